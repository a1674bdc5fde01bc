#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The `build_verify` fuzz target's check (`graph_plan::fuzz_entry`) under proptest with a fixed case count (the CI
//! smoke run when no fuzzer runs), option limits, and the whole pipeline on million-node graphs (ignored in
//! debug builds: `cargo xtask fuzz --big` runs them in release).

use graph_ir::{json, synth, ComputeGraph, GraphError};
use graph_plan::fuzz_entry::{build_and_verify, plan_from_bytes};
use graph_plan::{verify, ExecutionPlan, PlanOptions, MAX_STREAMS};
use proptest::prelude::*;
use std::time::Instant;

#[test]
fn stream_counts_out_of_range_are_option_errors() {
    let g = synth::chain(4).unwrap();
    for streams in [0, MAX_STREAMS + 1, 1_000_000_000] {
        let e = ExecutionPlan::build(&g, streams).unwrap_err();
        assert!(
            matches!(e.as_graph_error(), Some(GraphError::InvalidOption { option, .. }) if option == "max_streams"),
            "{e}"
        );
    }
    build_and_verify(&g, &PlanOptions::with_streams(MAX_STREAMS)).unwrap();
}

#[test]
fn pool_limit_is_a_clear_error() {
    let g = synth::mlp(2, 64, 8).unwrap();
    let mut o = PlanOptions::default();
    o.memory.max_pool_bytes = 1024;
    let e = ExecutionPlan::build_with(&g, &o).unwrap_err();
    assert!(e.to_string().contains("1024"), "{e}");
    // The default limit is 2^48 bytes.
    assert_eq!(PlanOptions::default().memory.max_pool_bytes, 1 << 48);
}

#[test]
fn pool_above_the_default_limit_is_an_error_not_an_allocation() {
    // 64 tensors of 2^43 bytes (each under the 2^44 tensor limit), all live at once before a chain of Adds
    // sums them: no packing fits them in less than 2^49 bytes, above the 2^48 default.
    let mut g = ComputeGraph::new("huge");
    let x = g.add_input("x", graph_ir::DType::F32, [1usize << 41]).unwrap();
    let parts: Vec<_> = (0..64).map(|i| g.add_node(&format!("n{i}"), graph_ir::Op::Relu, &[x]).unwrap()[0]).collect();
    let mut acc = parts[0];
    for (i, &p) in parts.iter().enumerate().skip(1) {
        acc = g.add_node(&format!("s{i}"), graph_ir::Op::Add, &[acc, p]).unwrap()[0];
    }
    g.mark_output(acc).unwrap();
    let mut o = PlanOptions::default();
    o.fusion.enabled = false;
    let t = Instant::now();
    let e = ExecutionPlan::build_with(&g, &o).unwrap_err();
    assert!(e.to_string().contains(&(1u64 << 48).to_string()), "{e}");
    assert!(t.elapsed().as_secs() < 10);
    // A single tensor over the 2^44 tensor limit is refused when it is declared, naming it.
    let e = g.add_input("big", graph_ir::DType::F32, [1usize << 43]).unwrap_err();
    assert!(matches!(&e, GraphError::LimitExceeded { what, .. } if what.contains("'big'")), "{e}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// The `build_verify` fuzz target on arbitrary bytes.
    #[test]
    fn build_and_verify_random_graphs(bytes in prop::collection::vec(any::<u8>(), 0..384)) {
        let _ = plan_from_bytes(&bytes);
    }
}

fn secs(t: Instant) -> f64 {
    t.elapsed().as_secs_f64()
}

/// Build, verify and save/load one huge graph; prints the times (quoted in the README).
fn whole_pipeline(g: &ComputeGraph, label: &str) {
    let t = Instant::now();
    let text = g.to_json();
    let back = json::from_json(&text).unwrap();
    assert_eq!(back.num_nodes(), g.num_nodes());
    let t_json = secs(t);
    drop((text, back));
    for streams in [1, 4] {
        let t = Instant::now();
        let plan = ExecutionPlan::build(g, streams).unwrap();
        let t_build = secs(t);
        let t = Instant::now();
        verify(&plan).unwrap();
        let t_verify = secs(t);
        let t = Instant::now();
        let ptext = plan.to_json();
        ExecutionPlan::from_json(&ptext).unwrap();
        let t_pjson = secs(t);
        eprintln!(
            "{label}: {} nodes, {streams} streams: graph json save+load {t_json:.2}s, build {t_build:.2}s, \
             verify {t_verify:.2}s, plan json save+load {t_pjson:.2}s ({} launches, pool {} bytes)",
            g.num_nodes(),
            plan.kernel_count_fused,
            plan.pool_bytes
        );
    }
}

#[test]
#[ignore = "a million nodes: minutes in a debug build; `cargo xtask fuzz --big` runs it in release"]
fn million_node_chain_through_the_whole_pipeline() {
    let t = Instant::now();
    let g = synth::chain(1_000_000).unwrap();
    eprintln!("chain(1M) built in {:.2}s", secs(t));
    whole_pipeline(&g, "chain");
}

#[test]
#[ignore = "a million nodes: minutes in a debug build; `cargo xtask fuzz --big` runs it in release"]
fn million_node_random_dag_through_the_whole_pipeline() {
    let t = Instant::now();
    let g = synth::random_dag(1_000_000, 3, 1).unwrap();
    eprintln!("random_dag(1M) built in {:.2}s", secs(t));
    whole_pipeline(&g, "random_dag");
}

#[test]
fn output_copy_readers_on_other_streams_are_ordered_and_verify_sees_it() {
    // Found by the sim_diff fuzz target: `n1`, a view of the input, is an output, so it is copied into an
    // output buffer at the start on stream 0; `n2` reads that buffer on stream 1 and used to race the copy.
    let g = json::from_json(
        r#"{"format":"cuplan-graph","version":1,"name":"copy_race",
        "inputs":[{"name":"x0","dtype":"f32","shape":[1,1,1]}],
        "nodes":[{"name":"n0","op":{"Cast":{"to":"f32"}},"inputs":["x0"]},
                 {"name":"n1","op":{"Unsqueeze":{"axes":[]}},"inputs":["x0"]},
                 {"name":"n2","op":"Neg","inputs":["n1"]}],
        "outputs":["n0","n1","n2"]}"#,
    )
    .unwrap();
    let plan = build_and_verify(&g, &PlanOptions::with_streams(8)).unwrap();
    assert_eq!((plan.num_streams, plan.event_count), (2, 1));
    // Without the event, the independent checker must object.
    let mut broken = plan.clone();
    broken.steps.retain(|s| !matches!(s, graph_plan::PlanStep::Record { .. } | graph_plan::PlanStep::Wait { .. }));
    broken.event_count = 0;
    assert!(verify(&broken).is_err(), "verify accepts a reader racing the output copy");
}
