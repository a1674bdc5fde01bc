//! Fused attention (FlashAttention's kernel shape): `MatMul(Q, K^T) -> [Cast] -> [Mul or Div by a scalar] ->
//! [Where(cond, scores, fill)] -> [Add mask or bias] -> Softmax(last axis) -> [Cast] -> MatMul(., V)` planned as
//! one kernel that walks tiles of K and V with an online softmax, so the score matrix is never materialised (it
//! leaves the memory pool). The `Where` is the causal mask of GPT-2-style eager exports (`torch.where(causal,
//! scores, finfo.min)`): a boolean condition and a fill value per score, the scores its second or third operand.
//!
//! **Dtypes.** Either the whole chain is f32 with no cast, or it is a *half chain*: Q, K, V, the scores and the
//! output in one half type `H` (f16 or bf16); every link between the scores and the Softmax (an optional `Cast`
//! to f32 right after the first MatMul, the scale, select and mask) stores f32, reading its float operands in
//! any float type (mixed-precision nodes, `graph_ir::Node::store`); the probabilities reach the second MatMul in
//! `H`, stored so by the Softmax itself or by a `Cast` back to `H` right after it. The precision transform writes
//! an attention block under its default policy (`softmax-input` and `Softmax` kept in f32) as mixed links — the
//! scale reads the half scores and stores f32, the Softmax stores `H` — and older graphs write the casts; either
//! way the links become members of the fused kernel, which reads `H`, computes the scores, scale, mask and
//! softmax in f32 without rounding them and rounds the output to `H` once (exec-sim's `attention` module states
//! the numerics). A link that stores `H` is refused: the unfused chain would round the scores inside it.
//!
//! A chain is recognised from its Softmax, walking back to the first MatMul and forward to the second, every link
//! a direct edge (no view in between). It is an attention candidate once the scores come from a MatMul; from
//! then on every reason it cannot fuse is reported on the edge out of that MatMul (out of its cast, when phase 1
//! made a cast the MatMul's epilogue and left no kernel edge there): the softmax is not over the last axis, an
//! intermediate (scores, cast scores, scaled or masked scores, probabilities, cast probabilities) is read
//! elsewhere or is a graph output, the mask or scale broadcasts the scores to a larger shape, the probabilities
//! are not the left operand of the second MatMul, V broadcasts the batch of the scores, a value has another
//! dtype than the chain needs (f32 out of every link, the chain's type outside them), or a cast converts to
//! another type than the chain needs (f32 after the first MatMul, the scores' half type after the Softmax).

use graph_ir::{DType, Op, OpCategory};

use super::dense::{Dense, NONE};
use super::rules::Why;

/// The nodes of one recognised chain (positions; `NONE` for the optional links).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Chain {
    pub m1: u32,
    /// The Cast of the scores to f32 (half chains).
    pub cast_scores: u32,
    pub scale: u32,
    /// The `Where` that replaces masked scores by a fill value.
    pub select: u32,
    pub mask: u32,
    pub softmax: u32,
    /// The Cast of the probabilities back to the half type (half chains).
    pub cast_probs: u32,
    pub m2: u32,
}

