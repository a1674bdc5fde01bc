//! Products that cuBLAS stores in a permuted layout (`FusionCaps::layout_epilogue`).
//!
//! A projection whose epilogue ends in a head split (`[B,S,H*D] -> Reshape [B,S,H,D] -> Transpose [B,H,S,D]`, or
//! `[B,H,D,S]` for a transposed key, or a packed `[3,B,H,S,D]`) writes its product straight into the permuted
//! output. The product's index space is refined into factors, each with its stride in the output
//! ([`Factors`]); one call's matrix is the innermost column factor by the innermost row factor (`ldc` the
//! other's output stride: the block written row-major, or column-major when the sequence axis is innermost), the
//! largest other factor is the call's strided batch (the heads, say: `strideC` their output stride, the weight's
//! columns or the activation's rows their operand stride), and the rest are loops of calls (the images of a
//! batch, the parts of a packed projection). The epilogue kernel then reads the product where the output element
//! it writes lives (the same index: in place, no thread reads another's element) and applies the bias,
//! activation and casts there. No launch moves the bytes and no buffer holds the unpermuted product.
//!
//! [`chain_output`] finds the chain (elementwise ops and layout ops from the product to the kernel's one
//! output) and the product's placement in it; [`Store::of`] turns the placement into the call and its loops,
//! `codegen::BlasStep::calls` into the calls with their operands.

use graph_plan::ir::OpCategory;
use graph_plan::{Access, Kernel, Op, ValueId};

use crate::blas::{ColMajorGemm, GemmTypes};

/// Where each element of a value lies in another buffer: the value's row-major index space refined into
/// factors `(extent, element stride)`, outermost first, extents above 1 (their product is the element count).
pub(crate) type Factors = Vec<(usize, usize)>;

/// Most loops of calls around a [`Store`]'s strided batch.
pub const MAX_LOOPS: usize = 4;

/// Most cuBLAS calls one stored product may take; a placement that needs more keeps the per-element product.
pub const MAX_CALLS: usize = 256;

/// A loop of calls around a [`Store`]'s GEMM: `count` calls, each this many elements further into the
/// activation, the weight and C.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Loop {
    /// Iterations.
    pub count: usize,
    /// Element step of the activation (a batch index or a block of rows).
    pub x: usize,
    /// Element step of the weight (a block of its columns).
    pub w: usize,
    /// Element step of the output.
    pub c: usize,
}

/// A product stored in a permuted layout: one column-major GEMM over a strided batch (one factor of the
/// placement: the heads, say), repeated over the other factors' loops (batch indices, the parts of a packed
/// projection).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Store {
    /// One call (operands in `Blas::gemm`'s order: see `weight_first`).
    pub gemm: ColMajorGemm,
    /// The column-major A is the weight (a block of its columns) and B the activation; else A is the
    /// activation (transposed) and B the weight, and C is written with the product's rows innermost.
    pub weight_first: bool,
    /// The loops around the call, outermost first; `loops[..nloops]` are used.
    pub loops: [Loop; MAX_LOOPS],
    /// How many of `loops` are used.
    pub nloops: usize,
}

/// Where a product's epilogue chain ends: the value it writes and, when a Transpose permutes it, the product's
/// [`Factors`] in that value.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Chain {
    /// The written value.
    pub end: ValueId,
    /// The product's placement in `end` (`None`: the same linear order, no Transpose on the way).
    pub factors: Option<Factors>,
    /// Nothing but views and Transposes on the way (the stored product is the output as it is).
    pub layout_only: bool,
}

