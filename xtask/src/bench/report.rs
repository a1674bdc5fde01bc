//! The report: Markdown tables, the target checks, the fitted exponents, and the SVG plots beside them.

use anyhow::{Context, Result};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

use super::fields::{self, MAKESPAN_BOUND, STAT_FIELDS};
use super::fmt::{self, md_table, Align};
use super::measure::{OrderRow, PackRow, PlanRow, ScalePoint, VerifyPoint};
use super::ort::{OrtRun, ReadmeRow};
use super::plot::{self, Bars, Layout, Series};
use super::stats::{fit_power_law, median, PowerFit};

/// Exponents above this are flagged as super-linear.
pub const SUPERLINEAR: f64 = 1.2;
/// Passes faster than this at the largest size are not flagged (their exponents are mostly timer noise).
pub const FLAG_MIN_MS: f64 = 1.0;

/// The targets of the benchmarks issue.
pub mod target {
    /// Full build of a 100k-node transformer stack on 4 streams, milliseconds.
    pub const BUILD_100K_MS: f64 = 500.0;
    /// Full build of a 1M-node transformer stack, milliseconds.
    pub const BUILD_1M_MS: f64 = 5000.0;
    /// Fitted exponent of the transformer's compile time.
    pub const EXPONENT: f64 = 1.15;
    /// Verify of a 1M-step plan, milliseconds.
    pub const VERIFY_1M_MS: f64 = 2000.0;
}

/// Where the numbers were measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Machine {
    /// CPU model from /proc/cpuinfo.
    pub cpu: String,
    /// Logical cores available to this process.
    pub cores: usize,
    /// Total memory, GiB.
    pub mem_gib: f64,
    /// `rustc -V`.
    pub rustc: String,
    /// UTC date and time of the run.
    pub date: String,
    /// `git rev-parse --short HEAD` (with `+dirty` when the tree has changes).
    pub commit: String,
}

fn cmd_line(prog: &str, args: &[&str]) -> Option<String> {
    let o = Command::new(prog).args(args).output().ok()?;
    o.status.success().then(|| String::from_utf8_lossy(&o.stdout).trim().to_string())
}

impl Machine {
    /// Look at this machine.
    pub fn probe() -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name").and_then(|r| r.split_once(':')).map(|(_, v)| v.trim()))
            .unwrap_or("unknown")
            .to_string();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let mem_kib: f64 = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|r| r.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
        let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let mut commit = cmd_line("git", &["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".into());
        if cmd_line("git", &["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty()) {
            commit.push_str("+dirty");
        }
        Machine {
            cpu,
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            mem_gib: mem_kib / (1024.0 * 1024.0),
            rustc: cmd_line(&rustc, &["-V"]).unwrap_or_else(|| "unknown".into()),
            date: fmt::utc_string(secs),
            commit,
        }
    }
}

/// Everything one run measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    /// The machine.
    pub machine: Machine,
    /// `--quick`.
    pub quick: bool,
    /// Streams of the plan table and the scaling series.
    pub streams: usize,
    /// Where shared data was found.
    pub shared_dir: Option<String>,
    /// Shared models compiled.
    pub models: Vec<PlanRow>,
    /// Shared models not found.
    pub models_missing: Vec<String>,
    /// The shared models' README table.
    #[serde(skip)]
    pub readme: Vec<ReadmeRow>,
    /// onnxruntime, measured in this run.
    pub ort: Option<OrtRun>,
    /// Why onnxruntime was not measured.
    pub ort_note: Option<String>,
    /// Synthetic families at the table size.
    pub synth: Vec<PlanRow>,
    /// Scaling series.
    pub scaling: Vec<ScalePoint>,
    /// The verify target.
    pub verify: Option<VerifyPoint>,
    /// MiniMalloc instances.
    pub packs: Vec<PackRow>,
    /// Memory-aware ordering against the given order.
    pub orders: Vec<OrderRow>,
    /// Dynamic models planned as sets of buckets.
    pub sets: Vec<super::sets::SetRow>,
    /// The same graphs planned by oxicuda-graph 0.5.5 and by cuplan.
    pub peers: Vec<PeerRow>,
    /// Other remarks.
    pub notes: Vec<String>,
    /// Seconds the run took.
    pub duration_s: f64,
    /// On-CPU seconds of the run's main thread.
    pub cpu_s: Option<f64>,
    /// One-minute load average when the run started.
    pub load_avg: Option<f64>,
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        f64::NAN
    }
}

/// The cells of one row of the plan table:
/// `model | nodes | launches (orig -> fused) | ORT nodes | pool / bound / naive | events | makespan / bound | compile ms`.
pub fn plan_cells(r: &PlanRow, ort_nodes: Option<usize>) -> Vec<String> {
    vec![
        r.name.clone(),
        fmt::count(r.nodes as u64),
        format!("{} -> {}", fmt::count(r.launches_orig as u64), fmt::count(r.launches_fused as u64)),
        ort_nodes.map_or_else(|| "-".into(), |n| fmt::count(n as u64)),
        format!(
            "{} / {} / {} MiB ({}x bound)",
            fmt::mib(r.pool_bytes),
            fmt::mib(r.lower_bound_bytes),
            fmt::mib(r.naive_bytes),
            fmt::ratio(ratio(r.pool_bytes as f64, r.lower_bound_bytes as f64))
        ),
        fmt::count(r.events as u64),
        makespan_cell(r.makespan_us, r.makespan_bound_us),
        fmt::ms(r.compile_ms),
    ]
}

/// `makespan / bound us (ratio)`, or `makespan us / n/a` without the bound.
pub fn makespan_cell(makespan_us: f64, bound_us: Option<f64>) -> String {
    match bound_us {
        Some(b) => format!("{} / {} us ({})", fmt::ms(makespan_us), fmt::ms(b), fmt::ratio(ratio(makespan_us, b))),
        None => format!("{} us / n/a", fmt::ms(makespan_us)),
    }
}

/// The cells of one row of the plan statistics table: the name, then one cell per [`STAT_FIELDS`] entry.
pub fn stat_cells(r: &PlanRow) -> Vec<String> {
    let mut row = vec![r.name.clone()];
    row.extend(STAT_FIELDS.iter().map(|f| fields::cell(&r.stats, f)));
    row
}

