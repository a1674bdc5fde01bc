//! The only module of exec-cuda that calls `unsafe` cudarc APIs.
//!
//! Everything here is small and `pub(crate)`: library probes, the raw kernel launch, raw-address copies, the
//! switch that turns off cudarc's per-allocation event tracking, and the RAII owner of a cuBLAS handle. The safe
//! layers (`device`, `blas`, `capture`, `nvrtc`, `probe`) validate every size, bound and signature before they call
//! in here, so each block's `// SAFETY:` comment can name the check that makes it sound.
#![allow(unsafe_code)]

use std::ffi::c_int;
use std::sync::Arc;

use cudarc::cublas::result::CublasError;

use crate::blas::{GemmType, GemmTypes};
use cudarc::cublas::sys as blas_sys;
use cudarc::cublaslt::sys as lt_sys;
use cudarc::driver::sys as drv_sys;
use cudarc::driver::{result as drv, CudaContext, CudaFunction, CudaStream, DriverError};

/// Whether `libcuda` (the driver library) can be dlopened by any of the names cudarc tries.
pub(crate) fn driver_lib_present() -> bool {
    // SAFETY: dlopen()s candidate names of the driver library and closes each handle again; loading libcuda runs
    // only its own initialisers, and no symbol is called.
    unsafe { drv_sys::is_culib_present() }
}

/// Whether `libnvrtc` can be dlopened by any of the names cudarc tries.
pub(crate) fn nvrtc_lib_present() -> bool {
    // SAFETY: as for `driver_lib_present`, for libnvrtc.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Whether `libcublas` can be dlopened by any of the names cudarc tries.
pub(crate) fn cublas_lib_present() -> bool {
    // SAFETY: as for `driver_lib_present`, for libcublas (which pulls in libcublasLt through its DT_NEEDED).
    unsafe { blas_sys::is_culib_present() }
}

/// The driver's CUDA version, e.g. 12080 for 12.8. Callers check `driver_lib_present()` first.
pub(crate) fn driver_version() -> Result<i32, DriverError> {
    let mut version: c_int = 0;
    // SAFETY: `version` is a valid out-pointer for the duration of the call; cuDriverGetVersion needs no cuInit.
    unsafe { drv_sys::cuDriverGetVersion(&mut version) }.result()?;
    Ok(version)
}

/// A device's total memory in bytes. `dev` must come from `cuDeviceGet` after a successful `cuInit`.
pub(crate) fn device_total_mem(dev: drv_sys::CUdevice) -> Result<usize, DriverError> {
    // SAFETY: `dev` was returned by cuDeviceGet (the caller's contract, kept by `probe::device_info`).
    unsafe { drv::device::total_mem(dev) }
}

/// A device attribute. `dev` must come from `cuDeviceGet` after a successful `cuInit`.
pub(crate) fn device_attribute(dev: drv_sys::CUdevice, attr: drv_sys::CUdevice_attribute) -> Result<i32, DriverError> {
    // SAFETY: as for `device_total_mem`.
    unsafe { drv::device::get_attribute(dev, attr) }
}

/// NVRTC's (major, minor) version. Callers check `nvrtc_lib_present()` first.
pub(crate) fn nvrtc_version() -> Result<(i32, i32), cudarc::nvrtc::result::NvrtcError> {
    let (mut major, mut minor): (c_int, c_int) = (0, 0);
    // SAFETY: both out-pointers are valid for the call.
    unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) }.result()?;
    Ok((major, minor))
}

/// Turns off cudarc's automatic per-allocation event tracking for `ctx`.
///
/// cudarc records a read and a write event per `CudaSlice` and makes launches wait on them; inside a stream capture
/// those waits would pull events recorded outside the capture into the graph (an invalid capture), and they would
/// duplicate the plan's own record/wait steps. The plan orders every access itself (`graph_plan::verify` checks it),
/// and `DeviceBuffer` synchronises the context before it frees, which are the two duties the cudarc docs hand back.
pub(crate) fn disable_event_tracking(ctx: &CudaContext) {
    // SAFETY: called once, right after the context is created and before any allocation or stream exists, so no
    // slice is half-tracked; the duties above (ordering, no free while in use) are kept by the plan's events and by
    // `DeviceBuffer`'s synchronising Drop.
    unsafe { ctx.disable_event_tracking() }
}

/// One kernel parameter's value, already checked against the kernel's signature by `device::Kernel`.
#[derive(Clone, Copy, Debug)]
pub(crate) enum RawArg {
    /// A device address.
    Ptr(u64),
    /// A 4-byte scalar, as its bit pattern.
    B4(u32),
    /// An 8-byte scalar, as its bit pattern.
    B8(u64),
}

