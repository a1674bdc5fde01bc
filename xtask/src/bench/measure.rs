//! The measurements of the report: compile times (medians of repeated `ExecutionPlan::build_with` through the
//! library, per pass from the plan's own `pass_ms`), plan figures, verify times, and the packing core on the
//! MiniMalloc instances.

use super::clock::{by_pass, Elapsed, PassTimes, Stopwatch};
use super::fields;
use super::stats::median;
use anyhow::{Context, Result};
use cuplan_benches::{plan_timing, Family, MinimallocInstance};
use graph_ir::ComputeGraph;
use graph_passes::memory::pack::{self, Buffer, PackOptions};
use graph_plan::{ExecutionPlan, Pass, PlanOptions};
use serde::Serialize;
use std::collections::BTreeMap;

/// How many times to repeat a measurement: at least `min_reps`, at most `max_reps`, and no more than fit in
/// `budget_s` seconds judged from the first run; a first run longer than `single_above_s` is the only one.
#[derive(Clone, Copy, Debug)]
pub struct Sampler {
    /// Fewest repetitions.
    pub min_reps: usize,
    /// Most repetitions.
    pub max_reps: usize,
    /// Seconds to spend on one measurement, after the first run.
    pub budget_s: f64,
    /// A first run at least this long is kept as the single sample.
    pub single_above_s: f64,
}

impl Sampler {
    /// Repetitions after a first run of `first_s` seconds (1: keep the first run).
    pub fn reps_after(&self, first_s: f64) -> usize {
        if first_s >= self.single_above_s {
            return 1;
        }
        let fit = if first_s > 0.0 { (self.budget_s / first_s).floor() as usize } else { self.max_reps };
        fit.clamp(self.min_reps.max(1), self.max_reps.max(1))
    }

    /// Run `f` repeatedly and return each run's time and the last run's result. The first run warms caches
    /// and sets the repetition count (judged on on-CPU time); it is kept only when it is the single sample.
    pub fn run<T>(&self, mut f: impl FnMut() -> Result<T>) -> Result<(Vec<Elapsed>, T)> {
        let w = Stopwatch::start();
        let first = f()?;
        let e = w.elapsed();
        let reps = self.reps_after(e.ms() / 1e3);
        if reps <= 1 {
            return Ok((vec![e], first));
        }
        drop(first);
        let mut times = Vec::with_capacity(reps);
        let mut last = None;
        for _ in 0..reps {
            // Drop the previous result before building the next, so that huge plans are not held twice.
            drop(last.take());
            let w = Stopwatch::start();
            let out = f()?;
            times.push(w.elapsed());
            last = Some(out);
        }
        let last = last.context("no repetition ran")?;
        Ok((times, last))
    }
}

/// Median on-CPU (else wall) milliseconds and median wall milliseconds of `times`.
pub fn medians(times: &[Elapsed]) -> (f64, f64) {
    let ms: Vec<f64> = times.iter().map(Elapsed::ms).collect();
    let wall: Vec<f64> = times.iter().map(|e| e.wall_ms).collect();
    (median(&ms).unwrap_or(f64::NAN), median(&wall).unwrap_or(f64::NAN))
}

/// Median milliseconds of each pass over repeated builds, in pipeline order.
pub fn pass_medians(samples: &[Vec<(String, f64)>]) -> Vec<(String, f64)> {
    let mut out = Vec::new();
    for p in Pass::ALL {
        let xs: Vec<f64> =
            samples.iter().filter_map(|s| s.iter().find(|(n, _)| n == p.name()).map(|&(_, ms)| ms)).collect();
        if let Some(m) = median(&xs) {
            out.push((p.name().to_string(), m));
        }
    }
    out
}

