//! `cargo xtask bench [--quick]`: measure cuplan's compiler and write `target/cuplan-report/report.md`, its
//! SVG plots and `report.json` (the raw numbers).
//!
//! Compile times are medians of repeated `ExecutionPlan::build_with` calls through the library (a release
//! build of this task; criterion is for `cargo bench`). Per-pass times are the plan's own `pass_ms`. The
//! scaling exponent of each family and pass is fitted on log-log axes, never assumed.

pub mod clock;
pub mod fields;
pub mod fmt;
pub mod measure;
pub mod ort;
pub mod plot;
pub mod report;
pub mod sets;
pub mod stats;

use anyhow::{Context, Result};
use cuplan_benches::{Family, SHARED_MODELS};
use std::path::PathBuf;
use std::time::Instant;

use measure::Sampler;

/// Options of the task.
#[derive(Clone, Debug)]
pub struct BenchOpts {
    /// Smaller sizes and fewer repetitions (CI: under 3 minutes on two cores).
    pub quick: bool,
    /// Output directory.
    pub out: PathBuf,
    /// Measure onnxruntime too, where it is installed.
    pub ort: bool,
    /// Also write the report to `docs/benchmarks.md`.
    pub record: bool,
}

/// The packing core's search effort in a quick run: a tenth of the packing issue's default budget (about half
/// a second of one core per instance at most).
pub const QUICK_PACK_EFFORT: u64 = 300_000_000;

/// Sizes and repetitions of one run.
#[derive(Clone, Debug)]
pub struct Sizes {
    /// Node counts of the scaling series.
    pub scaling: Vec<usize>,
    /// Node count of the synthetic rows of the plan table.
    pub table_nodes: usize,
    /// Nodes of the verify target's plan (about 1.8 steps per node).
    pub verify_nodes: usize,
    /// Stream counts of the makespan sweep.
    pub sweep: Vec<usize>,
    /// Streams of the plan table and the scaling series.
    pub streams: usize,
    /// Repetitions for small inputs.
    pub small: Sampler,
    /// Repetitions from `big_from` nodes up.
    pub big: Sampler,
    /// Where `big` starts.
    pub big_from: usize,
    /// A family's scaling series stops before a size whose build the sizes before it predict to take longer
    /// than this (milliseconds): a super-linear pass would otherwise blow the run's time budget; the report
    /// says where it stopped.
    pub stop_above_ms: f64,
    /// onnxruntime session repetitions.
    pub ort_reps: usize,
    /// Node counts of the comparison with oxicuda-graph (1 and 4 streams each).
    pub peer: Vec<usize>,
    /// Interleaved repetitions of each system in that comparison.
    pub peer_reps: usize,
    /// Search effort of the packing core on the MiniMalloc instances (`None`: its default budget, which may
    /// search for seconds per instance).
    pub pack_effort: Option<u64>,
}

impl Sizes {
    /// The sizes of a quick or a full run.
    pub fn new(quick: bool) -> Sizes {
        if quick {
            Sizes {
                scaling: vec![1_000, 3_000, 10_000, 30_000, 100_000],
                table_nodes: 10_000,
                verify_nodes: 60_000,
                sweep: vec![1, 2, 4, 8],
                streams: 4,
                small: Sampler { min_reps: 3, max_reps: 15, budget_s: 0.5, single_above_s: 2.0 },
                big: Sampler { min_reps: 3, max_reps: 3, budget_s: 0.0, single_above_s: 1.0 },
                big_from: 100_000,
                stop_above_ms: 5_000.0,
                ort_reps: 3,
                peer: vec![1_000],
                peer_reps: 3,
                pack_effort: Some(QUICK_PACK_EFFORT),
            }
        } else {
            Sizes {
                scaling: vec![1_000, 3_000, 10_000, 30_000, 100_000, 300_000, 1_000_000],
                table_nodes: 10_000,
                verify_nodes: 600_000,
                sweep: vec![1, 2, 4, 8],
                streams: 4,
                small: Sampler { min_reps: 5, max_reps: 31, budget_s: 2.0, single_above_s: 10.0 },
                big: Sampler { min_reps: 3, max_reps: 5, budget_s: 4.0, single_above_s: 10.0 },
                big_from: 300_000,
                stop_above_ms: 30_000.0,
                ort_reps: 7,
                peer: vec![1_000, 10_000, 100_000],
                peer_reps: 3,
                pack_effort: None,
            }
        }
    }

