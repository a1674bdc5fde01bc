//! Fuzz target: random graphs from graph-ir's builder, planned with random options, verified.
//! The check returns `Err` for rejected input and panics only on a real invariant violation.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = graph_plan::fuzz_entry::plan_from_bytes(data);
});
