//! Products that cuBLAS stores in a permuted layout (`FusionCaps::layout_epilogue`).
//!
//! A projection whose epilogue ends in a head split (`[B,S,H*D] -> Reshape [B,S,H,D] -> Transpose [B,H,S,D]`, or
//! `[B,H,D,S]` for a transposed key) writes its product straight into the permuted output: for each batch index,
//! one strided-batched GEMM over the heads, each head's `S x D` block of the product landing at its place in the
//! output (`ldc` the output's row stride, `strideC` its head stride; or, with the sequence axis innermost, the
//! block written column-major). The epilogue kernel then reads the product where the output element it writes
//! lives (the same index: in place, no thread reads another's element) and applies the bias, activation and
//! casts there. No launch moves the bytes and no buffer holds the unpermuted product.
//!
//! [`Store::of`] finds the chain (elementwise ops and layout ops from the product to the kernel's one output) and
//! the product's placement in that output; `codegen::blas_anchor` turns it into the calls ([`Store::calls`]).

use graph_plan::ir::OpCategory;
use graph_plan::{Access, Kernel, Op, ValueId};

use crate::blas::{ColMajorGemm, GemmTypes};

/// Where each element of a value lies in another buffer: the value's row-major index space refined into
/// factors `(extent, element stride)`, outermost first, extents above 1 (their product is the element count).
pub(crate) type Factors = Vec<(usize, usize)>;

/// A product stored in a permuted layout: the column-major call for one batch index (a strided batch over the
/// heads), repeated for every batch index of the product.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Store {
    /// One call (operands in `Blas::gemm`'s order: see `weight_first`), batch over the heads.
    pub gemm: ColMajorGemm,
    /// The column-major A is the weight (a head's block of its columns) and B the activation; else A is the
    /// activation (transposed) and B the weight, and C is written with the product's rows innermost.
    pub weight_first: bool,
    /// Calls: one per index of the product's batch dims.
    pub outer: usize,
    /// Elements between consecutive calls' activation matrices.
    pub outer_stride_x: usize,
    /// Elements between consecutive calls' first output elements.
    pub outer_stride_c: usize,
}

