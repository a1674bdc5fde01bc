//! `cuplan plan GRAPH`: compile a graph into an execution plan and print it, as text, JSON or a report.

use anyhow::{bail, Context, Result};
use graph_ir::ComputeGraph;
use graph_passes::precision::{parse_keep_f32, Precision, PrecisionError, PrecisionPolicy};
use graph_plan::{
    run_pipeline, verify, DeviceProfile, Effort, ExecutionPlan, InternalError, OrderStrategy, Pass, PlanError,
    PlanOptions,
};
use std::path::PathBuf;
use std::time::Instant;

use crate::load::{load_graph, GraphArgs};
use cuplan::report::report;

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
    /// Storage precision: fp32 (as declared), fp16 or bf16 (half storage, f32 compute; docs/precision.md).
    #[arg(long, default_value = "fp32", value_name = "fp32|fp16|bf16")]
    pub precision: String,
    /// What stays in f32 under fp16/bf16, replacing the default list: comma-separated op types
    /// (LayerNormalization), node-name patterns (`re:.*attn.*`), `softmax-input`, `default`; or `none`.
    #[arg(long, value_name = "LIST")]
    pub keep_f32: Option<String>,
    /// Graph inputs and outputs: `declared` keeps their dtype, `half` stores them in the plan's precision too.
    #[arg(long, value_enum, default_value_t = IoPrecision::Declared)]
    pub io_precision: IoPrecision,
    /// Planning effort: fast, default or max (as TensorRT's builder optimisation level). Search stages run only
    /// where the greedy result is above its bound, with budgets that scale with the graph: fast a tenth of the
    /// default's, max ten times.
    #[arg(long, value_enum, default_value_t = EffortFlag::Default)]
    pub effort: EffortFlag,
}

/// `--io-precision`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoPrecision {
    /// Graph inputs and outputs keep their declared dtype (casts at the boundary, fused).
    Declared,
    /// Graph inputs and outputs are stored in the plan's precision.
    Half,
}

/// Planning effort (see `PlanOptions::effort`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum EffortFlag {
    /// A tenth of the default's search budgets.
    Fast,
    /// Budgets linear in the graph's size, capped; today's plan quality.
    Default,
    /// Ten times the default's budgets.
    Max,
}

impl From<EffortFlag> for Effort {
    fn from(e: EffortFlag) -> Effort {
        match e {
            EffortFlag::Fast => Effort::Fast,
            EffortFlag::Default => Effort::Default,
            EffortFlag::Max => Effort::Max,
        }
    }
}

impl PlanFlags {
    /// The precision policy of `--precision`, `--keep-f32` and `--io-precision` (typed errors for an unknown
    /// precision, op type or a malformed pattern).
    pub fn policy(&self) -> Result<PrecisionPolicy, PrecisionError> {
        let mut p = PrecisionPolicy::new(Precision::parse(&self.precision)?);
        if let Some(list) = &self.keep_f32 {
            p.keep_f32 = parse_keep_f32(list)?;
        }
        p.io_half = self.io_precision == IoPrecision::Half;
        Ok(p)
    }

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
        o.precision = self.policy()?;
        o.effort = self.effort.into();
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
    /// Run the pipeline only up to PASS (topo, fusion, groups, memory or stream) and print what each pass made
    /// as JSON, for inspecting or bisecting a plan.
    #[arg(long, value_name = "PASS")]
    stop_after: Option<String>,
    #[command(flatten)]
    set: cuplan::set::SetFlags,
}

/// Build a plan and verify it; returns it with the build time in milliseconds.
pub fn build_checked(g: &ComputeGraph, opts: &PlanOptions) -> Result<(ExecutionPlan, f64)> {
    let t0 = Instant::now();
    let plan = ExecutionPlan::build_with(g, opts)?;
    checked(plan, t0.elapsed().as_secs_f64() * 1e3)
}

/// [`build_checked`] on a graph the caller is done with (`ExecutionPlan::build_owned`: a half-precision
/// transform edits it in place instead of copying it).
pub fn build_checked_owned(g: ComputeGraph, opts: &PlanOptions) -> Result<(ExecutionPlan, f64)> {
    let t0 = Instant::now();
    let plan = ExecutionPlan::build_owned(g, opts)?;
    checked(plan, t0.elapsed().as_secs_f64() * 1e3)
}

