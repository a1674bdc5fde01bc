//! The pipeline driver: `topo -> liveness -> fusion -> memory -> stream -> linearise`, straight-line, one
//! `tracing` span per pass, with a consistency check after each pass in debug and test builds and the option
//! to stop after a named pass (`run_pipeline`).

use graph_ir::{ComputeGraph, GraphError, GraphResult, OpCategory, TensorId, TensorRole};
use graph_passes::device::{estimate_group, DeviceProfile};
use graph_passes::fusion::{self, FusionOptions, FusionPlan, GroupKind};
use graph_passes::liveness::{self, Liveness};
use graph_passes::memory::{self, MemoryOptions, MemoryPlan, Placement};
use graph_passes::order::{self, OrderReport};
use graph_passes::stream::{self, StreamOptions, StreamPlan};
use graph_passes::timing::{self, LaunchMode, SimStep, Timeline, TimingError};
use graph_passes::topo::{self, TopoOrder};
use serde::{Deserialize, Serialize};
use slotmap::SecondaryMap;
use std::collections::HashMap;
use std::time::Instant;

use crate::ids::{EventId, KernelId, StreamId, ValueId};
use crate::plan::{
    Access, Binding, BindingRole, BufferRef, ExecutionPlan, Instr, Kernel, KernelOrder, Param, PlanNode, PlanStats,
    PlanStep, Value,
};

/// A pass of the pipeline, by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pass {
    /// Topological order.
    Topo,
    /// Node-level liveness.
    Liveness,
    /// Fusion.
    Fusion,
    /// Memory planning.
    Memory,
    /// Stream assignment and synchronisation.
    Stream,
    /// Submission order.
    Linearise,
}

impl Pass {
    /// Every pass in pipeline order.
    pub const ALL: [Pass; 6] = [Pass::Topo, Pass::Liveness, Pass::Fusion, Pass::Memory, Pass::Stream, Pass::Linearise];

    /// The pass's name (also its tracing span's name).
    pub fn name(self) -> &'static str {
        match self {
            Pass::Topo => "topo",
            Pass::Liveness => "liveness",
            Pass::Fusion => "fusion",
            Pass::Memory => "memory",
            Pass::Stream => "stream",
            Pass::Linearise => "linearise",
        }
    }

    /// A pass by name.
    pub fn by_name(s: &str) -> Option<Pass> {
        Pass::ALL.into_iter().find(|p| p.name() == s)
    }
}

/// How to choose the topological order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum OrderStrategy {
    /// The graph's own order (creation order, stable Kahn).
    #[default]
    Given,
    /// An order chosen to lower the activation peak.
    Memory,
}

/// Every knob of the pipeline.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlanOptions {
    /// Most streams (>= 1).
    pub max_streams: usize,
    /// Fusion options.
    pub fusion: FusionOptions,
    /// Memory options (reuse, in-place, alignment, pool limit).
    pub memory: MemoryOptions,
    /// Device profile for the cost model.
    pub device: DeviceProfile,
    /// Topological order strategy.
    pub order: OrderStrategy,
}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions {
            max_streams: 1,
            fusion: FusionOptions::default(),
            memory: MemoryOptions::default(),
            device: DeviceProfile::default(),
            order: OrderStrategy::Given,
        }
    }
}

impl PlanOptions {
    /// Defaults with `max_streams` streams.
    pub fn with_streams(max_streams: usize) -> Self {
        PlanOptions { max_streams, ..Default::default() }
    }

    /// The reference plan's options: fusion off, reuse off, in-place off, one stream.
    pub fn reference() -> Self {
        let mut o = PlanOptions::default();
        o.fusion.enabled = false;
        o.memory.reuse = false;
        o.memory.in_place = false;
        o
    }

