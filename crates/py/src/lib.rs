//! cuplan-py: the Python binding (`import cuplan`), a thin layer over the same library calls the `cuplan`
//! command line makes.
//!
//! Its place in the pipeline: [`load`](fn@load) reads a graph as `cuplan validate` does (graph-onnx or graph-ir's
//! JSON, through the CLI's library half `cuplan::load`); [`plan`](fn@plan) builds an `ExecutionPlan` with
//! graph-plan and checks it with `graph_plan::verify`, as `cuplan plan` does; `Plan.report()` and
//! `Plan.explain()` are the CLI's `--report` object and `explain` views (`cuplan::report`, `cuplan::viz`);
//! `Simulator.run` runs the plan on exec-sim, as `cuplan run` does. Nothing here plans, checks or simulates on
//! its own: figures, messages and outputs are the CLI's.
//!
//! Python-facing contract:
//! - every user error (bad file, bad model, bad option, bad input array) raises a `cuplan.CuplanError`, a
//!   `ValueError` subclass (`GraphError` for loading, `PlanError` for planning, `RunError` for running), whose
//!   message is the one line the CLI prints after `error: `; nothing a caller passes panics;
//! - numpy interop: inputs are numpy arrays (or anything `numpy.asarray` accepts) of the binding's dtype
//!   (float32, float16, int64, int32, int8, uint8, bool; bfloat16 is exchanged as float32); outputs are numpy
//!   arrays over the simulator's own output buffers (no copy; bfloat16 outputs are converted to float32);
//! - long calls (planning, simulation) release the GIL.

use std::sync::Arc;
use std::time::Instant;

use cuplan::load::{self as cli_load, Format, GraphArgs, Loaded};
use exec_sim::{Schedule, SimExecutor, SimOptions};
use graph_ir::ComputeGraph;
use graph_plan::{
    run_pipeline, verify, BindingRole, DType, DeviceProfile, Effort, ExecutionPlan, HostTensor, OrderStrategy, Pass,
    PlanOptions, Shape, StreamId, TensorMap,
};
use numpy::{PyArray1, PyArrayDyn, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::create_exception;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyString, PyTuple};

create_exception!(
    cuplan,
    CuplanError,
    PyValueError,
    "A user error: a bad file, model, option or input (a ValueError)."
);
create_exception!(cuplan, GraphError, CuplanError, "The graph or model could not be loaded.");
create_exception!(cuplan, PlanError, CuplanError, "The graph could not be planned with these options.");
create_exception!(cuplan, RunError, CuplanError, "The plan could not be run on these inputs.");

/// The one line the CLI prints for an error (after `error: `): the chain of causes joined with `": "`,
/// outermost first, a cause whose text its parent already shows left out, newlines flattened (`main.rs`).
fn one_line(e: &(dyn std::error::Error + 'static)) -> String {
    let mut msg = String::new();
    let mut cur = Some(e);
    while let Some(c) = cur {
        let text = c.to_string();
        if !msg.contains(&text) {
            if !msg.is_empty() {
                msg.push_str(": ");
            }
            msg.push_str(&text);
        }
        cur = c.source();
    }
    msg.replace('\n', " ")
}

fn graph_err(e: impl AsRef<dyn std::error::Error + Send + Sync + 'static>) -> PyErr {
    GraphError::new_err(one_line(e.as_ref()))
}

fn plan_err(e: &(dyn std::error::Error + 'static)) -> PyErr {
    PlanError::new_err(one_line(e))
}

/// `json.loads(text)`: serde values become Python dicts, lists, numbers and strings.
fn json_to_py<'py>(py: Python<'py>, text: &str) -> PyResult<Bound<'py, PyAny>> {
    PyModule::import(py, "json")?.getattr("loads")?.call1((text,))
}

/// A loaded compute graph (ONNX or cuplan JSON) with the weight values its file carried.
#[pyclass(module = "cuplan", frozen)]
struct Graph {
    graph: Arc<ComputeGraph>,
    weights: Arc<TensorMap>,
    origin: Option<String>,
}

fn tensor_list(g: &ComputeGraph, ids: &[graph_ir::TensorId]) -> Vec<(String, String, Vec<usize>)> {
    ids.iter()
        .map(|&t| {
            let t = g.tensor(t);
            (t.name.to_string(), t.dtype.name().to_string(), t.shape.dims().to_vec())
        })
        .collect()
}

