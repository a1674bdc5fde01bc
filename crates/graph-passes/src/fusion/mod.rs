//! The fusion pass: partitions the non-view nodes into groups, each of which becomes one kernel launch.
//!
//! # Kernel classes (TVM's op patterns, XLA's fusion kinds)
//! - **Loop kernels** (`Elementwise`, `DataMovement`): elementwise ops with any broadcasting, views, and (when
//!   `FusionCaps::injective_fusion`) data-movement ops, evaluated one thread per output element; a producer is
//!   inlined into its consumers at the index they read (XLA's loop fusion, TVM's injective class). Every tensor
//!   the kernel writes has the same element count (the iteration space).
//! - **Anchor kernels**: one MatMul/Gemm/Conv/pool with an elementwise epilogue (bias, BatchNormalization's
//!   scale-shift, activation, residual add, ...). Every anchor operand comes from outside the kernel (no prologue
//!   fusion) and every tensor the kernel writes has the anchor's element count. Elementwise "side" ops whose value
//!   only feeds the epilogue (a broadcast operand computed on the fly) may join. When
//!   `FusionCaps::layout_epilogue`, the epilogue may also hold Transposes (pure permutations, views around them):
//!   the kernel writes its result in the permuted layout (the head split `[B,S,H*D] -> [B,H,S,D]` after an
//!   attention projection, the head merge after `P.V`), and with `FusionCaps::select_epilogue` selections
//!   (constant-index Gathers and Splits: a packed projection's q, k and v routed to tensors of their own). Other
//!   data movement in an epilogue is `Pattern`; a Split outside an epilogue runs alone.
//!   When `FusionCaps::horizontal_gemm`, one anchor kernel may hold several **sibling products** (a horizontal
//!   GEMM): MatMuls, or Gemms with one set of attributes, that read the same activation as their left operand
//!   in one shape, each with a weight of one shape and dtype, writing results of one shape and dtype (an
//!   attention layer's Q, K and V projections; a gated MLP's gate and up projections). A backend runs them as
//!   one product over the weights concatenated at prepare, each column block with its own epilogue; the
//!   activation is read once. Epilogues may combine siblings element by element (`silu(gate) * up`).
//! - **Row kernels** (`Reduction`): reductions that share one domain, with elementwise producers (XLA input
//!   fusion) and consumers. The domain of a reduction is `(S, A)`: its input shape `S` and reduced axes `A`,
//!   compared with leading extent-1 axes stripped (`[1,128,768]` and `[128,768]` are one shape). Every value
//!   computed in the kernel must be a full row value (shape `S`) or a reduced value (`S` with `A` set to 1, or
//!   removed); an edge never crosses from full to reduced except through a reduction, and a full-shaped op reads a
//!   reduced value only in its kept-dims form (so numpy broadcasting lines up with the rows). One block per row
//!   runs one pass per reduction: the decomposed Softmax (ReduceMax, Sub, Exp, ReduceSum, Div) and the decomposed
//!   LayerNormalization (ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul, Add) each become one kernel.
//!   With `injective_fusion`, **loads** join a row kernel too: a Gather, Slice, Expand, Transpose or Concat that
//!   reads tensors from outside the kernel, other loads' results or Casts of those, and whose result is a row
//!   value, broadcasts into the rows, or is read only by other loads, is computed inline at each element (BERT's
//!   embedding lookups feeding their LayerNorm; a vision transformer's class token and patch grid through their
//!   Concat). A load of a value the kernel computes (that row may be another block's), or data movement that is
//!   no load (Pad, Split), is refused.
//! - **Attention kernels** (`Attention`, when `FusionCaps::attention`): `MatMul(Q, K^T) -> [Mul/Div by a
//!   scalar] -> [Where(cond, scores, fill)] -> [Add mask] -> Softmax(last axis) -> MatMul(., V)`, each link a
//!   direct edge read by nothing else,
//!   all f32 or a half chain (half Q, K, V with a Cast to f32 after the first MatMul and back after the
//!   Softmax, as the precision transform writes it; the casts join the kernel), planned as one
//!   FlashAttention-style kernel (tiles of K and V, online softmax): the scores never
//!   leave the kernel, so they take no pool bytes. Elementwise side producers of the mask and a permuted
//!   epilogue (the head merge) that phase 1 put with the chain ride along; nothing joins afterwards. A chain
//!   whose scores come from a MatMul but cannot fuse gets its reason on the edge out of that MatMul
//!   (`attention: ...`, phase `attention`): see `fusion/attention.rs`.
//! - Copies and custom kernels stay alone; nothing fuses across them.
//!
//! Views (Reshape, Flatten, Squeeze, Unsqueeze, Identity) are transparent while deciding. At the end a view joins
//! the group that produces its bytes when one of its (view-transparent) consumers is in that group, so a kernel
//! never reads through an outside alias what it writes itself; other views stay outside and alias.
//!
//! # Algorithm
//! 1. **Vertical, single root** (XLA's producer-into-consumer fusion, TVM's dominator grouping): nodes are visited
//!    in reverse topological order; a producer joins the group of its consumers when all of them (through views)
//!    are in one group and the merge is legal. Diamonds (Gelu's `x * f(x)`, Softmax's two uses of its input)
//!    fall out naturally, because a producer is decided only after all its consumers. Joins in this phase never
//!    create a cycle: a group holds only nodes after the producer, and the producer's only successors are in it.
//!    **Then attention (phase 1b)**: every recognised attention chain (kernel classes above) becomes one group,
//!    the union of the phase-1 groups holding its links (never a cycle: the chain's intermediates have no reader
//!    outside).
//! 2. **Multi-output** (when `FusionCaps::multi_output`): candidate pairs are the producer/consumer group edges;
//!    each is scored, then merged best first when legal, in rounds until nothing changes. A merged kernel may
//!    write an intermediate that other kernels still read (the residual input of a block).
//!    **Then sibling products (phase 2b)**: per activation, the anchor groups whose MatMul or Gemm reads it as
//!    the left operand are merged in position order when legal (the sibling rule, then everything a phase-2
//!    merge checks); each pair tried is a horizontal candidate in the decisions, with its reason when refused
//!    (`Pattern` with what differs, `CapsExceeded` when the cap is off, `WouldCycle`, `LosesConcurrency`).
//!    Siblings whose only reader is another sibling's epilogue already share a kernel after phase 1.
//! 3. **Horizontal** (`FusionOptions::horizontal`, off by default): groups reading the same tensor that do not
//!    depend on each other and are launch-bound (they move fewer bytes than one launch overhead is worth).
//!
//! Legality of a merge, checked in this order: never across a custom kernel or a copy; kernel-class rules above;
//! the caps (`FusionCaps`); the exact cycle check; the concurrency check. Every candidate that is not merged gets
//! a [`RejectReason`], listed by [`FusionPlan::explain`]: the first in this order that refuses it. Phase 2 and 3
//! merges run the cycle check before the kernel-class rules (it is the cheaper refusal on a branchy graph), and a
//! plan build, which records no reason, stops at its refusal; with decisions the rules still run and their
//! refusal is the one recorded. The checks done, and so the work and budget spent, are the same either way.
//!
//! **Cycle check.** Phases 2 and 3 keep a topological order of the group DAG (dynamic, after Pearce and Kelly):
//! merging `X` (ordered first) and `Y` creates a cycle exactly when a group ordered strictly between them is
//! reachable from `X` and reaches `Y`. A forward search from `X` (bounded to groups ordered before `Y`) and a
//! backward search from `Y` (bounded to groups after `X`) run alternately; when either side is empty the merge is
//! safe and the merged group takes `X`'s or `Y`'s place, otherwise the groups found are reordered locally. The
//! check is exact; a merge whose search exceeds its work budget (2048 steps, and 32 per node and edge of the graph
//! for the whole pass, with a floor of 256 per merge) is rejected conservatively (`CycleCheckBudget`) rather
//! than let a graph with long edges make the pass quadratic.
//!
//! # Score (profitability)
//! `score = bytes saved + launches saved x launch_bytes`, where bytes saved is `bytes(X) + bytes(Y) - bytes(X+Y)`
//! (a kernel's bytes: its distinct inputs read plus the tensors it writes) and `launch_bytes` is what the device
//! moves during one launch overhead (overhead x bandwidth), so launches and traffic share one unit, as in
//! Inductor's `score_fusion`. Candidates of phases 2 and 3 are tried best score first.
//!
//! **Lost concurrency.** With more than one stream, the unfused node DAG is timed (roofline plus launch overhead
//! per node, unlimited streams): earliest start, tail to the sinks, critical path `L`. A merged kernel starts when
//! all its inputs are ready and delays everything after it; the longest path through it is `ready + time +
//! tail`. A merge is rejected (`LosesConcurrency`) when that path exceeds `L` by more than one launch overhead
//! (the launch it removes is worth that much even off the critical path) and exceeds the paths through the two
//! parts run apart. Apart, the two kernels share the device: the longer of their paths also waits for the
//! other's work (the shorter roofline), since the model's rooflines are whole-device times. So Q, K and V
//! projections of one input merge on any stream count; a merge that makes a kernel wait for a late input does
//! not. With one stream nothing can run concurrently and the check is off.
//!
//! # Decisions
//! Every data edge between two kernels (producer and consumer non-view nodes, looking through views) gets a
//! [`FusionDecision`] with its reason code and specifics, from the phase that decided it (a later phase that
//! reaches the same verdict keeps the earlier record); so does every horizontal candidate, fused or not. Fused
//! edges are the groups themselves. [`FusionPlan::explain`] prints both; [`FusionPlan::report`] is its
//! serialisable form.
//!
//! # Complexity
//! The graph is first flattened into arrays (nodes by position, tensors by dense index, consumers through views
//! in compressed rows). Phase 1 is O((N + E) x k), k the inputs and outputs of a group (bounded by the caps);
//! groups merge small-into-large, and a group that never merged allocates nothing. Phases 2 and 3 sort O(E)
//! candidates per round (round 1 tries every pair, later rounds only pairs whose groups changed); the cycle
//! checks cost their budget at most. Rejection texts are formatted once per verdict, at the end.

