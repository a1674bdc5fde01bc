//! The memory pass (`graph_passes::memory::analyse`, default options: in-place, ordered-reuse preference, the
//! packer's default effort) on a transformer stack of about a million tensors (22,223 layers), after topo and
//! fusion, one and four streams' worth of options. Target: under 2 s (issue 6).
//!
//! `cargo bench -p cuplan-benches --bench memory`. `CUPLAN_MEMORY_LAYERS=N` changes the depth;
//! `CUPLAN_MEMORY_RUNS=N` skips criterion and prints the wall time of N runs of each variant.

#![allow(missing_docs)]

use criterion::{criterion_group, criterion_main, Criterion};
use graph_ir::{synth, ComputeGraph};
use graph_passes::memory::{self, MemoryOptions};
use graph_passes::target::Target;
use graph_plan::{run_pipeline, Pass, PipelineResult, PlanOptions};
use std::hint::black_box;
use std::time::{Duration, Instant};

fn layers() -> usize {
    std::env::var("CUPLAN_MEMORY_LAYERS").ok().and_then(|v| v.parse().ok()).unwrap_or(22_223)
}

fn setup() -> Option<(ComputeGraph, PipelineResult)> {
    let t0 = Instant::now();
    let g = match synth::transformer(layers(), 64, 4, 16, 1) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("memory bench: cannot build the graph: {e}");
            return None;
        }
    };
    let r = match run_pipeline(&g, &PlanOptions::with_streams(1), Some(Pass::Fusion)) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("memory bench: topo/fusion failed: {e}");
            return None;
        }
    };
    eprintln!(
        "memory bench graph: {} nodes, {} tensors, {} kernels, ready in {:.1} s",
        g.num_nodes(),
        g.num_tensors(),
        r.fusion.as_ref().map_or(0, |f| f.groups.len()),
        t0.elapsed().as_secs_f64()
    );
    Some((g, r))
}

fn variants() -> [(&'static str, Target); 2] {
    [
        ("transformer_1m_1stream", Target::new(1, Default::default())),
        ("transformer_1m_4streams", Target::new(4, Default::default())),
    ]
}

fn bench(c: &mut Criterion) {
    let Some((g, r)) = setup() else { return };
    let (Some(fusion), Some(groups)) = (r.fusion.as_ref(), r.groups.as_ref()) else { return };
    let opts = MemoryOptions::default();
    let runs: Option<usize> = std::env::var("CUPLAN_MEMORY_RUNS").ok().and_then(|v| v.parse().ok());
    for (name, target) in variants() {
        if let Some(n) = runs {
            for _ in 0..n {
                let t0 = Instant::now();
                match memory::analyse(&g, fusion, groups, &target, &opts) {
                    Ok(m) => eprintln!(
                        "{name}: {:.3} s, pool {} B, bound {} B, {} in place, {} reuse edges ({} added)",
                        t0.elapsed().as_secs_f64(),
                        m.pool_bytes(),
                        m.lower_bound_bytes,
                        m.in_place_count,
                        m.reuse_edges.len(),
                        m.reuse_edges_not_implied
                    ),
                    Err(e) => eprintln!("{name}: {e}"),
                }
            }
            continue;
        }
        let mut group = c.benchmark_group("memory");
        group.sample_size(10).measurement_time(Duration::from_secs(20));
        group.bench_function(name, |b| b.iter(|| black_box(memory::analyse(&g, fusion, groups, &target, &opts).ok())));
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