impl Chain {
    /// The chain's nodes in program order.
    pub fn nodes(&self) -> impl Iterator<Item = u32> + '_ {
        [self.m1, self.cast_scores, self.scale, self.select, self.mask, self.softmax, self.cast_probs, self.m2]
            .into_iter()
            .filter(|&n| n != NONE)
    }

    pub fn contains(&self, n: u32) -> bool {
        self.nodes().any(|x| x == n)
    }

    /// The link right after the first MatMul: the edge `m1 -> after_m1()` carries the chain's verdict.
    pub fn after_m1(&self) -> u32 {
        [self.cast_scores, self.scale, self.select, self.mask].into_iter().find(|&n| n != NONE).unwrap_or(self.softmax)
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

/// The links below the mask: `[Where] <- [Mul | Div by a scalar] <- [Cast] <- MatMul`, walking back from tensor
/// `t`.
struct Below {
    select: u32,
    scale: u32,
    cast: u32,
    m1: u32,
    /// The first MatMul's output.
    scores: u32,
}

fn walk_scores(d: &Dense<'_>, t: u32) -> Option<Below> {
    let node = producer(d, t);
    if node != NONE && matches!(d.op(node), Op::Mul | Op::Div) {
        let ins = d.inputs(node);
        let scalar = |u: u32| d.numel[u as usize] == 1;
        // The scores operand: the one the other (a scalar) scales. When both are scalars (a 1x1 score matrix)
        // the scores are the operand that leads down to a MatMul, whichever side it is on.
        let candidates: &[usize] = match d.op(node) {
            Op::Div if ins.len() == 2 && scalar(ins[1]) => &[0],
            Op::Mul if ins.len() == 2 => match (scalar(ins[0]), scalar(ins[1])) {
                (true, true) => &[0, 1],
                (false, true) => &[0],
                (true, false) => &[1],
                (false, false) => return None,
            },
            _ => return None,
        };
        return candidates.iter().find_map(|&k| {
            let below = walk_cast(d, ins[k])?;
            Some(Below { select: NONE, scale: node, ..below })
        });
    }
    walk_cast(d, t)
}

/// `[Cast] <- MatMul`, walking back from tensor `t`.
fn walk_cast(d: &Dense<'_>, mut t: u32) -> Option<Below> {
    let mut cast = NONE;
    let mut node = producer(d, t);
    if node != NONE && matches!(d.op(node), Op::Cast { .. }) {
        cast = node;
        t = *d.inputs(node).first()?;
        node = producer(d, t);
    }
    (node != NONE && matches!(d.op(node), Op::MatMul)).then_some(Below {
        select: NONE,
        scale: NONE,
        cast,
        m1: node,
        scores: t,
    })
}

/// `[Where] <- [Mul | Div] <- [Cast] <- MatMul`, walking back from tensor `t`: a Where whose second or third
/// operand leads down to the scores.
fn walk_select(d: &Dense<'_>, t: u32) -> Option<Below> {
    let node = producer(d, t);
    if node != NONE && matches!(d.op(node), Op::Where) {
        let ins = d.inputs(node);
        return ins.iter().skip(1).find_map(|&u| walk_scores(d, u)).map(|below| Below { select: node, ..below });
    }
    walk_scores(d, t)
}

/// Match the chain around Softmax node `s`.
pub(super) fn find(d: &Dense<'_>, s: u32) -> Found {
    let Op::Softmax { axis } = d.op(s) else { return Found::No };
    let Some(&x) = d.inputs(s).first() else { return Found::No };
    // Walk back: [Add] <- [Mul | Div] <- [Cast] <- MatMul; the mask's scores operand is the one that leads to a
    // MatMul.
    let mut mask = NONE;
    let mut below = None;
    let node = producer(d, x);
    if node != NONE && matches!(d.op(node), Op::Add) {
        below = d.inputs(node).iter().find_map(|&u| walk_select(d, u));
        if below.is_some() {
            mask = node;
        }
    }
    if mask == NONE {
        below = walk_select(d, x);
    }
    let Some(Below { select, scale, cast: cast_scores, m1, scores }) = below else { return Found::No };
    // The edge the verdict goes on: out of m1 into the next link.
    let next = [cast_scores, scale, select, mask, s].into_iter().find(|&n| n != NONE).unwrap_or(s);
    let refuse = |why: Why| Found::Refused { m1, next, why };
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
    let mut cast_probs = NONE;
    let mut probs = p_t;
    if let [c] = d.readers(p_t) {
        if matches!(d.op(*c), Op::Cast { .. }) {
            cast_probs = *c;
            probs = d.outputs(*c)[0];
        }
    }
    let readers = d.readers(probs);
    let m2 = match readers {
        [c] if matches!(d.op(*c), Op::MatMul) && d.inputs(*c).first() == Some(&probs) => *c,
        [c] => return refuse(Why::AttnNotPv { node: *c }),
        _ => return refuse(Why::AttnEscapes { t: probs }),
    };
    let mut inter = vec![scores];
    inter.extend([cast_scores, scale, select, mask].into_iter().filter(|&n| n != NONE).map(|n| d.outputs(n)[0]));
    inter.push(p_t);
    if cast_probs != NONE {
        inter.push(probs);
    }
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
    let chain = Chain { m1, cast_scores, scale, select, mask, softmax: s, cast_probs, m2 };
    if let Some(why) = dtypes(d, &chain) {
        return refuse(why);
    }
    Found::Chain(chain)
}

/// The dtype rule (module docs): `None` when the chain is all f32 without casts, or a half chain whose scores
/// are widened (by a cast, or by the mixed-precision links that read them) and whose probabilities are stored in
/// the half type (by the Softmax, or by a cast after it).
fn dtypes(d: &Dense<'_>, c: &Chain) -> Option<Why> {
    let dtype = |t: u32| d.graph.tensor(d.tids[t as usize]).dtype;
    let cast_to = |n: u32| match d.op(n) {
        Op::Cast { to } => *to,
        _ => DType::F32,
    };
    let scores = d.outputs(c.m1)[0];
    // The chain's type: what the first MatMul computes in.
    let outer = dtype(scores);
    let half = matches!(outer, DType::F16 | DType::BF16);
    if !half && outer != DType::F32 {
        return Some(Why::AttnDtype { t: scores, want: DType::F32 });
    }
    if c.cast_scores != NONE && (!half || cast_to(c.cast_scores) != DType::F32) {
        return Some(Why::AttnCast { node: c.cast_scores, want: DType::F32 });
    }
    if c.cast_probs != NONE && (!half || cast_to(c.cast_probs) != outer) {
        return Some(Why::AttnCast { node: c.cast_probs, want: outer });
    }
    // The probabilities: f32 in an f32 chain; in a half chain the half type, stored so by the Softmax or by the
    // cast after it.
    let p_t = d.outputs(c.softmax)[0];
    let p_want = if half && c.cast_probs == NONE { outer } else { DType::F32 };
    if dtype(p_t) != p_want {
        return Some(Why::AttnDtype { t: p_t, want: p_want });
    }
    // Outside the links: Q, K, V, the probabilities MatMul reads and the output in the chain's type.
    let (m2_in, o) = (d.inputs(c.m2), d.outputs(c.m2)[0]);
    let outside = [d.inputs(c.m1)[0], d.inputs(c.m1)[1], m2_in[0], m2_in[1], o];
    if let Some(&u) = outside.iter().find(|&&u| dtype(u) != outer) {
        return Some(Why::AttnDtype { t: u, want: outer });
    }
    // Between the scores and the Softmax: every link stores f32 (the scores are never rounded to half inside);
    // the scale, fill and mask operands are floats (read widened), the select's condition is bool.
    if c.select != NONE {
        let cond = d.inputs(c.select)[0];
        if dtype(cond) != DType::Bool {
            return Some(Why::AttnDtype { t: cond, want: DType::Bool });
        }
    }
    let links = [c.cast_scores, c.scale, c.select, c.mask];
    for n in links.into_iter().filter(|&n| n != NONE) {
        let out = d.outputs(n)[0];
        if dtype(out) != DType::F32 {
            return Some(Why::AttnDtype { t: out, want: DType::F32 });
        }
        let skip = usize::from(n == c.select);
        let want = if half { None } else { Some(DType::F32) };
        for &u in d.inputs(n).iter().skip(skip) {
            let ok = match want {
                Some(w) => dtype(u) == w,
                None => dtype(u).is_float(),
            };
            if !ok {
                return Some(Why::AttnDtype { t: u, want: want.unwrap_or(DType::F32) });
            }
        }
    }
    None
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
