//! The group graph: what every pass after fusion needs to know about the fused program, derived once from
//! (graph, topological order, fusion plan) and passed to memory, stream, memory-aware ordering and lowering.
//!
//! - **alias roots**: a view's output shares its input's bytes, so each tensor has a root (itself, or its
//!   view chain's first input), found in one pass in topological order ([`alias_roots`]);
//! - **writer group** of each tensor: the group whose launch writes its bytes, looking through views outside
//!   groups (absent for sources);
//! - **data edges** between groups: `p -> g` when `g` reads a tensor `p` writes (deduplicated, ascending;
//!   `p < g` because group order is topological), with successors and each group's longest-path depth;
//! - **readers** of each alias group: the groups that read any member, ascending. With a group's position
//!   this gives launch-level lifetimes ([`GroupGraph::lifetime`]);
//! - **slots** of eliminated Concats ([`FusionPlan::concat_slots`]): a slot (and every view of it) is rooted at
//!   the Concat's output with a byte offset ([`GroupGraph::offset`]); the output's alias family then has several
//!   writer groups ([`GroupGraph::writers`]: every slot's producer). A group reading the whole output (the
//!   output or a view of it) depends on all of them; a group reading one slot depends on its producer alone.
//!   The family's lifetime starts at its first writer.
//!
//! Building it is O(N + E); every query is O(1) or a slice.

use graph_ir::{ComputeGraph, TensorId};
use slotmap::SecondaryMap;

use crate::fusion::FusionPlan;
use crate::ids::GroupId;
use crate::interval::Interval;
use crate::stream::sort_dedup_down;
use crate::topo::TopoOrder;

