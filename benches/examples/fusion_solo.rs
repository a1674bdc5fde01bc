//! The fusion pass alone on a bench family, in its own process: `cargo run --release -p cuplan-benches
//! --example fusion_solo -- FAMILY NODES [REPS]` prints the median time of `Fusion::prepared` plus `analyse` (plan
//! builds' options: no decisions) in milliseconds, and the last run's `FusionStats` (`dag_visits` among them).

use anyhow::{bail, Context, Result};
use cuplan_benches::Family;
use std::time::Instant;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [family, nodes, rest @ ..] = args.as_slice() else {
        bail!("usage: fusion_solo FAMILY NODES [REPS]");
    };
    let f = Family::by_name(family).with_context(|| format!("unknown family '{family}'"))?;
    let nodes: usize = nodes.parse().context("NODES")?;
    let reps: usize = rest.first().map(|r| r.parse()).transpose().context("REPS")?.unwrap_or(7).max(1);
    let g = f.build(nodes)?;
    let topo = graph_passes::topo::analyse(&g)?;
    let target = graph_passes::target::Target::default();
    let opts = graph_passes::fusion::FusionOptions { decisions: false, ..Default::default() };
    let mut ms = Vec::with_capacity(reps);
    let mut stats = None;
    for _ in 0..reps {
        let t0 = Instant::now();
        let plan = graph_passes::fusion::Fusion::prepared(&g, &topo, &target, &opts).analyse(&opts);
        ms.push(t0.elapsed().as_secs_f64() * 1e3);
        stats = Some(plan.stats);
    }
    ms.sort_by(f64::total_cmp);
    println!("{} {} nodes: fusion {:.3} ms (median of {reps})", f.name(), g.num_nodes(), ms[reps / 2]);
    println!("{:?}", stats.context("no run")?);
    Ok(())
}
