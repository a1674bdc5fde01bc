//! MatMul, Gemm, Conv (as im2col + GEMM) and pooling.
//!
//! The f32 GEMM core runs in parallel over blocks of output rows (rayon) and, inside a block, over column
//! panels with a four-row micro-kernel. Every output element accumulates its products in increasing k order,
//! starting from zero, whatever the blocking or the thread count: results are deterministic and bitwise
//! reproducible across plans.

use graph_plan::ir::infer::Window;
use rayon::prelude::*;

use crate::value::{broadcast_shape, broadcast_strides, numel, strided_offsets, strides, Data, OpResult, Val};

/// Rows of C per parallel task.
const ROW_BLOCK: usize = 16;
/// Columns of C per panel (fits a panel of C rows in L1).
const COL_BLOCK: usize = 256;

/// `c = a * b` for row-major `a` (m x k), `b` (k x n), `c` (m x n); c is overwritten.
pub(crate) fn sgemm(m: usize, n: usize, k: usize, a: &[f32], b: &[f32], c: &mut [f32]) {
    debug_assert!(a.len() >= m * k && b.len() >= k * n && c.len() >= m * n);
    if m == 0 || n == 0 {
        return;
    }
    let work = m * n * k;
    let body = |(bi, cblk): (usize, &mut [f32])| {
        let r0 = bi * ROW_BLOCK;
        let rows = cblk.len() / n;
        block(r0, rows, n, k, a, b, cblk);
    };
    if work >= 1 << 16 {
        c[..m * n].par_chunks_mut(ROW_BLOCK * n).enumerate().for_each(body);
    } else {
        c[..m * n].chunks_mut(ROW_BLOCK * n).enumerate().for_each(body);
    }
}

/// One block of `rows` rows of C starting at row `r0`.
fn block(r0: usize, rows: usize, n: usize, k: usize, a: &[f32], b: &[f32], c: &mut [f32]) {
    c.fill(0.0);
    let mut j0 = 0;
    while j0 < n {
        let j1 = (j0 + COL_BLOCK).min(n);
        let w = j1 - j0;
        let mut i = 0;
        while i + 4 <= rows {
            let (c0, rest) = c[i * n..].split_at_mut(n);
            let (c1, rest) = rest.split_at_mut(n);
            let (c2, rest) = rest.split_at_mut(n);
            let c3 = &mut rest[..n];
            let (c0, c1, c2, c3) = (&mut c0[j0..j1], &mut c1[j0..j1], &mut c2[j0..j1], &mut c3[j0..j1]);
            let ar = |q: usize| &a[(r0 + i + q) * k..(r0 + i + q + 1) * k];
            let (a0, a1, a2, a3) = (ar(0), ar(1), ar(2), ar(3));
            for kk in 0..k {
                let brow = &b[kk * n + j0..kk * n + j0 + w];
                let (x0, x1, x2, x3) = (a0[kk], a1[kk], a2[kk], a3[kk]);
                for j in 0..w {
                    let bv = brow[j];
                    c0[j] += x0 * bv;
                    c1[j] += x1 * bv;
                    c2[j] += x2 * bv;
                    c3[j] += x3 * bv;
                }
            }
            i += 4;
        }
        while i < rows {
            let crow = &mut c[i * n + j0..i * n + j1];
            let arow = &a[(r0 + i) * k..(r0 + i + 1) * k];
            for (kk, &x) in arow.iter().enumerate() {
                let brow = &b[kk * n + j0..kk * n + j1];
                for (cv, &bv) in crow.iter_mut().zip(brow) {
                    *cv += x * bv;
                }
            }
            i += 1;
        }
        j0 = j1;
    }
}

/// Integer GEMM with wrapping arithmetic (rare: integer MatMul in index computations).
fn igemm(m: usize, n: usize, k: usize, a: &[i64], b: &[i64], c: &mut [i64]) {
    for i in 0..m {
        for kk in 0..k {
            let x = a[i * k + kk];
            for j in 0..n {
                c[i * n + j] = c[i * n + j].wrapping_add(x.wrapping_mul(b[kk * n + j]));
            }
        }
    }
}

