//! The pool model: which alias groups live in the activation pool, with their sizes, writer and reader kernels
//! and the in-place candidates. None of it depends on the launch order: the pass evaluates lifetimes from it
//! in the fusion plan's order. O(N + E) to build, plus the group scans of the in-place check.
//!
//! **In place** (as ONNX Runtime and MXNet do): an elementwise kernel may write its output `o` over an input
//! alias group `r` that dies at that launch. Static conditions, checked here:
//! - the kernel is a loop kernel of kind `Elementwise`; `o` is an alias root it writes, `r` a pool alias group it
//!   reads, both in the pool;
//! - the read tensor(s) of `r` and `o` have the same dtype and byte size (so the read and the written ranges are
//!   the same `BufferRef`, bound once by a backend);
//! - index identity: every value of the kernel computed from `r` comes from elementwise ops (or views) whose
//!   operands from `r` have their output's element count (no broadcast: equal counts under numpy broadcasting
//!   mean equal shapes up to leading ones, so element `i` is read to make element `i`), and `o` is the only
//!   tensor the kernel writes that depends on `r`. A per-element executor then reads element `i` of `r` before
//!   writing element `i` of `o` in the same thread, and nothing else reads `r`'s bytes in that launch;
//! - with `prefer_ordered_reuse`, every other reader of `r` is a DAG ancestor of the kernel (so the handover adds
//!   no ordering the data edges do not already imply).
//!
//! The dynamic condition — `r`'s last reader is this launch — depends on the order and is checked by the users.

use graph_ir::{ComputeGraph, OpCategory, TensorId};
use slotmap::SecondaryMap;
use std::collections::HashSet;

use crate::fusion::{FusionPlan, GroupKind};
use crate::group_graph::GroupGraph;
use crate::ids::{BufferId, GroupId};
use crate::interval::Interval;
use crate::memory::reach::Reach;
use crate::memory::regions::{align_up, Classes};

/// The pool's buffers (one per pool alias group, indexed by [`BufferId`] in graph tensor order) and how
/// kernels use them; groups in the fusion plan's numbering.
#[derive(Clone, Debug, Default)]
pub(crate) struct PoolModel {
    /// Alias root of each buffer.
    pub roots: Vec<TensorId>,
    /// Buffer of each pool root.
    pub index: SecondaryMap<TensorId, BufferId>,
    /// Bytes of each buffer (at least 1).
    pub bytes: Vec<u64>,
    /// Aligned size of each buffer.
    pub size: Vec<u64>,
    /// The group that writes each buffer.
    pub writer: Vec<GroupId>,
    /// Groups that read any member of each buffer, ascending.
    pub readers: Vec<Vec<GroupId>>,
    /// In-place candidates of each group: (output buffer, input buffer), in preference order.
    pub in_place: Vec<Vec<(BufferId, BufferId)>>,
}

/// An in-place handover: `group` writes `output` over `input`, which dies at that launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Handover {
    /// The buffer whose bytes are taken.
    pub input: BufferId,
    /// The buffer written over it.
    pub output: BufferId,
    /// The kernel that does it.
    pub group: GroupId,
}

impl PoolModel {
    /// The model of `fusion`'s pool. `in_place`: look for in-place candidates; `ordered`: when given, keep only
    /// candidates whose other readers are ordered before the kernel.
    pub fn new(
        graph: &ComputeGraph,
        fusion: &FusionPlan,
        groups: &GroupGraph,
        classes: &Classes,
        alignment: u64,
        in_place: bool,
        mut ordered: Option<&mut Reach<'_>>,
    ) -> PoolModel {
        let a = alignment.max(1);
        let ng = fusion.groups.len();
        let mut m = PoolModel { in_place: vec![Vec::new(); ng], ..PoolModel::default() };
        for (t, tensor) in graph.tensors() {
            if !classes.in_pool(graph, groups, t) {
                continue;
            }
            let Some(w) = groups.writer(t) else { continue };
            m.index.insert(t, BufferId::from_index(m.roots.len()));
            m.roots.push(t);
            let bytes = (tensor.size_bytes() as u64).max(1);
            m.bytes.push(bytes);
            m.size.push(align_up(bytes, a));
            m.writer.push(w);
            m.readers.push(groups.readers(t).to_vec());
        }
        if in_place {
            for g in (0..ng).map(GroupId::from_index) {
                let cands = in_place_candidates(graph, fusion, groups, &m, g);
                let cands = match ordered.as_deref_mut() {
                    Some(reach) => cands
                        .into_iter()
                        .filter(|&(_, r)| m.readers[r.index()].iter().all(|&x| x == g || reach.ordered(x, g)))
                        .collect(),
                    None => cands,
                };
                m.in_place[g.index()] = cands;
            }
        }
        m
    }

