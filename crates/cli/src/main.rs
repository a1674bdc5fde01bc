//! The `cuplan` command line: validate, plan, run, pack and synthesise compute graphs.
//!
//! Exit codes (DESIGN.md section 7): 0 on success, 1 on a user error (one line naming what was wrong), 2 on a
//! usage error (clap's own).

mod cmd_plan;
mod cmd_run;
mod cmd_synth;
mod cmd_validate;
mod load;
mod tensors_io;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

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
}

fn init_logging(verbose: u8) {
    use tracing_subscriber::EnvFilter;
    let default = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let _ =
        tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_target(false).try_init();
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.verbose);
    let result = match &cli.command {
        Command::Validate(a) => cmd_validate::run(a),
        Command::Plan(a) => cmd_plan::run(a),
        Command::Run(a) => cmd_run::run(a),
        Command::Synth(a) => cmd_synth::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line: the chain of causes joined, outermost first.
            let msg: Vec<String> = e.chain().map(|c| c.to_string()).collect();
            eprintln!("error: {}", msg.join(": "));
            ExitCode::from(1)
        }
    }
}
