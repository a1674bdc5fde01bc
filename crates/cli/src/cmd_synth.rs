//! `cuplan synth FAMILY`: write a synthetic graph as JSON.

use anyhow::{Context, Result};
use graph_ir::synth;

/// A synthetic graph family.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum Family {
    /// Unary elementwise chain (`--n`).
    Chain,
    /// Multi-layer perceptron (`--layers --width --batch`).
    Mlp,
    /// Transformer stack (`--layers --hidden --heads --seq --batch`).
    Transformer,
    /// Residual conv network (`--blocks --channels --image`).
    ResnetLike,
    /// Inception-style branches (`--modules --branches`).
    InceptionLike,
    /// Random DAG (`--n --fan-in --seed`).
    RandomDag,
}

/// Arguments of `synth`.
#[derive(clap::Args, Debug)]
pub struct SynthArgs {
    /// The family.
    #[arg(value_enum)]
    family: Family,
    /// Layers (mlp, transformer).
    #[arg(long, default_value_t = 2)]
    layers: usize,
    /// Hidden size (transformer).
    #[arg(long, default_value_t = 256)]
    hidden: usize,
    /// Attention heads (transformer).
    #[arg(long, default_value_t = 4)]
    heads: usize,
    /// Sequence length (transformer).
    #[arg(long, default_value_t = 128)]
    seq: usize,
    /// Batch (mlp, transformer).
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Width (mlp).
    #[arg(long, default_value_t = 256)]
    width: usize,
    /// Residual blocks (resnet-like).
    #[arg(long, default_value_t = 4)]
    blocks: usize,
    /// Channels (resnet-like).
    #[arg(long, default_value_t = 32)]
    channels: usize,
    /// Image side (resnet-like).
    #[arg(long, default_value_t = 32)]
    image: usize,
    /// Modules (inception-like).
    #[arg(long, default_value_t = 3)]
    modules: usize,
    /// Branches per module (inception-like).
    #[arg(long, default_value_t = 4)]
    branches: usize,
    /// Node count (chain, random-dag).
    #[arg(long, default_value_t = 100)]
    n: usize,
    /// Largest fan-in (random-dag).
    #[arg(long, default_value_t = 3)]
    fan_in: usize,
    /// Seed (random-dag).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Write to FILE instead of standard output.
    #[arg(short, long, value_name = "FILE")]
    output: Option<std::path::PathBuf>,
}

/// Run `synth`.
pub fn run(a: &SynthArgs) -> Result<()> {
    let g = match a.family {
        Family::Chain => synth::chain(a.n),
        Family::Mlp => synth::mlp(a.layers, a.width, a.batch),
        Family::Transformer => synth::transformer(a.layers, a.hidden, a.heads, a.seq, a.batch),
        Family::ResnetLike => synth::resnet_like(a.blocks, a.channels, a.image),
        Family::InceptionLike => synth::inception_like(a.modules, a.branches),
        Family::RandomDag => synth::random_dag(a.n, a.fan_in, a.seed),
    }?;
    let text = g.to_json();
    match &a.output {
        Some(p) => std::fs::write(p, text + "\n").with_context(|| format!("writing '{}'", p.display()))?,
        None => {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            // A closed pipe (e.g. `| head`) is not an error worth reporting.
            let _ = writeln!(out, "{text}");
        }
    }
    Ok(())
}
