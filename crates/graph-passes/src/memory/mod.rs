//! The memory pass: where every materialised tensor lives.
//!
//! Regions: sources go to `Weights` (weights, constants) or `Io` (graph inputs); alias groups holding a graph
//! output go to `Io`; results of a Memcpy to the host go to `Host`; every other materialised alias group is a
//! buffer of the activation `Pool`. Fused-away intermediates take no memory.
//!
//! The pool, top to bottom (each step in its own module):
//! 1. `model`: the pool's buffers (one per alias group), their writer and reader kernels, the in-place
//!    candidates — independent of the launch order.
//! 2. Lifetimes over launch steps (DESIGN.md section 5) in the fusion plan's order, and the in-place handovers
//!    (`MemoryOptions::in_place`): an elementwise kernel writes its output over an input that dies at that
//!    launch. The donor's lifetime then ends at the handover step, and donor and heir form one *unit* that
//!    shares one offset (a chain when the heir donates in turn).
//! 3. `pack`: offsets for the units — the greedy portfolio, then the exact search under `pack_effort` where the
//!    greedy result is above the lower bound and the component is small enough. Deterministic.
//! 4. `reuse::prefer_ordered` (`prefer_ordered_reuse`): units whose place would add an ordering the DAG does
//!    not imply move, when they can, to a gap of the packed pool that adds none.
//! 5. `reuse::edges`: the reuse edges the stream pass must honour, and how many the data edges do not imply.
//!
//! `lower_bound_bytes` is the sweep bound of the buffers as packed (in-place donors end at their handover), so
//! `lower_bound_bytes <= pool_bytes <= naive_bytes`. Cost: O(N + E) for the model and lifetimes, O(n log n) for
//! the sweeps, the packer's near-linear greedy plus its bounded search; the ordering preference adds
//! O(k log k) per revisited unit and bounded ancestor queries.

pub(crate) mod model;
pub mod pack;
pub(crate) mod reach;
mod reuse;

use graph_ir::{ComputeGraph, GraphError, NodeId, TensorId, TensorRole};
use serde::{Deserialize, Serialize};
use slotmap::SecondaryMap;

use crate::fusion::FusionPlan;
use crate::ids::GroupId;
use crate::liveness::Lifetime;
use crate::topo::TopoOrder;
use model::{Classes, PoolModel};
use reach::{GroupDag, Reach};

/// A memory region of the plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Region {
    /// The activation pool: intermediates, with reuse.
    Pool,
    /// Weights and constants, uploaded once.
    Weights,
    /// Graph inputs and outputs.
    Io,
    /// Pinned host memory for Memcpy-to-host results.
    Host,
}

impl Region {
    /// Every region, in a stable order.
    pub const ALL: [Region; 4] = [Region::Pool, Region::Weights, Region::Io, Region::Host];

    /// Index in `ALL`.
    pub fn index(self) -> usize {
        match self {
            Region::Pool => 0,
            Region::Weights => 1,
            Region::Io => 2,
            Region::Host => 3,
        }
    }

    /// Lowercase name, as the plan dump prints it.
    pub fn name(self) -> &'static str {
        match self {
            Region::Pool => "pool",
            Region::Weights => "weights",
            Region::Io => "io",
            Region::Host => "host",
        }
    }
}

/// Where a tensor's bytes are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Placement {
    /// The region.
    pub region: Region,
    /// Byte offset in the region (aligned).
    pub offset: u64,
    /// The tensor's size in bytes (unaligned).
    pub bytes: u64,
}

/// An ordering the stream pass must honour: `from` (a reader of the old occupant) before `to` (the writer of
/// the new one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ReuseEdge {
    /// Group that must finish first.
    pub from: GroupId,
    /// Group that overwrites the bytes.
    pub to: GroupId,
}

