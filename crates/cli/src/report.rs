//! The figures of a plan as one JSON object: `cuplan plan --report`, and `Plan.report()` in Python.

use graph_plan::ExecutionPlan;
use serde_json::json;

/// The `--report` object.
pub fn report(plan: &ExecutionPlan, compile_ms: f64) -> serde_json::Value {
    let s = plan.stats();
    let pass_ms: serde_json::Map<String, serde_json::Value> =
        s.pass_ms.iter().map(|(k, v)| (k.clone(), json!((v * 1000.0).round() / 1000.0))).collect();
    json!({
        "graph": plan.graph_name(),
        "nodes": s.nodes,
        "tensors": s.tensors,
        "kernel_count_original": plan.kernel_count_original,
        "kernel_count_fused": plan.kernel_count_fused,
        "pool_bytes": plan.pool_bytes,
        "naive_bytes": s.naive_bytes,
        "lower_bound_bytes": s.lower_bound_bytes,
        "pool_ratio": if s.lower_bound_bytes > 0 { plan.pool_bytes as f64 / s.lower_bound_bytes as f64 } else { 1.0 },
        "order": s.order_chosen,
        "order_optimal": s.order_optimal,
        "given_order_lower_bound_bytes": s.given_order_lower_bound_bytes,
        "order_ratio": if s.given_order_lower_bound_bytes > 0 { s.lower_bound_bytes as f64 / s.given_order_lower_bound_bytes as f64 } else { 1.0 },
        "reuse_edges": s.reuse_edges,
        "reuse_edges_added": s.reuse_edges_added,
        "in_place_count": s.in_place_count,
        "num_streams": plan.num_streams,
        "event_count": plan.event_count,
        "events_before_reduction": s.events_before_reduction,
        "waits": s.waits,
        "chains": s.chains,
        "makespan_us": round3(s.makespan_us),
        "makespan_bound_us": round3(s.makespan_bound_us),
        "makespan_ratio": if s.makespan_bound_us > 0.0 { round3(s.makespan_us / s.makespan_bound_us) } else { 1.0 },
        "energetic_bound_us": round3(s.energetic_bound_us),
        "energetic_ratio": if s.energetic_bound_us > 0.0 { round3(s.makespan_us / s.energetic_bound_us) } else { 1.0 },
        "data_bound_us": round3(s.data_bound_us),
        "critical_path_us": round3(s.critical_path_us),
        "area_us": round3(s.area_us),
        "one_stream_us": round3(s.one_stream_us),
        "speedup_vs_one_stream": if s.makespan_us > 0.0 { round3(s.one_stream_us / s.makespan_us) } else { 1.0 },
        "total_steps": plan.total_steps(),
        "bytes_moved": s.bytes_moved,
        "bytes_moved_unfused": s.bytes_moved_unfused,
        "precision": s.precision,
        "weights_bytes": s.weights_bytes,
        "nodes_per_precision": s.nodes_per_precision.iter().map(|(k, v)| (k.clone(), json!(v))).collect::<serde_json::Map<_, _>>(),
        "device": plan.device().name,
        "compile_ms": (compile_ms * 1000.0).round() / 1000.0,
        "pass_ms": pass_ms,
    })
}

/// `x` rounded to three decimals (the report's precision for times and ratios).
fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// The `--report` object of a plan set (`--buckets`): each member's figures, and the set's shared regions beside
/// what separate plans would cost.
pub fn set_report(set: &graph_plan::PlanSet, compile_ms: f64) -> serde_json::Value {
    use graph_plan::Region;
    let buckets: Vec<serde_json::Value> = set
        .members()
        .iter()
        .map(|m| {
            let mut r = report(&m.plan, m.compile_ms);
            if let Some(o) = r.as_object_mut() {
                o.insert("dims".into(), json!(m.dims));
                o.remove("pass_ms");
            }
            r
        })
        .collect();
    let padding: Vec<serde_json::Value> = set
        .padding()
        .iter()
        .map(|p| json!({"symbol": p.symbol, "safe": p.safe(), "marked_safe": p.marked_safe, "mixing": p.mixing}))
        .collect();
    let (pool, sum) = (set.pool_bytes(), set.sum_pool_bytes());
    json!({
        "graph": set.members().first().map_or("", |m| m.plan.graph_name()),
        "symbols": set.spec().symbols,
        "fixed": set.fixed(),
        "buckets": buckets,
        "set_pool_bytes": pool,
        "sum_pool_bytes": sum,
        "sum_over_set_pool": if pool > 0 { round3(sum as f64 / pool as f64) } else { 1.0 },
        "largest_member_pool_bytes": set.members().iter().map(|m| m.plan.pool_bytes).max().unwrap_or(0),
        "set_weights_bytes": set.region_bytes(Region::Weights),
        "set_io_bytes": set.region_bytes(Region::Io),
        "set_host_bytes": set.region_bytes(Region::Host),
        "padding": padding,
        "load_ms": round3(set.load_ms()),
        "compile_ms": round3(compile_ms),
    })
}
