//! One planner alone in its own process: `cargo run --release -p cuplan-benches --example peer_solo --
//! oxicuda|cuplan FAMILY NODES STREAMS [REPS]` prints the median build time in milliseconds (with
//! `PEER_SOLO_PASSES=1`, also each cuplan build's per-pass milliseconds on stderr).
//!
//! The peer bench interleaves both planners in one process, and each leaves the allocator in a state that
//! changes the other's time (oxicuda-graph at 10k nodes measured 1.4x slower after one version of our pipeline
//! than after another, with its own code unchanged). Timing each planner in a fresh process, and running the
//! two alternately from a shell, gives ratios that depend on the planners alone (docs/benchmarks.md, "Planning
//! speed, fourth round").

use anyhow::{bail, Context, Result};
use cuplan_benches::Family;
use std::time::Instant;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [who, family, nodes, streams, rest @ ..] = args.as_slice() else {
        bail!("usage: peer_solo oxicuda|cuplan FAMILY NODES STREAMS [REPS]");
    };
    let f = Family::by_name(family).with_context(|| format!("unknown family '{family}'"))?;
    let nodes: usize = nodes.parse().context("NODES")?;
    let streams: usize = streams.parse().context("STREAMS")?;
    let reps: usize = rest.first().map(|r| r.parse()).transpose().context("REPS")?.unwrap_or(7).max(1);
    let g = f.build(nodes)?;
    // `PEER_SOLO_PASSES=1`: also print each cuplan build's per-pass milliseconds (stderr).
    let passes = std::env::var_os("PEER_SOLO_PASSES").is_some();
    let mut ms = Vec::with_capacity(reps);
    match who.as_str() {
        "oxicuda" => {
            let peer = cuplan_benches::peer::to_oxicuda(&g)?;
            for _ in 0..reps {
                let t0 = Instant::now();
                let p = oxicuda_graph::ExecutionPlan::build(&peer, streams)?;
                ms.push(t0.elapsed().as_secs_f64() * 1e3);
                std::hint::black_box(p.pool_bytes);
            }
        }
        "cuplan" => {
            let opts = graph_plan::PlanOptions::with_streams(streams);
            for _ in 0..reps {
                let t0 = Instant::now();
                let p = graph_plan::ExecutionPlan::build_with(&g, &opts)?;
                ms.push(t0.elapsed().as_secs_f64() * 1e3);
                if passes {
                    eprintln!("{:?}", p.stats().pass_ms);
                }
                std::hint::black_box(p.pool_bytes);
            }
        }
        other => bail!("unknown planner '{other}' (oxicuda or cuplan)"),
    }
    ms.sort_by(f64::total_cmp);
    println!("{who} {} {} {streams} {:.3}", f.name(), g.num_nodes(), ms[ms.len() / 2]);
    Ok(())
}
