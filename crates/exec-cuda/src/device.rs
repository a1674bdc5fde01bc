//! RAII owners of the device's resources: the context, region buffers, streams, events, loaded modules and kernels.
//!
//! Every handle is owned by exactly one value here (or by the cudarc value it wraps) and released on Drop. Device
//! addresses handed to kernels are [`DevicePtr`]s, which only a bounds-checked [`DeviceBuffer::range`] makes and
//! which borrow their buffer, so no launch or copy can name memory outside a live allocation.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::sys::{CUevent_flags, CUresult};
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr as _, PinnedHostSlice,
};

use crate::error::{check_identifier, driver, CudaError, CudaResult};
use crate::ffi::{self, RawArg};
use crate::nvrtc::Ptx;
use crate::probe::{self, DeviceInfo};

/// One CUDA device with its primary context, ready for a plan's resources.
///
/// Opening a device turns off cudarc's automatic per-allocation event tracking: the plan's own record/wait steps
/// order every access, and stream capture requires that no hidden event waits are inserted.
pub struct Device {
    ctx: Arc<CudaContext>,
    info: DeviceInfo,
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Device").field("info", &self.info).finish_non_exhaustive()
    }
}

impl Device {
    /// Opens device `ordinal`.
    ///
    /// # Errors
    /// [`CudaError::NoDriver`] / [`CudaError::NoDevice`] as [`probe::device_info`]; [`CudaError::Driver`] when the
    /// context cannot be created.
    pub fn open(ordinal: usize) -> CudaResult<Self> {
        let info = probe::device_info(ordinal)?;
        let ctx = probe::guard("the CUDA driver", || CudaContext::new(ordinal))
            .map_err(|reason| CudaError::NoDriver { reason })?
            .map_err(driver("cuDevicePrimaryCtxRetain"))?;
        ffi::disable_event_tracking(&ctx);
        tracing::info!(
            device = %info.name,
            arch = %info.arch(),
            driver = ?info.driver_version_pair(),
            "opened CUDA device"
        );
        Ok(Self { ctx, info })
    }

    /// What the driver reports about this device.
    #[must_use]
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// Allocates `bytes` of zeroed device memory labelled `label` (the plan region it holds), ready for use on any
    /// stream when this returns.
    ///
    /// # Errors
    /// [`CudaError::OutOfMemory`] when the device cannot hold it; [`CudaError::Driver`] otherwise.
    pub fn alloc(&self, label: &str, bytes: usize) -> CudaResult<DeviceBuffer> {
        // A zero-byte region still gets a valid (one-byte) allocation so that its base address is real.
        let len = bytes.max(1);
        let stream = self.ctx.default_stream();
        let slice = stream.alloc_zeros::<u8>(len).map_err(|e| match e.0 {
            CUresult::CUDA_ERROR_OUT_OF_MEMORY => CudaError::OutOfMemory { requested: bytes },
            _ => driver("cuMemAllocAsync")(e),
        })?;
        // Streams are non-blocking, so they do not order after the legacy default stream's allocation and memset.
        stream.synchronize().map_err(driver("cuStreamSynchronize"))?;
        // With event tracking off, the returned guard records nothing.
        let base = slice.device_ptr(&stream).0;
        Ok(DeviceBuffer {
            label: label.to_owned(),
            bytes,
            base,
            ctx: self.ctx.clone(),
            storage: Some(Storage::Device(slice)),
        })
    }

    /// Allocates `bytes` of zeroed, page-locked host memory mapped into the device's address space, labelled
    /// `label`. Kernels and [`Stream::copy`] reach it through the same [`DevicePtr`]s as device memory, a copy into
    /// it is capturable (it is not pageable), and the host reads it in place ([`DeviceBuffer::host_bytes`]) once
    /// the work that wrote it is done. The plan's host region (Memcpy-to-host results) lives here.
    ///
    /// # Errors
    /// [`CudaError::OutOfMemory`] when the host cannot pin that much; [`CudaError::Driver`] otherwise.
    pub fn alloc_host_mapped(&self, label: &str, bytes: usize) -> CudaResult<DeviceBuffer> {
        let len = bytes.max(1);
        let (slice, base) = ffi::alloc_pinned_mapped(&self.ctx, len).map_err(|e| match e.0 {
            CUresult::CUDA_ERROR_OUT_OF_MEMORY => CudaError::OutOfMemory { requested: bytes },
            _ => driver("cuMemHostAlloc")(e),
        })?;
        Ok(DeviceBuffer {
            label: label.to_owned(),
            bytes,
            base,
            ctx: self.ctx.clone(),
            storage: Some(Storage::Pinned(slice)),
        })
    }

