//! Which symbols a request may be padded along, and how each graph input's and output's extents follow the
//! symbols.
//!
//! Both come from the model itself, loaded at two values of a symbol that differ in nothing else: an axis whose
//! extent differs is the symbol's axis. A node *mixes* across that axis when an output element at a valid index
//! can depend on an input element at a padded one: a contraction or reduction over the axis (MatMul's K, Softmax,
//! LayerNormalization, ReduceSum/Mean/Max, Conv or pooling windows), a Concat, Gather, Slice, Split or Pad along
//! it, a Reshape that merges its rows with others, a constant whose smaller version is not the leading part of the
//! larger, or an op cuplan cannot see into. Padding is then refused with the node's name, unless the caller marks
//! the symbol safe. Every other op keeps rows apart, so zero rows appended at the end never reach a valid one.

use graph_ir::shape::normalize_axis;
use graph_ir::{ComputeGraph, Op, OpCategory, TensorRole};
use serde::{Deserialize, Serialize};

use super::host::box_slice;
use super::spec::Dims;

/// How one symbol may be padded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SymbolPadding {
    /// The symbol.
    pub symbol: String,
    /// The first node (in topological order) that mixes values across the symbol's axis, if any.
    pub mixing: Option<Mixing>,
    /// The caller marked the symbol safe to pad regardless of `mixing`.
    pub marked_safe: bool,
}

impl SymbolPadding {
    /// True when requests may be padded along this symbol.
    pub fn safe(&self) -> bool {
        self.marked_safe || self.mixing.is_none()
    }
}

/// A node that mixes values across a symbol's axis.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mixing {
    /// The node (or constant) name.
    pub node: String,
    /// Its op.
    pub op: String,
    /// How it mixes.
    pub detail: String,
}

/// One axis's extent as a function of the symbols: `base + sum(coef[s] * dims[s])`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AxisExtent {
    /// The constant part.
    pub base: i64,
    /// The coefficient of each symbol it depends on (symbols with coefficient 0 are left out).
    pub coef: Vec<(String, i64)>,
}

impl AxisExtent {
    /// The extent at `dims` (`None` when negative or a symbol is missing).
    pub fn at(&self, dims: &Dims) -> Option<usize> {
        let mut e = self.base;
        for (s, c) in &self.coef {
            e = e.checked_add(c.checked_mul(i64::try_from(*dims.get(s)?).ok()?)?)?;
        }
        usize::try_from(e).ok()
    }

    /// True when the extent changes with `symbol`.
    pub fn depends_on(&self, symbol: &str) -> bool {
        self.coef.iter().any(|(s, _)| s == symbol)
    }
}

/// A graph input or output as the set sees it: its name and how each axis follows the symbols (`None` for an
/// axis that is not an affine function of them: such a tensor only takes requests that match a bucket exactly).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IoTensor {
    /// The tensor's name.
    pub name: String,
    /// True for a graph input, false for an output.
    pub input: bool,
    /// Each axis's extent, in axis order; `None` when not affine in the symbols.
    pub extents: Option<Vec<AxisExtent>>,
}

impl IoTensor {
    /// The tensor's shape at `dims`.
    pub fn shape_at(&self, dims: &Dims) -> Option<Vec<usize>> {
        self.extents.as_ref()?.iter().map(|e| e.at(dims)).collect()
    }
}

/// Fit each graph input's and output's extents from `samples` (graphs with their dims). `pairs[s]` names, for
/// symbol `s`, two samples that differ only in it.
pub(crate) fn fit_io(samples: &[(&Dims, &ComputeGraph)], pairs: &[(String, usize, usize)]) -> Vec<IoTensor> {
    let Some(&(d0, g0)) = samples.first() else { return Vec::new() };
    let mut out = Vec::new();
    for (input, ids) in [(true, g0.inputs()), (false, g0.outputs())] {
        for &t in ids {
            let name = &g0.tensor(t).name;
            let shape_of = |g: &ComputeGraph| g.tensor_id(name).map(|id| g.tensor(id).shape.dims().to_vec());
            let extents = fit_tensor(samples, pairs, d0, &shape_of);
            out.push(IoTensor { name: name.to_string(), input, extents });
        }
    }
    out
}

