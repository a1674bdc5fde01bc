//! `cargo xtask gpu-check`: the one prepared check for a machine with an NVIDIA GPU.
//!
//! Two halves, because the GPU machine may lack NVRTC (about 100 MB, too big to carry) and the time to build:
//!
//! - `gpu-check --prepare` (here, with NVRTC: `eval "$(bash .ci/install-nvrtc.sh)"` first) builds every plan the
//!   check runs, generates every kernel (with cuBLAS anchors and with generated products, in case cuBLAS is
//!   missing there) and compiles each distinct one to PTX for sm_90 into `target/gpu-check/ptx-cache`; copies
//!   the shared models into `target/gpu-check/models` and this program into `target/gpu-check/xtask`; writes
//!   `target/gpu-check/run.sh`. That folder is the whole bundle (well under the device tool's 64 MiB carry).
//! - `gpu-check` (there: `bash target/gpu-check/run.sh`, or `cargo xtask gpu-check` where cargo exists) runs the
//!   conformance suite (under the optimised and the reference plan, graph replay and eager submission) and the
//!   four shared models plus a 1,000-kernel launch-bound chain through exec-cuda and exec-sim, compares them
//!   (1e-3 relative for f32), times eager submission against graph replay (median of 100 runs after 10 warm-up
//!   runs, CUDA events), and writes `report.md` in the bundle (also printed). It exits non-zero when a check
//!   fails, and, without a GPU, says why and exits 2 (0 with `--allow-skip`).
//!
//! The plans are built by the same code in both halves, so a kernel the run needs is a kernel the prepare
//! compiled; the run checks that first and names any missing one. Kernel sources never depend on buffer offsets or
//! kernel ids, only on shapes, dtypes and attributes, so the cache survives unrelated plan changes.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use exec_cuda::codegen::{self, CodegenOptions, KernelSource, Launch};
use exec_cuda::{CompileCache, CompileOptions, CudaError, CudaExecutor, CudaOptions, CudaPrepared, SubmitMode};
use exec_sim::SimExecutor;
use graph_plan::conformance::{self, ConformanceCase};
use graph_plan::ir::op::MemSpace;
use graph_plan::ir::{synth, ComputeGraph};
use graph_plan::precision::{Precision, PrecisionPolicy};
use graph_plan::set::{dims_label, SetOptions};
use graph_plan::{
    verify_set, BucketSpec, DType, Dims, ExecutionPlan, Executor, HostTensor, Op, PlanOptions, PlanSet, PreparedPlan,
    Shape, TensorMap,
};

/// The shared models, in report order.
const MODELS: [&str; 4] = ["resnet50", "mobilenet_v2", "googlenet", "bert_base"];
/// Relative tolerance of CUDA against the simulator (f32 with reductions and cuBLAS).
const TOLERANCE: f64 = 1e-3;
/// Untimed runs before the timed ones.
const WARMUP: usize = 10;
/// Timed runs per workload and mode.
const RUNS: usize = 100;
/// Architectures the prepare compiles for by default (the H200 is sm_90).
const DEFAULT_ARCHS: &str = "sm_90";

const USAGE: &str = "usage: cargo xtask gpu-check [--prepare [--arch sm_90,...]] [--allow-skip] [--bundle DIR] \
                     [--models DIR] [--runs N] [--sim]";

struct Args {
    prepare: bool,
    verify_bundle: bool,
    allow_skip: bool,
    bundle: PathBuf,
    models: Option<PathBuf>,
    archs: Vec<String>,
    runs: usize,
    /// Recompute the simulator's reference outputs instead of using the bundle's.
    sim: bool,
}

fn parse(args: &[String]) -> Result<Args> {
    let mut a = Args {
        prepare: false,
        verify_bundle: false,
        allow_skip: false,
        bundle: workspace_root().join("target/gpu-check"),
        models: None,
        archs: DEFAULT_ARCHS.split(',').map(str::to_owned).collect(),
        runs: RUNS,
        sim: false,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().cloned().with_context(|| format!("{name} needs a value\n{USAGE}"));
        match arg.as_str() {
            "--prepare" => a.prepare = true,
            // Internal: run by --prepare in a fresh process, to prove the plans regenerate the same kernels.
            "--verify-bundle" => a.verify_bundle = true,
            "--allow-skip" => a.allow_skip = true,
            "--sim" => a.sim = true,
            "--bundle" => a.bundle = PathBuf::from(value("--bundle")?),
            "--models" => a.models = Some(PathBuf::from(value("--models")?)),
            "--arch" => a.archs = value("--arch")?.split(',').map(str::to_owned).collect(),
            "--runs" => a.runs = value("--runs")?.parse().context("--runs takes a count")?,
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => bail!("unknown gpu-check option {other:?}\n{USAGE}"),
        }
    }
    Ok(a)
}

/// The workspace root when this program runs from its build tree; the current directory otherwise (a carried
/// bundle runs with `--bundle`).
fn workspace_root() -> PathBuf {
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    if built.join("Cargo.toml").is_file() {
        built
    } else {
        PathBuf::from(".")
    }
}

/// Entry point of `cargo xtask gpu-check`.
pub fn main(args: &[String]) -> Result<()> {
    let args = parse(args)?;
    if args.prepare {
        prepare(&args)
    } else if args.verify_bundle {
        verify_bundle(&args)
    } else {
        run(&args)
    }
}

// ------------------------------------------------------------------------------------------------ workloads

/// A model or synthetic graph the check runs whole.
struct Workload {
    name: String,
    graph: ComputeGraph,
    /// Weights with data (the rest are seeded).
    weights: TensorMap,
    options: PlanOptions,
    /// Whether eager and graph submission are timed on it.
    timed: bool,
    /// Relative tolerance against the simulator: f32, or the precision check's for half plans (a GPU sum that
    /// differs in its last f32 bit may round to the neighbouring half value).
    tolerance: f64,
}

/// A plan set the check runs member by member and with one padded request: one pool, one weight upload.
struct SetWorkload {
    name: String,
    set: PlanSet,
    /// Weights with data (the rest are seeded), shared by every member.
    weights: TensorMap,
    /// The request served by padding (dims between two buckets), and the exact graph it is checked against.
    request: Dims,
    exact: ComputeGraph,
}

/// The half-precision plans the check runs beside the f32 ones, with their tolerance against the same plan on the
/// simulator and against the f32 reference (the precision check's: a GPU sum that differs in its last f32 bit
/// may round to the neighbouring half value).
const HALF_PLANS: [(&str, Precision, f64); 3] =
    [("resnet50", Precision::Fp16, 1e-2), ("bert_base", Precision::Fp16, 1e-2), ("bert_base", Precision::Bf16, 5e-2)];
/// The plan set: a dynamic export, its buckets, and the request between them served by padding.
const SET_MODEL: &str = "mobilenet_v2";
const SET_BUCKETS: &str = "batch=1,4";
const SET_REQUEST: usize = 3;

