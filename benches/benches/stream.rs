//! Stream-pass benchmarks and the multi-stream report.
//!
//! `cargo bench -p cuplan-benches --bench stream` prints, before the criterion runs:
//! - per graph family and stream count (1/2/4/8, H200 profile, graph replay): modelled makespan, its bound
//!   (max of the group DAG's critical path and the area), their ratio, the ratio to the bound with the stream
//!   limit (which also counts the sum of launch times over k), the speedup over one stream, the
//!   cross-stream edges before event reduction and the waits and events after, and the pool bytes;
//! - the memory the streams cost: the same graphs with pool reuse off (reuse edges no longer serialise
//!   launches) against reuse on;
//! - random DAGs (and googlenet without reuse) with `StreamOptions::reorder`;
//! - one-shot timings of the stream pass on raw random DAGs of 100k and 1M groups, with the growth of the
//!   process's peak resident memory.
//!
//! Criterion then times the stream pass (`assign`) on a 100k-group DAG and the timing evaluator on its plan.

use criterion::{criterion_group, criterion_main, Criterion};
use graph_ir::rng::SplitMix64;
use graph_ir::{synth, ComputeGraph};
use graph_passes::ids::GroupId;
use graph_passes::stream::{self, StreamOptions};
use graph_passes::timing;
use graph_plan::{run_pipeline, ExecutionPlan, Pass, PlanOptions};
use std::hint::black_box;
use std::time::Instant;

/// A random DAG shaped like `synth::random_dag` (predecessors mostly among the 16 latest groups, one in eight
/// anywhere earlier), with launch-bound times and small occupancies, without building a graph.
fn raw_dag(n: usize, fan_in: u64, seed: u64) -> (Vec<Vec<GroupId>>, Vec<f64>, Vec<f64>) {
    let mut rng = SplitMix64::new(seed);
    let mut preds = Vec::with_capacity(n);
    let mut time = Vec::with_capacity(n);
    let mut occ = Vec::with_capacity(n);
    for g in 0..n {
        let k = if g == 0 { 0 } else { 1 + rng.below(fan_in) as usize };
        let ps: Vec<GroupId> = (0..k)
            .map(|_| {
                let back = if rng.below(8) == 0 { g } else { g.min(16) };
                GroupId::from_index(g - 1 - rng.below(back as u64) as usize)
            })
            .collect();
        preds.push(ps);
        time.push(1.0 + rng.below(100) as f64 / 50.0);
        occ.push(0.001 + rng.below(100) as f64 / 400.0);
    }
    (preds, time, occ)
}

fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// The repository's ONNX models (`models/`).
fn models() -> Vec<(String, ComputeGraph)> {
    let dir = cuplan_benches::models_dir().display().to_string();
    let mut v = Vec::new();
    for m in ["googlenet", "resnet50", "mobilenet_v2", "bert_base"] {
        let path = format!("{dir}/{m}.onnx");
        match graph_onnx::import_file(&path, &graph_onnx::ImportOptions::default()) {
            Ok(model) => v.push((m.to_string(), model.graph)),
            Err(e) => eprintln!("{path}: {e}"),
        }
    }
    v
}

fn families() -> Vec<(String, ComputeGraph)> {
    let mut v = models();
    for g in [
        synth::inception_like(4, 4),
        synth::inception_like(8, 6),
        synth::random_dag(2000, 2, 3),
        synth::random_dag(2000, 4, 2),
        synth::random_dag(5000, 3, 11),
        synth::transformer(2, 256, 4, 64, 1),
    ] {
        match g {
            Ok(g) => v.push((g.name().to_string(), g)),
            Err(e) => eprintln!("synth failed: {e}"),
        }
    }
    v
}

