//! cuBLAS bound to one stream: single-precision GEMM (plain and strided-batched), column-major as cuBLAS is, and
//! the row-major MatMul/Gemm of ONNX mapped onto it.
//!
//! Row-major `C = op(A) * op(B)` is column-major `C^T = op(B)^T * op(A)^T`: a row-major buffer read column-major
//! is its transpose, so the call swaps the operands and the m/n sizes and keeps each operand's own transpose flag.

use std::ffi::c_int;
use std::fmt;

use crate::device::{Device, DeviceBuffer, DevicePtr, Stream};
use crate::error::{cublas, CudaError, CudaResult};
use crate::ffi::{self, BlasHandle, SgemmCall};

/// A column-major single-precision GEMM: `C = alpha * op(A) * op(B) + beta * C`, `op(A)` m x k, `op(B)` k x n,
/// repeated `batch` times with element strides between the matrices of a batch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sgemm {
    /// Use A transposed.
    pub trans_a: bool,
    /// Use B transposed.
    pub trans_b: bool,
    /// Rows of op(A) and C.
    pub m: usize,
    /// Columns of op(B) and C.
    pub n: usize,
    /// Columns of op(A), rows of op(B).
    pub k: usize,
    /// Leading dimension (elements) of A as stored.
    pub lda: usize,
    /// Leading dimension of B as stored.
    pub ldb: usize,
    /// Leading dimension of C.
    pub ldc: usize,
    /// Number of products.
    pub batch: usize,
    /// Elements between consecutive A matrices (0 broadcasts one A).
    pub stride_a: usize,
    /// Elements between consecutive B matrices (0 broadcasts one B).
    pub stride_b: usize,
    /// Elements between consecutive C matrices.
    pub stride_c: usize,
    /// Scale of the product.
    pub alpha: f32,
    /// Scale of the existing C.
    pub beta: f32,
}

/// A row-major batched matrix product as ONNX MatMul/Gemm define it: `C[b] = alpha * op(A[b]) * op(B[b]) + beta *
/// C[b]` with op(A) m x k and op(B) k x n, each matrix contiguous, batches `stride_*` elements apart (0 broadcasts).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Matmul {
    /// Rows of op(A) and C.
    pub m: usize,
    /// Columns of op(B) and C.
    pub n: usize,
    /// The shared dimension.
    pub k: usize,
    /// A is stored k x m and used transposed.
    pub trans_a: bool,
    /// B is stored n x k and used transposed.
    pub trans_b: bool,
    /// Number of products.
    pub batch: usize,
    /// Elements between A matrices.
    pub stride_a: usize,
    /// Elements between B matrices.
    pub stride_b: usize,
    /// Elements between C matrices.
    pub stride_c: usize,
    /// Scale of the product.
    pub alpha: f32,
    /// Scale of the existing C.
    pub beta: f32,
}

impl Matmul {
    /// One contiguous `m x k` by `k x n` product, `C = A * B`.
    #[must_use]
    pub fn new(m: usize, n: usize, k: usize) -> Self {
        Self::batched(1, m, n, k)
    }

    /// `batch` contiguous products laid out back to back.
    #[must_use]
    pub fn batched(batch: usize, m: usize, n: usize, k: usize) -> Self {
        Self {
            m,
            n,
            k,
            trans_a: false,
            trans_b: false,
            batch,
            stride_a: m * k,
            stride_b: k * n,
            stride_c: m * n,
            alpha: 1.0,
            beta: 0.0,
        }
    }

    /// The column-major call that computes this product on the same buffers (A and B swap places).
    #[must_use]
    pub fn to_col_major(&self) -> Sgemm {
        Sgemm {
            trans_a: self.trans_b,
            trans_b: self.trans_a,
            m: self.n,
            n: self.m,
            k: self.k,
            // Row length of each stored matrix.
            lda: if self.trans_b { self.k } else { self.n },
            ldb: if self.trans_a { self.m } else { self.k },
            ldc: self.n,
            batch: self.batch,
            stride_a: self.stride_b,
            stride_b: self.stride_a,
            stride_c: self.stride_c,
            alpha: self.alpha,
            beta: self.beta,
        }
    }
}

