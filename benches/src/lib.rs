//! Shared helpers for cuplan's benchmarks (the criterion benches under `benches/` and `cargo xtask bench`):
//! synthetic graphs sized to a node count, the shared ONNX models and MiniMalloc instances found beside the
//! workspace, and the modelled makespan of a finished plan.
//!
//! Everything here is deterministic: a family at a size is always the same graph, so that numbers from
//! different runs (and from criterion and the xtask report) describe the same inputs.

pub mod peer;

use anyhow::{bail, Context, Result};
use exec_sim::{TimingOptions, TimingReport};
use graph_ir::{synth, ComputeGraph};
use graph_passes::memory::pack::Buffer;
use graph_plan::ExecutionPlan;
use std::path::{Path, PathBuf};

/// A synthetic graph family of `graph_ir::synth`, with the fixed parameters the benchmarks use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// Pre-norm transformer blocks (hidden 256, 4 heads, sequence 128, batch 1), sized by layers.
    Transformer,
    /// Random DAG with fan-in up to 3 (seed 0), sized by nodes.
    RandomDag,
    /// Residual conv blocks (32 channels, 32x32 image), sized by blocks.
    ResnetLike,
    /// Inception modules of 4 branches, sized by modules.
    InceptionLike,
    /// Unary elementwise chain, sized by nodes (fusion's best case).
    Chain,
}

impl Family {
    /// Every family, in report order.
    pub const ALL: [Family; 5] =
        [Family::Transformer, Family::RandomDag, Family::ResnetLike, Family::InceptionLike, Family::Chain];

    /// The family's name in reports and benchmark ids.
    pub fn name(self) -> &'static str {
        match self {
            Family::Transformer => "transformer",
            Family::RandomDag => "random_dag",
            Family::ResnetLike => "resnet_like",
            Family::InceptionLike => "inception_like",
            Family::Chain => "chain",
        }
    }

    /// A family by name.
    pub fn by_name(name: &str) -> Option<Family> {
        Family::ALL.into_iter().find(|f| f.name() == name)
    }

    /// The family at `units` repetitions of its building block (layers, blocks, modules or nodes).
    pub fn build_units(self, units: usize) -> Result<ComputeGraph> {
        let g = match self {
            Family::Transformer => synth::transformer(units, 256, 4, 128, 1),
            Family::RandomDag => synth::random_dag(units, 3, 0),
            Family::ResnetLike => synth::resnet_like(units, 32, 32),
            Family::InceptionLike => synth::inception_like(units, 4),
            Family::Chain => synth::chain(units),
        };
        g.with_context(|| format!("synth {} with {units} units", self.name()))
    }

    /// How many building blocks give about `nodes` nodes (at least one). Block-structured families grow by a
    /// fixed number of nodes per block, found by building one and two blocks.
    pub fn units_for(self, nodes: usize) -> Result<usize> {
        match self {
            Family::RandomDag | Family::Chain => Ok(nodes.max(1)),
            _ => {
                let one = self.build_units(1)?.num_nodes();
                let two = self.build_units(2)?.num_nodes();
                let per = two.saturating_sub(one);
                if per == 0 {
                    bail!("{} does not grow with its unit count", self.name());
                }
                let base = one - per;
                Ok((nodes.saturating_sub(base) as f64 / per as f64).round().max(1.0) as usize)
            }
        }
    }

    /// The family sized to about `nodes` nodes.
    pub fn build(self, nodes: usize) -> Result<ComputeGraph> {
        self.build_units(self.units_for(nodes)?)
    }
}

/// The four shared ONNX models, in report order.
pub const SHARED_MODELS: [&str; 4] = ["resnet50", "mobilenet_v2", "googlenet", "bert_base"];

