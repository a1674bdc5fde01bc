//! `cuplan explain GRAPH`: the plan as a table, one step per row, then its figures beside their bounds and the
//! fusion decisions (text for a 120-column terminal, one JSON object, or GitHub markdown).

use anyhow::{Context, Result};
use graph_plan::{run_pipeline, Pass};

use crate::cmd_plan::{build_checked, PlanFlags};
use crate::load::{load_graph, GraphArgs};
use crate::viz::explain;
use crate::viz::Progress;

/// Output format of `explain`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExplainFormat {
    /// A table that fits 120 columns, a summary, the fusion decisions.
    Text,
    /// One JSON object: steps, summary, fusion.
    Json,
    /// GitHub markdown tables.
    Markdown,
}

/// Arguments of `explain`.
#[derive(clap::Args, Debug)]
pub struct ExplainArgs {
    #[command(flatten)]
    graph: GraphArgs,
    #[command(flatten)]
    flags: PlanFlags,
    /// Output format.
    #[arg(long, value_enum, default_value_t = ExplainFormat::Text)]
    format: ExplainFormat,
    #[command(flatten)]
    set: cuplan::set::SetFlags,
}

/// Run `explain`.
pub fn run(a: &ExplainArgs) -> Result<()> {
    if a.set.active() {
        // The set: its members' figures, shared layout and padding analysis (JSON: the set's report).
        let opts = a.flags.options()?;
        let b = cuplan::set::build(&a.graph, &a.set, &opts, false)?;
        let out = match a.format {
            ExplainFormat::Json => serde_json::to_string_pretty(&cuplan::report::set_report(&b.set, b.compile_ms))?,
            ExplainFormat::Text | ExplainFormat::Markdown => b.set.to_string(),
        };
        println!("{}", out.trim_end());
        return Ok(());
    }
    let progress = Progress::spinner("loading");
    let g = load_graph(&a.graph)?;
    let opts = a.flags.options()?;
    progress.set_message("planning");
    let (plan, _) = build_checked(&g, &opts)?;
    // The fusion decisions: the same pipeline, stopped after fusion (cheap next to the whole build).
    let r = run_pipeline(&g, &opts, Some(Pass::Fusion))?;
    let fusion = r.fusion.context("the pipeline stopped before fusion")?;
    progress.set_message("simulating");
    let mut e = explain::explain(&plan, &fusion)?;
    e.precision = match (&r.precision, &r.rewritten) {
        (Some(p), Some(g)) => Some(explain::PrecisionSection::new(p, g, &plan)),
        _ => None,
    };
    progress.finish();
    let out = match a.format {
        ExplainFormat::Text => explain::render_text(&e),
        ExplainFormat::Json => explain::render_json(&e)?,
        ExplainFormat::Markdown => explain::render_markdown(&e),
    };
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{}", out.trim_end());
    Ok(())
}