/// The elements a column-major operand of `rows x cols` (as stored) with leading dimension `ld` spans over `batch`
/// matrices `stride` apart; `None` on overflow.
#[must_use]
pub fn operand_extent(rows: usize, cols: usize, ld: usize, batch: usize, stride: usize) -> Option<usize> {
    if rows == 0 || cols == 0 || batch == 0 {
        return Some(0);
    }
    let one = (cols - 1).checked_mul(ld)?.checked_add(rows)?;
    (batch - 1).checked_mul(stride)?.checked_add(one)
}

impl Sgemm {
    /// Stored (rows, cols) of A, B and C.
    fn stored_shapes(&self) -> [(usize, usize); 3] {
        let a = if self.trans_a { (self.k, self.m) } else { (self.m, self.k) };
        let b = if self.trans_b { (self.n, self.k) } else { (self.k, self.n) };
        [a, b, (self.m, self.n)]
    }

    /// Checks sizes, leading dimensions, strides and operand extents against the given operand lengths in bytes.
    ///
    /// # Errors
    /// [`CudaError::Unsupported`] for sizes cuBLAS cannot take or a C batch that overlaps itself;
    /// [`CudaError::OutOfBounds`] when an operand's extent exceeds its range.
    pub fn check(&self, a_bytes: usize, b_bytes: usize, c_bytes: usize) -> CudaResult<()> {
        let bad = |what: String| CudaError::Unsupported { kernel: "sgemm".to_owned(), what };
        let fits = |v: usize| c_int::try_from(v).is_ok();
        for (name, v) in [("m", self.m), ("n", self.n), ("k", self.k), ("batch", self.batch)] {
            if v == 0 || !fits(v) {
                return Err(bad(format!("{name} = {v} (must be in 1..=2^31-1)")));
            }
        }
        let shapes = self.stored_shapes();
        let lds = [self.lda, self.ldb, self.ldc];
        let strides = [self.stride_a, self.stride_b, self.stride_c];
        let lens = [a_bytes, b_bytes, c_bytes];
        for (i, name) in ["A", "B", "C"].into_iter().enumerate() {
            let (rows, cols) = shapes[i];
            if lds[i] < rows || !fits(lds[i]) || i64::try_from(strides[i]).is_err() {
                return Err(bad(format!("operand {name}: leading dimension {} for {rows} rows", lds[i])));
            }
            let extent = operand_extent(rows, cols, lds[i], self.batch, strides[i])
                .and_then(|e| e.checked_mul(4))
                .ok_or_else(|| bad(format!("operand {name}: extent overflows")))?;
            if extent > lens[i] {
                return Err(CudaError::OutOfBounds {
                    what: format!("sgemm operand {name}"),
                    buffer: "(device range)".to_owned(),
                    offset: 0,
                    bytes: extent,
                    size: lens[i],
                });
            }
        }
        // Distinct C matrices must not overlap, or the batch races with itself.
        if self.batch > 1 && self.stride_c < (self.n - 1) * self.ldc + self.m {
            return Err(bad(format!("C batch stride {} overlaps its own matrices", self.stride_c)));
        }
        Ok(())
    }
}

/// A cuBLAS handle bound to one stream, with its own workspace (so that stream capture never allocates).
pub struct Blas {
    // Declared before the workspace: fields drop in order, and the handle must go before its workspace.
    handle: BlasHandle,
    stream: Stream,
    _workspace: DeviceBuffer,
}

impl fmt::Debug for Blas {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Blas").field("stream", &self.stream).finish_non_exhaustive()
    }
}