/// The plan table's header.
pub const PLAN_HEADER: [&str; 8] = [
    "model",
    "nodes",
    "launches (orig -> fused)",
    "ORT nodes",
    "pool / bound / naive",
    "events",
    "makespan / bound",
    "compile ms",
];

/// Fitted exponents of one family: the whole build, each pass, verify.
#[derive(Clone, Debug, Serialize)]
pub struct FamilyFit {
    /// Family.
    pub family: String,
    /// Full build.
    pub build: Option<PowerFit>,
    /// Slope between the two largest sizes.
    pub top_slope: Option<f64>,
    /// Per pass.
    pub passes: Vec<(String, Option<PowerFit>, f64)>,
    /// Verify.
    pub verify: Option<PowerFit>,
}

/// Fit every family's series.
pub fn family_fits(points: &[ScalePoint]) -> Vec<FamilyFit> {
    let mut by: BTreeMap<&str, Vec<&ScalePoint>> = BTreeMap::new();
    for p in points {
        by.entry(p.family.as_str()).or_default().push(p);
    }
    let mut order: Vec<&str> = points.iter().map(|p| p.family.as_str()).collect();
    order.dedup();
    order
        .into_iter()
        .filter_map(|f| by.get(f).map(|ps| (f, ps)))
        .map(|(f, ps)| {
            let mut ps = ps.clone();
            ps.sort_by_key(|p| p.nodes);
            let xy = |g: &dyn Fn(&ScalePoint) -> f64| -> Vec<(f64, f64)> {
                ps.iter().map(|p| (p.nodes as f64, g(p))).collect()
            };
            let top_slope = match ps.as_slice() {
                [.., a, b] if a.nodes < b.nodes && a.build_ms > 0.0 && b.build_ms > 0.0 => {
                    Some((b.build_ms / a.build_ms).ln() / (b.nodes as f64 / a.nodes as f64).ln())
                }
                _ => None,
            };
            let names: Vec<String> =
                ps.first().map(|p| p.pass_ms.iter().map(|(n, _)| n.clone()).collect()).unwrap_or_default();
            let passes = names
                .into_iter()
                .map(|name| {
                    let at = |p: &ScalePoint| p.pass_ms.iter().find(|(n, _)| *n == name).map_or(0.0, |x| x.1);
                    let last = ps.last().map_or(0.0, |p| at(p));
                    let fit = fit_power_law(&xy(&at));
                    (name, fit, last)
                })
                .collect();
            FamilyFit {
                family: f.to_string(),
                build: fit_power_law(&xy(&|p| p.build_ms)),
                top_slope,
                passes,
                verify: fit_power_law(&xy(&|p| p.verify_ms)),
            }
        })
        .collect()
}

fn exp_cell(f: &Option<PowerFit>) -> String {
    match f {
        Some(f) if f.exponent > SUPERLINEAR => format!("**{:.2}**", f.exponent),
        Some(f) => format!("{:.2}", f.exponent),
        None => "-".into(),
    }
}

fn status(ok: Option<bool>) -> &'static str {
    match ok {
        Some(true) => "met",
        Some(false) => "**MISSED**",
        None => "not measured",
    }
}

fn point<'a>(r: &'a Report, family: &str, target: usize) -> Option<&'a ScalePoint> {
    r.scaling.iter().find(|p| p.family == family && p.target == target)
}

