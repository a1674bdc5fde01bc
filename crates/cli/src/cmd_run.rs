//! `cuplan run GRAPH`: compile a graph and run the plan on a backend (the simulator or CUDA), optionally
//! checking it against the reference plan and writing a timeline trace.

use anyhow::{bail, Context, Result};
use exec_sim::{CheckOptions, Schedule, SimExecutor, SimOptions, TimingOptions};
use graph_plan::{verify, BindingRole, ExecutionPlan, Executor, HostTensor, PlanOptions, PreparedPlan, TensorMap};
use std::path::PathBuf;

use crate::cmd_plan::PlanFlags;
use crate::load::{load, GraphArgs};
use crate::tensors_io;
use graph_passes::precision::Precision;

/// Which backend runs the plan.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// exec-sim, the CPU simulator (always available).
    Sim,
    /// exec-cuda, a real NVIDIA GPU.
    Cuda,
}

/// Execution order of the simulator.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScheduleArg {
    /// Steps in submission order.
    Submission,
    /// A seeded adversarial order consistent with stream order and events.
    Random,
}

/// Arguments of `run`.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    graph: GraphArgs,
    #[command(flatten)]
    flags: PlanFlags,
    /// Backend.
    #[arg(long, value_enum, default_value_t = Backend::Sim)]
    backend: Backend,
    /// Graph inputs (and optionally weights) by name, as safetensors; missing ones get seeded values.
    #[arg(long, value_name = "IN.safetensors")]
    inputs: Option<PathBuf>,
    /// Weights by name, as safetensors (ONNX initializers with data are used otherwise; the rest are seeded).
    #[arg(long, value_name = "W.safetensors")]
    weights: Option<PathBuf>,
    /// Write every graph output, by name, as safetensors.
    #[arg(long, value_name = "OUT.safetensors")]
    output: Option<PathBuf>,
    /// Simulator schedule.
    #[arg(long, value_enum, default_value_t = ScheduleArg::Submission)]
    schedule: ScheduleArg,
    /// Seed of the random schedule and of the values of missing inputs and weights.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Also run the reference plan (no fusion, no reuse, one stream) and compare every output; exit 1 on a
    /// mismatch.
    #[arg(long)]
    check: bool,
    /// Relative tolerance of `--check` for floating-point outputs (relative to each output's magnitude); default
    /// 1e-5, or 1e-2 with `--precision fp16` and 5e-2 with bf16.
    #[arg(long)]
    tolerance: Option<f64>,
    /// With `--check` and `--precision fp16|bf16`: how many seeded inputs to compare (seeds SEED, SEED+1, ...).
    #[arg(long, default_value_t = 4, value_name = "N")]
    check_inputs: usize,
    /// Turn the simulator's race detector off.
    #[arg(long)]
    no_race_check: bool,
    /// Write the modelled timeline as Chrome trace JSON (opens in Perfetto).
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    #[command(flatten)]
    set: cuplan::set::SetFlags,
    /// With --buckets: run a request above the largest bucket in chunks of it (along a symbol that is safe to
    /// pad, whose axis every input and output carries alone).
    #[arg(long)]
    chunk: bool,
}

fn schedule(a: &RunArgs) -> Schedule {
    match a.schedule {
        ScheduleArg::Submission => Schedule::Submission,
        ScheduleArg::Random => Schedule::Random { seed: a.seed },
    }
}

/// Split a user's tensor file into inputs and weights by the plan's bindings; unknown names are errors.
fn split_supplied(
    plan: &ExecutionPlan,
    supplied: TensorMap,
    inputs: &mut TensorMap,
    weights: &mut TensorMap,
) -> Result<()> {
    for (name, t) in supplied {
        match plan.bindings().iter().find(|b| *b.name == *name).map(|b| b.role) {
            Some(BindingRole::Input) => {
                inputs.insert(name, t);
            }
            Some(BindingRole::Weight) => {
                weights.insert(name, t);
            }
            Some(BindingRole::Constant) => bail!("'{name}' is a constant of the graph and cannot be supplied"),
            Some(BindingRole::Output) => bail!("'{name}' is a graph output, not an input"),
            None => bail!("'{name}' is not an input or weight of the graph"),
        }
    }
    Ok(())
}

