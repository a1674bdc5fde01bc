//! Plan sets: one model planned for many values of its symbolic dimensions (shape buckets), every member
//! sharing one memory layout, so that a backend allocates one pool (the largest member's), uploads the weights
//! once, and captures one CUDA graph per bucket over the same weight and io addresses.
//!
//! Building a set (`PlanSet::build`): load the model at every member's dims (and at one more value of a symbol
//! with a single bucket, to see which axes it moves), find which symbols may be padded (`padding`) and how each
//! graph input's and output's extents follow the symbols, lay out the shared weights and io regions
//! ([`SharedLayout`], io slots sized for the largest member so that a smaller one uses a prefix of each), then
//! plan every member with that layout passed down to its memory pass. `verify_set` checks the result.
//!
//! Running a request (`PlanSet::run_with`): `select` the smallest member covering the request, pad each input
//! with zeros after its valid part, run, and slice each output back; above the largest bucket, optionally in
//! chunks of it along a chunkable symbol. The executors supply only "run member i on these inputs".

pub mod buckets;
pub mod host;
mod padding;
mod spec;

use graph_ir::ComputeGraph;
use graph_passes::memory::{outside_slots, OutsideSlot, Region, SharedLayout};
use graph_passes::precision::PrecisionPolicy;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::time::Instant;

use crate::{BindingRole, ExecError, ExecutionPlan, HostTensor, PlanOptions, TensorMap};
pub use padding::{AxisExtent, IoTensor, Mixing, SymbolPadding};
pub use spec::{dims_label, BucketSpec, Dims, SetError, SymbolBuckets, MAX_MEMBERS, MAX_SYMBOLS};

/// Options of a set: the plan options every member is planned with, fixed values of the model's other symbols,
/// and the symbols the caller marks safe to pad whatever the analysis finds.
#[derive(Clone, Debug, Default)]
pub struct SetOptions {
    /// Options of every member's plan (the set adds the shared layout).
    pub plan: PlanOptions,
    /// Values of symbols that are not bucketed (`--dim seq=128` beside `--buckets batch=...`).
    pub fixed: Dims,
    /// Symbols the caller marks safe to pad (e.g. a sequence length whose attention is masked).
    pub pad_safe: Vec<String>,
}

/// One member of a set: its dims and its plan.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SetMember {
    /// The values of the symbols this member is planned for.
    pub dims: Dims,
    /// Its plan (weights and io at the set's shared addresses).
    pub plan: ExecutionPlan,
    /// Milliseconds its plan took (the shared work, loading and analysis, is in the set's `load_ms`).
    pub compile_ms: f64,
}

/// A model planned for a set of buckets, sharing one layout (module docs).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PlanSet {
    spec: BucketSpec,
    fixed: Dims,
    members: Vec<SetMember>,
    padding: Vec<SymbolPadding>,
    io: Vec<IoTensor>,
    region_bytes: [u64; 4],
    load_ms: f64,
}

/// One request's piece: run `member` on the request's rows `[start, start + dims[symbol])` of the chunked
/// symbol (`start` 0 and the whole request when it is not chunked).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Piece {
    /// Index of the member that runs it.
    pub member: usize,
    /// The piece's own dims (the request's, with the chunked symbol's value cut to the piece).
    pub dims: Dims,
    /// The chunked symbol and the piece's first row along it.
    pub chunk: Option<(String, usize)>,
}

/// A breach of the shared layout found by [`verify_set`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetViolation {
    /// The member (`batch=4`), or empty for the set.
    pub member: String,
    /// What is wrong.
    pub detail: String,
}

impl fmt::Display for SetViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.member.is_empty() {
            write!(f, "{}", self.detail)
        } else {
            write!(f, "member {}: {}", self.member, self.detail)
        }
    }
}

/// The loader a set calls for each member's dims (an ONNX import or a JSON bind with those symbol values).
pub type LoadError = Box<dyn std::error::Error + Send + Sync>;

