//! The pipeline driver, straight-line and readable top to bottom:
//!
//! ```text
//! graph ─topo─> TopoOrder ─fusion─> FusionPlan ─groups─> GroupGraph ─memory─> MemoryPlan ─stream─> StreamPlan
//!       ─lower─> kernels, bindings ─emit─> steps ─report─> PlanStats           = ExecutionPlan
//! ```
//!
//! - **precision** (`graph_passes::precision`, only when [`PlanOptions::precision`] asks for fp16/bf16): graph,
//!   policy -> a rewritten graph (half storage, casts at the boundaries) that every later pass plans; the
//!   pipeline result owns it ([`PipelineResult::graph`]);
//! - **topo** (`graph_passes::topo`): graph -> a topological order of its nodes;
//! - **fusion** (`graph_passes::fusion`): graph, order, target -> fused groups in execution order; when it
//!   eliminated Concats (`FusionCaps::concat_elimination`), the memory bound (`memory::lower_bound`, no packing)
//!   is computed with and without them and they stay only when it does not rise (`settle_concats`, timed as
//!   fusion);
//! - **groups** (`graph_passes::group_graph`): graph, order, fusion -> the facts every later pass shares (alias
//!   roots, writer groups, data edges, readers);
//! - **memory** (`graph_passes::memory`): graph, fusion, groups, target -> placements, pool, reuse edges;
//! - **stream** (`graph_passes::stream`): graph, fusion, groups, memory, target -> streams and kept waits;
//! - **lower** ([`crate::lower`]): graph, fusion, groups, memory, device -> kernels (programs, bindings) and the
//!   external bindings; it reads nothing the stream pass decides, so a large enough build runs the two side by
//!   side on a multi-core machine (`stream_and_lower`);
//! - **emit** ([`crate::emit`]): lowered kernels, memory, stream -> the steps in submission order (the one place
//!   that turns synchronisation decisions into records and waits);
//! - **report** ([`crate::report`]): the finished plan, the device and the group graph's edges -> `PlanStats`.
//!
//! The target (streams, device) is derived once from [`PlanOptions`] ([`PlanOptions::target`]) and passed down.
//! With [`OrderStrategy::Memory`], memory-aware ordering is an outer loop: candidate orders each run the same
//! front of the pipeline (fusion, groups, memory) and the best confirmed by the memory pass goes on.
//! In debug and test builds a consistency check runs after each pass ([`crate::pass_checks`]); a failure is an
//! [`InternalError`] naming the pass. [`run_pipeline`] can stop after a named pass, for tools and benches.

use graph_ir::{ComputeGraph, GraphError, OpCost};
use graph_passes::device::{DeviceProfile, LaunchEstimate};
use graph_passes::estimate;
use graph_passes::fusion::{self, FusionOptions, FusionPlan};
use graph_passes::group_graph::GroupGraph;
use graph_passes::memory::{self, MemoryOptions, MemoryPlan};
use graph_passes::order;
use graph_passes::precision::{self, PrecisionPolicy, PrecisionReport};
use graph_passes::stream::{self, StreamOptions, StreamPlan};
use graph_passes::target::{Effort, Target};
use graph_passes::topo::{self, TopoOrder};
use graph_passes::{InternalError, PlanError, PlanResult};
use serde::{Deserialize, Serialize};
use std::time::Instant;

use crate::plan::ExecutionPlan;

/// A pass of the pipeline, by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pass {
    /// Topological order.
    Topo,
    /// Fusion.
    Fusion,
    /// The group graph (facts shared by the later passes).
    Groups,
    /// Memory planning.
    Memory,
    /// Stream assignment and synchronisation.
    Stream,
    /// Kernel lowering: programs, bindings.
    Lower,
    /// Step emission: launches, copies, records and waits in submission order.
    Emit,
    /// The figures of the finished plan.
    Report,
}

impl Pass {
    /// Every pass in pipeline order.
    pub const ALL: [Pass; 8] =
        [Pass::Topo, Pass::Fusion, Pass::Groups, Pass::Memory, Pass::Stream, Pass::Lower, Pass::Emit, Pass::Report];

