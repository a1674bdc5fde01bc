//! Chrome trace event JSON (`{"traceEvents": [...]}`) of a timed plan; opens in Perfetto or chrome://tracing.
//!
//! One track (tid) per stream named "stream N"; a complete event (`"ph": "X"`) per launch or copy, named after
//! its nodes, with the kernel, bytes and flops in `args`; zero-length slices for records and waits with flow
//! events (`"s"` -> `"f"`) from each Record to the Waits that depend on it; and a counter track (`"ph": "C"`)
//! of the pool bytes in use over time (a pool tensor is in use from the start of its writer's launch to the
//! end of its last reader's).

use graph_plan::{Access, ExecutionPlan, PlanStep, Region};
use serde_json::{json, Value};
use std::collections::BTreeMap;

use crate::schedule::wait_dependencies;
use crate::timing::TimingReport;

const PID: u32 = 1;

/// The trace of `plan` as timed in `timing` (from `timing::simulate` on the same plan).
pub fn chrome_trace(plan: &ExecutionPlan, timing: &TimingReport) -> Value {
    let mut ev: Vec<Value> = Vec::new();
    ev.push(json!({"name": "process_name", "ph": "M", "ts": 0, "pid": PID, "tid": 0,
        "args": {"name": format!("cuplan plan '{}' on {}", plan.graph_name(), timing.device)}}));
    let ns = timing.stream_busy_us.len();
    for s in 0..ns {
        ev.push(json!({"name": "thread_name", "ph": "M", "ts": 0, "pid": PID, "tid": s,
            "args": {"name": format!("stream {s}")}}));
        ev.push(json!({"name": "thread_sort_index", "ph": "M", "ts": 0, "pid": PID, "tid": s,
            "args": {"sort_index": s}}));
    }
    let deps = wait_dependencies(plan);
    let mut flow_id = 0u64;
    for (i, (step, t)) in plan.steps.iter().zip(&timing.steps).enumerate() {
        let tid = step.stream().index();
        match step {
            PlanStep::Launch { kernel, .. } => {
                let (name, bytes, flops) = match plan.kernel(*kernel) {
                    Some(k) => (k.node_names().collect::<Vec<_>>().join(" + "), k.cost.bytes(), k.cost.flops),
                    None => (kernel.to_string(), 0, 0),
                };
                ev.push(json!({"name": name, "cat": "launch", "ph": "X", "ts": t.start_us,
                    "dur": t.end_us - t.start_us, "pid": PID, "tid": tid,
                    "args": {"kernel": kernel.to_string(), "step": i, "bytes": bytes, "flops": flops,
                             "occupancy": t.occupancy, "alone_us": t.duration_us}}));
            }
            PlanStep::Copy { bytes, node, src, dst, .. } => {
                let name = node.clone().unwrap_or_else(|| "copy".into());
                ev.push(json!({"name": name, "cat": "copy", "ph": "X", "ts": t.start_us,
                    "dur": t.end_us - t.start_us, "pid": PID, "tid": tid,
                    "args": {"step": i, "bytes": bytes, "src": src.to_string(), "dst": dst.to_string()}}));
            }
            PlanStep::Record { event, .. } => {
                ev.push(json!({"name": format!("record {event}"), "cat": "sync", "ph": "X", "ts": t.start_us,
                    "dur": 0, "pid": PID, "tid": tid, "args": {"step": i}}));
            }
            PlanStep::Wait { event, .. } => {
                ev.push(json!({"name": format!("wait {event}"), "cat": "sync", "ph": "X", "ts": t.start_us,
                    "dur": 0, "pid": PID, "tid": tid, "args": {"step": i}}));
                if let Some(r) = deps[i] {
                    let rt = &timing.steps[r];
                    let name = event.to_string();
                    ev.push(json!({"name": name, "cat": "event", "ph": "s", "id": flow_id, "ts": rt.start_us,
                        "pid": PID, "tid": rt.stream.index()}));
                    ev.push(json!({"name": name, "cat": "event", "ph": "f", "bp": "e", "id": flow_id,
                        "ts": t.start_us, "pid": PID, "tid": tid}));
                    flow_id += 1;
                }
            }
        }
    }
    // Pool bytes in use: per alias root, [first write start, last read end).
    let mut life: BTreeMap<&str, (f64, f64, u64)> = BTreeMap::new();
    for (step, t) in plan.steps.iter().zip(&timing.steps) {
        let PlanStep::Launch { kernel, .. } = step else { continue };
        let Some(k) = plan.kernel(*kernel) else { continue };
        for p in k.params.iter().filter(|p| p.buffer.region == Region::Pool) {
            let e = life.entry(p.root.as_ref()).or_insert((f64::INFINITY, f64::NEG_INFINITY, 0));
            if p.access == Access::Write {
                e.0 = e.0.min(t.start_us);
            }
            e.1 = e.1.max(t.end_us);
            e.2 = e.2.max(p.buffer.bytes);
        }
    }
    let mut deltas: Vec<(f64, i128)> = Vec::new();
    for &(s, e, b) in life.values() {
        let s = if s.is_finite() { s } else { 0.0 };
        deltas.push((s, b as i128));
        deltas.push((e.max(s), -(b as i128)));
    }
    deltas.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut in_use: i128 = 0;
    ev.push(json!({"name": "pool bytes in use", "ph": "C", "ts": 0.0, "pid": PID, "tid": 0, "args": {"bytes": 0}}));
    let mut k = 0;
    while k < deltas.len() {
        let ts = deltas[k].0;
        while k < deltas.len() && deltas[k].0 == ts {
            in_use += deltas[k].1;
            k += 1;
        }
        ev.push(json!({"name": "pool bytes in use", "ph": "C", "ts": ts, "pid": PID, "tid": 0,
            "args": {"bytes": in_use.max(0) as u64}}));
    }
    json!({"traceEvents": ev, "displayTimeUnit": "ns",
        "otherData": {"graph": plan.graph_name(), "makespan_us": timing.makespan_us, "bound_us": timing.bound_us}})
}

/// The trace as a JSON string.
pub fn chrome_trace_json(plan: &ExecutionPlan, timing: &TimingReport) -> String {
    chrome_trace(plan, timing).to_string()
}
