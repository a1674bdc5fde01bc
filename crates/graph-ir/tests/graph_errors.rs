#![allow(clippy::unwrap_used, clippy::expect_used)]
//! One test per `GraphError` variant raised by the builder, the loader and validation, asserting the variant and
//! the names it carries.

use graph_ir::json::from_json;
use graph_ir::op::ConvAttrs;
use graph_ir::{ComputeGraph, DType, GraphError, Limits, Op};

const F: DType = DType::F32;

#[test]
fn empty_graph_and_no_outputs() {
    let g = ComputeGraph::new("e");
    assert_eq!(g.validate(), Err(GraphError::EmptyGraph { graph: "e".into() }));
    let mut g = ComputeGraph::new("n");
    let x = g.add_input("x", F, [2]).unwrap();
    g.add_node("r", Op::Relu, &[x]).unwrap();
    assert_eq!(g.validate(), Err(GraphError::NoOutputs { graph: "n".into() }));
}

#[test]
fn duplicate_names() {
    let mut g = ComputeGraph::new("d");
    let x = g.add_input("x", F, [2]).unwrap();
    assert_eq!(g.add_weight("x", F, [2]), Err(GraphError::DuplicateTensor { name: "x".into() }));
    g.add_node("r", Op::Relu, &[x]).unwrap();
    assert_eq!(g.add_node("r", Op::Relu, &[x]), Err(GraphError::DuplicateNode { name: "r".into() }));
    // output name collides with an existing tensor
    assert_eq!(g.add_node_named("r2", Op::Relu, &[x], &["x"]), Err(GraphError::DuplicateTensor { name: "x".into() }));
    // a failed add leaves the graph unchanged
    assert_eq!(g.num_nodes(), 1);
    assert!(g.node_id("r2").is_none());
    assert_eq!(g.add_input("", F, [1]), Err(GraphError::InvalidName { what: "tensor", name: String::new() }));
}

#[test]
fn arity_and_output_count() {
    let mut g = ComputeGraph::new("a");
    let x = g.add_input("x", F, [2]).unwrap();
    assert_eq!(
        g.add_node("add", Op::Add, &[x]),
        Err(GraphError::Arity { node: "add".into(), op: "Add", expected: "2".into(), got: 1 })
    );
    assert_eq!(
        g.add_node_named("r", Op::Relu, &[x], &["a", "b"]),
        Err(GraphError::OutputCount { node: "r".into(), op: "Relu", expected: 1, got: 2 })
    );
}

#[test]
fn shape_dtype_attribute_errors_name_the_node() {
    let mut g = ComputeGraph::new("s");
    let a = g.add_input("a", F, [2, 3]).unwrap();
    let b = g.add_input("b", F, [4, 5]).unwrap();
    let i = g.add_input("i", DType::I32, [2, 3]).unwrap();
    match g.add_node("mm", Op::MatMul, &[a, b]) {
        Err(GraphError::ShapeMismatch { node, op, detail }) => {
            assert_eq!((node.as_str(), op), ("mm", "MatMul"));
            assert!(detail.contains("[2,3]") && detail.contains("[4,5]"), "{detail}");
        }
        other => panic!("{other:?}"),
    }
    assert!(
        matches!(g.add_node("add", Op::Add, &[a, i]), Err(GraphError::DTypeMismatch { node, .. }) if node == "add")
    );
    assert!(matches!(
        g.add_node("sm", Op::Softmax { axis: 5 }, &[a]),
        Err(GraphError::InvalidAttribute { node, attr: "axis", .. }) if node == "sm"
    ));
    let w = g.add_weight("w", F, [4, 3, 3, 3]).unwrap();
    let img = g.add_input("img", F, [1, 2, 8, 8]).unwrap();
    assert!(matches!(
        g.add_node("conv", Op::Conv(ConvAttrs::default()), &[img, w]),
        Err(GraphError::ShapeMismatch { node, op: "Conv", .. }) if node == "conv"
    ));
}

#[test]
fn size_overflow_and_limits() {
    let mut g = ComputeGraph::new("o");
    assert_eq!(
        g.add_input("huge", F, [1usize << 62]),
        Err(GraphError::SizeOverflow {
            tensor: "huge".into(),
            shape: format!("[{}]", 1usize << 62),
            dtype: "f32".into()
        })
    );
    assert!(matches!(
        g.add_input("deep", F, vec![1usize; 65]),
        Err(GraphError::RankTooLarge { rank: 65, limit: 64, .. })
    ));
    let mut small = ComputeGraph::with_limits("l", Limits { max_nodes: 1, ..Limits::default() });
    let x = small.add_input("x", F, [2]).unwrap();
    small.add_node("a", Op::Relu, &[x]).unwrap();
    assert!(matches!(small.add_node("b", Op::Relu, &[x]), Err(GraphError::LimitExceeded { .. })));
}