/// Build a plan, recording its per-pass times: on-CPU from the pipeline's spans where the pass clock is
/// installed, else the plan's own wall-clock `pass_ms`.
pub fn build_recorded(
    graph: &ComputeGraph,
    opts: &PlanOptions,
    clock: Option<&PassTimes>,
    samples: &mut Vec<Vec<(String, f64)>>,
) -> Result<ExecutionPlan> {
    if let Some(c) = clock {
        c.take();
    }
    let plan = ExecutionPlan::build_with(graph, opts).with_context(|| format!("building {}", graph.name()))?;
    let passes = match clock {
        Some(c) => by_pass(&c.take()).into_iter().collect(),
        None => plan.stats().pass_ms.clone(),
    };
    samples.push(passes);
    Ok(plan)
}

/// A plan's makespan against its bound at one stream count.
#[derive(Clone, Debug, Serialize)]
pub struct StreamPoint {
    /// `max_streams` asked for.
    pub max_streams: usize,
    /// Streams the plan uses.
    pub streams: usize,
    /// Events of the plan.
    pub events: usize,
    /// Modelled makespan, microseconds.
    pub makespan_us: f64,
    /// The assignment-independent bound (`PlanStats::makespan_bound_us`), microseconds; `None` where this
    /// build's stats lack the field.
    pub bound_us: Option<f64>,
    /// The timing model's bound over the plan's own stream order (met trivially by a serial plan; kept in
    /// `report.json` for comparison, not judged against).
    pub stream_order_bound_us: f64,
}

/// The figures of one compiled graph (a shared model or a synth family at the table size).
#[derive(Clone, Debug, Serialize)]
pub struct PlanRow {
    /// Model or family name.
    pub name: String,
    /// `onnx` or `synth`.
    pub source: &'static str,
    /// Graph nodes.
    pub nodes: usize,
    /// Non-view nodes (launches before fusion).
    pub launches_orig: usize,
    /// Launch steps after fusion.
    pub launches_fused: usize,
    /// Activation pool bytes.
    pub pool_bytes: u64,
    /// Fixed-order lower bound of the pool.
    pub lower_bound_bytes: u64,
    /// Pool with no reuse.
    pub naive_bytes: u64,
    /// Events at the table's stream count.
    pub events: usize,
    /// Modelled makespan at the table's stream count, microseconds.
    pub makespan_us: f64,
    /// Its assignment-independent bound (`PlanStats::makespan_bound_us`); `None` where the stats lack it.
    pub makespan_bound_us: Option<f64>,
    /// The timing model's stream-order bound (see [`StreamPoint::stream_order_bound_us`]).
    pub stream_order_bound_us: f64,
    /// Median compile time (full build), on-CPU milliseconds.
    pub compile_ms: f64,
    /// Median compile wall time, milliseconds.
    pub compile_wall_ms: f64,
    /// Repetitions behind the median.
    pub compile_reps: usize,
    /// Median per-pass milliseconds.
    pub pass_ms: Vec<(String, f64)>,
    /// Median ONNX import time, milliseconds (models only).
    pub import_ms: Option<f64>,
    /// Makespan against bound per stream count.
    pub by_streams: Vec<StreamPoint>,
    /// Violations `graph_plan::verify` found in the table's plan (0 expected).
    pub violations: usize,
    /// Every numeric field of the plan's `PlanStats`, by name (see [`super::fields`]).
    pub stats: BTreeMap<String, f64>,
}

/// Makespan of a plan and its bounds: exec-sim's timing model for the makespan (and the stream-order bound),
/// and the plan's own assignment-independent bound where its stats carry it (`makespan_bound_us`, read by
/// name so that this task works on either side of that field's arrival).
pub struct Makespan {
    /// Modelled makespan, microseconds.
    pub makespan_us: f64,
    /// `PlanStats::makespan_bound_us`, if present and positive.
    pub bound_us: Option<f64>,
    /// The timing model's bound over the plan's stream order.
    pub stream_order_bound_us: f64,
}

/// The [`Makespan`] of `plan`.
pub fn makespan(plan: &ExecutionPlan) -> Result<Makespan> {
    let t = plan_timing(plan)?;
    let stats = fields::numeric_fields(plan.stats());
    Ok(Makespan {
        makespan_us: t.makespan_us,
        bound_us: fields::get(&stats, &fields::MAKESPAN_BOUND).filter(|b| *b > 0.0),
        stream_order_bound_us: t.bound_us,
    })
}