    /// Creates a non-blocking stream.
    ///
    /// # Errors
    /// [`CudaError::Driver`].
    pub fn stream(&self) -> CudaResult<Stream> {
        let inner = self.ctx.new_stream().map_err(driver("cuStreamCreate"))?;
        Ok(Stream { inner, ctx: self.ctx.clone() })
    }

    /// Creates an event with timing disabled (the cheapest kind, and the kind stream capture turns into edges).
    ///
    /// # Errors
    /// [`CudaError::Driver`].
    pub fn event(&self) -> CudaResult<Event> {
        let inner =
            self.ctx.new_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING)).map_err(driver("cuEventCreate"))?;
        Ok(Event { inner })
    }

    /// Creates an event that records a timestamp, for [`Event::elapsed_us`] (not for plan ordering: timing events
    /// cost more to record).
    ///
    /// # Errors
    /// [`CudaError::Driver`].
    pub fn timing_event(&self) -> CudaResult<Event> {
        let inner = self.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(driver("cuEventCreate"))?;
        Ok(Event { inner })
    }

    /// Loads a compiled module into the context.
    ///
    /// # Errors
    /// [`CudaError::Driver`] (`CUDA_ERROR_UNSUPPORTED_PTX_VERSION` means the driver is older than NVRTC).
    pub fn load(&self, ptx: &Ptx) -> CudaResult<Module> {
        let inner = self.ctx.load_module(cudarc::nvrtc::Ptx::from_src(ptx.text())).map_err(|e| {
            let mut err = driver("cuModuleLoadData")(e);
            if e.0 == CUresult::CUDA_ERROR_UNSUPPORTED_PTX_VERSION {
                if let CudaError::Driver { detail, .. } = &mut err {
                    let (maj, min) = self.info.driver_version_pair();
                    detail.push_str(&format!(
                        " (PTX from NVRTC needs a driver at least as new as NVRTC; this driver is CUDA {maj}.{min})"
                    ));
                }
            }
            err
        })?;
        Ok(Module {
            inner,
            program: ptx.kernel().to_owned(),
            ctx: self.ctx.clone(),
            driver_version: i32::try_from(self.info.driver_version).unwrap_or(0),
        })
    }

    /// Waits for all work on the device.
    ///
    /// # Errors
    /// [`CudaError::Driver`], including errors of earlier asynchronous work.
    pub fn synchronize(&self) -> CudaResult<()> {
        self.ctx.synchronize().map_err(driver("cuCtxSynchronize"))
    }

    pub(crate) fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
}

/// One device allocation: a plan region (the activation pool, the weights, the io area).
pub struct DeviceBuffer {
    label: String,
    bytes: usize,
    base: u64,
    ctx: Arc<CudaContext>,
    // Option so that Drop can free it after synchronising.
    storage: Option<Storage>,
}

/// What a [`DeviceBuffer`] owns.
enum Storage {
    /// Device memory (held only to be freed on drop: kernels reach it through `base`).
    Device(#[allow(dead_code)] CudaSlice<u8>),
    /// Pinned host memory mapped into the device's address space.
    Pinned(PinnedHostSlice<u8>),
}

impl fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("label", &self.label)
            .field("bytes", &self.bytes)
            .field("base", &format_args!("{:#x}", self.base))
            .field("host", &self.is_host())
            .finish()
    }
}

impl DeviceBuffer {
    /// The label given at allocation.
    #[must_use]
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Size in bytes.
    #[must_use]
    pub fn len(&self) -> usize {
        self.bytes
    }