    /// Check the options, naming the field at fault.
    pub fn validate(&self) -> GraphResult<()> {
        if self.max_streams == 0 {
            return Err(GraphError::InvalidOption {
                option: "max_streams".into(),
                detail: "must be at least 1".into(),
            });
        }
        if self.max_streams > MAX_STREAMS {
            return Err(GraphError::InvalidOption {
                option: "max_streams".into(),
                detail: format!("{} is above the limit of {MAX_STREAMS}", self.max_streams),
            });
        }
        let a = self.memory.alignment;
        if a == 0 || !a.is_power_of_two() {
            return Err(GraphError::InvalidOption {
                option: "alignment".into(),
                detail: format!("{a} is not a power of two"),
            });
        }
        if self.fusion.caps.max_ops == 0 || self.fusion.caps.max_inputs == 0 {
            return Err(GraphError::InvalidOption {
                option: "fusion.caps".into(),
                detail: "max_ops and max_inputs must be at least 1".into(),
            });
        }
        Ok(())
    }
}

/// Most streams a plan may use (CUDA supports many more; beyond this, events cost more than overlap gains).
pub const MAX_STREAMS: usize = 64;

/// What the pipeline produced, pass by pass (later passes absent when stopped early).
#[derive(Clone, Debug)]
pub struct PipelineResult {
    /// Topological order (with `OrderStrategy::Memory`, the one memory-aware ordering chose).
    pub topo: TopoOrder,
    /// What memory-aware ordering found (`OrderStrategy::Memory` only).
    pub order_report: Option<OrderReport>,
    /// Node-level liveness.
    pub liveness: Option<Liveness>,
    /// Fusion plan.
    pub fusion: Option<FusionPlan>,
    /// Memory plan.
    pub memory: Option<MemoryPlan>,
    /// Stream plan.
    pub stream: Option<StreamPlan>,
    /// Milliseconds per pass.
    pub pass_ms: Vec<(String, f64)>,
}

fn timed<T>(pass: Pass, ms: &mut Vec<(String, f64)>, f: impl FnOnce() -> T) -> T {
    let _span = tracing::info_span!("pass", name = pass.name()).entered();
    let t0 = Instant::now();
    let out = f();
    let dt = t0.elapsed().as_secs_f64() * 1e3;
    tracing::debug!(pass = pass.name(), ms = dt, "pass done");
    ms.push((pass.name().to_string(), dt));
    out
}

/// Run the passes up to and including `stop_after` (all of them when `None`).
///
/// With `OrderStrategy::Memory` the order is chosen by the pool it gives: the given order, the node-level
/// memory-aware order (which may fuse differently), and memory-aware orders of either's fused groups
/// (`graph_passes::order::memory_group_order`) are compared by the group-level bound, and the best is kept
/// only when the memory pass confirms a lower `lower_bound_bytes` than the given order's (so the chosen
/// order's bound never exceeds the given one's). Stopped before fusion, only the node-level order applies.
pub fn run_pipeline(graph: &ComputeGraph, opts: &PlanOptions, stop_after: Option<Pass>) -> GraphResult<PipelineResult> {
    opts.validate()?;
    graph.validate()?;
    let stop = |p: Pass| stop_after == Some(p);
    let mut ms = Vec::new();
    let topo = timed(Pass::Topo, &mut ms, || topo::analyse(graph))?;
    let mut r = PipelineResult {
        topo,
        order_report: None,
        liveness: None,
        fusion: None,
        memory: None,
        stream: None,
        pass_ms: Vec::new(),
    };
    let before_fusion = matches!(stop_after, Some(Pass::Topo | Pass::Liveness));
    let target = fusion::FusionTarget { streams: opts.max_streams, device: opts.device.clone() };
    // With one stream every reuse is ordered anyway: the preference for DAG-ordered reuse would only cost time.
    let mopts = MemoryOptions {
        prefer_ordered_reuse: opts.memory.prefer_ordered_reuse && opts.max_streams > 1,
        ..opts.memory.clone()
    };
    let mut chosen = None;
    if opts.order == OrderStrategy::Memory {
        if before_fusion {
            let (order, report) = order::memory_order(graph, &r.topo);
            r.topo = order;
            r.order_report = Some(report);
        } else {
            let c = memory_ordered(graph, opts, &r.topo, &target, &mopts, &mut ms)?;
            r.topo = c.topo;
            r.order_report = Some(c.report);
            chosen = Some((c.fusion, c.memory));
        }
    }
    if stop(Pass::Topo) {
        r.pass_ms = merge_ms(ms);
        return Ok(r);
    }
    let live = timed(Pass::Liveness, &mut ms, || liveness::analyse(graph, &r.topo));
    r.liveness = Some(live);
    if stop(Pass::Liveness) {
        r.pass_ms = merge_ms(ms);
        return Ok(r);
    }
    let (fusion, mem) = match chosen {
        Some((f, m)) => (f, Some(m)),
        None => (timed(Pass::Fusion, &mut ms, || fusion::analyse_for(graph, &r.topo, &opts.fusion, &target)), None),
    };
    #[cfg(debug_assertions)]
    crate::checks::fusion(graph, &r.topo, &fusion)?;
    r.fusion = Some(fusion);
    if stop(Pass::Fusion) {
        r.pass_ms = merge_ms(ms);
        return Ok(r);
    }
    let fusion = r.fusion.as_ref().ok_or_else(|| bug("fusion plan missing"))?;
    let mem = match mem {
        Some(m) => m,
        None => timed(Pass::Memory, &mut ms, || memory::analyse(graph, &r.topo, fusion, &mopts))?,
    };
    #[cfg(debug_assertions)]
    crate::checks::memory(&mem)?;
    r.memory = Some(mem);
    if stop(Pass::Memory) {
        r.pass_ms = merge_ms(ms);
        return Ok(r);
    }
    let mem = r.memory.as_ref().ok_or_else(|| bug("memory plan missing"))?;
    let sopts = StreamOptions::new(opts.max_streams, opts.device.clone());
    let streams = timed(Pass::Stream, &mut ms, || stream::analyse(graph, fusion, mem, &sopts));
    r.stream = Some(streams);
    r.pass_ms = merge_ms(ms);
    Ok(r)
}

