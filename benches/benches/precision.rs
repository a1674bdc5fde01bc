//! Compile time of half-precision plans against the f32 plan (issue 18's "within 1.2x"): for each shared model
//! (skipped when absent) and a synthetic transformer, `precision/<model>/<fp32|fp16|bf16>` times
//! `ExecutionPlan::build_owned` on a fresh copy of the loaded graph — the CLI's path, where the plan takes the
//! graph it was loaded into (a half precision edits it in place; the f32 plan borrows it and drops it). The copy
//! is made outside the timed region. Compare the medians of one model's three entries.
//!
//! `cargo bench -p cuplan-benches --bench precision`; instruction counts, steadier on a shared machine, come from
//! callgrind (docs/precision.md).
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use graph_ir::ComputeGraph;
use graph_passes::precision::{Precision, PrecisionPolicy};
use graph_plan::{ExecutionPlan, PlanOptions};
use std::hint::black_box;
use std::time::Duration;

fn graphs() -> Vec<(String, ComputeGraph)> {
    let mut out = Vec::new();
    for name in cuplan_benches::SHARED_MODELS {
        match cuplan_benches::load_model(name) {
            Ok(Some(g)) => out.push((name.to_string(), g)),
            Ok(None) => {
                eprintln!("precision bench: {name} not found under {}; skipped", cuplan_benches::models_dir().display())
            }
            Err(e) => panic!("{name}: {e:#}"),
        }
    }
    out.push(("transformer_synth".into(), graph_ir::synth::transformer(4, 128, 8, 32, 1).unwrap()));
    out
}

fn bench(c: &mut Criterion) {
    for (name, graph) in graphs() {
        let mut g = c.benchmark_group(format!("precision/{name}"));
        g.sample_size(20);
        g.warm_up_time(Duration::from_millis(300));
        g.measurement_time(Duration::from_secs(2));
        for p in [Precision::Fp32, Precision::Fp16, Precision::Bf16] {
            let opts = PlanOptions { precision: PrecisionPolicy::new(p), ..PlanOptions::default() };
            g.bench_function(p.to_string(), |b| {
                b.iter_batched(
                    || graph.clone(),
                    |graph| black_box(ExecutionPlan::build_owned(graph, &opts).unwrap()),
                    BatchSize::SmallInput,
                )
            });
        }
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
