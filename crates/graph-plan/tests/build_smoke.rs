#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The pipeline builds verifying plans on every synth family, with any stream count and fusion/reuse setting.

use graph_ir::synth;
use graph_plan::{verify, ExecutionPlan, PlanOptions};

#[test]
fn families_build_and_verify() {
    let graphs = vec![
        synth::chain(50).unwrap(),
        synth::mlp(3, 32, 2).unwrap(),
        synth::transformer(2, 32, 4, 8, 1).unwrap(),
        synth::resnet_like(2, 8, 16).unwrap(),
        synth::inception_like(2, 4).unwrap(),
        synth::random_dag(300, 3, 7).unwrap(),
    ];
    for g in &graphs {
        for streams in [1, 2, 4] {
            for (fusion, reuse) in [(true, true), (false, false), (true, false), (false, true)] {
                let mut o = PlanOptions::with_streams(streams);
                o.fusion.enabled = fusion;
                o.memory.reuse = reuse;
                // The 4-stream plans trade pool bytes for overlap.
                o.memory.concurrent_lifetimes = streams == 4;
                let p = ExecutionPlan::build_with(g, &o).unwrap();
                if let Err(v) = verify(&p) {
                    panic!("{} streams={streams} fusion={fusion} reuse={reuse}: {v:?}", g.name());
                }
                assert!(p.pool_bytes as u64 >= p.stats().lower_bound_bytes);
                assert!(p.pool_bytes as u64 <= p.stats().naive_bytes);
                // The seed's contract: compute_steps counts kernel launches only.
                assert_eq!(p.compute_steps(), p.kernel_count_fused);
                assert!(p.kernel_count_fused <= p.kernel_count_original);
                // Reuse edges only add constraints: the data-only bound is never above the full one.
                assert!(p.stats().data_bound_us <= p.stats().makespan_bound_us + 1e-9);
                assert!(p.stats().makespan_bound_us <= p.stats().makespan_us + 1e-6);
                // DESIGN's bound is max(critical path, area); the energetic bound only tightens it.
                let s = p.stats();
                assert_eq!(s.makespan_bound_us, s.critical_path_us.max(s.area_us));
                assert!(s.makespan_bound_us <= s.energetic_bound_us + 1e-9);
                assert!(s.energetic_bound_us <= s.makespan_us + 1e-6);
                assert!(p.num_streams <= streams);
            }
        }
    }
}

#[test]
fn zero_streams_is_an_error() {
    let g = synth::chain(3).unwrap();
    assert!(matches!(
        ExecutionPlan::build(&g, 0),
        Err(graph_plan::PlanError::Graph(graph_ir::GraphError::InvalidOption { option, .. })) if option == "max_streams"
    ));
}

#[test]
fn the_pipeline_stops_after_each_named_pass() {
    use graph_plan::{run_pipeline, Pass};
    let g = synth::inception_like(2, 3).unwrap();
    let opts = PlanOptions::with_streams(2);
    for (pass, fusion, memory, stream) in [
        (Pass::Topo, false, false, false),
        (Pass::Fusion, true, false, false),
        (Pass::Groups, true, false, false),
        (Pass::Memory, true, true, false),
        (Pass::Stream, true, true, true),
    ] {
        let r = run_pipeline(&g, &opts, Some(pass)).unwrap();
        assert_eq!(r.fusion.is_some(), fusion, "{pass:?}");
        assert_eq!(r.groups.is_some(), fusion && pass != Pass::Fusion, "{pass:?}");
        assert_eq!(r.memory.is_some(), memory, "{pass:?}");
        assert_eq!(r.stream.is_some(), stream, "{pass:?}");
        assert_eq!(r.pass_ms.last().map(|(n, _)| n.as_str()), Some(pass.name()), "{pass:?}");
        assert_eq!(Pass::by_name(pass.name()), Some(pass));
    }
    // The full build names every pass once, in pipeline order.
    let p = ExecutionPlan::build_with(&g, &opts).unwrap();
    let names: Vec<&str> = p.stats().pass_ms.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, Pass::ALL.map(Pass::name).to_vec());
    assert_eq!(p.device(), &opts.device, "the plan carries the device profile it was made for");
}

#[test]
fn a_custom_device_profile_travels_in_the_plan() {
    let g = synth::mlp(2, 64, 1).unwrap();
    let mut opts = PlanOptions::with_streams(1);
    opts.device =
        graph_plan::DeviceProfile { name: "custom".into(), sm_count: 7, ..graph_plan::DeviceProfile::default() };
    let p = ExecutionPlan::build_with(&g, &opts).unwrap();
    let back = ExecutionPlan::from_json(&p.to_json()).unwrap();
    assert_eq!(back.device(), &opts.device);
    assert_eq!(back.device().sm_count, 7);
}

#[test]
fn finishing_a_pipeline_stopped_early_is_a_caller_error() {
    use graph_plan::{run_pipeline, Pass, PlanError};
    let g = synth::mlp(2, 64, 1).unwrap();
    let r = run_pipeline(&g, &PlanOptions::default(), Some(Pass::Memory)).unwrap();
    let e = ExecutionPlan::finish(&g, &r).unwrap_err();
    assert!(
        matches!(&e, PlanError::Graph(graph_ir::GraphError::InvalidOption { option, .. }) if option == "pipeline"),
        "{e}"
    );
}

