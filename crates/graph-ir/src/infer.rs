//! Shape and dtype inference for every op: from the inputs' dtypes and shapes to the outputs'.
//!
//! Node-agnostic: errors say what is wrong; the graph wraps them with the node's name.

use crate::op::{ConvAttrs, Op, PadMode, PoolAttrs};
use crate::shape::{broadcast, normalize_axis, MAX_RANK};
use crate::{DType, Shape, TensorSpec};

/// Why inference failed (without the node's name, which the caller adds).
#[derive(Debug, Clone, PartialEq)]
pub enum InferError {
    /// Wrong input count; carries what the op accepts.
    Arity(String),
    /// Incompatible shapes.
    Shape(String),
    /// Incompatible dtypes.
    DType(String),
    /// A bad attribute: its name and what is wrong.
    Attr(&'static str, String),
}

type R<T> = Result<T, InferError>;

fn shape_err<T>(msg: impl Into<String>) -> R<T> {
    Err(InferError::Shape(msg.into()))
}

fn dtype_err<T>(msg: impl Into<String>) -> R<T> {
    Err(InferError::DType(msg.into()))
}

fn attr_err<T>(attr: &'static str, msg: impl Into<String>) -> R<T> {
    Err(InferError::Attr(attr, msg.into()))
}

fn spec(dtype: DType, shape: impl Into<Shape>) -> TensorSpec {
    TensorSpec { dtype, shape: shape.into() }
}

/// Infer the output specs of `op` applied to `inputs` (dtype and shape of each input, in ONNX order).
pub fn infer(op: &Op, inputs: &[(DType, &Shape)]) -> Result<Vec<TensorSpec>, InferError> {
    if !op.arity().accepts(inputs.len()) {
        return Err(InferError::Arity(op.arity().to_string()));
    }
    for (i, (_, s)) in inputs.iter().enumerate() {
        if s.rank() > MAX_RANK {
            return shape_err(format!("input {i} has rank {}, above the limit of {MAX_RANK}", s.rank()));
        }
    }
    finite_scalars(op)?;
    let out = infer_inner(op, inputs)?;
    for o in &out {
        if o.shape.rank() > MAX_RANK {
            return shape_err(format!("output rank {} is above the limit of {MAX_RANK}", o.shape.rank()));
        }
    }
    Ok(out)
}

/// [`infer`] for a node with a store dtype ([`crate::Node::store`]): with `Some(d)` the float operands count as
/// f32 whatever they are stored in (the node computes in f32) and the float outputs are stored in `d`; with
/// `None`, plain [`infer`]. Only ops that [`Op::stores_mixed`] and float `d` are accepted.
pub fn infer_stored(op: &Op, store: Option<DType>, inputs: &[(DType, &Shape)]) -> Result<Vec<TensorSpec>, InferError> {
    let Some(d) = store else { return infer(op, inputs) };
    if !d.is_float() {
        return dtype_err(format!("a node can store only a floating-point dtype, got store {d}"));
    }
    if !op.stores_mixed() {
        return dtype_err(format!(
            "{} cannot store another dtype than its operands' (only elementwise ops and reductions can)",
            op.name()
        ));
    }
    let as_f32: Vec<(DType, &Shape)> =
        inputs.iter().map(|&(t, s)| (if t.is_float() { DType::F32 } else { t }, s)).collect();
    let mut out = infer(op, &as_f32)?;
    for o in &mut out {
        if o.dtype.is_float() {
            o.dtype = d;
        }
    }
    Ok(out)
}

/// Slopes and scales must be finite: a NaN would silently turn outputs into NaN, and the JSON format writes
/// non-finite floats as null, so such a graph could not be saved. (Pad's fill value may be infinite: padding
/// with -inf before a max is a real use.)
fn finite_scalars(op: &Op) -> R<()> {
    let scalars: &[(&'static str, f32)] = match op {
        Op::LeakyRelu { alpha } => &[("alpha", *alpha)],
        Op::HardSigmoid { alpha, beta } => &[("alpha", *alpha), ("beta", *beta)],
        Op::Gemm { alpha, beta, .. } => &[("alpha", *alpha), ("beta", *beta)],
        _ => &[],
    };
    match scalars.iter().find(|(_, v)| !v.is_finite()) {
        Some(&(name, v)) => attr_err(name, format!("must be finite, got {v}")),
        None => Ok(()),
    }
}

fn infer_inner(op: &Op, inp: &[(DType, &Shape)]) -> R<Vec<TensorSpec>> {
    use Op::*;
    let x = |i: usize| inp[i];
    match op {
        Exp
        | Log
        | Sqrt
        | Reciprocal
        | Sigmoid
        | Tanh
        | Erf
        | Gelu { .. }
        | Silu
        | HardSwish
        | HardSigmoid { .. }
        | Floor
        | Ceil
        | LeakyRelu { .. } => {
            let (d, s) = x(0);
            require_float(op, 0, d)?;
            Ok(vec![spec(d, s.0.clone())])
        }
        Neg | Abs | Relu => {
            let (d, s) = x(0);
            require_numeric(op, 0, d)?;
            Ok(vec![spec(d, s.0.clone())])
        }
        Clip { min, max } => {
            let (d, s) = x(0);
            require_numeric(op, 0, d)?;
            if let (Some(lo), Some(hi)) = (min, max) {
                if lo.is_nan() || hi.is_nan() {
                    return attr_err("min", "bounds must not be NaN");
                }
            }
            // Infinite bounds too: the JSON format writes them as null, which would load back as "no bound"
            // and silently change what +inf (or -inf) meant. A bound that does not clamp is omitted instead.
            if min.is_some_and(|v| !v.is_finite()) {
                return attr_err("min", "must be finite (omit the bound for no clamp)");
            }
            if max.is_some_and(|v| !v.is_finite()) {
                return attr_err("max", "must be finite (omit the bound for no clamp)");
            }
            Ok(vec![spec(d, s.0.clone())])
        }
        Not => {
            let (d, s) = x(0);
            if d != DType::Bool {
                return dtype_err(format!("Not takes bool, got {d}"));
            }
            Ok(vec![spec(d, s.0.clone())])
        }
        Cast { to } => Ok(vec![spec(*to, x(0).1 .0.clone())]),
        Add | Sub | Mul | Div | Max | Min => {
            let (da, sa) = x(0);
            let (db, sb) = x(1);
            same_dtype(da, db)?;
            require_numeric(op, 0, da)?;
            Ok(vec![spec(da, bcast(sa, sb)?)])
        }
        Pow => {
            let (da, sa) = x(0);
            let (db, sb) = x(1);
            require_numeric(op, 0, da)?;
            require_numeric(op, 1, db)?;
            Ok(vec![spec(da, bcast(sa, sb)?)])
        }
        Equal | Less | LessOrEqual | Greater | GreaterOrEqual => {
            let (da, sa) = x(0);
            let (db, sb) = x(1);
            same_dtype(da, db)?;
            Ok(vec![spec(DType::Bool, bcast(sa, sb)?)])
        }
        And | Or => {
            let (da, sa) = x(0);
            let (db, sb) = x(1);
            if da != DType::Bool || db != DType::Bool {
                return dtype_err(format!("{} takes bool inputs, got {da} and {db}", op.name()));
            }
            Ok(vec![spec(DType::Bool, bcast(sa, sb)?)])
        }
        Where => {
            let (dc, sc) = x(0);
            let (dx, sx) = x(1);
            let (dy, sy) = x(2);
            if dc != DType::Bool {
                return dtype_err(format!("condition must be bool, got {dc}"));
            }
            same_dtype(dx, dy)?;
            let s = bcast(&bcast(sc, sx)?, sy)?;
            Ok(vec![spec(dx, s)])
        }
        MatMul => matmul(inp),
        Gemm { trans_a, trans_b, .. } => gemm(inp, *trans_a, *trans_b),
        Conv(a) => conv(inp, a),
        MaxPool(a) => pool(op, inp, a),
        AveragePool(a) => {
            require_float(op, 0, inp[0].0)?;
            pool(op, inp, a)
        }
        GlobalAveragePool => {
            let (d, s) = x(0);
            require_float(op, 0, d)?;
            if s.rank() < 3 {
                return shape_err(format!("input must have rank >= 3 (N, C, spatial...), got {s}"));
            }
            let mut out = s.0.to_vec();
            for v in out.iter_mut().skip(2) {
                *v = 1;
            }
            Ok(vec![spec(d, out)])
        }
        BatchNormalization { epsilon } => {
            let (d, s) = x(0);
            require_float(op, 0, d)?;
            if !(epsilon.is_finite() && *epsilon >= 0.0) {
                return attr_err("epsilon", format!("must be finite and >= 0, got {epsilon}"));
            }
            if s.rank() < 2 {
                return shape_err(format!("input must have rank >= 2 (N, C, ...), got {s}"));
            }
            let c = s.0[1];
            for (i, name) in [(1, "scale"), (2, "B"), (3, "mean"), (4, "var")] {
                let (di, si) = x(i);
                same_dtype(d, di)?;
                if *si.0 != [c] {
                    return shape_err(format!("{name} must have shape [{c}] (the channel count), got {si}"));
                }
            }
            Ok(vec![spec(d, s.0.clone())])
        }
        ReduceSum { axes, keepdims } | ReduceMax { axes, keepdims } | ReduceMean { axes, keepdims } => {
            let (d, s) = x(0);
            require_numeric(op, 0, d)?;
            let axes = reduce_axes(axes.as_deref(), s.rank())?;
            let mut out = Vec::with_capacity(s.rank());
            for (i, &v) in s.0.iter().enumerate() {
                if axes.contains(&i) {
                    if *keepdims {
                        out.push(1);
                    }
                } else {
                    out.push(v);
                }
            }
            Ok(vec![spec(d, out)])
        }
        Softmax { axis } => {
            let (d, s) = x(0);
            require_float(op, 0, d)?;
            axis_in(*axis, s.rank(), "axis")?;
            Ok(vec![spec(d, s.0.clone())])
        }
        LayerNormalization { axis, epsilon } => {
            let (d, s) = x(0);
            require_float(op, 0, d)?;
            if !(epsilon.is_finite() && *epsilon >= 0.0) {
                return attr_err("epsilon", format!("must be finite and >= 0, got {epsilon}"));
            }
            let a = axis_in(*axis, s.rank(), "axis")?;
            let norm = Shape::from(&s.0[a..]);
            for i in 1..inp.len() {
                let (di, si) = x(i);
                same_dtype(d, di)?;
                if broadcast(si, &norm).as_ref() != Some(&norm) {
                    let what = if i == 1 { "scale" } else { "B" };
                    return shape_err(format!("{what} {si} does not broadcast to the normalised shape {norm}"));
                }
            }
            Ok(vec![spec(d, s.0.clone())])
        }
        Reshape { shape, allowzero } => reshape(x(0), shape, *allowzero),
        Flatten { axis } => {
            let (d, s) = x(0);
            let r = s.rank() as i64;
            let a = if *axis < 0 { axis + r } else { *axis };
            if !(0..=r).contains(&a) {
                return attr_err("axis", format!("{axis} is out of range for rank {r}"));
            }
            let a = a as usize;
            let rows = checked_prod(&s.0[..a])?;
            let cols = checked_prod(&s.0[a..])?;
            Ok(vec![spec(d, vec![rows, cols])])
        }
        Squeeze { axes } => {
            let (d, s) = x(0);
            let out: Vec<usize> = match axes {
                None => s.0.iter().copied().filter(|&v| v != 1).collect(),
                Some(axes) => {
                    let axes = unique_axes(axes, s.rank(), "axes")?;
                    for &a in &axes {
                        if s.0[a] != 1 {
                            return shape_err(format!("cannot squeeze axis {a} of extent {} in {s}", s.0[a]));
                        }
                    }
                    s.0.iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, &v)| v).collect()
                }
            };
            Ok(vec![spec(d, out)])
        }
        Unsqueeze { axes } => {
            let (d, s) = x(0);
            let out_rank = s.rank() + axes.len();
            if out_rank > MAX_RANK {
                return shape_err(format!("output rank {out_rank} is above the limit of {MAX_RANK}"));
            }
            let axes = unique_axes(axes, out_rank, "axes")?;
            let mut out = Vec::with_capacity(out_rank);
            let mut it = s.0.iter();
            for i in 0..out_rank {
                if axes.contains(&i) {
                    out.push(1);
                } else if let Some(&v) = it.next() {
                    out.push(v);
                }
            }
            Ok(vec![spec(d, out)])
        }
        Identity | Memcpy { .. } => Ok(vec![spec(x(0).0, x(0).1 .0.clone())]),
        Transpose { perm } => {
            let (d, s) = x(0);
            let r = s.rank();
            let perm: Vec<usize> = match perm {
                Some(p) => p.clone(),
                None => (0..r).rev().collect(),
            };
            if perm.len() != r {
                return attr_err("perm", format!("has {} entries for rank {r}", perm.len()));
            }
            let mut seen = vec![false; r];
            for &p in &perm {
                if p >= r || seen[p] {
                    return attr_err("perm", format!("{perm:?} is not a permutation of 0..{r}"));
                }
                seen[p] = true;
            }
            Ok(vec![spec(d, perm.iter().map(|&p| s.0[p]).collect::<Vec<usize>>())])
        }
        Slice { starts, ends, axes, steps } => {
            let (d, s) = x(0);
            let plan = slice_plan(s, starts, ends, axes.as_deref(), steps.as_deref())?;
            Ok(vec![spec(d, plan.iter().map(|a| a.count).collect::<Vec<usize>>())])
        }
        Concat { axis } => {
            let (d, s0) = x(0);
            let a = axis_in(*axis, s0.rank(), "axis")?;
            let mut out = s0.0.to_vec();
            for (i, (di, si)) in inp.iter().enumerate().skip(1) {
                same_dtype(d, *di)?;
                if si.rank() != s0.rank() {
                    return shape_err(format!("input {i} has rank {} but input 0 has rank {}", si.rank(), s0.rank()));
                }
                for k in 0..si.rank() {
                    if k != a && si.0[k] != s0.0[k] {
                        return shape_err(format!("input {i} {si} differs from input 0 {s0} on axis {k}"));
                    }
                }
                out[a] = out[a]
                    .checked_add(si.0[a])
                    .ok_or_else(|| InferError::Shape("concatenated extent overflows".into()))?;
            }
            Ok(vec![spec(d, out)])
        }
        Gather { axis } => {
            let (d, s) = x(0);
            let (di, si) = x(1);
            if !matches!(di, DType::I64 | DType::I32) {
                return dtype_err(format!("indices must be i64 or i32, got {di}"));
            }
            let a = axis_in(*axis, s.rank(), "axis")?;
            let mut out = s.0[..a].to_vec();
            out.extend_from_slice(&si.0);
            out.extend_from_slice(&s.0[a + 1..]);
            Ok(vec![spec(d, out)])
        }
        Expand { shape } => {
            let (d, s) = x(0);
            let mut target = Vec::with_capacity(shape.len());
            for &v in shape {
                if v < 0 {
                    return attr_err("shape", format!("negative extent {v} in {shape:?}"));
                }
                target.push(v as usize);
            }
            match broadcast(s, &Shape::from(target)) {
                Some(o) => Ok(vec![spec(d, o.0)]),
                None => shape_err(format!("input {s} does not broadcast with {shape:?}")),
            }
        }
        Pad { pads, mode, value } => {
            let (d, s) = x(0);
            let r = s.rank();
            if pads.len() != 2 * r {
                return attr_err(
                    "pads",
                    format!("needs {} values (begins then ends) for rank {r}, got {}", 2 * r, pads.len()),
                );
            }
            if value.is_nan() && d.is_int() {
                return attr_err("value", "NaN cannot fill an integer tensor");
            }
            let mut out = Vec::with_capacity(r);
            for k in 0..r {
                let (b, e) = (pads[k], pads[k + r]);
                let dim = s.0[k] as i64;
                let n = dim.checked_add(b).and_then(|v| v.checked_add(e));
                match n {
                    Some(n) if n >= 0 => out.push(n as usize),
                    _ => return attr_err("pads", format!("axis {k}: extent {dim} with pads ({b}, {e}) is negative")),
                }
                if *mode == PadMode::Reflect && (b >= dim || e >= dim) && (b > 0 || e > 0) {
                    return attr_err(
                        "pads",
                        format!("reflect padding ({b}, {e}) must be smaller than extent {dim} on axis {k}"),
                    );
                }
                if *mode == PadMode::Edge && dim == 0 && (b > 0 || e > 0) {
                    return attr_err("pads", format!("edge padding needs a non-empty axis {k}"));
                }
            }
            Ok(vec![spec(d, out)])
        }
        Split { axis, splits } => {
            let (d, s) = x(0);
            let a = axis_in(*axis, s.rank(), "axis")?;
            if splits.is_empty() {
                return attr_err("splits", "must list at least one extent");
            }
            let total = splits.iter().try_fold(0usize, |acc, &v| acc.checked_add(v));
            if total != Some(s.0[a]) {
                return attr_err("splits", format!("{splits:?} do not sum to the extent {} of axis {a}", s.0[a]));
            }
            Ok(splits
                .iter()
                .map(|&n| {
                    let mut o = s.0.to_vec();
                    o[a] = n;
                    spec(d, o)
                })
                .collect())
        }
        Custom(c) => {
            if c.entry.is_empty() {
                return attr_err("entry", "must name the kernel's entry point");
            }
            if c.grid.contains(&0) || c.block.contains(&0) {
                return attr_err("grid", "grid and block dimensions must be >= 1");
            }
            if c.outputs.is_empty() {
                return attr_err("outputs", "a custom op must declare at least one output");
            }
            Ok(c.outputs.clone())
        }
    }
}

