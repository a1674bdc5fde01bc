//! cuplan against its peer, oxicuda-graph 0.5.5: the same synthetic graphs planned by both (see
//! `cuplan_benches::peer`), per family, size and stream count. Each benchmark id names the system; the ratio
//! (oxicuda time / cuplan time, medians of three interleaved builds) and both pools over our bound are printed
//! once per graph, as `cargo xtask bench`'s peer table gives them.
//!
//! `cargo bench -p cuplan-benches --bench peer`. `CUPLAN_PEER_SIZES=1000,10000,100000` changes the sizes
//! (default 1,000 and 10,000: oxicuda needs seconds per build from 100,000 nodes up).

#![allow(missing_docs)]

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use cuplan_benches::{peer, Family};
use graph_plan::{ExecutionPlan, PlanOptions};
use std::hint::black_box;
use std::time::Duration;

fn sizes() -> Vec<usize> {
    std::env::var("CUPLAN_PEER_SIZES")
        .ok()
        .map(|v| v.split(',').filter_map(|s| s.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1_000, 10_000])
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("peer");
    group.sample_size(10).measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_millis(500));
    for f in Family::ALL {
        for n in sizes() {
            let g = match f.build(n) {
                Ok(g) => g,
                Err(e) => {
                    eprintln!("peer bench: {}: {e:#}", f.name());
                    continue;
                }
            };
            let theirs = match peer::to_oxicuda(&g) {
                Ok(p) => p,
                Err(e) => {
                    eprintln!("peer bench: {} at {n}: {e:#}", f.name());
                    continue;
                }
            };
            for streams in [1usize, 4] {
                match peer::compare(&g, streams, 3) {
                    Ok(cmp) => eprintln!(
                        "peer {} {n} nodes {streams} streams: ratio {:.2}, pool/bound cuplan {:.2} oxicuda {:.2}",
                        f.name(),
                        cmp.ratio(),
                        peer::Comparison::pool_ratio(cmp.cuplan_pool, cmp.bound),
                        peer::Comparison::pool_ratio(cmp.oxicuda_pool, cmp.bound),
                    ),
                    Err(e) => eprintln!("peer bench: {} at {n}, {streams} streams: {e:#}", f.name()),
                }
                let id = format!("{}/{n}/{streams}", f.name());
                let opts = PlanOptions::with_streams(streams);
                group.bench_with_input(BenchmarkId::new("cuplan", &id), &g, |b, g| {
                    b.iter(|| black_box(ExecutionPlan::build_with(g, &opts).map(|p| p.pool_bytes)))
                });
                group.bench_with_input(BenchmarkId::new("oxicuda", &id), &theirs, |b, p| {
                    b.iter(|| black_box(oxicuda_graph::ExecutionPlan::build(p, streams).map(|p| p.pool_bytes)))
                });
            }
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
