//! Concat elimination (after the fusion phases, when `FusionCaps::concat_elimination`): a Concat that would run
//! as a kernel of its own becomes a no-launch alias, as a view is: each input tensor is placed at a byte offset
//! inside the Concat output's allocation, so its producer writes straight into its slice.
//!
//! A Concat is eliminated when all of these hold (otherwise it stays in a kernel, alone or fused into a loop
//! kernel, and gets a decision with the reason, phase `concat`):
//! - it is alone in its group: the conditions below are decided before the fusion phases ([`Candidates`]) and
//!   the phases never merge an eligible Concat's group (`Why::ConcatPinned`), so its producers' epilogues stay
//!   with their producers (a Relu goes to its Conv's epilogue instead of into the Concat's loop kernel);
//! - **layout** (`ConcatLayout`): every slice is one contiguous byte range of the output, i.e. every extent
//!   before the axis is 1 (batch-1 NCHW on axis 1), and every slice starts at a multiple of the slot
//!   alignment (`Target::slot_alignment`, 16 bytes: what a backend's widest access into a buffer needs; the
//!   output itself is an allocation at the plan's alignment), so each slot is a valid buffer of its own;
//! - **inputs** (`ConcatInput`): at least two; each an intermediate (not a graph input, weight, constant or
//!   output) written by a kernel (not by a view, a copy, a custom kernel or another eliminated Concat), appearing
//!   once in this Concat and in no other eliminated Concat (a tensor has one place), with no view of it being a
//!   graph output. Other readers of an input are fine (they read the slice) as long as they come, in the
//!   topological order, before the output's last reader: the slot's bytes are the output's and live as long;
//! - **output** (`ConcatOutput`): an intermediate that is read, whose alias family (views of it) holds no graph
//!   output (io placements are fixed by plan sets), and that is not itself a slot of an eliminated Concat (no
//!   nesting: one level of offsets).
//!
//! **Memory.** The output's buffer lives from its first producer's launch to its last reader's: during the
//! producers' window it holds bytes that separate slots would only take later. Two checks, both recording
//! `ConcatMemory`: before fusion, [`Candidates::new`] refuses every eligible Concat when eliminating them all
//! would raise the live-bytes bound of the node order (a cheap proxy: no fusion run is spent on eliminations
//! that would be dropped); after fusion the pipeline driver keeps the eliminations only when the memory pass
//! confirms that `lower_bound_bytes` of the plan's order does not rise (graph-plan `build.rs`), else it plans
//! without them.
//!
//! What the later passes see: the Concat is in no group (as a view outside groups); [`FusionPlan::concat_slots`]
//! maps each input to the output and its byte offset. The group graph roots a slot (and views of it) at the
//! Concat output with that offset; the output's alias family is written by several groups (every slot's
//! producer) and every reader of the whole output depends on all of them. O(N + E).

use graph_ir::{ComputeGraph, NodeId, Op, TensorId, TensorRole};
use serde::{Deserialize, Serialize};
use slotmap::SecondaryMap;
use std::collections::HashSet;

use super::{FusionDecision, FusionPhase, FusionPlan, GroupKind, RejectReason};
use crate::ids::GroupId;
use crate::topo::TopoOrder;

/// Where an eliminated Concat's input lives: a byte range of the Concat's output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConcatSlot {
    /// The eliminated Concat node.
    pub concat: NodeId,
    /// The Concat's output tensor, whose allocation holds the slot.
    pub output: TensorId,
    /// Byte offset of the slot in the output (a multiple of the slot alignment, `Target::slot_alignment`).
    pub offset: u64,
}

/// A refusal: the reason, the tensor at fault (when one input is) and the specifics (empty unless decisions are
/// recorded).
type Refusal = (RejectReason, Option<TensorId>, String);

/// A refusal's specifics, formatted only when decisions are recorded (`words`): a plan build never reads them, and
/// on a graph with many refused Concats the formatting cost more than the checks (random_dag 100k: a third of the
/// candidates' time).
macro_rules! why {
    ($words:expr, $($fmt:tt)+) => {
        if $words {
            format!($($fmt)+)
        } else {
            String::new()
        }
    };
}

