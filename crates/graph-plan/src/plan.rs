//! The `ExecutionPlan` and everything a backend needs to run it: steps in submission order, kernels with their
//! expression programs and buffer bindings, external bindings, and region sizes.

use graph_ir::{DType, Op, OpCost, Shape};
use graph_passes::device::{DeviceProfile, LaunchEstimate};
use graph_passes::fusion::GroupKind;
use graph_passes::memory::Region;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use crate::build::OrderChoice;
use crate::ids::{EventId, KernelId, StreamId, ValueId};

/// A byte range in a region: `[offset, offset + bytes)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BufferRef {
    /// The region.
    pub region: Region,
    /// First byte.
    pub offset: u64,
    /// Length in bytes.
    pub bytes: u64,
}

impl BufferRef {
    /// One past the last byte.
    pub fn end(&self) -> u64 {
        self.offset.saturating_add(self.bytes)
    }

    /// True when the two ranges share a byte (same region, half-open ranges intersect).
    pub fn overlaps(&self, other: &BufferRef) -> bool {
        self.region == other.region && self.offset < other.end() && other.offset < self.end()
    }
}

impl fmt::Display for BufferRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[{}..{})", self.region.name(), self.offset, self.end())
    }
}

/// One step of the plan, in submission order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum PlanStep {
    /// Launch a kernel on a stream.
    Launch {
        /// The stream.
        stream: StreamId,
        /// The kernel (index into the plan's kernels).
        kernel: KernelId,
        /// Every range the kernel reads.
        reads: Vec<BufferRef>,
        /// Every range the kernel writes.
        writes: Vec<BufferRef>,
    },
    /// Record an event on a stream (after the work submitted to it so far).
    Record {
        /// The stream.
        stream: StreamId,
        /// The event.
        event: EventId,
    },
    /// Make a stream wait for an event recorded earlier in submission order.
    Wait {
        /// The stream.
        stream: StreamId,
        /// The event.
        event: EventId,
    },
    /// Copy bytes (a Memcpy node, or a graph output that aliases a source).
    Copy {
        /// The stream.
        stream: StreamId,
        /// Source range.
        src: BufferRef,
        /// Destination range.
        dst: BufferRef,
        /// Bytes copied.
        bytes: u64,
        /// The Memcpy node this copy runs, if any.
        node: Option<Arc<str>>,
    },
}

impl PlanStep {
    /// The stream the step is submitted to.
    pub fn stream(&self) -> StreamId {
        match self {
            PlanStep::Launch { stream, .. }
            | PlanStep::Record { stream, .. }
            | PlanStep::Wait { stream, .. }
            | PlanStep::Copy { stream, .. } => *stream,
        }
    }

    /// True for launches and copies (steps that do work).
    pub fn is_compute(&self) -> bool {
        matches!(self, PlanStep::Launch { .. } | PlanStep::Copy { .. })
    }
}

/// A value of a kernel program: a tensor seen by the kernel.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Value {
    /// The graph tensor's name (the graph's own text, shared: a plan names each tensor in every kernel that
    /// touches it without a copy of the string).
    pub name: Arc<str>,
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Shape,
}

/// Read or write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Access {
    /// The kernel reads the buffer.
    Read,
    /// The kernel writes the buffer.
    Write,
}

/// A program value bound to memory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Param {
    /// The bound value.
    pub value: ValueId,
    /// Alias root of the value's tensor (its own name unless it is a view's output): the tensor whose writer
    /// produces these bytes.
    pub root: Arc<str>,
    /// Where the bytes are.
    pub buffer: BufferRef,
    /// Read or write.
    pub access: Access,
}

/// One instruction: a graph node's op over program values.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Instr {
    /// The graph node's name (shared with the graph, as [`Value::name`] is).
    pub node: Arc<str>,
    /// Its op (ONNX semantics; views reinterpret without moving bytes).
    pub op: Op,
    /// Input values in the op's order.
    pub inputs: Vec<ValueId>,
    /// Output values.
    pub outputs: Vec<ValueId>,
}