mod attention;
mod build;
mod concat;
mod dag;
mod dense;
mod explain;
mod model;
mod rules;

#[cfg(test)]
mod tests;

use graph_ir::{ComputeGraph, NodeId, OpCategory, TensorId, TensorRole};
use serde::{Deserialize, Serialize};
use slotmap::SecondaryMap;

use crate::ids::GroupId;
use crate::target::Target;
use crate::topo::TopoOrder;

pub use concat::ConcatSlot;
pub use explain::{DecisionReport, FusionReport, GroupReport};

/// What a backend can build: the plan never asks for a kernel outside these limits. A single node is always
/// buildable (every backend runs every op alone); the caps bound what fusion adds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FusionCaps {
    /// MatMul accepts an elementwise epilogue.
    pub matmul_epilogue: bool,
    /// Gemm accepts an elementwise epilogue.
    pub gemm_epilogue: bool,
    /// Conv accepts an elementwise epilogue.
    pub conv_epilogue: bool,
    /// MaxPool/AveragePool accept an elementwise epilogue.
    pub pool_epilogue: bool,
    /// Reductions accept elementwise producers (input fusion) and epilogues, and several reductions over one
    /// domain may share a kernel.
    pub reduction_fusion: bool,
    /// A kernel may write tensors produced by more than one of its ops (an intermediate that other kernels
    /// read, or several results).
    pub multi_output: bool,
    /// Data-movement ops (Transpose, Slice, Concat, Gather, Expand, Pad) may join loop kernels, which then index
    /// their operands through them (TVM's injective fusion). A Split never joins a loop kernel (only an anchor's
    /// epilogue, as a selection: `select_epilogue`).
    #[serde(default = "default_true")]
    pub injective_fusion: bool,
    /// An anchor's epilogue may end in Transposes (with views around them): the anchor kernel writes its result
    /// straight into the permuted layout (`[B,S,H*D] -> [B,H,S,D]` after a projection), so the permutation
    /// costs no launch and no bytes.
    #[serde(default = "default_true")]
    pub layout_epilogue: bool,
    /// With `layout_epilogue`, an anchor's epilogue may also hold selections (Gathers at a constant scalar
    /// index, and Splits, with Transposes and views after them): a packed projection writes each of its parts
    /// straight to a tensor of its own (`q, k, v = qkv.unbind(0)` after a ViT's qkv projection, `qkv.split(e,
    /// dim=-1)` after GPT-2's) instead of one launch per part.
    #[serde(default = "default_true")]
    pub select_epilogue: bool,
    /// A row kernel may hold row selections (a Gather at a constant scalar index along a row axis of a value it
    /// computes: a vision transformer's class token after the final LayerNorm), and then writes only the
    /// selected rows.
    #[serde(default = "default_true")]
    pub select_rows: bool,
    /// `MatMul(Q, K^T) -> [scale] -> [mask Add] -> Softmax -> MatMul(., V)` may be one fused attention kernel
    /// (`GroupKind::Attention`): tiles of K and V, online softmax, the scores never materialised.
    #[serde(default = "default_true")]
    pub attention: bool,
    /// A Concat whose inputs are each written by a kernel and occupy contiguous byte ranges of its output (every
    /// extent before the axis is 1) runs no kernel: each producer writes straight into its slice of the output's
    /// allocation (see `fusion/concat.rs`). The backend needs nothing but buffer offsets.
    #[serde(default = "default_true")]
    pub concat_elimination: bool,
    /// A pool that reads another pool's result may share its kernel (a pool chain, as an inception module's
    /// branch pool after the stage's pool): the kernel writes both results and recomputes the first pool over
    /// the second's window ([`POOL_CHAIN_MAX_WINDOW`] elements at most), so the chain costs one launch.
    #[serde(default = "default_true")]
    pub pool_chain: bool,
    /// Sibling projections share a kernel (horizontal GEMM fusion): MatMuls or Gemms of one kind that read the
    /// same activation as their left operand, each with a weight of one shape, and write results of one shape
    /// (the Q, K and V projections of an attention layer, a gated MLP's gate and up projections) become one
    /// product over the concatenated weights, each part with its own epilogue; the activation is read once.
    #[serde(default = "default_true")]
    pub horizontal_gemm: bool,
    /// A Transpose that swaps the last two axes (the others kept) and feeds only one MatMul or Gemm, as its A or B
    /// operand, joins the product's kernel as an operand layout: the backend reads its input transposed (cuBLAS
    /// `op_T`, leading dimensions and batch strides; a generated kernel indexes through it), so the transpose
    /// costs no launch and no bytes.
    #[serde(default = "default_true")]
    pub operand_layout: bool,
    /// Most distinct external inputs of one kernel.
    pub max_inputs: usize,
    /// Most ops (non-view nodes) in one kernel.
    pub max_ops: usize,
}

