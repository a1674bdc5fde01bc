//! `cuplan pack FILE`: pack a MiniMalloc-format CSV of buffers into one pool, validate, report, write offsets.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use graph_passes::memory::pack::{self, csv, Budget, PackError, PackOptions};

/// Arguments of `cuplan pack`.
#[derive(Debug, Clone, clap::Args)]
pub struct PackArgs {
    /// CSV file with the header `id,lower,upper,size` (`-` reads standard input).
    pub file: PathBuf,
    /// Pool capacity in bytes: report height/capacity, and fail (exit 1) if the height exceeds it.
    #[arg(long)]
    pub capacity: Option<u64>,
    /// Wall-clock limit of the search phase in milliseconds (on top of the default effort limit).
    #[arg(long = "budget-ms")]
    pub budget_ms: Option<u64>,
    /// Deterministic effort limit of the search phase (work units; 0 = greedy only).
    #[arg(long)]
    pub effort: Option<u64>,
    /// Alignment of every offset, in bytes.
    #[arg(long, default_value_t = 1)]
    pub alignment: u64,
    /// Write `id,lower,upper,size,offset` rows to this file.
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Also draw the packing (time across, address down) as SVG to FILE.
    #[arg(long, value_name = "FILE")]
    pub memory_svg: Option<PathBuf>,
    /// Seed of the search's randomised restarts.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// Runs `cuplan pack`.
pub fn run(args: &PackArgs) -> anyhow::Result<()> {
    let stdin = args.file.as_os_str() == "-";
    let name = if stdin { "standard input".to_string() } else { args.file.display().to_string() };
    let text = if stdin {
        std::io::read_to_string(std::io::stdin()).context("reading standard input")?
    } else {
        std::fs::read_to_string(&args.file).with_context(|| format!("reading {name}"))?
    };
    let rows = csv::parse(&text).with_context(|| format!("in {name}"))?;
    let buffers: Vec<pack::Buffer> = rows.iter().map(|r| r.buffer).collect();

    let mut budget = Budget::default();
    if let Some(effort) = args.effort {
        budget.effort = effort;
    }
    if let Some(ms) = args.budget_ms {
        budget = budget.with_time_limit(Duration::from_millis(ms));
    }
    let opts = PackOptions { alignment: args.alignment, budget, seed: args.seed };
    let started = Instant::now();
    let packing = pack::pack(&buffers, &opts).map_err(|e| name_buffer(e, &rows))?;
    let elapsed = started.elapsed();
    pack::check(&buffers, &packing.offsets).context("the packing failed validation")?;

    println!("buffers      {}", buffers.len());
    println!("height       {}", packing.height);
    println!("lower bound  {}{}", packing.lower_bound, if packing.optimal { " (height optimal)" } else { "" });
    if packing.stats.proved_lower_bound > packing.lower_bound {
        println!("proved bound {}", packing.stats.proved_lower_bound);
    }
    if let Some(cap) = args.capacity {
        println!("capacity     {cap} (height/capacity {:.4})", packing.height as f64 / cap.max(1) as f64);
    }
    println!("strategy     {}", packing.strategy);
    println!(
        "search       {} nodes, {} effort, {} component(s) searched{}",
        packing.stats.search_nodes,
        packing.stats.search_effort,
        packing.stats.searched_components,
        match packing.stats.search_skipped {
            Some(skip) => format!(", skipped: {skip:?}"),
            None => String::new(),
        }
    );
    println!("time         {:.3} s", elapsed.as_secs_f64());

    if let Some(path) = &args.output {
        std::fs::write(path, csv::write(&rows, &packing.offsets))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.memory_svg {
        let svg = crate::viz::pack_svg(&buffers, &packing.offsets, args.alignment, &name)?;
        std::fs::write(path, svg).with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(cap) = args.capacity {
        if packing.height > cap {
            bail!("height {} exceeds capacity {cap} by {} bytes", packing.height, packing.height - cap);
        }
    }
    Ok(())
}

/// Replaces buffer indices in a pack error by the ids the user wrote.
fn name_buffer(err: PackError, rows: &[csv::CsvBuffer]) -> anyhow::Error {
    let id = |i: usize| rows.get(i).map_or("?", |r| r.id.as_str()).to_string();
    match &err {
        PackError::InvalidInterval { index, .. } | PackError::Overflow { index, .. } => {
            anyhow::Error::new(err.clone()).context(format!("buffer `{}`", id(*index)))
        }
        _ => anyhow::Error::new(err),
    }
}