fn summarise(name: &str, t: &HostTensor) -> String {
    let v = t.to_f64();
    let (mut lo, mut hi, mut sum) = (f64::INFINITY, f64::NEG_INFINITY, 0f64);
    for &x in &v {
        lo = lo.min(x);
        hi = hi.max(x);
        sum += x;
    }
    let mean = if v.is_empty() { 0.0 } else { sum / v.len() as f64 };
    let head: Vec<String> = v.iter().take(4).map(|x| format!("{x:.6}")).collect();
    format!(
        "{name} {} {}: min {lo:.6} max {hi:.6} mean {mean:.6} [{}{}]",
        t.dtype,
        t.shape,
        head.join(", "),
        if v.len() > 4 { ", ..." } else { "" }
    )
}

/// Run `run`.
pub fn run(a: &RunArgs) -> Result<()> {
    if a.set.active() {
        return run_set(a);
    }
    if a.chunk {
        bail!("--chunk needs --buckets");
    }
    let loaded = load(&a.graph)?;
    let mut opts: PlanOptions = a.flags.options()?;
    if a.backend == Backend::Cuda {
        opts.fusion.caps = exec_cuda::codegen::fusion_caps();
    }
    let plan = ExecutionPlan::build_with(&loaded.graph, &opts)?;
    if let Err(v) = verify(&plan) {
        bail!("internal error: the plan fails verification ({} violations; first: {}) — this is a bug", v.len(), v[0]);
    }
    let mut inputs = TensorMap::new();
    let mut weights = loaded.weights;
    if let Some(p) = &a.inputs {
        split_supplied(&plan, tensors_io::read(p)?, &mut inputs, &mut weights)
            .with_context(|| format!("'{}'", p.display()))?;
    }
    if let Some(p) = &a.weights {
        split_supplied(&plan, tensors_io::read(p)?, &mut inputs, &mut weights)
            .with_context(|| format!("'{}'", p.display()))?;
    }
    // A half-precision plan's tensors are filled as the f32 graph declares them (weights are converted at
    // prepare, inputs by `inputs_for`), so that `--check` compares both plans on the same values.
    let f32_plan = if opts.precision.is_identity() {
        None
    } else {
        Some(ExecutionPlan::build_with(&loaded.graph, &PlanOptions::reference())?)
    };
    exec_sim::fill_tensors(f32_plan.as_ref().unwrap_or(&plan), &mut inputs, &mut weights, a.seed);
    let plan_inputs = exec_sim::inputs_for(&plan, &inputs);

    let outputs = match a.backend {
        Backend::Sim => {
            let exec = SimExecutor::with_options(SimOptions {
                schedule: schedule(a),
                race_check: !a.no_race_check,
                poison: true,
            });
            let mut prepared = exec.prepare_sim(&plan, &weights)?;
            prepared.run_sim(&plan_inputs)?
        }
        Backend::Cuda => {
            let exec = exec_cuda::CudaExecutor::new(0);
            exec.availability()?;
            let mut prepared = exec.prepare(&plan, &weights)?;
            prepared.run(&plan_inputs)?
        }
    };
    println!(
        "ran '{}' on {}: {} launches on {} stream(s), pool {} B",
        plan.graph_name(),
        match a.backend {
            Backend::Sim => "sim",
            Backend::Cuda => "cuda",
        },
        plan.kernel_count_fused,
        plan.num_streams,
        plan.pool_bytes
    );
    for (name, t) in &outputs {
        println!("  {}", summarise(name, t));
    }
    if let Some(p) = &a.output {
        tensors_io::write(p, &outputs)?;
    }
    if let Some(p) = &a.trace {
        let timing = exec_sim::simulate(&plan, &TimingOptions::for_plan(&plan))?;
        std::fs::write(p, exec_sim::chrome_trace_json(&plan, &timing))
            .with_context(|| format!("writing '{}'", p.display()))?;
        println!(
            "  timeline: makespan {:.1} us, bound {:.1} us ({:.3}x) -> {}",
            timing.makespan_us,
            timing.bound_us,
            if timing.bound_us > 0.0 { timing.makespan_us / timing.bound_us } else { 1.0 },
            p.display()
        );
    }
    let half_tolerance = match opts.precision.precision {
        Precision::Fp16 => 1e-2,
        Precision::Bf16 => 5e-2,
        Precision::Fp32 => 1e-5,
    };
    let tolerance = a.tolerance.unwrap_or(half_tolerance);
    if a.check && !opts.precision.is_identity() {
        if a.backend == Backend::Cuda {
            bail!(
                "--check with --precision {} compares simulated plans; run it with --backend sim",
                opts.precision.precision
            );
        }
        let c = exec_sim::check_precision(&loaded.graph, &opts, &inputs, &weights, a.check_inputs, a.seed, tolerance)?;
        print_precision_check(&c, opts.precision.precision);
        if !c.passed {
            bail!(
                "--check: the {} plan is not within {:e} of the f32 reference plan",
                opts.precision.precision,
                tolerance
            );
        }
        return Ok(());
    }
    if a.check {
        let reference = ExecutionPlan::build_with(&loaded.graph, &PlanOptions::reference())?;
        let copts = CheckOptions { schedule: schedule(a), race_check: !a.no_race_check, tolerance, seed: a.seed };
        let report = match a.backend {
            Backend::Sim => exec_sim::check_plans(&reference, &plan, &inputs, &weights, &copts)?,
            Backend::Cuda => {
                // The GPU's outputs against the simulated reference plan.
                let exec = SimExecutor::with_options(SimOptions::default());
                let want = exec_sim::run_plan(&exec, &reference, &weights, &inputs)?;
                let outs: Vec<_> = want
                    .iter()
                    .filter_map(|(n, w)| outputs.get(n).map(|g| exec_sim::compare(n, w, g, tolerance)))
                    .collect();
                exec_sim::CheckReport {
                    passed: outs.len() == want.len() && outs.iter().all(|o| o.passed),
                    outputs: outs,
                    tolerance,
                    reference_launches: reference.kernel_count_fused,
                    optimised_launches: plan.kernel_count_fused,
                    optimised_streams: plan.num_streams,
                }
            }
        };
        println!("check against the reference plan (tolerance {:e} relative):", report.tolerance);
        report.outputs.iter().for_each(print_comparison);
        if !report.passed {
            bail!("--check: the optimised plan's outputs differ from the reference plan's");
        }
    }
    Ok(())
}

