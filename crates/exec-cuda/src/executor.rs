//! The CUDA backend behind graph-plan's `Executor` trait (DESIGN.md section 6).
//!
//! `prepare`: open the device, allocate one buffer per plan region (the host region as mapped pinned host
//! memory), upload weights and constants, generate every kernel, compile each distinct source once (NVRTC, or the
//! PTX cache), load each distinct PTX once, create the plan's streams and events, and, in [`SubmitMode::Graph`],
//! capture the whole step list into one CUDA graph with the multi-stream fork/join recipe. `run`: copy the inputs
//! into their io ranges, replay the graph on stream 0 (or, in [`SubmitMode::Eager`], enqueue every step on its
//! stream between the same fork and join), wait, and copy the outputs back.
//!
//! Both modes enqueue the very same calls in the same order ([`Work::enqueue`]), so they compute the same bytes;
//! only the driver's submission cost differs, which [`CudaPrepared::time_runs`] measures with CUDA events.

use std::collections::HashMap;
use std::path::PathBuf;

use graph_plan::exec::check_tensors;
use graph_plan::{
    set::Dims, BindingRole, BufferRef, ExecError, ExecutionPlan, Executor, HostTensor, PlanSet, PlanStep, PreparedPlan,
    Region, SetError, TensorMap, Unavailable,
};

use crate::blas::{Blas, PointerArrays};
use crate::capture::{capture, fork_sides, join_sides, Graph};
use crate::codegen::{self, CodegenOptions, KernelSource, Launch};
use crate::device::{Device, DeviceBuffer, DevicePtr, Event, Kernel, KernelArg, LaunchDims, Module, Stream};
use crate::error::{CudaError, CudaResult};
use crate::nvrtc::{CompileCache, CompileOptions};

const BACKEND: &str = "cuda";

/// How a prepared plan submits its steps on each run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SubmitMode {
    /// Capture the steps once, at prepare, into one CUDA graph; each run is one graph launch.
    #[default]
    Graph,
    /// Enqueue every step on its stream at each run (one driver call per launch, copy, record and wait), without
    /// capture: for comparison with graph replay, and to tell a capture problem from a kernel problem.
    Eager,
}

impl SubmitMode {
    /// Lowercase name (`graph`, `eager`), as reports print it.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Graph => "graph",
            Self::Eager => "eager",
        }
    }
}

/// How [`CudaExecutor`] runs plans.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CudaOptions {
    /// The device ordinal.
    pub ordinal: usize,
    /// Graph replay or eager submission.
    pub mode: SubmitMode,
    /// Run eligible MatMul/Gemm through cuBLAS when libcublas can be loaded. When it cannot (or when this is
    /// off), products run as generated per-element kernels: slower, same semantics, and no error.
    pub cublas: bool,
    /// A directory of compiled PTX to read and fill (see [`CompileCache::with_dir`]); `None` uses
    /// `$CUPLAN_PTX_CACHE` when set. With a filled directory, a machine without NVRTC runs plans whose kernels
    /// were compiled elsewhere.
    pub ptx_cache: Option<PathBuf>,
}

impl CudaOptions {
    /// Graph mode with cuBLAS on device `ordinal`.
    #[must_use]
    pub fn new(ordinal: usize) -> Self {
        Self { ordinal, mode: SubmitMode::Graph, cublas: true, ptx_cache: None }
    }

    fn compile_cache(&self) -> CompileCache {
        match &self.ptx_cache {
            Some(dir) => CompileCache::with_dir(dir),
            None => CompileCache::from_env(),
        }
    }

    fn ptx_dir(&self) -> Option<PathBuf> {
        self.ptx_cache
            .clone()
            .or_else(|| std::env::var_os("CUPLAN_PTX_CACHE").filter(|d| !d.is_empty()).map(PathBuf::from))
    }
}

/// Runs plans on one NVIDIA GPU.
#[derive(Clone, Debug)]
pub struct CudaExecutor {
    options: CudaOptions,
}

impl Default for CudaExecutor {
    fn default() -> Self {
        Self::new(0)
    }
}

impl CudaExecutor {
    /// The executor for device `ordinal`: graph replay, cuBLAS when present.
    #[must_use]
    pub fn new(ordinal: usize) -> Self {
        Self { options: CudaOptions::new(ordinal) }
    }

    /// The executor with explicit options.
    #[must_use]
    pub fn with_options(options: CudaOptions) -> Self {
        Self { options }
    }

    /// Its options.
    #[must_use]
    pub fn options(&self) -> &CudaOptions {
        &self.options
    }

