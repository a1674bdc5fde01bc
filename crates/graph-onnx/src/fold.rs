//! Compile-time evaluation of nodes whose inputs are all constants.
//!
//! Exporters compute Reshape targets, index tables and masks with small subgraphs (Shape -> Gather ->
//! Unsqueeze -> Concat -> Reshape, GatherElements over a constant table, ...). cuplan's ops take those values
//! as attributes, so the importer evaluates such nodes here. The importer folds a node when every input is
//! a constant and either its result is integer or bool (shape arithmetic and index tables, never model
//! maths), or graph-ir has no op for it, or it is one of the f32 operations IEEE 754 rounds correctly (Cast to
//! f32 of an exactly representable value, Neg, Abs, Sqrt, Reciprocal, Add, Sub, Mul, Div: [`float_exact`]).
//! Those give the same bits on every backend, so folding them changes no value; exporters use them for
//! scalars computed from shapes (torch's `scaled_dot_product_attention` writes its scale as
//! `Sqrt(1 / Sqrt(Cast(Shape(q)[-1])))`, one tiny launch per layer otherwise). Other floating-point maths on
//! constants (transcendentals, whose last bit differs between libraries; Where, Pow, ...) stays in the graph.
//!
//! Dynamic exports (a symbolic batch or sequence length bound with `--dim`) compute much more this way: Reshape
//! and Expand targets from `Shape`, position ids from `Range` or `ConstantOfShape` + `CumSum`, masks from
//! `Equal`/`Where`/`Trilu`. Integer arithmetic is checked in the element type: an overflow is an error, never a
//! wrapped extent.
//!
//! Every function computes its output's size first and refuses results above `max_bytes`, so a hostile
//! `ConstantOfShape([10^9])` is an error, never an allocation. Errors are plain strings; the importer
//! wraps them with the node's name.

use graph_ir::infer::{infer, slice_plan};
use graph_ir::{Op, Shape};

use std::sync::Arc;

use crate::proto::data_type;
use crate::tensor::{elem_size, TensorValue};
use crate::types::dtype_of;

type R<T> = Result<T, String>;

/// Row-major strides of `dims`.
fn strides(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1];
    }
    s
}

/// Element count of `dims` and its byte size for `code`, refused above `max_bytes`.
pub(crate) fn check_size(dims: &[usize], code: i32, max_bytes: usize) -> R<usize> {
    let n = dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    let size = elem_size(code).unwrap_or(1);
    match n.and_then(|n| n.checked_mul(size).map(|b| (n, b))) {
        Some((n, b)) if b <= max_bytes => Ok(n),
        _ => Err(format!("the constant result of shape {dims:?} exceeds the folding limit of {max_bytes} bytes")),
    }
}

/// For each element of `out` (row-major), the flat index of the `inp` element numpy broadcasting reads.
fn broadcast_map(out: &[usize], inp: &[usize]) -> Vec<usize> {
    let n: usize = out.iter().product();
    let r = out.len();
    let off = r - inp.len();
    let in_strides = strides(inp);
    // Stride per output axis: 0 where the input is broadcast along it.
    let eff: Vec<usize> = (0..r).map(|k| if k < off || inp[k - off] == 1 { 0 } else { in_strides[k - off] }).collect();
    let mut idx = vec![0usize; r];
    let mut flat = 0usize;
    let mut map = Vec::with_capacity(n);
    for _ in 0..n {
        map.push(flat);
        for k in (0..r).rev() {
            idx[k] += 1;
            flat += eff[k];
            if idx[k] < out[k] {
                break;
            }
            flat -= eff[k] * idx[k];
            idx[k] = 0;
        }
    }
    map
}

fn bcast_dims(shapes: &[&[usize]]) -> R<Vec<usize>> {
    let mut acc = Shape::scalar();
    for s in shapes {
        acc = graph_ir::shape::broadcast(&acc, &Shape::from(*s))
            .ok_or_else(|| format!("cannot broadcast {acc} with {}", Shape::from(*s)))?;
    }
    Ok(acc.0.to_vec())
}

/// Packs i64 values as `code`'s little-endian bytes (wrapping, as a C cast).
pub(crate) fn pack_ints(code: i32, v: &[i64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len() * elem_size(code).unwrap_or(8));
    for &x in v {
        match code {
            data_type::INT64 | data_type::UINT64 => out.extend_from_slice(&x.to_le_bytes()),
            data_type::INT32 | data_type::UINT32 => out.extend_from_slice(&(x as i32).to_le_bytes()),
            data_type::INT16 | data_type::UINT16 => out.extend_from_slice(&(x as i16).to_le_bytes()),
            data_type::BOOL => out.push(u8::from(x != 0)),
            _ => out.push(x as u8),
        }
    }
    out
}

fn is_int_code(code: i32) -> bool {
    matches!(
        code,
        data_type::INT64
            | data_type::INT32
            | data_type::INT16
            | data_type::INT8
            | data_type::UINT64
            | data_type::UINT32
            | data_type::UINT16
            | data_type::UINT8
            | data_type::BOOL
    )
}

/// True for integer and bool element types: results of these types are folded.
pub(crate) fn is_index_type(code: i32) -> bool {
    is_int_code(code)
}

/// Output dims of a graph-ir op over constant inputs, through graph-ir's own inference.
fn infer_dims(op: &Op, inputs: &[&TensorValue]) -> R<Vec<usize>> {
    let specs: Vec<(graph_ir::DType, Shape)> = inputs
        .iter()
        .map(|v| {
            dtype_of(v.dtype)
                .map(|d| (d, Shape::from(v.dims.as_slice())))
                .ok_or_else(|| format!("cannot fold over {} values", data_type::name(v.dtype)))
        })
        .collect::<R<_>>()?;
    let refs: Vec<(graph_ir::DType, &Shape)> = specs.iter().map(|(d, s)| (*d, s)).collect();
    let out = infer(op, &refs).map_err(|e| format!("{e:?}"))?;
    out.into_iter().next().map(|s| s.shape.0.to_vec()).ok_or_else(|| "no output".to_string())
}

/// The same bytes under new dims (Reshape, Squeeze, Unsqueeze, Flatten, Identity).
pub(crate) fn view(op: &Op, x: &TensorValue) -> R<TensorValue> {
    let dims = infer_dims(op, &[x])?;
    Ok(TensorValue { dtype: x.dtype, dims, bytes: Arc::clone(&x.bytes) })
}

/// Concat along `axis`.
pub(crate) fn concat(axis: i64, xs: &[&TensorValue], max_bytes: usize) -> R<TensorValue> {
    let dims = infer_dims(&Op::Concat { axis }, xs)?;
    let code = xs[0].dtype;
    check_size(&dims, code, max_bytes)?;
    let a = graph_ir::shape::normalize_axis(axis, dims.len()).ok_or("axis out of range")?;
    let size = elem_size(code).unwrap_or(1);
    let outer: usize = dims[..a].iter().product();
    let mut out = Vec::new();
    for o in 0..outer {
        for x in xs {
            let chunk = x.dims[a..].iter().product::<usize>() * size;
            out.extend_from_slice(&x.bytes[o * chunk..(o + 1) * chunk]);
        }
    }
    Ok(TensorValue::new(code, dims, out))
}

