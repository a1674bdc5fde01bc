//! Tests that need a GPU: allocation and copies, kernel launch, signature checks, multi-stream capture and replay,
//! cuBLAS. Each prints SKIP with the reason and passes where no driver (or NVRTC, or cuBLAS) is present.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{blas_or_skip, device_or_skip, from_bytes, to_bytes};
use exec_cuda::{capture, Blas, CompileOptions, CudaError, KernelArg, LaunchDims, Matmul, ParamKind};

const KERNELS: &str = r#"
extern "C" __global__ void add_f32(const float* a, const float* b, float* out, unsigned long long n) {
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}
extern "C" __global__ void scale_f32(const float* x, float* out, float s, unsigned long long n) {
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] * s;
}
"#;

const ADD_PARAMS: [ParamKind; 4] = [ParamKind::Ptr, ParamKind::Ptr, ParamKind::Ptr, ParamKind::U64];
const SCALE_PARAMS: [ParamKind; 4] = [ParamKind::Ptr, ParamKind::Ptr, ParamKind::F32, ParamKind::U64];

fn options_for(device: &exec_cuda::Device) -> CompileOptions {
    CompileOptions::for_arch(&device.info().arch())
}

/// Device 0 and the test kernels compiled for it, through NVRTC or a PTX cache carried in `$CUPLAN_PTX_CACHE`
/// (a GPU machine without NVRTC); None after printing why. Without a device the kernels are still compiled for
/// sm_90 when NVRTC is present, so that `CUPLAN_PTX_CACHE=DIR cargo test` on a CPU-only machine fills DIR.
fn device_and_kernels(test: &str) -> Option<(exec_cuda::Device, exec_cuda::Ptx)> {
    let device = device_or_skip(test);
    let options = device.as_ref().map_or_else(CompileOptions::default, options_for);
    let compiled = exec_cuda::CompileCache::from_env().compile("kernels", KERNELS, &options);
    let device = device?;
    match compiled {
        Ok(ptx) => Some((device, ptx)),
        Err(e @ CudaError::NvrtcUnavailable { .. }) => {
            eprintln!("SKIP {test}: {e} (and no entry in $CUPLAN_PTX_CACHE)");
            None
        }
        Err(e) => panic!("{test}: {e}"),
    }
}

#[test]
fn buffers_round_trip_and_refuse_out_of_bounds_ranges() {
    let Some(device) = device_or_skip("buffers_round_trip_and_refuse_out_of_bounds_ranges") else {
        return;
    };
    let buf = device.alloc("pool", 1024).unwrap();
    let stream = device.stream().unwrap();
    let mut zeros = vec![1u8; 1024];
    stream.copy_to_host(&mut zeros, buf.all()).unwrap();
    assert!(zeros.iter().all(|&b| b == 0), "allocations are zeroed");
    let data: Vec<u8> = (0..256u32).map(|i| (i * 7 % 251) as u8).collect();
    stream.copy_to_device(buf.range("in", 512, 256).unwrap(), &data).unwrap();
    stream.copy_device(buf.range("dst", 0, 256).unwrap(), buf.range("src", 512, 256).unwrap()).unwrap();
    stream.fill(buf.range("tail", 768, 256).unwrap(), 0xAB).unwrap();
    let mut back = vec![0u8; 1024];
    stream.copy_to_host(&mut back, buf.all()).unwrap();
    assert_eq!(&back[..256], &data[..]);
    assert_eq!(&back[512..768], &data[..]);
    assert!(back[768..].iter().all(|&b| b == 0xAB));
    let err = buf.range("arg 1", 1000, 32).unwrap_err();
    assert!(
        matches!(err, CudaError::OutOfBounds { ref buffer, offset: 1000, bytes: 32, size: 1024, .. } if buffer == "pool")
    );
    assert!(matches!(
        stream.copy_to_device(buf.range("x", 0, 8).unwrap(), &[0u8; 4]),
        Err(CudaError::OutOfBounds { .. })
    ));
}

#[test]
fn an_impossible_allocation_is_out_of_memory() {
    let Some(device) = device_or_skip("an_impossible_allocation_is_out_of_memory") else {
        return;
    };
    let huge = device.info().total_memory * 4;
    let err = device.alloc("huge", huge).unwrap_err();
    assert_eq!(err, CudaError::OutOfMemory { requested: huge });
    // The context stays usable.
    let small = device.alloc("small", 256).unwrap();
    assert_eq!(small.len(), 256);
}