    /// [`Executor::prepare`] with this backend's own error type.
    ///
    /// # Errors
    /// Environment errors ([`CudaError::is_unavailable`]), device errors, and [`CudaError::Unsupported`] for a
    /// kernel the code generator cannot express.
    pub fn prepare_cuda(&self, plan: &ExecutionPlan, weights: &TensorMap) -> CudaResult<CudaPrepared> {
        CudaPrepared::new(&self.options, plan, weights)
    }

    /// Prepare a plan set once (see [`CudaPreparedSet`]): one allocation per region, one weight upload, one
    /// captured graph per member. Needs a device, like `prepare`.
    ///
    /// # Errors
    /// [`ExecError`] for missing or mismatched weights; the device's errors as [`ExecError::Backend`].
    pub fn prepare_set(&self, set: &PlanSet, weights: &TensorMap) -> Result<CudaPreparedSet, ExecError> {
        for m in set.members() {
            check_tensors(&m.plan, weights, BindingRole::Weight)?;
        }
        CudaPreparedSet::new(&self.options, set, weights).map_err(exec_error)
    }
}

fn exec_error(e: CudaError) -> ExecError {
    match e {
        CudaError::Unsupported { kernel, what } => ExecError::Unsupported { kernel, what },
        other => ExecError::Backend { backend: BACKEND, message: other.to_string() },
    }
}

impl Executor for CudaExecutor {
    type Prepared = CudaPrepared;

    fn name(&self) -> &'static str {
        BACKEND
    }

    /// A driver and the device are required; NVRTC is required unless a PTX cache directory is configured (a
    /// kernel missing from it is then reported by `prepare`, naming the kernel).
    fn availability(&self) -> Result<(), Unavailable> {
        let unavailable = |e: CudaError| Unavailable { backend: BACKEND, reason: e.to_string() };
        crate::probe::device_info(self.options.ordinal).map_err(unavailable)?;
        if let Err(e) = crate::probe::nvrtc_availability() {
            match self.options.ptx_dir() {
                Some(dir) if dir.is_dir() => {
                    tracing::info!(dir = %dir.display(), "NVRTC unavailable: kernels must come from the PTX cache");
                }
                _ => return Err(unavailable(e)),
            }
        }
        Ok(())
    }

    fn prepare(&self, plan: &ExecutionPlan, weights: &TensorMap) -> Result<CudaPrepared, ExecError> {
        check_tensors(plan, weights, BindingRole::Weight)?;
        self.prepare_cuda(plan, weights).map_err(exec_error)
    }
}

/// What `prepare` did, for reports.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PrepareInfo {
    /// Submission mode.
    pub mode: SubmitMode,
    /// The device's name.
    pub device: String,
    /// Plan kernels.
    pub kernels: usize,
    /// Kernels with a generated launch (the rest are plain cuBLAS calls).
    pub launched_kernels: usize,
    /// Distinct kernel sources (= PTX modules loaded).
    pub distinct_sources: usize,
    /// Sources NVRTC compiled in this prepare.
    pub compiled: u64,
    /// Sources found in the PTX cache directory.
    pub from_disk: u64,
    /// Products that run on cuBLAS (a kernel of sibling products has several).
    pub cublas_products: usize,
    /// cuBLAS calls one run enqueues: products of one shape in one kernel share one pointer-array call
    /// (`codegen::gemm_launches`), so this is at most `cublas_products` plus the loops of permuted stores.
    pub cublas_calls: usize,
    /// Why cuBLAS is not used, when products fell back to generated kernels.
    pub cublas_fallback: Option<String>,
    /// Products cuBLAS cannot run on this device in their precision (a bf16 product below compute capability
    /// 8.0), one [`CudaError::PrecisionUnsupported`] each, naming the node: they run as generated kernels.
    pub cublas_refused: Vec<CudaError>,
    /// Driver calls one eager run enqueues (launches, cuBLAS calls, copies, records, waits, fork and join).
    pub eager_calls: usize,
}

/// The device resources one plan's steps need beyond the regions and streams it runs on: its kernels, cuBLAS
/// handles, events and, in graph mode, its captured graph. A prepared plan holds one; a prepared set one per
/// member, over the set's shared regions and streams.
///
/// Fields drop in declaration order: the graph before the kernels it names, the kernels before their modules.
struct PlanResources {
    graph: Option<Graph>,
    blas: Vec<Option<Blas>>,
    gemms: Vec<Vec<PreparedGemm>>,
    kernels: Vec<Option<Kernel>>,
    _modules: Vec<Module>,
    events: Vec<Event>,
    sources: Vec<KernelSource>,
    inputs: Vec<(String, BufferRef)>,
    outputs: Vec<(String, graph_plan::DType, graph_plan::Shape, BufferRef)>,
    info: PrepareInfo,
}

