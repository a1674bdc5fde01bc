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

use graph_ir::{ComputeGraph, Op, OpCategory, TensorId, TensorRole};
use slotmap::SecondaryMap;
use std::collections::HashSet;

use crate::fusion::{FusionPlan, GroupKind};
use crate::memory::reach::Reach;
use crate::topo::TopoOrder;

/// The alias root of every tensor: itself, or for a view's output its input's root.
pub(crate) fn alias_roots(graph: &ComputeGraph, order: &TopoOrder) -> SecondaryMap<TensorId, TensorId> {
    let mut root: SecondaryMap<TensorId, TensorId> = SecondaryMap::with_capacity(graph.num_tensors());
    for (t, _) in graph.tensors() {
        root.insert(t, t);
    }
    for &n in &order.order {
        let node = graph.node(n);
        if node.op.is_view() {
            if let (Some(&i), Some(&o)) = (node.inputs.first(), node.outputs.first()) {
                let r = root[i];
                root.insert(o, r);
            }
        }
    }
    root
}

/// Where each alias group goes, decided from roles, producers and the fusion plan alone.
pub(crate) struct Classes {
    /// Alias root of every tensor.
    pub root: SecondaryMap<TensorId, TensorId>,
    /// Roots of groups some member of which needs memory.
    pub materialized: SecondaryMap<TensorId, ()>,
    /// Roots of groups holding a graph output.
    pub has_output: SecondaryMap<TensorId, ()>,
    /// Roots of groups written by a Memcpy to the host.
    pub to_host: SecondaryMap<TensorId, ()>,
}

impl Classes {
    pub fn new(graph: &ComputeGraph, order: &TopoOrder, fusion: &FusionPlan) -> Classes {
        let root = alias_roots(graph, order);
        let mut materialized = SecondaryMap::with_capacity(graph.num_tensors());
        let mut has_output = SecondaryMap::new();
        let mut to_host = SecondaryMap::new();
        for (t, tensor) in graph.tensors() {
            let r = root[t];
            if fusion.is_materialized(graph, t) {
                materialized.insert(r, ());
            }
            if tensor.role == TensorRole::Output {
                has_output.insert(r, ());
            }
            if let Some(p) = tensor.producer {
                if matches!(graph.node(p).op, Op::Memcpy { to: graph_ir::op::MemSpace::Host }) {
                    to_host.insert(r, ());
                }
            }
        }
        Classes { root, materialized, has_output, to_host }
    }

    /// True when the group rooted at `r` (a root) is a buffer of the activation pool.
    pub fn in_pool(&self, graph: &ComputeGraph, r: TensorId) -> bool {
        self.root[r] == r
            && !graph.tensor(r).role.is_source()
            && self.materialized.contains_key(r)
            && !self.to_host.contains_key(r)
            && !self.has_output.contains_key(r)
    }
}

fn align_up(v: u64, a: u64) -> u64 {
    v.div_ceil(a).saturating_mul(a)
}

/// The pool's buffers (one per pool alias group) and how kernels use them. Buffer and group numbers are `u32`
/// indices; groups in the fusion plan's numbering.
#[derive(Clone, Debug, Default)]
pub(crate) struct PoolModel {
    /// Alias root of each buffer, in graph tensor order.
    pub roots: Vec<TensorId>,
    /// Buffer of each pool root.
    pub index: SecondaryMap<TensorId, u32>,
    /// Bytes of each buffer (at least 1).
    pub bytes: Vec<u64>,
    /// Aligned size of each buffer.
    pub size: Vec<u64>,
    /// The group that writes each buffer.
    pub writer: Vec<u32>,
    /// Groups that read any member of each buffer, ascending.
    pub readers: Vec<Vec<u32>>,
    /// Buffers each group writes.
    pub writes: Vec<Vec<u32>>,
    /// Buffers each group reads and does not write.
    pub reads: Vec<Vec<u32>>,
    /// In-place candidates of each group: (output buffer, input buffer), in preference order.
    pub in_place: Vec<Vec<(u32, u32)>>,
}