/// The chain from a product `vy` to a value the kernel writes: each value on the way read by one instruction
/// only, each step an elementwise op of one shape (other operands come from elsewhere), a view or a Transpose,
/// the end a written value. `None` otherwise.
pub(crate) fn chain_output(kernel: &Kernel, vy: ValueId) -> Option<Chain> {
    // Walk forward: each step is the one instruction reading the current value.
    let mut cur = vy;
    let mut steps: Vec<&graph_plan::Instr> = Vec::new();
    loop {
        let mut readers = kernel.body.iter().filter(|i| i.inputs.contains(&cur));
        let Some(next) = readers.next() else { break };
        if readers.next().is_some() || next.outputs.len() != 1 {
            return None;
        }
        let shape_in = kernel.values.get(cur.index())?.shape.dims();
        let out = next.outputs[0];
        let shape_out = kernel.values.get(out.index())?.shape.dims();
        match next.op.category() {
            // Each element from the same index of the chain value: no broadcast of the chain value itself.
            OpCategory::Elementwise if shape_in == shape_out => {}
            OpCategory::View => {}
            OpCategory::DataMovement if matches!(next.op, Op::Transpose { .. }) => {}
            _ => return None,
        }
        steps.push(next);
        cur = out;
    }
    // The end is written by the kernel.
    kernel.param_of(cur, Access::Write)?;
    let layout_only = steps.iter().all(|i| i.op.category() == OpCategory::View || matches!(i.op, Op::Transpose { .. }));
    if !steps.iter().any(|i| matches!(i.op, Op::Transpose { .. })) {
        return Some(Chain { end: cur, factors: None, layout_only });
    }
    let factors = walk_back(kernel, &steps, row_major(kernel.values.get(cur.index())?.shape.dims()))?;
    Some(Chain { end: cur, factors: Some(factors), layout_only })
}

/// `factors` (in the index order of the last step's output) carried back through `steps` to the index order of
/// the first step's input: a view or an elementwise op keeps the linear order, a Transpose reorders the factors
/// of its output's dims into its input's.
fn walk_back(kernel: &Kernel, steps: &[&graph_plan::Instr], mut factors: Factors) -> Option<Factors> {
    for instr in steps.iter().rev() {
        if let Op::Transpose { perm } = &instr.op {
            let input = kernel.values.get(instr.inputs[0].index())?.shape.dims();
            let output = kernel.values.get(instr.outputs[0].index())?.shape.dims();
            let perm: Vec<usize> = perm.clone().unwrap_or_else(|| (0..input.len()).rev().collect());
            let groups = split_into(&factors, output)?;
            let mut by_input: Vec<Option<&Factors>> = vec![None; input.len()];
            for (j, &p) in perm.iter().enumerate() {
                *by_input.get_mut(p)? = Some(groups.get(j)?);
            }
            factors = by_input
                .into_iter()
                .map(|g| g.map(|g| g.iter().copied()))
                .collect::<Option<Vec<_>>>()?
                .into_iter()
                .flatten()
                .collect();
        }
    }
    Some(factors)
}

/// Most selected parts a selection epilogue may route a product to ([`Selected`]); the selected axis itself may be
/// longer (one class token of 197 rows).
pub const MAX_PARTS: usize = 8;

/// A product whose epilogue selects parts of one value (`FusionCaps::select_epilogue`): `T`, reached from the
/// product by elementwise ops, views and Transposes, is read by one Split or by Gathers at constant scalar
/// indices along one axis, each part then (through views, elementwise ops and Transposes) a written value of its
/// own, all placed alike. The product's placement: its [`Factors`] in a part's layout, the factor that walks the parts with
/// stride 0 (each part is a buffer of its own).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Selected {
    /// The placement in a part's layout (every part has the same), the part factor's stride 0.
    pub factors: Factors,
    /// Which of `factors` walks the parts (its extent is the number of parts).
    pub part: usize,
    /// The written value of each part, by part index (`None`: a part nothing selects).
    pub ends: Vec<Option<ValueId>>,
    /// Nothing but views, Transposes and the selections on the way.
    pub layout_only: bool,
}

/// One step of a chain: the single reader of `cur`, when it is an elementwise op of one shape, a view, or (with
/// `transposes`) a Transpose; `None` when `cur` has another number of readers or its reader is anything else.
fn chain_step(kernel: &Kernel, cur: ValueId, transposes: bool) -> Option<&graph_plan::Instr> {
    let mut readers = kernel.body.iter().filter(|i| i.inputs.contains(&cur));
    let next = readers.next()?;
    if readers.next().is_some() || next.outputs.len() != 1 {
        return None;
    }
    let shape_in = kernel.values.get(cur.index())?.shape.dims();
    let shape_out = kernel.values.get(next.outputs[0].index())?.shape.dims();
    match next.op.category() {
        OpCategory::Elementwise if shape_in == shape_out => Some(next),
        OpCategory::View => Some(next),
        OpCategory::DataMovement if transposes && matches!(next.op, Op::Transpose { .. }) => Some(next),
        _ => None,
    }
}