/// The regions, streams and fork/join events a prepared plan or set owns, with the device context.
///
/// Fields drop in declaration order: everything before the device context.
struct Shared {
    fork: Event,
    joins: Vec<Event>,
    timer: (Event, Event),
    streams: Vec<Stream>,
    regions: Vec<DeviceBuffer>,
    device: Device,
}

/// A plan ready to run: its device resources and, in graph mode, the instantiated graph.
///
/// Fields drop in declaration order: the plan's resources (graph, kernels) before the buffers and streams they
/// name, everything before the device context.
pub struct CudaPrepared {
    res: PlanResources,
    shared: Shared,
    plan: ExecutionPlan,
}

impl std::fmt::Debug for CudaPrepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaPrepared")
            .field("info", &self.res.info)
            .field("streams", &self.shared.streams.len())
            .field("regions", &self.shared.regions)
            .finish_non_exhaustive()
    }
}

fn range<'a>(regions: &'a [DeviceBuffer], what: &str, b: BufferRef) -> CudaResult<DevicePtr<'a>> {
    let buf = region_buffer(regions, what, b)?;
    let (offset, bytes) = (usize::try_from(b.offset), usize::try_from(b.bytes));
    match (offset, bytes) {
        (Ok(o), Ok(n)) => buf.range(what, o, n),
        _ => Err(CudaError::OutOfBounds {
            what: what.to_owned(),
            buffer: b.region.name().to_owned(),
            offset: usize::MAX,
            bytes: usize::MAX,
            size: buf.len(),
        }),
    }
}

fn region_buffer<'a>(regions: &'a [DeviceBuffer], what: &str, b: BufferRef) -> CudaResult<&'a DeviceBuffer> {
    regions.get(b.region.index()).ok_or_else(|| CudaError::Unsupported {
        kernel: what.to_owned(),
        what: format!("region {} is not allocated", b.region.name()),
    })
}

fn dims(src: &KernelSource) -> CudaResult<LaunchDims> {
    match src.launch {
        Launch::Elements { threads, block } => LaunchDims::linear(threads, block),
        Launch::Rows { rows, block } => Ok(LaunchDims {
            grid: (
                u32::try_from(rows).map_err(|_| CudaError::Unsupported {
                    kernel: src.name.clone(),
                    what: format!("{rows} rows exceed one grid"),
                })?,
                1,
                1,
            ),
            block: (block, 1, 1),
            shared_mem_bytes: 0,
        }),
        Launch::Fixed { grid, block, shared_mem_bytes } => Ok(LaunchDims {
            grid: (grid[0], grid[1], grid[2]),
            block: (block[0], block[1], block[2]),
            shared_mem_bytes,
        }),
        Launch::None => Err(CudaError::Unsupported { kernel: src.name.clone(), what: "no launch".to_owned() }),
    }
}

/// One cuBLAS call of a kernel, ready to enqueue (`codegen::GemmLaunch` with its pointer arrays written).
enum PreparedGemm {
    /// A plain or strided-batched call.
    Call(codegen::BlasCall),
    /// Products of one shape in one `cublasGemmBatchedEx`.
    Pointers { gemm: crate::blas::ColMajorGemm, arrays: PointerArrays },
    /// One `cublasLtMatmul` with its bias and activation.
    Lt(codegen::BlasCall, codegen::LtEpilogue),
}

/// The cuBLAS calls of every kernel (`codegen::gemm_launches`), with the operand arrays of pointer-array calls
/// checked and written into device memory once, through `stream`.
fn prepare_gemms(
    device: &Device,
    stream: &Stream,
    regions: &[DeviceBuffer],
    sources: &[KernelSource],
) -> CudaResult<Vec<Vec<PreparedGemm>>> {
    sources
        .iter()
        .map(|src| {
            codegen::gemm_launches(&src.blas)
                .into_iter()
                .map(|launch| match launch {
                    codegen::GemmLaunch::Strided(call) => Ok(PreparedGemm::Call(call)),
                    codegen::GemmLaunch::Lt(call, epilogue) => Ok(PreparedGemm::Lt(call, epilogue)),
                    codegen::GemmLaunch::Pointers { gemm, operands } => {
                        let ptrs = operands
                            .iter()
                            .map(|o| {
                                Ok([
                                    range(regions, &src.name, o[0])?,
                                    range(regions, &src.name, o[1])?,
                                    range(regions, &src.name, o[2])?,
                                ])
                            })
                            .collect::<CudaResult<Vec<_>>>()?;
                        let arrays = PointerArrays::new(device, stream, &gemm, &ptrs)?;
                        Ok(PreparedGemm::Pointers { gemm, arrays })
                    }
                })
                .collect()
        })
        .collect()
}