#[test]
fn a_compiled_kernel_launches_and_computes() {
    let Some((device, ptx)) = device_and_kernels("a_compiled_kernel_launches_and_computes") else {
        return;
    };
    let module = device.load(&ptx).unwrap();
    let add = module.kernel("add_f32", &ADD_PARAMS).unwrap();
    let n = 10_000usize;
    let a: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
    let b: Vec<f32> = (0..n).map(|i| 3.0 - i as f32).collect();
    let buf = device.alloc("pool", 3 * 4 * n).unwrap();
    let (ra, rb, rc) = (
        buf.range("a", 0, 4 * n).unwrap(),
        buf.range("b", 4 * n, 4 * n).unwrap(),
        buf.range("c", 8 * n, 4 * n).unwrap(),
    );
    let stream = device.stream().unwrap();
    stream.copy_to_device(ra, &to_bytes(&a)).unwrap();
    stream.copy_to_device(rb, &to_bytes(&b)).unwrap();
    let dims = LaunchDims::linear(n as u64, 256).unwrap();
    stream
        .launch(&add, dims, &[KernelArg::Ptr(ra), KernelArg::Ptr(rb), KernelArg::Ptr(rc), KernelArg::U64(n as u64)])
        .unwrap();
    let mut out = vec![0u8; 4 * n];
    stream.copy_to_host(&mut out, rc).unwrap();
    let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    assert_eq!(from_bytes(&out), want);

    // Wrong arguments are refused before the driver sees them.
    let err = stream.launch(&add, dims, &[KernelArg::Ptr(ra)]).unwrap_err();
    assert!(matches!(err, CudaError::Signature { .. }), "{err:?}");
}

#[test]
fn a_wrong_declaration_is_caught_at_load_on_new_drivers() {
    let Some((device, ptx)) = device_and_kernels("a_wrong_declaration_is_caught_at_load_on_new_drivers") else {
        return;
    };
    let module = device.load(&ptx).unwrap();
    let wrong = module.kernel("add_f32", &[ParamKind::Ptr, ParamKind::Ptr, ParamKind::Ptr, ParamKind::U32]);
    if device.info().driver_version >= 12_040 {
        assert!(matches!(wrong, Err(CudaError::Signature { .. })), "{wrong:?}");
    } else {
        eprintln!("driver < 12.4 cannot report parameter layouts; declaration not checked");
    }
    assert!(matches!(module.kernel("no_such_kernel", &[]), Err(CudaError::Driver { .. })));
    assert!(matches!(module.kernel("bad name", &[]), Err(CudaError::InvalidName { .. })));
}

/// Two streams in one captured graph: s0 computes c = a + b, s1 waits for it and computes d = 2c, while s0 goes on
/// with e = 3a; replaying twice after changing the inputs gives the new results.
#[test]
fn a_two_stream_capture_replays_with_the_plan_events() {
    let Some((device, ptx)) = device_and_kernels("a_two_stream_capture_replays_with_the_plan_events") else {
        return;
    };
    let module = device.load(&ptx).unwrap();
    let add = module.kernel("add_f32", &ADD_PARAMS).unwrap();
    let scale = module.kernel("scale_f32", &SCALE_PARAMS).unwrap();
    let n = 4096usize;
    let bytes = 4 * n;
    let buf = device.alloc("pool", 5 * bytes).unwrap();
    let r = |i: usize| buf.range("t", i * bytes, bytes).unwrap();
    let (s0, s1) = (device.stream().unwrap(), device.stream().unwrap());
    let c_ready = device.event().unwrap();
    let dims = LaunchDims::linear(n as u64, 128).unwrap();
    let nn = KernelArg::U64(n as u64);
    let graph = capture(&device, &s0, std::slice::from_ref(&s1), |streams| {
        let (s0, s1) = (&streams[0], &streams[1]);
        s0.launch(&add, dims, &[KernelArg::Ptr(r(0)), KernelArg::Ptr(r(1)), KernelArg::Ptr(r(2)), nn])?;
        s0.record(&c_ready)?;
        s1.wait(&c_ready)?;
        s1.launch(&scale, dims, &[KernelArg::Ptr(r(2)), KernelArg::Ptr(r(3)), KernelArg::F32(2.0), nn])?;
        s0.launch(&scale, dims, &[KernelArg::Ptr(r(0)), KernelArg::Ptr(r(4)), KernelArg::F32(3.0), nn])
    })
    .unwrap();
    graph.upload().unwrap();
    for round in 0..2 {
        let a: Vec<f32> = (0..n).map(|i| (i + round) as f32).collect();
        let b: Vec<f32> = (0..n).map(|i| 1.0 - (i * round) as f32).collect();
        s0.copy_to_device(r(0), &to_bytes(&a)).unwrap();
        s0.copy_to_device(r(1), &to_bytes(&b)).unwrap();
        graph.launch().unwrap();
        s0.synchronize().unwrap();
        let mut out = vec![0u8; 5 * bytes];
        s0.copy_to_host(&mut out, buf.all()).unwrap();
        let out = from_bytes(&out);
        for i in 0..n {
            let c = a[i] + b[i];
            assert_eq!(out[2 * n + i], c, "round {round} c[{i}]");
            assert_eq!(out[3 * n + i], 2.0 * c, "round {round} d[{i}]");
            assert_eq!(out[4 * n + i], 3.0 * a[i], "round {round} e[{i}]");
        }
    }
}

