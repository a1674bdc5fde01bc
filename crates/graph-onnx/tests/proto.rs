#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The hand-written messages: every shared model decodes and re-encodes to an equal message, with the op
//! inventory recorded here; the checked-in fixtures are what the encoder produces today.

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;

use graph_onnx::proto::{data_type, op_inventory, Dim, ModelProto, NodeProto, ValueInfoProto};
use graph_onnx::{import_file, ImportOptions, OnnxError};
use prost::Message;

fn inventory(name: &str) -> Option<BTreeMap<String, usize>> {
    let bytes = std::fs::read(format!("{}/../../models/{name}.onnx", env!("CARGO_MANIFEST_DIR"))).ok()?;
    let model = ModelProto::decode(bytes.as_slice()).unwrap();
    assert_eq!(ModelProto::decode(model.encode_to_vec().as_slice()).unwrap(), model, "{name} round trip");
    let g = model.graph.as_ref().unwrap();
    Some(op_inventory(g).into_iter().map(|((domain, op), (n, _))| (format!("{domain}:{op}"), n)).collect())
}

fn expect(name: &str, want: &[(&str, usize)]) {
    let Some(got) = inventory(name) else {
        panic!("models/{name}.onnx not found in the repository");
    };
    let want: BTreeMap<String, usize> = want.iter().map(|(k, v)| (format!(":{k}"), *v)).collect();
    assert_eq!(got, want, "{name}");
}

#[test]
fn shared_model_inventories() {
    expect(
        "resnet50",
        &[("Add", 16), ("Conv", 53), ("Gemm", 1), ("MaxPool", 1), ("ReduceMean", 1), ("Relu", 49), ("Reshape", 1)],
    );
    expect("mobilenet_v2", &[("Add", 10), ("Clip", 35), ("Conv", 52), ("Gemm", 1), ("ReduceMean", 1), ("Reshape", 1)]);
    expect(
        "googlenet",
        &[("Concat", 9), ("Conv", 57), ("Gemm", 1), ("MaxPool", 13), ("ReduceMean", 1), ("Relu", 57), ("Reshape", 1)],
    );
    expect(
        "bert_base",
        &[
            ("Add", 122),
            ("Div", 12),
            ("Erf", 12),
            ("Gather", 4),
            ("GatherElements", 1),
            ("Gemm", 1),
            ("LayerNormalization", 25),
            ("MatMul", 96),
            ("Mul", 36),
            ("Reshape", 48),
            ("Softmax", 12),
            ("Tanh", 1),
            ("Transpose", 48),
            ("Where", 1),
        ],
    );
}

/// A Relu over an input with a symbolic batch dimension.
fn symbolic_batch() -> Vec<u8> {
    let x = ValueInfoProto::tensor("x", data_type::FLOAT, &[Dim::from("batch"), Dim::Value(4)]);
    let y = ValueInfoProto::tensor("y", data_type::FLOAT, &[Dim::from("batch"), Dim::Value(4)]);
    common::encode(17, vec![NodeProto::new("Relu", "relu", &["x"], &["y"])], vec![x], vec![y], vec![])
}

/// Checks a fixture against the encoder's output; `CUPLAN_BLESS=1` rewrites it.
fn fixture(name: &str, bytes: &[u8]) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name);
    if std::env::var("CUPLAN_BLESS").is_ok_and(|v| v == "1") {
        std::fs::write(&path, bytes).unwrap();
    }
    let stored = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e} (run with CUPLAN_BLESS=1)", path.display()));
    assert_eq!(stored, bytes, "{name} differs from the encoder's output (run with CUPLAN_BLESS=1)");
    path
}

#[test]
fn fixtures_match_the_encoder_and_import() {
    let tiny = fixture("tiny_cnn.onnx", &common::tiny_model());
    let m = import_file(&tiny, &ImportOptions::default()).unwrap();
    assert_eq!(m.graph.num_nodes(), 5);
    let sym = fixture("symbolic_batch.onnx", &symbolic_batch());
    assert!(matches!(import_file(&sym, &ImportOptions::default()), Err(OnnxError::UnboundDim { .. })));
    let m = import_file(&sym, &ImportOptions::with_dims([("batch", 3)])).unwrap();
    assert_eq!(*m.graph.tensor(m.graph.outputs()[0]).shape.0, vec![3, 4]);
}