impl PoolModel {
    /// The model of `fusion`'s pool. `in_place`: look for in-place candidates; `ordered`: when given, keep only
    /// candidates whose other readers are ordered before the kernel.
    pub fn new(
        graph: &ComputeGraph,
        fusion: &FusionPlan,
        classes: &Classes,
        alignment: u64,
        in_place: bool,
        mut ordered: Option<&mut Reach<'_>>,
    ) -> PoolModel {
        let a = alignment.max(1);
        let ng = fusion.groups.len();
        let mut m = PoolModel {
            writes: vec![Vec::new(); ng],
            reads: vec![Vec::new(); ng],
            in_place: vec![Vec::new(); ng],
            ..PoolModel::default()
        };
        for (t, tensor) in graph.tensors() {
            if !classes.in_pool(graph, t) {
                continue;
            }
            let Some(w) = crate::memory::writer_group(graph, fusion, t) else { continue };
            let b = m.roots.len() as u32;
            m.index.insert(t, b);
            m.roots.push(t);
            let bytes = (tensor.size_bytes() as u64).max(1);
            m.bytes.push(bytes);
            m.size.push(align_up(bytes, a));
            m.writer.push(w.0);
            m.readers.push(Vec::new());
            m.writes[w.index()].push(b);
        }
        for (t, _) in graph.tensors() {
            let Some(&b) = m.index.get(classes.root[t]) else { continue };
            for &c in graph.consumers(t) {
                if let Some(&g) = fusion.group_of.get(c) {
                    m.readers[b as usize].push(g.0);
                }
            }
        }
        for (b, rs) in m.readers.iter_mut().enumerate() {
            rs.sort_unstable();
            rs.dedup();
            for &g in rs.iter() {
                if g != m.writer[b] {
                    m.reads[g as usize].push(b as u32);
                }
            }
        }
        if in_place {
            for g in 0..ng {
                let cands = in_place_candidates(graph, fusion, classes, &m, g);
                let cands = match ordered.as_deref_mut() {
                    Some(reach) => cands
                        .into_iter()
                        .filter(|&(_, r)| {
                            m.readers[r as usize].iter().all(|&x| x == g as u32 || reach.ordered(x, g as u32))
                        })
                        .collect(),
                    None => cands,
                };
                m.in_place[g] = cands;
            }
        }
        m
    }

    /// Number of buffers.
    pub fn len(&self) -> usize {
        self.roots.len()
    }

    /// Live interval `[start, end)` of each buffer when group `g` runs at step `pos[g]`: from its writer to one
    /// past its last reader (its writer's step alone when nobody else reads it).
    pub fn lifetimes(&self, pos: &[u32]) -> Vec<(u32, u32)> {
        (0..self.len())
            .map(|b| {
                let start = pos[self.writer[b] as usize];
                let last = self.readers[b].iter().map(|&g| pos[g as usize]).max().unwrap_or(start);
                (start, last.max(start) + 1)
            })
            .collect()
    }

    /// The in-place handovers for these lifetimes: for each group in step order, each output takes the first
    /// candidate input that dies at that step (each input and output used once). Returns (input, output,
    /// group) triples in step order.
    pub fn choose_in_place(&self, pos: &[u32], live: &[(u32, u32)]) -> Vec<(u32, u32, u32)> {
        let mut by_pos: Vec<u32> =
            (0..self.in_place.len() as u32).filter(|&g| !self.in_place[g as usize].is_empty()).collect();
        by_pos.sort_unstable_by_key(|&g| pos[g as usize]);
        let mut out_taken = vec![false; self.len()];
        let mut in_taken = vec![false; self.len()];
        let mut chosen = Vec::new();
        for g in by_pos {
            let s = pos[g as usize];
            for &(o, r) in &self.in_place[g as usize] {
                let (ou, ru) = (o as usize, r as usize);
                if out_taken[ou] || in_taken[ru] || live[ru].1 != s + 1 || live[ru].0 >= s {
                    continue;
                }
                out_taken[ou] = true;
                in_taken[ru] = true;
                chosen.push((r, o, g));
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
    classes: &Classes,
    m: &PoolModel,
    g: usize,
) -> Vec<(u32, u32)> {
    let grp = &fusion.groups[g];
    if grp.kind != GroupKind::Elementwise {
        return Vec::new();
    }
    let mut input_roots: Vec<TensorId> = Vec::new();
    for &x in &grp.inputs {
        let r = classes.root[x];
        if m.index.contains_key(r) && m.writer[m.index[r] as usize] != g as u32 && !input_roots.contains(&r) {
            input_roots.push(r);
        }
    }
    let mut found: Vec<(u32, u32)> = Vec::new();
    for r in input_roots {
        let sources: Vec<TensorId> = grp.inputs.iter().copied().filter(|&x| classes.root[x] == r).collect();
        let Some(o) = identity_output(graph, grp, &sources) else { continue };
        let Some(&ob) = m.index.get(o) else { continue };
        if m.writer[ob as usize] != g as u32 || classes.root[o] != o {
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
    let out_rank = |b: u32| grp.outputs.iter().position(|&t| m.index.get(t) == Some(&b)).unwrap_or(usize::MAX);
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