/// Everything one submission of the plan's steps needs, borrowed: the same code enqueues them inside a capture and
/// eagerly.
struct Work<'a> {
    steps: &'a [PlanStep],
    sources: &'a [KernelSource],
    kernels: &'a [Option<Kernel>],
    blas: &'a [Option<Blas>],
    gemms: &'a [Vec<PreparedGemm>],
    events: &'a [Event],
    regions: &'a [DeviceBuffer],
}

impl Work<'_> {
    /// Enqueues every step on its stream, in submission order. `streams[i]` is plan stream `i`.
    fn enqueue(&self, streams: &[Stream]) -> CudaResult<()> {
        let regions = self.regions;
        for step in self.steps {
            let stream_of = |s: graph_plan::StreamId| {
                streams.get(s.index()).ok_or_else(|| CudaError::Unsupported {
                    kernel: "(plan)".to_owned(),
                    what: format!("step on {s}, the plan has {} streams", streams.len()),
                })
            };
            let event_of = |e: graph_plan::EventId| {
                self.events.get(e.index()).ok_or_else(|| CudaError::Unsupported {
                    kernel: "(plan)".to_owned(),
                    what: format!("event {e} beyond the plan's {}", self.events.len()),
                })
            };
            match step {
                PlanStep::Launch { stream, kernel, .. } => {
                    let s = stream_of(*stream)?;
                    let src = self.sources.get(kernel.index()).ok_or_else(|| CudaError::Unsupported {
                        kernel: kernel.to_string(),
                        what: "launch of a kernel the plan lacks".to_owned(),
                    })?;
                    let gemms = self.gemms.get(kernel.index()).map_or(&[][..], Vec::as_slice);
                    if !gemms.is_empty() {
                        let handle = self.blas.get(stream.index()).and_then(Option::as_ref).ok_or_else(|| {
                            CudaError::Unsupported {
                                kernel: src.name.clone(),
                                what: "no cuBLAS handle on its stream".to_owned(),
                            }
                        })?;
                        for g in gemms {
                            match g {
                                PreparedGemm::Call(call) => handle.gemm(
                                    &call.gemm,
                                    range(regions, &src.name, call.a)?,
                                    range(regions, &src.name, call.b)?,
                                    range(regions, &src.name, call.c)?,
                                )?,
                                PreparedGemm::Pointers { gemm, arrays } => handle.gemm_pointers(gemm, arrays)?,
                                PreparedGemm::Lt(call, epilogue) => handle.gemm_lt(
                                    &call.gemm,
                                    epilogue.activation,
                                    range(regions, &src.name, call.a)?,
                                    range(regions, &src.name, call.b)?,
                                    range(regions, &src.name, call.c)?,
                                    epilogue.bias.map(|b| range(regions, &src.name, b)).transpose()?,
                                    epilogue.residual.map(|b| range(regions, &src.name, b)).transpose()?,
                                )?,
                            }
                        }
                    }
                    if let Some(Some(k)) = self.kernels.get(kernel.index()) {
                        let args = src
                            .args
                            .iter()
                            .map(|&b| range(regions, &src.name, b).map(KernelArg::Ptr))
                            .collect::<CudaResult<Vec<_>>>()?;
                        s.launch(k, dims(src)?, &args)?;
                    }
                }
                PlanStep::Record { stream, event } => stream_of(*stream)?.record(event_of(*event)?)?,
                PlanStep::Wait { stream, event } => stream_of(*stream)?.wait(event_of(*event)?)?,
                PlanStep::Copy { stream, src, dst, bytes, .. } => {
                    let n = *bytes;
                    let sub = |b: BufferRef| BufferRef { bytes: n, ..b };
                    // Device <-> device or device <-> the mapped host region: one unified-address copy either way.
                    stream_of(*stream)?.copy(
                        range(regions, "copy destination", sub(*dst))?,
                        range(regions, "copy source", sub(*src))?,
                    )?;
                }
            }
        }
        Ok(())
    }

    /// Driver calls of one eager submission.
    fn calls(&self, side_streams: usize) -> usize {
        let steps: usize = self
            .steps
            .iter()
            .map(|s| match s {
                PlanStep::Launch { kernel, .. } => self.sources.get(kernel.index()).map_or(0, |src| {
                    self.gemms.get(kernel.index()).map_or(0, Vec::len) + usize::from(src.launch != Launch::None)
                }),
                _ => 1,
            })
            .sum();
        // Fork: one record, one wait per side stream; join: one record and one wait per side stream.
        steps + 1 + 3 * side_streams
    }
}

