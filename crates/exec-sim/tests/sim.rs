//! The simulator as a whole: errors by kind, custom kernels, fused == unfused bitwise, optimised == reference
//! under adversarial schedules with no race (proptest), a removed Wait caught by the race detector and by the
//! numbers, the timing model's bound and exact makespans, and the trace format.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use exec_sim::attention::ATTENTION_TOLERANCE;
use exec_sim::{
    check, check_plans, chrome_trace, run_plan, simulate, CheckOptions, LaunchMode, Schedule, SimError, SimExecutor,
    SimOptions, TimingOptions,
};
use graph_plan::exec::fill_missing;
use graph_plan::ir::op::CustomOp;
use graph_plan::ir::{synth, ComputeGraph, TensorSpec};
use graph_plan::{
    verify, BindingRole, DType, DeviceProfile, ExecError, ExecutionPlan, Executor, GroupKind, HostTensor, Op,
    PlanOptions, PlanStep, PreparedPlan, Shape, TensorMap,
};
use proptest::prelude::*;

fn tensors(plan: &ExecutionPlan, seed: u64) -> (TensorMap, TensorMap) {
    let (mut i, mut w) = (TensorMap::new(), TensorMap::new());
    let pos = exec_sim::positive_tensors(plan);
    fill_missing(plan, &mut i, BindingRole::Input, seed, &pos);
    fill_missing(plan, &mut w, BindingRole::Weight, seed, &pos);
    (i, w)
}

fn build(g: &ComputeGraph, opts: &PlanOptions) -> ExecutionPlan {
    let plan = ExecutionPlan::build_with(g, opts).unwrap();
    verify(&plan).unwrap();
    plan
}

fn all_finite(outs: &TensorMap) -> bool {
    outs.values().all(|t| t.to_f64().iter().all(|v| v.is_finite()))
}

#[test]
fn gather_out_of_range_is_an_error_naming_the_node() {
    let mut g = ComputeGraph::new("gather_oob");
    let d = g.add_input("data", DType::F32, [3, 2]).unwrap();
    let i = g.add_input("idx", DType::I64, [2]).unwrap();
    let y = g.add_node("lookup", Op::Gather { axis: 0 }, &[d, i]).unwrap()[0];
    g.mark_output(y).unwrap();
    let plan = build(&g, &PlanOptions::default());
    let mut inputs = TensorMap::new();
    inputs.insert("data".into(), HostTensor::from_f32([3, 2], &[0.0; 6]));
    let idx = |v: [i64; 2]| HostTensor {
        dtype: DType::I64,
        shape: Shape::new([2]),
        data: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
    };
    inputs.insert("idx".into(), idx([0, 3]));
    let mut p = SimExecutor::new().prepare(&plan, &TensorMap::new()).unwrap();
    match p.run(&inputs) {
        Err(ExecError::Backend { backend: "sim", message }) => {
            assert!(message.contains("'lookup'") && message.contains("index 3"), "{message}")
        }
        other => panic!("expected a backend error, got {other:?}"),
    }
    inputs.insert("idx".into(), idx([-3, 2]));
    let out = p.run(&inputs).unwrap();
    assert_eq!(out["lookup"].shape, Shape::new([2, 2]));
}

#[test]
fn missing_and_mismatched_tensors_are_typed_errors() {
    let g = synth::mlp(2, 8, 2).unwrap();
    let plan = build(&g, &PlanOptions::default());
    let (inputs, weights) = tensors(&plan, 1);
    let exec = SimExecutor::new();
    let mut w = weights.clone();
    w.remove("l1.b");
    assert!(matches!(exec.prepare(&plan, &w), Err(ExecError::Missing { role: "weight", name }) if name == "l1.b"));
    let mut p = exec.prepare(&plan, &weights).unwrap();
    assert!(matches!(p.run(&TensorMap::new()), Err(ExecError::Missing { role: "input", .. })));
    let mut bad = inputs.clone();
    bad.insert("x".into(), HostTensor::from_f32([2, 7], &[0.0; 14]));
    assert!(matches!(p.run(&bad), Err(ExecError::Mismatch { role: "input", .. })));
    // Runs are repeatable (scratch is poisoned each time) and depend on the inputs.
    let a = p.run(&inputs).unwrap();
    assert_eq!(a, p.run(&inputs).unwrap());
    assert!(all_finite(&a));
    let (other, _) = tensors(&plan, 2);
    assert_ne!(a, p.run(&other).unwrap());
}

