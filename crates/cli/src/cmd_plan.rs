//! `cuplan plan GRAPH`: compile a graph into an execution plan and print it, as text, JSON or a report.

use anyhow::{bail, Context, Result};
use graph_ir::ComputeGraph;
use graph_plan::{run_pipeline, verify, DeviceProfile, ExecutionPlan, OrderStrategy, Pass, PlanOptions};
use serde_json::json;
use std::path::PathBuf;
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
    /// With several streams, keep each buffer's bytes until the branches reading it have met: more pool bytes,
    /// no reuse edge between branches (more overlap). Off: the pool stays at the order's lower bound.
    #[arg(long)]
    pub concurrent_lifetimes: bool,
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
        o.memory.concurrent_lifetimes = self.concurrent_lifetimes;
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
    /// Also draw the activation pool (time across, address down, the lower-bound curve) as SVG to FILE.
    #[arg(long, value_name = "FILE")]
    memory_svg: Option<PathBuf>,
    /// Also write the kernel DAG (one cluster per stream; data, event and reuse edges) as Graphviz DOT to FILE.
    #[arg(long, value_name = "FILE")]
    dot: Option<PathBuf>,
    /// Also print the fusion plan's groups and rejected candidates with reason codes (after the text listing;
    /// on standard error when standard output carries JSON).
    #[arg(long)]
    explain_fusion: bool,
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
        "device": plan.device().name,
        "compile_ms": (compile_ms * 1000.0).round() / 1000.0,
        "pass_ms": pass_ms,
    })
}

/// `x` rounded to three decimals (the report's precision for times and ratios).
fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// Build a plan and verify it; returns it with the build time in milliseconds.
pub fn build_checked(g: &ComputeGraph, opts: &PlanOptions) -> Result<(ExecutionPlan, f64)> {
    let t0 = Instant::now();
    let plan = ExecutionPlan::build_with(g, opts)?;
    let compile_ms = t0.elapsed().as_secs_f64() * 1e3;
    if let Err(violations) = verify(&plan) {
        let first: Vec<String> = violations.iter().take(3).map(ToString::to_string).collect();
        bail!(
            "internal error: the plan fails verification ({} violations; first: {}) — this is a bug",
            violations.len(),
            first.join("; ")
        );
    }
    Ok((plan, compile_ms))
}

/// Run `plan`.
pub fn run(a: &PlanArgs) -> Result<()> {
    let progress = crate::viz::Progress::spinner("loading");
    let g = load_graph(&a.graph)?;
    let opts = a.flags.options()?;
    progress.set_message("planning");
    let (plan, compile_ms) = build_checked(&g, &opts)?;
    progress.finish();
    if let Some(path) = &a.memory_svg {
        let svg = crate::viz::memory_svg(&plan);
        std::fs::write(path, svg).with_context(|| format!("--memory-svg: cannot write '{}'", path.display()))?;
    }
    if let Some(path) = &a.dot {
        let dot = crate::viz::dot::plan_dot(&plan);
        std::fs::write(path, dot).with_context(|| format!("--dot: cannot write '{}'", path.display()))?;
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
    if a.explain_fusion {
        let r = run_pipeline(&g, &opts, Some(Pass::Fusion))?;
        let text = crate::viz::explain::fusion_text(&g, r.fusion.as_ref().context("no fusion plan")?);
        if a.report || a.format == Format::Json {
            eprint!("{text}");
        } else {
            out = format!("{}\n\n{text}", out.trim_end());
        }
    }
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{}", out.trim_end());
    Ok(())
}
