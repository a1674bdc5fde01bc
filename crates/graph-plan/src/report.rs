//! The report beside the plan: [`PlanStats`], computed from the finished plan, its device profile and the
//! group graph's edges (DESIGN.md section 5 gives each figure's one definition). Timing figures come from the
//! shared evaluator (`graph_passes::timing`) run on the plan's own steps; the bounds are evaluated over the
//! group DAG the plan was made from (data edges, plus the memory plan's reuse edges), so that they hold for
//! every stream assignment, not just this one. Nothing here feeds back into planning.

use graph_ir::{ComputeGraph, OpCategory};
use graph_passes::device::DeviceProfile;
use graph_passes::group_graph::GroupGraph;
use graph_passes::memory::MemoryPlan;
use graph_passes::stream::StreamPlan;
use graph_passes::timing::{self, LaunchMode, SimStep, Timeline, TimingError};
use graph_passes::{GroupId, PlanResult};

use crate::build::{bug, OrderChoice, OrderOutcome};
use crate::plan::{ExecutionPlan, PlanStats, PlanStep};

/// Tasks from which the report computes its bounds on two threads (as `lower::PARALLEL_KERNELS`, measured).
const PARALLEL_TASKS: usize = 16_384;

/// What the report needs beyond the plan: the facts the pipeline derived once.
pub(crate) struct Facts<'a> {
    /// The group graph (data edges).
    pub groups: &'a GroupGraph,
    /// The memory plan (reuse edges, bounds, counts).
    pub memory: &'a MemoryPlan,
    /// The stream plan (submission order, chains, waits).
    pub streams: &'a StreamPlan,
    /// What memory-aware ordering chose, when asked.
    pub order: Option<OrderOutcome>,
    /// The stream limit the plan was made for.
    pub max_streams: usize,
    /// The storage precision the graph was rewritten for.
    pub precision: graph_passes::precision::Precision,
    /// The bytes every non-view node moves on its own, as the fusion pass found them (`FusionPlan::unfused_bytes`;
    /// `None`: summed here).
    pub unfused_bytes: Option<u64>,
}

