//! Row kernels: one block per output row. Threads stride over the row's elements (each computed through the
//! per-element emitter, so fused elementwise producers need no buffer), reduce in registers, then combine with
//! warp shuffles and one shared-memory step across the block's warps.

use graph_plan::{Access, Kernel, Op, Shape, ValueId};

use super::emit::{flit, norm_axis, store, Emitter, PRELUDE};
use super::{unsupported, value_checked, Buffers, KernelSource, Launch, ENTRY, ROW_BLOCK};
use crate::error::CudaResult;

const BLOCK_HELPERS: &str = r#"__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_down_sync(0xffffffffu, v, o));
    return v;
}
// Every thread of the block gets the block's total; `sh` holds one float per warp.
__device__ float block_sum(float v, float* sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    v = (threadIdx.x < warps) ? sh[threadIdx.x] : 0.0f;
    if (warp == 0) v = warp_sum(v);
    if (threadIdx.x == 0) sh[0] = v;
    __syncthreads();
    const float r = sh[0];
    __syncthreads();
    return r;
}
__device__ float block_max(float v, float* sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    v = (threadIdx.x < warps) ? sh[threadIdx.x] : -__int_as_float(0x7f800000);
    if (warp == 0) v = warp_max(v);
    if (threadIdx.x == 0) sh[0] = v;
    __syncthreads();
    const float r = sh[0];
    __syncthreads();
    return r;
}
"#;

/// What one row kernel computes.
enum Shape3 {
    /// Sum, mean or max of each row into one output element.
    Reduce { max: bool, mean: bool },
    /// Softmax over each row.
    Softmax,
    /// LayerNormalization of each row (scale, optional bias).
    LayerNorm { epsilon: f32, scale: ValueId, bias: Option<ValueId> },
}

