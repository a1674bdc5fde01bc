#![allow(clippy::unwrap_used, clippy::expect_used)]
//! ONNX external data: a model whose initializers live in a file beside it imports to the same graph and the
//! same weight bytes as its inline version, and every malformed entry (no location, a path leaving the model's
//! folder, a missing file, a range past its end, a bad offset, a length that disagrees with the dims, a model
//! given as bytes) is an `ExternalData` or `DataLength` error naming the tensor.

mod common;

use common::{encode, f32v, out};
use graph_onnx::proto::{data_location, NodeProto, StringStringEntryProto, TensorProto};
use graph_onnx::{import, import_file, ImportOptions, OnnxError};
use std::path::{Path, PathBuf};

const K: usize = 64;
const N: usize = 300;

/// A fresh directory under the system's temp dir.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cuplan-ext-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn values(n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|i| (i as f32 * 0.37).sin() * scale).collect()
}

/// `y = x @ w + b` with `w` (76,800 bytes: a weight) and `b` (1,200 bytes: an inline constant).
fn model(w: TensorProto, b: TensorProto) -> Vec<u8> {
    let nodes =
        vec![NodeProto::new("MatMul", "mm", &["x", "w"], &["h"]), NodeProto::new("Add", "add", &["h", "b"], &["y"])];
    encode(13, nodes, vec![f32v("x", &[2, K as i64])], vec![out("y")], vec![w, b])
}

fn external(name: &str, dims: &[i64], entries: &[(&str, String)]) -> TensorProto {
    let mut t = TensorProto::shape_only(name, common::F, dims);
    t.data_location = data_location::EXTERNAL;
    t.external_data =
        entries.iter().map(|(k, v)| StringStringEntryProto { key: k.to_string(), value: v.clone() }).collect();
    t
}