    /// True for a zero-byte buffer.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    /// The device range `[offset, offset + bytes)` of this buffer, for `what` (named in the error).
    ///
    /// # Errors
    /// [`CudaError::OutOfBounds`] when the range does not lie inside the buffer.
    pub fn range(&self, what: &str, offset: usize, bytes: usize) -> CudaResult<DevicePtr<'_>> {
        match offset.checked_add(bytes) {
            Some(end) if end <= self.bytes => {
                Ok(DevicePtr { addr: self.base + offset as u64, bytes, _buffer: PhantomData })
            }
            _ => Err(CudaError::OutOfBounds {
                what: what.to_owned(),
                buffer: self.label.clone(),
                offset,
                bytes,
                size: self.bytes,
            }),
        }
    }

    /// The whole buffer as one range.
    #[must_use]
    pub fn all(&self) -> DevicePtr<'_> {
        DevicePtr { addr: self.base, bytes: self.bytes, _buffer: PhantomData }
    }

    /// True for mapped pinned host memory ([`Device::alloc_host_mapped`]).
    #[must_use]
    pub fn is_host(&self) -> bool {
        matches!(self.storage, Some(Storage::Pinned(_)))
    }

    /// The bytes `[offset, offset + bytes)` of a host buffer, read in place. The caller first waits for the work
    /// that writes them (a stream synchronize): the device may write this memory at any time.
    ///
    /// # Errors
    /// [`CudaError::OutOfBounds`] outside the buffer; [`CudaError::Unsupported`] for device memory (copy it with
    /// [`Stream::copy_to_host`] instead).
    pub fn host_bytes(&self, what: &str, offset: usize, bytes: usize) -> CudaResult<&[u8]> {
        self.range(what, offset, bytes)?;
        match &self.storage {
            Some(Storage::Pinned(p)) => {
                let all = p.as_slice().map_err(driver("cuEventSynchronize"))?;
                all.get(offset..offset + bytes).ok_or_else(|| CudaError::OutOfBounds {
                    what: what.to_owned(),
                    buffer: self.label.clone(),
                    offset,
                    bytes,
                    size: all.len(),
                })
            }
            _ => Err(CudaError::Unsupported {
                kernel: what.to_owned(),
                what: format!("buffer `{}` is device memory, not host memory", self.label),
            }),
        }
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // Event tracking is off, so cudarc does not know which streams still use this memory: wait for all of them
        // before the free is enqueued.
        if let Err(e) = self.ctx.synchronize() {
            tracing::warn!(buffer = %self.label, error = ?e, "synchronize before freeing a device buffer failed");
        }
        drop(self.storage.take());
    }
}

/// A bounds-checked device range borrowed from a [`DeviceBuffer`].
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct DevicePtr<'a> {
    addr: u64,
    bytes: usize,
    _buffer: PhantomData<&'a DeviceBuffer>,
}

impl fmt::Debug for DevicePtr<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DevicePtr({:#x}, {} bytes)", self.addr, self.bytes)
    }
}

impl DevicePtr<'_> {
    /// The device address.
    #[must_use]
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// The range's length in bytes.
    #[must_use]
    pub fn len(&self) -> usize {
        self.bytes
    }

    /// True for an empty range.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }
}

/// A CUDA stream (non-blocking with respect to the legacy default stream).
#[derive(Clone)]
pub struct Stream {
    inner: Arc<CudaStream>,
    ctx: Arc<CudaContext>,
}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Stream({:p})", self.inner.cu_stream())
    }
}

impl Stream {
    /// Records `event` at the current end of this stream.
    ///
    /// # Errors
    /// [`CudaError::Driver`].
    pub fn record(&self, event: &Event) -> CudaResult<()> {
        event.inner.record(&self.inner).map_err(driver("cuEventRecord"))
    }

    /// Makes later work on this stream wait for `event`'s recorded work.
    ///
    /// # Errors
    /// [`CudaError::Driver`].
    pub fn wait(&self, event: &Event) -> CudaResult<()> {
        self.inner.wait(&event.inner).map_err(driver("cuStreamWaitEvent"))
    }

    /// Blocks until this stream's work is done.
    ///
    /// # Errors
    /// [`CudaError::Driver`], including errors of earlier asynchronous work.
    pub fn synchronize(&self) -> CudaResult<()> {
        self.inner.synchronize().map_err(driver("cuStreamSynchronize"))
    }