/// Numpy matmul: batched with broadcast batch axes; 1-D operands promoted and the added axis removed.
pub(crate) fn matmul(a: &Val, b: &Val) -> OpResult<Val> {
    if a.shape.is_empty() || b.shape.is_empty() {
        return Err(format!("MatMul operands must have rank >= 1, got {:?} and {:?}", a.shape, b.shape));
    }
    let a2: Vec<usize> = if a.shape.len() == 1 { vec![1, a.shape[0]] } else { a.shape.clone() };
    let b2: Vec<usize> = if b.shape.len() == 1 { vec![b.shape[0], 1] } else { b.shape.clone() };
    let (m, ka) = (a2[a2.len() - 2], a2[a2.len() - 1]);
    let (kb, n) = (b2[b2.len() - 2], b2[b2.len() - 1]);
    if ka != kb {
        return Err(format!("MatMul inner dimensions differ: {:?} x {:?}", a.shape, b.shape));
    }
    let k = ka;
    let (ab, bb) = (&a2[..a2.len() - 2], &b2[..b2.len() - 2]);
    let batch = broadcast_shape(ab, bb)?;
    let nb = numel(&batch);
    // Matrix index of each batch item in A and B.
    let a_idx = strided_offsets(&batch, &broadcast_strides(ab, &batch)?);
    let b_idx = strided_offsets(&batch, &broadcast_strides(bb, &batch)?);
    let mut out_shape = batch.clone();
    if a.shape.len() > 1 {
        out_shape.push(m);
    }
    if b.shape.len() > 1 {
        out_shape.push(n);
    }
    match (&a.data, &b.data) {
        (Data::F(av), Data::F(bv)) => {
            let mut out = vec![0f32; nb * m * n];
            if m * n > 0 {
                out.par_chunks_mut(m * n).enumerate().for_each(|(t, c)| {
                    let am = &av[a_idx[t] * m * k..(a_idx[t] + 1) * m * k];
                    let bm = &bv[b_idx[t] * k * n..(b_idx[t] + 1) * k * n];
                    sgemm(m, n, k, am, bm, c);
                });
            }
            Ok(Val::from_f(a.dtype, out_shape, out))
        }
        (Data::I(av), Data::I(bv)) => {
            let mut out = vec![0i64; nb * m * n];
            for t in 0..nb {
                let am = &av[a_idx[t] * m * k..(a_idx[t] + 1) * m * k];
                let bm = &bv[b_idx[t] * k * n..(b_idx[t] + 1) * k * n];
                igemm(m, n, k, am, bm, &mut out[t * m * n..(t + 1) * m * n]);
            }
            Ok(Val::from_i(a.dtype, out_shape, out))
        }
        _ => Err(format!("MatMul needs numeric operands of one kind, got {} and {}", a.dtype, b.dtype)),
    }
}

fn transposed<T: Copy>(v: &[T], rows: usize, cols: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(v.len());
    for j in 0..cols {
        for i in 0..rows {
            out.push(v[i * cols + j]);
        }
    }
    out
}

/// `alpha * op(A) op(B) + beta * C` with C unidirectionally broadcast to (M, N).
pub(crate) fn gemm(
    a: &Val,
    b: &Val,
    c: Option<&Val>,
    alpha: f32,
    beta: f32,
    trans_a: bool,
    trans_b: bool,
) -> OpResult<Val> {
    if a.shape.len() != 2 || b.shape.len() != 2 {
        return Err(format!("Gemm needs 2-D A and B, got {:?} and {:?}", a.shape, b.shape));
    }
    let (m, k) = if trans_a { (a.shape[1], a.shape[0]) } else { (a.shape[0], a.shape[1]) };
    let (kb, n) = if trans_b { (b.shape[1], b.shape[0]) } else { (b.shape[0], b.shape[1]) };
    if k != kb {
        return Err(format!("Gemm inner dimensions differ: A {:?} B {:?}", a.shape, b.shape));
    }
    let out_shape = vec![m, n];
    match (&a.data, &b.data) {
        (Data::F(av), Data::F(bv)) => {
            let at = if trans_a { std::borrow::Cow::Owned(transposed(av, k, m)) } else { (&av[..]).into() };
            let bt = if trans_b { std::borrow::Cow::Owned(transposed(bv, n, k)) } else { (&bv[..]).into() };
            let mut out = vec![0f32; m * n];
            sgemm(m, n, k, &at, &bt, &mut out);
            if alpha != 1.0 {
                for v in &mut out {
                    *v *= alpha;
                }
            }
            if let Some(c) = c {
                let cv = crate::value::expand(c.f()?, &c.shape, &out_shape)?;
                for (v, &x) in out.iter_mut().zip(cv.iter()) {
                    *v += beta * x;
                }
            }
            Ok(Val::from_f(a.dtype, out_shape, out))
        }
        (Data::I(av), Data::I(bv)) => {
            let at = if trans_a { transposed(av, k, m) } else { av.to_vec() };
            let bt = if trans_b { transposed(bv, n, k) } else { bv.to_vec() };
            let mut out = vec![0i64; m * n];
            igemm(m, n, k, &at, &bt, &mut out);
            let (al, be) = (alpha as i64, beta as i64);
            for v in &mut out {
                *v = v.wrapping_mul(al);
            }
            if let Some(c) = c {
                let ci = c.ints()?;
                let cv = crate::value::expand(&ci, &c.shape, &out_shape)?;
                for (v, &x) in out.iter_mut().zip(cv.iter()) {
                    *v = v.wrapping_add(be.wrapping_mul(x));
                }
            }
            Ok(Val::from_i(a.dtype, out_shape, out))
        }
        _ => Err(format!("Gemm needs numeric operands of one kind, got {} and {}", a.dtype, b.dtype)),
    }
}

