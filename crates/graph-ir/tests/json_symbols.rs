#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Version 2 of the graph format: named symbolic extents (`"shape": ["batch", 16]`) bound at load; version 1
//! files load unchanged.

use std::collections::HashMap;

use graph_ir::json::{from_json, from_json_with_dims, Extent, GraphDoc, SYMBOLIC_VERSION, VERSION};
use graph_ir::{GraphError, Limits};

const MLP: &str = r#"{
  "format": "cuplan-graph",
  "version": 2,
  "name": "dyn_mlp",
  "inputs": [{"name": "x", "dtype": "f32", "shape": ["batch", 16]}],
  "weights": [{"name": "w", "dtype": "f32", "shape": [16, "hidden"]}],
  "nodes": [
    {"name": "fc", "op": "MatMul", "inputs": ["x", "w"], "outputs": ["h"]},
    {"name": "act", "op": "Relu", "inputs": ["h"], "outputs": ["y"]}
  ],
  "outputs": ["y"]
}"#;

fn dims(pairs: &[(&str, usize)]) -> HashMap<String, usize> {
    pairs.iter().map(|&(k, v)| (k.to_string(), v)).collect()
}

fn load(text: &str, pairs: &[(&str, usize)]) -> Result<graph_ir::ComputeGraph, GraphError> {
    from_json_with_dims(text, Limits::default(), &dims(pairs))
}

#[test]
fn symbols_are_bound_at_load() {
    assert_eq!((VERSION, SYMBOLIC_VERSION), (1, 2));
    for (batch, hidden) in [(1, 32), (8, 64)] {
        let g = load(MLP, &[("batch", batch), ("hidden", hidden)]).unwrap();
        let x = g.tensor(g.inputs()[0]);
        assert_eq!(*x.shape.0, vec![batch, 16]);
        let y = g.tensor(g.outputs()[0]);
        assert_eq!(*y.shape.0, vec![batch, hidden]);
        // Written back: a concrete version-1 document, which loads again to the same text.
        let text = g.to_json();
        assert!(text.contains("\"version\": 1"), "{text}");
        assert_eq!(from_json(&text).unwrap().to_json(), text);
    }
}

#[test]
fn the_document_keeps_its_symbols() {
    let doc: GraphDoc = serde_json::from_str(MLP).unwrap();
    assert_eq!(doc.inputs[0].shape, vec![Extent::from("batch"), Extent::Fixed(16)]);
    assert_eq!(doc.weights[0].shape, vec![Extent::Fixed(16), Extent::Symbol("hidden".into())]);
    assert_eq!(doc.symbols().into_iter().collect::<Vec<_>>(), vec!["batch", "hidden"]);
    let again: GraphDoc = serde_json::from_str(&serde_json::to_string(&doc).unwrap()).unwrap();
    assert_eq!(again, doc);
    assert!(serde_json::to_string(&doc).unwrap().contains(r#""shape":["batch",16]"#));
}

#[test]
fn unbound_and_unused_symbols_are_named() {
    assert_eq!(
        load(MLP, &[("batch", 2)]).unwrap_err(),
        GraphError::UnboundSymbol { tensor: "w".into(), axis: 1, symbol: "hidden".into() }
    );
    let e = from_json(MLP).unwrap_err();
    assert_eq!(e, GraphError::UnboundSymbol { tensor: "x".into(), axis: 0, symbol: "batch".into() });
    assert_eq!(
        e.to_string(),
        "tensor 'x': extent 0 is the symbol 'batch', which has no value; bind it with --dim batch=VALUE"
    );
    assert_eq!(
        load(MLP, &[("batch", 2), ("hidden", 4), ("seq", 9)]).unwrap_err(),
        GraphError::UnusedSymbolBinding { symbol: "seq".into(), known: "batch, hidden".into() }
    );
    let v1 = MLP.replace("\"version\": 2", "\"version\": 1").replace("\"batch\"", "4").replace("\"hidden\"", "8");
    assert_eq!(
        load(&v1, &[("batch", 2)]).unwrap_err(),
        GraphError::UnusedSymbolBinding { symbol: "batch".into(), known: "none".into() }
    );
}

#[test]
fn malformed_symbols_are_errors() {
    // A symbol in a version-1 document asks for version 2.
    let v1 = MLP.replace("\"version\": 2", "\"version\": 1");
    match load(&v1, &[("batch", 2), ("hidden", 4)]).unwrap_err() {
        GraphError::Json { path, message, .. } => {
            assert_eq!(path, "shape of 'x', axis 0");
            assert!(message.contains("\"version\": 2"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    // An empty name, a non-integer number, a negative extent, a negative bound value cannot occur (usize).
    match load(&MLP.replace("\"batch\"", "\"\""), &[("hidden", 4)]).unwrap_err() {
        GraphError::Json { path, message, .. } => {
            assert_eq!(path, "inputs[0].shape[0]");
            assert!(message.contains("non-empty"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    match load(&MLP.replace("\"batch\"", "1.5"), &[("hidden", 4)]).unwrap_err() {
        GraphError::Json { path, .. } => assert_eq!(path, "inputs[0].shape[0]"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        load(&MLP.replace("\"batch\"", "-3"), &[("hidden", 4)]).unwrap_err(),
        GraphError::InvalidDim { tensor: "x".into(), axis: 0, value: -3 }
    );
    // A binding too large for the graph's limits is the graph's own error.
    assert!(matches!(
        load(MLP, &[("batch", usize::MAX), ("hidden", 4)]).unwrap_err(),
        GraphError::InvalidDim { .. } | GraphError::SizeOverflow { .. } | GraphError::LimitExceeded { .. }
    ));
}

#[test]
fn version_one_files_still_load() {
    let dir = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples"));
    let mut n = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "json") {
            let text = std::fs::read_to_string(&path).unwrap();
            // Version-2 examples (named extents) need bindings; the other tests here cover them.
            if !text.contains("\"cuplan-graph\"") || text.contains("\"version\": 2") {
                continue;
            }
            assert!(text.contains("\"version\": 1"), "{}", path.display());
            let g = from_json(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert_eq!(from_json(&g.to_json()).unwrap().to_json(), g.to_json());
            n += 1;
        }
    }
    assert!(n > 0, "no version-1 examples in {}", dir.display());
}