/// Gather along `axis` with (possibly negative) indices.
pub(crate) fn gather(axis: i64, data: &TensorValue, indices: &TensorValue, max_bytes: usize) -> R<TensorValue> {
    let dims = infer_dims(&Op::Gather { axis }, &[data, indices])?;
    check_size(&dims, data.dtype, max_bytes)?;
    let a = graph_ir::shape::normalize_axis(axis, data.dims.len()).ok_or("axis out of range")?;
    let idx = indices.to_i64s().ok_or("indices must be integers")?;
    let size = elem_size(data.dtype).unwrap_or(1);
    let extent = data.dims[a];
    let inner = data.dims[a + 1..].iter().product::<usize>() * size;
    let outer: usize = data.dims[..a].iter().product();
    let mut out = Vec::new();
    for o in 0..outer {
        for &i in &idx {
            let j = normalize_index(i, extent)?;
            let base = (o * extent + j) * inner;
            out.extend_from_slice(&data.bytes[base..base + inner]);
        }
    }
    Ok(TensorValue::new(data.dtype, dims, out))
}

fn normalize_index(i: i64, extent: usize) -> R<usize> {
    let e = extent as i64;
    let j = if i < 0 { i + e } else { i };
    if (0..e).contains(&j) {
        Ok(j as usize)
    } else {
        Err(format!("index {i} is out of range for extent {extent}"))
    }
}

/// GatherElements along `axis`: the output has the indices' shape.
pub(crate) fn gather_elements(
    axis: i64,
    data: &TensorValue,
    indices: &TensorValue,
    max_bytes: usize,
) -> R<TensorValue> {
    let r = data.dims.len();
    if indices.dims.len() != r {
        return Err(format!("indices rank {} differs from data rank {r}", indices.dims.len()));
    }
    let a = graph_ir::shape::normalize_axis(axis, r).ok_or_else(|| format!("axis {axis} out of range for rank {r}"))?;
    let n = check_size(&indices.dims, data.dtype, max_bytes)?;
    let idx = indices.to_i64s().ok_or("indices must be integers")?;
    let size = elem_size(data.dtype).unwrap_or(1);
    let ds = strides(&data.dims);
    let mut pos = vec![0usize; r];
    let mut out = Vec::with_capacity(n * size);
    for &i in idx.iter().take(n) {
        let mut flat = 0usize;
        for k in 0..r {
            let c = if k == a { normalize_index(i, data.dims[a])? } else { pos[k] };
            if c >= data.dims[k] {
                return Err(format!("indices shape {:?} exceeds data shape {:?} on axis {k}", indices.dims, data.dims));
            }
            flat += c * ds[k];
        }
        out.extend_from_slice(&data.bytes[flat * size..(flat + 1) * size]);
        advance(&mut pos, &indices.dims);
    }
    Ok(TensorValue::new(data.dtype, indices.dims.clone(), out))
}

/// Slice with graph-ir's resolution of starts, ends, axes and steps.
pub(crate) fn slice(op: &Op, x: &TensorValue, max_bytes: usize) -> R<TensorValue> {
    let Op::Slice { starts, ends, axes, steps } = op else {
        return Err("not a Slice".to_string());
    };
    let plan = slice_plan(&Shape::from(x.dims.as_slice()), starts, ends, axes.as_deref(), steps.as_deref())
        .map_err(|e| format!("{e:?}"))?;
    let dims: Vec<usize> = plan.iter().map(|p| p.count).collect();
    let n = check_size(&dims, x.dtype, max_bytes)?;
    let size = elem_size(x.dtype).unwrap_or(1);
    let xs = strides(&x.dims);
    let r = dims.len();
    let mut pos = vec![0usize; r];
    let mut out = Vec::with_capacity(n * size);
    for _ in 0..n {
        let flat: i64 = (0..r).map(|k| (plan[k].start + pos[k] as i64 * plan[k].step) * xs[k] as i64).sum();
        let f = flat as usize;
        out.extend_from_slice(&x.bytes[f * size..(f + 1) * size]);
        advance(&mut pos, &dims);
    }
    Ok(TensorValue::new(x.dtype, dims, out))
}

/// Step the row-major multi-index `pos` over `dims` to the next element (wrapping to all zeros after the last).
fn advance(pos: &mut [usize], dims: &[usize]) {
    for k in (0..pos.len()).rev() {
        pos[k] += 1;
        if pos[k] < dims[k] {
            return;
        }
        pos[k] = 0;
    }
}

/// Transpose (graph-ir's default permutation reverses the axes).
pub(crate) fn transpose(op: &Op, x: &TensorValue, max_bytes: usize) -> R<TensorValue> {
    let Op::Transpose { perm } = op else {
        return Err("not a Transpose".to_string());
    };
    let dims = infer_dims(op, &[x])?;
    let n = check_size(&dims, x.dtype, max_bytes)?;
    let r = dims.len();
    let perm: Vec<usize> = perm.clone().unwrap_or_else(|| (0..r).rev().collect());
    let size = elem_size(x.dtype).unwrap_or(1);
    let xs = strides(&x.dims);
    let mut pos = vec![0usize; r];
    let mut out = Vec::with_capacity(n * size);
    for _ in 0..n {
        // Output axis k reads input axis perm[k].
        let f: usize = (0..r).map(|k| pos[k] * xs[perm[k]]).sum();
        out.extend_from_slice(&x.bytes[f * size..(f + 1) * size]);
        advance(&mut pos, &dims);
    }
    Ok(TensorValue::new(x.dtype, dims, out))
}

/// Expand (bidirectional broadcast) to `shape`.
pub(crate) fn expand(shape: &[i64], x: &TensorValue, max_bytes: usize) -> R<TensorValue> {
    let dims = infer_dims(&Op::Expand { shape: shape.to_vec() }, &[x])?;
    check_size(&dims, x.dtype, max_bytes)?;
    let size = elem_size(x.dtype).unwrap_or(1);
    let map = broadcast_map(&dims, &x.dims);
    let mut out = Vec::with_capacity(map.len() * size);
    for i in map {
        out.extend_from_slice(&x.bytes[i * size..(i + 1) * size]);
    }
    Ok(TensorValue::new(x.dtype, dims, out))
}