    /// The pass's name (also its tracing span's name and its `pass_ms` key).
    pub fn name(self) -> &'static str {
        match self {
            Pass::Topo => "topo",
            Pass::Fusion => "fusion",
            Pass::Groups => "groups",
            Pass::Memory => "memory",
            Pass::Stream => "stream",
            Pass::Lower => "lower",
            Pass::Emit => "emit",
            Pass::Report => "report",
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

/// Which order the plan uses (what `OrderStrategy::Memory` settled on).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum OrderChoice {
    /// The given order (not asked to reorder, or no candidate beat it).
    #[default]
    #[serde(rename = "given")]
    Given,
    /// The node-level memory-aware order, fused as it comes.
    #[serde(rename = "node")]
    Node,
    /// The given order's fused groups reordered.
    #[serde(rename = "group")]
    Group,
    /// The node-level order's fused groups reordered.
    #[serde(rename = "node+group")]
    NodeGroup,
}

impl OrderChoice {
    /// The name the report prints (`given`, `node`, `group`, `node+group`).
    pub fn name(self) -> &'static str {
        match self {
            OrderChoice::Given => "given",
            OrderChoice::Node => "node",
            OrderChoice::Group => "group",
            OrderChoice::NodeGroup => "node+group",
        }
    }
}

impl std::fmt::Display for OrderChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
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
    /// Storage precision and its exceptions (fp32 by default: no transform).
    #[serde(default)]
    pub precision: PrecisionPolicy,
    /// How much search the passes may spend beyond their greedy answers (`fast`, `default`, `max`; the
    /// analogue of TensorRT's builder optimisation level). Budgets scale with the graph.
    #[serde(default)]
    pub effort: Effort,
}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions {
            max_streams: 1,
            fusion: FusionOptions::default(),
            memory: MemoryOptions::default(),
            device: DeviceProfile::default(),
            order: OrderStrategy::Given,
            precision: PrecisionPolicy::default(),
            effort: Effort::Default,
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

    /// The target these options plan for: the one place the stream limit and the device are read.
    pub fn target(&self) -> Target {
        Target::new(self.max_streams, self.device.clone())
            .with_effort(self.effort)
            .with_alignment(self.memory.alignment)
    }

    /// Check the options, naming the field at fault.
    pub fn validate(&self) -> Result<(), GraphError> {
        let invalid = |option: &str, detail: String| GraphError::InvalidOption { option: option.into(), detail };
        if self.max_streams == 0 {
            return Err(invalid("max_streams", "must be at least 1".into()));
        }
        if self.max_streams > MAX_STREAMS {
            return Err(invalid("max_streams", format!("{} is above the limit of {MAX_STREAMS}", self.max_streams)));
        }
        let a = self.memory.alignment;
        if a == 0 || !a.is_power_of_two() {
            return Err(invalid("alignment", format!("{a} is not a power of two")));
        }
        if self.fusion.caps.max_ops == 0 || self.fusion.caps.max_inputs == 0 {
            return Err(invalid("fusion.caps", "max_ops and max_inputs must be at least 1".into()));
        }
        Ok(())
    }
}

/// Most streams a plan may use (CUDA supports many more; beyond this, events cost more than overlap gains).
pub const MAX_STREAMS: usize = 64;

/// What memory-aware ordering settled on, in the plan's vocabulary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OrderOutcome {
    /// `lower_bound_bytes` of the given order's plan.
    pub given_lower_bound_bytes: u64,
    /// `lower_bound_bytes` of the chosen order's plan (`<=` the given one's).
    pub chosen_lower_bound_bytes: u64,
    /// Which candidate the plan uses.
    pub chosen: OrderChoice,
    /// The exact search proved no order of the plan's fused groups has a lower bound in its model.
    pub optimal: bool,
}

/// What the pipeline produced, pass by pass (later passes absent when stopped early).
#[derive(Clone, Debug)]
pub struct PipelineResult {
    /// The target every pass planned for.
    pub target: Target,
    /// Topological order (with `OrderStrategy::Memory`, the one memory-aware ordering chose).
    pub topo: TopoOrder,
    /// What memory-aware ordering found (`OrderStrategy::Memory` only; before fusion, the node-level search's
    /// own report).
    pub order: Option<OrderOutcome>,
    /// Fusion plan.
    pub fusion: Option<FusionPlan>,
    /// The group graph of the fusion plan.
    pub groups: Option<GroupGraph>,
    /// Memory plan.
    pub memory: Option<MemoryPlan>,
    /// Stream plan.
    pub stream: Option<StreamPlan>,
    /// Each fused group's cost and launch estimate on the target's device (`estimate::estimate_groups`), made
    /// once with the stream plan: the stream pass times its tasks with them and lowering gives them to the
    /// kernels. `None` before the stream pass.
    pub estimates: Option<Vec<(OpCost, LaunchEstimate)>>,
    /// Milliseconds per pass, in first-run order (passes memory-aware ordering runs more than once summed).
    pub pass_ms: Vec<(String, f64)>,
    /// The graph the passes planned when the precision transform rewrote the input (`None`: the input itself).
    pub rewritten: Option<ComputeGraph>,
    /// What the precision transform did (`None`: fp32, no transform).
    pub precision: Option<PrecisionReport>,
}