fn stream_point(graph: &ComputeGraph, max_streams: usize) -> Result<StreamPoint> {
    let opts = PlanOptions::with_streams(max_streams);
    let plan = ExecutionPlan::build_with(graph, &opts).with_context(|| format!("{max_streams} streams"))?;
    let m = makespan(&plan)?;
    Ok(StreamPoint {
        max_streams,
        streams: plan.num_streams,
        events: plan.event_count,
        makespan_us: m.makespan_us,
        bound_us: m.bound_us,
        stream_order_bound_us: m.stream_order_bound_us,
    })
}

/// Compile `graph` at `table_streams` streams repeatedly, then once per stream count of `sweep`.
pub fn plan_row(
    name: &str,
    source: &'static str,
    graph: &ComputeGraph,
    table_streams: usize,
    sweep: &[usize],
    sampler: &Sampler,
    clock: Option<&PassTimes>,
) -> Result<PlanRow> {
    let opts = PlanOptions::with_streams(table_streams);
    let mut passes = Vec::new();
    let (times, plan) = sampler.run(|| build_recorded(graph, &opts, clock, &mut passes))?;
    let (compile_ms, compile_wall_ms) = medians(&times);
    let m = makespan(&plan)?;
    let violations = graph_plan::verify(&plan).err().map_or(0, |v| v.len());
    let by_streams = sweep.iter().map(|&s| stream_point(graph, s)).collect::<Result<Vec<_>>>()?;
    let stats = plan.stats();
    Ok(PlanRow {
        name: name.to_string(),
        source,
        nodes: graph.num_nodes(),
        launches_orig: plan.kernel_count_original,
        launches_fused: plan.kernel_count_fused,
        pool_bytes: plan.pool_bytes as u64,
        lower_bound_bytes: stats.lower_bound_bytes,
        naive_bytes: stats.naive_bytes,
        events: plan.event_count,
        makespan_us: m.makespan_us,
        makespan_bound_us: m.bound_us,
        stream_order_bound_us: m.stream_order_bound_us,
        compile_ms,
        compile_wall_ms,
        compile_reps: times.len(),
        pass_ms: pass_medians(&passes),
        import_ms: None,
        by_streams,
        violations,
        stats: fields::numeric_fields(stats),
    })
}

/// One point of a compile-time scaling series.
#[derive(Clone, Debug, Serialize)]
pub struct ScalePoint {
    /// Family name.
    pub family: String,
    /// Nodes asked for.
    pub target: usize,
    /// Nodes built.
    pub nodes: usize,
    /// Streams (`max_streams`).
    pub streams: usize,
    /// Median full-build milliseconds (on-CPU).
    pub build_ms: f64,
    /// Median full-build wall milliseconds.
    pub build_wall_ms: f64,
    /// Every build time behind the median.
    pub build_samples_ms: Vec<f64>,
    /// Median per-pass milliseconds.
    pub pass_ms: Vec<(String, f64)>,
    /// Median `graph_plan::verify` milliseconds on the plan.
    pub verify_ms: f64,
    /// Violations found (0 expected).
    pub violations: usize,
    /// Steps of the plan.
    pub steps: usize,
    /// Launch steps.
    pub launches: usize,
    /// Events.
    pub events: usize,
    /// Milliseconds to generate the graph (not part of compile time).
    pub synth_ms: f64,
}

/// Time building (and verifying) `family` at about `target` nodes on `streams` streams.
pub fn scale_point(
    family: Family,
    target: usize,
    streams: usize,
    sampler: &Sampler,
    clock: Option<&PassTimes>,
) -> Result<ScalePoint> {
    let w = Stopwatch::start();
    let graph = family.build(target)?;
    let synth_ms = w.elapsed().ms();
    let opts = PlanOptions::with_streams(streams);
    let mut passes = Vec::new();
    let (times, plan) = sampler.run(|| build_recorded(&graph, &opts, clock, &mut passes))?;
    let (build_ms, build_wall_ms) = medians(&times);
    let (vtimes, violations) = verify_timed(&plan, sampler)?;
    Ok(ScalePoint {
        family: family.name().to_string(),
        target,
        nodes: graph.num_nodes(),
        streams,
        build_ms,
        build_wall_ms,
        build_samples_ms: times.iter().map(Elapsed::ms).collect(),
        pass_ms: pass_medians(&passes),
        verify_ms: medians(&vtimes).0,
        violations,
        steps: plan.total_steps(),
        launches: plan.kernel_count_fused,
        events: plan.event_count,
        synth_ms,
    })
}