/// The conformance cases' two plans.
fn case_options() -> [(&'static str, PlanOptions); 2] {
    let mut optimised = PlanOptions::with_streams(2);
    optimised.fusion.caps = codegen::fusion_caps();
    let mut reference = PlanOptions::reference();
    reference.fusion.caps = codegen::fusion_caps();
    [("optimised", optimised), ("reference", reference)]
}

/// The suite's cases plus this backend's own: Memcpy through the host region, Gather clamping.
fn cases() -> Result<Vec<ConformanceCase>> {
    let mut cases = conformance::cases()?;
    cases.extend(cuda_cases()?);
    Ok(cases)
}

fn f32s(shape: &[usize], v: &[f32]) -> HostTensor {
    HostTensor::from_f32(shape.to_vec(), v)
}

/// Cases whose behaviour is this backend's: a kernel reading a Memcpy-to-host result from mapped pinned memory,
/// and out-of-range Gather indices clamped to the axis (the simulator reports those as errors instead).
fn cuda_cases() -> Result<Vec<ConformanceCase>> {
    let mut out = Vec::new();
    {
        let mut g = ComputeGraph::new("cuda/memcpy_host_region");
        let x = g.add_input("x", DType::F32, [4])?;
        let r = g.add_node("r", Op::Relu, &[x])?[0];
        let h = g.add_node("to_host", Op::Memcpy { to: MemSpace::Host }, &[r])?[0];
        let y = g.add_node("y", Op::Neg, &[h])?[0];
        g.mark_output(h)?;
        g.mark_output(y)?;
        let (hn, yn) = (g.tensor(h).name.to_string(), g.tensor(y).name.to_string());
        out.push(ConformanceCase {
            name: "cuda/memcpy_host_region".into(),
            graph: g,
            inputs: [("x".to_owned(), f32s(&[4], &[-1.0, 2.0, -3.0, 4.0]))].into(),
            weights: TensorMap::new(),
            expected: [(hn, f32s(&[4], &[0.0, 2.0, 0.0, 4.0])), (yn, f32s(&[4], &[0.0, -2.0, 0.0, -4.0]))].into(),
            tolerance: 0.0,
        });
    }
    {
        let mut g = ComputeGraph::new("cuda/gather_clamps");
        let d = g.add_input("d", DType::F32, [3])?;
        let i = g.add_input("i", DType::I64, [4])?;
        let y = g.add_node("y", Op::Gather { axis: 0 }, &[d, i])?[0];
        g.mark_output(y)?;
        let yn = g.tensor(y).name.to_string();
        let idx = HostTensor {
            dtype: DType::I64,
            shape: Shape::from(vec![4]),
            data: [5i64, -7, 1, -1].iter().flat_map(|v| v.to_le_bytes()).collect(),
        };
        out.push(ConformanceCase {
            name: "cuda/gather_clamps".into(),
            graph: g,
            inputs: [("d".to_owned(), f32s(&[3], &[10.0, 20.0, 30.0])), ("i".to_owned(), idx)].into(),
            weights: TensorMap::new(),
            // 5 -> 2, -7 -> -4 -> 0, 1, -1 -> 2.
            expected: [(yn, f32s(&[4], &[30.0, 10.0, 20.0, 30.0]))].into(),
            tolerance: 0.0,
        });
    }
    Ok(out)
}

/// Where the models are: `--models`, `$CUPLAN_MODELS_DIR`, the bundle, then the repository's `models/`.
fn models_dir(args: &Args) -> Option<PathBuf> {
    let root = workspace_root();
    let candidates = [
        args.models.clone(),
        std::env::var_os("CUPLAN_MODELS_DIR").map(PathBuf::from),
        Some(args.bundle.join("models")),
        Some(root.join("models")),
    ];
    candidates.into_iter().flatten().find(|d| d.join(format!("{}.onnx", MODELS[0])).is_file())
}

fn onnx_weights(model: &graph_onnx::OnnxModel) -> TensorMap {
    model
        .weights
        .iter()
        .map(|w| (w.name.clone(), HostTensor { dtype: w.dtype, shape: w.shape.clone(), data: w.bytes.to_vec() }))
        .collect()
}

/// The models' plan options: four streams, this backend's fusion caps, and `precision`.
fn model_options(precision: Precision) -> PlanOptions {
    let mut options = PlanOptions::with_streams(4);
    options.fusion.caps = codegen::fusion_caps();
    options.precision = PrecisionPolicy::new(precision);
    options
}

/// The shared models (f32, then the half plans), the launch-bound chain, and the plan set.
fn workloads(args: &Args) -> Result<(Vec<Workload>, Vec<SetWorkload>, Option<PathBuf>)> {
    let mut out = Vec::new();
    let mut sets = Vec::new();
    let dir = models_dir(args);
    match &dir {
        Some(dir) => {
            for m in MODELS {
                let model =
                    graph_onnx::import_file(dir.join(format!("{m}.onnx")), &graph_onnx::ImportOptions::default())
                        .with_context(|| format!("importing {m}"))?;
                let weights = onnx_weights(&model);
                for &(_, precision, tolerance) in HALF_PLANS.iter().filter(|h| h.0 == m) {
                    out.push(Workload {
                        name: format!("{m} {}", precision.name()),
                        graph: model.graph.clone(),
                        weights: weights.clone(),
                        options: model_options(precision),
                        timed: true,
                        tolerance,
                    });
                }
                out.push(Workload {
                    name: m.to_owned(),
                    graph: model.graph,
                    weights,
                    options: model_options(Precision::Fp32),
                    timed: true,
                    tolerance: TOLERANCE,
                });
            }
            // f32 first, in MODELS order; the half plans after them.
            out.sort_by_key(|w| w.options.precision.precision != Precision::Fp32);
            let dynamic = dir.join("dynamic").join(format!("{SET_MODEL}.onnx"));
            if dynamic.is_file() {
                sets.push(set_workload(&dynamic)?);
            } else {
                eprintln!("gpu-check: {} not found: the plan set is skipped", dynamic.display());
            }
        }
        None => eprintln!("gpu-check: the shared models were not found (--models DIR or CUPLAN_MODELS_DIR): skipped"),
    }
    // Launch-bound: 1,000 elementwise kernels in a row, fusion off.
    let mut options = PlanOptions::with_streams(1);
    options.fusion.enabled = false;
    options.fusion.caps = codegen::fusion_caps();
    out.push(Workload {
        name: "chain1000 (fusion off)".to_owned(),
        graph: synth::chain(1000)?,
        weights: TensorMap::new(),
        options,
        timed: true,
        tolerance: TOLERANCE,
    });
    Ok((out, sets, dir))
}

/// The dynamic export at `path` planned for `SET_BUCKETS` (two streams), with the exact graph of `SET_REQUEST`.
fn set_workload(path: &Path) -> Result<SetWorkload> {
    let import = |d: &Dims| {
        let options = graph_onnx::ImportOptions {
            dims: d.iter().map(|(k, v)| (k.clone(), *v)).collect(),
            inline_folded: true,
            ..graph_onnx::ImportOptions::default()
        };
        graph_onnx::import_file(path, &options)
    };
    let spec = BucketSpec::parse(&[SET_BUCKETS])?;
    let mut plan = PlanOptions::with_streams(2);
    plan.fusion.caps = codegen::fusion_caps();
    let opts = SetOptions { plan, fixed: Dims::new(), pad_safe: Vec::new() };
    let set = PlanSet::build(&spec, &opts, |d| Ok(import(d)?.graph))?;
    if let Err(v) = verify_set(&set) {
        bail!("{SET_MODEL} set fails verify_set: {}", v.first().map(ToString::to_string).unwrap_or_default());
    }
    let symbol = spec.names().next().context("the set has no bucketed symbol")?.to_string();
    let request: Dims = [(symbol, SET_REQUEST)].into();
    let exact = import(&request).with_context(|| format!("importing {SET_MODEL} at {}", dims_label(&request)))?;
    Ok(SetWorkload {
        name: format!("{SET_MODEL} set {SET_BUCKETS}"),
        weights: onnx_weights(&exact),
        set,
        request,
        exact: exact.graph,
    })
}

/// Every plan the run builds, named.
fn all_plans(
    cases: &[ConformanceCase],
    work: &[Workload],
    sets: &[SetWorkload],
) -> Result<Vec<(String, ExecutionPlan)>> {
    let mut plans = Vec::new();
    for (tag, opts) in case_options() {
        for c in cases {
            let p = ExecutionPlan::build_with(&c.graph, &opts).with_context(|| format!("{tag} {}", c.name))?;
            plans.push((format!("{tag} {}", c.name), p));
        }
    }
    for w in work {
        plans.push((w.name.clone(), ExecutionPlan::build_with(&w.graph, &w.options).context(w.name.clone())?));
    }
    for s in sets {
        for m in s.set.members() {
            plans.push((format!("{} {}", s.name, dims_label(&m.dims)), m.plan.clone()));
        }
    }
    Ok(plans)
}

/// The distinct launched kernel sources of `plans`, with and without cuBLAS anchors.
fn distinct_sources(plans: &[(String, ExecutionPlan)]) -> Result<Vec<KernelSource>> {
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for (name, plan) in plans {
        for cublas in [true, false] {
            let sources = codegen::generate_all_with(plan, &CodegenOptions { cublas })
                .map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
            for s in sources {
                if s.launch != Launch::None && seen.insert(s.source.clone()) {
                    out.push(s);
                }
            }
        }
    }
    Ok(out)
}

// ------------------------------------------------------------------------------------------------ prepare

fn prepare(args: &Args) -> Result<()> {
    let started = Instant::now();
    if cfg!(debug_assertions) {
        eprintln!(
            "gpu-check --prepare: this binary is unoptimised; the bundle carries it, so eager submission would be timed \
             with unoptimised host code and the simulator runs slowly. Prefer `cargo run --release -p xtask -- \
             gpu-check --prepare`."
        );
    }
    if let Err(e) = exec_cuda::nvrtc_availability() {
        bail!("gpu-check --prepare compiles every kernel with NVRTC, which is missing here: {e}");
    }
    std::fs::create_dir_all(&args.bundle)?;
    let args =
        &Args { bundle: args.bundle.canonicalize()?, models: args.models.clone(), archs: args.archs.clone(), ..*args };
    let cases = cases()?;
    let (work, sets, models) = workloads(args)?;
    let plans = all_plans(&cases, &work, &sets)?;
    let sources = distinct_sources(&plans)?;
    let cache_dir = args.bundle.join("ptx-cache");
    let cache = CompileCache::with_dir(&cache_dir);
    println!(
        "gpu-check --prepare: {} plans, {} distinct kernels, for {} into {}",
        plans.len(),
        sources.len(),
        args.archs.join(","),
        cache_dir.display()
    );
    for arch in &args.archs {
        compile_all(&cache, &sources, &CompileOptions::for_arch(arch))?;
    }
    let st = cache.stats();
    println!("  NVRTC compiled {}, {} already in the cache", st.misses, st.disk_hits);
    // The models travel with the bundle.
    if let Some(dir) = &models {
        let dst = args.bundle.join("models");
        std::fs::create_dir_all(&dst)?;
        for m in MODELS {
            let name = format!("{m}.onnx");
            if dir.join(&name) != dst.join(&name) {
                std::fs::copy(dir.join(&name), dst.join(&name)).with_context(|| format!("copying {name}"))?;
            }
        }
        let name = format!("dynamic/{SET_MODEL}.onnx");
        if !sets.is_empty() && dir.join(&name) != dst.join(&name) {
            std::fs::create_dir_all(dst.join("dynamic"))?;
            std::fs::copy(dir.join(&name), dst.join(&name)).with_context(|| format!("copying {name}"))?;
        }
    }
    // This program, without debug info (the device may have no cargo, and no time to build).
    let exe = std::env::current_exe()?;
    let dst = args.bundle.join("xtask");
    if exe != dst {
        std::fs::copy(&exe, &dst).context("copying the xtask binary")?;
        let stripped = std::process::Command::new("strip").arg("--strip-debug").arg(&dst).status();
        if !stripped.is_ok_and(|s| s.success()) {
            eprintln!("  (strip is not available: the binary keeps its debug info)");
        }
    }
    // The simulator's reference outputs of every workload (minutes of CPU here, none on the device).
    let refs = args.bundle.join("reference");
    std::fs::create_dir_all(&refs)?;
    for w in &work {
        let t = Instant::now();
        let (inputs, weights, reference) = workload_tensors(w)?;
        let path = refs.join(format!("{}.bin", slug(&w.name)));
        if read_reference(&path, fingerprint(&inputs, &weights)).is_none() {
            let want = exec_sim::run_plan(&SimExecutor::new(), &reference, &weights, &inputs)
                .map_err(|e| anyhow::anyhow!("{}: sim: {e}", w.name))?;
            write_reference(&path, fingerprint(&inputs, &weights), &want)?;
            println!("  reference outputs of {} (exec-sim) in {:.1} s", w.name, t.elapsed().as_secs_f64());
        }
    }
    for s in &sets {
        let (weights, runs) = set_tensors(s)?;
        for r in &runs {
            let t = Instant::now();
            let path = refs.join(format!("{}.bin", slug(&format!("{} {}", s.name, r.label))));
            if read_reference(&path, fingerprint(&r.inputs, &weights)).is_none() {
                let want = exec_sim::run_plan(&SimExecutor::new(), &r.reference, &weights, &r.inputs)
                    .map_err(|e| anyhow::anyhow!("{} {}: sim: {e}", s.name, r.label))?;
                write_reference(&path, fingerprint(&r.inputs, &weights), &want)?;
                println!("  reference outputs of {} {} in {:.1} s", s.name, r.label, t.elapsed().as_secs_f64());
            }
        }
    }
    std::fs::write(args.bundle.join("run.sh"), RUN_SH)?;
    std::fs::write(args.bundle.join("torch_baseline.py"), TORCH_BASELINE)?;
    bundle_gpu_tests(&args.bundle.join("tests"))?;
    // A fresh process regenerates every kernel and finds it in the cache (no NVRTC call): the device will too.
    let verified = std::process::Command::new(&dst)
        .args(["gpu-check", "--verify-bundle", "--bundle"])
        .arg(&args.bundle)
        .arg("--arch")
        .arg(args.archs.join(","))
        .status()
        .context("running the bundled binary")?;
    if !verified.success() {
        bail!("the bundle does not cover every kernel its own binary generates (see above)");
    }
    let size = dir_bytes(&args.bundle);
    println!(
        "  bundle {} ready in {:.1} s: {:.1} MiB{}",
        args.bundle.display(),
        started.elapsed().as_secs_f64(),
        size as f64 / (1 << 20) as f64,
        if models.is_none() { " (no models: they will be skipped)" } else { "" }
    );
    println!("  device: carry [\"target/gpu-check\"], run `bash target/gpu-check/run.sh` (timeout 600 s)");
    for line in device_plan(cases.len(), &work, &sets) {
        println!("    {line}");
    }
    if size > 60 << 20 {
        bail!("the bundle is over 60 MiB: it would not fit the device tool's 64 MiB carry");
    }
    Ok(())
}

/// exec-cuda's test binaries that need a GPU, carried so that the device runs them from the bundle (no cargo
/// there); run.sh runs each after the check.
const GPU_TESTS: [&str; 2] = ["gpu", "attention"];

/// Builds exec-cuda's GPU test binaries in release (`cargo test --no-run`, their paths from cargo's JSON
/// messages) and copies them, without debug info, into `dir`. Without cargo (a bundle's own binary) it says so
/// and carries none.
fn bundle_gpu_tests(dir: &Path) -> Result<()> {
    let out = std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned()))
        .current_dir(workspace_root())
        .args(["test", "--release", "-p", "exec-cuda", "--no-run", "--message-format=json"])
        .args(GPU_TESTS.iter().flat_map(|t| ["--test", t]))
        .stderr(std::process::Stdio::inherit())
        .output();
    let out = match out {
        Ok(o) if o.status.success() => o,
        Ok(o) => bail!("building exec-cuda's GPU tests failed ({})", o.status),
        Err(e) => {
            eprintln!("  (cargo is not available: the bundle carries no test binaries: {e})");
            return Ok(());
        }
    };
    std::fs::create_dir_all(dir)?;
    let mut carried = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        let name = msg.pointer("/target/name").and_then(serde_json::Value::as_str);
        let exe = msg.get("executable").and_then(serde_json::Value::as_str);
        if let (Some(name), Some(exe)) = (name, exe) {
            if GPU_TESTS.contains(&name) {
                let dst = dir.join(name);
                std::fs::copy(exe, &dst).with_context(|| format!("copying the test binary {exe}"))?;
                let _ = std::process::Command::new("strip").arg("--strip-debug").arg(&dst).status();
                carried.push(name.to_owned());
            }
        }
    }
    carried.sort_unstable();
    println!("  exec-cuda GPU tests carried: {}", carried.join(", "));
    Ok(())
}