/// The Concats that can be eliminated, decided before the fusion phases from the graph alone (every condition
/// of the module docs but the last, which the phases guarantee by never merging a pinned Concat's group), with
/// each input's byte offset; and every other Concat's refusal. `order`: a topological order, so that a Concat
/// reading another's output sees that one's verdict.
pub(super) struct Candidates {
    /// Byte offset of each input of each eliminable Concat.
    pub placed: SecondaryMap<NodeId, Vec<(TensorId, u64)>>,
    /// Why each other Concat stays a kernel.
    refused: SecondaryMap<NodeId, Refusal>,
}

impl Candidates {
    /// The candidates of `graph` with slots at multiples of `alignment` (the slot alignment; type docs), those
    /// that would raise the memory bound of the node order left out ([`memory_filter`]; `buffer_alignment`: the
    /// plan's allocation alignment).
    /// `words`: whether the refusals carry their specifics (only recorded decisions show them).
    pub fn new(
        graph: &ComputeGraph,
        order: &TopoOrder,
        alignment: u64,
        buffer_alignment: u64,
        words: bool,
    ) -> Candidates {
        let mut c = Candidates::by_layout(graph, order, alignment, words);
        memory_filter(graph, order, buffer_alignment, &mut c, words);
        c
    }

    /// The candidates by the layout, input and output conditions alone.
    fn by_layout(graph: &ComputeGraph, order: &TopoOrder, alignment: u64, words: bool) -> Candidates {
        let a = alignment.max(1);
        let mut placed: SecondaryMap<NodeId, Vec<(TensorId, u64)>> = SecondaryMap::new();
        let mut refused: SecondaryMap<NodeId, Refusal> = SecondaryMap::new();
        let mut taken: SecondaryMap<TensorId, ()> = SecondaryMap::new();
        for &n in &order.order {
            if !matches!(graph.node(n).op, Op::Concat { .. }) {
                continue;
            }
            match check(graph, order, &taken, n, a, words) {
                Ok(p) => {
                    for &(t, _) in &p {
                        taken.insert(t, ());
                    }
                    placed.insert(n, p);
                }
                Err(r) => {
                    refused.insert(n, r);
                }
            }
        }
        Candidates { placed, refused }
    }

    /// True when `n` is a Concat the phases must leave alone in its group.
    pub fn pinned(&self, n: NodeId) -> bool {
        self.placed.contains_key(n)
    }
}

/// Refuse every candidate when eliminating them all would raise the memory bound of the node order (one buffer
/// per alias family, live from its producer to its last reader, each at the allocation alignment). An
/// eliminated Concat's output is live from its first input's producer on, holding bytes that separate inputs
/// would only fill up to its own position; after that it holds what the inputs or the output would. This runs
/// before the fusion phases, on the unfused order: a proxy for the fused plan's bound, which the pipeline driver
/// still checks (`memory::concat_bound`, and a plan without eliminations when they raise it). All or none, as
/// that check decides: the proxy only spares the driver a second fusion run where the eliminations will not be
/// kept. O(N + E): range adds into a difference array, two prefix sweeps.
fn memory_filter(graph: &ComputeGraph, order: &TopoOrder, alignment: u64, c: &mut Candidates, words: bool) {
    if c.placed.is_empty() {
        return;
    }
    let a = u128::from(alignment.max(1));
    let bytes = |t: TensorId| (graph.tensor(t).size_bytes() as u128).div_ceil(a) * a;
    let n = order.order.len();
    // Each alias family's live interval [producer, last reader + 1) over the node positions.
    let root = crate::group_graph::alias_roots(graph, order);
    let mut span: SecondaryMap<TensorId, (usize, usize)> = SecondaryMap::with_capacity(graph.num_tensors());
    for (i, &id) in order.order.iter().enumerate() {
        let node = graph.node(id);
        if node.op.is_view() {
            continue;
        }
        for &t in &node.inputs {
            if let Some(s) = span.get_mut(root[t]) {
                s.1 = s.1.max(i + 1);
            }
        }
        for &o in &node.outputs {
            match graph.tensor(o).role {
                TensorRole::Intermediate => {
                    span.insert(o, (i, i + 1));
                }
                TensorRole::Output => {
                    span.insert(o, (i, n));
                }
                _ => {}
            }
        }
    }
    let mut live = Live::new(n);
    for (t, &(from, to)) in &span {
        live.add(from, to, bytes(t) as i128);
    }
    let bound = live.peak();
    let pos = |x: NodeId| order.position.get(x).copied().unwrap_or(0) as usize;
    for (id, inputs) in &c.placed {
        let (Some(&o), at) = (graph.node(id).outputs.first(), pos(id)) else { continue };
        let mut first = at;
        for &(t, _) in inputs {
            if let Some(&(f, e)) = span.get(t) {
                live.add(f, e, -(bytes(t) as i128));
                first = first.min(f);
            }
        }
        live.add(first, at, bytes(o) as i128);
    }
    let with = live.peak();
    if with <= bound {
        return;
    }
    let count = c.placed.len();
    let why = why!(
        words,
        "eliminating the {count} eligible Concats would raise the memory bound of the node order from {bound} to \
         {with} bytes (each output live from its first input's producer on)"
    );
    for (id, _) in std::mem::take(&mut c.placed) {
        c.refused.insert(id, (RejectReason::ConcatMemory, None, why.clone()));
    }
}

