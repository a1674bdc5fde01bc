#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Malformed and hostile files: each gives its specific error, never a panic or a huge allocation.

mod common;

use common::*;
use graph_onnx::proto::{
    data_location, data_type, type_proto, AttributeProto as A, Dim, GraphProto, ModelProto, NodeProto,
    OperatorSetIdProto, StringStringEntryProto, TensorProto, TypeProto, ValueInfoProto,
};
use graph_onnx::{import, import_file, ImportOptions, OnnxError};
use proptest::prelude::*;
use prost::Message;

#[test]
fn tiny_model_imports() {
    let m = import(&tiny_model(), &ImportOptions::default()).unwrap();
    assert_eq!(m.graph.num_nodes(), 5);
    assert_eq!(dims(&m, "c"), vec![1, 4, 6, 6]);
    assert_eq!(dims(&m, "p"), vec![1, 4, 3, 3]);
}

#[test]
fn truncated_file_is_a_decode_error() {
    let bytes = tiny_model();
    let e = import(&bytes[..bytes.len() - 1], &ImportOptions::default()).unwrap_err();
    assert!(matches!(e, OnnxError::Decode(_)), "{e}");
    assert!(e.to_string().starts_with("malformed ONNX protobuf:"), "{e}");
    // Every prefix is either a smaller valid message or an error; none panics.
    for n in 0..bytes.len() {
        let _ = import(&bytes[..n], &ImportOptions::default());
    }
}

#[test]
fn wrong_wire_types_and_bad_utf8_are_decode_errors() {
    // Field 7 (graph) written as a varint instead of a message.
    let e = import(&[0x38, 0x01], &ImportOptions::default()).unwrap_err();
    assert!(matches!(e, OnnxError::Decode(_)), "{e}");
    assert!(e.to_string().contains("wire type"), "{e}");
    // A node name that is not UTF-8.
    let mut bytes = tiny_model();
    let pos = bytes.windows(4).position(|w| w == b"relu").unwrap();
    bytes[pos] = 0xff;
    let e = import(&bytes, &ImportOptions::default()).unwrap_err();
    assert!(matches!(e, OnnxError::Decode(_)), "{e}");
    // Empty input: a model with no graph.
    assert!(matches!(import(&[], &ImportOptions::default()), Err(OnnxError::OpsetOutOfRange { version: 0, .. })));
    let no_graph = ModelProto {
        opset_import: vec![OperatorSetIdProto { domain: String::new(), version: 13 }],
        ..Default::default()
    };
    assert!(matches!(import(&no_graph.encode_to_vec(), &ImportOptions::default()), Err(OnnxError::NoGraph)));
}