/// `cond ? x : y` with three-way broadcasting.
pub(crate) fn where_(c: &TensorValue, x: &TensorValue, y: &TensorValue, max_bytes: usize) -> R<TensorValue> {
    if x.dtype != y.dtype {
        return Err("X and Y must share a dtype".to_string());
    }
    let dims = bcast_dims(&[&c.dims, &x.dims, &y.dims])?;
    check_size(&dims, x.dtype, max_bytes)?;
    let size = elem_size(x.dtype).unwrap_or(1);
    let cond = c.to_i64s().ok_or("condition must be bool")?;
    let (mc, mx, my) = (broadcast_map(&dims, &c.dims), broadcast_map(&dims, &x.dims), broadcast_map(&dims, &y.dims));
    let mut out = Vec::with_capacity(mc.len() * size);
    for k in 0..mc.len() {
        let (src, i) = if cond[mc[k]] != 0 { (x, mx[k]) } else { (y, my[k]) };
        out.extend_from_slice(&src.bytes[i * size..(i + 1) * size]);
    }
    Ok(TensorValue::new(x.dtype, dims, out))
}

/// The range of values an integer or bool element type holds, as i128 (u64 values above `i64::MAX` do not
/// arise: [`TensorValue::to_i64s`] reads them as negative i64, which this range refuses).
fn int_range(code: i32) -> (i128, i128) {
    match code {
        data_type::INT32 => (i32::MIN.into(), i32::MAX.into()),
        data_type::UINT32 => (0, u32::MAX.into()),
        data_type::INT16 => (i16::MIN.into(), i16::MAX.into()),
        data_type::UINT16 => (0, u16::MAX.into()),
        data_type::INT8 => (i8::MIN.into(), i8::MAX.into()),
        data_type::UINT8 => (0, u8::MAX.into()),
        data_type::BOOL => (0, 1),
        data_type::UINT64 => (0, i64::MAX.into()),
        _ => (i64::MIN.into(), i64::MAX.into()),
    }
}

/// `v` when it fits `code`, an error naming the operation otherwise.
fn fit(code: i32, v: Option<i128>, what: impl FnOnce() -> String) -> R<i64> {
    let (lo, hi) = int_range(code);
    match v {
        Some(x) if (lo..=hi).contains(&x) => Ok(x as i64),
        _ => Err(format!("{} overflows {}", what(), data_type::name(code))),
    }
}

/// One integer binary op on two values (checked: an overflow of the element type is an error).
fn int_op(op: &str, code: i32, x: i64, y: i64) -> R<Option<i64>> {
    let (a, b) = (i128::from(x), i128::from(y));
    let arith = |v: Option<i128>, sym: &str| fit(code, v, || format!("{x} {sym} {y}")).map(Some);
    match op {
        "Add" => arith(a.checked_add(b), "+"),
        "Sub" => arith(a.checked_sub(b), "-"),
        "Mul" => arith(a.checked_mul(b), "*"),
        // ONNX integer Div truncates toward zero; Mod (fmod=0) takes the divisor's sign, FMod the dividend's.
        "Div" | "Mod" | "FMod" if y == 0 => Err(format!("integer division by zero ({x} {op} 0)")),
        "Div" => arith(a.checked_div(b), "/"),
        "FMod" => arith(a.checked_rem(b), "fmod"),
        "Mod" => arith(a.checked_rem_euclid(b).map(|r| if r != 0 && b < 0 { r + b } else { r }), "mod"),
        "Max" => Ok(Some(x.max(y))),
        "Min" => Ok(Some(x.min(y))),
        "Equal" => Ok(Some(i64::from(x == y))),
        "Less" => Ok(Some(i64::from(x < y))),
        "LessOrEqual" => Ok(Some(i64::from(x <= y))),
        "Greater" => Ok(Some(i64::from(x > y))),
        "GreaterOrEqual" => Ok(Some(i64::from(x >= y))),
        "And" => Ok(Some(i64::from(x != 0 && y != 0))),
        "Or" => Ok(Some(i64::from(x != 0 || y != 0))),
        "Xor" => Ok(Some(i64::from((x != 0) != (y != 0)))),
        _ => Ok(None),
    }
}

/// An integer binary op (checked arithmetic; Div truncates toward zero; `Mod` is ONNX Mod with fmod=0,
/// `FMod` with fmod=1) or a comparison (any numeric type, compared as f64 when either side is
/// floating-point; bool result). `None` for floating-point arithmetic, which stays in the graph.
pub(crate) fn binary(op: &str, a: &TensorValue, b: &TensorValue, max_bytes: usize) -> R<Option<TensorValue>> {
    let cmp = matches!(op, "Equal" | "Less" | "LessOrEqual" | "Greater" | "GreaterOrEqual");
    if a.dtype != b.dtype {
        return Err(format!(
            "inputs must share a dtype, got {} and {}",
            data_type::name(a.dtype),
            data_type::name(b.dtype)
        ));
    }
    let ints = is_int_code(a.dtype);
    if !ints && !cmp {
        return Ok(None); // floating-point maths stays in the graph
    }
    let dims = bcast_dims(&[&a.dims, &b.dims])?;
    let out_code = if cmp || matches!(op, "And" | "Or" | "Xor") { data_type::BOOL } else { a.dtype };
    check_size(&dims, out_code, max_bytes)?;
    let (ma, mb) = (broadcast_map(&dims, &a.dims), broadcast_map(&dims, &b.dims));
    let vals: Vec<i64> = if ints {
        let (va, vb) = (a.to_i64s().unwrap_or_default(), b.to_i64s().unwrap_or_default());
        let mut v = Vec::with_capacity(ma.len());
        for k in 0..ma.len() {
            match int_op(op, a.dtype, va[ma[k]], vb[mb[k]])? {
                Some(x) => v.push(x),
                None => return Ok(None),
            }
        }
        v
    } else {
        let (va, vb) = (a.to_f64s(), b.to_f64s());
        (0..ma.len())
            .map(|k| {
                let (x, y) = (va[ma[k]], vb[mb[k]]);
                i64::from(match op {
                    "Equal" => x == y,
                    "Less" => x < y,
                    "LessOrEqual" => x <= y,
                    "Greater" => x > y,
                    _ => x >= y,
                })
            })
            .collect()
    };
    Ok(Some(TensorValue::new(out_code, dims, pack_ints(out_code, &vals))))
}

/// An integer unary op (Neg, Abs, Not, Sign), checked: `-i64::MIN` is an error.
pub(crate) fn unary(op: &str, x: &TensorValue) -> R<Option<TensorValue>> {
    let Some(v) = x.to_i64s() else { return Ok(None) };
    let code = if op == "Not" { data_type::BOOL } else { x.dtype };
    let mut out = Vec::with_capacity(v.len());
    for &a in &v {
        out.push(match op {
            "Neg" => fit(code, i128::from(a).checked_neg(), || format!("-({a})"))?,
            "Abs" => fit(code, Some(i128::from(a).abs()), || format!("|{a}|"))?,
            "Sign" => a.signum(),
            "Not" => i64::from(a == 0),
            _ => return Ok(None),
        });
    }
    Ok(Some(TensorValue::new(code, x.dims.clone(), pack_ints(code, &out))))
}

