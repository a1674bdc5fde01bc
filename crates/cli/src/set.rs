//! Plan sets on the command line: `--buckets NAME=V1,V2,...` on `plan`, `run` and `explain` plans one model
//! for every bucket with one shared layout (graph_plan::set).

use anyhow::{bail, Context, Result};
use graph_plan::set::{dims_label, SetOptions};
use graph_plan::{verify_set, BucketSpec, Dims, PlanOptions, PlanSet, TensorMap};
use std::time::Instant;

use crate::load::{parse_dims, GraphArgs, Source};

/// Flags that turn a command into its plan-set form.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct SetFlags {
    /// Plan one member per bucket value of a symbolic dimension, sharing one pool, one weight upload and fixed
    /// io addresses: NAME=V1,V2,... ascending (repeat for a grid over two symbols, e.g. batch x seq).
    #[arg(long = "buckets", value_name = "NAME=V1,V2,...")]
    pub buckets: Vec<String>,
    /// Mark a bucketed symbol safe to pad even where the analysis finds a node mixing across its axis (e.g. a
    /// sequence length whose attention is masked).
    #[arg(long = "pad-safe", value_name = "NAME")]
    pub pad_safe: Vec<String>,
}

impl SetFlags {
    /// True when `--buckets` was given.
    pub fn active(&self) -> bool {
        !self.buckets.is_empty()
    }
}

/// A built and checked set, with the weights its file carried and the source to load other sizes from.
pub struct BuiltSet {
    /// The set.
    pub set: PlanSet,
    /// Weight values from the file (ONNX initializers with data).
    pub weights: TensorMap,
    /// The model file, to load the exact graph of a request.
    pub source: Source,
    /// Milliseconds of the whole build (loading every member, analysis, planning).
    pub compile_ms: f64,
}

/// Build the set `flags` ask for; `request` names `--dim` values that select a request (for `run`) rather than
/// fix a symbol for every member.
pub fn build(graph: &GraphArgs, flags: &SetFlags, opts: &PlanOptions, request: bool) -> Result<BuiltSet> {
    let spec = BucketSpec::parse(&flags.buckets)?;
    let dims = parse_dims(&graph.dims)?;
    let mut fixed = Dims::new();
    for (k, v) in dims {
        if !(request && spec.names().any(|n| n == k)) {
            fixed.insert(k, v);
        }
    }
    let source = Source::read(graph)?;
    let t0 = Instant::now();
    let weights = std::sync::Mutex::new(None::<TensorMap>);
    let set_opts = SetOptions { plan: opts.clone(), fixed, pad_safe: flags.pad_safe.clone() };
    let set = PlanSet::build(&spec, &set_opts, |d| {
        let err = |e: anyhow::Error| -> graph_plan::set::LoadError { format!("{e:#}").into() };
        // The weights' values once, with the first member to load (they do not change with the buckets).
        let mut w = weights.lock().map_err(|_| -> graph_plan::set::LoadError { "a loader panicked".into() })?;
        if w.is_none() {
            let l = source.load_at(d).map_err(err)?;
            *w = Some(l.weights);
            return Ok(l.graph);
        }
        drop(w);
        source.graph_at(d).map_err(err)
    })?;
    let weights = weights.into_inner().ok().flatten().unwrap_or_default();
    let compile_ms = t0.elapsed().as_secs_f64() * 1e3;
    if let Err(v) = verify_set(&set) {
        let first: Vec<String> = v.iter().take(3).map(ToString::to_string).collect();
        let detail = format!("the plan set fails verify_set ({} violations; first: {})", v.len(), first.join("; "));
        return Err(graph_plan::PlanError::from(graph_plan::InternalError::new("verify_set", detail)).into());
    }
    Ok(BuiltSet { set, weights, source, compile_ms })
}

/// The request `--dim` names on `run --buckets`: every bucketed symbol's value (fixed symbols may be repeated).
pub fn request(graph: &GraphArgs, set: &PlanSet) -> Result<Dims> {
    let mut d: Dims = parse_dims(&graph.dims)?.into_iter().collect();
    for s in set.spec().names() {
        if !d.contains_key(s) {
            bail!("--buckets: give the request's size with --dim {s}=VALUE");
        }
    }
    for (k, v) in set.fixed() {
        d.entry(k.clone()).or_insert(*v);
    }
    Ok(d)
}

/// Load the exact graph of `dims` from the set's source (for `--check`).
pub fn exact_graph(b: &BuiltSet, dims: &Dims) -> Result<graph_ir::ComputeGraph> {
    Ok(b.source.load_at(dims).with_context(|| format!("loading the exact graph at {}", dims_label(dims)))?.graph)
}