/// A fused kernel: a small expression program over values, some bound to buffers.
///
/// Executors evaluate `body` in order. A value that is a `Read` param starts as the bytes of its buffer; a value
/// that is a `Write` param must end up in its buffer; other values are kernel-internal temporaries.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Kernel {
    /// Its id.
    pub id: KernelId,
    /// Display name (`k3`).
    pub name: String,
    /// Kernel shape (elementwise, anchor + epilogue, reduction, data movement, custom).
    pub kind: GroupKind,
    /// Values, indexed by `ValueId`.
    pub values: Vec<Value>,
    /// Buffer bindings.
    pub params: Vec<Param>,
    /// The program.
    pub body: Vec<Instr>,
    /// Modelled cost (flops, bytes read and written by the kernel).
    pub cost: OpCost,
    /// Modelled time and occupancy on the plan's device.
    pub estimate: LaunchEstimate,
}

impl Kernel {
    /// Names of the graph nodes it runs, in program order.
    pub fn node_names(&self) -> impl Iterator<Item = &str> + '_ {
        self.body.iter().map(|i| i.node.as_ref())
    }

    /// The value of id `v`.
    pub fn value(&self, v: ValueId) -> &Value {
        &self.values[v.index()]
    }

    /// The param binding value `v`, if any, with the given access.
    pub fn param_of(&self, v: ValueId, access: Access) -> Option<&Param> {
        self.params.iter().find(|p| p.value == v && p.access == access)
    }
}

/// What an external binding is to the graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BindingRole {
    /// Supplied at every run.
    Input,
    /// Supplied when the plan is prepared.
    Weight,
    /// Carried in the plan.
    Constant,
    /// Returned by every run.
    Output,
}

/// A named tensor the caller exchanges with the plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Binding {
    /// Tensor name (the graph's, e.g. the ONNX name).
    pub name: Arc<str>,
    /// Role.
    pub role: BindingRole,
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Shape,
    /// Where its bytes live.
    pub buffer: BufferRef,
    /// Little-endian bytes of a constant.
    pub data: Option<Vec<u8>>,
}

/// A graph node as the plan records it (for the coverage check).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanNode {
    /// Node name.
    pub name: Arc<str>,
    /// Op name (a static string when the plan was built, owned when it was read back from JSON).
    pub op: Cow<'static, str>,
    /// True for views (no kernel).
    pub view: bool,
    /// True for an eliminated Concat: no kernel either, its inputs were written into slices of its output
    /// (`FusionCaps::concat_elimination`). Still counted in `kernel_count_original`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub eliminated: bool,
}

/// An ordering the memory plan requires between two launches: `from` before `to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct KernelOrder {
    /// Kernel that must finish first.
    pub from: KernelId,
    /// Kernel that must start after.
    pub to: KernelId,
}