#[test]
fn a_failed_capture_leaves_the_streams_usable() {
    let Some((device, ptx)) = device_and_kernels("a_failed_capture_leaves_the_streams_usable") else {
        return;
    };
    let module = device.load(&ptx).unwrap();
    let add = module.kernel("add_f32", &ADD_PARAMS).unwrap();
    let buf = device.alloc("pool", 1024).unwrap();
    let (s0, s1) = (device.stream().unwrap(), device.stream().unwrap());
    let err = capture(&device, &s0, std::slice::from_ref(&s1), |streams| {
        // A signature error in the middle of recording.
        streams[1].launch(&add, LaunchDims::linear(1, 32)?, &[KernelArg::Ptr(buf.all())])
    })
    .unwrap_err();
    assert!(matches!(err, CudaError::Signature { .. }), "{err:?}");
    // Both streams work normally afterwards.
    let r = buf.range("x", 0, 16).unwrap();
    s1.fill(r, 7).unwrap();
    s1.synchronize().unwrap();
    let mut out = [0u8; 16];
    s0.copy_to_host(&mut out, r).unwrap();
    assert_eq!(out, [7u8; 16]);
}

#[test]
fn cublas_matmul_matches_the_cpu_in_row_major() {
    let Some(device) = device_or_skip("cublas_matmul_matches_the_cpu_in_row_major") else {
        return;
    };
    let stream = device.stream().unwrap();
    let Some(blas) = blas_or_skip("cublas_matmul_matches_the_cpu_in_row_major", Blas::new(&device, &stream)) else {
        return;
    };
    let (batch, m, n, k) = (3usize, 5usize, 7usize, 4usize);
    let mut mm = Matmul::batched(batch, m, n, k);
    mm.stride_b = 0; // one B broadcast over the batch, as ONNX MatMul with a 2-D weight
    let a: Vec<f32> = (0..batch * m * k).map(|i| (i % 13) as f32 - 6.0).collect();
    let b: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 * 0.25).collect();
    let buf = device.alloc("pool", 4 * (a.len() + b.len() + batch * m * n)).unwrap();
    let ra = buf.range("a", 0, 4 * a.len()).unwrap();
    let rb = buf.range("b", 4 * a.len(), 4 * b.len()).unwrap();
    let rc = buf.range("c", 4 * (a.len() + b.len()), 4 * batch * m * n).unwrap();
    stream.copy_to_device(ra, &to_bytes(&a)).unwrap();
    stream.copy_to_device(rb, &to_bytes(&b)).unwrap();
    blas.matmul(&mm, ra, rb, rc).unwrap();
    let mut out = vec![0u8; rc.len()];
    stream.copy_to_host(&mut out, rc).unwrap();
    let out = from_bytes(&out);
    for p in 0..batch {
        for i in 0..m {
            for j in 0..n {
                let want: f32 = (0..k).map(|l| a[p * m * k + i * k + l] * b[l * n + j]).sum();
                let got = out[p * m * n + i * n + j];
                assert!((got - want).abs() <= 1e-4 * want.abs().max(1.0), "[{p},{i},{j}] {got} vs {want}");
            }
        }
    }
    // Undersized operands are refused before cuBLAS runs.
    let short = buf.range("c", 0, 4).unwrap();
    assert!(matches!(blas.matmul(&mm, ra, rb, short), Err(CudaError::OutOfBounds { .. })));
}

