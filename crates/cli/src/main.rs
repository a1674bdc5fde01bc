//! `cuplan` on the `pack` branch: only the `pack` subcommand (the full command line lives on `main`; merges keep
//! main's `main.rs` and its `pack` wiring).
mod cmd_pack;
use clap::Parser;
/// Command line.
#[derive(clap::Parser)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}
/// Subcommands.
#[derive(clap::Subcommand)]
enum Cmd {
    /// Pack a MiniMalloc-format CSV of buffers into one pool.
    Pack(cmd_pack::PackArgs),
}
fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Pack(a) => cmd_pack::run(&a),
    }
}
