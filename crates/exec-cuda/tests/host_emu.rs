//! Numbers of generated kernels, checked without a GPU: each plan runs through the host emulator
//! (`common::host`, generated CUDA C compiled as C++20 with a shim) and is compared with a reference written
//! directly from the op's ONNX definition. Skips, printing why, where no host C++ compiler exists.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::needless_range_loop)]

mod common;

use std::collections::HashMap;

use common::host::{compiler, run_plan, HostProgram, HostRegions};
use exec_cuda::codegen;
use graph_plan::ir::op::{ConvAttrs, PadMode, PoolAttrs};
use graph_plan::ir::{synth, ComputeGraph, TensorId};
use graph_plan::{BindingRole, DType, ExecutionPlan, Op, PlanOptions};

fn f(v: &[f32]) -> Vec<u8> {
    common::to_bytes(v)
}

fn seq(n: usize, scale: f32, shift: f32) -> Vec<f32> {
    (0..n).map(|i| ((i * 37 % 23) as f32 - 11.0) * scale + shift).collect()
}

/// Builds the plan (this backend's caps, `streams` streams), fills inputs and weights, runs it on the host and
/// returns every output's bytes.
fn run(test: &str, g: &ComputeGraph, streams: usize, data: &[(&str, Vec<u8>)]) -> Option<HashMap<String, Vec<u8>>> {
    run_caps(test, g, streams, data, codegen::fusion_caps(), None)
}

/// [`run`] with explicit fusion caps; `kernels`: the launch count the plan must have.
fn run_caps(
    test: &str,
    g: &ComputeGraph,
    streams: usize,
    data: &[(&str, Vec<u8>)],
    caps: graph_plan::FusionCaps,
    kernels: Option<usize>,
) -> Option<HashMap<String, Vec<u8>>> {
    let Some(cxx) = compiler() else {
        eprintln!("SKIP {test}: no host C++ compiler (c++, g++ or clang++) to emulate kernels");
        return None;
    };
    let mut opts = PlanOptions::with_streams(streams);
    opts.fusion.caps = caps;
    let plan = ExecutionPlan::build_with(g, &opts).unwrap();
    if let Some(k) = kernels {
        assert_eq!(plan.kernels().len(), k, "{test}: launches");
    }
    graph_plan::verify(&plan).unwrap();
    let mut regions = HostRegions::new(&plan);
    for b in plan.bindings() {
        if let Some(bytes) = &b.data {
            regions.bytes_mut(b.buffer).copy_from_slice(bytes);
        }
        if let Some((_, bytes)) = data.iter().find(|(n, _)| *n == &*b.name) {
            assert_eq!(bytes.len() as u64, b.buffer.bytes, "{test}: size of '{}'", b.name);
            regions.bytes_mut(b.buffer).copy_from_slice(bytes);
        }
    }
    run_plan(cxx, test, &plan, &mut regions);
    Some(
        plan.bindings()
            .iter()
            .filter(|b| b.role == BindingRole::Output)
            .map(|b| (b.name.to_string(), regions.bytes(b.buffer).to_vec()))
            .collect(),
    )
}

fn close(test: &str, got: &[u8], want: &[f32]) {
    let got = common::from_bytes(got);
    assert_eq!(got.len(), want.len(), "{test}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-5 * w.abs().max(1.0),
            "{test}: [{i}] got {g}, want {w}\n got {got:?}\nwant {want:?}"
        );
    }
}

fn node(g: &mut ComputeGraph, name: &str, op: Op, ins: &[TensorId]) -> TensorId {
    g.add_node(name, op, ins).unwrap()[0]
}

/// An attention-style projection `x * w (+ bias)`, its result viewed as `shape` and permuted by `perm` (a head
/// split, or a packed projection's parts): the chain the stored-product tests plan into one cuBLAS kernel.
fn projected_heads(
    g: &mut ComputeGraph,
    name: &str,
    x: TensorId,
    w: TensorId,
    bias: Option<TensorId>,
    shape: Vec<i64>,
    perm: Vec<usize>,
) -> TensorId {
    let mut y = node(g, &format!("{name}.mm"), Op::MatMul, &[x, w]);
    if let Some(b) = bias {
        y = node(g, &format!("{name}.bias"), Op::Add, &[y, b]);
    }
    let r = node(g, &format!("{name}.view"), Op::Reshape { shape, allowzero: false }, &[y]);
    node(g, &format!("{name}.t"), Op::Transpose { perm: Some(perm) }, &[r])
}

#[test]
fn broadcast_chain() {
    let mut g = ComputeGraph::new("t");
    let x = g.add_input("x", DType::F32, [2, 3]).unwrap();
    let b = g.add_input("b", DType::F32, [3]).unwrap();
    let s = node(&mut g, "add", Op::Add, &[x, b]);
    let r = node(&mut g, "relu", Op::Relu, &[s]);
    let y = node(&mut g, "mul", Op::Mul, &[r, x]);
    g.mark_output(y).unwrap();
    let (xv, bv) = (seq(6, 0.5, 0.0), vec![1.0, -2.0, 0.25]);
    let Some(out) = run("broadcast_chain", &g, 1, &[("x", f(&xv)), ("b", f(&bv))]) else { return };
    let want: Vec<f32> = (0..6).map(|i| (xv[i] + bv[i % 3]).max(0.0) * xv[i]).collect();
    close("broadcast_chain", &out[&*g.tensor(y).name], &want);
}