impl PipelineResult {
    /// The graph every pass of this result planned: the rewritten one, or `input` when none was made. Node and
    /// tensor ids in the result refer to this graph.
    pub fn graph<'a>(&'a self, input: &'a ComputeGraph) -> &'a ComputeGraph {
        self.rewritten.as_ref().unwrap_or(input)
    }
}

/// Runs passes under their tracing span and adds up their wall time by name.
#[derive(Default)]
struct PassClock {
    ms: Vec<(String, f64)>,
}

impl PassClock {
    fn run<T>(&mut self, pass: Pass, f: impl FnOnce() -> T) -> T {
        self.run_named(pass.name(), f)
    }

    /// Add `ms` to `pass`'s time (work done off the clock on the pass's behalf).
    fn add(&mut self, pass: Pass, ms: f64) {
        self.add_named(pass.name(), ms);
    }

    /// Add `ms` to the time of the pass (or rewrite) `name`, listed in first-run order.
    fn add_named(&mut self, name: &str, ms: f64) {
        match self.ms.iter_mut().find(|(n, _)| n == name) {
            Some(e) => e.1 += ms,
            None => self.ms.push((name.to_string(), ms)),
        }
    }

    /// As `run`, for the precision transform (a rewrite before the passes, not a stop-after point).
    fn run_named<T>(&mut self, name: &'static str, f: impl FnOnce() -> T) -> T {
        let (out, ms) = timed(name, f);
        self.add_named(name, ms);
        out
    }
}

/// The front of the pipeline for one order: fusion, its group graph and (once run) its memory plan.
struct Front {
    topo: TopoOrder,
    fusion: FusionPlan,
    groups: GroupGraph,
    memory: Option<MemoryPlan>,
    /// The memory pass's first steps for this fusion plan when the Concat check already made them
    /// ([`settle_concats`]): the memory pass then starts from them instead of deriving them again.
    prepared: Option<memory::Prepared>,
}

/// Fusion and the group graph for `topo`, each followed by its check.
fn fuse(
    graph: &ComputeGraph,
    topo: TopoOrder,
    opts: &PlanOptions,
    target: &Target,
    clock: &mut PassClock,
) -> PlanResult<Front> {
    let (pass, fusion) = clock.run(Pass::Fusion, || {
        let pass = fusion::Fusion::prepared(graph, &topo, target, &opts.fusion);
        let plan = pass.analyse(&opts.fusion);
        (pass, plan)
    });
    crate::pass_checks::after_fusion(graph, &fusion)?;
    settle_concats(graph, &topo, &pass, fusion, opts, target, clock)
}

/// The front for `fusion` when its Concat eliminations do not raise the memory bound, else for the fusion plan
/// without them, with a `ConcatMemory` decision on each such Concat. First `memory::concat_bound`: when a step
/// at `fusion`'s peak lies outside every elimination's early window, the same kernels with each Concat launched
/// peak no lower, and `fusion` is kept without a second fusion run (the usual case). Otherwise the two fusion
/// plans are compared by `memory::lower_bound` (the bound the memory pass would report, without its packing).
/// The caller plans memory once, for the front it gets. The check's time (the bounds, the second fusion and its
/// group graph) counts as fusion time.
fn settle_concats(
    graph: &ComputeGraph,
    topo: &TopoOrder,
    pass: &fusion::Fusion<'_>,
    fusion: FusionPlan,
    opts: &PlanOptions,
    target: &Target,
    clock: &mut PassClock,
) -> PlanResult<Front> {
    if fusion.stats.concats_eliminated == 0 {
        return Front::with_fusion(graph, topo.clone(), fusion, clock);
    }
    let mut front = Front::with_fusion(graph, topo.clone(), fusion, clock)?;
    let mut scratch = PassClock::default();
    let t0 = Instant::now();
    // The memory pass's first steps, which the bound needs: the kept front's memory pass starts from them.
    let prepared = memory::prepare(graph, &front.fusion, &front.groups, target, &opts.memory).ok();
    // A bound over the pool limit counts as a rise (the plan without them reports its own error, if any).
    let (with, may_raise) = match prepared.as_ref().map(|p| p.concat_bound(graph, &front.fusion, &opts.memory)) {
        Some((b, may_raise)) if b <= opts.memory.max_pool_bytes => (b, may_raise),
        _ => (u64::MAX, true),
    };
    if !may_raise {
        // A step at the peak is outside every elimination's early window: without them the bound is no lower
        // (`memory::Prepared::concat_bound`), so the second fusion run is not needed.
        clock.add(Pass::Fusion, t0.elapsed().as_secs_f64() * 1e3);
        front.prepared = prepared;
        return Ok(front);
    }
    let mut off = opts.fusion.clone();
    off.caps.concat_elimination = false;
    let alt_fusion = pass.analyse(&off);
    crate::pass_checks::after_fusion(graph, &alt_fusion)?;
    let mut alt = Front::with_fusion(graph, topo.clone(), alt_fusion, &mut scratch)?;
    let alt_prepared = memory::prepare(graph, &alt.fusion, &alt.groups, target, &opts.memory)?;
    let without = alt_prepared.lower_bound(&opts.memory);
    clock.add(Pass::Fusion, t0.elapsed().as_secs_f64() * 1e3);
    if with <= without {
        front.prepared = prepared;
        return Ok(front);
    }
    alt.prepared = Some(alt_prepared);
    tracing::debug!(with, without, "concat elimination would raise the memory bound: planned without it");
    let why = format!("they would raise lower_bound_bytes from {without} to {with}");
    if opts.fusion.decisions {
        concat_memory_decisions(graph, &front.fusion, &mut alt.fusion, &why);
    }
    Ok(alt)
}