/// Launches `func` on `stream` with `args`.
///
/// Preconditions (checked by `device::Stream::launch`): `args` match the kernel's parameters in number and size
/// (verified against the driver's own parameter layout when the driver can report it), every pointer lies inside a
/// live `DeviceBuffer`, and the launch dimensions are within device limits.
pub(crate) fn launch(
    ctx: &CudaContext,
    stream: &CudaStream,
    func: &CudaFunction,
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
    shared_mem_bytes: u32,
    args: &[RawArg],
) -> Result<(), DriverError> {
    ctx.bind_to_thread()?;
    // One 8-byte slot per parameter: cuLaunchKernel reads `size(param)` bytes from each pointer, and the first 4
    // bytes of a slot written with `to_ne_bytes` are the 4-byte value on either endianness.
    let mut slots: Vec<u64> = args
        .iter()
        .map(|a| match *a {
            RawArg::Ptr(p) | RawArg::B8(p) => p,
            RawArg::B4(v) => {
                let mut bytes = [0u8; 8];
                bytes[..4].copy_from_slice(&v.to_ne_bytes());
                u64::from_ne_bytes(bytes)
            }
        })
        .collect();
    let mut params: Vec<*mut std::ffi::c_void> =
        slots.iter_mut().map(|s| (s as *mut u64).cast::<std::ffi::c_void>()).collect();
    // SAFETY: `func` belongs to `ctx` (bound above) and stays loaded while `func` lives; `params` holds exactly one
    // valid pointer per kernel parameter (signature checked by the caller), each into `slots`, which outlives the
    // call (the driver copies parameter values before cuLaunchKernel returns); device pointers inside the values
    // were bounds-checked against live buffers, which are freed only after a full context synchronize.
    unsafe { drv::launch_kernel(func.cu_function(), grid, block, shared_mem_bytes, stream.cu_stream(), &mut params) }
}

/// The byte size of each parameter of `func` in order, or `None` when the driver is older than 12.4 and cannot say.
pub(crate) fn param_sizes(
    ctx: &CudaContext,
    func: &CudaFunction,
    driver_version: i32,
) -> Result<Option<Vec<usize>>, DriverError> {
    if driver_version < 12040 {
        // cuFuncGetParamInfo appeared in 12.4; cudarc would panic on the missing symbol.
        return Ok(None);
    }
    ctx.bind_to_thread()?;
    let mut sizes = Vec::new();
    // Kernel parameters are limited to 32 KiB, so 8192 4-byte parameters bounds the loop.
    for index in 0..8192usize {
        let (mut offset, mut size) = (0usize, 0usize);
        // SAFETY: `func` is a loaded function of the bound context; both out-pointers are valid for the call.
        let status = unsafe { drv_sys::cuFuncGetParamInfo(func.cu_function(), index, &mut offset, &mut size) };
        match status {
            drv_sys::CUresult::CUDA_SUCCESS => sizes.push(size),
            // One past the last parameter.
            drv_sys::CUresult::CUDA_ERROR_INVALID_VALUE => return Ok(Some(sizes)),
            other => return Err(DriverError(other)),
        }
    }
    Ok(Some(sizes))
}

/// Copies `src` to device address `dst` and waits until the copy is complete.
///
/// Precondition (checked by the caller): `[dst, dst + src.len())` lies inside a live buffer of `ctx`.
pub(crate) fn copy_htod_sync(ctx: &CudaContext, stream: &CudaStream, dst: u64, src: &[u8]) -> Result<(), DriverError> {
    ctx.bind_to_thread()?;
    // SAFETY: `dst` range is in bounds of a live allocation (caller's check); `src` is borrowed until the stream
    // synchronize below returns, so the driver never reads it after it is released.
    unsafe { drv::memcpy_htod_async(dst, src, stream.cu_stream()) }?;
    // SAFETY: `stream` is a live stream of the bound context.
    unsafe { drv::stream::synchronize(stream.cu_stream()) }
}

/// Copies from device address `src` into `dst` and waits until the copy is complete.
///
/// Precondition (checked by the caller): `[src, src + dst.len())` lies inside a live buffer of `ctx`.
pub(crate) fn copy_dtoh_sync(
    ctx: &CudaContext,
    stream: &CudaStream,
    dst: &mut [u8],
    src: u64,
) -> Result<(), DriverError> {
    ctx.bind_to_thread()?;
    // SAFETY: `src` range is in bounds of a live allocation (caller's check); `dst` is exclusively borrowed until
    // the synchronize below returns, so nothing else observes it while the driver writes it.
    unsafe { drv::memcpy_dtoh_async(dst, src, stream.cu_stream()) }?;
    // SAFETY: `stream` is a live stream of the bound context.
    unsafe { drv::stream::synchronize(stream.cu_stream()) }
}