#[test]
fn file_size_limit() {
    let bytes = tiny_model();
    let opts = ImportOptions { max_file_bytes: 100, ..ImportOptions::default() };
    assert!(matches!(import(&bytes, &opts), Err(OnnxError::FileTooLarge { limit: 100, .. })));
    let dir = std::env::temp_dir().join(format!("graph-onnx-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tiny.onnx");
    std::fs::write(&path, &bytes).unwrap();
    assert!(matches!(import_file(&path, &opts), Err(OnnxError::FileTooLarge { .. })));
    assert_eq!(import_file(&path, &ImportOptions::default()).unwrap().graph.num_nodes(), 5);
    assert!(matches!(import_file(dir.join("missing.onnx"), &opts), Err(OnnxError::Io { .. })));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn billion_element_dims_never_allocate() {
    let relu = || vec![NodeProto::new("Relu", "r", &["x"], &["y"])];
    // 10^27 elements overflow.
    let e = try_import(13, relu(), vec![f32v("x", &[1_000_000_000; 3])], vec![out("y")], vec![]).unwrap_err();
    assert!(matches!(&e, OnnxError::SizeOverflow { tensor, .. } if tensor == "x"), "{e}");
    // 10^18 floats are over the 16 GiB tensor limit.
    let e =
        try_import(13, relu(), vec![f32v("x", &[1_000_000_000, 1_000_000_000])], vec![out("y")], vec![]).unwrap_err();
    assert!(matches!(&e, OnnxError::TensorTooLarge { tensor, .. } if tensor == "x"), "{e}");
    // 10^9 floats (4 GB) is a legal declaration: the importer allocates nothing for it.
    let m = try_import(13, relu(), vec![f32v("x", &[1_000_000_000])], vec![out("y")], vec![]).unwrap();
    assert_eq!(dims(&m, "y"), vec![1_000_000_000]);
    // ... unless the caller lowers the limit.
    let small = ImportOptions { max_tensor_bytes: 1 << 20, ..ImportOptions::default() };
    let bytes = encode(13, relu(), vec![f32v("x", &[1_000_000_000])], vec![out("y")], vec![]);
    assert!(matches!(import(&bytes, &small), Err(OnnxError::TensorTooLarge { .. })));
    // An initializer claiming 10^9 elements with 4 bytes of data.
    let w = TensorProto::f32("w", &[1_000_000_000], &[1.0]);
    let e = try_import(
        13,
        vec![NodeProto::new("Add", "a", &["x", "w"], &["y"])],
        vec![f32v("x", &[1])],
        vec![out("y")],
        vec![w],
    )
    .unwrap_err();
    assert!(
        matches!(&e, OnnxError::DataLength { tensor, expected: 4_000_000_000, actual: 4, .. } if tensor == "w"),
        "{e}"
    );
    let w = TensorProto::shape_only("w", F, &[1_000_000_000; 2]);
    let e = try_import(13, relu(), vec![f32v("x", &[1])], vec![out("y")], vec![w]).unwrap_err();
    assert!(matches!(&e, OnnxError::TensorTooLarge { tensor, .. } if tensor == "w"), "{e}");
}

#[test]
fn undefined_tensor_cycle_and_duplicates() {
    let e = try_import(
        13,
        vec![NodeProto::new("Relu", "r", &["nope"], &["y"])],
        vec![f32v("x", &[2])],
        vec![out("y")],
        vec![],
    )
    .unwrap_err();
    assert!(matches!(&e, OnnxError::UndefinedTensor { node, tensor, .. } if node == "r" && tensor == "nope"), "{e}");
    assert_eq!(e.to_string(), "node 'r' (Relu) reads 'nope', which no node, input or initializer defines");

    let cycle = vec![
        NodeProto::new("Add", "a", &["x", "t3"], &["t1"]),
        NodeProto::new("Relu", "b", &["t1"], &["t2"]),
        NodeProto::new("Relu", "c", &["t2"], &["t3"]),
        NodeProto::new("Relu", "d", &["t3"], &["y"]),
    ];
    let e = try_import(13, cycle, vec![f32v("x", &[2])], vec![out("y")], vec![]).unwrap_err();
    let OnnxError::Cycle { nodes } = &e else { panic!("{e}") };
    let mut on_cycle = nodes[..nodes.len() - 1].to_vec();
    on_cycle.sort();
    assert_eq!(on_cycle, vec!["a", "b", "c"], "{e}");

    let dup = vec![NodeProto::new("Relu", "a", &["x"], &["y"]), NodeProto::new("Relu", "b", &["x"], &["y"])];
    let e = try_import(13, dup, vec![f32v("x", &[2])], vec![out("y")], vec![]).unwrap_err();
    assert_eq!(e.to_string(), "tensor 'y' is defined twice: by node 'a' and by node 'b'");
    let e = try_import(
        13,
        vec![NodeProto::new("Relu", "a", &["x"], &["y"])],
        vec![f32v("x", &[2])],
        vec![out("z")],
        vec![],
    )
    .unwrap_err();
    assert!(matches!(&e, OnnxError::UndefinedOutput(t) if t == "z"), "{e}");
    let e = try_import(
        13,
        vec![NodeProto::new("Relu", "a", &["x"], &["y"])],
        vec![f32v("x", &[2])],
        vec![out("x")],
        vec![],
    )
    .unwrap_err();
    assert!(matches!(&e, OnnxError::UnsupportedFeature(what) if what.contains("'x'")), "{e}");
    let e = try_import(
        13,
        vec![NodeProto::new("Conv", "conv", &["x"], &["y"])],
        vec![f32v("x", &[1, 1, 2, 2])],
        vec![out("y")],
        vec![],
    )
    .unwrap_err();
    assert!(matches!(&e, OnnxError::MissingInput { node, index: 1, .. } if node == "conv"), "{e}");
}

#[test]
fn nodes_out_of_file_order_are_sorted() {
    let nodes = vec![NodeProto::new("Relu", "b", &["t"], &["y"]), NodeProto::new("Neg", "a", &["x"], &["t"])];
    let m = imp(13, nodes, vec![f32v("x", &[2])], vec![out("y")], vec![]);
    let order: Vec<&str> = m.graph.nodes().map(|(_, n)| n.name.as_ref()).collect();
    assert_eq!(order, vec!["a", "b"]);
}

#[test]
fn attribute_type_errors() {
    let mut bad = A::int("axis", 1);
    bad.r#type = 42;
    let e = single(13, "Softmax", &["x"], vec![bad], &[2], vec![]).unwrap_err();
    assert!(
        matches!(&e, OnnxError::UnknownAttributeType { node, attr, code: 42, .. } if node == "n" && attr == "axis"),
        "{e}"
    );
    let e = single(13, "Softmax", &["x"], vec![A::string("axis", "last")], &[2], vec![]).unwrap_err();
    assert_eq!(e.to_string(), "node 'n' (Softmax): attribute 'axis': has type STRING, expected INT");
}

#[test]
fn opset_range() {
    for bad in [1, 12, 22] {
        let e = single(bad, "Relu", &["x"], vec![], &[2], vec![]).unwrap_err();
        assert!(matches!(e, OnnxError::OpsetOutOfRange { version, min: 13, max: 21, .. } if version == bad), "{e}");
    }
    for good in [13, 17, 21] {
        single(good, "Relu", &["x"], vec![], &[2], vec![]).unwrap();
    }
    // "ai.onnx" is the default domain too; other domains may be imported alongside.
    let mut model = ModelProto::with_graph(
        13,
        GraphProto::build(
            vec![NodeProto::new("Relu", "r", &["x"], &["y"])],
            vec![f32v("x", &[2])],
            vec![out("y")],
            vec![],
        ),
    );
    model.opset_import = vec![
        OperatorSetIdProto { domain: "com.microsoft".into(), version: 1 },
        OperatorSetIdProto { domain: "ai.onnx".into(), version: 14 },
    ];
    assert_eq!(import(&model.encode_to_vec(), &ImportOptions::default()).unwrap().opset, 14);
    model.opset_import.pop();
    assert!(matches!(
        import(&model.encode_to_vec(), &ImportOptions::default()),
        Err(OnnxError::OpsetOutOfRange { version: 0, .. })
    ));
}

#[test]
fn unsupported_ops_name_op_and_domain() {
    let e = single(13, "Resize", &["x"], vec![], &[1, 1, 2, 2], vec![]).unwrap_err();
    assert_eq!(e.to_string(), "node 'n': unsupported operator Resize (domain '')");
    let mut n = NodeProto::new("FusedMatMul", "fm", &["x", "x"], &["y"]);
    n.domain = "com.microsoft".into();
    let e = try_import(13, vec![n], vec![f32v("x", &[2, 2])], vec![out("y")], vec![]).unwrap_err();
    assert!(
        matches!(&e, OnnxError::UnsupportedOp { node, op_type, domain } if node == "fm" && op_type == "FusedMatMul" && domain == "com.microsoft"),
        "{e}"
    );
}

#[test]
fn unsupported_types_and_storage() {
    let mut w = TensorProto::shape_only("w", F, &[2]);
    w.data_location = data_location::EXTERNAL;
    w.external_data = vec![StringStringEntryProto { key: "location".into(), value: "model.data".into() }];
    let e = single(13, "Add", &["x", "w"], vec![], &[2], vec![w]).unwrap_err();
    assert!(
        matches!(&e, OnnxError::ExternalData { tensor, location, .. } if tensor == "w" && location == "model.data"),
        "{e}"
    );

    let dbl = ValueInfoProto::tensor("x", data_type::DOUBLE, &[Dim::Value(2)]);
    let e = try_import(13, vec![NodeProto::new("Relu", "r", &["x"], &["y"])], vec![dbl], vec![out("y")], vec![])
        .unwrap_err();
    assert!(matches!(&e, OnnxError::UnsupportedDtype { tensor, dtype: "DOUBLE", .. } if tensor == "x"), "{e}");

    let seq = ValueInfoProto {
        name: "x".into(),
        r#type: Some(TypeProto { value: Some(type_proto::Value::SequenceType(vec![])) }),
    };
    let e = try_import(13, vec![NodeProto::new("Relu", "r", &["x"], &["y"])], vec![seq], vec![out("y")], vec![])
        .unwrap_err();
    assert!(
        matches!(&e, OnnxError::BadType { value, problem } if value == "x" && problem.contains("sequence_type")),
        "{e}"
    );

    let mut g = GraphProto::build(
        vec![NodeProto::new("Relu", "r", &["x"], &["y"])],
        vec![f32v("x", &[2])],
        vec![out("y")],
        vec![],
    );
    g.sparse_initializer.push(vec![]);
    let e = import(&ModelProto::with_graph(13, g).encode_to_vec(), &ImportOptions::default()).unwrap_err();
    assert!(matches!(e, OnnxError::UnsupportedFeature(_)), "{e}");
}

#[test]
fn symbolic_dims_need_bindings() {
    let x = ValueInfoProto::tensor("x", F, &[Dim::from("batch"), Dim::Value(3)]);
    let y = ValueInfoProto::tensor("y", F, &[Dim::from("batch"), Dim::Value(3)]);
    let bytes = encode(13, vec![NodeProto::new("Relu", "r", &["x"], &["y"])], vec![x], vec![y], vec![]);
    let e = import(&bytes, &ImportOptions::default()).unwrap_err();
    assert!(matches!(&e, OnnxError::UnboundDim { input, axis: 0, dim } if input == "x" && dim == "batch"), "{e}");
    assert_eq!(e.to_string(), "input 'x' dimension 0 is symbolic ('batch'); bind it with --dim batch=VALUE");
    let m = import(&bytes, &ImportOptions::with_dims([("batch", 8)])).unwrap();
    assert_eq!(dims(&m, "y"), vec![8, 3]);
    let e = import(&bytes, &ImportOptions::with_dims([("batch", 8), ("seq", 4)])).unwrap_err();
    assert!(matches!(&e, OnnxError::UnusedDimBinding { dim, known } if dim == "seq" && known == "batch"), "{e}");
    // A declared output with a symbolic dim is checked once bound.
    let x = ValueInfoProto::tensor("x", F, &[Dim::from("batch"), Dim::Value(3)]);
    let y = ValueInfoProto::tensor("y", F, &[Dim::from("other"), Dim::Value(3)]);
    let bytes = encode(13, vec![NodeProto::new("Relu", "r", &["x"], &["y"])], vec![x], vec![y], vec![]);
    import(&bytes, &ImportOptions::with_dims([("batch", 8)])).unwrap();
    let unknown = ValueInfoProto {
        name: "x".into(),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: F,
                shape: Some(graph_onnx::proto::TensorShapeProto { dim: vec![Default::default()] }),
            })),
        }),
    };
    let e = try_import(13, vec![NodeProto::new("Relu", "r", &["x"], &["y"])], vec![unknown], vec![out("y")], vec![])
        .unwrap_err();
    assert!(matches!(&e, OnnxError::UnknownDim { input, axis: 0 } if input == "x"), "{e}");
}