fn verify_timed(plan: &ExecutionPlan, sampler: &Sampler) -> Result<(Vec<Elapsed>, usize)> {
    sampler.run(|| Ok(graph_plan::verify(plan).err().map_or(0, |v| v.len())))
}

/// The verify target: a plan of at least a given number of steps.
#[derive(Clone, Debug, Serialize)]
pub struct VerifyPoint {
    /// What the plan is.
    pub label: String,
    /// Steps of the plan.
    pub steps: usize,
    /// Median verify milliseconds (on-CPU).
    pub verify_ms: f64,
    /// Median verify wall milliseconds.
    pub verify_wall_ms: f64,
    /// Repetitions.
    pub reps: usize,
    /// Violations found (0 expected).
    pub violations: usize,
}

/// Verify a plan of about `1.8 * nodes` steps: a random DAG with fusion off (every node its own launch) on
/// four streams, so that events are exercised as well as launches. Reuse is off, as in the verify bench
/// (`benches/benches/verify.rs`): one pool buffer per tensor, the most segments for verify's shadow memory,
/// and a plan the baseline memory packer (quadratic in pool buffers) can build in seconds.
pub fn verify_point(nodes: usize, sampler: &Sampler) -> Result<VerifyPoint> {
    let graph = Family::RandomDag.build(nodes)?;
    let mut opts = PlanOptions::with_streams(4);
    opts.fusion.enabled = false;
    opts.memory.reuse = false;
    let plan = ExecutionPlan::build_with(&graph, &opts).context("building the verify plan")?;
    drop(graph);
    let (times, violations) = verify_timed(&plan, sampler)?;
    Ok(VerifyPoint {
        label: format!("random_dag {} nodes, fusion and reuse off, 4 streams", cuplan_fmt_count(nodes)),
        steps: plan.total_steps(),
        verify_ms: medians(&times).0,
        verify_wall_ms: medians(&times).1,
        reps: times.len(),
        violations,
    })
}

fn cuplan_fmt_count(n: usize) -> String {
    super::fmt::count(n as u64)
}

/// Memory-aware ordering on one graph (one stream, default options otherwise): the plan's pool bound in the
/// graph's given order and in the order `OrderStrategy::Memory` chose.
#[derive(Clone, Debug, Serialize)]
pub struct OrderRow {
    /// Graph name as reported.
    pub name: String,
    /// Nodes.
    pub nodes: usize,
    /// `lower_bound_bytes` of the given order (`PlanStats::given_order_lower_bound_bytes`).
    pub given_bytes: u64,
    /// `lower_bound_bytes` of the chosen order.
    pub chosen_bytes: u64,
    /// Which candidate won (`PlanStats::order_chosen`).
    pub chosen: String,
    /// The exact search proved the chosen order optimal for its fused groups (`PlanStats::order_optimal`).
    pub optimal: bool,
    /// Median milliseconds of the whole build with memory-aware ordering.
    pub build_ms: f64,
    /// The plan passed `graph_plan::verify`.
    pub verified: bool,
}

/// Build `g` with `OrderStrategy::Memory` on one stream and read the ordering's figures off the plan.
pub fn order_row(name: &str, g: &ComputeGraph, sampler: &Sampler) -> Result<OrderRow> {
    let mut opts = PlanOptions::with_streams(1);
    opts.order = graph_plan::OrderStrategy::Memory;
    let (times, plan) = sampler.run(|| ExecutionPlan::build_with(g, &opts).with_context(|| name.to_string()))?;
    let s = plan.stats();
    Ok(OrderRow {
        name: name.to_string(),
        nodes: g.num_nodes(),
        given_bytes: s.given_order_lower_bound_bytes,
        chosen_bytes: s.lower_bound_bytes,
        chosen: s.order_chosen.name().to_string(),
        optimal: s.order_optimal,
        build_ms: medians(&times).0,
        verified: graph_plan::verify(&plan).is_ok(),
    })
}

