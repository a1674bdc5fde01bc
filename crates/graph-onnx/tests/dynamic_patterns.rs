#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The shape arithmetic of dynamic exports (HF/torch.onnx transformers and CNNs with symbolic batch and sequence
//! length) folds to exact values once the symbols are bound: Shape -> Gather -> Unsqueeze -> Concat targets for
//! Reshape and Expand, Range position ids, ConstantOfShape + CumSum position ids, Equal/Where on shape tensors,
//! Mod, and Tile; what cannot fold is an error naming the node, tensor or symbol.

mod common;

use common::*;
use graph_ir::Op;
use graph_onnx::proto::{data_type, AttributeProto as A, Dim, NodeProto as N, TensorProto as T, ValueInfoProto};
use graph_onnx::{import, ImportOptions, OnnxError, OnnxModel};

fn i64_out(name: &str) -> ValueInfoProto {
    ValueInfoProto::untyped_shape(name, I64)
}

/// The data of the constant an output copies (a folded output is a constant copied out by an Identity node).
fn folded_i64s(m: &OnnxModel, output: &str) -> Vec<i64> {
    let n = node(m, output);
    assert_eq!(n.op, Op::Identity);
    let t = m.graph.tensor(n.inputs[0]);
    let data = t.data.as_ref().expect("constant data");
    match t.dtype {
        graph_ir::DType::Bool => data.iter().map(|&b| i64::from(b)).collect(),
        _ => data.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect(),
    }
}

/// A transformer-style front end over `input_ids: [batch, seq]` and `x: [batch, seq, 16]`.
fn front_end() -> (Vec<N>, Vec<ValueInfoProto>, Vec<ValueInfoProto>, Vec<T>) {
    let nodes = vec![
        N::new("Shape", "shape", &["input_ids"], &["s"]),
        N::new("Gather", "g_batch", &["s", "i0"], &["b"]),
        N::new("Gather", "g_seq", &["s", "i1"], &["sq"]),
        N::new("Range", "range", &["zero", "sq", "one"], &["pos"]),
        N::new("Unsqueeze", "u_pos", &["pos", "ax0"], &["pos2"]),
        N::new("Unsqueeze", "u_b", &["b", "ax0"], &["b1"]),
        N::new("Unsqueeze", "u_s", &["sq", "ax0"], &["s1"]),
        N::new("Concat", "tgt", &["b1", "s1"], &["tgt"]).with_attrs(vec![A::int("axis", 0)]),
        N::new("Expand", "pos_ids", &["pos2", "tgt"], &["pos_ids"]),
        N::new("ConstantOfShape", "ones", &["tgt"], &["ones"])
            .with_attrs(vec![A::tensor("value", T::i64("v", &[1], &[1]))]),
        N::new("CumSum", "cumsum", &["ones", "axm1"], &["cs"]),
        N::new("Sub", "cs_minus_one", &["cs", "one"], &["pos_cs"]),
        N::new("Equal", "same", &["pos_cs", "pos_ids"], &["same"]),
        N::new("Mod", "parity", &["sq", "two"], &["parity"]),
        N::new("Max", "biggest", &["b", "sq", "two", "one"], &["biggest"]),
        // Reshape x to [b, s, 4, 4] through a 4-way Concat, then Expand it through Where(Equal(t, -1), 1, t).
        N::new("Concat", "tgt4", &["b1", "s1", "four", "four"], &["tgt4"]).with_attrs(vec![A::int("axis", 0)]),
        N::new("Reshape", "reshape", &["x", "tgt4"], &["xr"]),
        N::new("Equal", "is_neg", &["tgt4", "neg1"], &["is_neg"]),
        N::new("Where", "tgt4b", &["is_neg", "one", "tgt4"], &["tgt4b"]),
        N::new("Expand", "expand", &["xr", "tgt4b"], &["xe"]),
        // Shape with start/end and a Slice of it: the last two extents.
        N::new("Shape", "shape_tail", &["xr"], &["tail"]).with_attrs(vec![A::int("start", -2)]),
        N::new("Slice", "first_tail", &["tail", "sl0", "sl1"], &["tail0"]),
        N::new("Cast", "cast", &["tail0"], &["tail0_i32"]).with_attrs(vec![A::int("to", data_type::INT32 as i64)]),
    ];
    let inputs = vec![
        ValueInfoProto::tensor("input_ids", I64, &[Dim::from("batch"), Dim::from("seq")]),
        ValueInfoProto::tensor("x", F, &[Dim::from("batch"), Dim::from("seq"), Dim::Value(16)]),
    ];
    let outputs = vec![
        i64_out("pos_ids"),
        i64_out("pos_cs"),
        ValueInfoProto::untyped_shape("same", data_type::BOOL),
        i64_out("parity"),
        i64_out("biggest"),
        ValueInfoProto::untyped_shape("tail0_i32", data_type::INT32),
        out("xe"),
    ];
    let scalar = |n: &str, v: i64| T::i64(n, &[], &[v]);
    let inits = vec![
        scalar("i0", 0),
        scalar("i1", 1),
        scalar("zero", 0),
        scalar("one", 1),
        scalar("two", 2),
        scalar("axm1", -1),
        scalar("neg1", -1),
        T::i64("ax0", &[1], &[0]),
        T::i64("four", &[1], &[4]),
        T::i64("sl0", &[1], &[0]),
        T::i64("sl1", &[1], &[1]),
    ];
    (nodes, inputs, outputs, inits)
}

