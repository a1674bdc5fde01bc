#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Per-operator import: small models built with the crate's prost messages, encoded, imported, and checked
//! for the graph-ir op, its attributes (ONNX defaults included) and the inferred output shapes.

mod common;

use common::*;
use graph_ir::op::{ConvAttrs, GeluApprox, PadMode, PoolAttrs};
use graph_ir::{DType, Op, TensorRole};
use graph_onnx::proto::{AttributeProto as A, GraphProto, ModelProto, NodeProto, TensorProto, ValueInfoProto};
use graph_onnx::{import, ImportOptions, OnnxError};
use prost::Message;

fn conv_model(x: &[i64], w: &[i64], attrs: Vec<A>) -> Result<graph_onnx::OnnxModel, OnnxError> {
    let n = NodeProto::new("Conv", "conv", &["x", "w"], &["y"]).with_attrs(attrs);
    try_import(17, vec![n], vec![f32v("x", x)], vec![out("y")], vec![TensorProto::shape_only("w", F, w)])
}

#[test]
fn conv_auto_pad_resolves_to_explicit_pads() {
    // 8 wide, kernel 3, stride 2: out ceil(8/2) = 4, total pad 3*2 + 3 - 8 = 1, odd.
    let upper = conv_model(
        &[1, 1, 8, 8],
        &[2, 1, 3, 3],
        vec![A::string("auto_pad", "SAME_UPPER"), A::ints("strides", &[2, 2])],
    )
    .unwrap();
    assert_eq!(
        op(&upper, "conv"),
        Op::Conv(ConvAttrs { strides: vec![2, 2], pads: vec![0, 0, 1, 1], dilations: vec![], group: 1 })
    );
    assert_eq!(dims(&upper, "y"), vec![1, 2, 4, 4]);
    let lower = conv_model(
        &[1, 1, 8, 8],
        &[2, 1, 3, 3],
        vec![A::string("auto_pad", "SAME_LOWER"), A::ints("strides", &[2, 2])],
    )
    .unwrap();
    let Op::Conv(a) = op(&lower, "conv") else { panic!() };
    assert_eq!(a.pads, vec![1, 1, 0, 0]);
    assert_eq!(dims(&lower, "y"), vec![1, 2, 4, 4]);
    let valid =
        conv_model(&[1, 1, 8, 8], &[2, 1, 3, 3], vec![A::string("auto_pad", "VALID"), A::ints("strides", &[2, 2])])
            .unwrap();
    assert_eq!(dims(&valid, "y"), vec![1, 2, 3, 3]);
    // Dilation 2 makes the window 5 wide: SAME at stride 1 pads 4, two on each side.
    let dil = conv_model(
        &[1, 1, 8, 8],
        &[2, 1, 3, 3],
        vec![A::string("auto_pad", "SAME_UPPER"), A::ints("dilations", &[2, 2])],
    )
    .unwrap();
    let Op::Conv(a) = op(&dil, "conv") else { panic!() };
    assert_eq!(a.pads, vec![2, 2, 2, 2]);
    assert_eq!(dims(&dil, "y"), vec![1, 2, 8, 8]);
}

#[test]
fn conv_group_bias_and_explicit_pads() {
    let n = NodeProto::new("Conv", "dw", &["x", "w", "b"], &["y"]).with_attrs(vec![
        A::int("group", 4),
        A::ints("pads", &[1, 1, 1, 1]),
        A::ints("kernel_shape", &[3, 3]),
    ]);
    let m = imp(
        13,
        vec![n],
        vec![f32v("x", &[2, 4, 5, 5])],
        vec![f32v("y", &[2, 4, 5, 5])],
        vec![TensorProto::shape_only("w", F, &[4, 1, 3, 3]), TensorProto::f32("b", &[4], &[0.1, 0.2, 0.3, 0.4])],
    );
    assert_eq!(op(&m, "dw"), Op::Conv(ConvAttrs { strides: vec![], pads: vec![1; 4], dilations: vec![], group: 4 }));
    assert_eq!(node(&m, "dw").inputs.len(), 3);
    assert_eq!(role(&m, "w"), TensorRole::Weight);
    assert_eq!(role(&m, "b"), TensorRole::Constant);
}

#[test]
fn conv_attribute_errors_name_the_node() {
    let e = conv_model(&[1, 1, 8, 8], &[2, 1, 3, 3], vec![A::ints("kernel_shape", &[5, 5])]).unwrap_err();
    assert!(matches!(&e, OnnxError::Attribute { node, attr, .. } if node == "conv" && attr == "kernel_shape"), "{e}");
    let e = conv_model(&[1, 1, 8, 8], &[2, 1, 3, 3], vec![A::ints("strides", &[-1, 1])]).unwrap_err();
    assert!(matches!(&e, OnnxError::Attribute { attr, .. } if attr == "strides"), "{e}");
    let e = conv_model(&[1, 1, 8, 8], &[2, 1, 3, 3], vec![A::string("auto_pad", "SAME")]).unwrap_err();
    assert!(matches!(&e, OnnxError::Attribute { attr, .. } if attr == "auto_pad"), "{e}");
    let e = conv_model(&[1, 1, 8, 8], &[2, 1, 3, 3], vec![A::string("auto_pad", "VALID"), A::ints("pads", &[1; 4])])
        .unwrap_err();
    assert!(matches!(&e, OnnxError::Attribute { attr, .. } if attr == "pads"), "{e}");
    let e = conv_model(&[1, 3, 8, 8], &[2, 1, 3, 3], vec![]).unwrap_err();
    assert!(matches!(&e, OnnxError::Graph(_)), "{e}");
    assert!(e.to_string().contains("conv"), "{e}");
}