/// Options of the memory pass.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryOptions {
    /// Share pool bytes between tensors with disjoint lifetimes (off: every buffer gets its own bytes).
    pub reuse: bool,
    /// Let an elementwise op write over an input that dies at that op.
    pub in_place: bool,
    /// Offset alignment in bytes (a power of two).
    pub alignment: u64,
    /// Largest pool accepted; above it planning fails with an error.
    pub max_pool_bytes: u64,
    /// Deterministic effort budget for the packer's exact search (work units, about 10^8 per second; 0: greedy
    /// portfolio only). Spent only on components the greedy result leaves above their lower bound.
    pub pack_effort: u64,
    /// Seed for the packer.
    pub seed: u64,
    /// Among places of equal cost, prefer reuse the DAG already orders, and hand over bytes in place only when
    /// the input's other readers are ordered before the kernel: no reuse edge then serialises concurrent work.
    /// Only matters with several streams (the pipeline turns it off for one).
    pub prefer_ordered_reuse: bool,
    /// Trade pool bytes for overlap: each buffer's bytes stay reserved until the branches reading it have met
    /// (the nearest common post-dominator of its readers' first merges in the group DAG, or earlier a merge no
    /// data edge spans; to the end when they never meet), so no reuse edge chains branches the stream pass could
    /// run side by side. Off by default (the pool stays at the order's bound); `lower_bound_bytes` stays the bound
    /// of the plain lifetimes, so the report shows what the overlap costs. Only matters with several streams.
    #[serde(default)]
    pub concurrent_lifetimes: bool,
}

/// The packer's default effort for graphs: at most about 0.1 s of search, spent only where the greedy result is
/// above the lower bound.
pub const DEFAULT_PACK_EFFORT: u64 = 10_000_000;

impl Default for MemoryOptions {
    fn default() -> Self {
        MemoryOptions {
            reuse: true,
            in_place: true,
            alignment: 256,
            max_pool_bytes: 1 << 48,
            pack_effort: DEFAULT_PACK_EFFORT,
            seed: 0,
            prefer_ordered_reuse: true,
            concurrent_lifetimes: false,
        }
    }
}

/// A pool buffer: one alias group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolBuffer {
    /// The alias root.
    pub root: TensorId,
    /// Live steps (launch indices).
    pub live: Lifetime,
    /// Aligned size.
    pub size: u64,
    /// Offset in the pool.
    pub offset: u64,
}

/// The result of the memory pass.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MemoryPlan {
    /// Alignment used.
    pub alignment: u64,
    /// Bytes of each region, indexed by `Region::index`.
    pub region_bytes: [u64; 4],
    /// Placement of every materialised tensor (view outputs share their root's bytes).
    pub placement: SecondaryMap<TensorId, Placement>,
    /// The pool's buffers, one per materialised alias group in the pool.
    pub buffers: Vec<PoolBuffer>,
    /// Sum of the aligned sizes of the pool's buffers (no reuse).
    pub naive_bytes: u64,
    /// Largest sum of aligned sizes live at one launch, for this launch order.
    pub lower_bound_bytes: u64,
    /// Orderings the stream pass must honour.
    pub reuse_edges: Vec<ReuseEdge>,
    /// How many of `reuse_edges` the data edges do not already imply (`from` is not known to be an ancestor of
    /// `to`): the orderings reuse adds to the DAG. An upper bound: ancestor queries are budgeted.
    pub reuse_edges_not_implied: usize,
    /// Graph outputs whose bytes alias a source: (source tensor, output tensor) pairs to copy.
    pub output_copies: Vec<(TensorId, TensorId)>,
    /// Tensors written in place over a dying input.
    pub in_place_count: usize,
    /// The in-place handovers: (input alias root, output root written over it, kernel), in launch order.
    pub in_place: Vec<(TensorId, TensorId, GroupId)>,
    /// Whether the packer proved `pool_bytes` minimal for these lifetimes.
    pub pool_optimal: bool,
}

impl MemoryPlan {
    /// Bytes of the activation pool.
    pub fn pool_bytes(&self) -> u64 {
        self.region_bytes[Region::Pool.index()]
    }
}

fn align_up(v: u64, a: u64) -> u64 {
    v.div_ceil(a).saturating_mul(a)
}