    /// Enqueues `kernel` with `args`.
    ///
    /// # Errors
    /// [`CudaError::Signature`] when `args` do not match the kernel's parameters; [`CudaError::Unsupported`] for
    /// launch dimensions beyond CUDA's limits; [`CudaError::Driver`] when the launch fails.
    pub fn launch(&self, kernel: &Kernel, dims: LaunchDims, args: &[KernelArg<'_>]) -> CudaResult<()> {
        dims.check(&kernel.name)?;
        let raw = kernel.check_args(args)?;
        ffi::launch(&self.ctx, &self.inner, &kernel.func, dims.grid, dims.block, dims.shared_mem_bytes, &raw)
            .map_err(driver("cuLaunchKernel"))
    }

    /// Copies `src` into `dst` and waits for the copy (not capturable: host memory is pageable).
    ///
    /// # Errors
    /// [`CudaError::OutOfBounds`] when the lengths differ; [`CudaError::Driver`].
    pub fn copy_to_device(&self, dst: DevicePtr<'_>, src: &[u8]) -> CudaResult<()> {
        same_len("host-to-device copy", dst.bytes, src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        ffi::copy_htod_sync(&self.ctx, &self.inner, dst.addr, src).map_err(driver("cuMemcpyHtoDAsync"))
    }

    /// Copies `src` into `dst` and waits for the copy (not capturable).
    ///
    /// # Errors
    /// [`CudaError::OutOfBounds`] when the lengths differ; [`CudaError::Driver`].
    pub fn copy_to_host(&self, dst: &mut [u8], src: DevicePtr<'_>) -> CudaResult<()> {
        same_len("device-to-host copy", src.bytes, dst.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        ffi::copy_dtoh_sync(&self.ctx, &self.inner, dst, src.addr).map_err(driver("cuMemcpyDtoHAsync"))
    }

    /// Enqueues a device-to-device copy (capturable).
    ///
    /// # Errors
    /// [`CudaError::OutOfBounds`] when the lengths differ; [`CudaError::Driver`].
    pub fn copy_device(&self, dst: DevicePtr<'_>, src: DevicePtr<'_>) -> CudaResult<()> {
        same_len("device-to-device copy", dst.bytes, src.bytes)?;
        if src.bytes == 0 {
            return Ok(());
        }
        ffi::copy_dtod_async(&self.ctx, &self.inner, dst.addr, src.addr, src.bytes).map_err(driver("cuMemcpyDtoDAsync"))
    }

    /// Enqueues a copy between any two ranges of [`DeviceBuffer`]s, device or mapped host memory (capturable).
    ///
    /// # Errors
    /// [`CudaError::OutOfBounds`] when the lengths differ; [`CudaError::Driver`].
    pub fn copy(&self, dst: DevicePtr<'_>, src: DevicePtr<'_>) -> CudaResult<()> {
        same_len("copy", dst.bytes, src.bytes)?;
        if src.bytes == 0 {
            return Ok(());
        }
        ffi::copy_unified_async(&self.ctx, &self.inner, dst.addr, src.addr, src.bytes).map_err(driver("cuMemcpyAsync"))
    }

    /// Enqueues a fill of `dst` with the byte `value` (capturable).
    ///
    /// # Errors
    /// [`CudaError::Driver`].
    pub fn fill(&self, dst: DevicePtr<'_>, value: u8) -> CudaResult<()> {
        if dst.bytes == 0 {
            return Ok(());
        }
        ffi::memset_async(&self.ctx, &self.inner, dst.addr, value, dst.bytes).map_err(driver("cuMemsetD8Async"))
    }

    pub(crate) fn cuda(&self) -> &Arc<CudaStream> {
        &self.inner
    }
}

fn same_len(what: &str, device: usize, host: usize) -> CudaResult<()> {
    if device == host {
        Ok(())
    } else {
        Err(CudaError::OutOfBounds {
            what: format!("{what} of {host} bytes"),
            buffer: "(device range)".to_owned(),
            offset: 0,
            bytes: host,
            size: device,
        })
    }
}

/// A CUDA event created with timing disabled.
pub struct Event {
    inner: CudaEvent,
}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Event({:p})", self.inner.cu_event())
    }
}

impl Event {
    /// Blocks until the recorded work is done.
    ///
    /// # Errors
    /// [`CudaError::Driver`].
    pub fn synchronize(&self) -> CudaResult<()> {
        self.inner.synchronize().map_err(driver("cuEventSynchronize"))
    }