/// The selection epilogue of product `vy` ([`Selected`]); `index_of` gives a constant scalar index operand's value.
/// `None` for any other shape of epilogue.
pub(crate) fn selected_outputs(
    kernel: &Kernel,
    vy: ValueId,
    index_of: &dyn Fn(ValueId) -> Option<i64>,
) -> Option<Selected> {
    let mut cur = vy;
    let mut steps: Vec<&graph_plan::Instr> = Vec::new();
    while let Some(next) = chain_step(kernel, cur, true) {
        steps.push(next);
        cur = next.outputs[0];
    }
    // `cur` is T: read by the selections only, written by nobody.
    if kernel.param_of(cur, Access::Write).is_some() {
        return None;
    }
    let td = kernel.values.get(cur.index())?.shape.dims().to_vec();
    let readers: Vec<&graph_plan::Instr> = kernel.body.iter().filter(|i| i.inputs.contains(&cur)).collect();
    let norm = |axis: i64| -> Option<usize> {
        let a = if axis < 0 { axis + td.len() as i64 } else { axis };
        usize::try_from(a).ok().filter(|&a| a < td.len())
    };
    // (axis, parts, size of a part, the value each selection reads out for each part index).
    let (axis, parts, size, picked): (usize, usize, usize, Vec<(usize, ValueId)>) = match readers.as_slice() {
        [split] if matches!(split.op, Op::Split { .. }) => {
            let Op::Split { axis, splits } = &split.op else { return None };
            let a = norm(*axis)?;
            let k = split.outputs.len();
            let s = *splits.first()?;
            if k < 2 || splits.len() != k || splits.iter().any(|&x| x != s) || s * k != td[a] || split.inputs[0] != cur
            {
                return None;
            }
            (a, k, s, split.outputs.iter().copied().enumerate().collect())
        }
        gathers if !gathers.is_empty() => {
            let mut a = None;
            let mut picked = Vec::new();
            for g in gathers {
                let Op::Gather { axis } = &g.op else { return None };
                let ax = norm(*axis)?;
                if *a.get_or_insert(ax) != ax || g.inputs.first() != Some(&cur) || g.outputs.len() != 1 {
                    return None;
                }
                let i = index_of(*g.inputs.get(1)?)?;
                let i = usize::try_from(if i < 0 { i + td[ax] as i64 } else { i }).ok().filter(|&i| i < td[ax])?;
                if picked.iter().any(|&(j, _)| j == i) {
                    return None;
                }
                picked.push((i, g.outputs[0]));
            }
            (a?, td[a?], 1, picked)
        }
        _ => return None,
    };
    // Each part: views, elementwise ops and Transposes to a written value; every part's selected value placed
    // alike in its own output (the factors of its index order in the output's layout).
    let mut ends: Vec<Option<ValueId>> = vec![None; parts];
    let mut layout_only =
        steps.iter().all(|i| i.op.category() == OpCategory::View || matches!(i.op, Op::Transpose { .. }));
    let mut placement: Option<Factors> = None;
    let mut sel_dims: Option<Vec<usize>> = None;
    for (p, v) in picked {
        let mut end = v;
        let mut post: Vec<&graph_plan::Instr> = Vec::new();
        while let Some(next) = chain_step(kernel, end, true) {
            layout_only &= next.op.category() == OpCategory::View || matches!(next.op, Op::Transpose { .. });
            post.push(next);
            end = next.outputs[0];
        }
        kernel.param_of(end, Access::Write)?;
        let f = walk_back(kernel, &post, row_major(kernel.values.get(end.index())?.shape.dims()))?;
        let dims = kernel.values.get(v.index())?.shape.dims().to_vec();
        if *placement.get_or_insert_with(|| f.clone()) != f || *sel_dims.get_or_insert_with(|| dims.clone()) != dims {
            return None;
        }
        if ends[p].is_some() {
            return None;
        }
        ends[p] = Some(end);
    }
    // In T's index order: each dim's factors as a part places them, the selected axis led by the part factor
    // (stride 0: each part is a buffer of its own). A selected value has T's dims with the axis's extent `size`
    // (a Split) or without the axis (a Gather).
    let (placement, sel_dims) = (placement?, sel_dims?);
    let gather = sel_dims.len() + 1 == td.len();
    if !gather && (sel_dims.len() != td.len() || sel_dims[axis] != size) {
        return None;
    }
    let groups = split_into(&placement, &sel_dims)?;
    let mut factors: Factors = Vec::new();
    for d in 0..td.len() {
        let g = if !gather || d < axis {
            groups.get(d)
        } else if d == axis {
            None
        } else {
            groups.get(d - 1)
        };
        if d == axis {
            factors.push((parts, 0));
        }
        factors.extend(g.into_iter().flatten().copied());
    }
    let factors = walk_back(kernel, &steps, factors)?;
    let zero: Vec<usize> = (0..factors.len()).filter(|&i| factors[i].1 == 0).collect();
    let [part] = zero.as_slice() else { return None };
    if factors[*part].0 != parts {
        return None;
    }
    Some(Selected { part: *part, factors, ends, layout_only })
}