/// Enqueues a device-to-device copy of `bytes` bytes (capturable).
///
/// Precondition (checked by the caller): both ranges lie inside live buffers of `ctx`.
pub(crate) fn copy_dtod_async(
    ctx: &CudaContext,
    stream: &CudaStream,
    dst: u64,
    src: u64,
    bytes: usize,
) -> Result<(), DriverError> {
    ctx.bind_to_thread()?;
    // SAFETY: both ranges are in bounds of live allocations (caller's check); device memory is freed only after a
    // full context synchronize, so the copy cannot outlive its buffers.
    unsafe { drv::memcpy_dtod_async(dst, src, bytes, stream.cu_stream()) }
}

/// Enqueues a copy of `bytes` bytes between two unified addresses (device memory or mapped pinned host memory);
/// capturable, since neither side is pageable host memory.
///
/// Precondition (checked by the caller): both ranges lie inside live `DeviceBuffer`s of `ctx`.
pub(crate) fn copy_unified_async(
    ctx: &CudaContext,
    stream: &CudaStream,
    dst: u64,
    src: u64,
    bytes: usize,
) -> Result<(), DriverError> {
    ctx.bind_to_thread()?;
    // SAFETY: both ranges are in bounds of live allocations (caller's check), device or pinned-and-mapped host
    // memory, whose unified addresses cuMemcpyAsync resolves itself; both are freed only after a full context
    // synchronize, so the copy cannot outlive them.
    unsafe { drv_sys::cuMemcpyAsync(dst, src, bytes, stream.cu_stream()) }.result()
}

/// Page-locked host memory mapped into the device's address space, zeroed, with its device address.
///
/// Flags: `PORTABLE` (pinned for every context) and `DEVICEMAP` (kernels and copies may use it through the
/// returned address; with unified addressing, which every 64-bit CUDA platform has, that address equals the
/// host pointer).
pub(crate) fn alloc_pinned_mapped(
    ctx: &Arc<CudaContext>,
    bytes: usize,
) -> Result<(cudarc::driver::PinnedHostSlice<u8>, u64), DriverError> {
    let flags = drv_sys::CU_MEMHOSTALLOC_PORTABLE | drv_sys::CU_MEMHOSTALLOC_DEVICEMAP;
    // SAFETY: the memory is zeroed below before anyone reads it; cudarc frees it in PinnedHostSlice's Drop.
    let mut slice = unsafe { ctx.alloc_pinned_with_flags::<u8>(bytes, flags) }?;
    slice.as_mut_slice()?.fill(0);
    let host = slice.as_mut_ptr()?;
    let mut dptr: drv_sys::CUdeviceptr = 0;
    // SAFETY: `host` is the start of a live allocation made with DEVICEMAP in the bound context; `dptr` is a valid
    // out-pointer for the call.
    unsafe { drv_sys::cuMemHostGetDevicePointer_v2(&mut dptr, host.cast::<std::ffi::c_void>(), 0) }.result()?;
    Ok((slice, dptr))
}

/// Enqueues a byte fill of `bytes` bytes at `dst` (capturable).
///
/// Precondition (checked by the caller): the range lies inside a live buffer of `ctx`.
pub(crate) fn memset_async(
    ctx: &CudaContext,
    stream: &CudaStream,
    dst: u64,
    value: u8,
    bytes: usize,
) -> Result<(), DriverError> {
    ctx.bind_to_thread()?;
    // SAFETY: the range is in bounds of a live allocation (caller's check), freed only after a context synchronize.
    unsafe { drv::memset_d8_async(dst, value, bytes, stream.cu_stream()) }
}

/// A column-major GEMM call with f32 compute, already validated by `blas::Blas`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GemmCall {
    pub trans_a: bool,
    pub trans_b: bool,
    pub m: c_int,
    pub n: c_int,
    pub k: c_int,
    pub alpha: f32,
    pub a: u64,
    pub lda: c_int,
    pub stride_a: i64,
    pub b: u64,
    pub ldb: c_int,
    pub stride_b: i64,
    pub beta: f32,
    pub c: u64,
    pub ldc: c_int,
    pub stride_c: i64,
    pub batch: c_int,
    pub types: GemmTypes,
}

