//! The stream pass: assigns fused groups to at most `max_streams` streams and chooses the fewest cross-stream
//! synchronisations (Nimble's assignment, on a cost model).
//!
//! Pipeline, over the group DAG (data edges through views plus the memory pass's reuse edges, which are honoured
//! exactly like data edges, so no bytes are reused across unordered launches):
//! 1. `reduce`: transitive reduction with window-bounded reachability bit sets (exact for edges spanning at
//!    most `window` groups, conservative beyond). O((N + E) W / 64) time, O(W^2 / 8 + N + E) memory.
//! 2. `chains`: a maximum matching on the reduction's bipartite graph (greedy along critical edges, then
//!    Hopcroft-Karp) gives the minimum number of chains that cover the reduction: groups of one chain are
//!    ordered, unordered groups never share a chain (maximum logical concurrency), and the cross-chain edges are
//!    as few as possible. O(E log E + E sqrt N).
//! 3. With more chains than streams, candidate assignments, the one with the shortest modelled makespan kept
//!    (ties within a relative 1e-9: fewer waits, then the earlier candidate):
//!    - `merge` puts whole chains onto streams, critical path first, each where it overlaps the least
//!      modelled busy time (then the least load); O(N k log N); on small graphs then refined by local search
//!      (each chain, critical first, moved to the stream that shortens the simulated makespan most);
//!    - `schedule::in_order` walks groups in group order, each onto the stream where it starts earliest
//!      (ties: fewest new waits, its chain predecessor's stream); O(N k + E);
//!    - `schedule::list_schedule` list-schedules groups by longest path to the end under the timing model, on
//!      the idle stream needing the fewest new waits; O((N + E) log N + N k). Once starting a group only when
//!      it fits beside the running ones (occupancies sum to at most 1), and, when that rule ever held a group
//!      back, once greedily. Its start order becomes the submission order only with `StreamOptions::reorder`.
//!
//!    Graphs with at most `MERGE_CHAINS_PER_STREAM` chains per stream try all of them with k, k/2, ... >= 2
//!    streams (none is monotone in the stream count); larger ones only the schedules with k. The schedules
//!    come first: when one of them reaches the bound (longest path or device area), the merge's local search
//!    is skipped (it could at best tie), except at `max` effort; the merge itself, one greedy pass, still
//!    competes (at equal makespans it often needs the fewest waits). With no more chains than streams,
//!    Nimble's stream per chain is kept as is. From `PARALLEL_GROUPS` groups on a multi-core machine the
//!    smaller counts' candidates are made on a scoped thread beside k's; the choice among them (shortest
//!    modelled makespan, then fewest waits, then the earlier candidate) is the same. Each candidate's path
//!    bound (its streams in submission order plus the reduced edges, launch times only; a lower bound on its
//!    simulated makespan, O(N + E)) comes first: a candidate whose bound is past the shortest makespan
//!    simulated so far is not finished or simulated, as it cannot be kept.
//! 4. `sync`: vector clocks keep a cross-stream edge only when stream order plus earlier waits do not imply it;
//!    one Record (after the source group) serves every waiter. The kept waits are exactly the cross-stream
//!    edges of the transitive reduction of the final happens-before order. O((N + E) k).
//!
//! Submission order is the fusion plan's group order (the order the memory plan was made for), or with
//! `reorder` the list schedule's start order (`StreamPlan::order`); either is a topological order of data and
//! reuse edges, so every wait follows its record.

mod chains;
mod csr;
mod merge;
mod reduce;
mod schedule;
mod sync;

pub use csr::Csr;
pub(crate) use csr::{sort_dedup_down, sort_dedup_tail};
pub use sync::waits_for_initial_work;

use graph_ir::ComputeGraph;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::device::DeviceProfile;
use crate::device::LaunchEstimate;
use crate::estimate::estimate_groups;
use crate::fusion::FusionPlan;
use crate::group_graph::GroupGraph;
use crate::ids::{GroupId, StreamId};
use crate::memory::MemoryPlan;
use crate::target::{Effort, Target};
use crate::timing::{self, LaunchMode, Task, TaskId};
use graph_ir::OpCost;

/// Default reachability window of the transitive reduction (groups).
pub const DEFAULT_WINDOW: usize = 4096;

/// The chain merge is tried only while there are at most this many chains per stream: beyond, the chains'
/// unlimited-stream intervals overlap so much that the schedules always win, and the merge's
/// O(N k log N) would dominate the pass on million-group graphs.
pub const MERGE_CHAINS_PER_STREAM: usize = 16;

/// Options of the stream pass.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StreamOptions {
    /// Most streams to use and the device the cost model describes.
    pub target: Target,
    /// Launch overhead the cost model adds to each group.
    #[serde(default)]
    pub launch_mode: LaunchMode,
    /// Reachability window of the transitive reduction, in groups (exact when it covers the graph).
    #[serde(default = "default_window")]
    pub window: usize,
    /// Let the pass submit groups in an order of its own (a list schedule's start order) instead of the fusion
    /// plan's group order. Off by default: the memory plan's lifetimes and `lower_bound_bytes` are stated for
    /// group order, and with reordering they no longer describe the plan's launch order (memory stays safe:
    /// reuse edges are honoured in any order).
    #[serde(default)]
    pub reorder: bool,
}

fn default_window() -> usize {
    DEFAULT_WINDOW
}

impl StreamOptions {
    /// For `target`, graph-replay overhead, the default window.
    pub fn new(target: Target) -> Self {
        StreamOptions { target, launch_mode: LaunchMode::Graph, window: DEFAULT_WINDOW, reorder: false }
    }