/// The workspace root (the directory above this package).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// The shared data directory (the MiniMalloc instances): `$CUPLAN_SHARED_DIR`, else the first `shared/` beside
/// the workspace root or one of its ancestors that holds `models/` or `bench/` (`../shared` for the main checkout, `../../shared` for a
/// worktree under `wt/`).
pub fn shared_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("CUPLAN_SHARED_DIR") {
        return Some(PathBuf::from(d));
    }
    let root = workspace_root();
    root.ancestors().skip(1).map(|a| a.join("shared")).find(|s| s.join("models").is_dir() || s.join("bench").is_dir())
}

/// The repository's ONNX models: `$CUPLAN_MODELS_DIR`, else `models/` at the workspace root.
pub fn models_dir() -> PathBuf {
    std::env::var_os("CUPLAN_MODELS_DIR").map_or_else(|| workspace_root().join("models"), PathBuf::from)
}

/// Path of model `name` (`resnet50`, ...) in [`models_dir`], if the file exists.
pub fn model_path(name: &str) -> Option<PathBuf> {
    let p = models_dir().join(format!("{name}.onnx"));
    p.is_file().then_some(p)
}

/// Import shared model `name`; `Ok(None)` when the file is absent.
pub fn load_model(name: &str) -> Result<Option<ComputeGraph>> {
    let Some(path) = model_path(name) else { return Ok(None) };
    let model = graph_onnx::import_file(&path, &graph_onnx::ImportOptions::default())
        .with_context(|| format!("importing {}", path.display()))?;
    Ok(Some(model.graph))
}

/// One MiniMalloc instance: its name, the capacity in its file name, and its buffers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MinimallocInstance {
    /// File stem (`A.1048576`).
    pub name: String,
    /// Capacity the instance is known to fit in (the number in the file name), if the name carries one.
    pub capacity: Option<u64>,
    /// Buffers in file order.
    pub buffers: Vec<Buffer>,
}

/// Parse MiniMalloc's CSV format: a header `id,lower,upper,size`, then one buffer a row.
pub fn parse_minimalloc(text: &str) -> Result<Vec<Buffer>> {
    let mut lines = text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty());
    let Some((_, header)) = lines.next() else { bail!("empty file: expected the header id,lower,upper,size") };
    let cols: Vec<&str> = header.split(',').map(str::trim).collect();
    let col = |name: &str| cols.iter().position(|c| *c == name).with_context(|| format!("header lacks `{name}`"));
    let (lo, hi, sz) = (col("lower")?, col("upper")?, col("size")?);
    let mut out = Vec::new();
    for (i, line) in lines {
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        let num = |c: usize, what: &str| -> Result<u64> {
            let s = f.get(c).with_context(|| format!("line {}: missing `{what}`", i + 1))?;
            s.parse().with_context(|| format!("line {}: `{what}` = {s:?} is not a non-negative integer", i + 1))
        };
        out.push(Buffer { lower: num(lo, "lower")?, upper: num(hi, "upper")?, size: num(sz, "size")? });
    }
    Ok(out)
}

/// Every `*.csv` instance under `<shared>/bench/minimalloc`, sorted by name (empty when absent).
pub fn minimalloc_instances() -> Result<Vec<MinimallocInstance>> {
    let Some(dir) = shared_dir().map(|d| d.join("bench").join("minimalloc")) else { return Ok(Vec::new()) };
    let Ok(entries) = std::fs::read_dir(&dir) else { return Ok(Vec::new()) };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "csv"))
        .collect();
    paths.sort();
    let mut out = Vec::new();
    for p in paths {
        let text = std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
        let buffers = parse_minimalloc(&text).with_context(|| p.display().to_string())?;
        let name = p.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        let capacity = name.rsplit('.').next().and_then(|s| s.parse().ok());
        out.push(MinimallocInstance { name, capacity, buffers });
    }
    Ok(out)
}

/// Modelled replay of `plan`: exec-sim's timing model (DESIGN.md section 5) on the plan's device profile
/// with CUDA-graph launch overhead.
pub fn plan_timing(plan: &ExecutionPlan) -> Result<TimingReport> {
    exec_sim::simulate(plan, &TimingOptions::for_plan(plan)).context("timing model of the plan")
}