#[test]
fn integer_division_by_zero_is_an_error_not_a_panic() {
    let mut g = ComputeGraph::new("idiv");
    let a = g.add_input("a", DType::I32, [2]).unwrap();
    let b = g.add_input("b", DType::I32, [2]).unwrap();
    let y = g.add_node("q", Op::Div, &[a, b]).unwrap()[0];
    g.mark_output(y).unwrap();
    let plan = build(&g, &PlanOptions::default());
    let t = |v: [i32; 2]| HostTensor {
        dtype: DType::I32,
        shape: Shape::new([2]),
        data: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
    };
    let mut inputs = TensorMap::new();
    inputs.insert("a".into(), t([4, 5]));
    inputs.insert("b".into(), t([2, 0]));
    let err = run_plan(&SimExecutor::new(), &plan, &TensorMap::new(), &inputs).unwrap_err();
    assert!(err.to_string().contains("division by zero") && err.to_string().contains("'q'"), "{err}");
}

fn custom_graph() -> ComputeGraph {
    let mut g = ComputeGraph::new("custom");
    let x = g.add_input("x", DType::F32, [3]).unwrap();
    let op = CustomOp {
        source: "extern \"C\" __global__ void twice(const float* x, float* y) {}".into(),
        entry: "twice".into(),
        grid: [1, 1, 1],
        block: [32, 1, 1],
        outputs: vec![TensorSpec { dtype: DType::F32, shape: Shape::new([3]) }],
        ..Default::default()
    };
    let c = g.add_node("k", Op::Custom(op), &[x]).unwrap()[0];
    let y = g.add_node("r", Op::Relu, &[c]).unwrap()[0];
    g.mark_output(y).unwrap();
    g
}

#[test]
fn custom_kernels_run_registered_closures_or_fail_cleanly() {
    let g = custom_graph();
    let plan = build(&g, &PlanOptions::default());
    let mut inputs = TensorMap::new();
    inputs.insert("x".into(), HostTensor::from_f32([3], &[1.0, -2.0, 3.0]));
    match SimExecutor::new().prepare(&plan, &TensorMap::new()) {
        Err(ExecError::Unsupported { kernel, what }) => {
            assert!(kernel.starts_with('k') && what.contains("'twice'") && what.contains("'k'"), "{kernel}: {what}")
        }
        other => panic!("expected Unsupported, got {other:?}"),
    }
    let mut exec = SimExecutor::new();
    exec.register_custom("twice", |ins: &[HostTensor]| {
        let v: Vec<f32> = ins[0].to_f32().ok_or("not f32")?.iter().map(|x| 2.0 * x).collect();
        Ok(vec![HostTensor::from_f32(ins[0].shape.clone(), &v)])
    });
    let out = run_plan(&exec, &plan, &TensorMap::new(), &inputs).unwrap();
    assert_eq!(out["r"].to_f32().unwrap(), vec![2.0, 0.0, 6.0]);
}

#[test]
fn fused_elementwise_chains_are_bitwise_equal_to_unfused_in_f32_and_f16() {
    for dtype in [DType::F32, DType::F16] {
        let mut g = ComputeGraph::new("chain");
        let mut x = g.add_input("x", dtype, [1, 257]).unwrap();
        let ops = [
            Op::Tanh,
            Op::Sigmoid,
            Op::Exp,
            Op::Sqrt,
            Op::Gelu { approximate: Default::default() },
            Op::Silu,
            Op::Erf,
            Op::HardSwish,
            Op::Log,
        ];
        for (i, op) in ops.iter().cycle().take(30).enumerate() {
            x = g.add_node(&format!("n{i}"), op.clone(), &[x]).unwrap()[0];
        }
        g.mark_output(x).unwrap();
        let fused = build(&g, &PlanOptions::default());
        assert!(fused.kernel_count_fused < 5, "the chain should fuse: {} launches", fused.kernel_count_fused);
        let r =
            check(&g, &PlanOptions::default(), &TensorMap::new(), &TensorMap::new(), &CheckOptions::default()).unwrap();
        assert!(r.passed && r.outputs.iter().all(|o| o.bitwise_equal), "{dtype}: {r:?}");
    }
}