    /// Microseconds between this event's and `later`'s recorded timestamps, both created with
    /// [`Device::timing_event`] and both complete (synchronize `later` first). CUDA's resolution is about 0.5 us.
    ///
    /// # Errors
    /// [`CudaError::Driver`] (`CUDA_ERROR_INVALID_HANDLE` for events created without timing).
    pub fn elapsed_us(&self, later: &Event) -> CudaResult<f64> {
        let ms = self.inner.elapsed_ms(&later.inner).map_err(driver("cuEventElapsedTime"))?;
        Ok(f64::from(ms) * 1000.0)
    }
}

/// A loaded module (one compiled program).
pub struct Module {
    inner: Arc<CudaModule>,
    program: String,
    ctx: Arc<CudaContext>,
    driver_version: i32,
}

impl fmt::Debug for Module {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Module").field("program", &self.program).finish_non_exhaustive()
    }
}

impl Module {
    /// Looks up the entry point `name` and declares its parameters.
    ///
    /// When the driver can report a function's parameter layout (CUDA 12.4 and later) the declaration is checked
    /// against it, so a launch can never pass fewer or differently sized arguments than the kernel reads.
    ///
    /// # Errors
    /// [`CudaError::InvalidName`]; [`CudaError::Driver`] when there is no such entry point;
    /// [`CudaError::Signature`] when `params` disagree with the compiled function.
    pub fn kernel(&self, name: &str, params: &[ParamKind]) -> CudaResult<Kernel> {
        check_identifier("entry point", name)?;
        let func = self.inner.load_function(name).map_err(driver("cuModuleGetFunction"))?;
        if let Some(sizes) =
            ffi::param_sizes(&self.ctx, &func, self.driver_version).map_err(driver("cuFuncGetParamInfo"))?
        {
            check_layout(name, params, &sizes)?;
        }
        Ok(Kernel { name: name.to_owned(), func, params: params.to_vec() })
    }
}

/// Checks declared parameters against the sizes the driver reports.
pub(crate) fn check_layout(kernel: &str, params: &[ParamKind], sizes: &[usize]) -> CudaResult<()> {
    if params.len() != sizes.len() {
        return Err(CudaError::Signature {
            kernel: kernel.to_owned(),
            detail: format!("declared {} parameters, the compiled function has {}", params.len(), sizes.len()),
        });
    }
    for (i, (p, &s)) in params.iter().zip(sizes).enumerate() {
        if p.size() != s {
            return Err(CudaError::Signature {
                kernel: kernel.to_owned(),
                detail: format!("parameter {i} declared {p:?} ({} bytes), compiled as {s} bytes", p.size()),
            });
        }
    }
    Ok(())
}

/// The kind of one kernel parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ParamKind {
    /// A device pointer.
    Ptr,
    /// `int`.
    I32,
    /// `unsigned int`.
    U32,
    /// `long long`.
    I64,
    /// `unsigned long long`.
    U64,
    /// `float`.
    F32,
}

impl ParamKind {
    /// Size in bytes on the device.
    #[must_use]
    pub fn size(self) -> usize {
        match self {
            Self::I32 | Self::U32 | Self::F32 => 4,
            Self::Ptr | Self::I64 | Self::U64 => 8,
        }
    }
}

/// One argument of a launch.
#[derive(Clone, Copy, Debug)]
pub enum KernelArg<'a> {
    /// A device range; the kernel receives its address.
    Ptr(DevicePtr<'a>),
    /// `int`.
    I32(i32),
    /// `unsigned int`.
    U32(u32),
    /// `long long`.
    I64(i64),
    /// `unsigned long long`.
    U64(u64),
    /// `float`.
    F32(f32),
}

