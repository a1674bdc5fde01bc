//! The liveness pass: when each tensor is written and last read, and which tensors share bytes.
//!
//! Steps are positions in an execution order (node positions from `topo`, or launch positions once nodes are
//! fused: `analyse_steps` takes any node -> step map). A lifetime is the half-open interval
//! `[write step, last read step + 1)`. Sources (inputs, weights, constants) live from step 0; graph outputs live to
//! the end. A view's output aliases its input's bytes: alias groups are found with one pass in topological
//! order (each view joins its input's root), and a group's lifetime is the union of its members'. O(N + E).

use graph_ir::{ComputeGraph, NodeId, TensorId, TensorRole};
use serde::{Deserialize, Serialize};
use slotmap::SecondaryMap;

use crate::topo::TopoOrder;

/// A half-open interval of steps `[start, end)`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Lifetime {
    /// First step (inclusive).
    pub start: u32,
    /// One past the last step.
    pub end: u32,
}

impl Lifetime {
    /// True when the two intervals share a step. `[0, 3)` and `[3, 5)` do not.
    pub fn overlaps(&self, other: &Lifetime) -> bool {
        self.start < other.end && other.start < self.end
    }

    /// The smallest interval covering both.
    pub fn union(&self, other: &Lifetime) -> Lifetime {
        Lifetime { start: self.start.min(other.start), end: self.end.max(other.end) }
    }

    /// Number of steps covered.
    pub fn len(&self) -> u32 {
        self.end.saturating_sub(self.start)
    }

    /// True when no step is covered.
    pub fn is_empty(&self) -> bool {
        self.end <= self.start
    }
}

/// Lifetimes of every tensor and of every alias group.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Liveness {
    /// Number of steps in the order the lifetimes refer to.
    pub num_steps: u32,
    /// The alias root of every tensor (itself unless it is a view's output).
    pub root: SecondaryMap<TensorId, TensorId>,
    /// Each tensor's own lifetime.
    pub tensor: SecondaryMap<TensorId, Lifetime>,
    /// For alias roots: the union of the lifetimes of every member of the group.
    pub group: SecondaryMap<TensorId, Lifetime>,
}

impl Liveness {
    /// The lifetime of the alias group `t` belongs to.
    pub fn group_of(&self, t: TensorId) -> Lifetime {
        self.group[self.root[t]]
    }
}

/// Node-level liveness over a topological order.
pub fn analyse(graph: &ComputeGraph, order: &TopoOrder) -> Liveness {
    let _span = tracing::debug_span!("liveness").entered();
    analyse_steps(graph, &order.order, &order.position, order.len() as u32)
}

/// Liveness for any step assignment: `order` lists the nodes in a topological order, `step[n]` is the step at
/// which node `n` runs (several nodes may share a step, e.g. when fused into one launch), `num_steps` bounds them.
pub fn analyse_steps(
    graph: &ComputeGraph,
    order: &[NodeId],
    step: &SecondaryMap<NodeId, u32>,
    num_steps: u32,
) -> Liveness {
    let mut root: SecondaryMap<TensorId, TensorId> = SecondaryMap::with_capacity(graph.num_tensors());
    let mut tensor: SecondaryMap<TensorId, Lifetime> = SecondaryMap::with_capacity(graph.num_tensors());
    for (id, t) in graph.tensors() {
        root.insert(id, id);
        let lt = if t.role.is_source() { Lifetime { start: 0, end: 1 } } else { Lifetime { start: u32::MAX, end: 0 } };
        tensor.insert(id, lt);
    }
    for &n in order {
        let node = graph.node(n);
        let s = step[n];
        for &o in &node.outputs {
            let lt = &mut tensor[o];
            lt.start = lt.start.min(s);
            lt.end = lt.end.max(s + 1);
        }
        for &i in &node.inputs {
            let lt = &mut tensor[i];
            lt.end = lt.end.max(s + 1);
        }
        if node.op.is_view() {
            if let (Some(&i), Some(&o)) = (node.inputs.first(), node.outputs.first()) {
                let r = root[i];
                root.insert(o, r);
            }
        }
    }
    for (id, t) in graph.tensors() {
        let lt = &mut tensor[id];
        if t.role == TensorRole::Output {
            lt.end = num_steps.max(lt.end);
        }
        if lt.start == u32::MAX {
            // Never written nor a source: cannot happen in a validated graph; keep an empty interval.
            *lt = Lifetime { start: 0, end: 0 };
        }
        if lt.end <= lt.start {
            // Written but never read: it still occupies its bytes during the writing step.
            lt.end = lt.start + 1;
        }
    }
    let mut group: SecondaryMap<TensorId, Lifetime> = SecondaryMap::with_capacity(graph.num_tensors());
    for (id, _) in graph.tensors() {
        let r = root[id];
        let lt = tensor[id];
        match group.get_mut(r) {
            Some(g) => *g = g.union(&lt),
            None => {
                group.insert(r, lt);
            }
        }
    }
    Liveness { num_steps, root, tensor, group }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topo;
    use graph_ir::{DType, Op};

    #[test]
    fn overlaps_at_the_edges() {
        let a = Lifetime { start: 0, end: 3 };
        assert!(!a.overlaps(&Lifetime { start: 3, end: 5 }));
        assert!(a.overlaps(&Lifetime { start: 2, end: 5 }));
        assert!(!a.overlaps(&Lifetime { start: 5, end: 5 }));
        assert_eq!(a.union(&Lifetime { start: 4, end: 6 }), Lifetime { start: 0, end: 6 });
    }

    #[test]
    fn chain_with_view_exact() {
        // x -> a(relu) -> v(reshape, view) -> b(neg) -> c(abs, output); a also feeds d(exp) read late.
        let mut g = ComputeGraph::new("l");
        let x = g.add_input("x", DType::F32, [2, 2]).unwrap();
        let a = g.add_node("a", Op::Relu, &[x]).unwrap()[0];
        let v = g.add_node("v", Op::Reshape { shape: vec![4], allowzero: false }, &[a]).unwrap()[0];
        let b = g.add_node("b", Op::Neg, &[v]).unwrap()[0];
        let c = g.add_node("c", Op::Abs, &[b]).unwrap()[0];
        g.mark_output(c).unwrap();
        let order = topo::analyse(&g).unwrap();
        let l = analyse(&g, &order);
        assert_eq!(l.num_steps, 4);
        assert_eq!(l.tensor[x], Lifetime { start: 0, end: 1 });
        assert_eq!(l.tensor[a], Lifetime { start: 0, end: 2 });
        assert_eq!(l.tensor[v], Lifetime { start: 1, end: 3 });
        assert_eq!(l.tensor[b], Lifetime { start: 2, end: 4 });
        assert_eq!(l.tensor[c], Lifetime { start: 3, end: 4 });
        assert_eq!(l.root[v], a);
        assert_eq!(l.group_of(v), Lifetime { start: 0, end: 3 });
        assert_eq!(l.group_of(a), l.group_of(v));
    }
}