#[test]
fn outputs_must_be_produced_once() {
    let mut g = ComputeGraph::new("o");
    let x = g.add_input("x", F, [2]).unwrap();
    assert_eq!(g.mark_output(x), Err(GraphError::OutputNotProduced { tensor: "x".into() }));
    let y = g.add_node("r", Op::Relu, &[x]).unwrap()[0];
    g.mark_output(y).unwrap();
    assert_eq!(g.mark_output(y), Err(GraphError::DuplicateOutput { tensor: "r".into() }));
}

#[test]
fn constants_are_checked() {
    let mut g = ComputeGraph::new("c");
    assert!(matches!(
        g.add_constant("c", F, [2], vec![0; 4]),
        Err(GraphError::ConstantData { tensor, .. }) if tensor == "c"
    ));
    assert!(matches!(
        g.add_constant("b", DType::Bool, [1], vec![2]),
        Err(GraphError::ConstantData { tensor, .. }) if tensor == "b"
    ));
    g.add_constant_f32("ok", [2], &[1.0, 2.0]).unwrap();
}

fn doc(nodes: &str, outputs: &str) -> String {
    format!(
        r#"{{"format": "cuplan-graph", "version": 1, "name": "t",
  "inputs": [{{"name": "x", "dtype": "f32", "shape": [2, 3]}}],
  "nodes": [{nodes}],
  "outputs": [{outputs}]}}"#
    )
}

#[test]
fn loader_reports_graph_structure_errors_by_name() {
    let unknown = doc(r#"{"name": "a", "op": "Relu", "inputs": ["nope"]}"#, r#""a""#);
    assert_eq!(from_json(&unknown).unwrap_err(), GraphError::UnknownTensor { node: "a".into(), tensor: "nope".into() });

    let double = doc(
        r#"{"name": "a", "op": "Relu", "inputs": ["x"], "outputs": ["t"]},
           {"name": "b", "op": "Neg", "inputs": ["x"], "outputs": ["t"]}"#,
        r#""t""#,
    );
    assert_eq!(
        from_json(&double).unwrap_err(),
        GraphError::DoubleProducer { tensor: "t".into(), first: "a".into(), second: "b".into() }
    );

    let writes_input = doc(r#"{"name": "a", "op": "Relu", "inputs": ["x"], "outputs": ["x"]}"#, r#""x""#);
    assert!(
        matches!(from_json(&writes_input).unwrap_err(), GraphError::WritesSource { node, role: "input", .. } if node == "a")
    );

    let cycle = doc(
        r#"{"name": "a", "op": "Add", "inputs": ["x", "c"], "outputs": ["a_out"]},
           {"name": "b", "op": "Relu", "inputs": ["a_out"], "outputs": ["b_out"]},
           {"name": "c", "op": "Neg", "inputs": ["b_out"], "outputs": ["c"]}"#,
        r#""c""#,
    );
    match from_json(&cycle).unwrap_err() {
        GraphError::Cycle { nodes } => {
            assert_eq!(nodes.len(), 3);
            // Data-flow order along the cycle, starting anywhere: a -> b -> c -> a.
            let start = nodes.iter().position(|n| n == "a").unwrap();
            let rotated: Vec<&str> = (0..3).map(|i| nodes[(start + i) % 3].as_str()).collect();
            assert_eq!(rotated, ["a", "b", "c"]);
        }
        other => panic!("{other:?}"),
    }

    let self_loop = doc(r#"{"name": "s", "op": "Relu", "inputs": ["s"]}"#, r#""s""#);
    assert_eq!(from_json(&self_loop).unwrap_err(), GraphError::Cycle { nodes: vec!["s".into()] });

    let never = doc(r#"{"name": "a", "op": "Relu", "inputs": ["x"]}"#, r#""zzz""#);
    assert_eq!(from_json(&never).unwrap_err(), GraphError::OutputNotProduced { tensor: "zzz".into() });

    let empty = doc("", "");
    assert_eq!(from_json(&empty).unwrap_err(), GraphError::EmptyGraph { graph: "t".into() });

    let dup_node = doc(
        r#"{"name": "a", "op": "Relu", "inputs": ["x"], "outputs": ["p"]},
           {"name": "a", "op": "Neg", "inputs": ["x"], "outputs": ["q"]}"#,
        r#""p""#,
    );
    assert_eq!(from_json(&dup_node).unwrap_err(), GraphError::DuplicateNode { name: "a".into() });
}

#[test]
fn nodes_in_any_order_are_sorted() {
    let text = doc(
        r#"{"name": "b", "op": "Neg", "inputs": ["a"]},
           {"name": "a", "op": "Relu", "inputs": ["x"]}"#,
        r#""b""#,
    );
    let g = from_json(&text).unwrap();
    let names: Vec<&str> = g.nodes().map(|(_, n)| n.name.as_ref()).collect();
    assert_eq!(names, ["a", "b"]);
}
