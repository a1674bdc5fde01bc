//! Fuzz target: random buffer lists packed, then checked for overlap independently.
//! The check returns `Err` for rejected input and panics only on a real invariant violation.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = graph_passes::fuzz_entry::pack_from_bytes(data);
});