#[test]
fn pools_ceil_mode_and_count_include_pad() {
    let mp = single(
        18,
        "MaxPool",
        &["x"],
        vec![A::ints("kernel_shape", &[3, 3]), A::ints("strides", &[2, 2]), A::int("ceil_mode", 1)],
        &[1, 1, 6, 6],
        vec![],
    )
    .unwrap();
    assert_eq!(
        op(&mp, "n"),
        Op::MaxPool(PoolAttrs {
            kernel_shape: vec![3, 3],
            strides: vec![2, 2],
            pads: vec![],
            dilations: vec![],
            ceil_mode: true,
            count_include_pad: false
        })
    );
    assert_eq!(dims(&mp, "y"), vec![1, 1, 3, 3]);
    let ap = single(
        18,
        "AveragePool",
        &["x"],
        vec![A::ints("kernel_shape", &[3, 3]), A::ints("pads", &[1, 1, 1, 1]), A::int("count_include_pad", 1)],
        &[1, 1, 6, 6],
        vec![],
    )
    .unwrap();
    let Op::AveragePool(a) = op(&ap, "n") else { panic!() };
    assert!(a.count_include_pad && !a.ceil_mode);
    assert_eq!(dims(&ap, "y"), vec![1, 1, 6, 6]);
    let e = single(18, "MaxPool", &["x"], vec![], &[1, 1, 6, 6], vec![]).unwrap_err();
    assert!(matches!(&e, OnnxError::Attribute { attr, .. } if attr == "kernel_shape"), "{e}");
    let gmp = single(13, "GlobalMaxPool", &["x"], vec![], &[1, 3, 6, 6], vec![]).unwrap();
    assert_eq!(op(&gmp, "n"), Op::ReduceMax { axes: Some(vec![2, 3]), keepdims: true });
    assert_eq!(dims(&gmp, "y"), vec![1, 3, 1, 1]);
}

#[test]
fn maxpool_indices_output_is_rejected_only_when_read() {
    let pool = |outs: &[&str]| {
        NodeProto::new("MaxPool", "mp", &["x"], outs).with_attrs(vec![A::ints("kernel_shape", &[2, 2])])
    };
    // Named but unused: dropped.
    imp(13, vec![pool(&["y", "idx"])], vec![f32v("x", &[1, 1, 4, 4])], vec![out("y")], vec![]);
    let e = try_import(
        13,
        vec![pool(&["y", "idx"])],
        vec![f32v("x", &[1, 1, 4, 4])],
        vec![out("y"), ValueInfoProto::untyped_shape("idx", I64)],
        vec![],
    )
    .unwrap_err();
    assert!(matches!(&e, OnnxError::Unsupported { node, what, .. } if node == "mp" && what.contains("idx")), "{e}");
}

#[test]
fn gemm_defaults_and_optional_c() {
    let n = NodeProto::new("Gemm", "g", &["x", "w"], &["y"]);
    let m = imp(13, vec![n], vec![f32v("x", &[2, 3])], vec![out("y")], vec![TensorProto::shape_only("w", F, &[3, 5])]);
    assert_eq!(op(&m, "g"), Op::Gemm { alpha: 1.0, beta: 1.0, trans_a: false, trans_b: false });
    assert_eq!(dims(&m, "y"), vec![2, 5]);
    let n = NodeProto::new("Gemm", "g", &["x", "w", ""], &["y"]).with_attrs(vec![
        A::int("transA", 1),
        A::int("transB", 1),
        A::float("alpha", 0.5),
    ]);
    let m = imp(13, vec![n], vec![f32v("x", &[3, 2])], vec![out("y")], vec![TensorProto::shape_only("w", F, &[5, 3])]);
    assert_eq!(op(&m, "g"), Op::Gemm { alpha: 0.5, beta: 1.0, trans_a: true, trans_b: true });
    assert_eq!(node(&m, "g").inputs.len(), 2);
    let e = single(13, "Gemm", &["x", "x"], vec![A::int("transA", 2)], &[2, 2], vec![]).unwrap_err();
    assert!(matches!(&e, OnnxError::Attribute { attr, .. } if attr == "transA"), "{e}");
}

