//! The memory pass: where every materialised tensor lives.
//!
//! Regions: sources go to `Weights` (weights, constants) or `Io` (graph inputs); alias groups holding a graph
//! output go to `Io`; results of a Memcpy to the host go to `Host`; every other materialised alias group is a
//! buffer of the activation `Pool`, live over launch steps (groups in execution order, DESIGN.md section 5),
//! packed by the packing core (`pack`). Fused-away intermediates take no memory.
//!
//! Reuse edges (DESIGN.md section 3): when buffer B takes bytes that buffer A held, every reader of A must
//! happen-before B's writer. Sweeping buffers by start step over an address map of "most recent occupant" finds,
//! for each B, exactly the buffers whose bytes it takes last, in O(n log n); the edges run from each reader (or
//! the writer, when unread) of those buffers to B's writer.

pub mod pack;

use graph_ir::{ComputeGraph, GraphError, NodeId, Op, TensorId, TensorRole};
use serde::{Deserialize, Serialize};
use slotmap::SecondaryMap;
use std::collections::BTreeMap;

use crate::fusion::FusionPlan;
use crate::ids::GroupId;
use crate::liveness::{self, Lifetime};
use crate::topo::TopoOrder;

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
    /// Deterministic effort budget for the packer's improvement stage.
    pub pack_effort: u64,
    /// Seed for the packer.
    pub seed: u64,
}