/// The Markdown report.
pub fn markdown(r: &Report) -> String {
    let mut s = String::new();
    let m = &r.machine;
    let _ = writeln!(s, "# cuplan benchmark report\n");
    let _ = writeln!(
        s,
        "`cargo xtask bench{}` — {} on {} ({} cores, {:.0} GiB), {}, commit {}; took {:.0} s wall{}{}.\n",
        if r.quick { " --quick" } else { "" },
        m.date,
        m.cpu,
        m.cores,
        m.mem_gib,
        m.rustc,
        m.commit,
        r.duration_s,
        r.cpu_s.map_or(String::new(), |c| format!(", {c:.0} s on CPU")),
        r.load_avg.map_or(String::new(), |l| format!(", load average {l:.1} at the start")),
    );
    let _ = writeln!(
        s,
        "Compile time is the time of `ExecutionPlan::build_with` (all passes, {} streams, H200 profile) through \
         the library in a release build: the median of repeated runs after one warm-up run (a single run when \
         one run is long). Times are **on-CPU time** of the process (`CLOCK_PROCESS_CPUTIME_ID`, every \
         thread's: the stream pass runs beside lowering from 256 fused groups with several streams and from \
         1,024 with one, the stream pass's smaller stream counts beside its largest from 256 groups, and \
         lowering and the report split across threads from 16,384 kernels, so on-CPU time exceeds wall time \
         there, and equals it on an idle machine below); this machine is shared, so wall times (given beside \
         the targets and in `report.json`) include waiting for a core. Per-pass times come from the \
         pipeline's `pass` tracing spans. Makespans are exec-sim's timing model (the shared \
         evaluator `graph_plan::timing`, CUDA-graph launch overhead) over the plan's steps.\n",
        r.streams
    );

    // Targets.
    let t100 = point(r, "transformer", 100_000);
    let t1m = point(r, "transformer", 1_000_000);
    let fits = family_fits(&r.scaling);
    let tfit = fits.iter().find(|f| f.family == "transformer").and_then(|f| f.build);
    let mut rows = Vec::new();
    rows.push(vec![
        format!("transformer 100k nodes, full build, {} streams", r.streams),
        t100.map_or("-".into(), |p| {
            format!(
                "{} ms (wall {}; {} nodes)",
                fmt::ms(p.build_ms),
                fmt::ms(p.build_wall_ms),
                fmt::count(p.nodes as u64)
            )
        }),
        format!("< {} ms", target::BUILD_100K_MS),
        status(t100.map(|p| p.build_ms < target::BUILD_100K_MS)).into(),
    ]);
    rows.push(vec![
        "transformer 1M nodes, full build".into(),
        t1m.map_or_else(
            || match tfit {
                Some(f) => format!("- (full run only; the fit predicts {} ms)", fmt::ms(f.at(1e6))),
                None => "- (full run only)".into(),
            },
            |p| {
                format!(
                    "{} ms (wall {}; {} nodes)",
                    fmt::ms(p.build_ms),
                    fmt::ms(p.build_wall_ms),
                    fmt::count(p.nodes as u64)
                )
            },
        ),
        format!("< {} ms", target::BUILD_1M_MS),
        status(t1m.map(|p| p.build_ms < target::BUILD_1M_MS)).into(),
    ]);
    rows.push(vec![
        "transformer compile-time exponent".into(),
        tfit.map_or("-".into(), |f| format!("{:.3} (r² {:.3}, {} sizes)", f.exponent, f.r2, f.points)),
        format!("<= {}", target::EXPONENT),
        status(tfit.map(|f| f.exponent <= target::EXPONENT)).into(),
    ]);
    if let Some(v) = &r.verify {
        let at_scale = v.steps >= 1_000_000;
        rows.push(vec![
            "verify of a 1M-step plan".into(),
            format!(
                "{} ms (wall {}; {} steps; {})",
                fmt::ms(v.verify_ms),
                fmt::ms(v.verify_wall_ms),
                fmt::count(v.steps as u64),
                v.label
            ),
            format!("< {} ms", target::VERIFY_1M_MS),
            if at_scale {
                status(Some(v.verify_ms < target::VERIFY_1M_MS)).into()
            } else {
                format!(
                    "not at scale (--quick); linear extrapolation to 1M steps: {} ms",
                    fmt::ms(v.verify_ms * 1e6 / v.steps.max(1) as f64)
                )
            },
        ]);
    }
    let _ = writeln!(s, "## Targets\n");
    s.push_str(&md_table(
        &["target", "measured", "limit", "status"],
        &[Align::Left, Align::Right, Align::Right, Align::Left],
        &rows,
    ));
    s.push('\n');

    // Plan table.
    let _ = writeln!(s, "## Plans: shared models and synthetic families\n");
    let _ = writeln!(
        s,
        "{} streams. Launches: non-view nodes -> launch steps. ORT nodes: onnxruntime's ENABLE_ALL graph as \
         recorded in `models/README.md`. Pool / bound / naive: activation pool, the fixed-order lower \
         bound, and the pool without reuse (DESIGN.md section 5). Synthetic families at about {} nodes.\n",
        r.streams,
        r.synth.first().map_or("-".into(), |p| fmt::count(p.nodes as u64))
    );
    let ort_readme: BTreeMap<&str, usize> = r.readme.iter().map(|x| (x.model.as_str(), x.ort_nodes)).collect();
    let mut rows: Vec<Vec<String>> =
        r.models.iter().map(|m| plan_cells(m, ort_readme.get(m.name.as_str()).copied())).collect();
    rows.extend(r.synth.iter().map(|m| plan_cells(m, None)));
    s.push_str(&md_table(&PLAN_HEADER, &[Align::Left], &rows));
    if !r.models_missing.is_empty() {
        let _ = writeln!(
            s,
            "\nNot found (skipped): {} — looked in {}.",
            r.models_missing.join(", "),
            r.shared_dir.as_deref().unwrap_or("no shared/ directory beside the workspace (set CUPLAN_SHARED_DIR)")
        );
    }
    let bad: Vec<String> = r
        .models
        .iter()
        .chain(&r.synth)
        .filter(|m| m.violations > 0)
        .map(|m| format!("{} ({})", m.name, m.violations))
        .collect();
    if !bad.is_empty() {
        let _ = writeln!(s, "\n**`graph_plan::verify` found violations in:** {}.", bad.join(", "));
    }
    s.push('\n');
    stats_section(&mut s, r);

    // onnxruntime.
    let _ = writeln!(s, "## onnxruntime beside cuplan\n");
    match &r.ort {
        Some(run) => {
            let _ = writeln!(
                s,
                "onnxruntime {} (Python), ORT_ENABLE_ALL, CPU execution provider, one intra-op thread: \
                 `InferenceSession` creation from the serialised model (stripped weights filled as \
                 `ort_check.py` fills them), median of {} runs, measured in this run, process CPU time. \
                 cuplan: ONNX import and compile, medians, on-CPU time. Both include work the other does \
                 not (onnxruntime: kernel creation and weight pre-packing; cuplan: memory and stream \
                 planning), so the ratio says how heavy each front end is, not which is better.\n",
                run.version,
                run.models.values().next().map_or(0, |m| m.session_ms.len())
            );
            let rows: Vec<Vec<String>> = r
                .models
                .iter()
                .map(|m| {
                    let o = run.models.get(&m.name);
                    let sess = o.and_then(|o| median(&o.session_ms));
                    vec![
                        m.name.clone(),
                        ort_readme.get(m.name.as_str()).map_or("-".into(), |n| n.to_string()),
                        o.and_then(|o| o.optimized_nodes).map_or("-".into(), |n| n.to_string()),
                        m.launches_fused.to_string(),
                        sess.map_or("-".into(), fmt::ms),
                        m.import_ms.map_or("-".into(), fmt::ms),
                        fmt::ms(m.compile_ms),
                        sess.map_or("-".into(), |t| {
                            format!("{:.1}x", t / (m.compile_ms + m.import_ms.unwrap_or(0.0)).max(1e-9))
                        }),
                    ]
                })
                .collect();
            s.push_str(&md_table(
                &[
                    "model",
                    "ORT nodes (README)",
                    "ORT nodes (this run)",
                    "cuplan launches",
                    "ORT session ms",
                    "cuplan import ms",
                    "cuplan compile ms",
                    "ORT / cuplan time",
                ],
                &[Align::Left],
                &rows,
            ));
        }
        None => {
            let _ = writeln!(
                s,
                "Not measured: {}. Node counts from the README are in the plan table.",
                r.ort_note.as_deref().unwrap_or("no models")
            );
        }
    }
    s.push('\n');

    // Makespan sweep.
    let _ = writeln!(s, "## Makespan against its bound by stream count\n");
    let sweep: Vec<usize> =
        r.models.iter().chain(&r.synth).flat_map(|m| m.by_streams.iter().map(|p| p.max_streams)).fold(
            Vec::new(),
            |mut v, x| {
                if !v.contains(&x) {
                    v.push(x);
                }
                v
            },
        );
    let mut head = vec!["model".to_string()];
    head.extend(sweep.iter().map(|k| format!("{k} stream{}", if *k == 1 { "" } else { "s" })));
    let rows: Vec<Vec<String>> = r
        .models
        .iter()
        .chain(&r.synth)
        .map(|m| {
            let mut row = vec![m.name.clone()];
            for k in &sweep {
                row.push(m.by_streams.iter().find(|p| p.max_streams == *k).map_or("-".into(), |p| {
                    format!(
                        "{} us ({}; {} ev)",
                        fmt::ms(p.makespan_us),
                        p.bound_us.map_or("n/a".into(), |b| fmt::ratio(ratio(p.makespan_us, b))),
                        p.events
                    )
                }));
            }
            row
        })
        .collect();
    let head_ref: Vec<&str> = head.iter().map(String::as_str).collect();
    let dag = r.models.iter().chain(&r.synth).all(|m| m.by_streams.iter().all(|p| p.bound_us.is_some()));
    let _ = writeln!(
        s,
        "Each cell: modelled makespan (makespan / bound; events). {}\n",
        if dag {
            "Bound: `PlanStats::makespan_bound_us`, DESIGN.md section 5's max(critical path, area) over the \
             group DAG, the same for every stream assignment. The tighter `energetic_bound_us` (lengthened where \
             launches that must run between two ordered launches need more device time than the path between \
             them, `graph_passes::timing`) is in `report.json`."
        } else {
            "**Bound n/a:** this build's `PlanStats` has no `makespan_bound_us` (the assignment-independent \
             bound of DESIGN.md section 5, added by the streams issue); compare makespans across stream counts \
             instead. The timing model's bound over each plan's own stream order (met trivially by a serial \
             plan) is in `report.json` as `stream_order_bound_us`."
        }
    );
    s.push_str(&md_table(&head_ref, &[Align::Left], &rows));
    s.push('\n');

    // Scaling.
    let _ = writeln!(s, "## Compile time against graph size\n");
    let passes: Vec<String> =
        r.scaling.first().map(|p| p.pass_ms.iter().map(|x| x.0.clone()).collect()).unwrap_or_default();
    let mut head = vec!["family".to_string(), "nodes".into(), "build ms".into(), "us / node".into()];
    head.extend(passes.iter().cloned());
    head.extend(["verify ms".to_string(), "steps".into(), "events".into()]);
    let rows: Vec<Vec<String>> = r
        .scaling
        .iter()
        .map(|p| {
            let mut row = vec![
                p.family.clone(),
                fmt::count(p.nodes as u64),
                format!("{} (x{})", fmt::ms(p.build_ms), p.build_samples_ms.len()),
                format!("{:.2}", p.build_ms * 1e3 / p.nodes.max(1) as f64),
            ];
            row.extend(
                passes.iter().map(|n| p.pass_ms.iter().find(|x| &x.0 == n).map_or("-".into(), |x| fmt::ms(x.1))),
            );
            row.extend([fmt::ms(p.verify_ms), fmt::count(p.steps as u64), fmt::count(p.events as u64)]);
            row
        })
        .collect();
    let head_ref: Vec<&str> = head.iter().map(String::as_str).collect();
    let _ = writeln!(s, "Milliseconds (medians; `xN`: runs behind the build median), {} streams.\n", r.streams);
    s.push_str(&md_table(&head_ref, &[Align::Left], &rows));
    s.push('\n');
    let _ = writeln!(
        s,
        "Fitted exponents (least squares of log time on log nodes over every size; bold above {SUPERLINEAR}); \
         `top` is the slope between the two largest sizes, where super-linear growth shows first.\n"
    );
    let mut head = vec!["family".to_string(), "build".into(), "r²".into(), "top".into()];
    head.extend(passes.iter().cloned());
    head.push("verify".into());
    let rows: Vec<Vec<String>> = fits
        .iter()
        .map(|f| {
            let mut row = vec![
                f.family.clone(),
                exp_cell(&f.build),
                f.build.map_or("-".into(), |b| format!("{:.3}", b.r2)),
                f.top_slope.map_or("-".into(), |t| format!("{t:.2}")),
            ];
            row.extend(
                passes.iter().map(|n| f.passes.iter().find(|x| &x.0 == n).map_or("-".into(), |x| exp_cell(&x.1))),
            );
            row.push(exp_cell(&f.verify));
            row
        })
        .collect();
    let head_ref: Vec<&str> = head.iter().map(String::as_str).collect();
    s.push_str(&md_table(&head_ref, &[Align::Left], &rows));
    let broken: Vec<String> = r
        .scaling
        .iter()
        .filter(|p| p.violations > 0)
        .map(|p| format!("{} at {} nodes ({})", p.family, fmt::count(p.nodes as u64), p.violations))
        .chain(r.verify.iter().filter(|v| v.violations > 0).map(|v| format!("{} ({})", v.label, v.violations)))
        .collect();
    if !broken.is_empty() {
        let _ = writeln!(s, "\n**`graph_plan::verify` found violations in:** {}.", broken.join(", "));
    }
    let flags = superlinear_flags(&fits);
    s.push('\n');
    if flags.is_empty() {
        let _ = writeln!(s, "No family or pass taking {FLAG_MIN_MS} ms or more grows faster than N^{SUPERLINEAR}.");
    } else {
        let _ = writeln!(s, "**Super-linear (exponent above {SUPERLINEAR}):**\n");
        for f in &flags {
            let _ = writeln!(s, "- {f}");
        }
    }
    s.push('\n');

    // Packing.
    let _ = writeln!(s, "## Packing core on the MiniMalloc instances\n");
    if r.packs.is_empty() {
        let _ = writeln!(s, "No instances found (`shared/bench/minimalloc/*.csv`).\n");
    } else {
        let same = r.packs.iter().all(|p| p.height == p.greedy_height);
        let effort = match r.packs.first().and_then(|p| p.effort) {
            Some(e) => format!("search effort {} (quick run; the default budget in a full run)", fmt::count(e)),
            None => "default options".into(),
        };
        let _ = writeln!(
            s,
            "`graph_passes::memory::pack` (the core of `cuplan pack`) with {effort}, alignment 1, median time; \
             `greedy` is this task's own greedy-by-size best fit, for reference. Valid: no two buffers live \
             together share bytes (checked here). Optimal / strategy: what the packer reports (`n/a` where this \
             build's `Packing` does not serialise them: the packing issue adds them).{}\n",
            if same {
                " **The packing core gives the greedy heights on every instance: it is still the baseline.**"
            } else {
                ""
            }
        );
        let rows: Vec<Vec<String>> = r.packs.iter().map(pack_cells).collect();
        s.push_str(&md_table(&PACK_HEADER, &[Align::Left], &rows));
        s.push('\n');
    }

    // Memory-aware ordering.
    let _ = writeln!(s, "## Memory-aware ordering\n");
    if r.orders.is_empty() {
        let _ = writeln!(s, "Not measured.\n");
    } else {
        let _ = writeln!(
            s,
            "`cuplan plan --order memory` (one stream): the pool's lower bound (DESIGN.md 5) of the graph's own \
             order and of the order chosen (`node`: node-level order before fusion; `group`: the fused groups \
             reordered; `node+group`: both; `given`: nothing lower), ratio chosen / given. Optimal: the exact \
             search over downsets finished on the plan's groups, so no order of them has a lower bound (without \
             in-place handovers); `given` + optimal proves the graph's own order already optimal. Build: median \
             ms of the whole build with the search.\n"
        );
        let rows: Vec<Vec<String>> = r.orders.iter().map(order_cells).collect();
        s.push_str(&md_table(&ORDER_HEADER, &[Align::Left], &rows));
        s.push('\n');
    }

    super::sets::section(&mut s, &r.sets);
    // The peer.
    let _ = writeln!(s, "## Against oxicuda-graph 0.5.5\n");
    if r.peers.is_empty() {
        let _ = writeln!(s, "Not measured.\n");
    } else {
        let _ = writeln!(
            s,
            "The same synthetic graphs built in oxicuda-graph 0.5.5 (`cuplan_benches::peer`: a kernel node per graph \
             node, a buffer per tensor) and planned by both at default options, interleaved runs, medians. Ratio = \
             oxicuda ms / cuplan ms (above 1: cuplan is faster). Pools over cuplan's lower bound for its launch \
             order (DESIGN.md 5).\n"
        );
        let rows: Vec<Vec<String>> = r.peers.iter().map(peer_cells).collect();
        s.push_str(&md_table(&PEER_HEADER, &[Align::Left], &rows));
        s.push('\n');
    }

    // Plots.
    let _ = writeln!(s, "## Plots\n");
    for (file, what) in PLOTS {
        let _ = writeln!(s, "- [{what}]({file})");
    }
    if !r.notes.is_empty() {
        let _ = writeln!(s, "\n## Notes\n");
        for n in &r.notes {
            let _ = writeln!(s, "- {n}");
        }
    }
    s
}

