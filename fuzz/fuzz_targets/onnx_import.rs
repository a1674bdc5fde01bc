//! Fuzz target: ONNX import: decode, check, map, fold, validate, JSON round trip.
//! The check returns `Err` for rejected input and panics only on a real invariant violation.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = graph_onnx::fuzz_entry::import(data);
});
