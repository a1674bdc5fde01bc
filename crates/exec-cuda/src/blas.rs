//! cuBLAS bound to one stream: GEMM (plain, strided-batched, or over arrays of operand addresses) in f32, or with
//! f16/bf16 operands and f32 compute, column-major as cuBLAS is, and the row-major MatMul/Gemm of ONNX mapped onto
//! it; and f32 cuBLASLt products with a bias, residual and activation epilogue ([`Blas::gemm_lt`]).
//!
//! Row-major `C = op(A) * op(B)` is column-major `C^T = op(B)^T * op(A)^T`: a row-major buffer read column-major
//! is its transpose, so the call swaps the operands and the m/n sizes and keeps each operand's own transpose flag.
//!
//! Element types ([`GemmTypes`]): f32 operands run `cublasSgemm_v2` (plain FP32, no TF32); f16 or bf16 operands
//! run `cublasGemmEx` / `cublasGemmStridedBatchedEx` with `CUBLAS_COMPUTE_32F`, so that products of half values
//! accumulate in f32 and the result is rounded once, on the store, to C's type (f16/bf16 like the operands, or
//! f32) — the rule exec-sim follows (`docs/precision.md`). [`GemmType::min_capability`] says which devices cuBLAS
//! runs each type on; [`Matmul::check_device`] turns a refusal into [`CudaError::PrecisionUnsupported`].

use std::ffi::c_int;
use std::fmt;

use graph_plan::DType;

use crate::device::{Device, DeviceBuffer, DevicePtr, Stream};
use crate::error::{cublas, CudaError, CudaResult};
use crate::ffi::{self, BlasHandle, GemmCall, LtHandle};

/// The element type of a GEMM operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GemmType {
    /// IEEE single precision (`CUDA_R_32F`).
    F32,
    /// IEEE half precision (`CUDA_R_16F`).
    F16,
    /// bfloat16 (`CUDA_R_16BF`).
    BF16,
}

impl GemmType {
    /// The GEMM type of a plan dtype, or `None` for a dtype cuBLAS products do not take here (integers).
    #[must_use]
    pub fn of(dtype: DType) -> Option<Self> {
        match dtype {
            DType::F32 => Some(Self::F32),
            DType::F16 => Some(Self::F16),
            DType::BF16 => Some(Self::BF16),
            _ => None,
        }
    }

    /// The plan dtype of this type.
    #[must_use]
    pub fn dtype(self) -> DType {
        match self {
            Self::F32 => DType::F32,
            Self::F16 => DType::F16,
            Self::BF16 => DType::BF16,
        }
    }

    /// Bytes per element.
    #[must_use]
    pub fn size(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::BF16 => 2,
        }
    }

    /// The lowest compute capability on which this backend runs a cuBLAS product with operands of this type.
    ///
    /// - f32: any device CUDA 12 supports (`cublasSgemm_v2`);
    /// - f16: 5.0, `cublasGemmEx`'s own minimum (below it cuBLAS answers `CUBLAS_STATUS_ARCH_MISMATCH`); every
    ///   device CUDA 12 supports has it;
    /// - bf16: 8.0 (Ampere), the first architecture with bf16 tensor-core instructions. cuBLAS's bf16 GemmEx on
    ///   older devices depends on the cuBLAS version (it answers `CUBLAS_STATUS_NOT_SUPPORTED` on sm_52 and
    ///   sm_60 with CUDA 11.3, PyTorch issue 57773, and works on sm_75), so this backend does not rely on it
    ///   there: such products run as generated kernels, which need no tensor cores.
    #[must_use]
    pub fn min_capability(self) -> (u32, u32) {
        match self {
            Self::F32 => (0, 0),
            Self::F16 => (5, 0),
            Self::BF16 => (8, 0),
        }
    }
}

impl fmt::Display for GemmType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.dtype(), f)
    }
}