/// What the device run will do with this bundle, one line each (printed by `--prepare`, so that whoever spends the
/// device time knows what it buys).
fn device_plan(cases: usize, work: &[Workload], sets: &[SetWorkload]) -> Vec<String> {
    let named =
        |timed: bool| -> Vec<&str> { work.iter().filter(|w| w.timed == timed).map(|w| w.name.as_str()).collect() };
    let mut lines = vec![
        "the device run, from the bundle alone (no cargo, no NVRTC needed there):".to_owned(),
        "1. opens GPU 0 (without a driver: says why and exits 2, or 0 with --allow-skip); without NVRTC there, checks \
         that every kernel it will launch is in ptx-cache for the GPU's architecture and names any missing one"
            .to_owned(),
        format!(
            "2. conformance: {cases} cases x 2 plans (optimised on 2 streams, reference) on exec-sim and on exec-cuda \
             in graph replay and in eager submission ({TOLERANCE:e} relative), graph == eager bitwise"
        ),
        format!(
            "3. workloads through exec-cuda (both modes) against exec-sim's reference-plan outputs in reference/ \
             ({TOLERANCE:e} relative): {}",
            work.iter().map(|w| w.name.as_str()).collect::<Vec<_>>().join(", ")
        ),
        format!(
            "4. timings, CUDA events, median of {RUNS} runs after {WARMUP} warm-up runs, eager vs graph replay, beside \
             the timing model's predicted makespan, and each launch timed alone against its estimate (by kernel \
             class): {}",
            named(true).join(", ")
        ),
        format!(
            "5. plan sets through one prepared set (one pool, one weight upload), each member and one padded request \
             against exec-sim: {}",
            sets.iter().map(|s| s.name.as_str()).collect::<Vec<_>>().join(", ")
        ),
        "6. writes report.md into the bundle and into $OUT; exits non-zero when any check fails".to_owned(),
        "7. where python3 has torch: PyTorch eager and CUDA-graph times of the same architectures (torch.md)"
            .to_owned(),
        format!("8. exec-cuda's GPU test binaries from tests/ ({}), logs in $OUT/tests-NAME.log", GPU_TESTS.join(", ")),
    ];
    let untimed = named(false);
    if !untimed.is_empty() {
        lines.push(format!("(checked, not timed: {})", untimed.join(", ")));
    }
    lines
}