/// For each kernel tap and each output position, the input spatial offset (None: padding).
fn tap_table(in_sp: &[usize], out_sp: &[usize], w: &Window) -> Vec<Vec<Option<usize>>> {
    let kst = strides(&w.kernel);
    let ist = strides(in_sp);
    let ntaps = numel(&w.kernel);
    let nout = numel(out_sp);
    let ost = strides(out_sp);
    let mut table = Vec::with_capacity(ntaps);
    for t in 0..ntaps {
        let mut row = Vec::with_capacity(nout);
        for p in 0..nout {
            let mut off = 0usize;
            let mut inside = true;
            for d in 0..in_sp.len() {
                let kd = (t / kst[d]) % w.kernel[d];
                let od = (p / ost[d]) % out_sp[d];
                let pos = (od * w.strides[d] + kd * w.dilations[d]) as i64 - w.pads_begin[d] as i64;
                if pos < 0 || pos >= in_sp[d] as i64 {
                    inside = false;
                    break;
                }
                off += pos as usize * ist[d];
            }
            row.push(inside.then_some(off));
        }
        table.push(row);
    }
    table
}

fn out_extents(in_sp: &[usize], w: &Window, ceil_mode: bool) -> OpResult<Vec<usize>> {
    in_sp.iter().enumerate().map(|(i, &d)| w.out_extent(i, d, ceil_mode).map_err(|e| format!("{e:?}"))).collect()
}

/// N-D convolution with groups: per batch item and group, `out = W_g (Mg x Cg*KS) * cols (Cg*KS x P) + bias`.
pub(crate) fn conv(x: &Val, wt: &Val, bias: Option<&Val>, win: &Window, group: usize) -> OpResult<Val> {
    let (nb, c) = (x.shape[0], x.shape[1]);
    let m = wt.shape[0];
    let cg = wt.shape[1];
    if group == 0 || c % group != 0 || m % group != 0 || cg * group != c {
        return Err(format!("Conv: group {group} does not fit X {:?} and W {:?}", x.shape, wt.shape));
    }
    let in_sp = &x.shape[2..];
    if win.kernel.len() != in_sp.len() {
        return Err(format!("Conv: window rank {} for {} spatial axes", win.kernel.len(), in_sp.len()));
    }
    let out_sp = out_extents(in_sp, win, false)?;
    let (xv, wv) = (x.f()?, wt.f()?);
    let bv = match bias {
        Some(b) => Some(b.f()?),
        None => None,
    };
    if bv.is_some_and(|b| b.len() != m) {
        return Err(format!("Conv bias must have {m} elements"));
    }
    let mg = m / group;
    let ks = numel(&win.kernel);
    let kdim = cg * ks;
    let p = numel(&out_sp);
    let isz = numel(in_sp);
    let direct = ks == 1
        && win.strides.iter().all(|&s| s == 1)
        && win.pads_begin.iter().chain(&win.pads_end).all(|&q| q == 0)
        && p == isz;
    let table = if direct { Vec::new() } else { tap_table(in_sp, &out_sp, win) };
    let mut out = vec![0f32; nb * m * p];
    let mut cols = if direct { Vec::new() } else { vec![0f32; kdim * p] };
    for n in 0..nb {
        for g in 0..group {
            let xg = &xv[(n * c + g * cg) * isz..(n * c + (g + 1) * cg) * isz];
            let colref: &[f32] = if direct {
                xg
            } else {
                cols.par_chunks_mut(p.max(1)).enumerate().for_each(|(row, dst)| {
                    let (ci, t) = (row / ks, row % ks);
                    let src = &xg[ci * isz..(ci + 1) * isz];
                    for (d, off) in dst.iter_mut().zip(&table[t]) {
                        *d = off.map_or(0.0, |o| src[o]);
                    }
                });
                &cols
            };
            let wg = &wv[g * mg * kdim..(g + 1) * mg * kdim];
            let og = &mut out[(n * m + g * mg) * p..(n * m + (g + 1) * mg) * p];
            sgemm(mg, p, kdim, wg, colref, og);
            if let Some(b) = bv {
                for (i, row) in og.chunks_mut(p.max(1)).enumerate() {
                    let bb = b[g * mg + i];
                    for v in row {
                        *v += bb;
                    }
                }
            }
        }
    }
    let mut shape = vec![nb, m];
    shape.extend_from_slice(&out_sp);
    Ok(Val::from_f(x.dtype, shape, out))
}