/// Per-pass milliseconds with repeated passes (memory-aware ordering runs fusion and memory more than once)
/// summed under one name, in first-run order.
fn merge_ms(ms: Vec<(String, f64)>) -> Vec<(String, f64)> {
    let mut out: Vec<(String, f64)> = Vec::with_capacity(ms.len());
    for (name, t) in ms {
        match out.iter_mut().find(|(n, _)| *n == name) {
            Some(e) => e.1 += t,
            None => out.push((name, t)),
        }
    }
    out
}

/// The order `OrderStrategy::Memory` settles on, with the fusion and memory plans made for it.
struct MemoryOrdered {
    topo: TopoOrder,
    fusion: FusionPlan,
    memory: MemoryPlan,
    report: OrderReport,
}

/// Memory-aware ordering at plan level (see [`run_pipeline`]). The report's peaks are `lower_bound_bytes` of
/// the given order's plan and of the chosen one's.
fn memory_ordered(
    graph: &ComputeGraph,
    opts: &PlanOptions,
    given: &TopoOrder,
    target: &fusion::FusionTarget,
    mopts: &MemoryOptions,
    ms: &mut Vec<(String, f64)>,
) -> GraphResult<MemoryOrdered> {
    let a = mopts.alignment;
    let fa = timed(Pass::Fusion, ms, || fusion::analyse_for(graph, given, &opts.fusion, target));
    let (plan, rep_given) = order::memory_group_order(graph, given, &fa, a);
    let given_model = rep_given.given_peak_bytes;
    // (name, node order, fusion plan, group-level bound, proved optimal for its groups), the best below the
    // given order's.
    let mut best: Option<(&'static str, TopoOrder, FusionPlan, u64, bool)> = None;
    let mut consider = |name: &'static str, topo: TopoOrder, f: FusionPlan, peak: u64, optimal: bool| {
        if peak < best.as_ref().map_or(given_model, |b| b.3) {
            best = Some((name, topo, f, peak, optimal));
        }
    };
    if let Some((t, f)) = plan {
        consider("group", t, f, rep_given.chosen_peak_bytes, rep_given.optimal);
    }
    let (node_topo, _) = order::memory_order(graph, given);
    if node_topo.order != given.order {
        let fb = timed(Pass::Fusion, ms, || fusion::analyse_for(graph, &node_topo, &opts.fusion, target));
        let (plan, rep) = order::memory_group_order(graph, &node_topo, &fb, a);
        let peak = rep.given_peak_bytes;
        consider("node", node_topo, fb, peak, rep.optimal && rep.chosen_peak_bytes == peak);
        if let Some((t, f)) = plan {
            consider("node+group", t, f, rep.chosen_peak_bytes, rep.optimal);
        }
    }
    let ma = timed(Pass::Memory, ms, || memory::analyse(graph, given, &fa, mopts))?;
    let given_bound = ma.lower_bound_bytes;
    if let Some((name, topo, fusion, _, optimal)) = best {
        let mb = timed(Pass::Memory, ms, || memory::analyse(graph, &topo, &fusion, mopts))?;
        if mb.lower_bound_bytes < given_bound {
            let report = OrderReport {
                given_peak_bytes: given_bound,
                chosen_peak_bytes: mb.lower_bound_bytes,
                chosen: name,
                optimal,
            };
            tracing::debug!(given = given_bound, chosen = mb.lower_bound_bytes, strategy = name, "memory-aware order");
            return Ok(MemoryOrdered { topo, fusion, memory: mb, report });
        }
    }
    let report = OrderReport {
        given_peak_bytes: given_bound,
        chosen_peak_bytes: given_bound,
        chosen: "given",
        optimal: rep_given.optimal && rep_given.chosen_peak_bytes == given_model,
    };
    Ok(MemoryOrdered { topo: given.clone(), fusion: fa, memory: ma, report })
}