/// A `ConcatMemory` decision in `without` (the fusion plan made with Concat elimination off) on each Concat that
/// `with` eliminated, saying `why` they were not kept.
fn concat_memory_decisions(graph: &ComputeGraph, with: &FusionPlan, without: &mut FusionPlan, why: &str) {
    for (n, node) in graph.nodes() {
        if with.is_eliminated(graph, n) {
            without.decisions.push(fusion::FusionDecision {
                producer: node.name.to_string(),
                consumer: node.name.to_string(),
                rejected: Some(fusion::RejectReason::ConcatMemory),
                phase: fusion::FusionPhase::Concat,
                tensor: String::new(),
                score: 0,
                detail: format!("the plan's {} Concat eliminations are not kept: {why}", with.stats.concats_eliminated),
            });
        }
    }
}

impl Front {
    fn with_fusion(
        graph: &ComputeGraph,
        topo: TopoOrder,
        fusion: FusionPlan,
        clock: &mut PassClock,
    ) -> PlanResult<Front> {
        let groups = clock.run(Pass::Groups, || GroupGraph::new(graph, &topo, &fusion));
        crate::pass_checks::after_groups(&groups)?;
        Ok(Front { topo, fusion, groups, memory: None, prepared: None })
    }

    /// Run the memory pass (once) and its check.
    fn plan_memory(
        &mut self,
        graph: &ComputeGraph,
        opts: &PlanOptions,
        target: &Target,
        clock: &mut PassClock,
    ) -> PlanResult<&MemoryPlan> {
        if self.memory.is_none() {
            let (fusion, groups, prepared) = (&self.fusion, &self.groups, self.prepared.take());
            let m = clock.run(Pass::Memory, || match prepared {
                Some(p) => memory::analyse_prepared(graph, fusion, groups, target, &opts.memory, p),
                None => memory::analyse(graph, fusion, groups, target, &opts.memory),
            })?;
            crate::pass_checks::after_memory(&m)?;
            self.memory = Some(m);
        }
        self.memory.as_ref().ok_or_else(|| bug("pipeline", "memory plan missing right after the memory pass"))
    }
}

/// Run the passes up to and including `stop_after` (up to the stream pass when `None`; lowering, emission and
/// the report belong to [`ExecutionPlan::build_with`]).
pub fn run_pipeline(graph: &ComputeGraph, opts: &PlanOptions, stop_after: Option<Pass>) -> PlanResult<PipelineResult> {
    opts.validate()?;
    graph.validate()?;
    if opts.precision.is_identity() {
        return run_passes(graph, opts, stop_after, PassClock::default());
    }
    let mut clock = PassClock::default();
    let (rewritten, report) = clock.run_named("precision", || precision::transform(graph, &opts.precision))?;
    crate::pass_checks::after_precision(graph, &rewritten)?;
    let mut r = run_passes(&rewritten, opts, stop_after, clock)?;
    r.rewritten = Some(rewritten);
    r.precision = Some(report);
    Ok(r)
}