fn require_float(op: &Op, i: usize, d: DType) -> R<()> {
    if d.is_float() {
        Ok(())
    } else {
        dtype_err(format!("{} needs a floating-point input {i}, got {d}", op.name()))
    }
}

fn require_numeric(op: &Op, i: usize, d: DType) -> R<()> {
    if d == DType::Bool {
        dtype_err(format!("{} needs a numeric input {i}, got bool", op.name()))
    } else {
        Ok(())
    }
}

fn same_dtype(a: DType, b: DType) -> R<()> {
    if a == b {
        Ok(())
    } else {
        dtype_err(format!("inputs must share a dtype, got {a} and {b}"))
    }
}

fn bcast(a: &Shape, b: &Shape) -> R<Shape> {
    match broadcast(a, b) {
        Some(s) => Ok(s),
        None => shape_err(format!("cannot broadcast {a} with {b}")),
    }
}

fn checked_prod(d: &[usize]) -> R<usize> {
    d.iter()
        .try_fold(1usize, |acc, &v| acc.checked_mul(v))
        .ok_or_else(|| InferError::Shape("element count overflows".into()))
}

fn axis_in(axis: i64, rank: usize, attr: &'static str) -> R<usize> {
    match normalize_axis(axis, rank) {
        Some(a) => Ok(a),
        None => attr_err(attr, format!("{axis} is out of range for rank {rank}")),
    }
}

