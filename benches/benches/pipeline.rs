//! Compile-time benchmarks of the pipeline on the synthetic families (`cuplan_benches::Family`) at 1k, 10k and
//! 100k nodes (1M with `--features huge`):
//!
//! - `pipeline/<family>/<pass>/<nodes>`: `run_pipeline` stopped after each pass (four streams), so a pass's own
//!   cost is the step from the pass before it (the same entry point the CLI's stop-after uses, so these benches
//!   follow the passes' signatures as they change);
//! - `build/<family>/<streams>/<nodes>`: the whole `ExecutionPlan::build_with`, one and four streams;
//! - `verify/<family>/<nodes>`: `graph_plan::verify` on the four-stream plan.
//!
//! Criterion's smallest sample (10) is used with short measurement windows so that the default run stays in
//! minutes; `cargo xtask bench` is the faster route to the report's numbers. Filter as usual, e.g.
//! `cargo bench -p cuplan-benches --bench pipeline -- build/transformer`.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use criterion::{criterion_group, criterion_main, BenchmarkGroup, BenchmarkId, Criterion, SamplingMode, Throughput};
use cuplan_benches::Family;
use graph_ir::ComputeGraph;
use graph_plan::{run_pipeline, ExecutionPlan, Pass, PlanOptions};
use std::hint::black_box;
use std::time::Duration;

const SIZES: [usize; 3] = [1_000, 10_000, 100_000];
/// The passes `run_pipeline` can stop after (linearise is part of the whole build).
const STOPS: [Pass; 5] = [Pass::Topo, Pass::Fusion, Pass::Groups, Pass::Memory, Pass::Stream];

fn tune<M: criterion::measurement::Measurement>(g: &mut BenchmarkGroup<'_, M>, nodes: usize) {
    g.sample_size(10);
    g.warm_up_time(Duration::from_millis(if nodes >= 100_000 { 200 } else { 500 }));
    g.measurement_time(Duration::from_secs(if nodes >= 100_000 { 2 } else { 1 }));
    // Flat sampling: one iteration per sample once an iteration takes milliseconds.
    g.sampling_mode(if nodes >= 10_000 { SamplingMode::Flat } else { SamplingMode::Auto });
    g.throughput(Throughput::Elements(nodes as u64));
}

fn graphs(sizes: &[usize]) -> Vec<(Family, usize, ComputeGraph)> {
    let mut out = Vec::new();
    for f in Family::ALL {
        for &n in sizes {
            out.push((f, n, f.build(n).unwrap()));
        }
    }
    out
}

fn passes(c: &mut Criterion, inputs: &[(Family, usize, ComputeGraph)]) {
    let opts = PlanOptions::with_streams(4);
    for (family, n, graph) in inputs {
        let mut g = c.benchmark_group(format!("pipeline/{}", family.name()));
        tune(&mut g, *n);
        for stop in STOPS {
            g.bench_with_input(BenchmarkId::new(stop.name(), n), graph, |b, graph| {
                b.iter(|| black_box(run_pipeline(graph, &opts, Some(stop)).unwrap()))
            });
        }
        g.finish();
    }
}

fn builds(c: &mut Criterion, inputs: &[(Family, usize, ComputeGraph)], streams: &[usize]) {
    for (family, n, graph) in inputs {
        let mut g = c.benchmark_group(format!("build/{}", family.name()));
        tune(&mut g, *n);
        for &s in streams {
            let opts = PlanOptions::with_streams(s);
            let id = BenchmarkId::new(format!("{s}_stream{}", if s == 1 { "" } else { "s" }), n);
            g.bench_with_input(id, graph, |b, graph| {
                b.iter(|| black_box(ExecutionPlan::build_with(graph, &opts).unwrap()))
            });
        }
        g.finish();
    }
}

fn verifies(c: &mut Criterion, inputs: &[(Family, usize, ComputeGraph)]) {
    for (family, n, graph) in inputs {
        let plan = ExecutionPlan::build(graph, 4).unwrap();
        let mut g = c.benchmark_group(format!("verify/{}", family.name()));
        tune(&mut g, *n);
        g.throughput(Throughput::Elements(plan.total_steps() as u64));
        g.bench_with_input(BenchmarkId::from_parameter(n), &plan, |b, plan| {
            b.iter(|| black_box(graph_plan::verify(plan).is_ok()))
        });
        g.finish();
    }
}

fn pipeline(c: &mut Criterion) {
    let inputs = graphs(&SIZES);
    passes(c, &inputs);
    builds(c, &inputs, &[1, 4]);
    verifies(c, &inputs);
}

/// The 1M-node groups: whole build on four streams and verify (`--features huge`).
#[cfg(feature = "huge")]
fn huge(c: &mut Criterion) {
    let inputs = graphs(&[1_000_000]);
    builds(c, &inputs, &[4]);
    verifies(c, &inputs);
}

#[cfg(not(feature = "huge"))]
fn huge(_: &mut Criterion) {}

criterion_group!(benches, pipeline, huge);
criterion_main!(benches);