fn bug(what: &str) -> GraphError {
    GraphError::InvalidOption { option: "internal".into(), detail: format!("planner bug: {what}") }
}

impl ExecutionPlan {
    /// Build a plan with default options and at most `max_streams` streams.
    pub fn build(graph: &ComputeGraph, max_streams: usize) -> GraphResult<Self> {
        Self::build_with(graph, &PlanOptions::with_streams(max_streams))
    }

    /// Build a plan with explicit options.
    pub fn build_with(graph: &ComputeGraph, opts: &PlanOptions) -> GraphResult<Self> {
        let _span = tracing::info_span!("build", graph = graph.name()).entered();
        let r = run_pipeline(graph, opts, None)?;
        let mut ms = r.pass_ms.clone();
        let (fusion, mem, streams) = match (&r.fusion, &r.memory, &r.stream) {
            (Some(f), Some(m), Some(s)) => (f, m, s),
            _ => return Err(bug("pipeline stopped early")),
        };
        let plan = timed(Pass::Linearise, &mut ms, || linearise(graph, opts, fusion, mem, streams))?;
        let mut plan = plan;
        plan.stats.pass_ms = ms;
        if let Some(rep) = &r.order_report {
            plan.stats.given_order_lower_bound_bytes = rep.given_peak_bytes;
            plan.stats.order_chosen = rep.chosen.to_string();
            plan.stats.order_optimal = rep.optimal;
        }
        Ok(plan)
    }
}

fn buf(p: &Placement) -> BufferRef {
    BufferRef { region: p.region, offset: p.offset, bytes: p.bytes }
}

