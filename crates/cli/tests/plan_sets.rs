//! Plan sets of the dynamic-batch models in `models/dynamic/`: the shared layout's figures, and padded runs equal
//! to the exact plan of each request size bit for bit on exec-sim.
//!
//! CI runs every model's set and the numerics of the two small CNNs at every size up to the largest bucket; the
//! ignored test runs every model at every size of `batch=1,2,4,8` (`cargo test -p cuplan --test plan_sets --
//! --ignored`; the workspace's test profile is optimised).
#![allow(clippy::unwrap_used, clippy::expect_used)] // helpers of tests

use cuplan::load::{GraphArgs, Source};
use exec_sim::{SimExecutor, SimOptions};
use graph_plan::set::{BucketSpec, Dims, SetOptions};
use graph_plan::{verify, verify_set, ExecutionPlan, PlanOptions, PlanSet, Region, TensorMap};
use std::path::PathBuf;

const MODELS: [&str; 4] = ["bert_base", "googlenet", "mobilenet_v2", "resnet50"];

fn source(model: &str) -> Source {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/dynamic").join(format!("{model}.onnx"));
    Source::read(&GraphArgs { graph: path.to_string_lossy().into_owned(), dims: Vec::new() }).unwrap()
}

fn batch(b: usize) -> Dims {
    [("batch".to_string(), b)].into_iter().collect()
}

fn build(src: &Source, buckets: &str, opts: &PlanOptions) -> (PlanSet, TensorMap) {
    let weights = src.load_at(&batch(1)).unwrap().weights;
    let spec = BucketSpec::parse(&[buckets]).unwrap();
    let set = PlanSet::build(&spec, &SetOptions { plan: opts.clone(), ..Default::default() }, |d| {
        Ok(src.graph_at(d).map_err(|e| format!("{e:#}"))?)
    })
    .unwrap();
    verify_set(&set).unwrap();
    (set, weights)
}

/// Run every request size in `sizes` padded on the set and exactly, and compare bit for bit.
fn padded_equals_exact(model: &str, buckets: &str, sizes: &[usize]) {
    let src = source(model);
    let opts = PlanOptions::with_streams(2);
    let (set, mut weights) = build(&src, buckets, &opts);
    let exec = SimExecutor::with_options(SimOptions { race_check: false, poison: true, ..Default::default() });
    // Seeded weights once (the model's are stripped), from the smallest exact plan: they do not depend on batch.
    let g1 = src.load_at(&batch(1)).unwrap().graph;
    let p1 = ExecutionPlan::build_with(&g1, &opts).unwrap();
    exec_sim::fill_tensors(&p1, &mut TensorMap::new(), &mut weights, 11);
    let mut prepared = exec.prepare_set(&set, &weights).unwrap();
    for &b in sizes {
        let g = src.load_at(&batch(b)).unwrap().graph;
        let plan = ExecutionPlan::build_with(&g, &opts).unwrap();
        assert!(verify(&plan).is_ok());
        let mut inputs = TensorMap::new();
        exec_sim::fill_tensors(&plan, &mut inputs, &mut TensorMap::new(), b as u64);
        let want = exec_sim::run_plan(&exec, &plan, &weights, &inputs).unwrap();
        let got = prepared.run_request(&batch(b), &inputs, false).unwrap();
        assert_eq!(got.keys().collect::<Vec<_>>(), want.keys().collect::<Vec<_>>());
        for (name, w) in &want {
            assert!(got[name] == *w, "{model} batch {b}: output '{name}' differs from the exact plan's");
        }
    }
}

#[test]
fn every_dynamic_model_plans_as_one_set() {
    for m in MODELS {
        let src = source(m);
        let (set, _) = build(&src, "batch=1,2,4,8", &PlanOptions::default());
        assert!(set.padding()[0].safe(), "{m}: {:?}", set.padding());
        let largest = set.members().iter().map(|x| x.plan.region_bytes(Region::Pool)).max().unwrap();
        assert_eq!(set.pool_bytes(), largest, "{m}");
        assert!(set.sum_pool_bytes() > set.pool_bytes(), "{m}");
        // The weights region is the batch-1 plan's: weights are shared, not repeated per member.
        let alone = ExecutionPlan::build(&src.load_at(&batch(1)).unwrap().graph, 1).unwrap();
        assert!(set.region_bytes(Region::Weights) >= alone.region_bytes(Region::Weights));
        assert!(set.region_bytes(Region::Weights) < 2 * alone.region_bytes(Region::Weights).max(1), "{m}");
        // Io sized for the largest member.
        let big = ExecutionPlan::build(&src.load_at(&batch(8)).unwrap().graph, 1).unwrap();
        assert_eq!(set.region_bytes(Region::Io), big.region_bytes(Region::Io), "{m}");
    }
}

#[test]
fn small_cnns_padded_equal_exact_at_every_size() {
    padded_equals_exact("mobilenet_v2", "batch=1,2,4", &[1, 2, 3, 4]);
    padded_equals_exact("googlenet", "batch=1,3", &[1, 2, 3]);
}

#[test]
#[ignore = "minutes of simulation: run with -- --ignored"]
fn every_dynamic_model_padded_equals_exact_at_every_size() {
    for m in MODELS {
        padded_equals_exact(m, "batch=1,2,4,8", &[1, 2, 3, 4, 5, 6, 7, 8]);
    }
}