    /// `max_streams` streams on the default device (tests and plain-DAG analyses).
    pub fn with_streams(max_streams: usize) -> Self {
        StreamOptions::new(Target::new(max_streams, DeviceProfile::default()))
    }
}

impl Default for StreamOptions {
    fn default() -> Self {
        StreamOptions::with_streams(1)
    }
}

/// A cross-stream synchronisation: `to` waits for the event recorded after `from`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SyncEdge {
    /// Group after which the event is recorded.
    pub from: GroupId,
    /// Group before which the stream waits.
    pub to: GroupId,
}

/// The result of the stream pass.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct StreamPlan {
    /// Streams used (>= 1).
    pub num_streams: usize,
    /// Stream of each group, indexed by `GroupId`.
    pub stream_of: Vec<StreamId>,
    /// Synchronisations kept after reduction (one Wait each), sorted.
    pub syncs: Vec<SyncEdge>,
    /// Cross-stream dependency edges before reduction (data and reuse edges between groups on different
    /// streams).
    pub events_before_reduction: usize,
    /// Distinct events after reduction: groups another stream waits on (one Record each).
    #[serde(default)]
    pub events: usize,
    /// Chains of the minimum chain decomposition (the streams Nimble would use without a limit).
    #[serde(default)]
    pub chains: usize,
    /// Edges of the group DAG (data and reuse, deduplicated).
    #[serde(default)]
    pub dag_edges: usize,
    /// Edges left by the transitive reduction.
    #[serde(default)]
    pub reduced_edges: usize,
    /// True when the reduction's window covered the whole graph (the reduction is exact).
    #[serde(default)]
    pub exact_reduction: bool,
    /// Submission order of the groups, when it differs from group order (empty: group order). Always a
    /// topological order of data and reuse edges.
    #[serde(default)]
    pub order: Vec<GroupId>,
}

impl StreamPlan {
    /// Groups in submission order.
    pub fn submission_order(&self) -> Vec<GroupId> {
        if self.order.is_empty() {
            (0..self.stream_of.len()).map(GroupId::from_index).collect()
        } else {
            self.order.clone()
        }
    }

    /// The timing evaluator's tasks in submission order (task `i` is the `i`-th group of
    /// [`submission_order`](Self::submission_order)), each depending on the sources of its waits. `time_us`
    /// (with overhead) and `occupancy` are per group.
    pub fn ordered_tasks(&self, time_us: &[f64], occupancy: &[f64]) -> Vec<Task> {
        let order = self.submission_order();
        let mut pos = vec![0u32; self.stream_of.len()];
        for (i, g) in order.iter().enumerate() {
            pos[g.index()] = i as u32;
        }
        let mut deps: Vec<Vec<TaskId>> = vec![Vec::new(); order.len()];
        for s in &self.syncs {
            deps[pos[s.to.index()] as usize].push(TaskId(pos[s.from.index()]));
        }
        order
            .iter()
            .zip(deps)
            .map(|(g, deps)| Task {
                stream: self.stream_of[g.index()],
                duration_us: time_us.get(g.index()).copied().unwrap_or(0.0),
                occupancy: occupancy.get(g.index()).copied().unwrap_or(1.0),
                deps,
            })
            .collect()
    }
}

/// Predecessors of every group: the group graph's data edges and the memory plan's reuse edges, deduplicated.
pub fn group_predecessors(groups: &GroupGraph, memory: &MemoryPlan) -> Vec<Vec<GroupId>> {
    groups.preds_with(memory.reuse_edges.iter().map(|e| (e.from, e.to)))
}

/// Modelled time (with the launch overhead of `opts.launch_mode`) and occupancy of every group.
pub fn group_costs(graph: &ComputeGraph, fusion: &FusionPlan, opts: &StreamOptions) -> (Vec<f64>, Vec<f64>) {
    times_of(&estimate_groups(graph, fusion, &opts.target.device), opts)
}

/// Task times (with the launch overhead of `opts.launch_mode`) and occupancies from the groups' estimates.
fn times_of(estimates: &[(OpCost, LaunchEstimate)], opts: &StreamOptions) -> (Vec<f64>, Vec<f64>) {
    let overhead = opts.launch_mode.overhead_us(&opts.target.device);
    estimates.iter().map(|(_, e)| (e.time_us + overhead, e.occupancy)).unzip()
}

/// Run the stream pass.
pub fn analyse(
    graph: &ComputeGraph,
    fusion: &FusionPlan,
    groups: &GroupGraph,
    memory: &MemoryPlan,
    opts: &StreamOptions,
) -> StreamPlan {
    analyse_estimated(&estimate_groups(graph, fusion, &opts.target.device), groups, memory, opts)
}

/// [`analyse`] on the groups' estimates made beforehand (`estimate::estimate_groups` for `opts.target`'s
/// device; the pipeline makes them once and lowering reuses them).
pub fn analyse_estimated(
    estimates: &[(OpCost, LaunchEstimate)],
    groups: &GroupGraph,
    memory: &MemoryPlan,
    opts: &StreamOptions,
) -> StreamPlan {
    let _span = tracing::debug_span!("stream").entered();
    let preds = group_predecessors(groups, memory);
    let (time, occupancy) = times_of(estimates, opts);
    assign(&preds, &time, &occupancy, opts)
}