/// Checks, without NVRTC, that every kernel the run needs is in the bundle's PTX cache for each `--arch`.
fn verify_bundle(args: &Args) -> Result<()> {
    let cases = cases()?;
    let (work, sets, _) = workloads(args)?;
    let sources = distinct_sources(&all_plans(&cases, &work, &sets)?)?;
    let cache = CompileCache::with_dir(args.bundle.join("ptx-cache"));
    for arch in &args.archs {
        let missing = missing_kernels(&cache, &sources, &CompileOptions::for_arch(arch));
        if !missing.is_empty() {
            bail!("{} of {} kernels are missing for {arch}: {}", missing.len(), sources.len(), missing.join(", "));
        }
        println!("  verified: all {} kernels are in the bundle for {arch}", sources.len());
    }
    Ok(())
}

fn missing_kernels(cache: &CompileCache, sources: &[KernelSource], options: &CompileOptions) -> Vec<String> {
    sources.iter().filter(|s| !cache.contains(&s.source, options)).map(|s| s.name.clone()).collect()
}

/// Compiles `sources` on every core; fails listing each kernel that does not compile.
fn compile_all(cache: &CompileCache, sources: &[KernelSource], options: &CompileOptions) -> Result<()> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failures = std::sync::Mutex::new(Vec::new());
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(s) = sources.get(i) else { break };
                if let Err(e) = cache.compile(&s.name, &s.source, options) {
                    failures.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(format!("{}: {e}", s.name));
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner);
    if !failures.is_empty() {
        bail!("{} kernel(s) failed to compile for {}:\n{}", failures.len(), options.arch, failures.join("\n"));
    }
    Ok(())
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| match e.metadata() {
                    Ok(m) if m.is_dir() => dir_bytes(&e.path()),
                    Ok(m) => m.len(),
                    Err(_) => 0,
                })
                .sum()
        })
        .unwrap_or(0)
}

/// PyTorch's figures for the same architectures on the same GPU (run by run.sh where python3 has torch).
const TORCH_BASELINE: &str = include_str!("../gpu/torch_baseline.py");

/// The device-side wrapper, written into the bundle by `--prepare`.
const RUN_SH: &str = r#"#!/usr/bin/env bash
# Written by `cargo xtask gpu-check --prepare`. Runs the prepared GPU check on a machine with an NVIDIA GPU:
#     bash target/gpu-check/run.sh [--sim] [--runs N]     (from the repository root; the bundle is target/gpu-check)
# The report lands in target/gpu-check/report.md, and in $OUT when that is set (the device tool's output folder).
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# cudarc dlopens libcuda.so.1, libnvrtc.so.12 (or libnvrtc.so) and libcublas.so.12 (or libcublas.so) by name.
# Make the usual folders visible, and when only a CUDA 13 cuBLAS/NVRTC exists (a toolkit or a pip wheel), give it
# the unversioned name cudarc also tries: the C entry points used here are unchanged in 13.
LIBS="$HERE/lib"
mkdir -p "$LIBS"
DIRS=""
for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && DIRS="$DIRS:$d"
done
visible() { # is $1 loadable by name already?
    ldconfig -p 2>/dev/null | grep -q "[[:space:]]$1 (" && return 0
    local d
    for d in ${DIRS//:/ }; do [ -e "$d/$1" ] && return 0; done
    return 1
}
FOUND=""
for lib in cublas nvrtc; do
    visible "lib$lib.so.12" && continue
    if [ -z "$FOUND" ]; then
        FOUND="$(find /usr/local /usr/lib/x86_64-linux-gnu /opt /usr/lib/python3* \( -name 'libcublas.so.1[23]*' \
            -o -name 'libnvrtc.so.1[23]*' \) 2>/dev/null | sort)"
    fi
    pick="$(echo "$FOUND" | grep "/lib$lib\.so\.12" | head -1)"
    [ -z "$pick" ] && pick="$(echo "$FOUND" | grep "/lib$lib\.so\.13" | head -1)"
    if [ -n "$pick" ]; then
        ln -sf "$pick" "$LIBS/lib$lib.so"
        DIRS="$DIRS:$(dirname "$pick")" # its companions (libcublasLt, libnvrtc-builtins) load from there
        echo "gpu-check: lib$lib: $pick"
    else
        case $lib in
            cublas) echo "gpu-check: libcublas not found: products run as generated kernels" ;;
            *) echo "gpu-check: libnvrtc not found: kernels come from the bundle's PTX cache only" ;;
        esac
    fi
done
export LD_LIBRARY_PATH="$LIBS$DIRS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "gpu-check: LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
if [ -x "$HERE/xtask" ]; then
    "$HERE/xtask" gpu-check --bundle "$HERE" "$@"
else
    echo "gpu-check: no prepared binary in $HERE; building with cargo" >&2
    cargo run --release -p xtask -- gpu-check --bundle "$HERE" "$@"
