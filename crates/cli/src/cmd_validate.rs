//! `cuplan validate GRAPH`: check a graph and print a summary.

use anyhow::Result;
use graph_ir::{ComputeGraph, TensorRole};

use crate::load::{load, GraphArgs};

/// Arguments of `validate`.
#[derive(clap::Args, Debug)]
pub struct ValidateArgs {
    #[command(flatten)]
    graph: GraphArgs,
}

/// Human-readable byte count.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

/// The summary text of a valid graph.
pub fn summary(g: &ComputeGraph) -> String {
    let mut s = String::new();
    s.push_str(&format!("graph '{}': valid\n", g.name()));
    s.push_str(&format!("  nodes: {}\n", g.num_nodes()));
    let mut cats = g.category_counts();
    cats.sort_by_key(|(c, _)| format!("{c:?}"));
    for (c, n) in cats {
        s.push_str(&format!("    {:<13} {n}\n", format!("{c:?}").to_lowercase()));
    }
    s.push_str(&format!("  tensors: {}\n", g.num_tensors()));
    for role in
        [TensorRole::Input, TensorRole::Weight, TensorRole::Constant, TensorRole::Intermediate, TensorRole::Output]
    {
        let (n, bytes) = g
            .tensors()
            .filter(|(_, t)| t.role == role)
            .fold((0usize, 0u64), |(n, b), (_, t)| (n + 1, b.saturating_add(t.size_bytes() as u64)));
        if n > 0 {
            s.push_str(&format!("    {:<13} {n:>7} tensors {:>12}\n", role.name(), human_bytes(bytes)));
        }
    }
    for (label, list) in [("inputs", g.inputs()), ("outputs", g.outputs())] {
        s.push_str(&format!("  {label}:\n"));
        for &t in list {
            let t = g.tensor(t);
            s.push_str(&format!("    {} {} {}\n", t.name, t.dtype, t.shape));
        }
    }
    s
}

/// Run `validate`.
pub fn run(args: &ValidateArgs) -> Result<()> {
    let l = load(&args.graph)?;
    l.graph.validate()?;
    print!("{}", summary(&l.graph));
    if let Some(o) = &l.origin {
        println!("  source: {o}");
    }
    Ok(())
}