/// Remove the `k`-th Wait of `plan`.
fn without_wait(plan: &ExecutionPlan, k: usize) -> ExecutionPlan {
    let mut p = plan.clone();
    let idx = p.steps.iter().enumerate().filter(|(_, s)| matches!(s, PlanStep::Wait { .. })).nth(k).unwrap().0;
    p.steps.remove(idx);
    p
}

#[test]
fn a_removed_wait_is_caught_by_the_race_detector_and_changes_results_under_some_seed() {
    let mut found = None;
    'search: for seed in 0..40u64 {
        let g = synth::random_dag(40, 3, seed).unwrap();
        let plan = build(&g, &PlanOptions::with_streams(4));
        let waits = plan.steps.iter().filter(|s| matches!(s, PlanStep::Wait { .. })).count();
        for k in 0..waits {
            let broken = without_wait(&plan, k);
            let (inputs, weights) = tensors(&plan, seed);
            // Race detector: fires whatever the order, here in submission order.
            let raced = match run_plan(&SimExecutor::new(), &broken, &weights, &inputs) {
                Err(SimError::Race(r)) => Some(r),
                _ => None,
            };
            let Some(race) = raced else { continue };
            let want = run_plan(&SimExecutor::new(), &plan, &weights, &inputs).unwrap();
            for s in 0..12u64 {
                let exec = SimExecutor::with_options(SimOptions {
                    schedule: Schedule::Random { seed: s },
                    race_check: false,
                    poison: true,
                });
                let got = run_plan(&exec, &broken, &weights, &inputs).unwrap();
                if got != want {
                    found = Some((g.name().to_string(), k, s, race));
                    break 'search;
                }
            }
        }
    }
    let (graph, k, s, race) = found.expect("no plan where a removed wait shows");
    assert_ne!(race.first.stream, race.second.stream, "{race}");
    assert!(race.to_string().contains("race on"), "{race}");
    eprintln!("{graph}: removing wait #{k} races ({race}) and changes outputs under seed {s}");
}

#[test]
fn random_schedules_reorder_streams_and_respect_record_wait() {
    let g = synth::random_dag(60, 3, 5).unwrap();
    let plan = build(&g, &PlanOptions::with_streams(4));
    assert!(plan.num_streams > 1);
    let deps = exec_sim::schedule::wait_dependencies(&plan);
    let mut some_differs = false;
    for seed in 0..6 {
        let order = exec_sim::schedule::execution_order(&plan, Schedule::Random { seed });
        let mut pos = vec![0; order.len()];
        for (p, &i) in order.iter().enumerate() {
            pos[i] = p;
        }
        let mut sorted = order.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..plan.steps.len()).collect::<Vec<_>>());
        for (i, s) in plan.steps.iter().enumerate() {
            if let Some(r) = deps[i] {
                assert!(pos[r] < pos[i]);
            }
            // stream order
            if let Some(j) = (i + 1..plan.steps.len()).find(|&j| plan.steps[j].stream() == s.stream()) {
                assert!(pos[i] < pos[j]);
            }
        }
        some_differs |= order != (0..plan.steps.len()).collect::<Vec<_>>();
    }
    assert!(some_differs);
}

/// Two independent launches on two streams.
fn two_branch_plan() -> ExecutionPlan {
    let mut g = ComputeGraph::new("two");
    let x = g.add_input("x", DType::F32, [1024]).unwrap();
    let a = g.add_node("a", Op::Relu, &[x]).unwrap()[0];
    let b = g.add_node("b", Op::Neg, &[x]).unwrap()[0];
    g.mark_output(a).unwrap();
    g.mark_output(b).unwrap();
    build(&g, &PlanOptions::with_streams(2))
}

fn device(eager: f64, graph: f64) -> DeviceProfile {
    DeviceProfile { launch_overhead_eager_us: eager, launch_overhead_graph_us: graph, ..DeviceProfile::h200() }
}

fn set_estimate(plan: &mut ExecutionPlan, node: &str, time_us: f64, occupancy: f64) {
    let k = plan.kernels_mut().iter_mut().find(|k| k.node_names().any(|n| n == node)).unwrap();
    k.estimate.time_us = time_us;
    k.estimate.occupancy = occupancy;
}