/// The stream pass over a plain DAG: `preds[g]` lists the groups `g` depends on (all earlier than `g`; any
/// other entry is a planner bug and is ignored with an error event); `time_us[g]` is its modelled launch time
/// with overhead and `occupancy[g]` its device fraction.
pub fn assign(preds: &[Vec<GroupId>], time_us: &[f64], occupancy: &[f64], opts: &StreamOptions) -> StreamPlan {
    let rows: Vec<Vec<u32>> = preds
        .iter()
        .enumerate()
        .map(|(g, ps)| {
            let mut r: Vec<u32> = ps
                .iter()
                .filter(|p| {
                    let ok = p.index() < g;
                    if !ok {
                        tracing::error!(group = g, pred = p.index(), "stream pass: predecessor not earlier (bug)");
                    }
                    ok
                })
                .map(|p| p.0)
                .collect();
            r.sort_unstable();
            r.dedup();
            r
        })
        .collect();
    let full = Csr::from_rows(&rows);
    drop(rows);
    assign_csr(&full, time_us, occupancy, opts)
}

/// One candidate assignment: stream per group and submission order.
struct Candidate {
    stream_of: Vec<u32>,
    order: Option<Vec<u32>>,
}

/// The longest path of launch times through `c`'s streams in its submission order and the edges of `reduced`:
/// a lower bound on the simulated makespan of `c`'s plan, in O(N + E). The plan's synchronisations and stream
/// order imply every edge of `reduced`, and no task of the timing model runs faster than alone, so no task of
/// the simulation finishes before its finish here. A predecessor not yet seen in the order counts as finished at
/// 0 (a submission order is topological, so none is; without the edge the value is still a lower bound).
fn path_bound(reduced: &Csr, c: &Candidate, time: &[f64]) -> f64 {
    let n = reduced.len();
    let streams = c.stream_of.iter().map(|&s| s as usize + 1).max().unwrap_or(1);
    let mut finish = vec![0f64; n];
    let mut last = vec![0f64; streams];
    let mut visit = |g: usize| {
        let s = c.stream_of[g] as usize;
        let start = reduced.row(g).iter().map(|&p| finish[p as usize]).fold(last[s], f64::max);
        finish[g] = start + time[g];
        last[s] = finish[g];
    };
    match &c.order {
        Some(order) => order.iter().for_each(|&g| visit(g as usize)),
        None => (0..n).for_each(visit),
    }
    last.into_iter().fold(0f64, f64::max)
}

/// [`assign`] over compressed rows (row `g`: distinct predecessors of `g`, all `< g`).
pub fn assign_csr(full: &Csr, time_us: &[f64], occupancy: &[f64], opts: &StreamOptions) -> StreamPlan {
    assign_split(full, time_us, occupancy, opts, crate::multi_core(), true).0
}