/// Figures reported beside the plan.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PlanStats {
    /// Nodes in the graph.
    pub nodes: usize,
    /// Tensors in the graph.
    pub tensors: usize,
    /// Sum of aligned sizes of pool tensors (no reuse).
    pub naive_bytes: u64,
    /// Fixed-order lower bound of the pool (DESIGN.md 5).
    pub lower_bound_bytes: u64,
    /// Cross-stream dependency edges before event reduction.
    pub events_before_reduction: usize,
    /// Waits after event reduction (one per kept cross-stream edge; one Record serves several waits).
    #[serde(default)]
    pub waits: usize,
    /// Chains of the minimum chain decomposition (streams an unlimited plan would use).
    #[serde(default)]
    pub chains: usize,
    /// Modelled makespan of one graph replay (the timing evaluator on the plan's steps, graph-replay overhead).
    #[serde(default)]
    pub makespan_us: f64,
    /// DESIGN.md 5's makespan bound: max(`critical_path_us`, `area_us`). No schedule on this device, with any
    /// stream assignment, does better.
    #[serde(default)]
    pub makespan_bound_us: f64,
    /// Longest path of launch times over the group DAG (data and reuse edges).
    #[serde(default)]
    pub critical_path_us: f64,
    /// Sum over launches of launch time x occupancy: the device time the work needs.
    #[serde(default)]
    pub area_us: f64,
    /// The energetic bound: `makespan_bound_us` tightened by the energetic path (launches that must run between
    /// two ordered launches share the device; `graph_passes::timing`'s module docs). Never below
    /// `makespan_bound_us`; `makespan_us / energetic_bound_us` is the tighter quality figure.
    #[serde(default)]
    pub energetic_bound_us: f64,
    /// DESIGN.md 5's data-only bound: `makespan_bound_us` over the data edges alone (no reuse edges). Against
    /// `makespan_bound_us` it says what the memory plan's reuse costs the best possible schedule.
    #[serde(default)]
    pub data_bound_us: f64,
    /// Modelled makespan of the same launches on one stream (the sum of launch times).
    #[serde(default)]
    pub one_stream_us: f64,
    /// The bound with the stream limit: max(`energetic_bound_us`, `one_stream_us` / max streams), since each
    /// stream runs one launch at a time and no launch runs faster than alone.
    #[serde(default)]
    pub stream_limit_bound_us: f64,
    /// `lower_bound_bytes` of the graph's given order: equal to `lower_bound_bytes` unless memory-aware ordering
    /// chose another order, whose bound it then exceeds (the order's gain is the ratio of the two).
    #[serde(default)]
    pub given_order_lower_bound_bytes: u64,
    /// The order the plan uses: `given`, or which memory-aware candidate won (`node`, `group`, `node+group`).
    #[serde(default)]
    pub order_chosen: OrderChoice,
    /// Memory-aware ordering's exact search finished on the plan's fused groups: no order of them has a lower
    /// bound in its model (the pool bound without in-place handovers). False when ordering was not asked for or
    /// the graph was too large or branchy for the search.
    #[serde(default)]
    pub order_optimal: bool,
    /// Reuse edges the memory plan requires.
    pub reuse_edges: usize,
    /// How many of `reuse_edges` the data edges do not already imply: the orderings reuse adds to the DAG (an
    /// upper bound; the memory pass's ancestor queries are budgeted).
    #[serde(default)]
    pub reuse_edges_added: usize,
    /// Tensors written in place over a dying input.
    pub in_place_count: usize,
    /// Bytes moved by all launches (read + written), after fusion.
    pub bytes_moved: u64,
    /// Bytes moved by the unfused graph (every non-view node reading its inputs and writing its outputs).
    pub bytes_moved_unfused: u64,
    /// The storage precision the plan was built for (`fp32`: no precision transform ran).
    #[serde(default)]
    pub precision: graph_passes::precision::Precision,
    /// Bytes of the weights region (weights and constants).
    #[serde(default)]
    pub weights_bytes: u64,
    /// Nodes of the planned graph per dtype of their first float output (`none`: no float output); after the
    /// precision transform, its inserted casts included.
    #[serde(default)]
    pub nodes_per_precision: Vec<(String, usize)>,
    /// Milliseconds per pass, in pipeline order.
    pub pass_ms: Vec<(String, f64)>,
}

/// A compiled plan: what to launch, where, in which order, with which memory.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ExecutionPlan {
    /// Every step in submission order.
    pub steps: Vec<PlanStep>,
    /// Number of streams.
    pub num_streams: usize,
    /// Bytes of the activation pool.
    pub pool_bytes: usize,
    /// Non-view nodes of the graph.
    pub kernel_count_original: usize,
    /// Launch steps.
    pub kernel_count_fused: usize,
    /// Distinct events.
    pub event_count: usize,
    pub(crate) graph_name: String,
    pub(crate) alignment: u64,
    /// Where a slot of an eliminated Concat may start (0, in plans written before slots had their own
    /// alignment: the same as `alignment`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) slot_alignment: u64,
    /// The ranges of the slots of eliminated Concats that do not start their output's allocation: the only
    /// ranges allowed off `alignment` (verify's bounds check).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) slots: Vec<BufferRef>,
    pub(crate) region_bytes: [u64; 4],
    pub(crate) kernels: Vec<Kernel>,
    pub(crate) bindings: Vec<Binding>,
    pub(crate) nodes: Vec<PlanNode>,
    pub(crate) orders: Vec<KernelOrder>,
    pub(crate) stats: PlanStats,
    /// The device profile the plan's estimates and figures are for (the profile itself, so that a custom one
    /// travels with the plan).
    #[serde(default)]
    pub(crate) device: DeviceProfile,
}

impl ExecutionPlan {
    /// Steps submitted to `stream`, in order.
    pub fn steps_on(&self, stream: StreamId) -> Vec<&PlanStep> {
        self.steps.iter().filter(|s| s.stream() == stream).collect()
    }

    /// Number of steps.
    pub fn total_steps(&self) -> usize {
        self.steps.len()
    }

    /// The number of kernel-launch steps (after fusion): equal to `kernel_count_fused`. Copies are not kernel
    /// launches; [`work_steps`](Self::work_steps) counts both.
    pub fn compute_steps(&self) -> usize {
        self.steps.iter().filter(|s| matches!(s, PlanStep::Launch { .. })).count()
    }

    /// Launches and copies: the steps that do work on a device.
    pub fn work_steps(&self) -> usize {
        self.steps.iter().filter(|s| s.is_compute()).count()
    }

