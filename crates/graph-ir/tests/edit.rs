#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `ComputeGraph::edit`: re-placing nodes with new inputs and ops, splicing new nodes between them, retyping
//! sources and renaming outputs, and the graph `finish` hands back (creation order topological, consumers,
//! producers and the name maps in step). Misuse gets `GraphError::Edit` and the builder's own errors.

use graph_ir::{synth, ComputeGraph, DType, GraphError, NodeId, Op, TensorId, TensorRole};
use proptest::prelude::*;

const F: DType = DType::F32;
const H: DType = DType::F16;

/// Every structural fact `finish` must restore, checked from scratch: nodes in creation order read only sources
/// and earlier nodes' outputs, each tensor's producer and consumer list match the nodes, and the name maps find
/// every node and tensor.
fn consistent(g: &ComputeGraph) {
    g.validate().unwrap();
    let mut seen: Vec<TensorId> = Vec::new();
    let mut readers: std::collections::HashMap<TensorId, Vec<NodeId>> = Default::default();
    for (n, node) in g.nodes() {
        for &t in &node.inputs {
            assert!(
                g.tensor(t).role.is_source() || seen.contains(&t),
                "'{}' reads '{}' before it is written",
                node.name,
                g.tensor(t).name
            );
            readers.entry(t).or_default().push(n);
        }
        for &o in &node.outputs {
            assert_eq!(g.producer(o), Some(n));
            seen.push(o);
        }
        assert_eq!(g.node_id(&node.name), Some(n));
    }
    for (t, x) in g.tensors() {
        assert_eq!(g.consumers(t), readers.get(&t).map_or(&[][..], Vec::as_slice), "consumers of '{}'", x.name);
        assert_eq!(g.tensor_id(&x.name), Some(t));
    }
}