/// [`run_pipeline`] through the memory pass on a graph the caller gives up, for a precision other than the
/// identity: the transform edits the graph in place (`precision::transform_owned`) instead of copying it.
fn run_pipeline_owned(graph: ComputeGraph, opts: &PlanOptions) -> PlanResult<PipelineResult> {
    opts.validate()?;
    graph.validate()?;
    // The debug checks compare the rewrite with its input, which the edit consumes.
    let input = crate::pass_checks::ON.then(|| graph.clone());
    let mut clock = PassClock::default();
    let (rewritten, report) = clock.run_named("precision", || precision::transform_owned(graph, &opts.precision))?;
    if let Some(input) = &input {
        crate::pass_checks::after_precision(input, &rewritten)?;
    }
    let mut r = run_passes(&rewritten, opts, Some(Pass::Memory), clock)?;
    r.rewritten = Some(rewritten);
    r.precision = Some(report);
    Ok(r)
}

/// The passes from topo on, over the graph they plan.
fn run_passes(
    graph: &ComputeGraph,
    opts: &PlanOptions,
    stop_after: Option<Pass>,
    mut clock: PassClock,
) -> PlanResult<PipelineResult> {
    let target = opts.target();
    let stop = |p: Pass| stop_after == Some(p);
    let given = clock.run(Pass::Topo, || topo::analyse(graph))?;
    let mut r = PipelineResult {
        target: target.clone(),
        topo: given,
        order: None,
        fusion: None,
        groups: None,
        memory: None,
        stream: None,
        estimates: None,
        pass_ms: Vec::new(),
        rewritten: None,
        precision: None,
    };
    if stop(Pass::Topo) {
        if opts.order == OrderStrategy::Memory {
            // Stopped before fusion: only the node-level order applies.
            let (order, rep) = order::memory_order_with(graph, &r.topo, target.effort);
            r.topo = order;
            r.order = Some(OrderOutcome {
                given_lower_bound_bytes: rep.given_peak_bytes,
                chosen_lower_bound_bytes: rep.chosen_peak_bytes,
                chosen: if rep.chosen_peak_bytes < rep.given_peak_bytes {
                    OrderChoice::Node
                } else {
                    OrderChoice::Given
                },
                optimal: rep.optimal,
            });
        }
        r.pass_ms = clock.ms;
        return Ok(r);
    }
    if stop(Pass::Fusion) && opts.order == OrderStrategy::Given {
        let (pass, mut fusion) = clock.run(Pass::Fusion, || {
            let pass = fusion::Fusion::prepared(graph, &r.topo, &target, &opts.fusion);
            let plan = pass.analyse(&opts.fusion);
            (pass, plan)
        });
        crate::pass_checks::after_fusion(graph, &fusion)?;
        // Whether Concat eliminations stay needs the memory pass: what the full pipeline would keep.
        if fusion.stats.concats_eliminated > 0 {
            // The kept front's group graph is the next pass's: its time counts as fusion here too.
            let (mut scratch, t0) = (PassClock::default(), Instant::now());
            fusion = settle_concats(graph, &r.topo, &pass, fusion, opts, &target, &mut scratch)?.fusion;
            clock.add(Pass::Fusion, t0.elapsed().as_secs_f64() * 1e3);
        }
        r.fusion = Some(fusion);
        r.pass_ms = clock.ms;
        return Ok(r);
    }
    let mut front = fuse(graph, r.topo.clone(), opts, &target, &mut clock)?;
    if opts.order == OrderStrategy::Memory {
        let (chosen, outcome) = memory_ordered(graph, opts, &target, front, &mut clock)?;
        front = chosen;
        r.order = Some(outcome);
    }
    let Front { topo, fusion, groups, memory, prepared } = front;
    r.topo = topo;
    // (Memory-aware ordering needs the group graph, so with it a stop after fusion has one too.)
    if stop(Pass::Fusion) || stop(Pass::Groups) {
        r.fusion = Some(fusion);
        r.groups = Some(groups);
        r.pass_ms = clock.ms;
        return Ok(r);
    }
    let mut front = Front { topo: r.topo.clone(), fusion, groups, memory, prepared };
    if let Err(e) = front.plan_memory(graph, opts, &target, &mut clock).map(|_| ()) {
        // Concat eliminations are kept on their bound (`settle_concats`); a pool over the limit with them that
        // would fit without them falls back to the plan without them, as it did when the check packed both.
        let over_limit = matches!(e, PlanError::Graph(GraphError::LimitExceeded { .. }));
        if !over_limit || front.fusion.stats.concats_eliminated == 0 {
            return Err(e);
        }
        let mut off = opts.fusion.clone();
        off.caps.concat_elimination = false;
        let mut fusion = clock.run(Pass::Fusion, || fusion::analyse_for(graph, &front.topo, &off, &target));
        crate::pass_checks::after_fusion(graph, &fusion)?;
        if opts.fusion.decisions {
            concat_memory_decisions(graph, &front.fusion, &mut fusion, &format!("with them the pool fails: {e}"));
        }
        front = Front::with_fusion(graph, front.topo.clone(), fusion, &mut clock)?;
        front.plan_memory(graph, opts, &target, &mut clock)?;
    }
    let Front { fusion, groups, memory, .. } = front;
    let memory = memory.ok_or_else(|| bug("pipeline", "memory plan missing"))?;
    if !stop(Pass::Memory) {
        let (s, estimates) = clock.run(Pass::Stream, || {
            let estimates = estimate::estimate_groups(graph, &fusion, &target.device);
            (stream_pass(&estimates, &groups, &memory, &target), estimates)
        });
        crate::pass_checks::after_stream(&s, fusion.groups.len(), target.streams)?;
        r.stream = Some(s);
        r.estimates = Some(estimates);
    }
    r.fusion = Some(fusion);
    r.groups = Some(groups);
    r.memory = Some(memory);
    r.pass_ms = clock.ms;
    Ok(r)
}