fn unique_axes(axes: &[i64], rank: usize, attr: &'static str) -> R<Vec<usize>> {
    let mut out = Vec::with_capacity(axes.len());
    for &a in axes {
        let n = axis_in(a, rank, attr)?;
        if out.contains(&n) {
            return attr_err(attr, format!("axis {a} is listed twice in {axes:?}"));
        }
        out.push(n);
    }
    Ok(out)
}

/// The normalised, sorted reduction axes; `None` means all axes.
pub fn reduce_axes(axes: Option<&[i64]>, rank: usize) -> R<Vec<usize>> {
    match axes {
        None => Ok((0..rank).collect()),
        Some(a) => {
            let mut v = unique_axes(a, rank, "axes")?;
            v.sort_unstable();
            Ok(v)
        }
    }
}

fn matmul(inp: &[(DType, &Shape)]) -> R<Vec<TensorSpec>> {
    let (da, sa) = inp[0];
    let (db, sb) = inp[1];
    same_dtype(da, db)?;
    if da == DType::Bool {
        return dtype_err("MatMul needs numeric inputs, got bool");
    }
    let rank0 = || shape_err(format!("MatMul operands must have rank >= 1, got {sa} and {sb}"));
    // Batch axes and matrix extents, a vector operand promoted to a matrix (numpy's matmul rules).
    let (ab, m, ka) = match &sa.0[..] {
        [k] => (&[][..], 1, *k),
        [batch @ .., m, k] => (batch, *m, *k),
        [] => return rank0(),
    };
    let (bb, kb, n) = match &sb.0[..] {
        [k] => (&[][..], *k, 1),
        [batch @ .., k, n] => (batch, *k, *n),
        [] => return rank0(),
    };
    if ka != kb {
        return shape_err(format!("inner dimensions differ: {sa} x {sb} ({ka} vs {kb})"));
    }
    // The batch axes broadcast (numpy's implicit leading ones), written straight into the output.
    let rank = ab.len().max(bb.len());
    let mut out = Vec::with_capacity(rank + 2);
    let from_right = |d: &[usize], k: usize| if k < d.len() { d[d.len() - 1 - k] } else { 1 };
    for k in (0..rank).rev() {
        out.push(match (from_right(ab, k), from_right(bb, k)) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return shape_err(format!("cannot broadcast {} with {}", Shape::from(ab), Shape::from(bb))),
        });
    }
    if sa.rank() > 1 {
        out.push(m);
    }
    if sb.rank() > 1 {
        out.push(n);
    }
    Ok(vec![spec(da, out)])
}

