#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Fused plans compute what the reference plan computes: exec-sim runs the reference plan (fusion off, reuse
//! off, one stream) and a fused plan on the same seeded tensors, with its race check and poisoned memory, and
//! compares every output.
//!
//! The simulator evaluates every instruction with one formula whether fused or not and keeps the order of each
//! reduction, so fused outputs must be bitwise equal, reductions included (except a fused attention kernel, whose
//! online softmax is held to `exec_sim::attention::ATTENTION_TOLERANCE`); `CheckOptions::tolerance` (1e-5,
//! relative) is what a backend that reorders a reduction may use, and every comparison must pass it too.

mod fusion_util;

use exec_sim::attention::ATTENTION_TOLERANCE;
use exec_sim::{check, CheckOptions, CheckReport, Schedule};
use fusion_util::*;
use graph_ir::{synth, ComputeGraph, Op};
use graph_passes::fusion::{FusionOptions, GroupKind};
use graph_plan::{PlanOptions, TensorMap};
use proptest::prelude::*;

/// The check report, and whether the fused plan has a fused attention kernel.
fn run(g: &ComputeGraph, fusion: FusionOptions, streams: usize, seed: u64) -> (CheckReport, bool) {
    let mut opts = PlanOptions::with_streams(streams);
    opts.fusion = fusion;
    let attention = fuse(g, &opts.fusion).groups.iter().any(|gr| gr.kind == GroupKind::Attention);
    let co = CheckOptions { schedule: Schedule::Random { seed }, seed, ..CheckOptions::default() };
    let r = check(g, &opts, &TensorMap::new(), &TensorMap::new(), &co).unwrap_or_else(|e| panic!("{}: {e}", g.name()));
    (r, attention)
}

/// Bitwise equal; a plan with a fused attention kernel (online softmax) within `ATTENTION_TOLERANCE`.
fn assert_equal(g: &ComputeGraph, (r, attention): &(CheckReport, bool)) {
    assert!(r.passed, "{}: {r:#?}", g.name());
    for o in &r.outputs {
        if *attention {
            assert!(o.max_rel_err <= ATTENTION_TOLERANCE, "{}: output '{}' differs: {o:?}", g.name(), o.name);
        } else {
            assert!(o.bitwise_equal, "{}: output '{}' differs: {o:?}", g.name(), o.name);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Every fusion class (loop, anchor epilogue, row kernels with several reductions, multi-output,
    /// horizontal, views inside kernels) on random rows graphs, under random schedules and stream counts.
    #[test]
    fn fused_rows_graphs_equal_reference(seed in any::<u64>(), n in 2usize..45, streams in 1usize..4, horizontal in any::<bool>()) {
        let g = rows_graph(seed, n, false);
        let r = run(&g, FusionOptions { horizontal, ..Default::default() }, streams, seed);
        assert_equal(&g, &r);
    }

    #[test]
    fn fused_rows_graphs_equal_reference_under_random_caps(seed in any::<u64>(), n in 2usize..45, caps in caps_strategy()) {
        let g = rows_graph(seed, n, false);
        let r = run(&g, FusionOptions { enabled: true, horizontal: true, caps, decisions: true }, 2, seed);
        assert_equal(&g, &r);
    }

    #[test]
    fn fused_random_dags_equal_reference(n in 3usize..120, fan_in in 1usize..4, seed in 0u64..10_000, streams in 1usize..4) {
        let g = synth::random_dag(n, fan_in, seed).unwrap();
        let r = run(&g, FusionOptions { horizontal: true, ..Default::default() }, streams, seed);
        assert_equal(&g, &r);
    }
}

#[test]
fn fused_families_equal_reference() {
    let graphs = vec![
        synth::mlp(3, 16, 2).unwrap(),
        synth::transformer(2, 16, 2, 4, 1).unwrap(),
        synth::resnet_like(2, 4, 8).unwrap(),
        synth::inception_like(2, 3).unwrap(),
    ];
    for g in &graphs {
        for streams in [1, 3] {
            assert_equal(g, &run(g, FusionOptions::default(), streams, 7));
        }
    }
}

#[test]
fn decomposed_softmax_and_layernorm_kernels_equal_reference() {
    // One row kernel each (asserted in fusion_patterns); here their numbers.
    let mut g = ComputeGraph::new("rows");
    let x = g.add_input("x", F, [2, 8, 16]).unwrap();
    let gamma = g.add_weight("gamma", F, [16]).unwrap();
    let beta = g.add_weight("beta", F, [16]).unwrap();
    let two = g.add_constant_f32("two", [], &[2.0]).unwrap();
    let eps = g.add_constant_f32("eps", [], &[1e-5]).unwrap();
    let keep = |a: i64| Op::ReduceMean { axes: Some(vec![a]), keepdims: true };
    let mean = n1(&mut g, "mean", keep(-1), &[x]);
    let d = n1(&mut g, "sub", Op::Sub, &[x, mean]);
    let sq = n1(&mut g, "pow", Op::Pow, &[d, two]);
    let var = n1(&mut g, "var", keep(-1), &[sq]);
    let ve = n1(&mut g, "add_eps", Op::Add, &[var, eps]);
    let sd = n1(&mut g, "sqrt", Op::Sqrt, &[ve]);
    let nrm = n1(&mut g, "div", Op::Div, &[d, sd]);
    let sc = n1(&mut g, "mul", Op::Mul, &[nrm, gamma]);
    let ln = n1(&mut g, "ln", Op::Add, &[sc, beta]);
    let mx = n1(&mut g, "max", Op::ReduceMax { axes: Some(vec![-1]), keepdims: true }, &[ln]);
    let s = n1(&mut g, "sm_sub", Op::Sub, &[ln, mx]);
    let e = n1(&mut g, "exp", Op::Exp, &[s]);
    let sum = n1(&mut g, "sum", Op::ReduceSum { axes: Some(vec![-1]), keepdims: true }, &[e]);
    let y = n1(&mut g, "softmax", Op::Div, &[e, sum]);
    g.mark_output(y).unwrap();
    let p = fuse(&g, &FusionOptions::default());
    assert_eq!(p.groups.len(), 1, "{}", p.explain(&g));
    assert_equal(&g, &run(&g, FusionOptions::default(), 1, 3));
}