/// The packing core on one MiniMalloc instance.
#[derive(Clone, Debug, Serialize)]
pub struct PackRow {
    /// Instance name.
    pub name: String,
    /// Buffers.
    pub buffers: usize,
    /// Largest total size live at once.
    pub lower_bound: u64,
    /// Capacity the instance is known to fit in.
    pub capacity: Option<u64>,
    /// Height `graph_passes::memory::pack` reached.
    pub height: u64,
    /// Median milliseconds of `pack`.
    pub ms: f64,
    /// The packing is valid (no two time-overlapping buffers share bytes), checked here independently.
    pub valid: bool,
    /// Height of the reference greedy (by size, best fit) for comparison.
    pub greedy_height: u64,
    /// Whether the packer proved its height minimal (`Packing::optimal`); `None` where this build's `Packing`
    /// does not serialise or lacks the field (see [`super::fields`]).
    pub optimal: Option<bool>,
    /// The phase that produced the height (`Packing::strategy`); `None` likewise.
    pub strategy: Option<String>,
    /// The search effort asked for (`None`: the packer's default budget).
    pub effort: Option<u64>,
}

/// Run the packing core on `inst` with its default options, or with the search effort `effort` (work units of
/// `pack::Budget::effort`) where given.
pub fn pack_row(inst: &MinimallocInstance, sampler: &Sampler, effort: Option<u64>) -> Result<PackRow> {
    let mut opts = PackOptions::default();
    if let Some(e) = effort {
        opts.budget.effort = e;
    }
    let (times, packing) = sampler.run(|| pack::pack(&inst.buffers, &opts).with_context(|| inst.name.clone()))?;
    let valid = packing_is_valid(&inst.buffers, &packing.offsets);
    // `Packing` serialises (with `optimal` and `strategy`) once the packing issue is merged; `None` before.
    let json = fields::serde_json_of!(packing);
    let optimal = json.as_ref().and_then(|v| v.get("optimal")).and_then(serde_json::Value::as_bool);
    let strategy = json.as_ref().and_then(|v| v.get("strategy")).and_then(fields::enum_text);
    Ok(PackRow {
        name: inst.name.clone(),
        buffers: inst.buffers.len(),
        lower_bound: pack::lower_bound(&inst.buffers, 1),
        capacity: inst.capacity,
        height: packing.height,
        ms: medians(&times).0,
        valid,
        greedy_height: greedy_best_fit(&inst.buffers),
        optimal,
        strategy,
        effort,
    })
}

/// True when no two buffers live at the same time overlap in memory (half-open intervals in both).
pub fn packing_is_valid(buffers: &[Buffer], offsets: &[u64]) -> bool {
    if buffers.len() != offsets.len() {
        return false;
    }
    for i in 0..buffers.len() {
        for j in i + 1..buffers.len() {
            let (a, b) = (buffers[i], buffers[j]);
            let live_together = a.lower < b.upper && b.lower < a.upper;
            let (ao, bo) = (offsets[i], offsets[j]);
            let share = ao < bo.saturating_add(b.size) && bo < ao.saturating_add(a.size);
            if live_together && share && a.size > 0 && b.size > 0 {
                return false;
            }
        }
    }
    true
}