/// Half products on cuBLAS (`cublasGemmEx`, f32 compute): batched with a broadcast B, stored in the half type and
/// in f32, against the host model of the same call (`ColMajorGemm::host_reference`). cuBLAS may sum in another
/// order, so the results agree to one unit in the last place of the stored type (f32 sums of exact products
/// differ by f32 rounding only). bf16 is skipped, with the reason, below compute capability 8.0.
#[test]
fn cublas_half_matmul_matches_the_host_model() {
    use exec_cuda::{GemmType, GemmTypes};
    let test = "cublas_half_matmul_matches_the_host_model";
    let Some(device) = device_or_skip(test) else {
        return;
    };
    let stream = device.stream().unwrap();
    let Some(blas) = blas_or_skip(test, Blas::new(&device, &stream)) else {
        return;
    };
    let (batch, m, n, k) = (3usize, 5usize, 7usize, 24usize);
    let half_bytes = |v: &[f32], t: GemmType| graph_plan::exec::f32_to_half_bytes(&to_bytes(v), t.dtype());
    for ab in [GemmType::F16, GemmType::BF16] {
        for c in [ab, GemmType::F32] {
            let mut mm = Matmul::batched(batch, m, n, k);
            mm.stride_b = 0;
            mm.alpha = 0.75;
            mm.types = GemmTypes { ab, c };
            if let Err(e) = mm.check_device("test", device.info().compute_capability) {
                eprintln!("SKIP {test} ({ab} -> {c}): {e}");
                continue;
            }
            let a: Vec<f32> = (0..batch * m * k).map(|i| ((i * 7) % 13) as f32 * 0.125 - 0.75).collect();
            let b: Vec<f32> = (0..k * n).map(|i| ((i * 5) % 9) as f32 * 0.25 - 1.0).collect();
            let (ha, hb) = (half_bytes(&a, ab), half_bytes(&b, ab));
            let c_len = batch * m * n * c.size();
            let buf = device.alloc("pool", ha.len() + hb.len() + c_len).unwrap();
            let ra = buf.range("a", 0, ha.len()).unwrap();
            let rb = buf.range("b", ha.len(), hb.len()).unwrap();
            let rc = buf.range("c", ha.len() + hb.len(), c_len).unwrap();
            stream.copy_to_device(ra, &ha).unwrap();
            stream.copy_to_device(rb, &hb).unwrap();
            blas.matmul(&mm, ra, rb, rc).unwrap();
            let mut got = vec![0u8; c_len];
            stream.copy_to_host(&mut got, rc).unwrap();
            let mut want = vec![0u8; c_len];
            mm.to_col_major().host_reference(&hb, &ha, &mut want).unwrap();
            let widen = |bytes: &[u8]| -> Vec<f32> {
                match c {
                    GemmType::F32 => from_bytes(bytes),
                    GemmType::F16 => bytes
                        .chunks_exact(2)
                        .map(|e| graph_plan::exec::f16_to_f32(u16::from_le_bytes([e[0], e[1]])))
                        .collect(),
                    GemmType::BF16 => bytes
                        .chunks_exact(2)
                        .map(|e| f32::from_bits(u32::from(u16::from_le_bytes([e[0], e[1]])) << 16))
                        .collect(),
                }
            };
            let ulp = match c {
                GemmType::F32 => 2f32.powi(-20),
                GemmType::F16 => 2f32.powi(-10),
                GemmType::BF16 => 2f32.powi(-7),
            };
            for (i, (g, w)) in widen(&got).iter().zip(widen(&want)).enumerate() {
                assert!((g - w).abs() <= ulp * w.abs().max(1.0), "{ab} -> {c} [{i}]: {g} vs {w}");
            }
        }
    }
}