/// [`assign_csr`], generating the smaller stream counts' candidates on a scoped thread when `split` allows
/// (and the graph is large enough to repay it), and skipping the simulation of candidates whose path bound
/// rules them out when `skip` allows; the plan is the same either way. Also returns how many were skipped.
fn assign_split(
    full: &Csr,
    time_us: &[f64],
    occupancy: &[f64],
    opts: &StreamOptions,
    split: bool,
    skip: bool,
) -> (StreamPlan, usize) {
    let n = full.len();
    if n == 0 {
        return (StreamPlan { num_streams: 1, exact_reduction: true, ..Default::default() }, 0);
    }
    let clean = |v: Option<&f64>, default: f64| v.copied().filter(|t| t.is_finite() && *t >= 0.0).unwrap_or(default);
    let time: Vec<f64> = (0..n).map(|g| clean(time_us.get(g), 0.0)).collect();
    let occ: Vec<f64> = (0..n).map(|g| clean(occupancy.get(g), 1.0).clamp(1e-9, 1.0)).collect();
    let window = opts.window.max(1);
    let reduced = {
        let _s = tracing::debug_span!("transitive_reduction").entered();
        reduce::transitive_reduction(full, window)
    };
    // Earliest start with unlimited streams, and longest path from each group's start to the end.
    let mut top = vec![0f64; n];
    for g in 0..n {
        top[g] = reduced.row(g).iter().map(|&p| top[p as usize] + time[p as usize]).fold(0f64, f64::max);
    }
    let (bottom, tail) = below(&reduced, &time);
    let chains = {
        let _s = tracing::debug_span!("chains").entered();
        chains::decompose(&reduced, |u, v| top[u as usize] + time[u as usize] + bottom[v as usize])
    };
    let k = opts.target.streams.max(1);
    let by_chain =
        |chain_stream: &[u32]| -> Vec<u32> { (0..n).map(|g| chain_stream[chains.chain_of[g] as usize]).collect() };
    let mut prev = vec![u32::MAX; n];
    for (u, &v) in chains.next.iter().enumerate() {
        if v != u32::MAX {
            prev[v as usize] = u as u32;
        }
    }
    let single = |c: Candidate| finish(full, &reduced, &c, window, chains.chains.len());
    if k == 1 {
        return (single(Candidate { stream_of: vec![0; n], order: None }), 0);
    }
    if chains.chains.len() <= k {
        // Nimble: a stream per chain; every group can start as soon as its predecessors end.
        let ids: Vec<u32> = (0..chains.chains.len() as u32).collect();
        // With enough streams, Nimble's guarantees hold: unordered groups never share a stream (maximum logical
        // concurrency) and the cross-stream edges are the fewest any chain cover leaves.
        return (single(Candidate { stream_of: by_chain(&ids), order: None }), 0);
    }
    // Small graphs (few chains per stream) try every rule with k, k/2, k/4, ... >= 2 streams: neither rule is
    // monotone in the stream count (more concurrent launches can slow the critical path when they share the
    // device). Large graphs try the schedules with k streams only.
    let small = chains.chains.len() <= MERGE_CHAINS_PER_STREAM * k;
    let mut counts = vec![k];
    while small && counts[counts.len() - 1] >= 4 {
        counts.push(counts[counts.len() - 1] / 2);
    }
    // No assignment's simulated makespan is below the longest path or the device area (the timing model's
    // bound, DESIGN.md 5): a candidate there cannot be improved on.
    let bound =
        (0..n).map(|g| top[g] + time[g]).fold(0f64, f64::max).max(time.iter().zip(&occ).map(|(t, o)| t * o).sum());
    let at_bound = |m: f64| m <= bound * (1.0 + 1e-9);
    // The shortest makespan simulated so far (its f64 bits: for non-negative values they order as the values
    // do), shared by the stream counts' threads.
    let shortest = AtomicU64::new(f64::INFINITY.to_bits());
    let skipped = AtomicUsize::new(0);
    // Each candidate finished and simulated: (plan, makespan, waits); `None` when its path bound
    // (`path_bound`) already lies past the tolerance of the shortest makespan simulated so far and of the
    // bound. Its makespan is at least that path, so it can neither be kept below nor reach the bound, and its
    // synchronisations and simulation (most of a candidate's cost) are not worth computing. Which candidates
    // are skipped depends on the order the threads simulate them in; the plan kept does not.
    let evaluate = |c: Candidate| -> Option<(StreamPlan, f64, usize)> {
        let lb = path_bound(&reduced, &c, &time);
        let limit = f64::from_bits(shortest.load(Ordering::Relaxed)).max(bound);
        if skip && lb > limit * (1.0 + SKIP_TOLERANCE) {
            skipped.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let plan = finish(full, &reduced, &c, window, chains.chains.len());
        let tasks = plan.ordered_tasks(&time, &occ);
        let makespan = timing::simulate_makespan(&tasks, 0.0).unwrap_or(f64::INFINITY);
        shortest.fetch_min(makespan.to_bits(), Ordering::Relaxed);
        let waits = plan.syncs.len();
        Some((plan, makespan, waits))
    };
    // The schedules for `kk` streams: one pass each, no search.
    let schedules_for = |kk: usize| -> Vec<Option<(StreamPlan, f64, usize)>> {
        let _s = tracing::debug_span!("schedule").entered();
        let mut cs = vec![Candidate { stream_of: schedule::in_order(&reduced, &time, &prev, kk), order: None }];
        // A list schedule's start order is a submission order of its own; kept only when reordering is allowed,
        // otherwise its stream choice runs in group order.
        let keep = |order: Vec<u32>| if opts.reorder { Some(order) } else { None };
        let aware = schedule::list_schedule(&reduced, &time, &bottom, &prev, kk, Some(&occ));
        let blocked = aware.blocked;
        cs.push(Candidate { stream_of: aware.stream_of, order: keep(aware.order) });
        if blocked {
            let greedy = schedule::list_schedule(&reduced, &time, &bottom, &prev, kk, None);
            cs.push(Candidate { stream_of: greedy.stream_of, order: keep(greedy.order) });
        }
        cs.into_iter().map(evaluate).collect()
    };
    // The chain merge for `kk` streams, refined by local search (with `search`) on small enough graphs.
    let merge_for = |kk: usize, search: bool| -> Option<(StreamPlan, f64, usize)> {
        let _s = tracing::debug_span!("merge").entered();
        let mut merged = merge::merge(&chains.chains, &top, &time, &bottom, kk);
        let refine_budget = opts.target.effort.scaled(0, 0, REFINE_BUDGET, REFINE_BUDGET);
        if search && (chains.chains.len().saturating_mul(kk).saturating_mul(n) as u64) <= refine_budget {
            refine(
                &mut merged,
                &chains.chains,
                &chains.chain_of,
                &reduced,
                &time,
                &occ,
                &top,
                (&bottom, &tail),
                kk,
                &at_bound,
            );
        }
        evaluate(Candidate { stream_of: by_chain(&merged), order: None })
    };
    // The stream counts' work is independent: from PARALLEL_GROUPS groups on a multi-core machine, the smaller
    // counts run on a scoped thread while this one does `k` (the largest share). Results keep their order.
    let per_count = |work: &(dyn Fn(usize) -> Vec<Option<(StreamPlan, f64, usize)>> + Sync)| -> Vec<Vec<_>> {
        if split && counts.len() > 1 && n >= PARALLEL_GROUPS {
            std::thread::scope(|scope| {
                let rest = scope.spawn(|| counts[1..].iter().map(|&kk| work(kk)).collect::<Vec<_>>());
                let mut all = vec![work(k)];
                all.extend(rest.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)));
                all
            })
        } else {
            counts.iter().map(|&kk| work(kk)).collect()
        }
    };
    let schedules = per_count(&schedules_for);
    // The local search only pays while no schedule reaches the bound: past it, it could at best tie. At `max`
    // effort it always runs (a tie with fewer waits still wins). The merge alone is one greedy pass and stays a
    // candidate either way.
    let scheduled_at_bound = schedules.iter().flatten().flatten().any(|(_, m, _)| at_bound(*m));
    let search = opts.target.effort == Effort::Max || !scheduled_at_bound;
    let merges: Vec<Vec<_>> =
        if small { per_count(&|kk| vec![merge_for(kk, search)]) } else { counts.iter().map(|_| Vec::new()).collect() };
    // Per stream count, the merge first, then the schedules (the order the tie-break below reads).
    let evaluated: Vec<(StreamPlan, f64, usize)> =
        merges.into_iter().zip(schedules).flat_map(|(m, s)| m.into_iter().chain(s)).flatten().collect();
    // Keep a candidate with the shortest modelled makespan (within a relative `TIE_TOLERANCE`), of those the
    // one with the fewest waits, then the earliest. A skipped candidate's makespan lies past that tolerance.
    let shortest = evaluated.iter().map(|e| e.1).fold(f64::INFINITY, f64::min);
    let mut best: Option<(usize, StreamPlan)> = None;
    for (plan, makespan, waits) in evaluated {
        if makespan <= shortest * (1.0 + TIE_TOLERANCE) && best.as_ref().is_none_or(|(w, _)| waits < *w) {
            best = Some((waits, plan));
        }
    }
    (best.map(|b| b.1).unwrap_or_default(), skipped.into_inner())
}