/// cuBLAS's name for an element type.
fn data_type(t: GemmType) -> blas_sys::cudaDataType {
    match t {
        GemmType::F32 => blas_sys::cudaDataType::CUDA_R_32F,
        GemmType::F16 => blas_sys::cudaDataType::CUDA_R_16F,
        GemmType::BF16 => blas_sys::cudaDataType::CUDA_R_16BF,
    }
}

/// cuBLAS's transpose flag.
fn op(transposed: bool) -> blas_sys::cublasOperation_t {
    if transposed {
        blas_sys::cublasOperation_t::CUBLAS_OP_T
    } else {
        blas_sys::cublasOperation_t::CUBLAS_OP_N
    }
}

/// Owns one cuBLAS handle, bound to one stream and one workspace for its whole life.
///
/// Unlike cudarc's `CudaBlas`, whose Drop unwraps, a failed destroy here is logged, never a panic.
pub(crate) struct BlasHandle {
    handle: blas_sys::cublasHandle_t,
    ctx: Arc<CudaContext>,
}

impl BlasHandle {
    /// Makes the handle's context current on this thread (every call below needs it).
    fn bind(&self) -> Result<(), (&'static str, CublasError)> {
        self.ctx
            .bind_to_thread()
            .map_err(|_| ("cuCtxSetCurrent", CublasError(blas_sys::cublasStatus_t::CUBLAS_STATUS_NOT_INITIALIZED)))
    }

    /// Creates a handle on `stream` using `[workspace, workspace + workspace_bytes)` as its workspace.
    ///
    /// Preconditions: `cublas_lib_present()` was checked; the workspace lies in a live buffer that outlives the
    /// handle (the `blas::Blas` owner declares the handle before the buffer, so it drops first).
    pub(crate) fn new(
        ctx: &Arc<CudaContext>,
        stream: &CudaStream,
        workspace: u64,
        workspace_bytes: usize,
    ) -> Result<Self, (&'static str, CublasError)> {
        ctx.bind_to_thread()
            .map_err(|_| ("cuCtxSetCurrent", CublasError(blas_sys::cublasStatus_t::CUBLAS_STATUS_NOT_INITIALIZED)))?;
        let handle = cudarc::cublas::result::create_handle().map_err(|e| ("cublasCreate_v2", e))?;
        // Own it at once so that any error below still destroys it.
        let owned = Self { handle, ctx: ctx.clone() };
        // SAFETY: `handle` is live; `stream` is a live stream of the bound context and outlives the handle (the
        // `Blas` owner holds an Arc of it).
        unsafe { cudarc::cublas::result::set_stream(owned.handle, stream.cu_stream() as _) }
            .map_err(|e| ("cublasSetStream_v2", e))?;
        // An explicit workspace keeps cuBLAS from allocating inside a stream capture (which would fail or leak
        // into the graph) and keeps concurrent handles on different streams from sharing one.
        // SAFETY: the range is a live device allocation that outlives the handle (precondition above).
        unsafe { blas_sys::cublasSetWorkspace_v2(owned.handle, workspace as *mut std::ffi::c_void, workspace_bytes) }
            .result()
            .map_err(|e| ("cublasSetWorkspace_v2", e))?;
        // Plain FP32 arithmetic: no TF32 tensor-op shortcut, so f32 results stay comparable with the simulator's.
        // The default math mode plus DISALLOW_REDUCED_PRECISION_REDUCTION (0 | 16, the variant of value 16): in a
        // half GEMM with a half C, reductions (split-K) stay in the f32 compute type instead of the output type,
        // so the result is rounded to half once, on the store, as exec-sim rounds it. f32 GEMMs are unaffected.
        // SAFETY: `handle` is live.
        unsafe {
            blas_sys::cublasSetMathMode(
                owned.handle,
                blas_sys::cublasMath_t::CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION,
            )
        }
        .result()
        .map_err(|e| ("cublasSetMathMode", e))?;
        Ok(owned)
    }