/// The group (kernel) whose launch writes `t`'s bytes, looking through views outside groups.
pub fn writer_group(graph: &ComputeGraph, fusion: &FusionPlan, mut t: TensorId) -> Option<GroupId> {
    loop {
        let p = graph.producer(t)?;
        if let Some(&g) = fusion.group_of.get(p) {
            return Some(g);
        }
        t = *graph.node(p).inputs.first()?;
    }
}

/// Step of every node at launch granularity: a grouped node runs at its group's index; a view outside groups at
/// the step its input's bytes are written (0 for sources).
pub fn launch_steps(graph: &ComputeGraph, order: &TopoOrder, fusion: &FusionPlan) -> SecondaryMap<NodeId, u32> {
    let mut step: SecondaryMap<NodeId, u32> = SecondaryMap::with_capacity(graph.num_nodes());
    for &n in &order.order {
        let s = match fusion.group_of.get(n) {
            Some(g) => g.0,
            None => graph.node(n).inputs.first().and_then(|&t| graph.producer(t)).map_or(0, |p| step[p]),
        };
        step.insert(n, s);
    }
    step
}

/// Most groups one ancestor query of the memory pass may visit.
const REACH_LIMIT: usize = 4096;

fn internal(what: impl std::fmt::Display) -> GraphError {
    GraphError::InvalidOption { option: "internal".into(), detail: format!("memory planner bug: {what}") }
}