#[test]
fn softmax_layernorm_and_batchnorm() {
    let sm = single(13, "Softmax", &["x"], vec![], &[2, 5], vec![]).unwrap();
    assert_eq!(op(&sm, "n"), Op::Softmax { axis: -1 });
    let ln = NodeProto::new("LayerNormalization", "ln", &["x", "s", "b"], &["y", "mean", ""])
        .with_attrs(vec![A::float("epsilon", 1e-12)]);
    let m = imp(
        17,
        vec![ln.clone()],
        vec![f32v("x", &[2, 8])],
        vec![out("y")],
        vec![TensorProto::shape_only("s", F, &[8]), TensorProto::shape_only("b", F, &[8])],
    );
    assert_eq!(op(&m, "ln"), Op::LayerNormalization { axis: -1, epsilon: 1e-12 });
    let e = try_import(
        17,
        vec![ln, NodeProto::new("Relu", "r", &["mean"], &["z"])],
        vec![f32v("x", &[2, 8])],
        vec![out("y"), out("z")],
        vec![TensorProto::shape_only("s", F, &[8]), TensorProto::shape_only("b", F, &[8])],
    )
    .unwrap_err();
    assert!(matches!(&e, OnnxError::Unsupported { node, .. } if node == "ln"), "{e}");

    let c = |n: &str| TensorProto::shape_only(n, F, &[3]);
    let bn = NodeProto::new("BatchNormalization", "bn", &["x", "s", "b", "m", "v"], &["y"]);
    let m =
        imp(15, vec![bn.clone()], vec![f32v("x", &[1, 3, 4, 4])], vec![out("y")], vec![c("s"), c("b"), c("m"), c("v")]);
    assert_eq!(op(&m, "bn"), Op::BatchNormalization { epsilon: 1e-5 });
    let e = try_import(
        15,
        vec![bn.with_attrs(vec![A::int("training_mode", 1)])],
        vec![f32v("x", &[1, 3, 4, 4])],
        vec![out("y")],
        vec![c("s"), c("b"), c("m"), c("v")],
    )
    .unwrap_err();
    assert!(matches!(&e, OnnxError::Unsupported { what, .. } if what.contains("training_mode")), "{e}");
}

#[test]
fn reduce_axes_attribute_before_18_and_input_from_18() {
    let m = single(17, "ReduceMean", &["x"], vec![A::ints("axes", &[-1]), A::int("keepdims", 0)], &[2, 3, 4], vec![])
        .unwrap();
    assert_eq!(op(&m, "n"), Op::ReduceMean { axes: Some(vec![-1]), keepdims: false });
    assert_eq!(dims(&m, "y"), vec![2, 3]);
    let m = single(18, "ReduceMean", &["x", "ax"], vec![], &[2, 3, 4], vec![TensorProto::i64("ax", &[2], &[-1, -2])])
        .unwrap();
    assert_eq!(op(&m, "n"), Op::ReduceMean { axes: Some(vec![-1, -2]), keepdims: true });
    assert_eq!(dims(&m, "y"), vec![2, 1, 1]);
    assert!(m.graph.tensor_id("ax").is_none(), "axes are an attribute, not a tensor");
    let m = single(13, "ReduceSum", &["x"], vec![], &[2, 3], vec![]).unwrap();
    assert_eq!(op(&m, "n"), Op::ReduceSum { axes: None, keepdims: true });
    assert_eq!(dims(&m, "y"), vec![1, 1]);
    let m = single(13, "ReduceSum", &["x"], vec![A::int("noop_with_empty_axes", 1)], &[2, 3], vec![]).unwrap();
    assert_eq!(op(&m, "n"), Op::Identity);
    let e = single(18, "ReduceMax", &["x", "x"], vec![], &[2, 3], vec![]).unwrap_err();
    assert!(matches!(&e, OnnxError::NonConstantInput { index: 1, tensor, .. } if tensor == "x"), "{e}");
}

#[test]
fn views_take_constant_inputs_as_attributes() {
    let m =
        single(14, "Reshape", &["x", "s"], vec![], &[2, 3, 4], vec![TensorProto::i64("s", &[2], &[0, -1])]).unwrap();
    assert_eq!(op(&m, "n"), Op::Reshape { shape: vec![0, -1], allowzero: false });
    assert_eq!(dims(&m, "y"), vec![2, 12]);
    let m = single(13, "Flatten", &["x"], vec![], &[2, 3, 4], vec![]).unwrap();
    assert_eq!(op(&m, "n"), Op::Flatten { axis: 1 });
    let m = single(13, "Squeeze", &["x", "a"], vec![], &[1, 3, 1], vec![TensorProto::i64("a", &[1], &[0])]).unwrap();
    assert_eq!(op(&m, "n"), Op::Squeeze { axes: Some(vec![0]) });
    let m = single(13, "Squeeze", &["x"], vec![], &[1, 3, 1], vec![]).unwrap();
    assert_eq!(dims(&m, "y"), vec![3]);
    let m = single(13, "Unsqueeze", &["x", "a"], vec![], &[3], vec![TensorProto::i64("a", &[2], &[0, -1])]).unwrap();
    assert_eq!(op(&m, "n"), Op::Unsqueeze { axes: vec![0, -1] });
    assert_eq!(dims(&m, "y"), vec![1, 3, 1]);
    let e = single(13, "Unsqueeze", &["x"], vec![], &[3], vec![]).unwrap_err();
    assert!(matches!(&e, OnnxError::MissingInput { index: 1, .. }), "{e}");
    let m = single(13, "Transpose", &["x"], vec![], &[2, 3, 4], vec![]).unwrap();
    assert_eq!(op(&m, "n"), Op::Transpose { perm: None });
    assert_eq!(dims(&m, "y"), vec![4, 3, 2]);
    let m = single(13, "Identity", &["x"], vec![], &[2], vec![]).unwrap();
    assert_eq!(op(&m, "n"), Op::Identity);
}