/// The element types of one GEMM: A and B share `ab`; C is `c`. Compute (accumulation, alpha, beta) is f32.
///
/// Valid pairs are those cuBLAS takes with `CUBLAS_COMPUTE_32F`: f32/f32, f16/f16, f16/f32, bf16/bf16 and
/// bf16/f32 ([`GemmTypes::is_valid`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GemmTypes {
    /// Type of A and B.
    pub ab: GemmType,
    /// Type of C.
    pub c: GemmType,
}

impl GemmTypes {
    /// f32 everywhere: `cublasSgemm_v2`.
    pub const F32: Self = Self { ab: GemmType::F32, c: GemmType::F32 };

    /// Operands and result all of type `t`.
    #[must_use]
    pub fn uniform(t: GemmType) -> Self {
        Self { ab: t, c: t }
    }

    /// Whether cuBLAS takes this pair with f32 compute: C is A's type or f32.
    #[must_use]
    pub fn is_valid(self) -> bool {
        self.c == self.ab || self.c == GemmType::F32
    }
}

impl Default for GemmTypes {
    fn default() -> Self {
        Self::F32
    }
}

/// A column-major GEMM: `C = alpha * op(A) * op(B) + beta * C`, `op(A)` m x k, `op(B)` k x n, repeated `batch`
/// times with element strides between the matrices of a batch; operands of `types`, f32 compute.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ColMajorGemm {
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
    /// Element types of A, B and C.
    pub types: GemmTypes,
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
    /// Element types of A, B and C (f32 compute whatever they are).
    pub types: GemmTypes,
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
            types: GemmTypes::F32,
        }
    }

    /// Checks that cuBLAS runs this product's operand type on a device of compute capability `capability`
    /// ([`GemmType::min_capability`]). A pure function of its arguments, so that the rule is testable without a
    /// GPU; `node` names the plan node in the error.
    ///
    /// # Errors
    /// [`CudaError::PrecisionUnsupported`] naming the node, the dtype, the device's capability and the one needed.
    pub fn check_device(&self, node: &str, capability: (u32, u32)) -> CudaResult<()> {
        let needs = self.types.ab.min_capability();
        if capability >= needs {
            Ok(())
        } else {
            Err(CudaError::PrecisionUnsupported {
                node: node.to_owned(),
                dtype: self.types.ab.dtype(),
                capability,
                needs,
            })
        }
    }

    /// The column-major call that computes this product on the same buffers (A and B swap places).
    #[must_use]
    pub fn to_col_major(&self) -> ColMajorGemm {
        ColMajorGemm {
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
            types: self.types,
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

impl ColMajorGemm {
    /// Stored (rows, cols) of A, B and C.
    fn stored_shapes(&self) -> [(usize, usize); 3] {
        let a = if self.trans_a { (self.k, self.m) } else { (self.m, self.k) };
        let b = if self.trans_b { (self.n, self.k) } else { (self.k, self.n) };
        [a, b, (self.m, self.n)]
    }

    /// The cuBLAS entry point this call runs (for errors): `cublasSgemm_v2` for f32, else `cublasGemmEx`, or
    /// their strided-batched forms when `batch > 1`.
    #[must_use]
    pub fn entry(&self) -> &'static str {
        match (self.types == GemmTypes::F32, self.batch > 1) {
            (true, false) => "cublasSgemm_v2",
            (true, true) => "cublasSgemmStridedBatched",
            (false, false) => "cublasGemmEx",
            (false, true) => "cublasGemmStridedBatchedEx",
        }
    }

    /// Checks the element types, sizes, leading dimensions, strides and operand extents against the given operand
    /// lengths in bytes (each operand's extent in elements times its element size).
    ///
    /// # Errors
    /// [`CudaError::Unsupported`] for a type pair or sizes cuBLAS cannot take or a C batch that overlaps itself;
    /// [`CudaError::OutOfBounds`] when an operand's extent exceeds its range.
    pub fn check(&self, a_bytes: usize, b_bytes: usize, c_bytes: usize) -> CudaResult<()> {
        let bad = |what: String| CudaError::Unsupported { kernel: self.entry().to_owned(), what };
        if !self.types.is_valid() {
            return Err(bad(format!(
                "{} operands with a {} result (C must be the operands' type or f32)",
                self.types.ab, self.types.c
            )));
        }
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
        let sizes = [self.types.ab.size(), self.types.ab.size(), self.types.c.size()];
        for (i, name) in ["A", "B", "C"].into_iter().enumerate() {
            let (rows, cols) = shapes[i];
            if lds[i] < rows || !fits(lds[i]) || i64::try_from(strides[i]).is_err() {
                return Err(bad(format!("operand {name}: leading dimension {} for {rows} rows", lds[i])));
            }
            let extent = operand_extent(rows, cols, lds[i], self.batch, strides[i])
                .and_then(|e| e.checked_mul(sizes[i]))
                .ok_or_else(|| bad(format!("operand {name}: extent overflows")))?;
            if extent > lens[i] {
                return Err(CudaError::OutOfBounds {
                    what: format!("{} operand {name}", self.entry()),
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

    /// What this call computes, on host bytes (little-endian, as device memory holds them): the model of cuBLAS
    /// that the host emulator runs and the tests hold the column-major mapping to. Operands are widened to f32,
    /// each output element accumulates `op(A)[i, l] * op(B)[l, j]` in f32 for `l = 0..k` in order, then
    /// `alpha * acc` (plus `beta * C` when `beta != 0`; C is not read otherwise, as in cuBLAS) is rounded once,
    /// to nearest even, to C's type. cuBLAS itself may sum in another order (blocked, split-K, tensor cores), so a
    /// GPU agrees with this to f32 rounding of the sum, not bit for bit.
    ///
    /// # Errors
    /// As [`ColMajorGemm::check`] (on the slices' lengths), so that no index can leave a slice.
    pub fn host_reference(&self, a: &[u8], b: &[u8], c: &mut [u8]) -> CudaResult<()> {
        self.check(a.len(), b.len(), c.len())?;
        let (ab, ct) = (self.types.ab, self.types.c);
        for p in 0..self.batch {
            for j in 0..self.n {
                for i in 0..self.m {
                    let mut acc = 0.0f32;
                    for l in 0..self.k {
                        let ai = if self.trans_a { i * self.lda + l } else { l * self.lda + i } + p * self.stride_a;
                        let bi = if self.trans_b { l * self.ldb + j } else { j * self.ldb + l } + p * self.stride_b;
                        acc += host_load(a, ai, ab) * host_load(b, bi, ab);
                    }
                    let ci = j * self.ldc + i + p * self.stride_c;
                    let mut v = self.alpha * acc;
                    if self.beta != 0.0 {
                        v += self.beta * host_load(c, ci, ct);
                    }
                    host_store(c, ci, ct, v);
                }
            }
        }
        Ok(())
    }
}

/// Element `i` of little-endian `bytes` of type `t`, widened to f32 (exact). The caller checked the extent.
fn host_load(bytes: &[u8], i: usize, t: GemmType) -> f32 {
    let at = |n: usize| bytes.get(i * n..i * n + n).unwrap_or(&[0; 4][..n]);
    match t {
        GemmType::F32 => {
            let e = at(4);
            f32::from_le_bytes([e[0], e[1], e[2], e[3]])
        }
        GemmType::F16 => {
            let e = at(2);
            graph_plan::exec::f16_to_f32(u16::from_le_bytes([e[0], e[1]]))
        }
        GemmType::BF16 => {
            let e = at(2);
            f32::from_bits(u32::from(u16::from_le_bytes([e[0], e[1]])) << 16)
        }
    }
}

/// Stores `v` rounded to nearest even to type `t` as element `i` of little-endian `bytes`. The caller checked
/// the extent.
fn host_store(bytes: &mut [u8], i: usize, t: GemmType, v: f32) {
    let encoded = match t {
        GemmType::F32 => v.to_le_bytes().to_vec(),
        GemmType::F16 | GemmType::BF16 => graph_plan::exec::f32_to_half_bytes(&v.to_le_bytes(), t.dtype()),
    };
    let n = t.size();
    if let Some(dst) = bytes.get_mut(i * n..i * n + n) {
        dst.copy_from_slice(&encoded);
    }
}

/// A cuBLAS handle bound to one stream, with its own workspace (so that stream capture never allocates).
pub struct Blas {
    // Declared before the workspace: fields drop in order, and the handles must go before their workspace.
    handle: BlasHandle,
    lt: LtHandle,
    stream: Stream,
    workspace: DeviceBuffer,
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
        if !ffi::cublas_lib_present() || !ffi::cublaslt_lib_present() {
            return Err(CudaError::CublasUnavailable { reason: crate::probe::CUBLAS_MISSING.to_owned() });
        }
        let mib = if device.info().compute_capability.0 >= 9 { 32 } else { 4 };
        let workspace = device.alloc("cublas-workspace", mib << 20)?;
        let ws = workspace.all();
        let handle =
            crate::probe::guard("cuBLAS", || BlasHandle::new(device.context(), stream.cuda(), ws.addr(), ws.len()))
                .map_err(|reason| CudaError::CublasUnavailable { reason })?
                .map_err(|(call, e)| cublas(call)(e))?;
        let lt = crate::probe::guard("cuBLASLt", || LtHandle::new(device.context()))
            .map_err(|reason| CudaError::CublasUnavailable { reason })?
            .map_err(|(call, status)| CudaError::Cublas { call, status })?;
        Ok(Self { handle, lt, stream: stream.clone(), workspace })
    }

    /// The stream the handle enqueues on.
    #[must_use]
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// Enqueues a column-major GEMM on the handle's stream: `cublasSgemm_v2` for f32 operands, `cublasGemmEx`
    /// with f32 compute for f16/bf16 ones, or their strided batch when `batch > 1` ([`ColMajorGemm::entry`]).
    /// Capturable.
    ///
    /// # Errors
    /// As [`ColMajorGemm::check`]; [`CudaError::Unsupported`] for an operand address not aligned to its element
    /// size; [`CudaError::Cublas`] when cuBLAS refuses.
    pub fn gemm(&self, g: &ColMajorGemm, a: DevicePtr<'_>, b: DevicePtr<'_>, c: DevicePtr<'_>) -> CudaResult<()> {
        g.check_operands(a, b, c)?;
        self.handle.gemm(&g.call(a.addr(), b.addr(), c.addr())).map_err(|(call, e)| cublas(call)(e))
    }

    /// Enqueues `count` products of `g`'s shape (`batch` 1) as one `cublasGemmBatchedEx` (f32 compute, whatever
    /// the operand types) over device arrays of their operand addresses: `arrays` holds every A, then every B,
    /// then every C, each already checked with [`ColMajorGemm::check_operands`] ([`PointerArrays`] builds them).
    /// Capturable: the arrays are read when the call runs, so they must outlive every replay.
    ///
    /// # Errors
    /// [`CudaError::Unsupported`] for a batch other than 1, no products, or arrays too short or misaligned;
    /// [`CudaError::Cublas`] when cuBLAS refuses.
    pub fn gemm_pointers(&self, g: &ColMajorGemm, arrays: &PointerArrays) -> CudaResult<()> {
        let bad = |what: String| CudaError::Unsupported { kernel: "cublasGemmBatchedEx".to_owned(), what };
        let count = arrays.count;
        let ptr = arrays.buffer.all();
        if g.batch != 1 || count == 0 {
            return Err(bad(format!("batch {} over {count} products (one matrix each, at least one)", g.batch)));
        }
        let Ok(n) = c_int::try_from(count) else {
            return Err(bad(format!("{count} products exceed cuBLAS's batch count")));
        };
        if ptr.len() < count.saturating_mul(24) || ptr.addr() % 8 != 0 {
            return Err(bad(format!(
                "{} bytes of operand arrays at {:#x} for {count} products",
                ptr.len(),
                ptr.addr()
            )));
        }
        self.handle.gemm_pointers(&g.call(0, 0, 0), ptr.addr(), n).map_err(|(call, e)| cublas(call)(e))
    }

    /// Enqueues one f32 product (batch 1) through cuBLASLt with its epilogue: `C = act(alpha * op(A) op(B) +
    /// residual + bias)`, the bias `g.m` f32 values, one per row of the column-major C, the residual a matrix of
    /// C's layout (see [`crate::codegen::LtEpilogue`]). Uses the handle's workspace (calls on one stream never
    /// overlap). Capturable.
    ///
    /// # Errors
    /// As [`ColMajorGemm::check_operands`]; [`CudaError::Unsupported`] for another type, a batch, or a bias or
    /// residual that is short or misaligned; [`CudaError::Cublas`] when cuBLASLt refuses.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_lt(
        &self,
        g: &ColMajorGemm,
        activation: crate::codegen::LtActivation,
        a: DevicePtr<'_>,
        b: DevicePtr<'_>,
        c: DevicePtr<'_>,
        bias: Option<DevicePtr<'_>>,
        residual: Option<DevicePtr<'_>>,
    ) -> CudaResult<()> {
        let bad = |what: String| CudaError::Unsupported { kernel: "cublasLtMatmul".to_owned(), what };
        if g.types != GemmTypes::F32 || g.batch != 1 {
            return Err(bad(format!("{} operands, batch {} (f32, batch 1 only)", g.types.ab, g.batch)));
        }
        g.check_operands(a, b, c)?;
        if let Some(p) = bias {
            if p.len() < g.m.saturating_mul(4) || p.addr() % 4 != 0 {
                return Err(bad(format!("bias of {} bytes at {:#x} for {} rows", p.len(), p.addr(), g.m)));
            }
        }
        if let Some(p) = residual {
            // C's extent: `check_operands` proved it fits usize for the output.
            let extent = operand_extent(g.m, g.n, g.ldc, 1, 0).unwrap_or(usize::MAX).saturating_mul(4);
            if p.len() < extent || p.addr() % 4 != 0 {
                return Err(bad(format!("residual of {} bytes at {:#x} for {extent}", p.len(), p.addr())));
            }
        }
        let ws = self.workspace.all();
        let call = ffi::LtCall {
            gemm: g.call(a.addr(), b.addr(), c.addr()),
            bias: bias.map_or(0, |p| p.addr()),
            residual: residual.map_or(0, |p| p.addr()),
            epilogue: ffi::lt_epilogue(bias.is_some(), activation),
            workspace: ws.addr(),
            workspace_bytes: ws.len(),
        };
        self.lt.matmul(self.stream.cuda(), &call).map_err(|(call, status)| CudaError::Cublas { call, status })
    }

    /// Enqueues a row-major product (ONNX MatMul/Gemm layout).
    ///
    /// # Errors
    /// As [`Blas::gemm`].
    pub fn matmul(&self, mm: &Matmul, a: DevicePtr<'_>, b: DevicePtr<'_>, c: DevicePtr<'_>) -> CudaResult<()> {
        // Operands swap: the column-major A is the row-major B.
        self.gemm(&mm.to_col_major(), b, a, c)
    }
}

/// The device arrays of operand addresses one pointer-array call reads (every A, then every B, then every C),
/// written once when a plan is prepared: the pool does not move, so they stay valid for every run and replay.
pub struct PointerArrays {
    buffer: DeviceBuffer,
    count: usize,
}

impl fmt::Debug for PointerArrays {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PointerArrays").field("count", &self.count).finish_non_exhaustive()
    }
}

impl PointerArrays {
    /// Checks every product's operands against `g` (batch 1: [`ColMajorGemm::check_operands`]), then allocates
    /// the arrays on `device` and writes the addresses through `stream` (synchronised before it returns).
    ///
    /// # Errors
    /// As [`ColMajorGemm::check_operands`] for the first product that fails; [`CudaError::OutOfMemory`] and
    /// copy errors.
    pub fn new(
        device: &Device,
        stream: &Stream,
        g: &ColMajorGemm,
        operands: &[[DevicePtr<'_>; 3]],
    ) -> CudaResult<Self> {
        let mut addrs = vec![0u64; operands.len() * 3];
        let n = operands.len();
        for (i, [a, b, c]) in operands.iter().enumerate() {
            g.check_operands(*a, *b, *c)?;
            addrs[i] = a.addr();
            addrs[n + i] = b.addr();
            addrs[2 * n + i] = c.addr();
        }
        let bytes: Vec<u8> = addrs.iter().flat_map(|a| a.to_le_bytes()).collect();
        let buffer = device.alloc("cublas-pointer-arrays", bytes.len().max(8))?;
        stream.copy_to_device(buffer.range("cublas-pointer-arrays", 0, bytes.len())?, &bytes)?;
        stream.synchronize()?;
        Ok(Self { buffer, count: n })
    }

    /// How many products the arrays address.
    #[must_use]
    pub fn count(&self) -> usize {
        self.count
    }
}

impl ColMajorGemm {
    /// [`ColMajorGemm::check`] on device ranges, and each operand's address aligned to its element size: what a
    /// call on these operands needs before it may be enqueued.
    ///
    /// # Errors
    /// As [`ColMajorGemm::check`]; [`CudaError::Unsupported`] for a misaligned operand.
    pub fn check_operands(&self, a: DevicePtr<'_>, b: DevicePtr<'_>, c: DevicePtr<'_>) -> CudaResult<()> {
        self.check(a.len(), b.len(), c.len())?;
        let sizes = [self.types.ab.size(), self.types.ab.size(), self.types.c.size()];
        for ((name, p), size) in ["A", "B", "C"].into_iter().zip([a, b, c]).zip(sizes) {
            // usize -> u64 is lossless on every target CUDA supports.
            if p.addr() % size as u64 != 0 {
                return Err(CudaError::Unsupported {
                    kernel: self.entry().to_owned(),
                    what: format!("operand {name} at {:#x} is not aligned to its {size}-byte elements", p.addr()),
                });
            }
        }
        Ok(())
    }

    /// The FFI form of this call on operand addresses `a`, `b`, `c`. Every value was checked to fit by
    /// [`ColMajorGemm::check`]; the conversions saturate instead of failing.
    fn call(&self, a: u64, b: u64, c: u64) -> GemmCall {
        let g = self;
        let int = |v: usize| c_int::try_from(v).unwrap_or(c_int::MAX);
        let long = |v: usize| i64::try_from(v).unwrap_or(i64::MAX);
        GemmCall {
            trans_a: g.trans_a,
            trans_b: g.trans_b,
            m: int(g.m),
            n: int(g.n),
            k: int(g.k),
            alpha: g.alpha,
            a,
            lda: int(g.lda),
            stride_a: long(g.stride_a),
            b,
            ldb: int(g.ldb),
            stride_b: long(g.stride_b),
            beta: g.beta,
            c,
            ldc: int(g.ldc),
            stride_c: long(g.stride_c),
            batch: int(g.batch),
            types: g.types,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Reference column-major sgemm over host slices, asserting it stays inside the checked extents.
    fn col_major_ref(g: &ColMajorGemm, a: &[f32], b: &[f32], c: &mut [f32]) {
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

    /// Host bytes of `v` as type `t` (rounded to nearest even).
    fn encode(v: &[f32], t: GemmType) -> Vec<u8> {
        let f32_bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        match t {
            GemmType::F32 => f32_bytes,
            _ => graph_plan::exec::f32_to_half_bytes(&f32_bytes, t.dtype()),
        }
    }

    /// `v` rounded to type `t`, as f32.
    fn rounded(v: f32, t: GemmType) -> f32 {
        let b = encode(&[v], t);
        host_load(&b, 0, t)
    }

    /// Row-major reference of a typed product, written from ONNX's definition and the precision rule: operands
    /// widened to f32, an f32 sum over `l` in order, `alpha` applied, one rounding to C's type.
    fn typed_row_major_ref(mm: &Matmul, a: &[f32], b: &[f32]) -> Vec<f32> {
        let mut c = vec![0f32; mm.batch * mm.m * mm.n];
        for p in 0..mm.batch {
            for i in 0..mm.m {
                for j in 0..mm.n {
                    let mut acc = 0f32;
                    for l in 0..mm.k {
                        let ai = if mm.trans_a { l * mm.m + i } else { i * mm.k + l } + p * mm.stride_a;
                        let bi = if mm.trans_b { j * mm.k + l } else { l * mm.n + j } + p * mm.stride_b;
                        acc += a[ai] * b[bi];
                    }
                    c[p * mm.stride_c + i * mm.n + j] = rounded(mm.alpha * acc, mm.types.c);
                }
            }
        }
        c
    }

    fn half_pairs() -> impl Strategy<Value = GemmTypes> {
        prop_oneof![
            Just(GemmTypes::uniform(GemmType::F16)),
            Just(GemmTypes { ab: GemmType::F16, c: GemmType::F32 }),
            Just(GemmTypes::uniform(GemmType::BF16)),
            Just(GemmTypes { ab: GemmType::BF16, c: GemmType::F32 }),
            Just(GemmTypes::F32),
        ]
    }

    proptest! {
        /// The same for typed products on bytes: the column-major call's host model (operands swapped) gives the
        /// row-major reference's bits exactly, and `check` counts each operand's bytes with its element size.
        #[test]
        fn typed_row_major_maps_to_col_major(
            m in 1usize..5, n in 1usize..5, k in 1usize..6, batch in 1usize..4,
            trans_a: bool, trans_b: bool, broadcast_b: bool, types in half_pairs(),
            alpha in prop_oneof![Just(1.0f32), Just(0.3f32)],
        ) {
            let mut mm = Matmul::batched(batch, m, n, k);
            mm.trans_a = trans_a;
            mm.trans_b = trans_b;
            mm.alpha = alpha;
            mm.types = types;
            if broadcast_b { mm.stride_b = 0; }
            let g = mm.to_col_major();
            let (sab, sc) = (types.ab.size(), types.c.size());
            let a_len = (batch - 1) * mm.stride_a + m * k;
            let b_len = (batch - 1) * mm.stride_b + k * n;
            let c_len = batch * m * n;
            prop_assert_eq!(g.check(b_len * sab, a_len * sab, c_len * sc), Ok(()));
            prop_assert!(g.check(b_len * sab - sab, a_len * sab, c_len * sc).is_err());
            prop_assert!(g.check(b_len * sab, a_len * sab - sab, c_len * sc).is_err());
            prop_assert!(g.check(b_len * sab, a_len * sab, c_len * sc - sc).is_err());
            // Values exact in every type (small integers and halves), so that only the store rounds.
            let quarter = |v: Vec<f32>| v.into_iter().map(|x| x * 0.25).collect::<Vec<_>>();
            let (a, b) = (quarter(values(a_len, 1)), quarter(values(b_len, 2)));
            let mut c = vec![0xa5u8; c_len * sc];
            g.host_reference(&encode(&b, types.ab), &encode(&a, types.ab), &mut c).unwrap();
            prop_assert_eq!(c, encode(&typed_row_major_ref(&mm, &a, &b), types.c));
        }
    }

    /// Half products accumulate in f32 and round once: `1 + u + 2^-20` (u = half an ulp of 1) rounds up to
    /// `1 + 2u`, where rounding after every addition would give 1; `1 + u` alone is a tie and rounds to even (1).
    /// With an f32 C nothing is rounded.
    #[test]
    fn half_products_round_once_from_the_f32_sum() {
        for (t, u) in [(GemmType::F16, 2f32.powi(-11)), (GemmType::BF16, 2f32.powi(-8))] {
            let tiny = 2f32.powi(-20);
            // Row-major A (2 x 3) and B (3 x 2).
            let a = [1.0, u, tiny, 1.0, u, 0.0];
            let b = [1.0, 0.0, 1.0, 1.0, 1.0, 0.0];
            for c_type in [t, GemmType::F32] {
                let mut mm = Matmul::new(2, 2, 3);
                mm.types = GemmTypes { ab: t, c: c_type };
                let mut c = vec![0u8; 4 * c_type.size()];
                mm.to_col_major().host_reference(&encode(&b, t), &encode(&a, t), &mut c).unwrap();
                let got: Vec<f32> = (0..4).map(|i| host_load(&c, i, c_type)).collect();
                let want = if c_type == t { [1.0 + 2.0 * u, u, 1.0, u] } else { [1.0 + u + tiny, u, 1.0 + u, u] };
                assert_eq!(got, want, "{t} -> {c_type}");
            }
        }
    }

    #[test]
    fn typed_checks_count_bytes_and_refuse_bad_pairs() {
        let mut mm = Matmul::new(2, 3, 4);
        mm.types = GemmTypes::uniform(GemmType::F16);
        let g = mm.to_col_major();
        // Column-major A is the row-major B (4 x 3), B is A (2 x 4), C is 2 x 3: two bytes an element.
        assert_eq!(g.check(2 * 12, 2 * 8, 2 * 6), Ok(()));
        assert!(matches!(g.check(2 * 12 - 2, 2 * 8, 2 * 6), Err(CudaError::OutOfBounds { bytes: 24, size: 22, .. })));
        // An f32 C of the same product needs four bytes an element.
        mm.types.c = GemmType::F32;
        let g = mm.to_col_major();
        assert_eq!(g.entry(), "cublasGemmEx");
        assert_eq!(g.check(2 * 12, 2 * 8, 4 * 6), Ok(()));
        assert!(matches!(g.check(2 * 12, 2 * 8, 2 * 6), Err(CudaError::OutOfBounds { bytes: 24, size: 12, .. })));
        // Half results from f32 operands, or a product mixing two half types, are not cuBLAS calls.
        for types in
            [GemmTypes { ab: GemmType::F32, c: GemmType::F16 }, GemmTypes { ab: GemmType::BF16, c: GemmType::F16 }]
        {
            mm.types = types;
            assert!(
                matches!(mm.to_col_major().check(1 << 20, 1 << 20, 1 << 20), Err(CudaError::Unsupported { .. })),
                "{types:?}"
            );
        }
        let mut batched = Matmul::batched(2, 2, 2, 2);
        batched.types = GemmTypes::uniform(GemmType::BF16);
        assert_eq!(batched.to_col_major().entry(), "cublasGemmStridedBatchedEx");
        assert_eq!(Matmul::batched(2, 2, 2, 2).to_col_major().entry(), "cublasSgemmStridedBatched");
    }

    /// The device rule, from a fake compute capability: bf16 needs 8.0, f16 5.0, f32 anything.
    #[test]
    fn device_check_names_node_dtype_and_capability() {
        let mut mm = Matmul::new(2, 2, 2);
        assert_eq!(mm.check_device("fc", (3, 5)), Ok(()));
        mm.types = GemmTypes::uniform(GemmType::F16);
        assert_eq!(mm.check_device("fc", (5, 0)), Ok(()));
        assert_eq!(
            mm.check_device("fc", (3, 7)),
            Err(CudaError::PrecisionUnsupported {
                node: "fc".into(),
                dtype: DType::F16,
                capability: (3, 7),
                needs: (5, 0)
            })
        );
        mm.types = GemmTypes { ab: GemmType::BF16, c: GemmType::F32 };
        for ok in [(8, 0), (8, 6), (9, 0), (10, 0)] {
            assert_eq!(mm.check_device("fc", ok), Ok(()), "{ok:?}");
        }
        for refused in [(7, 5), (7, 0), (6, 1)] {
            assert_eq!(
                mm.check_device("fc", refused),
                Err(CudaError::PrecisionUnsupported {
                    node: "fc".into(),
                    dtype: DType::BF16,
                    capability: refused,
                    needs: (8, 0)
                })
            );
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
