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

/// Owns one cuBLAS handle, bound to one stream and one workspace for its whole life.
///
/// Unlike cudarc's `CudaBlas`, whose Drop unwraps, a failed destroy here is logged, never a panic.
pub(crate) struct BlasHandle {
    handle: blas_sys::cublasHandle_t,
    ctx: Arc<CudaContext>,
}

impl BlasHandle {
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
        self.ctx
            .bind_to_thread()
            .map_err(|_| ("cuCtxSetCurrent", CublasError(blas_sys::cublasStatus_t::CUBLAS_STATUS_NOT_INITIALIZED)))?;
        let op = |t: bool| {
            if t {
                blas_sys::cublasOperation_t::CUBLAS_OP_T
            } else {
                blas_sys::cublasOperation_t::CUBLAS_OP_N
            }
        };
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
    pub(crate) fn gemm_pointers(&self, call: &GemmCall, arrays: u64, count: c_int) -> Result<(), (&'static str, CublasError)> {
        self.ctx
            .bind_to_thread()
            .map_err(|_| ("cuCtxSetCurrent", CublasError(blas_sys::cublasStatus_t::CUBLAS_STATUS_NOT_INITIALIZED)))?;
        let op = |t: bool| {
            if t {
                blas_sys::cublasOperation_t::CUBLAS_OP_T
            } else {
                blas_sys::cublasOperation_t::CUBLAS_OP_N
            }
        };
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