/// Relative difference under which two candidates' makespans tie (the fewer waits then decide).
const TIE_TOLERANCE: f64 = 1e-9;

/// Relative margin past the shortest makespan (and the bound) from which a candidate's path bound skips its
/// simulation: twice the tie tolerance, so that rounding in the simulation's sums cannot bring a skipped
/// candidate back within the tie.
const SKIP_TOLERANCE: f64 = 2.0 * TIE_TOLERANCE;

/// Groups from which the stream pass generates the candidates of its smaller stream counts on a thread of its
/// own (random_dag, 1k nodes, 277 groups at 4 streams: about 1.0 ms for 4 streams and 0.7 ms for 2).
const PARALLEL_GROUPS: usize = 256;

/// Most `chains x streams x groups` for which the chain merge is refined by simulation (each move costs one
/// simulation of every group), at the default effort (a tenth at `fast`, ten times at `max`).
const REFINE_BUDGET: u64 = 1 << 22;

/// Modelled makespan of `stream_of` in group order, every cross-stream edge of `reduced` a dependency (the
/// schedule the minimal waits give, without computing them).
/// `tasks` is rewritten in place (its dependency lists keep their allocations from one call to the next: the
/// local search simulates thousands of candidates).
fn makespan_in_group_order_with(
    sim: &mut timing::Simulator,
    tasks: &mut Vec<Task>,
    reduced: &Csr,
    stream_of: &[u32],
    time: &[f64],
    occ: &[f64],
) -> f64 {
    let n = reduced.len();
    tasks.truncate(n);
    while tasks.len() < n {
        tasks.push(Task { stream: StreamId(0), duration_us: 0.0, occupancy: 1.0, deps: Vec::new() });
    }
    for (g, t) in tasks.iter_mut().enumerate() {
        t.stream = StreamId(stream_of[g]);
        t.duration_us = time[g];
        t.occupancy = occ[g];
        t.deps.clear();
        t.deps.extend(reduced.row(g).iter().filter(|&&p| stream_of[p as usize] != stream_of[g]).map(|&p| TaskId(p)));
    }
    sim.makespan(tasks, 0.0).unwrap_or(f64::INFINITY)
}

/// The longest path of an assignment in group order over stream order and the edges of `reduced`, launch times
/// only: no task of the timing model runs faster than alone, so no simulation of the assignment ends earlier
/// (the stream-order critical path of `timing::bound`, in O(N + E) without a heap).
///
/// The local search asks it for assignments that differ from a base in one chain's groups, only to learn
/// whether the path stays below a limit. So the base's path is kept per group ([`StreamPath::rebase`]) and a
/// move is evaluated from the chain's first group on ([`StreamPath::moved_below`]), stopping as soon as the
/// path reaches the limit.
struct StreamPath {
    /// Streams (the assignment's ids are below this).
    k: usize,
    /// The base's finish time of each group.
    finish: Vec<f64>,
    /// `last[g * k + s]`: in the base, the finish of the last group before `g` on stream `s` (0 if none).
    last: Vec<f64>,
    /// `before[g]`: the longest finish among the base's groups before `g`.
    before: Vec<f64>,
    /// Scratch of a move's evaluation: finish times from its first group on, and the streams' last finish.
    moved: Vec<f64>,
    cur: Vec<f64>,
}

impl StreamPath {
    fn new(n: usize, k: usize) -> StreamPath {
        StreamPath {
            k,
            finish: vec![0.0; n],
            last: vec![0.0; n * k],
            before: vec![0.0; n],
            moved: vec![0.0; n],
            cur: vec![0.0; k],
        }
    }

    /// Take `stream_of` as the base.
    fn rebase(&mut self, reduced: &Csr, stream_of: &[u32], time: &[f64]) {
        let k = self.k;
        self.cur.iter_mut().for_each(|x| *x = 0.0);
        let mut longest = 0f64;
        for g in 0..reduced.len() {
            self.last[g * k..(g + 1) * k].copy_from_slice(&self.cur);
            self.before[g] = longest;
            let s = stream_of[g] as usize;
            let start = reduced.row(g).iter().map(|&p| self.finish[p as usize]).fold(self.cur[s], f64::max);
            self.finish[g] = start + time[g];
            self.cur[s] = self.finish[g];
            longest = longest.max(self.finish[g]);
        }
    }

