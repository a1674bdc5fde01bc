//! `cuplan plan GRAPH`: compile a graph into an execution plan and print it, as text, JSON or a report.

use anyhow::{bail, Result};
use graph_plan::{verify, DeviceProfile, ExecutionPlan, OrderStrategy, PlanOptions};
use serde_json::json;
use std::time::Instant;

use crate::load::{load_graph, GraphArgs};

/// Output format of `plan`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// The readable listing.
    Text,
    /// The whole plan as JSON.
    Json,
}

/// Topological order strategy.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// The graph's own order.
    Given,
    /// An order chosen to lower peak memory.
    Memory,
}

/// Planning options shared by `plan`, `run` and `explain`.
#[derive(clap::Args, Debug, Clone)]
pub struct PlanFlags {
    /// Most CUDA streams to use.
    #[arg(long, default_value_t = 1)]
    pub streams: usize,
    /// Turn fusion off.
    #[arg(long)]
    pub no_fusion: bool,
    /// Turn memory reuse off (every intermediate gets its own bytes).
    #[arg(long)]
    pub no_reuse: bool,
    /// Device profile for the cost model: h200 or small.
    #[arg(long, default_value = "h200")]
    pub device: String,
    /// Topological order: given or memory.
    #[arg(long, value_enum, default_value_t = Order::Given)]
    pub order: Order,
}

impl PlanFlags {
    /// The plan options these flags select.
    pub fn options(&self) -> Result<PlanOptions> {
        let Some(device) = DeviceProfile::by_name(&self.device) else {
            bail!("--device {:?}: unknown profile (known: h200, small)", self.device);
        };
        let mut o = PlanOptions::with_streams(self.streams);
        o.fusion.enabled = !self.no_fusion;
        o.memory.reuse = !self.no_reuse;
        o.device = device;
        o.order = match self.order {
            Order::Given => OrderStrategy::Given,
            Order::Memory => OrderStrategy::Memory,
        };
        o.validate()?;
        Ok(o)
    }
}

/// Arguments of `plan`.
#[derive(clap::Args, Debug)]
pub struct PlanArgs {
    #[command(flatten)]
    graph: GraphArgs,
    #[command(flatten)]
    flags: PlanFlags,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
    /// Print one JSON object of figures instead of the plan.
    #[arg(long)]
    report: bool,
}

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
        "reuse_edges": s.reuse_edges,
        "in_place_count": s.in_place_count,
        "num_streams": plan.num_streams,
        "event_count": plan.event_count,
        "events_before_reduction": s.events_before_reduction,
        "total_steps": plan.total_steps(),
        "bytes_moved": s.bytes_moved,
        "bytes_moved_unfused": s.bytes_moved_unfused,
        "device": s.device,
        "compile_ms": (compile_ms * 1000.0).round() / 1000.0,
        "pass_ms": pass_ms,
    })
}

/// Run `plan`.
pub fn run(a: &PlanArgs) -> Result<()> {
    let g = load_graph(&a.graph)?;
    let opts = a.flags.options()?;
    let t0 = Instant::now();
    let plan = ExecutionPlan::build_with(&g, &opts)?;
    let compile_ms = t0.elapsed().as_secs_f64() * 1e3;
    if let Err(violations) = verify(&plan) {
        let first: Vec<String> = violations.iter().take(3).map(ToString::to_string).collect();
        bail!(
            "internal error: the plan fails verification ({} violations; first: {}) — this is a bug",
            violations.len(),
            first.join("; ")
        );
    }
    let mut out = String::new();
    if a.report {
        out = serde_json::to_string_pretty(&report(&plan, compile_ms))?;
    } else {
        match a.format {
            Format::Text => out.push_str(&plan.to_string()),
            Format::Json => out = plan.to_json(),
        }
    }
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{}", out.trim_end());
    Ok(())
}
