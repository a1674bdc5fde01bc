//! Release measurements: `cargo run --release -p exec-sim --example measure -- [blocks] [channels] [image]`.
//! Runs `check` (reference plan vs an optimised 4-stream plan under a random schedule) on `synth::resnet_like`
//! and prints wall times.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use exec_sim::{check, simulate, CheckOptions, Schedule, TimingOptions};
use graph_plan::ir::synth;
use graph_plan::{ExecutionPlan, PlanOptions, TensorMap};
use std::time::Instant;

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (blocks, channels, image) =
        (args.first().copied().unwrap_or(16), args.get(1).copied().unwrap_or(64), args.get(2).copied().unwrap_or(56));
    let g = synth::resnet_like(blocks, channels, image).unwrap();
    let t0 = Instant::now();
    let opts = PlanOptions::with_streams(4);
    let r = check(
        &g,
        &opts,
        &TensorMap::new(),
        &TensorMap::new(),
        &CheckOptions { schedule: Schedule::Random { seed: 1 }, ..Default::default() },
    )
    .unwrap();
    let dt = t0.elapsed().as_secs_f64();
    println!(
        "resnet_like({blocks}, {channels}, {image}): check (two plans) {dt:.2} s, passed {}, outputs {:?}",
        r.passed,
        r.outputs.iter().map(|o| (o.name.clone(), o.max_abs_err)).collect::<Vec<_>>()
    );
    let plan = ExecutionPlan::build_with(&g, &opts).unwrap();
    let t = simulate(&plan, &TimingOptions::for_plan(&plan)).unwrap();
    println!("timing: makespan {:.1} us, bound {:.1} us, busy {:?}", t.makespan_us, t.bound_us, t.stream_busy_us);
}