#[test]
fn timing_exact_makespan_of_two_concurrent_launches_sharing_sms() {
    let mut plan = two_branch_plan();
    assert_eq!(plan.num_streams, 2);
    set_estimate(&mut plan, "a", 10.0, 0.6);
    set_estimate(&mut plan, "b", 10.0, 0.6);
    let opts = TimingOptions { device: device(0.0, 0.0), overhead: LaunchMode::Eager };
    let t = simulate(&plan, &opts).unwrap();
    // Occupancy 1.2 > 1: both progress at 1/1.2 and end together at 12 us.
    assert!((t.makespan_us - 12.0).abs() < 1e-9, "{}", t.makespan_us);
    assert!((t.bound_us - 12.0).abs() < 1e-9);
    assert!((t.critical_path_us - 10.0).abs() < 1e-9);
    assert_eq!(t.stream_busy_us.len(), 2);
    set_estimate(&mut plan, "b", 10.0, 0.4);
    let t = simulate(&plan, &opts).unwrap();
    assert!((t.makespan_us - 10.0).abs() < 1e-9, "{}", t.makespan_us);
    // Eager overhead adds 4 us to each launch; graph replay 1 us.
    let t = simulate(&plan, &TimingOptions { device: device(4.0, 1.0), overhead: LaunchMode::Eager }).unwrap();
    assert!((t.makespan_us - 14.0).abs() < 1e-9, "{}", t.makespan_us);
    assert_eq!((t.launch_overhead_eager_us, t.launch_overhead_graph_us), (8.0, 2.0));
}

#[test]
fn timing_exact_makespan_with_a_cross_stream_wait() {
    // a (s0) and b (s1) run concurrently; c needs both, so one stream waits for the other's record.
    let mut g = ComputeGraph::new("join");
    let x = g.add_input("x", DType::F32, [1024]).unwrap();
    let a = g.add_node("a", Op::Relu, &[x]).unwrap()[0];
    let b = g.add_node("b", Op::Neg, &[x]).unwrap()[0];
    let c = g.add_node("c", Op::Add, &[a, b]).unwrap()[0];
    g.mark_output(c).unwrap();
    // Fusion off: fused, the diamond is one loop kernel; the wait between streams is what is timed here.
    let mut opts = PlanOptions::with_streams(2);
    opts.fusion.enabled = false;
    let mut plan = build(&g, &opts);
    assert_eq!(plan.num_streams, 2);
    assert_eq!(plan.steps.iter().filter(|s| matches!(s, PlanStep::Wait { .. })).count(), 1, "{plan}");
    set_estimate(&mut plan, "a", 10.0, 1.0);
    set_estimate(&mut plan, "b", 4.0, 0.25);
    set_estimate(&mut plan, "c", 5.0, 1.0);
    let t = simulate(&plan, &TimingOptions { device: device(9.0, 1.0), overhead: LaunchMode::Graph }).unwrap();
    // With 1 us overhead: a 11, b 5, c 6. a + b load 1.25 -> rate 0.8: b ends at 6.25 (a has done 5 of 11),
    // a ends at 6.25 + 6 = 12.25, c runs 12.25 .. 18.25. Bound: area 11 + 1.25 + 6 = 18.25 (path 17).
    assert!((t.makespan_us - 18.25).abs() < 1e-9, "{}", t.makespan_us);
    assert!((t.critical_path_us - 17.0).abs() < 1e-9);
    assert!((t.bound_us - 18.25).abs() < 1e-9);
    assert!(t.makespan_us >= t.bound_us - 1e-9);
}