fn report() {
    println!("# stream report (H200 profile, graph replay)");
    println!(
        "{:<28} {:>3} {:>3} {:>6} {:>10} {:>10} {:>6} {:>7} {:>7} {:>7} {:>6} {:>6} {:>10}",
        "graph",
        "k",
        "str",
        "chains",
        "makespan",
        "bound",
        "ratio",
        "ratio_k",
        "speedup",
        "x-edges",
        "waits",
        "events",
        "pool_B"
    );
    for (name, g) in families() {
        for reuse in [true, false] {
            for k in [1usize, 2, 4, 8, 16] {
                let mut o = PlanOptions::with_streams(k);
                o.memory.reuse = reuse;
                let t0 = Instant::now();
                let p = match ExecutionPlan::build_with(&g, &o) {
                    Ok(p) => p,
                    Err(e) => {
                        eprintln!("{name}: {e}");
                        continue;
                    }
                };
                let ms = t0.elapsed().as_secs_f64() * 1e3;
                let s = p.stats();
                let name = format!("{name}{}", if reuse { "" } else { " noreuse" });
                println!(
                    "{:<28} {:>3} {:>3} {:>6} {:>10.1} {:>10.1} {:>6.3} {:>7.3} {:>7.2} {:>7} {:>6} {:>6} {:>10}  ({ms:.0} ms)",
                    name,
                    k,
                    p.num_streams,
                    s.chains,
                    s.makespan_us,
                    s.makespan_bound_us,
                    s.makespan_us / s.makespan_bound_us.max(1e-12),
                    s.makespan_us / s.stream_limit_bound_us.max(1e-12),
                    s.one_stream_us / s.makespan_us.max(1e-12),
                    s.events_before_reduction,
                    s.waits,
                    p.event_count,
                    p.pool_bytes,
                );
            }
        }
    }
    println!("# with StreamOptions::reorder (the list schedule's own submission order)");
    for (name, g) in families().into_iter().filter(|(n, _)| n.starts_with("random_dag") || n.starts_with("googlenet")) {
        for k in [2usize, 4, 8] {
            let mut opts = PlanOptions::with_streams(k);
            opts.memory.reuse = !name.starts_with("googlenet");
            let Ok(mut r) = run_pipeline(&g, &opts, Some(Pass::Memory)) else { continue };
            let (Some(fusion), Some(groups), Some(mem)) = (r.fusion.as_ref(), r.groups.as_ref(), r.memory.as_ref())
            else {
                continue;
            };
            let sopts = StreamOptions { reorder: true, ..StreamOptions::new(opts.target()) };
            r.stream = Some(stream::analyse(&g, fusion, groups, mem, &sopts));
            let Ok(p) = ExecutionPlan::finish(&g, &r) else { continue };
            let s = p.stats();
            println!(
                "{name:<28} {k:>3} reorder: makespan {:.1} bound {:.1} ratio {:.3} ratio_k {:.3} speedup {:.2} waits {}",
                s.makespan_us,
                s.makespan_bound_us,
                s.makespan_us / s.makespan_bound_us.max(1e-12),
                s.makespan_us / s.stream_limit_bound_us.max(1e-12),
                s.one_stream_us / s.makespan_us.max(1e-12),
                s.waits
            );
        }
    }
    for n in [100_000usize, 1_000_000] {
        let (preds, time, occ) = raw_dag(n, 3, 7);
        let before = peak_rss_kib();
        for k in [4usize, 8] {
            let o = StreamOptions::with_streams(k);
            let t0 = Instant::now();
            let p = stream::assign(&preds, &time, &occ, &o);
            let secs = t0.elapsed().as_secs_f64();
            println!(
                "raw_dag n={n} k={k}: assign {secs:.3} s, chains {}, edges {} -> reduced {}, cross-stream edges {} -> waits {} ({} events), peak RSS +{} MiB",
                p.chains,
                p.dag_edges,
                p.reduced_edges,
                p.events_before_reduction,
                p.syncs.len(),
                p.events,
                peak_rss_kib().saturating_sub(before) / 1024
            );
        }
    }
}

fn benches(c: &mut Criterion) {
    report();
    let (preds, time, occ) = raw_dag(100_000, 3, 7);
    let o = StreamOptions::with_streams(4);
    c.bench_function("stream_assign_raw_dag_100k_k4", |b| {
        b.iter(|| stream::assign(black_box(&preds), &time, &occ, &o))
    });
    let p = stream::assign(&preds, &time, &occ, &o);
    let tasks = p.ordered_tasks(&time, &occ);
    c.bench_function("timing_simulate_100k_k4", |b| b.iter(|| timing::simulate(black_box(&tasks), 1.0)));
}

criterion_group! {
    name = stream_benches;
    config = Criterion::default().sample_size(10);
    targets = benches
}
criterion_main!(stream_benches);
