//! Kernel-local values: a dtype, a shape and the elements in one of three computation types.
//!
//! Floats (f32, f16, bf16) compute in f32 and are rounded to their dtype whenever a value is made, so an
//! instruction gives the same bits whether its result stays in kernel scratch (fused) or goes through memory
//! (unfused). Integers compute in i64 and wrap to their width the same way; bools are bytes 0/1.

use graph_plan::DType;
use std::sync::Arc;

/// The elements of a value. `Arc` so that views share them.
#[derive(Clone, Debug)]
pub(crate) enum Data {
    /// f32, f16, bf16 (rounded to the dtype).
    F(Arc<Vec<f32>>),
    /// i64, i32, i8, u8 (wrapped to the dtype).
    I(Arc<Vec<i64>>),
    /// bool as 0/1.
    B(Arc<Vec<u8>>),
}

/// A value of a kernel program.
#[derive(Clone, Debug)]
pub(crate) struct Val {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub data: Data,
}

/// An op-level failure; the caller adds the kernel and node.
pub(crate) type OpResult<T> = Result<T, String>;

/// Round an f32 to the precision of a float dtype.
#[inline]
pub(crate) fn round_float(dtype: DType, v: f32) -> f32 {
    match dtype {
        DType::F16 => half::f16::from_f32(v).to_f32(),
        DType::BF16 => half::bf16::from_f32(v).to_f32(),
        _ => v,
    }
}

/// Wrap an i64 to the range of an integer dtype (two's complement, as Rust `as`).
#[inline]
pub(crate) fn wrap_int(dtype: DType, v: i64) -> i64 {
    match dtype {
        DType::I32 => v as i32 as i64,
        DType::I8 => v as i8 as i64,
        DType::U8 => v as u8 as i64,
        _ => v,
    }
}

pub(crate) fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

impl Val {
    /// A float value; rounds to `dtype`.
    pub fn from_f(dtype: DType, shape: Vec<usize>, mut v: Vec<f32>) -> Val {
        if matches!(dtype, DType::F16 | DType::BF16) {
            for x in &mut v {
                *x = round_float(dtype, *x);
            }
        }
        Val { dtype, shape, data: Data::F(Arc::new(v)) }
    }

    /// An integer value; wraps to `dtype`.
    pub fn from_i(dtype: DType, shape: Vec<usize>, mut v: Vec<i64>) -> Val {
        if dtype != DType::I64 {
            for x in &mut v {
                *x = wrap_int(dtype, *x);
            }
        }
        Val { dtype, shape, data: Data::I(Arc::new(v)) }
    }

    /// A bool value (any non-zero byte is true).
    pub fn from_b(shape: Vec<usize>, mut v: Vec<u8>) -> Val {
        for x in &mut v {
            *x = u8::from(*x != 0);
        }
        Val { dtype: DType::Bool, shape, data: Data::B(Arc::new(v)) }
    }

    /// Same elements, another shape of the same element count (a view).
    pub fn reshaped(&self, shape: Vec<usize>) -> OpResult<Val> {
        if numel(&shape) != self.len() {
            return Err(format!("cannot view {:?} ({} elements) as {:?}", self.shape, self.len(), shape));
        }
        Ok(Val { dtype: self.dtype, shape, data: self.data.clone() })
    }

    pub fn len(&self) -> usize {
        match &self.data {
            Data::F(v) => v.len(),
            Data::I(v) => v.len(),
            Data::B(v) => v.len(),
        }
    }

    pub fn f(&self) -> OpResult<&[f32]> {
        match &self.data {
            Data::F(v) => Ok(v),
            _ => Err(format!("expected a floating-point operand, got {}", self.dtype)),
        }
    }

    pub fn b(&self) -> OpResult<&[u8]> {
        match &self.data {
            Data::B(v) => Ok(v),
            _ => Err(format!("expected a bool operand, got {}", self.dtype)),
        }
    }

    /// Integer elements (bools read as 0/1).
    pub fn ints(&self) -> OpResult<Vec<i64>> {
        match &self.data {
            Data::I(v) => Ok(v.to_vec()),
            Data::B(v) => Ok(v.iter().map(|&x| x as i64).collect()),
            Data::F(_) => Err(format!("expected an integer operand, got {}", self.dtype)),
        }
    }

    /// Elements as f64 (for casts and messages).
    pub fn to_f64(&self) -> Vec<f64> {
        match &self.data {
            Data::F(v) => v.iter().map(|&x| x as f64).collect(),
            Data::I(v) => v.iter().map(|&x| x as f64).collect(),
            Data::B(v) => v.iter().map(|&x| x as f64).collect(),
        }
    }