/// The "Plan statistics" section: the [`STAT_FIELDS`] of every plan, and why any column is `n/a`.
fn stats_section(s: &mut String, r: &Report) {
    let plans: Vec<&PlanRow> = r.models.iter().chain(&r.synth).collect();
    if plans.is_empty() {
        return;
    }
    let _ = writeln!(s, "## Plan statistics\n");
    let _ = writeln!(
        s,
        "The plans of the table above, from their `PlanStats` ({} streams): reuse edges and in-place writes \
         of the memory plan, cross-stream edges before event reduction and waits after it, chains of the \
         minimum chain decomposition, the critical path and the one-stream makespan (the bound's two \
         ingredients), the bound with the stream limit, and bytes moved with and without fusion.\n",
        r.streams
    );
    let mut head = vec!["model"];
    head.extend(STAT_FIELDS.iter().map(|f| f.header));
    let rows: Vec<Vec<String>> = plans.iter().map(|m| stat_cells(m)).collect();
    s.push_str(&md_table(&head, &[Align::Left], &rows));
    let mut all = STAT_FIELDS.to_vec();
    all.push(MAKESPAN_BOUND);
    let notes = fields::absent_notes(plans.iter().map(|m| &m.stats), &all, "`PlanStats`");
    if !notes.is_empty() {
        s.push('\n');
        for n in notes {
            let _ = writeln!(s, "- {n}");
        }
    }
    s.push('\n');
}