    /// The path of `stream_of`, which equals the base before group `from`, when it is below `limit`;
    /// otherwise some value at or above `limit` (the evaluation stops there).
    ///
    /// `tail[g]` is the longest path of launch times after `g` (over `reduced`, `g` excluded): a group that
    /// finishes at `f` puts the path at `f + tail[g]` or later whatever the streams, so the evaluation stops at
    /// the first group past the limit that way, usually long before the path itself gets there.
    fn moved_below(
        &mut self,
        reduced: &Csr,
        stream_of: &[u32],
        time: &[f64],
        tail: &[f64],
        from: usize,
        limit: f64,
    ) -> f64 {
        let (k, n) = (self.k, reduced.len());
        if from >= n {
            return self.before.get(n.wrapping_sub(1)).map_or(0.0, |&b| b.max(self.finish[n - 1]));
        }
        self.cur.copy_from_slice(&self.last[from * k..(from + 1) * k]);
        let mut longest = self.before[from];
        for g in from..n {
            let s = stream_of[g] as usize;
            let mut start = self.cur[s];
            for &p in reduced.row(g) {
                let p = p as usize;
                let f = if p < from { self.finish[p] } else { self.moved[p] };
                start = start.max(f);
            }
            let f = start + time[g];
            self.moved[g] = f;
            self.cur[s] = f;
            longest = longest.max(f);
            if longest >= limit {
                return longest;
            }
            if f + tail[g] >= limit {
                return f + tail[g];
            }
        }
        longest
    }
}

/// The longest path of launch times over `reduced` from each group's start to the end (`bottom`, the group's
/// own time included) and after it (`tail`, excluded: the most of `bottom` over its successors).
fn below(reduced: &Csr, time: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let mut bottom = time.to_vec();
    let mut tail = vec![0f64; time.len()];
    for g in (0..reduced.len()).rev() {
        let b = bottom[g];
        for &p in reduced.row(g) {
            let p = p as usize;
            bottom[p] = bottom[p].max(time[p] + b);
            tail[p] = tail[p].max(b);
        }
    }
    (bottom, tail)
}

/// Improve a chain merge by local search under the timing model: chains in priority order (critical first),
/// each moved to the stream that shortens the simulated makespan most, until a round changes nothing (at most
/// four rounds). Deterministic; never worse than the merge it starts from.
#[allow(clippy::too_many_arguments)] // the pass's per-group tables, passed explicitly
fn refine(
    chain_stream: &mut [u32],
    chains: &[Vec<u32>],
    chain_of: &[u32],
    reduced: &Csr,
    time: &[f64],
    occ: &[f64],
    top: &[f64],
    (bottom, tail): (&[f64], &[f64]),
    k: usize,
    at_bound: &dyn Fn(f64) -> bool,
) {
    let mut stream_of: Vec<u32> = chain_of.iter().map(|&c| chain_stream[c as usize]).collect();
    let mut tasks = Vec::new();
    let mut sim = timing::Simulator::default();
    let mut path = StreamPath::new(time.len(), k.max(stream_of.iter().map(|&s| s as usize + 1).max().unwrap_or(1)));
    path.rebase(reduced, &stream_of, time);
    let mut best = makespan_in_group_order_with(&mut sim, &mut tasks, reduced, &stream_of, time, occ);
    if at_bound(best) {
        return;
    }
    let prio: Vec<f64> =
        chains.iter().map(|c| c.iter().map(|&g| top[g as usize] + bottom[g as usize]).fold(0f64, f64::max)).collect();
    let mut order: Vec<usize> = (0..chains.len()).collect();
    order.sort_by(|&a, &b| prio[b].total_cmp(&prio[a]).then(a.cmp(&b)));
    for _ in 0..4 {
        let mut improved = false;
        for &c in &order {
            let keep = chain_stream[c];
            let mut choice = keep;
            let from = chains[c].iter().min().map_or(0, |&g| g as usize);
            for s in 0..k as u32 {
                if s == keep {
                    continue;
                }
                chain_stream[c] = s;
                for &g in &chains[c] {
                    stream_of[g as usize] = s;
                }
                // A move whose stream-order path already reaches the makespan to beat cannot be taken: skip
                // its simulation (the margin covers the two computations' rounding).
                let limit = best * (1.0 - 1e-9) / (1.0 - 1e-12);
                let p = path.moved_below(reduced, &stream_of, time, tail, from, limit);
                if p * (1.0 - 1e-12) >= best * (1.0 - 1e-9) {
                    continue;
                }
                let m = makespan_in_group_order_with(&mut sim, &mut tasks, reduced, &stream_of, time, occ);
                if m < best * (1.0 - 1e-9) {
                    best = m;
                    choice = s;
                }
            }
            chain_stream[c] = choice;
            for &g in &chains[c] {
                stream_of[g as usize] = choice;
            }
            if choice != keep {
                path.rebase(reduced, &stream_of, time);
            }
            improved |= choice != keep;
            if at_bound(best) {
                return;
            }
        }
        if !improved {
            break;
        }
    }
}

