//! Row kernels: one block per output row. Threads stride over the row's elements (each computed through the
//! per-element emitter, so fused elementwise producers need no buffer), reduce in registers, then combine with
//! warp shuffles and one shared-memory step across the block's warps.

use graph_plan::{Access, Kernel, Op, Shape, ValueId};

use super::emit::{compute_type, flit, lowest, norm_axis, round, store, Emitter, RowValue, PRELUDE};
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

/// The integer counterparts, emitted only into integer reductions (so float kernels keep their text): partial
/// results accumulate in 64 bits and add as unsigned, so a sum wraps (two's complement) instead of overflowing.
const BLOCK_HELPERS_I64: &str = r#"__device__ __forceinline__ long long warp_sum_i64(long long v) {
    for (int o = 16; o > 0; o >>= 1) v = (long long)((unsigned long long)v + (unsigned long long)__shfl_down_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ long long warp_max_i64(long long v) {
    for (int o = 16; o > 0; o >>= 1) { const long long w = __shfl_down_sync(0xffffffffu, v, o); v = w > v ? w : v; }
    return v;
}
__device__ long long block_sum_i64(long long v, long long* sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    v = warp_sum_i64(v);
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    v = (threadIdx.x < warps) ? sh[threadIdx.x] : 0LL;
    if (warp == 0) v = warp_sum_i64(v);
    if (threadIdx.x == 0) sh[0] = v;
    __syncthreads();
    const long long r = sh[0];
    __syncthreads();
    return r;
}
__device__ long long block_max_i64(long long v, long long* sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    v = warp_max_i64(v);
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    v = (threadIdx.x < warps) ? sh[threadIdx.x] : (-9223372036854775807LL - 1LL);
    if (warp == 0) v = warp_max_i64(v);
    if (threadIdx.x == 0) sh[0] = v;
    __syncthreads();
    const long long r = sh[0];
    __syncthreads();
    return r;
}
"#;

/// The axes `red` reduces over its input (sorted, distinct), and what it computes.
fn reduction_of(kernel: &Kernel, red: &graph_plan::Instr) -> CudaResult<(Vec<usize>, Shape3)> {
    let xv = *red.inputs.first().ok_or_else(|| unsupported(kernel, format!("node '{}' lacks operands", red.node)))?;
    let rank = value_checked(kernel, xv)?.shape.rank();
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
    Ok(match &red.op {
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
    })
}

/// A reduction domain: the input shape and the reduced axes.
type Domain = (Vec<usize>, Vec<usize>);

/// A domain with leading extent-1 axes stripped (the fusion pass compares domains that way): the shape and the
/// reduced axes renumbered.
fn canonical(xs: &[usize], reduced: &[usize]) -> Domain {
    let lead = xs.iter().take_while(|&&d| d == 1).count().min(xs.len().saturating_sub(1));
    let axes = reduced.iter().filter(|&&a| a >= lead && xs[a] != 1).map(|&a| a - lead).collect();
    (xs[lead..].to_vec(), axes)
}

/// A fused row kernel (`FusionCaps::reduction_fusion`): reductions sharing one domain `(S, A)` with elementwise
/// producers and consumers, where every value is a full row value (shape `S`, one per element) or a reduced one
/// (one per row). One block per row; for each reduction in program order, one pass over the row per partial result
/// (its producers computed inline at each element, reading earlier per-row results), combined across the block;
/// per-row values computed once, after the reductions they need; a last pass writes the full-shaped outputs and
/// thread 0 the per-row ones. Integer ReduceSum/Mean/Max accumulate in 64 bits, as the plain path.
fn fused(kernel: &Kernel) -> CudaResult<KernelSource> {
    // The domain, from the first reduction; every other must agree with it.
    let mut domain: Option<(Vec<usize>, Vec<usize>, Domain)> = None;
    let mut integer = false;
    for red in kernel.body.iter().filter(|i| is_reduction(i)) {
        let xv =
            *red.inputs.first().ok_or_else(|| unsupported(kernel, format!("node '{}' lacks operands", red.node)))?;
        let x = value_checked(kernel, xv)?;
        let (reduced, what) = reduction_of(kernel, red)?;
        // Integer inputs: sums, means and maxima (ONNX defines no integer Softmax or LayerNormalization).
        if !x.dtype.is_float() && (x.dtype == graph_plan::DType::Bool || !matches!(what, Shape3::Reduce { .. })) {
            return Err(unsupported(
                kernel,
                format!("{} over {} in a row kernel (node '{}')", red.op.name(), x.dtype, red.node),
            ));
        }
        integer |= !x.dtype.is_float();
        let canon = canonical(x.shape.dims(), &reduced);
        match &domain {
            None => domain = Some((x.shape.dims().to_vec(), reduced, canon)),
            Some((_, _, c)) if *c == canon => {}
            Some((xs, a, _)) => {
                return Err(unsupported(
                    kernel,
                    format!(
                        "reductions over different domains in one kernel: {xs:?} axes {a:?} and {:?} axes {reduced:?} \
                         (node '{}')",
                        x.shape.dims(),
                        red.node
                    ),
                ))
            }
        }
    }
    let Some((xs, reduced, _)) = domain else {
        return Err(unsupported(kernel, "a reduction kernel without a reduction"));
    };
    let layout = RowLayout::new(&xs, &reduced);
    let (rows, len) = (layout.rows, layout.len);
    let numel = |v: ValueId| -> CudaResult<usize> {
        let val = value_checked(kernel, v)?;
        val.shape.numel().ok_or_else(|| unsupported(kernel, format!("shape {} overflows", val.shape)))
    };
    // Per-row values; with one element per row every value is both, and is computed per element.
    let per_row = |v: ValueId| -> CudaResult<bool> { Ok(len != 1 && numel(v)? == rows) };
    // Computed values must be full or per-row; operands from outside broadcast into them (a LayerNorm scale), and
    // so may the loads (data movement of outside tensors) that the kernel computes inline at whatever element their
    // readers ask for and never writes: bert's position rows, `[1, S, H]` in a `[B, S, H]` domain, or a class token
    // and a patch grid before their Concat. Those are never per-row values, whatever their element count.
    let written = |v: ValueId| kernel.params.iter().any(|p| p.value == v && p.access == Access::Write);
    let moves = |i: &graph_plan::Instr| i.op.category() == graph_plan::ir::OpCategory::DataMovement;
    // A load's result, or a value only loads read (a Cast before a Gather): computed where it is asked for.
    let inline_load = |instr: &graph_plan::Instr, v: ValueId| {
        !written(v) && (moves(instr) || kernel.body.iter().filter(|i| i.inputs.contains(&v)).all(&moves))
    };
    // Row selections (`FusionCaps::select_rows`): a written Gather at a scalar index along a row axis of a full
    // row value with the rows last; the block of a selected row writes it ([`RowSelection`]).
    let mut selections: Vec<RowSelection> = Vec::new();
    for instr in &kernel.body {
        let computed = |x: &ValueId| kernel.body.iter().any(|i| !moves(i) && i.outputs.contains(x));
        if moves(instr) && instr.outputs.iter().any(|&v| written(v)) && instr.inputs.first().is_some_and(computed) {
            match row_selection(kernel, instr, &xs, &reduced)? {
                Some(sel) => {
                    selections.push(sel);
                    continue;
                }
                None => {
                    return Err(unsupported(
                        kernel,
                        format!("a selection of computed rows in a row kernel (node '{}')", instr.node),
                    ))
                }
            }
        }
        for &v in &instr.outputs {
            if inline_load(instr, v) {
                continue;
            }
            let n = numel(v)?;
            if n != rows && n != rows * len {
                return Err(unsupported(
                    kernel,
                    format!(
                        "value '{}' of {n} elements is neither a row value ({} elements) nor a per-row one ({rows}) \
                         (node '{}')",
                        value_checked(kernel, v)?.name,
                        rows * len,
                        instr.node
                    ),
                ));
            }
        }
    }

    let bufs = Buffers::of(kernel)?;
    let mut e = Emitter::new(kernel, &bufs, Vec::new())?;
    e.indent = 1;
    e.line("__shared__ float sh[32];");
    if integer {
        e.line("__shared__ long long shl[32];");
    }
    e.line("const long long r = blockIdx.x;");
    e.line(&format!("const long long base = {};", layout.base()));
    let off = |j: &str| layout.offset(j);
    // One pass over the row accumulating `body(acc, element)` into a fresh `float` (or, `wide`, `long long` with
    // the element widened) initialised to `init`; returns the accumulator's name.
    let pass = |e: &mut Emitter<'_>,
                xv: ValueId,
                wide: bool,
                init: &str,
                body: &dyn Fn(&str, &str) -> String|
     -> CudaResult<String> {
        let acc = e.fresh("acc");
        e.line(&format!("{} {acc} = {init};", if wide { "long long" } else { "float" }));
        let j = e.fresh("j");
        e.open(&format!("for (long long {j} = threadIdx.x; {j} < {len}LL; {j} += blockDim.x)"));
        let i = e.def("long long", "i", &format!("base + {}", off(&j)));
        let v = e.at(xv, &i)?;
        let v = if wide { format!("(long long){v}") } else { v };
        e.line(&body(&acc, &v));
        e.close();
        Ok(acc)
    };
    let ninf = "-__int_as_float(0x7f800000)";
    let len_f = flit(len as f32);
    for instr in &kernel.body {
        if !is_reduction(instr) {
            // Per-row values are computed once, as soon as the reductions they read are done.
            for &o in &instr.outputs {
                if per_row(o)? && !inline_load(instr, o) && !selections.iter().any(|s| s.out == o) {
                    let name = e.at(o, "r")?;
                    e.rows.insert(o, RowValue::Scalar(name));
                }
            }
            continue;
        }
        let (Some(&xv), Some(&yv)) = (instr.inputs.first(), instr.outputs.first()) else {
            return Err(unsupported(kernel, format!("node '{}' lacks operands", instr.node)));
        };
        let yd = value_checked(kernel, yv)?.dtype;
        let (_, what) = reduction_of(kernel, instr)?;
        match what {
            Shape3::Reduce { max, mean } if !value_checked(kernel, xv)?.dtype.is_float() => {
                // As the plain path: 64-bit partials, sums wrap (two's complement), means truncate toward zero.
                let tot = if max {
                    let lo = lowest(graph_plan::DType::I64);
                    let acc = pass(&mut e, xv, true, &lo, &|a, v| format!("{a} = {v} > {a} ? {v} : {a};"))?;
                    format!("block_max_i64({acc}, shl)")
                } else {
                    let acc = pass(&mut e, xv, true, "0LL", &|a, v| {
                        format!("{a} = (long long)((unsigned long long){a} + (unsigned long long){v});")
                    })?;
                    format!("block_sum_i64({acc}, shl)")
                };
                let tot = e.def("long long", "s", &tot);
                if mean && len == 0 {
                    return Err(unsupported(
                        kernel,
                        format!("integer mean over an empty axis (node '{}')", instr.node),
                    ));
                }
                let res = if mean { format!("{tot} / {len}LL") } else { tot };
                let ct = compute_type(yd);
                let name = e.def(ct, "s", &round(&format!("({ct})({res})"), yd));
                e.rows.insert(yv, RowValue::Scalar(name));
            }
            Shape3::Reduce { max, mean } => {
                let tot = if max {
                    let acc = pass(&mut e, xv, false, ninf, &|a, v| format!("{a} = fmaxf({a}, {v});"))?;
                    format!("block_max({acc}, sh)")
                } else {
                    let acc = pass(&mut e, xv, false, "0.0f", &|a, v| format!("{a} += {v};"))?;
                    format!("block_sum({acc}, sh)")
                };
                let tot = e.def("float", "s", &tot);
                let res = if mean { format!("{tot} / {len_f}") } else { tot };
                let name = e.def("float", "s", &round(&res, yd));
                e.rows.insert(yv, RowValue::Scalar(name));
            }
            Shape3::Softmax => {
                let mx = pass(&mut e, xv, false, ninf, &|a, v| format!("{a} = fmaxf({a}, {v});"))?;
                let max = e.def("float", "s", &format!("block_max({mx}, sh)"));
                let sm = pass(&mut e, xv, false, "0.0f", &|a, v| format!("{a} += expf({v} - {max});"))?;
                let sum = e.def("float", "s", &format!("block_sum({sm}, sh)"));
                e.rows.insert(yv, RowValue::Softmax { x: xv, max, sum });
            }
            Shape3::LayerNorm { epsilon, scale, bias } => {
                let s1 = pass(&mut e, xv, false, "0.0f", &|a, v| format!("{a} += {v};"))?;
                let mean = e.def("float", "s", &format!("block_sum({s1}, sh) / {len_f}"));
                let s2 = pass(&mut e, xv, false, "0.0f", &|a, v| format!("{a} += ({v} - {mean}) * ({v} - {mean});"))?;
                let rstd =
                    e.def("float", "s", &format!("1.0f / sqrtf(block_sum({s2}, sh) / {len_f} + {})", flit(epsilon)));
                e.rows.insert(yv, RowValue::LayerNorm { x: xv, mean, rstd, scale, bias });
            }
        }
    }
    // Outputs: full row values in one last pass, per-row ones by thread 0.
    let mut full = Vec::new();
    let mut row_writes = Vec::new();
    for (pi, p) in kernel.params.iter().enumerate() {
        if p.access != Access::Write || selections.iter().any(|s| s.out == p.value) {
            continue;
        }
        let b = bufs.of_param[pi];
        let d = value_checked(kernel, p.value)?.dtype;
        match e.rows.get(&p.value) {
            Some(RowValue::Scalar(name)) if per_row(p.value)? || numel(p.value)? == rows => {
                row_writes.push(format!("b{b}[r] = {};", store(name, d)));
            }
            _ => full.push((p.value, b, d)),
        }
    }
    if !full.is_empty() {
        let j = e.fresh("j");
        e.open(&format!("for (long long {j} = threadIdx.x; {j} < {len}LL; {j} += blockDim.x)"));
        let i = e.def("long long", "i", &format!("base + {}", off(&j)));
        for (v, b, d) in full {
            let x = e.at(v, &i)?;
            e.line(&format!("b{b}[{i}] = {};", store(&x, d)));
        }
        e.close();
    }
    // Row selections: the block whose row has the selected coordinate writes its row of the selection, reading
    // the Gather at its own index (which maps back to this block's row).
    for sel in &selections {
        let b = bufs.of_param[kernel
            .params
            .iter()
            .position(|p| p.value == sel.out && p.access == Access::Write)
            .ok_or_else(|| unsupported(kernel, "a row selection without a buffer"))?];
        let d = value_checked(kernel, sel.out)?.dtype;
        let index = e.at(sel.index, "0LL")?;
        let at = e.def(
            "long long",
            "t",
            &format!("((long long){index} < 0 ? (long long){index} + {}LL : (long long){index})", sel.extent),
        );
        // The row's coordinate on the selected axis (a kept axis: the same for every element of the row).
        let here = coord(&sel.dims, sel.axis, "base");
        e.open(&format!("if ({here} == {at})"));
        let j = e.fresh("j");
        e.open(&format!("for (long long {j} = threadIdx.x; {j} < {len}LL; {j} += blockDim.x)"));
        let iu = e.def("long long", "i", &format!("base + {}", off(&j)));
        let i = e.def("long long", "i", &sel.out_index(&iu));
        let x = e.at(sel.out, &i)?;
        e.line(&format!("b{b}[{i}] = {};", store(&x, d)));
        e.close();
        e.close();
    }
    if !row_writes.is_empty() {
        e.open("if (threadIdx.x == 0)");
        for w in &row_writes {
            e.line(w);
        }
        e.close();
    }
    let body = std::mem::take(&mut e.out);
    let helpers = if integer { format!("{BLOCK_HELPERS}{BLOCK_HELPERS_I64}") } else { BLOCK_HELPERS.to_owned() };
    Ok(row_kernel_source(kernel, &bufs, &helpers, &body, rows))
}

/// A row selection of a fused row kernel: `out = Gather(x, index, axis)` with `x` a full row value (`dims`, the
/// domain's shape up to leading 1s, in the same linear order) and `axis` a kept axis of the domain.
struct RowSelection {
    out: ValueId,
    index: ValueId,
    axis: usize,
    extent: usize,
    dims: Vec<usize>,
}

impl RowSelection {
    /// The index in `out` of element `iu` of `x` (on a selected row): its coordinates without `axis`.
    fn out_index(&self, iu: &str) -> String {
        let mut terms = Vec::new();
        let mut stride = 1usize;
        for d in (0..self.dims.len()).rev() {
            if d == self.axis {
                continue;
            }
            if self.dims[d] > 1 {
                let c = coord(&self.dims, d, iu);
                terms.push(if stride == 1 { c } else { format!("{c} * {stride}LL") });
            }
            stride *= self.dims[d];
        }
        join_or_zero(&terms)
    }
}

/// `instr` as a [`RowSelection`] of a domain over `xs` reducing `reduced`, when it is one: a Gather of a value of
/// the domain's full shape (up to leading 1s) along a kept axis, the index a scalar operand.
fn row_selection(
    kernel: &Kernel,
    instr: &graph_plan::Instr,
    xs: &[usize],
    reduced: &[usize],
) -> CudaResult<Option<RowSelection>> {
    let Op::Gather { axis } = &instr.op else { return Ok(None) };
    let (Some(&x), Some(&index), Some(&out)) = (instr.inputs.first(), instr.inputs.get(1), instr.outputs.first())
    else {
        return Ok(None);
    };
    let (xv, iv) = (value_checked(kernel, x)?, value_checked(kernel, index)?);
    let dims = xv.shape.dims();
    let strip = |v: &[usize]| -> Vec<usize> { v.iter().copied().skip_while(|&e| e == 1).collect() };
    let rank = dims.len();
    let a = if *axis < 0 { *axis + rank as i64 } else { *axis };
    let Some(a) = usize::try_from(a).ok().filter(|&a| a < rank) else { return Ok(None) };
    // The same axis in the domain's dims (which may have other leading 1s): counted from the end.
    let from_end = rank - a;
    let kept = xs.len().checked_sub(from_end).is_some_and(|ax| !reduced.contains(&ax));
    if strip(dims) != strip(xs) || iv.shape.numel() != Some(1) || iv.dtype.is_float() || !kept {
        return Ok(None);
    }
    Ok(Some(RowSelection { out, index, axis: a, extent: dims[a], dims: dims.to_vec() }))
}

/// What one row kernel computes.
enum Shape3 {
    /// Sum, mean or max of each row into one output element.
    Reduce { max: bool, mean: bool },
    /// Softmax over each row.
    Softmax,
    /// LayerNormalization of each row (scale, optional bias).
    LayerNorm { epsilon: f32, scale: ValueId, bias: Option<ValueId> },
}

fn is_reduction(i: &graph_plan::Instr) -> bool {
    i.op.category() == graph_plan::ir::OpCategory::Reduction
}

/// A row kernel: one reduction as the last op writing only its result (the plain path, which also takes integer
/// inputs), or a fused row kernel ([`fused`]).
pub(crate) fn generate(kernel: &Kernel) -> CudaResult<KernelSource> {
    let reductions = kernel.body.iter().filter(|i| is_reduction(i)).count();
    let (ri, red) = kernel
        .body
        .iter()
        .enumerate()
        .find(|(_, i)| is_reduction(i))
        .ok_or_else(|| unsupported(kernel, "a reduction kernel without a reduction"))?;
    let writes = kernel.params.iter().filter(|p| p.access == Access::Write).count();
    if reductions > 1 || ri + 1 != kernel.body.len() || writes != 1 {
        return fused(kernel);
    }
    let (Some(&xv), Some(&yv)) = (red.inputs.first(), red.outputs.first()) else {
        return Err(unsupported(kernel, format!("node '{}' lacks operands", red.node)));
    };
    let x = value_checked(kernel, xv)?;
    let y = value_checked(kernel, yv)?;
    // Integer inputs: ReduceSum/Mean/Max only (ONNX defines no integer Softmax, LayerNormalization or pooling).
    let integer = !x.dtype.is_float();
    let int_ok = matches!(red.op, Op::ReduceSum { .. } | Op::ReduceMean { .. } | Op::ReduceMax { .. })
        && x.dtype != graph_plan::DType::Bool;
    if integer && !int_ok {
        return Err(unsupported(kernel, format!("{} over {} (node '{}')", red.op.name(), x.dtype, red.node)));
    }
    let xs = x.shape.dims().to_vec();
    let (reduced, what) = reduction_of(kernel, red)?;
    let layout = RowLayout::new(&xs, &reduced);
    let (rows, len) = (layout.rows, layout.len);

    let bufs = Buffers::of(kernel)?;
    let mut e = Emitter::new(kernel, &bufs, Vec::new())?;
    e.indent = 1;
    e.line(if integer { "__shared__ long long sh[32];" } else { "__shared__ float sh[32];" });
    e.line("const long long r = blockIdx.x;");
    e.line(&format!("const long long base = {};", layout.base()));
    let off = |j: &str| layout.offset(j);
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
        Shape3::Reduce { max, mean } if integer => {
            // Integer mean truncates toward zero, as the simulator's.
            let pass_ll = |e: &mut Emitter<'_>, init: &str, body: &dyn Fn(&str) -> String| -> CudaResult<()> {
                e.line(&format!("long long acc = {init};"));
                let j = e.fresh("j");
                e.open(&format!("for (long long {j} = threadIdx.x; {j} < {len}LL; {j} += blockDim.x)"));
                let i = e.def("long long", "i", &format!("base + {}", off(&j)));
                let v = e.at(xv, &i)?;
                e.line(&body(&format!("(long long){v}")));
                e.close();
                Ok(())
            };
            if max {
                pass_ll(&mut e, &lowest(graph_plan::DType::I64), &|v| format!("acc = {v} > acc ? {v} : acc;"))?;
                e.line("const long long tot = block_max_i64(acc, sh);");
            } else {
                pass_ll(&mut e, "0LL", &|v| {
                    format!("acc = (long long)((unsigned long long)acc + (unsigned long long){v});")
                })?;
                e.line("const long long tot = block_sum_i64(acc, sh);");
            }
            if mean && len == 0 {
                return Err(unsupported(kernel, format!("integer mean over an empty axis (node '{}')", red.node)));
            }
            let res = if mean { format!("tot / {len}LL") } else { "tot".to_owned() };
            e.line(&format!("if (threadIdx.x == 0) b{yb}[r] = {};", store(&res, yd)));
        }
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
            let norm_shape: Vec<usize> = layout.reduced.iter().map(|a| a.1).collect();
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
    let helpers = if integer { BLOCK_HELPERS_I64 } else { BLOCK_HELPERS };
    Ok(row_kernel_source(kernel, &bufs, helpers, &body, rows))
}