/// Each fused group's cost and launch estimate ([`PipelineResult::estimates`]).
type Estimates = Vec<(OpCost, LaunchEstimate)>;

/// The stream pass over the groups' estimates.
fn stream_pass(
    estimates: &[(OpCost, LaunchEstimate)],
    groups: &GroupGraph,
    memory: &MemoryPlan,
    target: &Target,
) -> StreamPlan {
    stream::analyse_estimated(estimates, groups, memory, &StreamOptions::new(target.clone()))
}

/// Groups from which a build runs the stream pass on a thread of its own beside lowering (both need only the
/// memory plan and the estimates). A thread costs 0.05-0.2 ms to start and join on this project's 2-core VMs,
/// and the two threads slow each other: at 1k nodes (about 300 groups) the overlap made every family slower at
/// 4 streams (random_dag 5.2-5.6 against 5.8-6.0 ms, resnet_like 1.8 against 2.0), at 3k nodes it broke even,
/// at 10k it gains (docs/benchmarks.md, eighth round).
const OVERLAP_GROUPS: usize = 1024;

/// The stream pass and lowering of a build, after the estimates they share. From [`OVERLAP_GROUPS`] groups
/// on a machine with two or more cores, the stream pass runs on
/// a scoped thread while this one lowers: lowering decides nothing the stream pass reads, nor the other way
/// round, so the plan is the one the sequential order gives. Each pass's time is its own (`pass_ms` then adds
/// up to more than the build's wall time).
fn stream_and_lower(
    graph: &ComputeGraph,
    fusion: &FusionPlan,
    groups: &GroupGraph,
    memory: &MemoryPlan,
    target: &Target,
    clock: &mut PassClock,
) -> PlanResult<(StreamPlan, Estimates, crate::lower::Lowered)> {
    let estimates = clock.run(Pass::Stream, || estimate::estimate_groups(graph, fusion, &target.device));
    let stream = || timed(Pass::Stream.name(), || stream_pass(&estimates, groups, memory, target));
    let lower = || timed(Pass::Lower.name(), || crate::lower::lower(graph, fusion, groups, memory, &estimates));
    let ((s, stream_ms), (lowered, lower_ms)) = if fusion.groups.len() >= OVERLAP_GROUPS && graph_passes::multi_core() {
        let parent = tracing::Span::current();
        std::thread::scope(|scope| {
            let handle = scope.spawn(move || parent.in_scope(stream));
            let lowered = lower();
            (handle.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)), lowered)
        })
    } else {
        (stream(), lower())
    };
    clock.add(Pass::Stream, stream_ms);
    crate::pass_checks::after_stream(&s, fusion.groups.len(), target.streams)?;
    clock.add(Pass::Lower, lower_ms);
    Ok((s, estimates, lowered?))
}

/// `f` under the tracing span of the pass `name`, with its wall time in milliseconds: what [`PassClock`] adds
/// up, and what a pass run off the clock (on another thread) reports to it.
fn timed<T>(name: &'static str, f: impl FnOnce() -> T) -> (T, f64) {
    let _span = tracing::info_span!("pass", name).entered();
    let t0 = Instant::now();
    let out = f();
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    tracing::debug!(pass = name, ms, "pass done");
    (out, ms)
}

/// A candidate order of memory-aware ordering: its front and its group-model bound.
struct Candidate {
    choice: OrderChoice,
    front: Front,
    model_peak: u64,
    optimal: bool,
}

