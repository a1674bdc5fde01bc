//! The code generator: golden sources for a few small plans (rewritten only with `CUPLAN_BLESS=1`), and every
//! kernel of the synthetic model families and of an op-coverage graph compiles with NVRTC (skipped, with the
//! reason printed, where NVRTC is not installed).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;

use exec_cuda::codegen::{self, KernelSource, Launch, ENTRY};
use exec_cuda::{CompileCache, CompileOptions, CudaError};
use graph_plan::ir::op::{ConvAttrs, GeluApprox, PadMode, PoolAttrs};
use graph_plan::ir::{synth, ComputeGraph};
use graph_plan::{DType, ExecutionPlan, Op, PlanOptions};

fn plan(g: &ComputeGraph, streams: usize) -> ExecutionPlan {
    let mut opts = PlanOptions::with_streams(streams);
    opts.fusion.caps = codegen::fusion_caps();
    ExecutionPlan::build_with(g, &opts).unwrap()
}

fn golden(name: &str, sources: &[KernelSource]) {
    let mut text = String::new();
    for s in sources {
        text.push_str(&format!(
            "// ==== {} launch={:?} blas={:?}{}\n",
            s.name,
            s.launch,
            s.blas.first().map(|b| b.matmul),
            s.blas.first().and_then(|b| b.lt).map_or(String::new(), |lt| format!(" lt={lt:?}"))
        ));
        text.push_str(&s.source);
    }
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(format!("{name}.cu"));
    if std::env::var("CUPLAN_BLESS").is_ok_and(|v| v == "1") {
        std::fs::write(&path, &text).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run with CUPLAN_BLESS=1 to create it)", path.display()));
    assert!(want == text, "generated code for {name} changed; review and rerun with CUPLAN_BLESS=1\n{text}");
}

/// Compiles every generated source of `plan` through `cache`; returns how many kernels had a source.
fn compile_all(test: &str, plan: &ExecutionPlan, cache: &CompileCache) -> usize {
    let sources = codegen::generate_all(plan).unwrap_or_else(|e| panic!("{test}: {e}"));
    assert_eq!(sources.len(), plan.kernels().len());
    if !common::nvrtc_or_skip(test) {
        return 0;
    }
    let mut n = 0;
    for s in &sources {
        if s.launch == Launch::None {
            continue;
        }
        let ptx = match cache.compile(&s.name, &s.source, &CompileOptions::default()) {
            Ok(p) => p,
            Err(CudaError::Compile { log, .. }) => {
                panic!("{test}: kernel {} does not compile:\n{log}\n{}", s.name, s.source)
            }
            Err(e) => panic!("{test}: {e}"),
        };
        assert!(ptx.entries().contains(&s.entry.as_str()), "{test}: {} lacks entry {}", s.name, s.entry);
        n += 1;
    }
    n
}

#[test]
fn golden_elementwise_chain() {
    let g = synth::chain_with_width(3, 8).unwrap();
    let p = plan(&g, 1);
    let src = codegen::generate_all(&p).unwrap();
    assert_eq!(src.len(), 1, "the chain fuses into one kernel");
    assert_eq!(src[0].launch, Launch::Elements { threads: 8, block: 256 });
    assert_eq!(src[0].entry, ENTRY);
    golden("chain3", &src);
}

#[test]
fn golden_broadcast_and_softmax() {
    let mut g = ComputeGraph::new("bcast");
    let x = g.add_input("x", DType::F32, [2, 3]).unwrap();
    let b = g.add_weight("b", DType::F32, [3]).unwrap();
    let s = g.add_node("add", Op::Add, &[x, b]).unwrap()[0];
    let r = g.add_node("relu", Op::Relu, &[s]).unwrap()[0];
    let y = g.add_node("softmax", Op::Softmax { axis: -1 }, &[r]).unwrap()[0];
    g.mark_output(y).unwrap();
    // The plain row kernel: without reduction fusion the Softmax stays alone (the fused row kernels' numbers are
    // checked on the host emulator, whatever the fusion pass groups).
    let mut opts = PlanOptions::with_streams(1);
    opts.fusion.caps = codegen::fusion_caps();
    opts.fusion.caps.reduction_fusion = false;
    let p = ExecutionPlan::build_with(&g, &opts).unwrap();
    let src = codegen::generate_all(&p).unwrap();
    assert_eq!(
        src.iter().map(|s| s.launch).collect::<Vec<_>>(),
        [Launch::Elements { threads: 6, block: 256 }, Launch::Rows { rows: 2, block: 256 }]
    );
    golden("bcast_softmax", &src);
}