/// Row-major factors of a contiguous value of `dims`.
fn row_major(dims: &[usize]) -> Factors {
    let mut out = Vec::new();
    let mut stride = 1;
    for &d in dims.iter().rev() {
        if d > 1 {
            out.push((d, stride));
        }
        stride *= d;
    }
    out.reverse();
    out
}

/// `factors` grouped by the dims of `dims` (a shape of the same element count, row-major), splitting a factor
/// across dims where needed; `None` when the extents do not divide.
pub(crate) fn split_into(factors: &[(usize, usize)], dims: &[usize]) -> Option<Vec<Factors>> {
    let mut rest: std::collections::VecDeque<(usize, usize)> = factors.iter().copied().collect();
    let mut groups = Vec::with_capacity(dims.len());
    for &d in dims {
        let mut group = Vec::new();
        let mut left = d;
        while left > 1 {
            let (e, s) = rest.pop_front()?;
            if e <= left {
                if left % e != 0 {
                    return None;
                }
                group.push((e, s));
                left /= e;
            } else {
                // Split (e, s) into (left, s * e / left) for this dim and (e / left, s) for the next.
                if e % left != 0 {
                    return None;
                }
                let inner = e / left;
                group.push((left, s * inner));
                rest.push_front((inner, s));
                left = 1;
            }
        }
        groups.push(group);
    }
    rest.is_empty().then_some(groups)
}

/// Which operand dimension a factor of the product's placement walks.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Axis {
    Batch,
    Row,
    Col,
}

/// A factor of the product's placement, with what one step of it moves in each operand.
#[derive(Clone, Copy)]
struct Step {
    extent: usize,
    /// Elements in the output.
    c: usize,
    /// Elements in the product's row-major index.
    linear: usize,
    axis: Axis,
}