/// Memory-aware ordering at plan level: the given order's front, the node-level memory-aware order (which may
/// fuse differently), and memory-aware reorders of either's fused groups (`order::memory_group_order`) are
/// compared by the group-level bound; the best is kept only when the memory pass confirms a lower
/// `lower_bound_bytes` than the given order's, so the chosen order's bound never exceeds the given one's.
fn memory_ordered(
    graph: &ComputeGraph,
    opts: &PlanOptions,
    target: &Target,
    mut given: Front,
    clock: &mut PassClock,
) -> PlanResult<(Front, OrderOutcome)> {
    let a = opts.memory.alignment;
    let e = target.effort;
    let (regrouped, rep_given) = order::memory_group_order_with(graph, &given.topo, &given.fusion, &given.groups, a, e);
    let given_model = rep_given.given_peak_bytes;
    let mut best: Option<Candidate> = None;
    let mut consider = |c: Candidate| {
        if c.model_peak < best.as_ref().map_or(given_model, |b| b.model_peak) {
            best = Some(c);
        }
    };
    if let Some((t, f)) = regrouped {
        let front = Front::with_fusion(graph, t, f, clock)?;
        consider(Candidate {
            choice: OrderChoice::Group,
            front,
            model_peak: rep_given.chosen_peak_bytes,
            optimal: rep_given.optimal,
        });
    }
    let (node_topo, _) = order::memory_order_with(graph, &given.topo, e);
    if node_topo.order != given.topo.order {
        let node = fuse(graph, node_topo, opts, target, clock)?;
        let (regrouped, rep) = order::memory_group_order_with(graph, &node.topo, &node.fusion, &node.groups, a, e);
        let peak = rep.given_peak_bytes;
        let node_optimal = rep.optimal && rep.chosen_peak_bytes == peak;
        if let Some((t, f)) = regrouped {
            let front = Front::with_fusion(graph, t, f, clock)?;
            consider(Candidate { choice: OrderChoice::Node, front: node, model_peak: peak, optimal: node_optimal });
            consider(Candidate {
                choice: OrderChoice::NodeGroup,
                front,
                model_peak: rep.chosen_peak_bytes,
                optimal: rep.optimal,
            });
        } else {
            consider(Candidate { choice: OrderChoice::Node, front: node, model_peak: peak, optimal: node_optimal });
        }
    }
    let given_bound = given.plan_memory(graph, opts, target, clock)?.lower_bound_bytes;
    if let Some(mut c) = best {
        let chosen_bound = c.front.plan_memory(graph, opts, target, clock)?.lower_bound_bytes;
        if chosen_bound < given_bound {
            tracing::debug!(given = given_bound, chosen = chosen_bound, strategy = ?c.choice, "memory-aware order");
            let outcome = OrderOutcome {
                given_lower_bound_bytes: given_bound,
                chosen_lower_bound_bytes: chosen_bound,
                chosen: c.choice,
                optimal: c.optimal,
            };
            return Ok((c.front, outcome));
        }
    }
    let outcome = OrderOutcome {
        given_lower_bound_bytes: given_bound,
        chosen_lower_bound_bytes: given_bound,
        chosen: OrderChoice::Given,
        optimal: rep_given.optimal && rep_given.chosen_peak_bytes == given_model,
    };
    Ok((given, outcome))
}

/// A planner bug in `pass`.
/// `opts` with fusion decisions off: a plan carries none (`explain` replays fusion to show them), so building
/// one formats no reasons.
fn without_decisions(opts: &PlanOptions) -> std::borrow::Cow<'_, PlanOptions> {
    if !opts.fusion.decisions {
        return std::borrow::Cow::Borrowed(opts);
    }
    let mut o = opts.clone();
    o.fusion.decisions = false;
    std::borrow::Cow::Owned(o)
}

pub(crate) fn bug(pass: &'static str, what: impl std::fmt::Display) -> PlanError {
    PlanError::Internal(InternalError::new(pass, what))
}

impl ExecutionPlan {
    /// Build a plan with default options and at most `max_streams` streams.
    pub fn build(graph: &ComputeGraph, max_streams: usize) -> PlanResult<Self> {
        Self::build_with(graph, &PlanOptions::with_streams(max_streams))
    }

    /// Build a plan with explicit options: the pipeline, then lowering, step emission and the report.
    pub fn build_with(graph: &ComputeGraph, opts: &PlanOptions) -> PlanResult<Self> {
        let _span = tracing::info_span!("build", graph = graph.name()).entered();
        let r = run_pipeline(graph, &without_decisions(opts), Some(Pass::Memory))?;
        Self::complete(Some(graph), r)
    }