/// CumSum of an integer tensor along `axis` (ONNX `exclusive` and `reverse` attributes), checked.
/// `None` for floating-point data.
pub(crate) fn cumsum(x: &TensorValue, axis: i64, exclusive: bool, reverse: bool) -> R<Option<TensorValue>> {
    let Some(v) = x.to_i64s() else { return Ok(None) };
    let r = x.dims.len();
    let a = graph_ir::shape::normalize_axis(axis, r).ok_or_else(|| format!("axis {axis} out of range for rank {r}"))?;
    let (extent, inner) = (x.dims[a], x.dims[a + 1..].iter().product::<usize>());
    let outer: usize = x.dims[..a].iter().product();
    let mut out = vec![0i64; v.len()];
    for o in 0..outer {
        for i in 0..inner {
            let mut acc: i64 = 0;
            for step in 0..extent {
                let k = if reverse { extent - 1 - step } else { step };
                let flat = (o * extent + k) * inner + i;
                let next = fit(x.dtype, i128::from(acc).checked_add(i128::from(v[flat])), || {
                    format!("the running sum {acc} + {}", v[flat])
                })?;
                out[flat] = if exclusive { acc } else { next };
                acc = next;
            }
        }
    }
    Ok(Some(TensorValue::new(x.dtype, x.dims.clone(), pack_ints(x.dtype, &out))))
}

/// Tile: `x` repeated `repeats[k]` times along each axis k (any element type).
pub(crate) fn tile(x: &TensorValue, repeats: &[i64], max_bytes: usize) -> R<TensorValue> {
    let dims = tile_dims(&x.dims, repeats)?;
    let n = check_size(&dims, x.dtype, max_bytes)?;
    let size = elem_size(x.dtype).unwrap_or(1);
    let xs = strides(&x.dims);
    let r = dims.len();
    let mut pos = vec![0usize; r];
    let mut out = Vec::with_capacity(n * size);
    for _ in 0..n {
        let f: usize = (0..r).map(|k| (pos[k] % x.dims[k]) * xs[k]).sum();
        out.extend_from_slice(&x.bytes[f * size..(f + 1) * size]);
        advance(&mut pos, &dims);
    }
    Ok(TensorValue::new(x.dtype, dims, out))
}

/// Trilu: the upper (`upper`) or lower triangle of the last two axes, relative to diagonal `k`; the rest is
/// zero (any element type).
pub(crate) fn trilu(x: &TensorValue, k: i64, upper: bool) -> R<TensorValue> {
    let r = x.dims.len();
    if r < 2 {
        return Err(format!("input must have rank >= 2, has dims {:?}", x.dims));
    }
    let (n, m) = (x.dims[r - 2], x.dims[r - 1]);
    let size = elem_size(x.dtype).unwrap_or(1);
    let mut out = vec![0u8; x.bytes.len()];
    for (e, chunk) in x.bytes.chunks_exact(size).enumerate() {
        let (i, j) = ((e / m.max(1)) % n.max(1), e % m.max(1));
        let d = i128::try_from(j).unwrap_or(i128::MAX) - i128::try_from(i).unwrap_or(i128::MAX);
        if (upper && d >= i128::from(k)) || (!upper && d <= i128::from(k)) {
            out[e * size..(e + 1) * size].copy_from_slice(chunk);
        }
    }
    Ok(TensorValue::new(x.dtype, x.dims.clone(), out))
}

/// The output dims of Tile: one non-negative repeat per axis.
pub(crate) fn tile_dims(dims: &[usize], repeats: &[i64]) -> R<Vec<usize>> {
    if repeats.len() != dims.len() {
        return Err(format!("repeats {repeats:?} has {} values for an input of rank {}", repeats.len(), dims.len()));
    }
    dims.iter()
        .zip(repeats)
        .map(|(&d, &k)| {
            usize::try_from(k)
                .ok()
                .and_then(|k| d.checked_mul(k))
                .ok_or_else(|| format!("repeat {k} of extent {d} is negative or overflows"))
        })
        .collect()
}

/// Cast to an integer or bool type (floats truncate toward zero, as ONNX Cast; NaN becomes 0).
pub(crate) fn cast_to_int(x: &TensorValue, to: i32) -> Option<TensorValue> {
    if !is_int_code(to) {
        return None;
    }
    let v: Vec<i64> = match x.to_i64s() {
        Some(v) => v,
        None => x
            .to_f64s()
            .into_iter()
            .map(|f| if to == data_type::BOOL { i64::from(f != 0.0) } else { f as i64 })
            .collect(),
    };
    Some(TensorValue::new(to, x.dims.clone(), pack_ints(to, &v)))
}

/// Range(start, limit, delta) over integers.
pub(crate) fn range(
    start: &TensorValue,
    limit: &TensorValue,
    delta: &TensorValue,
    max_bytes: usize,
) -> R<Option<TensorValue>> {
    let code = start.dtype;
    let (Some(s), Some(l), Some(d)) = (start.to_i64s(), limit.to_i64s(), delta.to_i64s()) else {
        return Ok(None);
    };
    let (&[s], &[l], &[d]) = (s.as_slice(), l.as_slice(), d.as_slice()) else {
        return Err("start, limit and delta must be scalars".to_string());
    };
    if d == 0 {
        return Err("delta must be non-zero".to_string());
    }
    let (s128, l128, d128) = (s as i128, l as i128, d as i128);
    let count = if d > 0 && l128 > s128 {
        (l128 - s128 + d128 - 1) / d128
    } else if d < 0 && s128 > l128 {
        (s128 - l128 - d128 - 1) / -d128
    } else {
        0
    };
    let count = usize::try_from(count).map_err(|_| "range count overflows".to_string())?;
    check_size(&[count], code, max_bytes)?;
    let v: Vec<i64> = (0..count as i64).map(|i| s.wrapping_add(i.wrapping_mul(d))).collect();
    Ok(Some(TensorValue::new(code, vec![count], pack_ints(code, &v))))
}