#[pymethods]
impl Graph {
    /// The graph's name.
    #[getter]
    fn name(&self) -> String {
        self.graph.name().to_string()
    }

    /// Number of nodes.
    #[getter]
    fn num_nodes(&self) -> usize {
        self.graph.num_nodes()
    }

    /// Number of tensors.
    #[getter]
    fn num_tensors(&self) -> usize {
        self.graph.num_tensors()
    }

    /// Graph inputs as `(name, dtype, shape)`.
    #[getter]
    fn inputs(&self) -> Vec<(String, String, Vec<usize>)> {
        tensor_list(&self.graph, self.graph.inputs())
    }

    /// Graph outputs as `(name, dtype, shape)`.
    #[getter]
    fn outputs(&self) -> Vec<(String, String, Vec<usize>)> {
        tensor_list(&self.graph, self.graph.outputs())
    }

    /// Names of the weights whose values the file carried (the rest are filled with seeded values when run).
    #[getter]
    fn weights_with_data(&self) -> Vec<String> {
        self.weights.keys().cloned().collect()
    }

    /// A line about the source format (opset, producer, counts) for ONNX models; `None` for JSON graphs.
    #[getter]
    fn origin(&self) -> Option<String> {
        self.origin.clone()
    }

    /// The graph in cuplan's JSON format.
    fn to_json(&self) -> String {
        self.graph.to_json()
    }

    fn __repr__(&self) -> String {
        format!(
            "<cuplan.Graph '{}': {} nodes, {} tensors, {} inputs, {} outputs>",
            self.graph.name(),
            self.graph.num_nodes(),
            self.graph.num_tensors(),
            self.graph.inputs().len(),
            self.graph.outputs().len()
        )
    }
}

/// `dims` as the CLI's `--dim NAME=VALUE` strings, so that their checks and messages are the CLI's.
fn dim_args(dims: Option<&Bound<'_, PyDict>>) -> PyResult<Vec<String>> {
    let Some(dims) = dims else { return Ok(Vec::new()) };
    let mut out = Vec::with_capacity(dims.len());
    for (k, v) in dims.iter() {
        let name: String = k.extract().map_err(|_| GraphError::new_err(format!("dims: key {k} is not a string")))?;
        let value: i128 = v
            .extract()
            .map_err(|_| GraphError::new_err(format!("--dim {name:?}: VALUE must be a non-negative integer")))?;
        out.push(format!("{name}={value}"));
    }
    Ok(out)
}

fn wrap_loaded(l: Loaded) -> Graph {
    Graph { graph: Arc::new(l.graph), weights: Arc::new(l.weights), origin: l.origin }
}

/// Load a graph: a path (`str` or `os.PathLike`; `.onnx` is ONNX, anything else cuplan JSON) or the file's
/// `bytes` (JSON when they start with `{`, else ONNX). `dims` binds symbolic ONNX dimensions
/// (`{"batch": 8}`, the CLI's `--dim batch=8`).
#[pyfunction]
#[pyo3(signature = (source, dims = None))]
fn load(py: Python<'_>, source: &Bound<'_, PyAny>, dims: Option<&Bound<'_, PyDict>>) -> PyResult<Graph> {
    let dims = dim_args(dims)?;
    if let Ok(b) = source.cast::<PyBytes>() {
        let format = Format::sniff(b.as_bytes());
        let bytes = b.as_bytes().to_vec();
        let parsed = cli_load::parse_dims(&dims).map_err(graph_err)?;
        let loaded = py.detach(|| cli_load::from_bytes(bytes, format, parsed, "bytes", None)).map_err(graph_err)?;
        return Ok(wrap_loaded(loaded));
    }
    let path: std::path::PathBuf = source
        .extract()
        .map_err(|_| GraphError::new_err("load: expected a path (str or os.PathLike) or bytes".to_string()))?;
    let Some(path) = path.to_str().map(str::to_string) else {
        return Err(GraphError::new_err(format!("'{}': the path is not valid UTF-8", path.display())));
    };
    // The CLI reads `-` as standard input; from Python it is a file of that name.
    let graph = if path == "-" { "./-".to_string() } else { path };
    let args = GraphArgs { graph, dims };
    let loaded = py.detach(|| cli_load::load(&args)).map_err(graph_err)?;
    Ok(wrap_loaded(loaded))
}