/// Live bytes per node position: range adds into a difference array, read back by one prefix sweep (every add
/// of a phase comes before its query, so no tree is needed). O(1) per add, O(n) per query.
struct Live {
    diff: Vec<i128>,
}

impl Live {
    fn new(n: usize) -> Self {
        Live { diff: vec![0; n + 1] }
    }

    /// Adds `v` over positions `[l, r)`.
    fn add(&mut self, l: usize, r: usize, v: i128) {
        let r = r.min(self.diff.len() - 1);
        if l < r {
            self.diff[l] += v;
            self.diff[r] -= v;
        }
    }

    /// The most live bytes at any position (0 when there is none).
    fn peak(&self) -> i128 {
        let mut live = 0i128;
        let mut peak = 0i128;
        for &d in &self.diff[..self.diff.len() - 1] {
            live += d;
            peak = peak.max(live);
        }
        peak
    }
}

/// Eliminate the candidate Concats of `plan` (see the module docs): drop their groups, renumber the rest, record
/// the slots, and replace the decisions on their edges (no longer between two kernels) by one `concat` decision
/// per Concat that stays a kernel of its own (when `decisions` are recorded).
pub(super) fn eliminate(graph: &ComputeGraph, plan: &mut FusionPlan, cands: &Candidates, decisions: bool) {
    let mut slots: SecondaryMap<TensorId, ConcatSlot> = SecondaryMap::new();
    let mut gone: SecondaryMap<NodeId, ()> = SecondaryMap::new();
    let mut refused: Vec<(NodeId, Refusal)> = Vec::new();
    for (gi, g) in plan.groups.iter().enumerate() {
        for &n in &g.nodes {
            if let Some(p) = cands.placed.get(n) {
                if g.nodes.len() == 1 {
                    for &(t, offset) in p {
                        slots.insert(t, ConcatSlot { concat: n, output: graph.node(n).outputs[0], offset });
                    }
                    gone.insert(n, ());
                } else {
                    // Unreachable while the phases honour the pin; stay a kernel rather than guess.
                    let why = format!("the Concat runs inside kernel g{gi} with {} other ops", g.nodes.len() - 1);
                    refused.push((n, (RejectReason::ConcatFused, None, why)));
                }
            } else if let Some(r) = cands.refused.get(n) {
                refused.push((n, r.clone()));
            }
        }
    }
    if !gone.is_empty() {
        let groups = std::mem::take(&mut plan.groups);
        plan.groups = groups.into_iter().filter(|g| !(g.nodes.len() == 1 && gone.contains_key(g.nodes[0]))).collect();
        plan.group_of = SecondaryMap::with_capacity(plan.group_of.len());
        for (gi, g) in plan.groups.iter().enumerate() {
            for &n in &g.nodes {
                plan.group_of.insert(n, GroupId::from_index(gi));
            }
        }
        let names: HashSet<&str> = gone.keys().map(|n| graph.node(n).name.as_ref()).collect();
        plan.decisions.retain(|d| {
            d.phase == FusionPhase::Horizontal
                || !(names.contains(d.producer.as_str()) || names.contains(d.consumer.as_str()))
        });
        plan.stats.groups = plan.groups.len();
    }
    if !decisions {
        refused.clear();
    }
    for (n, (reason, t, detail)) in refused {
        let node = graph.node(n);
        let producer =
            t.and_then(|t| graph.producer(t)).map_or_else(|| node.name.clone(), |p| graph.node(p).name.clone());
        plan.decisions.push(FusionDecision {
            producer: producer.to_string(),
            consumer: node.name.to_string(),
            rejected: Some(reason),
            phase: FusionPhase::Concat,
            tensor: t.map_or_else(String::new, |t| graph.tensor(t).name.to_string()),
            score: 0,
            detail,
        });
    }
    plan.stats.concats_eliminated = gone.len();
    plan.concat_slots = slots;
}