/// `plan` with its build time, or the violations `verify` finds in it.
fn checked(plan: ExecutionPlan, compile_ms: f64) -> Result<(ExecutionPlan, f64)> {
    if let Err(violations) = verify(&plan) {
        let first: Vec<String> = violations.iter().take(3).map(ToString::to_string).collect();
        let detail = format!("the plan fails verify ({} violations; first: {})", violations.len(), first.join("; "));
        return Err(PlanError::from(InternalError::new("verify", detail)).into());
    }
    Ok((plan, compile_ms))
}

/// `--stop-after PASS`: the pipeline up to `name`, each pass's output as one JSON object.
fn stopped_pipeline(g: &ComputeGraph, opts: &PlanOptions, name: &str) -> Result<String> {
    let known = "topo, fusion, groups, memory, stream";
    let pass = match Pass::by_name(name) {
        Some(p @ (Pass::Topo | Pass::Fusion | Pass::Groups | Pass::Memory | Pass::Stream)) => p,
        Some(_) => bail!("--stop-after {name:?}: the passes after stream make the plan itself; use --format json"),
        None => bail!("--stop-after {name:?}: unknown pass (known: {known})"),
    };
    let r = run_pipeline(g, opts, Some(pass))?;
    let pass_ms: serde_json::Map<String, serde_json::Value> =
        r.pass_ms.iter().map(|(k, v)| (k.clone(), serde_json::json!(v))).collect();
    let order = r.order.map(|o| {
        serde_json::json!({
            "chosen": o.chosen,
            "given_lower_bound_bytes": o.given_lower_bound_bytes,
            "chosen_lower_bound_bytes": o.chosen_lower_bound_bytes,
            "optimal": o.optimal,
        })
    });
    let out = serde_json::json!({
        "stopped_after": pass.name(),
        "pass_ms": pass_ms,
        "order": order,
        "topo": r.topo.order.iter().map(|&n| r.graph(g).node(n).name.clone()).collect::<Vec<_>>(),
        "precision": r.precision,
        "fusion": r.fusion,
        "memory": r.memory,
        "stream": r.stream,
    });
    Ok(serde_json::to_string_pretty(&out)?)
}

/// Run `plan`.
pub fn run(a: &PlanArgs) -> Result<()> {
    if a.set.active() {
        return run_set(a);
    }
    let progress = crate::viz::Progress::spinner("loading");
    let g = load_graph(&a.graph)?;
    let opts = a.flags.options()?;
    progress.set_message("planning");
    if let Some(name) = &a.stop_after {
        let text = stopped_pipeline(&g, &opts, name)?;
        progress.finish();
        println!("{text}");
        return Ok(());
    }
    // `--explain-fusion` runs the pipeline again on the graph; otherwise the plan takes it.
    let kept = a.explain_fusion.then(|| g.clone());
    let (plan, compile_ms) = build_checked_owned(g, &opts)?;
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
    if let Some(g) = kept {
        let r = run_pipeline(&g, &opts, Some(Pass::Fusion))?;
        let text = crate::viz::explain::fusion_text(r.graph(&g), r.fusion.as_ref().context("no fusion plan")?);
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

/// `plan --buckets`: the set as text (each member's figures, the shared layout, the padding analysis), JSON, or
/// the set's report.
fn run_set(a: &PlanArgs) -> Result<()> {
    if a.stop_after.is_some() || a.memory_svg.is_some() || a.dot.is_some() || a.explain_fusion {
        bail!(
            "--buckets plans a set; --stop-after, --memory-svg, --dot and --explain-fusion take one plan (use --dim)"
        );
    }
    let opts = a.flags.options()?;
    let progress = crate::viz::Progress::spinner("planning the set");
    let b = cuplan::set::build(&a.graph, &a.set, &opts, false)?;
    progress.finish();
    let out = if a.report {
        serde_json::to_string_pretty(&cuplan::report::set_report(&b.set, b.compile_ms))?
    } else {
        match a.format {
            Format::Text => b.set.to_string(),
            Format::Json => b.set.to_json(),
        }
    };
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{}", out.trim_end());
    Ok(())
}