/// Options of [`plan`](fn@plan), as the CLI's `PlanFlags::options` builds them.
#[allow(clippy::too_many_arguments)] // one per keyword of `plan`
fn plan_options(
    streams: i64,
    fusion: bool,
    reuse: bool,
    concurrent_lifetimes: bool,
    order: &str,
    device: &str,
    effort: &str,
) -> PyResult<PlanOptions> {
    let streams =
        usize::try_from(streams).map_err(|_| PlanError::new_err(format!("streams {streams}: must be at least 1")))?;
    let Some(dev) = DeviceProfile::by_name(device) else {
        return Err(PlanError::new_err(format!("--device {device:?}: unknown profile (known: h200, small)")));
    };
    let mut o = PlanOptions::with_streams(streams);
    o.fusion.enabled = fusion;
    o.memory.reuse = reuse;
    o.memory.concurrent_lifetimes = concurrent_lifetimes;
    o.device = dev;
    o.order = match order {
        "given" => OrderStrategy::Given,
        "memory" => OrderStrategy::Memory,
        other => return Err(PlanError::new_err(format!("--order {other:?}: expected given or memory"))),
    };
    o.effort = effort.parse::<Effort>().map_err(|e| PlanError::new_err(format!("effort: {e}")))?;
    o.validate().map_err(|e| plan_err(&e))?;
    Ok(o)
}

/// The simulator's `schedule` keyword ("submission" or "random" with `seed`), with the CLI's message.
fn parse_schedule(schedule: &str, seed: u64) -> PyResult<Schedule> {
    match schedule {
        "submission" => Ok(Schedule::Submission),
        "random" => Ok(Schedule::Random { seed }),
        other => Err(RunError::new_err(format!("--schedule {other:?}: expected submission or random"))),
    }
}

/// An execution plan: steps on streams over one memory pool, with its figures.
#[pyclass(module = "cuplan", frozen)]
struct Plan {
    plan: Arc<ExecutionPlan>,
    /// The graph and options it was built from (`None` for a plan read from JSON): `explain` replays fusion.
    source: Option<(Arc<ComputeGraph>, PlanOptions)>,
    weights: Arc<TensorMap>,
    compile_ms: f64,
}

/// Compile `graph` into a verified plan (the CLI's `cuplan plan`): at most `streams` CUDA streams, fusion and
/// memory reuse on or off, `order` "given" or "memory", `device` "h200" or "small", `concurrent_lifetimes`
/// trading pool bytes for overlap, `effort` "fast", "default" or "max" (the search budgets, as `--effort`).
#[pyfunction]
#[pyo3(signature = (graph, streams = 1, fusion = true, reuse = true, order = "given", device = "h200", concurrent_lifetimes = false, effort = "default"))]
#[allow(clippy::too_many_arguments)]
fn plan(
    py: Python<'_>,
    graph: &Graph,
    streams: i64,
    fusion: bool,
    reuse: bool,
    order: &str,
    device: &str,
    concurrent_lifetimes: bool,
    effort: &str,
) -> PyResult<Plan> {
    let opts = plan_options(streams, fusion, reuse, concurrent_lifetimes, order, device, effort)?;
    let g = Arc::clone(&graph.graph);
    let (built, compile_ms) = py.detach(|| {
        let t0 = Instant::now();
        let p = ExecutionPlan::build_with(&g, &opts);
        (p, t0.elapsed().as_secs_f64() * 1e3)
    });
    let built = built.map_err(|e| plan_err(&e))?;
    if let Err(v) = verify(&built) {
        let first: Vec<String> = v.iter().take(3).map(ToString::to_string).collect();
        return Err(PlanError::new_err(format!(
            "internal error: the plan fails verification ({} violations; first: {}) — this is a bug",
            v.len(),
            first.join("; ")
        )));
    }
    Ok(Plan { plan: Arc::new(built), source: Some((g, opts)), weights: Arc::clone(&graph.weights), compile_ms })
}

fn steps_to_py<'py>(py: Python<'py>, steps: &[&graph_plan::PlanStep]) -> PyResult<Bound<'py, PyAny>> {
    let text = serde_json::to_string(steps).map_err(|e| plan_err(&e))?;
    json_to_py(py, &text)
}