/// End to end on the GPU: prepare and replay whole plans (several streams, captured graph), compared with the
/// host emulator's numbers for the same generated kernels, in f32, fp16 and bf16.
#[test]
fn plans_run_end_to_end_and_match_the_host_emulator() {
    use common::host::{compiler, run_plan, HostRegions};
    use graph_plan::precision::{Precision, PrecisionPolicy};
    use graph_plan::{BindingRole, ExecutionPlan, Executor, HostTensor, PlanOptions, PreparedPlan, TensorMap};
    let test = "plans_run_end_to_end_and_match_the_host_emulator";
    let Some(_device) = device_or_skip(test) else {
        return;
    };
    let Some(cxx) = compiler() else {
        eprintln!("SKIP {test}: no host C++ compiler for the reference");
        return;
    };
    let exec = exec_cuda::CudaExecutor::new(0);
    let graphs = [
        graph_plan::ir::synth::mlp(2, 32, 4).unwrap(),
        graph_plan::ir::synth::transformer(1, 16, 2, 8, 1).unwrap(),
        // Batch 2: the head-split stores loop over the images, one pointer-array call per shape.
        graph_plan::ir::synth::transformer(1, 16, 2, 8, 2).unwrap(),
        graph_plan::ir::synth::resnet_like(1, 4, 8).unwrap(),
    ];
    // f32 within 1e-3 of the host; half plans (cuBLAS GemmEx products, half storage) within the precision check's
    // tolerances, since a GPU sum that differs in its last f32 bit may round to the neighbouring half value.
    let precisions = [(None, 1e-3f32), (Some(Precision::Fp16), 1e-2), (Some(Precision::Bf16), 5e-2)];
    for (g, (precision, tol)) in graphs.iter().flat_map(|g| precisions.iter().map(move |p| (g, *p))) {
        let mut opts = PlanOptions::with_streams(3);
        opts.fusion.caps = exec_cuda::codegen::fusion_caps();
        if let Some(p) = precision {
            opts.precision = PrecisionPolicy::new(p);
        }
        let plan = ExecutionPlan::build_with(g, &opts).unwrap();
        let seeded = |role| {
            let mut m = TensorMap::new();
            for b in plan.bindings().iter().filter(|b| b.role == role) {
                m.insert(b.name.to_string(), HostTensor::seeded(b.dtype, &b.shape, &b.name, 9, b.name.contains("var")));
            }
            m
        };
        let (weights, inputs) = (seeded(BindingRole::Weight), seeded(BindingRole::Input));
        let mut prepared = match exec.prepare(&plan, &weights) {
            Ok(p) => p,
            Err(graph_plan::ExecError::Backend { message, .. })
                if message.contains("cuBLAS unavailable") || message.contains("NVRTC unavailable") =>
            {
                eprintln!("SKIP {test}: {message}");
                return;
            }
            Err(e) => panic!("{}: {e}", g.name()),
        };
        for e in &prepared.info().cublas_refused {
            eprintln!("{test}: {} {precision:?}: {e}", g.name());
        }
        // f32 MLP layers are cuBLASLt calls with their bias (and Relu) and launch nothing.
        let info = prepared.info();
        eprintln!(
            "{test}: {} {precision:?}: {} cuBLAS products in {} calls, {} launched kernels",
            g.name(),
            info.cublas_products,
            info.cublas_calls,
            info.launched_kernels
        );
        let first = prepared.run(&inputs).unwrap();
        let second = prepared.run(&inputs).unwrap();
        assert_eq!(first, second, "{}: replays are deterministic", g.name());
        let mut regions = HostRegions::new(&plan);
        for b in plan.bindings() {
            let t = weights
                .get(&*b.name)
                .or_else(|| inputs.get(&*b.name))
                .map(|t| t.data.clone())
                .or_else(|| b.data.clone());
            if let Some(bytes) = t {
                regions.bytes_mut(b.buffer).copy_from_slice(&bytes);
            }
        }
        run_plan(cxx, &format!("gpu-{}", g.name()), &plan, &mut regions);
        // Outputs keep their declared dtype (f32) under every precision.
        for b in plan.bindings().iter().filter(|b| b.role == BindingRole::Output) {
            let want = common::from_bytes(regions.bytes(b.buffer));
            let got = first[&*b.name].to_f32().unwrap();
            for (i, (x, y)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (x - y).abs() <= tol * y.abs().max(1.0),
                    "{} {precision:?}: '{}'[{i}] gpu {x} host {y}",
                    g.name(),
                    b.name
                );
            }
        }
    }
}