#[test]
fn slice_expand_pad_split() {
    let inits = vec![
        TensorProto::i64("st", &[2], &[1, -1]),
        TensorProto::i64("en", &[2], &[i64::MAX, i64::MIN]),
        TensorProto::i64("ax", &[2], &[0, 1]),
        TensorProto::i64("sp", &[2], &[1, -2]),
    ];
    let m = single(13, "Slice", &["x", "st", "en", "ax", "sp"], vec![], &[4, 5], inits).unwrap();
    assert_eq!(
        op(&m, "n"),
        Op::Slice {
            starts: vec![1, -1],
            ends: vec![i64::MAX, i64::MIN],
            axes: Some(vec![0, 1]),
            steps: Some(vec![1, -2])
        }
    );
    assert_eq!(dims(&m, "y"), vec![3, 3]);

    let m = single(13, "Expand", &["x", "s"], vec![], &[3, 1], vec![TensorProto::i64("s", &[3], &[2, 1, 4])]).unwrap();
    assert_eq!(dims(&m, "y"), vec![2, 3, 4]);

    let pads = TensorProto::i64("p", &[4], &[0, 1, 0, 2]);
    let cv = TensorProto::f32("v", &[], &[1.5]);
    let m = single(13, "Pad", &["x", "p", "v"], vec![A::string("mode", "constant")], &[2, 3], vec![pads.clone(), cv])
        .unwrap();
    assert_eq!(op(&m, "n"), Op::Pad { pads: vec![0, 1, 0, 2], mode: PadMode::Constant, value: 1.5 });
    assert_eq!(dims(&m, "y"), vec![2, 6]);
    // Opset 18 axes input: pads only for the listed axes.
    let m = single(
        18,
        "Pad",
        &["x", "p", "", "a"],
        vec![A::string("mode", "edge")],
        &[2, 3],
        vec![TensorProto::i64("p", &[2], &[2, 3]), TensorProto::i64("a", &[1], &[-1])],
    )
    .unwrap();
    assert_eq!(op(&m, "n"), Op::Pad { pads: vec![0, 2, 0, 3], mode: PadMode::Edge, value: 0.0 });
    let e = single(19, "Pad", &["x", "p"], vec![A::string("mode", "wrap")], &[2, 3], vec![pads]).unwrap_err();
    assert!(matches!(&e, OnnxError::Unsupported { what, .. } if what.contains("wrap")), "{e}");

    let split = |opset, inputs: &[&str], attrs, inits| {
        let n = NodeProto::new("Split", "s", inputs, &["a", "b"]).with_attrs(attrs);
        try_import(opset, vec![n], vec![f32v("x", &[2, 5])], vec![out("a"), out("b")], inits)
    };
    let m = split(13, &["x", "sz"], vec![A::int("axis", 1)], vec![TensorProto::i64("sz", &[2], &[1, 4])]).unwrap();
    assert_eq!(op(&m, "s"), Op::Split { axis: 1, splits: vec![1, 4] });
    assert_eq!((dims(&m, "a"), dims(&m, "b")), (vec![2, 1], vec![2, 4]));
    let m = split(18, &["x"], vec![A::int("axis", 1), A::int("num_outputs", 2)], vec![]).unwrap();
    assert_eq!(op(&m, "s"), Op::Split { axis: 1, splits: vec![3, 2] });
    let m = split(13, &["x"], vec![], vec![]).unwrap();
    assert_eq!(op(&m, "s"), Op::Split { axis: 0, splits: vec![1, 1] });
    let e = split(13, &["x"], vec![A::int("axis", 1)], vec![]).unwrap_err();
    assert!(matches!(&e, OnnxError::InvalidNode { node, .. } if node == "s"), "{e}");
}

#[test]
fn clip_bounds_are_optional_constant_inputs() {
    let lo = TensorProto::f32("lo", &[], &[0.0]);
    let hi = TensorProto::f32("hi", &[], &[6.0]);
    let m = single(13, "Clip", &["x", "lo", "hi"], vec![], &[4], vec![lo.clone(), hi.clone()]).unwrap();
    assert_eq!(op(&m, "n"), Op::Clip { min: Some(0.0), max: Some(6.0) });
    let m = single(13, "Clip", &["x", "", "hi"], vec![], &[4], vec![hi]).unwrap();
    assert_eq!(op(&m, "n"), Op::Clip { min: None, max: Some(6.0) });
    let m = single(13, "Clip", &["x"], vec![], &[4], vec![]).unwrap();
    assert_eq!(op(&m, "n"), Op::Clip { min: None, max: None });
    let e = single(13, "Clip", &["x", "x"], vec![], &[1], vec![]).unwrap_err();
    assert!(matches!(&e, OnnxError::NonConstantInput { node, index: 1, .. } if node == "n"), "{e}");
    let e =
        single(13, "Clip", &["x", "lo"], vec![], &[4], vec![TensorProto::f32("lo", &[2], &[0.0, 1.0])]).unwrap_err();
    assert!(matches!(&e, OnnxError::InvalidNode { .. }), "{e}");
}