#[test]
fn trace_has_the_required_fields_tracks_flows_and_counters() {
    let g = synth::random_dag(50, 3, 7).unwrap();
    let plan = build(&g, &PlanOptions::with_streams(3));
    let t = simulate(&plan, &TimingOptions::for_plan(&plan)).unwrap();
    let trace = chrome_trace(&plan, &t);
    let text = trace.to_string();
    let parsed: serde_json::Value = serde_json::from_str(&text).unwrap();
    let events = parsed["traceEvents"].as_array().unwrap();
    let mut complete = 0;
    for e in events {
        for field in ["name", "ph", "ts", "pid", "tid"] {
            assert!(e.get(field).is_some(), "missing {field} in {e}");
        }
        if e["ph"] == "X" {
            assert!(e["dur"].as_f64().unwrap() >= 0.0);
            complete += 1;
        }
    }
    let launches = plan.steps.iter().filter(|s| matches!(s, PlanStep::Launch { .. })).count();
    assert!(complete >= launches);
    for s in 0..plan.num_streams {
        assert!(events.iter().any(|e| e["ph"] == "M" && e["args"]["name"] == format!("stream {s}")));
    }
    let waits = plan.steps.iter().filter(|s| matches!(s, PlanStep::Wait { .. })).count();
    assert!(waits > 0);
    assert_eq!(events.iter().filter(|e| e["ph"] == "s").count(), waits);
    assert_eq!(events.iter().filter(|e| e["ph"] == "f").count(), waits);
    let counters: Vec<&serde_json::Value> = events.iter().filter(|e| e["ph"] == "C").collect();
    assert!(counters.len() > 2);
    let peak = counters.iter().map(|e| e["args"]["bytes"].as_u64().unwrap()).max().unwrap();
    assert!(peak > 0 && peak <= plan.pool_bytes as u64, "peak {peak} pool {}", plan.pool_bytes);
    let last = counters.last().unwrap()["args"]["bytes"].as_u64().unwrap();
    assert_eq!(last, 0);
}

#[test]
fn check_reports_a_difference_with_its_size() {
    let g = synth::mlp(2, 8, 2).unwrap();
    let reference = build(&g, &PlanOptions::reference());
    let mut other = build(&g, &PlanOptions::default());
    // Perturb a weight-free constant path: change one Add into a Sub in the optimised plan's programs.
    for k in other.kernels_mut() {
        for ins in &mut k.body {
            if &*ins.node == "l1.bias" {
                ins.op = Op::Sub;
            }
        }
    }
    let r = check_plans(&reference, &other, &TensorMap::new(), &TensorMap::new(), &CheckOptions::default()).unwrap();
    assert!(!r.passed);
    assert!(r.outputs[0].max_abs_err > 0.0 && r.outputs[0].differing > 0 && !r.outputs[0].bitwise_equal);
}

fn plan_options(streams: usize, fusion: bool, reuse: bool) -> PlanOptions {
    let mut o = PlanOptions::with_streams(streams);
    o.fusion.enabled = fusion;
    o.memory.reuse = reuse;
    o.memory.in_place = reuse;
    o
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Random DAGs, 1..8 streams, fusion and reuse on or off, random schedules: the optimised plan verifies,
    /// races nowhere and reproduces the reference bitwise; the timing model's makespan is at least its bound.
    #[test]
    fn optimised_equals_reference_on_random_dags(
        n in 3usize..70, fan_in in 1usize..4, gseed in 0u64..1000,
        streams in 1usize..=8, fusion in any::<bool>(), reuse in any::<bool>(), sseed in 0u64..1000,
    ) {
        let g = synth::random_dag(n, fan_in, gseed).unwrap();
        let opts = plan_options(streams, fusion, reuse);
        let plan = build(&g, &opts);
        let r = check(&g, &opts, &TensorMap::new(), &TensorMap::new(),
            &CheckOptions { schedule: Schedule::Random { seed: sseed }, ..CheckOptions::default() }).unwrap();
        // Bitwise, except under a fused attention kernel (a MatMul -> Softmax -> MatMul chain in the DAG), whose
        // online softmax is held to its documented tolerance (random_dag 42/1/248: 2.5e-7).
        let attention = plan.kernels().iter().any(|k| k.kind == GroupKind::Attention);
        prop_assert!(r.passed, "{:?}", r);
        prop_assert!(r.outputs.iter().all(|o| if attention { o.max_rel_err <= ATTENTION_TOLERANCE } else { o.bitwise_equal }),
            "{:?}", r);
        prop_assert!(r.outputs.iter().all(|o| o.reference_non_finite == 0), "{:?}", r);
        let t = simulate(&plan, &TimingOptions::for_plan(&plan)).unwrap();
        prop_assert!(t.makespan_us >= t.bound_us * (1.0 - 1e-12), "{} < {}", t.makespan_us, t.bound_us);
        let t = simulate(&plan, &TimingOptions { overhead: LaunchMode::Graph, ..TimingOptions::for_plan(&plan) }).unwrap();
        prop_assert!(t.makespan_us >= t.bound_us * (1.0 - 1e-12));
    }

    /// Small transformers and ResNets under the same property (fused transformers: within the attention
    /// kernel's tolerance, `exec_sim::attention::ATTENTION_TOLERANCE`).
    #[test]
    fn optimised_equals_reference_on_small_models(
        which in 0usize..2, streams in 1usize..=8, fusion in any::<bool>(), reuse in any::<bool>(), sseed in 0u64..1000,
    ) {
        let g = if which == 0 { synth::transformer(1, 16, 2, 4, 1).unwrap() } else { synth::resnet_like(2, 4, 8).unwrap() };
        let opts = plan_options(streams, fusion, reuse);
        let plan = build(&g, &opts);
        let (inputs, weights) = tensors(&plan, sseed);
        let r = check(&g, &opts, &inputs, &weights,
            &CheckOptions { schedule: Schedule::Random { seed: sseed }, ..CheckOptions::default() }).unwrap();
        if which == 0 && fusion {
            // The fused attention kernel's online softmax rounds differently from the unfused chain.
            let worst = r.outputs.iter().map(|o| o.max_rel_err).fold(0f64, f64::max);
            prop_assert!(r.passed && worst <= exec_sim::attention::ATTENTION_TOLERANCE, "{:?}", r);
        } else {
            // Bitwise, except under a fused attention kernel (a MatMul -> Softmax -> MatMul chain in the DAG), whose
        // online softmax is held to its documented tolerance (random_dag 42/1/248: 2.5e-7).
        let attention = plan.kernels().iter().any(|k| k.kind == GroupKind::Attention);
        prop_assert!(r.passed, "{:?}", r);
        prop_assert!(r.outputs.iter().all(|o| if attention { o.max_rel_err <= ATTENTION_TOLERANCE } else { o.bitwise_equal }),
            "{:?}", r);
        }
        let out = run_plan(&SimExecutor::new(), &plan, &weights, &inputs).unwrap();
        prop_assert!(all_finite(&out));
        let t = simulate(&plan, &TimingOptions::for_plan(&plan)).unwrap();
        prop_assert!(t.makespan_us >= t.bound_us * (1.0 - 1e-12));
    }
}

