//! Plan sets (issue 17's target: a set of six buckets plans in less than six times one plan): for each dynamic
//! model, `plan_set/<model>/one_plan` (decode, import at batch 32, build) against `plan_set/<model>/set6` (batch
//! 1, 2, 4, 8, 16, 32 from one decode). `cargo xtask bench` reports the ratio.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use criterion::{criterion_group, criterion_main, Criterion};
use cuplan_benches::{dynamic_model_bytes, one_plan, plan_set, DYNAMIC_MODELS};
use graph_plan::PlanOptions;
use std::hint::black_box;
use std::time::Duration;

const BUCKETS: [usize; 6] = [1, 2, 4, 8, 16, 32];

fn sets(c: &mut Criterion) {
    let opts = PlanOptions::default();
    for name in DYNAMIC_MODELS {
        let Some(bytes) = dynamic_model_bytes(name).unwrap() else { continue };
        let mut g = c.benchmark_group(format!("plan_set/{name}"));
        g.sample_size(10);
        g.warm_up_time(Duration::from_millis(500));
        g.measurement_time(Duration::from_secs(3));
        g.bench_function("one_plan", |b| b.iter(|| black_box(one_plan(&bytes, 32, &opts).unwrap())));
        g.bench_function("set6", |b| b.iter(|| black_box(plan_set(&bytes, &BUCKETS, &opts).unwrap())));
        g.finish();
    }
}

criterion_group!(benches, sets);
criterion_main!(benches);
