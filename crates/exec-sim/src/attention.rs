//! The fused attention kernel (`GroupKind::Attention`) computed the way the kernel runs it: per query row, tiles
//! of K and V with an online softmax (running maximum, running sum, rescaled accumulator), so the score matrix is
//! never formed. The reference plan computes the same chain unfused (MatMul, scale, mask, Softmax, MatMul).
//! A `Where(cond, scores, fill)` link (a causal mask in GPT-2's eager export) picks, per score, the score or the
//! fill value exactly as the unfused `Where` does, before the mask is added.
//!
//! **Agreement with the reference (f32 chains).** Each score is the same f32 dot product (sequential over `k`)
//! scaled and masked in f32 as the unfused ops do; the softmax statistics and the `P.V` accumulator are f64,
//! rounded to f32 once at the end, whereas the reference rounds the probabilities to f32 and sums `P.V` in f32.
//! Outputs agree within `ATTENTION_TOLERANCE` relative to the output's magnitude (well inside
//! `CheckOptions::tolerance`, 1e-5); they are not bitwise equal.
//!
//! **Half chains** (`MatMul(H) -> [scale] -> [mask] -> Softmax -> MatMul(H)`, `H` f16 or bf16, whose links
//! store f32 and whose probabilities reach the second MatMul in `H`: the precision transform writes attention
//! under its default policy as mixed-precision links — the scale reads the half scores and stores f32, the
//! Softmax stores `H` — and casts `Cast(f32)` after the first MatMul and `Cast(H)` after the Softmax are accepted
//! as links too; graph_passes::fusion's attention module states the dtype rule). The numeric rule of the kernel:
//! Q, K and V are read as stored (half values, exact in f32); every score is the f32 dot product above, scaled
//! and masked in f32, and is *not* rounded to `H` (the policy keeps the softmax input in f32, and the fused
//! kernel has no reason to round a value it never stores); the softmax statistics and `P.V` are f64 as above,
//! with unrounded probabilities; the output is rounded once, to the output's dtype `H`, on the store. So the
//! fused kernel is never less accurate than the unfused half chain, but it is not bit-identical to it: the
//! unfused chain rounds every score to `H` after the first MatMul (its output dtype) and the probabilities to `H`
//! before `P.V`. A score `s` rounded to `H` moves by up to `|s| u` (`u` = 2^-11 for f16, 2^-8 for bf16), so its
//! probability by a factor up to `exp(|s| u)`; with the probabilities' own rounding (`u`) and the two outputs'
//! roundings (`u / 2` each) the outputs differ by at most about `(2 max|s| + 2) u` of `max |V|`. The tests hold
//! the fused half kernel to [`half_attention_tolerance`] of the unfused half chain (scores up to about 8 in
//! magnitude, outputs comparable to `max |V|`), and to the precision check's tolerance (1e-2 f16, 5e-2 bf16) of
//! the f32 reference plan.

use graph_plan::{DType, Kernel, Op, ValueId};
use rayon::prelude::*;

use crate::value::{broadcast_shape, expand, numel, OpResult, Val};

/// Columns of K (rows of V) per tile: one rescale of the accumulator per tile, as FlashAttention does.
pub(crate) const TILE: usize = 64;

/// Largest relative difference (to the output's largest magnitude) between the fused kernel and the reference
/// plan's unfused chain, for f32 inputs of moderate range (the tests hold exec-sim to it).
pub const ATTENTION_TOLERANCE: f64 = 2e-6;

/// Largest relative difference (to the output's largest magnitude) between the fused kernel of a half chain and
/// the reference plan's unfused half chain (module docs: `(2 max|s| + 2) u` for scores up to 8, rounded up):
/// 1e-2 for f16 (u = 2^-11), 8e-2 for bf16 (u = 2^-8); `None` for other dtypes.
pub fn half_attention_tolerance(dtype: DType) -> Option<f64> {
    match dtype {
        DType::F16 => Some(1e-2),
        DType::BF16 => Some(8e-2),
        _ => None,
    }
}

/// The chain inside an attention kernel's body (found by `graph_plan::attention`, shared with exec-cuda).
pub(crate) type Chain = graph_plan::attention::AttentionChain;

/// Find the chain, or say what the kernel lacks.
pub(crate) fn chain(k: &Kernel) -> Result<Chain, String> {
    graph_plan::attention::find(k).map_err(|what| format!("attention kernel: {what}"))
}