/// Run the memory pass.
pub fn analyse(
    graph: &ComputeGraph,
    order: &TopoOrder,
    fusion: &FusionPlan,
    opts: &MemoryOptions,
) -> Result<MemoryPlan, GraphError> {
    let _span = tracing::debug_span!("memory").entered();
    let a = opts.alignment.max(1);
    let classes = Classes::new(graph, order, fusion);

    // Sources, Io and Host by bumping, in declaration and tensor order.
    let mut region_bytes = [0u64; 4];
    let mut placement: SecondaryMap<TensorId, Placement> = SecondaryMap::with_capacity(graph.num_tensors());
    let mut root_place: SecondaryMap<TensorId, (Region, u64)> = SecondaryMap::new();
    let bump = |region: Region, bytes: u64, region_bytes: &mut [u64; 4]| -> u64 {
        let off = region_bytes[region.index()];
        region_bytes[region.index()] = off.saturating_add(align_up(bytes.max(1), a));
        off
    };
    for &t in graph.inputs().iter().chain(graph.weights()) {
        let tensor = graph.tensor(t);
        let region = if tensor.role == TensorRole::Input { Region::Io } else { Region::Weights };
        let off = bump(region, tensor.size_bytes() as u64, &mut region_bytes);
        root_place.insert(t, (region, off));
    }
    for (t, tensor) in graph.tensors() {
        if classes.root[t] != t || tensor.role.is_source() || !classes.materialized.contains_key(t) {
            continue;
        }
        if classes.to_host.contains_key(t) {
            let off = bump(Region::Host, tensor.size_bytes() as u64, &mut region_bytes);
            root_place.insert(t, (Region::Host, off));
        } else if classes.has_output.contains_key(t) {
            let off = bump(Region::Io, tensor.size_bytes() as u64, &mut region_bytes);
            root_place.insert(t, (Region::Io, off));
        }
    }
    // Graph outputs aliasing a source get their own Io bytes and a copy.
    let mut output_copies = Vec::new();
    for &o in graph.outputs() {
        let r = classes.root[o];
        if graph.tensor(r).role.is_source() {
            let bytes = graph.tensor(o).size_bytes() as u64;
            let off = bump(Region::Io, bytes, &mut region_bytes);
            placement.insert(o, Placement { region: Region::Io, offset: off, bytes });
            output_copies.push((r, o));
        }
    }

    // 1. The pool model, and 2. lifetimes and in-place handovers in the fusion plan's order.
    let dag = GroupDag::new(graph, fusion);
    let mut reach = Reach::new(&dag, REACH_LIMIT);
    let ordered = opts.reuse && opts.prefer_ordered_reuse;
    let in_place = opts.reuse && opts.in_place;
    let model = PoolModel::new(graph, fusion, &classes, a, in_place, if ordered { Some(&mut reach) } else { None });
    let n = model.len();
    let pos: Vec<u32> = (0..fusion.groups.len() as u32).collect();
    let mut live = model.lifetimes(&pos);
    let handovers = if in_place { model.choose_in_place(&pos, &live) } else { Vec::new() };
    let mut unit_of: Vec<u32> = (0..n as u32).collect();
    for &(r, o, g) in &handovers {
        live[r as usize].1 = pos[g as usize];
        unit_of[o as usize] = unit_of[r as usize];
    }
    // Units: one per chain head; a chain is live from its head's start to its last heir's end.
    let mut unit_index = vec![u32::MAX; n];
    let mut heads: Vec<u32> = Vec::new();
    let mut last: Vec<u32> = Vec::new();
    for b in 0..n {
        if unit_of[b] as usize == b {
            unit_index[b] = heads.len() as u32;
            heads.push(b as u32);
            last.push(b as u32);
        }
    }
    let mut unit_live: Vec<(u32, u32)> = heads.iter().map(|&h| live[h as usize]).collect();
    for b in 0..n {
        let u = unit_index[unit_of[b] as usize] as usize;
        if live[b].1 > unit_live[u].1 {
            unit_live[u].1 = live[b].1;
            last[u] = b as u32;
        }
    }
    let froms: Vec<&[u32]> =
        (0..n)
            .map(|b| {
                if model.readers[b].is_empty() {
                    std::slice::from_ref(&model.writer[b])
                } else {
                    &model.readers[b][..]
                }
            })
            .collect();

    // 3. Offsets.
    let unit_bufs: Vec<pack::Buffer> = heads
        .iter()
        .zip(&unit_live)
        .map(|(&h, &(lo, hi))| pack::Buffer { lower: lo as u64, upper: hi as u64, size: model.bytes[h as usize] })
        .collect();
    let naive_bytes = model.size.iter().fold(0u64, |s, &x| s.saturating_add(x));
    let lower_bound_bytes = pack::lower_bound(&unit_bufs, a);
    if opts.reuse && opts.concurrent_lifetimes {
        let (ipdom, merge, next_cut) = post_dominators(&dag);
        let sink = ipdom.len() as u32;
        for (u, lt) in unit_live.iter_mut().enumerate() {
            let l = last[u] as usize;
            // Where the readers' branches have met (the writer's, for a buffer nobody reads).
            let pd = froms[l].iter().fold(None, |acc: Option<u32>, &g| {
                let d = ipdom.get(g as usize).and_then(|&p| merge.get(p as usize)).copied().unwrap_or(sink);
                Some(acc.map_or(d, |x| intersect(&ipdom, x, d)))
            });
            let pd = pd.unwrap_or(sink);
            let cut = next_cut.get(lt.1.saturating_sub(1) as usize).copied().unwrap_or(sink);
            lt.1 = lt.1.max(pd.min(cut).saturating_add(1));
        }
    }
    let unit_bufs: Vec<pack::Buffer> = if opts.reuse && opts.concurrent_lifetimes {
        unit_bufs.iter().zip(&unit_live).map(|(b, &(_, hi))| pack::Buffer { upper: hi as u64, ..*b }).collect()
    } else {
        unit_bufs
    };
    let (mut unit_off, pool_optimal): (Vec<u64>, bool) = if opts.reuse {
        let popts = pack::PackOptions {
            alignment: a,
            budget: pack::Budget { effort: opts.pack_effort, time_limit: None },
            seed: opts.seed,
        };
        let p = pack::pack(&unit_bufs, &popts).map_err(|e| match e {
            pack::PackError::Internal(v) => internal(format!("the packer's layout is invalid: {v}")),
            e => GraphError::LimitExceeded {
                what: format!("activation pool of graph '{}' ({e})", graph.name()),
                value: 0,
                limit: 0,
            },
        })?;
        (p.offsets, p.optimal)
    } else {
        let mut off = 0u64;
        let offs = unit_bufs
            .iter()
            .map(|b| {
                let o = off;
                off = off.saturating_add(align_up(b.size, a));
                o
            })
            .collect();
        (offs, false)
    };
    let pool_bytes =
        unit_bufs.iter().zip(&unit_off).map(|(b, &o)| o.saturating_add(align_up(b.size, a))).max().unwrap_or(0);

    // 4. Prefer places the DAG already orders.
    if ordered && unit_bufs.len() > 1 {
        let mut units: Vec<reuse::Unit> = (0..heads.len())
            .map(|u| reuse::Unit {
                live: unit_live[u],
                size: align_up(unit_bufs[u].size, a),
                offset: unit_off[u],
                writer: model.writer[heads[u] as usize],
                froms: froms[last[u] as usize],
            })
            .collect();
        let stats = reuse::prefer_ordered(&mut units, pool_bytes, &mut reach);
        tracing::debug!(revisited = stats.revisited, moved = stats.moved, "memory: ordered-reuse preference");
        unit_off = units.iter().map(|u| u.offset).collect();
        pack::check(&unit_bufs, &unit_off)
            .map_err(|v| internal(format!("ordered-reuse moves broke the layout: {v}")))?;
    }

    // Buffers and placements.
    let mut pool_buffers = Vec::with_capacity(n);
    for b in 0..n {
        let off = unit_off[unit_index[unit_of[b] as usize] as usize];
        let r = model.roots[b];
        root_place.insert(r, (Region::Pool, off));
        let (start, end) = live[b];
        pool_buffers.push(PoolBuffer { root: r, live: Lifetime { start, end }, size: model.size[b], offset: off });
    }
    region_bytes[Region::Pool.index()] = pool_bytes;
    if pool_bytes > opts.max_pool_bytes {
        return Err(GraphError::LimitExceeded {
            what: format!("activation pool of graph '{}' (bytes)", graph.name()),
            value: pool_bytes,
            limit: opts.max_pool_bytes,
        });
    }
    for (t, tensor) in graph.tensors() {
        if placement.contains_key(t) {
            continue;
        }
        let r = classes.root[t];
        if let Some(&(region, offset)) = root_place.get(r) {
            if classes.materialized.contains_key(r) || tensor.role.is_source() {
                placement.insert(t, Placement { region, offset, bytes: tensor.size_bytes() as u64 });
            }
        }
    }

    // 5. Reuse edges.
    let sweep: Vec<reuse::SweepBuffer<'_>> = (0..n)
        .map(|b| reuse::SweepBuffer {
            live: live[b],
            offset: pool_buffers[b].offset,
            size: model.size[b],
            writer: model.writer[b],
            froms: froms[b],
        })
        .collect();
    let edges = reuse::edges(&sweep);
    let reuse_edges_not_implied = edges.iter().filter(|&&(f, t)| !reach.ordered(f, t)).count();
    let reuse_edges = edges.into_iter().map(|(f, t)| ReuseEdge { from: GroupId(f), to: GroupId(t) }).collect();
    let in_place: Vec<(TensorId, TensorId, GroupId)> =
        handovers.iter().map(|&(r, o, g)| (model.roots[r as usize], model.roots[o as usize], GroupId(g))).collect();
    Ok(MemoryPlan {
        alignment: a,
        region_bytes,
        placement,
        buffers: pool_buffers,
        naive_bytes,
        lower_bound_bytes,
        reuse_edges,
        reuse_edges_not_implied,
        output_copies,
        in_place_count: in_place.len(),
        in_place,
        pool_optimal,
    })
}