impl PlanSet {
    /// Plan `spec`'s members of the model `load` returns at given dims (module docs for the steps).
    pub fn build(
        spec: &BucketSpec,
        opts: &SetOptions,
        load: impl Fn(&Dims) -> Result<ComputeGraph, LoadError> + Sync,
    ) -> Result<PlanSet, SetError> {
        let _span = tracing::info_span!("plan_set").entered();
        let t0 = Instant::now();
        spec.validate()?;
        for s in spec.names() {
            if opts.fixed.contains_key(s) {
                return Err(SetError::UnknownSymbol {
                    symbol: s.to_string(),
                    detail: "is given both as a bucket list and as a fixed --dim".into(),
                });
            }
        }
        for s in &opts.pad_safe {
            if !spec.names().any(|n| n == s) {
                return Err(SetError::UnknownSymbol {
                    symbol: s.clone(),
                    detail: format!("is marked safe to pad but is not bucketed (buckets: {})", names(spec)),
                });
            }
        }
        let dims = spec.members(&opts.fixed);
        // Members load in parallel: they share nothing but the read-only model. The same worker finds the
        // member's outside-pool slots (its graph's own facts); their errors surface below, where the layout
        // needs them, so that a set reports its problems in one order.
        let precision = &opts.plan.precision;
        let (graphs, slots): (Vec<ComputeGraph>, Vec<Result<Vec<OutsideSlot>, SetError>>) = dims
            .par_iter()
            .map(|d| {
                let g = load(d).map_err(|source| SetError::Load { dims: dims_label(d), source })?;
                let slots = member_slots(d, &g, precision);
                Ok((g, slots))
            })
            .collect::<Result<Vec<_>, SetError>>()?
            .into_iter()
            .unzip();
        // Weights are supplied once by name for every member, so none may change with the symbols.
        check_weights(&dims, &graphs)?;
        // A symbol with one bucket gets a probe one above it, to see which axes it moves.
        let mut probes: Vec<(Dims, ComputeGraph)> = Vec::new();
        for s in &spec.symbols {
            if s.values.len() == 1 {
                let mut d = dims[0].clone();
                let v = s.values[0].saturating_add(1);
                d.insert(s.name.clone(), v);
                let g = load(&d).map_err(|source| SetError::Load { dims: dims_label(&d), source })?;
                probes.push((d, g));
            }
        }
        let samples: Vec<(&Dims, &ComputeGraph)> =
            dims.iter().zip(&graphs).chain(probes.iter().map(|(d, g)| (d, g))).collect();
        let mut pairs = Vec::new();
        let mut padding = Vec::new();
        for s in spec.names() {
            let Some((lo, hi)) = padding::pair_for(&samples, s) else {
                return Err(SetError::UnknownSymbol { symbol: s.into(), detail: "no two members differ in it".into() });
            };
            let (gl, gh) = (samples[lo].1, samples[hi].1);
            if !shapes_differ(gl, gh) {
                return Err(SetError::UnknownSymbol {
                    symbol: s.to_string(),
                    detail: format!("no tensor's shape changes with it: model '{}' has no such symbol", gh.name()),
                });
            }
            let order = graph_passes::topo::analyse(gh)
                .map_err(|e| SetError::Member { dims: dims_label(samples[hi].0), source: e.into() })?;
            padding.push(SymbolPadding {
                symbol: s.to_string(),
                mixing: padding::first_mixing(gl, gh, &order.order),
                marked_safe: opts.pad_safe.iter().any(|p| p == s),
            });
            pairs.push((s.to_string(), lo, hi));
        }
        let io = padding::fit_io(&samples, &pairs);
        drop(samples);
        drop(probes);
        let slots = slots.into_iter().collect::<Result<Vec<_>, _>>()?;
        let layouts = shared_layouts(&slots, opts.plan.memory.alignment.max(1));
        drop(slots);
        let load_ms = t0.elapsed().as_secs_f64() * 1e3;

        // Members plan in parallel too: each gets its own layout and nothing else is shared while planning.
        // Each member's graph is dropped by the worker that planned it.
        let members: Vec<SetMember> = dims
            .into_par_iter()
            .zip(graphs.into_par_iter())
            .zip(layouts.into_par_iter())
            .map(|((d, g), layout)| {
                let t = Instant::now();
                let mut o = opts.plan.clone();
                o.memory.layout = Some(layout);
                let plan = ExecutionPlan::build_with(&g, &o)
                    .map_err(|source| SetError::Member { dims: dims_label(&d), source })?;
                let compile_ms = t.elapsed().as_secs_f64() * 1e3;
                drop(g);
                Ok(SetMember { dims: d, plan, compile_ms })
            })
            .collect::<Result<_, SetError>>()?;
        let mut region_bytes = [0u64; 4];
        for m in &members {
            for r in Region::ALL {
                region_bytes[r.index()] = region_bytes[r.index()].max(m.plan.region_bytes(r));
            }
        }
        Ok(PlanSet { spec: spec.clone(), fixed: opts.fixed.clone(), members, padding, io, region_bytes, load_ms })
    }