/// Compute the output of `chain.m2` from the values the chain reads (`env`, indexed by value).
pub(crate) fn run(k: &Kernel, c: &Chain, env: &[Option<Val>]) -> OpResult<Val> {
    let get = |v: ValueId| env.get(v.index()).and_then(Option::as_ref).ok_or_else(|| format!("value {v} not computed"));
    let body = &k.body;
    let m1 = &body[c.m1];
    let s_out = m1.outputs[0];
    let (q, kt) = (get(m1.inputs[0])?, get(m1.inputs[1])?);
    // The scale: the scalar operand of the Mul or Div, and whether it divides.
    // The scores as the scale reads them: through the Cast to f32 in a half chain (the fused kernel never
    // rounds them to the half type).
    let mut score_v = match c.cast_scores {
        Some(j) => body[j].outputs[0],
        None => s_out,
    };
    let scale = match c.scale {
        Some(j) => {
            let ins = &body[j].inputs;
            let k_other = usize::from(ins[0] == score_v);
            let sv = get(ins[k_other])?.f()?.first().copied().ok_or("empty scale")?;
            score_v = body[j].outputs[0];
            Some((sv, matches!(body[j].op, Op::Div)))
        }
        None => None,
    };
    // The select: its condition, its fill operand, and whether the scores are taken where the condition holds.
    let select = match c.select {
        Some(j) => {
            let ins = &body[j].inputs;
            if ins.len() != 3 {
                return Err("the select needs three operands".into());
            }
            let on_true = ins[1] == score_v;
            let fill = if on_true { ins[2] } else { ins[1] };
            score_v = body[j].outputs[0];
            Some((get(ins[0])?, get(fill)?, on_true))
        }
        None => None,
    };
    let mask = match c.mask {
        Some(j) => {
            let ins = &body[j].inputs;
            let other = if ins[0] == score_v { ins[1] } else { ins[0] };
            Some(get(other)?)
        }
        None => None,
    };
    let v = get(body[c.m2].inputs[1])?;
    let (qd, kd, vd) = (&q.shape, &kt.shape, &v.shape);
    if qd.len() < 2 || kd.len() < 2 || vd.len() < 2 {
        return Err("attention operands must have rank >= 2".into());
    }
    let (sq, dk) = (qd[qd.len() - 2], qd[qd.len() - 1]);
    let sk = kd[kd.len() - 1];
    let dv = vd[vd.len() - 1];
    if kd[kd.len() - 2] != dk || vd[vd.len() - 2] != sk {
        return Err(format!("attention shapes do not chain: Q {qd:?}, K^T {kd:?}, V {vd:?}"));
    }
    let batch = broadcast_shape(&qd[..qd.len() - 2], &kd[..kd.len() - 2])?;
    let dims = |tail: [usize; 2]| -> Vec<usize> { batch.iter().copied().chain(tail).collect() };
    let qx = expand(q.f()?, qd, &dims([sq, dk]))?;
    let kx = expand(kt.f()?, kd, &dims([dk, sk]))?;
    let vx = expand(v.f()?, vd, &dims([sk, dv]))?;
    let mx = match mask {
        Some(m) => Some(expand(m.f()?, &m.shape, &dims([sq, sk]))?),
        None => None,
    };
    let sx = match select {
        Some((cond, fill, on_true)) => Some((
            expand(cond.b()?, &cond.shape, &dims([sq, sk]))?,
            expand(fill.f()?, &fill.shape, &dims([sq, sk]))?,
            on_true,
        )),
        None => None,
    };
    let nb = numel(&batch);
    let mut out = vec![0f32; nb * sq * dv];
    if dv > 0 {
        out.par_chunks_mut(dv).enumerate().for_each(|(row, o)| {
            let (b, i) = (row / sq.max(1), row % sq.max(1));
            let qrow = &qx[(b * sq + i) * dk..(b * sq + i + 1) * dk];
            let (mut m, mut l) = (f64::NEG_INFINITY, 0f64);
            let mut acc = vec![0f64; dv];
            let mut s = [0f32; TILE];
            for j0 in (0..sk).step_by(TILE) {
                let cols = TILE.min(sk - j0);
                let mut tile_max = f64::NEG_INFINITY;
                for (jj, sj) in s[..cols].iter_mut().enumerate() {
                    let j = j0 + jj;
                    let mut dot = 0f32;
                    for (kk, &qv) in qrow.iter().enumerate() {
                        dot += qv * kx[(b * dk + kk) * sk + j];
                    }
                    if let Some((c, div)) = scale {
                        dot = if div { dot / c } else { dot * c };
                    }
                    if let Some((cond, fill, on_true)) = &sx {
                        let at = (b * sq + i) * sk + j;
                        if (cond[at] != 0) != *on_true {
                            dot = fill[at];
                        }
                    }
                    if let Some(mx) = &mx {
                        dot += mx[(b * sq + i) * sk + j];
                    }
                    *sj = dot;
                    let d = f64::from(dot);
                    if d > tile_max || d.is_nan() {
                        tile_max = d;
                    }
                }
                let m_new = if m.is_nan() || tile_max.is_nan() { f64::NAN } else { m.max(tile_max) };
                if m_new == f64::NEG_INFINITY {
                    continue; // every score so far is -inf: nothing to add yet
                }
                let corr = if m == f64::NEG_INFINITY { 0.0 } else { (m - m_new).exp() };
                l *= corr;
                acc.iter_mut().for_each(|a| *a *= corr);
                for (jj, &sj) in s[..cols].iter().enumerate() {
                    let p = (f64::from(sj) - m_new).exp();
                    l += p;
                    let vrow = &vx[(b * sk + j0 + jj) * dv..(b * sk + j0 + jj + 1) * dv];
                    for (a, &x) in acc.iter_mut().zip(vrow) {
                        *a += p * f64::from(x);
                    }
                }
                m = m_new;
            }
            for (o, a) in o.iter_mut().zip(&acc) {
                *o = (a / l) as f32;
            }
        });
    }
    let mut shape = batch;
    shape.extend([sq, dv]);
    // One rounding, to the output's dtype, on the store.
    let out_dtype = k.values.get(body[c.m2].outputs[0].index()).map_or(v.dtype, |x| x.dtype);
    Ok(Val::from_f(out_dtype, shape, out))
}