/// MaxPool (padding never wins) or AveragePool (divisor: valid taps, or with `count_include_pad` the taps
/// inside the padded input, so windows that ceil_mode pushes past the end pad do not count those).
pub(crate) fn pool(x: &Val, win: &Window, ceil_mode: bool, max: bool, include_pad: bool) -> OpResult<Val> {
    if x.shape.len() < 3 {
        return Err(format!("pooling needs rank >= 3, got {:?}", x.shape));
    }
    let in_sp = &x.shape[2..];
    if win.kernel.len() != in_sp.len() {
        return Err(format!("pool: kernel_shape has {} axes for {} spatial axes", win.kernel.len(), in_sp.len()));
    }
    let out_sp = out_extents(in_sp, win, ceil_mode)?;
    let table = tap_table(in_sp, &out_sp, win);
    let planes = x.shape[0] * x.shape[1];
    let isz = numel(in_sp);
    let p = numel(&out_sp);
    let mut shape = x.shape[..2].to_vec();
    shape.extend_from_slice(&out_sp);
    // Taps inside the padded extent, per output position (for count_include_pad).
    let padded_count: Vec<usize> = if include_pad && !max {
        let kst = strides(&win.kernel);
        let ost = strides(&out_sp);
        (0..p)
            .map(|q| {
                (0..numel(&win.kernel))
                    .filter(|&t| {
                        (0..in_sp.len()).all(|d| {
                            let kd = (t / kst[d]) % win.kernel[d];
                            let od = (q / ost[d]) % out_sp[d];
                            let pos = od * win.strides[d] + kd * win.dilations[d];
                            pos < in_sp[d] + win.pads_begin[d] + win.pads_end[d]
                        })
                    })
                    .count()
            })
            .collect()
    } else {
        Vec::new()
    };
    match &x.data {
        Data::F(v) => {
            let mut out = vec![0f32; planes * p];
            out.par_chunks_mut(p.max(1)).enumerate().for_each(|(pl, dst)| {
                let src = &v[pl * isz..(pl + 1) * isz];
                for (q, o) in dst.iter_mut().enumerate() {
                    if max {
                        let mut best = f32::NEG_INFINITY;
                        for row in &table {
                            if let Some(i) = row[q] {
                                let a = src[i];
                                if a > best || a.is_nan() {
                                    best = a;
                                }
                            }
                        }
                        *o = best;
                    } else {
                        let mut s = 0f64;
                        let mut cnt = 0usize;
                        for row in &table {
                            if let Some(i) = row[q] {
                                s += src[i] as f64;
                                cnt += 1;
                            }
                        }
                        let div = if include_pad { padded_count[q] } else { cnt };
                        *o = (s / div as f64) as f32;
                    }
                }
            });
            Ok(Val::from_f(x.dtype, shape, out))
        }
        Data::I(v) if max => {
            let mut out = vec![i64::MIN; planes * p];
            for pl in 0..planes {
                let src = &v[pl * isz..(pl + 1) * isz];
                for q in 0..p {
                    for row in &table {
                        if let Some(i) = row[q] {
                            out[pl * p + q] = out[pl * p + q].max(src[i]);
                        }
                    }
                }
            }
            Ok(Val::from_i(x.dtype, shape, out))
        }
        _ => Err(format!("{} pooling does not take {}", if max { "max" } else { "average" }, x.dtype)),
    }
}