fn never_panics(bytes: &[u8]) {
    // Either outcome is fine; reaching here without a panic is the property.
    match import(bytes, &ImportOptions::default()) {
        Ok(m) => {
            m.graph.validate().unwrap();
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn bit_flips_never_panic(flips in prop::collection::vec((any::<prop::sample::Index>(), 0u8..8), 1..8)) {
        let mut bytes = tiny_model();
        for (i, bit) in flips {
            let k = i.index(bytes.len());
            bytes[k] ^= 1 << bit;
        }
        never_panics(&bytes);
    }

    #[test]
    fn byte_overwrites_never_panic(writes in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..16)) {
        let mut bytes = tiny_model();
        for (i, v) in writes {
            let k = i.index(bytes.len());
            bytes[k] = v;
        }
        never_panics(&bytes);
    }

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        never_panics(&bytes);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Bit flips in a real exported model (the repository's resnet50).
    #[test]
    fn bit_flips_in_resnet50_never_panic(flips in prop::collection::vec((any::<prop::sample::Index>(), 0u8..8), 1..4)) {
        let Ok(mut bytes) = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/resnet50.onnx")) else { return Ok(()) };
        for (i, bit) in flips {
            let k = i.index(bytes.len());
            bytes[k] ^= 1 << bit;
        }
        never_panics(&bytes);
    }
}

const OPS: &[&str] = &[
    "Relu",
    "Neg",
    "Exp",
    "Sqrt",
    "Not",
    "Add",
    "Mul",
    "Div",
    "Equal",
    "Where",
    "MatMul",
    "Gemm",
    "Conv",
    "MaxPool",
    "AveragePool",
    "GlobalAveragePool",
    "GlobalMaxPool",
    "BatchNormalization",
    "ReduceSum",
    "ReduceMean",
    "ReduceMax",
    "Softmax",
    "LayerNormalization",
    "Reshape",
    "Flatten",
    "Squeeze",
    "Unsqueeze",
    "Identity",
    "Dropout",
    "Transpose",
    "Slice",
    "Concat",
    "Gather",
    "GatherElements",
    "Expand",
    "Pad",
    "Split",
    "Clip",
    "Cast",
    "CastLike",
    "Gelu",
    "Sum",
    "Max",
    "Constant",
    "Shape",
    "Size",
    "ConstantOfShape",
    "Range",
    "Resize",
    "",
];
const ATTRS: &[&str] = &[
    "axis",
    "axes",
    "perm",
    "kernel_shape",
    "strides",
    "pads",
    "dilations",
    "group",
    "auto_pad",
    "ceil_mode",
    "keepdims",
    "to",
    "alpha",
    "epsilon",
    "num_outputs",
    "value_ints",
    "value_float",
    "value",
    "mode",
    "transB",
    "allowzero",
    "start",
    "end",
    "noop_with_empty_axes",
    "approximate",
];

fn small_int() -> impl Strategy<Value = i64> {
    prop_oneof![8 => -3i64..6, 1 => Just(i64::MAX), 1 => Just(i64::MIN), 1 => Just(1_000_000_000)]
}

fn attr() -> impl Strategy<Value = A> {
    (prop::sample::select(ATTRS), 0u8..6, small_int(), prop::collection::vec(small_int(), 0..5)).prop_map(
        |(name, kind, i, ints)| match kind {
            0 | 1 => A::int(name, i),
            2 => A::ints(name, &ints),
            3 => A::float(name, i as f32 * 0.5),
            4 => A::string(
                name,
                ["NOTSET", "SAME_UPPER", "VALID", "constant", "tanh", "reflect"][i.rem_euclid(6) as usize],
            ),
            _ => A::tensor(name, TensorProto::i64("", &[ints.len() as i64], &ints)),
        },
    )
}

fn random_node(i: usize) -> impl Strategy<Value = NodeProto> {
    (
        prop::sample::select(OPS),
        prop::collection::vec(0usize..(i + 6), 0..5),
        prop::collection::vec(attr(), 0..4),
        1usize..3,
    )
        .prop_map(move |(op, ins, attrs, nout)| {
            // Names: x, the four initializers, earlier outputs t0..; index i+5 is the empty name.
            let pool: Vec<String> = ["x", "ci", "cf", "cb", "cw"]
                .iter()
                .map(|s| s.to_string())
                .chain((0..i).map(|k| format!("t{k}")))
                .chain([String::new()])
                .collect();
            let inputs: Vec<&str> = ins.iter().map(|&k| pool[k % pool.len()].as_str()).collect();
            let outs: Vec<String> =
                (0..nout).map(|k| if k == 0 { format!("t{i}") } else { format!("t{i}_{k}") }).collect();
            let outs: Vec<&str> = outs.iter().map(String::as_str).collect();
            NodeProto::new(op, &format!("n{i}"), &inputs, &outs).with_attrs(attrs)
        })
}

fn random_graph() -> impl Strategy<Value = Vec<u8>> {
    (
        prop::collection::vec(0i64..5, 0..5),
        prop::collection::vec(small_int(), 0..5),
        (0usize..6).prop_flat_map(|n| (0..n).map(random_node).collect::<Vec<_>>()),
        13i64..=21,
    )
        .prop_map(|(xdims, ints, nodes, opset)| {
            let n = nodes.len();
            let cb = TensorProto {
                name: "cb".into(),
                dims: vec![2],
                data_type: data_type::BOOL,
                raw_data: vec![1, 0],
                ..Default::default()
            };
            let inits = vec![
                TensorProto::i64("ci", &[ints.len() as i64], &ints),
                TensorProto::f32("cf", &[], &[0.5]),
                cb,
                TensorProto::shape_only("cw", F, &[3, 3, 1, 1]),
            ];
            let outputs = if n == 0 { vec![out("x")] } else { vec![out(&format!("t{}", n - 1))] };
            encode(opset, nodes, vec![f32v("x", &xdims)], outputs, inits)
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    /// Structurally valid protobuf with arbitrary ops, wiring and attribute values: errors, never panics.
    #[test]
    fn random_graphs_never_panic(bytes in random_graph()) {
        never_panics(&bytes);
    }
}
