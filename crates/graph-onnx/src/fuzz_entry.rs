//! Fuzzing and property entry point for the importer: the same function runs under proptest in `cargo test`
//! (`tests/hostile.rs`, `tests/reliability.rs`) and under `cargo fuzz` (`fuzz/fuzz_targets/onnx_import.rs`).
//!
//! Contract: `Err(reason)` when the file is rejected with an [`OnnxError`](crate::OnnxError) (the right answer
//! to a bad file); a **panic only on a real invariant violation**: an imported graph that does not validate, a
//! weight whose bytes disagree with its dtype and shape, or a graph that changes through a JSON round trip.

use crate::{import as import_model, ImportOptions};

/// Import `bytes` with default options and check what comes out (see the module doc).
pub fn import(bytes: &[u8]) -> Result<(), String> {
    let model = import_model(bytes, &ImportOptions::default()).map_err(|e| e.to_string())?;
    graph_ir::fuzz_entry::assert_valid(&model.graph);
    for w in &model.weights {
        let want = w.shape.byte_size(w.dtype);
        assert!(
            want == Some(w.bytes.len()),
            "invariant: weight '{}' has {} bytes for {} {}",
            w.name,
            w.bytes.len(),
            w.dtype,
            w.shape
        );
        let t = model.graph.get_tensor(w.tensor);
        assert!(t.is_some_and(|t| *t.name == *w.name), "invariant: weight '{}' names another tensor", w.name);
    }
    // A NaN or infinite float attribute (Pad's value, LeakyRelu's alpha) cannot be written as JSON: that is
    // an `Err`, not a crash; any other difference panics inside.
    graph_ir::fuzz_entry::json_roundtrip(&model.graph)
}
