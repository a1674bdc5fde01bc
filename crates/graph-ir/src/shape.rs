//! Static tensor shapes with checked size arithmetic.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::Arc;

use crate::DType;

/// Largest rank a shape may have. Real models stay far below; the limit keeps hostile inputs (a 10^6-rank
/// shape) from costing memory or time quadratic in the rank.
pub const MAX_RANK: usize = 64;

/// A static shape: one extent per axis. Rank 0 is a scalar (one element). Zero extents are allowed
/// (an empty tensor), as in ONNX. The extents are shared and immutable: a clone (every value and binding of a
/// plan names its tensor's shape) takes a reference, not a copy; a new shape is built from a `Vec` and converted.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Shape(pub Arc<[usize]>);

impl Shape {
    /// A shape from its extents.
    pub fn new(dims: impl Into<Vec<usize>>) -> Self {
        Shape(dims.into().into())
    }

    /// The rank-0 shape.
    pub fn scalar() -> Self {
        Shape(Arc::new([]))
    }

    /// Number of axes.
    pub fn rank(&self) -> usize {
        self.0.len()
    }

    /// The extents.
    pub fn dims(&self) -> &[usize] {
        &self.0
    }

    /// Number of elements, or `None` when the product overflows `usize`.
    pub fn numel(&self) -> Option<usize> {
        self.0.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
    }

    /// Bytes the tensor occupies with `dtype`, or `None` on overflow.
    pub fn byte_size(&self, dtype: DType) -> Option<usize> {
        self.numel()?.checked_mul(dtype.size_bytes())
    }

    /// Row-major (C order) strides in elements; saturating, only meaningful when `numel` is `Some`.
    pub fn strides(&self) -> Vec<usize> {
        let mut strides = vec![1usize; self.0.len()];
        for i in (0..self.0.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1].saturating_mul(self.0[i + 1]);
        }
        strides
    }
}

impl From<Vec<usize>> for Shape {
    fn from(v: Vec<usize>) -> Self {
        Shape(v.into())
    }
}

impl From<Arc<[usize]>> for Shape {
    fn from(v: Arc<[usize]>) -> Self {
        Shape(v)
    }
}

impl From<&[usize]> for Shape {
    fn from(v: &[usize]) -> Self {
        Shape(v.into())
    }
}

impl<const N: usize> From<[usize; N]> for Shape {
    fn from(v: [usize; N]) -> Self {
        Shape(Arc::new(v))
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

/// Numpy multidirectional broadcasting of two shapes; `None` when they are incompatible.
pub fn broadcast(a: &Shape, b: &Shape) -> Option<Shape> {
    let rank = a.rank().max(b.rank());
    let mut out = vec![0usize; rank];
    for (i, slot) in out.iter_mut().enumerate() {
        let da = dim_from_right(a, rank - 1 - i);
        let db = dim_from_right(b, rank - 1 - i);
        *slot = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return None,
        };
    }
    Some(Shape::from(out))
}

/// The extent `k` axes from the right, 1 beyond the rank (numpy's implicit leading ones).
fn dim_from_right(s: &Shape, k: usize) -> usize {
    if k < s.rank() {
        s.0[s.rank() - 1 - k]
    } else {
        1
    }
}

/// True when `from` broadcasts to exactly `to` (unidirectional, as ONNX Gemm's C or Expand's check).
pub fn broadcasts_to(from: &Shape, to: &Shape) -> bool {
    broadcast(from, to).as_ref() == Some(to)
}

/// Normalise a possibly negative axis against `rank` (ONNX style: `-1` is the last axis). `None` when out of
/// range.
pub fn normalize_axis(axis: i64, rank: usize) -> Option<usize> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if (0..r).contains(&a) {
        Some(a as usize)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numel_and_bytes() {
        assert_eq!(Shape::new([2, 3, 4]).numel(), Some(24));
        assert_eq!(Shape::scalar().numel(), Some(1));
        assert_eq!(Shape::new([0, 5]).numel(), Some(0));
        assert_eq!(Shape::new([1 << 40, 1 << 30]).numel(), None);
        assert_eq!(Shape::new([1 << 62]).byte_size(DType::F32), None);
        assert_eq!(Shape::new([3]).byte_size(DType::I64), Some(24));
    }

    #[test]
    fn strides_row_major() {
        assert_eq!(Shape::new([2, 3, 4]).strides(), vec![12, 4, 1]);
        assert_eq!(Shape::scalar().strides(), Vec::<usize>::new());
    }

    #[test]
    fn broadcasting() {
        let s = |v: &[usize]| Shape::from(v);
        assert_eq!(broadcast(&s(&[2, 1, 4]), &s(&[3, 1])), Some(s(&[2, 3, 4])));
        assert_eq!(broadcast(&s(&[]), &s(&[5])), Some(s(&[5])));
        assert_eq!(broadcast(&s(&[2]), &s(&[3])), None);
        assert_eq!(broadcast(&s(&[0]), &s(&[1])), Some(s(&[0])));
        assert!(broadcasts_to(&s(&[4]), &s(&[3, 4])));
        assert!(!broadcasts_to(&s(&[3, 4]), &s(&[4])));
    }

    #[test]
    fn axes() {
        assert_eq!(normalize_axis(-1, 3), Some(2));
        assert_eq!(normalize_axis(3, 3), None);
        assert_eq!(normalize_axis(-4, 3), None);
        assert_eq!(normalize_axis(0, 0), None);
    }
}