#[test]
fn activations_and_cast() {
    let m = single(20, "Gelu", &["x"], vec![A::string("approximate", "tanh")], &[4], vec![]).unwrap();
    assert_eq!(op(&m, "n"), Op::Gelu { approximate: GeluApprox::Tanh });
    let m = single(20, "Gelu", &["x"], vec![], &[4], vec![]).unwrap();
    assert_eq!(op(&m, "n"), Op::Gelu { approximate: GeluApprox::None });
    let e = single(20, "Gelu", &["x"], vec![A::string("approximate", "fast")], &[4], vec![]).unwrap_err();
    assert!(matches!(&e, OnnxError::Attribute { attr, .. } if attr == "approximate"), "{e}");
    let m = single(16, "LeakyRelu", &["x"], vec![], &[4], vec![]).unwrap();
    assert_eq!(op(&m, "n"), Op::LeakyRelu { alpha: 0.01 });
    let m = single(13, "HardSigmoid", &["x"], vec![A::float("alpha", 0.25)], &[4], vec![]).unwrap();
    assert_eq!(op(&m, "n"), Op::HardSigmoid { alpha: 0.25, beta: 0.5 });
    let m = single(14, "HardSwish", &["x"], vec![], &[4], vec![]).unwrap();
    assert_eq!(op(&m, "n"), Op::HardSwish);

    let n = NodeProto::new("Cast", "c", &["x"], &["y"]).with_attrs(vec![A::int("to", 10)]);
    let m = imp(13, vec![n], vec![f32v("x", &[4])], vec![ValueInfoProto::untyped_shape("y", 10)], vec![]);
    assert_eq!(op(&m, "c"), Op::Cast { to: DType::F16 });
    let e = single(13, "Cast", &["x"], vec![A::int("to", 11)], &[4], vec![]).unwrap_err();
    assert!(matches!(&e, OnnxError::UnsupportedDtype { tensor, dtype: "DOUBLE", .. } if tensor == "y"), "{e}");
    let e = single(13, "Cast", &["x"], vec![], &[4], vec![]).unwrap_err();
    assert!(matches!(&e, OnnxError::Attribute { attr, .. } if attr == "to"), "{e}");
    let n = NodeProto::new("CastLike", "c", &["x", "t"], &["y"]);
    let m = imp(
        15,
        vec![n],
        vec![f32v("x", &[4])],
        vec![ValueInfoProto::untyped_shape("y", I64)],
        vec![TensorProto::shape_only("t", I64, &[1])],
    );
    assert_eq!(op(&m, "c"), Op::Cast { to: DType::I64 });
}

#[test]
fn dropout_is_identity_in_inference() {
    let m = single(13, "Dropout", &["x"], vec![], &[4], vec![]).unwrap();
    assert_eq!(op(&m, "n"), Op::Identity);
    let off = graph_onnx::proto::TensorProto {
        name: "t".into(),
        data_type: graph_onnx::proto::data_type::BOOL,
        raw_data: vec![0],
        ..Default::default()
    };
    let m = single(13, "Dropout", &["x", "", "t"], vec![], &[4], vec![off.clone()]).unwrap();
    assert_eq!(op(&m, "n"), Op::Identity);
    let on = graph_onnx::proto::TensorProto { raw_data: vec![1], ..off };
    let e = single(13, "Dropout", &["x", "", "t"], vec![], &[4], vec![on]).unwrap_err();
    assert!(matches!(&e, OnnxError::Unsupported { what, .. } if what.contains("training_mode")), "{e}");
}

#[test]
fn variadic_sum_chains_and_single_input_is_identity() {
    let n = NodeProto::new("Sum", "s", &["x", "x", "x"], &["y"]);
    let m = imp(13, vec![n], vec![f32v("x", &[4])], vec![f32v("y", &[4])], vec![]);
    assert_eq!(m.graph.num_nodes(), 2);
    assert_eq!(op(&m, "s"), Op::Add);
    assert!(m.graph.nodes().all(|(_, n)| n.op == Op::Add));
    let n = NodeProto::new("Max", "mx", &["x"], &["y"]);
    let m = imp(13, vec![n], vec![f32v("x", &[4])], vec![f32v("y", &[4])], vec![]);
    assert_eq!(op(&m, "mx"), Op::Identity);
}

#[test]
fn gather_with_constant_indices_materializes_a_constant() {
    let n = NodeProto::new("Gather", "g", &["x", "i"], &["y"]).with_attrs(vec![A::int("axis", 1)]);
    let m = imp(13, vec![n], vec![f32v("x", &[2, 5])], vec![out("y")], vec![TensorProto::i64("i", &[3], &[4, 0, -1])]);
    assert_eq!(op(&m, "g"), Op::Gather { axis: 1 });
    assert_eq!(dims(&m, "y"), vec![2, 3]);
    let t = m.graph.tensor(m.graph.tensor_id("i").unwrap());
    assert_eq!(t.role, TensorRole::Constant);
    let want: Vec<u8> = [4i64, 0, -1].iter().flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(t.data.as_deref(), Some(want.as_slice()));
}