/// The byte offset of each input when Concat `n` can be eliminated, else why not. `taken`: inputs that
/// already have a slot.
fn check(
    graph: &ComputeGraph,
    order: &TopoOrder,
    taken: &SecondaryMap<TensorId, ()>,
    n: NodeId,
    a: u64,
    words: bool,
) -> Result<Vec<(TensorId, u64)>, Refusal> {
    let node = graph.node(n);
    let Op::Concat { axis } = node.op else { return Err((RejectReason::Pattern, None, why!(words, "not a Concat"))) };
    let Some(&o) = node.outputs.first() else {
        return Err((RejectReason::ConcatOutput, None, why!(words, "no output")));
    };
    let out = graph.tensor(o);
    if out.role != TensorRole::Intermediate || family_has_output(graph, o) {
        return Err((RejectReason::ConcatOutput, None, why!(words, "the output (or a view of it) is a graph output")));
    }
    if graph.consumers(o).is_empty() {
        return Err((RejectReason::ConcatOutput, None, why!(words, "the output is never read")));
    }
    if taken.contains_key(o) {
        return Err((
            RejectReason::ConcatOutput,
            None,
            why!(words, "the output is itself a slot of an eliminated Concat"),
        ));
    }
    if node.inputs.len() < 2 {
        return Err((RejectReason::ConcatInput, None, why!(words, "fewer than two inputs")));
    }
    let rank = out.shape.rank();
    let ax = if axis < 0 { axis + rank as i64 } else { axis };
    if ax < 0 || ax as usize >= rank {
        return Err((RejectReason::ConcatLayout, None, why!(words, "axis {axis} out of range for rank {rank}")));
    }
    if let Some((i, &d)) = out.shape.dims()[..ax as usize].iter().enumerate().find(|(_, &d)| d != 1) {
        return Err((
            RejectReason::ConcatLayout,
            None,
            why!(words, "dim {i} before axis {ax} has extent {d}: each input's slice is strided, not one byte range"),
        ));
    }
    // Position (in `order`) of the output's last reader: a slot read later would keep the whole output live.
    let pos = |r: NodeId| order.position.get(r).copied().unwrap_or(0);
    let last_read = family_readers(graph, o).into_iter().map(pos).max().unwrap_or(0);
    let mut placed = Vec::with_capacity(node.inputs.len());
    let mut offset = 0u64;
    for (k, &t) in node.inputs.iter().enumerate() {
        let tensor = graph.tensor(t);
        let bad = |why: String| Err((RejectReason::ConcatInput, Some(t), why));
        if tensor.role != TensorRole::Intermediate {
            return bad(why!(
                words,
                "input '{}' is a graph {}",
                tensor.name,
                format!("{:?}", tensor.role).to_lowercase()
            ));
        }
        if node.inputs[..k].contains(&t) {
            return bad(why!(words, "input '{}' fills two slots", tensor.name));
        }
        if taken.contains_key(t) {
            return bad(why!(words, "input '{}' already has a slot in another Concat", tensor.name));
        }
        let Some(p) = graph.producer(t) else { return bad(why!(words, "input '{}' has no producer", tensor.name)) };
        let pnode = graph.node(p);
        if pnode.op.is_view() || matches!(pnode.op, Op::Concat { .. }) {
            return bad(why!(words, "input '{}' is made by a {} (an alias)", tensor.name, pnode.op.name()));
        }
        let kind = GroupKind::of(pnode.op.category());
        if matches!(kind, GroupKind::Copy | GroupKind::Custom) {
            return bad(why!(words, "input '{}' is written by a {} step", tensor.name, kind.name()));
        }
        if family_has_output(graph, t) {
            return bad(why!(words, "a view of input '{}' is a graph output", tensor.name));
        }
        let readers = family_readers(graph, t);
        if readers.iter().all(|&r| r == n) && !rooted_in_compute(graph, p) {
            return bad(why!(
                words,
                "input '{}' is read only here and computed from graph sources by loop ops only: its producer \
                 joins the Concat's kernel, and eliminating the Concat would launch it alone",
                tensor.name
            ));
        }
        if let Some(r) = readers.into_iter().find(|&r| r != n && pos(r) > last_read) {
            return bad(why!(
                words,
                "input '{}' is read by '{}' after the output's last reader (the whole output would stay live)",
                tensor.name,
                graph.node(r).name
            ));
        }
        if offset % a != 0 {
            return Err((
                RejectReason::ConcatLayout,
                Some(t),
                why!(
                    words,
                    "slice of '{}' would start at byte {offset}, not a multiple of the slot alignment {a}",
                    tensor.name
                ),
            ));
        }
        placed.push((t, offset));
        offset = offset.saturating_add(tensor.size_bytes() as u64);
    }
    if offset != out.size_bytes() as u64 {
        return Err((RejectReason::ConcatLayout, None, why!(words, "the slices do not add up to the output")));
    }
    Ok(placed)
}