    /// The buckets the set was planned for.
    pub fn spec(&self) -> &BucketSpec {
        &self.spec
    }

    /// Values of the model's other symbols, fixed for every member.
    pub fn fixed(&self) -> &Dims {
        &self.fixed
    }

    /// The members, row-major over the spec's symbols.
    pub fn members(&self) -> &[SetMember] {
        &self.members
    }

    /// How each bucketed symbol may be padded.
    pub fn padding(&self) -> &[SymbolPadding] {
        &self.padding
    }

    /// The graph inputs and outputs with their extents as functions of the symbols.
    pub fn io(&self) -> &[IoTensor] {
        &self.io
    }

    /// Bytes of a region of the set: the pool and host regions are the largest member's, the weights and io
    /// regions are shared by every member.
    pub fn region_bytes(&self, region: Region) -> u64 {
        self.region_bytes[region.index()]
    }

    /// The activation pool of the set: the largest member's (members never run at the same time).
    pub fn pool_bytes(&self) -> u64 {
        self.region_bytes(Region::Pool)
    }

    /// What separate plans' pools would cost together.
    pub fn sum_pool_bytes(&self) -> u64 {
        self.members.iter().fold(0u64, |s, m| s.saturating_add(m.plan.region_bytes(Region::Pool)))
    }

    /// Milliseconds spent loading the model at every member's dims and analysing the set (before planning).
    pub fn load_ms(&self) -> f64 {
        self.load_ms
    }

    /// The smallest member covering `request` (every bucketed symbol at least the request's value). Typed errors
    /// for a missing, unknown or zero symbol, a fixed symbol at another value, a value above the largest bucket,
    /// and a padded request along a symbol that is not safe to pad.
    pub fn select(&self, request: &Dims) -> Result<usize, SetError> {
        self.check_request(request)?;
        let mut want = self.fixed.clone();
        for s in &self.spec.symbols {
            let v = request[&s.name];
            let Some(&b) = s.values.iter().find(|&&b| b >= v) else {
                let largest = s.values.last().copied().unwrap_or(0);
                let hint = if self.chunk_axes(&s.name).is_ok() {
                    "; run it in chunks of the largest bucket (the chunk option)".to_string()
                } else {
                    String::new()
                };
                return Err(SetError::AboveLargest { symbol: s.name.clone(), value: v, largest, hint });
            };
            if b != v {
                let p = self.padding.iter().find(|p| p.symbol == s.name);
                if let Some(Mixing { node, op, detail }) = p.filter(|p| !p.safe()).and_then(|p| p.mixing.clone()) {
                    return Err(SetError::NotPaddable { symbol: s.name.clone(), node, op, detail });
                }
                if self.io.iter().any(|t| t.extents.is_none()) {
                    let t = self.io.iter().find(|t| t.extents.is_none()).map_or("", |t| t.name.as_str());
                    return Err(SetError::Request {
                        detail: format!(
                            "{}={v} needs padding, but the shape of '{t}' is not an affine function of the \
                             symbols; only the buckets themselves can run",
                            s.name
                        ),
                    });
                }
            }
            want.insert(s.name.clone(), b);
        }
        self.members
            .iter()
            .position(|m| m.dims == want)
            .ok_or_else(|| SetError::Request { detail: format!("no member for {}", dims_label(&want)) })
    }