#[test]
fn constant_nodes_and_shape_subgraphs_fold_into_attributes() {
    // Shape(x) -> Gather(0) -> Unsqueeze(0) -> Concat(with Constant [-1]) -> Reshape target.
    let nodes = vec![
        NodeProto::new("Shape", "shape", &["x"], &["s"]),
        NodeProto::new("Constant", "zero", &[], &["z"])
            .with_attrs(vec![A::tensor("value", TensorProto::i64("", &[], &[0]))]),
        NodeProto::new("Gather", "first", &["s", "z"], &["d0"]),
        NodeProto::new("Constant", "axes", &[], &["ax"]).with_attrs(vec![A::ints("value_ints", &[0])]),
        NodeProto::new("Unsqueeze", "unsq", &["d0", "ax"], &["d0v"]),
        NodeProto::new("Constant", "minus", &[], &["m1"]).with_attrs(vec![A::ints("value_ints", &[-1])]),
        NodeProto::new("Concat", "cat", &["d0v", "m1"], &["target"]).with_attrs(vec![A::int("axis", 0)]),
        NodeProto::new("Reshape", "reshape", &["x", "target"], &["y"]),
    ];
    let m = imp(13, nodes, vec![f32v("x", &[3, 4, 5])], vec![f32v("y", &[3, 20])], vec![]);
    assert_eq!(m.graph.num_nodes(), 1);
    assert_eq!(m.stats.folded_nodes, 7);
    assert_eq!(m.stats.onnx_nodes, 8);
    assert_eq!(op(&m, "reshape"), Op::Reshape { shape: vec![3, -1], allowzero: false });
    // value_float and value_floats give float constants (kept as graph constants when read as tensors).
    let nodes = vec![
        NodeProto::new("Constant", "c", &[], &["k"]).with_attrs(vec![A::float("value_float", 2.0)]),
        NodeProto::new("Mul", "mul", &["x", "k"], &["y"]),
    ];
    let m = imp(13, nodes, vec![f32v("x", &[2])], vec![out("y")], vec![]);
    let k = m.graph.tensor(m.graph.tensor_id("k").unwrap());
    assert_eq!((k.role, k.data.as_deref()), (TensorRole::Constant, Some(&2f32.to_le_bytes()[..])));
    let e = try_import(
        13,
        vec![NodeProto::new("Constant", "c", &[], &["k"])
            .with_attrs(vec![A::float("value_float", 2.0), A::ints("value_ints", &[1])])],
        vec![],
        vec![out("k")],
        vec![],
    )
    .unwrap_err();
    assert!(matches!(&e, OnnxError::InvalidNode { node, .. } if node == "c"), "{e}");
}

#[test]
fn a_constant_graph_output_is_copied_out_through_identity() {
    let nodes = vec![NodeProto::new("Constant", "c", &[], &["k"]).with_attrs(vec![A::ints("value_ints", &[1, 2])])];
    let m = imp(13, nodes, vec![], vec![ValueInfoProto::untyped_shape("k", I64)], vec![]);
    assert_eq!(m.graph.outputs().len(), 1);
    let out = m.graph.tensor(m.graph.outputs()[0]);
    assert_eq!((out.name.as_ref(), out.role), ("k", TensorRole::Output));
    assert_eq!(m.graph.num_nodes(), 1);
}

#[test]
fn gather_elements_and_range_fold_over_constants() {
    // BERT's token type ids: GatherElements over a constant table.
    let nodes = vec![
        NodeProto::new("GatherElements", "ge", &["table", "idx"], &["ids"]).with_attrs(vec![A::int("axis", 1)]),
        NodeProto::new("Gather", "emb", &["w", "ids"], &["y"]),
    ];
    let inits = vec![
        TensorProto::i64("table", &[1, 4], &[0, 0, 1, 1]),
        TensorProto::i64("idx", &[1, 3], &[3, 2, 0]),
        TensorProto::shape_only("w", F, &[2, 8]),
    ];
    let m = imp(13, nodes, vec![], vec![out("y")], inits);
    assert_eq!(m.stats.folded_nodes, 1);
    let ids = m.graph.tensor(m.graph.tensor_id("ids").unwrap());
    let want: Vec<u8> = [1i64, 1, 0].iter().flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(ids.data.as_deref(), Some(want.as_slice()));
    assert_eq!(dims(&m, "y"), vec![1, 3, 8]);
    // GatherElements over run-time data has no graph-ir op.
    let e = single(13, "GatherElements", &["x", "i"], vec![], &[1, 4], vec![TensorProto::i64("i", &[1, 1], &[0])])
        .unwrap_err();
    assert!(matches!(&e, OnnxError::NonConstantInput { .. }), "{e}");
    let nodes = vec![
        NodeProto::new("Range", "r", &["s", "l", "d"], &["ix"]),
        NodeProto::new("Gather", "g", &["x", "ix"], &["y"]),
    ];
    let inits =
        vec![TensorProto::i64("s", &[], &[0]), TensorProto::i64("l", &[], &[6]), TensorProto::i64("d", &[], &[2])];
    let m = imp(13, nodes, vec![f32v("x", &[8, 2])], vec![out("y")], inits);
    assert_eq!(dims(&m, "y"), vec![3, 2]);
    let e = single(13, "ConstantOfShape", &["s"], vec![], &[1], vec![TensorProto::i64("s", &[1], &[1_000_000_000])])
        .unwrap_err();
    assert!(matches!(&e, OnnxError::InvalidNode { problem, .. } if problem.contains("folding limit")), "{e}");
}

