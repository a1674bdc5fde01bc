#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The JSON format: exact round trips on every synth family, and a malformed corpus where each file gets its
//! specific error, never a panic.

use graph_ir::json::from_json;
use graph_ir::{synth, ComputeGraph, GraphError};
use proptest::prelude::*;

fn round_trip(g: &ComputeGraph) {
    let text = g.to_json();
    let back = from_json(&text).unwrap();
    assert_eq!(back.to_json(), text, "round trip of {}", g.name());
    assert_eq!(back.num_nodes(), g.num_nodes());
    assert_eq!(back.num_tensors(), g.num_tensors());
    for ((_, a), (_, b)) in g.nodes().zip(back.nodes()) {
        assert_eq!(a.name, b.name);
        assert_eq!(a.op, b.op);
    }
    for (_, a) in g.tensors() {
        let b = back.tensor(back.tensor_id(&a.name).unwrap());
        assert_eq!((&a.name, a.dtype, &a.shape, a.role, &a.data), (&b.name, b.dtype, &b.shape, b.role, &b.data));
    }
}

#[test]
fn every_family_round_trips_exactly() {
    round_trip(&synth::chain(20).unwrap());
    round_trip(&synth::mlp(4, 16, 2).unwrap());
    round_trip(&synth::transformer(2, 32, 4, 8, 1).unwrap());
    round_trip(&synth::resnet_like(2, 8, 16).unwrap());
    round_trip(&synth::inception_like(2, 3).unwrap());
    round_trip(&synth::random_dag(300, 4, 1).unwrap());
}

#[test]
fn constants_of_every_dtype_round_trip() {
    let text = r#"{"format": "cuplan-graph", "version": 1, "name": "c",
      "inputs": [{"name": "x", "dtype": "i64", "shape": [3]}],
      "constants": [
        {"name": "ci64", "dtype": "i64", "shape": [3], "data": [-9223372036854775808, 0, 9223372036854775807]},
        {"name": "cf16", "dtype": "f16", "shape": [2], "data": [0.5, -2.0]},
        {"name": "cbf16", "dtype": "bf16", "shape": [1], "data": [1.5]},
        {"name": "cf32", "dtype": "f32", "shape": [], "data": [0.1]},
        {"name": "cb", "dtype": "bool", "shape": [2], "data": [true, false]},
        {"name": "cu8", "dtype": "u8", "shape": [1], "data": [255]}
      ],
      "nodes": [{"name": "add", "op": "Add", "inputs": ["x", "ci64"]}],
      "outputs": ["add"]}"#;
    let g = from_json(text).unwrap();
    let t = g.tensor(g.tensor_id("ci64").unwrap());
    assert_eq!(&t.data.as_ref().unwrap()[..8], &i64::MIN.to_le_bytes());
    let f = g.tensor(g.tensor_id("cf32").unwrap());
    assert_eq!(&f.data.as_ref().unwrap()[..], &0.1f32.to_le_bytes());
    let again = from_json(&g.to_json()).unwrap();
    assert_eq!(again.to_json(), g.to_json());
}

fn json_err(text: &str) -> GraphError {
    from_json(text).unwrap_err()
}

#[test]
fn malformed_corpus_gives_specific_errors() {
    let good = synth::mlp(1, 4, 1).unwrap().to_json();
    // truncated: a syntax error at the end, with a position
    match json_err(&good[..good.len() / 2]) {
        GraphError::Json { line, .. } => assert!(line > 1),
        e => panic!("{e:?}"),
    }
    // wrong type: shape is a string, reported with its path
    let wrong = good.replacen("\"shape\": [\n        1,\n        4\n      ]", "\"shape\": \"1x4\"", 1);
    assert_ne!(wrong, good);
    match json_err(&wrong) {
        GraphError::Json { path, .. } => assert_eq!(path, "inputs[0].shape"),
        e => panic!("{e:?}"),
    }
    // unknown op
    let unknown = good.replacen("\"op\": \"MatMul\"", "\"op\": \"FancyOp\"", 1);
    match json_err(&unknown) {
        GraphError::Json { path, message, .. } => {
            assert_eq!(path, "nodes[0].op");
            assert!(message.contains("FancyOp"), "{message}");
        }
        e => panic!("{e:?}"),
    }
    // negative dim
    let neg = good.replacen("\"shape\": [\n        1,", "\"shape\": [\n        -1,", 1);
    assert_eq!(json_err(&neg), GraphError::InvalidDim { tensor: "x".into(), axis: 0, value: -1 });
    // 2^62-sized tensor
    let big = good.replacen("\"shape\": [\n        1,\n        4\n      ]", "\"shape\": [4611686018427387904]", 1);
    assert!(matches!(json_err(&big), GraphError::SizeOverflow { tensor, .. } if tensor == "x"));
    // not our format, wrong version
    assert!(matches!(json_err(r#"{"format": "onnx"}"#), GraphError::WrongFormat { .. }));
    assert_eq!(
        json_err(r#"{"format": "cuplan-graph", "version": 7}"#),
        GraphError::UnsupportedVersion { found: 7, supported: 2 }
    );
    // unknown field
    let extra = good.replacen("\"name\": \"mlp_1x4\"", "\"name\": \"mlp_1x4\", \"colour\": 3", 1);
    assert!(matches!(json_err(&extra), GraphError::Json { message, .. } if message.contains("colour")));
    // NaN attribute (JSON has no NaN literal: a string in a float slot)
    let nan = r#"{"format": "cuplan-graph", "version": 1, "name": "n",
      "inputs": [{"name": "x", "dtype": "f32", "shape": [2]}],
      "nodes": [{"name": "l", "op": {"LeakyRelu": {"alpha": "NaN"}}, "inputs": ["x"]}], "outputs": ["l"]}"#;
    assert!(matches!(json_err(nan), GraphError::Json { path, .. } if path.starts_with("nodes[0].op")));
    // empty input and garbage
    assert!(matches!(json_err(""), GraphError::Json { .. }));
    assert!(matches!(json_err("\u{0}\u{1}garbage"), GraphError::Json { .. }));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn random_dags_validate_and_round_trip(n in 1usize..400, fan_in in 1usize..6, seed in any::<u64>()) {
        let g = synth::random_dag(n, fan_in, seed).unwrap();
        prop_assert_eq!(g.num_nodes(), n);
        g.validate().unwrap();
        let text = g.to_json();
        let back = from_json(&text).unwrap();
        prop_assert_eq!(back.to_json(), text);
    }

    #[test]
    fn truncations_never_panic(cut in 0usize..2000, flip in 0usize..2000, byte in any::<u8>()) {
        let text = synth::transformer(1, 8, 2, 4, 1).unwrap().to_json();
        let cut = cut.min(text.len());
        let _ = from_json(&text[..text.floor_char_boundary(cut)]);
        let mut bytes = text.into_bytes();
        let i = flip % bytes.len();
        bytes[i] = byte;
        if let Ok(s) = String::from_utf8(bytes) {
            let _ = from_json(&s);
        }
    }
}
