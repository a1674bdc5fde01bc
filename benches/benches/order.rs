//! Memory-aware ordering (`OrderStrategy::Memory`): whole builds on the branchy families, with the pool bound
//! of the chosen order against the given order's printed once per graph (issue 6's ordering target; `cargo
//! xtask bench` tabulates the same figures with the shared models).
//!
//! `cargo bench -p cuplan-benches --bench order`.

#![allow(missing_docs)]

use criterion::{criterion_group, criterion_main, Criterion};
use graph_ir::{synth, ComputeGraph};
use graph_plan::{verify, ExecutionPlan, OrderStrategy, PlanOptions};
use std::hint::black_box;
use std::time::Duration;

fn graphs() -> Vec<(&'static str, ComputeGraph)> {
    let mut out = Vec::new();
    for (name, g) in [
        ("random_dag_200", synth::random_dag(200, 3, 0)),
        ("random_dag_2000", synth::random_dag(2000, 3, 0)),
        ("inception_like_20x4", synth::inception_like(20, 4)),
    ] {
        match g {
            Ok(g) => out.push((name, g)),
            Err(e) => eprintln!("order bench: cannot build {name}: {e}"),
        }
    }
    out
}

fn bench(c: &mut Criterion) {
    let mut opts = PlanOptions::with_streams(1);
    opts.order = OrderStrategy::Memory;
    let mut group = c.benchmark_group("order");
    group.sample_size(10).measurement_time(Duration::from_secs(10));
    for (name, g) in graphs() {
        match ExecutionPlan::build_with(&g, &opts) {
            Ok(p) => {
                let s = p.stats();
                eprintln!(
                    "{name}: bound {} B in the given order, {} B chosen ({}, ratio {:.4}, optimal: {}), verify: {}",
                    s.given_order_lower_bound_bytes,
                    s.lower_bound_bytes,
                    s.order_chosen,
                    s.lower_bound_bytes as f64 / s.given_order_lower_bound_bytes.max(1) as f64,
                    s.order_optimal,
                    if verify(&p).is_ok() { "ok" } else { "FAILED" }
                );
            }
            Err(e) => {
                eprintln!("order bench: {name}: {e}");
                continue;
            }
        }
        group.bench_function(name, |b| b.iter(|| black_box(ExecutionPlan::build_with(&g, &opts).ok())));
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