/// Reduction fusion (this backend's caps): Softmax spelt out (ReduceMax, Sub, Exp, ReduceSum, Div) on a broadcast
/// add, with a Relu after it, is one row kernel (`reduce::fused`): the add is computed inline in each pass over the
/// row, the per-row max and sum once per block, and the Relu in the last pass that writes the row.
#[test]
fn golden_fused_row_kernel() {
    let mut g = ComputeGraph::new("decomposed_softmax");
    let x = g.add_input("x", DType::F32, [2, 3]).unwrap();
    let b = g.add_weight("b", DType::F32, [3]).unwrap();
    let mut node = |name: &str, op: Op, ins: &[graph_plan::ir::TensorId]| g.add_node(name, op, ins).unwrap()[0];
    let s = node("add", Op::Add, &[x, b]);
    let mx = node("max", Op::ReduceMax { axes: Some(vec![-1]), keepdims: true }, &[s]);
    let d = node("sub", Op::Sub, &[s, mx]);
    let e = node("exp", Op::Exp, &[d]);
    let sm = node("sum", Op::ReduceSum { axes: Some(vec![-1]), keepdims: true }, &[e]);
    let p = node("div", Op::Div, &[e, sm]);
    let y = node("relu", Op::Relu, &[p]);
    g.mark_output(y).unwrap();
    let p = plan(&g, 1);
    graph_plan::verify(&p).unwrap();
    let src = codegen::generate_all(&p).unwrap();
    assert_eq!(src.iter().map(|s| s.launch).collect::<Vec<_>>(), [Launch::Rows { rows: 2, block: 256 }]);
    golden("fused_softmax", &src);
}

/// An f32 MLP layer (MatMul + bias) is one cuBLASLt call with a bias epilogue: no kernel launches after it.
/// Layers with a Relu take `RELU_BIAS`; the last layer's plain bias `BIAS`.
#[test]
fn golden_mlp_runs_its_bias_in_cublaslt() {
    use exec_cuda::codegen::{LtActivation, LtEpilogue};
    let g = synth::mlp(1, 4, 2).unwrap();
    let p = plan(&g, 1);
    let src = codegen::generate_all(&p).unwrap();
    let mm = src.iter().find(|s| !s.blas.is_empty()).expect("the MatMul runs on cuBLAS");
    let b = mm.blas[0];
    assert_eq!((b.matmul.m, b.matmul.n, b.matmul.k, b.matmul.batch), (2, 4, 4, 1));
    let bias = p.kernels()[0].params.iter().find(|q| p.kernels()[0].values[q.value.index()].shape.dims() == [4]);
    assert_eq!(b.lt, Some(LtEpilogue { bias: bias.map(|q| q.buffer), residual: None, activation: LtActivation::None }));
    assert_eq!(mm.launch, Launch::None);
    let g3 = synth::mlp(3, 4, 2).unwrap();
    let src3 = codegen::generate_all(&plan(&g3, 1)).unwrap();
    let acts: Vec<_> = src3.iter().flat_map(|s| &s.blas).filter_map(|b| b.lt.map(|l| l.activation)).collect();
    assert_eq!(acts, [LtActivation::Relu, LtActivation::Relu, LtActivation::None]);
    assert!(src3.iter().all(|s| s.launch == Launch::None), "three calls, no launch");
    golden("mlp1", &src);
}

