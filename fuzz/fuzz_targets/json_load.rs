//! Fuzz target: graph JSON loading: parse, validate, save, load back, compare.
//! The check returns `Err` for rejected input and panics only on a real invariant violation.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = graph_ir::fuzz_entry::json_load(data);
});