/// Largest window (elements of one output's window) of the second pool of a pool chain: each of its outputs
/// recomputes the first pool at every window position, so the first pool's reads grow by this factor.
pub const POOL_CHAIN_MAX_WINDOW: usize = 9;

fn default_true() -> bool {
    true
}

impl FusionCaps {
    /// Everything allowed, with generous limits (the simulator can run any program).
    pub fn all() -> Self {
        FusionCaps {
            matmul_epilogue: true,
            gemm_epilogue: true,
            conv_epilogue: true,
            pool_epilogue: true,
            reduction_fusion: true,
            multi_output: true,
            injective_fusion: true,
            layout_epilogue: true,
            select_epilogue: true,
            attention: true,
            concat_elimination: true,
            pool_chain: true,
            horizontal_gemm: true,
            operand_layout: true,
            select_rows: true,
            max_inputs: 64,
            max_ops: 256,
        }
    }

    /// Only vertical elementwise chains with single-output kernels (a minimal backend).
    pub fn elementwise_only() -> Self {
        FusionCaps {
            matmul_epilogue: false,
            gemm_epilogue: false,
            conv_epilogue: false,
            pool_epilogue: false,
            reduction_fusion: false,
            multi_output: false,
            injective_fusion: false,
            layout_epilogue: false,
            select_epilogue: false,
            attention: false,
            concat_elimination: false,
            pool_chain: false,
            horizontal_gemm: false,
            operand_layout: false,
            select_rows: false,
            max_inputs: 64,
            max_ops: 256,
        }
    }
}