#[pymethods]
impl Plan {
    /// Every step in submission order, as dicts (`{"Launch": {"stream": 0, "kernel": 3, ...}}`, as in the
    /// plan's JSON).
    #[getter]
    fn steps<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let all: Vec<&graph_plan::PlanStep> = self.plan.steps.iter().collect();
        steps_to_py(py, &all)
    }

    /// Streams the plan uses.
    #[getter]
    fn num_streams(&self) -> usize {
        self.plan.num_streams
    }

    /// Bytes of the activation pool.
    #[getter]
    fn pool_bytes(&self) -> usize {
        self.plan.pool_bytes
    }

    /// Kernel launches without fusion (non-view nodes).
    #[getter]
    fn kernel_count_original(&self) -> usize {
        self.plan.kernel_count_original
    }

    /// Kernel launches of the plan.
    #[getter]
    fn kernel_count_fused(&self) -> usize {
        self.plan.kernel_count_fused
    }

    /// Distinct events.
    #[getter]
    fn event_count(&self) -> usize {
        self.plan.event_count
    }

    /// The source graph's name.
    #[getter]
    fn graph_name(&self) -> String {
        self.plan.graph_name().to_string()
    }

    /// Steps submitted to `stream`, in order (dicts, as `steps`).
    fn steps_on<'py>(&self, py: Python<'py>, stream: i64) -> PyResult<Bound<'py, PyAny>> {
        let s = usize::try_from(stream).ok().filter(|&s| s < self.plan.num_streams).ok_or_else(|| {
            PlanError::new_err(format!("stream {stream}: the plan has {} stream(s)", self.plan.num_streams))
        })?;
        steps_to_py(py, &self.plan.steps_on(StreamId::from_index(s)))
    }

    /// Number of steps.
    fn total_steps(&self) -> usize {
        self.plan.total_steps()
    }

    /// Kernel-launch steps after fusion (`ExecutionPlan::compute_steps`, equal to `kernel_count_fused`).
    fn compute_steps(&self) -> usize {
        self.plan.compute_steps()
    }

    /// The figures of `cuplan plan --report`, as a dict with the same keys.
    fn report<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let v = cuplan::report::report(&self.plan, self.compile_ms);
        json_to_py(py, &v.to_string())
    }

    /// `cuplan explain`: the steps as a table, the figures beside their bounds, the fusion decisions.
    /// `format` is "text" (120 columns), "json" or "markdown". Needs the graph: a plan read with `from_json`
    /// cannot be explained.
    #[pyo3(signature = (format = "text"))]
    fn explain(&self, py: Python<'_>, format: &str) -> PyResult<String> {
        if !matches!(format, "text" | "json" | "markdown") {
            return Err(PlanError::new_err(format!("--format {format:?}: expected text, json or markdown")));
        }
        let Some((g, opts)) = &self.source else {
            return Err(PlanError::new_err(
                "explain needs the graph the plan was built from (this plan was read from JSON): plan the graph with \
                 cuplan.plan()"
                    .to_string(),
            ));
        };
        let plan = &self.plan;
        let out: Result<String, String> = py.detach(|| {
            let r = run_pipeline(g, opts, Some(Pass::Fusion)).map_err(|e| one_line(&e))?;
            let fusion = r.fusion.ok_or_else(|| "the pipeline stopped before fusion".to_string())?;
            let e = cuplan::viz::explain::explain(plan, &fusion).map_err(|e| one_line(e.as_ref()))?;
            Ok(match format {
                "json" => cuplan::viz::explain::render_json(&e).map_err(|e| one_line(e.as_ref()))?,
                "markdown" => cuplan::viz::explain::render_markdown(&e),
                _ => cuplan::viz::explain::render_text(&e),
            })
        });
        out.map_err(PlanError::new_err)
    }

    /// The whole plan as JSON (`cuplan plan --format json`).
    fn to_json(&self) -> String {
        self.plan.to_json()
    }

    /// A plan from its JSON (as `to_json` writes it). It carries no weights (they are seeded when run) and no
    /// graph (so no `explain`).
    #[staticmethod]
    fn from_json(text: &str) -> PyResult<Plan> {
        let plan =
            ExecutionPlan::from_json(text).map_err(|e| PlanError::new_err(format!("plan JSON: {}", one_line(&e))))?;
        Ok(Plan { plan: Arc::new(plan), source: None, weights: Arc::new(TensorMap::new()), compile_ms: 0.0 })
    }

    /// `graph_plan::verify`: every violation of the plan's invariants, as one line each (empty when valid).
    fn verify(&self) -> Vec<String> {
        match verify(&self.plan) {
            Ok(()) => Vec::new(),
            Err(v) => v.iter().map(ToString::to_string).collect(),
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "<cuplan.Plan '{}': {} launches ({} unfused) on {} stream(s), {} events, pool {} B>",
            self.plan.graph_name(),
            self.plan.kernel_count_fused,
            self.plan.kernel_count_original,
            self.plan.num_streams,
            self.plan.event_count,
            self.plan.pool_bytes
        )
    }

    /// The readable listing (`cuplan plan`'s text output).
    fn __str__(&self) -> String {
        self.plan.to_string()
    }
}