/// Immediate post-dominator of every group in `dag` (data edges), with a virtual sink `n` after every group:
/// `ipdom[g] > g`, and every path from `g` to the end passes through `ipdom[g]` (reverse group order with the
/// Cooper-Harvey-Kennedy intersection; group index is a topological numbering). Also, per group, the first
/// post-dominator (itself included) with several predecessors (a merge of branches), and the first merge at or
/// after it that no data edge spans; `n` when none. O(N + E) plus the intersections' walks up the tree.
fn post_dominators(dag: &GroupDag) -> (Vec<u32>, Vec<u32>, Vec<u32>) {
    let n = dag.len();
    let mut succ: Vec<Vec<u32>> = vec![Vec::new(); n];
    for (g, ps) in dag.preds.iter().enumerate() {
        for &p in ps {
            if let Some(l) = succ.get_mut(p as usize) {
                l.push(g as u32);
            }
        }
    }
    let sink = n as u32;
    let mut ipdom = vec![sink; n];
    for g in (0..n).rev() {
        let mut it = succ[g].iter().copied();
        let Some(first) = it.next() else { continue };
        ipdom[g] = it.fold(first, |x, s| intersect(&ipdom, x, s));
    }
    let preds: Vec<usize> = dag.preds.iter().map(Vec::len).collect();
    let mut merge = vec![sink; n];
    for g in (0..n).rev() {
        merge[g] = if preds[g] >= 2 { g as u32 } else { merge.get(ipdom[g] as usize).copied().unwrap_or(sink) };
    }
    // A cut: a merge that no data edge spans (no edge u -> v with u < j < v).
    let mut next_cut = vec![sink; n];
    let mut reach = vec![0u32; n];
    let mut far = 0u32;
    for (j, r) in reach.iter_mut().enumerate() {
        *r = far;
        far = far.max(succ[j].iter().copied().max().unwrap_or(j as u32));
    }
    let mut after = sink;
    for j in (0..n).rev() {
        if reach[j] <= j as u32 && preds[j] >= 2 {
            after = j as u32;
        }
        next_cut[j] = after;
    }
    (ipdom, merge, next_cut)
}