impl Default for FusionCaps {
    fn default() -> Self {
        FusionCaps::all()
    }
}

/// Options of the fusion pass.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FusionOptions {
    /// Fuse at all (off: one group per non-view node).
    pub enabled: bool,
    /// Fuse small independent siblings that read the same input.
    pub horizontal: bool,
    /// The target backend's capabilities.
    pub caps: FusionCaps,
    /// Record [`FusionPlan::decisions`]: a decision, with its reason's text, on every edge between two kernels
    /// and every horizontal candidate. Off, the decisions stay empty and no reason is formatted; the groups are
    /// the same. `ExecutionPlan::build` turns it off (a plan carries no decisions; `explain` replays fusion).
    #[serde(default = "default_true")]
    pub decisions: bool,
}

impl Default for FusionOptions {
    fn default() -> Self {
        FusionOptions { enabled: true, horizontal: false, caps: FusionCaps::all(), decisions: true }
    }
}

/// The shape of a group's kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum GroupKind {
    /// Only elementwise ops (and views): one thread per output element.
    Elementwise,
    /// An anchor (MatMul, Gemm, Conv, pool) with an optional elementwise epilogue (no prologue).
    Anchor,
    /// Reductions over one domain with optional elementwise producers and consumers: one block per row.
    Reduction,
    /// A loop kernel with data-movement ops (and elementwise ops and views): one thread per output element,
    /// operands indexed through the moves. Alone: one data-movement op.
    DataMovement,
    /// A host <-> device copy.
    Copy,
    /// A user kernel.
    Custom,
    /// Fused attention: `MatMul(Q, K^T)`, an optional scale and mask, a last-axis Softmax and `MatMul(., V)`,
    /// with elementwise side producers and a permuted epilogue; one block per tile of query rows walks K and V
    /// with an online softmax, so the scores are never written.
    Attention,
}