/// Range(start, limit, delta) over FLOAT or DOUBLE scalars: `max(ceil((limit - start) / delta), 0)` values
/// `start + i * delta`, computed in f64.
pub(crate) fn range_float(
    start: &TensorValue,
    limit: &TensorValue,
    delta: &TensorValue,
    max_bytes: usize,
) -> R<TensorValue> {
    let code = start.dtype;
    if !matches!(code, data_type::FLOAT | data_type::DOUBLE) || limit.dtype != code || delta.dtype != code {
        return Err(format!(
            "start, limit and delta must share an integer, FLOAT or DOUBLE type, got {}, {} and {}",
            data_type::name(code),
            data_type::name(limit.dtype),
            data_type::name(delta.dtype)
        ));
    }
    let (&[s], &[l], &[d]) = (start.to_f64s().as_slice(), limit.to_f64s().as_slice(), delta.to_f64s().as_slice())
    else {
        return Err("start, limit and delta must be scalars".to_string());
    };
    if d == 0.0 || !(s.is_finite() && l.is_finite() && d.is_finite()) {
        return Err(format!("start {s}, limit {l} and delta {d} must be finite with delta non-zero"));
    }
    let count = ((l - s) / d).ceil().max(0.0);
    if count >= max_bytes as f64 {
        return Err(format!("Range({s}, {l}, {d}) exceeds the folding limit of {max_bytes} bytes"));
    }
    let count = count as usize;
    check_size(&[count], code, max_bytes)?;
    let vals = (0..count).map(|i| s + i as f64 * d);
    let bytes: Vec<u8> = if code == data_type::FLOAT {
        vals.flat_map(|v| (v as f32).to_le_bytes()).collect()
    } else {
        vals.flat_map(f64::to_le_bytes).collect()
    };
    Ok(TensorValue::new(code, vec![count], bytes))
}

/// ConstantOfShape: `value` (one element, default float 0) repeated over `dims`.
pub(crate) fn constant_of_shape(dims: &[i64], value: Option<&TensorValue>, max_bytes: usize) -> R<TensorValue> {
    let dims: Vec<usize> = dims
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| format!("negative extent {d} in the shape")))
        .collect::<R<_>>()?;
    let (code, elem) = match value {
        Some(v) if v.numel() == 1 => (v.dtype, v.bytes.to_vec()),
        Some(v) => return Err(format!("value must have one element, has {}", v.numel())),
        None => (data_type::FLOAT, 0f32.to_le_bytes().to_vec()),
    };
    let n = check_size(&dims, code, max_bytes)?;
    Ok(TensorValue::new(code, dims, elem.repeat(n)))
}

/// An int64 value (Shape, Size, Constant ints).
pub(crate) fn i64_value(dims: Vec<usize>, v: &[i64]) -> TensorValue {
    TensorValue::new(data_type::INT64, dims, pack_ints(data_type::INT64, v))
}

/// The largest magnitude below which every integer converts to f32 exactly (2^24).
const F32_EXACT_INT: i64 = 1 << 24;