/// Mapped pinned host memory: a capturable copy from device memory lands there, a kernel-visible address, and
/// the host reads it in place.
#[test]
fn the_host_region_is_mapped_pinned_memory() {
    let Some(device) = device_or_skip("the_host_region_is_mapped_pinned_memory") else {
        return;
    };
    let dev = device.alloc("pool", 256).unwrap();
    let host = device.alloc_host_mapped("host", 256).unwrap();
    assert!(host.is_host() && !dev.is_host());
    assert!(host.host_bytes("h", 0, 256).unwrap().iter().all(|&b| b == 0), "zeroed");
    let (s0, s1) = (device.stream().unwrap(), device.stream().unwrap());
    let data: Vec<u8> = (0..128u8).collect();
    s0.copy_to_device(dev.range("d", 0, 128).unwrap(), &data).unwrap();
    let graph = capture(&device, &s0, std::slice::from_ref(&s1), |streams| {
        streams[0].copy(host.range("h", 64, 128).unwrap(), dev.range("d", 0, 128).unwrap())
    })
    .unwrap();
    graph.launch().unwrap();
    s0.synchronize().unwrap();
    assert_eq!(host.host_bytes("h", 64, 128).unwrap(), &data[..]);
    assert!(matches!(dev.host_bytes("d", 0, 4), Err(CudaError::Unsupported { .. })));
    assert!(matches!(host.host_bytes("h", 250, 8), Err(CudaError::OutOfBounds { .. })));
}

/// Graph replay and eager submission of the same multi-stream plans give the same bytes; both can be timed.
#[test]
fn eager_and_graph_modes_agree_and_time() {
    use exec_cuda::{CudaExecutor, CudaOptions, SubmitMode};
    use graph_plan::{BindingRole, ExecutionPlan, HostTensor, PlanOptions, PreparedPlan, TensorMap};
    let test = "eager_and_graph_modes_agree_and_time";
    let Some(_device) = device_or_skip(test) else {
        return;
    };
    let graphs =
        [graph_plan::ir::synth::transformer(1, 16, 2, 8, 1).unwrap(), graph_plan::ir::synth::chain(50).unwrap()];
    for g in &graphs {
        let mut opts = PlanOptions::with_streams(3);
        opts.fusion.caps = exec_cuda::codegen::fusion_caps();
        let plan = ExecutionPlan::build_with(g, &opts).unwrap();
        let seeded = |role| {
            let mut m = TensorMap::new();
            for b in plan.bindings().iter().filter(|b| b.role == role) {
                m.insert(b.name.to_string(), HostTensor::seeded(b.dtype, &b.shape, &b.name, 5, false));
            }
            m
        };
        let (weights, inputs) = (seeded(BindingRole::Weight), seeded(BindingRole::Input));
        let mut outs = Vec::new();
        for mode in [SubmitMode::Graph, SubmitMode::Eager] {
            let exec = CudaExecutor::with_options(CudaOptions { mode, ..CudaOptions::new(0) });
            let mut p = match exec.prepare_cuda(&plan, &weights) {
                Ok(p) => p,
                Err(e) if e.is_unavailable() => {
                    eprintln!("SKIP {test}: {e}");
                    return;
                }
                Err(e) => panic!("{}: {e}", g.name()),
            };
            assert_eq!(p.info().mode, mode);
            outs.push(p.run(&inputs).unwrap());
            let t = p.time_runs(2, 5).unwrap();
            assert_eq!(t.len(), 5);
            assert!(t.iter().all(|&us| us > 0.0 && us.is_finite()), "{t:?}");
            eprintln!("{} {}: {:?} us", g.name(), mode.name(), t);
            // Each launch alone: one median per launched kernel, none for the others, and the outputs unchanged
            // by the serial pass (it runs the same steps).
            let alone = p.time_kernels(1, 3).unwrap();
            assert_eq!(alone.len(), plan.kernels().len());
            let launched: std::collections::HashSet<usize> = plan
                .steps
                .iter()
                .filter_map(|s| match s {
                    graph_plan::PlanStep::Launch { kernel, .. } => Some(kernel.index()),
                    _ => None,
                })
                .collect();
            for (k, us) in alone.iter().enumerate() {
                assert_eq!(us.is_some(), launched.contains(&k), "{}: kernel {k}", g.name());
                assert!(us.is_none_or(|us| us > 0.0 && us.is_finite()), "{}: kernel {k}: {us:?}", g.name());
            }
            assert_eq!(p.run(&inputs).unwrap(), outs[outs.len() - 1], "{}: a run after time_kernels", g.name());
        }
        assert_eq!(outs[0], outs[1], "{}: graph and eager outputs", g.name());
    }
}