impl GroupKind {
    /// The kind of a group founded by a node of `cat`.
    pub fn of(cat: OpCategory) -> GroupKind {
        match cat {
            OpCategory::Elementwise | OpCategory::View => GroupKind::Elementwise,
            OpCategory::Anchor => GroupKind::Anchor,
            OpCategory::Reduction => GroupKind::Reduction,
            OpCategory::DataMovement => GroupKind::DataMovement,
            OpCategory::Copy => GroupKind::Copy,
            OpCategory::Custom => GroupKind::Custom,
        }
    }

    /// Lowercase name, as `explain` prints it.
    pub fn name(self) -> &'static str {
        match self {
            GroupKind::Elementwise => "elementwise",
            GroupKind::Anchor => "anchor",
            GroupKind::Reduction => "reduction",
            GroupKind::DataMovement => "data-movement",
            GroupKind::Copy => "copy",
            GroupKind::Custom => "custom",
            GroupKind::Attention => "attention",
        }
    }
}

/// One fused group: the nodes of one kernel.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FusedGroup {
    /// Nodes in topological order (views fused inside included).
    pub nodes: Vec<NodeId>,
    /// The kernel's shape.
    pub kind: GroupKind,
    /// Tensors read from outside the group, in first-use order.
    pub inputs: Vec<TensorId>,
    /// Tensors the group writes that outlive it (read by another group or a graph output), in production order.
    pub outputs: Vec<TensorId>,
    /// The nodes' flops summed, as the fusion pass found them (`None` in a group built elsewhere or read from a
    /// file without it: `estimate::estimate_group` then sums the nodes' costs itself).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flops: Option<u64>,
}