/// cuBLAS handles for the streams that launch a product (none when no kernel uses cuBLAS).
fn blas_handles(
    device: &Device,
    streams: &[Stream],
    plan: &ExecutionPlan,
    sources: &[KernelSource],
) -> CudaResult<Vec<Option<Blas>>> {
    let mut blas: Vec<Option<Blas>> = (0..streams.len()).map(|_| None).collect();
    for step in &plan.steps {
        if let PlanStep::Launch { stream, kernel, .. } = step {
            let s = stream.index();
            if sources.get(kernel.index()).is_some_and(|k| !k.blas.is_empty()) && s < blas.len() && blas[s].is_none() {
                blas[s] = Some(Blas::new(device, &streams[s])?);
            }
        }
    }
    Ok(blas)
}

/// Replaces every cuBLAS anchor of `sources` (generated for `plan`, in kernel order) whose operand type cuBLAS
/// cannot run on a device of compute capability `capability` ([`crate::blas::Matmul::check_device`]) by its
/// generated per-element kernel, and returns one [`CudaError::PrecisionUnsupported`] per replaced anchor, naming
/// its node. A pure function of the plan, the sources and the capability: testable without a GPU.
///
/// # Errors
/// [`CudaError::Unsupported`] when a replacement cannot be generated (it always can for a MatMul/Gemm).
pub fn refuse_unsupported_products(
    plan: &ExecutionPlan,
    sources: &mut [KernelSource],
    capability: (u32, u32),
) -> CudaResult<Vec<CudaError>> {
    let mut refused = Vec::new();
    for (kernel, src) in plan.kernels().iter().zip(sources.iter_mut()) {
        let node = kernel.body.first().map_or(kernel.name.as_str(), |i| i.node.as_ref());
        if let Some(e) = src.blas.iter().find_map(|b| b.matmul.check_device(node, capability).err()) {
            *src = codegen::generate_with(kernel, &CodegenOptions { cublas: false })?;
            refused.push(e);
        }
    }
    Ok(refused)
}

impl Shared {
    /// Open the device, allocate the regions (the host region as mapped pinned host memory) and create `streams`
    /// streams with their fork/join and timing events.
    fn open(options: &CudaOptions, sizes: [u64; 4], streams: usize) -> CudaResult<Self> {
        let device = Device::open(options.ordinal)?;
        let regions = Region::ALL
            .iter()
            .map(|&r| {
                let bytes =
                    usize::try_from(sizes[r.index()]).map_err(|_| CudaError::OutOfMemory { requested: usize::MAX })?;
                if r == Region::Host {
                    device.alloc_host_mapped(r.name(), bytes)
                } else {
                    device.alloc(r.name(), bytes)
                }
            })
            .collect::<CudaResult<Vec<_>>>()?;
        let streams = (0..streams.max(1)).map(|_| device.stream()).collect::<CudaResult<Vec<_>>>()?;
        let fork = device.event()?;
        let joins = streams[1..].iter().map(|_| device.event()).collect::<CudaResult<Vec<_>>>()?;
        let timer = (device.timing_event()?, device.timing_event()?);
        Ok(Shared { fork, joins, timer, streams, regions, device })
    }

    /// Copy `plan`'s weights and constants into their ranges (on stream 0, asynchronously).
    fn upload(&self, plan: &ExecutionPlan, weights: &TensorMap) -> CudaResult<()> {
        for b in plan.bindings() {
            let data = match b.role {
                BindingRole::Constant => b.data.as_deref().map(std::borrow::Cow::Borrowed),
                // A half weight supplied in f32 is converted here, once (graph_plan::exec::weight_bytes).
                BindingRole::Weight => weights.get(&*b.name).map(|t| graph_plan::exec::weight_bytes(b, t)),
                _ => None,
            };
            if let Some(bytes) = data {
                self.streams[0].copy_to_device(range(&self.regions, &b.name, b.buffer)?, &bytes)?;
            }
        }
        Ok(())
    }

    /// Enqueue one execution of `plan`'s steps on stream 0 without waiting: its graph launch, or every step
    /// between a fork from and a join back to stream 0.
    fn submit(&self, res: &PlanResources, plan: &ExecutionPlan) -> CudaResult<()> {
        if let Some(g) = &res.graph {
            return g.launch();
        }
        let n = plan.num_streams.max(1).min(self.streams.len());
        let (main, side) = (&self.streams[0], &self.streams[1..n]);
        fork_sides(main, side, &self.fork)?;
        let work = res.work(plan, &self.regions);
        let enqueued = work.enqueue(&self.streams[..n]);
        // Join even after a failure, so that stream 0 never runs ahead of work still queued on a side stream.
        let joined = join_sides(main, side, &self.joins[..n - 1]);
        enqueued?;
        joined
    }