#[test]
fn memcpy_nodes_run_as_copy_steps() {
    let mut g = ComputeGraph::new("copy");
    let x = g.add_input("x", DType::F32, [4]).unwrap();
    let r = g.add_node("r", Op::Relu, &[x]).unwrap()[0];
    let h = g.add_node("to_host", Op::Memcpy { to: graph_plan::ir::op::MemSpace::Host }, &[r]).unwrap()[0];
    let y = g.add_node("y", Op::Neg, &[h]).unwrap()[0];
    g.mark_output(y).unwrap();
    for streams in [1, 2] {
        let plan = build(&g, &PlanOptions::with_streams(streams));
        assert!(
            plan.steps.iter().any(|s| matches!(s, PlanStep::Copy { node: Some(n), .. } if &**n == "to_host")),
            "{plan}"
        );
        let mut inputs = TensorMap::new();
        inputs.insert("x".into(), HostTensor::from_f32([4], &[-1.0, 2.0, -3.0, 4.0]));
        let out = run_plan(&SimExecutor::new(), &plan, &TensorMap::new(), &inputs).unwrap();
        assert_eq!(out["y"].to_f32().unwrap(), vec![0.0, -2.0, 0.0, -4.0]);
        let t = simulate(&plan, &TimingOptions::for_plan(&plan)).unwrap();
        assert_eq!(t.launches, 3);
    }
}