/// The usual heuristic, as a fixed reference: largest buffer first, each at the lowest-waste gap among the
/// buffers already placed that live at the same time (best fit), else on top.
pub fn greedy_best_fit(buffers: &[Buffer]) -> u64 {
    let mut order: Vec<usize> = (0..buffers.len()).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(buffers[i].size), buffers[i].lower, i));
    let mut placed: Vec<(usize, u64)> = Vec::new();
    let mut height = 0;
    for i in order {
        let b = buffers[i];
        let mut busy: Vec<(u64, u64)> = placed
            .iter()
            .filter(|&&(j, _)| buffers[j].lower < b.upper && b.lower < buffers[j].upper)
            .map(|&(j, off)| (off, off + buffers[j].size))
            .collect();
        busy.sort_unstable();
        let (mut best, mut best_gap, mut cursor) = (None, u64::MAX, 0u64);
        for (s, e) in busy {
            if s > cursor && s - cursor >= b.size && s - cursor < best_gap {
                best = Some(cursor);
                best_gap = s - cursor;
            }
            cursor = cursor.max(e);
        }
        let off = best.unwrap_or(cursor);
        placed.push((i, off));
        height = height.max(off + b.size);
    }
    height
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(lower: u64, upper: u64, size: u64) -> Buffer {
        Buffer { lower, upper, size }
    }

    #[test]
    fn sampler_repetitions_follow_the_budget() {
        let s = Sampler { min_reps: 3, max_reps: 9, budget_s: 1.0, single_above_s: 4.0 };
        assert_eq!(s.reps_after(0.5), 3);
        assert_eq!(s.reps_after(0.2), 5);
        assert_eq!(s.reps_after(0.0001), 9);
        assert_eq!(s.reps_after(0.0), 9);
        assert_eq!(s.reps_after(3.9), 3);
        assert_eq!(s.reps_after(4.0), 1);
        let one = Sampler { min_reps: 1, max_reps: 3, budget_s: 1.0, single_above_s: f64::INFINITY };
        assert_eq!(one.reps_after(5.0), 1);
    }

    #[test]
    fn sampler_returns_the_last_result_and_counts_runs() {
        let s = Sampler { min_reps: 4, max_reps: 4, budget_s: 0.0, single_above_s: f64::INFINITY };
        let mut calls = 0;
        let (times, last) = s
            .run(|| {
                calls += 1;
                Ok(calls)
            })
            .unwrap();
        assert_eq!(times.len(), 4);
        assert_eq!(last, 5, "one warm-up run, then four timed ones");
    }

    #[test]
    fn medians_prefer_cpu_time_and_keep_wall_apart() {
        let e = |wall_ms: f64, cpu: Option<f64>| Elapsed { wall_ms, cpu_ms: cpu };
        let (cpu, wall) = medians(&[e(10.0, Some(2.0)), e(30.0, Some(4.0)), e(20.0, Some(3.0))]);
        assert_eq!((cpu, wall), (3.0, 20.0));
        let (cpu, wall) = medians(&[e(10.0, None), e(30.0, None)]);
        assert_eq!((cpu, wall), (20.0, 20.0), "without a CPU clock the report falls back to wall time");
        let (cpu, wall) = medians(&[]);
        assert!(cpu.is_nan() && wall.is_nan());
    }

    #[test]
    fn pass_medians_keep_pipeline_order() {
        let s = |t: f64| vec![("memory".to_string(), t), ("topo".to_string(), 1.0)];
        let m = pass_medians(&[s(3.0), s(1.0), s(2.0)]);
        assert_eq!(m, vec![("topo".to_string(), 1.0), ("memory".to_string(), 2.0)]);
    }

    #[test]
    fn validity_checks_time_and_space_overlap() {
        let bufs = [b(0, 3, 4), b(3, 9, 4), b(0, 9, 4)];
        assert!(packing_is_valid(&bufs, &[0, 0, 4]), "b0 and b1 never live together");
        assert!(!packing_is_valid(&bufs, &[0, 4, 2]), "b0 and b2 overlap at 2..4 while both live");
        assert!(!packing_is_valid(&bufs, &[0, 0]));
    }

    #[test]
    fn greedy_reference_on_the_readme_example() {
        let bufs = [b(0, 3, 4), b(3, 9, 4), b(0, 9, 4), b(9, 21, 4), b(0, 21, 4)];
        assert_eq!(greedy_best_fit(&bufs), 12);
        assert_eq!(greedy_best_fit(&[]), 0);
    }
}
