//! The executor contract (DESIGN.md section 6): prepare once for a plan, then run many times on named host
//! tensors. Both backends (exec-sim, exec-cuda) implement it, so callers are generic over them.

use graph_ir::rng::SplitMix64;
use graph_ir::{DType, Shape};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use thiserror::Error;

use crate::plan::{Binding, BindingRole, ExecutionPlan};
use std::borrow::Cow;

/// A tensor in host memory: dtype, shape and little-endian bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostTensor {
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Shape,
    /// Row-major little-endian element bytes.
    pub data: Vec<u8>,
}

impl HostTensor {
    /// A tensor from f32 values.
    pub fn from_f32(shape: impl Into<Shape>, values: &[f32]) -> Self {
        HostTensor {
            dtype: DType::F32,
            shape: shape.into(),
            data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }

    /// A zero-filled tensor.
    pub fn zeros(dtype: DType, shape: impl Into<Shape>) -> Self {
        let shape = shape.into();
        let n = shape.byte_size(dtype).unwrap_or(0);
        HostTensor { dtype, shape, data: vec![0; n] }
    }

    /// The values as f32 (`None` unless the dtype is f32).
    pub fn to_f32(&self) -> Option<Vec<f32>> {
        (self.dtype == DType::F32)
            .then(|| self.data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
    }

    /// The values converted to f64, whatever the dtype (for comparisons and reports).
    pub fn to_f64(&self) -> Vec<f64> {
        let w = self.dtype.size_bytes();
        self.data
            .chunks_exact(w)
            .map(|c| match self.dtype {
                DType::F32 => f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64,
                DType::F16 => f16_to_f32(u16::from_le_bytes([c[0], c[1]])) as f64,
                DType::BF16 => f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16) as f64,
                DType::I64 => i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]) as f64,
                DType::I32 => i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64,
                DType::I8 => c[0] as i8 as f64,
                DType::U8 | DType::Bool => c[0] as f64,
            })
            .collect()
    }

    /// Deterministic pseudo-random values for a tensor named `name`: floats uniform in [-1, 1) (or [0.5, 1.5)
    /// when `positive`), integers in [0, 2), bools 0/1. The same (name, seed) always gives the same bytes.
    pub fn seeded(dtype: DType, shape: &Shape, name: &str, seed: u64, positive: bool) -> Self {
        let n = shape.numel().unwrap_or(0);
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in name.bytes() {
            h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
        }
        let mut rng = SplitMix64::new(h ^ seed.rotate_left(17));
        let mut data = Vec::with_capacity(n * dtype.size_bytes());
        for _ in 0..n {
            let u = rng.unit_f64() as f32;
            let f = if positive { 0.5 + u } else { 2.0 * u - 1.0 };
            match dtype {
                DType::F32 => data.extend_from_slice(&f.to_le_bytes()),
                DType::F16 => data.extend_from_slice(&f32_to_f16(f).to_le_bytes()),
                DType::BF16 => data.extend_from_slice(&((f.to_bits() >> 16) as u16).to_le_bytes()),
                DType::I64 => data.extend_from_slice(&(rng.below(2) as i64).to_le_bytes()),
                DType::I32 => data.extend_from_slice(&(rng.below(2) as i32).to_le_bytes()),
                DType::I8 | DType::U8 | DType::Bool => data.push(rng.below(2) as u8),
            }
        }
        HostTensor { dtype, shape: shape.clone(), data }
    }
}

/// IEEE half to f32 (exact).
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h >> 15) as u32) << 31;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    let bits = match (exp, man) {
        (0, 0) => sign,
        (0, m) => {
            // subnormal: normalise
            let mut e = 127 - 15 + 1;
            let mut m = m;
            while m & 0x400 == 0 {
                m <<= 1;
                e -= 1;
            }
            sign | (e << 23) | ((m & 0x3ff) << 13)
        }
        (0x1f, 0) => sign | 0x7f80_0000,
        (0x1f, m) => sign | 0x7fc0_0000 | (m << 13),
        (e, m) => sign | ((e + 127 - 15) << 23) | (m << 13),
    };
    f32::from_bits(bits)
}

/// f32 to IEEE half, round to nearest even.
pub fn f32_to_f16(f: f32) -> u16 {
    let x = f.to_bits();
    let sign = ((x >> 16) & 0x8000) as u16;
    let exp = ((x >> 23) & 0xff) as i32;
    let man = x & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if man != 0 { 0x200 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        let m = man | 0x80_0000;
        let shift = (14 - e) as u32;
        let half = 1u32 << (shift - 1);
        let rest = m & ((1 << shift) - 1);
        let mut r = m >> shift;
        if rest > half || (rest == half && r & 1 == 1) {
            r += 1;
        }
        return sign | r as u16;
    }
    let mut r = ((e as u32) << 10) | (man >> 13);
    let rest = man & 0x1fff;
    if rest > 0x1000 || (rest == 0x1000 && r & 1 == 1) {
        r += 1;
    }
    sign | r as u16
}

/// Named host tensors (inputs, weights or outputs), sorted by name.
pub type TensorMap = BTreeMap<String, HostTensor>;

/// Errors any executor reports about the caller's tensors or the plan.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum ExecError {
    /// A graph input (or weight) was not supplied.
    #[error("missing {role} '{name}'")]
    Missing {
        /// "input" or "weight".
        role: &'static str,
        /// Its name.
        name: String,
    },
    /// A supplied tensor has the wrong dtype or shape.
    #[error("{role} '{name}': expected {expected}, got {got}")]
    Mismatch {
        /// "input" or "weight".
        role: &'static str,
        /// Its name.
        name: String,
        /// Expected dtype and shape.
        expected: String,
        /// What was supplied.
        got: String,
    },
    /// The backend cannot run part of the plan.
    #[error("kernel {kernel}: unsupported: {what}")]
    Unsupported {
        /// The kernel.
        kernel: String,
        /// What is unsupported.
        what: String,
    },
    /// A run-time failure on the backend (out-of-range index, device error...).
    #[error("{backend}: {message}")]
    Backend {
        /// Backend name.
        backend: &'static str,
        /// What happened.
        message: String,
    },
}

