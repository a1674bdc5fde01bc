//! Regions: where each alias group goes, decided from roles, producers and the fusion plan alone, and the
//! placement of everything outside the activation pool by bumping (in declaration, then tensor, order).
//!
//! Sources go to `Weights` (weights, constants) or `Io` (graph inputs); alias groups holding a graph output go
//! to `Io`; results of a Memcpy to the host go to `Host`; every other materialised alias group is a buffer of the
//! pool. A graph output whose bytes alias a source gets its own `Io` bytes and a copy. O(N).

use graph_ir::{ComputeGraph, Op, TensorId, TensorRole};
use serde::{Deserialize, Serialize};
use slotmap::SecondaryMap;
use std::collections::BTreeMap;

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
        for (t, _) in graph.tensors() {
            if fusion.is_materialized(graph, t) {
                materialized.insert(groups.root(t), ());
            }
        }
        let (has_output, to_host) = output_classes(graph, |t| groups.root(t));
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

/// What an outside-pool slot holds (the name the set layout keys it by is the tensor's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SlotKind {
    /// A source (graph input, weight or constant): its alias group's root.
    Source,
    /// The root of an alias group holding a graph output (or a Memcpy-to-host result).
    Root,
    /// A graph output whose bytes alias a source: its own bytes, filled by a copy.
    OutputCopy,
}

/// Roots of groups holding a graph output, and roots of groups written by a Memcpy to the host.
fn output_classes(
    graph: &ComputeGraph,
    root: impl Fn(TensorId) -> TensorId,
) -> (SecondaryMap<TensorId, ()>, SecondaryMap<TensorId, ()>) {
    let mut has_output = SecondaryMap::new();
    let mut to_host = SecondaryMap::new();
    for (t, tensor) in graph.tensors() {
        if tensor.role == TensorRole::Output {
            has_output.insert(root(t), ());
        }
        if let Some(p) = tensor.producer {
            if matches!(graph.node(p).op, Op::Memcpy { to: graph_ir::op::MemSpace::Host }) {
                to_host.insert(root(t), ());
            }
        }
    }
    (has_output, to_host)
}

/// Every tensor placed outside the pool, with its region, in placement order. `root` maps a tensor to its alias
/// root; `materialized` says whether a non-source root needs memory. One owner: the memory pass places these
/// slots and [`outside_slots`] lists them for a plan set's shared layout.
pub(crate) fn slots(
    graph: &ComputeGraph,
    root: impl Fn(TensorId) -> TensorId,
    materialized: impl Fn(TensorId) -> bool,
) -> Vec<(TensorId, Region, SlotKind)> {
    let mut out = Vec::new();
    for &t in graph.inputs().iter().chain(graph.weights()) {
        let region = if graph.tensor(t).role == TensorRole::Input { Region::Io } else { Region::Weights };
        out.push((t, region, SlotKind::Source));
    }
    let (has_output, to_host) = output_classes(graph, &root);
    for (t, tensor) in graph.tensors() {
        if root(t) != t || tensor.role.is_source() || !materialized(t) {
            continue;
        }
        if to_host.contains_key(t) {
            out.push((t, Region::Host, SlotKind::Root));
        } else if has_output.contains_key(t) {
            out.push((t, Region::Io, SlotKind::Root));
        }
    }
    for &o in graph.outputs() {
        if graph.tensor(root(o)).role.is_source() {
            out.push((o, Region::Io, SlotKind::OutputCopy));
        }
    }
    out
}

