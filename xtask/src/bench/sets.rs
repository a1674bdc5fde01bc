//! The plan-set rows of the report: each dynamic model planned as a set of six batch buckets from one decode,
//! against one standalone plan (decode, import, build) of the largest bucket, with the set's shared pool
//! beside what six separate plans would cost.

use anyhow::Result;
use cuplan_benches::{dynamic_model_bytes, one_plan, plan_set, DYNAMIC_MODELS};
use graph_plan::{verify_set, PlanOptions};
use serde::Serialize;
use std::fmt::Write;

use super::fmt::{md_table, Align};
use super::measure::{medians, Sampler};

/// The buckets of every measured set.
pub const BUCKETS: [usize; 6] = [1, 2, 4, 8, 16, 32];

/// One dynamic model as a set.
#[derive(Clone, Debug, Serialize)]
pub struct SetRow {
    /// Model name.
    pub name: String,
    /// Median on-CPU ms of one plan at the largest bucket (decode, import, build).
    pub one_plan_ms: f64,
    /// Median on-CPU ms of the whole set (one decode, six imports and builds, the analysis), all threads.
    pub set_ms: f64,
    /// Median wall-clock ms of one plan.
    pub one_plan_wall_ms: f64,
    /// Median wall-clock ms of the set: what a caller waits, its members planned in parallel.
    pub set_wall_ms: f64,
    /// The set's pool (the largest member's).
    pub set_pool_bytes: u64,
    /// The six members' pools added up.
    pub sum_pool_bytes: u64,
    /// The shared weights region.
    pub weights_bytes: u64,
    /// Whether batch padding was found safe.
    pub padding_safe: bool,
}

/// Measure every dynamic model found.
pub fn measure(sampler: &Sampler) -> Result<Vec<SetRow>> {
    let opts = PlanOptions::default();
    let mut rows = Vec::new();
    for name in DYNAMIC_MODELS {
        let Some(bytes) = dynamic_model_bytes(name)? else { continue };
        let largest = BUCKETS[BUCKETS.len() - 1];
        let (one, _) = sampler.run(|| one_plan(&bytes, largest, &opts))?;
        let (times, set) = sampler.run(|| plan_set(&bytes, &BUCKETS, &opts))?;
        if let Err(v) = verify_set(&set) {
            anyhow::bail!("{name}: the set fails verify_set: {}", v[0]);
        }
        let ((one_plan_ms, one_plan_wall_ms), (set_ms, set_wall_ms)) = (medians(&one), medians(&times));
        rows.push(SetRow {
            name: name.to_string(),
            one_plan_ms,
            set_ms,
            one_plan_wall_ms,
            set_wall_ms,
            set_pool_bytes: set.pool_bytes(),
            sum_pool_bytes: set.sum_pool_bytes(),
            weights_bytes: set.region_bytes(graph_plan::Region::Weights),
            padding_safe: set.padding().iter().all(|p| p.safe()),
        });
    }
    Ok(rows)
}

const HEADER: [&str; 9] = [
    "model",
    "one plan ms",
    "set of 6 ms",
    "set / one",
    "wall: set / one",
    "set pool MiB",
    "sum of pools MiB",
    "sum / set",
    "padding",
];

/// The report's "Plan sets" section.
pub fn section(s: &mut String, rows: &[SetRow]) {
    let _ = writeln!(s, "## Plan sets\n");
    if rows.is_empty() {
        let _ = writeln!(s, "Not measured (no `models/dynamic/`).\n");
        return;
    }
    let _ = writeln!(
        s,
        "`cuplan plan models/dynamic/M.onnx --buckets batch=1,2,4,8,16,32`: median on-CPU ms of the whole set \
         (one decode, six imports and plans, the padding analysis; every thread's time, so the members' \
         parallel planning does not shorten it) against one standalone plan of batch 32 (decode, import, plan); \
         the target is set / one < 6. The wall-clock ratio beside it is what a caller waits, with the members \
         planned in parallel. The set's pool is its largest member's; the sum is what six separate plans would \
         allocate.\n"
    );
    let mib = |b: u64| format!("{:.1}", b as f64 / (1u64 << 20) as f64);
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.name.clone(),
                format!("{:.2}", r.one_plan_ms),
                format!("{:.2}", r.set_ms),
                format!("{:.2}", r.set_ms / r.one_plan_ms),
                format!("{:.2}", r.set_wall_ms / r.one_plan_wall_ms),
                mib(r.set_pool_bytes),
                mib(r.sum_pool_bytes),
                format!("{:.2}", r.sum_pool_bytes as f64 / r.set_pool_bytes.max(1) as f64),
                if r.padding_safe { "safe" } else { "refused" }.to_string(),
            ]
        })
        .collect();
    s.push_str(&md_table(&HEADER, &[Align::Left], &cells));
    s.push('\n');
}
