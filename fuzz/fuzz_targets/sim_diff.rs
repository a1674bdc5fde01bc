//! Fuzz target: random graphs, reference vs optimised plan on the simulator.
//! The check returns `Err` for rejected input and panics only on a real invariant violation.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = exec_sim::fuzz_entry::differential_from_bytes(data);
});