/// An f32 result of an operation IEEE 754 rounds correctly, over constants: `Cast` to f32 (of f32, or of integers
/// that f32 holds exactly), `Neg`, `Abs`, `Sqrt`, `Reciprocal`, and `Add`, `Sub`, `Mul`, `Div` with numpy
/// broadcasting. Computed in f32, as the kernels compute them, so the folded bits are the ones every backend
/// would produce. `None` for anything else (it stays in the graph).
pub(crate) fn float_exact(op: &Op, xs: &[&TensorValue], max_bytes: usize) -> R<Option<TensorValue>> {
    let f32s = |v: &TensorValue| -> Vec<f32> {
        v.bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
    };
    // Decoded values hold exactly their dims' bytes; anything else is left to the graph, never indexed past.
    if xs.iter().any(|x| x.dtype == data_type::FLOAT && x.bytes.len() != x.numel().saturating_mul(4)) {
        return Ok(None);
    }
    let pack = |dims: Vec<usize>, v: Vec<f32>| {
        TensorValue::new(data_type::FLOAT, dims, v.iter().flat_map(|x| x.to_le_bytes()).collect())
    };
    match (op, xs) {
        (Op::Cast { to: graph_ir::DType::F32 }, [x]) => {
            check_size(&x.dims, data_type::FLOAT, max_bytes)?;
            let vals: Vec<f32> = if x.dtype == data_type::FLOAT {
                f32s(x)
            } else {
                let Some(ints) = x.to_i64s() else { return Ok(None) };
                if ints.iter().any(|v| v.unsigned_abs() > F32_EXACT_INT as u64) {
                    return Ok(None);
                }
                ints.iter().map(|&v| v as f32).collect()
            };
            Ok(Some(pack(x.dims.clone(), vals)))
        }
        (Op::Neg | Op::Abs | Op::Sqrt | Op::Reciprocal, [x]) if x.dtype == data_type::FLOAT => {
            check_size(&x.dims, data_type::FLOAT, max_bytes)?;
            let f: fn(f32) -> f32 = match op {
                Op::Neg => |v| -v,
                Op::Abs => f32::abs,
                Op::Sqrt => f32::sqrt,
                _ => |v| 1.0 / v,
            };
            Ok(Some(pack(x.dims.clone(), f32s(x).into_iter().map(f).collect())))
        }
        (Op::Add | Op::Sub | Op::Mul | Op::Div, [a, b])
            if a.dtype == data_type::FLOAT && b.dtype == data_type::FLOAT =>
        {
            let dims = bcast_dims(&[&a.dims, &b.dims])?;
            check_size(&dims, data_type::FLOAT, max_bytes)?;
            let (ma, mb) = (broadcast_map(&dims, &a.dims), broadcast_map(&dims, &b.dims));
            let (va, vb) = (f32s(a), f32s(b));
            let f: fn(f32, f32) -> f32 = match op {
                Op::Add => |x, y| x + y,
                Op::Sub => |x, y| x - y,
                Op::Mul => |x, y| x * y,
                _ => |x, y| x / y,
            };
            Ok(Some(pack(dims, ma.iter().zip(&mb).map(|(&i, &j)| f(va[i], vb[j])).collect())))
        }
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: usize = 1 << 20;

    fn iv(dims: &[usize], v: &[i64]) -> TensorValue {
        i64_value(dims.to_vec(), v)
    }

    #[test]
    fn broadcast_map_matches_numpy() {
        assert_eq!(broadcast_map(&[2, 3], &[3]), vec![0, 1, 2, 0, 1, 2]);
        assert_eq!(broadcast_map(&[2, 3], &[2, 1]), vec![0, 0, 0, 1, 1, 1]);
        assert_eq!(broadcast_map(&[2, 2], &[]), vec![0; 4]);
        assert_eq!(broadcast_map(&[2, 2], &[2, 2]), vec![0, 1, 2, 3]);
    }

    #[test]
    fn shape_arithmetic_chain() {
        // Shape -> Gather(0) -> Unsqueeze -> Concat with [-1]: the classic Reshape target subgraph.
        let shape = iv(&[3], &[8, 16, 32]);
        let g = gather(0, &shape, &iv(&[], &[0]), MAX).unwrap();
        assert_eq!((g.dims.clone(), g.to_i64s().unwrap()), (vec![], vec![8]));
        let u = view(&Op::Unsqueeze { axes: vec![0] }, &g).unwrap();
        assert_eq!(u.dims, vec![1]);
        let c = concat(0, &[&u, &iv(&[1], &[-1])], MAX).unwrap();
        assert_eq!(c.to_i64s().unwrap(), vec![8, -1]);
    }

    #[test]
    fn gather_elements_and_slice() {
        let table = iv(&[1, 5], &[10, 11, 12, 13, 14]);
        let idx = iv(&[1, 3], &[4, 0, -1]);
        let g = gather_elements(1, &table, &idx, MAX).unwrap();
        assert_eq!((g.dims.clone(), g.to_i64s().unwrap()), (vec![1, 3], vec![14, 10, 14]));
        assert!(gather_elements(1, &table, &iv(&[1, 1], &[5]), MAX).is_err());
        let s = slice(
            &Op::Slice { starts: vec![-1], ends: vec![i64::MIN], axes: Some(vec![1]), steps: Some(vec![-2]) },
            &table,
            MAX,
        )
        .unwrap();
        assert_eq!(s.to_i64s().unwrap(), vec![14, 12, 10]);
    }

    #[test]
    fn binary_where_expand_cast_range() {
        let a = iv(&[2, 1], &[1, 2]);
        let b = iv(&[3], &[10, 20, 30]);
        let s = binary("Mul", &a, &b, MAX).unwrap().unwrap();
        assert_eq!((s.dims.clone(), s.to_i64s().unwrap()), (vec![2, 3], vec![10, 20, 30, 20, 40, 60]));
        assert!(binary("Div", &a, &iv(&[], &[0]), MAX).is_err());
        let eq = binary("Equal", &b, &iv(&[], &[20]), MAX).unwrap().unwrap();
        assert_eq!((eq.dtype, eq.bytes.to_vec()), (data_type::BOOL, vec![0, 1, 0]));
        let w = where_(&eq, &b, &iv(&[], &[-1]), MAX).unwrap();
        assert_eq!(w.to_i64s().unwrap(), vec![-1, 20, -1]);
        let e = expand(&[2, 3], &iv(&[3], &[1, 2, 3]), MAX).unwrap();
        assert_eq!(e.to_i64s().unwrap(), vec![1, 2, 3, 1, 2, 3]);
        let f = TensorValue::new(
            data_type::FLOAT,
            vec![3],
            [1.9f32, -1.9, 0.0].iter().flat_map(|v| v.to_le_bytes()).collect(),
        );
        assert_eq!(cast_to_int(&f, data_type::INT32).unwrap().to_i64s().unwrap(), vec![1, -1, 0]);
        assert_eq!(cast_to_int(&f, data_type::BOOL).unwrap().bytes.to_vec(), vec![1, 1, 0]);
        assert!(cast_to_int(&f, data_type::FLOAT).is_none());
        let r = range(&iv(&[], &[5]), &iv(&[], &[-1]), &iv(&[], &[-2]), MAX).unwrap().unwrap();
        assert_eq!(r.to_i64s().unwrap(), vec![5, 3, 1]);
        let r = range(&iv(&[], &[0]), &iv(&[], &[0]), &iv(&[], &[1]), MAX).unwrap().unwrap();
        assert_eq!(r.dims, vec![0]);
    }

    #[test]
    fn folding_refuses_huge_results() {
        assert!(constant_of_shape(&[1_000_000_000], None, MAX).is_err());
        assert!(constant_of_shape(&[1 << 40, 1 << 40], None, MAX).is_err());
        assert!(range(&iv(&[], &[0]), &iv(&[], &[i64::MAX]), &iv(&[], &[1]), MAX).is_err());
        assert!(expand(&[1_000_000, 1_000_000], &iv(&[1], &[1]), MAX).is_err());
        let c = constant_of_shape(&[2, 2], Some(&iv(&[1], &[7])), MAX).unwrap();
        assert_eq!(c.to_i64s().unwrap(), vec![7; 4]);
    }

    fn i32v(dims: &[usize], v: &[i64]) -> TensorValue {
        TensorValue::new(data_type::INT32, dims.to_vec(), pack_ints(data_type::INT32, v))
    }

    fn f32v(dims: &[usize], v: &[f32]) -> TensorValue {
        TensorValue::new(data_type::FLOAT, dims.to_vec(), v.iter().flat_map(|x| x.to_le_bytes()).collect())
    }

    fn vals(t: &TensorValue) -> (Vec<usize>, Vec<i64>) {
        (t.dims.clone(), t.to_i64s().unwrap())
    }

    #[test]
    fn integer_arithmetic_is_checked_in_the_element_type() {
        let bin = |op: &str, a: &TensorValue, b: &TensorValue| binary(op, a, b, MAX).map(|v| v.map(|t| vals(&t).1));
        assert_eq!(bin("Add", &iv(&[2], &[8, -3]), &iv(&[], &[5])), Ok(Some(vec![13, 2])));
        assert_eq!(bin("Sub", &iv(&[2], &[8, -3]), &iv(&[], &[5])), Ok(Some(vec![3, -8])));
        assert_eq!(bin("Div", &iv(&[4], &[7, -7, 7, -7]), &iv(&[4], &[2, 2, -2, -2])), Ok(Some(vec![3, -3, -3, 3])));
        // ONNX Mod with fmod=0 takes the divisor's sign (Python), with fmod=1 the dividend's (C).
        let (x, y) = (iv(&[4], &[7, -7, 7, -7]), iv(&[4], &[3, 3, -3, -3]));
        assert_eq!(bin("Mod", &x, &y), Ok(Some(vec![1, 2, -2, -1])));
        assert_eq!(bin("FMod", &x, &y), Ok(Some(vec![1, -1, 1, -1])));
        assert_eq!(bin("Max", &x, &y), Ok(Some(vec![7, 3, 7, -3])));
        assert_eq!(bin("Min", &x, &y), Ok(Some(vec![3, -7, -3, -7])));
        // Overflow of i64 and of a narrower type, division by zero, i64::MIN / -1: errors, never wraps.
        assert!(bin("Add", &iv(&[], &[i64::MAX]), &iv(&[], &[1])).unwrap_err().contains("overflows INT64"));
        assert!(bin("Mul", &iv(&[], &[i64::MIN]), &iv(&[], &[2])).is_err());
        assert!(bin("Div", &iv(&[], &[i64::MIN]), &iv(&[], &[-1])).is_err());
        assert!(bin("Mul", &i32v(&[], &[1 << 20]), &i32v(&[], &[1 << 12])).unwrap_err().contains("overflows INT32"));
        assert_eq!(bin("Mul", &i32v(&[], &[1 << 20]), &i32v(&[], &[1 << 10])), Ok(Some(vec![1 << 30])));
        for op in ["Div", "Mod", "FMod"] {
            assert!(bin(op, &iv(&[], &[5]), &iv(&[], &[0])).unwrap_err().contains("division by zero"), "{op}");
        }
        // Mismatched ranks that do not broadcast and mismatched dtypes are errors; float maths is not folded.
        assert!(bin("Add", &iv(&[2], &[1, 2]), &iv(&[3], &[1, 2, 3])).unwrap_err().contains("cannot broadcast"));
        assert!(bin("Add", &iv(&[1], &[1]), &i32v(&[1], &[1])).unwrap_err().contains("share a dtype"));
        assert_eq!(binary("Add", &f32v(&[1], &[1.0]), &f32v(&[1], &[2.0]), MAX), Ok(None));
        // Comparisons give bool; Xor of bools.
        let eq = binary("Equal", &iv(&[3], &[1, 2, 3]), &iv(&[1], &[2]), MAX).unwrap().unwrap();
        assert_eq!((eq.dtype, vals(&eq)), (data_type::BOOL, (vec![3], vec![0, 1, 0])));
        let t = TensorValue::new(data_type::BOOL, vec![2], vec![1, 0]);
        let x = binary("Xor", &t, &TensorValue::new(data_type::BOOL, vec![2], vec![1, 1]), MAX).unwrap().unwrap();
        assert_eq!(x.bytes.to_vec(), vec![0, 1]);
    }

    #[test]
    fn unary_ops_are_checked() {
        let neg = unary("Neg", &iv(&[3], &[1, -2, 0])).unwrap().unwrap();
        assert_eq!(vals(&neg), (vec![3], vec![-1, 2, 0]));
        assert!(unary("Neg", &iv(&[], &[i64::MIN])).unwrap_err().contains("overflows"));
        assert!(unary("Abs", &i32v(&[], &[i32::MIN.into()])).is_err());
        assert_eq!(vals(&unary("Sign", &iv(&[3], &[-5, 0, 9])).unwrap().unwrap()).1, vec![-1, 0, 1]);
        let not = unary("Not", &TensorValue::new(data_type::BOOL, vec![2], vec![1, 0])).unwrap().unwrap();
        assert_eq!((not.dtype, not.bytes.to_vec()), (data_type::BOOL, vec![0, 1]));
        assert_eq!(unary("Neg", &f32v(&[1], &[1.0])), Ok(None));
    }

    #[test]
    fn cumsum_position_ids() {
        let x = iv(&[4], &[1, 2, 3, 4]);
        let run = |excl, rev| vals(&cumsum(&x, 0, excl, rev).unwrap().unwrap()).1;
        assert_eq!(run(false, false), vec![1, 3, 6, 10]);
        assert_eq!(run(true, false), vec![0, 1, 3, 6]);
        assert_eq!(run(false, true), vec![10, 9, 7, 4]);
        assert_eq!(run(true, true), vec![9, 7, 4, 0]);
        // Along the last axis of a [2, 3] mask: the position ids of HF exports.
        let m = iv(&[2, 3], &[1, 1, 1, 0, 1, 1]);
        assert_eq!(vals(&cumsum(&m, -1, false, false).unwrap().unwrap()), (vec![2, 3], vec![1, 2, 3, 0, 1, 2]));
        assert_eq!(vals(&cumsum(&m, 0, false, false).unwrap().unwrap()).1, vec![1, 1, 1, 1, 2, 2]);
        assert!(cumsum(&m, 2, false, false).unwrap_err().contains("out of range"));
        assert!(cumsum(&iv(&[2], &[i64::MAX, 1]), 0, false, false).unwrap_err().contains("overflows"));
        assert_eq!(cumsum(&f32v(&[1], &[1.0]), 0, false, false), Ok(None));
    }

    #[test]
    fn tile_and_transpose() {
        let x = iv(&[1, 2], &[1, 2]);
        assert_eq!(vals(&tile(&x, &[2, 2], MAX).unwrap()), (vec![2, 4], vec![1, 2, 1, 2, 1, 2, 1, 2]));
        let y = iv(&[2, 1], &[5, 6]);
        assert_eq!(vals(&tile(&y, &[1, 3], MAX).unwrap()), (vec![2, 3], vec![5, 5, 5, 6, 6, 6]));
        assert_eq!(tile(&x, &[0, 1], MAX).unwrap().dims, vec![0, 2]);
        assert!(tile(&x, &[2], MAX).unwrap_err().contains("rank"));
        assert!(tile(&x, &[1, -1], MAX).unwrap_err().contains("negative"));
        assert!(tile(&x, &[1, i64::MAX], MAX).is_err());
        assert!(tile(&x, &[1 << 20, 1 << 20], MAX).unwrap_err().contains("folding limit"));
        let m = iv(&[2, 3], &[1, 2, 3, 4, 5, 6]);
        let t = transpose(&Op::Transpose { perm: None }, &m, MAX).unwrap();
        assert_eq!(vals(&t), (vec![3, 2], vec![1, 4, 2, 5, 3, 6]));
        let c = iv(&[2, 1, 2], &[1, 2, 3, 4]);
        let t = transpose(&Op::Transpose { perm: Some(vec![1, 2, 0]) }, &c, MAX).unwrap();
        assert_eq!(vals(&t), (vec![1, 2, 2], vec![1, 3, 2, 4]));
        assert!(transpose(&Op::Transpose { perm: Some(vec![0, 0, 1]) }, &c, MAX).is_err());
    }

    #[test]
    fn float_range_and_constant_of_shape() {
        let r = range_float(&f32v(&[], &[0.0]), &f32v(&[], &[1.0]), &f32v(&[], &[0.25]), MAX).unwrap();
        assert_eq!((r.dims.clone(), r.to_f64s()), (vec![4], vec![0.0, 0.25, 0.5, 0.75]));
        let r = range_float(&f32v(&[], &[3.0]), &f32v(&[], &[0.0]), &f32v(&[], &[-1.5]), MAX).unwrap();
        assert_eq!(r.to_f64s(), vec![3.0, 1.5]);
        let empty = range_float(&f32v(&[], &[1.0]), &f32v(&[], &[0.0]), &f32v(&[], &[1.0]), MAX).unwrap();
        assert_eq!(empty.dims, vec![0]);
        assert!(range_float(&f32v(&[], &[0.0]), &f32v(&[], &[1.0]), &f32v(&[], &[0.0]), MAX).is_err());
        assert!(range_float(&f32v(&[], &[0.0]), &f32v(&[], &[f32::NAN]), &f32v(&[], &[1.0]), MAX).is_err());
        assert!(range_float(&f32v(&[], &[0.0]), &f32v(&[], &[1e30]), &f32v(&[], &[1e-30]), MAX).is_err());
        assert!(range_float(&f32v(&[], &[-3e38]), &f32v(&[], &[3e38]), &f32v(&[], &[1.0]), MAX).is_err());
        assert!(range_float(&f32v(&[], &[0.0]), &iv(&[], &[1]), &f32v(&[], &[1.0]), MAX).is_err());
        assert!(range_float(&f32v(&[2], &[0.0, 1.0]), &f32v(&[], &[1.0]), &f32v(&[], &[1.0]), MAX).is_err());
        // Integer Range: the position ids of a dynamic export, and its hostile forms.
        let r = range(&iv(&[], &[0]), &iv(&[], &[128]), &iv(&[], &[1]), MAX).unwrap().unwrap();
        assert_eq!((r.dims.clone(), r.to_i64s().unwrap()[127]), (vec![128], 127));
        assert!(range(&iv(&[], &[0]), &iv(&[], &[5]), &iv(&[], &[0]), MAX).is_err());
        assert!(range(&iv(&[1], &[0]), &iv(&[2], &[5, 6]), &iv(&[], &[1]), MAX).is_err());
        assert!(range(&iv(&[], &[i64::MIN]), &iv(&[], &[i64::MAX]), &iv(&[], &[1]), MAX).is_err());
        assert!(constant_of_shape(&[2, -1], None, MAX).unwrap_err().contains("negative"));
        let z = constant_of_shape(&[2, 0], None, MAX).unwrap();
        assert_eq!((z.dtype, z.dims.clone(), z.bytes.len()), (data_type::FLOAT, vec![2, 0], 0));
        assert!(constant_of_shape(&[1], Some(&iv(&[2], &[1, 2])), MAX).is_err());
    }

    #[test]
    fn shape_tensor_ops_and_their_hostile_forms() {
        // A 4-way Concat of shape pieces (bert's expanded attention mask target).
        let parts = [iv(&[1], &[8]), iv(&[1], &[1]), iv(&[1], &[128]), iv(&[1], &[128])];
        let refs: Vec<&TensorValue> = parts.iter().collect();
        assert_eq!(vals(&concat(0, &refs, MAX).unwrap()), (vec![4], vec![8, 1, 128, 128]));
        assert!(concat(0, &[&iv(&[1], &[8]), &iv(&[1, 1], &[1])], MAX).is_err());
        assert!(concat(3, &[&iv(&[1], &[8]), &iv(&[1], &[1])], MAX).is_err());
        let shape = iv(&[4], &[8, 3, 224, 224]);
        assert_eq!(vals(&gather(0, &shape, &iv(&[2], &[-1, 0]), MAX).unwrap()).1, vec![224, 8]);
        assert!(gather(0, &shape, &iv(&[], &[4]), MAX).unwrap_err().contains("out of range"));
        assert!(gather(0, &shape, &iv(&[], &[i64::MIN]), MAX).is_err());
        assert!(gather(1, &shape, &iv(&[], &[0]), MAX).is_err());
        // Slice to the end with the exporters' i64::MAX sentinel, and from the back.
        let op = Op::Slice { starts: vec![1], ends: vec![i64::MAX], axes: None, steps: None };
        assert_eq!(vals(&slice(&op, &shape, MAX).unwrap()).1, vec![3, 224, 224]);
        let op = Op::Slice { starts: vec![-2], ends: vec![i64::MAX], axes: Some(vec![0]), steps: Some(vec![1]) };
        assert_eq!(vals(&slice(&op, &shape, MAX).unwrap()).1, vec![224, 224]);
        let op = Op::Slice { starts: vec![0], ends: vec![1], axes: Some(vec![1]), steps: None };
        assert!(slice(&op, &shape, MAX).is_err());
        let op = Op::Slice { starts: vec![0], ends: vec![1], axes: None, steps: Some(vec![0]) };
        assert!(slice(&op, &shape, MAX).is_err());
        // Unsqueeze/Squeeze views; a Reshape target whose product disagrees is an error.
        let u = view(&Op::Unsqueeze { axes: vec![0, -1] }, &iv(&[], &[5])).unwrap();
        assert_eq!(vals(&u), (vec![1, 1], vec![5]));
        assert_eq!(view(&Op::Squeeze { axes: None }, &u).unwrap().dims, Vec::<usize>::new());
        assert!(view(&Op::Squeeze { axes: Some(vec![0]) }, &iv(&[2], &[1, 2])).is_err());
        assert!(view(&Op::Reshape { shape: vec![3], allowzero: false }, &iv(&[2], &[1, 2])).is_err());
        // Expand to a negative or incompatible target.
        assert!(expand(&[-2, 3], &iv(&[3], &[1, 2, 3]), MAX).is_err());
        assert!(expand(&[2, 4], &iv(&[3], &[1, 2, 3]), MAX).is_err());
        // Where over shape tensors (the -1 placeholders of a Reshape target), Cast between int widths.
        let w = where_(
            &TensorValue::new(data_type::BOOL, vec![3], vec![1, 0, 1]),
            &iv(&[3], &[8, 12, 64]),
            &iv(&[], &[-1]),
            MAX,
        )
        .unwrap();
        assert_eq!(vals(&w).1, vec![8, -1, 64]);
        assert!(where_(
            &TensorValue::new(data_type::BOOL, vec![2], vec![1, 0]),
            &iv(&[3], &[1, 2, 3]),
            &iv(&[], &[0]),
            MAX
        )
        .is_err());
        assert!(where_(&TensorValue::new(data_type::BOOL, vec![1], vec![1]), &iv(&[1], &[1]), &i32v(&[1], &[0]), MAX)
            .is_err());
        let c = cast_to_int(&iv(&[2], &[3, -1]), data_type::INT32).unwrap();
        assert_eq!((c.dtype, vals(&c).1), (data_type::INT32, vec![3, -1]));
    }

    #[test]
    fn trilu_causal_masks() {
        let ones = iv(&[3, 3], &[1; 9]);
        assert_eq!(vals(&trilu(&ones, 0, false).unwrap()).1, vec![1, 0, 0, 1, 1, 0, 1, 1, 1]);
        assert_eq!(vals(&trilu(&ones, 1, true).unwrap()).1, vec![0, 1, 1, 0, 0, 1, 0, 0, 0]);
        assert_eq!(vals(&trilu(&ones, -1, true).unwrap()).1, vec![1, 1, 1, 1, 1, 1, 0, 1, 1]);
        assert_eq!(vals(&trilu(&ones, i64::MIN, false).unwrap()).1, vec![0; 9]);
        assert_eq!(vals(&trilu(&ones, i64::MAX, false).unwrap()).1, vec![1; 9]);
        // Batched [2, 1, 2] and a non-square [2, 3].
        let b = iv(&[2, 1, 2], &[5, 6, 7, 8]);
        assert_eq!(vals(&trilu(&b, 0, true).unwrap()).1, vec![5, 6, 7, 8]);
        let w = f32v(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        assert_eq!(trilu(&w, 0, true).unwrap().to_f64s(), vec![1.0, 2.0, 3.0, 0.0, 5.0, 6.0]);
        assert!(trilu(&iv(&[3], &[1, 2, 3]), 0, true).unwrap_err().contains("rank"));
        assert_eq!(trilu(&iv(&[0, 4], &[]), 0, true).unwrap().dims, vec![0, 4]);
    }
}
