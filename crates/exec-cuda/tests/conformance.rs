//! graph-plan's conformance suite (every built-in op, hand-computed outputs) through this backend's generated
//! kernels, under two plans per case: the optimised plan with this backend's fusion caps (two streams, reuse) and
//! the reference plan (no fusion, no reuse, one stream).
//!
//! - Without a GPU: every kernel compiles with NVRTC (printed skip without NVRTC), and every case runs through the
//!   host emulator (`common::host`: the generated CUDA C compiled as C++ for the CPU; printed skip without a host
//!   C++ compiler).
//! - With a GPU: every case runs through `CudaExecutor` in graph and in eager mode, within 1e-3 relative (f32
//!   with reductions, cuBLAS), and the two modes agree bit for bit (printed skip without a driver).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;

use common::host::{compiler, HostEmu, HostProgram};
use exec_cuda::codegen::{self, CodegenOptions, KernelSource, Launch};
use exec_cuda::{CompileCache, CompileOptions, CudaExecutor, CudaOptions, SubmitMode};
use graph_plan::conformance::{self, ConformanceCase};
use graph_plan::{ExecutionPlan, Executor, PlanOptions, PreparedPlan};

/// The GPU's floor: f32 sums in another order (block reductions, cuBLAS) and CUDA's own transcendentals.
const GPU_TOLERANCE: f64 = 1e-3;
/// The host emulator runs the same C code on the CPU: only reduction order and libm differ from the cases'.
const HOST_TOLERANCE: f64 = 1e-6;

fn option_sets() -> [(&'static str, PlanOptions); 2] {
    let mut optimised = PlanOptions::with_streams(2);
    optimised.fusion.caps = codegen::fusion_caps();
    let mut reference = PlanOptions::reference();
    reference.fusion.caps = codegen::fusion_caps();
    [("optimised", optimised), ("reference", reference)]
}

/// Every generated source of every case under every option set, with and without cuBLAS anchors; panics listing
/// every case the code generator refuses.
fn all_sources(cases: &[ConformanceCase]) -> Vec<KernelSource> {
    let mut out = Vec::new();
    let mut refused = Vec::new();
    for (tag, opts) in option_sets() {
        for c in cases {
            let plan = ExecutionPlan::build_with(&c.graph, &opts).unwrap_or_else(|e| panic!("{}: {e}", c.name));
            for cublas in [true, false] {
                match codegen::generate_all_with(&plan, &CodegenOptions { cublas }) {
                    Ok(sources) => out.extend(sources),
                    Err(e) => refused.push((format!("{tag} {} (cublas {cublas})", c.name), e.to_string())),
                }
            }
        }
    }
    report(&refused);
    out
}

fn report(failures: &[(String, String)]) {
    assert!(
        failures.is_empty(),
        "{} conformance failure(s):\n{}",
        failures.len(),
        failures.iter().map(|(n, f)| format!("  {n}: {f}")).collect::<Vec<_>>().join("\n")
    );
}

#[test]
fn every_conformance_kernel_compiles_with_nvrtc() {
    let test = "every_conformance_kernel_compiles_with_nvrtc";
    let cases = conformance::cases().unwrap();
    let sources = all_sources(&cases);
    if !common::nvrtc_or_skip(test) {
        return;
    }
    let started = std::time::Instant::now();
    let cache = CompileCache::from_env();
    let n = common::compile_distinct(test, &sources, &cache, &CompileOptions::default());
    eprintln!("{test}: {n} distinct kernels of {} cases compiled in {:?}", cases.len(), started.elapsed());
}

#[test]
fn conformance_on_the_host_emulator() {
    let test = "conformance_on_the_host_emulator";
    let Some(cxx) = compiler() else {
        eprintln!("SKIP {test}: no host C++ compiler (c++, g++ or clang++) to emulate kernels");
        return;
    };
    let cases = conformance::cases().unwrap();
    let started = std::time::Instant::now();
    // cuBLAS steps run as a host product in the emulator: the cuBLAS variant of each plan is what it runs.
    let sources: Vec<KernelSource> = all_sources(&cases);
    let program = Arc::new(HostProgram::build(cxx, "conformance", &sources));
    let built = started.elapsed();
    let emu = HostEmu { program };
    let mut failures = Vec::new();
    for (tag, opts) in option_sets() {
        for (name, f) in conformance::run_all(&emu, &cases, &opts, HOST_TOLERANCE) {
            failures.push((format!("{tag} {name}"), f.to_string()));
        }
    }
    eprintln!(
        "{test}: {} cases x 2 plans; one host program of {} kernels built in {built:?}, all run in {:?}",
        cases.len(),
        emu.program.len(),
        started.elapsed()
    );
    report(&failures);
}

#[test]
fn conformance_on_the_gpu_in_both_modes() {
    let test = "conformance_on_the_gpu_in_both_modes";
    // Holding the device open keeps its primary context alive across the many prepares.
    let Some(_device) = common::device_or_skip(test) else {
        return;
    };
    let cases = conformance::cases().unwrap();
    let graph = CudaExecutor::with_options(CudaOptions { mode: SubmitMode::Graph, ..CudaOptions::new(0) });
    let eager = CudaExecutor::with_options(CudaOptions { mode: SubmitMode::Eager, ..CudaOptions::new(0) });
    if let Err(u) = graph.availability() {
        eprintln!("SKIP {test}: {u}");
        return;
    }
    let mut failures = Vec::new();
    for (tag, opts) in option_sets() {
        for (exec, mode) in [(&graph, "graph"), (&eager, "eager")] {
            for (name, f) in conformance::run_all(exec, &cases, &opts, GPU_TOLERANCE) {
                failures.push((format!("{tag} {mode} {name}"), f.to_string()));
            }
        }
        // Both modes enqueue the same calls: the same bytes come out.
        for c in &cases {
            let Ok(plan) = ExecutionPlan::build_with(&c.graph, &opts) else { continue };
            let run = |e: &CudaExecutor| e.prepare(&plan, &c.weights).and_then(|mut p| p.run(&c.inputs));
            match (run(&graph), run(&eager)) {
                (Ok(a), Ok(b)) if a != b => {
                    failures.push((format!("{tag} {}", c.name), "graph and eager outputs differ".to_owned()));
                }
                _ => {}
            }
        }
    }
    report(&failures);
}

#[test]
fn the_suite_covers_integer_reductions_and_pools() {
    // The cases this backend once refused: they now generate (the host-emulator run checks their numbers).
    let cases = conformance::cases().unwrap();
    let names: BTreeSet<&str> = cases.iter().map(|c| c.name.as_str()).collect();
    for want in ["reduce_sum/i64", "maxpool/i64", "matmul/i64", "gather/axis0_negative_index"] {
        assert!(names.contains(want), "the suite lost {want}");
    }
    for c in cases.iter().filter(|c| ["reduce_sum/i64", "maxpool/i64"].contains(&c.name.as_str())) {
        let (_, opts) = &option_sets()[0];
        let plan = ExecutionPlan::build_with(&c.graph, opts).unwrap();
        let sources = codegen::generate_all(&plan).unwrap();
        assert!(sources.iter().any(|s| s.launch != Launch::None && s.source.contains("long long")), "{}", c.name);
    }
}