    /// Decode little-endian bytes of `dtype`.
    pub fn load(dtype: DType, shape: Vec<usize>, bytes: &[u8]) -> OpResult<Val> {
        let n = numel(&shape);
        let w = dtype.size_bytes();
        if bytes.len() != n * w {
            return Err(format!("{} bytes for a {dtype} value of shape {shape:?} ({} bytes)", bytes.len(), n * w));
        }
        let val = match dtype {
            DType::F32 => Val::from_f(
                dtype,
                shape,
                bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
            ),
            DType::F16 => Val::from_f(
                dtype,
                shape,
                bytes.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
            ),
            DType::BF16 => Val::from_f(
                dtype,
                shape,
                bytes.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
            ),
            DType::I64 => Val::from_i(
                dtype,
                shape,
                bytes
                    .chunks_exact(8)
                    .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                    .collect(),
            ),
            DType::I32 => Val::from_i(
                dtype,
                shape,
                bytes.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64).collect(),
            ),
            DType::I8 => Val::from_i(dtype, shape, bytes.iter().map(|&b| b as i8 as i64).collect()),
            DType::U8 => Val::from_i(dtype, shape, bytes.iter().map(|&b| b as i64).collect()),
            DType::Bool => Val::from_b(shape, bytes.to_vec()),
        };
        Ok(val)
    }

    /// Encode into `out` (exactly the value's byte size).
    pub fn store(&self, out: &mut [u8]) -> OpResult<()> {
        let w = self.dtype.size_bytes();
        if out.len() != self.len() * w {
            return Err(format!(
                "a {} value of shape {:?} needs {} bytes, its buffer has {}",
                self.dtype,
                self.shape,
                self.len() * w,
                out.len()
            ));
        }
        match (&self.data, self.dtype) {
            (Data::F(v), DType::F32) => {
                for (c, x) in out.chunks_exact_mut(4).zip(v.iter()) {
                    c.copy_from_slice(&x.to_le_bytes());
                }
            }
            (Data::F(v), DType::F16) => {
                for (c, x) in out.chunks_exact_mut(2).zip(v.iter()) {
                    c.copy_from_slice(&half::f16::from_f32(*x).to_le_bytes());
                }
            }
            (Data::F(v), DType::BF16) => {
                for (c, x) in out.chunks_exact_mut(2).zip(v.iter()) {
                    c.copy_from_slice(&half::bf16::from_f32(*x).to_le_bytes());
                }
            }
            (Data::I(v), DType::I64) => {
                for (c, x) in out.chunks_exact_mut(8).zip(v.iter()) {
                    c.copy_from_slice(&x.to_le_bytes());
                }
            }
            (Data::I(v), DType::I32) => {
                for (c, x) in out.chunks_exact_mut(4).zip(v.iter()) {
                    c.copy_from_slice(&(*x as i32).to_le_bytes());
                }
            }
            (Data::I(v), DType::I8 | DType::U8) => {
                for (c, x) in out.iter_mut().zip(v.iter()) {
                    *c = *x as u8;
                }
            }
            (Data::B(v), DType::Bool) => out.copy_from_slice(v),
            (_, d) => return Err(format!("value of dtype {d} holds elements of another kind")),
        }
        Ok(())
    }
}

/// Row-major strides of `shape`.
pub(crate) fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// Strides of `input` seen from an output of shape `out` under numpy broadcasting (0 on broadcast axes).
pub(crate) fn broadcast_strides(input: &[usize], out: &[usize]) -> OpResult<Vec<usize>> {
    if input.len() > out.len() {
        return Err(format!("cannot broadcast {input:?} to {out:?}"));
    }
    let lead = out.len() - input.len();
    let st = strides(input);
    let mut r = vec![0usize; out.len()];
    for (i, &d) in input.iter().enumerate() {
        if d == out[lead + i] {
            r[lead + i] = if d == 1 { 0 } else { st[i] };
        } else if d != 1 {
            return Err(format!("cannot broadcast {input:?} to {out:?}"));
        }
    }
    Ok(r)
}

/// Numpy broadcast of two shapes.
pub(crate) fn broadcast_shape(a: &[usize], b: &[usize]) -> OpResult<Vec<usize>> {
    let r = a.len().max(b.len());
    let mut out = vec![0; r];
    for (i, o) in out.iter_mut().enumerate() {
        let da = if i + a.len() >= r { a[i + a.len() - r] } else { 1 };
        let db = if i + b.len() >= r { b[i + b.len() - r] } else { 1 };
        *o = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return Err(format!("cannot broadcast {a:?} with {b:?}")),
        };
    }
    Ok(out)
}

/// Visit the flat indices of an output of shape `out` in row-major order, giving for each the flat offset into
/// an input laid out with `st` (strides aligned to `out`, 0 on broadcast axes).
pub(crate) fn strided_offsets(out: &[usize], st: &[usize]) -> Vec<usize> {
    let n = numel(out);
    let mut offs = Vec::with_capacity(n);
    if n == 0 {
        return offs;
    }
    let r = out.len();
    if r == 0 {
        offs.push(0);
        return offs;
    }
    let last = out[r - 1];
    let ls = st[r - 1];
    let mut idx = vec![0usize; r];
    let mut base = 0usize;
    loop {
        for j in 0..last {
            offs.push(base + j * ls);
        }
        // odometer over the axes before the last
        let mut k = r - 1;
        loop {
            if k == 0 {
                return offs;
            }
            k -= 1;
            idx[k] += 1;
            base += st[k];
            if idx[k] < out[k] {
                break;
            }
            base -= st[k] * idx[k];
            idx[k] = 0;
        }
    }
}

/// The elements of `src` (shape `input`) broadcast to `out`, borrowing when no broadcast is needed.
pub(crate) fn expand<'a, T: Copy>(src: &'a [T], input: &[usize], out: &[usize]) -> OpResult<std::borrow::Cow<'a, [T]>> {
    if input == out {
        return Ok(std::borrow::Cow::Borrowed(src));
    }
    let st = broadcast_strides(input, out)?;
    if src.len() == 1 {
        return Ok(std::borrow::Cow::Owned(vec![src[0]; numel(out)]));
    }
    Ok(std::borrow::Cow::Owned(strided_offsets(out, &st).into_iter().map(|o| src[o]).collect()))
}