impl Default for MemoryOptions {
    fn default() -> Self {
        MemoryOptions { reuse: true, in_place: true, alignment: 256, max_pool_bytes: 1 << 48, pack_effort: 0, seed: 0 }
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
    /// Graph outputs whose bytes alias a source: (source tensor, output tensor) pairs to copy.
    pub output_copies: Vec<(TensorId, TensorId)>,
    /// Tensors written in place over a dying input.
    pub in_place_count: usize,
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

/// Run the memory pass.
pub fn analyse(
    graph: &ComputeGraph,
    order: &TopoOrder,
    fusion: &FusionPlan,
    opts: &MemoryOptions,
) -> Result<MemoryPlan, GraphError> {
    let _span = tracing::debug_span!("memory").entered();
    let a = opts.alignment.max(1);
    let steps = launch_steps(graph, order, fusion);
    let num_steps = fusion.groups.len() as u32;
    let live = liveness::analyse_steps(graph, &order.order, &steps, num_steps);

    // Which alias groups are materialised, and what they contain.
    let mut materialized: SecondaryMap<TensorId, bool> = SecondaryMap::with_capacity(graph.num_tensors());
    let mut has_output: SecondaryMap<TensorId, bool> = SecondaryMap::new();
    let mut to_host: SecondaryMap<TensorId, bool> = SecondaryMap::new();
    for (t, tensor) in graph.tensors() {
        let r = live.root[t];
        if fusion.is_materialized(graph, t) {
            materialized.insert(r, true);
        }
        if tensor.role == TensorRole::Output {
            has_output.insert(r, true);
        }
        if let Some(p) = tensor.producer {
            if matches!(graph.node(p).op, Op::Memcpy { to: graph_ir::op::MemSpace::Host }) {
                to_host.insert(r, true);
            }
        }
    }

    let mut region_bytes = [0u64; 4];
    let mut placement: SecondaryMap<TensorId, Placement> = SecondaryMap::with_capacity(graph.num_tensors());
    let mut root_place: SecondaryMap<TensorId, (Region, u64)> = SecondaryMap::new();
    let bump = |region: Region, bytes: u64, region_bytes: &mut [u64; 4]| -> u64 {
        let off = region_bytes[region.index()];
        region_bytes[region.index()] = off.saturating_add(align_up(bytes.max(1), a));
        off
    };
    // Sources first, in declaration order: inputs, then weights and constants.
    for &t in graph.inputs().iter().chain(graph.weights()) {
        let tensor = graph.tensor(t);
        let region = if tensor.role == TensorRole::Input { Region::Io } else { Region::Weights };
        let off = bump(region, tensor.size_bytes() as u64, &mut region_bytes);
        root_place.insert(t, (region, off));
    }
    // Pool candidates and Io/Host roots.
    let mut pool_roots: Vec<TensorId> = Vec::new();
    let mut output_copies = Vec::new();
    for (t, tensor) in graph.tensors() {
        if live.root[t] != t || tensor.role.is_source() || !materialized.get(t).copied().unwrap_or(false) {
            continue;
        }
        if to_host.contains_key(t) {
            let off = bump(Region::Host, tensor.size_bytes() as u64, &mut region_bytes);
            root_place.insert(t, (Region::Host, off));
        } else if has_output.contains_key(t) {
            let off = bump(Region::Io, tensor.size_bytes() as u64, &mut region_bytes);
            root_place.insert(t, (Region::Io, off));
        } else {
            pool_roots.push(t);
        }
    }
    // Graph outputs aliasing a source get their own Io bytes and a copy.
    for &o in graph.outputs() {
        let r = live.root[o];
        if graph.tensor(r).role.is_source() {
            let off = bump(Region::Io, graph.tensor(o).size_bytes() as u64, &mut region_bytes);
            placement
                .insert(o, Placement { region: Region::Io, offset: off, bytes: graph.tensor(o).size_bytes() as u64 });
            output_copies.push((r, o));
        }
    }

    // Pack the pool.
    let buffers: Vec<pack::Buffer> = pool_roots
        .iter()
        .map(|&r| {
            let lt = live.group[r];
            pack::Buffer {
                lower: lt.start as u64,
                upper: lt.end.max(lt.start + 1) as u64,
                size: graph.tensor(r).size_bytes().max(1) as u64,
            }
        })
        .collect();
    let naive_bytes = buffers.iter().map(|b| align_up(b.size, a)).fold(0u64, u64::saturating_add);
    let lower_bound_bytes = pack::lower_bound(&buffers, a);
    let offsets: Vec<u64> = if opts.reuse {
        let popts = pack::PackOptions {
            alignment: a,
            budget: pack::Budget { effort: opts.pack_effort, time_limit: None },
            seed: opts.seed,
        };
        pack::pack(&buffers, &popts)
            .map_err(|e| GraphError::LimitExceeded {
                what: format!("activation pool packing ({e})"),
                value: 0,
                limit: 0,
            })?
            .offsets
    } else {
        let mut off = 0u64;
        buffers
            .iter()
            .map(|b| {
                let o = off;
                off = off.saturating_add(align_up(b.size, a));
                o
            })
            .collect()
    };
    let mut pool_buffers = Vec::with_capacity(pool_roots.len());
    let mut pool_bytes = 0u64;
    for (i, &r) in pool_roots.iter().enumerate() {
        let size = align_up(buffers[i].size, a);
        pool_bytes = pool_bytes.max(offsets[i].saturating_add(size));
        root_place.insert(r, (Region::Pool, offsets[i]));
        pool_buffers.push(PoolBuffer { root: r, live: live.group[r], size, offset: offsets[i] });
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
        if let Some(&(region, offset)) = root_place.get(live.root[t]) {
            if materialized.get(live.root[t]).copied().unwrap_or(false) || tensor.role.is_source() {
                placement.insert(t, Placement { region, offset, bytes: tensor.size_bytes() as u64 });
            }
        }
    }
    let reuse_edges = reuse_edges(graph, fusion, &live, &pool_buffers);
    Ok(MemoryPlan {
        alignment: a,
        region_bytes,
        placement,
        buffers: pool_buffers,
        naive_bytes,
        lower_bound_bytes,
        reuse_edges,
        output_copies,
        in_place_count: 0,
    })
}

/// For each pool buffer, the buffers whose bytes it takes last, turned into reader -> writer group edges.
fn reuse_edges(
    graph: &ComputeGraph,
    fusion: &FusionPlan,
    live: &liveness::Liveness,
    buffers: &[PoolBuffer],
) -> Vec<ReuseEdge> {
    // Readers of each alias group, at group granularity.
    let mut readers: SecondaryMap<TensorId, Vec<GroupId>> = SecondaryMap::new();
    for (t, _) in graph.tensors() {
        let r = live.root[t];
        for &c in graph.consumers(t) {
            if let Some(&g) = fusion.group_of.get(c) {
                let list = match readers.get_mut(r) {
                    Some(l) => l,
                    None => {
                        readers.insert(r, Vec::new());
                        &mut readers[r]
                    }
                };
                if !list.contains(&g) {
                    list.push(g);
                }
            }
        }
    }
    let mut by_start: Vec<usize> = (0..buffers.len()).collect();
    by_start.sort_by_key(|&i| (buffers[i].live.start, i));
    // Address map: start offset -> (end offset, buffer index) of the most recent occupant.
    let mut map: BTreeMap<u64, (u64, usize)> = BTreeMap::new();
    let mut edges = Vec::new();
    for &i in &by_start {
        let b = buffers[i];
        let (lo, hi) = (b.offset, b.offset + b.size);
        let mut displaced: Vec<usize> = Vec::new();
        // Segments overlapping [lo, hi): possibly one starting before lo.
        let mut starts: Vec<u64> = Vec::new();
        if let Some((&s, &(e, _))) = map.range(..lo).next_back() {
            if e > lo {
                starts.push(s);
            }
        }
        starts.extend(map.range(lo..hi).map(|(&s, _)| s));
        for s in starts {
            if let Some((e, j)) = map.remove(&s) {
                displaced.push(j);
                if s < lo {
                    map.insert(s, (lo, j));
                }
                if e > hi {
                    map.insert(hi, (e, j));
                }
            }
        }
        map.insert(lo, (hi, i));
        displaced.sort_unstable();
        displaced.dedup();
        let Some(to) = writer_group(graph, fusion, b.root) else { continue };
        for j in displaced {
            let old = buffers[j].root;
            let froms: Vec<GroupId> = match readers.get(old) {
                Some(r) if !r.is_empty() => r.clone(),
                _ => writer_group(graph, fusion, old).into_iter().collect(),
            };
            for from in froms {
                if from != to {
                    edges.push(ReuseEdge { from, to });
                }
            }
        }
    }
    edges.sort_unstable();
    edges.dedup();
    edges
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{fusion, topo};
    use graph_ir::{DType, Op};

    #[test]
    fn chain_reuses_two_slots_exactly() {
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
        let m = analyse(&g, &order, &f, &MemoryOptions::default()).unwrap();
        assert_eq!(m.naive_bytes, 3 * 1024);
        assert_eq!(m.lower_bound_bytes, 2 * 1024);
        assert_eq!(m.pool_bytes(), 2 * 1024);
        assert_eq!(m.placement[x].region, Region::Io);
        assert_eq!(m.placement[d].region, Region::Io);
        assert_eq!(m.placement[a].offset, m.placement[c].offset);
        assert_ne!(m.placement[a].offset, m.placement[b].offset);
        // c takes a's bytes: a's reader (b, group 1) must precede c's writer (group 2).
        assert_eq!(m.reuse_edges, vec![ReuseEdge { from: GroupId(1), to: GroupId(2) }]);
        let naive = analyse(&g, &order, &f, &MemoryOptions { reuse: false, ..Default::default() }).unwrap();
        assert_eq!(naive.pool_bytes(), 3 * 1024);
        assert!(naive.reuse_edges.is_empty());
    }
}