fn import_front_end(dims: &[(&str, usize)]) -> Result<OnnxModel, OnnxError> {
    let (n, i, o, t) = front_end();
    import(&encode(18, n, i, o, t), &ImportOptions::with_dims(dims.iter().map(|&(k, v)| (k, v))))
}

#[test]
fn shape_arithmetic_folds_to_exact_values() {
    let m = import_front_end(&[("batch", 2), ("seq", 3)]).unwrap();
    assert_eq!(folded_i64s(&m, "pos_ids"), vec![0, 1, 2, 0, 1, 2]);
    assert_eq!(folded_i64s(&m, "pos_cs"), vec![0, 1, 2, 0, 1, 2]);
    assert_eq!(folded_i64s(&m, "same"), vec![1; 6]);
    assert_eq!(folded_i64s(&m, "parity"), vec![1]);
    assert_eq!(folded_i64s(&m, "biggest"), vec![3]);
    let t = m.graph.tensor(node(&m, "tail0_i32").inputs[0]);
    assert_eq!((t.dtype, t.data.as_deref()), (graph_ir::DType::I32, Some(&4i32.to_le_bytes()[..])));
    assert_eq!(dims(&m, "xr"), vec![2, 3, 4, 4]);
    assert_eq!(op(&m, "reshape"), Op::Reshape { shape: vec![2, 3, 4, 4], allowzero: false });
    assert_eq!(op(&m, "expand"), Op::Expand { shape: vec![2, 3, 4, 4] });
    // Only Reshape, Expand and the output copies remain as graph nodes.
    assert_eq!(m.stats.onnx_nodes, 23);
    assert_eq!(m.stats.folded_nodes, 21);
    // Another binding gives other values from the same file.
    let m = import_front_end(&[("batch", 1), ("seq", 4)]).unwrap();
    assert_eq!(folded_i64s(&m, "pos_ids"), vec![0, 1, 2, 3]);
    assert_eq!(folded_i64s(&m, "parity"), vec![0]);
    assert_eq!(folded_i64s(&m, "biggest"), vec![4]);
    assert_eq!(dims(&m, "xe"), vec![1, 4, 4, 4]);
}

#[test]
fn unbound_symbols_are_named() {
    let e = import_front_end(&[]).unwrap_err();
    assert!(
        matches!(&e, OnnxError::UnboundDim { input, axis: 0, dim } if input == "input_ids" && dim == "batch"),
        "{e}"
    );
    let e = import_front_end(&[("batch", 2)]).unwrap_err();
    assert!(matches!(&e, OnnxError::UnboundDim { input, axis: 1, dim } if input == "input_ids" && dim == "seq"), "{e}");
    let e = import_front_end(&[("batch", 2), ("seq", 3), ("heads", 4)]).unwrap_err();
    assert!(matches!(&e, OnnxError::UnusedDimBinding { dim, .. } if dim == "heads"), "{e}");
}

#[test]
fn seq_zero_folds_to_empty_values() {
    // seq = 0: Range is empty, every position tensor has no element, the Reshape target holds a zero.
    let m = import_front_end(&[("batch", 2), ("seq", 0)]).unwrap();
    assert_eq!(dims(&m, "xe"), vec![2, 0, 4, 4]);
    assert_eq!(folded_i64s(&m, "pos_ids"), Vec::<i64>::new());
    assert_eq!(folded_i64s(&m, "biggest"), vec![2]);
}

fn one_node(
    node: N,
    inputs: Vec<ValueInfoProto>,
    output: ValueInfoProto,
    inits: Vec<T>,
) -> Result<OnnxModel, OnnxError> {
    try_import(18, vec![node], inputs, vec![output], inits)
}