pub(crate) fn generate(kernel: &Kernel) -> CudaResult<KernelSource> {
    let (ri, red) = kernel
        .body
        .iter()
        .enumerate()
        .find(|(_, i)| i.op.category() == graph_plan::ir::OpCategory::Reduction)
        .ok_or_else(|| unsupported(kernel, "a reduction kernel without a reduction"))?;
    if ri + 1 != kernel.body.len() {
        return Err(unsupported(kernel, "elementwise epilogues after a reduction (reduction_fusion is off)"));
    }
    let (Some(&xv), Some(&yv)) = (red.inputs.first(), red.outputs.first()) else {
        return Err(unsupported(kernel, format!("node '{}' lacks operands", red.node)));
    };
    let x = value_checked(kernel, xv)?;
    let y = value_checked(kernel, yv)?;
    if !x.dtype.is_float() {
        return Err(unsupported(kernel, format!("{} over {} (node '{}')", red.op.name(), x.dtype, red.node)));
    }
    let xs = x.shape.dims().to_vec();
    let rank = xs.len();
    let all = |axes: &Option<Vec<i64>>| -> CudaResult<Vec<usize>> {
        match axes {
            None => Ok((0..rank).collect()),
            Some(a) if a.is_empty() => Ok((0..rank).collect()),
            Some(a) => {
                let mut v = a
                    .iter()
                    .map(|&ax| {
                        norm_axis(ax, rank).ok_or_else(|| unsupported(kernel, format!("axis {ax} for rank {rank}")))
                    })
                    .collect::<CudaResult<Vec<usize>>>()?;
                v.sort_unstable();
                v.dedup();
                Ok(v)
            }
        }
    };
    let input = |j: usize| -> CudaResult<ValueId> {
        red.inputs.get(j).copied().ok_or_else(|| unsupported(kernel, format!("node '{}' lacks input {j}", red.node)))
    };
    let (reduced, what): (Vec<usize>, Shape3) = match &red.op {
        Op::ReduceSum { axes, .. } => (all(axes)?, Shape3::Reduce { max: false, mean: false }),
        Op::ReduceMean { axes, .. } => (all(axes)?, Shape3::Reduce { max: false, mean: true }),
        Op::ReduceMax { axes, .. } => (all(axes)?, Shape3::Reduce { max: true, mean: false }),
        Op::GlobalAveragePool => ((2..rank).collect(), Shape3::Reduce { max: false, mean: true }),
        Op::Softmax { axis } => (
            vec![norm_axis(*axis, rank).ok_or_else(|| unsupported(kernel, "Softmax axis out of range"))?],
            Shape3::Softmax,
        ),
        Op::LayerNormalization { axis, epsilon } => {
            let a =
                norm_axis(*axis, rank).ok_or_else(|| unsupported(kernel, "LayerNormalization axis out of range"))?;
            (
                (a..rank).collect(),
                Shape3::LayerNorm { epsilon: *epsilon, scale: input(1)?, bias: red.inputs.get(2).copied() },
            )
        }
        other => return Err(unsupported(kernel, format!("{} in a row kernel", other.name()))),
    };
    let kept: Vec<usize> = (0..rank).filter(|d| !reduced.contains(d)).collect();
    let kept_ext: Vec<usize> = kept.iter().map(|&d| xs[d]).collect();
    let red_ext: Vec<usize> = reduced.iter().map(|&d| xs[d]).collect();
    let rows: usize = kept_ext.iter().product();
    let len: usize = red_ext.iter().product();
    let xstr = x.shape.strides();

    let bufs = Buffers::of(kernel)?;
    let mut e = Emitter::new(kernel, &bufs, None)?;
    e.indent = 1;
    e.line("__shared__ float sh[32];");
    e.line("const long long r = blockIdx.x;");
    let base_terms: Vec<String> = kept
        .iter()
        .enumerate()
        .filter(|&(t, _)| kept_ext[t] > 1)
        .map(|(t, &d)| format!("{} * {}LL", coord(&kept_ext, t, "r"), xstr[d]))
        .collect();
    e.line(&format!("const long long base = {};", join_or_zero(&base_terms)));
    let off = |j: &str| -> String {
        let terms: Vec<String> = reduced
            .iter()
            .enumerate()
            .filter(|&(t, _)| red_ext[t] > 1)
            .map(|(t, &d)| format!("{} * {}LL", coord(&red_ext, t, j), xstr[d]))
            .collect();
        join_or_zero(&terms)
    };
    // One pass over the row: `body` turns the element (a C variable) into the statement that accumulates it.
    let pass = |e: &mut Emitter<'_>, acc: &str, init: &str, body: &dyn Fn(&str) -> String| -> CudaResult<()> {
        e.line(&format!("float {acc} = {init};"));
        let j = e.fresh("j");
        e.open(&format!("for (long long {j} = threadIdx.x; {j} < {len}LL; {j} += blockDim.x)"));
        let i = e.def("long long", "i", &format!("base + {}", off(&j)));
        let v = e.at(xv, &i)?;
        e.line(&body(&v));
        e.close();
        Ok(())
    };
    let out_buf = |v: ValueId| -> CudaResult<usize> {
        kernel
            .params
            .iter()
            .position(|p| p.value == v && p.access == Access::Write)
            .map(|pi| bufs.of_param[pi])
            .ok_or_else(|| unsupported(kernel, format!("reduction output {v} has no buffer")))
    };
    let yb = out_buf(yv)?;
    let yd = y.dtype;
    let ninf = "-__int_as_float(0x7f800000)";
    match what {
        Shape3::Reduce { max, mean } => {
            if max {
                pass(&mut e, "acc", ninf, &|v| format!("acc = fmaxf(acc, {v});"))?;
                e.line("const float tot = block_max(acc, sh);");
            } else {
                pass(&mut e, "acc", "0.0f", &|v| format!("acc += {v};"))?;
                e.line("const float tot = block_sum(acc, sh);");
            }
            let res = if mean { format!("tot / {}", flit(len as f32)) } else { "tot".to_owned() };
            e.line(&format!("if (threadIdx.x == 0) b{yb}[r] = {};", store(&res, yd)));
        }
        Shape3::Softmax => {
            pass(&mut e, "mx", ninf, &|v| format!("mx = fmaxf(mx, {v});"))?;
            e.line("const float rmax = block_max(mx, sh);");
            pass(&mut e, "sm", "0.0f", &|v| format!("sm += expf({v} - rmax);"))?;
            e.line("const float rsum = block_sum(sm, sh);");
            let j = e.fresh("j");
            e.open(&format!("for (long long {j} = threadIdx.x; {j} < {len}LL; {j} += blockDim.x)"));
            let i = e.def("long long", "i", &format!("base + {}", off(&j)));
            let v = e.at(xv, &i)?;
            e.line(&format!("b{yb}[{i}] = {};", store(&format!("expf({v} - rmax) / rsum"), yd)));
            e.close();
        }
        Shape3::LayerNorm { epsilon, scale, bias } => {
            pass(&mut e, "s1", "0.0f", &|v| format!("s1 += {v};"))?;
            e.line(&format!("const float mean = block_sum(s1, sh) / {};", flit(len as f32)));
            pass(&mut e, "s2", "0.0f", &|v| format!("s2 += ({v} - mean) * ({v} - mean);"))?;
            e.line(&format!(
                "const float rstd = 1.0f / sqrtf(block_sum(s2, sh) / {} + {});",
                flit(len as f32),
                flit(epsilon)
            ));
            let j = e.fresh("j");
            e.open(&format!("for (long long {j} = threadIdx.x; {j} < {len}LL; {j} += blockDim.x)"));
            let i = e.def("long long", "i", &format!("base + {}", off(&j)));
            let v = e.at(xv, &i)?;
            let norm_shape = red_ext.clone();
            let sidx = bcast_into(&mut e, &j, &norm_shape, value_checked(kernel, scale)?.shape.dims());
            let s = e.at(scale, &sidx)?;
            let mut res = format!("({v} - mean) * rstd * {s}");
            if let Some(bv) = bias {
                let bidx = bcast_into(&mut e, &j, &norm_shape, value_checked(kernel, bv)?.shape.dims());
                let b = e.at(bv, &bidx)?;
                res = format!("{res} + {b}");
            }
            e.line(&format!("b{yb}[{i}] = {};", store(&res, yd)));
            e.close();
        }
    }
    let body = std::mem::take(&mut e.out);
    let source =
        format!("{PRELUDE}{BLOCK_HELPERS}\nextern \"C\" __global__ void {ENTRY}({}) {{\n{body}}}\n", bufs.signature());
    Ok(KernelSource {
        kernel: kernel.id,
        name: kernel.name.clone(),
        entry: ENTRY.to_owned(),
        source,
        params: bufs.params(),
        args: bufs.list.clone(),
        launch: Launch::Rows { rows: rows as u64, block: ROW_BLOCK },
        blas: None,
    })
}

fn join_or_zero(terms: &[String]) -> String {
    if terms.is_empty() {
        "0LL".to_owned()
    } else {
        terms.join(" + ")
    }
}

/// Coordinate `t` of linear index `idx` in a shape of extents `ext`.
fn coord(ext: &[usize], t: usize, idx: &str) -> String {
    let stride: usize = ext[t + 1..].iter().product();
    if stride == 1 {
        format!("({idx} % {}LL)", ext[t])
    } else {
        format!("(({idx} / {stride}LL) % {}LL)", ext[t])
    }
}

/// Index into a `from`-shaped value broadcast to `to` for element `idx` of `to`.
fn bcast_into(e: &mut Emitter<'_>, idx: &str, to: &[usize], from: &[usize]) -> String {
    if to == from {
        return idx.to_owned();
    }
    let off = to.len().saturating_sub(from.len());
    let strides = Shape::new(from.to_vec()).strides();
    let terms: Vec<String> = from
        .iter()
        .enumerate()
        .filter(|&(_, &x)| x > 1)
        .map(|(d, _)| format!("{} * {}LL", coord(to, d + off, idx), strides[d]))
        .collect();
    e.def("long long", "t", &join_or_zero(&terms))
}