/// The alias root of every tensor: itself, or for a view's output its input's root. `order` must be a
/// topological order of `graph` (a view of a view is then seen after the view it reads).
pub fn alias_roots(graph: &ComputeGraph, order: &TopoOrder) -> SecondaryMap<TensorId, TensorId> {
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

/// Successors (ascending) and longest-path depth of every group, from predecessor lists in which every
/// predecessor comes before its successor.
fn succs_and_depth(preds: &[Vec<GroupId>]) -> (Vec<Vec<GroupId>>, Vec<u32>) {
    // Each list sized once (its count first), not grown push by push.
    let mut count = vec![0usize; preds.len()];
    for &p in preds.iter().flatten() {
        if let Some(c) = count.get_mut(p.index()) {
            *c += 1;
        }
    }
    let mut succs: Vec<Vec<GroupId>> = count.into_iter().map(Vec::with_capacity).collect();
    let mut depth = vec![0u32; preds.len()];
    for (g, ps) in preds.iter().enumerate() {
        for &p in ps {
            if let Some(s) = succs.get_mut(p.index()) {
                s.push(GroupId::from_index(g));
            }
            // Predecessors come first in group order, so their depth is final.
            depth[g] = depth[g].max(depth.get(p.index()).copied().unwrap_or(0) + 1);
        }
    }
    (succs, depth)
}

/// Group-level facts of a fused program (see the module docs).
#[derive(Clone, Debug, Default)]
pub struct GroupGraph {
    /// The alias root of each tensor that is not its own (views' outputs, slots of eliminated Concats).
    root: SecondaryMap<TensorId, TensorId>,
    /// Byte offset of each tensor inside its root (absent: 0); only slots of eliminated Concats and their views.
    offset: SecondaryMap<TensorId, u64>,
    writer: SecondaryMap<TensorId, GroupId>,
    /// Every writer group (ascending) of the roots written by more than one group: eliminated Concat outputs.
    multi: SecondaryMap<TensorId, Vec<GroupId>>,
    preds: Vec<Vec<GroupId>>,
    succs: Vec<Vec<GroupId>>,
    depth: Vec<u32>,
    /// The readers of each alias group read at all: its range in `reader_list`, where every root's readers lie
    /// end to end (ascending within a root), one array instead of a vector per root.
    reader_range: SecondaryMap<TensorId, (u32, u32)>,
    reader_list: Vec<GroupId>,
}

impl GroupGraph {
    /// The group graph of `fusion` (made for `order`) over `graph`.
    pub fn new(graph: &ComputeGraph, order: &TopoOrder, fusion: &FusionPlan) -> GroupGraph {
        // Only tensors that are not their own root are entered (views, slots): most tensors are.
        let mut root: SecondaryMap<TensorId, TensorId> = SecondaryMap::with_capacity(graph.num_tensors());
        let root_of = |root: &SecondaryMap<TensorId, TensorId>, t: TensorId| root.get(t).copied().unwrap_or(t);
        let mut offset: SecondaryMap<TensorId, u64> = SecondaryMap::new();
        // Tensors that are (views of) a slot: they read one writer's bytes, not the whole family's.
        let mut part: SecondaryMap<TensorId, ()> = SecondaryMap::new();
        // Slots first: the views of a slot come before its Concat in topological order.
        for (t, s) in &fusion.concat_slots {
            root.insert(t, s.output);
            offset.insert(t, s.offset);
            part.insert(t, ());
        }
        let mut writer: SecondaryMap<TensorId, GroupId> = SecondaryMap::with_capacity(graph.num_tensors());
        let mut multi: SecondaryMap<TensorId, Vec<GroupId>> = SecondaryMap::new();
        for &n in &order.order {
            let node = graph.node(n);
            if fusion.is_eliminated(graph, n) {
                let mut ws: Vec<GroupId> = node.inputs.iter().filter_map(|&i| writer.get(i)).copied().collect();
                ws.sort_unstable();
                ws.dedup();
                if let (Some(&o), Some(&first)) = (node.outputs.first(), ws.first()) {
                    writer.insert(o, first);
                    multi.insert(o, ws);
                }
                continue;
            }
            if node.op.is_view() {
                if let (Some(&i), Some(&o)) = (node.inputs.first(), node.outputs.first()) {
                    let r = root_of(&root, i);
                    if r != o {
                        root.insert(o, r);
                    }
                    if let Some(&off) = offset.get(i) {
                        offset.insert(o, off);
                    }
                    if part.contains_key(i) {
                        part.insert(o, ());
                    }
                }
            }
            let w = match fusion.group_of.get(n) {
                Some(&g) => Some(g),
                // A view outside groups: its bytes are its input's, written by the input's writer.
                None => node.inputs.first().and_then(|&i| writer.get(i)).copied(),
            };
            if let Some(w) = w {
                for &o in &node.outputs {
                    writer.insert(o, w);
                }
            }
        }
        let ng = fusion.groups.len();
        let mut preds: Vec<Vec<GroupId>> = vec![Vec::new(); ng];
        for (gi, g) in fusion.groups.iter().enumerate() {
            let ps = &mut preds[gi];
            // One writer per input but for whole multi-writer families (which may grow it once more).
            ps.reserve_exact(g.inputs.len());
            for &t in &g.inputs {
                // The whole of a multi-writer family: every writer; a slot or a plain tensor: its writer.
                match multi.get(root_of(&root, t)).filter(|_| !part.contains_key(t)) {
                    Some(ws) => ps.extend(ws.iter().copied()),
                    None => ps.extend(writer.get(t).copied()),
                }
            }
            ps.retain(|p| p.index() != gi);
            ps.sort_unstable();
            ps.dedup();
        }
        let (succs, depth) = succs_and_depth(&preds);
        // Every (root, reading group) pair, then a counting sort by root: each root's readers become one run of
        // the list, sorted and deduplicated in place (a run is a few groups; no vector per root).
        let mut pairs: Vec<(TensorId, GroupId)> = Vec::with_capacity(graph.num_tensors());
        for (t, _) in graph.tensors() {
            let r = root_of(&root, t);
            pairs.extend(graph.consumers(t).iter().filter_map(|&c| fusion.group_of.get(c)).map(|&g| (r, g)));
        }
        let mut reader_range: SecondaryMap<TensorId, (u32, u32)> = SecondaryMap::with_capacity(graph.num_tensors());
        for &(r, _) in &pairs {
            match reader_range.get_mut(r) {
                Some(e) => e.1 += 1,
                None => {
                    reader_range.insert(r, (0, 1));
                }
            }
        }
        let mut next = 0u32;
        for (_, e) in reader_range.iter_mut() {
            let count = e.1;
            *e = (next, next);
            next += count;
        }
        let mut reader_list = vec![GroupId(0); pairs.len()];
        for &(r, g) in &pairs {
            if let Some(e) = reader_range.get_mut(r) {
                reader_list[e.1 as usize] = g;
                e.1 += 1;
            }
        }
        // Each run sorted and deduplicated, moved down over the duplicates of the runs before it.
        let mut kept = 0usize;
        for (_, e) in reader_range.iter_mut() {
            let first = kept;
            kept = sort_dedup_down(&mut reader_list, e.0 as usize..e.1 as usize, first);
            *e = (first as u32, kept as u32);
        }
        reader_list.truncate(kept);
        GroupGraph { root, offset, writer, multi, preds, succs, depth, reader_range, reader_list }
    }

    /// A group graph with these data predecessor lists and no tensors (each predecessor below its successor),
    /// for tests and for analyses over plain DAGs.
    pub fn from_preds(preds: Vec<Vec<GroupId>>) -> GroupGraph {
        let (succs, depth) = succs_and_depth(&preds);
        GroupGraph { preds, succs, depth, ..GroupGraph::default() }
    }

    /// Number of groups.
    pub fn len(&self) -> usize {
        self.preds.len()
    }

    /// True when there are no groups.
    pub fn is_empty(&self) -> bool {
        self.preds.is_empty()
    }

    /// The alias root of `t` (itself unless `t` is a view's output).
    pub fn root(&self, t: TensorId) -> TensorId {
        self.root.get(t).copied().unwrap_or(t)
    }

    /// Byte offset of `t` inside its alias root's bytes: 0 but for slots of eliminated Concats and their views.
    pub fn offset(&self, t: TensorId) -> u64 {
        self.offset.get(t).copied().unwrap_or(0)
    }

    /// The group whose launch writes `t`'s bytes (`None` for sources and what only views of sources make); for
    /// an eliminated Concat's output, the first of its [`writers`](Self::writers).
    pub fn writer(&self, t: TensorId) -> Option<GroupId> {
        self.writer.get(t).copied()
    }

    /// Every group that writes part of the alias family rooted at `root`, ascending: one (its writer), several
    /// for an eliminated Concat's output (each slot's producer), none for sources.
    pub fn writers(&self, root: TensorId) -> &[GroupId] {
        match self.multi.get(root) {
            Some(ws) => ws,
            None => self.writer.get(root).map_or(&[], std::slice::from_ref),
        }
    }

    /// Data predecessors of `g` (ascending, without `g`).
    pub fn preds(&self, g: GroupId) -> &[GroupId] {
        self.preds.get(g.index()).map_or(&[], Vec::as_slice)
    }

    /// Data predecessors of every group, indexed by group.
    pub fn all_preds(&self) -> &[Vec<GroupId>] {
        &self.preds
    }

    /// Data successors of `g` (ascending).
    pub fn succs(&self, g: GroupId) -> &[GroupId] {
        self.succs.get(g.index()).map_or(&[], Vec::as_slice)
    }

    /// Longest path (in edges) from a source group to `g`.
    pub fn depth(&self, g: GroupId) -> u32 {
        self.depth.get(g.index()).copied().unwrap_or(0)
    }

    /// The groups that read any member of the alias group rooted at `root` (ascending).
    pub fn readers(&self, root: TensorId) -> &[GroupId] {
        self.reader_range
            .get(root)
            .and_then(|&(start, end)| self.reader_list.get(start as usize..end as usize))
            .unwrap_or(&[])
    }

    /// Predecessors of every group through data edges and `extra` edges `(from, to)` (reuse edges), sorted and
    /// deduplicated; self-edges are dropped.
    pub fn preds_with(&self, extra: impl IntoIterator<Item = (GroupId, GroupId)>) -> Vec<Vec<GroupId>> {
        // Each list sized once for its data and extra predecessors (counted first), not grown push by push.
        let extra: Vec<(GroupId, GroupId)> =
            extra.into_iter().filter(|&(from, to)| from != to && to.index() < self.preds.len()).collect();
        let mut count: Vec<usize> = self.preds.iter().map(Vec::len).collect();
        for &(_, to) in &extra {
            count[to.index()] += 1;
        }
        let mut preds: Vec<Vec<GroupId>> = self
            .preds
            .iter()
            .zip(count)
            .map(|(p, c)| {
                let mut v = Vec::with_capacity(c);
                v.extend_from_slice(p);
                v
            })
            .collect();
        for (from, to) in extra {
            preds[to.index()].push(from);
        }
        for p in &mut preds {
            p.sort_unstable();
            p.dedup();
        }
        preds
    }

    /// The launch-level lifetime of the alias group rooted at `root` when group `g` runs at step `pos[g]`: from
    /// its (first) writer's step to one past its last reader's (its writer's step alone when nobody reads it).
    /// `None` for a group no launch writes.
    pub fn lifetime(&self, root: TensorId, pos: &[u32]) -> Option<Interval> {
        let start = self.writers(root).iter().filter_map(|w| pos.get(w.index()).copied()).min()?;
        let last = self.readers(root).iter().filter_map(|g| pos.get(g.index()).copied()).max().unwrap_or(start);
        Some(Interval::new(start, last.max(start) + 1))
    }
}