/// Why two nodes (or two sibling groups) were not fused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum RejectReason {
    /// Fusion is switched off.
    Disabled,
    /// Fusing would create a cycle between groups.
    WouldCycle,
    /// The producer's result has consumers in other kernels (and multi-output fusion did not apply).
    MultiConsumer,
    /// The producer's result is a graph output (and multi-output fusion did not apply).
    GraphOutput,
    /// The backend's caps forbid the combination or the size.
    CapsExceeded,
    /// One side is a custom kernel.
    AcrossCustom,
    /// One side is a host/device copy.
    AcrossCopy,
    /// The pair's ops do not form a kernel class (e.g. a prologue into an anchor, two anchors, a reduction over
    /// another domain, outputs of different sizes).
    Pattern,
    /// Fusing would serialise work that could run concurrently and lengthen the critical path.
    LosesConcurrency,
    /// The exact cycle check hit its per-merge work budget; not fused, conservatively.
    CycleCheckBudget,
    /// Horizontal candidates only: a sibling is not launch-bound (it moves more bytes than a launch is worth).
    NotSmall,
    /// Concat elimination: the Concat shares a kernel with other ops (it costs no launch of its own there).
    ConcatFused,
    /// Concat elimination: an input cannot be placed in its slice (a source, a graph output, an alias, written
    /// by a copy or custom kernel, in two slots or two Concats).
    ConcatInput,
    /// Concat elimination: a slice is not one aligned byte range of the output (an extent before the axis is
    /// not 1, or a slice would start off the alignment).
    ConcatLayout,
    /// Concat elimination: the output is (or aliases) a graph output, is never read, or is itself a slot.
    ConcatOutput,
    /// Concat elimination: eliminating would raise the memory bound (the output's buffer lives from its first
    /// producer): decided before fusion on the node order (all eligible Concats or none), or after fusion by the
    /// memory pass on the plan's order.
    ConcatMemory,
}

impl RejectReason {
    /// Every reason, in a stable order.
    pub const ALL: [RejectReason; 16] = [
        RejectReason::Disabled,
        RejectReason::WouldCycle,
        RejectReason::MultiConsumer,
        RejectReason::GraphOutput,
        RejectReason::CapsExceeded,
        RejectReason::AcrossCustom,
        RejectReason::AcrossCopy,
        RejectReason::Pattern,
        RejectReason::LosesConcurrency,
        RejectReason::CycleCheckBudget,
        RejectReason::NotSmall,
        RejectReason::ConcatFused,
        RejectReason::ConcatInput,
        RejectReason::ConcatLayout,
        RejectReason::ConcatOutput,
        RejectReason::ConcatMemory,
    ];

    /// The reason's code, as `explain` prints it.
    pub fn code(self) -> &'static str {
        match self {
            RejectReason::Disabled => "Disabled",
            RejectReason::WouldCycle => "WouldCycle",
            RejectReason::MultiConsumer => "MultiConsumer",
            RejectReason::GraphOutput => "GraphOutput",
            RejectReason::CapsExceeded => "CapsExceeded",
            RejectReason::AcrossCustom => "AcrossCustom",
            RejectReason::AcrossCopy => "AcrossCopy",
            RejectReason::Pattern => "Pattern",
            RejectReason::LosesConcurrency => "LosesConcurrency",
            RejectReason::CycleCheckBudget => "CycleCheckBudget",
            RejectReason::NotSmall => "NotSmall",
            RejectReason::ConcatFused => "ConcatFused",
            RejectReason::ConcatInput => "ConcatInput",
            RejectReason::ConcatLayout => "ConcatLayout",
            RejectReason::ConcatOutput => "ConcatOutput",
            RejectReason::ConcatMemory => "ConcatMemory",
        }
    }
}

/// The phase of the pass that made a decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FusionPhase {
    /// Phase 1: a producer into the single group of its consumers.
    Vertical,
    /// Phase 2: a producer group into a consumer group, the merged kernel possibly writing several tensors.
    MultiOutput,
    /// Phase 3: independent siblings that read the same tensor.
    Horizontal,
    /// Between phases 1 and 2: attention chains merged into one kernel.
    Attention,
    /// After the phases: a Concat kept as a kernel instead of being eliminated (`fusion/concat.rs`).
    Concat,
}

impl FusionPhase {
    /// Lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            FusionPhase::Vertical => "vertical",
            FusionPhase::MultiOutput => "multi-output",
            FusionPhase::Horizontal => "horizontal",
            FusionPhase::Attention => "attention",
            FusionPhase::Concat => "concat",
        }
    }
}