/// `run --buckets ... --dim batch=3`: prepare the set once, run the request (padded into the smallest covering
/// bucket, or chunked with `--chunk`), and with `--check` compare its outputs with the exact plan of the
/// request's size.
fn run_set(a: &RunArgs) -> Result<()> {
    if a.trace.is_some() {
        bail!("--trace takes one plan; use --dim without --buckets");
    }
    let opts = a.flags.options()?;
    let mut b = cuplan::set::build(&a.graph, &a.set, &opts, true)?;
    let dims = cuplan::set::request(&a.graph, &b.set)?;
    // The exact graph of the request: its inputs' shapes, seeded values, and the reference for --check.
    let exact_graph = cuplan::set::exact_graph(&b, &dims)?;
    let exact = ExecutionPlan::build_with(&exact_graph, &opts)?;
    if let Err(v) = verify(&exact) {
        bail!(
            "internal error: the exact plan fails verification ({} violations; first: {}) — this is a bug",
            v.len(),
            v[0]
        );
    }
    let mut inputs = TensorMap::new();
    let mut weights = std::mem::take(&mut b.weights);
    for p in [&a.inputs, &a.weights].into_iter().flatten() {
        split_supplied(&exact, tensors_io::read(p)?, &mut inputs, &mut weights)
            .with_context(|| format!("'{}'", p.display()))?;
    }
    exec_sim::fill_tensors(&exact, &mut inputs, &mut weights, a.seed);
    let sim = SimOptions { schedule: schedule(a), race_check: !a.no_race_check, poison: true };
    let exec = SimExecutor::with_options(sim);
    let pieces = b.set.pieces(&dims, a.chunk)?;
    let outputs = match a.backend {
        Backend::Sim => exec.prepare_set(&b.set, &weights)?.run_request(&dims, &inputs, a.chunk)?,
        Backend::Cuda => {
            let cuda = exec_cuda::CudaExecutor::new(0);
            cuda.availability()?;
            cuda.prepare_set(&b.set, &weights)?.run_request(&dims, &inputs, a.chunk)?
        }
    };
    let ran: Vec<String> =
        pieces.iter().map(|p| graph_plan::set::dims_label(&b.set.members()[p.member].dims)).collect();
    println!(
        "ran '{}' at {} on {}: {} piece(s) on bucket(s) {} of {}; set pool {} B",
        exact.graph_name(),
        graph_plan::set::dims_label(&dims),
        if a.backend == Backend::Sim { "sim" } else { "cuda" },
        pieces.len(),
        ran.join(" + "),
        b.set.members().len(),
        b.set.pool_bytes()
    );
    for (name, t) in &outputs {
        println!("  {}", summarise(name, t));
    }
    if let Some(p) = &a.output {
        tensors_io::write(p, &outputs)?;
    }
    if a.check {
        // The exact plan has the set's options (precision included): the padded run should equal it bit for bit.
        let tolerance = a.tolerance.unwrap_or(1e-5);
        let want = exec_sim::run_plan(&exec, &exact, &weights, &inputs)?;
        println!(
            "check against the exact plan at {} (tolerance {:e} relative):",
            graph_plan::set::dims_label(&dims),
            tolerance
        );
        let mut passed = want.len() == outputs.len();
        for (n, w) in &want {
            let Some(g) = outputs.get(n) else {
                println!("  FAIL {n}: missing from the set's outputs");
                passed = false;
                continue;
            };
            let o = exec_sim::compare(n, w, g, tolerance);
            passed &= o.passed;
            print_comparison(&o);
        }
        if !passed {
            bail!("--check: the set's padded outputs differ from the exact plan's");
        }
    }
    Ok(())
}