/// The MiniMalloc table's header.
pub const PACK_HEADER: [&str; 12] = [
    "instance",
    "buffers",
    "lower bound",
    "capacity",
    "height",
    "height / capacity",
    "height / bound",
    "ms",
    "valid",
    "optimal",
    "strategy",
    "greedy (/ capacity)",
];

/// Columns of the memory-aware ordering table.
pub const ORDER_HEADER: [&str; 8] =
    ["graph", "nodes", "bound given", "bound chosen", "chosen / given", "order", "optimal", "build ms"];

/// The cells of one row of the ordering table (see [`ORDER_HEADER`]).
pub fn order_cells(o: &OrderRow) -> Vec<String> {
    vec![
        o.name.clone(),
        fmt::count(o.nodes as u64),
        fmt::count(o.given_bytes),
        fmt::count(o.chosen_bytes),
        format!("{:.4}", ratio(o.chosen_bytes as f64, o.given_bytes as f64)),
        if o.verified { o.chosen.clone() } else { format!("{} (**plan failed verify**)", o.chosen) },
        if o.optimal { "yes".into() } else { "not proved".into() },
        fmt::ms(o.build_ms),
    ]
}

/// The cells of one row of the MiniMalloc table (see [`PACK_HEADER`]).
pub fn pack_cells(p: &PackRow) -> Vec<String> {
    vec![
        p.name.clone(),
        p.buffers.to_string(),
        fmt::count(p.lower_bound),
        p.capacity.map_or("-".into(), fmt::count),
        fmt::count(p.height),
        p.capacity.map_or("-".into(), |c| fmt::ratio(p.height as f64 / c as f64)),
        fmt::ratio(p.height as f64 / p.lower_bound.max(1) as f64),
        fmt::ms(p.ms),
        if p.valid { "yes".into() } else { "**NO**".into() },
        p.optimal.map_or("n/a".into(), |o| if o { "yes".into() } else { "no".into() }),
        p.strategy.clone().unwrap_or_else(|| "n/a".into()),
        format!(
            "{} ({})",
            fmt::count(p.greedy_height),
            p.capacity.map_or("-".into(), |c| fmt::ratio(p.greedy_height as f64 / c as f64))
        ),
    ]
}