#[test]
fn correctly_rounded_float_scalars_fold_and_keep_their_bits() {
    // torch.onnx's scaled_dot_product_attention: the scale from the query's shape, its square root applied to
    // each operand. Shape -> Slice -> Cast -> Sqrt -> Div -> Cast -> Sqrt all fold; the Mul stays.
    let nodes = vec![
        NodeProto::new("Shape", "shape", &["q"], &["qs"]),
        NodeProto::new("Slice", "last", &["qs", "st", "en"], &["d"]),
        NodeProto::new("Cast", "to_f", &["d"], &["df"]).with_attrs(vec![A::int("to", F as i64)]),
        NodeProto::new("Sqrt", "sqrt_d", &["df"], &["sd"]),
        NodeProto::new("Div", "inv", &["one", "sd"], &["scale"]),
        NodeProto::new("Cast", "again", &["scale"], &["scale_f"]).with_attrs(vec![A::int("to", F as i64)]),
        NodeProto::new("Sqrt", "sqrt_scale", &["scale_f"], &["ss"]),
        NodeProto::new("Mul", "q_scaled", &["q", "ss"], &["y"]),
    ];
    let inits = vec![
        TensorProto::i64("st", &[1], &[-1]),
        TensorProto::i64("en", &[1], &[i64::MAX]),
        TensorProto::f32("one", &[1], &[1.0]),
    ];
    let m = imp(14, nodes, vec![f32v("q", &[1, 2, 5, 24])], vec![out("y")], inits);
    assert_eq!(m.graph.num_nodes(), 1);
    assert_eq!(m.stats.folded_nodes, 7);
    let ss = m.graph.tensor(m.graph.tensor_id("ss").unwrap());
    let want = (1.0f32 / 24f32.sqrt()).sqrt();
    assert_eq!((ss.role, ss.data.as_deref()), (TensorRole::Constant, Some(&want.to_le_bytes()[..])));
    // Broadcasting, Sub, Mul, Neg, Abs and Reciprocal, each in f32.
    let nodes = vec![
        NodeProto::new("Sub", "sub", &["a", "b"], &["s"]),
        NodeProto::new("Mul", "mul", &["s", "a"], &["p"]),
        NodeProto::new("Neg", "neg", &["p"], &["n"]),
        NodeProto::new("Abs", "abs", &["n"], &["ab"]),
        NodeProto::new("Reciprocal", "rcp", &["ab"], &["r"]),
        NodeProto::new("Add", "add", &["x", "r"], &["y"]),
    ];
    let inits = vec![TensorProto::f32("a", &[2], &[3.0, -0.1]), TensorProto::f32("b", &[], &[0.7])];
    let m = imp(13, nodes, vec![f32v("x", &[2])], vec![out("y")], inits);
    assert_eq!((m.graph.num_nodes(), m.stats.folded_nodes), (1, 5));
    let r = m.graph.tensor(m.graph.tensor_id("r").unwrap());
    let want: Vec<u8> =
        [3.0f32, -0.1].iter().flat_map(|&a| (1.0f32 / (-((a - 0.7f32) * a)).abs()).to_le_bytes()).collect();
    assert_eq!(r.data.as_deref(), Some(want.as_slice()));
    // A Cast of an integer f32 cannot hold exactly (2^24 + 1) is left to the kernels.
    let nodes = vec![
        NodeProto::new("Cast", "to_f", &["big"], &["bf"]).with_attrs(vec![A::int("to", F as i64)]),
        NodeProto::new("Add", "add", &["x", "bf"], &["y"]),
    ];
    let m =
        imp(13, nodes, vec![f32v("x", &[1])], vec![out("y")], vec![TensorProto::i64("big", &[1], &[(1 << 24) + 1])]);
    assert_eq!((m.graph.num_nodes(), m.stats.folded_nodes), (2, 0));
}

#[test]
fn float_maths_on_constants_stays_in_the_graph() {
    let nodes = vec![
        NodeProto::new("Where", "w", &["m", "a", "b"], &["mask"]),
        NodeProto::new("Add", "add", &["x", "mask"], &["y"]),
    ];
    let cond = TensorProto {
        name: "m".into(),
        dims: vec![2],
        data_type: graph_onnx::proto::data_type::BOOL,
        raw_data: vec![1, 0],
        ..Default::default()
    };
    let inits = vec![cond, TensorProto::f32("a", &[], &[0.0]), TensorProto::f32("b", &[], &[-1e9])];
    let m = imp(13, nodes, vec![f32v("x", &[2])], vec![out("y")], inits);
    assert_eq!(m.stats.folded_nodes, 0);
    assert_eq!(op(&m, "w"), Op::Where);
    assert_eq!(role(&m, "m"), TensorRole::Constant);
}