    /// Copy the inputs in, run `plan` once, wait, and copy its outputs out.
    fn execute(&self, res: &PlanResources, plan: &ExecutionPlan, inputs: &TensorMap) -> CudaResult<TensorMap> {
        let main = &self.streams[0];
        for (name, b) in &res.inputs {
            if let Some(t) = inputs.get(name) {
                main.copy_to_device(range(&self.regions, name, *b)?, &t.data)?;
            }
        }
        self.submit(res, plan)?;
        main.synchronize()?;
        let mut out = TensorMap::new();
        for (name, dtype, shape, b) in &res.outputs {
            let r = range(&self.regions, name, *b)?;
            let buf = region_buffer(&self.regions, name, *b)?;
            let data = if buf.is_host() {
                // `range` proved offset and length fit usize.
                let offset = usize::try_from(b.offset).unwrap_or(usize::MAX);
                buf.host_bytes(name, offset, r.len())?.to_vec()
            } else {
                let mut data = vec![0u8; r.len()];
                main.copy_to_host(&mut data, r)?;
                data
            };
            out.insert(name.clone(), HostTensor { dtype: *dtype, shape: shape.clone(), data });
        }
        Ok(out)
    }
}

impl PlanResources {
    /// Generate, compile and load `plan`'s kernels, create its cuBLAS handles and events over `shared`, and in
    /// graph mode capture its steps (on the first `plan.num_streams` of the shared streams).
    fn new(options: &CudaOptions, shared: &Shared, plan: &ExecutionPlan) -> CudaResult<Self> {
        let (device, regions) = (&shared.device, &shared.regions);
        let streams = &shared.streams[..plan.num_streams.max(1).min(shared.streams.len())];
        // cuBLAS: one handle per stream that runs a product; when the library cannot be loaded, the products are
        // generated kernels instead (same semantics, slower), and `info` says why.
        let mut cublas_fallback = (!options.cublas).then(|| "cuBLAS turned off in CudaOptions".to_owned());
        let mut sources = codegen::generate_all_with(plan, &CodegenOptions { cublas: options.cublas })?;
        // A product whose precision cuBLAS cannot run here is a generated kernel instead (before any handle or
        // capture exists, so cuBLAS never sees the call).
        let cublas_refused = refuse_unsupported_products(plan, &mut sources, device.info().compute_capability)?;
        for e in &cublas_refused {
            tracing::warn!(error = %e, "the product runs as a generated kernel");
        }
        let blas = match blas_handles(device, streams, plan, &sources) {
            Ok(b) => b,
            Err(e @ CudaError::CublasUnavailable { .. }) => {
                tracing::warn!(error = %e, "cuBLAS unavailable: MatMul/Gemm run as generated kernels");
                cublas_fallback = Some(e.to_string());
                sources = codegen::generate_all_with(plan, &CodegenOptions { cublas: false })?;
                (0..streams.len()).map(|_| None).collect()
            }
            Err(e) => return Err(e),
        };
        // Kernels: compile once per distinct source (NVRTC or the PTX cache), load once per distinct source.
        let cache = options.compile_cache();
        let compile_options = CompileOptions::for_arch(&device.info().arch());
        let mut modules: Vec<Module> = Vec::new();
        let mut module_of: HashMap<&str, usize> = HashMap::new();
        let mut kernels = Vec::with_capacity(sources.len());
        for s in &sources {
            if s.launch == Launch::None {
                kernels.push(None);
                continue;
            }
            let m = match module_of.get(s.source.as_str()) {
                Some(&m) => m,
                None => {
                    let ptx = cache.compile(&s.name, &s.source, &compile_options)?;
                    modules.push(device.load(&ptx)?);
                    module_of.insert(&s.source, modules.len() - 1);
                    modules.len() - 1
                }
            };
            kernels.push(Some(modules[m].kernel(&s.entry, &s.params)?));
        }
        let stats = cache.stats();
        tracing::info!(
            kernels = sources.len(),
            modules = modules.len(),
            compiled = stats.misses,
            from_disk = stats.disk_hits,
            "loaded plan kernels"
        );
        let events = (0..plan.event_count).map(|_| device.event()).collect::<CudaResult<Vec<_>>>()?;
        let gemms = prepare_gemms(device, &streams[0], regions, &sources)?;
        let work = Work {
            steps: &plan.steps,
            sources: &sources,
            kernels: &kernels,
            blas: &blas,
            gemms: &gemms,
            events: &events,
            regions,
        };
        let graph = match options.mode {
            SubmitMode::Graph => {
                let g = capture(device, &streams[0], &streams[1..], |streams| work.enqueue(streams))?;
                g.upload()?;
                Some(g)
            }
            SubmitMode::Eager => None,
        };
        let info = PrepareInfo {
            mode: options.mode,
            device: device.info().name.clone(),
            kernels: sources.len(),
            launched_kernels: sources.iter().filter(|s| s.launch != Launch::None).count(),
            distinct_sources: modules.len(),
            compiled: stats.misses,
            from_disk: stats.disk_hits,
            cublas_products: sources.iter().map(|s| s.blas.len()).sum(),
            cublas_calls: gemms.iter().map(Vec::len).sum(),
            cublas_fallback,
            cublas_refused,
            eager_calls: work.calls(streams.len() - 1),
        };
        let inputs = plan
            .bindings()
            .iter()
            .filter(|b| b.role == BindingRole::Input)
            .map(|b| (b.name.to_string(), b.buffer))
            .collect();
        let outputs = plan
            .bindings()
            .iter()
            .filter(|b| b.role == BindingRole::Output)
            .map(|b| (b.name.to_string(), b.dtype, b.shape.clone(), b.buffer))
            .collect();
        Ok(PlanResources { graph, blas, gemms, kernels, _modules: modules, events, sources, inputs, outputs, info })
    }