fn le(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Writes the model with `w` and `b` in `weights.bin` (after 16 bytes of padding, `b` after `w`).
fn write_external(dir: &Path) -> PathBuf {
    let (w, b) = (values(K * N, 0.1), values(N, 1.0));
    let mut data = vec![0xAB; 16];
    data.extend(le(&w));
    let b_off = data.len();
    data.extend(le(&b));
    std::fs::write(dir.join("weights.bin"), data).unwrap();
    let wt = external(
        "w",
        &[K as i64, N as i64],
        &[("location", "weights.bin".into()), ("offset", "16".into()), ("length", (K * N * 4).to_string())],
    );
    let bt = external("b", &[N as i64], &[("location", "./weights.bin".into()), ("offset", b_off.to_string())]);
    let path = dir.join("model.onnx");
    std::fs::write(&path, model(wt, bt)).unwrap();
    path
}

#[test]
fn external_model_imports_like_its_inline_version() {
    let dir = scratch("same");
    let path = write_external(&dir);
    let inline = import(
        &model(
            TensorProto::f32("w", &[K as i64, N as i64], &values(K * N, 0.1)),
            TensorProto::f32("b", &[N as i64], &values(N, 1.0)),
        ),
        &ImportOptions::default(),
    )
    .unwrap();
    let ext = import_file(&path, &ImportOptions::default()).unwrap();
    assert_eq!(ext.graph.to_json(), inline.graph.to_json());
    assert_eq!(ext.weights.len(), 1);
    assert_eq!(ext.weights, inline.weights);
    assert_eq!(*ext.weights[0].bytes, le(&values(K * N, 0.1)));
    // The same bytes with the folder given explicitly.
    let bytes = std::fs::read(&path).unwrap();
    let opts = ImportOptions { external_data_dir: Some(dir.clone()), ..ImportOptions::default() };
    assert_eq!(import(&bytes, &opts).unwrap().weights, inline.weights);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Imports the model with `w` described by `entries` (and an inline `b`) from `dir`.
fn import_w(dir: &Path, entries: &[(&str, String)]) -> OnnxError {
    let w = external("w", &[K as i64, N as i64], entries);
    let path = dir.join("m.onnx");
    std::fs::write(&path, model(w, TensorProto::f32("b", &[N as i64], &values(N, 1.0)))).unwrap();
    import_file(&path, &ImportOptions::default()).unwrap_err()
}

fn problem(e: &OnnxError) -> String {
    match e {
        OnnxError::ExternalData { tensor, problem, .. } => {
            assert_eq!(tensor, "w", "{e}");
            problem.clone()
        }
        other => panic!("expected ExternalData, got {other}"),
    }
}

#[test]
fn malformed_external_entries_are_errors_naming_the_tensor() {
    let dir = scratch("bad");
    let inside = dir.join("in");
    std::fs::create_dir_all(&inside).unwrap();
    let bytes = K * N * 4;
    std::fs::write(inside.join("w.bin"), vec![0u8; bytes]).unwrap();
    std::fs::write(dir.join("outside.bin"), vec![0u8; bytes]).unwrap();
    let loc = |s: &str| ("location", s.to_string());

    let e = import_w(&inside, &[loc("missing.bin")]);
    assert!(problem(&e).starts_with("cannot open"), "{e}");
    assert!(e.to_string().starts_with("tensor 'w': external data 'missing.bin': cannot open"), "{e}");

    for leaving in ["../outside.bin", "/etc/passwd", "sub/../../outside.bin"] {
        let e = import_w(&inside, &[loc(leaving)]);
        assert_eq!(problem(&e), "the path leaves the model's folder", "{leaving}: {e}");
    }
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(dir.join("outside.bin"), inside.join("link.bin")).unwrap();
        let e = import_w(&inside, &[loc("link.bin")]);
        assert_eq!(problem(&e), "the path leaves the model's folder", "{e}");
    }

    let e = import_w(&inside, &[]);
    assert_eq!(problem(&e), "the tensor has no 'location' entry");

    let e = import_w(&inside, &[loc("w.bin"), ("offset", "4".into())]);
    assert!(problem(&e).starts_with(&format!("bytes 4..{} lie past the end of", bytes + 4)), "{e}");

    let e = import_w(&inside, &[loc("w.bin"), ("offset", "-1".into())]);
    assert_eq!(problem(&e), "'offset' \"-1\" is not a non-negative integer");
    let e = import_w(&inside, &[loc("w.bin"), ("offset", u64::MAX.to_string())]);
    assert!(problem(&e).contains("overflows"), "{e}");

    let e = import_w(&inside, &[loc("w.bin"), ("length", "8".into())]);
    assert!(
        matches!(&e, OnnxError::DataLength { tensor, expected, actual: 8, .. } if tensor == "w" && *expected == bytes as u64),
        "{e}"
    );

    // The happy path of the same file, then the same model as bytes without a folder.
    let w = external("w", &[K as i64, N as i64], &[loc("w.bin")]);
    let m = model(w, TensorProto::f32("b", &[N as i64], &values(N, 1.0)));
    std::fs::write(inside.join("ok.onnx"), &m).unwrap();
    assert_eq!(import_file(inside.join("ok.onnx"), &ImportOptions::default()).unwrap().weights.len(), 1);
    let e = import(&m, &ImportOptions::default()).unwrap_err();
    assert!(problem(&e).contains("not loaded from a file"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn data_both_inline_and_external_is_malformed() {
    let dir = scratch("both");
    std::fs::write(dir.join("w.bin"), vec![0u8; K * N * 4]).unwrap();
    let mut w = TensorProto::f32("w", &[K as i64, N as i64], &values(K * N, 0.1));
    w.data_location = data_location::EXTERNAL;
    w.external_data = vec![StringStringEntryProto { key: "location".into(), value: "w.bin".into() }];
    let path = dir.join("m.onnx");
    std::fs::write(&path, model(w, TensorProto::f32("b", &[N as i64], &values(N, 1.0)))).unwrap();
    let e = import_file(&path, &ImportOptions::default()).unwrap_err();
    assert!(matches!(&e, OnnxError::MalformedTensor { tensor, .. } if tensor == "w"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}
