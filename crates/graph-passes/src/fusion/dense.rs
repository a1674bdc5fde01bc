//! A dense, view-transparent picture of the graph for the fusion pass: nodes by topological position, data
//! edges between non-view nodes looking through views, and who reads each tensor's bytes.

use graph_ir::{ComputeGraph, NodeId, Op, OpCategory, TensorId, TensorRole};
use slotmap::SecondaryMap;

use crate::topo::TopoOrder;

/// Sentinel for "no node".
pub(super) const NONE: u32 = u32::MAX;

/// Who reads a tensor's bytes, through views.
#[derive(Clone, Debug, Default)]
pub(super) struct Readers {
    /// Non-view nodes reading the tensor or a view of it, ascending positions, deduplicated.
    pub cons: Vec<u32>,
    /// The tensor or a view of it is a graph output.
    pub output: bool,
}

/// The graph as the fusion pass sees it.
pub(super) struct Dense<'g> {
    pub graph: &'g ComputeGraph,
    /// Node at each topological position.
    pub ids: Vec<NodeId>,
    /// Category of each node.
    pub cat: Vec<OpCategory>,
    /// Alias root of every tensor (itself unless a view's output).
    pub root: SecondaryMap<TensorId, TensorId>,
    /// Position of the non-view node whose kernel writes each tensor's bytes; absent for sources and views of
    /// sources.
    pub kprod: SecondaryMap<TensorId, u32>,
    /// Readers of each alias root.
    pub readers: SecondaryMap<TensorId, Readers>,
    /// Non-view consumers of each non-view node (through views), ascending, deduplicated.
    pub succ: Vec<Vec<u32>>,
}

impl<'g> Dense<'g> {
    pub fn new(graph: &'g ComputeGraph, order: &TopoOrder) -> Self {
        let n = order.order.len();
        let ids = order.order.clone();
        let cat: Vec<OpCategory> = ids.iter().map(|&id| graph.node(id).op.category()).collect();
        let mut root: SecondaryMap<TensorId, TensorId> = SecondaryMap::with_capacity(graph.num_tensors());
        let mut kprod: SecondaryMap<TensorId, u32> = SecondaryMap::with_capacity(graph.num_tensors());
        for (t, _) in graph.tensors() {
            root.insert(t, t);
        }
        for (i, &id) in ids.iter().enumerate() {
            let node = graph.node(id);
            if cat[i] == OpCategory::View {
                if let (Some(&x), Some(&y)) = (node.inputs.first(), node.outputs.first()) {
                    let r = root[x];
                    root.insert(y, r);
                    if let Some(&p) = kprod.get(x) {
                        kprod.insert(y, p);
                    }
                }
            } else {
                for &t in &node.outputs {
                    kprod.insert(t, i as u32);
                }
            }
        }
        let mut readers: SecondaryMap<TensorId, Readers> = SecondaryMap::with_capacity(graph.num_tensors());
        let mut succ: Vec<Vec<u32>> = vec![Vec::new(); n];
        for (i, &id) in ids.iter().enumerate() {
            if cat[i] == OpCategory::View {
                continue;
            }
            for &t in &graph.node(id).inputs {
                let r = root[t];
                match readers.get_mut(r) {
                    Some(x) => x.cons.push(i as u32),
                    None => {
                        readers.insert(r, Readers { cons: vec![i as u32], output: false });
                    }
                }
                if let Some(&p) = kprod.get(t) {
                    succ[p as usize].push(i as u32);
                }
            }
        }
        for &o in graph.outputs() {
            let r = root[o];
            match readers.get_mut(r) {
                Some(x) => x.output = true,
                None => {
                    readers.insert(r, Readers { cons: Vec::new(), output: true });
                }
            }
        }
        for (_, x) in readers.iter_mut() {
            x.cons.dedup();
        }
        for s in &mut succ {
            s.dedup();
        }
        Dense { graph, ids, cat, root, kprod, readers, succ }
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn op(&self, i: u32) -> &'g Op {
        &self.graph.node(self.ids[i as usize]).op
    }

    pub fn name(&self, i: u32) -> &'g str {
        &self.graph.node(self.ids[i as usize]).name
    }

    pub fn inputs(&self, i: u32) -> &'g [TensorId] {
        &self.graph.node(self.ids[i as usize]).inputs
    }

    pub fn outputs(&self, i: u32) -> &'g [TensorId] {
        &self.graph.node(self.ids[i as usize]).outputs
    }

    pub fn is_view(&self, i: u32) -> bool {
        self.cat[i as usize] == OpCategory::View
    }

    /// Readers of `t`'s bytes (through views).
    pub fn readers(&self, t: TensorId) -> Option<&Readers> {
        self.readers.get(self.root[t])
    }

    /// The kernel producer of `t` (through views), if produced.
    pub fn producer(&self, t: TensorId) -> Option<u32> {
        self.kprod.get(t).copied()
    }

    pub fn bytes(&self, t: TensorId) -> u64 {
        self.graph.tensor(t).size_bytes() as u64
    }

    pub fn numel(&self, t: TensorId) -> u64 {
        self.graph.tensor(t).shape.numel().map_or(u64::MAX, |v| v as u64)
    }

    /// True when `t` or a view of it is a graph output.
    pub fn is_output(&self, t: TensorId) -> bool {
        self.graph.tensor(t).role == TensorRole::Output || self.readers(t).is_some_and(|r| r.output)
    }
}
