//! `graph_plan::verify` on big plans built by the pipeline from `synth::random_dag` with fusion off and four
//! streams (launches, records, waits; data edges across streams):
//! - `verify/random_dag_1m`: 600k nodes, reuse off, about a million steps (one pool buffer per tensor, so the
//!   shadow memory holds a segment per tensor). Target: under 2 s. Reuse is off because the baseline packer
//!   is quadratic in the number of pool buffers: with reuse on, building this plan takes many minutes.
//! - `verify/random_dag_reuse`: 50k nodes, reuse on (tens of thousands of reuse edges to check).
//!
//! `cargo bench -p cuplan-benches --bench verify`. `CUPLAN_VERIFY_NODES=N` changes the size of the first
//! plan; `CUPLAN_VERIFY_RUNS=N` skips criterion and prints the wall time of N runs on it (for `perf stat`).

#![allow(missing_docs)]

use criterion::{criterion_group, criterion_main, Criterion};
use graph_ir::synth;
use graph_plan::{verify, ExecutionPlan, PlanOptions};
use std::hint::black_box;
use std::time::Instant;

fn plan(nodes: usize, reuse: bool) -> Option<ExecutionPlan> {
    let t0 = Instant::now();
    let built = synth::random_dag(nodes, 3, 1).map_err(graph_plan::PlanError::from).and_then(|g| {
        let mut o = PlanOptions::with_streams(4);
        o.fusion.enabled = false;
        o.memory.reuse = reuse;
        ExecutionPlan::build_with(&g, &o)
    });
    let p = match built {
        Ok(p) => p,
        Err(e) => {
            eprintln!("verify bench: cannot build the plan: {e}");
            return None;
        }
    };
    eprintln!(
        "verify bench plan: {nodes} nodes, reuse {reuse}: {} steps ({} launches, {} events, {} streams, {} reuse \
         edges), built in {:.1} s",
        p.total_steps(),
        p.kernel_count_fused,
        p.event_count,
        p.num_streams,
        p.orders().len(),
        t0.elapsed().as_secs_f64()
    );
    if let Err(v) = verify(&p) {
        let first = v.first().map(|x| x.to_string()).unwrap_or_default();
        eprintln!("verify bench: the plan does not verify ({} violations), first: {first}", v.len());
        return None;
    }
    Some(p)
}

fn bench(c: &mut Criterion) {
    let nodes = std::env::var("CUPLAN_VERIFY_NODES").ok().and_then(|s| s.parse().ok()).unwrap_or(600_000);
    let Some(big) = plan(nodes, false) else { return };
    if let Some(runs) = std::env::var("CUPLAN_VERIFY_RUNS").ok().and_then(|s| s.parse::<usize>().ok()) {
        for _ in 0..runs {
            let t = Instant::now();
            let ok = black_box(verify(black_box(&big))).is_ok();
            eprintln!("verify: {:.1} ms ({})", t.elapsed().as_secs_f64() * 1e3, if ok { "ok" } else { "violations" });
        }
        return;
    }
    let mut g = c.benchmark_group("verify");
    g.sample_size(10);
    g.bench_function("random_dag_1m", |b| b.iter(|| black_box(verify(black_box(&big)))));
    drop(big);
    if let Some(p) = plan(50_000, true) {
        g.bench_function("random_dag_reuse", |b| b.iter(|| black_box(verify(black_box(&p)))));
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