    /// Number of buffers.
    pub fn len(&self) -> usize {
        self.roots.len()
    }

    /// Live interval of each buffer when group `g` runs at step `pos[g]`: from its writer to one past its last
    /// reader (its writer's step alone when nobody else reads it), as [`GroupGraph::lifetime`] defines it.
    pub fn lifetimes(&self, groups: &GroupGraph, pos: &[u32]) -> Vec<Interval> {
        self.roots.iter().map(|&r| groups.lifetime(r, pos).unwrap_or_default()).collect()
    }

    /// The in-place handovers for these lifetimes: for each group in step order, each output takes the first
    /// candidate input that dies at that step (each input and output used once). Returns the handovers in step
    /// order.
    pub fn choose_in_place(&self, pos: &[u32], live: &[Interval]) -> Vec<Handover> {
        let mut by_pos: Vec<GroupId> =
            (0..self.in_place.len()).filter(|&g| !self.in_place[g].is_empty()).map(GroupId::from_index).collect();
        by_pos.sort_unstable_by_key(|&g| pos[g.index()]);
        let mut out_taken = vec![false; self.len()];
        let mut in_taken = vec![false; self.len()];
        let mut chosen = Vec::new();
        for g in by_pos {
            let s = pos[g.index()];
            for &(o, r) in &self.in_place[g.index()] {
                let (ou, ru) = (o.index(), r.index());
                if out_taken[ou] || in_taken[ru] || live[ru].end != s + 1 || live[ru].start >= s {
                    continue;
                }
                out_taken[ou] = true;
                in_taken[ru] = true;
                chosen.push(Handover { input: r, output: o, group: g });
            }
        }
        chosen
    }
}

/// The static in-place candidates of group `g` (see the module docs), in the order of its outputs, then of its
/// inputs.
fn in_place_candidates(
    graph: &ComputeGraph,
    fusion: &FusionPlan,
    groups: &GroupGraph,
    m: &PoolModel,
    g: GroupId,
) -> Vec<(BufferId, BufferId)> {
    let grp = &fusion.groups[g.index()];
    if grp.kind != GroupKind::Elementwise {
        return Vec::new();
    }
    let mut input_roots: Vec<TensorId> = Vec::new();
    for &x in &grp.inputs {
        let r = groups.root(x);
        if m.index.get(r).is_some_and(|b| m.writer[b.index()] != g) && !input_roots.contains(&r) {
            input_roots.push(r);
        }
    }
    let mut found: Vec<(BufferId, BufferId)> = Vec::new();
    for r in input_roots {
        let sources: Vec<TensorId> = grp.inputs.iter().copied().filter(|&x| groups.root(x) == r).collect();
        let Some(o) = identity_output(graph, grp, &sources) else { continue };
        let Some(&ob) = m.index.get(o) else { continue };
        if m.writer[ob.index()] != g || groups.root(o) != o {
            continue;
        }
        let (ot, rt) = (graph.tensor(o), graph.tensor(r));
        let same = |x: TensorId| {
            let xt = graph.tensor(x);
            xt.dtype == ot.dtype && xt.size_bytes() == ot.size_bytes()
        };
        if rt.size_bytes() != ot.size_bytes() || !sources.iter().all(|&x| same(x)) {
            continue;
        }
        found.push((ob, m.index[r]));
    }
    // Outputs in the group's output order, then inputs in first-use order (already so within an output).
    let out_rank = |b: BufferId| grp.outputs.iter().position(|&t| m.index.get(t) == Some(&b)).unwrap_or(usize::MAX);
    found.sort_by_key(|&(o, _)| out_rank(o));
    found
}

/// When every value the group computes from `sources` is made element by element at its own index (elementwise
/// ops without broadcasting those operands, or views) and exactly one tensor the group writes depends on them,
/// that tensor.
fn identity_output(graph: &ComputeGraph, grp: &crate::fusion::FusedGroup, sources: &[TensorId]) -> Option<TensorId> {
    let numel = |t: TensorId| graph.tensor(t).shape.numel();
    let mut derived: HashSet<TensorId> = sources.iter().copied().collect();
    for &n in &grp.nodes {
        let node = graph.node(n);
        let touched: Vec<TensorId> = node.inputs.iter().copied().filter(|t| derived.contains(t)).collect();
        if touched.is_empty() {
            continue;
        }
        match node.op.category() {
            OpCategory::View => {}
            OpCategory::Elementwise => {
                let out = numel(*node.outputs.first()?)?;
                if touched.iter().any(|&t| numel(t) != Some(out)) {
                    return None;
                }
            }
            _ => return None,
        }
        derived.extend(node.outputs.iter().copied());
    }
    let mut reached = grp.outputs.iter().copied().filter(|t| derived.contains(t));
    let o = reached.next()?;
    if reached.next().is_some() {
        return None;
    }
    Some(o)
}
