//! Release measurement on the shared ONNX models: `cargo run --release -p exec-sim --example models -- [MODEL.onnx...]`
//! (default: every model in the repository's models/). For each: import, `check` (reference plan
//! vs an optimised 4-stream plan under a random schedule, seeded weights), wall time, and the timing model.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use exec_sim::{check, simulate, CheckOptions, LaunchMode, Schedule, TimingOptions};
use graph_plan::{ExecutionPlan, HostTensor, PlanOptions, TensorMap};
use std::time::Instant;

fn main() {
    let mut paths: Vec<String> = std::env::args().skip(1).collect();
    if paths.is_empty() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models");
        for m in ["resnet50", "mobilenet_v2", "googlenet", "bert_base"] {
            paths.push(format!("{dir}/{m}.onnx"));
        }
    }
    for p in paths {
        let t0 = Instant::now();
        let model = graph_onnx::import_file(&p, &graph_onnx::ImportOptions::default()).unwrap();
        let mut weights = TensorMap::new();
        for w in &model.weights {
            weights
                .insert(w.name.clone(), HostTensor { dtype: w.dtype, shape: w.shape.clone(), data: w.bytes.to_vec() });
        }
        let g = &model.graph;
        let opts = PlanOptions::with_streams(4);
        let t1 = Instant::now();
        let r = check(
            g,
            &opts,
            &TensorMap::new(),
            &weights,
            &CheckOptions { schedule: Schedule::Random { seed: 1 }, ..Default::default() },
        );
        let dt = t1.elapsed().as_secs_f64();
        match r {
            Ok(r) => println!(
                "{p}: import {:.2} s, check (two plans) {dt:.2} s: passed {} ({} vs {} launches, {} streams), max rel err {:e}, non-finite reference elements {}",
                (t1 - t0).as_secs_f64(),
                r.passed,
                r.reference_launches,
                r.optimised_launches,
                r.optimised_streams,
                r.outputs.iter().map(|o| o.max_rel_err).fold(0.0, f64::max),
                r.outputs.iter().map(|o| o.reference_non_finite).sum::<usize>()
            ),
            Err(e) => println!("{p}: check failed after {dt:.2} s: {e}"),
        }
        let plan = ExecutionPlan::build_with(g, &opts).unwrap();
        for mode in [LaunchMode::Eager, LaunchMode::Graph] {
            let t = simulate(&plan, &TimingOptions { overhead: mode, ..TimingOptions::for_plan(&plan) }).unwrap();
            println!(
                "  timing {mode:?}: makespan {:.1} us, bound {:.1} us, busy {:?}",
                t.makespan_us,
                t.bound_us,
                t.stream_busy_us.iter().map(|b| b.round()).collect::<Vec<_>>()
            );
        }
    }
}
