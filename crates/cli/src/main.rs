//! The `cuplan` command line: validate, plan, explain, run, pack and synthesise compute graphs.
//!
//! Exit codes (DESIGN.md section 7): 0 on success, 1 on a user error (one line naming what was wrong), 2 on a
//! usage error (clap's own), 3 on a planner bug (`graph_plan::InternalError`: the message names the pass).

mod cmd_buckets;
mod cmd_explain;
mod cmd_pack;
mod cmd_plan;
mod cmd_run;
mod cmd_synth;
mod cmd_validate;
mod tensors_io;

// The library half of the package (`src/lib.rs`), under the names the subcommands use (`crate::viz`, ...).
use cuplan::{load, viz};

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// The process allocator. Planning allocates and frees many small lists (groups, lifetimes, kernels); glibc's
/// malloc spent about a fifth of a 1k-node build in malloc and free, and its consolidation of freed chunks showed
/// up at a million nodes. mimalloc's size-class pages serve those lists with less work.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// cuplan: compile compute graphs into GPU execution plans.
#[derive(Parser, Debug)]
#[command(name = "cuplan", version, about, long_about = None)]
struct Cli {
    /// More logging (-v: per-pass timings; -vv: debug). RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Check a graph and print a summary.
    Validate(cmd_validate::ValidateArgs),
    /// Compile a graph into an execution plan.
    Plan(cmd_plan::PlanArgs),
    /// Run a graph's plan on a backend (simulator or CUDA), optionally checking it against the reference plan.
    Run(cmd_run::RunArgs),
    /// Write a synthetic graph as JSON.
    Synth(cmd_synth::SynthArgs),
    /// Show a plan step by step with its figures, their bounds and the fusion decisions.
    Explain(cmd_explain::ExplainArgs),
    /// Pack a MiniMalloc-format CSV of buffers (`id,lower,upper,size`) into one pool; validate and report.
    Pack(cmd_pack::PackArgs),
    /// Choose bucket sizes (`plan --buckets`) for a histogram of request sizes: exact, against powers of two.
    Buckets(cmd_buckets::BucketsArgs),
}

fn init_logging(verbose: u8) {
    use tracing_subscriber::fmt::format::FmtSpan;
    use tracing_subscriber::EnvFilter;
    let default = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let from_env = EnvFilter::try_from_default_env().ok();
    // Log lines and a progress bar on the same stderr garble each other: the bar gives way.
    viz::progress::set_enabled(verbose == 0 && from_env.is_none());
    let filter = from_env.unwrap_or_else(|| EnvFilter::new(default));
    // A closing span prints its busy time: at -v, one line per pass (the pipeline's spans are named after them).
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_span_events(FmtSpan::CLOSE)
        .try_init();
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.verbose);
    let result = match &cli.command {
        Command::Validate(a) => cmd_validate::run(a),
        Command::Plan(a) => cmd_plan::run(a),
        Command::Run(a) => cmd_run::run(a),
        Command::Synth(a) => cmd_synth::run(a),
        Command::Explain(a) => cmd_explain::run(a),
        Command::Pack(a) => cmd_pack::run(a),
        Command::Buckets(a) => cmd_buckets::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line: the chain of causes joined, outermost first; a cause whose text its parent already
            // shows (a thiserror `{0}` over a `#[from]` source) is not repeated, and no message spans lines.
            let mut msg = String::new();
            for c in e.chain() {
                let text = c.to_string();
                if !msg.contains(&text) {
                    if !msg.is_empty() {
                        msg.push_str(": ");
                    }
                    msg.push_str(&text);
                }
            }
            eprintln!("error: {}", msg.replace('\n', " "));
            let bug = e.chain().any(|c| {
                c.downcast_ref::<graph_plan::PlanError>()
                    .is_some_and(|p| matches!(p, graph_plan::PlanError::Internal(_)))
                    || c.downcast_ref::<graph_plan::InternalError>().is_some()
            });
            ExitCode::from(if bug { 3 } else { 1 })
        }
    }
}