/// Place sources, io and host groups: by bumping each region, aligned to `a`, or at the offsets of a plan
/// set's shared `layout` (weights and io; host memory is per plan and always bumped).
pub(crate) fn place_outside_pool(
    graph: &ComputeGraph,
    groups: &GroupGraph,
    classes: &Classes,
    a: u64,
    layout: Option<&SharedLayout>,
) -> Result<Outside, String> {
    let mut out = Outside {
        region_bytes: [0; 4],
        root_place: SecondaryMap::new(),
        placement: SecondaryMap::with_capacity(graph.num_tensors()),
        output_copies: Vec::new(),
    };
    if let Some(l) = layout {
        out.region_bytes[Region::Weights.index()] = l.weights_bytes;
        out.region_bytes[Region::Io.index()] = l.io_bytes;
    }
    let slots = slots(graph, |t| groups.root(t), |r| classes.materialized.contains_key(r));
    for (t, region, kind) in slots {
        let tensor = graph.tensor(t);
        let bytes = tensor.size_bytes() as u64;
        let off = match (layout, region) {
            (Some(l), Region::Weights | Region::Io) => {
                let Some(&off) = l.slot(region).get(&*tensor.name) else {
                    return Err(format!(
                        "the shared layout has no {} slot for tensor '{}'",
                        region.name(),
                        tensor.name
                    ));
                };
                if off.saturating_add(bytes) > out.region_bytes[region.index()] {
                    return Err(format!(
                        "tensor '{}' ({bytes} bytes at {off}) does not fit the shared {} region of {} bytes",
                        tensor.name,
                        region.name(),
                        out.region_bytes[region.index()]
                    ));
                }
                off
            }
            _ => {
                let off = out.region_bytes[region.index()];
                out.region_bytes[region.index()] = off.saturating_add(align_up(bytes.max(1), a));
                off
            }
        };
        match kind {
            SlotKind::Source | SlotKind::Root => {
                out.root_place.insert(t, (region, off));
            }
            SlotKind::OutputCopy => {
                out.placement.insert(t, Placement { region, offset: off, bytes });
                out.output_copies.push((groups.root(t), t));
            }
        }
    }
    Ok(out)
}

/// The addresses a plan set fixes for all its members: each weight, constant, graph input and io root at one
/// offset of the shared weights and io regions (keyed by tensor name), and those regions' sizes. A member's
/// memory pass places its sources and outputs there instead of bumping, so a captured graph of every member
/// sees the same weight and io addresses.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedLayout {
    /// Offset of each tensor of the weights region, by name.
    pub weights: BTreeMap<String, u64>,
    /// Offset of each tensor of the io region, by name.
    pub io: BTreeMap<String, u64>,
    /// Bytes of the shared weights region.
    pub weights_bytes: u64,
    /// Bytes of the shared io region.
    pub io_bytes: u64,
}

impl SharedLayout {
    /// The offsets of `region` (weights or io; empty for the others).
    pub fn slot(&self, region: Region) -> &BTreeMap<String, u64> {
        static EMPTY: BTreeMap<String, u64> = BTreeMap::new();
        match region {
            Region::Weights => &self.weights,
            Region::Io => &self.io,
            _ => &EMPTY,
        }
    }
}

/// One tensor a plan places outside the pool, as a plan set's layout needs to know it before planning.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutsideSlot {
    /// The tensor's name.
    pub name: String,
    /// Its region (weights, io or host).
    pub region: Region,
    /// Its bytes.
    pub bytes: u64,
    /// A constant's bytes (weights without data and inputs: `None`), so that equal constants can share a slot.
    pub data: Option<Vec<u8>>,
}

/// The tensors a plan of `graph` places outside the pool, in placement order: what the memory pass will place
/// (graph-level facts: sources, alias roots of outputs, copies of outputs that alias a source).
pub fn outside_slots(graph: &ComputeGraph, order: &crate::topo::TopoOrder) -> Vec<OutsideSlot> {
    let roots = crate::group_graph::alias_roots(graph, order);
    // Every output root is materialised (an output always is); other non-source roots are not placed here.
    slots(graph, |t| roots[t], |_| true)
        .into_iter()
        .map(|(t, region, _)| {
            let tensor = graph.tensor(t);
            OutsideSlot {
                name: tensor.name.to_string(),
                region,
                bytes: tensor.size_bytes() as u64,
                data: if tensor.role == TensorRole::Constant {
                    tensor.data.as_deref().map(<[u8]>::to_vec)
                } else {
                    None
                },
            }
        })
        .collect()
}