/// A node as names: its own, its op's, its inputs', and its outputs' with their dtypes.
type NodeSig = (String, &'static str, Vec<String>, Vec<(String, DType)>);

fn names(g: &ComputeGraph) -> Vec<String> {
    g.nodes().map(|(_, n)| n.name.to_string()).collect()
}

/// x -> relu -> add(relu, x) -> out, with a weight w added by a second node.
fn small() -> ComputeGraph {
    let mut g = ComputeGraph::new("small");
    let x = g.add_input("x", F, [2, 3]).unwrap();
    let w = g.add_weight("w", F, [2, 3]).unwrap();
    let r = g.add_node("relu", Op::Relu, &[x]).unwrap()[0];
    let a = g.add_node("add", Op::Add, &[r, x]).unwrap()[0];
    let o = g.add_node("mul", Op::Mul, &[a, w]).unwrap()[0];
    g.mark_output(o).unwrap();
    g
}

#[test]
fn casts_spliced_between_placed_nodes_keep_creation_order_topological() {
    let g = small();
    let id = |n: &str| g.node_id(n).unwrap();
    let (x, w, relu, add, mul) =
        (g.tensor_id("x").unwrap(), g.tensor_id("w").unwrap(), id("relu"), id("add"), id("mul"));
    let mut e = g.clone().edit();
    e.retype_source(x, H, None).unwrap();
    e.retype_source(w, H, None).unwrap();
    e.place(relu, None, &[x]).unwrap();
    let r = e.node(relu).outputs[0];
    assert_eq!(e.tensor(r).dtype, H, "re-inferred from the half input");
    // add computes in f32: both operands widened by spliced casts.
    let r32 = e.add_node("relu.to_f32", Op::Cast { to: F }, &[r], &["relu.to_f32"]).unwrap()[0];
    let x32 = e.add_node("x.to_f32", Op::Cast { to: F }, &[x], &["x.to_f32"]).unwrap()[0];
    e.place(add, None, &[r32, x32]).unwrap();
    // mul computes in half; its output is a graph output declared f32: renamed, and a cast writes the output.
    let a = e.node(add).outputs[0];
    let a16 = e.add_node("add.to_f16", Op::Cast { to: H }, &[a], &["add.to_f16"]).unwrap()[0];
    e.place(mul, None, &[a16, w]).unwrap();
    let m = e.node(mul).outputs[0];
    e.rename_tensor(m, "mul.f16").unwrap();
    let out = e.add_node("mul.cast_out", Op::Cast { to: F }, &[m], &["mul"]).unwrap()[0];
    e.replace_output(m, out).unwrap();
    let g2 = e.finish().unwrap();
    consistent(&g2);
    assert_eq!(names(&g2), ["relu", "relu.to_f32", "x.to_f32", "add", "add.to_f16", "mul", "mul.cast_out"]);
    let t = |n: &str| g2.tensor(g2.tensor_id(n).unwrap());
    assert_eq!((t("x").dtype, t("w").dtype, t("relu").dtype, t("add").dtype, t("mul.f16").dtype), (H, H, H, F, H));
    assert_eq!((t("mul").dtype, t("mul").role, t("mul.f16").role), (F, TensorRole::Output, TensorRole::Intermediate));
    assert_eq!(g2.outputs(), [g2.tensor_id("mul").unwrap()]);
    // x is read by relu and the cast, no longer by add.
    let readers: Vec<&str> =
        g2.consumers(g2.tensor_id("x").unwrap()).iter().map(|&n| g2.node(n).name.as_ref()).collect();
    assert_eq!(readers, ["relu", "x.to_f32"]);
    // The input graph (a clone was edited) is untouched.
    consistent(&g);
    assert_eq!(g.tensor(x).dtype, F);
}

#[test]
fn a_changed_op_is_re_inferred() {
    let mut g = ComputeGraph::new("c");
    let x = g.add_input("x", F, [4]).unwrap();
    let c = g.add_node("c", Op::Cast { to: F }, &[x]).unwrap()[0];
    g.mark_output(c).unwrap();
    let n = g.node_id("c").unwrap();
    let mut e = g.edit();
    e.place(n, Some(Op::Cast { to: DType::BF16 }), &[x]).unwrap();
    let g = e.finish().unwrap();
    consistent(&g);
    assert_eq!(g.tensor(g.tensor_id("c").unwrap()).dtype, DType::BF16);
}

#[test]
fn misuse_is_a_typed_error() {
    let g = small();
    let id = |n: &str| g.node_id(n).unwrap();
    let t = |n: &str| g.tensor_id(n).unwrap();
    let edit_err = |r: Result<(), GraphError>, what: &str| match r {
        Err(GraphError::Edit { detail }) => assert!(detail.contains(what), "{detail}"),
        other => panic!("expected an edit error about {what:?}, got {other:?}"),
    };
    // Placed before the producer of an input.
    let mut e = g.clone().edit();
    edit_err(e.place(id("add"), None, &[t("relu"), t("x")]), "before the producer of its input 'relu'");
    // Placed twice.
    let mut e = g.clone().edit();
    e.place(id("relu"), None, &[t("x")]).unwrap();
    edit_err(e.place(id("relu"), None, &[t("x")]), "placed twice");
    // A node never placed.
    edit_err(e.finish().map(|_| ()), "'add' (and 1 more) was never placed");
    // Sources only, with data exactly for constants.
    let mut e = g.clone().edit();
    edit_err(e.retype_source(t("relu"), H, None), "tensor 'relu' is a Intermediate");
    let mut gc = ComputeGraph::new("k");
    let k = gc.add_constant_f32("k", [2], &[1.0, 2.0]).unwrap();
    let x = gc.add_input("x", F, [2]).unwrap();
    let o = gc.add_node("m", Op::Mul, &[x, k]).unwrap()[0];
    gc.mark_output(o).unwrap();
    let mut e = gc.edit();
    edit_err(e.retype_source(k, H, None), "needs its new data");
    assert!(
        matches!(e.retype_source(k, H, Some(vec![0; 3])), Err(GraphError::ConstantData { tensor, .. }) if tensor == "k")
    );
    e.retype_source(k, H, Some(vec![0; 4])).unwrap();
    // An input whose shape changes the node's output shape.
    let mut g3 = ComputeGraph::new("s");
    let a = g3.add_input("a", F, [2]).unwrap();
    let b = g3.add_input("b", F, [3]).unwrap();
    let r = g3.add_node("r", Op::Relu, &[a]).unwrap()[0];
    g3.mark_output(r).unwrap();
    let n = g3.node_id("r").unwrap();
    let mut e = g3.edit();
    assert!(matches!(e.place(n, None, &[b]), Err(GraphError::DeclaredMismatch { tensor, .. }) if tensor == "r"));
    // Names stay unique; only graph outputs are replaced, by intermediates.
    let mut e = g.clone().edit();
    assert_eq!(e.rename_tensor(t("relu"), "x"), Err(GraphError::DuplicateTensor { name: "x".into() }));
    edit_err(e.replace_output(t("relu"), t("add")), "'relu' is no graph output");
    assert!(matches!(e.replace_output(t("mul"), t("x")), Err(GraphError::OutputNotProduced { .. })));
    // Inference errors name the node.
    let (relu, add, x, r) = (id("relu"), id("add"), t("x"), t("relu"));
    let mut e = g.edit();
    e.place(relu, None, &[x]).unwrap();
    let bad = e.place(add, Some(Op::Cast { to: F }), &[r, x]);
    assert!(matches!(bad, Err(GraphError::Arity { ref node, .. }) if node == "add"), "{bad:?}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// A random DAG with a cast spliced before a random subset of its reads: the edited graph is the one a builder
    /// makes adding the same nodes in the same order (names, ops, input names, dtypes), and is consistent.
    #[test]
    fn splicing_casts_equals_building_in_that_order(n in 2usize..60, fan_in in 1usize..4, seed in 0u64..1000, mask in any::<u64>()) {
        let g = synth::random_dag(n, fan_in, seed).unwrap();
        let order: Vec<NodeId> = g.node_ids().collect();
        let mut e = g.clone().edit();
        let mut rebuilt = ComputeGraph::new(g.name());
        let mut map = std::collections::HashMap::new();
        for &t in g.inputs() {
            let x = g.tensor(t);
            map.insert(t, rebuilt.add_input(&x.name, x.dtype, x.shape.clone()).unwrap());
        }
        for &t in g.weights() {
            let x = g.tensor(t);
            let id = match &x.data {
                Some(d) => rebuilt.add_constant(&x.name, x.dtype, x.shape.clone(), d.to_vec()).unwrap(),
                None => rebuilt.add_weight(&x.name, x.dtype, x.shape.clone()).unwrap(),
            };
            map.insert(t, id);
        }
        let mut bit = 0;
        for &n in &order {
            let node = g.node(n).clone();
            let mut ins = Vec::new();
            let mut rins = Vec::new();
            for (i, &t) in node.inputs.iter().enumerate() {
                bit = (bit + 1) % 64;
                if mask >> bit & 1 == 1 && g.tensor(t).dtype.is_float() {
                    let name = format!("{}.cast{i}", node.name);
                    ins.push(e.add_node(&name, Op::Cast { to: F }, &[t], &[&name]).unwrap()[0]);
                    rins.push(rebuilt.add_node_named(&name, Op::Cast { to: F }, &[map[&t]], &[&name]).unwrap()[0]);
                } else {
                    ins.push(t);
                    rins.push(map[&t]);
                }
            }
            e.place(n, None, &ins).unwrap();
            let onames: Vec<&str> = node.outputs.iter().map(|&o| g.tensor(o).name.as_ref()).collect();
            let outs = rebuilt.add_node_named(&node.name, node.op.clone(), &rins, &onames).unwrap();
            for (&o, r) in node.outputs.iter().zip(outs) {
                map.insert(o, r);
            }
        }
        for &o in g.outputs() {
            rebuilt.mark_output(map[&o]).unwrap();
        }
        let edited = e.finish().unwrap();
        consistent(&edited);
        prop_assert_eq!(names(&edited), names(&rebuilt));
        let sig = |g: &ComputeGraph| -> Vec<NodeSig> {
            g.nodes()
                .map(|(_, n)| {
                    let ins = n.inputs.iter().map(|&t| g.tensor(t).name.to_string()).collect();
                    let outs = n.outputs.iter().map(|&t| (g.tensor(t).name.to_string(), g.tensor(t).dtype)).collect();
                    (n.name.to_string(), n.op.name(), ins, outs)
                })
                .collect()
        };
        prop_assert_eq!(sig(&edited), sig(&rebuilt));
        let outs = |g: &ComputeGraph| g.outputs().iter().map(|&t| g.tensor(t).name.clone()).collect::<Vec<_>>();
        prop_assert_eq!(outs(&edited), outs(&rebuilt));
    }
}