/// The same half computation written with mixed-precision nodes (`Node::store`) and with the casts they stand
/// for: a LayerNorm reading f16 with f32 weights and storing f16, an Add of f16 and f32 storing f16, a Softmax
/// reading f16 and storing f32.
fn mixed_or_casts(mixed: bool) -> ComputeGraph {
    let (f16, f32) = (DType::F16, DType::F32);
    let mut g = ComputeGraph::new(if mixed { "mixed" } else { "casts" });
    let x = g.add_input("x", f16, [2, 64]).unwrap();
    let y = g.add_input("y", f32, [2, 64]).unwrap();
    let s = g.add_weight("s", f32, [64]).unwrap();
    let b = g.add_weight("b", f32, [64]).unwrap();
    let ln_op = Op::LayerNormalization { axis: -1, epsilon: 1e-5 };
    let (ln, q) = if mixed {
        let ln = g.add_node_stored("ln", ln_op, &[x, s, b], &["ln"], Some(f16)).unwrap()[0];
        let q = g.add_node_stored("q", Op::Add, &[ln, y], &["q"], Some(f16)).unwrap()[0];
        (ln, q)
    } else {
        let xc = g.add_node("xc", Op::Cast { to: f32 }, &[x]).unwrap()[0];
        let ln32 = g.add_node("ln32", ln_op, &[xc, s, b]).unwrap()[0];
        let ln = g.add_node("ln16", Op::Cast { to: f16 }, &[ln32]).unwrap()[0];
        let lc = g.add_node("lc", Op::Cast { to: f32 }, &[ln]).unwrap()[0];
        let q32 = g.add_node("q32", Op::Add, &[lc, y]).unwrap()[0];
        (ln, g.add_node("q16", Op::Cast { to: f16 }, &[q32]).unwrap()[0])
    };
    let e = g.add_node("e", Op::Exp, &[q]).unwrap()[0];
    let p = if mixed {
        g.add_node_stored("p", Op::Softmax { axis: -1 }, &[e], &["p"], Some(f32)).unwrap()[0]
    } else {
        let ec = g.add_node("ec", Op::Cast { to: f32 }, &[e]).unwrap()[0];
        g.add_node("p32", Op::Softmax { axis: -1 }, &[ec]).unwrap()[0]
    };
    g.mark_output(ln).unwrap();
    g.mark_output(p).unwrap();
    g
}

#[test]
fn mixed_precision_nodes_compute_what_their_casts_would() {
    let mixed = mixed_or_casts(true);
    let casts = mixed_or_casts(false);
    assert_eq!(mixed.tensor(mixed.outputs()[0]).dtype, DType::F16);
    assert_eq!(mixed.tensor(mixed.outputs()[1]).dtype, DType::F32);
    // The store dtype survives the JSON format.
    let back = graph_plan::ir::json::from_json(&mixed.to_json()).unwrap();
    let stores: Vec<_> = back.nodes().map(|(_, n)| (n.name.clone(), n.store)).collect();
    assert!(stores.contains(&("ln".into(), Some(DType::F16))) && stores.contains(&("p".into(), Some(DType::F32))));
    let (pm, pc) = (build(&mixed, &PlanOptions::default()), build(&casts, &PlanOptions::default()));
    assert!(pm.kernel_count_fused <= pc.kernel_count_fused);
    for seed in 0..3 {
        let (inputs, weights) = tensors(&pm, seed);
        let om = run_plan(&SimExecutor::new(), &pm, &weights, &inputs).unwrap();
        let oc = run_plan(&SimExecutor::new(), &pc, &weights, &inputs).unwrap();
        let (ln_m, ln_c) = (&om["ln"], &oc["ln16"]);
        assert_eq!(ln_m.dtype, DType::F16);
        assert_eq!(ln_m.data, ln_c.data, "seed {seed}: the LayerNorm differs");
        assert_eq!(om["p"].data, oc["p32"].data, "seed {seed}: the Softmax differs");
    }
    // Fused against the unfused reference plan, bit for bit.
    let r =
        check(&mixed, &PlanOptions::default(), &TensorMap::new(), &TensorMap::new(), &CheckOptions::default()).unwrap();
    assert!(r.passed && r.outputs.iter().all(|o| o.bitwise_equal), "{r:?}");
}

#[test]
fn a_store_dtype_is_refused_where_it_has_no_meaning() {
    let mut g = ComputeGraph::new("bad_store");
    let a = g.add_input("a", DType::F16, [4, 4]).unwrap();
    let w = g.add_weight("w", DType::F32, [4, 4]).unwrap();
    let e = g.add_node_stored("mm", Op::MatMul, &[a, w], &["mm"], Some(DType::F16)).unwrap_err();
    assert!(matches!(&e, graph_plan::ir::GraphError::DTypeMismatch { node, .. } if node == "mm"), "{e}");
    let e = g.add_node_stored("r", Op::Relu, &[a], &["r"], Some(DType::I32)).unwrap_err();
    assert!(
        matches!(&e, graph_plan::ir::GraphError::DTypeMismatch { node, detail, .. }
        if node == "r" && detail.contains("store i32")),
        "{e}"
    );
    // Without a store dtype, mixed operands stay an error.
    let e = g.add_node("add", Op::Add, &[a, w]).unwrap_err();
    assert!(matches!(&e, graph_plan::ir::GraphError::DTypeMismatch { .. }), "{e}");
}