/// A three-layer bf16 MLP. Layer 0 reads the f32 input and stays f32 (rule `AnchorReadsF32`), but its epilogue
/// narrows to bf16, so its f32 product has no f32 buffer to land in: a generated kernel. Layer 1 is a bf16 cuBLAS
/// product stored in bf16, which its bias + Relu epilogue reads back (`bf2f`); layer 2's epilogue casts to the
/// f32 graph output, so its product is stored in f32 and rounded to bf16 in the epilogue (`bf2f(f2bf(..))`).
#[test]
fn golden_half_mlp_uses_gemm_ex() {
    use exec_cuda::{GemmType, GemmTypes};
    use graph_plan::precision::{Precision, PrecisionPolicy};
    let g = synth::mlp(3, 4, 2).unwrap();
    let mut opts = PlanOptions::with_streams(1);
    opts.fusion.caps = codegen::fusion_caps();
    opts.precision = PrecisionPolicy::new(Precision::Bf16);
    let p = ExecutionPlan::build_with(&g, &opts).unwrap();
    graph_plan::verify(&p).unwrap();
    let src = codegen::generate_all(&p).unwrap();
    let types: Vec<GemmTypes> = src.iter().flat_map(|s| &s.blas).map(|b| b.matmul.types).collect();
    assert_eq!(
        types,
        [GemmTypes::uniform(GemmType::BF16), GemmTypes { ab: GemmType::BF16, c: GemmType::F32 }],
        "layers 1 and 2 on cuBLAS"
    );
    golden("mlp3_bf16", &src);
}