    /// The borrowed view of these resources that enqueues `plan`'s steps.
    fn work<'a>(&'a self, plan: &'a ExecutionPlan, regions: &'a [DeviceBuffer]) -> Work<'a> {
        Work {
            steps: &plan.steps,
            sources: &self.sources,
            kernels: &self.kernels,
            blas: &self.blas,
            gemms: &self.gemms,
            events: &self.events,
            regions,
        }
    }
}

impl CudaPrepared {
    fn new(options: &CudaOptions, plan: &ExecutionPlan, weights: &TensorMap) -> CudaResult<Self> {
        let sizes = Region::ALL.map(|r| plan.region_bytes(r));
        let shared = Shared::open(options, sizes, plan.num_streams)?;
        shared.upload(plan, weights)?;
        let res = PlanResources::new(options, &shared, plan)?;
        Ok(Self { res, shared, plan: plan.clone() })
    }

    /// What `prepare` did.
    #[must_use]
    pub fn info(&self) -> &PrepareInfo {
        &self.res.info
    }

    /// The generated kernels, in plan kernel order.
    #[must_use]
    pub fn sources(&self) -> &[KernelSource] {
        &self.res.sources
    }

    /// Times `count` executions of the plan, after `warmup` untimed ones, on whatever the inputs hold (the last
    /// run's, or zeros). Each is bracketed by timing events recorded on stream 0 and waited for before the next
    /// starts, so each figure is one execution's device time from its first enqueued work to its last, including
    /// any time the device waits for the host to submit (which is what eager submission costs).
    ///
    /// Returns microseconds, one per timed execution.
    ///
    /// # Errors
    /// [`CudaError::Driver`].
    pub fn time_runs(&mut self, warmup: usize, count: usize) -> CudaResult<Vec<f64>> {
        let sh = &self.shared;
        let main = &sh.streams[0];
        for _ in 0..warmup {
            sh.submit(&self.res, &self.plan)?;
        }
        main.synchronize()?;
        let mut times = Vec::with_capacity(count);
        for _ in 0..count {
            main.record(&sh.timer.0)?;
            sh.submit(&self.res, &self.plan)?;
            main.record(&sh.timer.1)?;
            sh.timer.1.synchronize()?;
            times.push(sh.timer.0.elapsed_us(&sh.timer.1)?);
        }
        Ok(times)
    }

    /// Times each launch alone: the plan's steps enqueued one at a time in submission order (a valid serial order:
    /// every record precedes its waits), each launch bracketed by timing events on its own stream and waited for
    /// before the next step, `count` times after `warmup` untimed passes. What the timing model's per-launch
    /// estimate (`Kernel::estimate.time_us`, alone on the device) predicts, so the two can be compared kernel by
    /// kernel.
    ///
    /// Returns, per plan kernel (indexed by `KernelId`), the median microseconds of its launches; `None` for a
    /// kernel the steps never launch.
    ///
    /// # Errors
    /// [`CudaError::Driver`].
    pub fn time_kernels(&mut self, warmup: usize, count: usize) -> CudaResult<Vec<Option<f64>>> {
        let sh = &self.shared;
        let n = self.plan.num_streams.max(1).min(sh.streams.len());
        let work = self.res.work(&self.plan, &sh.regions);
        let mut samples: Vec<Vec<f64>> = vec![Vec::new(); self.plan.kernels().len()];
        for pass in 0..warmup + count {
            for (i, step) in self.plan.steps.iter().enumerate() {
                let one = Work { steps: &self.plan.steps[i..=i], ..work };
                let PlanStep::Launch { stream, kernel, .. } = step else {
                    one.enqueue(&sh.streams[..n])?;
                    continue;
                };
                let s = sh.streams.get(stream.index()).ok_or_else(|| CudaError::Unsupported {
                    kernel: kernel.to_string(),
                    what: format!("launch on {stream}, the plan has {n} streams"),
                })?;
                s.record(&sh.timer.0)?;
                one.enqueue(&sh.streams[..n])?;
                s.record(&sh.timer.1)?;
                sh.timer.1.synchronize()?;
                if pass >= warmup {
                    if let Some(v) = samples.get_mut(kernel.index()) {
                        v.push(sh.timer.0.elapsed_us(&sh.timer.1)?);
                    }
                }
            }
            for s in &sh.streams[..n] {
                s.synchronize()?;
            }
        }
        Ok(samples
            .into_iter()
            .map(|mut v| {
                v.sort_by(f64::total_cmp);
                v.get(v.len() / 2).copied()
            })
            .collect())
    }