/// Number the streams by first use in submission order, reduce the synchronisations, fill in the counts.
fn finish(full: &Csr, reduced: &Csr, c: &Candidate, window: usize, num_chains: usize) -> StreamPlan {
    let n = full.len();
    let order: Vec<u32> = c.order.clone().unwrap_or_else(|| (0..n as u32).collect());
    let mut renumber: Vec<u32> = vec![u32::MAX; c.stream_of.iter().map(|&s| s as usize + 1).max().unwrap_or(1)];
    let mut used = 0u32;
    for &g in &order {
        let s = c.stream_of[g as usize] as usize;
        if renumber[s] == u32::MAX {
            renumber[s] = used;
            used += 1;
        }
    }
    let stream_of: Vec<u32> = c.stream_of.iter().map(|&s| renumber[s as usize]).collect();
    let num_streams = used.max(1) as usize;
    let waits = {
        let _s = tracing::debug_span!("sync").entered();
        sync::reduce(reduced, &stream_of, &order, num_streams)
    };
    let before =
        (0..n).map(|g| full.row(g).iter().filter(|&&p| stream_of[p as usize] != stream_of[g]).count()).sum::<usize>();
    let mut sources: Vec<u32> = waits.iter().map(|w| w.0).collect();
    sources.sort_unstable();
    sources.dedup();
    StreamPlan {
        num_streams,
        stream_of: stream_of.into_iter().map(StreamId).collect(),
        syncs: waits.iter().map(|&(f, t)| SyncEdge { from: GroupId(f), to: GroupId(t) }).collect(),
        events_before_reduction: before,
        events: sources.len(),
        chains: num_chains,
        dag_edges: full.num_items(),
        reduced_edges: reduced.num_items(),
        exact_reduction: window >= n,
        order: match &c.order {
            Some(o) => o.iter().map(|&g| GroupId(g)).collect(),
            None => Vec::new(),
        },
    }
}

