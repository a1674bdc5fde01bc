//! The CUDA backend behind graph-plan's `Executor` trait (DESIGN.md section 6).
//!
//! `prepare`: open the device, allocate one buffer per plan region, upload weights and constants, generate and
//! compile every kernel once (identical sources share one NVRTC compile), create the plan's streams and events,
//! and capture the whole step list into one CUDA graph with the multi-stream fork/join recipe. `run`: copy the
//! inputs into their io ranges, replay the graph on stream 0, wait, and copy the outputs back.

use graph_plan::exec::check_tensors;
use graph_plan::{
    BindingRole, BufferRef, ExecError, ExecutionPlan, Executor, HostTensor, PlanStep, PreparedPlan, Region, TensorMap,
    Unavailable,
};

use crate::blas::Blas;
use crate::capture::{capture, Graph};
use crate::codegen::{self, KernelSource, Launch};
use crate::device::{Device, DeviceBuffer, DevicePtr, Event, Kernel, KernelArg, LaunchDims, Stream};
use crate::error::{CudaError, CudaResult};
use crate::nvrtc::{CompileCache, CompileOptions};

const BACKEND: &str = "cuda";

/// Runs plans on one NVIDIA GPU.
#[derive(Clone, Debug, Default)]
pub struct CudaExecutor {
    ordinal: usize,
}

impl CudaExecutor {
    /// The executor for device `ordinal`.
    #[must_use]
    pub fn new(ordinal: usize) -> Self {
        Self { ordinal }
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

    fn availability(&self) -> Result<(), Unavailable> {
        let unavailable = |e: CudaError| Unavailable { backend: BACKEND, reason: e.to_string() };
        crate::probe::device_info(self.ordinal).map_err(unavailable)?;
        crate::probe::nvrtc_availability().map_err(unavailable)?;
        Ok(())
    }

    fn prepare(&self, plan: &ExecutionPlan, weights: &TensorMap) -> Result<CudaPrepared, ExecError> {
        check_tensors(plan, weights, BindingRole::Weight)?;
        CudaPrepared::new(self.ordinal, plan, weights).map_err(exec_error)
    }
}

/// A plan ready to replay: its device resources and the instantiated graph.
///
/// Fields drop in declaration order: the graph before the kernels and buffers it names, everything before the
/// device context.
pub struct CudaPrepared {
    graph: Graph,
    _blas: Vec<Option<Blas>>,
    _kernels: Vec<Option<Kernel>>,
    _events: Vec<Event>,
    streams: Vec<Stream>,
    regions: Vec<DeviceBuffer>,
    inputs: Vec<(String, BufferRef)>,
    outputs: Vec<(String, graph_plan::DType, graph_plan::Shape, BufferRef)>,
    plan_inputs: ExecutionPlan,
    _device: Device,
}

impl std::fmt::Debug for CudaPrepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaPrepared")
            .field("streams", &self.streams.len())
            .field("regions", &self.regions)
            .finish_non_exhaustive()
    }
}

fn range<'a>(regions: &'a [DeviceBuffer], what: &str, b: BufferRef) -> CudaResult<DevicePtr<'a>> {
    let buf = regions.get(b.region.index()).ok_or_else(|| CudaError::Unsupported {
        kernel: what.to_owned(),
        what: format!("region {} is not allocated", b.region.name()),
    })?;
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