/// numpy's name of a cuplan dtype (bfloat16, which numpy lacks, travels as float32).
fn np_name(d: DType) -> &'static str {
    match d {
        DType::F32 | DType::BF16 => "float32",
        DType::F16 => "float16",
        DType::I64 => "int64",
        DType::I32 => "int32",
        DType::I8 => "int8",
        DType::U8 => "uint8",
        DType::Bool => "bool",
    }
}

/// cuplan's dtype for a numpy dtype name, if it has one.
fn from_np_name(name: &str) -> Option<DType> {
    Some(match name {
        "float32" => DType::F32,
        "float16" => DType::F16,
        "int64" => DType::I64,
        "int32" => DType::I32,
        "int8" => DType::I8,
        "uint8" => DType::U8,
        "bool" => DType::Bool,
        _ => return None,
    })
}

/// Little-endian bytes of a C-contiguous array of element type `T`.
macro_rules! le_bytes {
    ($arr:expr, $t:ty, $conv:expr) => {{
        let a = $arr.cast::<PyArrayDyn<$t>>()?.readonly();
        let conv = $conv;
        match a.as_slice() {
            Ok(s) => s.iter().flat_map(|v| conv(*v)).collect::<Vec<u8>>(),
            Err(_) => a.as_array().iter().flat_map(|v| conv(*v)).collect::<Vec<u8>>(),
        }
    }};
}

/// A host tensor from a Python value for binding `name` of dtype `want`: numpy arrays keep their dtype (the
/// executor then reports a mismatch as the CLI does); other values go through `numpy.asarray(value, dtype)`.
fn host_tensor(py: Python<'_>, name: &str, value: &Bound<'_, PyAny>, want: DType) -> PyResult<HostTensor> {
    let np = PyModule::import(py, "numpy")?;
    let arr = if let Ok(a) = value.cast::<PyUntypedArray>() {
        // Native byte order (a big-endian array is converted; a native one passes through without a copy).
        let native = a.dtype().call_method1("newbyteorder", ("=",))?;
        np.getattr("asarray")?.call1((a, native))?
    } else {
        np.getattr("asarray")?.call1((value, np_name(want))).map_err(|e| {
            RunError::new_err(format!("input '{name}': cannot convert to a {} array: {e}", np_name(want)))
        })?
    };
    let untyped = arr.cast::<PyUntypedArray>()?;
    let dt_name: String = untyped.dtype().getattr("name")?.extract()?;
    let shape = Shape::new(untyped.shape().to_vec());
    let dtype = if want == DType::BF16 && dt_name == "float32" {
        DType::BF16
    } else {
        from_np_name(&dt_name).ok_or_else(|| {
            RunError::new_err(format!(
                "input '{name}': numpy dtype {dt_name} is not supported (expected {} for this binding)",
                np_name(want)
            ))
        })?
    };
    let data = match dtype {
        DType::F32 => le_bytes!(arr, f32, |v: f32| v.to_le_bytes()),
        DType::BF16 => le_bytes!(arr, f32, |v: f32| half::bf16::from_f32(v).to_bits().to_le_bytes()),
        DType::F16 => le_bytes!(arr, half::f16, |v: half::f16| v.to_bits().to_le_bytes()),
        DType::I64 => le_bytes!(arr, i64, |v: i64| v.to_le_bytes()),
        DType::I32 => le_bytes!(arr, i32, |v: i32| v.to_le_bytes()),
        DType::I8 => le_bytes!(arr, i8, |v: i8| v.to_le_bytes()),
        DType::U8 => le_bytes!(arr, u8, |v: u8| v.to_le_bytes()),
        DType::Bool => le_bytes!(arr, bool, |v: bool| [u8::from(v)]),
    };
    Ok(HostTensor { dtype, shape, data })
}