/// The source of a row kernel (one block per row) from its helpers and body.
fn row_kernel_source(kernel: &Kernel, bufs: &Buffers, helpers: &str, body: &str, rows: usize) -> KernelSource {
    let source =
        format!("{PRELUDE}{helpers}\nextern \"C\" __global__ void {ENTRY}({}) {{\n{body}}}\n", bufs.signature());
    KernelSource {
        kernel: kernel.id,
        name: kernel.name.clone(),
        entry: ENTRY.to_owned(),
        source,
        params: bufs.params(),
        args: bufs.list.clone(),
        launch: Launch::Rows { rows: rows as u64, block: ROW_BLOCK },
        blas: Vec::new(),
    }
}

/// How a row kernel addresses its input: block `r` takes the row at the kept axes' coordinates of `r`, and
/// reduced index `j` walks the reduced axes (size-1 axes contribute nothing). Shared by every row kernel.
struct RowLayout {
    /// Kept axes and their extents.
    kept: Vec<(usize, usize)>,
    /// Reduced axes and their extents.
    reduced: Vec<(usize, usize)>,
    /// Row-major strides of the input.
    strides: Vec<usize>,
    /// Number of rows (blocks).
    rows: usize,
    /// Elements per row.
    len: usize,
}

impl RowLayout {
    fn new(dims: &[usize], reduced: &[usize]) -> RowLayout {
        let kept: Vec<(usize, usize)> =
            (0..dims.len()).filter(|d| !reduced.contains(d)).map(|d| (d, dims[d])).collect();
        let reduced: Vec<(usize, usize)> = reduced.iter().map(|&d| (d, dims[d])).collect();
        let rows = kept.iter().map(|k| k.1).product();
        let len = reduced.iter().map(|k| k.1).product();
        RowLayout { kept, reduced, strides: Shape::new(dims.to_vec()).strides(), rows, len }
    }

    /// The C expression of the linear index, over the axes `axes`, of the element whose coordinates come from
    /// the flat index variable `idx`.
    fn linear(&self, axes: &[(usize, usize)], idx: &str) -> String {
        let ext: Vec<usize> = axes.iter().map(|a| a.1).collect();
        let terms: Vec<String> = axes
            .iter()
            .enumerate()
            .filter(|&(_, a)| a.1 > 1)
            .map(|(t, a)| format!("{} * {}LL", coord(&ext, t, idx), self.strides[a.0]))
            .collect();
        join_or_zero(&terms)
    }

    /// Offset of row `r`'s first element.
    fn base(&self) -> String {
        self.linear(&self.kept, "r")
    }

    /// Offset of reduced index `j` within a row.
    fn offset(&self, j: &str) -> String {
        self.linear(&self.reduced, j)
    }
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
