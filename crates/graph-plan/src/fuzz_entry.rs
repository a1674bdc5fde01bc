//! Fuzzing and property entry point for the compiler: build a plan, run the independent `verify`, and assert
//! the invariants every plan keeps. The same functions run under proptest in `cargo test`
//! (`tests/reliability.rs`) and under `cargo fuzz` (`fuzz/fuzz_targets/build_verify.rs`).
//!
//! Contract: `Err(reason)` when the graph or options are rejected with an error (the right answer to bad
//! input); a **panic only on a real invariant violation**:
//! - `verify` finds a violation;
//! - the pool is smaller than the fixed-order lower bound (impossible for a correct packing), or larger than
//!   the naive sum of every pool tensor (no reuse can do worse than none);
//! - more launches than the graph's kernels (fusion only merges), or more streams than allowed;
//! - the plan's JSON form does not load back to the same plan.

use graph_ir::fuzz_entry::ByteSource;
use graph_ir::ComputeGraph;

use crate::build::{OrderStrategy, PlanOptions};
use crate::plan::ExecutionPlan;
use crate::verify::verify;

/// Build `graph` with `opts`, verify the plan and assert the plan invariants (see the module doc).
pub fn build_and_verify(graph: &ComputeGraph, opts: &PlanOptions) -> Result<ExecutionPlan, String> {
    let plan = ExecutionPlan::build_with(graph, opts).map_err(|e| e.to_string())?;
    assert_plan_invariants(&plan, opts);
    Ok(plan)
}

/// The invariants of a built plan; panics naming the first one broken.
pub fn assert_plan_invariants(plan: &ExecutionPlan, opts: &PlanOptions) {
    let name = plan.graph_name();
    if let Err(v) = verify(plan) {
        let list: Vec<String> = v.iter().map(ToString::to_string).collect();
        panic!("invariant: plan of '{name}' fails verify: {}", list.join("; "));
    }
    let s = plan.stats();
    assert!(
        plan.pool_bytes as u64 >= s.lower_bound_bytes,
        "invariant: plan of '{name}': pool {} below its lower bound {}",
        plan.pool_bytes,
        s.lower_bound_bytes
    );
    assert!(
        plan.pool_bytes as u64 <= s.naive_bytes,
        "invariant: plan of '{name}': pool {} above the naive {} bytes",
        plan.pool_bytes,
        s.naive_bytes
    );
    assert!(
        plan.kernel_count_fused <= plan.kernel_count_original,
        "invariant: plan of '{name}': {} launches for {} kernels",
        plan.kernel_count_fused,
        plan.kernel_count_original
    );
    assert!(
        (1..=opts.max_streams.max(1)).contains(&plan.num_streams),
        "invariant: plan of '{name}': {} streams, at most {} allowed",
        plan.num_streams,
        opts.max_streams
    );
    let text = plan.to_json();
    match ExecutionPlan::from_json(&text) {
        Ok(back) => assert!(back.to_json() == text, "invariant: plan of '{name}' changes in a JSON round trip"),
        Err(e) => panic!("invariant: plan of '{name}' does not load back from its JSON: {e}"),
    }
}

/// Plan options from fuzz bytes: mostly valid (1 to 8 streams, fusion and reuse on or off, power-of-two
/// alignments), sometimes invalid (0 or a billion streams, alignment 3), which must be rejected cleanly.
pub fn options_from_bytes(b: &mut ByteSource) -> PlanOptions {
    let mut o = PlanOptions::default();
    let flags = b.byte();
    o.max_streams = match b.byte() {
        0 => 0,
        1 => 1_000_000_000,
        x => 1 + usize::from(x % 8),
    };
    o.fusion.enabled = flags & 1 == 0;
    o.fusion.horizontal = flags & 2 != 0;
    o.memory.reuse = flags & 4 == 0;
    o.memory.in_place = flags & 8 == 0;
    o.memory.alignment = match flags >> 5 {
        0 => 1,
        1 => 3,
        2 => 64,
        3 => 4096,
        _ => 256,
    };
    if flags & 16 != 0 && b.byte() < 16 {
        // A small pool limit, so that the limit's error path runs too.
        o.memory.max_pool_bytes = u64::from(b.u16());
    }
    o.order = OrderStrategy::Given;
    o
}

/// The `build_verify` fuzz target: options and a graph from `bytes` (graph-ir's generator), then the
/// optimised plan and the reference plan, each built and checked.
pub fn plan_from_bytes(bytes: &[u8]) -> Result<(), String> {
    let mut b = ByteSource::new(bytes);
    let opts = options_from_bytes(&mut b);
    let rest = bytes.get(4..).unwrap_or(&[]);
    let graph = graph_ir::fuzz_entry::graph_from_bytes(rest).map_err(|e| e.to_string())?;
    let optimised = build_and_verify(&graph, &opts);
    build_and_verify(&graph, &PlanOptions::reference())?;
    optimised.map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_cover_invalid_values() {
        let mut b = ByteSource::new(&[0, 0]);
        assert_eq!(options_from_bytes(&mut b).max_streams, 0);
        let mut b = ByteSource::new(&[0, 1]);
        assert_eq!(options_from_bytes(&mut b).max_streams, 1_000_000_000);
        let mut b = ByteSource::new(&[0x20, 9]);
        let o = options_from_bytes(&mut b);
        assert_eq!((o.max_streams, o.memory.alignment), (2, 3));
        assert!(o.validate().is_err());
    }

    #[test]
    fn a_synthetic_graph_passes() {
        let g = graph_ir::synth::transformer(1, 16, 2, 4, 1).unwrap();
        for streams in [1, 4] {
            let plan = build_and_verify(&g, &PlanOptions::with_streams(streams)).unwrap();
            assert!(plan.kernel_count_fused < plan.kernel_count_original);
        }
        assert!(build_and_verify(&g, &PlanOptions::with_streams(0)).unwrap_err().contains("max_streams"));
    }
}