impl KernelArg<'_> {
    /// The parameter kind this argument fills.
    #[must_use]
    pub fn kind(&self) -> ParamKind {
        match self {
            Self::Ptr(_) => ParamKind::Ptr,
            Self::I32(_) => ParamKind::I32,
            Self::U32(_) => ParamKind::U32,
            Self::I64(_) => ParamKind::I64,
            Self::U64(_) => ParamKind::U64,
            Self::F32(_) => ParamKind::F32,
        }
    }

    fn raw(&self) -> RawArg {
        match *self {
            Self::Ptr(p) => RawArg::Ptr(p.addr),
            Self::I32(v) => RawArg::B4(u32::from_ne_bytes(v.to_ne_bytes())),
            Self::U32(v) => RawArg::B4(v),
            Self::F32(v) => RawArg::B4(v.to_bits()),
            Self::I64(v) => RawArg::B8(u64::from_ne_bytes(v.to_ne_bytes())),
            Self::U64(v) => RawArg::B8(v),
        }
    }
}

/// An entry point of a loaded module with its declared parameters.
#[derive(Clone)]
pub struct Kernel {
    name: String,
    func: CudaFunction,
    params: Vec<ParamKind>,
}

impl fmt::Debug for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Kernel").field("name", &self.name).field("params", &self.params).finish_non_exhaustive()
    }
}

impl Kernel {
    /// The entry point's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The declared parameters.
    #[must_use]
    pub fn params(&self) -> &[ParamKind] {
        &self.params
    }

    fn check_args(&self, args: &[KernelArg<'_>]) -> CudaResult<Vec<RawArg>> {
        check_args(&self.name, &self.params, args)?;
        Ok(args.iter().map(KernelArg::raw).collect())
    }
}

/// Checks launch arguments against declared parameters.
pub(crate) fn check_args(kernel: &str, params: &[ParamKind], args: &[KernelArg<'_>]) -> CudaResult<()> {
    if params.len() != args.len() {
        return Err(CudaError::Signature {
            kernel: kernel.to_owned(),
            detail: format!("{} parameters, {} arguments", params.len(), args.len()),
        });
    }
    for (i, (p, a)) in params.iter().zip(args).enumerate() {
        if *p != a.kind() {
            return Err(CudaError::Signature {
                kernel: kernel.to_owned(),
                detail: format!("argument {i} is {:?}, parameter is {p:?}", a.kind()),
            });
        }
    }
    Ok(())
}

/// Grid and block dimensions of a launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchDims {
    /// Blocks in x, y, z.
    pub grid: (u32, u32, u32),
    /// Threads per block in x, y, z.
    pub block: (u32, u32, u32),
    /// Dynamic shared memory per block in bytes.
    pub shared_mem_bytes: u32,
}

/// CUDA's limits: 1024 threads per block, 2^31 - 1 blocks in x, 65535 in y and z, 64 threads in block z.
const MAX_BLOCK_THREADS: u64 = 1024;
const MAX_GRID_X: u64 = (1 << 31) - 1;
const MAX_GRID_YZ: u32 = 65_535;

impl LaunchDims {
    /// One thread per element for `n` elements in blocks of `block` threads (a 1-D grid).
    ///
    /// # Errors
    /// [`CudaError::Unsupported`] when `block` is 0 or over 1024, or `n` needs more than 2^31 - 1 blocks.
    pub fn linear(n: u64, block: u32) -> CudaResult<Self> {
        if block == 0 || u64::from(block) > MAX_BLOCK_THREADS {
            return Err(unsupported_dims(format!("block of {block} threads")));
        }
        let blocks = n.div_ceil(u64::from(block)).max(1);
        if blocks > MAX_GRID_X {
            return Err(unsupported_dims(format!("{n} elements need {blocks} blocks")));
        }
        Ok(Self { grid: (u32::try_from(blocks).unwrap_or(u32::MAX), 1, 1), block: (block, 1, 1), shared_mem_bytes: 0 })
    }

    /// Total threads launched.
    #[must_use]
    pub fn threads(&self) -> u64 {
        let (g, b) = (self.grid, self.block);
        u64::from(g.0) * u64::from(g.1) * u64::from(g.2) * u64::from(b.0) * u64::from(b.1) * u64::from(b.2)
    }