impl Store {
    /// The calls that store the row-major product `x [batch.., m, k] * w [k, n]` (the weight without batch dims,
    /// neither transposed) placed by `factors` (its [`Factors`] in the output). The matrix of one call is the
    /// product's innermost column factor by its innermost row factor, one of them contiguous in the output
    /// (else `None`); the largest other factor is the call's strided batch and the rest are loops of calls
    /// ([`MAX_LOOPS`], [`MAX_CALLS`] at most, else `None`).
    pub(crate) fn of(
        batch: &[usize],
        m: usize,
        n: usize,
        k: usize,
        factors: &[(usize, usize)],
        types: GemmTypes,
    ) -> Option<Self> {
        let mut dims = batch.to_vec();
        dims.extend([m, n]);
        let groups = split_into(factors, &dims)?;
        let rank = dims.len();
        let mut steps: Vec<Step> = Vec::with_capacity(factors.len());
        for (d, group) in groups.iter().enumerate() {
            let axis = match rank - 1 - d {
                0 => Axis::Col,
                1 => Axis::Row,
                _ => Axis::Batch,
            };
            steps.extend(group.iter().map(|&(extent, c)| Step { extent, c, linear: 0, axis }));
        }
        let mut linear = 1usize;
        for s in steps.iter_mut().rev() {
            s.linear = linear;
            linear = linear.checked_mul(s.extent)?;
        }
        // What a step moves: a batch index or rows of the activation, columns of the weight.
        let moves = |s: &Step| -> (usize, usize) {
            match s.axis {
                Axis::Batch => (s.linear / (m * n) * (m * k), 0),
                Axis::Row => (s.linear / n * k, 0),
                Axis::Col => (0, s.linear),
            }
        };
        // A factor of stride 0 walks the parts of a selection epilogue (`Selected`): each part is a buffer of its
        // own, so it must be a loop of calls, never the matrix or the strided batch.
        let col = steps.iter().position(|s| s.axis == Axis::Col && s.linear == 1).filter(|&i| steps[i].c != 0)?;
        let row = steps.iter().position(|s| s.axis == Axis::Row && s.linear == n && s.c != 0);
        let (d, d_stride) = (steps[col].extent, steps[col].c);
        let (rows, row_stride) = row.map_or((1, None), |r| (steps[r].extent, Some(steps[r].c)));
        let weight_first = if d_stride == 1 {
            true
        } else if row_stride == Some(1) || rows == 1 {
            false
        } else {
            return None;
        };
        let mut rest: Vec<Step> =
            steps.iter().enumerate().filter(|&(i, _)| i != col && Some(i) != row).map(|(_, s)| *s).collect();
        // The strided batch: the largest remaining factor; the others loop, in the output's order.
        let batch_at = (0..rest.len()).filter(|&i| rest[i].c != 0).max_by_key(|&i| (rest[i].extent, usize::MAX - i));
        let (batch_count, stride_x, stride_w, stride_c) = match batch_at {
            Some(i) => {
                let b = rest.remove(i);
                let (x, w) = moves(&b);
                (b.extent, x, w, b.c)
            }
            None => (1, 0, 0, 0),
        };
        if rest.len() > MAX_LOOPS {
            return None;
        }
        // The part loop of a selection epilogue (output step 0) runs only its selected parts: not counted here.
        let calls = rest.iter().filter(|s| s.c != 0).try_fold(1usize, |acc, s| acc.checked_mul(s.extent))?;
        if calls > MAX_CALLS {
            return None;
        }
        let mut loops = [Loop::default(); MAX_LOOPS];
        for (l, s) in loops.iter_mut().zip(&rest) {
            let (x, w) = moves(s);
            *l = Loop { count: s.extent, x, w, c: s.c };
        }
        let base = ColMajorGemm {
            trans_a: false,
            trans_b: false,
            m: 0,
            n: 0,
            k,
            lda: 0,
            ldb: 0,
            ldc: 0,
            batch: batch_count,
            stride_a: 0,
            stride_b: 0,
            stride_c,
            alpha: 1.0,
            beta: 0.0,
            types,
        };
        let gemm = if weight_first {
            // C^T (d x rows, column-major, ldc = the row stride) = W block^T (d x k, ld n) * X^T (k x rows, ld k).
            ColMajorGemm {
                m: d,
                n: rows,
                lda: n,
                ldb: k,
                ldc: row_stride.unwrap_or(d),
                stride_a: stride_w,
                stride_b: stride_x,
                ..base
            }
        } else {
            // C (rows x d, column-major, ldc = the column stride) = X (row-major: transposed) * W block (transposed).
            ColMajorGemm {
                trans_a: true,
                trans_b: true,
                m: rows,
                n: d,
                lda: k,
                ldb: n,
                ldc: d_stride,
                stride_a: stride_x,
                stride_b: stride_w,
                ..base
            }
        };
        Some(Store { gemm, weight_first, loops, nloops: rest.len() })
    }

    /// The loops in use.
    #[must_use]
    pub fn loops(&self) -> &[Loop] {
        &self.loops[..self.nloops.min(MAX_LOOPS)]
    }

    /// How many calls the loops make.
    #[must_use]
    pub fn calls(&self) -> usize {
        self.loops().iter().map(|l| l.count).product()
    }

    /// The element offsets (activation, weight, output) of every call, in loop order (the last loop fastest).
    #[must_use]
    pub fn offsets(&self) -> Vec<(usize, usize, usize)> {
        self.offsets_parts().into_iter().map(|(x, w, c, _)| (x, w, c)).collect()
    }