    /// Enqueues `call` on the handle's stream: for f32 operands one `cublasSgemm_v2` when `batch == 1`, else the
    /// strided batch; for f16/bf16 operands `cublasGemmEx` / `cublasGemmStridedBatchedEx` with
    /// `CUBLAS_COMPUTE_32F` (f32 accumulation, f32 alpha and beta) and the default algorithm.
    ///
    /// Precondition (checked by `blas::Blas`): the type pair is one cuBLAS takes with f32 compute; every operand's
    /// extent, from its leading dimension, stride, batch and element size, lies inside a live buffer, at an address
    /// aligned to its element size; dimensions and leading dimensions are positive and fit `c_int`.
    pub(crate) fn gemm(&self, call: &GemmCall) -> Result<(), (&'static str, CublasError)> {
        self.bind()?;
        if call.types != GemmTypes::F32 {
            return self.gemm_ex(call, op(call.trans_a), op(call.trans_b));
        }
        if call.batch == 1 {
            // SAFETY: operands are in bounds of live buffers (caller's check); alpha and beta are host values
            // (the handle's default host pointer mode) read before the call returns.
            unsafe {
                cudarc::cublas::result::sgemm(
                    self.handle,
                    op(call.trans_a),
                    op(call.trans_b),
                    call.m,
                    call.n,
                    call.k,
                    &call.alpha,
                    call.a as *const f32,
                    call.lda,
                    call.b as *const f32,
                    call.ldb,
                    &call.beta,
                    call.c as *mut f32,
                    call.ldc,
                )
            }
            .map_err(|e| ("cublasSgemm_v2", e))
        } else {
            // SAFETY: as above, with each operand's extent including its `(batch - 1) * stride` (caller's check).
            unsafe {
                cudarc::cublas::result::sgemm_strided_batched(
                    self.handle,
                    op(call.trans_a),
                    op(call.trans_b),
                    call.m,
                    call.n,
                    call.k,
                    &call.alpha,
                    call.a as *const f32,
                    call.lda,
                    call.stride_a,
                    call.b as *const f32,
                    call.ldb,
                    call.stride_b,
                    &call.beta,
                    call.c as *mut f32,
                    call.ldc,
                    call.stride_c,
                    call.batch,
                )
            }
            .map_err(|e| ("cublasSgemmStridedBatched", e))
        }
    }

    /// The f16/bf16 half of [`BlasHandle::gemm`] (same preconditions).
    fn gemm_ex(
        &self,
        call: &GemmCall,
        trans_a: blas_sys::cublasOperation_t,
        trans_b: blas_sys::cublasOperation_t,
    ) -> Result<(), (&'static str, CublasError)> {
        let (ab, c) = (data_type(call.types.ab), data_type(call.types.c));
        let compute = blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F;
        let algo = blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT;
        // With CUBLAS_COMPUTE_32F, alpha and beta are f32 host values (the handle's default pointer mode).
        let alpha = (&call.alpha as *const f32).cast::<std::ffi::c_void>();
        let beta = (&call.beta as *const f32).cast::<std::ffi::c_void>();
        if call.batch == 1 {
            // SAFETY: operands are in bounds of live buffers and aligned to their element sizes, which are the
            // sizes of the `ab`/`c` types passed alongside (caller's check); the pair is one cuBLAS takes with
            // CUBLAS_COMPUTE_32F (`GemmTypes::is_valid`, checked by the caller); alpha and beta point at f32
            // values that live until the call returns, and cuBLAS reads them before it does.
            unsafe {
                cudarc::cublas::result::gemm_ex(
                    self.handle,
                    trans_a,
                    trans_b,
                    call.m,
                    call.n,
                    call.k,
                    alpha,
                    call.a as *const std::ffi::c_void,
                    ab,
                    call.lda,
                    call.b as *const std::ffi::c_void,
                    ab,
                    call.ldb,
                    beta,
                    call.c as *mut std::ffi::c_void,
                    c,
                    call.ldc,
                    compute,
                    algo,
                )
            }
            .map_err(|e| ("cublasGemmEx", e))
        } else {
            // SAFETY: as above, with each operand's extent including its `(batch - 1) * stride` (caller's check).
            unsafe {
                cudarc::cublas::result::gemm_strided_batched_ex(
                    self.handle,
                    trans_a,
                    trans_b,
                    call.m,
                    call.n,
                    call.k,
                    alpha,
                    call.a as *const std::ffi::c_void,
                    ab,
                    call.lda,
                    call.stride_a,
                    call.b as *const std::ffi::c_void,
                    ab,
                    call.ldb,
                    call.stride_b,
                    beta,
                    call.c as *mut std::ffi::c_void,
                    c,
                    call.ldc,
                    call.stride_c,
                    call.batch,
                    compute,
                    algo,
                )
            }
            .map_err(|e| ("cublasGemmStridedBatchedEx", e))
        }
    }
}