/// Nearest common post-dominator of `a` and `b` (either may be the virtual sink `ipdom.len()`).
fn intersect(ipdom: &[u32], mut a: u32, mut b: u32) -> u32 {
    let sink = ipdom.len() as u32;
    while a != b {
        if a < b {
            a = ipdom.get(a as usize).copied().unwrap_or(sink);
        } else {
            b = ipdom.get(b as usize).copied().unwrap_or(sink);
        }
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{fusion, topo};
    use graph_ir::{DType, Op};

    #[test]
    fn chain_reuses_two_slots_exactly_without_in_place() {
        // x -> a -> b -> c -> d (output), 1 KiB each, fusion off: a, b, c in the pool.
        let mut g = ComputeGraph::new("m");
        let x = g.add_input("x", DType::F32, [256]).unwrap();
        let a = g.add_node("a", Op::Relu, &[x]).unwrap()[0];
        let b = g.add_node("b", Op::Neg, &[a]).unwrap()[0];
        let c = g.add_node("c", Op::Abs, &[b]).unwrap()[0];
        let d = g.add_node("d", Op::Exp, &[c]).unwrap()[0];
        g.mark_output(d).unwrap();
        let order = topo::analyse(&g).unwrap();
        let f = fusion::analyse(&g, &order, &fusion::FusionOptions { enabled: false, ..Default::default() });
        let opts = MemoryOptions { in_place: false, ..Default::default() };
        let m = analyse(&g, &order, &f, &opts).unwrap();
        assert_eq!(m.naive_bytes, 3 * 1024);
        assert_eq!(m.lower_bound_bytes, 2 * 1024);
        assert_eq!(m.pool_bytes(), 2 * 1024);
        assert_eq!(m.in_place_count, 0);
        assert_eq!(m.placement[x].region, Region::Io);
        assert_eq!(m.placement[d].region, Region::Io);
        assert_eq!(m.placement[a].offset, m.placement[c].offset);
        assert_ne!(m.placement[a].offset, m.placement[b].offset);
        // c takes a's bytes: a's reader (b, group 1) must precede c's writer (group 2).
        assert_eq!(m.reuse_edges, vec![ReuseEdge { from: GroupId(1), to: GroupId(2) }]);
        assert_eq!(m.reuse_edges_not_implied, 0);
        let naive = analyse(&g, &order, &f, &MemoryOptions { reuse: false, ..Default::default() }).unwrap();
        assert_eq!(naive.pool_bytes(), 3 * 1024);
        assert!(naive.reuse_edges.is_empty());
        assert_eq!(naive.in_place_count, 0);
    }
}