/// One fusion decision between a producer and a consumer node (for horizontal candidates: two siblings).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FusionDecision {
    /// Producer node name (horizontal: the first sibling's first node, or its product for sibling products).
    pub producer: String,
    /// Consumer node name (horizontal: the second sibling's first node, or its product).
    pub consumer: String,
    /// `None` when fused; otherwise why not.
    pub rejected: Option<RejectReason>,
    /// The phase that made the final call.
    pub phase: FusionPhase,
    /// The tensor on the edge (horizontal: the shared input).
    pub tensor: String,
    /// The score of the merge when it was evaluated (bytes; see the module docs), 0 when never scored.
    pub score: i64,
    /// Specifics: which cap, which rule, which path.
    pub detail: String,
}

/// Counters of one run of the pass.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FusionStats {
    /// Nodes in the graph.
    pub nodes: usize,
    /// View nodes.
    pub views: usize,
    /// Views that joined a group.
    pub views_absorbed: usize,
    /// Groups (kernel launches, copies included).
    pub groups: usize,
    /// Merges made by phase 1.
    pub merges_vertical: usize,
    /// Merges made by phase 2.
    pub merges_multi_output: usize,
    /// Merges made by phase 3.
    pub merges_horizontal: usize,
    /// Attention chains fused (phase 1b).
    #[serde(default)]
    pub merges_attention: usize,
    /// Rounds phase 2 ran.
    pub multi_output_rounds: usize,
    /// Concats eliminated: their inputs written into slices of their output, no launch.
    #[serde(default)]
    pub concats_eliminated: usize,
    /// Groups visited by cycle checks and reorders, in total (the pass's dominant cost beyond O(N + E)).
    pub dag_visits: u64,
    /// Most groups visited by one cycle check and reorder.
    pub dag_visits_max: u64,
}

/// The result of the fusion pass.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FusionPlan {
    /// Groups in execution (topological) order; `GroupId(i)` is `groups[i]`.
    pub groups: Vec<FusedGroup>,
    /// The group of every node that runs in a kernel (views outside groups are absent).
    pub group_of: SecondaryMap<NodeId, GroupId>,
    /// Every data edge between non-view nodes (looking through views) that runs between two kernels, with the
    /// reason it was not fused, in topological order of the producer; then every horizontal candidate, fused or
    /// not. Edges inside a group are the groups themselves.
    pub decisions: Vec<FusionDecision>,
    /// Counters.
    #[serde(default)]
    pub stats: FusionStats,
    /// The inputs of eliminated Concats (which are in no group): each lives at a byte offset of its Concat's
    /// output (`fusion/concat.rs`).
    #[serde(default, skip_serializing_if = "SecondaryMap::is_empty")]
    pub concat_slots: SecondaryMap<TensorId, ConcatSlot>,
    /// The bytes every non-view node of the graph moves on its own (the report's unfused traffic), as the pass
    /// found them (`None` for a plan read from a file without it: the report then sums them itself).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unfused_bytes: Option<u64>,
}

impl FusionPlan {
    /// True when `t` needs memory: it is read or written outside the group that produces it, or is a source.
    pub fn is_materialized(&self, graph: &ComputeGraph, t: TensorId) -> bool {
        let Some(p) = graph.producer(t) else { return true };
        let Some(&g) = self.group_of.get(p) else { return true };
        if graph.tensor(t).role == TensorRole::Output {
            return true;
        }
        graph.consumers(t).iter().any(|&c| self.group_of.get(c) != Some(&g))
    }

    /// True when `n` is an eliminated Concat: a non-view node that runs in no kernel.
    pub fn is_eliminated(&self, graph: &ComputeGraph, n: NodeId) -> bool {
        !self.group_of.contains_key(n)
            && graph.node(n).inputs.first().and_then(|&i| self.concat_slots.get(i)).is_some_and(|s| s.concat == n)
    }

    /// The decisions that rejected a candidate.
    pub fn rejections(&self) -> impl Iterator<Item = &FusionDecision> + '_ {
        self.decisions.iter().filter(|d| d.rejected.is_some())
    }
}

/// Run the fusion pass for one stream on the default device (see [`analyse_for`]).
pub fn analyse(graph: &ComputeGraph, order: &TopoOrder, opts: &FusionOptions) -> FusionPlan {
    analyse_for(graph, order, opts, &Target::default())
}

