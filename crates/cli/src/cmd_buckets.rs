//! `cuplan buckets --histogram FILE --max-buckets K`: choose bucket sizes for an observed distribution of
//! request sizes (exact DP over the sorted sizes, `graph_plan::set::buckets`), beside powers of two; with
//! `--memory-budget`, check that the model's largest bucket fits.

use anyhow::{bail, Context, Result};
use graph_plan::set::buckets::{choose, powers_of_two, Histogram};
use graph_plan::set::{dims_label, SetError};
use graph_plan::{Dims, Region};

use crate::cmd_plan::{build_checked, PlanFlags};
use crate::load::{parse_dims, GraphArgs, Source};

/// Arguments of `buckets`.
#[derive(clap::Args, Debug)]
pub struct BucketsArgs {
    /// Request sizes: one per line (`SIZE`), or `SIZE COUNT` / `SIZE,COUNT` per line; `#` starts a comment.
    #[arg(long, value_name = "FILE")]
    histogram: std::path::PathBuf,
    /// Most buckets to choose.
    #[arg(long, value_name = "K")]
    max_buckets: usize,
    /// Bytes the set may take on the device (pool + weights + io + host of the largest bucket); needs --model
    /// and --symbol.
    #[arg(long, value_name = "BYTES")]
    memory_budget: Option<u64>,
    /// The model the buckets are for (to check --memory-budget), with --dim for its other symbols.
    #[arg(long, value_name = "MODEL")]
    model: Option<String>,
    /// The model's symbol the sizes are values of (e.g. batch).
    #[arg(long, value_name = "NAME")]
    symbol: Option<String>,
    /// Bind the model's other symbolic dimensions: NAME=VALUE (repeatable).
    #[arg(long = "dim", value_name = "NAME=VALUE")]
    dims: Vec<String>,
    #[command(flatten)]
    flags: PlanFlags,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// Run `buckets`.
pub fn run(a: &BucketsArgs) -> Result<()> {
    let text = std::fs::read_to_string(&a.histogram)
        .with_context(|| format!("--histogram: cannot read '{}'", a.histogram.display()))?;
    let h = Histogram::parse(&text).with_context(|| format!("'{}'", a.histogram.display()))?;
    let choice = choose(&h, a.max_buckets)?;
    let pow2 = powers_of_two(&h);
    let pow2_work = h.padded_work(&pow2).context("powers of two cover every size")?;
    let work = h.work();
    let waste = |w: u128| if work > 0 { (w - work) as f64 / work as f64 } else { 0.0 };
    // The DP at as many buckets as powers of two: the same bucket count, chosen for this histogram.
    let same_count = choose(&h, pow2.len())?;
    let largest = choice.buckets.last().copied().unwrap_or(1);
    let mut memory = None;
    match (a.memory_budget, &a.model, &a.symbol) {
        (None, None, _) => {}
        (Some(budget), Some(model), Some(symbol)) => {
            let mut d: Dims = parse_dims(&a.dims)?.into_iter().collect();
            d.insert(symbol.clone(), largest);
            let source = Source::read(&GraphArgs { graph: model.clone(), dims: Vec::new() })?;
            let g = source.load_at(&d)?.graph;
            let (plan, _) = build_checked(&g, &a.flags.options()?)?;
            let needed = Region::ALL.iter().fold(0u64, |s, &r| s.saturating_add(plan.region_bytes(r)));
            if needed > budget {
                return Err(SetError::Budget { budget, needed, dims: dims_label(&d) }.into());
            }
            memory = Some((needed, budget));
        }
        _ => bail!("--memory-budget needs --model and --symbol (and --model is only for --memory-budget)"),
    }
    if a.json {
        let out = serde_json::json!({
            "requests": h.requests(),
            "distinct_sizes": h.bins.len(),
            "buckets": choice.buckets,
            "padded_work": choice.padded_work as f64,
            "work": work as f64,
            "waste": waste(choice.padded_work),
            "powers_of_two": pow2,
            "powers_of_two_waste": waste(pow2_work),
            "same_count_buckets": same_count.buckets,
            "same_count_waste": waste(same_count.padded_work),
            "memory": memory.map(|(n, b)| serde_json::json!({"needed_bytes": n, "budget_bytes": b})),
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!(
        "{} requests, {} distinct sizes from {} to {}",
        h.requests(),
        h.bins.len(),
        h.bins.first().map_or(0, |b| b.0),
        h.bins.last().map_or(0, |b| b.0)
    );
    let list = |b: &[usize]| b.iter().map(ToString::to_string).collect::<Vec<_>>().join(",");
    println!(
        "chosen ({} of at most {}): {}  expected padding waste {:.2}%",
        choice.buckets.len(),
        a.max_buckets,
        list(&choice.buckets),
        100.0 * waste(choice.padded_work)
    );
    println!(
        "powers of two ({}): {}  expected padding waste {:.2}%",
        pow2.len(),
        list(&pow2),
        100.0 * waste(pow2_work)
    );
    println!(
        "chosen with as many buckets as powers of two ({}): {}  expected padding waste {:.2}%",
        same_count.buckets.len(),
        list(&same_count.buckets),
        100.0 * waste(same_count.padded_work)
    );
    if let Some((needed, budget)) = memory {
        println!("memory: the largest bucket needs {needed} B of the budget's {budget} B (the set's pool is its pool)");
    }
    if let Some(s) = &a.symbol {
        println!("use: --buckets {s}={}", list(&choice.buckets));
    }
    Ok(())
}