/// `refuse_unsupported_products` with a fake compute capability: on 7.5 every bf16 product becomes a generated
/// kernel and is reported as `PrecisionUnsupported` naming its node; f32 products stay on cuBLAS; on 8.0 nothing
/// changes. No GPU involved.
#[test]
fn bf16_products_fall_back_below_compute_capability_8() {
    use exec_cuda::executor::refuse_unsupported_products;
    use exec_cuda::GemmType;
    use graph_plan::precision::{Precision, PrecisionPolicy};
    let g = synth::mlp(3, 4, 2).unwrap();
    let mut opts = PlanOptions::with_streams(1);
    opts.fusion.caps = codegen::fusion_caps();
    opts.precision = PrecisionPolicy::new(Precision::Bf16);
    let p = ExecutionPlan::build_with(&g, &opts).unwrap();
    graph_plan::verify(&p).unwrap();
    let generated = codegen::generate_all(&p).unwrap();
    let bf16_steps = generated.iter().filter(|s| s.blas.iter().any(|b| b.matmul.types.ab == GemmType::BF16)).count();
    assert_eq!(bf16_steps, 2, "layers 1 and 2 are bf16 products");
    let mut on_ampere = generated.clone();
    assert_eq!(refuse_unsupported_products(&p, &mut on_ampere, (8, 0)), Ok(Vec::new()));
    assert_eq!(on_ampere, generated);
    let mut on_turing = generated.clone();
    let refused = refuse_unsupported_products(&p, &mut on_turing, (7, 5)).unwrap();
    let nodes: Vec<String> = refused
        .iter()
        .map(|e| match e {
            CudaError::PrecisionUnsupported { node, dtype: DType::BF16, capability: (7, 5), needs: (8, 0) } => {
                node.clone()
            }
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(nodes, ["l1.matmul", "l2.matmul"]);
    for (before, after) in generated.iter().zip(&on_turing) {
        match before.blas.first() {
            Some(b) if b.matmul.types.ab == GemmType::BF16 => {
                assert!(after.blas.is_empty() && after.launch != Launch::None, "{}", after.name);
            }
            _ => assert_eq!(before, after),
        }
    }
}

/// Also the graphs of the GPU end-to-end test: with `CUPLAN_PTX_CACHE=DIR` this test fills DIR with their PTX,
/// which a GPU machine without NVRTC can then use.
/// The kernels of selection epilogues (a packed projection unbound by a Split or by Gathers; GPT-2's last-axis
/// split with per-part head splits) and of a row selection (a class token after a LayerNorm) compile with NVRTC.
#[test]
fn selection_kernels_compile() {
    let test = "selection_kernels_compile";
    let cache = CompileCache::from_env();
    let mut graphs = Vec::new();
    for form in 0..3 {
        let mut g = ComputeGraph::new(format!("packed_{form}"));
        let x = g.add_input("x", DType::F32, [2, 5, 8]).unwrap();
        let w = g.add_weight("w", DType::F32, [8, 24]).unwrap();
        let b = g.add_weight("b", DType::F32, [24]).unwrap();
        let y = g.add_node("mm", Op::MatMul, &[x, w]).unwrap()[0];
        let y = g.add_node("bias", Op::Add, &[y, b]).unwrap()[0];
        let outs: Vec<graph_plan::ir::TensorId> = if form == 2 {
            // GPT-2: split the last axis, then each part's heads.
            let parts = g.add_node("split", Op::Split { axis: 2, splits: vec![8, 8, 8] }, &[y]).unwrap();
            parts
                .iter()
                .enumerate()
                .map(|(i, &p)| {
                    let v = g
                        .add_node(&format!("v{i}"), Op::Reshape { shape: vec![2, 5, 2, 4], allowzero: false }, &[p])
                        .unwrap()[0];
                    g.add_node(&format!("h{i}"), Op::Transpose { perm: Some(vec![0, 2, 1, 3]) }, &[v]).unwrap()[0]
                })
                .collect()
        } else {
            let v = g.add_node("view", Op::Reshape { shape: vec![2, 5, 3, 2, 4], allowzero: false }, &[y]).unwrap()[0];
            let t = g.add_node("t", Op::Transpose { perm: Some(vec![2, 0, 3, 1, 4]) }, &[v]).unwrap()[0];
            if form == 0 {
                let parts = g.add_node("split", Op::Split { axis: 0, splits: vec![1, 1, 1] }, &[t]).unwrap();
                parts
                    .iter()
                    .enumerate()
                    .map(|(i, &p)| g.add_node(&format!("sq{i}"), Op::Squeeze { axes: Some(vec![0]) }, &[p]).unwrap()[0])
                    .collect()
            } else {
                (0..3i64)
                    .map(|i| {
                        let idx = g.add_constant(&format!("i{i}"), DType::I64, [], i.to_le_bytes().to_vec()).unwrap();
                        g.add_node(&format!("g{i}"), Op::Gather { axis: 0 }, &[t, idx]).unwrap()[0]
                    })
                    .collect()
            }
        };
        for o in outs {
            g.mark_output(o).unwrap();
        }
        graphs.push(g);
    }
    let mut g = ComputeGraph::new("cls_token");
    let x = g.add_input("x", DType::F32, [2, 5, 8]).unwrap();
    let gamma = g.add_weight("gamma", DType::F32, [8]).unwrap();
    let ln = g.add_node("ln", Op::LayerNormalization { axis: -1, epsilon: 1e-5 }, &[x, gamma]).unwrap()[0];
    let zero = g.add_constant("zero", DType::I64, [], 0i64.to_le_bytes().to_vec()).unwrap();
    let cls = g.add_node("cls", Op::Gather { axis: 1 }, &[ln, zero]).unwrap()[0];
    g.mark_output(cls).unwrap();
    graphs.push(g);
    let mut compiled = 0;
    for g in &graphs {
        let p = plan(g, 1);
        // One kernel each: the selections are in the product's epilogue or in the row kernel.
        assert_eq!(p.kernels().len(), 1, "{}\n{p}", g.name());
        let sources = codegen::generate_all(&p).unwrap();
        if g.name().starts_with("packed") {
            assert!(sources[0].blas.first().is_some_and(|b| b.parts.is_some()), "{}: {:?}", g.name(), sources[0].blas);
        }
        compiled += compile_all(&format!("{test}/{}", g.name()), &p, &cache);
    }
    eprintln!("{test}: {compiled} kernels compiled");
}

#[test]
fn model_families_compile() {
    let cache = CompileCache::from_env();
    let graphs = [
        synth::mlp(2, 32, 4).unwrap(),
        synth::transformer(1, 16, 2, 8, 1).unwrap(),
        synth::resnet_like(1, 4, 8).unwrap(),
        synth::chain(8).unwrap(),
        synth::mlp(2, 16, 4).unwrap(),
        synth::transformer(2, 16, 2, 4, 1).unwrap(),
        synth::resnet_like(1, 4, 8).unwrap(),
        synth::inception_like(1, 3).unwrap(),
        synth::random_dag(40, 3, 7).unwrap(),
        synth::random_dag(40, 3, 11).unwrap(),
    ];
    let started = std::time::Instant::now();
    let mut compiled = 0;
    for g in &graphs {
        for streams in [3, 1] {
            compiled += compile_all(&format!("model_families_compile/{}", g.name()), &plan(g, streams), &cache);
        }
    }
    if compiled > 0 {
        let st = cache.stats();
        eprintln!(
            "compiled {compiled} kernels ({} distinct, {} from disk, {} cache hits) in {:?}",
            st.misses,
            st.disk_hits,
            st.hits,
            started.elapsed()
        );
        // Two identical transformer layers and two stream counts per graph: the cache must have been hit.
        assert!(st.hits > 0 && st.misses + st.disk_hits < compiled as u64);
    }
}

/// Half plans (fp16 and bf16) of the model families compile with NVRTC, with cuBLAS anchors (half epilogues
/// reading a product stored in half or in f32) and with every product generated.
#[test]
fn half_plans_compile() {
    use graph_plan::precision::{Precision, PrecisionPolicy};
    let test = "half_plans_compile";
    let graphs = [
        synth::mlp(3, 16, 4).unwrap(),
        synth::transformer(1, 16, 2, 8, 1).unwrap(),
        synth::resnet_like(1, 4, 8).unwrap(),
    ];
    let mut sources = Vec::new();
    for p in [Precision::Fp16, Precision::Bf16] {
        let mut opts = PlanOptions::with_streams(2);
        opts.fusion.caps = codegen::fusion_caps();
        opts.precision = PrecisionPolicy::new(p);
        for g in &graphs {
            let plan = ExecutionPlan::build_with(g, &opts).unwrap();
            graph_plan::verify(&plan).unwrap();
            for cublas in [true, false] {
                let s = codegen::generate_all_with(&plan, &codegen::CodegenOptions { cublas })
                    .unwrap_or_else(|e| panic!("{test}: {} {p:?}: {e}", g.name()));
                sources.extend(s);
            }
        }
    }
    assert!(sources.iter().any(|s| s.blas.iter().any(|b| b.matmul.types.ab != exec_cuda::GemmType::F32)));
    if !common::nvrtc_or_skip(test) {
        return;
    }
    let n = common::compile_distinct(test, &sources, &CompileCache::new(), &CompileOptions::default());
    eprintln!("{test}: {n} distinct half kernels compile");
}

/// One graph touching every op the code generator emits.
fn op_coverage() -> ComputeGraph {
    let f = DType::F32;
    let mut g = ComputeGraph::new("ops");
    let x = g.add_input("x", f, [2, 3, 4, 4]).unwrap();
    let w = g.add_weight("w", f, [4, 3, 3, 3]).unwrap();
    let cb = g.add_weight("cb", f, [4]).unwrap();
    let one = |g: &mut ComputeGraph, name: &str, op: Op, ins: &[graph_plan::ir::TensorId]| {
        g.add_node(name, op, ins).unwrap()[0]
    };
    let conv = one(
        &mut g,
        "conv",
        Op::Conv(ConvAttrs { strides: vec![1, 1], pads: vec![1, 1, 1, 1], dilations: vec![], group: 1 }),
        &[x, w, cb],
    );
    let gelu = one(&mut g, "gelu", Op::Gelu { approximate: GeluApprox::Tanh }, &[conv]);
    let mp = one(
        &mut g,
        "maxpool",
        Op::MaxPool(PoolAttrs { kernel_shape: vec![2, 2], strides: vec![2, 2], ..Default::default() }),
        &[gelu],
    );
    let ap = one(
        &mut g,
        "avgpool",
        Op::AveragePool(PoolAttrs {
            kernel_shape: vec![3, 3],
            pads: vec![1, 1, 1, 1],
            count_include_pad: true,
            ..Default::default()
        }),
        &[gelu],
    );
    let gap = one(&mut g, "gap", Op::GlobalAveragePool, &[ap]);
    let t = one(&mut g, "transpose", Op::Transpose { perm: Some(vec![0, 2, 3, 1]) }, &[mp]);
    let sl = one(
        &mut g,
        "slice",
        Op::Slice { starts: vec![0, -1], ends: vec![2, -3], axes: Some(vec![1, 2]), steps: Some(vec![1, -1]) },
        &[t],
    );
    let pd =
        one(&mut g, "pad", Op::Pad { pads: vec![0, 1, 0, 0, 0, 1, 0, 0], mode: PadMode::Reflect, value: 0.0 }, &[sl]);
    let cat = one(&mut g, "concat", Op::Concat { axis: 1 }, &[pd, pd]);
    let fl = one(&mut g, "flatten", Op::Flatten { axis: 1 }, &[cat]);
    let idx = g.add_input("idx", DType::I64, [3]).unwrap();
    let ga = one(&mut g, "gather", Op::Gather { axis: 1 }, &[fl, idx]);
    let h = one(&mut g, "cast16", Op::Cast { to: DType::F16 }, &[ga]);
    let h2 = one(&mut g, "clip", Op::Clip { min: Some(-1.0), max: None }, &[h]);
    let back = one(&mut g, "cast32", Op::Cast { to: DType::F32 }, &[h2]);
    let cmp = one(&mut g, "less", Op::Less, &[back, ga]);
    let wh = one(&mut g, "where", Op::Where, &[cmp, back, ga]);
    let rs = one(&mut g, "rsum", Op::ReduceSum { axes: Some(vec![0]), keepdims: false }, &[wh]);
    let parts = g.add_node("split", Op::Split { axis: 0, splits: vec![1, 2] }, &[rs]).unwrap();
    let ex = one(&mut g, "expand", Op::Expand { shape: vec![3, 2] }, &[parts[1]]);
    let gm_b = g.add_weight("gm_b", f, [2, 4]).unwrap();
    let gm_c = g.add_weight("gm_c", f, [4]).unwrap();
    let gm = one(&mut g, "gemm", Op::Gemm { alpha: 0.5, beta: 2.0, trans_a: false, trans_b: false }, &[ex, gm_b, gm_c]);
    let v = g.add_input("v", f, [4]).unwrap();
    let mv = one(&mut g, "matvec", Op::MatMul, &[gm, v]);
    let ln_x = g.add_input("ln_x", f, [2, 5, 8]).unwrap();
    let ln_s = g.add_weight("ln_s", f, [8]).unwrap();
    let ln = one(&mut g, "layernorm", Op::LayerNormalization { axis: -1, epsilon: 1e-5 }, &[ln_x, ln_s]);
    let rm = one(&mut g, "rmax", Op::ReduceMax { axes: Some(vec![1]), keepdims: true }, &[ln]);
    let bn_s = g.add_weight("bn_s", f, [4]).unwrap();
    let bn = one(&mut g, "bn", Op::BatchNormalization { epsilon: 1e-5 }, &[conv, bn_s, bn_s, bn_s, bn_s]);
    let i32v = one(&mut g, "toint", Op::Cast { to: DType::I32 }, &[bn]);
    let ab = one(&mut g, "absint", Op::Abs, &[i32v]);
    for out in [gap, parts[0], mv, rm, ab] {
        g.mark_output(out).unwrap();
    }
    g
}

#[test]
fn every_op_generates_and_compiles() {
    let g = op_coverage();
    let p = plan(&g, 2);
    let cache = CompileCache::new();
    let n = compile_all("every_op_generates_and_compiles", &p, &cache);
    eprintln!("{n} kernels compiled");
}

#[test]
fn fusion_caps_are_declared() {
    let caps = codegen::fusion_caps();
    assert!(caps.matmul_epilogue && caps.conv_epilogue && caps.multi_output);
    assert!(caps.reduction_fusion, "fused row kernels (reduce::fused) take producers and consumers");
    assert!(caps.attention, "fused attention kernels (codegen::attention)");
}

/// A small fused attention kernel: f16 Q, K, V through head-split transposes, scaled by a Div, masked by a
/// [1, 1, 1, 5] input, the head merge folded into the output index (the half chain's casts inside the kernel).
/// Its source is a golden; it compiles with NVRTC where installed.
#[test]
fn golden_attention_kernel() {
    use graph_plan::precision::{Precision, PrecisionPolicy};
    let (s, heads, d) = (5usize, 2usize, 4usize);
    let e = heads * d;
    let mut g = ComputeGraph::new("attention");
    let split = |g: &mut ComputeGraph, n: &str, perm: Vec<usize>| {
        let x = g.add_input(n, DType::F32, [1, s, e]).unwrap();
        let r = g
            .add_node(
                &format!("view_{n}"),
                Op::Reshape { shape: vec![1, s as i64, heads as i64, d as i64], allowzero: false },
                &[x],
            )
            .unwrap()[0];
        g.add_node(&format!("split_{n}"), Op::Transpose { perm: Some(perm) }, &[r]).unwrap()[0]
    };
    let q = split(&mut g, "q", vec![0, 2, 1, 3]);
    let kt = split(&mut g, "k", vec![0, 2, 3, 1]);
    let v = split(&mut g, "v", vec![0, 2, 1, 3]);
    let mask = g.add_input("mask", DType::F32, [1, 1, 1, s]).unwrap();
    let c = g.add_constant_f32("sqrt_d", [], &[2.0]).unwrap();
    let sc = g.add_node("qk", Op::MatMul, &[q, kt]).unwrap()[0];
    let sc = g.add_node("scale", Op::Div, &[sc, c]).unwrap()[0];
    let sc = g.add_node("mask_add", Op::Add, &[sc, mask]).unwrap()[0];
    let p = g.add_node("softmax", Op::Softmax { axis: -1 }, &[sc]).unwrap()[0];
    let o = g.add_node("pv", Op::MatMul, &[p, v]).unwrap()[0];
    let o = g.add_node("merge_t", Op::Transpose { perm: Some(vec![0, 2, 1, 3]) }, &[o]).unwrap()[0];
    g.mark_output(o).unwrap();
    let mut opts = PlanOptions::with_streams(1);
    opts.fusion.caps = codegen::fusion_caps();
    opts.precision = PrecisionPolicy::new(Precision::Fp16);
    let p = ExecutionPlan::build_with(&g, &opts).unwrap();
    graph_plan::verify(&p).unwrap();
    let attn: Vec<_> = p.kernels().iter().filter(|k| k.kind == graph_plan::GroupKind::Attention).collect();
    assert_eq!(attn.len(), 1, "{p}");
    let src = codegen::generate(attn[0]).unwrap();
    assert!(matches!(src.launch, Launch::Elements { threads: 40, .. }), "{:?}", src.launch);
    assert!(src.source.contains("h2f(") && src.source.contains("f2h("), "half loads and one rounding store");
    golden("attention_f16", std::slice::from_ref(&src));
    let n = compile_all("golden_attention_kernel", &p, &CompileCache::new());
    eprintln!("{n} kernels compiled");
}