    /// [`ExecutionPlan::build_with`] on a graph the caller gives up (the CLI, which plans a graph it loaded and
    /// drops it): the same plan, but under a half precision the transform edits the graph in place rather than
    /// copying it, which keeps the half plan's compile time near the f32 plan's.
    pub fn build_owned(graph: ComputeGraph, opts: &PlanOptions) -> PlanResult<Self> {
        if opts.precision.is_identity() {
            return Self::build_with(&graph, opts);
        }
        let _span = tracing::info_span!("build", graph = graph.name()).entered();
        let r = run_pipeline_owned(graph, &without_decisions(opts))?;
        // Every id of the result refers to the rewritten graph, which `complete` takes from the result itself.
        Self::complete(None, r)
    }

    /// The rest of a build from a pipeline run through the memory pass, over the graph it planned (the result's
    /// rewritten graph, or `input`): the stream pass and lowering (side by side where that pays,
    /// [`stream_and_lower`]), then emission and the report.
    fn complete(input: Option<&ComputeGraph>, mut r: PipelineResult) -> PlanResult<Self> {
        let no_graph = || bug("pipeline", "a build's pipeline without the graph it planned");
        let graph = r.rewritten.as_ref().or(input).ok_or_else(no_graph)?;
        let (fusion, groups, mem) = match (&r.fusion, &r.groups, &r.memory) {
            (Some(f), Some(g), Some(m)) => (f, g, m),
            _ => return Err(bug("pipeline", "a build's pipeline stopped before the memory plan")),
        };
        let mut clock = PassClock { ms: std::mem::take(&mut r.pass_ms) };
        let (stream, estimates, lowered) = stream_and_lower(graph, fusion, groups, mem, &r.target, &mut clock)?;
        r.stream = Some(stream);
        r.estimates = Some(estimates);
        let graph = r.rewritten.as_ref().or(input).ok_or_else(no_graph)?;
        Self::finish_lowered(graph, &r, lowered, clock)
    }

    /// Lower, emit and report a pipeline run through the stream pass — one a caller may have changed, e.g. with
    /// a stream plan made under other `StreamOptions` (every plan is still checked by `verify` in tests).
    pub fn finish(input: &ComputeGraph, r: &PipelineResult) -> PlanResult<Self> {
        let graph = r.graph(input);
        let (fusion, groups, mem) = match (&r.fusion, &r.groups, &r.memory, &r.stream) {
            (Some(f), Some(g), Some(m), Some(_)) => (f, g, m),
            // A caller's mistake (a pipeline stopped early), not a planner bug.
            _ => {
                return Err(PlanError::Graph(GraphError::InvalidOption {
                    option: "pipeline".into(),
                    detail: "finish needs a pipeline run through the stream pass (stop_after: None or stream)".into(),
                }))
            }
        };
        let mut clock = PassClock { ms: r.pass_ms.clone() };
        let device = &r.target.device;
        let lowered = clock.run(Pass::Lower, || match &r.estimates {
            Some(e) => crate::lower::lower(graph, fusion, groups, mem, e),
            None => crate::lower::lower(graph, fusion, groups, mem, &estimate::estimate_groups(graph, fusion, device)),
        })?;
        Self::finish_lowered(graph, r, lowered, clock)
    }

    /// Emit and report a pipeline run through the stream pass whose groups are lowered (`lowered`); `graph` is
    /// the one it planned ([`PipelineResult::graph`]).
    fn finish_lowered(
        graph: &ComputeGraph,
        r: &PipelineResult,
        lowered: crate::lower::Lowered,
        mut clock: PassClock,
    ) -> PlanResult<Self> {
        let (fusion, groups, mem, streams) = match (&r.fusion, &r.groups, &r.memory, &r.stream) {
            (Some(f), Some(g), Some(m), Some(s)) => (f, g, m, s),
            _ => return Err(bug("pipeline", "a lowered pipeline without its plans")),
        };
        let device = &r.target.device;
        let steps = clock.run(Pass::Emit, || crate::emit::emit(graph, fusion, mem, streams, &lowered))?;
        let mut plan = ExecutionPlan::assemble(graph, mem, streams, lowered, steps, device.clone());
        let facts = crate::report::Facts {
            groups,
            memory: mem,
            streams,
            order: r.order,
            max_streams: r.target.streams,
            precision: r.precision.as_ref().map_or(Default::default(), |p| p.precision),
            unfused_bytes: fusion.unfused_bytes,
        };
        plan.stats = clock.run(Pass::Report, || crate::report::compute(graph, &plan, &facts))?;
        plan.stats.pass_ms = clock.ms;
        Ok(plan)
    }
}