    /// Runs on `inputs` with this backend's own error type (see [`PreparedPlan::run`]).
    ///
    /// # Errors
    /// As [`PreparedPlan::run`], as a [`CudaError`]; the caller's tensors are checked by `run`.
    pub fn run_cuda(&mut self, inputs: &TensorMap) -> CudaResult<TensorMap> {
        self.shared.execute(&self.res, &self.plan, inputs)
    }
}

/// A plan set ready to run: one device allocation per region of the set (one activation pool, the largest
/// member's), every member's weights and constants uploaded once at their shared addresses, and each member's
/// kernels and, in graph mode, its own CUDA graph captured at prepare over those same addresses.
///
/// Fields drop in declaration order: the members' resources before the shared buffers and streams.
pub struct CudaPreparedSet {
    members: Vec<PlanResources>,
    shared: Shared,
    set: PlanSet,
}

impl std::fmt::Debug for CudaPreparedSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaPreparedSet")
            .field("members", &self.members.len())
            .field("streams", &self.shared.streams.len())
            .field("regions", &self.shared.regions)
            .finish_non_exhaustive()
    }
}

impl CudaPreparedSet {
    fn new(options: &CudaOptions, set: &PlanSet, weights: &TensorMap) -> CudaResult<Self> {
        let sizes = Region::ALL.map(|r| set.region_bytes(r));
        let streams = set.members().iter().map(|m| m.plan.num_streams).max().unwrap_or(1);
        let shared = Shared::open(options, sizes, streams)?;
        let mut members = Vec::with_capacity(set.members().len());
        for m in set.members() {
            shared.upload(&m.plan, weights)?;
            members.push(PlanResources::new(options, &shared, &m.plan)?);
        }
        Ok(Self { members, shared, set: set.clone() })
    }

    /// The prepared set.
    #[must_use]
    pub fn set(&self) -> &PlanSet {
        &self.set
    }

    /// What `prepare` did for each member.
    pub fn infos(&self) -> impl Iterator<Item = &PrepareInfo> + '_ {
        self.members.iter().map(|r| &r.info)
    }

    /// Run member `i` on inputs of exactly its shapes.
    ///
    /// # Errors
    /// [`CudaError`] from the driver; a member index out of range is [`CudaError::Unsupported`].
    pub fn run_member(&mut self, i: usize, inputs: &TensorMap) -> CudaResult<TensorMap> {
        let (Some(res), Some(m)) = (self.members.get(i), self.set.members().get(i)) else {
            return Err(CudaError::Unsupported { kernel: "(set)".to_owned(), what: format!("no member {i}") });
        };
        self.shared.execute(res, &m.plan, inputs)
    }

    /// Run a request of `dims` (`PlanSet::run_with`: select, pad, run the member's graph, slice; with `chunk`,
    /// above the largest bucket in chunks of it).
    ///
    /// # Errors
    /// [`SetError`] for a request the set cannot serve; [`SetError::Exec`] wraps the device's errors.
    pub fn run_request(&mut self, dims: &Dims, inputs: &TensorMap, chunk: bool) -> Result<TensorMap, SetError> {
        let Self { members, shared, set } = self;
        set.run_with(dims, inputs, chunk, |i, feed| {
            let (Some(res), Some(m)) = (members.get(i), set.members().get(i)) else {
                return Err(ExecError::Backend { backend: BACKEND, message: format!("no member {i}") });
            };
            check_tensors(&m.plan, feed, BindingRole::Input)?;
            shared.execute(res, &m.plan, feed).map_err(exec_error)
        })
    }
}

impl PreparedPlan for CudaPrepared {
    fn run(&mut self, inputs: &TensorMap) -> Result<TensorMap, ExecError> {
        check_tensors(&self.plan, inputs, BindingRole::Input)?;
        self.run_cuda(inputs).map_err(exec_error)
    }
}
