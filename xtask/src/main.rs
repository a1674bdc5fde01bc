//! cuplan's developer tasks, run as `cargo xtask <task>`: `bench` (the benchmark report), `gpu-check` (the
//! prepared script for a machine with a GPU), `fuzz` (the fuzz targets for a fixed time) and `ort-check` (cuplan
//! against onnxruntime on the repository's models, in a virtualenv of its own).

mod bench;
mod fuzz;
mod gpu_check;
mod ort_check;

use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use std::process::Command;

fn usage() -> &'static str {
    concat!(
        "usage: cargo xtask <task>\n\n",
        "tasks:\n",
        "  bench [--quick] [--out DIR] [--no-ort] [--record]\n",
        "      the benchmark report in target/cuplan-report (--quick: the CI-sized run; --no-ort: skip\n",
        "      onnxruntime; --record: also write docs/benchmarks.md)\n",
        "  gpu-check [--prepare] [--allow-skip]\n",
        "      --prepare: build the bundle (PTX, models, reference outputs, run.sh) in target/gpu-check;\n",
        "      without it: run that bundle's checks on this machine's GPU\n",
        "  fuzz [--seconds N] [--target NAME]... [--proptest] [--big]\n",
        "      every cargo-fuzz target for N seconds (default 60), or their proptest equivalents, or the\n",
        "      million-node pipeline tests in release (--big); `cargo xtask fuzz --help` for details\n",
        "  ort-check [MODEL.onnx...] [--seed N] [--rtol R] [--dim NAME=VALUE] [--precision fp16|bf16] [--extra ARGS]\n",
        "      cuplan run against onnxruntime (default: the four models in models/), in target/ort-venv;\n",
        "      --precision: cuplan in half precision against onnxruntime's float16 run",
    )
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        None | Some("help" | "--help" | "-h") => {
            println!("{}", usage());
            Ok(())
        }
        Some("bench") => bench_task(&args[1..]),
        Some("gpu-check") => gpu_check::main(&args[1..]),
        Some("fuzz") => fuzz::run(&args[1..]),
        Some("ort-check") => ort_check::main(&args[1..], &bench_root()),
        Some(other) => bail!("unknown task {other:?}\n{}", usage()),
    }
}

fn bench_task(args: &[String]) -> Result<()> {
    let mut opts = bench::BenchOpts {
        quick: false,
        out: bench_root().join("target").join("cuplan-report"),
        ort: true,
        record: false,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--quick" => opts.quick = true,
            "--no-ort" => opts.ort = false,
            "--record" => opts.record = true,
            "--help" | "-h" => {
                println!("{}", usage());
                return Ok(());
            }
            "--out" => opts.out = PathBuf::from(it.next().context("--out needs a directory")?),
            other => bail!("bench: unknown option {other:?}\n{}", usage()),
        }
    }
    // Timings of an unoptimised build (and the debug-only consistency checks of the pipeline) say nothing:
    // run the task again from a release build.
    if cfg!(debug_assertions) {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        eprintln!("bench: building xtask in release mode for the measurements");
        let status = Command::new(cargo)
            .current_dir(bench_root())
            .args(["run", "--release", "--quiet", "--package", "xtask", "--", "bench"])
            .args(args)
            .status()
            .context("running cargo")?;
        if !status.success() {
            bail!("the release run of `xtask bench` failed ({status})");
        }
        return Ok(());
    }
    bench::run(&opts)
}

/// The workspace root.
fn bench_root() -> PathBuf {
    cuplan_benches::workspace_root()
}