    /// [`Store::offsets`] with each call's part: the iteration of the loop whose output step is 0 (a selection
    /// epilogue's parts, each a buffer of its own), 0 without one.
    #[must_use]
    pub fn offsets_parts(&self) -> Vec<(usize, usize, usize, usize)> {
        let mut out = vec![(0usize, 0usize, 0usize, 0usize)];
        for l in self.loops() {
            let part = l.c == 0;
            out = out
                .into_iter()
                .flat_map(|(x, w, c, p)| {
                    (0..l.count).map(move |i| (x + i * l.x, w + i * l.w, c + i * l.c, if part { i } else { p }))
                })
                .collect();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn factors_split_across_dims() {
        assert_eq!(split_into(&[(768, 1)], &[1, 12, 64]).unwrap(), vec![vec![], vec![(12, 64)], vec![(64, 1)]]);
        assert_eq!(split_into(&[(4, 3), (6, 1)], &[2, 12]).unwrap(), vec![vec![(2, 6)], vec![(2, 3), (6, 1)]]);
        assert!(split_into(&[(6, 1)], &[4, 3]).is_none(), "4 does not divide 6's factors");
        assert!(split_into(&[(6, 1)], &[2, 2]).is_none(), "element counts differ");
    }

    #[test]
    fn head_splits_are_strided_batches() {
        let t = GemmTypes::F32;
        // [1,128,768] -> [1,128,12,64] -> [1,12,128,64]: the product (s, h, d) at h*8192 + s*64 + d.
        let s = Store::of(&[1], 128, 768, 768, &[(128, 64), (12, 8192), (64, 1)], t).unwrap();
        assert!(s.weight_first);
        let g = s.gemm;
        assert_eq!((g.m, g.n, g.k, g.lda, g.ldb, g.ldc), (64, 128, 768, 768, 768, 64));
        assert_eq!((g.batch, g.stride_a, g.stride_b, g.stride_c, s.calls()), (12, 64, 0, 8192, 1));
        // The key's [1,12,64,128]: (s, h, d) at h*8192 + d*128 + s, the rows innermost.
        let s = Store::of(&[1], 128, 768, 768, &[(128, 1), (12, 8192), (64, 128)], t).unwrap();
        assert!(!s.weight_first);
        let g = s.gemm;
        assert_eq!((g.trans_a, g.trans_b, g.m, g.n, g.lda, g.ldb, g.ldc), (true, true, 128, 64, 768, 768, 128));
        assert_eq!((g.batch, g.stride_a, g.stride_b, g.stride_c), (12, 0, 64, 8192));
        // Batch 2, 2 heads of 4 (x [2,4,3], out [2,2,4,4]): of two factors of one extent the outer one is the
        // strided batch (the images: 12 activation elements apart), the heads a loop (4 weight columns apart).
        let s = Store::of(&[2], 4, 8, 3, &[(2, 32), (4, 4), (2, 16), (4, 1)], t).unwrap();
        assert_eq!((s.gemm.batch, s.gemm.stride_a, s.gemm.stride_b, s.gemm.stride_c), (2, 0, 12, 32));
        assert_eq!(s.loops(), &[Loop { count: 2, x: 0, w: 4, c: 16 }]);
        assert_eq!(s.offsets(), vec![(0, 0, 0), (0, 4, 16)]);
        // A ViT's packed qkv [1,4,24] -> [1,4,3,2,4] -> [3,1,2,4,4]: (s, part, h, d) at part*32 + h*16 + s*4 + d.
        // The parts (3) and heads (2): the parts are the batch, the heads a loop (the weight's columns 4 apart).
        let s = Store::of(&[1], 4, 24, 5, &[(4, 4), (3, 32), (2, 16), (4, 1)], t).unwrap();
        assert!(s.weight_first);
        assert_eq!((s.gemm.batch, s.gemm.stride_a, s.gemm.stride_b, s.gemm.stride_c), (3, 8, 0, 32));
        assert_eq!(s.offsets(), vec![(0, 0, 0), (0, 4, 16)]);
        // Neither the columns nor the rows contiguous: no cuBLAS layout.
        assert!(Store::of(&[1], 4, 8, 3, &[(4, 2), (8, 4)], t).is_none());
    }
}
