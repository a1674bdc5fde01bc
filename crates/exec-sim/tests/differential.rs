#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The `sim_diff` fuzz target's check (`exec_sim::fuzz_entry`) under proptest with a fixed case count (the CI
//! smoke run when no fuzzer runs), and the simulator on a million-node chain (ignored in debug builds:
//! `cargo xtask fuzz --big` runs it in release).

use exec_sim::fuzz_entry::{differential_from_bytes, reference_vs_optimised};
use graph_plan::ir::synth;
use graph_plan::{ExecutionPlan, PlanOptions, TensorMap};
use proptest::prelude::*;

#[test]
fn synthetic_graphs_agree_on_four_streams() {
    for g in [synth::transformer(1, 16, 2, 4, 1).unwrap(), synth::random_dag(40, 3, 5).unwrap()] {
        for seed in 0..3 {
            reference_vs_optimised(&g, &PlanOptions::with_streams(4), seed).unwrap();
        }
    }
}

#[test]
fn output_copies_are_ordered_before_readers_on_other_streams() {
    // Found by the sim_diff target: `n1`, a view of the input, is an output, so its bytes are copied into an
    // output buffer at the start on stream 0; `n2` reads that buffer on stream 1 and used to race the copy.
    let g = graph_plan::ir::json::from_json(
        r#"{"format":"cuplan-graph","version":1,"name":"copy_race",
        "inputs":[{"name":"x0","dtype":"f32","shape":[1,1,1]}],
        "nodes":[{"name":"n0","op":{"Cast":{"to":"f32"}},"inputs":["x0"]},
                 {"name":"n1","op":{"Unsqueeze":{"axes":[]}},"inputs":["x0"]},
                 {"name":"n2","op":"Neg","inputs":["n1"]}],
        "outputs":["n0","n1","n2"]}"#,
    )
    .unwrap();
    let plan = ExecutionPlan::build(&g, 8).unwrap();
    assert_eq!(plan.num_streams, 2);
    assert_eq!(plan.event_count, 1);
    for seed in 0..8 {
        reference_vs_optimised(&g, &PlanOptions::with_streams(8), seed).unwrap();
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// The `sim_diff` fuzz target on arbitrary bytes.
    #[test]
    fn reference_and_optimised_agree_on_random_graphs(bytes in prop::collection::vec(any::<u8>(), 0..384)) {
        let _ = differential_from_bytes(&bytes);
    }
}

#[test]
#[ignore = "a million nodes: minutes in a debug build; `cargo xtask fuzz --big` runs it in release"]
fn million_node_chain_runs_on_the_simulator() {
    // The optimised plan only: the reference plan (no reuse) of this chain needs a 4 GiB pool.
    let t = std::time::Instant::now();
    let g = synth::chain(1_000_000).unwrap();
    let plan = ExecutionPlan::build(&g, 2).unwrap();
    let t_build = t.elapsed().as_secs_f64();
    let t = std::time::Instant::now();
    let exec = exec_sim::SimExecutor::new();
    let mut inputs = TensorMap::new();
    let mut weights = TensorMap::new();
    exec_sim::fill_tensors(&plan, &mut inputs, &mut weights, 1);
    let out = exec_sim::run_plan(&exec, &plan, &weights, &inputs).unwrap();
    let y = out.values().next().unwrap().to_f32().unwrap();
    assert!(y.iter().all(|v| v.is_finite()));
    eprintln!(
        "chain(1M) on the simulator: build {t_build:.2}s, run {:.2}s ({} launches)",
        t.elapsed().as_secs_f64(),
        plan.kernel_count_fused
    );
}

#[test]
#[ignore = "a million nodes: minutes in a debug build; `cargo xtask fuzz --big` runs it in release"]
fn million_node_random_dag_reference_vs_optimised() {
    // [1, 64] tensors: the reference plan's pool (no reuse) is about 256 MB, so both plans run.
    let t = std::time::Instant::now();
    let g = synth::random_dag(1_000_000, 3, 1).unwrap();
    let opts = PlanOptions::with_streams(4);
    reference_vs_optimised(&g, &opts, 7).unwrap();
    eprintln!(
        "random_dag(1M) reference vs optimised (4 streams, random schedule) on the simulator: {:.2}s",
        t.elapsed().as_secs_f64()
    );
}