#[test]
fn transpose_slice_pad() {
    let mut g = ComputeGraph::new("t");
    let x = g.add_input("x", DType::F32, [2, 3, 4]).unwrap();
    let t = node(&mut g, "tr", Op::Transpose { perm: Some(vec![2, 0, 1]) }, &[x]);
    let m = g.add_input("m", DType::F32, [5, 6]).unwrap();
    let s = node(
        &mut g,
        "sl",
        Op::Slice { starts: vec![4, 1], ends: vec![0, 6], axes: Some(vec![0, 1]), steps: Some(vec![-2, 2]) },
        &[m],
    );
    let p = g.add_input("p", DType::F32, [2, 3]).unwrap();
    let pads = vec![1, 2, 0, 1];
    let pc = node(&mut g, "pc", Op::Pad { pads: pads.clone(), mode: PadMode::Constant, value: 9.0 }, &[p]);
    let pe = node(&mut g, "pe", Op::Pad { pads: pads.clone(), mode: PadMode::Edge, value: 0.0 }, &[p]);
    let pr = node(&mut g, "pr", Op::Pad { pads, mode: PadMode::Reflect, value: 0.0 }, &[p]);
    for o in [t, s, pc, pe, pr] {
        g.mark_output(o).unwrap();
    }
    let (xv, mv, pv) = (seq(24, 1.0, 0.0), seq(30, 1.0, 0.5), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let Some(out) = run("transpose_slice_pad", &g, 2, &[("x", f(&xv)), ("m", f(&mv)), ("p", f(&pv))]) else { return };
    let mut want = Vec::new();
    for a in 0..4 {
        for b in 0..2 {
            for c in 0..3 {
                want.push(xv[b * 12 + c * 4 + a]);
            }
        }
    }
    close("transpose", &out[&*g.tensor(t).name], &want);
    let want: Vec<f32> = [4usize, 2].iter().flat_map(|&r| [1usize, 3, 5].map(|c| mv[r * 6 + c])).collect();
    close("slice", &out[&*g.tensor(s).name], &want);
    // Output [3, 6]: rows -1..2 of p, columns -2..4.
    let pad_ref = |mode: &str| -> Vec<f32> {
        let mut v = Vec::new();
        for r in -1i64..2 {
            for c in -2i64..4 {
                let inside = (0..2).contains(&r) && (0..3).contains(&c);
                let (rr, cc) = match mode {
                    "edge" => (r.clamp(0, 1), c.clamp(0, 2)),
                    "reflect" => (
                        r.abs().min(2 - r.abs()),
                        if c < 0 {
                            -c
                        } else if c > 2 {
                            4 - c
                        } else {
                            c
                        },
                    ),
                    _ => (r, c),
                };
                v.push(if mode == "constant" && !inside { 9.0 } else { pv[(rr * 3 + cc) as usize] });
            }
        }
        v
    };
    close("pad constant", &out[&*g.tensor(pc).name], &pad_ref("constant"));
    close("pad edge", &out[&*g.tensor(pe).name], &pad_ref("edge"));
    close("pad reflect", &out[&*g.tensor(pr).name], &pad_ref("reflect"));
}

#[test]
fn concat_split_gather() {
    let mut g = ComputeGraph::new("t");
    let a = g.add_input("a", DType::F32, [2, 2]).unwrap();
    let b = g.add_input("b", DType::F32, [2, 3]).unwrap();
    let c = node(&mut g, "cat", Op::Concat { axis: 1 }, &[a, b]);
    let parts = g.add_node("split", Op::Split { axis: 1, splits: vec![1, 4] }, &[c]).unwrap();
    let d = g.add_input("d", DType::F32, [3, 4]).unwrap();
    let idx = g.add_input("idx", DType::I64, [2]).unwrap();
    let ga = node(&mut g, "gather", Op::Gather { axis: 1 }, &[d, idx]);
    for o in [c, parts[0], parts[1], ga] {
        g.mark_output(o).unwrap();
    }
    let (av, bv, dv) = (vec![1.0, 2.0, 3.0, 4.0], vec![5.0, 6.0, 7.0, 8.0, 9.0, 10.0], seq(12, 1.0, 0.0));
    let iv: Vec<u8> = [-1i64, 1].iter().flat_map(|v| v.to_le_bytes()).collect();
    let Some(out) = run("concat_split_gather", &g, 1, &[("a", f(&av)), ("b", f(&bv)), ("d", f(&dv)), ("idx", iv)])
    else {
        return;
    };
    close("concat", &out[&*g.tensor(c).name], &[1.0, 2.0, 5.0, 6.0, 7.0, 3.0, 4.0, 8.0, 9.0, 10.0]);
    close("split0", &out[&*g.tensor(parts[0]).name], &[1.0, 3.0]);
    close("split1", &out[&*g.tensor(parts[1]).name], &[2.0, 5.0, 6.0, 7.0, 4.0, 8.0, 9.0, 10.0]);
    let want: Vec<f32> = (0..3).flat_map(|r| [dv[r * 4 + 3], dv[r * 4 + 1]]).collect();
    close("gather", &out[&*g.tensor(ga).name], &want);
}

#[test]
fn grouped_strided_conv_and_pools() {
    let mut g = ComputeGraph::new("t");
    let x = g.add_input("x", DType::F32, [1, 4, 5, 5]).unwrap();
    let w = g.add_input("w", DType::F32, [4, 2, 3, 3]).unwrap();
    let bias = g.add_input("bias", DType::F32, [4]).unwrap();
    let conv = ConvAttrs { strides: vec![2, 2], pads: vec![1, 1, 1, 1], dilations: vec![], group: 2 };
    let y = node(&mut g, "conv", Op::Conv(conv), &[x, w, bias]);
    let p = g.add_input("p", DType::F32, [1, 1, 4, 4]).unwrap();
    let mp = node(
        &mut g,
        "mp",
        Op::MaxPool(PoolAttrs { kernel_shape: vec![2, 2], strides: vec![2, 2], ..Default::default() }),
        &[p],
    );
    let avg = |inc: bool| PoolAttrs {
        kernel_shape: vec![3, 3],
        pads: vec![1, 1, 1, 1],
        count_include_pad: inc,
        ..Default::default()
    };
    let a0 = node(&mut g, "a0", Op::AveragePool(avg(false)), &[p]);
    let a1 = node(&mut g, "a1", Op::AveragePool(avg(true)), &[p]);
    for o in [y, mp, a0, a1] {
        g.mark_output(o).unwrap();
    }
    let (xv, wv, bv, pv) = (seq(100, 0.1, 0.0), seq(72, 0.05, 0.01), vec![0.5, -0.5, 1.0, 0.0], seq(16, 1.0, 0.0));
    let Some(out) = run("conv_pools", &g, 1, &[("x", f(&xv)), ("w", f(&wv)), ("bias", f(&bv)), ("p", f(&pv))]) else {
        return;
    };
    let mut want = vec![0.0f32; 4 * 9];
    for m in 0..4 {
        let grp = m / 2;
        for oy in 0..3 {
            for ox in 0..3 {
                let mut acc = 0.0f32;
                for c in 0..2 {
                    for ky in 0..3 {
                        for kx in 0..3 {
                            let (iy, ix) = (oy as i64 * 2 - 1 + ky as i64, ox as i64 * 2 - 1 + kx as i64);
                            if (0..5).contains(&iy) && (0..5).contains(&ix) {
                                let xi = (grp * 2 + c) * 25 + iy as usize * 5 + ix as usize;
                                acc += xv[xi] * wv[m * 18 + c * 9 + ky * 3 + kx];
                            }
                        }
                    }
                }
                want[m * 9 + oy * 3 + ox] = acc + bv[m];
            }
        }
    }
    close("conv", &out[&*g.tensor(y).name], &want);
    let want: Vec<f32> = (0..2)
        .flat_map(|oy| (0..2).map(move |ox| (oy, ox)))
        .map(|(oy, ox)| {
            let v = [pv[oy * 8 + ox * 2], pv[oy * 8 + ox * 2 + 1], pv[oy * 8 + 4 + ox * 2], pv[oy * 8 + 5 + ox * 2]];
            v.into_iter().fold(f32::NEG_INFINITY, f32::max)
        })
        .collect();
    close("maxpool", &out[&*g.tensor(mp).name], &want);
    for (t, inc) in [(a0, false), (a1, true)] {
        let mut want = Vec::new();
        for oy in 0..4i64 {
            for ox in 0..4i64 {
                let (mut s, mut n) = (0.0f32, 0);
                for iy in oy - 1..=oy + 1 {
                    for ix in ox - 1..=ox + 1 {
                        if (0..4).contains(&iy) && (0..4).contains(&ix) {
                            s += pv[(iy * 4 + ix) as usize];
                            n += 1;
                        }
                    }
                }
                want.push(if inc { s / 9.0 } else { s / n as f32 });
            }
        }
        close(if inc { "avgpool incl" } else { "avgpool excl" }, &out[&*g.tensor(t).name], &want);
    }
}

/// Pointwise Convs (1x1, unit stride, no padding, one group) run as cuBLAS products over the images, the weight
/// shared: with a bias and a Relu in the epilogue, and bare; two images, against a direct loop.
#[test]
fn pointwise_convs_run_as_products() {
    let mut g = ComputeGraph::new("pointwise");
    let x = g.add_input("x", DType::F32, [2, 6, 3, 4]).unwrap();
    let w0 = g.add_input("w0", DType::F32, [5, 6, 1, 1]).unwrap();
    let b0 = g.add_input("b0", DType::F32, [5]).unwrap();
    let w1 = g.add_input("w1", DType::F32, [3, 6, 1, 1]).unwrap();
    let unit = ConvAttrs { strides: vec![1, 1], pads: vec![0; 4], dilations: vec![], group: 1 };
    let y0 = node(&mut g, "conv0", Op::Conv(unit.clone()), &[x, w0, b0]);
    let r0 = node(&mut g, "relu0", Op::Relu, &[y0]);
    let y1 = node(&mut g, "conv1", Op::Conv(unit), &[x, w1]);
    g.mark_output(r0).unwrap();
    g.mark_output(y1).unwrap();
    let mut opts = PlanOptions::with_streams(1);
    opts.fusion.caps = codegen::fusion_caps();
    let plan = ExecutionPlan::build_with(&g, &opts).unwrap();
    graph_plan::verify(&plan).unwrap();
    let sources = codegen::generate_all(&plan).unwrap();
    let products: Vec<_> = sources.iter().flat_map(|s| &s.blas).collect();
    assert_eq!(products.len(), 2, "both convs are cuBLAS products");
    for p in &products {
        assert_eq!((p.matmul.batch, p.matmul.n, p.matmul.k, p.matmul.stride_a), (2, 12, 6, 0));
    }
    let (xv, wv0, bv, wv1) = (seq(144, 0.1, 0.05), seq(30, 0.2, 0.0), seq(5, 0.3, 0.1), seq(18, 0.15, -0.02));
    let data = [("x", f(&xv)), ("w0", f(&wv0)), ("b0", f(&bv)), ("w1", f(&wv1))];
    let Some(out) = run("pointwise", &g, 1, &data) else {
        return;
    };
    let conv = |w: &[f32], cout: usize, bias: Option<&[f32]>, relu: bool| -> Vec<f32> {
        let mut y = vec![0.0f32; 2 * cout * 12];
        for n in 0..2 {
            for m in 0..cout {
                for p in 0..12 {
                    let acc: f32 = (0..6).map(|c| w[m * 6 + c] * xv[(n * 6 + c) * 12 + p]).sum::<f32>()
                        + bias.map_or(0.0, |b| b[m]);
                    y[(n * cout + m) * 12 + p] = if relu { acc.max(0.0) } else { acc };
                }
            }
        }
        y
    };
    close("conv0", &out[&*g.tensor(r0).name], &conv(&wv0, 5, Some(&bv), true));
    close("conv1", &out[&*g.tensor(y1).name], &conv(&wv1, 3, None, false));
}

#[test]
fn row_kernels() {
    let mut g = ComputeGraph::new("t");
    let x = g.add_input("x", DType::F32, [3, 40]).unwrap();
    let sc = g.add_input("sc", DType::F32, [40]).unwrap();
    let bi = g.add_input("bi", DType::F32, [40]).unwrap();
    let sm = node(&mut g, "softmax", Op::Softmax { axis: 1 }, &[x]);
    let ln = node(&mut g, "ln", Op::LayerNormalization { axis: -1, epsilon: 1e-5 }, &[x, sc, bi]);
    let rs = node(&mut g, "rsum", Op::ReduceSum { axes: Some(vec![0]), keepdims: false }, &[x]);
    let rm = node(&mut g, "rmean", Op::ReduceMean { axes: Some(vec![1]), keepdims: true }, &[x]);
    let rx = node(&mut g, "rmax", Op::ReduceMax { axes: None, keepdims: false }, &[x]);
    let t = g.add_input("t", DType::F32, [2, 3, 2, 2]).unwrap();
    let gap = node(&mut g, "gap", Op::GlobalAveragePool, &[t]);
    for o in [sm, ln, rs, rm, rx, gap] {
        g.mark_output(o).unwrap();
    }
    let (xv, sv, bv, tv) = (seq(120, 0.1, 0.3), seq(40, 0.02, 1.0), seq(40, 0.01, 0.0), seq(24, 1.0, 0.0));
    let Some(out) = run("row_kernels", &g, 2, &[("x", f(&xv)), ("sc", f(&sv)), ("bi", f(&bv)), ("t", f(&tv))]) else {
        return;
    };
    let row = |r: usize| &xv[r * 40..(r + 1) * 40];
    let mut want = Vec::new();
    for r in 0..3 {
        let m = row(r).iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let s: f32 = row(r).iter().map(|v| (v - m).exp()).sum();
        want.extend(row(r).iter().map(|v| (v - m).exp() / s));
    }
    close("softmax", &out[&*g.tensor(sm).name], &want);
    let mut want = Vec::new();
    for r in 0..3 {
        let mean: f32 = row(r).iter().sum::<f32>() / 40.0;
        let var: f32 = row(r).iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / 40.0;
        want.extend(row(r).iter().enumerate().map(|(j, v)| (v - mean) / (var + 1e-5).sqrt() * sv[j] + bv[j]));
    }
    close("layernorm", &out[&*g.tensor(ln).name], &want);
    let want: Vec<f32> = (0..40).map(|j| xv[j] + xv[40 + j] + xv[80 + j]).collect();
    close("reducesum", &out[&*g.tensor(rs).name], &want);
    let want: Vec<f32> = (0..3).map(|r| row(r).iter().sum::<f32>() / 40.0).collect();
    close("reducemean", &out[&*g.tensor(rm).name], &want);
    close("reducemax", &out[&*g.tensor(rx).name], &[xv.iter().copied().fold(f32::NEG_INFINITY, f32::max)]);
    let want: Vec<f32> = (0..6).map(|c| tv[c * 4..c * 4 + 4].iter().sum::<f32>() / 4.0).collect();
    close("globalaveragepool", &out[&*g.tensor(gap).name], &want);
}

#[test]
fn matmuls_cublas_path_and_fallback() {
    let mut g = ComputeGraph::new("t");
    let a = g.add_input("a", DType::F32, [2, 1, 3, 4]).unwrap();
    let b = g.add_input("b", DType::F32, [1, 2, 4, 5]).unwrap();
    let bc = node(&mut g, "bcast_mm", Op::MatMul, &[a, b]);
    let m = g.add_input("m", DType::F32, [3, 4]).unwrap();
    let v = g.add_input("v", DType::F32, [4]).unwrap();
    let mv = node(&mut g, "matvec", Op::MatMul, &[m, v]);
    let ga = g.add_input("ga", DType::F32, [4, 3]).unwrap();
    let gb = g.add_input("gb", DType::F32, [4, 5]).unwrap();
    let gc = g.add_input("gc", DType::F32, [5]).unwrap();
    let gm = node(&mut g, "gemm", Op::Gemm { alpha: 0.5, beta: 2.0, trans_a: true, trans_b: false }, &[ga, gb, gc]);
    for o in [bc, mv, gm] {
        g.mark_output(o).unwrap();
    }
    let (av, bv, mvv, vv) = (seq(24, 0.1, 0.0), seq(40, 0.1, 0.2), seq(12, 1.0, 0.0), vec![1.0, -1.0, 0.5, 2.0]);
    let (gav, gbv, gcv) = (seq(12, 0.1, 0.0), seq(20, 0.1, 0.0), vec![1.0, 2.0, 3.0, 4.0, 5.0]);
    let data = [
        ("a", f(&av)),
        ("b", f(&bv)),
        ("m", f(&mvv)),
        ("v", f(&vv)),
        ("ga", f(&gav)),
        ("gb", f(&gbv)),
        ("gc", f(&gcv)),
    ];
    let Some(out) = run("matmuls", &g, 1, &data) else { return };
    let mut want = Vec::new();
    for p in 0..2 {
        for q in 0..2 {
            for i in 0..3 {
                for j in 0..5 {
                    want.push((0..4).map(|l| av[p * 12 + i * 4 + l] * bv[q * 20 + l * 5 + j]).sum::<f32>());
                }
            }
        }
    }
    close("broadcast matmul", &out[&*g.tensor(bc).name], &want);
    let want: Vec<f32> = (0..3).map(|i| (0..4).map(|l| mvv[i * 4 + l] * vv[l]).sum()).collect();
    close("matvec", &out[&*g.tensor(mv).name], &want);
    let mut want = Vec::new();
    for i in 0..3 {
        for j in 0..5 {
            let acc: f32 = (0..4).map(|l| gav[l * 3 + i] * gbv[l * 5 + j]).sum();
            want.push(0.5 * acc + 2.0 * gcv[j]);
        }
    }
    close("gemm (cuBLAS + epilogue)", &out[&*g.tensor(gm).name], &want);
}

#[test]
fn permuted_epilogues_write_the_permuted_layout() {
    // With `layout_epilogue` on, a projection + bias + head split [1,4,8] -> [1,2,4,4] and a square product +
    // bias + transpose are one kernel each; the square one must not run its epilogue in place over the cuBLAS
    // product (a thread would read an element another thread already rewrote).
    let mut g = ComputeGraph::new("perm");
    let x = g.add_input("x", DType::F32, [1, 4, 8]).unwrap();
    let w = g.add_input("w", DType::F32, [8, 8]).unwrap();
    let b = g.add_input("b", DType::F32, [8]).unwrap();
    let t = projected_heads(&mut g, "proj", x, w, Some(b), vec![1, 4, 2, 4], vec![0, 2, 1, 3]);
    let s = g.add_input("s", DType::F32, [4, 4]).unwrap();
    let sq = node(&mut g, "square", Op::MatMul, &[s, s]);
    let c = g.add_input("c", DType::F32, [4]).unwrap();
    let sb = node(&mut g, "sq_bias", Op::Add, &[sq, c]);
    let st = node(&mut g, "sq_t", Op::Transpose { perm: Some(vec![1, 0]) }, &[sb]);
    g.mark_output(t).unwrap();
    g.mark_output(st).unwrap();
    let (xv, wv, bv, sv, cv) =
        (seq(32, 0.1, 0.0), seq(64, 0.05, 0.1), seq(8, 0.3, 0.0), seq(16, 0.2, -0.1), vec![1.0, 2.0, 3.0, 4.0]);
    let data = [("x", f(&xv)), ("w", f(&wv)), ("b", f(&bv)), ("s", f(&sv)), ("c", f(&cv))];
    let caps = graph_plan::FusionCaps { layout_epilogue: true, ..codegen::fusion_caps() };
    let Some(out) = run_caps("permuted epilogues", &g, 1, &data, caps.clone(), Some(2)) else { return };
    // y[s, n] = x[s,:] . w[:, n] + b[n]; out[h, s, d] = y[s, h * 4 + d].
    let mut want = vec![0f32; 32];
    for h in 0..2 {
        for si in 0..4 {
            for d in 0..4 {
                let n = h * 4 + d;
                let acc: f32 = (0..8).map(|k| xv[si * 8 + k] * wv[k * 8 + n]).sum();
                want[(h * 4 + si) * 4 + d] = acc + bv[n];
            }
        }
    }
    close("head split", &out[&*g.tensor(t).name], &want);
    let mut want = vec![0f32; 16];
    for i in 0..4 {
        for j in 0..4 {
            let acc: f32 = (0..4).map(|k| sv[i * 4 + k] * sv[k * 4 + j]).sum();
            want[j * 4 + i] = acc + cv[j];
        }
    }
    close("square transpose", &out[&*g.tensor(st).name], &want);
    // Both products are cuBLAS calls that store straight into the permuted outputs.
    let plan =
        ExecutionPlan::build_with(&g, &PlanOptions { fusion: opts_caps(caps), ..PlanOptions::default() }).unwrap();
    graph_plan::verify(&plan).unwrap();
    let stored =
        codegen::generate_all(&plan).unwrap().iter().filter(|s| s.blas.iter().any(|b| b.store.is_some())).count();
    assert_eq!(stored, 2);
}

fn opts_caps(caps: graph_plan::FusionCaps) -> graph_plan::FusionOptions {
    graph_plan::FusionOptions { caps, ..graph_plan::FusionOptions::default() }
}

#[test]
fn projections_store_their_heads_through_cublas() {
    // Batch 2: a query projection + bias split into heads [2,4,8] -> [2,2,4,4] then a Relu, and a key projection
    // + bias split and transposed for the scores [2,2,4,4] (d before s). Each is one kernel: cuBLAS calls (one per
    // image, batched over the heads) store the product into the permuted output, the epilogue adds the bias there.
    let mut g = ComputeGraph::new("heads");
    let x = g.add_input("x", DType::F32, [2, 4, 8]).unwrap();
    let wq = g.add_input("wq", DType::F32, [8, 8]).unwrap();
    let wk = g.add_input("wk", DType::F32, [8, 8]).unwrap();
    let b = g.add_input("b", DType::F32, [8]).unwrap();
    let q = projected_heads(&mut g, "q", x, wq, Some(b), vec![2, 4, 2, 4], vec![0, 2, 1, 3]);
    let k = projected_heads(&mut g, "k", x, wk, Some(b), vec![2, 4, 2, 4], vec![0, 2, 3, 1]);
    let q = node(&mut g, "q.relu", Op::Relu, &[q]);
    // A value projection without a bias: the stored product is the output, nothing to launch after cuBLAS.
    let wv = g.add_input("wv", DType::F32, [8, 8]).unwrap();
    let v = projected_heads(&mut g, "v", x, wv, None, vec![2, 4, 2, 4], vec![0, 2, 1, 3]);
    g.mark_output(q).unwrap();
    g.mark_output(k).unwrap();
    g.mark_output(v).unwrap();
    let (xv, wqv, wkv, bv) = (seq(64, 0.1, 0.0), seq(64, 0.05, 0.1), seq(64, 0.07, -0.1), seq(8, 0.3, 0.0));
    let wvv = seq(64, 0.03, 0.2);
    let data = [("x", f(&xv)), ("wq", f(&wqv)), ("wk", f(&wkv)), ("b", f(&bv)), ("wv", f(&wvv))];
    let caps = codegen::fusion_caps();
    let plan =
        ExecutionPlan::build_with(&g, &PlanOptions { fusion: opts_caps(caps.clone()), ..PlanOptions::default() })
            .unwrap();
    graph_plan::verify(&plan).unwrap();
    let sources = codegen::generate_all(&plan).unwrap();
    let calls: Vec<usize> =
        sources.iter().flat_map(|s| &s.blas).filter(|b| b.store.is_some()).map(|b| b.call_count()).collect();
    assert_eq!(calls, vec![2, 2, 2], "one stored product per projection, a call per image");
    // The executor enqueues each projection's two calls (one per image, a strided batch over the heads each) as
    // one pointer-array call over its four matrices; the emulator below runs exactly those.
    let launches: Vec<(usize, usize)> = sources
        .iter()
        .filter(|s| !s.blas.is_empty())
        .map(|s| {
            let l = codegen::gemm_launches(&s.blas);
            (l.len(), l.iter().map(codegen::GemmLaunch::products).sum())
        })
        .collect();
    assert_eq!(launches, vec![(1, 4); 3], "one cuBLAS call per projection, over 2 images x 2 heads");
    let launched = sources.iter().filter(|s| s.launch != codegen::Launch::None).count();
    assert_eq!(launched, 2, "the bias-free projection launches no epilogue");
    let Some(out) = run_caps("heads", &g, 1, &data, caps, Some(3)) else { return };
    let y = |w: &[f32], bi: usize, si: usize, n: usize| -> f32 {
        (0..8).map(|l| xv[(bi * 4 + si) * 8 + l] * w[l * 8 + n]).sum::<f32>() + bv[n]
    };
    let (mut wq_out, mut wk_out) = (vec![0f32; 64], vec![0f32; 64]);
    for bi in 0..2 {
        for h in 0..2 {
            for si in 0..4 {
                for d in 0..4 {
                    let n = h * 4 + d;
                    wq_out[((bi * 2 + h) * 4 + si) * 4 + d] = y(&wqv, bi, si, n).max(0.0);
                    wk_out[((bi * 2 + h) * 4 + d) * 4 + si] = y(&wkv, bi, si, n);
                }
            }
        }
    }
    close("query heads", &out[&*g.tensor(q).name], &wq_out);
    close("key heads", &out[&*g.tensor(k).name], &wk_out);
    let mut wv_out = vec![0f32; 64];
    for bi in 0..2 {
        for h in 0..2 {
            for si in 0..4 {
                for d in 0..4 {
                    let n = h * 4 + d;
                    wv_out[((bi * 2 + h) * 4 + si) * 4 + d] =
                        (0..8).map(|l| xv[(bi * 4 + si) * 8 + l] * wvv[l * 8 + n]).sum();
                }
            }
        }
    }
    close("value heads", &out[&*g.tensor(v).name], &wv_out);
}

#[test]
fn packed_qkv_stores_every_part_through_cublas() {
    // A vision transformer's packed projection at batch 2: x [2,4,6] * w [6,24] + b, Reshape [2,4,3,2,4] (part,
    // head, d), Transpose (2,0,3,1,4) -> [3,2,2,4,4]. One kernel: cuBLAS calls over the parts, heads and images
    // store the product into the permuted output, the bias is added there.
    let mut g = ComputeGraph::new("qkv");
    let x = g.add_input("x", DType::F32, [2, 4, 6]).unwrap();
    let w = g.add_input("w", DType::F32, [6, 24]).unwrap();
    let b = g.add_input("b", DType::F32, [24]).unwrap();
    let t = projected_heads(&mut g, "qkv", x, w, Some(b), vec![2, 4, 3, 2, 4], vec![2, 0, 3, 1, 4]);
    g.mark_output(t).unwrap();
    let (xv, wv, bv) = (seq(48, 0.1, 0.0), seq(144, 0.05, 0.1), seq(24, 0.3, 0.0));
    let data = [("x", f(&xv)), ("w", f(&wv)), ("b", f(&bv))];
    let caps = codegen::fusion_caps();
    let plan =
        ExecutionPlan::build_with(&g, &PlanOptions { fusion: opts_caps(caps.clone()), ..PlanOptions::default() })
            .unwrap();
    graph_plan::verify(&plan).unwrap();
    let sources = codegen::generate_all(&plan).unwrap();
    let store = sources.iter().flat_map(|s| &s.blas).find_map(|b| b.store).expect("a stored product");
    assert_eq!(store.gemm.batch * store.calls(), 12, "3 parts x 2 heads x 2 images");
    let launches: Vec<codegen::GemmLaunch> = sources.iter().flat_map(|s| codegen::gemm_launches(&s.blas)).collect();
    assert!(
        matches!(launches.as_slice(), [codegen::GemmLaunch::Pointers { operands, .. }] if operands.len() == 12),
        "the loops of calls are one pointer-array call over all 12 matrices: {launches:?}"
    );
    let Some(out) = run_caps("qkv", &g, 1, &data, caps, Some(1)) else { return };
    let mut want = vec![0f32; 192];
    for bi in 0..2 {
        for si in 0..4 {
            for part in 0..3 {
                for h in 0..2 {
                    for d in 0..4 {
                        let n = (part * 2 + h) * 4 + d;
                        let acc: f32 = (0..6).map(|l| xv[(bi * 4 + si) * 6 + l] * wv[l * 24 + n]).sum();
                        want[(((part * 2 + bi) * 2 + h) * 4 + si) * 4 + d] = acc + bv[n];
                    }
                }
            }
        }
    }
    close("packed qkv", &out[&*g.tensor(t).name], &want);
}

/// Selection epilogues (`caps.select_epilogue`, on in this backend's caps): a ViT's packed projection
/// `[B,N,3E] -> [B,N,3,H,D] -> (2,0,3,1,4)` unbound by a Split + Squeezes or by Gathers at constant indices, the
/// query scaled; GPT-2's last-axis Split with each part's head split. cuBLAS stores each part into its own output
/// (one pointer-array call over parts, heads and images) and one epilogue kernel adds the bias in place. A key
/// placed unlike the other parts keeps the per-element product; one token of six is one row per image. Against
/// the reference plans, at batch 1 and 2.
#[test]
fn packed_parts_store_into_their_own_outputs() {
    let vit = |batch: usize, gather: bool| {
        let (n, heads, d) = (5usize, 2usize, 4usize);
        let e = heads * d;
        let mut g = ComputeGraph::new(format!("vit_b{batch}_{}", if gather { "gather" } else { "split" }));
        let x = g.add_input("x", DType::F32, [batch, n, e]).unwrap();
        let w = g.add_weight("w", DType::F32, [e, 3 * e]).unwrap();
        let b = g.add_weight("b", DType::F32, [3 * e]).unwrap();
        let shape = [batch, n, 3, heads, d].map(|v| v as i64).to_vec();
        let t = projected_heads(&mut g, "qkv", x, w, Some(b), shape, vec![2, 0, 3, 1, 4]);
        let parts: Vec<TensorId> = if gather {
            (0..3i64)
                .map(|i| {
                    let idx = g.add_constant(&format!("i{i}"), DType::I64, [], i.to_le_bytes().to_vec()).unwrap();
                    node(&mut g, &format!("part{i}"), Op::Gather { axis: 0 }, &[t, idx])
                })
                .collect()
        } else {
            let outs = g.add_node("split", Op::Split { axis: 0, splits: vec![1, 1, 1] }, &[t]).unwrap();
            outs.iter()
                .enumerate()
                .map(|(i, &o)| node(&mut g, &format!("part{i}"), Op::Squeeze { axes: Some(vec![0]) }, &[o]))
                .collect()
        };
        let c = g.add_constant_f32("scale", [], &[0.5]).unwrap();
        let q = node(&mut g, "q", Op::Mul, &[parts[0], c]);
        for o in [q, parts[1], parts[2]] {
            g.mark_output(o).unwrap();
        }
        g
    };
    // GPT-2: the packed product split on its last axis, each part then split into heads ([B,S,H,D] ->
    // (0,2,1,3)) on its own.
    let gpt2 = |batch: usize, kt: bool| {
        let (n, heads, d) = (5usize, 2usize, 4usize);
        let e = heads * d;
        let mut g = ComputeGraph::new(format!("gpt2_b{batch}{}", if kt { "_kt" } else { "" }));
        let x = g.add_input("x", DType::F32, [batch, n, e]).unwrap();
        let w = g.add_weight("w", DType::F32, [e, 3 * e]).unwrap();
        let b = g.add_weight("b", DType::F32, [3 * e]).unwrap();
        let y = node(&mut g, "qkv", Op::MatMul, &[x, w]);
        let y = node(&mut g, "qkv.bias", Op::Add, &[y, b]);
        let outs = g.add_node("split", Op::Split { axis: 2, splits: vec![e, e, e] }, &[y]).unwrap();
        for (i, &o) in outs.iter().enumerate() {
            let shape = [batch, n, heads, d].map(|v| v as i64).to_vec();
            let v = node(&mut g, &format!("view{i}"), Op::Reshape { shape, allowzero: false }, &[o]);
            // With `kt` the key's heads are transposed as well: parts placed differently, no common store.
            let perm = if kt && i == 1 { vec![0, 2, 3, 1] } else { vec![0, 2, 1, 3] };
            let t = node(&mut g, &format!("heads{i}"), Op::Transpose { perm: Some(perm) }, &[v]);
            g.mark_output(t).unwrap();
        }
        g
    };
    let mut graphs: Vec<ComputeGraph> =
        [(1, false), (2, false), (1, true), (2, true)].map(|(b, gt)| vit(b, gt)).to_vec();
    graphs.extend([gpt2(1, false), gpt2(2, false), gpt2(1, true)]);
    // One token of six selected from a product with its bias (batch 2): cuBLAS computes that row only.
    let mut tok = ComputeGraph::new("token");
    let x = tok.add_input("x", DType::F32, [2, 6, 8]).unwrap();
    let w = tok.add_weight("w", DType::F32, [8, 8]).unwrap();
    let b = tok.add_weight("b", DType::F32, [8]).unwrap();
    let y = node(&mut tok, "mm", Op::MatMul, &[x, w]);
    let y = node(&mut tok, "bias", Op::Add, &[y, b]);
    let two = tok.add_constant("two", DType::I64, [], 2i64.to_le_bytes().to_vec()).unwrap();
    let t = node(&mut tok, "pick", Op::Gather { axis: 1 }, &[y, two]);
    tok.mark_output(t).unwrap();
    graphs.push(tok);
    let mut optimised = PlanOptions::with_streams(1);
    optimised.fusion.caps = codegen::fusion_caps();
    let Some(runs) = differential("packed_parts_store_into_their_own_outputs", &graphs, &optimised, 1e-5) else {
        return;
    };
    for r in runs.iter().filter(|r| r.tag == "opt") {
        assert_eq!(r.plan.kernels().len(), 1, "{}: one kernel\n{}", r.graph, r.plan);
        let src = &r.sources[0];
        if r.graph == "token" {
            let [step] = src.blas.as_slice() else { panic!("{:?}", src.blas) };
            let parts = step.parts.expect("parts");
            assert_eq!((parts.count, parts.buffer(2).is_some()), (1, true));
            // Row 2 of each image: one matrix per image, in one pointer-array call (or one strided call).
            let products: usize = codegen::gemm_launches(&src.blas).iter().map(codegen::GemmLaunch::products).sum();
            assert_eq!(products, 2);
            continue;
        }
        if r.graph.ends_with("_kt") {
            // The per-element kernel computes the product and every part (checked above against the reference).
            assert!(src.blas.is_empty(), "{}: {:?}", r.graph, src.blas);
            continue;
        }
        let [step] = src.blas.as_slice() else { panic!("{}: {:?}", r.graph, src.blas) };
        let parts = step.parts.expect("parts");
        assert_eq!(parts.count, 3, "{}", r.graph);
        assert!((0..3).all(|p| parts.buffer(p).is_some()), "{}", r.graph);
        // Parts x heads x images matrices in one pointer-array call; the bias and scale in one launch.
        let launches = codegen::gemm_launches(&src.blas);
        let batch = if r.graph.contains("_b2") { 2 } else { 1 };
        assert_eq!(launches.len(), 1, "{}: {launches:?}", r.graph);
        assert_eq!(launches[0].products(), 3 * 2 * batch, "{}", r.graph);
        assert_ne!(src.launch, codegen::Launch::None);
    }
}

/// Row selections (`caps.select_rows`): a ViT's class token after the final LayerNorm, and a row picked from the
/// middle of a batch with a negative index, both written by the blocks of the selected rows of the row kernel,
/// beside a full output of the same kernel. Against the reference plans.
#[test]
fn row_kernels_write_their_selected_rows() {
    let mut g = ComputeGraph::new("cls_token");
    let x = g.add_input("x", DType::F32, [2, 5, 8]).unwrap();
    let gamma = g.add_weight("gamma", DType::F32, [8]).unwrap();
    let beta = g.add_weight("beta", DType::F32, [8]).unwrap();
    let r = node(&mut g, "relu", Op::Relu, &[x]);
    let ln = node(&mut g, "ln", Op::LayerNormalization { axis: -1, epsilon: 1e-5 }, &[r, gamma, beta]);
    let zero = g.add_constant("zero", DType::I64, [], 0i64.to_le_bytes().to_vec()).unwrap();
    let cls = node(&mut g, "cls", Op::Gather { axis: 1 }, &[ln, zero]);
    g.mark_output(cls).unwrap();
    let mut h = ComputeGraph::new("picked_row");
    let x = h.add_input("x", DType::F32, [3, 4, 6]).unwrap();
    let sm = node(&mut h, "softmax", Op::Softmax { axis: -1 }, &[x]);
    let last = h.add_constant("last", DType::I64, [], (-1i64).to_le_bytes().to_vec()).unwrap();
    let pick = node(&mut h, "pick", Op::Gather { axis: 0 }, &[sm, last]);
    h.mark_output(pick).unwrap();
    h.mark_output(sm).unwrap();
    // As many selected elements as rows (4 tokens of 4 features): the selection is still no per-row value.
    let mut sq = ComputeGraph::new("square");
    let x = sq.add_input("x", DType::F32, [2, 4, 4]).unwrap();
    let gamma = sq.add_weight("gamma", DType::F32, [4]).unwrap();
    let ln = node(&mut sq, "ln", Op::LayerNormalization { axis: -1, epsilon: 1e-5 }, &[x, gamma]);
    let one = sq.add_constant("one", DType::I64, [], 1i64.to_le_bytes().to_vec()).unwrap();
    let tok = node(&mut sq, "tok", Op::Gather { axis: 1 }, &[ln, one]);
    sq.mark_output(tok).unwrap();
    // A Softmax over a middle axis: the rows are not contiguous; one column selected along the last (kept) axis.
    let mut mid = ComputeGraph::new("middle_axis");
    let x = mid.add_input("x", DType::F32, [2, 5, 3]).unwrap();
    let sm = node(&mut mid, "softmax", Op::Softmax { axis: 1 }, &[x]);
    let one = mid.add_constant("one", DType::I64, [], 1i64.to_le_bytes().to_vec()).unwrap();
    let col = node(&mut mid, "col", Op::Gather { axis: 2 }, &[sm, one]);
    mid.mark_output(col).unwrap();
    let mut optimised = PlanOptions::with_streams(1);
    optimised.fusion.caps = codegen::fusion_caps();
    assert!(optimised.fusion.caps.select_rows);
    let graphs = [g, h, sq, mid];
    let Some(runs) = differential("row_kernels_write_their_selected_rows", &graphs, &optimised, 1e-5) else {
        return;
    };
    for r in runs.iter().filter(|r| r.tag == "opt") {
        assert_eq!(r.plan.kernels().len(), 1, "{}: the selection is in the row kernel\n{}", r.graph, r.plan);
    }
}

#[test]
fn mlp_runs_through_cublas_steps() {
    let g = synth::mlp(2, 8, 3).unwrap();
    let names: Vec<(String, usize)> = g
        .inputs()
        .iter()
        .chain(g.weights())
        .map(|&t| (g.tensor(t).name.to_string(), g.tensor(t).shape.numel().unwrap()))
        .collect();
    let values: HashMap<String, Vec<f32>> =
        names.iter().enumerate().map(|(k, (n, len))| (n.clone(), seq(*len, 0.05, k as f32 * 0.01))).collect();
    let data: Vec<(&str, Vec<u8>)> = names.iter().map(|(n, _)| (n.as_str(), f(&values[n]))).collect();
    let Some(out) = run("mlp", &g, 1, &data) else { return };
    let mut x = values["x"].clone();
    for l in 0..2 {
        let (w, b) = (&values[&format!("l{l}.w")], &values[&format!("l{l}.b")]);
        let mut y = vec![0.0f32; 24];
        for i in 0..3 {
            for j in 0..8 {
                let v = (0..8).map(|k| x[i * 8 + k] * w[k * 8 + j]).sum::<f32>() + b[j];
                y[i * 8 + j] = if l == 0 { v.max(0.0) } else { v };
            }
        }
        x = y;
    }
    close("mlp", &out[&*g.tensor(g.outputs()[0]).name], &x);
}

#[test]
fn casts_and_batchnorm() {
    let mut g = ComputeGraph::new("t");
    let x = g.add_input("x", DType::F32, [2, 3, 2]).unwrap();
    let h = node(&mut g, "to16", Op::Cast { to: DType::F16 }, &[x]);
    let back = node(&mut g, "to32", Op::Cast { to: DType::F32 }, &[h]);
    let i = node(&mut g, "toint", Op::Cast { to: DType::I32 }, &[x]);
    let p: Vec<TensorId> =
        ["s", "bb", "mean", "var"].iter().map(|n| g.add_input(n, DType::F32, [3]).unwrap()).collect();
    let bn = node(&mut g, "bn", Op::BatchNormalization { epsilon: 1e-3 }, &[x, p[0], p[1], p[2], p[3]]);
    for o in [back, i, bn] {
        g.mark_output(o).unwrap();
    }
    let xv = vec![1.0e-4, 0.1, 1.337, -2.5, 65519.0, 3.25159, -0.7, 7.9, -7.9, 100.25, 0.333, -1e-8];
    let (s, bb, mean, var) = (vec![1.0, 2.0, 0.5], vec![0.0, 1.0, -1.0], vec![0.1, -0.2, 0.3], vec![1.0, 0.25, 4.0]);
    let data = [("x", f(&xv)), ("s", f(&s)), ("bb", f(&bb)), ("mean", f(&mean)), ("var", f(&var))];
    let Some(out) = run("casts_bn", &g, 1, &data) else { return };
    let f16_round = |v: f32| graph_plan::exec::f16_to_f32(graph_plan::exec::f32_to_f16(v));
    let got = common::from_bytes(&out[&*g.tensor(back).name]);
    let want: Vec<f32> = xv.iter().map(|&v| f16_round(v)).collect();
    assert_eq!(got, want, "f32 -> f16 -> f32 rounds to nearest even");
    let ints: Vec<i32> =
        out[&*g.tensor(i).name].chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    assert_eq!(ints, xv.iter().map(|&v| v as i32).collect::<Vec<_>>(), "float to int truncates toward zero");
    let want: Vec<f32> = (0..12)
        .map(|k| {
            let c = (k / 2) % 3;
            (xv[k] - mean[c]) / (var[c] + 1e-3).sqrt() * s[c] + bb[c]
        })
        .collect();
    close("batchnorm", &out[&*g.tensor(bn).name], &want);
}

/// Differential: the optimised plan (fusion, reuse, several streams) gives the reference plan's numbers (fusion
/// off, no reuse, one stream) when both run through generated kernels.
#[test]
fn fused_plans_match_reference_plans() {
    let graphs = [
        synth::random_dag(20, 3, 5).unwrap(),
        synth::transformer(1, 8, 2, 4, 1).unwrap(),
        synth::resnet_like(1, 2, 6).unwrap(),
    ];
    let mut optimised = PlanOptions::with_streams(3);
    optimised.fusion.caps = codegen::fusion_caps();
    differential("fused_plans_match_reference_plans", &graphs, &optimised, 1e-4);
}

/// Pool chains (a strided pool whose result a second pool also reads) are one kernel that writes both results,
/// recomputing the first pool over the second's window; max and average (with and without the padding counted),
/// against the reference plan's kernels, one per pool.
#[test]
fn pool_chains_match_reference_plans() {
    let mut graphs = Vec::new();
    for (second_max, include_pad) in [(true, false), (false, false), (false, true)] {
        let mut g = ComputeGraph::new(format!("pool_chain_{second_max}_{include_pad}"));
        let x = g.add_input("x", DType::F32, [1, 3, 9, 11]).unwrap();
        let w = g.add_input("w", DType::F32, [2, 3, 1, 1]).unwrap();
        let down = PoolAttrs { kernel_shape: vec![3, 3], strides: vec![2, 2], pads: vec![1; 4], ..Default::default() };
        let p1 = node(&mut g, "stage_pool", Op::MaxPool(down), &[x]);
        let c = node(&mut g, "conv", Op::Conv(ConvAttrs { group: 1, ..Default::default() }), &[p1, w]);
        let same = PoolAttrs {
            kernel_shape: vec![3, 3],
            strides: vec![1, 1],
            pads: vec![1; 4],
            count_include_pad: include_pad,
            ..Default::default()
        };
        let op = if second_max { Op::MaxPool(same) } else { Op::AveragePool(same) };
        let p2 = node(&mut g, "branch_pool", op, &[p1]);
        g.mark_output(c).unwrap();
        g.mark_output(p2).unwrap();
        graphs.push(g);
    }
    let mut optimised = PlanOptions::with_streams(1);
    optimised.fusion.caps = codegen::fusion_caps();
    for g in &graphs {
        let plan = ExecutionPlan::build_with(g, &optimised).unwrap();
        graph_plan::verify(&plan).unwrap();
        let chained = plan.kernels().iter().filter(|k| k.body.len() == 2).count();
        assert_eq!(chained, 1, "{}: the two pools share a kernel\n{plan}", g.name());
    }
    differential("pool_chains_match_reference_plans", &graphs, &optimised, 1e-6);
}

/// Sibling products (a horizontal GEMM, on in this backend's caps): the Q, K and V projections of a transformer
/// layer are one kernel of three cuBLAS products, each stored where its own output lives (the head splits), and
/// one epilogue kernel; a gated MLP's gate and up projections, whose results combine into one output, are a
/// per-element kernel that computes each product and the epilogue. Both against their reference plans.
#[test]
fn sibling_products_store_through_cublas_or_run_as_generated_kernels() {
    assert!(codegen::fusion_caps().horizontal_gemm);
    let mut mlp = ComputeGraph::new("gated_mlp");
    let x = mlp.add_input("x", DType::F32, [5, 8]).unwrap();
    let w1 = mlp.add_weight("w1", DType::F32, [8, 12]).unwrap();
    let w3 = mlp.add_weight("w3", DType::F32, [8, 12]).unwrap();
    let gate = node(&mut mlp, "gate", Op::MatMul, &[x, w1]);
    let sig = node(&mut mlp, "sig", Op::Sigmoid, &[gate]);
    let silu = node(&mut mlp, "silu", Op::Mul, &[gate, sig]);
    let up = node(&mut mlp, "up", Op::MatMul, &[x, w3]);
    let h = node(&mut mlp, "h", Op::Mul, &[silu, up]);
    mlp.mark_output(h).unwrap();
    let graphs = [synth::transformer(1, 8, 2, 4, 1).unwrap(), mlp];
    let mut optimised = PlanOptions::with_streams(1);
    optimised.fusion.caps = codegen::fusion_caps();
    let mut stored = Vec::new();
    for g in &graphs {
        let plan = ExecutionPlan::build_with(g, &optimised).unwrap();
        graph_plan::verify(&plan).unwrap();
        // Products of anchor kernels (a fused attention kernel's two MatMuls are its own).
        let products = |k: &graph_plan::Kernel| {
            let n = k.body.iter().filter(|i| matches!(i.op, Op::MatMul)).count();
            if k.kind == graph_plan::GroupKind::Attention {
                0
            } else {
                n
            }
        };
        assert!(plan.kernels().iter().any(|k| products(k) >= 2), "{}: no sibling kernel\n{plan}", g.name());
        for k in plan.kernels().iter().filter(|k| products(k) >= 2) {
            let src = codegen::generate(k).unwrap();
            // The query and value heads are stored with one shape: one pointer-array cuBLAS call computes both
            // (2 heads each); the key, stored transposed, is a call of its own (a strided batch over its heads).
            let launches = codegen::gemm_launches(&src.blas);
            if !src.blas.is_empty() {
                let [codegen::GemmLaunch::Pointers { operands, .. }, codegen::GemmLaunch::Strided(key)] =
                    launches.as_slice()
                else {
                    panic!("{}: {launches:?}", g.name())
                };
                assert_eq!((operands.len(), key.gemm.batch, key.gemm.trans_a), (4, 2, true));
            }
            let calls: usize = launches.iter().map(codegen::GemmLaunch::products).sum();
            assert_eq!(
                calls,
                src.blas.iter().map(|b| b.calls().iter().map(|c| c.gemm.batch).sum::<usize>()).sum::<usize>()
            );
            stored.push((g.name().to_owned(), products(k), src.blas.len()));
        }
    }
    assert_eq!(stored, [("transformer_1l_8h".to_owned(), 3, 3), ("gated_mlp".to_owned(), 2, 0)], "{stored:?}");
    differential("sibling_products_store_through_cublas_or_run_as_generated_kernels", &graphs, &optimised, 1e-5);
}

/// f32 products whose whole epilogue is a bias and/or a Relu or tanh Gelu are one cuBLASLt call each, no launch:
/// an MLP (bias + Relu, bias), a Gemm with a `C[n]` term (`beta` 1, B transposed, alpha 0.5) and a tanh Gelu, a
/// batch of products over one weight (one call over all rows), a Relu alone. A Gemm whose `beta` is not 1, a
/// bias that is a whole matrix and an erf Gelu keep their generated epilogue. Every plan against its reference.
#[test]
fn lt_epilogues_match_reference_plans() {
    use codegen::LtActivation as A;
    let mut g = ComputeGraph::new("lt_epilogues");
    let x = g.add_input("x", DType::F32, [5, 8]).unwrap();
    let xb = g.add_input("xb", DType::F32, [2, 3, 8]).unwrap();
    let w = g.add_weight("w", DType::F32, [6, 8]).unwrap();
    let wb = g.add_weight("wb", DType::F32, [8, 6]).unwrap();
    let c = g.add_weight("c", DType::F32, [6]).unwrap();
    let c2 = g.add_weight("c2", DType::F32, [1, 6]).unwrap();
    let col = g.add_weight("col", DType::F32, [5, 1]).unwrap();
    let gemm = |alpha, beta| Op::Gemm { alpha, beta, trans_a: false, trans_b: true };
    let g1 = node(&mut g, "g1", gemm(0.5, 1.0), &[x, w, c]);
    let g1 = node(&mut g, "g1.gelu", Op::Gelu { approximate: graph_plan::op::GeluApprox::Tanh }, &[g1]);
    let b1 = node(&mut g, "b1", Op::MatMul, &[xb, wb]);
    let b1 = node(&mut g, "b1.bias", Op::Add, &[c2, b1]);
    let b1 = node(&mut g, "b1.relu", Op::Relu, &[b1]);
    let r1 = node(&mut g, "r1", Op::MatMul, &[x, wb]);
    let r1 = node(&mut g, "r1.relu", Op::Relu, &[r1]);
    // Residual connections (cuBLASLt's C with beta 1): after the bias, before it (then a Relu), alone; over a
    // batch of products, the residual flattened with them.
    let res_b = g.add_input("res_b", DType::F32, [2, 3, 6]).unwrap();
    // Its own activation: products over one activation are siblings (one kernel, no cuBLASLt epilogue).
    let xb2 = g.add_input("xb2", DType::F32, [2, 3, 8]).unwrap();
    let p1 = node(&mut g, "p1", Op::MatMul, &[xb2, wb]);
    let p1 = node(&mut g, "p1.bias", Op::Add, &[p1, c]);
    let p1 = node(&mut g, "p1.res", Op::Add, &[res_b, p1]);
    let (x2, x3) = (g.add_input("x2", DType::F32, [5, 8]).unwrap(), g.add_input("x3", DType::F32, [5, 8]).unwrap());
    let (w2, w3) = (g.add_weight("w2", DType::F32, [8, 6]).unwrap(), g.add_weight("w3", DType::F32, [8, 6]).unwrap());
    let full = g.add_input("full", DType::F32, [5, 6]).unwrap();
    let p2 = node(&mut g, "p2", Op::MatMul, &[x2, w2]);
    let p2 = node(&mut g, "p2.res", Op::Add, &[p2, full]);
    let p2 = node(&mut g, "p2.bias", Op::Add, &[p2, c]);
    let p2 = node(&mut g, "p2.relu", Op::Relu, &[p2]);
    let p3 = node(&mut g, "p3", Op::MatMul, &[x3, w3]);
    let p3 = node(&mut g, "p3.res", Op::Add, &[p3, full]);
    // Not cuBLASLt: beta 2, an addend broadcast along the columns, the erf form of Gelu.
    let n1 = node(&mut g, "n1", gemm(1.0, 2.0), &[x, w, c]);
    let n2 = node(&mut g, "n2", Op::MatMul, &[x, wb]);
    let n2 = node(&mut g, "n2.add", Op::Add, &[n2, col]);
    let n3 = node(&mut g, "n3", Op::MatMul, &[x, wb]);
    let n3 = node(&mut g, "n3.bias", Op::Add, &[n3, c]);
    let n3 = node(&mut g, "n3.gelu", Op::Gelu { approximate: graph_plan::op::GeluApprox::None }, &[n3]);
    for t in [g1, b1, r1, p1, p2, p3, n1, n2, n3] {
        g.mark_output(t).unwrap();
    }
    let graphs = [g, synth::mlp(3, 8, 5).unwrap()];
    let mut optimised = PlanOptions::with_streams(1);
    optimised.fusion.caps = codegen::fusion_caps();
    let Some(runs) = differential("lt_epilogues_match_reference_plans", &graphs, &optimised, 1e-5) else { return };
    let lt = |graph: &str| -> Vec<(A, bool, bool, usize)> {
        let r = runs.iter().find(|r| r.graph == graph && r.tag == "opt").unwrap();
        r.sources
            .iter()
            .flat_map(|s| s.blas.iter().map(move |b| (s, b)))
            .filter_map(|(s, b)| {
                // A cuBLASLt step is its kernel's whole work.
                assert!(b.lt.is_none() || (s.launch == codegen::Launch::None && s.blas.len() == 1), "{}", s.name);
                b.lt.map(|l| (l.activation, l.bias.is_some(), l.residual.is_some(), b.matmul.m))
            })
            .collect()
    };
    let sorted = |mut v: Vec<(A, bool, bool, usize)>| {
        v.sort_by_key(|t| format!("{t:?}"));
        v
    };
    // The batches of 2 x 3 rows are one product of 6 rows each.
    let want = [
        (A::Relu, false, false, 5),
        (A::GeluTanh, true, false, 5),
        (A::Relu, true, false, 6),
        (A::None, true, true, 6),
        (A::Relu, true, true, 5),
        (A::None, false, true, 5),
    ];
    assert_eq!(sorted(lt("lt_epilogues")), sorted(want.to_vec()));
    assert_eq!(lt("mlp_3x8"), [(A::Relu, true, false, 5), (A::Relu, true, false, 5), (A::None, true, false, 5)]);
}

/// Operand layouts (`caps.operand_layout`): a Transpose of a product's operand joins its kernel and cuBLAS reads
/// the Transpose's input with `op_T` (and batch strides): x . W^T, batched q . k^T, a transposed left operand, a
/// Gemm whose A is transposed by a node (then a cuBLASLt call with its bias); no transposed copy and no launch.
/// Against the reference plans.
#[test]
fn transposed_operands_run_as_cublas_op_t() {
    let mut g = ComputeGraph::new("op_t");
    let x = g.add_input("x", DType::F32, [2, 4, 8]).unwrap();
    let w = g.add_weight("w", DType::F32, [6, 8]).unwrap();
    let wt = node(&mut g, "wt", Op::Transpose { perm: None }, &[w]);
    let y = node(&mut g, "mm", Op::MatMul, &[x, wt]);
    let k = g.add_input("k", DType::F32, [2, 5, 8]).unwrap();
    let kt = node(&mut g, "kt", Op::Transpose { perm: Some(vec![0, 2, 1]) }, &[k]);
    let s = node(&mut g, "scores", Op::MatMul, &[x, kt]);
    let tokens = g.add_input("tokens", DType::F32, [2, 8, 4]).unwrap();
    let tt = node(&mut g, "tokens_t", Op::Transpose { perm: Some(vec![0, 2, 1]) }, &[tokens]);
    let w2 = g.add_weight("w2", DType::F32, [8, 3]).unwrap();
    let z = node(&mut g, "mix", Op::MatMul, &[tt, w2]);
    let a = g.add_input("a", DType::F32, [8, 4]).unwrap();
    let at = node(&mut g, "a_t", Op::Transpose { perm: Some(vec![1, 0]) }, &[a]);
    let w3 = g.add_weight("w3", DType::F32, [6, 8]).unwrap();
    let c = g.add_weight("c", DType::F32, [6]).unwrap();
    let gm = node(&mut g, "gemm", Op::Gemm { alpha: 0.5, beta: 1.0, trans_a: false, trans_b: true }, &[at, w3, c]);
    for t in [y, s, z, gm] {
        g.mark_output(t).unwrap();
    }
    let mut optimised = PlanOptions::with_streams(2);
    optimised.fusion.caps = codegen::fusion_caps();
    let Some(runs) = differential("transposed_operands_run_as_cublas_op_t", &[g], &optimised, 1e-5) else { return };
    let r = runs.iter().find(|r| r.tag == "opt").unwrap();
    assert_eq!(r.plan.kernels().len(), 4, "{}", r.plan);
    let mut flags: Vec<(bool, bool, usize, bool)> = r
        .sources
        .iter()
        .map(|s| {
            assert_eq!(s.launch, codegen::Launch::None, "{}: nothing to launch after cuBLAS", s.name);
            let [b] = s.blas.as_slice() else { panic!("{}: {:?}", s.name, s.blas) };
            (b.matmul.trans_a, b.matmul.trans_b, b.matmul.batch, b.lt.is_some())
        })
        .collect();
    flags.sort_unstable();
    // x . W^T (2 batches over one weight), q . k^T, tokens^T . w2, the Gemm (its own trans_b, A by its node).
    assert_eq!(
        flags,
        [(false, true, 2, false), (false, true, 2, false), (true, false, 2, false), (true, true, 1, true)]
    );
    // Without cuBLAS the per-element products index through the layouts: the same numbers.
    let Some(cxx) = compiler() else { return };
    let plain = codegen::generate_all_with(&r.plan, &codegen::CodegenOptions { cublas: false }).unwrap();
    assert!(plain.iter().all(|s| s.blas.is_empty() && s.launch != codegen::Launch::None));
    let program = HostProgram::build(cxx, "op_t_plain", r.sources.iter().chain(&plain));
    let outputs = |sources: &[codegen::KernelSource]| {
        let mut regions = HostRegions::new(&r.plan);
        for b in r.plan.bindings().iter().filter(|b| b.role != BindingRole::Output) {
            let t = graph_plan::HostTensor::seeded(b.dtype, &b.shape, &b.name, 7, false);
            regions.bytes_mut(b.buffer).copy_from_slice(b.data.as_deref().unwrap_or(&t.data));
        }
        program.run(&r.plan, sources, &mut regions);
        let outs: Vec<Vec<f32>> = r
            .plan
            .bindings()
            .iter()
            .filter(|b| b.role == BindingRole::Output)
            .map(|b| regions.f32s(b.buffer))
            .collect();
        outs
    };
    let (blas, generated) = (outputs(&r.sources), outputs(&plain));
    assert_eq!(blas.len(), 4);
    for (x, y) in blas.iter().zip(&generated) {
        close("op_t per-element", &f(x), y);
    }
}

#[test]
fn eliminated_concat_producers_write_their_slices() {
    // Three conv+relu branches of 8 x 8 x 8 f32 (2048 bytes each) joined on axis 1 of a batch-1 map: the Concat
    // runs no kernel, each generated kernel writes at its slice's pool offset.
    let mut g = ComputeGraph::new("cat_slices");
    let x = g.add_input("x", DType::F32, [1, 4, 8, 8]).unwrap();
    let mut outs = Vec::new();
    for b in 0..3 {
        let w = g.add_weight(&format!("b{b}.w"), DType::F32, [8, 4, 1, 1]).unwrap();
        let c = node(&mut g, &format!("b{b}.conv"), Op::Conv(ConvAttrs::default()), &[x, w]);
        outs.push(node(&mut g, &format!("b{b}.relu"), Op::Relu, &[c]));
    }
    let cat = node(&mut g, "cat", Op::Concat { axis: 1 }, &outs);
    let w = g.add_weight("head.w", DType::F32, [4, 24, 1, 1]).unwrap();
    let y = node(&mut g, "head", Op::Conv(ConvAttrs::default()), &[cat, w]);
    g.mark_output(y).unwrap();
    let mut optimised = PlanOptions::with_streams(3);
    optimised.fusion.caps = codegen::fusion_caps();
    let plan = ExecutionPlan::build_with(&g, &optimised).unwrap();
    assert!(plan.nodes().iter().any(|n| &*n.name == "cat" && n.eliminated));
    differential("eliminated_concat_producers_write_their_slices", &[g], &optimised, 1e-4);
}

/// Half precision: f16 and bf16 storage (the PRELUDE's `f2h`/`f2bf` conversions, rounding after every op as
/// exec-sim does) and half MatMul/Gemm on cuBLAS steps (the host model of `cublasGemmEx` with f32 compute),
/// fused plans against their unfused reference plans; the kernels really store half values and the products
/// really are half cuBLAS calls.
#[test]
fn half_precision_plans_match_their_reference_plans() {
    use graph_plan::precision::{Precision, PrecisionPolicy};
    let graphs = [
        synth::transformer(1, 8, 2, 4, 1).unwrap(),
        synth::resnet_like(1, 2, 6).unwrap(),
        synth::mlp(2, 8, 3).unwrap(),
    ];
    for p in [Precision::Fp16, Precision::Bf16] {
        let mut o = PlanOptions::with_streams(2);
        o.fusion.caps = codegen::fusion_caps();
        // A fused half attention kernel is not bitwise the unfused half chain (it never rounds its scores and
        // probabilities to half: `exec_sim::attention`), so it is held to `half_attention_tolerance` in
        // tests/attention.rs; here the chain stays unfused and every other half kernel is held to 1e-4.
        o.fusion.caps.attention = false;
        o.precision = PrecisionPolicy::new(p);
        let Some(runs) = differential("half_precision_plans_match_their_reference_plans", &graphs, &o, 1e-4) else {
            return;
        };
        let half = exec_cuda::GemmType::of(p.dtype()).unwrap();
        for r in &runs {
            let halves = r.plan.kernels().iter().flat_map(|k| &k.values).filter(|v| v.dtype == p.dtype()).count();
            assert!(halves > 0, "{} {}: no {} value in any kernel", r.graph, r.tag, p.dtype());
            if !r.graph.starts_with("resnet_like") {
                let products = r.sources.iter().flat_map(|s| &s.blas).filter(|b| b.matmul.types.ab == half).count();
                assert!(products > 0, "{} {}: no {} cuBLAS product", r.graph, r.tag, p.dtype());
            }
        }
    }
}

/// The cuBLAS half path and the generated per-element products compute the same bits on the host (both sum in
/// f32 in the same order and round once on the store), for every output of half plans of a transformer and an
/// MLP: the cuBLAS steps (products stored in half, or in f32 before a cast epilogue) keep exec-sim's rule.
#[test]
fn half_cublas_steps_match_generated_products() {
    use graph_plan::precision::{Precision, PrecisionPolicy};
    let test = "half_cublas_steps_match_generated_products";
    let Some(cxx) = compiler() else {
        eprintln!("SKIP {test}: no host C++ compiler");
        return;
    };
    let graphs = [synth::transformer(1, 8, 2, 4, 1).unwrap(), synth::mlp(2, 8, 3).unwrap(), half_gemms()];
    let mut runs = Vec::new();
    for p in [Precision::Fp16, Precision::Bf16] {
        let mut o = PlanOptions::with_streams(2);
        o.fusion.caps = codegen::fusion_caps();
        o.precision = PrecisionPolicy::new(p);
        for g in &graphs {
            let plan = ExecutionPlan::build_with(g, &o).unwrap();
            graph_plan::verify(&plan).unwrap();
            let with = codegen::generate_all_with(&plan, &codegen::CodegenOptions { cublas: true }).unwrap();
            let without = codegen::generate_all_with(&plan, &codegen::CodegenOptions { cublas: false }).unwrap();
            let half = exec_cuda::GemmType::of(p.dtype()).unwrap();
            let steps: Vec<_> = with.iter().flat_map(|s| &s.blas).filter(|b| b.matmul.types.ab == half).collect();
            assert!(!steps.is_empty(), "{} {p:?}: no half cuBLAS step", g.name());
            assert!(without.iter().all(|s| s.blas.is_empty()));
            eprintln!(
                "{test}: {} {p:?}: {} half cuBLAS steps ({} storing f32)",
                g.name(),
                steps.len(),
                steps.iter().filter(|b| b.matmul.types.c == exec_cuda::GemmType::F32).count()
            );
            // A half Gemm with a C term stores its product in f32 (a cast epilogue's output) or is no cuBLAS
            // step: rounding the product to half before the C term is added would round twice.
            for (k, s) in plan.kernels().iter().zip(&with) {
                let c_term = matches!(k.body[0].op, Op::Gemm { .. }) && k.body[0].inputs.len() == 3;
                if let (Some(b), true) = (s.blas.first(), c_term) {
                    assert!(
                        b.matmul.types.ab == exec_cuda::GemmType::F32 || b.matmul.types.c == exec_cuda::GemmType::F32
                    );
                }
            }
            runs.push((format!("{} {p:?}", g.name()), plan, with, without));
        }
    }
    let program = HostProgram::build(cxx, test, runs.iter().flat_map(|(_, _, w, wo)| w.iter().chain(wo)));
    for (name, plan, with, without) in &runs {
        let outputs = |sources: &[codegen::KernelSource]| {
            let mut regions = HostRegions::new(plan);
            for b in plan.bindings() {
                if b.role == BindingRole::Output {
                    continue;
                }
                let t = match &b.data {
                    Some(d) => d.clone(),
                    None => graph_plan::HostTensor::seeded(b.dtype, &b.shape, &b.name, 5, false).data,
                };
                regions.bytes_mut(b.buffer).copy_from_slice(&t);
            }
            program.run(plan, sources, &mut regions);
            plan.bindings()
                .iter()
                .filter(|b| b.role == BindingRole::Output)
                .map(|b| (b.name.clone(), regions.bytes(b.buffer).to_vec()))
                .collect::<Vec<_>>()
        };
        let (a, b) = (outputs(with), outputs(without));
        assert!(!a.is_empty());
        for ((n, x), (_, y)) in a.iter().zip(&b) {
            assert!(x == y, "{name}: output '{n}' differs between cuBLAS steps and generated products");
        }
    }
}

/// Half Gemms with C terms: `g1`'s product goes straight to a graph output (a cast to f32 fused as its
/// epilogue, so cuBLAS stores it in f32), `g2`'s is read by another product (stored in half: a generated kernel),
/// whose own product `g3` is cast to f32 on the way out.
fn half_gemms() -> ComputeGraph {
    let mut g = ComputeGraph::new("half_gemms");
    let x = g.add_input("x", DType::F32, [3, 4]).unwrap();
    let w1 = g.add_weight("w1", DType::F32, [5, 4]).unwrap();
    let c1 = g.add_weight("c1", DType::F32, [5]).unwrap();
    let w2 = g.add_weight("w2", DType::F32, [4, 5]).unwrap();
    let c2 = g.add_weight("c2", DType::F32, [1, 5]).unwrap();
    let w3 = g.add_weight("w3", DType::F32, [5, 2]).unwrap();
    let r = node(&mut g, "relu", Op::Relu, &[x]);
    let g1 = node(&mut g, "g1", Op::Gemm { alpha: 0.5, beta: 2.0, trans_a: false, trans_b: true }, &[r, w1, c1]);
    let g2 = node(&mut g, "g2", Op::Gemm { alpha: 1.0, beta: 1.0, trans_a: false, trans_b: false }, &[r, w2, c2]);
    let g3 = node(&mut g, "g3", Op::MatMul, &[g2, w3]);
    g.mark_output(g1).unwrap();
    g.mark_output(g3).unwrap();
    g
}

/// One graph's plan as the differential tests run it: its name, the plan's tag, the plan and its kernels.
struct DiffRun {
    graph: String,
    tag: &'static str,
    plan: ExecutionPlan,
    sources: Vec<codegen::KernelSource>,
}

/// Builds, for every graph, the reference plan and the plan of `opts` (both verified, this backend's caps),
/// generates their kernels, runs them all through one host program (one C++ compile) on seeded inputs and
/// asserts that every output agrees: floats within `tol` relative (absolute below 1), other dtypes bit for bit.
/// Returns the runs (for assertions on the kernels), or `None` where no host compiler exists.
fn differential(test: &str, graphs: &[ComputeGraph], opts: &PlanOptions, tol: f32) -> Option<Vec<DiffRun>> {
    let Some(cxx) = compiler() else {
        eprintln!("SKIP {test}: no host C++ compiler");
        return None;
    };
    let mut reference = PlanOptions::reference();
    reference.fusion.caps = codegen::fusion_caps();
    // A half-precision plan's reference is the unfused plan of the same rewritten graph.
    reference.precision = opts.precision.clone();
    let mut runs = Vec::new();
    for g in graphs {
        for (tag, o) in [("ref", &reference), ("opt", opts)] {
            let plan = ExecutionPlan::build_with(g, o).unwrap();
            graph_plan::verify(&plan).unwrap_or_else(|e| panic!("{} {tag}: {e:?}", g.name()));
            let sources = codegen::generate_all(&plan).unwrap_or_else(|e| panic!("{} {tag}: {e}", g.name()));
            runs.push(DiffRun { graph: g.name().to_owned(), tag, plan, sources });
        }
    }
    let program = HostProgram::build(cxx, test, runs.iter().flat_map(|r| &r.sources));
    // Output dtype and bytes by binding name, per (graph, tag).
    type Outputs = HashMap<String, (DType, Vec<u8>)>;
    let mut outs: HashMap<(String, &str), Outputs> = HashMap::new();
    for r in &runs {
        let mut regions = HostRegions::new(&r.plan);
        for b in r.plan.bindings() {
            if b.role == BindingRole::Output {
                continue;
            }
            let t = match &b.data {
                Some(d) => d.clone(),
                None => graph_plan::HostTensor::seeded(b.dtype, &b.shape, &b.name, 3, b.name.contains("var")).data,
            };
            regions.bytes_mut(b.buffer).copy_from_slice(&t);
        }
        program.run(&r.plan, &r.sources, &mut regions);
        let o = r
            .plan
            .bindings()
            .iter()
            .filter(|b| b.role == BindingRole::Output)
            .map(|b| (b.name.to_string(), (b.dtype, regions.bytes(b.buffer).to_vec())))
            .collect();
        outs.insert((r.graph.clone(), r.tag), o);
    }
    for g in graphs {
        let (r, o) = (&outs[&(g.name().to_owned(), "ref")], &outs[&(g.name().to_owned(), "opt")]);
        assert_eq!(r.len(), o.len(), "{}: both plans bind the same outputs", g.name());
        for (name, (dt, rb)) in r {
            let (_, ob) = o.get(name).unwrap_or_else(|| panic!("{}: the optimised plan lacks '{name}'", g.name()));
            assert_eq!(rb.len(), ob.len(), "{}: '{name}' sizes", g.name());
            if *dt != DType::F32 {
                assert_eq!(rb, ob, "{}: '{name}' ({dt}) differs", g.name());
                continue;
            }
            let (rv, ov) = (common::from_bytes(rb), common::from_bytes(ob));
            assert!(rv.iter().all(|v| v.is_finite()), "{}: reference '{name}' is not finite", g.name());
            for (i, (a, b)) in rv.iter().zip(&ov).enumerate() {
                assert!(
                    (a - b).abs() <= tol * a.abs().max(1.0),
                    "{}: '{name}'[{i}]: reference {a}, optimised {b}",
                    g.name()
                );
            }
        }
    }
    for r in &runs {
        eprintln!("{test}: {} {}: {} kernels", r.graph, r.tag, r.plan.kernels().len());
    }
    eprintln!("{test}: {} plans, one host program of {} kernels", runs.len(), program.len());
    Some(runs)
}

/// Out-of-range Gather indices are clamped to the axis (a GPU kernel cannot report them; it must not read out of
/// bounds): 5 -> 2, -7 -> -4 -> 0; in-range and negative ones as ONNX says.
#[test]
fn gather_clamps_out_of_range_indices() {
    let mut g = ComputeGraph::new("t");
    let d = g.add_input("d", DType::F32, [3, 2]).unwrap();
    let idx = g.add_input("idx", DType::I64, [5]).unwrap();
    let y = node(&mut g, "gather", Op::Gather { axis: 0 }, &[d, idx]);
    g.mark_output(y).unwrap();
    let dv = vec![10.0, 11.0, 20.0, 21.0, 30.0, 31.0];
    let iv: Vec<u8> = [5i64, -7, 1, -1, i64::MIN].iter().flat_map(|v| v.to_le_bytes()).collect();
    let Some(out) = run("gather_clamps", &g, 1, &[("d", f(&dv)), ("idx", iv)]) else { return };
    close("gather clamps", &out[&*g.tensor(y).name], &[30.0, 31.0, 10.0, 11.0, 20.0, 21.0, 30.0, 31.0, 10.0, 11.0]);
}

/// A Memcpy-to-host result lives in the plan's host region (mapped pinned memory on the GPU) and a later kernel
/// reads it there; both the copy and the read are plan steps.
#[test]
fn memcpy_results_live_in_the_host_region() {
    use graph_plan::ir::op::MemSpace;
    let mut g = ComputeGraph::new("t");
    let x = g.add_input("x", DType::F32, [4]).unwrap();
    let r = node(&mut g, "r", Op::Relu, &[x]);
    let h = node(&mut g, "to_host", Op::Memcpy { to: MemSpace::Host }, &[r]);
    let y = node(&mut g, "y", Op::Neg, &[h]);
    g.mark_output(h).unwrap();
    g.mark_output(y).unwrap();
    let mut opts = PlanOptions::with_streams(2);
    opts.fusion.caps = codegen::fusion_caps();
    let plan = ExecutionPlan::build_with(&g, &opts).unwrap();
    let host = plan.bindings().iter().find(|b| b.name == g.tensor(h).name).unwrap();
    assert_eq!(host.buffer.region, graph_plan::Region::Host, "{plan}");
    assert!(plan.steps.iter().any(|s| matches!(s, graph_plan::PlanStep::Copy { .. })), "{plan}");
    let Some(out) = run("memcpy_host", &g, 2, &[("x", f(&[-1.0, 2.0, -3.0, 4.0]))]) else { return };
    close("to_host", &out[&*g.tensor(h).name], &[0.0, 2.0, 0.0, 4.0]);
    close("y", &out[&*g.tensor(y).name], &[0.0, -2.0, 0.0, -4.0]);
}

/// Row kernels with `reduction_fusion`: decomposed LayerNormalization and Softmax, a scaled and masked Softmax with
/// a consumer, a reduction feeding a per-row epilogue, integer sums/maxima/means with consumers, and the transformer
/// family; the fused plan's generated kernels give the reference plan's numbers (both through the host emulator,
/// one program) and compile with NVRTC where it is installed.
#[test]
fn fused_row_kernels_match_reference_plans() {
    let test = "fused_row_kernels_match_reference_plans";
    let f32t = DType::F32;
    let mut graphs = Vec::new();
    {
        // LayerNormalization spelt out, over [2, 3, 40] rows of 40.
        let mut g = ComputeGraph::new("decomposed_layernorm");
        let x = g.add_input("x", f32t, [2, 3, 40]).unwrap();
        let sc = g.add_weight("sc", f32t, [40]).unwrap();
        let bi = g.add_weight("bi", f32t, [40]).unwrap();
        let two = g.add_constant("two", f32t, [], 2.0f32.to_le_bytes().to_vec()).unwrap();
        let eps = g.add_constant("eps", f32t, [], 1e-5f32.to_le_bytes().to_vec()).unwrap();
        let mean = node(&mut g, "mean", Op::ReduceMean { axes: Some(vec![-1]), keepdims: true }, &[x]);
        let d = node(&mut g, "d", Op::Sub, &[x, mean]);
        let sq = node(&mut g, "sq", Op::Pow, &[d, two]);
        let var = node(&mut g, "var", Op::ReduceMean { axes: Some(vec![-1]), keepdims: true }, &[sq]);
        let ve = node(&mut g, "ve", Op::Add, &[var, eps]);
        let sd = node(&mut g, "sd", Op::Sqrt, &[ve]);
        let n = node(&mut g, "n", Op::Div, &[d, sd]);
        let m = node(&mut g, "m", Op::Mul, &[n, sc]);
        let y = node(&mut g, "y", Op::Add, &[m, bi]);
        g.mark_output(y).unwrap();
        graphs.push(g);
    }
    {
        // Softmax spelt out, then a consumer; the row max is also an output (one per row).
        let mut g = ComputeGraph::new("decomposed_softmax");
        let x = g.add_input("x", f32t, [4, 33]).unwrap();
        let mx = node(&mut g, "mx", Op::ReduceMax { axes: Some(vec![1]), keepdims: true }, &[x]);
        let d = node(&mut g, "d", Op::Sub, &[x, mx]);
        let ex = node(&mut g, "ex", Op::Exp, &[d]);
        let sm = node(&mut g, "sm", Op::ReduceSum { axes: Some(vec![1]), keepdims: true }, &[ex]);
        let p = node(&mut g, "p", Op::Div, &[ex, sm]);
        let y = node(&mut g, "y", Op::Relu, &[p]);
        g.mark_output(y).unwrap();
        g.mark_output(mx).unwrap();
        graphs.push(g);
    }
    {
        // Softmax of scaled, masked scores, with a consumer; a row sum with a per-row epilogue.
        let mut g = ComputeGraph::new("softmax_producers");
        let s = g.add_input("s", f32t, [2, 2, 5, 5]).unwrap();
        let mask = g.add_input("mask", f32t, [5]).unwrap();
        let k = g.add_constant("k", f32t, [], 0.125f32.to_le_bytes().to_vec()).unwrap();
        let sc = node(&mut g, "sc", Op::Mul, &[s, k]);
        let mk = node(&mut g, "mk", Op::Add, &[sc, mask]);
        let sm = node(&mut g, "softmax", Op::Softmax { axis: -1 }, &[mk]);
        let y = node(&mut g, "y", Op::Mul, &[sm, s]);
        g.mark_output(y).unwrap();
        let t = g.add_input("t", f32t, [3, 7]).unwrap();
        let e = node(&mut g, "e", Op::Abs, &[t]);
        let rs = node(&mut g, "rs", Op::ReduceSum { axes: Some(vec![1]), keepdims: false }, &[e]);
        let z = node(&mut g, "z", Op::Sqrt, &[rs]);
        g.mark_output(z).unwrap();
        graphs.push(g);
    }
    {
        // Integer rows: |x| summed and maxed per row, with a per-row consumer and a full-shaped one.
        let mut g = ComputeGraph::new("integer_rows");
        let x = g.add_input("x", DType::I32, [3, 9]).unwrap();
        let a = node(&mut g, "a", Op::Abs, &[x]);
        let s = node(&mut g, "s", Op::ReduceSum { axes: Some(vec![1]), keepdims: true }, &[a]);
        let m = node(&mut g, "m", Op::ReduceMax { axes: Some(vec![1]), keepdims: true }, &[a]);
        let q = node(&mut g, "q", Op::ReduceMean { axes: Some(vec![1]), keepdims: true }, &[a]);
        let t = node(&mut g, "t", Op::Sub, &[s, m]);
        let y = node(&mut g, "y", Op::Sub, &[a, q]);
        g.mark_output(t).unwrap();
        g.mark_output(y).unwrap();
        graphs.push(g);
    }
    {
        // BERT's embeddings at batch 2: word rows gathered by id, a window of the position table (`[1, 6, 40]`,
        // broadcast over the batch), token-type rows by a constant id list, then LayerNorm: the Gathers and the
        // Slice are loads of the row kernel (ids past the table are clamped alike in both plans).
        let mut g = ComputeGraph::new("embedding_layernorm");
        let ids = g.add_input("ids", DType::I64, [2, 6]).unwrap();
        let word = g.add_weight("word", f32t, [23, 40]).unwrap();
        let pos = g.add_weight("pos", f32t, [1, 16, 40]).unwrap();
        let types = g.add_weight("types", f32t, [2, 40]).unwrap();
        let tt: Vec<u8> = [0i64, 0, 1, 1, 0, 1, 1, 1, 0, 0, 1, 0].iter().flat_map(|v| v.to_le_bytes()).collect();
        let tt = g.add_constant("tt", DType::I64, [2, 6], tt).unwrap();
        let sc = g.add_weight("sc", f32t, [40]).unwrap();
        let bi = g.add_weight("bi", f32t, [40]).unwrap();
        let w = node(&mut g, "word_rows", Op::Gather { axis: 0 }, &[word, ids]);
        let window = Op::Slice { starts: vec![2], ends: vec![8], axes: Some(vec![1]), steps: None };
        let p = node(&mut g, "pos_rows", window, &[pos]);
        let a = node(&mut g, "add_pos", Op::Add, &[w, p]);
        let t = node(&mut g, "type_rows", Op::Gather { axis: 0 }, &[types, tt]);
        let b = node(&mut g, "add_type", Op::Add, &[a, t]);
        let y = node(&mut g, "ln", Op::LayerNormalization { axis: -1, epsilon: 1e-5 }, &[b, sc, bi]);
        g.mark_output(y).unwrap();
        graphs.push(g);
    }
    {
        // A vision transformer's embeddings: the patch grid (a conv result from outside, [1, 40, 2, 3]) flattened
        // and transposed to six tokens, a class token expanded before them, the position table added (the
        // residual stream, an output too), then LayerNorm: the loads chain Transpose and Expand into a Concat.
        let mut g = ComputeGraph::new("patch_embedding");
        let grid = g.add_input("grid", f32t, [1, 40, 2, 3]).unwrap();
        let cls = g.add_weight("cls", f32t, [1, 1, 40]).unwrap();
        let pos = g.add_weight("pos", f32t, [1, 7, 40]).unwrap();
        let sc = g.add_weight("sc", f32t, [40]).unwrap();
        let bi = g.add_weight("bi", f32t, [40]).unwrap();
        let flat = node(&mut g, "flat", Op::Reshape { shape: vec![1, 40, 6], allowzero: false }, &[grid]);
        let tokens = node(&mut g, "tokens", Op::Transpose { perm: Some(vec![0, 2, 1]) }, &[flat]);
        let c = node(&mut g, "cls_b", Op::Expand { shape: vec![1, 1, 40] }, &[cls]);
        let cat = node(&mut g, "cat", Op::Concat { axis: 1 }, &[c, tokens]);
        let h = node(&mut g, "h", Op::Add, &[cat, pos]);
        let y = node(&mut g, "ln", Op::LayerNormalization { axis: -1, epsilon: 1e-5 }, &[h, sc, bi]);
        g.mark_output(y).unwrap();
        g.mark_output(h).unwrap();
        graphs.push(g);
    }
    graphs.push(synth::transformer(1, 16, 2, 8, 1).unwrap());
    let mut fused = PlanOptions::with_streams(2);
    fused.fusion.caps = codegen::fusion_caps();
    assert!(fused.fusion.caps.reduction_fusion);
    let Some(runs) = differential(test, &graphs, &fused, 1e-5) else {
        return;
    };
    // The fusion pass made one row kernel of each decomposed normalisation and of the integer rows (else this test
    // would prove nothing about `reduce::fused`).
    for (name, kernels) in [
        ("decomposed_layernorm", 1),
        ("decomposed_softmax", 1),
        ("integer_rows", 1),
        ("embedding_layernorm", 1),
        ("patch_embedding", 1),
    ] {
        let r = runs.iter().find(|r| r.graph == name && r.tag == "opt").unwrap();
        assert_eq!(r.plan.kernels().len(), kernels, "{name}: kernels of the fused plan");
        assert!(r.sources.iter().all(|s| matches!(s.launch, codegen::Launch::Rows { .. })), "{name}: a row kernel");
    }
    // The same sources are CUDA C that NVRTC accepts (the emulator compiles them as C++ with a shim).
    if common::nvrtc_or_skip(test) {
        let sources: Vec<_> = runs.into_iter().flat_map(|r| r.sources).collect();
        let cache = exec_cuda::CompileCache::from_env();
        let n = common::compile_distinct(test, &sources, &cache, &exec_cuda::CompileOptions::default());
        eprintln!("{test}: {n} distinct kernels compiled with NVRTC");
    }
}

/// Mixed-precision nodes (`Node::store`: a LayerNorm reading f16 with f32 weights and storing f16, an Add of f16
/// and f32 storing f16, a Softmax reading f16 and storing f32) generate the code of the casts they stand for: the
/// same bytes as the graph written with those casts.
#[test]
fn mixed_precision_nodes_match_their_casts() {
    let build = |mixed: bool| {
        let (f16, f32) = (DType::F16, DType::F32);
        let mut g = ComputeGraph::new("mixed");
        let x = g.add_input("x", f32, [2, 64]).unwrap();
        let y = g.add_input("y", f32, [2, 64]).unwrap();
        let s = g.add_weight("s", f32, [64]).unwrap();
        let b = g.add_weight("b", f32, [64]).unwrap();
        let x16 = node(&mut g, "x16", Op::Cast { to: f16 }, &[x]);
        let ln_op = Op::LayerNormalization { axis: -1, epsilon: 1e-5 };
        let e = if mixed {
            let ln = g.add_node_stored("ln", ln_op, &[x16, s, b], &["ln"], Some(f16)).unwrap()[0];
            let q = g.add_node_stored("q", Op::Add, &[ln, y], &["q"], Some(f16)).unwrap()[0];
            node(&mut g, "e", Op::Exp, &[q])
        } else {
            let xc = node(&mut g, "xc", Op::Cast { to: f32 }, &[x16]);
            let ln32 = node(&mut g, "ln32", ln_op, &[xc, s, b]);
            let ln = node(&mut g, "ln", Op::Cast { to: f16 }, &[ln32]);
            let lc = node(&mut g, "lc", Op::Cast { to: f32 }, &[ln]);
            let q32 = node(&mut g, "q32", Op::Add, &[lc, y]);
            let q = node(&mut g, "q", Op::Cast { to: f16 }, &[q32]);
            node(&mut g, "e", Op::Exp, &[q])
        };
        let p = if mixed {
            g.add_node_stored("p", Op::Softmax { axis: -1 }, &[e], &["p"], Some(f32)).unwrap()[0]
        } else {
            let ec = node(&mut g, "ec", Op::Cast { to: f32 }, &[e]);
            node(&mut g, "p", Op::Softmax { axis: -1 }, &[ec])
        };
        g.mark_output(p).unwrap();
        g
    };
    let data = [
        ("x", f(&seq(128, 0.3, 0.1))),
        ("y", f(&seq(128, 0.05, -0.2))),
        ("s", f(&seq(64, 0.02, 1.0))),
        ("b", f(&seq(64, 0.01, 0.0))),
    ];
    let test = "mixed_precision_nodes_match_their_casts";
    let (Some(m), Some(c)) = (run(test, &build(true), 1, &data), run(test, &build(false), 1, &data)) else { return };
    assert_eq!(m["p"], c["p"], "{test}: the mixed nodes' output differs from the casts'");
}