fn gemm(inp: &[(DType, &Shape)], ta: bool, tb: bool) -> R<Vec<TensorSpec>> {
    let (da, sa) = inp[0];
    let (db, sb) = inp[1];
    same_dtype(da, db)?;
    if da == DType::Bool {
        return dtype_err("Gemm needs numeric inputs, got bool");
    }
    if sa.rank() != 2 || sb.rank() != 2 {
        return shape_err(format!("Gemm needs 2-D A and B, got {sa} and {sb}"));
    }
    let (m, ka) = if ta { (sa.0[1], sa.0[0]) } else { (sa.0[0], sa.0[1]) };
    let (kb, n) = if tb { (sb.0[1], sb.0[0]) } else { (sb.0[0], sb.0[1]) };
    if ka != kb {
        return shape_err(format!("inner dimensions differ: A {sa} (trans_a={ta}) and B {sb} (trans_b={tb})"));
    }
    let out = Shape::from(vec![m, n]);
    if let Some(&(dc, sc)) = inp.get(2) {
        same_dtype(da, dc)?;
        if broadcast(sc, &out).as_ref() != Some(&out) {
            return shape_err(format!("C {sc} does not broadcast to the output {out}"));
        }
    }
    Ok(vec![spec(da, out.0)])
}

/// Spatial attribute vectors filled with defaults and checked against the spatial rank.
fn spatial(v: &[usize], n: usize, default: usize, attr: &'static str) -> R<Vec<usize>> {
    if v.is_empty() {
        return Ok(vec![default; n]);
    }
    if v.len() != n {
        return attr_err(attr, format!("has {} values for {n} spatial axes", v.len()));
    }
    Ok(v.to_vec())
}

fn pads_of(v: &[usize], n: usize) -> R<Vec<usize>> {
    if v.is_empty() {
        return Ok(vec![0; 2 * n]);
    }
    if v.len() != 2 * n {
        return attr_err("pads", format!("has {} values; {n} spatial axes need {} (begins then ends)", v.len(), 2 * n));
    }
    Ok(v.to_vec())
}

/// Resolved window geometry of a Conv or pool: per spatial axis (kernel, stride, pad begin, pad end, dilation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Window {
    /// Kernel extent per spatial axis.
    pub kernel: Vec<usize>,
    /// Stride per spatial axis.
    pub strides: Vec<usize>,
    /// Begin pads per spatial axis.
    pub pads_begin: Vec<usize>,
    /// End pads per spatial axis.
    pub pads_end: Vec<usize>,
    /// Dilation per spatial axis.
    pub dilations: Vec<usize>,
}

impl Window {
    /// Resolve attributes for `kernel` extents (Conv: the weight's spatial dims; pools: kernel_shape).
    pub fn resolve(
        kernel: &[usize],
        strides: &[usize],
        pads: &[usize],
        dilations: &[usize],
    ) -> Result<Window, InferError> {
        let n = kernel.len();
        let strides = spatial(strides, n, 1, "strides")?;
        let dilations = spatial(dilations, n, 1, "dilations")?;
        let mut pads_begin = pads_of(pads, n)?;
        if strides.contains(&0) {
            return attr_err("strides", "must be >= 1");
        }
        if dilations.contains(&0) {
            return attr_err("dilations", "must be >= 1");
        }
        if kernel.contains(&0) {
            return attr_err("kernel_shape", "must be >= 1");
        }
        let pads_end = pads_begin.split_off(n);
        Ok(Window { kernel: kernel.to_vec(), strides, pads_begin, pads_end, dilations })
    }

    /// Output extent along spatial axis `i` for input extent `input`.
    pub fn out_extent(&self, i: usize, input: usize, ceil_mode: bool) -> R<usize> {
        let eff = self.dilations[i]
            .checked_mul(self.kernel[i] - 1)
            .and_then(|v| v.checked_add(1))
            .ok_or_else(|| InferError::Shape("window extent overflows".into()))?;
        let padded = input
            .checked_add(self.pads_begin[i])
            .and_then(|v| v.checked_add(self.pads_end[i]))
            .ok_or_else(|| InferError::Shape("padded extent overflows".into()))?;
        if padded < eff {
            return shape_err(format!(
                "spatial axis {i}: window {eff} (kernel {} dilation {}) is larger than the padded input {padded}",
                self.kernel[i], self.dilations[i]
            ));
        }
        let s = self.strides[i];
        let span = padded - eff;
        let mut out = if ceil_mode { span.div_ceil(s) + 1 } else { span / s + 1 };
        // As PyTorch and ONNX's reference: the last window must start inside the input or the begin padding.
        if ceil_mode && (out - 1) * s >= input + self.pads_begin[i] {
            out -= 1;
        }
        Ok(out)
    }
}