/// Why a backend cannot run here (no driver, no device...), said instead of panicking.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{backend} unavailable: {reason}")]
pub struct Unavailable {
    /// Backend name.
    pub backend: &'static str,
    /// Why.
    pub reason: String,
}

/// A backend that runs plans.
pub trait Executor {
    /// The state of a prepared plan (regions allocated, kernels compiled, streams created).
    type Prepared: PreparedPlan;

    /// The backend's name (`sim`, `cuda`).
    fn name(&self) -> &'static str;

    /// A cheap check that the backend can run here.
    fn availability(&self) -> Result<(), Unavailable>;

    /// Prepare a plan once: allocate regions, upload weights, compile kernels, capture.
    fn prepare(&self, plan: &ExecutionPlan, weights: &TensorMap) -> Result<Self::Prepared, ExecError>;
}

/// A prepared plan: run it many times.
pub trait PreparedPlan {
    /// Run on the given inputs; returns every graph output by name.
    fn run(&mut self, inputs: &TensorMap) -> Result<TensorMap, ExecError>;
}

/// True when a weight stored as `binding` is made from an f32 tensor at prepare (a half-precision plan of an
/// f32 model: its weights are supplied as the model has them and converted once).
fn converts_at_prepare(b: &Binding, t: &HostTensor) -> bool {
    b.role == BindingRole::Weight
        && matches!(b.dtype, DType::F16 | DType::BF16)
        && t.dtype == DType::F32
        && t.shape == b.shape
        && t.data.len() as u64 == 2 * b.buffer.bytes
}

/// The bytes a weight binding holds, made from the tensor supplied for it: the tensor's own bytes when the
/// dtypes agree; for a half binding supplied in f32, converted here, once per prepare (round to nearest even,
/// the numeric rule of `graph_passes::precision`). Both executors call this at prepare.
pub fn weight_bytes<'a>(b: &Binding, t: &'a HostTensor) -> Cow<'a, [u8]> {
    if converts_at_prepare(b, t) {
        Cow::Owned(graph_passes::precision::convert_f32_bytes(&t.data, b.dtype))
    } else {
        Cow::Borrowed(t.data.as_slice())
    }
}

/// Little-endian f32 bytes as f16 or bf16 bytes, rounded to nearest even (the numeric rule of
/// `graph_passes::precision`; other dtypes: the bytes unchanged).
pub fn f32_to_half_bytes(bytes: &[u8], to: DType) -> Vec<u8> {
    graph_passes::precision::convert_f32_bytes(bytes, to)
}

/// Check that `map` supplies every binding of `role` with the right dtype and shape (a half weight may come in
/// f32: [`weight_bytes`] converts it).
pub fn check_tensors(plan: &ExecutionPlan, map: &TensorMap, role: BindingRole) -> Result<(), ExecError> {
    let label = if role == BindingRole::Input { "input" } else { "weight" };
    for b in plan.bindings().iter().filter(|b| b.role == role) {
        let t = map.get(&*b.name).ok_or_else(|| ExecError::Missing { role: label, name: b.name.to_string() })?;
        if converts_at_prepare(b, t) {
            continue;
        }
        if t.dtype != b.dtype || t.shape != b.shape || t.data.len() as u64 != b.buffer.bytes {
            return Err(ExecError::Mismatch {
                role: label,
                name: b.name.to_string(),
                expected: format!("{} {}", b.dtype, b.shape),
                got: format!("{} {} ({} bytes)", t.dtype, t.shape, t.data.len()),
            });
        }
    }
    Ok(())
}

/// Fill every binding of `role` that `map` lacks with seeded values (BatchNormalization variances and other
/// tensors named in `positive` get positive values, so that models without weights still compute finite results).
pub fn fill_missing(plan: &ExecutionPlan, map: &mut TensorMap, role: BindingRole, seed: u64, positive: &[String]) {
    for b in plan.bindings().iter().filter(|b| b.role == role) {
        if !map.contains_key(&*b.name) {
            let pos = positive.iter().any(|p| **p == *b.name);
            map.insert(b.name.to_string(), HostTensor::seeded(b.dtype, &b.shape, &b.name, seed, pos));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_conversions_round_trip() {
        for h in [0u16, 0x3c00, 0xc000, 0x7bff, 0x0001, 0x03ff, 0x7c00, 0xfc00] {
            assert_eq!(f32_to_f16(f16_to_f32(h)), h, "{h:#x}");
        }
        assert_eq!(f32_to_f16(1.0), 0x3c00);
        assert_eq!(f32_to_f16(65520.0), 0x7c00); // rounds to infinity
        assert_eq!(f16_to_f32(0x3555), 0.333_251_95);
    }

    #[test]
    fn seeded_values_are_deterministic() {
        let s = Shape::new([4, 4]);
        let a = HostTensor::seeded(DType::F32, &s, "w", 1, false);
        assert_eq!(a, HostTensor::seeded(DType::F32, &s, "w", 1, false));
        assert_ne!(a, HostTensor::seeded(DType::F32, &s, "w", 2, false));
        assert_ne!(a, HostTensor::seeded(DType::F32, &s, "v", 1, false));
        let p = HostTensor::seeded(DType::F32, &s, "var", 1, true);
        assert!(p.to_f32().unwrap().iter().all(|&v| (0.5..1.5).contains(&v)));
    }
}