/// Build the kernels and the single submission order from the passes' results.
pub fn linearise(
    graph: &ComputeGraph,
    opts: &PlanOptions,
    fusion: &FusionPlan,
    mem: &MemoryPlan,
    streams: &StreamPlan,
) -> GraphResult<ExecutionPlan> {
    let place = |t: TensorId| -> GraphResult<BufferRef> {
        mem.placement.get(t).map(buf).ok_or_else(|| bug(&format!("tensor '{}' has no placement", graph.tensor(t).name)))
    };
    // Alias roots (views share their input's bytes).
    let mut root: SecondaryMap<TensorId, TensorId> = SecondaryMap::with_capacity(graph.num_tensors());
    for (t, _) in graph.tensors() {
        root.insert(t, t);
    }
    for (_, n) in graph.nodes() {
        if n.op.is_view() {
            if let (Some(&i), Some(&o)) = (n.inputs.first(), n.outputs.first()) {
                let r = root[i];
                root.insert(o, r);
            }
        }
    }

    // Kernels, one per non-copy group; copies become Copy steps.
    let mut kernel_of_group: Vec<Option<KernelId>> = vec![None; fusion.groups.len()];
    let mut kernels: Vec<Kernel> = Vec::new();
    let mut bytes_moved = 0u64;
    for (gi, g) in fusion.groups.iter().enumerate() {
        if g.kind == GroupKind::Copy {
            continue;
        }
        let id = KernelId::from_index(kernels.len());
        let mut values: Vec<Value> = Vec::new();
        let mut vid: HashMap<TensorId, ValueId> = HashMap::new();
        let mut value_of = |t: TensorId, values: &mut Vec<Value>| -> ValueId {
            *vid.entry(t).or_insert_with(|| {
                let tensor = graph.tensor(t);
                values.push(Value { name: tensor.name.clone(), dtype: tensor.dtype, shape: tensor.shape.clone() });
                ValueId::from_index(values.len() - 1)
            })
        };
        let mut params = Vec::new();
        for &t in &g.inputs {
            let v = value_of(t, &mut values);
            params.push(Param {
                value: v,
                root: graph.tensor(root[t]).name.clone(),
                buffer: place(t)?,
                access: Access::Read,
            });
        }
        let mut body = Vec::with_capacity(g.nodes.len());
        for &n in &g.nodes {
            let node = graph.node(n);
            let inputs = node.inputs.iter().map(|&t| value_of(t, &mut values)).collect();
            let outputs = node.outputs.iter().map(|&t| value_of(t, &mut values)).collect();
            body.push(Instr { node: node.name.clone(), op: node.op.clone(), inputs, outputs });
        }
        for &t in &g.outputs {
            let v = value_of(t, &mut values);
            params.push(Param {
                value: v,
                root: graph.tensor(root[t]).name.clone(),
                buffer: place(t)?,
                access: Access::Write,
            });
        }
        let (cost, estimate) = estimate_group(graph, g, &opts.device);
        bytes_moved = bytes_moved.saturating_add(cost.bytes());
        kernel_of_group[gi] = Some(id);
        kernels.push(Kernel { id, name: id.to_string(), kind: g.kind, values, params, body, cost, estimate });
    }

    // Events: one per group that another stream waits on.
    let mut event_of_group: HashMap<usize, EventId> = HashMap::new();
    let mut waits_into: Vec<Vec<usize>> = vec![Vec::new(); fusion.groups.len()];
    for s in &streams.syncs {
        let next = EventId::from_index(event_of_group.len());
        event_of_group.entry(s.from.index()).or_insert(next);
        waits_into[s.to.index()].push(s.from.index());
    }
    let mut steps = Vec::with_capacity(fusion.groups.len() + 2 * streams.syncs.len());
    for &(src, dst) in &mem.output_copies {
        let (s, d) = (place(src)?, place(dst)?);
        steps.push(PlanStep::Copy { stream: StreamId(0), src: s, dst: d, bytes: d.bytes.min(s.bytes), node: None });
    }
    // A launch on another stream may read a copied output (an output that is a view of an input that is itself an
    // output): one event after the copies, waited on only by the first such reader of each stream that does not
    // already know the copies are done (through an earlier wait on an event recorded after them).
    let copied: Vec<BufferRef> = steps
        .iter()
        .filter_map(|s| match s {
            PlanStep::Copy { dst, .. } => Some(*dst),
            _ => None,
        })
        .collect();
    let copy_event = EventId::from_index(event_of_group.len());
    let record_at = steps.len();
    let mut copy_event_used = false;
    if !copied.is_empty() && streams.num_streams > 1 {
        steps.push(PlanStep::Record { stream: StreamId(0), event: copy_event });
    }
    // Per stream: whether it is known to run after the copies; per event: whether its record did.
    let mut knows = vec![false; streams.num_streams.max(1)];
    if let Some(k) = knows.first_mut() {
        *k = true;
    }
    let mut event_knows: HashMap<EventId, bool> = HashMap::new();
    for gid in streams.submission_order() {
        let (gi, g) = (gid.index(), &fusion.groups[gid.index()]);
        let stream = streams.stream_of[gi];
        let mut froms = waits_into[gi].clone();
        froms.sort_unstable();
        froms.dedup();
        for f in froms {
            let event = *event_of_group.get(&f).ok_or_else(|| bug("wait on an event never recorded"))?;
            steps.push(PlanStep::Wait { stream, event });
            if event_knows.get(&event).copied().unwrap_or(false) {
                knows[stream.index()] = true;
            }
        }
        let mut wait_for_copies = |reads: &[BufferRef], steps: &mut Vec<PlanStep>| {
            if !knows[stream.index()] && reads.iter().any(|r| copied.iter().any(|c| c.overlaps(r))) {
                steps.push(PlanStep::Wait { stream, event: copy_event });
                knows[stream.index()] = true;
                copy_event_used = true;
            }
        };
        match kernel_of_group[gi] {
            Some(k) => {
                let kernel = &kernels[k.index()];
                let mut reads: Vec<BufferRef> =
                    kernel.params.iter().filter(|p| p.access == Access::Read).map(|p| p.buffer).collect();
                let mut writes: Vec<BufferRef> =
                    kernel.params.iter().filter(|p| p.access == Access::Write).map(|p| p.buffer).collect();
                reads.sort_unstable();
                reads.dedup();
                writes.sort_unstable();
                writes.dedup();
                wait_for_copies(&reads, &mut steps);
                steps.push(PlanStep::Launch { stream, kernel: k, reads, writes });
            }
            None => {
                let node = g.nodes.first().map(|&n| graph.node(n)).ok_or_else(|| bug("empty copy group"))?;
                let (src, dst) = match (node.inputs.first(), node.outputs.first()) {
                    (Some(&i), Some(&o)) => (place(i)?, place(o)?),
                    _ => return Err(bug("copy without operands")),
                };
                bytes_moved = bytes_moved.saturating_add(2 * src.bytes);
                wait_for_copies(&[src], &mut steps);
                steps.push(PlanStep::Copy { stream, src, dst, bytes: src.bytes, node: Some(node.name.clone()) });
            }
        }
        if let Some(&event) = event_of_group.get(&gi) {
            steps.push(PlanStep::Record { stream, event });
            event_knows.insert(event, knows[stream.index()]);
        }
    }
    let extra_events = usize::from(copy_event_used);
    if !copied.is_empty() && streams.num_streams > 1 && !copy_event_used {
        steps.remove(record_at);
    }

    // Bindings: inputs, weights and constants, outputs.
    let mut bindings = Vec::new();
    for &t in graph.inputs().iter().chain(graph.weights()).chain(graph.outputs()) {
        let tensor = graph.tensor(t);
        let role = match tensor.role {
            TensorRole::Input => BindingRole::Input,
            TensorRole::Weight => BindingRole::Weight,
            TensorRole::Constant => BindingRole::Constant,
            _ => BindingRole::Output,
        };
        bindings.push(Binding {
            name: tensor.name.clone(),
            role,
            dtype: tensor.dtype,
            shape: tensor.shape.clone(),
            buffer: place(t)?,
            data: tensor.data.as_ref().map(|d| d.to_vec()),
        });
    }
    let nodes: Vec<PlanNode> = graph
        .nodes()
        .map(|(_, n)| PlanNode { name: n.name.clone(), op: n.op.name().to_string(), view: n.op.is_view() })
        .collect();
    let mut orders: Vec<KernelOrder> = mem
        .reuse_edges
        .iter()
        .filter_map(|e| match (kernel_of_group[e.from.index()], kernel_of_group[e.to.index()]) {
            (Some(from), Some(to)) => Some(KernelOrder { from, to }),
            _ => None,
        })
        .collect();
    orders.sort_unstable();
    orders.dedup();
    let bytes_moved_unfused = graph
        .nodes()
        .filter(|(_, n)| n.op.category() != OpCategory::View)
        .map(|(id, _)| graph.node_cost(id).bytes())
        .fold(0u64, u64::saturating_add);
    let launches = steps.iter().filter(|s| matches!(s, PlanStep::Launch { .. })).count();
    let stats = PlanStats {
        nodes: graph.num_nodes(),
        tensors: graph.num_tensors(),
        naive_bytes: mem.naive_bytes,
        lower_bound_bytes: mem.lower_bound_bytes,
        events_before_reduction: streams.events_before_reduction,
        waits: streams.syncs.len(),
        chains: streams.chains,
        makespan_us: 0.0,
        makespan_bound_us: 0.0,
        critical_path_us: 0.0,
        area_us: 0.0,
        simple_bound_us: 0.0,
        data_bound_us: 0.0,
        one_stream_us: 0.0,
        stream_limit_bound_us: 0.0,
        given_order_lower_bound_bytes: mem.lower_bound_bytes,
        order_chosen: "given".to_string(),
        order_optimal: false,
        reuse_edges: mem.reuse_edges.len(),
        reuse_edges_added: mem.reuse_edges_not_implied,
        in_place_count: mem.in_place_count,
        bytes_moved,
        bytes_moved_unfused,
        device: opts.device.name.clone(),
        pass_ms: Vec::new(),
    };
    let mut plan = ExecutionPlan {
        steps,
        num_streams: streams.num_streams,
        pool_bytes: mem.pool_bytes(),
        kernel_count_original: nodes.iter().filter(|n| !n.view).count(),
        kernel_count_fused: launches,
        event_count: event_of_group.len() + extra_events,
        graph_name: graph.name().to_string(),
        alignment: mem.alignment,
        region_bytes: mem.region_bytes,
        kernels,
        bindings,
        nodes,
        orders,
        stats,
    };
    let t = simulate_plan(&plan, &opts.device, LaunchMode::Graph).map_err(|e| bug(&format!("timing: {e}")))?;
    // The bound of any stream assignment: the same launches with the group DAG's edges (data and reuse) as
    // their only dependencies. Steps run copies of aliased outputs first, then one step per group.
    let (mut tasks, _) =
        timing::tasks_from_steps(&plan_sim_steps(&plan, &opts.device)).map_err(|e| bug(&format!("timing: {e}")))?;
    let first = tasks.len().saturating_sub(fusion.groups.len());
    let order = streams.submission_order();
    let mut task_of = vec![0usize; order.len()];
    for (i, g) in order.iter().enumerate() {
        task_of[g.index()] = first + i;
    }
    let mut bound_over = |preds: &[Vec<graph_passes::GroupId>]| {
        for (i, t) in tasks.iter_mut().enumerate() {
            t.deps = match i.checked_sub(first) {
                Some(j) => {
                    preds[order[j].index()].iter().map(|p| timing::TaskId::from_index(task_of[p.index()])).collect()
                }
                None => Vec::new(),
            };
        }
        timing::dag_bound(&tasks, t.overhead_us).map_err(|e| bug(&format!("timing: {e}")))
    };
    let b = bound_over(&graph_passes::stream::group_predecessors(graph, fusion, mem))?;
    let data = bound_over(&graph_passes::stream::group_data_predecessors(graph, fusion))?;
    plan.stats.data_bound_us = data.bound_us;
    plan.stats.makespan_us = t.makespan_us;
    plan.stats.makespan_bound_us = b.bound_us;
    plan.stats.critical_path_us = b.critical_path_us;
    plan.stats.area_us = b.area_us;
    plan.stats.simple_bound_us = b.critical_path_us.max(b.area_us);
    plan.stats.one_stream_us = t.serial_us;
    plan.stats.stream_limit_bound_us = b.bound_us.max(t.serial_us / opts.max_streams.max(1) as f64);
    Ok(plan)
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