fn conv(inp: &[(DType, &Shape)], a: &ConvAttrs) -> R<Vec<TensorSpec>> {
    let (dx, sx) = inp[0];
    let (dw, sw) = inp[1];
    if !dx.is_float() {
        return dtype_err(format!("Conv needs floating-point input, got {dx}"));
    }
    same_dtype(dx, dw)?;
    if sx.rank() < 3 {
        return shape_err(format!("X must have rank >= 3 (N, C, spatial...), got {sx}"));
    }
    if sw.rank() != sx.rank() {
        return shape_err(format!("W {sw} must have the rank of X {sx}"));
    }
    let g = a.group.max(1);
    let (n, c) = (sx.0[0], sx.0[1]);
    let (m, cg) = (sw.0[0], sw.0[1]);
    if c % g != 0 || m % g != 0 {
        return attr_err("group", format!("{g} must divide input channels {c} and output channels {m}"));
    }
    if cg * g != c {
        return shape_err(format!("W {sw} expects {cg} x {g} groups = {} input channels, X {sx} has {c}", cg * g));
    }
    if let Some(&(db, sb)) = inp.get(2) {
        same_dtype(dx, db)?;
        if *sb.0 != [m] {
            return shape_err(format!("bias must have shape [{m}], got {sb}"));
        }
    }
    let w = Window::resolve(&sw.0[2..], &a.strides, &a.pads, &a.dilations)?;
    let mut out = Vec::with_capacity(sx.rank());
    out.extend([n, m]);
    for (i, &d) in sx.0[2..].iter().enumerate() {
        out.push(w.out_extent(i, d, false)?);
    }
    Ok(vec![spec(dx, out)])
}

fn pool(op: &Op, inp: &[(DType, &Shape)], a: &PoolAttrs) -> R<Vec<TensorSpec>> {
    let (d, s) = inp[0];
    require_numeric(op, 0, d)?;
    if s.rank() < 3 {
        return shape_err(format!("X must have rank >= 3 (N, C, spatial...), got {s}"));
    }
    if a.kernel_shape.len() != s.rank() - 2 {
        return attr_err(
            "kernel_shape",
            format!("has {} values for {} spatial axes", a.kernel_shape.len(), s.rank() - 2),
        );
    }
    let w = Window::resolve(&a.kernel_shape, &a.strides, &a.pads, &a.dilations)?;
    for i in 0..w.kernel.len() {
        if w.pads_begin[i] >= w.kernel[i] || w.pads_end[i] >= w.kernel[i] {
            return attr_err("pads", format!("pads on axis {i} must be smaller than the kernel {}", w.kernel[i]));
        }
    }
    let mut out = s.0[..2].to_vec();
    for (i, &dim) in s.0[2..].iter().enumerate() {
        out.push(w.out_extent(i, dim, a.ceil_mode)?);
    }
    Ok(vec![spec(d, out)])
}

fn reshape((d, s): (DType, &Shape), target: &[i64], allowzero: bool) -> R<Vec<TensorSpec>> {
    let total = checked_prod(&s.0)?;
    let mut out = Vec::with_capacity(target.len());
    let mut infer_at = None;
    for (i, &v) in target.iter().enumerate() {
        match v {
            -1 => {
                if infer_at.is_some() {
                    return attr_err("shape", format!("{target:?} has more than one -1"));
                }
                infer_at = Some(i);
                out.push(1);
            }
            0 if !allowzero => match s.0.get(i) {
                Some(&e) => out.push(e),
                None => return attr_err("shape", format!("0 at position {i} copies an axis that {s} lacks")),
            },
            v if v < 0 => return attr_err("shape", format!("negative extent {v} in {target:?}")),
            v => out.push(v as usize),
        }
    }
    if allowzero && infer_at.is_some() && target.contains(&0) {
        return attr_err("shape", "with allowzero, 0 and -1 cannot appear together");
    }
    let known = checked_prod(&out)?;
    if let Some(i) = infer_at {
        if known == 0 || total % known != 0 {
            return shape_err(format!("cannot reshape {s} ({total} elements) to {target:?}"));
        }
        out[i] = total / known;
    } else if known != total {
        return shape_err(format!("cannot reshape {s} ({total} elements) to {target:?} ({known} elements)"));
    }
    Ok(vec![spec(d, out)])
}

/// One axis of a resolved Slice: first index, step and element count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SliceAxis {
    /// First input index taken.
    pub start: i64,
    /// Step between taken indices (non-zero).
    pub step: i64,
    /// Number of indices taken.
    pub count: usize,
}