/// A numpy array over `t`'s bytes: the buffer moves into numpy (no copy) and is viewed with the dtype and
/// shape; bfloat16 is converted to float32.
fn to_numpy<'py>(py: Python<'py>, t: HostTensor) -> PyResult<Bound<'py, PyAny>> {
    let dims = PyTuple::new(py, t.shape.dims())?;
    if t.dtype == DType::BF16 {
        let v: Vec<f32> =
            t.data.chunks_exact(2).map(|c| half::bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32()).collect();
        return PyArray1::from_vec(py, v).into_any().call_method1("reshape", (dims,));
    }
    let bytes = PyArray1::from_vec(py, t.data).into_any();
    bytes.call_method1("view", (np_name(t.dtype),))?.call_method1("reshape", (dims,))
}

/// Runs a plan on exec-sim, the CPU simulator (`cuplan run --backend sim`).
#[pyclass(module = "cuplan", frozen)]
struct Simulator {
    plan: Arc<ExecutionPlan>,
    weights: Arc<TensorMap>,
}

#[pymethods]
impl Simulator {
    /// A simulator for `plan`, with the weights its graph's file carried.
    #[new]
    fn new(plan: &Plan) -> Self {
        Simulator { plan: Arc::clone(&plan.plan), weights: Arc::clone(&plan.weights) }
    }

    /// Run the plan on `inputs` (a dict of input or weight name -> numpy array) and return every graph output
    /// by name. Inputs and weights not given get seeded values (`seed`; BatchNormalization variances positive),
    /// as `cuplan run` gives them. `schedule` is "submission" or "random" (a seeded adversarial order consistent
    /// with streams and events); `race_check` turns the simulator's race detector on.
    #[pyo3(signature = (inputs = None, schedule = "submission", seed = 0, race_check = true))]
    fn run<'py>(
        &self,
        py: Python<'py>,
        inputs: Option<&Bound<'py, PyDict>>,
        schedule: &str,
        seed: u64,
        race_check: bool,
    ) -> PyResult<Bound<'py, PyDict>> {
        let schedule = parse_schedule(schedule, seed)?;
        let mut ins = TensorMap::new();
        let mut weights = (*self.weights).clone();
        if let Some(d) = inputs {
            for (k, v) in d.iter() {
                let name: String =
                    k.extract().map_err(|_| RunError::new_err(format!("inputs: key {k} is not a string")))?;
                let role = self.plan.bindings().iter().find(|b| *b.name == *name).map(|b| (b.role, b.dtype));
                let dtype = match role {
                    Some((BindingRole::Input | BindingRole::Weight, d)) => d,
                    Some((BindingRole::Constant, _)) => {
                        return Err(RunError::new_err(format!(
                            "'{name}' is a constant of the graph and cannot be supplied"
                        )))
                    }
                    Some((BindingRole::Output, _)) => {
                        return Err(RunError::new_err(format!("'{name}' is a graph output, not an input")))
                    }
                    None => return Err(RunError::new_err(format!("'{name}' is not an input or weight of the graph"))),
                };
                let t = host_tensor(py, &name, &v, dtype)?;
                if matches!(role, Some((BindingRole::Weight, _))) {
                    weights.insert(name, t);
                } else {
                    ins.insert(name, t);
                }
            }
        }
        let plan = Arc::clone(&self.plan);
        let outputs = py
            .detach(move || {
                exec_sim::fill_tensors(&plan, &mut ins, &mut weights, seed);
                let exec = SimExecutor::with_options(SimOptions { schedule, race_check, poison: true });
                let mut prepared = exec.prepare_sim(&plan, &weights).map_err(|e| one_line(&e))?;
                prepared.run_sim(&ins).map_err(|e| one_line(&e))
            })
            .map_err(RunError::new_err)?;
        let out = PyDict::new(py);
        for (name, t) in outputs {
            out.set_item(PyString::new(py, &name), to_numpy(py, t)?)?;
        }
        Ok(out)
    }

    fn __repr__(&self) -> String {
        format!("<cuplan.Simulator for '{}'>", self.plan.graph_name())
    }
}