#[test]
fn hostile_shape_arithmetic_is_a_named_error() {
    let x = || f32v("x", &[2, 3]);
    // Integer overflow in a Reshape target computation.
    let e = one_node(
        N::new("Mul", "overflow", &["a", "b"], &["y"]),
        vec![x()],
        i64_out("y"),
        vec![T::i64("a", &[1], &[i64::MAX]), T::i64("b", &[1], &[2])],
    )
    .unwrap_err();
    assert!(
        matches!(&e, OnnxError::InvalidNode { node, problem, .. } if node == "overflow" && problem.contains("overflows INT64")),
        "{e}"
    );
    // Mod by zero, Range with delta 0, CumSum over run-time data, Mod of run-time data.
    let e = one_node(
        N::new("Mod", "m0", &["a", "b"], &["y"]),
        vec![x()],
        i64_out("y"),
        vec![T::i64("a", &[1], &[5]), T::i64("b", &[1], &[0])],
    )
    .unwrap_err();
    assert!(
        matches!(&e, OnnxError::InvalidNode { node, problem, .. } if node == "m0" && problem.contains("division by zero")),
        "{e}"
    );
    let e = one_node(
        N::new("Range", "r0", &["a", "b", "c"], &["y"]),
        vec![x()],
        i64_out("y"),
        vec![T::i64("a", &[], &[0]), T::i64("b", &[], &[5]), T::i64("c", &[], &[0])],
    )
    .unwrap_err();
    assert!(matches!(&e, OnnxError::InvalidNode { node, .. } if node == "r0"), "{e}");
    let e = one_node(N::new("CumSum", "cs", &["x", "ax"], &["y"]), vec![x()], out("y"), vec![T::i64("ax", &[], &[1])])
        .unwrap_err();
    assert!(matches!(&e, OnnxError::NonConstantInput { node, tensor, .. } if node == "cs" && tensor == "x"), "{e}");
    // Expand to a negative extent; Tile with a repeat per axis missing.
    let e =
        one_node(N::new("Expand", "ex", &["x", "t"], &["y"]), vec![x()], out("y"), vec![T::i64("t", &[2], &[-2, 3])])
            .unwrap_err();
    assert!(e.to_string().contains("ex"), "{e}");
    let e = one_node(N::new("Tile", "tl", &["x", "r"], &["y"]), vec![x()], out("y"), vec![T::i64("r", &[1], &[2])])
        .unwrap_err();
    assert!(matches!(&e, OnnxError::InvalidNode { node, .. } if node == "tl"), "{e}");
}

#[test]
fn tile_of_run_time_data_is_an_expand_where_it_can_be() {
    let m = one_node(
        N::new("Tile", "tl", &["x", "r"], &["y"]),
        vec![f32v("x", &[1, 3])],
        out("y"),
        vec![T::i64("r", &[2], &[4, 1])],
    )
    .unwrap();
    assert_eq!(op(&m, "tl"), Op::Expand { shape: vec![4, 3] });
    assert_eq!(dims(&m, "y"), vec![4, 3]);
    let e = one_node(
        N::new("Tile", "tl", &["x", "r"], &["y"]),
        vec![f32v("x", &[2, 3])],
        out("y"),
        vec![T::i64("r", &[2], &[1, 2])],
    )
    .unwrap_err();
    assert!(matches!(&e, OnnxError::Unsupported { node, .. } if node == "tl"), "{e}");
    // A constant tiles at import.
    let m = one_node(
        N::new("Tile", "tc", &["c", "r"], &["t"]),
        vec![f32v("x", &[1])],
        i64_out("t"),
        vec![T::i64("c", &[2], &[7, 8]), T::i64("r", &[1], &[2])],
    )
    .unwrap();
    assert_eq!(folded_i64s(&m, "t"), vec![7, 8, 7, 8]);
}

/// The structure (declared types, node order, duplicate names) is checked once per decode and shared by every
/// bind; a file with a structural problem still reports, on each import, the problem a full check meets first.
#[test]
fn structure_errors_keep_their_order_across_binds() {
    use graph_onnx::DecodedModel;
    let batch = || ValueInfoProto::tensor("x", F, &[Dim::from("batch"), Dim::Value(4)]);
    // A graph input listed twice: with the batch unbound the dims error comes first, bound it is the duplicate.
    let dup = encode(18, vec![N::new("Relu", "r", &["x"], &["y"])], vec![batch(), batch()], vec![out("y")], vec![]);
    let d = DecodedModel::decode(&dup, &ImportOptions::default()).unwrap();
    let e = d.import(&ImportOptions::default()).unwrap_err();
    assert!(matches!(&e, OnnxError::UnboundDim { input, dim, .. } if input == "x" && dim == "batch"), "{e}");
    let e = d.import(&ImportOptions::with_dims([("batch", 2)])).unwrap_err();
    assert!(matches!(&e, OnnxError::DuplicateDefinition { tensor, .. } if tensor == "x"), "{e}");
    // A cycle is reported by every import of one decode, after the inputs bind.
    let cyc = encode(
        18,
        vec![N::new("Add", "a", &["x", "c"], &["b"]), N::new("Relu", "r", &["b"], &["c"])],
        vec![batch()],
        vec![out("c")],
        vec![],
    );
    let d = DecodedModel::decode(&cyc, &ImportOptions::default()).unwrap();
    for b in [1, 3] {
        let e = d.import(&ImportOptions::with_dims([("batch", b)])).unwrap_err();
        assert!(matches!(&e, OnnxError::Cycle { nodes } if nodes.len() == 3), "{e}");
    }
    let e = d.import(&ImportOptions::default()).unwrap_err();
    assert!(matches!(&e, OnnxError::UnboundDim { .. }), "{e}");
    // A sound file: two binds of one decode give each its own shapes.
    let ok = encode(18, vec![N::new("Relu", "r", &["x"], &["y"])], vec![batch()], vec![out("y")], vec![]);
    let d = DecodedModel::decode(&ok, &ImportOptions::default()).unwrap();
    for b in [1, 5] {
        let m = d.import(&ImportOptions::with_dims([("batch", b)])).unwrap();
        assert_eq!(dims(&m, "y"), vec![b, 4]);
    }
}
