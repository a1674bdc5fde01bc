//! Fused attention (FlashAttention's kernel shape): `MatMul(Q, K^T) -> [Mul or Div by a scalar] -> [Add mask or
//! bias] -> Softmax(last axis) -> MatMul(., V)` planned as one kernel that walks tiles of K and V with an online
//! softmax, so the score matrix is never materialised (it leaves the memory pool).
//!
//! A chain is recognised from its Softmax, walking back to the first MatMul and forward to the second, every link
//! a direct edge (no view in between). It is an attention candidate once the scores come from a MatMul; from
//! then on every reason it cannot fuse is reported on the edge out of that MatMul: the softmax is not over the
//! last axis, an intermediate (scores, scaled or masked scores, probabilities) is read elsewhere or is a graph
//! output, the mask or scale broadcasts the scores to a larger shape, the probabilities are not the left operand
//! of the second MatMul, V broadcasts the batch of the scores, or a value is not f32.

use graph_ir::{DType, Op, OpCategory};

use super::dense::{Dense, NONE};
use super::rules::Why;

/// The nodes of one recognised chain (positions; `NONE` for the optional links).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Chain {
    pub m1: u32,
    pub scale: u32,
    pub mask: u32,
    pub softmax: u32,
    pub m2: u32,
}

impl Chain {
    /// The chain's nodes in program order.
    pub fn nodes(&self) -> impl Iterator<Item = u32> + '_ {
        [self.m1, self.scale, self.mask, self.softmax, self.m2].into_iter().filter(|&n| n != NONE)
    }

    pub fn contains(&self, n: u32) -> bool {
        self.nodes().any(|x| x == n)
    }
}

/// What the matcher found at one Softmax.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Found {
    /// Not an attention pattern (the scores do not come from a MatMul).
    No,
    /// A chain that may fuse.
    Chain(Chain),
    /// An attention candidate that cannot fuse: reported on the edge `m1 -> next`.
    Refused { m1: u32, next: u32, why: Why },
}

/// The direct (non-view) producer of tensor `t`, `NONE` when a source or a view.
fn producer(d: &Dense<'_>, t: u32) -> u32 {
    let p = d.prod[t as usize];
    if p == NONE || d.is_view(p) {
        NONE
    } else {
        p
    }
}

/// Match the chain around Softmax node `s`.
pub(super) fn find(d: &Dense<'_>, s: u32) -> Found {
    let Op::Softmax { axis } = d.op(s) else { return Found::No };
    let Some(&x) = d.inputs(s).first() else { return Found::No };
    // Walk back: [Add] <- [Mul | Div] <- MatMul.
    let (mut scale, mut mask) = (NONE, NONE);
    let mut t = x;
    let mut node = producer(d, t);
    if node != NONE && matches!(d.op(node), Op::Add) {
        let ins = d.inputs(node);
        let from_scores = |u: u32| {
            let p = producer(d, u);
            p != NONE && matches!(d.op(p), Op::Mul | Op::Div | Op::MatMul)
        };
        let Some(k) = (0..ins.len()).find(|&k| from_scores(ins[k])) else { return Found::No };
        mask = node;
        t = ins[k];
        node = producer(d, t);
    }
    if node != NONE && matches!(d.op(node), Op::Mul | Op::Div) {
        let ins = d.inputs(node);
        let scalar = |u: u32| d.numel[u as usize] == 1;
        let k = match d.op(node) {
            Op::Div if ins.len() == 2 && scalar(ins[1]) => 0,
            Op::Mul if ins.len() == 2 && scalar(ins[1]) => 0,
            Op::Mul if ins.len() == 2 && scalar(ins[0]) => 1,
            _ => return Found::No,
        };
        scale = node;
        t = ins[k];
        node = producer(d, t);
    }
    if node == NONE || !matches!(d.op(node), Op::MatMul) {
        return Found::No;
    }
    let m1 = node;
    // The edge the verdict goes on: out of m1 into the next link.
    let next = [scale, mask, s].into_iter().find(|&n| n != NONE).unwrap_or(s);
    let refuse = |why: Why| Found::Refused { m1, next, why };
    let scores = t;
    let sdims = d.dims(scores);
    if sdims.len() < 2 || d.dims(d.inputs(m1)[0]).len() < 2 || d.dims(d.inputs(m1)[1]).len() < 2 {
        return refuse(Why::AttnShape { node: m1 });
    }
    let rank = d.dims(x).len() as i64;
    let ax = if *axis < 0 { axis + rank } else { *axis };
    if ax != rank - 1 {
        return refuse(Why::AttnAxis { node: s });
    }
    // Every intermediate is read once, by the next link, and is no graph output.
    let p_t = d.outputs(s)[0];
    let readers = d.readers(p_t);
    let m2 = match readers {
        [c] if matches!(d.op(*c), Op::MatMul) && d.inputs(*c).first() == Some(&p_t) => *c,
        [c] => return refuse(Why::AttnNotPv { node: *c }),
        _ => return refuse(Why::AttnEscapes { t: p_t }),
    };
    let mut inter = vec![scores];
    inter.extend([scale, mask].into_iter().filter(|&n| n != NONE).map(|n| d.outputs(n)[0]));
    inter.push(p_t);
    for &u in &inter {
        if d.is_output(u) || d.readers(u).len() != 1 || d.root[u as usize] != u {
            return refuse(Why::AttnEscapes { t: u });
        }
        // A mask or scale that broadcasts the scores to a larger shape is not a per-score epilogue.
        if d.dims(u) != sdims {
            return refuse(Why::AttnBroadcast { t: u });
        }
    }
    // V's batch axes must broadcast into the scores' (the output has the scores' batch).
    let (v, o) = (d.inputs(m2)[1], d.outputs(m2)[0]);
    let (vd, od) = (d.dims(v), d.dims(o));
    if vd.len() < 2 || od.len() != sdims.len() || od[..od.len() - 2] != sdims[..sdims.len() - 2] {
        return refuse(Why::AttnBatch { node: m2 });
    }
    let f32_only = [scores, p_t, o, v, d.inputs(m1)[0], d.inputs(m1)[1]]
        .into_iter()
        .chain([scale, mask].into_iter().filter(|&n| n != NONE).flat_map(|n| d.inputs(n).iter().copied()))
        .find(|&u| d.graph.tensor(d.tids[u as usize]).dtype != DType::F32);
    if let Some(u) = f32_only {
        return refuse(Why::AttnDtype { t: u });
    }
    Found::Chain(Chain { m1, scale, mask, softmax: s, m2 })
}

/// Whether a member outside the chain may ride along in the fused kernel: elementwise side producers (a mask
/// computed on the fly) and a permuted epilogue of the output.
pub(super) fn may_ride(d: &Dense<'_>, n: u32) -> bool {
    match d.cat[n as usize] {
        OpCategory::Elementwise => true,
        OpCategory::DataMovement => matches!(d.op(n), Op::Transpose { .. }),
        _ => false,
    }
}
