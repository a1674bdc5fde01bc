#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Plans the pipeline builds verify: every synth family, 1..8 streams, fusion and reuse on and off, both
//! order strategies, JSON round trips; and under proptest, random DAGs of any seed, size and stream count.
//! Also: dropping any one wait from a good plan yields only order/memory violations, all naming steps after it.

use graph_ir::op::MemSpace;
use graph_ir::{synth, ComputeGraph, DType, Op};
use graph_plan::verify::Check;
use graph_plan::{verify, ExecutionPlan, OrderStrategy, PlanOptions, PlanStep, StepId, Violation};
use proptest::prelude::*;

fn opts(streams: usize, fusion: bool, reuse: bool) -> PlanOptions {
    let mut o = PlanOptions::with_streams(streams);
    o.fusion.enabled = fusion;
    o.memory.reuse = reuse;
    o
}

fn families() -> Vec<ComputeGraph> {
    vec![
        synth::chain(40).unwrap(),
        synth::mlp(3, 32, 2).unwrap(),
        synth::transformer(2, 32, 4, 8, 1).unwrap(),
        synth::resnet_like(2, 8, 16).unwrap(),
        synth::inception_like(3, 4).unwrap(),
        synth::random_dag(250, 3, 11).unwrap(),
    ]
}

#[test]
fn every_family_verifies_with_any_streams_fusion_and_reuse() {
    for g in &families() {
        for streams in 1..=8 {
            for (fusion, reuse) in [(true, true), (false, false), (true, false), (false, true)] {
                for order in [OrderStrategy::Given, OrderStrategy::Memory] {
                    let mut o = opts(streams, fusion, reuse);
                    o.order = order;
                    let p = ExecutionPlan::build_with(g, &o).unwrap();
                    if let Err(v) = verify(&p) {
                        panic!("{} streams={streams} fusion={fusion} reuse={reuse} {order:?}: {v:#?}", g.name());
                    }
                }
            }
        }
    }
}

#[test]
fn multi_stream_plans_really_use_streams_and_events() {
    // The checks above must have had something to check: some family plans on several streams with events.
    // (inception_like packs its pool so tightly that reuse edges order its branches onto one stream, with or
    // without fusion; the random DAG keeps independent work.)
    let g = synth::random_dag(250, 3, 11).unwrap();
    let p = ExecutionPlan::build_with(&g, &opts(4, true, true)).unwrap();
    assert!(p.num_streams > 1, "random_dag should spread over streams");
    assert!(p.event_count > 0);
    assert!(!p.orders().is_empty(), "reuse on: the memory plan hands over reuse edges");
    verify(&p).unwrap();
}

#[test]
fn a_json_round_trip_verifies() {
    for g in &families() {
        let p = ExecutionPlan::build_with(g, &opts(3, true, true)).unwrap();
        let q = ExecutionPlan::from_json(&p.to_json()).unwrap();
        verify(&q).unwrap();
    }
}

#[test]
fn memcpy_nodes_run_as_copy_steps_and_verify() {
    let mut g = ComputeGraph::new("memcpy");
    let x = g.add_input("x", DType::F32, [4, 64]).unwrap();
    let a = g.add_node("a", Op::Tanh, &[x]).unwrap()[0];
    let h = g.add_node("to_host", Op::Memcpy { to: MemSpace::Host }, &[a]).unwrap()[0];
    let b = g.add_node("b", Op::Neg, &[a]).unwrap()[0];
    g.mark_output(h).unwrap();
    g.mark_output(b).unwrap();
    for streams in 1..=3 {
        let p = ExecutionPlan::build_with(&g, &opts(streams, true, true)).unwrap();
        assert!(p.steps.iter().any(|s| matches!(s, PlanStep::Copy { node: Some(n), .. } if &**n == "to_host")));
        verify(&p).unwrap();
        // The copy is how 'to_host' runs: drop it and coverage says so.
        let mut q = p.clone();
        q.steps.retain(|s| !matches!(s, PlanStep::Copy { node: Some(_), .. }));
        let v = verify(&q).unwrap_err();
        assert!(v.contains(&Violation::NodeNotRun { node: "to_host".into() }), "{v:#?}");
    }
}

#[test]
fn an_empty_pool_and_a_one_node_graph_verify() {
    let mut g = ComputeGraph::new("one");
    let x = g.add_input("x", DType::F32, [1, 8]).unwrap();
    let y = g.add_node("y", Op::Relu, &[x]).unwrap()[0];
    g.mark_output(y).unwrap();
    for streams in 1..=8 {
        verify(&ExecutionPlan::build(&g, streams).unwrap()).unwrap();
    }
}

/// Drop the step at `i`, then check that every violation is one a missing wait explains (order or memory:
/// dependency, reuse edge or race) and names a later step after `i` (earlier steps are unaffected).
fn check_dropped_wait(p: &ExecutionPlan, i: usize) -> Vec<Violation> {
    let mut q = p.clone();
    q.steps.remove(i);
    let Err(v) = verify(&q) else { return Vec::new() };
    for x in &v {
        assert!(
            matches!(x, Violation::Dependency { .. } | Violation::ReuseOrder { .. } | Violation::Race { .. }),
            "dropping wait {i}: unexpected {x}"
        );
        assert!(matches!(x.check(), Check::Order | Check::Memory));
        let last = x.steps().into_iter().max().unwrap();
        assert!(last >= StepId::from_index(i), "dropping wait {i}: {x} names only earlier steps");
    }
    v
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn random_dags_verify(n in 1usize..160, fan_in in 1usize..4, seed in any::<u64>(), streams in 1usize..=8,
                          fusion in any::<bool>(), reuse in any::<bool>()) {
        let g = synth::random_dag(n, fan_in, seed).unwrap();
        let p = ExecutionPlan::build_with(&g, &opts(streams, fusion, reuse)).unwrap();
        if let Err(v) = verify(&p) {
            prop_assert!(false, "{}: {:#?}", g.name(), v);
        }
    }

    #[test]
    fn dropping_any_wait_reports_only_what_a_missing_wait_explains(n in 20usize..120, seed in any::<u64>(),
                                                                    streams in 2usize..=6, pick in any::<prop::sample::Index>()) {
        let g = synth::random_dag(n, 3, seed).unwrap();
        let p = ExecutionPlan::build_with(&g, &opts(streams, false, true)).unwrap();
        let waits: Vec<usize> =
            p.steps.iter().enumerate().filter(|(_, s)| matches!(s, PlanStep::Wait { .. })).map(|(i, _)| i).collect();
        if !waits.is_empty() {
            check_dropped_wait(&p, waits[pick.index(waits.len())]);
        }
    }

    #[test]
    fn violations_round_trip_through_json(n in 10usize..60, seed in any::<u64>()) {
        // Corrupt a plan several ways at once and round-trip whatever it reports.
        let g = synth::random_dag(n, 3, seed).unwrap();
        let mut p = ExecutionPlan::build_with(&g, &opts(3, true, true)).unwrap();
        p.event_count += 1;
        p.pool_bytes += 1;
        p.steps.retain(|s| !matches!(s, PlanStep::Wait { .. }));
        if let Some(i) = p.steps.iter().position(|s| matches!(s, PlanStep::Launch { .. })) {
            p.steps.remove(i);
        }
        let v = verify(&p).unwrap_err();
        let text = serde_json::to_string(&v).unwrap();
        let back: Vec<Violation> = serde_json::from_str(&text).unwrap();
        prop_assert_eq!(&back, &v);
        for x in &v {
            prop_assert!(!x.to_string().is_empty());
        }
    }
}