/// The figures of `plan` (see the module docs); `pass_ms` is left for the driver to fill.
pub(crate) fn compute(graph: &ComputeGraph, plan: &ExecutionPlan, f: &Facts<'_>) -> PlanResult<PlanStats> {
    let (mem, streams) = (f.memory, f.streams);
    let device = &plan.device;
    let timing_bug = |e: TimingError| bug("report", format!("timing: {e}"));
    let mut bytes_moved = plan.kernels.iter().fold(0u64, |s, k| s.saturating_add(k.cost.bytes()));
    for s in &plan.steps {
        if let PlanStep::Copy { bytes, node: Some(_), .. } = s {
            bytes_moved = bytes_moved.saturating_add(2 * bytes);
        }
    }
    let bytes_moved_unfused = f.unfused_bytes.unwrap_or_else(|| {
        graph
            .nodes()
            .filter(|(_, n)| n.op.category() != OpCategory::View)
            .map(|(id, _)| graph.node_cost(id).bytes())
            .fold(0u64, u64::saturating_add)
    });
    // The plan's steps as tasks, simulated once (the makespan only: the report's bounds are those of the
    // group DAG below, so the stream-order bound `simulate` adds would be computed for nothing).
    let (tasks, _) = timing::tasks_from_steps(&plan_sim_steps(plan, device)).map_err(timing_bug)?;
    let overhead_us = LaunchMode::Graph.overhead_us(device);
    let serial_us: f64 = tasks.iter().map(|t| t.duration_us + overhead_us).sum();
    // The bounds of any stream assignment: the same launches with the group DAG's edges as their only
    // dependencies. Steps run the copies of aliased outputs first, then one step per group.
    let ng = f.groups.len();
    let first = tasks.len().saturating_sub(ng);
    let order = streams.submission_order();
    let mut task_of = vec![0usize; order.len()];
    for (i, g) in order.iter().enumerate() {
        task_of[g.index()] = first + i;
    }
    // The steps' tasks with `preds` (per group) as their only dependencies.
    let over = |preds: &[Vec<GroupId>]| -> Vec<timing::Task> {
        let deps = |i: usize| match i.checked_sub(first) {
            Some(j) => preds[order[j].index()].iter().map(|p| timing::TaskId::from_index(task_of[p.index()])).collect(),
            None => Vec::new(),
        };
        let task = |(i, t): (usize, &timing::Task)| timing::Task { deps: deps(i), ..*t };
        tasks.iter().enumerate().map(task).collect()
    };
    let reuse_preds = f.groups.preds_with(mem.reuse_edges.iter().map(|e| (e.from, e.to)));
    // The energetic bound (over data and reuse edges; the largest part of the report) and, beside it, the
    // simulated makespan (the plan's own steps) and the data-edge bound: independent figures, on two threads
    // once the plan is large enough to repay the hand-off.
    let energetic = || timing::dag_bound(&over(&reuse_preds), overhead_us);
    let rest = || {
        let makespan = timing::simulate_makespan(&tasks, overhead_us);
        (makespan, timing::dag_critical_path(&over(f.groups.all_preds()), overhead_us))
    };
    let (b, (makespan, data)) =
        if tasks.len() >= PARALLEL_TASKS { rayon::join(energetic, rest) } else { (energetic(), rest()) };
    let (b, makespan_us, data) = (b.map_err(timing_bug)?, makespan.map_err(timing_bug)?, data.map_err(timing_bug)?);
    let order_outcome = f.order.unwrap_or(OrderOutcome {
        given_lower_bound_bytes: mem.lower_bound_bytes,
        chosen_lower_bound_bytes: mem.lower_bound_bytes,
        chosen: OrderChoice::Given,
        optimal: false,
    });
    Ok(PlanStats {
        nodes: graph.num_nodes(),
        tensors: graph.num_tensors(),
        naive_bytes: mem.naive_bytes,
        lower_bound_bytes: mem.lower_bound_bytes,
        events_before_reduction: streams.events_before_reduction,
        waits: streams.syncs.len(),
        chains: streams.chains,
        makespan_us,
        makespan_bound_us: b.critical_path_us.max(b.area_us),
        critical_path_us: b.critical_path_us,
        area_us: b.area_us,
        energetic_bound_us: b.bound_us,
        data_bound_us: data.critical_path_us.max(data.area_us),
        one_stream_us: serial_us,
        stream_limit_bound_us: b.bound_us.max(serial_us / f.max_streams.max(1) as f64),
        given_order_lower_bound_bytes: order_outcome.given_lower_bound_bytes,
        order_chosen: order_outcome.chosen,
        order_optimal: order_outcome.optimal,
        reuse_edges: mem.reuse_edges.len(),
        reuse_edges_added: mem.reuse_edges_not_implied,
        in_place_count: mem.in_place_count,
        bytes_moved,
        bytes_moved_unfused,
        precision: f.precision,
        weights_bytes: plan.region_bytes(graph_passes::memory::Region::Weights),
        nodes_per_precision: graph_passes::precision::node_counts(graph),
        pass_ms: Vec::new(),
    })
}

/// The timing evaluator on a plan's steps (DESIGN.md 5): each launch takes its kernel's modelled time and
/// occupancy, a copy reads and writes its bytes at DRAM bandwidth on one block's worth of the device,
/// records and waits become dependencies; `mode` sets the launch overhead.
pub fn simulate_plan(plan: &ExecutionPlan, device: &DeviceProfile, mode: LaunchMode) -> Result<Timeline, TimingError> {
    let (tasks, _) = timing::tasks_from_steps(&plan_sim_steps(plan, device))?;
    timing::simulate_on(&tasks, device, mode)
}

fn plan_sim_steps(plan: &ExecutionPlan, device: &DeviceProfile) -> Vec<SimStep> {
    let copy_occupancy = device.occupancy(1);
    plan.steps
        .iter()
        .map(|s| match s {
            PlanStep::Launch { stream, kernel, .. } => {
                let e = plan.kernel(*kernel).map(|k| k.estimate).unwrap_or_default();
                SimStep::Work {
                    stream: *stream,
                    duration_us: e.time_us,
                    occupancy: e.occupancy.clamp(copy_occupancy, 1.0),
                }
            }
            // As exec-sim's timing model: a copy reads and writes its bytes at DRAM bandwidth.
            PlanStep::Copy { stream, bytes, .. } => SimStep::Work {
                stream: *stream,
                duration_us: 2.0 * *bytes as f64 / device.mem_bandwidth.max(1.0) * 1e6,
                occupancy: copy_occupancy,
            },
            PlanStep::Record { stream, event } => SimStep::Record { stream: *stream, event: event.0 },
            PlanStep::Wait { stream, event } => SimStep::Wait { stream: *stream, event: event.0 },
        })
        .collect()
}