/// Plan `source` (a model path) for every bucket of `buckets` (`{"batch": [1, 2, 4, 8]}`, or a grid over two
/// symbols) as one set sharing a pool, a weight upload and io addresses (the CLI's `plan --buckets`).
/// `dims` fixes the model's other symbols; `pad_safe` names symbols the caller marks safe to pad.
#[pyfunction]
#[pyo3(signature = (source, buckets, dims = None, streams = 1, fusion = true, reuse = true, order = "given", device = "h200", pad_safe = None))]
#[allow(clippy::too_many_arguments)]
fn plan_set(
    py: Python<'_>,
    source: &Bound<'_, PyAny>,
    buckets: &Bound<'_, PyDict>,
    dims: Option<&Bound<'_, PyDict>>,
    streams: i64,
    fusion: bool,
    reuse: bool,
    order: &str,
    device: &str,
    pad_safe: Option<Vec<String>>,
) -> PyResult<PlanSet> {
    let opts = plan_options(streams, fusion, reuse, false, order, device, "default")?;
    let path: std::path::PathBuf = source
        .extract()
        .map_err(|_| GraphError::new_err("plan_set: expected a model path (str or os.PathLike)".to_string()))?;
    let Some(graph) = path.to_str().map(str::to_string) else {
        return Err(GraphError::new_err(format!("'{}': the path is not valid UTF-8", path.display())));
    };
    let graph = if graph == "-" { "./-".to_string() } else { graph };
    let mut lists = Vec::with_capacity(buckets.len());
    for (k, v) in buckets.iter() {
        let name: String = k.extract().map_err(|_| PlanError::new_err(format!("buckets: key {k} is not a string")))?;
        let values: Vec<i128> =
            v.extract().map_err(|_| PlanError::new_err(format!("--buckets {name}: expected a list of integers")))?;
        let values: Vec<String> = values.iter().map(ToString::to_string).collect();
        lists.push(format!("{name}={}", values.join(",")));
    }
    let args = GraphArgs { graph, dims: dim_args(dims)? };
    let flags = cuplan::set::SetFlags { buckets: lists, pad_safe: pad_safe.unwrap_or_default() };
    let built = py.detach(|| cuplan::set::build(&args, &flags, &opts, false)).map_err(|e| plan_err(e.as_ref()))?;
    Ok(PlanSet { set: Arc::new(built.set), weights: Arc::new(built.weights), compile_ms: built.compile_ms })
}

/// Plans of one model for several buckets sharing one layout; `run` serves a request of any covered size.
#[pyclass(module = "cuplan", frozen)]
struct PlanSet {
    set: Arc<graph_plan::PlanSet>,
    weights: Arc<TensorMap>,
    compile_ms: f64,
}

/// `dims` as the set's request: symbol name -> value.
fn request_dims(dims: &Bound<'_, PyDict>) -> PyResult<graph_plan::Dims> {
    let mut out = graph_plan::Dims::new();
    for (k, v) in dims.iter() {
        let name: String = k.extract().map_err(|_| RunError::new_err(format!("dims: key {k} is not a string")))?;
        let value: usize =
            v.extract().map_err(|_| RunError::new_err(format!("dims {name:?}: expected a non-negative integer")))?;
        out.insert(name, value);
    }
    Ok(out)
}

#[pymethods]
impl PlanSet {
    /// The members' dims, in order (row-major over the bucketed symbols).
    #[getter]
    fn members(&self) -> Vec<std::collections::BTreeMap<String, usize>> {
        self.set.members().iter().map(|m| m.dims.clone()).collect()
    }

    /// Bytes of the set's activation pool (its largest member's).
    #[getter]
    fn pool_bytes(&self) -> u64 {
        self.set.pool_bytes()
    }

    /// What separate plans' pools would cost together.
    #[getter]
    fn sum_pool_bytes(&self) -> u64 {
        self.set.sum_pool_bytes()
    }