fn fit_tensor(
    samples: &[(&Dims, &ComputeGraph)],
    pairs: &[(String, usize, usize)],
    d0: &Dims,
    shape_of: &dyn Fn(&ComputeGraph) -> Option<Vec<usize>>,
) -> Option<Vec<AxisExtent>> {
    let shapes: Vec<Vec<usize>> = samples.iter().map(|(_, g)| shape_of(g)).collect::<Option<_>>()?;
    let rank = shapes[0].len();
    if shapes.iter().any(|s| s.len() != rank) {
        return None;
    }
    let val = |d: &Dims, s: &str| d.get(s).and_then(|&v| i64::try_from(v).ok());
    let mut extents = Vec::with_capacity(rank);
    for axis in 0..rank {
        let e = |i: usize| i64::try_from(shapes[i][axis]).ok();
        let mut coef = Vec::new();
        for (s, lo, hi) in pairs {
            let dv = val(samples[*hi].0, s)? - val(samples[*lo].0, s)?;
            let de = e(*hi)? - e(*lo)?;
            if dv == 0 || de % dv != 0 {
                return None;
            }
            if de != 0 {
                coef.push((s.clone(), de / dv));
            }
        }
        let mut base = e(0)?;
        for (s, c) in &coef {
            base -= c.checked_mul(val(d0, s)?)?;
        }
        let ext = AxisExtent { base, coef };
        // The fit must hold at every sample, not only the ones it came from.
        if samples.iter().zip(&shapes).any(|((d, _), s)| ext.at(d) != Some(s[axis])) {
            return None;
        }
        extents.push(ext);
    }
    Some(extents)
}

/// The axes of tensor `name` whose extents differ between `lo` and `hi` (`None`: missing or of another rank).
fn varying(lo: &ComputeGraph, hi: &ComputeGraph, name: &str) -> Option<Vec<usize>> {
    let a = lo.tensor(lo.tensor_id(name)?).shape.dims();
    let b = hi.tensor(hi.tensor_id(name)?).shape.dims();
    (a.len() == b.len()).then(|| (0..a.len()).filter(|&i| a[i] != b[i]).collect())
}

/// The first node of `hi` (in `order`) that mixes values across `symbol`'s axis; `lo` is the same model at a
/// smaller value of `symbol` and the same value of every other symbol.
pub(crate) fn first_mixing(lo: &ComputeGraph, hi: &ComputeGraph, order: &[graph_ir::NodeId]) -> Option<Mixing> {
    // Constants (folded shape arithmetic: position ids, masks) must agree on the valid part.
    for &t in hi.weights() {
        let th = hi.tensor(t);
        let Some(ax) = varying(lo, hi, &th.name) else {
            return Some(mixing_const(&th.name, "exists at one size and not the other"));
        };
        if ax.is_empty() {
            continue;
        }
        if th.role != TensorRole::Constant {
            return Some(mixing_const(&th.name, "is a weight whose shape changes with the symbol"));
        }
        let tl = lo.tensor_id(&th.name).map(|id| lo.tensor(id));
        let (Some(dl), Some(dh)) = (tl.and_then(|t| t.data.as_deref()), th.data.as_deref()) else {
            return Some(mixing_const(&th.name, "has no data to compare"));
        };
        let lo_shape = tl.map(|t| t.shape.dims().to_vec()).unwrap_or_default();
        let prefix = box_slice(dh, th.shape.dims(), &lo_shape, th.dtype.size_bytes());
        if prefix.as_deref() != Some(dl) {
            return Some(mixing_const(
                &th.name,
                "differs at the smaller size from the leading part of the larger (a padded request would read \
                 the larger one's values)",
            ));
        }
    }
    for &n in order {
        let node = hi.node(n);
        let Some(ln) = lo.node_id(&node.name).map(|id| lo.node(id)) else {
            return Some(mixing(&node.name, &node.op, "exists at one size and not the other"));
        };
        if std::mem::discriminant(&ln.op) != std::mem::discriminant(&node.op)
            || ln.inputs.len() != node.inputs.len()
            || ln.outputs.len() != node.outputs.len()
        {
            return Some(mixing(&node.name, &node.op, "changes its op or arity with the symbol"));
        }
        let mut ins = Vec::with_capacity(node.inputs.len());
        let mut shapes = Vec::with_capacity(node.inputs.len());
        for &t in node.inputs.iter().chain(&node.outputs) {
            let name = &hi.tensor(t).name;
            let Some(ax) = varying(lo, hi, name) else {
                return Some(mixing(&node.name, &node.op, &format!("tensor '{name}' changes rank with the symbol")));
            };
            ins.push(ax);
            shapes.push(hi.tensor(t).shape.dims().to_vec());
        }
        if ins.iter().all(Vec::is_empty) {
            continue;
        }
        let nin = node.inputs.len();
        if let Some(detail) = op_mixes(&node.op, &ins[..nin], &shapes[..nin], &ins[nin..], &shapes[nin..], ln, lo) {
            return Some(mixing(&node.name, &node.op, &detail));
        }
    }
    None
}