#[test]
fn initializers_become_constants_weights_or_nothing() {
    let big: Vec<f32> = (0..20_000).map(|i| i as f32).collect();
    let nodes = vec![
        NodeProto::new("MatMul", "mm", &["x", "w_big"], &["h"]),
        NodeProto::new("Add", "add", &["h", "b_small"], &["h2"]),
        NodeProto::new("MatMul", "mm2", &["h2", "w_stripped"], &["y"]),
    ];
    let inits = vec![
        TensorProto::f32("w_big", &[4, 5000], &big),
        TensorProto::f32("b_small", &[5000], &big[..5000]),
        TensorProto::shape_only("w_stripped", F, &[5000, 3]),
        TensorProto::i64("unused", &[2], &[1, 2]),
    ];
    // An older exporter also lists initializers as graph inputs: they stay weights.
    let inputs = vec![f32v("x", &[2, 4]), f32v("w_big", &[4, 5000])];
    let m = imp(13, nodes, inputs, vec![out("y")], inits);
    assert_eq!(m.graph.inputs().len(), 1);
    assert_eq!(role(&m, "w_big"), TensorRole::Weight);
    assert_eq!(role(&m, "b_small"), TensorRole::Constant);
    assert_eq!(role(&m, "w_stripped"), TensorRole::Weight);
    assert!(m.graph.tensor_id("unused").is_none());
    assert_eq!(m.stats.unused_initializers, 1);
    assert_eq!(m.weights.len(), 1);
    let w = &m.weights[0];
    assert_eq!((w.name.as_str(), w.dtype, w.shape.0.to_vec()), ("w_big", DType::F32, vec![4, 5000]));
    assert_eq!(w.tensor, m.graph.tensor_id("w_big").unwrap());
    assert_eq!(&w.bytes[4..8], &1f32.to_le_bytes());
    assert_eq!(w.bytes.len(), 80_000);
    assert_eq!(dims(&m, "y"), vec![2, 3]);
}

#[test]
fn declared_shapes_must_agree_with_inference() {
    let n = NodeProto::new("Relu", "r", &["x"], &["y"]);
    let e = try_import(13, vec![n.clone()], vec![f32v("x", &[2, 3])], vec![f32v("y", &[3, 2])], vec![]).unwrap_err();
    assert!(matches!(&e, OnnxError::ShapeMismatch { tensor, .. } if tensor == "y"), "{e}");
    assert_eq!(e.to_string(), "tensor 'y': the file declares FLOAT [3, 2], inference gives FLOAT [2, 3]");
    // An intermediate's value_info is checked too, element type included.
    let mut g = GraphProto::build(
        vec![n, NodeProto::new("Relu", "r2", &["y"], &["z"])],
        vec![f32v("x", &[2, 3])],
        vec![out("z")],
        vec![],
    );
    g.value_info.push(ValueInfoProto::untyped_shape("y", I64));
    let e = import(&ModelProto::with_graph(13, g).encode_to_vec(), &ImportOptions::default()).unwrap_err();
    assert!(
        matches!(&e, OnnxError::ShapeMismatch { tensor, declared, .. } if tensor == "y" && declared.starts_with("INT64")),
        "{e}"
    );
}

#[test]
fn split_attribute_form_and_untyped_outputs() {
    let n = NodeProto::new("Split", "s", &["x"], &["a", "b"]).with_attrs(vec![A::ints("split", &[2, 3])]);
    // Outputs with no type at all declare nothing; inference decides.
    let untyped = |name: &str| ValueInfoProto { name: name.into(), r#type: None };
    let m = imp(13, vec![n], vec![f32v("x", &[5])], vec![untyped("a"), untyped("b")], vec![]);
    assert_eq!(op(&m, "s"), Op::Split { axis: 0, splits: vec![2, 3] });
    assert_eq!(dims(&m, "b"), vec![3]);
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// SAME padding: the output extent is ceil(input / stride), and the odd pad goes to the end for
        /// SAME_UPPER and to the beginning for SAME_LOWER.
        #[test]
        fn same_padding_keeps_ceil_extent(
            input in 1i64..40, k in 1i64..6, s in 1i64..4, d in 1i64..3, upper in any::<bool>(),
        ) {
            let mode = if upper { "SAME_UPPER" } else { "SAME_LOWER" };
            let m = conv_model(
                &[1, 1, input],
                &[1, 1, k],
                vec![A::string("auto_pad", mode), A::ints("strides", &[s]), A::ints("dilations", &[d])],
            ).unwrap();
            prop_assert_eq!(dims(&m, "y")[2] as i64, (input + s - 1) / s);
            let Op::Conv(a) = op(&m, "conv") else { panic!() };
            let (b, e) = (a.pads[0], a.pads[1]);
            prop_assert!(b.abs_diff(e) <= 1);
            if b != e {
                prop_assert_eq!(e > b, upper, "pads ({}, {})", b, e);
            }
        }

        /// File order does not matter: any permutation of a valid chain imports to the same graph.
        #[test]
        fn node_order_is_irrelevant(perm in Just((0..6).collect::<Vec<usize>>()).prop_shuffle()) {
            let ops = ["Relu", "Neg", "Exp", "Sigmoid", "Tanh", "Abs"];
            let nodes: Vec<NodeProto> = (0..6)
                .map(|i| {
                    let input = if i == 0 { "x".to_string() } else { format!("t{}", i - 1) };
                    NodeProto::new(ops[i], &format!("n{i}"), &[input.as_str()], &[format!("t{i}").as_str()])
                })
                .collect();
            let shuffled: Vec<NodeProto> = perm.iter().map(|&i| nodes[i].clone()).collect();
            let m = imp(13, shuffled, vec![f32v("x", &[3, 2])], vec![f32v("t5", &[3, 2])], vec![]);
            let order: Vec<String> = m.graph.nodes().map(|(_, n)| n.name.to_string()).collect();
            prop_assert_eq!(order, (0..6).map(|i| format!("n{i}")).collect::<Vec<_>>());
        }
    }
}