    fn check(&self, kernel: &str) -> CudaResult<()> {
        let (g, b) = (self.grid, self.block);
        let block_threads = u64::from(b.0) * u64::from(b.1) * u64::from(b.2);
        let problem = if g.0 == 0 || g.1 == 0 || g.2 == 0 || block_threads == 0 {
            Some("an empty grid or block".to_owned())
        } else if block_threads > MAX_BLOCK_THREADS || b.2 > 64 {
            Some(format!("block {b:?} exceeds 1024 threads (or 64 in z)"))
        } else if u64::from(g.0) > MAX_GRID_X || g.1 > MAX_GRID_YZ || g.2 > MAX_GRID_YZ {
            Some(format!("grid {g:?} exceeds CUDA's limits"))
        } else {
            None
        };
        match problem {
            None => Ok(()),
            Some(what) => Err(CudaError::Unsupported { kernel: kernel.to_owned(), what }),
        }
    }
}

fn unsupported_dims(what: String) -> CudaError {
    CudaError::Unsupported { kernel: "(launch dimensions)".to_owned(), what }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn layout_check_names_the_parameter() {
        assert_eq!(check_layout("k", &[ParamKind::Ptr, ParamKind::I32], &[8, 4]), Ok(()));
        let e = check_layout("k", &[ParamKind::Ptr, ParamKind::I64], &[8, 4]).unwrap_err();
        assert!(
            matches!(&e, CudaError::Signature { kernel, detail } if kernel == "k" && detail.contains("parameter 1"))
        );
        let e = check_layout("k", &[ParamKind::Ptr], &[8, 4]).unwrap_err();
        assert!(
            matches!(&e, CudaError::Signature { detail, .. } if detail.contains("declared 1 parameters, the compiled function has 2"))
        );
    }

    #[test]
    fn args_must_match_params() {
        let params = [ParamKind::U64, ParamKind::F32];
        assert_eq!(check_args("k", &params, &[KernelArg::U64(3), KernelArg::F32(1.0)]), Ok(()));
        let e = check_args("k", &params, &[KernelArg::U64(3), KernelArg::I32(1)]).unwrap_err();
        assert!(
            matches!(&e, CudaError::Signature { detail, .. } if detail.contains("argument 1 is I32, parameter is F32"))
        );
        assert!(check_args("k", &params, &[KernelArg::U64(3)]).is_err());
    }

    #[test]
    fn raw_args_keep_bit_patterns() {
        assert!(matches!(KernelArg::F32(1.5).raw(), RawArg::B4(b) if b == 1.5f32.to_bits()));
        assert!(matches!(KernelArg::I32(-1).raw(), RawArg::B4(u32::MAX)));
        assert!(matches!(KernelArg::I64(-2).raw(), RawArg::B8(b) if b == u64::MAX - 1));
    }

    #[test]
    fn dims_limits() {
        assert!(LaunchDims::linear(10, 0).is_err());
        assert!(LaunchDims::linear(10, 1025).is_err());
        assert_eq!(LaunchDims::linear(0, 256).map(|d| d.grid), Ok((1, 1, 1)));
        let bad = LaunchDims { grid: (1, 65_536, 1), block: (32, 1, 1), shared_mem_bytes: 0 };
        assert!(matches!(bad.check("k"), Err(CudaError::Unsupported { .. })));
        let bad = LaunchDims { grid: (1, 1, 1), block: (32, 32, 2), shared_mem_bytes: 0 };
        assert!(bad.check("k").is_err());
        let ok = LaunchDims { grid: (4, 2, 1), block: (32, 8, 4), shared_mem_bytes: 0 };
        assert_eq!(ok.check("k"), Ok(()));
        assert_eq!(ok.threads(), 8 * 1024);
    }

    proptest! {
        /// A linear launch covers every element with less than one block to spare and passes the limit check;
        /// it is refused exactly when the grid would exceed 2^31 - 1 blocks.
        #[test]
        fn linear_covers_exactly(n in 0u64..(1u64 << 42), block in 1u32..=1024) {
            match LaunchDims::linear(n, block) {
                Ok(d) => {
                    let threads = d.threads();
                    prop_assert!(threads >= n);
                    prop_assert!(threads < n.max(1) + u64::from(block));
                    prop_assert_eq!(d.check("k"), Ok(()));
                }
                Err(e) => {
                    prop_assert!(n.div_ceil(u64::from(block)) > MAX_GRID_X, "{e}");
                }
            }
        }
    }
}