    fn sampler(&self, nodes: usize) -> &Sampler {
        if nodes >= self.big_from {
            &self.big
        } else {
            &self.small
        }
    }
}

/// The build time at `nodes` that the last two measured `(nodes, ms)` points predict, growing at least
/// linearly; `None` before two points.
pub fn predict_ms(done: &[(usize, f64)], nodes: usize) -> Option<f64> {
    let [.., (n0, t0), (n1, t1)] = done else { return None };
    if *n0 == 0 || *n1 <= *n0 || *t0 <= 0.0 || *t1 <= 0.0 {
        return None;
    }
    let slope = ((t1 / t0).ln() / (*n1 as f64 / *n0 as f64).ln()).max(1.0);
    Some(t1 * (nodes as f64 / *n1 as f64).powf(slope))
}

struct Progress(Instant);

impl Progress {
    fn say(&self, what: impl std::fmt::Display) {
        eprintln!("[{:>6.1}s] {what}", self.0.elapsed().as_secs_f64());
    }
}

/// Run the benchmarks and write the report.
pub fn run(opts: &BenchOpts) -> Result<()> {
    let started = Instant::now();
    let p = Progress(started);
    let sizes = Sizes::new(opts.quick);
    std::fs::create_dir_all(&opts.out).with_context(|| format!("creating {}", opts.out.display()))?;
    let mut r = report::Report {
        machine: report::Machine::probe(),
        quick: opts.quick,
        streams: sizes.streams,
        ..Default::default()
    };
    let clock = clock::install();
    if clock.is_none() {
        r.notes.push(
            "per-pass times are the plan's wall-clock pass_ms (the tracing pass clock could not be installed)".into(),
        );
    }
    let clock = clock.as_ref();
    r.load_avg = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().and_then(|v| v.parse().ok()));
    let shared = cuplan_benches::shared_dir();
    r.shared_dir = shared.as_ref().map(|d| d.display().to_string());

    // Shared models: import, compile, makespan sweep.
    for name in SHARED_MODELS {
        let Some(path) = cuplan_benches::model_path(name) else {
            r.models_missing.push(name.to_string());
            continue;
        };
        p.say(format_args!("model {name}"));
        let import = graph_onnx::ImportOptions::default();
        let (itimes, model) = sizes
            .small
            .run(|| graph_onnx::import_file(&path, &import).with_context(|| format!("importing {}", path.display())))?;
        let mut row = measure::plan_row(name, "onnx", &model.graph, sizes.streams, &sizes.sweep, &sizes.small, clock)?;
        row.import_ms = Some(measure::medians(&itimes).0);
        r.models.push(row);
    }
    match std::fs::read_to_string(cuplan_benches::models_dir().join("README.md")) {
        Ok(text) => match ort::parse_readme(&text) {
            Ok(rows) => r.readme = rows,
            Err(e) => r.notes.push(format!("models/README.md: {e:#}")),
        },
        Err(e) => r.notes.push(format!("models/README.md not read: {e}")),
    }

    // onnxruntime in the same run.
    if opts.ort && !r.models.is_empty() {
        match ort::unavailable() {
            Some(why) => r.ort_note = Some(why),
            None => {
                p.say("onnxruntime session creation");
                let names: Vec<&str> = r.models.iter().map(|m| m.name.as_str()).collect();
                match ort::measure(&cuplan_benches::models_dir(), &names, sizes.ort_reps, &opts.out) {
                    Ok(run) => r.ort = Some(run),
                    Err(e) => r.ort_note = Some(format!("{e:#}")),
                }
            }
        }
    } else if !opts.ort {
        r.ort_note = Some("skipped (--no-ort)".into());
    }

    // Synthetic families at the table size.
    for f in Family::ALL {
        p.say(format_args!("{} at {} nodes", f.name(), sizes.table_nodes));
        let g = f.build(sizes.table_nodes)?;
        r.synth.push(measure::plan_row(f.name(), "synth", &g, sizes.streams, &sizes.sweep, &sizes.small, clock)?);
    }

    // Scaling series.
    for f in Family::ALL {
        let mut done: Vec<(usize, f64)> = Vec::new();
        for (i, &n) in sizes.scaling.iter().enumerate() {
            if let Some(t) = predict_ms(&done, n).filter(|&t| t > sizes.stop_above_ms) {
                r.notes.push(format!(
                    "{}: the series stops before {} nodes: the last two sizes predict {} s for one build there \
                     (limit {} s); not measured: {}",
                    f.name(),
                    fmt::count(n as u64),
                    fmt::ms(t / 1e3),
                    sizes.stop_above_ms / 1e3,
                    sizes.scaling[i..].iter().map(|&x| fmt::count(x as u64)).collect::<Vec<_>>().join(", ")
                ));
                break;
            }
            p.say(format_args!("scaling {} at {n} nodes", f.name()));
            let point = measure::scale_point(f, n, sizes.streams, sizes.sampler(n), clock)?;
            done.push((point.nodes, point.build_ms));
            r.scaling.push(point);
        }
    }

    // Verify target.
    p.say(format_args!("verify on a plan of about {} steps", sizes.verify_nodes));
    r.verify = Some(measure::verify_point(sizes.verify_nodes, sizes.sampler(sizes.verify_nodes))?);

    // Packing core on MiniMalloc.
    for inst in cuplan_benches::minimalloc_instances()? {
        p.say(format_args!("pack {}", inst.name));
        r.packs.push(measure::pack_row(&inst, &sizes.small, sizes.pack_effort)?);
    }

    // Memory-aware ordering: the shared models, every family at 2,000 nodes, and small random DAGs (where the
    // exact search finishes).
    for name in SHARED_MODELS {
        let Some(path) = cuplan_benches::model_path(name) else { continue };
        p.say(format_args!("memory order {name}"));
        let model = graph_onnx::import_file(&path, &graph_onnx::ImportOptions::default())
            .with_context(|| format!("importing {}", path.display()))?;
        r.orders.push(measure::order_row(name, &model.graph, &sizes.small)?);
    }
    for f in Family::ALL {
        p.say(format_args!("memory order {} at 2000 nodes", f.name()));
        let g = f.build(2_000)?;
        r.orders.push(measure::order_row(f.name(), &g, &sizes.small)?);
    }
    for seed in 0..3 {
        let g = graph_ir::synth::random_dag(200, 3, seed)?;
        r.orders.push(measure::order_row(&format!("random_dag 200 seed {seed}"), &g, &sizes.small)?);
    }

    // Plan sets of the dynamic models.
    p.say("plan sets of the dynamic models");
    r.sets = sets::measure(&sizes.small)?;
    // The peer: the same graphs in oxicuda-graph 0.5.5.
    for f in Family::ALL {
        for &n in &sizes.peer {
            let g = f.build(n)?;
            for streams in [1, 4] {
                p.say(format_args!("peer {} at {n} nodes, {streams} streams", f.name()));
                let c = cuplan_benches::peer::compare(&g, streams, sizes.peer_reps)?;
                r.peers.push(report::PeerRow {
                    family: f.name().into(),
                    nodes: g.num_nodes(),
                    streams,
                    oxicuda_ms: c.oxicuda_ms,
                    cuplan_ms: c.cuplan_ms,
                    oxicuda_pool_ratio: cuplan_benches::peer::Comparison::pool_ratio(c.oxicuda_pool, c.bound),
                    cuplan_pool_ratio: cuplan_benches::peer::Comparison::pool_ratio(c.cuplan_pool, c.bound),
                });
            }
        }
    }

    r.duration_s = started.elapsed().as_secs_f64();
    r.cpu_s = clock::cpu_ns().map(|ns| ns as f64 / 1e9);
    p.say("writing the report");
    let md = report::write(&r, &opts.out)?;
    if opts.record {
        let doc = cuplan_benches::workspace_root().join("docs").join("benchmarks.md");
        std::fs::write(&doc, report::as_doc(&md, "../target/cuplan-report", opts.quick))
            .with_context(|| format!("writing {}", doc.display()))?;
        p.say(format_args!("recorded in {}", doc.display()));
    }
    println!("{md}");
    p.say(format_args!("report: {}", opts.out.join("report.md").display()));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn predictions_follow_the_last_slope_and_never_drop_below_linear() {
        assert_eq!(predict_ms(&[], 10), None);
        assert_eq!(predict_ms(&[(10, 1.0)], 100), None);
        let quad = predict_ms(&[(10, 1.0), (100, 100.0)], 1000).unwrap();
        assert!((quad - 10_000.0).abs() < 1e-6, "{quad}");
        let sub = predict_ms(&[(10, 1.0), (100, 2.0)], 1000).unwrap();
        assert!((sub - 20.0).abs() < 1e-9, "sub-linear growth is extrapolated linearly: {sub}");
    }
}