/// The plot files and what they show.
pub const PLOTS: [(&str, &str); 5] = [
    ("compile_scaling.svg", "compile time against graph size (log-log, linear reference)"),
    ("pass_share.svg", "per-pass share of compile time"),
    ("pool_ratio.svg", "pool / lower bound per model"),
    ("launches.svg", "launches before and after fusion per model"),
    ("makespan.svg", "makespan / bound per model and stream count"),
];

/// Lines naming every super-linear family and pass.
pub fn superlinear_flags(fits: &[FamilyFit]) -> Vec<String> {
    let mut out = Vec::new();
    for f in fits {
        if let Some(b) = f.build.filter(|b| b.exponent > SUPERLINEAR) {
            out.push(format!("{}: whole build N^{:.2}", f.family, b.exponent));
        }
        for (name, fit, last_ms) in &f.passes {
            if let Some(p) = fit.filter(|p| p.exponent > SUPERLINEAR && *last_ms >= FLAG_MIN_MS) {
                out.push(format!(
                    "{}: pass `{name}` N^{:.2} ({} ms at the largest size)",
                    f.family,
                    p.exponent,
                    fmt::ms(*last_ms)
                ));
            }
        }
        if let Some(v) = f.verify.filter(|v| v.exponent > SUPERLINEAR) {
            out.push(format!("{}: verify N^{:.2}", f.family, v.exponent));
        }
    }
    out
}

fn draw_plots(r: &Report, out: &Path) -> Result<()> {
    // Compile time against size.
    let fams: Vec<String> = r.scaling.iter().map(|p| p.family.clone()).fold(Vec::new(), |mut v, f| {
        if !v.contains(&f) {
            v.push(f);
        }
        v
    });
    let series: Vec<Series> = fams
        .iter()
        .map(|f| Series {
            name: f.clone(),
            points: r.scaling.iter().filter(|p| &p.family == f).map(|p| (p.nodes as f64, p.build_ms)).collect(),
        })
        .collect();
    plot::loglog(
        &out.join(PLOTS[0].0),
        &format!("Compile time (full build, {} streams)", r.streams),
        "graph nodes",
        "milliseconds",
        &series,
        Some(1.0),
    )?;

    // Per-pass share: each family at its largest size, then the models.
    let mut rows = Vec::new();
    let mut shares: Vec<Vec<(String, f64)>> = Vec::new();
    for f in &fams {
        if let Some(p) = r.scaling.iter().filter(|p| &p.family == f).max_by_key(|p| p.nodes) {
            rows.push(format!("{f} {}", fmt::count(p.nodes as u64)));
            shares.push(p.pass_ms.clone());
        }
    }
    for m in &r.models {
        rows.push(m.name.clone());
        shares.push(m.pass_ms.clone());
    }
    let names: Vec<String> = shares.first().map(|s| s.iter().map(|x| x.0.clone()).collect()).unwrap_or_default();
    let groups: Vec<(String, Vec<f64>)> = names
        .iter()
        .map(|n| {
            let vals = shares
                .iter()
                .map(|s| {
                    let total: f64 = s.iter().map(|x| x.1).sum();
                    s.iter().find(|x| &x.0 == n).map_or(0.0, |x| 100.0 * x.1 / total.max(1e-12))
                })
                .collect();
            (n.clone(), vals)
        })
        .collect();
    Bars {
        title: "Share of compile time per pass",
        x_desc: "% of build time",
        rows: &rows,
        groups: &groups,
        layout: Layout::Stacked,
        log_x: false,
        reference: None,
    }
    .draw(&out.join(PLOTS[1].0))?;

    let plans: Vec<&PlanRow> = r.models.iter().chain(&r.synth).collect();
    let rows: Vec<String> = plans.iter().map(|m| m.name.clone()).collect();
    Bars {
        title: "Activation pool / fixed-order lower bound",
        x_desc: "pool / bound (1.00 is perfect for the order)",
        rows: &rows,
        groups: &[(
            "pool / bound".into(),
            plans.iter().map(|m| ratio(m.pool_bytes as f64, m.lower_bound_bytes as f64)).collect(),
        )],
        layout: Layout::Grouped,
        log_x: false,
        reference: Some(1.0),
    }
    .draw(&out.join(PLOTS[2].0))?;
    Bars {
        title: "Kernel launches before and after fusion",
        x_desc: "launches (log scale)",
        rows: &rows,
        groups: &[
            ("before (non-view nodes)".into(), plans.iter().map(|m| m.launches_orig as f64).collect()),
            ("after fusion".into(), plans.iter().map(|m| m.launches_fused as f64).collect()),
        ],
        layout: Layout::Grouped,
        log_x: true,
        reference: None,
    }
    .draw(&out.join(PLOTS[3].0))?;
    let sweep: Vec<usize> =
        plans.first().map(|m| m.by_streams.iter().map(|p| p.max_streams).collect()).unwrap_or_default();
    let (groups, has_bound) = makespan_groups(&plans, &sweep);
    let (title, x_desc) = if has_bound {
        ("Modelled makespan / bound", "makespan / bound (1.00 is optimal)")
    } else {
        (
            "Modelled makespan / 1-stream makespan (bound n/a in this build)",
            "makespan / makespan on one stream (lower is better)",
        )
    };
    Bars { title, x_desc, rows: &rows, groups: &groups, layout: Layout::Grouped, log_x: false, reference: Some(1.0) }
        .draw(&out.join(PLOTS[4].0))?;
    Ok(())
}

/// The bars of the makespan plot, one group per stream count of `sweep`: makespan / bound where every plan
/// carries the bound (second value `true`), else makespan / the plan's own one-stream makespan (`false`;
/// NaN where a plan has no one-stream point).
pub fn makespan_groups(plans: &[&PlanRow], sweep: &[usize]) -> (Vec<(String, Vec<f64>)>, bool) {
    let has_bound = plans.iter().all(|m| m.by_streams.iter().all(|p| p.bound_us.is_some()));
    let groups = sweep
        .iter()
        .map(|k| {
            let vals = plans
                .iter()
                .map(|m| {
                    let Some(p) = m.by_streams.iter().find(|p| p.max_streams == *k) else { return f64::NAN };
                    let base = if has_bound {
                        p.bound_us
                    } else {
                        m.by_streams.iter().find(|q| q.max_streams == 1).map(|q| q.makespan_us)
                    };
                    base.map_or(f64::NAN, |b| ratio(p.makespan_us, b))
                })
                .collect();
            (format!("{k} stream{}", if *k == 1 { "" } else { "s" }), vals)
        })
        .collect();
    (groups, has_bound)
}