/// The chain from a product to the kernel's output when it permutes: the written value and the product's
/// [`Factors`] in it. `None` when some op on the way is not elementwise, a view or a Transpose, when a value on
/// the way has a second reader, when the end is not the kernel's only written value, or when nothing permutes.
pub(crate) fn permuted_output(kernel: &Kernel, vy: ValueId) -> Option<(ValueId, Factors)> {
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
    if !steps.iter().any(|i| matches!(i.op, Op::Transpose { .. })) {
        return None;
    }
    let mut written = kernel.params.iter().filter(|p| p.access == Access::Write);
    if written.next().map(|p| p.value) != Some(cur) || written.next().is_some() {
        return None;
    }
    // Walk back: start from the output's own row-major layout; a view or an elementwise op keeps the linear
    // order, a Transpose reorders the factors of its output's dims into its input's.
    let mut factors = row_major(kernel.values.get(cur.index())?.shape.dims());
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
    Some((cur, factors))
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

/// Merges adjacent factors that are one contiguous run (`outer stride = inner stride * inner extent`).
fn merged(factors: &[(usize, usize)]) -> Factors {
    let mut out: Factors = Vec::new();
    for &(e, s) in factors.iter().rev() {
        match out.last_mut() {
            Some(last) if s == last.1 * last.0 => last.0 *= e,
            _ => out.push((e, s)),
        }
    }
    out.reverse();
    out
}

impl Store {
    /// The calls that store the row-major product `x [batch.., m, k] * w [k, n]` (the weight without batch dims,
    /// neither transposed) placed by `factors` (its [`Factors`] in the output). `None` when the placement is not
    /// a strided batch of matrices with a unit stride: the product's rows must be one factor, its columns at most
    /// two (heads, then the head's columns) with either the last or the rows' stride 1, its batch dims one run.
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
        let (cols, rows, outer) = (&groups[dims.len() - 1], &groups[dims.len() - 2], &groups[..dims.len() - 2]);
        let outer = merged(&outer.concat());
        let (outer, outer_stride_c) = match outer.as_slice() {
            [] => (1, 0),
            [(e, s)] => (*e, *s),
            _ => return None,
        };
        let (heads, head_stride, d, col_stride) = match cols.as_slice() {
            [(d, sd)] => (1, 0, *d, *sd),
            [(h, sh), (d, sd)] => (*h, *sh, *d, *sd),
            _ => return None,
        };
        // One row: its stride is never used; any value that keeps the call valid.
        let row_stride = match rows.as_slice() {
            [] => None,
            [(_, s)] => Some(*s),
            _ => return None,
        };
        let base = ColMajorGemm {
            trans_a: false,
            trans_b: false,
            m: 0,
            n: 0,
            k,
            lda: 0,
            ldb: 0,
            ldc: 0,
            batch: heads,
            stride_a: 0,
            stride_b: 0,
            stride_c: head_stride,
            alpha: 1.0,
            beta: 0.0,
            types,
        };
        let gemm = if col_stride == 1 {
            // C^T (d x m, column-major, ldc = the row stride) = W_h^T (d x k: W's columns h*d.., ld n) * X^T.
            ColMajorGemm { m: d, n: m, lda: n, ldb: k, ldc: row_stride.unwrap_or(d), stride_a: d, ..base }
        } else if row_stride == Some(1) || (row_stride.is_none() && m == 1) {
            // C (m x d, column-major, ldc = the column stride) = X (row-major, so transposed) * W_h (transposed).
            ColMajorGemm { trans_a: true, trans_b: true, m, n: d, lda: k, ldb: n, ldc: col_stride, stride_b: d, ..base }
        } else {
            return None;
        };
        Some(Store { gemm, weight_first: col_stride == 1, outer, outer_stride_x: m * k, outer_stride_c })
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
        assert_eq!(merged(&[(2, 12), (3, 4), (4, 1)]), vec![(24, 1)]);
        assert_eq!(merged(&[(2, 1), (3, 2)]), vec![(2, 1), (3, 2)]);
    }

    #[test]
    fn head_splits_are_strided_batches() {
        let t = GemmTypes::F32;
        // [1,128,768] -> [1,128,12,64] -> [1,12,128,64]: the product (s, h, d) at h*8192 + s*64 + d.
        let s = Store::of(&[1], 128, 768, 768, &[(128, 64), (12, 8192), (64, 1)], t).unwrap();
        assert!(s.weight_first);
        let g = s.gemm;
        assert_eq!((g.m, g.n, g.k, g.lda, g.ldb, g.ldc), (64, 128, 768, 768, 768, 64));
        assert_eq!((g.batch, g.stride_a, g.stride_b, g.stride_c, s.outer), (12, 64, 0, 8192, 1));
        // The key's [1,12,64,128]: (s, h, d) at h*8192 + d*128 + s, the rows innermost.
        let s = Store::of(&[1], 128, 768, 768, &[(128, 1), (12, 8192), (64, 128)], t).unwrap();
        assert!(!s.weight_first);
        let g = s.gemm;
        assert_eq!((g.trans_a, g.trans_b, g.m, g.n, g.lda, g.ldb, g.ldc), (true, true, 128, 64, 768, 768, 128));
        assert_eq!((g.batch, g.stride_a, g.stride_b, g.stride_c), (12, 0, 64, 8192));
        // Batch 2: one call per image.
        let s = Store::of(&[2], 4, 8, 3, &[(2, 32), (4, 4), (2, 16), (4, 1)], t).unwrap();
        assert_eq!((s.outer, s.outer_stride_x, s.outer_stride_c), (2, 12, 32));
        // Neither the columns nor the rows contiguous: no cuBLAS layout.
        assert!(Store::of(&[1], 4, 8, 3, &[(4, 2), (8, 4)], t).is_none());
        // Rows split across two places: not one matrix.
        assert!(Store::of(&[1], 4, 8, 3, &[(2, 1), (2, 64), (8, 2)], t).is_none());
    }
}
