#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Properties of the fusion pass over random graphs, the synth families and random caps: every plan covers
//! each non-view node once, orders its groups topologically (no cycle), respects the caps, keeps its decisions
//! consistent, and builds into an `ExecutionPlan` that `graph_plan::verify` accepts.

mod fusion_util;

use fusion_util::*;
use graph_ir::{synth, ComputeGraph};
use graph_passes::fusion::FusionOptions;
use graph_plan::{verify, ExecutionPlan, PlanOptions};
use proptest::prelude::*;

/// Check the pass alone and through the whole pipeline with the same options.
fn check_all(g: &ComputeGraph, opts: &FusionOptions, streams: usize) {
    let p = fuse_streams(g, opts, streams);
    check(g, &p, &opts.caps);
    let again = fuse_streams(g, opts, streams);
    assert_eq!(names(g, &p), names(g, &again), "not deterministic");
    // Without decisions: the same groups, counters and Concat slots, and no decision recorded.
    let quiet = fuse_streams(g, &FusionOptions { decisions: false, ..opts.clone() }, streams);
    assert_eq!(quiet.groups, p.groups);
    assert_eq!(quiet.stats, p.stats);
    assert_eq!(quiet.concat_slots, p.concat_slots);
    assert!(quiet.decisions.is_empty());
    let mut po = PlanOptions::with_streams(streams);
    po.fusion = opts.clone();
    let plan = ExecutionPlan::build_with(g, &po).unwrap();
    if let Err(v) = verify(&plan) {
        panic!("{}: {v:?}", g.name());
    }
    // The pipeline may drop the pass's Concat eliminations when they would raise the memory bound: compare with
    // the fusion plan the pipeline kept, which is the pass's own unless so.
    let kept = graph_plan::run_pipeline(g, &po, Some(graph_plan::Pass::Fusion)).unwrap().fusion.unwrap();
    if p.stats.concats_eliminated == 0 || kept.stats.concats_eliminated > 0 {
        assert_eq!(names(g, &p), names(g, &kept));
    }
    check(g, &kept, &opts.caps);
    let copies = kept.groups.iter().filter(|x| x.kind == graph_passes::fusion::GroupKind::Copy).count();
    assert_eq!(plan.kernel_count_fused, kept.groups.len() - copies);
    assert!(plan.stats().bytes_moved <= plan.stats().bytes_moved_unfused);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn rows_graphs_default_caps(seed in any::<u64>(), n in 1usize..60, streams in 1usize..4, horizontal in any::<bool>()) {
        let g = rows_graph(seed, n, true);
        check_all(&g, &FusionOptions { horizontal, ..Default::default() }, streams);
    }

    #[test]
    fn rows_graphs_random_caps(seed in any::<u64>(), n in 1usize..60, caps in caps_strategy(), horizontal in any::<bool>()) {
        let g = rows_graph(seed, n, true);
        check_all(&g, &FusionOptions { enabled: true, horizontal, caps, decisions: true }, 1);
    }

    #[test]
    fn random_dags(n in 1usize..300, fan_in in 1usize..5, seed in any::<u64>(), streams in 1usize..4, horizontal in any::<bool>()) {
        let g = synth::random_dag(n, fan_in, seed).unwrap();
        check_all(&g, &FusionOptions { horizontal, ..Default::default() }, streams);
    }

    #[test]
    fn random_dags_random_caps(n in 1usize..200, fan_in in 1usize..5, seed in any::<u64>(), caps in caps_strategy()) {
        let g = synth::random_dag(n, fan_in, seed).unwrap();
        check_all(&g, &FusionOptions { enabled: true, horizontal: true, caps, decisions: true }, 2);
    }

    #[test]
    fn families(layers in 1usize..4, blocks in 1usize..4, branches in 1usize..5, caps in caps_strategy(), streams in 1usize..4) {
        let graphs = vec![
            synth::chain(3 * layers + 1).unwrap(),
            synth::mlp(layers, 16, 2).unwrap(),
            synth::transformer(layers, 16, 2, 4, 1).unwrap(),
            synth::resnet_like(blocks, 4, 8).unwrap(),
            synth::inception_like(blocks, branches).unwrap(),
        ];
        for g in &graphs {
            check_all(g, &FusionOptions::default(), streams);
            check_all(g, &FusionOptions { enabled: true, horizontal: true, caps: caps.clone(), decisions: true }, streams);
        }
    }
}

#[test]
fn rows_graph_generator_covers_every_class() {
    // The generator is only useful if it produces what the properties are about.
    let mut seen = std::collections::HashSet::new();
    let mut sibling_kernels = 0;
    for seed in 0..40 {
        let g = rows_graph(seed, 60, true);
        g.validate().unwrap();
        for (_, n) in g.nodes() {
            seen.insert(n.op.name());
        }
        sibling_kernels += fuse(&g, &FusionOptions::default()).stats.merges_horizontal;
    }
    assert!(sibling_kernels > 0, "generator never gives sibling products");
    for op in [
        "ReduceSum",
        "ReduceMax",
        "ReduceMean",
        "Softmax",
        "LayerNormalization",
        "Reshape",
        "Squeeze",
        "Unsqueeze",
        "Transpose",
        "MatMul",
        "Gemm",
        "Concat",
        "Slice",
        "Split",
        "Where",
        "Cast",
        "Custom",
        "Memcpy",
    ] {
        assert!(seen.contains(op), "generator never emits {op}");
    }
}
