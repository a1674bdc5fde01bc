//! Regions: where each alias group goes, decided from roles, producers and the fusion plan alone, and the
//! placement of everything outside the activation pool by bumping (in declaration, then tensor, order).
//!
//! Sources go to `Weights` (weights, constants) or `Io` (graph inputs); alias groups holding a graph output go
//! to `Io`; results of a Memcpy to the host go to `Host`; every other materialised alias group is a buffer of the
//! pool. A graph output whose bytes alias a source gets its own `Io` bytes and a copy. O(N).

use graph_ir::{ComputeGraph, Op, TensorId, TensorRole};
use slotmap::SecondaryMap;

use crate::fusion::FusionPlan;
use crate::group_graph::GroupGraph;
use crate::memory::{Placement, Region};

/// `v` rounded up to a multiple of `a` (saturating).
pub(crate) fn align_up(v: u64, a: u64) -> u64 {
    v.div_ceil(a).saturating_mul(a)
}

/// The classes of alias groups, by root.
pub(crate) struct Classes {
    /// Roots of groups some member of which needs memory.
    pub materialized: SecondaryMap<TensorId, ()>,
    /// Roots of groups holding a graph output.
    pub has_output: SecondaryMap<TensorId, ()>,
    /// Roots of groups written by a Memcpy to the host.
    pub to_host: SecondaryMap<TensorId, ()>,
}

impl Classes {
    /// The classes of `graph`'s alias groups under `fusion`.
    pub fn new(graph: &ComputeGraph, fusion: &FusionPlan, groups: &GroupGraph) -> Classes {
        let mut materialized = SecondaryMap::with_capacity(graph.num_tensors());
        let mut has_output = SecondaryMap::new();
        let mut to_host = SecondaryMap::new();
        for (t, tensor) in graph.tensors() {
            let r = groups.root(t);
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
        Classes { materialized, has_output, to_host }
    }

    /// True when the group rooted at `r` (a root) is a buffer of the activation pool.
    pub fn in_pool(&self, graph: &ComputeGraph, groups: &GroupGraph, r: TensorId) -> bool {
        groups.root(r) == r
            && !graph.tensor(r).role.is_source()
            && self.materialized.contains_key(r)
            && !self.to_host.contains_key(r)
            && !self.has_output.contains_key(r)
    }
}

/// Everything outside the pool, placed.
pub(crate) struct Outside {
    /// Bytes of each region so far (the pool's entry stays 0 here).
    pub region_bytes: [u64; 4],
    /// Region and offset of each alias root placed outside the pool.
    pub root_place: SecondaryMap<TensorId, (Region, u64)>,
    /// Placements made directly (outputs copied from a source).
    pub placement: SecondaryMap<TensorId, Placement>,
    /// Graph outputs whose bytes alias a source: (source root, output) pairs to copy.
    pub output_copies: Vec<(TensorId, TensorId)>,
}

/// Place sources, io and host groups by bumping each region, aligned to `a`.
pub(crate) fn place_outside_pool(graph: &ComputeGraph, groups: &GroupGraph, classes: &Classes, a: u64) -> Outside {
    let mut out = Outside {
        region_bytes: [0; 4],
        root_place: SecondaryMap::new(),
        placement: SecondaryMap::with_capacity(graph.num_tensors()),
        output_copies: Vec::new(),
    };
    let bump = |region: Region, bytes: u64, region_bytes: &mut [u64; 4]| -> u64 {
        let off = region_bytes[region.index()];
        region_bytes[region.index()] = off.saturating_add(align_up(bytes.max(1), a));
        off
    };
    for &t in graph.inputs().iter().chain(graph.weights()) {
        let tensor = graph.tensor(t);
        let region = if tensor.role == TensorRole::Input { Region::Io } else { Region::Weights };
        let off = bump(region, tensor.size_bytes() as u64, &mut out.region_bytes);
        out.root_place.insert(t, (region, off));
    }
    for (t, tensor) in graph.tensors() {
        if groups.root(t) != t || tensor.role.is_source() || !classes.materialized.contains_key(t) {
            continue;
        }
        let region = if classes.to_host.contains_key(t) {
            Region::Host
        } else if classes.has_output.contains_key(t) {
            Region::Io
        } else {
            continue;
        };
        let off = bump(region, tensor.size_bytes() as u64, &mut out.region_bytes);
        out.root_place.insert(t, (region, off));
    }
    for &o in graph.outputs() {
        let r = groups.root(o);
        if graph.tensor(r).role.is_source() {
            let bytes = graph.tensor(o).size_bytes() as u64;
            let off = bump(Region::Io, bytes, &mut out.region_bytes);
            out.placement.insert(o, Placement { region: Region::Io, offset: off, bytes });
            out.output_copies.push((r, o));
        }
    }
    out
}
