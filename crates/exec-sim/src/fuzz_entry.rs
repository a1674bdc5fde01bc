//! Fuzzing and property entry point for the whole pipeline's numbers: a small random graph, the reference plan
//! and an optimised plan (fusion, reuse, in-place, several streams), both run on the simulator — the optimised
//! one in a seeded adversarial schedule with the race detector on — and every output compared
//! ([`crate::reference_check`]). The same function runs under proptest in `cargo test` (`tests/differential.rs`) and under
//! `cargo fuzz` (`fuzz/fuzz_targets/sim_diff.rs`).
//!
//! Contract: `Err(reason)` for graphs or options rejected with an error, graphs too large to simulate quickly
//! (`differential_from_bytes` only: [`small_enough`]),
//! custom kernels (no CPU closure) and run errors the reference plan hits too (data-dependent, such as a
//! Gather index out of range); a **panic only on a real invariant violation**: a plan failing `verify` or the
//! plan invariants, a race or run error in the optimised plan only, different outputs, or numbers that differ.

use graph_plan::fuzz_entry::{build_and_verify, options_from_bytes};
use graph_plan::ir::fuzz_entry::{graph_from_bytes, ByteSource};
use graph_plan::ir::ComputeGraph;
use graph_plan::{ExecutionPlan, Op, PlanOptions, TensorMap};

use crate::reference_check::{check_plans, CheckError, CheckOptions};
use crate::Schedule;

/// Largest graph a fuzz run simulates: bytes of all its tensors.
pub const MAX_SIM_BYTES: u64 = 16 << 20;
/// Largest graph a fuzz run simulates: FLOPs of all nodes.
pub const MAX_SIM_FLOPS: u64 = 50_000_000;

/// Whether `graph` is small enough for a fuzz run: FLOPs and the bytes of all its tensors (an upper bound of
/// every region without reuse) under the limits.
pub fn small_enough(graph: &ComputeGraph) -> Result<(), String> {
    let flops: u64 = graph.node_ids().map(|n| graph.node_cost(n).flops).fold(0, u64::saturating_add);
    if flops > MAX_SIM_FLOPS {
        return Err(format!("{flops} FLOPs: too large to simulate in a fuzz run"));
    }
    let bytes: u64 = graph.tensors().map(|(_, t)| t.size_bytes() as u64).fold(0, u64::saturating_add);
    if bytes > MAX_SIM_BYTES {
        return Err(format!("{bytes} bytes: too large to simulate in a fuzz run"));
    }
    Ok(())
}

/// Build both plans of `graph`, run both on seeded inputs and compare (see the module doc).
pub fn reference_vs_optimised(graph: &ComputeGraph, opts: &PlanOptions, seed: u64) -> Result<(), String> {
    if graph.nodes().any(|(_, n)| matches!(n.op, Op::Custom(_))) {
        return Err("custom kernels have no CPU closure here".into());
    }
    let reference = build_and_verify(graph, &PlanOptions::reference())?;
    let optimised: ExecutionPlan = build_and_verify(graph, opts)?;
    let copts = CheckOptions { schedule: Schedule::Random { seed }, race_check: true, tolerance: 1e-5, seed };
    match check_plans(&reference, &optimised, &TensorMap::new(), &TensorMap::new(), &copts) {
        Ok(report) => {
            if !report.passed {
                let bad: Vec<String> = report
                    .outputs
                    .iter()
                    .filter(|o| !o.passed)
                    .map(|o| format!("'{}' max abs err {} ({} elements differ)", o.name, o.max_abs_err, o.differing))
                    .collect();
                panic!(
                    "invariant: optimised plan of '{}' computes different numbers: {}",
                    graph.name(),
                    bad.join(", ")
                );
            }
            Ok(())
        }
        Err(CheckError::Run { which: "reference", source }) => Err(format!("reference run: {source}")),
        Err(e) => panic!("invariant: optimised plan of '{}' fails where the reference runs: {e}", graph.name()),
    }
}

/// The `sim_diff` fuzz target: options, a seed and a graph from `bytes`.
pub fn differential_from_bytes(bytes: &[u8]) -> Result<(), String> {
    let mut b = ByteSource::new(bytes);
    let mut opts = options_from_bytes(&mut b);
    let seed = u64::from(b.byte());
    // Valid options only here: option errors are the build_verify target's business.
    opts.max_streams = opts.max_streams.clamp(1, 8);
    if !opts.memory.alignment.is_power_of_two() {
        opts.memory.alignment = 256;
    }
    let graph = graph_from_bytes(bytes.get(5..).unwrap_or(&[])).map_err(|e| e.to_string())?;
    small_enough(&graph)?;
    reference_vs_optimised(&graph, &opts, seed)
}