/// Run the fusion pass for `target` (stream count and device, used by the score and the concurrency check).
pub fn analyse_for(graph: &ComputeGraph, order: &TopoOrder, opts: &FusionOptions, target: &Target) -> FusionPlan {
    Fusion::new(graph, order, target).analyse(opts)
}

/// The fusion pass over one graph, order and target, prepared once for several runs under different options
/// (the pipeline driver's Concat check runs it with and without Concat elimination): what every run starts from
/// (the dense view, the cost model, one group per node) is built here, not per run.
pub struct Fusion<'g> {
    graph: &'g ComputeGraph,
    order: &'g TopoOrder,
    /// Where Concat slots may start ([`Target::slot_alignment`]).
    slot_alignment: u64,
    /// The plan's allocation alignment ([`Target::alignment`]), for the Concat candidates' memory check.
    alignment: u64,
    start: build::Start<'g>,
    /// The Concat candidates prepared with the start ([`Fusion::prepared`]) and whether their refusals carry
    /// their specifics (`FusionOptions::decisions`); a run whose options ask for other candidates builds its own.
    cands: Option<(bool, concat::Candidates)>,
}

/// Nodes from which [`Fusion::prepared`] builds the Concat candidates on a second thread beside the start (the
/// two read only the graph). Below it a thread's start costs more than the overlap gains.
const PARALLEL_START_NODES: usize = 8192;

impl<'g> Fusion<'g> {
    /// Prepare the pass for `graph` in `order` on `target`.
    pub fn new(graph: &'g ComputeGraph, order: &'g TopoOrder, target: &Target) -> Fusion<'g> {
        let _span = tracing::debug_span!("fusion_start").entered();
        Fusion {
            graph,
            order,
            slot_alignment: target.slot_alignment(),
            alignment: target.alignment,
            start: build::Start::new(graph, order, target),
            cands: None,
        }
    }

    /// [`Fusion::new`], with the Concat candidates a run under `opts` needs built once here: on a second thread
    /// beside the start from 8,192 nodes (`PARALLEL_START_NODES`) on a multi-core machine (both only read the graph).
    /// Every run gives the same plan as after [`Fusion::new`].
    pub fn prepared(
        graph: &'g ComputeGraph,
        order: &'g TopoOrder,
        target: &Target,
        opts: &FusionOptions,
    ) -> Fusion<'g> {
        if !(opts.enabled && opts.caps.concat_elimination) {
            return Fusion::new(graph, order, target);
        }
        let (slot_alignment, alignment, words) = (target.slot_alignment(), target.alignment, opts.decisions);
        let cands = || concat::Candidates::new(graph, order, slot_alignment, alignment, words);
        let (start, cands) = if crate::multi_core() && graph.num_nodes() >= PARALLEL_START_NODES {
            std::thread::scope(|scope| {
                let side = scope.spawn(cands);
                let start = {
                    let _span = tracing::debug_span!("fusion_start").entered();
                    build::Start::new(graph, order, target)
                };
                (start, side.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
            })
        } else {
            let _span = tracing::debug_span!("fusion_start").entered();
            (build::Start::new(graph, order, target), cands())
        };
        Fusion { graph, order, slot_alignment, alignment, start, cands: Some((words, cands)) }
    }

    /// One run of the pass under `opts`: the same plan [`analyse_for`] gives.
    pub fn analyse(&self, opts: &FusionOptions) -> FusionPlan {
        let _span = tracing::debug_span!("fusion").entered();
        let (graph, order) = (self.graph, self.order);
        let built;
        let cands = if !(opts.enabled && opts.caps.concat_elimination) {
            None
        } else if let Some((_, c)) = self.cands.as_ref().filter(|(words, _)| *words == opts.decisions) {
            Some(c)
        } else {
            built = concat::Candidates::new(graph, order, self.slot_alignment, self.alignment, opts.decisions);
            Some(&built)
        };
        let mut plan = build::run(&self.start, order, opts, cands);
        if let Some(c) = cands {
            concat::eliminate(graph, &mut plan, c, opts.decisions);
        }
        plan
    }
}