impl BlasHandle {
    /// Enqueues `count` products of one shape as one `cublasGemmBatchedEx` with `CUBLAS_COMPUTE_32F` (f32
    /// compute, f32 alpha and beta, whatever the operand types; cuBLAS takes f32 operands there with plain FP32
    /// arithmetic under the handle's math mode). `arrays` is the device address of `3 * count` operand addresses:
    /// every A, then every B, then every C. The call's `a`, `b`, `c`, strides and batch are not read.
    ///
    /// Precondition (checked by `blas::Blas::gemm_pointers`): as [`BlasHandle::gemm`] for each product, batch 1;
    /// `arrays` lies in a live device buffer of at least `24 * count` bytes, 8-byte aligned, holding those
    /// addresses, and the buffer outlives every run of the enqueued call (a captured graph reads it at replay).
    pub(crate) fn gemm_pointers(
        &self,
        call: &GemmCall,
        arrays: u64,
        count: c_int,
    ) -> Result<(), (&'static str, CublasError)> {
        self.bind()?;
        let (ab, c) = (data_type(call.types.ab), data_type(call.types.c));
        let alpha = (&call.alpha as *const f32).cast::<std::ffi::c_void>();
        let beta = (&call.beta as *const f32).cast::<std::ffi::c_void>();
        // usize -> u64 is lossless on every target CUDA supports; `count` is positive (caller's check).
        let n = u64::try_from(count).unwrap_or(0);
        let array = |i: u64| arrays + i * n * 8;
        // SAFETY: the three arrays hold `count` addresses each, inside one live device buffer (precondition);
        // every address they hold is an operand whose extent at batch 1 lies in a live pool buffer, aligned to its
        // element size, with the pair cuBLAS takes with CUBLAS_COMPUTE_32F (checked at prepare); alpha and beta
        // point at f32 host values (the handle's default pointer mode) read before the call returns.
        unsafe {
            blas_sys::cublasGemmBatchedEx(
                self.handle,
                op(call.trans_a),
                op(call.trans_b),
                call.m,
                call.n,
                call.k,
                alpha,
                array(0) as *const *const std::ffi::c_void,
                ab,
                call.lda,
                array(1) as *const *const std::ffi::c_void,
                ab,
                call.ldb,
                beta,
                array(2) as *const *mut std::ffi::c_void,
                c,
                call.ldc,
                count,
                blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .result()
        .map_err(|e| ("cublasGemmBatchedEx", e))
    }
}

impl Drop for BlasHandle {
    fn drop(&mut self) {
        if let Err(e) = self.ctx.bind_to_thread() {
            tracing::warn!(error = ?e, "binding the context to destroy a cuBLAS handle failed");
        }
        // SAFETY: the handle is live and owned by this value alone; nothing uses it after Drop.
        if let Err(e) = unsafe { cudarc::cublas::result::destroy_handle(self.handle) } {
            tracing::warn!(status = ?e.0, "cublasDestroy_v2 failed");
        }
    }
}

/// Whether `libcublasLt` can be dlopened by any of the names cudarc tries.
pub(crate) fn cublaslt_lib_present() -> bool {
    // SAFETY: as for `driver_lib_present`, for libcublasLt.
    unsafe { lt_sys::is_culib_present() }
}

/// One f32 `cublasLtMatmul` (batch 1) with an epilogue: `D = act(alpha * op(A) op(B) + residual + bias)`, D at
/// the call's `c` (the residual, when given, is cuBLASLt's C with beta 1; else C is D with beta 0), column-major
/// as [`GemmCall`].
pub(crate) struct LtCall {
    pub gemm: GemmCall,
    /// Device address of `m` f32 bias values (one per row of the column-major D), or 0 for none.
    pub bias: u64,
    /// Device address of a matrix of D's layout added with beta 1 (cuBLASLt's C), or 0 for none (beta 0).
    pub residual: u64,
    /// `CUBLASLT_EPILOGUE_*` for the bias and activation.
    pub epilogue: lt_sys::cublasLtEpilogue_t,
    /// The workspace cuBLASLt may use (the stream's cuBLAS workspace: calls on one stream never overlap).
    pub workspace: u64,
    /// Its size in bytes.
    pub workspace_bytes: usize,
}

/// The epilogue value for a bias (or none) and an activation.
pub(crate) fn lt_epilogue(bias: bool, activation: crate::codegen::LtActivation) -> lt_sys::cublasLtEpilogue_t {
    use crate::codegen::LtActivation as A;
    use lt_sys::cublasLtEpilogue_t as E;
    match (bias, activation) {
        (false, A::None) => E::CUBLASLT_EPILOGUE_DEFAULT,
        (false, A::Relu) => E::CUBLASLT_EPILOGUE_RELU,
        (false, A::GeluTanh) => E::CUBLASLT_EPILOGUE_GELU,
        (true, A::None) => E::CUBLASLT_EPILOGUE_BIAS,
        (true, A::Relu) => E::CUBLASLT_EPILOGUE_RELU_BIAS,
        (true, A::GeluTanh) => E::CUBLASLT_EPILOGUE_GELU_BIAS,
    }
}

/// Destroys a cuBLASLt descriptor when dropped (errors are logged: nothing can be done about them).
struct LtGuard<T: Copy> {
    raw: T,
    destroy: unsafe fn(T) -> Result<(), cudarc::cublaslt::result::CublasError>,
}

impl<T: Copy> Drop for LtGuard<T> {
    fn drop(&mut self) {
        // SAFETY: `raw` was created by the matching create call and is destroyed once, here.
        if let Err(e) = unsafe { (self.destroy)(self.raw) } {
            tracing::warn!(status = ?e.0, "destroying a cuBLASLt descriptor failed");
        }
    }
}

/// Owns one cuBLASLt handle (cuBLASLt handles are not bound to a stream: each call names its stream).
pub(crate) struct LtHandle {
    handle: lt_sys::cublasLtHandle_t,
    ctx: Arc<CudaContext>,
}

impl LtHandle {
    /// Creates a handle. Precondition: `cublaslt_lib_present()` was checked.
    pub(crate) fn new(ctx: &Arc<CudaContext>) -> Result<Self, (&'static str, String)> {
        ctx.bind_to_thread().map_err(|e| ("cuCtxSetCurrent", format!("{e:?}")))?;
        let handle = cudarc::cublaslt::result::create_handle().map_err(|e| ("cublasLtCreate", format!("{:?}", e.0)))?;
        Ok(Self { handle, ctx: ctx.clone() })
    }

    /// Enqueues `call` on `stream`: a matmul descriptor (f32 compute and scale, the transposes, the epilogue and
    /// bias pointer), the three layouts, the heuristic's first algorithm within the workspace, the call; the
    /// descriptors are destroyed when it returns (cuBLASLt copies what it needs at enqueue, so a captured call
    /// keeps them).
    ///
    /// Precondition (checked by `blas::Blas::gemm_lt`): as [`BlasHandle::gemm`] for an f32 call of batch 1; the
    /// bias, when given, is `m` f32 values in a live buffer, 4-byte aligned; the workspace lies in a live buffer
    /// of `workspace_bytes` that outlives the call, used by no other stream.
    pub(crate) fn matmul(&self, stream: &CudaStream, call: &LtCall) -> Result<(), (&'static str, String)> {
        use cudarc::cublaslt::result as lt;
        use lt_sys::cublasLtMatmulDescAttributes_t as D;
        let status = |call: &'static str| move |e: lt::CublasError| (call, format!("{:?}", e.0));
        self.ctx.bind_to_thread().map_err(|e| ("cuCtxSetCurrent", format!("{e:?}")))?;
        let g = &call.gemm;
        let f32_t = lt_sys::cudaDataType::CUDA_R_32F;
        let desc = LtGuard {
            raw: lt::create_matmul_desc(lt_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F, f32_t)
                .map_err(status("cublasLtMatmulDescCreate"))?,
            destroy: lt::destroy_matmul_desc,
        };
        // cublasOperation_t as the int32 the attribute holds: CUBLAS_OP_N = 0, CUBLAS_OP_T = 1.
        let (ta, tb) = (i32::from(g.trans_a), i32::from(g.trans_b));
        let bias = call.bias as *const std::ffi::c_void;
        // SAFETY: `desc` is live; each buffer is a value of the attribute's documented type (cublasOperation_t,
        // cublasLtEpilogue_t: 32-bit values; the bias pointer: a device address), read before the call returns.
        unsafe {
            let set = |attr: D, buf: *const std::ffi::c_void, size: usize| {
                lt::set_matmul_desc_attribute(desc.raw, attr, buf, size)
            };
            set(D::CUBLASLT_MATMUL_DESC_TRANSA, (&ta as *const i32).cast(), size_of_val(&ta))
                .map_err(status("cublasLtMatmulDescSetAttribute(TRANSA)"))?;
            set(D::CUBLASLT_MATMUL_DESC_TRANSB, (&tb as *const i32).cast(), size_of_val(&tb))
                .map_err(status("cublasLtMatmulDescSetAttribute(TRANSB)"))?;
            set(
                D::CUBLASLT_MATMUL_DESC_EPILOGUE,
                (&call.epilogue as *const lt_sys::cublasLtEpilogue_t).cast(),
                size_of_val(&call.epilogue),
            )
            .map_err(status("cublasLtMatmulDescSetAttribute(EPILOGUE)"))?;
            if call.bias != 0 {
                set(
                    D::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                    (&bias as *const *const std::ffi::c_void).cast(),
                    size_of_val(&bias),
                )
                .map_err(status("cublasLtMatmulDescSetAttribute(BIAS_POINTER)"))?;
            }
        }
        // Stored shapes: A is k x m transposed or m x k, B n x k transposed or k x n, D m x n.
        let dims = |t: bool, r: c_int, c: c_int| if t { (c, r) } else { (r, c) };
        let as_u64 = |v: c_int| u64::try_from(v).unwrap_or(0);
        let layout = |(rows, cols): (c_int, c_int), ld: c_int| {
            lt::create_matrix_layout(f32_t, as_u64(rows), as_u64(cols), i64::from(ld))
                .map(|raw| LtGuard { raw, destroy: lt::destroy_matrix_layout })
                .map_err(status("cublasLtMatrixLayoutCreate"))
        };
        let la = layout(dims(g.trans_a, g.m, g.k), g.lda)?;
        let lb = layout(dims(g.trans_b, g.k, g.n), g.ldb)?;
        let ld = layout((g.m, g.n), g.ldc)?;
        let pref = LtGuard {
            raw: lt::create_matmul_pref().map_err(status("cublasLtMatmulPreferenceCreate"))?,
            destroy: lt::destroy_matmul_pref,
        };
        let ws = u64::try_from(call.workspace_bytes).unwrap_or(0);
        // SAFETY: `pref` is live; the attribute is a uint64_t, read before the call returns.
        unsafe {
            lt::set_matmul_pref_attribute(
                pref.raw,
                lt_sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&ws as *const u64).cast(),
                size_of_val(&ws),
            )
        }
        .map_err(status("cublasLtMatmulPreferenceSetAttribute"))?;
        // The heuristic assumes 256-byte aligned operands unless told otherwise; pool offsets are only aligned to
        // their elements, so each operand's actual alignment (capped at 256) rules out algorithms that need more.
        let align = |addr: u64| -> u32 {
            if addr == 0 {
                256
            } else {
                1u32 << addr.trailing_zeros().min(8)
            }
        };
        use lt_sys::cublasLtMatmulPreferenceAttributes_t as P;
        for (attr, addr) in [
            (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, g.a),
            (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, g.b),
            (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, if call.residual != 0 { call.residual } else { g.c }),
            (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, g.c),
        ] {
            let a = align(addr);
            // SAFETY: `pref` is live; the attribute is a uint32_t, read before the call returns.
            unsafe { lt::set_matmul_pref_attribute(pref.raw, attr, (&a as *const u32).cast(), size_of_val(&a)) }
                .map_err(status("cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT)"))?;
        }
        // SAFETY: every descriptor is live; the heuristic only reads them.
        let heuristic =
            unsafe { lt::get_matmul_algo_heuristic(self.handle, desc.raw, la.raw, lb.raw, ld.raw, ld.raw, pref.raw) }
                .map_err(status("cublasLtMatmulAlgoGetHeuristic"))?;
        // With a residual, C is it (beta 1) and D the output; else C is D and is not read (beta 0).
        let (c_in, beta) = if call.residual != 0 { (call.residual, 1f32) } else { (g.c, 0f32) };
        // SAFETY: operands, bias, residual and workspace lie in live device buffers of the extents the layouts
        // describe (precondition, checked by the caller); C is the residual (D's layout) or D itself (beta 0: not
        // read); alpha and beta are f32 host values
        // (the descriptor's default host pointer mode) read before the call returns; the algorithm came from the
        // heuristic for these descriptors and needs at most the workspace given to it.
        unsafe {
            lt::matmul(
                self.handle,
                desc.raw,
                (&g.alpha as *const f32).cast(),
                (&beta as *const f32).cast(),
                g.a as *const std::ffi::c_void,
                la.raw,
                g.b as *const std::ffi::c_void,
                lb.raw,
                c_in as *const std::ffi::c_void,
                ld.raw,
                g.c as *mut std::ffi::c_void,
                ld.raw,
                &heuristic.algo,
                call.workspace as *mut std::ffi::c_void,
                call.workspace_bytes,
                stream.cu_stream() as lt_sys::cudaStream_t,
            )
        }
        .map_err(status("cublasLtMatmul"))
    }
}

impl Drop for LtHandle {
    fn drop(&mut self) {
        if let Err(e) = self.ctx.bind_to_thread() {
            tracing::warn!(error = ?e, "binding the context to destroy a cuBLASLt handle failed");
        }
        // SAFETY: the handle is live and owned by this value alone; nothing uses it after Drop.
        if let Err(e) = unsafe { cudarc::cublaslt::result::destroy_handle(self.handle) } {
            tracing::warn!(status = ?e.0, "cublasLtDestroy failed");
        }
    }
}
