//! cuplan's developer tasks, run as `cargo xtask <task>`: `bench` (the benchmark report), `gpu-check` (the
//! prepared script for a machine with a GPU) and `fuzz` (the fuzz targets for a fixed time).

use anyhow::{bail, Result};

mod fuzz;

fn usage() -> &'static str {
    "usage: cargo xtask <bench [--quick] | gpu-check | fuzz [--seconds N]>"
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        None | Some("help" | "--help" | "-h") => {
            println!("{}", usage());
            Ok(())
        }
        Some("fuzz") => fuzz::run(&args[1..]),
        Some(other) => bail!("unknown or not yet available task {other:?}\n{}", usage()),
    }
}
