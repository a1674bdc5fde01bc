//! The topo pass: a deterministic topological order of the nodes.
//!
//! Kahn's algorithm with the node's creation index as the tie-break (a min-heap of ready nodes), so the order is
//! the creation order whenever that order is already topological (as the builder guarantees) and stable
//! otherwise. O((N + E) log N); with creation order topological the heap stays small.

use graph_ir::{ComputeGraph, GraphError, GraphResult, NodeId};
use serde::{Deserialize, Serialize};
use slotmap::SecondaryMap;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// A topological order of the graph's nodes and each node's position in it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TopoOrder {
    /// Nodes in execution order.
    pub order: Vec<NodeId>,
    /// Position of each node in `order`.
    pub position: SecondaryMap<NodeId, u32>,
}

impl TopoOrder {
    /// Build from an explicit order (checked to be a permutation of the graph's nodes in topological order).
    pub fn from_order(graph: &ComputeGraph, order: Vec<NodeId>) -> GraphResult<TopoOrder> {
        let mut position = SecondaryMap::with_capacity(order.len());
        for (i, &n) in order.iter().enumerate() {
            position.insert(n, i as u32);
        }
        for &n in &order {
            for &t in &graph.node(n).inputs {
                if let Some(p) = graph.producer(t) {
                    if !position.contains_key(p) || position[p] >= position[n] {
                        return Err(GraphError::Cycle {
                            nodes: vec![graph.node(p).name.to_string(), graph.node(n).name.to_string()],
                        });
                    }
                }
            }
        }
        Ok(TopoOrder { order, position })
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// True when the graph has no nodes.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }
}

/// Compute the stable topological order of `graph`.
pub fn analyse(graph: &ComputeGraph) -> GraphResult<TopoOrder> {
    let _span = tracing::debug_span!("topo").entered();
    let index: SecondaryMap<NodeId, u32> = graph.node_ids().enumerate().map(|(i, id)| (id, i as u32)).collect();
    let ids: Vec<NodeId> = graph.node_ids().collect();
    // Creation order is usually topological (a graph built op by op, an ONNX file in its order): then the
    // smallest-index-first order below is the creation order itself (the smallest node not yet placed has every
    // producer placed), found in one pass over the inputs, without the heap or the consumer walk.
    if in_creation_order(graph, &ids, &index) {
        return Ok(TopoOrder { order: ids, position: index });
    }
    kahn(graph, ids, &index)
}

/// Whether every node's producers were created before it.
fn in_creation_order(graph: &ComputeGraph, ids: &[NodeId], index: &SecondaryMap<NodeId, u32>) -> bool {
    ids.iter().enumerate().all(|(i, &id)| {
        graph
            .node(id)
            .inputs
            .iter()
            .all(|&t| graph.producer(t).is_none_or(|p| index.get(p).is_some_and(|&j| j < i as u32)))
    })
}

/// Kahn's algorithm, the smallest ready creation index first.
fn kahn(graph: &ComputeGraph, ids: Vec<NodeId>, index: &SecondaryMap<NodeId, u32>) -> GraphResult<TopoOrder> {
    let n = ids.len();
    let mut indeg = vec![0u32; n];
    for (i, &id) in ids.iter().enumerate() {
        for &t in &graph.node(id).inputs {
            if graph.producer(t).is_some() {
                indeg[i] += 1;
            }
        }
    }
    let mut ready: BinaryHeap<Reverse<u32>> = (0..n as u32).filter(|&i| indeg[i as usize] == 0).map(Reverse).collect();
    let mut order = Vec::with_capacity(n);
    let mut position = SecondaryMap::with_capacity(n);
    while let Some(Reverse(i)) = ready.pop() {
        let id = ids[i as usize];
        position.insert(id, order.len() as u32);
        order.push(id);
        for &t in &graph.node(id).outputs {
            for &c in graph.consumers(t) {
                let ci = index[c] as usize;
                indeg[ci] -= 1;
                if indeg[ci] == 0 {
                    ready.push(Reverse(ci as u32));
                }
            }
        }
    }
    if order.len() != n {
        // Unreachable for graphs built through the builder (inputs precede consumers); reported all the same.
        let stuck: Vec<String> = ids
            .iter()
            .enumerate()
            .filter(|(i, _)| indeg[*i] > 0)
            .map(|(_, &id)| graph.node(id).name.to_string())
            .collect();
        return Err(GraphError::Cycle { nodes: stuck });
    }
    Ok(TopoOrder { order, position })
}

#[cfg(test)]
mod tests {
    use super::*;
    use graph_ir::{synth, DType, Op};

    #[test]
    fn creation_order_is_kept() {
        let g = synth::transformer(1, 16, 2, 4, 1).unwrap();
        let t = analyse(&g).unwrap();
        let ids: Vec<NodeId> = g.node_ids().collect();
        assert_eq!(t.order, ids);
        for (i, &n) in t.order.iter().enumerate() {
            assert_eq!(t.position[n], i as u32);
        }
    }

    proptest::proptest! {
        /// On graphs built op by op (creation order topological), the fast path's order is Kahn's smallest-index
        /// -first order, positions included.
        #[test]
        fn the_creation_order_is_kahns_order(n in 1usize..400, fan_in in 1usize..5, seed in proptest::prelude::any::<u64>()) {
            let g = synth::random_dag(n, fan_in, seed).unwrap();
            let ids: Vec<NodeId> = g.node_ids().collect();
            let index: SecondaryMap<NodeId, u32> = ids.iter().enumerate().map(|(i, &id)| (id, i as u32)).collect();
            proptest::prop_assert!(in_creation_order(&g, &ids, &index));
            let fast = analyse(&g).unwrap();
            let slow = kahn(&g, ids, &index).unwrap();
            proptest::prop_assert_eq!(&fast.order, &slow.order);
            for &id in &fast.order {
                proptest::prop_assert_eq!(fast.position[id], slow.position[id]);
            }
        }
    }

    #[test]
    fn diamond_order_exact() {
        let mut g = ComputeGraph::new("d");
        let x = g.add_input("x", DType::F32, [4]).unwrap();
        let a = g.add_node("a", Op::Relu, &[x]).unwrap()[0];
        let b = g.add_node("b", Op::Neg, &[a]).unwrap()[0];
        let c = g.add_node("c", Op::Abs, &[a]).unwrap()[0];
        let d = g.add_node("d", Op::Add, &[b, c]).unwrap()[0];
        g.mark_output(d).unwrap();
        let t = analyse(&g).unwrap();
        let names: Vec<&str> = t.order.iter().map(|&n| g.node(n).name.as_ref()).collect();
        assert_eq!(names, ["a", "b", "c", "d"]);
        // A custom order must be topological.
        let bad = vec![t.order[1], t.order[0], t.order[2], t.order[3]];
        assert!(matches!(TopoOrder::from_order(&g, bad), Err(GraphError::Cycle { .. })));
    }
}