fi
rc=$?
if [ -n "${OUT:-}" ] && [ -f "$HERE/report.md" ]; then cp "$HERE/report.md" "$OUT/"; fi
if [ -n "${OUT:-}" ] && [ -f "$HERE/launches.tsv" ]; then cp "$HERE/launches.tsv" "$OUT/"; fi
# exec-cuda's GPU tests, carried as binaries (a failure makes the exit status non-zero).
for t in "$HERE"/tests/*; do
    [ -x "$t" ] || continue
    name="$(basename "$t")"
    log="$HERE/tests-$name.log"
    CUPLAN_PTX_CACHE="$HERE/ptx-cache" timeout 300 "$t" --test-threads 1 >"$log" 2>&1
    trc=$?
    echo "gpu-check: tests/$name exit $trc: $(grep -E '^test result' "$log" | tail -1)"
    [ $trc -ne 0 ] && rc=1
    if [ -n "${OUT:-}" ]; then cp "$log" "$OUT/"; fi
done
# PyTorch on the same GPU, for comparison (does not change the exit status).
if [ -f "$HERE/torch_baseline.py" ] && python3 -c 'import torch, torchvision' 2>/dev/null; then
    timeout 300 python3 "$HERE/torch_baseline.py" --out "$HERE/torch.md" || echo "gpu-check: the PyTorch baseline failed"
    if [ -n "${OUT:-}" ] && [ -f "$HERE/torch.md" ]; then cp "$HERE/torch.md" "$OUT/"; fi
else
    echo "gpu-check: python3 with torch and torchvision not found: no PyTorch baseline"
fi
exit $rc
"#;

// ------------------------------------------------------------------------------------------------ references

/// A file-name-safe form of a workload name.
fn slug(name: &str) -> String {
    let s: String = name.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
    s.split('-').filter(|p| !p.is_empty()).collect::<Vec<_>>().join("-")
}

/// A fingerprint of the tensors a reference was computed from: names, dtypes, shapes, and a strided sample of
/// the bytes (every 4099th byte and the last 64 of each tensor: enough to notice a changed generator or seed, and
/// cheap on bert's 440 MB).
fn fingerprint(inputs: &TensorMap, weights: &TensorMap) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |b: u8| h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    for (name, t) in inputs.iter().chain(weights) {
        name.bytes().chain(t.dtype.to_string().bytes()).for_each(&mut eat);
        t.shape.dims().iter().flat_map(|d| d.to_le_bytes()).for_each(&mut eat);
        t.data.iter().step_by(4099).chain(t.data.iter().rev().take(64)).for_each(|&b| eat(b));
    }
    h
}

const REF_MAGIC: &str = "cuplan-reference-outputs v1";

/// Writes `outputs` after a text header: the magic line, the fingerprint, then per tensor a line
/// `name<TAB>dtype<TAB>dims,...<TAB>bytes` followed by its bytes.
fn write_reference(path: &Path, fingerprint: u64, outputs: &TensorMap) -> Result<()> {
    let mut out = format!("{REF_MAGIC}\n{fingerprint:016x}\n{}\n", outputs.len()).into_bytes();
    for (name, t) in outputs {
        let dims: Vec<String> = t.shape.dims().iter().map(ToString::to_string).collect();
        out.extend(format!("{name}\t{}\t{}\t{}\n", t.dtype, dims.join(","), t.data.len()).bytes());
        out.extend_from_slice(&t.data);
    }
    std::fs::write(path, out).with_context(|| format!("writing {}", path.display()))
}

/// The outputs stored at `path`, when the file is there, well formed and made from tensors with `fingerprint`.
fn read_reference(path: &Path, fingerprint: u64) -> Option<TensorMap> {
    let bytes = std::fs::read(path).ok()?;
    let mut rest = bytes.as_slice();
    fn line(rest: &mut &[u8]) -> Option<String> {
        let end = rest.iter().position(|&b| b == b'\n')?;
        let l = String::from_utf8(rest[..end].to_vec()).ok();
        *rest = &rest[end + 1..];
        l
    }
    if line(&mut rest)? != REF_MAGIC || u64::from_str_radix(&line(&mut rest)?, 16).ok()? != fingerprint {
        return None;
    }
    let count: usize = line(&mut rest)?.parse().ok()?;
    let mut out = TensorMap::new();
    for _ in 0..count {
        let header = line(&mut rest)?;
        let f: Vec<&str> = header.split('\t').collect();
        let [name, dtype, dims, len] = f.as_slice() else { return None };
        let dtype = *DType::ALL.iter().find(|d| d.to_string() == *dtype)?;
        let dims = if dims.is_empty() {
            Vec::new()
        } else {
            dims.split(',').map(str::parse).collect::<Result<Vec<usize>, _>>().ok()?
        };
        let len: usize = len.parse().ok()?;
        let data = rest.get(..len)?.to_vec();
        rest = &rest[len..];
        out.insert((*name).to_owned(), HostTensor { dtype, shape: Shape::from(dims), data });
    }
    Some(out)
}

// ------------------------------------------------------------------------------------------------ run

/// One row of the conformance table.
#[derive(Default)]
struct SuiteTally {
    runs: usize,
    failures: Vec<String>,
}

fn run(args: &Args) -> Result<()> {
    let started = Instant::now();
    let info = match exec_cuda::availability() {
        Ok(i) => i,
        Err(e) => {
            let msg = format!("gpu-check: no GPU here, nothing checked: {e}");
            if args.allow_skip {
                println!("{msg} (--allow-skip)");
                return Ok(());
            }
            eprintln!("{msg}");
            std::process::exit(2);
        }
    };
    // Holding the device open keeps its primary context alive across the many prepares.
    let _device = exec_cuda::Device::open(0).map_err(|e| anyhow::anyhow!("opening device 0: {e}"))?;
    let nvrtc = match exec_cuda::nvrtc_availability() {
        Ok(n) => format!("NVRTC {}.{}", n.version.0, n.version.1),
        Err(e) => format!("absent ({e})"),
    };
    let cublas = match exec_cuda::cublas_availability() {
        Ok(()) => "loads".to_owned(),
        Err(e) => format!("absent: products run as generated kernels ({e})"),
    };
    let cache_dir = args.bundle.join("ptx-cache");
    let ptx_cache = cache_dir.is_dir().then(|| cache_dir.clone());
    let mut report = String::new();
    writeln!(report, "# cuplan gpu-check\n")?;
    writeln!(
        report,
        "- device: {} (sm_{}{}, {} SMs, {:.0} GiB), driver CUDA {}.{}",
        info.name,
        info.compute_capability.0,
        info.compute_capability.1,
        info.sm_count,
        info.total_memory as f64 / (1u64 << 30) as f64,
        info.driver_version_pair().0,
        info.driver_version_pair().1
    )?;
    writeln!(report, "- NVRTC: {nvrtc}")?;
    writeln!(report, "- cuBLAS: {cublas}")?;
    writeln!(
        report,
        "- PTX cache: {}",
        ptx_cache.as_ref().map_or("none (every kernel through NVRTC)".to_owned(), |d| d.display().to_string())
    )?;

    let cases = cases()?;
    let (work, sets, models) = workloads(args)?;
    writeln!(report, "- models: {}", models.map_or("not found: skipped".to_owned(), |d| d.display().to_string()))?;
    // Every kernel must be compilable here or already compiled: name the missing ones before anything runs.
    let plans = all_plans(&cases, &work, &sets)?;
    let sources = distinct_sources(&plans)?;
    let arch_options = CompileOptions::for_arch(&info.arch());
    if exec_cuda::nvrtc_availability().is_err() {
        let cache = ptx_cache.as_ref().map(CompileCache::with_dir).unwrap_or_default();
        let missing = missing_kernels(&cache, &sources, &arch_options);
        writeln!(
            report,
            "- kernels: {} distinct, {} missing from the PTX cache for {}",
            sources.len(),
            missing.len(),
            info.arch()
        )?;
        if !missing.is_empty() {
            print!("{report}");
            bail!(
                "{} kernel(s) are neither in the PTX cache nor compilable (no NVRTC here): rerun `cargo xtask gpu-check \
                 --prepare --arch {}` on a machine with NVRTC and carry the bundle again",
                missing.len(),
                info.arch()
            );
        }
    } else {
        writeln!(report, "- kernels: {} distinct", sources.len())?;
    }
    let options = |mode| CudaOptions { mode, ptx_cache: ptx_cache.clone(), ..CudaOptions::new(0) };
    let graph_exec = CudaExecutor::with_options(options(SubmitMode::Graph));
    let eager_exec = CudaExecutor::with_options(options(SubmitMode::Eager));
    let sim = SimExecutor::new();
    let mut failed = false;

    // Conformance: each case under both plans, on the simulator and on the GPU in both modes.
    let t = Instant::now();
    let mut tally: BTreeMap<&str, SuiteTally> = BTreeMap::new();
    for (tag, opts) in case_options() {
        for c in &cases {
            let own = c.name.starts_with("cuda/");
            if !own {
                let r = conformance::run_case_with(&sim, c, &opts, 0.0);
                let e = tally.entry("sim").or_default();
                e.runs += 1;
                if let Err(f) = r {
                    e.failures.push(format!("{tag} {}: {f}", c.name));
                }
            }
            for (exec, mode) in [(&graph_exec, "cuda graph"), (&eager_exec, "cuda eager")] {
                let r = conformance::run_case_with(exec, c, &opts, TOLERANCE);
                let e = tally.entry(mode).or_default();
                e.runs += 1;
                if let Err(f) = r {
                    e.failures.push(format!("{tag} {}: {f}", c.name));
                }
            }
            let e = tally.entry("graph == eager (bitwise)").or_default();
            e.runs += 1;
            match both_modes(&graph_exec, &eager_exec, c, &opts) {
                Ok(true) => {}
                Ok(false) => e.failures.push(format!("{tag} {}: outputs differ", c.name)),
                Err(msg) => e.failures.push(format!("{tag} {}: {msg}", c.name)),
            }
        }
    }
    writeln!(
        report,
        "\n## Conformance ({} cases x {} plans, {:.1} s)\n",
        cases.len(),
        case_options().len(),
        t.elapsed().as_secs_f64()
    )?;
    writeln!(report, "| executor | runs | failed |\n|---|---|---|")?;
    for (name, s) in &tally {
        writeln!(report, "| {name} | {} | {} |", s.runs, s.failures.len())?;
    }
    for (name, s) in &tally {
        for f in &s.failures {
            failed = true;
            writeln!(report, "- {name}: {f}")?;
        }
    }
    print!("{report}");
    let mut printed = report.len();

    // Models and the chain: CUDA (graph, then eager) against the simulator's reference plan; then timings.
    writeln!(
        report,
        "\n## Models against exec-sim, tolerance {TOLERANCE:e} relative (f32, against the reference plan), \
         the precision check's for half plans (1e-2 fp16, 5e-2 bf16; against the same plan on the simulator, which \
         rounds where the kernels do)\n"
    )?;
    writeln!(
        report,
        "| workload | kernels | streams | cuBLAS products / calls | max rel err | passed | graph == eager | prepare s | sim s |\n|---|---|---|---|---|---|---|---|---|"
    )?;
    let mut timings = Vec::new();
    let mut launches = vec![LAUNCHES_HEADER.to_owned()];
    for w in &work {
        let row = model_row(w, &graph_exec, &eager_exec, args);
        match row {
            Ok(r) => {
                failed |= !r.passed || !r.modes_equal;
                writeln!(
                    report,
                    "| {} | {} | {} | {} | {:.2e} | {} | {} | {:.1} | {} |",
                    w.name,
                    r.kernels,
                    r.streams,
                    r.cublas,
                    r.max_rel_err,
                    if r.passed { "yes" } else { "**NO**" },
                    if r.modes_equal { "yes" } else { "**NO**" },
                    r.prepare_s,
                    r.sim_s.map_or("prepared".to_owned(), |s| format!("{s:.1}"))
                )?;
                for note in &r.notes {
                    writeln!(report, "|  | {note} | | | | | | | |")?;
                }
                launches.extend(r.launch_lines);
                if let Some(t) = r.timing {
                    timings.push((w.name.clone(), r.kernels, t, r.predicted, r.classes));
                }
            }
            Err(e) => {
                failed = true;
                writeln!(report, "| {} | **error**: {} | | | | | | | |", w.name, e.to_string().replace('\n', " "))?;
            }
        }
        print!("{}", &report[printed..]);
        printed = report.len();
    }
    writeln!(
        report,
        "\n## Eager submission vs graph replay (median of {} runs after {WARMUP} warm-up, CUDA events)\n",
        args.runs
    )?;
    writeln!(
        report,
        "| workload | launches | eager us | graph us | speed-up | eager - graph per launch us | predicted eager us | \
         predicted graph us | graph measured / predicted |\n|---|---|---|---|---|---|---|---|---|"
    )?;
    for (name, launches, (eager, graph), (p_eager, p_graph), _) in &timings {
        writeln!(
            report,
            "| {name} | {launches} | {eager:.1} | {graph:.1} | {:.2}x | {:.2} | {p_eager:.1} | {p_graph:.1} | {:.2} |",
            eager / graph.max(1e-9),
            (eager - graph) / (*launches).max(1) as f64,
            graph / p_graph.max(1e-9)
        )?;
    }
    writeln!(
        report,
        "\n## Each launch alone against the timing model's estimate, by kernel class (median of {KERNEL_RUNS} passes \
         after {KERNEL_WARMUP})\n"
    )?;
    writeln!(
        report,
        "Every launch of the plan enqueued by itself, between timing events on its stream, and waited for; the \
         estimate is `Kernel::estimate.time_us` (roofline over the SMs its grid reaches, no launch overhead).\n"
    )?;
    writeln!(
        report,
        "| workload | class | launches | measured us | estimated us | measured / estimated | worst launch (measured / estimated) |\n|---|---|---|---|---|---|---|"
    )?;
    for (name, _, _, _, classes) in &timings {
        for c in classes {
            writeln!(
                report,
                "| {name} | {} | {} | {:.1} | {:.1} | {:.2} | {} |",
                c.class,
                c.launches,
                c.measured_us,
                c.estimated_us,
                c.measured_us / c.estimated_us.max(1e-9),
                c.worst
            )?;
        }
    }
    print!("{}", &report[printed..]);
    printed = report.len();
    for s in &sets {
        failed |= set_rows(s, &graph_exec, args, &mut report)?;
        print!("{}", &report[printed..]);
        printed = report.len();
    }
    writeln!(
        report,
        "\nTotal {:.1} s; {}.",
        started.elapsed().as_secs_f64(),
        if failed { "FAILED" } else { "all passed" }
    )?;
    print!("{}", &report[printed..]);
    std::fs::write(args.bundle.join("launches.tsv"), launches.join("\n") + "\n")?;
    let path = args.bundle.join("report.md");
    std::fs::create_dir_all(&args.bundle)?;
    std::fs::write(&path, &report).with_context(|| format!("writing {}", path.display()))?;
    println!("report: {}", path.display());
    if failed {
        bail!("gpu-check failed (see the report)");
    }
    Ok(())
}

/// Runs `c` in both modes; true when the outputs are identical bytes.
fn both_modes(
    graph: &CudaExecutor,
    eager: &CudaExecutor,
    c: &ConformanceCase,
    opts: &PlanOptions,
) -> Result<bool, String> {
    let plan = ExecutionPlan::build_with(&c.graph, opts).map_err(|e| e.to_string())?;
    let run =
        |e: &CudaExecutor| e.prepare(&plan, &c.weights).and_then(|mut p| p.run(&c.inputs)).map_err(|e| e.to_string());
    Ok(run(graph)? == run(eager)?)
}

/// One workload's results.
struct ModelRow {
    kernels: usize,
    streams: usize,
    cublas: String,
    max_rel_err: f64,
    passed: bool,
    modes_equal: bool,
    prepare_s: f64,
    /// Seconds of simulation here, or None when the bundle's prepared reference outputs were used.
    sim_s: Option<f64>,
    notes: Vec<String>,
    /// Median eager and graph microseconds.
    timing: Option<(f64, f64)>,
    /// The timing model's makespan with eager and with graph launch overheads, microseconds.
    predicted: (f64, f64),
    /// Launches timed alone against their estimates, by class (empty when untimed).
    classes: Vec<ClassTiming>,
    /// One line per launch timed alone (`launch_lines`), for launches.tsv.
    launch_lines: Vec<String>,
}

/// The header of launches.tsv: every launch timed alone, beside its estimate and shape.
const LAUNCHES_HEADER: &str =
    "workload\tkernel\tfirst node\tclass\tthreads\tblock\tflops\tbytes\testimated us\tmeasured us";

/// launches.tsv's lines for one plan.
fn launch_lines(name: &str, plan: &ExecutionPlan, sources: &[KernelSource], measured: &[Option<f64>]) -> Vec<String> {
    plan.kernels()
        .iter()
        .zip(measured)
        .filter_map(|(k, m)| {
            let (m, src) = (m.as_ref()?, sources.get(k.id.index())?);
            let (threads, block) = match src.launch {
                Launch::Elements { threads, block } => (threads, block),
                Launch::Rows { rows, block } => (rows * u64::from(block), block),
                Launch::Fixed { grid, block, .. } => (
                    grid.iter().map(|&g| u64::from(g)).product::<u64>()
                        * block.iter().map(|&b| u64::from(b)).product::<u64>(),
                    block[0] * block[1] * block[2],
                ),
                Launch::None => (0, 0),
            };
            Some(format!(
                "{name}\t{}\t{}\t{}\t{threads}\t{block}\t{}\t{}\t{:.2}\t{m:.2}",
                k.name,
                k.node_names().next().unwrap_or("?"),
                kernel_class(k, src),
                k.cost.flops,
                k.cost.bytes_read + k.cost.bytes_written,
                k.estimate.time_us,
            ))
        })
        .collect()
}

/// Untimed passes before the per-launch timings.
const KERNEL_WARMUP: usize = 2;
/// Timed passes of the per-launch timings.
const KERNEL_RUNS: usize = 10;

/// Launches of one kernel class timed alone, summed over the plan.
struct ClassTiming {
    class: String,
    launches: usize,
    measured_us: f64,
    estimated_us: f64,
    /// The launch whose measured time is furthest from its estimate (as a ratio either way), described.
    worst: String,
}

/// The class of kernel `k` as the timing model prices it: its kind, anchors split by how they run.
fn kernel_class(k: &graph_plan::Kernel, source: &KernelSource) -> String {
    use graph_plan::GroupKind;
    match k.kind {
        GroupKind::Anchor if !source.blas.is_empty() => "GEMM (cuBLAS)".to_owned(),
        GroupKind::Anchor => {
            let ops: Vec<&str> = k.node_names().collect();
            let conv = ops.iter().any(|n| n.to_ascii_lowercase().contains("conv"));
            let pool = ops.iter().any(|n| n.to_ascii_lowercase().contains("pool"));
            match (conv, pool) {
                (true, _) => "anchor (generated conv)".to_owned(),
                (false, true) => "anchor (generated pool)".to_owned(),
                _ => "anchor (generated, other)".to_owned(),
            }
        }
        other => format!("{other:?}"),
    }
}

/// Per-class sums of `measured` (median microseconds per kernel) against the kernels' estimates.
fn class_timings(plan: &ExecutionPlan, sources: &[KernelSource], measured: &[Option<f64>]) -> Vec<ClassTiming> {
    let mut by: BTreeMap<String, (ClassTiming, f64)> = BTreeMap::new();
    for (k, m) in plan.kernels().iter().zip(measured) {
        let (Some(m), Some(src)) = (m, sources.get(k.id.index())) else { continue };
        let class = kernel_class(k, src);
        let est = k.estimate.time_us;
        let off = (m / est.max(1e-9)).max(est / m.max(1e-9));
        let e = by.entry(class.clone()).or_insert_with(|| {
            let t = ClassTiming { class, launches: 0, measured_us: 0.0, estimated_us: 0.0, worst: String::new() };
            (t, 0.0)
        });
        e.0.launches += 1;
        e.0.measured_us += m;
        e.0.estimated_us += est;
        if off > e.1 {
            e.1 = off;
            e.0.worst = format!("{} ({}): {m:.1} / {est:.1} us", k.name, k.node_names().next().unwrap_or("?"));
        }
    }
    by.into_values().map(|(t, _)| t).collect()
}

/// A workload's seeded inputs and weights (the same bytes on every machine) and its reference plan.
///
/// The tensors are seeded from the f32 reference plan, so a half plan runs on the same (f32) weights and inputs
/// as its f32 workload, converted by the executor, as a deployment would (`fill_tensors` scales only f32
/// weights, so seeding from the half plan would leave deep models unscaled and overflowing). The plan the
/// simulator runs for the expected outputs is the f32 reference plan for f32 workloads, and for a half plan the
/// plan itself: the simulator rounds on every store exactly where the CUDA kernels do, so the two differ only
/// in summation order.
fn workload_tensors(w: &Workload) -> Result<(TensorMap, TensorMap, ExecutionPlan)> {
    let mut reference_opts = PlanOptions::reference();
    reference_opts.fusion.caps = codegen::fusion_caps();
    let f32_reference = ExecutionPlan::build_with(&w.graph, &reference_opts)?;
    let (mut inputs, mut weights) = (TensorMap::new(), w.weights.clone());
    exec_sim::fill_tensors(&f32_reference, &mut inputs, &mut weights, 0);
    let reference = if is_half(w) { ExecutionPlan::build_with(&w.graph, &w.options)? } else { f32_reference };
    Ok((inputs, weights, reference))
}

fn is_half(w: &Workload) -> bool {
    w.options.precision.precision != Precision::Fp32
}

fn model_row(w: &Workload, graph_exec: &CudaExecutor, eager_exec: &CudaExecutor, args: &Args) -> Result<ModelRow> {
    let plan = ExecutionPlan::build_with(&w.graph, &w.options)?;
    let predict = |overhead| {
        let opts = exec_sim::TimingOptions { overhead, ..exec_sim::TimingOptions::for_plan(&plan) };
        exec_sim::simulate(&plan, &opts).map(|r| r.makespan_us)
    };
    let predicted = (predict(exec_sim::LaunchMode::Eager)?, predict(exec_sim::LaunchMode::Graph)?);
    let (inputs, weights, reference) = workload_tensors(w)?;
    let t = Instant::now();
    let stored = args.bundle.join("reference").join(format!("{}.bin", slug(&w.name)));
    let (want, sim_s) = match read_reference(&stored, fingerprint(&inputs, &weights)).filter(|_| !args.sim) {
        Some(want) => (want, None),
        None => {
            let want = exec_sim::run_plan(&SimExecutor::new(), &reference, &weights, &inputs)
                .map_err(|e| anyhow::anyhow!("sim: {e}"))?;
            (want, Some(t.elapsed().as_secs_f64()))
        }
    };
    let t = Instant::now();
    let mut g = graph_exec.prepare_cuda(&plan, &weights).map_err(cuda("prepare (graph)"))?;
    let prepare_s = t.elapsed().as_secs_f64();
    let got = g.run(&inputs).map_err(|e| anyhow::anyhow!("run (graph): {e}"))?;
    let mut e = eager_exec.prepare_cuda(&plan, &weights).map_err(cuda("prepare (eager)"))?;
    let got_eager = e.run(&inputs).map_err(|e| anyhow::anyhow!("run (eager): {e}"))?;
    let (mut max_rel_err, mut passed, mut notes) = (0.0f64, true, Vec::new());
    for (name, want_t) in &want {
        let Some(got_t) = got.get(name) else {
            passed = false;
            notes.push(format!("output '{name}' missing"));
            continue;
        };
        let c = exec_sim::compare(name, want_t, got_t, w.tolerance);
        max_rel_err = max_rel_err.max(c.max_rel_err);
        passed &= c.passed;
        if c.reference_non_finite > 0 {
            notes.push(format!("'{name}': {} non-finite reference elements", c.reference_non_finite));
        }
        if !c.passed {
            notes.push(format!("'{name}': {} elements differ, max abs err {:.3e}", c.differing, c.max_abs_err));
        }
    }
    if let Some(base) = w.name.split(' ').next().filter(|_| is_half(w)) {
        // The accuracy of the half plan on the device: its outputs against the f32 workload's reference.
        let path = args.bundle.join("reference").join(format!("{}.bin", slug(base)));
        match read_reference(&path, fingerprint(&inputs, &weights)) {
            Some(f32_want) => {
                let worst = f32_want
                    .iter()
                    .filter_map(|(name, t)| got.get(name).map(|g| exec_sim::compare(name, t, g, w.tolerance)))
                    .map(|c| c.max_rel_err)
                    .fold(0.0f64, f64::max);
                notes.push(format!("against the f32 reference plan: max rel err {worst:.2e}"));
            }
            None => notes.push(format!("no f32 reference of {base} with these tensors")),
        }
    }
    let info = g.info().clone();
    if let Some(why) = &info.cublas_fallback {
        notes.push(format!("cuBLAS not used: {why}"));
    }
    let timing = if w.timed { Some(time_modes(&mut e, &mut g, args.runs)?) } else { None };
    // A failure here costs only this table, not the row's checks and timings.
    let mut lines = Vec::new();
    let classes = match w.timed.then(|| e.time_kernels(KERNEL_WARMUP, KERNEL_RUNS)) {
        Some(Ok(measured)) => {
            lines = launch_lines(&w.name, &plan, e.sources(), &measured);
            class_timings(&plan, e.sources(), &measured)
        }
        Some(Err(err)) => {
            notes.push(format!("timing launches alone failed: {err}"));
            Vec::new()
        }
        None => Vec::new(),
    };
    Ok(ModelRow {
        kernels: plan.kernel_count_fused,
        streams: plan.num_streams,
        cublas: format!("{} / {}", info.cublas_products, info.cublas_calls),
        max_rel_err,
        passed,
        modes_equal: got == got_eager,
        prepare_s,
        sim_s,
        notes,
        timing,
        predicted,
        classes,
        launch_lines: lines,
    })
}

/// A set's runs: each member on its own bucket's inputs, and the padded request on the exact graph's.
struct SetRun {
    label: String,
    /// The member that serves it, and whether it is the padded request.
    member: usize,
    padded: bool,
    inputs: TensorMap,
    /// What the simulator runs for the expected outputs: the member's plan, or the exact graph's reference plan.
    reference: ExecutionPlan,
}

/// The set's shared weights (the file's, the rest seeded from the first member) and its runs.
fn set_tensors(s: &SetWorkload) -> Result<(TensorMap, Vec<SetRun>)> {
    let mut weights = s.weights.clone();
    let mut runs = Vec::new();
    for (i, m) in s.set.members().iter().enumerate() {
        let mut inputs = TensorMap::new();
        exec_sim::fill_tensors(&m.plan, &mut inputs, &mut weights, 0);
        runs.push(SetRun { label: dims_label(&m.dims), member: i, padded: false, inputs, reference: m.plan.clone() });
    }
    let mut reference_opts = PlanOptions::reference();
    reference_opts.fusion.caps = codegen::fusion_caps();
    let reference = ExecutionPlan::build_with(&s.exact, &reference_opts)?;
    let mut inputs = TensorMap::new();
    exec_sim::fill_tensors(&reference, &mut inputs, &mut weights.clone(), 0);
    let member = s
        .set
        .members()
        .iter()
        .position(|m| m.dims.iter().all(|(k, v)| s.request.get(k).is_none_or(|r| r <= v)))
        .context("no member serves the request")?;
    runs.push(SetRun {
        label: format!("{} (padded)", dims_label(&s.request)),
        member,
        padded: true,
        inputs,
        reference,
    });
    Ok((weights, runs))
}

/// Runs `s` through one prepared set on the GPU and appends its table; true when a check failed.
fn set_rows(s: &SetWorkload, exec: &CudaExecutor, args: &Args, report: &mut String) -> Result<bool> {
    let (weights, runs) = set_tensors(s)?;
    let t = Instant::now();
    let mut prepared =
        exec.prepare_set(&s.set, &weights).map_err(|e| anyhow::anyhow!("{}: prepare_set: {e}", s.name))?;
    let prepare_s = t.elapsed().as_secs_f64();
    let pool = s.set.region_bytes(graph_plan::Region::Pool);
    let largest = s.set.members().iter().map(|m| m.plan.region_bytes(graph_plan::Region::Pool)).max().unwrap_or(0);
    writeln!(
        report,
        "\n## Plan set {} (one prepared set: {:.1} s, pool {:.2} MiB, largest member's own pool {:.2} MiB)\n",
        s.name,
        prepare_s,
        pool as f64 / f64::from(1u32 << 20),
        largest as f64 / f64::from(1u32 << 20)
    )?;
    writeln!(report, "| run | member | kernels | max rel err | passed |\n|---|---|---|---|---|")?;
    let mut failed = false;
    for r in &runs {
        let path = args.bundle.join("reference").join(format!("{}.bin", slug(&format!("{} {}", s.name, r.label))));
        let want = match read_reference(&path, fingerprint(&r.inputs, &weights)).filter(|_| !args.sim) {
            Some(w) => w,
            None => exec_sim::run_plan(&SimExecutor::new(), &r.reference, &weights, &r.inputs)
                .map_err(|e| anyhow::anyhow!("{} {}: sim: {e}", s.name, r.label))?,
        };
        let got = if r.padded {
            prepared.run_request(&s.request, &r.inputs, false).map_err(|e| anyhow::anyhow!("{}: {e}", r.label))
        } else {
            prepared.run_member(r.member, &r.inputs).map_err(cuda("run_member"))
        };
        let (mut max_rel, mut passed) = (0.0f64, true);
        let mut notes = Vec::new();
        match got {
            Ok(got) => {
                for (name, want_t) in &want {
                    let Some(got_t) = got.get(name) else {
                        passed = false;
                        notes.push(format!("output '{name}' missing"));
                        continue;
                    };
                    let c = exec_sim::compare(name, want_t, got_t, TOLERANCE);
                    max_rel = max_rel.max(c.max_rel_err);
                    passed &= c.passed;
                }
            }
            Err(e) => {
                passed = false;
                notes.push(e.to_string());
            }
        }
        failed |= !passed;
        let member = &s.set.members()[r.member];
        writeln!(
            report,
            "| {} | {} | {} | {:.2e} | {}{} |",
            r.label,
            dims_label(&member.dims),
            member.plan.kernel_count_fused,
            max_rel,
            if passed { "yes" } else { "**NO**" },
            notes.iter().map(|n| format!("; {n}")).collect::<String>()
        )?;
    }
    Ok(failed)
}

fn cuda(what: &'static str) -> impl Fn(CudaError) -> anyhow::Error {
    move |e| anyhow::anyhow!("{what}: {e}")
}

/// Median eager and graph microseconds.
fn time_modes(eager: &mut CudaPrepared, graph: &mut CudaPrepared, runs: usize) -> Result<(f64, f64)> {
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let e = eager.time_runs(WARMUP, runs).map_err(cuda("timing eager runs"))?;
    let g = graph.time_runs(WARMUP, runs).map_err(cuda("timing graph replays"))?;
    Ok((median(e), median(g)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launches_are_classed_and_summed_against_their_estimates() {
        let g = synth::mlp(2, 32, 4).unwrap();
        let mut opts = PlanOptions::with_streams(1);
        opts.fusion.caps = codegen::fusion_caps();
        let plan = ExecutionPlan::build_with(&g, &opts).unwrap();
        let sources = codegen::generate_all_with(&plan, &CodegenOptions { cublas: true }).unwrap();
        // Every kernel measured at twice its estimate, but the first not measured at all.
        let measured: Vec<Option<f64>> =
            plan.kernels().iter().enumerate().map(|(i, k)| (i > 0).then_some(2.0 * k.estimate.time_us)).collect();
        let classes = class_timings(&plan, &sources, &measured);
        assert_eq!(classes.iter().map(|c| c.launches).sum::<usize>(), plan.kernels().len() - 1);
        assert!(classes.iter().any(|c| c.class == "GEMM (cuBLAS)"), "an MLP's products run on cuBLAS");
        for c in &classes {
            assert!((c.measured_us - 2.0 * c.estimated_us).abs() <= 1e-9 * c.measured_us.max(1.0), "{}", c.class);
            assert!(c.worst.contains(" / "), "{}: {}", c.class, c.worst);
        }
        let lines = launch_lines("mlp", &plan, &sources, &measured);
        assert_eq!(lines.len(), plan.kernels().len() - 1);
        let columns = LAUNCHES_HEADER.split('\t').count();
        assert!(lines.iter().all(|l| l.starts_with("mlp\t") && l.split('\t').count() == columns), "{lines:?}");
    }

    #[test]
    fn slugs_are_file_names() {
        assert_eq!(slug("chain1000 (fusion off)"), "chain1000-fusion-off");
        assert_eq!(slug("bert_base"), "bert-base");
    }

    #[test]
    fn references_round_trip_and_check_their_fingerprint() {
        let dir = std::env::temp_dir().join(format!("cuplan-gpu-check-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("r.bin");
        let mut outputs = TensorMap::new();
        outputs.insert("logits".into(), f32s(&[2, 3], &[1.0, -2.0, 3.5, 0.0, f32::NAN, 7.0]));
        outputs.insert("scalar".into(), f32s(&[], &[4.0]));
        let ints = HostTensor { dtype: DType::I64, shape: Shape::from(vec![1]), data: 9i64.to_le_bytes().to_vec() };
        outputs.insert("ids".into(), ints);
        write_reference(&path, 42, &outputs).unwrap();
        assert_eq!(read_reference(&path, 42), Some(outputs));
        assert_eq!(read_reference(&path, 43), None, "another fingerprint");
        std::fs::write(&path, b"garbage").unwrap();
        assert_eq!(read_reference(&path, 42), None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn fingerprints_see_names_shapes_and_bytes() {
        let mut a = TensorMap::new();
        a.insert("x".into(), f32s(&[4], &[1.0, 2.0, 3.0, 4.0]));
        let base = fingerprint(&a, &TensorMap::new());
        assert_eq!(base, fingerprint(&a, &TensorMap::new()));
        let mut b = a.clone();
        b.get_mut("x").unwrap().data[15] ^= 1;
        assert_ne!(base, fingerprint(&b, &TensorMap::new()), "last bytes");
        let mut c = a.clone();
        c.get_mut("x").unwrap().shape = Shape::from(vec![2, 2]);
        assert_ne!(base, fingerprint(&c, &TensorMap::new()), "shape");
    }

    #[test]
    fn own_cases_build_and_generate() {
        let cases = cuda_cases().unwrap();
        assert_eq!(cases.len(), 2);
        for (tag, opts) in case_options() {
            for c in &cases {
                let plan = ExecutionPlan::build_with(&c.graph, &opts).unwrap();
                graph_plan::verify(&plan).unwrap();
                codegen::generate_all(&plan).unwrap_or_else(|e| panic!("{tag} {}: {e}", c.name));
            }
        }
    }

    #[test]
    fn options_parse() {
        let a =
            parse(&["--prepare".into(), "--arch".into(), "sm_90,sm_80".into(), "--runs".into(), "7".into()]).unwrap();
        assert!(a.prepare && !a.allow_skip);
        assert_eq!(a.archs, ["sm_90", "sm_80"]);
        assert_eq!(a.runs, 7);
        assert!(parse(&["--bogus".into()]).is_err());
        assert!(parse(&["--runs".into()]).is_err());
    }
}