impl Blas {
    /// Creates a handle on `stream`. The workspace is 32 MiB on Hopper and later, 4 MiB before (cuBLAS's advice).
    ///
    /// # Errors
    /// [`CudaError::CublasUnavailable`] when libcublas cannot be loaded; [`CudaError::Cublas`];
    /// [`CudaError::OutOfMemory`] for the workspace.
    pub fn new(device: &Device, stream: &Stream) -> CudaResult<Self> {
        if !ffi::cublas_lib_present() {
            return Err(CudaError::CublasUnavailable { reason: crate::probe::CUBLAS_MISSING.to_owned() });
        }
        let mib = if device.info().compute_capability.0 >= 9 { 32 } else { 4 };
        let workspace = device.alloc("cublas-workspace", mib << 20)?;
        let ws = workspace.all();
        let handle =
            crate::probe::guard("cuBLAS", || BlasHandle::new(device.context(), stream.cuda(), ws.addr(), ws.len()))
                .map_err(|reason| CudaError::CublasUnavailable { reason })?
                .map_err(|(call, e)| cublas(call)(e))?;
        Ok(Self { handle, stream: stream.clone(), _workspace: workspace })
    }

    /// The stream the handle enqueues on.
    #[must_use]
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// Enqueues a column-major GEMM on the handle's stream (`cublasSgemm_v2`, or the strided batch when
    /// `batch > 1`). Capturable.
    ///
    /// # Errors
    /// As [`Sgemm::check`]; [`CudaError::Cublas`] when cuBLAS refuses.
    pub fn sgemm(&self, g: &Sgemm, a: DevicePtr<'_>, b: DevicePtr<'_>, c: DevicePtr<'_>) -> CudaResult<()> {
        g.check(a.len(), b.len(), c.len())?;
        // Every value below was checked to fit by `check`; the conversions cannot fail.
        let int = |v: usize| c_int::try_from(v).unwrap_or(c_int::MAX);
        let long = |v: usize| i64::try_from(v).unwrap_or(i64::MAX);
        let call = SgemmCall {
            trans_a: g.trans_a,
            trans_b: g.trans_b,
            m: int(g.m),
            n: int(g.n),
            k: int(g.k),
            alpha: g.alpha,
            a: a.addr(),
            lda: int(g.lda),
            stride_a: long(g.stride_a),
            b: b.addr(),
            ldb: int(g.ldb),
            stride_b: long(g.stride_b),
            beta: g.beta,
            c: c.addr(),
            ldc: int(g.ldc),
            stride_c: long(g.stride_c),
            batch: int(g.batch),
        };
        self.handle.sgemm(&call).map_err(|(call, e)| cublas(call)(e))
    }