    /// The device profile the plan was made for.
    pub fn device(&self) -> &DeviceProfile {
        &self.device
    }

    /// The source graph's name.
    pub fn graph_name(&self) -> &str {
        &self.graph_name
    }

    /// Offset alignment of every allocation, and of every range but the slots of eliminated Concats.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Offset alignment of the slots of eliminated Concats ([`ExecutionPlan::slots`]): a divisor of
    /// [`ExecutionPlan::alignment`] (16 bytes by default), what a backend's widest access into a buffer needs.
    pub fn slot_alignment(&self) -> u64 {
        if self.slot_alignment == 0 {
            self.alignment
        } else {
            self.slot_alignment
        }
    }

    /// The ranges of the slots of eliminated Concats that start inside their output's allocation (sorted,
    /// distinct): a backend binds each as a buffer of its own, aligned to [`ExecutionPlan::slot_alignment`].
    pub fn slots(&self) -> &[BufferRef] {
        &self.slots
    }

    /// Size of a region in bytes.
    pub fn region_bytes(&self, region: Region) -> u64 {
        self.region_bytes[region.index()]
    }

    /// The kernels, indexed by `KernelId`.
    pub fn kernels(&self) -> &[Kernel] {
        &self.kernels
    }

    /// One kernel.
    pub fn kernel(&self, id: KernelId) -> Option<&Kernel> {
        self.kernels.get(id.index())
    }

    /// Mutable kernels, for tools and tests that transform plans (`verify` re-checks the result).
    pub fn kernels_mut(&mut self) -> &mut Vec<Kernel> {
        &mut self.kernels
    }

    /// External bindings: inputs, weights and constants, outputs.
    pub fn bindings(&self) -> &[Binding] {
        &self.bindings
    }

    /// Mutable bindings, for tools and tests that transform plans.
    pub fn bindings_mut(&mut self) -> &mut Vec<Binding> {
        &mut self.bindings
    }

    /// The graph's nodes as the plan records them.
    pub fn nodes(&self) -> &[PlanNode] {
        &self.nodes
    }

    /// Orderings the memory plan requires between kernels (reuse edges).
    pub fn orders(&self) -> &[KernelOrder] {
        &self.orders
    }

    /// Mutable region sizes, for tools and tests that transform plans.
    pub fn region_bytes_mut(&mut self) -> &mut [u64; 4] {
        &mut self.region_bytes
    }

    /// Figures reported beside the plan.
    pub fn stats(&self) -> &PlanStats {
        &self.stats
    }

    /// Put a plan together from what lowering and emission produced; the stats are the report's to fill.
    pub(crate) fn assemble(
        graph: &graph_ir::ComputeGraph,
        mem: &graph_passes::memory::MemoryPlan,
        streams: &graph_passes::stream::StreamPlan,
        lowered: crate::lower::Lowered,
        steps: Vec<PlanStep>,
        device: DeviceProfile,
    ) -> ExecutionPlan {
        let launches = steps.iter().filter(|s| matches!(s, PlanStep::Launch { .. })).count();
        let mut events: Vec<EventId> = steps
            .iter()
            .filter_map(|s| match s {
                PlanStep::Record { event, .. } => Some(*event),
                _ => None,
            })
            .collect();
        events.sort_unstable();
        events.dedup();
        ExecutionPlan {
            steps,
            num_streams: streams.num_streams,
            pool_bytes: usize::try_from(mem.pool_bytes()).unwrap_or(usize::MAX),
            kernel_count_original: lowered.nodes.iter().filter(|n| !n.view).count(),
            kernel_count_fused: launches,
            event_count: events.len(),
            graph_name: graph.name().to_string(),
            alignment: mem.alignment,
            slot_alignment: mem.slot_alignment,
            slots: mem.slots.iter().map(|p| BufferRef { region: p.region, offset: p.offset, bytes: p.bytes }).collect(),
            region_bytes: mem.region_bytes,
            kernels: lowered.kernels,
            bindings: lowered.bindings,
            nodes: lowered.nodes,
            orders: lowered.orders,
            stats: PlanStats::default(),
            device,
        }
    }

    /// Plan as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }

    /// Plan from JSON (as `to_json` writes it).
    pub fn from_json(text: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(text)
    }
}

/// For `skip_serializing_if`: a zero field is left out of the JSON.
fn is_zero(x: &u64) -> bool {
    *x == 0
}