/// The report as `docs/benchmarks.md` records it: a title and a note on how to regenerate it, then the report
/// with its plot links pointing at the run's output directory (`plots_rel`, relative to `docs/`).
pub fn as_doc(md: &str, plots_rel: &str, quick: bool) -> String {
    let body = md.strip_prefix("# cuplan benchmark report\n").unwrap_or(md);
    let mut body = body.to_string();
    for (file, _) in PLOTS {
        body = body.replace(&format!("]({file})"), &format!("]({plots_rel}/{file})"));
    }
    let which = if quick {
        "The last report of `cargo xtask bench --quick` (the CI-sized suite: sizes up to 100k nodes, fewer \
         repetitions, a capped packing search; a full `cargo xtask bench --record` replaces it), recorded with \
         `--record`"
    } else {
        "The last full report of `cargo xtask bench`, recorded with `cargo xtask bench --record` (which rewrites \
         this file; `--quick` runs the CI-sized suite)"
    };
    format!(
        "# Benchmarks\n\n{which}. The plots are written beside the report \
         in `target/cuplan-report/` by every run. Criterion benches of the same inputs: \
         `cargo bench -p cuplan-benches` (`--bench pipeline`: per pass and whole build, one and four streams, \
         and verify, at 1k, 10k and 100k nodes, 1M with `--features huge`; `--bench verify`: the 1M-step plan; \
         `--bench sim`: exec-sim on a transformer block).\n{body}"
    )
}

