//! Plan sets on the simulator: a padded (or chunked) request equals the exact plan of its size bit for bit,
//! for every request size, on one prepared set.
#![allow(clippy::unwrap_used, clippy::expect_used)] // helpers of tests

use exec_sim::{SimExecutor, SimOptions};
use graph_plan::ir::op::ConvAttrs;
use graph_plan::ir::{ComputeGraph, DType, Op};
use graph_plan::set::{BucketSpec, Dims, LoadError, SetOptions};
use graph_plan::{verify, verify_set, ExecutionPlan, PlanOptions, PlanSet, TensorMap};
use proptest::prelude::*;

fn d(b: usize) -> Dims {
    [("batch".to_string(), b)].into_iter().collect()
}

/// A small CNN: conv 3x3 (pad 1) -> relu -> global average pool -> flatten -> gemm -> softmax, and a
/// layer-normalised MLP branch; batch on axis 0 everywhere.
fn cnn(dims: &Dims) -> Result<ComputeGraph, LoadError> {
    let b = *dims.get("batch").ok_or("no batch")?;
    let mut g = ComputeGraph::new("cnn");
    let x = g.add_input("x", DType::F32, [b, 3, 6, 6])?;
    let w = g.add_weight("w", DType::F32, [4, 3, 3, 3])?;
    let attrs = ConvAttrs { pads: vec![1, 1, 1, 1], ..Default::default() };
    let c = g.add_node("conv", Op::Conv(attrs), &[x, w])?[0];
    let r = g.add_node("relu", Op::Relu, &[c])?[0];
    let p = g.add_node("gap", Op::GlobalAveragePool, &[r])?[0];
    let f = g.add_node("flat", Op::Flatten { axis: 1 }, &[p])?[0];
    let fc = g.add_weight("fc", DType::F32, [4, 5])?;
    let gm = g.add_node("gemm", Op::Gemm { alpha: 1.0, beta: 1.0, trans_a: false, trans_b: false }, &[f, fc])?[0];
    let s = g.add_node("softmax", Op::Softmax { axis: -1 }, &[gm])?[0];
    g.mark_output(s)?;
    let gamma = g.add_weight("gamma", DType::F32, [5])?;
    let beta = g.add_weight("beta", DType::F32, [5])?;
    let ln = g.add_node("ln", Op::LayerNormalization { axis: -1, epsilon: 1e-5 }, &[gm, gamma, beta])?[0];
    let t = g.add_node("tanh", Op::Tanh, &[ln])?[0];
    g.mark_output(t)?;
    Ok(g)
}

fn exact(b: usize, opts: &PlanOptions, seed: u64) -> (ExecutionPlan, TensorMap, TensorMap) {
    let g = cnn(&d(b)).unwrap();
    let plan = ExecutionPlan::build_with(&g, opts).unwrap();
    assert!(verify(&plan).is_ok());
    let (mut inputs, mut weights) = (TensorMap::new(), TensorMap::new());
    exec_sim::fill_tensors(&plan, &mut inputs, &mut weights, seed);
    (plan, inputs, weights)
}

fn set(buckets: &str, opts: &PlanOptions) -> PlanSet {
    let spec = BucketSpec::parse(&[buckets]).unwrap();
    let set = PlanSet::build(&spec, &SetOptions { plan: opts.clone(), ..Default::default() }, cnn).unwrap();
    verify_set(&set).unwrap();
    set
}

#[test]
fn every_request_size_equals_the_exact_plan_bit_for_bit() {
    for streams in [1, 3] {
        let opts = PlanOptions::with_streams(streams);
        let s = set("batch=1,2,4,8", &opts);
        assert!(s.padding()[0].safe(), "{:?}", s.padding());
        // Weights do not depend on the batch: one set of values serves every request.
        let (_, _, weights) = exact(1, &opts, 7);
        let exec = SimExecutor::with_options(SimOptions { race_check: true, poison: true, ..Default::default() });
        let mut prepared = exec.prepare_set(&s, &weights).unwrap();
        // Sizes out of order, so that every member runs after another on the same memory.
        for b in [3, 1, 8, 5, 2, 7, 4, 6, 3] {
            let (plan, inputs, _) = exact(b, &opts, b as u64);
            let want = exec_sim::run_plan(&exec, &plan, &weights, &inputs).unwrap();
            let got = prepared.run_request(&d(b), &inputs, false).unwrap();
            assert_eq!(got, want, "batch {b} at {streams} streams");
        }
        // Above the largest bucket: an error, or chunks that still equal the exact plan.
        let (plan, inputs, _) = exact(19, &opts, 19);
        assert!(prepared.run_request(&d(19), &inputs, false).is_err());
        let want = exec_sim::run_plan(&exec, &plan, &weights, &inputs).unwrap();
        assert_eq!(prepared.run_request(&d(19), &inputs, true).unwrap(), want);
    }
}

#[test]
fn bad_requests_are_typed_errors() {
    let opts = PlanOptions::default();
    let s = set("batch=2,4", &opts);
    let (_, inputs3, weights) = exact(3, &opts, 1);
    let mut prepared = SimExecutor::new().prepare_set(&s, &weights).unwrap();
    // The input's shape must be the request's.
    let e = prepared.run_request(&d(2), &inputs3, false).unwrap_err();
    assert!(e.to_string().contains("'x'"), "{e}");
    let e = prepared.run_request(&d(2), &TensorMap::new(), false).unwrap_err();
    assert!(e.to_string().contains("missing"), "{e}");
    // Missing weights at prepare.
    assert!(SimExecutor::new().prepare_set(&s, &TensorMap::new()).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]
    #[test]
    fn random_buckets_and_requests_match_exact(
        mut buckets in proptest::collection::btree_set(1usize..7, 1..4),
        requests in proptest::collection::vec(1usize..12, 1..4),
        streams in 1usize..3,
    ) {
        let list: Vec<String> = buckets.iter().map(ToString::to_string).collect();
        let opts = PlanOptions::with_streams(streams);
        let s = set(&format!("batch={}", list.join(",")), &opts);
        let (_, _, weights) = exact(1, &opts, 3);
        let exec = SimExecutor::new();
        let mut prepared = exec.prepare_set(&s, &weights).unwrap();
        let largest = buckets.pop_last().unwrap();
        for b in requests {
            let (plan, inputs, _) = exact(b, &opts, b as u64 + 100);
            let want = exec_sim::run_plan(&exec, &plan, &weights, &inputs).unwrap();
            let chunk = b > largest;
            prop_assert_eq!(prepared.run_request(&d(b), &inputs, chunk).unwrap(), want);
        }
    }
}
