//! exec-sim numeric throughput: one prepared transformer block run on the simulator (optimised plan, submission
//! order with race check, and a random schedule), plus the timing model on the same plan.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use exec_sim::{fill_tensors, simulate, Schedule, SimExecutor, SimOptions, TimingOptions};
use graph_plan::ir::synth;
use graph_plan::{ExecutionPlan, PlanOptions, PreparedPlan, TensorMap};

fn transformer_block(c: &mut Criterion) {
    // One pre-norm block, hidden 256, 4 heads, 128 tokens: ~0.2 GFLOP per run.
    let g = synth::transformer(1, 256, 4, 128, 1).unwrap();
    let plan = ExecutionPlan::build_with(&g, &PlanOptions::with_streams(4)).unwrap();
    let (mut inputs, mut weights) = (TensorMap::new(), TensorMap::new());
    fill_tensors(&plan, &mut inputs, &mut weights, 1);
    let flops: u64 = plan.kernels().iter().map(|k| k.cost.flops).sum();
    let mut group = c.benchmark_group("sim");
    group.throughput(Throughput::Elements(flops));
    group.sample_size(20);
    for (name, schedule) in
        [("transformer_block", Schedule::Submission), ("transformer_block_random", Schedule::Random { seed: 1 })]
    {
        let exec = SimExecutor::with_options(SimOptions { schedule, ..SimOptions::default() });
        let mut prepared = exec.prepare_sim(&plan, &weights).unwrap();
        group.bench_function(name, |b| b.iter(|| prepared.run(&inputs).unwrap()));
    }
    group.finish();
    let opts = TimingOptions::for_plan(&plan);
    c.bench_function("sim/timing_model_transformer_block", |b| b.iter(|| simulate(&plan, &opts).unwrap()));
}

criterion_group!(benches, transformer_block);
criterion_main!(benches);