/// Write `report.md`, `report.json` and the plots into `out`; return the Markdown.
pub fn write(r: &Report, out: &Path) -> Result<String> {
    let md = markdown(r);
    std::fs::write(out.join("report.md"), &md).with_context(|| format!("writing {}", out.display()))?;
    let json = serde_json::to_string_pretty(r).context("serialising the report")?;
    std::fs::write(out.join("report.json"), json).context("writing report.json")?;
    draw_plots(r, out).context("drawing the plots")?;
    Ok(md)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::measure::StreamPoint;

    fn row() -> PlanRow {
        PlanRow {
            name: "resnet50".into(),
            source: "onnx",
            nodes: 122,
            launches_orig: 120,
            launches_fused: 60,
            pool_bytes: 12 << 20,
            lower_bound_bytes: 10 << 20,
            naive_bytes: 100 << 20,
            events: 7,
            makespan_us: 150.0,
            makespan_bound_us: Some(120.0),
            stream_order_bound_us: 150.0,
            compile_ms: 3.456,
            compile_wall_ms: 4.0,
            compile_reps: 5,
            pass_ms: vec![],
            import_ms: Some(1.0),
            by_streams: vec![StreamPoint {
                max_streams: 1,
                streams: 1,
                events: 0,
                makespan_us: 2.0,
                bound_us: Some(1.0),
                stream_order_bound_us: 2.0,
            }],
            violations: 0,
            stats: [("reuse_edges".to_string(), 17.0), ("makespan_bound_us".to_string(), 120.0)].into(),
        }
    }

    #[test]
    fn ratios_are_undefined_for_a_zero_denominator() {
        assert_eq!(ratio(3.0, 2.0), 1.5);
        assert!(ratio(3.0, 0.0).is_nan());
        assert!(ratio(3.0, -1.0).is_nan());
        assert_eq!(fmt::ratio(ratio(1.0, 0.0)), "-");
    }

    #[test]
    fn plan_row_cells_follow_the_header() {
        let c = plan_cells(&row(), Some(58));
        assert_eq!(c.len(), PLAN_HEADER.len());
        assert_eq!(
            c,
            vec![
                "resnet50",
                "122",
                "120 -> 60",
                "58",
                "12.00 / 10.00 / 100.00 MiB (1.20x bound)",
                "7",
                "150 / 120 us (1.25)",
                "3.46"
            ]
        );
        assert_eq!(plan_cells(&row(), None)[3], "-");
    }

    fn sp(family: &str, nodes: usize, build_ms: f64, memory_ms: f64) -> ScalePoint {
        ScalePoint {
            family: family.into(),
            target: nodes,
            nodes,
            streams: 4,
            build_ms,
            build_wall_ms: build_ms,
            build_samples_ms: vec![build_ms],
            pass_ms: vec![("topo".into(), build_ms / 10.0), ("memory".into(), memory_ms)],
            verify_ms: build_ms / 5.0,
            violations: 0,
            steps: nodes,
            launches: nodes,
            events: 0,
            synth_ms: 0.0,
        }
    }

    #[test]
    fn fits_find_the_superlinear_pass() {
        let mut pts = Vec::new();
        for n in [1_000usize, 10_000, 100_000] {
            let x = n as f64;
            pts.push(sp("chain", n, 1e-3 * x, 1e-7 * x * x));
        }
        let fits = family_fits(&pts);
        assert_eq!(fits.len(), 1);
        assert!((fits[0].build.unwrap().exponent - 1.0).abs() < 1e-9);
        assert!((fits[0].top_slope.unwrap() - 1.0).abs() < 1e-9);
        let flags = superlinear_flags(&fits);
        assert_eq!(flags.len(), 1, "{flags:?}");
        assert!(flags[0].contains("`memory` N^2.00"), "{flags:?}");
    }

    #[test]
    fn the_recorded_doc_links_plots_in_the_output_directory() {
        let md = "# cuplan benchmark report\n\nbody\n- [plot](compile_scaling.svg)\n";
        let doc = as_doc(md, "../target/cuplan-report", false);
        assert!(doc.contains("The last full report"));
        assert!(as_doc(md, "x", true).contains("The last report of `cargo xtask bench --quick`"));
        assert!(doc.starts_with("# Benchmarks\n"));
        assert!(!doc.contains("# cuplan benchmark report"));
        assert!(doc.contains("- [plot](../target/cuplan-report/compile_scaling.svg)"), "{doc}");
    }

    #[test]
    fn markdown_states_targets_and_missing_models() {
        let mut r = Report { streams: 4, ..Default::default() };
        r.scaling = vec![sp("transformer", 10_000, 40.0, 1.0), sp("transformer", 100_000, 600.0, 1.0)];
        r.models_missing = vec!["bert_base".into()];
        let md = markdown(&r);
        assert!(md.contains("| transformer 100k nodes, full build, 4 streams"), "{md}");
        assert!(md.contains("600 ms (wall 600; 100,000 nodes)"), "{md}");
        assert!(md.contains("**MISSED**"), "{md}");
        assert!(md.contains("Not found (skipped): bert_base"), "{md}");
        assert!(md.contains("- (full run only; the fit predicts"), "{md}");
    }

    fn pack(optimal: Option<bool>, strategy: Option<&str>) -> PackRow {
        PackRow {
            name: "A.1048576".into(),
            buffers: 154,
            lower_bound: 1_048_576,
            capacity: Some(1_048_576),
            height: 1_310_720,
            ms: 0.5,
            valid: true,
            greedy_height: 1_374_208,
            optimal,
            strategy: strategy.map(str::to_string),
            effort: None,
        }
    }

    #[test]
    fn order_cells_follow_the_header() {
        let mut o = OrderRow {
            name: "random_dag".into(),
            nodes: 2000,
            given_bytes: 40192,
            chosen_bytes: 38656,
            chosen: "group".into(),
            optimal: false,
            build_ms: 12.5,
            verified: true,
        };
        let c = order_cells(&o);
        assert_eq!(c.len(), ORDER_HEADER.len());
        assert_eq!(c[1..7], ["2,000", "40,192", "38,656", "0.9618", "group", "not proved"]);
        o.verified = false;
        o.optimal = true;
        let c = order_cells(&o);
        assert_eq!(c[5], "group (**plan failed verify**)");
        assert_eq!(c[6], "yes");
    }

    #[test]
    fn pack_cells_follow_the_header_and_say_na_without_the_packers_report() {
        let c = pack_cells(&pack(None, None));
        assert_eq!(c.len(), PACK_HEADER.len());
        assert_eq!(
            c,
            vec![
                "A.1048576",
                "154",
                "1,048,576",
                "1,048,576",
                "1,310,720",
                "1.25",
                "1.25",
                "0.500",
                "yes",
                "n/a",
                "n/a",
                "1,374,208 (1.31)"
            ]
        );
        let c = pack_cells(&pack(Some(true), Some("Search")));
        assert_eq!((c[9].as_str(), c[10].as_str()), ("yes", "Search"));
    }

    #[test]
    fn makespan_without_the_bound_is_na_and_the_plot_falls_back_to_one_stream() {
        assert_eq!(makespan_cell(150.0, Some(120.0)), "150 / 120 us (1.25)");
        assert_eq!(makespan_cell(150.0, None), "150 us / n/a");
        let mut a = row();
        a.by_streams = [(1, 200.0), (4, 100.0)]
            .iter()
            .map(|&(k, m)| StreamPoint {
                max_streams: k,
                streams: k,
                events: 0,
                makespan_us: m,
                bound_us: Some(80.0),
                stream_order_bound_us: m,
            })
            .collect();
        let (g, bound) = makespan_groups(&[&a], &[1, 4]);
        assert!(bound);
        assert_eq!(g, vec![("1 stream".to_string(), vec![2.5]), ("4 streams".to_string(), vec![1.25])]);
        for p in &mut a.by_streams {
            p.bound_us = None;
        }
        let (g, bound) = makespan_groups(&[&a], &[1, 4, 8]);
        assert!(!bound);
        assert_eq!(g[0].1, vec![1.0]);
        assert_eq!(g[1].1, vec![0.5]);
        assert!(g[2].1[0].is_nan(), "no 8-stream point");
    }

    #[test]
    fn the_statistics_table_prints_na_and_names_the_missing_fields() {
        let mut r = Report { streams: 4, ..Default::default() };
        let mut m = row();
        m.makespan_bound_us = None;
        m.by_streams[0].bound_us = None;
        m.stats = [("reuse_edges".to_string(), 17.0), ("in_place_count".to_string(), 2.0)].into();
        r.models = vec![m];
        let md = markdown(&r);
        assert!(md.contains("## Plan statistics"), "{md}");
        let stats = &md[md.find("## Plan statistics").unwrap()..];
        let line = stats.lines().find(|l| l.starts_with("| resnet50")).unwrap();
        assert!(line.contains(" 17 | "), "{line}");
        assert_eq!(line.matches("n/a").count(), STAT_FIELDS.len() - 2, "{line}");
        assert!(md.contains("`waits`: n/a — not in this build's `PlanStats` (added by the streams issue)"), "{md}");
        assert!(md.contains("`makespan_bound_us`: n/a"), "{md}");
        assert!(md.contains("150 us / n/a"), "{md}");
        assert!(md.contains("**Bound n/a:**"), "{md}");
        assert!(!md.contains("`reuse_edges`: n/a"), "{md}");
    }
}

/// One graph planned by both systems (see `cuplan_benches::peer`).
#[derive(Clone, Debug, Serialize)]
pub struct PeerRow {
    /// Family.
    pub family: String,
    /// Nodes of the graph.
    pub nodes: usize,
    /// Streams.
    pub streams: usize,
    /// Median ms of oxicuda-graph's `ExecutionPlan::build`.
    pub oxicuda_ms: f64,
    /// Median ms of cuplan's `ExecutionPlan::build_with`.
    pub cuplan_ms: f64,
    /// oxicuda's pool over cuplan's lower bound.
    pub oxicuda_pool_ratio: f64,
    /// cuplan's pool over its lower bound.
    pub cuplan_pool_ratio: f64,
}

const PEER_HEADER: [&str; 7] =
    ["family", "nodes", "streams", "oxicuda ms", "cuplan ms", "ratio", "pool/bound oxicuda / cuplan"];

fn peer_cells(p: &PeerRow) -> Vec<String> {
    vec![
        p.family.clone(),
        fmt::count(p.nodes as u64),
        p.streams.to_string(),
        format!("{:.1}", p.oxicuda_ms),
        format!("{:.1}", p.cuplan_ms),
        fmt::ratio(ratio(p.oxicuda_ms, p.cuplan_ms)),
        format!("{} / {}", fmt::ratio(p.oxicuda_pool_ratio), fmt::ratio(p.cuplan_pool_ratio)),
    ]
}