/// One `--check` line: an output's errors against its reference, and whether it is bitwise equal.
fn print_comparison(o: &exec_sim::OutputComparison) {
    println!(
        "  {} {}: max abs err {:.3e}, max rel err {:.3e}{}",
        if o.passed { "ok  " } else { "FAIL" },
        o.name,
        o.max_abs_err,
        o.max_rel_err,
        if o.bitwise_equal { " (bitwise equal)" } else { "" }
    );
}

/// The `--check` lines of a half-precision run.
fn print_precision_check(c: &exec_sim::PrecisionCheck, p: Precision) {
    println!(
        "check {p} against the f32 reference plan over {} seeded input(s) (tolerance {:e} relative to each output's max magnitude):",
        c.seeds, c.tolerance
    );
    for o in &c.outputs {
        let ok = o.max_rel_err <= c.tolerance && o.non_finite == 0;
        let ties = match o.top1_near_ties {
            0 => String::new(),
            k => format!(" ({k} other(s) a near tie: the two picks' reference scores within one {p} rounding step)"),
        };
        let top1 = o.top1.map_or(String::new(), |(agree, rows)| format!(", top-1 agreement {agree}/{rows}{ties}"));
        let nf = if o.non_finite > 0 { format!(", {} non-finite", o.non_finite) } else { String::new() };
        println!(
            "  {} {}: max abs err {:.3e}, max rel err {:.3e}{top1}{nf}",
            if ok { "ok  " } else { "FAIL" },
            o.name,
            o.max_abs_err,
            o.max_rel_err
        );
    }
    match &c.overflow {
        None => println!("  overflow: none (no inf/NaN in any tensor of the {p} reference plan)"),
        Some((node, tensor)) => println!("  overflow: node '{node}' is the first to write inf/NaN (tensor '{tensor}')"),
    }
}
