//! The four ONNX models of the repository (`models/`, or `$CUPLAN_MODELS_DIR`): every kernel of
//! their plans (f32, fp16, bf16) under this backend's fusion caps generates, with cuBLAS anchors and with
//! generated products, and compiles with NVRTC. Prints why and passes when the models or NVRTC are absent. Running the models on a GPU is
//! `cargo xtask gpu-check`'s job.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;

use exec_cuda::codegen::{self, CodegenOptions, Launch};
use exec_cuda::{CompileCache, CompileOptions};
use graph_plan::{ExecutionPlan, Op, PlanOptions};

const MODELS: [&str; 4] = ["resnet50", "mobilenet_v2", "googlenet", "bert_base"];

fn models_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("CUPLAN_MODELS_DIR")
        .map_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../models")), PathBuf::from);
    if dir.join("resnet50.onnx").is_file() {
        Some(dir)
    } else {
        eprintln!("SKIP: ONNX models not found in {} (set CUPLAN_MODELS_DIR)", dir.display());
        None
    }
}

#[test]
fn shared_model_kernels_generate_and_compile() {
    use graph_plan::precision::{Precision, PrecisionPolicy};
    let test = "shared_model_kernels_generate_and_compile";
    let Some(dir) = models_dir() else { return };
    let mut sources = Vec::new();
    for m in MODELS {
        let model = graph_onnx::import_file(dir.join(format!("{m}.onnx")), &graph_onnx::ImportOptions::default())
            .unwrap_or_else(|e| panic!("{m}: {e}"));
        // f32, and the half plans whose MatMul/Gemm run on cuBLAS GemmEx (f16/bf16 operands, f32 compute).
        for precision in [None, Some(Precision::Fp16), Some(Precision::Bf16)] {
            let mut opts = PlanOptions::with_streams(4);
            opts.fusion.caps = codegen::fusion_caps();
            if let Some(p) = precision {
                opts.precision = PrecisionPolicy::new(p);
            }
            let plan = ExecutionPlan::build_with(&model.graph, &opts).unwrap_or_else(|e| panic!("{m}: {e}"));
            for cublas in [true, false] {
                let s = codegen::generate_all_with(&plan, &CodegenOptions { cublas })
                    .unwrap_or_else(|e| panic!("{m} {precision:?} (cublas {cublas}): {e}"));
                assert_eq!(s.len(), plan.kernels().len());
                if cublas {
                    // Fused attention kernels also start with a MatMul: they are generated, not cuBLAS anchors.
                    let attention =
                        plan.kernels().iter().filter(|k| k.kind == graph_plan::GroupKind::Attention).count();
                    let products = plan
                        .kernels()
                        .iter()
                        .filter(|k| k.kind != graph_plan::GroupKind::Attention)
                        .filter(|k| k.body.first().is_some_and(|i| matches!(i.op, Op::MatMul | Op::Gemm { .. })))
                        .count();
                    let half = s
                        .iter()
                        .flat_map(|k| &k.blas)
                        .filter(|b| b.matmul.types.ab != exec_cuda::GemmType::F32)
                        .count();
                    // cuBLAS calls: each product's calls, and what the executor enqueues (calls of one shape
                    // in one kernel merged into one pointer-array call).
                    let step_calls: usize = s.iter().flat_map(|k| &k.blas).map(codegen::BlasStep::call_count).sum();
                    let calls: usize = s.iter().map(|k| codegen::gemm_launches(&k.blas).len()).sum();
                    assert!(calls <= step_calls, "{m}: {calls} > {step_calls}");
                    let launched = s.iter().filter(|k| k.launch != Launch::None).count();
                    eprintln!(
                        "{m} {precision:?}: {} kernels, {} on cuBLAS ({half} with half operands) of {products} \
                         MatMul/Gemm anchors, {attention} fused attention, {launched} launched; cuBLAS calls \
                         {calls} ({step_calls} unmerged); GPU operations {}",
                        s.len(),
                        s.iter().filter(|k| !k.blas.is_empty()).count(),
                        launched + calls
                    );
                }
                sources.extend(s);
            }
        }
    }
    if !common::nvrtc_or_skip(test) {
        return;
    }
    let started = std::time::Instant::now();
    let n = common::compile_distinct(test, &sources, &CompileCache::from_env(), &CompileOptions::default());
    eprintln!("{test}: {n} distinct kernels compiled in {:?}", started.elapsed());
}