/// The dynamic-batch models (`models/dynamic/`, symbol `batch`) the plan-set benches use.
pub const DYNAMIC_MODELS: [&str; 4] = ["bert_base", "googlenet", "mobilenet_v2", "resnet50"];

/// The bytes of dynamic model `name` in `models/dynamic/`; `Ok(None)` when the file is absent.
pub fn dynamic_model_bytes(name: &str) -> Result<Option<Vec<u8>>> {
    let p = models_dir().join("dynamic").join(format!("{name}.onnx"));
    if !p.is_file() {
        return Ok(None);
    }
    Ok(Some(std::fs::read(&p).with_context(|| format!("reading {}", p.display()))?))
}

/// Import options of a set's members: `batch` bound, folded constants kept as constants (as the CLI does).
fn member_import(b: usize) -> graph_onnx::ImportOptions {
    let mut o = graph_onnx::ImportOptions::with_dims([("batch", b)]);
    o.inline_folded = true;
    o
}

/// One plan as a standalone user makes it: decode and import the model at `batch`, then build.
pub fn one_plan(bytes: &[u8], batch: usize, opts: &graph_plan::PlanOptions) -> Result<ExecutionPlan> {
    let model = graph_onnx::import(bytes, &member_import(batch))?;
    Ok(ExecutionPlan::build_with(&model.graph, opts)?)
}

/// A plan set over `batch` = `buckets`, from the model's bytes: decoded once, imported per member.
pub fn plan_set(bytes: &[u8], buckets: &[usize], opts: &graph_plan::PlanOptions) -> Result<graph_plan::PlanSet> {
    let decoded = graph_onnx::DecodedModel::decode(bytes, &graph_onnx::ImportOptions::default())?;
    let list: Vec<String> = buckets.iter().map(ToString::to_string).collect();
    let spec = graph_plan::BucketSpec::parse(&[format!("batch={}", list.join(","))])?;
    let set_opts = graph_plan::SetOptions { plan: opts.clone(), ..Default::default() };
    Ok(graph_plan::PlanSet::build(&spec, &set_opts, |d| {
        let b = d.get("batch").copied().unwrap_or(1);
        Ok(decoded.import(&member_import(b)).map_err(Box::new)?.graph)
    })?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minimalloc_csv_parses_the_readme_example() {
        let text = "id,lower,upper,size\nb1,0,3,4\nb2,3,9,4\nb3,0,9,4\nb4,9,21,4\nb5,0,21,4\n";
        let b = parse_minimalloc(text).unwrap();
        assert_eq!(b.len(), 5);
        assert_eq!(b[1], Buffer { lower: 3, upper: 9, size: 4 });
        assert_eq!(graph_passes::memory::pack::lower_bound(&b, 1), 12);
    }

    #[test]
    fn minimalloc_csv_errors_name_the_line_and_field() {
        let err = parse_minimalloc("id,lower,upper,size\nb1,0,x,4\n").unwrap_err();
        assert!(format!("{err:#}").contains("line 2") && format!("{err:#}").contains("upper"), "{err:#}");
        assert!(parse_minimalloc("id,lower,size\n").is_err());
        assert!(parse_minimalloc("").is_err());
    }

    #[test]
    fn families_hit_their_size() {
        for f in Family::ALL {
            let g = f.build(1000).unwrap();
            let n = g.num_nodes();
            assert!((700..=1300).contains(&n), "{}: {n} nodes for a target of 1000", f.name());
            assert_eq!(Family::by_name(f.name()), Some(f));
        }
    }

    #[test]
    fn modelled_makespan_of_a_plan_is_at_or_above_its_bound() {
        let g = Family::Transformer.build(300).unwrap();
        let plan = ExecutionPlan::build(&g, 4).unwrap();
        let t = plan_timing(&plan).unwrap();
        assert!(t.makespan_us > 0.0);
        assert!(t.makespan_us + 1e-9 >= t.bound_us);
    }
}