fn mixing(node: &str, op: &Op, detail: &str) -> Mixing {
    Mixing { node: node.to_string(), op: op.name().to_string(), detail: detail.to_string() }
}

fn mixing_const(name: &str, detail: &str) -> Mixing {
    Mixing { node: name.to_string(), op: "constant".into(), detail: format!("(a constant) {detail}") }
}

/// Why `op` mixes across the varying axes `va` of its inputs (`vo`: of its outputs), if it does. Shapes are the
/// larger graph's; `lo_node` is the node in the smaller graph `lo` (for attributes that the symbol changes).
fn op_mixes(
    op: &Op,
    va: &[Vec<usize>],
    sa: &[Vec<usize>],
    vo: &[Vec<usize>],
    so: &[Vec<usize>],
    lo_node: &graph_ir::Node,
    lo: &ComputeGraph,
) -> Option<String> {
    let any_in = |i: usize, axes: &[usize]| va.get(i).is_some_and(|v| v.iter().any(|a| axes.contains(a)));
    let rank = |i: usize| sa.get(i).map_or(0, Vec::len);
    let all = |r: usize| (0..r).collect::<Vec<_>>();
    const CONTRACT: &str = "contracts over the symbol's axis";
    const REDUCE: &str = "reduces over the symbol's axis";
    match op {
        Op::MatMul => {
            let ka = rank(0).saturating_sub(1);
            let kb = if rank(1) == 1 { 0 } else { rank(1).saturating_sub(2) };
            (any_in(0, &[ka]) || any_in(1, &[kb])).then(|| CONTRACT.into())
        }
        Op::Gemm { trans_a, trans_b, .. } => {
            let ka = usize::from(!*trans_a);
            let kb = usize::from(*trans_b);
            (any_in(0, &[ka]) || any_in(1, &[kb])).then(|| CONTRACT.into())
        }
        Op::Conv(_) => (any_in(0, &all(rank(0))[1..]) || !va.get(1).is_none_or(Vec::is_empty))
            .then(|| "convolves over the symbol's axis (only the batch axis 0 keeps rows apart)".into()),
        Op::MaxPool(_) | Op::AveragePool(_) | Op::GlobalAveragePool => {
            (any_in(0, &all(rank(0))[2.min(rank(0))..])).then(|| "pools over the symbol's axis (a spatial axis)".into())
        }
        Op::ReduceSum { axes, .. } | Op::ReduceMean { axes, .. } | Op::ReduceMax { axes, .. } => {
            let axes: Vec<usize> = match axes {
                None => all(rank(0)),
                Some(a) => a.iter().filter_map(|&x| normalize_axis(x, rank(0))).collect(),
            };
            any_in(0, &axes).then(|| REDUCE.into())
        }
        Op::Softmax { axis } => any_in(0, &normalize_axis(*axis, rank(0)).into_iter().collect::<Vec<_>>())
            .then(|| "normalises over the symbol's axis (padded entries would take part)".into()),
        Op::LayerNormalization { axis, .. } => {
            let from = normalize_axis(*axis, rank(0)).unwrap_or(0);
            any_in(0, &all(rank(0))[from..]).then(|| "normalises over the symbol's axis".into())
        }
        Op::Reshape { .. } | Op::Flatten { .. } | Op::Squeeze { .. } | Op::Unsqueeze { .. } | Op::Identity => {
            reshape_mixes(&va[0], &sa[0], &vo[0], &so[0])
        }
        Op::Concat { axis } => {
            let a = normalize_axis(*axis, rank(0)).unwrap_or(0);
            (0..va.len()).any(|i| any_in(i, &[a])).then(|| "concatenates along the symbol's axis".into())
        }
        Op::Split { axis, .. } => any_in(0, &normalize_axis(*axis, rank(0)).into_iter().collect::<Vec<_>>())
            .then(|| "splits along the symbol's axis".into()),
        Op::Gather { axis } => any_in(0, &normalize_axis(*axis, rank(0)).into_iter().collect::<Vec<_>>())
            .then(|| "gathers along the symbol's axis".into()),
        Op::Pad { pads, .. } => {
            let r = rank(0);
            va[0]
                .iter()
                .any(|&a| pads.get(a).copied().unwrap_or(0) != 0 || pads.get(a + r).copied().unwrap_or(0) != 0)
                .then(|| "pads along the symbol's axis".into())
        }
        Op::Slice { starts, ends, axes, steps } => {
            let Op::Slice { starts: ls, ends: le, axes: la, steps: lst } = &lo_node.op else {
                return Some("changes its op with the symbol".into());
            };
            let lo_in = lo_node.inputs.first().map(|&t| lo.tensor(t).shape.dims().to_vec()).unwrap_or_default();
            let full = |starts: &[i64],
                        ends: &[i64],
                        axes: &Option<Vec<i64>>,
                        steps: &Option<Vec<i64>>,
                        dims: &[usize],
                        a: usize| {
                let axes: Vec<usize> = match axes {
                    None => (0..starts.len()).collect(),
                    Some(x) => x.iter().filter_map(|&x| normalize_axis(x, dims.len())).collect(),
                };
                let Some(k) = axes.iter().position(|&x| x == a) else { return true };
                let d = i64::try_from(dims[a]).unwrap_or(i64::MAX);
                let norm = |v: i64| if v < 0 { (v.saturating_add(d)).max(0) } else { v.min(d) };
                let step = steps.as_ref().and_then(|s| s.get(k).copied()).unwrap_or(1);
                step == 1 && starts.get(k).copied().map(norm) == Some(0) && ends.get(k).copied().map(norm) == Some(d)
            };
            va[0]
                .iter()
                .any(|&a| !full(starts, ends, axes, steps, &sa[0], a) || !full(ls, le, la, lst, &lo_in, a))
                .then(|| "slices the symbol's axis (the slice would take padded entries or drop valid ones)".into())
        }
        Op::Custom(_) => Some("is a custom op: cuplan cannot tell whether it mixes across the symbol's axis".into()),
        // Elementwise ops (broadcasting keeps rows apart), BatchNormalization, Transpose (moves the axis), Expand
        // (replicates) and Memcpy.
        _ => match op.category() {
            OpCategory::Elementwise | OpCategory::DataMovement | OpCategory::Copy => None,
            _ => Some("is an op the padding analysis does not know".into()),
        },
    }
}