/// Resolve ONNX Slice attributes against `shape`: one entry per input axis (untouched axes take everything).
pub fn slice_plan(
    shape: &Shape,
    starts: &[i64],
    ends: &[i64],
    axes: Option<&[i64]>,
    steps: Option<&[i64]>,
) -> Result<Vec<SliceAxis>, InferError> {
    let r = shape.rank();
    if starts.len() != ends.len() {
        return attr_err("ends", format!("has {} values but starts has {}", ends.len(), starts.len()));
    }
    let axes: Vec<usize> = match axes {
        Some(a) => {
            if a.len() != starts.len() {
                return attr_err("axes", format!("has {} values but starts has {}", a.len(), starts.len()));
            }
            unique_axes(a, r, "axes")?
        }
        None => {
            if starts.len() > r {
                return attr_err("starts", format!("has {} values for rank {r}", starts.len()));
            }
            (0..starts.len()).collect()
        }
    };
    if let Some(st) = steps {
        if st.len() != starts.len() {
            return attr_err("steps", format!("has {} values but starts has {}", st.len(), starts.len()));
        }
    }
    let mut plan: Vec<SliceAxis> = shape.0.iter().map(|&d| SliceAxis { start: 0, step: 1, count: d }).collect();
    for (k, &a) in axes.iter().enumerate() {
        let dim = shape.0[a] as i64;
        let step = steps.map_or(1, |s| s[k]);
        if step == 0 {
            return attr_err("steps", "must be non-zero");
        }
        let norm = |v: i64| if v < 0 { v.saturating_add(dim) } else { v };
        // ONNX clamps starts into [0, dim] (positive steps) or [0, dim - 1] (negative steps), and ends into
        // [0, dim] or [-1, dim - 1]; an empty axis yields nothing either way.
        let (start, end) = if dim == 0 {
            (0, 0)
        } else if step > 0 {
            (norm(starts[k]).clamp(0, dim), norm(ends[k]).clamp(0, dim))
        } else {
            (norm(starts[k]).clamp(0, dim - 1), norm(ends[k]).clamp(-1, dim - 1))
        };
        // Ceiling division of the span by |step| without overflow (steps may be as large as i64 allows).
        let span = if step > 0 { end - start } else { start - end };
        let count = if span > 0 { (span.unsigned_abs() - 1) / step.unsigned_abs() + 1 } else { 0 };
        plan[a] = SliceAxis { start: if count == 0 { 0 } else { start }, step, count: count as usize };
    }
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::{GeluApprox, MemSpace};

    fn s(v: &[usize]) -> Shape {
        Shape::from(v)
    }

    /// `infer`, and on every case of these tests the property `GraphEdit::place` relies on to skip
    /// re-inference: renaming one float dtype to another that no operand has (f32 -> f16, f16 -> bf16, ...)
    /// renames the outputs the same way, or fails alike (Cast and custom ops aside: their output dtype is an
    /// attribute).
    fn inf(op: &Op, ins: &[(DType, Shape)]) -> R<Vec<TensorSpec>> {
        let refs: Vec<(DType, &Shape)> = ins.iter().map(|(d, s)| (*d, s)).collect();
        let out = infer(op, &refs);
        if !matches!(op, Op::Cast { .. } | Op::Custom(_)) {
            let floats = [DType::F32, DType::F16, DType::BF16];
            for from in floats.into_iter().filter(|&d| ins.iter().any(|(x, _)| *x == d)) {
                for to in floats.into_iter().filter(|&d| ins.iter().all(|(x, _)| *x != d)) {
                    let r = |d: DType| if d == from { to } else { d };
                    let renamed: Vec<(DType, &Shape)> = ins.iter().map(|(d, s)| (r(*d), s)).collect();
                    let got = infer(op, &renamed);
                    match (&out, &got) {
                        (Ok(a), Ok(b)) => {
                            let want: Vec<TensorSpec> =
                                a.iter().map(|t| TensorSpec { dtype: r(t.dtype), shape: t.shape.clone() }).collect();
                            assert_eq!(b, &want, "{op}: {from} -> {to}");
                        }
                        (Err(a), Err(b)) => {
                            assert_eq!(std::mem::discriminant(a), std::mem::discriminant(b), "{op}: {from} -> {to}")
                        }
                        _ => panic!("{op}: {from} -> {to} changes the verdict: {out:?} vs {got:?}"),
                    }
                }
            }
        }
        out
    }

    fn one(op: &Op, ins: &[(DType, Shape)]) -> (DType, Vec<usize>) {
        let o = inf(op, ins).unwrap();
        assert_eq!(o.len(), 1);
        (o[0].dtype, o[0].shape.0.to_vec())
    }

    const F: DType = DType::F32;

    #[test]
    fn unary_keeps_shape_and_checks_dtype() {
        for op in [
            Op::Exp,
            Op::Relu,
            Op::Gelu { approximate: GeluApprox::Tanh },
            Op::Silu,
            Op::HardSwish,
            Op::Clip { min: Some(0.0), max: Some(6.0) },
            Op::LeakyRelu { alpha: 0.1 },
        ] {
            assert_eq!(one(&op, &[(F, s(&[2, 3]))]), (F, vec![2, 3]), "{op}");
        }
        assert!(matches!(inf(&Op::Exp, &[(DType::I32, s(&[2]))]), Err(InferError::DType(_))));
        assert!(matches!(inf(&Op::Relu, &[(DType::Bool, s(&[2]))]), Err(InferError::DType(_))));
        assert_eq!(one(&Op::Neg, &[(DType::I64, s(&[4]))]), (DType::I64, vec![4]));
        assert!(matches!(inf(&Op::Not, &[(F, s(&[2]))]), Err(InferError::DType(_))));
        assert!(matches!(
            inf(&Op::Clip { min: Some(f32::NAN), max: None }, &[(F, s(&[2]))]),
            Err(InferError::Attr("min", _))
        ));
    }

    #[test]
    fn binary_broadcasts() {
        assert_eq!(one(&Op::Add, &[(F, s(&[4, 1, 3])), (F, s(&[5, 1]))]), (F, vec![4, 5, 3]));
        assert_eq!(one(&Op::Less, &[(F, s(&[3])), (F, s(&[]))]), (DType::Bool, vec![3]));
        assert!(matches!(inf(&Op::Add, &[(F, s(&[2])), (F, s(&[3]))]), Err(InferError::Shape(_))));
        assert!(matches!(inf(&Op::Mul, &[(F, s(&[2])), (DType::I32, s(&[2]))]), Err(InferError::DType(_))));
        assert!(matches!(inf(&Op::Add, &[(F, s(&[2]))]), Err(InferError::Arity(_))));
        assert_eq!(one(&Op::Where, &[(DType::Bool, s(&[2, 1])), (F, s(&[3])), (F, s(&[1, 1]))]), (F, vec![2, 3]));
        assert!(matches!(inf(&Op::Where, &[(F, s(&[2])), (F, s(&[2])), (F, s(&[2]))]), Err(InferError::DType(_))));
        assert_eq!(one(&Op::Cast { to: DType::I8 }, &[(F, s(&[7]))]), (DType::I8, vec![7]));
        assert_eq!(one(&Op::Pow, &[(F, s(&[2, 2])), (DType::I32, s(&[]))]), (F, vec![2, 2]));
    }

    #[test]
    fn matmul_shapes() {
        assert_eq!(one(&Op::MatMul, &[(F, s(&[2, 3])), (F, s(&[3, 4]))]), (F, vec![2, 4]));
        assert_eq!(one(&Op::MatMul, &[(F, s(&[5, 1, 2, 3])), (F, s(&[7, 3, 4]))]), (F, vec![5, 7, 2, 4]));
        assert_eq!(one(&Op::MatMul, &[(F, s(&[3])), (F, s(&[3, 4]))]), (F, vec![4]));
        assert_eq!(one(&Op::MatMul, &[(F, s(&[2, 3])), (F, s(&[3]))]), (F, vec![2]));
        assert_eq!(one(&Op::MatMul, &[(F, s(&[3])), (F, s(&[3]))]), (F, vec![]));
        assert!(matches!(inf(&Op::MatMul, &[(F, s(&[2, 3])), (F, s(&[4, 5]))]), Err(InferError::Shape(_))));
        assert!(matches!(inf(&Op::MatMul, &[(F, s(&[2, 2, 3])), (F, s(&[3, 3, 5]))]), Err(InferError::Shape(_))));
    }

    #[test]
    fn gemm_shapes() {
        let g = |ta, tb| Op::Gemm { alpha: 1.0, beta: 1.0, trans_a: ta, trans_b: tb };
        assert_eq!(one(&g(false, true), &[(F, s(&[2, 3])), (F, s(&[4, 3])), (F, s(&[4]))]), (F, vec![2, 4]));
        assert_eq!(one(&g(true, false), &[(F, s(&[3, 2])), (F, s(&[3, 4]))]), (F, vec![2, 4]));
        assert!(matches!(
            inf(&g(false, false), &[(F, s(&[2, 3])), (F, s(&[3, 4])), (F, s(&[3]))]),
            Err(InferError::Shape(_))
        ));
        assert!(matches!(inf(&g(false, false), &[(F, s(&[2, 3, 1])), (F, s(&[3, 4]))]), Err(InferError::Shape(_))));
    }

    #[test]
    fn conv_shapes() {
        let a = ConvAttrs { strides: vec![2, 2], pads: vec![3, 3, 3, 3], dilations: vec![], group: 1 };
        assert_eq!(
            one(&Op::Conv(a), &[(F, s(&[1, 3, 224, 224])), (F, s(&[64, 3, 7, 7])), (F, s(&[64]))]),
            (F, vec![1, 64, 112, 112])
        );
        // depthwise, dilated
        let a = ConvAttrs { strides: vec![], pads: vec![2, 2, 2, 2], dilations: vec![2, 2], group: 32 };
        assert_eq!(one(&Op::Conv(a), &[(F, s(&[2, 32, 10, 10])), (F, s(&[32, 1, 3, 3]))]), (F, vec![2, 32, 10, 10]));
        let bad = ConvAttrs { group: 3, ..Default::default() };
        assert!(matches!(
            inf(&Op::Conv(bad), &[(F, s(&[1, 4, 5, 5])), (F, s(&[6, 1, 3, 3]))]),
            Err(InferError::Attr("group", _))
        ));
        let bad = ConvAttrs { strides: vec![1], ..Default::default() };
        assert!(matches!(
            inf(&Op::Conv(bad), &[(F, s(&[1, 4, 5, 5])), (F, s(&[6, 4, 3, 3]))]),
            Err(InferError::Attr("strides", _))
        ));
        assert!(matches!(
            inf(&Op::Conv(ConvAttrs::default()), &[(F, s(&[1, 4, 2, 2])), (F, s(&[6, 4, 3, 3]))]),
            Err(InferError::Shape(_))
        ));
        // 1-D conv
        assert_eq!(one(&Op::Conv(ConvAttrs::default()), &[(F, s(&[1, 2, 9])), (F, s(&[4, 2, 3]))]), (F, vec![1, 4, 7]));
    }

    #[test]
    fn pool_shapes() {
        let a =
            PoolAttrs { kernel_shape: vec![3, 3], strides: vec![2, 2], pads: vec![1, 1, 1, 1], ..Default::default() };
        assert_eq!(one(&Op::MaxPool(a.clone()), &[(F, s(&[1, 64, 112, 112]))]), (F, vec![1, 64, 56, 56]));
        let c = PoolAttrs { kernel_shape: vec![3, 3], strides: vec![2, 2], ceil_mode: true, ..Default::default() };
        // googlenet-style: 112 -> ceil((112-3)/2)+1 = 56
        assert_eq!(one(&Op::MaxPool(c.clone()), &[(F, s(&[1, 64, 112, 112]))]), (F, vec![1, 64, 56, 56]));
        assert_eq!(one(&Op::MaxPool(c), &[(F, s(&[1, 1, 6, 6]))]), (F, vec![1, 1, 3, 3]));
        let floor = PoolAttrs { kernel_shape: vec![3, 3], strides: vec![2, 2], ..Default::default() };
        assert_eq!(one(&Op::AveragePool(floor), &[(F, s(&[1, 1, 6, 6]))]), (F, vec![1, 1, 2, 2]));
        assert_eq!(one(&Op::GlobalAveragePool, &[(F, s(&[2, 8, 7, 7]))]), (F, vec![2, 8, 1, 1]));
        assert!(matches!(
            inf(&Op::MaxPool(PoolAttrs { kernel_shape: vec![3], ..Default::default() }), &[(F, s(&[1, 1, 6, 6]))]),
            Err(InferError::Attr("kernel_shape", _))
        ));
    }

    #[test]
    fn reductions() {
        let r = |axes: Option<Vec<i64>>, keepdims| Op::ReduceMean { axes, keepdims };
        assert_eq!(one(&r(Some(vec![-1]), true), &[(F, s(&[2, 3, 4]))]), (F, vec![2, 3, 1]));
        assert_eq!(one(&r(Some(vec![0, 2]), false), &[(F, s(&[2, 3, 4]))]), (F, vec![3]));
        assert_eq!(one(&r(None, false), &[(F, s(&[2, 3, 4]))]), (F, vec![]));
        assert!(matches!(inf(&r(Some(vec![3]), true), &[(F, s(&[2, 3, 4]))]), Err(InferError::Attr("axes", _))));
        assert!(matches!(inf(&r(Some(vec![1, -2]), true), &[(F, s(&[2, 3, 4]))]), Err(InferError::Attr("axes", _))));
        assert_eq!(one(&Op::Softmax { axis: -1 }, &[(F, s(&[2, 5]))]), (F, vec![2, 5]));
        assert!(matches!(inf(&Op::Softmax { axis: 2 }, &[(F, s(&[2, 5]))]), Err(InferError::Attr("axis", _))));
        let ln = Op::LayerNormalization { axis: -1, epsilon: 1e-5 };
        assert_eq!(one(&ln, &[(F, s(&[2, 8])), (F, s(&[8])), (F, s(&[8]))]), (F, vec![2, 8]));
        assert!(matches!(inf(&ln, &[(F, s(&[2, 8])), (F, s(&[4]))]), Err(InferError::Shape(_))));
        let bn = Op::BatchNormalization { epsilon: 1e-5 };
        let c = (F, s(&[3]));
        assert_eq!(
            one(&bn, &[(F, s(&[1, 3, 4, 4])), c.clone(), c.clone(), c.clone(), c.clone()]),
            (F, vec![1, 3, 4, 4])
        );
        assert!(matches!(
            inf(&bn, &[(F, s(&[1, 4, 4, 4])), c.clone(), c.clone(), c.clone(), c]),
            Err(InferError::Shape(_))
        ));
    }

    #[test]
    fn views() {
        let rs = |v: &[i64]| Op::Reshape { shape: v.to_vec(), allowzero: false };
        assert_eq!(one(&rs(&[0, -1]), &[(F, s(&[2, 3, 4]))]), (F, vec![2, 12]));
        assert_eq!(one(&rs(&[4, 0, 2]), &[(F, s(&[2, 3, 4]))]), (F, vec![4, 3, 2]));
        assert!(matches!(inf(&rs(&[-1, -1]), &[(F, s(&[4]))]), Err(InferError::Attr("shape", _))));
        assert!(matches!(inf(&rs(&[5]), &[(F, s(&[4]))]), Err(InferError::Shape(_))));
        assert!(matches!(inf(&rs(&[-2]), &[(F, s(&[4]))]), Err(InferError::Attr("shape", _))));
        assert_eq!(one(&Op::Reshape { shape: vec![0, 4], allowzero: true }, &[(F, s(&[0, 4]))]), (F, vec![0, 4]));
        assert_eq!(one(&Op::Flatten { axis: 1 }, &[(F, s(&[2, 3, 4]))]), (F, vec![2, 12]));
        assert_eq!(one(&Op::Flatten { axis: 0 }, &[(F, s(&[2, 3]))]), (F, vec![1, 6]));
        assert_eq!(one(&Op::Flatten { axis: 2 }, &[(F, s(&[2, 3]))]), (F, vec![6, 1]));
        assert_eq!(one(&Op::Squeeze { axes: None }, &[(F, s(&[1, 3, 1]))]), (F, vec![3]));
        assert_eq!(one(&Op::Squeeze { axes: Some(vec![-1]) }, &[(F, s(&[1, 3, 1]))]), (F, vec![1, 3]));
        assert!(matches!(inf(&Op::Squeeze { axes: Some(vec![1]) }, &[(F, s(&[1, 3]))]), Err(InferError::Shape(_))));
        assert_eq!(one(&Op::Unsqueeze { axes: vec![0, 3] }, &[(F, s(&[2, 3]))]), (F, vec![1, 2, 3, 1]));
        assert_eq!(one(&Op::Unsqueeze { axes: vec![-1] }, &[(F, s(&[2]))]), (F, vec![2, 1]));
        assert!(matches!(inf(&Op::Unsqueeze { axes: vec![0, 0] }, &[(F, s(&[2]))]), Err(InferError::Attr(..))));
        assert_eq!(one(&Op::Memcpy { to: MemSpace::Host }, &[(F, s(&[2]))]), (F, vec![2]));
    }

    #[test]
    fn data_movement() {
        assert_eq!(one(&Op::Transpose { perm: Some(vec![0, 2, 1]) }, &[(F, s(&[2, 3, 4]))]), (F, vec![2, 4, 3]));
        assert_eq!(one(&Op::Transpose { perm: None }, &[(F, s(&[2, 3, 4]))]), (F, vec![4, 3, 2]));
        assert!(matches!(
            inf(&Op::Transpose { perm: Some(vec![0, 0, 1]) }, &[(F, s(&[2, 3, 4]))]),
            Err(InferError::Attr("perm", _))
        ));
        let sl = Op::Slice { starts: vec![1, -3], ends: vec![i64::MAX, -1], axes: Some(vec![0, 1]), steps: None };
        assert_eq!(one(&sl, &[(F, s(&[4, 10]))]), (F, vec![3, 2]));
        let rev = Op::Slice { starts: vec![-1], ends: vec![i64::MIN], axes: None, steps: Some(vec![-2]) };
        assert_eq!(one(&rev, &[(F, s(&[5]))]), (F, vec![3]));
        // negative step with a start before the axis clamps to index 0 (ONNX), taking one element
        let neg = Op::Slice { starts: vec![-3], ends: vec![i64::MIN], axes: None, steps: Some(vec![-2]) };
        assert_eq!(one(&neg, &[(F, s(&[2]))]), (F, vec![1]));
        let on_empty = Op::Slice { starts: vec![-1], ends: vec![i64::MIN], axes: None, steps: Some(vec![-1]) };
        assert_eq!(one(&on_empty, &[(F, s(&[0]))]), (F, vec![0]));
        let empty = Op::Slice { starts: vec![3], ends: vec![1], axes: None, steps: None };
        assert_eq!(one(&empty, &[(F, s(&[5]))]), (F, vec![0]));
        // Steps at the ends of i64 take the first element (found by the reliability proptest: the ceiling
        // division overflowed).
        let huge = Op::Slice { starts: vec![1], ends: vec![5], axes: None, steps: Some(vec![i64::MAX]) };
        assert_eq!(one(&huge, &[(F, s(&[5]))]), (F, vec![1]));
        let huge_neg = Op::Slice { starts: vec![4], ends: vec![i64::MIN], axes: None, steps: Some(vec![i64::MIN]) };
        assert_eq!(one(&huge_neg, &[(F, s(&[5]))]), (F, vec![1]));
        let zero = Op::Slice { starts: vec![0], ends: vec![1], axes: None, steps: Some(vec![0]) };
        assert!(matches!(inf(&zero, &[(F, s(&[5]))]), Err(InferError::Attr("steps", _))));
        assert_eq!(one(&Op::Concat { axis: 1 }, &[(F, s(&[2, 3])), (F, s(&[2, 5])), (F, s(&[2, 1]))]), (F, vec![2, 9]));
        assert!(matches!(inf(&Op::Concat { axis: 1 }, &[(F, s(&[2, 3])), (F, s(&[3, 3]))]), Err(InferError::Shape(_))));
        assert_eq!(one(&Op::Gather { axis: 0 }, &[(F, s(&[100, 16])), (DType::I64, s(&[1, 7]))]), (F, vec![1, 7, 16]));
        assert!(matches!(inf(&Op::Gather { axis: 0 }, &[(F, s(&[4])), (F, s(&[2]))]), Err(InferError::DType(_))));
        assert_eq!(one(&Op::Expand { shape: vec![2, 1, 3] }, &[(F, s(&[4, 1]))]), (F, vec![2, 4, 3]));
        assert!(matches!(inf(&Op::Expand { shape: vec![3] }, &[(F, s(&[2]))]), Err(InferError::Shape(_))));
        let pad = Op::Pad { pads: vec![0, 1, 0, -1], mode: PadMode::Constant, value: 0.0 };
        assert_eq!(one(&pad, &[(F, s(&[2, 3]))]), (F, vec![2, 3]));
        let bad = Op::Pad { pads: vec![0, 3, 0, 0], mode: PadMode::Reflect, value: 0.0 };
        assert!(matches!(inf(&bad, &[(F, s(&[2, 3]))]), Err(InferError::Attr("pads", _))));
        let split = Op::Split { axis: -1, splits: vec![2, 4] };
        let o = inf(&split, &[(F, s(&[3, 6]))]).unwrap();
        assert_eq!(o.iter().map(|t| t.shape.0.to_vec()).collect::<Vec<_>>(), vec![vec![3, 2], vec![3, 4]]);
        assert!(matches!(
            inf(&Op::Split { axis: 0, splits: vec![1, 1] }, &[(F, s(&[3]))]),
            Err(InferError::Attr("splits", _))
        ));
    }

    #[test]
    fn rank_limit() {
        let big = Shape::from(vec![1; MAX_RANK + 1]);
        assert!(matches!(inf(&Op::Relu, &[(F, big)]), Err(InferError::Shape(_))));
        let ok = Shape::from(vec![1; MAX_RANK]);
        assert!(matches!(inf(&Op::Unsqueeze { axes: vec![0] }, &[(F, ok)]), Err(InferError::Shape(_))));
    }
}