    /// Enqueues a row-major product (ONNX MatMul/Gemm layout).
    ///
    /// # Errors
    /// As [`Blas::sgemm`].
    pub fn matmul(&self, mm: &Matmul, a: DevicePtr<'_>, b: DevicePtr<'_>, c: DevicePtr<'_>) -> CudaResult<()> {
        // Operands swap: the column-major A is the row-major B.
        self.sgemm(&mm.to_col_major(), b, a, c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Reference column-major sgemm over host slices, asserting it stays inside the checked extents.
    fn col_major_ref(g: &Sgemm, a: &[f32], b: &[f32], c: &mut [f32]) {
        for p in 0..g.batch {
            for j in 0..g.n {
                for i in 0..g.m {
                    let mut acc = 0.0f64;
                    for l in 0..g.k {
                        let ai = if g.trans_a { i * g.lda + l } else { l * g.lda + i } + p * g.stride_a;
                        let bi = if g.trans_b { l * g.ldb + j } else { j * g.ldb + l } + p * g.stride_b;
                        acc += f64::from(a[ai]) * f64::from(b[bi]);
                    }
                    let ci = j * g.ldc + i + p * g.stride_c;
                    c[ci] = (f64::from(g.alpha) * acc + f64::from(g.beta) * f64::from(c[ci])) as f32;
                }
            }
        }
    }

    /// Reference row-major product.
    fn row_major_ref(mm: &Matmul, a: &[f32], b: &[f32], c: &mut [f32]) {
        for p in 0..mm.batch {
            for i in 0..mm.m {
                for j in 0..mm.n {
                    let mut acc = 0.0f64;
                    for l in 0..mm.k {
                        let ai = if mm.trans_a { l * mm.m + i } else { i * mm.k + l } + p * mm.stride_a;
                        let bi = if mm.trans_b { j * mm.k + l } else { l * mm.n + j } + p * mm.stride_b;
                        acc += f64::from(a[ai]) * f64::from(b[bi]);
                    }
                    let ci = i * mm.n + j + p * mm.stride_c;
                    c[ci] = (f64::from(mm.alpha) * acc + f64::from(mm.beta) * f64::from(c[ci])) as f32;
                }
            }
        }
    }

    fn values(len: usize, seed: u32) -> Vec<f32> {
        (0..len).map(|i| ((i as u32 * 7 + seed * 13) % 11) as f32 - 5.0).collect()
    }

    proptest! {
        /// The column-major call derived from a row-major product computes the same numbers on the same buffers,
        /// and the extents `check` demands are exactly what the products touch.
        #[test]
        fn row_major_maps_to_col_major(
            m in 1usize..5, n in 1usize..5, k in 1usize..5, batch in 1usize..4,
            trans_a: bool, trans_b: bool, broadcast_b: bool, beta in prop_oneof![Just(0.0f32), Just(0.5f32)],
        ) {
            let mut mm = Matmul::batched(batch, m, n, k);
            mm.trans_a = trans_a;
            mm.trans_b = trans_b;
            mm.beta = beta;
            if broadcast_b { mm.stride_b = 0; }
            let g = mm.to_col_major();
            let a_len = (batch - 1) * mm.stride_a + m * k;
            let b_len = (batch - 1) * mm.stride_b + k * n;
            let c_len = batch * m * n;
            prop_assert_eq!(g.check(b_len * 4, a_len * 4, c_len * 4), Ok(()));
            // One element less in any operand is refused.
            prop_assert!(g.check(b_len * 4 - 4, a_len * 4, c_len * 4).is_err());
            prop_assert!(g.check(b_len * 4, a_len * 4 - 4, c_len * 4).is_err());
            prop_assert!(g.check(b_len * 4, a_len * 4, c_len * 4 - 4).is_err());
            let (a, b) = (values(a_len, 1), values(b_len, 2));
            let mut c_row = values(c_len, 3);
            let mut c_col = c_row.clone();
            row_major_ref(&mm, &a, &b, &mut c_row);
            col_major_ref(&g, &b, &a, &mut c_col);
            prop_assert_eq!(c_row, c_col);
        }
    }

    #[test]
    fn check_refuses_bad_shapes() {
        let g = Matmul::new(2, 3, 4).to_col_major();
        assert_eq!(g.check(4 * 12, 4 * 8, 4 * 6), Ok(()));
        let mut zero = g;
        zero.k = 0;
        assert!(matches!(zero.check(1 << 20, 1 << 20, 1 << 20), Err(CudaError::Unsupported { .. })));
        let mut small_ld = g;
        small_ld.ldc = 1;
        assert!(matches!(small_ld.check(1 << 20, 1 << 20, 1 << 20), Err(CudaError::Unsupported { .. })));
        let mut overlapping = Matmul::batched(2, 2, 2, 2);
        overlapping.stride_c = 0;
        assert!(matches!(
            overlapping.to_col_major().check(1 << 20, 1 << 20, 1 << 20),
            Err(CudaError::Unsupported { what, .. }) if what.contains("overlaps")
        ));
        assert_eq!(operand_extent(3, 2, 5, 2, 100), Some(100 + 5 + 3));
        assert_eq!(operand_extent(0, 2, 5, 2, 100), Some(0));
        assert_eq!(operand_extent(2, usize::MAX, 2, 1, 0), None);
    }
}