/// A view keeps rows apart when the symbol's axis keeps the same outer extent (the product of the axes before
/// it) and each output row lies inside one input row (the input's row size is a multiple of the output's).
fn reshape_mixes(va: &[usize], sa: &[usize], vo: &[usize], so: &[usize]) -> Option<String> {
    if va.is_empty() && vo.is_empty() {
        return None;
    }
    let (&[a], &[b]) = (va, vo) else {
        return Some("reshapes several axes that change with the symbol".into());
    };
    let outer = |s: &[usize], a: usize| s[..a].iter().product::<usize>();
    let inner = |s: &[usize], a: usize| s[a + 1..].iter().product::<usize>();
    let (ii, io) = (inner(sa, a), inner(so, b));
    (outer(sa, a) != outer(so, b) || io == 0 || ii % io != 0)
        .then(|| "reshapes the symbol's axis together with others (its rows would mix)".into())
}

/// The (lo, hi) sample indices that differ only in `symbol`, with `lo` the smaller value: the first pair found.
pub(crate) fn pair_for(samples: &[(&Dims, &ComputeGraph)], symbol: &str) -> Option<(usize, usize)> {
    for (i, (di, _)) in samples.iter().enumerate() {
        for (j, (dj, _)) in samples.iter().enumerate() {
            let same_rest = di.iter().all(|(k, v)| k == symbol || dj.get(k) == Some(v));
            if same_rest && di.get(symbol) < dj.get(symbol) {
                return Some((i, j));
            }
        }
    }
    None
}