/// The groups' estimates are made once, with the stream plan, and lowering gives them to the kernels: a
/// pipeline result without them (a caller's) finishes into the same plan, and each kernel carries its group's
/// estimate. A plan build records no fusion decisions; the pipeline run for tools does.
#[test]
fn kernels_carry_the_estimates_made_with_the_stream_plan() {
    use graph_plan::run_pipeline;
    let g = synth::inception_like(3, 4).unwrap();
    for streams in [1, 4] {
        let opts = PlanOptions::with_streams(streams);
        let mut r = run_pipeline(&g, &opts, None).unwrap();
        assert!(!r.fusion.as_ref().unwrap().decisions.is_empty());
        let estimates = r.estimates.clone().unwrap();
        let fusion = r.fusion.as_ref().unwrap();
        assert_eq!(estimates.len(), fusion.groups.len());
        let with = ExecutionPlan::finish(&g, &r).unwrap();
        verify(&with).unwrap();
        for (gi, group) in fusion.groups.iter().enumerate() {
            let expect = graph_passes::estimate::estimate_group(&g, group, &opts.device);
            assert_eq!(estimates[gi], expect, "group {gi}");
        }
        for k in with.kernels() {
            assert!(estimates.iter().any(|(c, e)| *c == k.cost && *e == k.estimate), "kernel {}", k.name);
        }
        r.estimates = None;
        let without = ExecutionPlan::finish(&g, &r).unwrap();
        assert_eq!(with.kernels(), without.kernels());
        assert_eq!(with.steps, without.steps);
        let built = ExecutionPlan::build_with(&g, &opts).unwrap();
        assert_eq!(built.kernels(), with.kernels());
        assert_eq!(built.steps, with.steps);
    }
}

/// Quality floor of the default effort (docs/benchmarks.md): on every synth family, at 1 and 4 streams and
/// with both order strategies, the pool is packed at its lower bound; `fast` (given order) builds verifying
/// plans that never go below it. (`max` is left out: ten times the budgets is too slow for a unit test.)
#[test]
fn default_effort_packs_every_family_at_its_bound() {
    use graph_passes::target::Effort;
    use graph_plan::OrderStrategy;
    let graphs = vec![
        synth::chain(200).unwrap(),
        synth::transformer(2, 64, 4, 32, 1).unwrap(),
        synth::resnet_like(3, 16, 16).unwrap(),
        synth::inception_like(3, 4).unwrap(),
        synth::random_dag(400, 3, 3).unwrap(),
    ];
    for g in &graphs {
        for streams in [1, 4] {
            for order in [OrderStrategy::Given, OrderStrategy::Memory] {
                for effort in [Effort::Fast, Effort::Default] {
                    if effort == Effort::Fast && order == OrderStrategy::Memory {
                        continue;
                    }
                    let o = PlanOptions { order, effort, ..PlanOptions::with_streams(streams) };
                    let p = ExecutionPlan::build_with(g, &o).unwrap();
                    let what = format!("{} streams={streams} order={order:?} effort={effort}", g.name());
                    assert!(verify(&p).is_ok(), "{what}: plan fails verify");
                    let bound = p.stats().lower_bound_bytes;
                    if effort == Effort::Fast {
                        assert!(p.pool_bytes as u64 >= bound, "{what}");
                    } else {
                        assert_eq!(p.pool_bytes as u64, bound, "{what}: pool above its bound");
                    }
                }
            }
        }
    }
}

/// The plan a build makes with the stream pass on its own thread beside lowering (a graph of 1,024 groups or
/// more, on a machine with two cores or more), and with the stream pass's smaller stream counts on a thread of
/// their own, is the one the sequential pipeline makes: every field and figure but the pass times, at one, two
/// and four streams, in fp32 and (through `build_owned`, whose graph the precision transform edits in place)
/// in fp16.
#[test]
fn overlapped_build_is_the_sequential_plan() {
    use graph_plan::run_pipeline;
    let g = synth::random_dag(5000, 3, 11).unwrap();
    let strip = |p: &ExecutionPlan| {
        let mut v: serde_json::Value = serde_json::from_str(&p.to_json()).unwrap();
        v["stats"]["pass_ms"] = serde_json::Value::Null;
        v
    };
    use graph_passes::precision::{Precision, PrecisionPolicy};
    for precision in [Precision::Fp32, Precision::Fp16] {
        for streams in [1, 2, 4] {
            let mut opts = PlanOptions::with_streams(streams);
            opts.precision = PrecisionPolicy::new(precision);
            let built = if precision == Precision::Fp32 {
                ExecutionPlan::build_with(&g, &opts).unwrap()
            } else {
                ExecutionPlan::build_owned(g.clone(), &opts).unwrap()
            };
            verify(&built).unwrap();
            let mut seq = opts.clone();
            seq.fusion.decisions = false;
            let r = run_pipeline(&g, &seq, None).unwrap();
            assert!(r.fusion.as_ref().unwrap().groups.len() >= 1024, "the overlapped path is taken");
            let sequential = ExecutionPlan::finish(&g, &r).unwrap();
            assert_eq!(strip(&built), strip(&sequential), "{precision:?}, {streams} streams");
            let passes: Vec<&str> = built.stats().pass_ms.iter().map(|(n, _)| n.as_str()).collect();
            let tail = ["memory", "stream", "lower", "emit", "report"];
            assert_eq!(&passes[passes.len() - tail.len()..], &tail, "pass times in pipeline order");
        }
    }
}