    fn check_request(&self, request: &Dims) -> Result<(), SetError> {
        for (k, v) in request {
            if let Some(&f) = self.fixed.get(k) {
                if f != *v {
                    return Err(SetError::Request {
                        detail: format!("symbol '{k}' is fixed at {f} in this set; the request has {v}"),
                    });
                }
            } else if !self.spec.names().any(|n| n == k) {
                return Err(SetError::Request {
                    detail: format!("unknown symbol '{k}' (bucketed: {})", names(&self.spec)),
                });
            }
        }
        for s in self.spec.names() {
            match request.get(s) {
                None => return Err(SetError::Request { detail: format!("no value for symbol '{s}'") }),
                Some(0) => return Err(SetError::Request { detail: format!("{s}=0 holds no rows") }),
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// For chunking along `symbol`: each graph input's and output's axis that follows it, with rows per unit of
    /// the symbol. Chunkable when the symbol is safe to pad and every io tensor has exactly one axis that depends
    /// on it, as `coef * symbol` alone.
    pub fn chunk_axes(&self, symbol: &str) -> Result<BTreeMap<String, (usize, usize)>, String> {
        if !self.padding.iter().any(|p| p.symbol == symbol && p.safe()) {
            return Err(format!("'{symbol}' is not safe to pad, so not to chunk either"));
        }
        let mut out = BTreeMap::new();
        for t in &self.io {
            let ext = t.extents.as_ref().ok_or_else(|| format!("the shape of '{}' is not affine", t.name))?;
            let axes: Vec<usize> = (0..ext.len()).filter(|&a| ext[a].depends_on(symbol)).collect();
            let [a] = axes[..] else {
                return Err(format!(
                    "'{}' has {} axes that follow '{symbol}' (chunking needs one)",
                    t.name,
                    axes.len()
                ));
            };
            let e = &ext[a];
            let coef = match &e.coef[..] {
                [(s, c)] if s == symbol && e.base == 0 && *c > 0 => usize::try_from(*c).map_err(|e| e.to_string())?,
                _ => return Err(format!("axis {a} of '{}' is not a multiple of '{symbol}' alone", t.name)),
            };
            out.insert(t.name.clone(), (a, coef));
        }
        Ok(out)
    }

    /// How a request runs: one piece on the member `select` picks, or with `chunk` above the largest bucket,
    /// pieces of the largest bucket along the one symbol that exceeds it (the last piece on the member that
    /// covers what is left).
    pub fn pieces(&self, request: &Dims, chunk: bool) -> Result<Vec<Piece>, SetError> {
        match self.select(request) {
            Ok(member) => Ok(vec![Piece { member, dims: request.clone(), chunk: None }]),
            Err(SetError::AboveLargest { symbol, value, largest, .. }) if chunk => {
                self.chunk_axes(&symbol).map_err(|why| SetError::AboveLargest {
                    symbol: symbol.clone(),
                    value,
                    largest,
                    hint: format!("; it cannot be chunked: {why}"),
                })?;
                let mut out = Vec::new();
                let mut start = 0;
                while start < value {
                    let len = (value - start).min(largest);
                    let mut d = request.clone();
                    d.insert(symbol.clone(), len);
                    out.push(Piece { member: self.select(&d)?, dims: d, chunk: Some((symbol.clone(), start)) });
                    start += len;
                }
                Ok(out)
            }
            Err(e) => Err(e),
        }
    }

    /// Run a request of `dims` over the set: check the inputs' shapes, choose the pieces, pad each piece's
    /// inputs into its member's shapes (zeros after the valid part), `run(member, inputs)`, slice the outputs
    /// back and join chunked pieces. The executors' one way to run a set.
    pub fn run_with(
        &self,
        dims: &Dims,
        inputs: &TensorMap,
        chunk: bool,
        mut run: impl FnMut(usize, &TensorMap) -> Result<TensorMap, ExecError>,
    ) -> Result<TensorMap, SetError> {
        let pieces = self.pieces(dims, chunk)?;
        for t in self.io.iter().filter(|t| t.input) {
            let got = inputs
                .get(&t.name)
                .ok_or_else(|| SetError::Request { detail: format!("input '{}' is missing", t.name) })?;
            let want = t.shape_at(dims);
            if want.as_deref() != Some(got.shape.dims()) {
                return Err(SetError::Request {
                    detail: format!(
                        "input '{}' has shape {:?}; {} needs {want:?}",
                        t.name,
                        got.shape.dims(),
                        dims_label(dims)
                    ),
                });
            }
        }
        let axes = match pieces.first().and_then(|p| p.chunk.as_ref()) {
            Some((s, _)) => self.chunk_axes(s).map_err(|detail| SetError::Request { detail })?,
            None => BTreeMap::new(),
        };
        let bad = |name: &str, what: &str| SetError::Request { detail: format!("'{name}': cannot {what}") };
        let mut outs: Vec<TensorMap> = Vec::with_capacity(pieces.len());
        for p in &pieces {
            let m = &self.members[p.member];
            let mut feed = TensorMap::new();
            for b in m.plan.bindings().iter().filter(|b| b.role == BindingRole::Input) {
                let t = inputs
                    .get(&*b.name)
                    .ok_or_else(|| SetError::Request { detail: format!("input '{}' is missing", b.name) })?;
                if t.dtype != b.dtype {
                    return Err(SetError::Request {
                        detail: format!("input '{}' is {}; the model takes {}", b.name, t.dtype.name(), b.dtype.name()),
                    });
                }
                let elem = b.dtype.size_bytes();
                let (data, shape) = match (&p.chunk, axes.get(&*b.name)) {
                    (Some((s, start)), Some(&(axis, coef))) => {
                        let mut shape = t.shape.dims().to_vec();
                        let len = p.dims[s] * coef;
                        let d = host::axis_range(&t.data, &shape, axis, start * coef, len, elem)
                            .ok_or_else(|| bad(&b.name, "cut a chunk"))?;
                        shape[axis] = len;
                        (d, shape)
                    }
                    _ => (t.data.clone(), t.shape.dims().to_vec()),
                };
                let padded = host::box_pad(&data, &shape, b.shape.dims(), elem)
                    .ok_or_else(|| bad(&b.name, "pad into the bucket"))?;
                feed.insert(b.name.to_string(), HostTensor { dtype: b.dtype, shape: b.shape.clone(), data: padded });
            }
            let got = run(p.member, &feed).map_err(SetError::Exec)?;
            let mut out = TensorMap::new();
            for t in self.io.iter().filter(|t| !t.input) {
                let o = got.get(&t.name).ok_or_else(|| bad(&t.name, "find the output"))?;
                let want = t.shape_at(&p.dims).ok_or_else(|| bad(&t.name, "size the output"))?;
                let data = host::box_slice(&o.data, o.shape.dims(), &want, o.dtype.size_bytes())
                    .ok_or_else(|| bad(&t.name, "slice the output"))?;
                out.insert(t.name.clone(), HostTensor { dtype: o.dtype, shape: graph_ir::Shape::new(want), data });
            }
            outs.push(out);
        }
        if outs.len() == 1 {
            return outs.pop().ok_or_else(|| bad("", "run"));
        }
        let mut joined = TensorMap::new();
        for t in self.io.iter().filter(|t| !t.input) {
            let &(axis, _) = axes.get(&t.name).ok_or_else(|| bad(&t.name, "join chunks"))?;
            let parts: Vec<(&[u8], &[usize])> =
                outs.iter().filter_map(|o| o.get(&t.name)).map(|o| (o.data.as_slice(), o.shape.dims())).collect();
            let first = outs.first().and_then(|o| o.get(&t.name)).ok_or_else(|| bad(&t.name, "join chunks"))?;
            let (data, shape) =
                host::axis_concat(&parts, axis, first.dtype.size_bytes()).ok_or_else(|| bad(&t.name, "join chunks"))?;
            joined.insert(t.name.clone(), HostTensor { dtype: first.dtype, shape: graph_ir::Shape::new(shape), data });
        }
        Ok(joined)
    }

    /// The set as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }
}

fn names(spec: &BucketSpec) -> String {
    spec.names().collect::<Vec<_>>().join(", ")
}

/// Every weight (a tensor whose values the caller supplies by name) has one dtype and shape in every member.
fn check_weights(dims: &[Dims], graphs: &[ComputeGraph]) -> Result<(), SetError> {
    let Some(first) = graphs.first() else { return Ok(()) };
    for (d, g) in dims.iter().zip(graphs).skip(1) {
        for &t in g.weights() {
            let w = g.tensor(t);
            if w.role != graph_ir::TensorRole::Weight {
                continue;
            }
            let other = first.tensor_id(&w.name).map(|id| first.tensor(id));
            if other.is_none_or(|o| o.shape != w.shape || o.dtype != w.dtype || o.role != w.role) {
                return Err(SetError::VaryingWeight {
                    name: w.name.to_string(),
                    dims: dims_label(d),
                    detail: match other {
                        Some(o) => format!(
                            "{} {} here, {} {} at {}",
                            w.dtype.name(),
                            w.shape,
                            o.dtype.name(),
                            o.shape,
                            dims_label(&dims[0])
                        ),
                        None => format!("absent at {}", dims_label(&dims[0])),
                    },
                });
            }
        }
    }
    Ok(())
}

/// True when some tensor's shape differs between the two graphs (tensors matched by name).
fn shapes_differ(a: &ComputeGraph, b: &ComputeGraph) -> bool {
    b.tensors().any(|(_, t)| a.tensor_id(&t.name).is_none_or(|id| a.tensor(id).shape != t.shape))
}

/// One member's tensors outside the pool, in the graph the passes will plan: after the precision transform when
/// one is asked for (half weights and constants take half the slots).
fn member_slots(d: &Dims, g: &ComputeGraph, precision: &PrecisionPolicy) -> Result<Vec<OutsideSlot>, SetError> {
    let slots = |g: &ComputeGraph| graph_passes::topo::analyse(g).map(|order| outside_slots(g, &order));
    let found = if precision.is_identity() {
        slots(g)
    } else {
        graph_passes::precision::transform(g, precision).and_then(|(rewritten, _)| slots(&rewritten))
    };
    found.map_err(|e| SetError::Member { dims: dims_label(d), source: e.into() })
}

/// The shared layout of each member: weights and constants equal in name, size and data share one slot (a
/// constant that differs between members gets its own), and each io tensor gets one slot sized for the largest
/// member that has it, in the largest member's order.
fn shared_layouts(slots: &[Vec<OutsideSlot>], a: u64) -> Vec<SharedLayout> {
    let align = |v: u64| v.max(1).div_ceil(a).saturating_mul(a);
    let mut layouts = vec![SharedLayout::default(); slots.len()];
    // Weights: one slot per distinct (name, bytes, data).
    let mut weights_bytes = 0u64;
    let mut seen: HashMap<(&str, u64, Option<&[u8]>), u64> = HashMap::new();
    for (i, ss) in slots.iter().enumerate() {
        for s in ss.iter().filter(|s| s.region == Region::Weights) {
            let off = *seen.entry((&s.name, s.bytes, s.data.as_deref())).or_insert_with(|| {
                let off = weights_bytes;
                weights_bytes = weights_bytes.saturating_add(align(s.bytes));
                off
            });
            layouts[i].weights.insert(s.name.clone(), off);
        }
    }
    // Io: each name's largest size, placed in the largest member's order first.
    let mut size: HashMap<&str, u64> = HashMap::new();
    for s in slots.iter().flatten().filter(|s| s.region == Region::Io) {
        let e = size.entry(&s.name).or_insert(0);
        *e = (*e).max(s.bytes);
    }
    let mut io_bytes = 0u64;
    let mut io_off: HashMap<&str, u64> = HashMap::new();
    for ss in slots.iter().rev() {
        for s in ss.iter().filter(|s| s.region == Region::Io) {
            io_off.entry(&s.name).or_insert_with(|| {
                let off = io_bytes;
                io_bytes = io_bytes.saturating_add(align(size[s.name.as_str()]));
                off
            });
        }
    }
    for (i, ss) in slots.iter().enumerate() {
        for s in ss.iter().filter(|s| s.region == Region::Io) {
            layouts[i].io.insert(s.name.clone(), io_off[s.name.as_str()]);
        }
        layouts[i].weights_bytes = weights_bytes;
        layouts[i].io_bytes = io_bytes;
    }
    layouts
}

/// One member's binding of a name: offset, bytes, a constant's data.
type Use<'a> = (u64, u64, Option<&'a [u8]>);

/// Check a set: every member passes [`crate::verify`]; every member's weights and io regions are the set's;
/// each weight and each graph input and output has one address in every member; no two different contents
/// (constants that differ between members, io tensors) overlap; every member's pool fits the set's pool; and
/// each member's io shapes are the set's extents at its dims (so a smaller member uses a prefix of each slot).
pub fn verify_set(set: &PlanSet) -> Result<(), Vec<SetViolation>> {
    let mut v = Vec::new();
    let mut push = |member: &str, detail: String| v.push(SetViolation { member: member.to_string(), detail });
    // (region, name) -> (offset, largest bytes, data of constants) over all members.
    let mut addr: BTreeMap<(Region, &str), Vec<Use<'_>>> = BTreeMap::new();
    for m in &set.members {
        let label = dims_label(&m.dims);
        if let Err(errs) = crate::verify(&m.plan) {
            for e in errs.iter().take(5) {
                push(&label, format!("verify: {e}"));
            }
        }
        for r in [Region::Weights, Region::Io] {
            if m.plan.region_bytes(r) != set.region_bytes(r) {
                push(
                    &label,
                    format!(
                        "its {} region has {} bytes; the set's has {}",
                        r.name(),
                        m.plan.region_bytes(r),
                        set.region_bytes(r)
                    ),
                );
            }
        }
        for r in [Region::Pool, Region::Host] {
            if m.plan.region_bytes(r) > set.region_bytes(r) {
                push(
                    &label,
                    format!(
                        "its {} region ({} bytes) exceeds the set's ({})",
                        r.name(),
                        m.plan.region_bytes(r),
                        set.region_bytes(r)
                    ),
                );
            }
        }
        for b in m.plan.bindings() {
            if matches!(b.buffer.region, Region::Weights | Region::Io) {
                addr.entry((b.buffer.region, &b.name)).or_default().push((
                    b.buffer.offset,
                    b.buffer.bytes,
                    b.data.as_deref(),
                ));
            }
            if matches!(b.role, BindingRole::Input | BindingRole::Output) {
                match set.io.iter().find(|t| *t.name == *b.name).and_then(|t| t.shape_at(&m.dims)) {
                    Some(s) if s == b.shape.dims() => {}
                    Some(s) => push(
                        &label,
                        format!("'{}' has shape {:?}; the set's extents give {s:?}", b.name, b.shape.dims()),
                    ),
                    None if set.io.iter().any(|t| *t.name == *b.name) => {}
                    None => push(&label, format!("'{}' is not an input or output of the set", b.name)),
                }
            }
        }
    }
    // One address per name; distinct names (or contents) never overlap.
    let mut ranges: Vec<(Region, u64, u64, String)> = Vec::new();
    for ((r, name), uses) in &addr {
        let mut offs: Vec<u64> = uses.iter().map(|u| u.0).collect();
        offs.sort_unstable();
        offs.dedup();
        let weight_like = *r == Region::Weights;
        if !weight_like && offs.len() > 1 {
            push("", format!("io tensor '{name}' has {} different addresses across members: {offs:?}", offs.len()));
        }
        for &o in &offs {
            let group: Vec<&Use<'_>> = uses.iter().filter(|u| u.0 == o).collect();
            let bytes = group.iter().map(|u| u.1).max().unwrap_or(0);
            if weight_like && group.iter().any(|u| u.1 != group[0].1 || u.2 != group[0].2) {
                push("", format!("'{name}' at weights offset {o} holds different bytes in different members"));
            }
            ranges.push((*r, o, o.saturating_add(bytes), format!("'{name}'@{o}")));
        }
    }
    ranges.sort();
    for w in ranges.windows(2) {
        if w[0].0 == w[1].0 && w[1].1 < w[0].2 {
            push("", format!("{} and {} overlap in the {} region", w[0].3, w[1].3, w[0].0.name()));
        }
    }
    if v.is_empty() {
        Ok(())
    } else {
        Err(v)
    }
}

impl fmt::Display for PlanSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = self.members.first().map_or("", |m| m.plan.graph_name());
        writeln!(f, "plan set of '{name}': {} members over {}", self.members.len(), names(&self.spec))?;
        if !self.fixed.is_empty() {
            writeln!(f, "  fixed: {}", dims_label(&self.fixed))?;
        }
        writeln!(
            f,
            "  shared: pool {} B (largest member; separate plans: {} B, {:.2}x), weights {} B, io {} B, host {} B",
            self.pool_bytes(),
            self.sum_pool_bytes(),
            self.sum_pool_bytes() as f64 / self.pool_bytes().max(1) as f64,
            self.region_bytes(Region::Weights),
            self.region_bytes(Region::Io),
            self.region_bytes(Region::Host)
        )?;
        writeln!(
            f,
            "  {:<24} {:>12} {:>12} {:>9} {:>11} {:>10}",
            "bucket", "pool B", "bound B", "launches", "makespan us", "plan ms"
        )?;
        for m in &self.members {
            let s = m.plan.stats();
            writeln!(
                f,
                "  {:<24} {:>12} {:>12} {:>9} {:>11.1} {:>10.2}",
                dims_label(&m.dims),
                m.plan.pool_bytes,
                s.lower_bound_bytes,
                m.plan.kernel_count_fused,
                s.makespan_us,
                m.compile_ms
            )?;
        }
        for p in &self.padding {
            match (&p.mixing, p.marked_safe) {
                (None, _) => writeln!(f, "  padding {}: safe (no node mixes across its axis)", p.symbol)?,
                (Some(m), true) => writeln!(
                    f,
                    "  padding {}: marked safe by the caller (node '{}' ({}) {})",
                    p.symbol, m.node, m.op, m.detail
                )?,
                (Some(m), false) => {
                    writeln!(f, "  padding {}: refused, node '{}' ({}) {}", p.symbol, m.node, m.op, m.detail)?
                }
            }
        }
        writeln!(f, "  io (one address for every member; smaller buckets use a prefix):")?;
        let last = self.members.last();
        for t in &self.io {
            let at = last
                .and_then(|m| m.plan.bindings().iter().find(|b| *b.name == *t.name))
                .map(|b| b.buffer.to_string())
                .unwrap_or_default();
            let ext = t.extents.as_ref().map_or("not affine in the symbols".to_string(), |e| {
                e.iter()
                    .map(|a| {
                        let mut s: Vec<String> =
                            a.coef.iter().map(|(n, c)| if *c == 1 { n.clone() } else { format!("{c}*{n}") }).collect();
                        if a.base != 0 || s.is_empty() {
                            s.push(a.base.to_string());
                        }
                        s.join("+")
                    })
                    .collect::<Vec<_>>()
                    .join(" x ")
            });
            writeln!(f, "    {} {:<20} [{}] {at}", if t.input { "in " } else { "out" }, t.name, ext)?;
        }
        Ok(())
    }
}