/// Whether node `p`'s result comes, through elementwise, data-movement and view nodes, from an anchor or a
/// reduction: a kernel that a Concat could never join, so writing its slot in place saves the Concat's launch.
/// A producer made only of loop ops over graph sources (a cast of an input) that feeds nothing but the Concat
/// would instead fuse into the Concat's loop kernel; eliminating the Concat would give it a launch of its own
/// (a launch only to cast, under a precision policy). The walk visits at most 64
/// nodes; past that the answer is no (the Concat keeps its kernel).
fn rooted_in_compute(graph: &ComputeGraph, p: NodeId) -> bool {
    use graph_ir::OpCategory;
    let mut stack = vec![p];
    // At most 65 entries: a scan beats hashing.
    let mut seen: Vec<NodeId> = Vec::new();
    while let Some(n) = stack.pop() {
        if seen.contains(&n) {
            continue;
        }
        seen.push(n);
        if seen.len() > 64 {
            return false;
        }
        let node = graph.node(n);
        match node.op.category() {
            OpCategory::Anchor | OpCategory::Reduction => return true,
            OpCategory::Elementwise | OpCategory::DataMovement | OpCategory::View => {
                stack.extend(node.inputs.iter().filter_map(|&t| graph.producer(t)));
            }
            _ => {}
        }
    }
    false
}

/// The non-view nodes that read `t` or a view of it.
fn family_readers(graph: &ComputeGraph, t: TensorId) -> Vec<NodeId> {
    let consumers = graph.consumers(t);
    // The usual case, no view of `t`: its consumers, without a search.
    if consumers.iter().all(|&c| !graph.node(c).op.is_view()) {
        return consumers.to_vec();
    }
    let mut out = Vec::new();
    let mut stack = vec![t];
    while let Some(x) = stack.pop() {
        for &c in graph.consumers(x) {
            let node = graph.node(c);
            if node.op.is_view() {
                stack.extend(node.outputs.iter().copied());
            } else {
                out.push(c);
            }
        }
    }
    out
}

/// True when `t` or a view of it (transitively) is a graph output.
fn family_has_output(graph: &ComputeGraph, t: TensorId) -> bool {
    if graph.tensor(t).role == TensorRole::Output {
        return true;
    }
    // The usual case, no view of `t`, allocates nothing.
    if graph.consumers(t).iter().all(|&c| !graph.node(c).op.is_view()) {
        return false;
    }
    let mut stack = vec![t];
    while let Some(x) = stack.pop() {
        if graph.tensor(x).role == TensorRole::Output {
            return true;
        }
        for &c in graph.consumers(x) {
            let node = graph.node(c);
            if node.op.is_view() {
                stack.extend(node.outputs.iter().copied());
            }
        }
    }
    false
}