/// Keep only the cross-stream edges that stream order plus earlier synchronisations do not imply. Returns the
/// kept edges (sorted) and the number of cross-stream edges before reduction.
pub fn reduce_syncs(preds: &[Vec<GroupId>], stream_of: &[StreamId], num_streams: usize) -> (Vec<SyncEdge>, usize) {
    let rows: Vec<Vec<u32>> = preds
        .iter()
        .enumerate()
        .map(|(g, ps)| {
            let mut r: Vec<u32> = ps.iter().filter(|p| p.index() < g).map(|p| p.0).collect();
            r.sort_unstable();
            r.dedup();
            r
        })
        .collect();
    let so: Vec<u32> = stream_of.iter().map(|s| s.0).collect();
    let k = num_streams.max(so.iter().map(|&s| s as usize + 1).max().unwrap_or(1));
    let csr = Csr::from_rows(&rows);
    let order: Vec<u32> = (0..csr.len() as u32).collect();
    let before = (0..csr.len()).map(|g| csr.row(g).iter().filter(|&&p| so[p as usize] != so[g]).count()).sum::<usize>();
    let waits = sync::reduce(&csr, &so, &order, k);
    (waits.into_iter().map(|(f, t)| SyncEdge { from: GroupId(f), to: GroupId(t) }).collect(), before)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The stream-order path of `stream_of` computed from scratch.
    fn path_from_scratch(reduced: &Csr, stream_of: &[u32], time: &[f64], k: usize) -> f64 {
        let mut p = StreamPath::new(reduced.len(), k);
        p.rebase(reduced, stream_of, time);
        p.finish.iter().copied().fold(0f64, f64::max)
    }

    proptest! {
        // A move evaluated from its first group on gives the path computed from scratch when it is below the
        // limit, and a value at or above the limit otherwise: the local search prunes exactly the same moves.
        #[test]
        fn a_moved_chain_s_path_is_the_path_from_scratch(
            seed in 1u64..u64::MAX,
            n in 1usize..60,
            k in 1usize..5,
            limit_frac in 0.2f64..1.5,
        ) {
            let mut rng = crate::test_rng::XorShift::new(seed);
            let reduced = Csr::from_rows(rng.earlier_preds(n, 4));
            let time: Vec<f64> = (0..n).map(|_| rng.below(100) as f64 / 7.0).collect();
            let base: Vec<u32> = (0..n).map(|_| rng.below(k as u64) as u32).collect();
            let mut path = StreamPath::new(n, k);
            path.rebase(&reduced, &base, &time);
            // Move a random set of groups from `from` on to one stream.
            let from = rng.below(n as u64) as usize;
            let to = rng.below(k as u64) as u32;
            let mut moved = base.clone();
            for (g, s) in moved.iter_mut().enumerate().skip(from) {
                if rng.below(2) == 0 || g == from {
                    *s = to;
                }
            }
            let exact = path_from_scratch(&reduced, &moved, &time, k);
            let limit = exact * limit_frac;
            let (_, tail) = below(&reduced, &time);
            let got = path.moved_below(&reduced, &moved, &time, &tail, from, limit);
            if exact < limit {
                prop_assert_eq!(got.to_bits(), exact.to_bits());
            } else {
                // A bound from the tail may exceed the exact path by the rounding of the two sums' orders.
                prop_assert!(got >= limit && got <= exact * (1.0 + 1e-12), "got {got}, exact {exact}, limit {limit}");
            }
        }
    }

    proptest! {
        // A candidate's path bound never exceeds the simulated makespan of its finished plan (so a skipped
        // candidate could not have been kept), and equals it when no two tasks ever share the device beyond
        // its capacity (every occupancy at most 1/k).
        #[test]
        fn the_path_bound_is_below_the_simulated_makespan(
            seed in 1u64..u64::MAX,
            n in 1usize..60,
            k in 1usize..5,
            reorder: bool,
            crowded: bool,
        ) {
            let mut rng = crate::test_rng::XorShift::new(seed);
            let rows = rng.earlier_preds(n, 3);
            let full = Csr::from_rows(&rows);
            let reduced = reduce::transitive_reduction(&full, n);
            let time: Vec<f64> = (0..n).map(|_| rng.below(100) as f64 / 7.0).collect();
            let occ: Vec<f64> = (0..n)
                .map(|_| if crowded { (1 + rng.below(10)) as f64 / 10.0 } else { 1.0 / k as f64 })
                .collect();
            let stream_of: Vec<u32> = (0..n).map(|_| rng.below(k as u64) as u32).collect();
            // A random topological order: any ready group next.
            let order = reorder.then(|| {
                let mut left: Vec<usize> = rows.iter().map(Vec::len).collect();
                let mut ready: Vec<u32> = (0..n as u32).filter(|&g| left[g as usize] == 0).collect();
                let mut order = Vec::with_capacity(n);
                while !ready.is_empty() {
                    let g = ready.swap_remove(rng.below(ready.len() as u64) as usize);
                    order.push(g);
                    for (h, row) in rows.iter().enumerate() {
                        if row.contains(&g) {
                            left[h] -= 1;
                            if left[h] == 0 {
                                ready.push(h as u32);
                            }
                        }
                    }
                }
                order
            });
            let c = Candidate { stream_of, order };
            let lb = path_bound(&reduced, &c, &time);
            let plan = finish(&full, &reduced, &c, n, 1);
            let m = timing::simulate_makespan(&plan.ordered_tasks(&time, &occ), 0.0).unwrap_or(f64::INFINITY);
            prop_assert!(lb <= m * (1.0 + 1e-12), "bound {lb} above makespan {m}");
            if !crowded {
                prop_assert!((lb - m).abs() <= m * 1e-12, "bound {lb}, makespan {m}");
            }
        }
    }

    /// Skipping the candidates whose path bound rules them out gives the plan that simulating every candidate
    /// gives, on random DAGs with several chains per stream (where every stream count's schedules and merges
    /// are candidates), and it does skip.
    #[test]
    fn skipped_candidates_never_change_the_plan() {
        let mut rng = crate::test_rng::XorShift::new(0x5EED_0F57_12EA_0002);
        let (mut skipped, mut tried) = (0, 0);
        for round in 0..40 {
            let n = 20 + rng.below(120) as usize;
            let full = Csr::from_rows(rng.earlier_preds(n, 3));
            let time: Vec<f64> = (0..n).map(|_| 1.0 + rng.below(100) as f64 / 7.0).collect();
            let crowded = round % 2 == 0;
            let occ: Vec<f64> =
                (0..n).map(|_| if crowded { (1 + rng.below(10)) as f64 / 10.0 } else { 0.05 }).collect();
            for k in [2, 3, 4, 8] {
                let opts = StreamOptions::new(crate::target::Target::new(k, Default::default()));
                let (all, none_skipped) = assign_split(&full, &time, &occ, &opts, false, false);
                let (some, s) = assign_split(&full, &time, &occ, &opts, false, true);
                assert_eq!(none_skipped, 0);
                let key = |p: &StreamPlan| serde_json::to_string(p).unwrap_or_default();
                assert_eq!(key(&all), key(&some), "round {round}, {k} streams, {s} skipped");
                skipped += s;
                tried += 1;
            }
        }
        assert!(skipped >= tried, "only {skipped} candidates skipped in {tried} passes");
    }

    /// The stream pass gives the same plan with the smaller stream counts' candidates on their own thread as
    /// without, on random DAGs large enough for the split (and with few enough chains to try every count).
    #[test]
    fn candidates_on_a_second_thread_give_the_same_plan() {
        let mut rng = crate::test_rng::XorShift::new(0x5EED_0F57_12EA_0001);
        let mut split = 0;
        for round in 0..6 {
            let n = PARALLEL_GROUPS + rng.below(200) as usize;
            let rows: Vec<Vec<u32>> = (0..n)
                .map(|g| {
                    // Mostly near predecessors (long chains, few of them), now and then a far one.
                    let mut r: Vec<u32> = (0..1 + rng.below(2))
                        .filter(|_| g > 0)
                        .map(|_| {
                            let back = if rng.below(5) == 0 { rng.below(g as u64) } else { rng.below(3.min(g as u64)) };
                            (g as u64 - 1 - back) as u32
                        })
                        .collect();
                    r.sort_unstable();
                    r.dedup();
                    r
                })
                .collect();
            let full = Csr::from_rows(&rows);
            let time: Vec<f64> = (0..n).map(|_| 1.0 + rng.below(100) as f64 / 7.0).collect();
            let occ: Vec<f64> = (0..n).map(|_| (1 + rng.below(10)) as f64 / 10.0).collect();
            for k in [2, 3, 4, 8] {
                let opts = StreamOptions::new(crate::target::Target::new(k, Default::default()));
                let one = assign_split(&full, &time, &occ, &opts, false, true).0;
                let two = assign_split(&full, &time, &occ, &opts, true, true).0;
                let key = |p: &StreamPlan| serde_json::to_string(p).unwrap_or_default();
                assert_eq!(key(&one), key(&two), "round {round}, {k} streams, {} chains", one.chains);
                if k >= 4 && one.chains > k && one.chains <= MERGE_CHAINS_PER_STREAM * k {
                    split += 1;
                }
            }
        }
        assert!(split >= 6, "only {split} cases tried several stream counts");
    }

    #[test]
    fn redundant_waits_are_dropped() {
        // s0: g0 -> g2 ; s1: g1 -> g3; g3 depends on g0 and g2; waiting on g2 implies g0.
        let preds = vec![vec![], vec![], vec![GroupId(0)], vec![GroupId(0), GroupId(1), GroupId(2)]];
        let stream_of = vec![StreamId(0), StreamId(1), StreamId(0), StreamId(1)];
        let (syncs, before) = reduce_syncs(&preds, &stream_of, 2);
        assert_eq!(before, 2);
        assert_eq!(syncs, vec![SyncEdge { from: GroupId(2), to: GroupId(3) }]);
    }
}
