//! `cargo xtask fuzz`: run every cargo-fuzz target for a fixed time and report executions per second and corpus
//! sizes; `--big` runs the million-node pipeline tests in release instead.
//!
//! cargo-fuzz needs nightly features: on the stable toolchain they are unlocked with `RUSTC_BOOTSTRAP=1`.
//! Where `cargo fuzz` is not installed (`cargo install cargo-fuzz`), the task says so and runs the proptest
//! equivalents instead (the same check functions with fixed case counts, as CI does).

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The targets, in `fuzz/fuzz_targets/`, with the proptest suites that call the same checks.
const TARGETS: [(&str, &str, &str); 5] = [
    ("json_load", "graph-ir", "reliability"),
    ("onnx_import", "graph-onnx", "reliability"),
    ("build_verify", "graph-plan", "reliability"),
    ("pack", "graph-passes", "reliability"),
    ("sim_diff", "exec-sim", "differential"),
];

fn usage() -> &'static str {
    "usage: cargo xtask fuzz [--seconds N] [--target NAME]... [--proptest] [--big]\n\
     \x20 --seconds N   time per target (default 60)\n\
     \x20 --target NAME only this target (repeatable): json_load, onnx_import, build_verify, pack, sim_diff\n\
     \x20 --proptest    run the proptest equivalents instead of libFuzzer\n\
     \x20 --big         run the million-node pipeline tests in release (chain and random DAG)"
}

struct Args {
    seconds: u64,
    targets: Vec<String>,
    proptest: bool,
    big: bool,
}

fn parse(args: &[String]) -> Result<Args> {
    let mut a = Args { seconds: 60, targets: Vec::new(), proptest: false, big: false };
    let mut it = args.iter();
    while let Some(x) = it.next() {
        match x.as_str() {
            "--seconds" => {
                let v = it.next().context("--seconds needs a value")?;
                a.seconds = v.parse().with_context(|| format!("--seconds {v:?}: not a whole number"))?;
            }
            "--target" => {
                let v = it.next().context("--target needs a value")?;
                if !TARGETS.iter().any(|t| t.0 == v) {
                    bail!("unknown target {v:?}\n{}", usage());
                }
                a.targets.push(v.clone());
            }
            "--proptest" => a.proptest = true,
            "--big" => a.big = true,
            "-h" | "--help" => {
                println!("{}", usage());
                std::process::exit(0);
            }
            other => bail!("unknown argument {other:?}\n{}", usage()),
        }
    }
    Ok(a)
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

fn status(mut c: Command) -> Result<()> {
    let shown = format!("{c:?}");
    let s = c.status().with_context(|| format!("running {shown}"))?;
    if !s.success() {
        bail!("{shown} failed ({s})");
    }
    Ok(())
}

/// Entry point of `cargo xtask fuzz`.
pub fn run(args: &[String]) -> Result<()> {
    let a = parse(args)?;
    if a.big {
        return big();
    }
    let chosen: Vec<_> =
        TARGETS.iter().filter(|t| a.targets.is_empty() || a.targets.iter().any(|n| n == t.0)).collect();
    let have_fuzz = cargo().args(["fuzz", "--version"]).output().map(|o| o.status.success()).unwrap_or(false);
    if a.proptest || !have_fuzz {
        if !have_fuzz {
            println!("cargo fuzz is not installed (`cargo install cargo-fuzz`): running the proptest equivalents");
        }
        for (name, krate, test) in chosen {
            println!("== {name}: proptest ({krate} --test {test})");
            let mut c = cargo();
            c.current_dir(workspace()).args(["test", "--release", "-p", krate, "--test", test]);
            status(c)?;
        }
        return Ok(());
    }
    let fuzz_dir = workspace().join("fuzz");
    let mut rows = Vec::new();
    for (name, _, _) in chosen {
        let corpus = fuzz_dir.join("corpus").join(name);
        std::fs::create_dir_all(&corpus)?;
        let mut c = cargo();
        c.current_dir(&fuzz_dir).env("RUSTC_BOOTSTRAP", "1").args(["fuzz", "run", "-O", name]);
        c.arg(&corpus);
        let seeds = fuzz_dir.join("seeds").join(name);
        if seeds.is_dir() {
            c.arg(&seeds);
        }
        // The repository's ONNX models are good seeds.
        let models = workspace().join("models");
        if *name == "onnx_import" && models.is_dir() {
            c.arg(&models);
        }
        c.args(["--", &format!("-max_total_time={}", a.seconds), "-rss_limit_mb=4096", "-timeout=30"]);
        if matches!(*name, "build_verify" | "pack" | "sim_diff") {
            // Structured targets read bytes as choices: long inputs from the start, not grown slowly.
            c.args(["-max_len=1024", "-len_control=0"]);
        }
        c.arg("-print_final_stats=1");
        println!("== {name}: {} s", a.seconds);
        let out = c.output().with_context(|| format!("running cargo fuzz run {name}"))?;
        let log = String::from_utf8_lossy(&out.stderr);
        let stat = |key: &str| {
            log.lines()
                .rev()
                .find_map(|l| l.strip_prefix(key).map(|v| v.trim().trim_start_matches(':').trim().to_string()))
        };
        let execs = stat("stat::number_of_executed_units").unwrap_or_else(|| "?".into());
        let per_sec = stat("stat::average_exec_per_sec").unwrap_or_else(|| "?".into());
        let files = std::fs::read_dir(&corpus).map(|d| d.count()).unwrap_or(0);
        if !out.status.success() {
            let tail: Vec<&str> = log.lines().rev().take(60).collect::<Vec<_>>().into_iter().rev().collect();
            bail!(
                "fuzz target {name} failed (a crash or a leak; the input is under fuzz/artifacts/{name}):\n{}",
                tail.join("\n")
            );
        }
        println!("   {execs} runs, {per_sec} runs/s, corpus {files} inputs");
        rows.push((name.to_string(), execs, per_sec, files));
    }
    println!("\n{:<14} {:>12} {:>10} {:>8}", "target", "runs", "runs/s", "corpus");
    for (n, e, p, f) in rows {
        println!("{n:<14} {e:>12} {p:>10} {f:>8}");
    }
    Ok(())
}

/// The million-node tests, in release (each is `#[ignore]`d in the debug test run).
fn big() -> Result<()> {
    for (krate, test) in [("graph-plan", "reliability"), ("exec-sim", "differential")] {
        println!("== {krate}: million-node tests (release)");
        let mut c = cargo();
        c.current_dir(workspace()).args([
            "test",
            "--release",
            "-p",
            krate,
            "--test",
            test,
            "--",
            "--ignored",
            "--nocapture",
        ]);
        status(c)?;
    }
    Ok(())
}