impl CudaPrepared {
    fn new(ordinal: usize, plan: &ExecutionPlan, weights: &TensorMap) -> CudaResult<Self> {
        let device = Device::open(ordinal)?;
        // Regions, in Region::ALL order. The host region (Memcpy-to-host results) lives on the device for now.
        let regions = Region::ALL
            .iter()
            .map(|&r| {
                let bytes = usize::try_from(plan.region_bytes(r))
                    .map_err(|_| CudaError::OutOfMemory { requested: usize::MAX })?;
                device.alloc(r.name(), bytes)
            })
            .collect::<CudaResult<Vec<_>>>()?;
        let streams = (0..plan.num_streams.max(1)).map(|_| device.stream()).collect::<CudaResult<Vec<_>>>()?;
        let upload = &streams[0];
        for b in plan.bindings() {
            let data = match b.role {
                BindingRole::Constant => b.data.as_deref(),
                BindingRole::Weight => weights.get(&b.name).map(|t| t.data.as_slice()),
                _ => None,
            };
            if let Some(bytes) = data {
                upload.copy_to_device(range(&regions, &b.name, b.buffer)?, bytes)?;
            }
        }
        // Kernels: generate, compile once per distinct source, load.
        let sources = codegen::generate_all(plan)?;
        // $CUPLAN_PTX_CACHE lets a machine without NVRTC use PTX compiled elsewhere.
        let cache = CompileCache::from_env();
        let options = CompileOptions::for_arch(&device.info().arch());
        let mut kernels = Vec::with_capacity(sources.len());
        for s in &sources {
            if s.launch == Launch::None {
                kernels.push(None);
                continue;
            }
            let ptx = cache.compile(&s.name, &s.source, &options)?;
            let module = device.load(&ptx)?;
            kernels.push(Some(module.kernel(&s.entry, &s.params)?));
        }
        tracing::info!(kernels = sources.len(), compiles = cache.stats().misses, "compiled plan kernels");
        // One cuBLAS handle per stream that runs a product.
        let mut blas: Vec<Option<Blas>> = (0..streams.len()).map(|_| None).collect();
        for step in &plan.steps {
            if let PlanStep::Launch { stream, kernel, .. } = step {
                let s = stream.index();
                if sources.get(kernel.index()).is_some_and(|k| k.blas.is_some()) && blas[s].is_none() {
                    blas[s] = Some(Blas::new(&device, &streams[s])?);
                }
            }
        }
        let events = (0..plan.event_count).map(|_| device.event()).collect::<CudaResult<Vec<_>>>()?;
        let graph = capture(&device, &streams[0], &streams[1..], |streams| {
            for step in &plan.steps {
                let stream_of = |s: graph_plan::StreamId| {
                    streams.get(s.index()).ok_or_else(|| CudaError::Unsupported {
                        kernel: "(plan)".to_owned(),
                        what: format!("step on {s}, the plan has {} streams", streams.len()),
                    })
                };
                let event_of = |e: graph_plan::EventId| {
                    events.get(e.index()).ok_or_else(|| CudaError::Unsupported {
                        kernel: "(plan)".to_owned(),
                        what: format!("event {e} beyond the plan's {}", events.len()),
                    })
                };
                match step {
                    PlanStep::Launch { stream, kernel, .. } => {
                        let s = stream_of(*stream)?;
                        let src = sources.get(kernel.index()).ok_or_else(|| CudaError::Unsupported {
                            kernel: kernel.to_string(),
                            what: "launch of a kernel the plan lacks".to_owned(),
                        })?;
                        if let Some(b) = src.blas {
                            let handle = blas[stream.index()].as_ref().ok_or_else(|| CudaError::Unsupported {
                                kernel: src.name.clone(),
                                what: "no cuBLAS handle on its stream".to_owned(),
                            })?;
                            handle.matmul(
                                &b.matmul,
                                range(&regions, &src.name, b.a)?,
                                range(&regions, &src.name, b.b)?,
                                range(&regions, &src.name, b.c)?,
                            )?;
                        }
                        if let Some(Some(k)) = kernels.get(kernel.index()) {
                            let args = src
                                .args
                                .iter()
                                .map(|&b| range(&regions, &src.name, b).map(KernelArg::Ptr))
                                .collect::<CudaResult<Vec<_>>>()?;
                            s.launch(k, dims(src)?, &args)?;
                        }
                    }
                    PlanStep::Record { stream, event } => stream_of(*stream)?.record(event_of(*event)?)?,
                    PlanStep::Wait { stream, event } => stream_of(*stream)?.wait(event_of(*event)?)?,
                    PlanStep::Copy { stream, src, dst, bytes, .. } => {
                        let n = *bytes;
                        let sub = |b: BufferRef| BufferRef { bytes: n, ..b };
                        stream_of(*stream)?.copy_device(
                            range(&regions, "copy destination", sub(*dst))?,
                            range(&regions, "copy source", sub(*src))?,
                        )?;
                    }
                }
            }
            Ok(())
        })?;
        graph.upload()?;
        let inputs = plan
            .bindings()
            .iter()
            .filter(|b| b.role == BindingRole::Input)
            .map(|b| (b.name.clone(), b.buffer))
            .collect();
        let outputs = plan
            .bindings()
            .iter()
            .filter(|b| b.role == BindingRole::Output)
            .map(|b| (b.name.clone(), b.dtype, b.shape.clone(), b.buffer))
            .collect();
        Ok(Self {
            graph,
            _blas: blas,
            _kernels: kernels,
            _events: events,
            streams,
            regions,
            inputs,
            outputs,
            plan_inputs: plan.clone(),
            _device: device,
        })
    }

    fn replay(&mut self, inputs: &TensorMap) -> CudaResult<TensorMap> {
        let main = &self.streams[0];
        for (name, b) in &self.inputs {
            if let Some(t) = inputs.get(name) {
                main.copy_to_device(range(&self.regions, name, *b)?, &t.data)?;
            }
        }
        self.graph.launch()?;
        main.synchronize()?;
        let mut out = TensorMap::new();
        for (name, dtype, shape, b) in &self.outputs {
            let r = range(&self.regions, name, *b)?;
            let mut data = vec![0u8; r.len()];
            main.copy_to_host(&mut data, r)?;
            out.insert(name.clone(), HostTensor { dtype: *dtype, shape: shape.clone(), data });
        }
        Ok(out)
    }
}

impl PreparedPlan for CudaPrepared {
    fn run(&mut self, inputs: &TensorMap) -> Result<TensorMap, ExecError> {
        check_tensors(&self.plan_inputs, inputs, BindingRole::Input)?;
        self.replay(inputs).map_err(exec_error)
    }
}