    /// The set's figures as a dict: the same object as `cuplan plan --buckets ... --report`.
    fn report<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let text =
            serde_json::to_string(&cuplan::report::set_report(&self.set, self.compile_ms)).map_err(|e| plan_err(&e))?;
        json_to_py(py, &text)
    }

    /// The member a request of `dims` runs on (its dims), or the CLI's error for a request the set cannot serve.
    fn select(&self, dims: &Bound<'_, PyDict>) -> PyResult<std::collections::BTreeMap<String, usize>> {
        let i = self.set.select(&request_dims(dims)?).map_err(|e| RunError::new_err(one_line(&e)))?;
        Ok(self.set.members()[i].dims.clone())
    }

    /// The set as JSON (every member's whole plan).
    fn to_json(&self) -> String {
        self.set.to_json()
    }

    /// Run a request of `dims` on the simulator: `inputs` (name -> numpy array, every graph input at the
    /// request's shape) padded into the smallest covering bucket, outputs sliced back; `chunk` runs a request
    /// above the largest bucket in chunks of it. Weights not in the model file get seeded values (`seed`).
    #[pyo3(signature = (inputs, dims, chunk = false, schedule = "submission", seed = 0, race_check = true))]
    #[allow(clippy::too_many_arguments)]
    fn run<'py>(
        &self,
        py: Python<'py>,
        inputs: &Bound<'py, PyDict>,
        dims: &Bound<'py, PyDict>,
        chunk: bool,
        schedule: &str,
        seed: u64,
        race_check: bool,
    ) -> PyResult<Bound<'py, PyDict>> {
        let schedule = parse_schedule(schedule, seed)?;
        let dims = request_dims(dims)?;
        let mut ins = TensorMap::new();
        for (k, v) in inputs.iter() {
            let name: String =
                k.extract().map_err(|_| RunError::new_err(format!("inputs: key {k} is not a string")))?;
            let Some(t) = self.set.io().iter().find(|t| t.input && t.name == name) else {
                return Err(RunError::new_err(format!("'{name}' is not an input of the graph")));
            };
            let dtype = self
                .set
                .members()
                .first()
                .and_then(|m| m.plan.bindings().iter().find(|b| *b.name == *t.name))
                .map(|b| b.dtype)
                .ok_or_else(|| RunError::new_err(format!("'{name}' has no binding")))?;
            ins.insert(name.clone(), host_tensor(py, &name, &v, dtype)?);
        }
        let (set, weights) = (Arc::clone(&self.set), Arc::clone(&self.weights));
        let outputs = py
            .detach(move || {
                // Weights do not change with the buckets: seed the missing ones once, from the largest member.
                let mut weights = (*weights).clone();
                if let Some(m) = set.members().last() {
                    exec_sim::fill_tensors(&m.plan, &mut TensorMap::new(), &mut weights, seed);
                }
                let exec = SimExecutor::with_options(SimOptions { schedule, race_check, poison: true });
                let mut prepared = exec.prepare_set(&set, &weights).map_err(|e| one_line(&e))?;
                prepared.run_request(&dims, &ins, chunk).map_err(|e| one_line(&e))
            })
            .map_err(RunError::new_err)?;
        let out = PyDict::new(py);
        for (name, t) in outputs {
            out.set_item(PyString::new(py, &name), to_numpy(py, t)?)?;
        }
        Ok(out)
    }

    fn __repr__(&self) -> String {
        let name = self.set.members().first().map_or("", |m| m.plan.graph_name());
        format!("<cuplan.PlanSet '{name}': {} members, pool {} B>", self.set.members().len(), self.set.pool_bytes())
    }
}

/// The extension module `cuplan._cuplan` (re-exported by the `cuplan` package).
#[pymodule]
fn _cuplan(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_function(wrap_pyfunction!(load, m)?)?;
    m.add_function(wrap_pyfunction!(plan, m)?)?;
    m.add_function(wrap_pyfunction!(plan_set, m)?)?;
    m.add_class::<PlanSet>()?;
    m.add_class::<Graph>()?;
    m.add_class::<Plan>()?;
    m.add_class::<Simulator>()?;
    m.add("CuplanError", py.get_type::<CuplanError>())?;
    m.add("GraphError", py.get_type::<GraphError>())?;
    m.add("PlanError", py.get_type::<PlanError>())?;
    m.add("RunError", py.get_type::<RunError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
