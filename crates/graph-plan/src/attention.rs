//! The attention chain inside a `GroupKind::Attention` kernel's body, found once for every backend: `MatMul(Q,
//! K^T) -> [Cast] -> [Mul or Div by a scalar] -> [Where(cond, scores, fill) or Where(cond, fill, scores)] ->
//! [Add mask] -> Softmax -> [Cast] -> MatMul(., V)` as indices into
//! the body (the planner's `fusion/attention.rs` matcher, on the kernel program). exec-sim computes the chain
//! with an online softmax and exec-cuda generates it; both start from [`find`].

use crate::ids::ValueId;
use crate::plan::Kernel;
use graph_ir::Op;

/// The chain inside an attention kernel's body: indices into `body`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionChain {
    /// The scores MatMul, `Q x K^T`.
    pub m1: usize,
    /// The Cast of half scores to f32 (a half chain).
    pub cast_scores: Option<usize>,
    /// The Mul or Div by a scalar.
    pub scale: Option<usize>,
    /// A `Where` that replaces masked scores by a fill value (GPT-2's causal mask in eager exports): the scores
    /// are its second or third operand.
    pub select: Option<usize>,
    /// The mask (or bias) Add.
    pub mask: Option<usize>,
    /// The Softmax over the scores' last axis.
    pub softmax: usize,
    /// The Cast of the f32 probabilities back to the half type (a half chain).
    pub cast_probs: Option<usize>,
    /// The output MatMul, `P x V`.
    pub m2: usize,
}

impl AttentionChain {
    /// True for the links whose values the fused kernel never forms (every link but the output MatMul).
    pub fn skipped(&self, i: usize) -> bool {
        i == self.m1
            || Some(i) == self.cast_scores
            || Some(i) == self.scale
            || Some(i) == self.select
            || Some(i) == self.mask
            || i == self.softmax
            || Some(i) == self.cast_probs
    }
}

/// The links below the mask, walking back from value `v`: `[Mul | Div by a scalar] <- [Cast] <- MatMul`, as
/// `(scale, cast, m1)`.
fn walk_scores(k: &Kernel, v: ValueId) -> Option<(Option<usize>, Option<usize>, usize)> {
    let body = &k.body;
    let producer = |v: ValueId| body.iter().position(|i| i.outputs.contains(&v));
    let scalar = |v: &ValueId| k.values.get(v.index()).is_some_and(|x| x.shape.0.iter().product::<usize>() == 1);
    // `[Cast] <- MatMul` from value `v`.
    let below_cast = |v: ValueId| {
        let mut at = producer(v)?;
        let mut cast = None;
        if matches!(body[at].op, Op::Cast { .. }) {
            cast = Some(at);
            at = producer(*body[at].inputs.first()?)?;
        }
        matches!(body[at].op, Op::MatMul).then_some((cast, at))
    };
    let at = producer(v)?;
    if matches!(body[at].op, Op::Mul | Op::Div) {
        let ins = &body[at].inputs;
        // The scores operand; when both are scalars (a 1x1 score matrix), the one that leads down to a MatMul.
        let candidates: &[usize] = match body[at].op {
            Op::Div if ins.len() == 2 && scalar(&ins[1]) => &[0],
            Op::Mul if ins.len() == 2 => match (scalar(&ins[0]), scalar(&ins[1])) {
                (true, true) => &[0, 1],
                (false, true) => &[0],
                (true, false) => &[1],
                (false, false) => return None,
            },
            _ => return None,
        };
        let (cast, m1) = candidates.iter().find_map(|&i| below_cast(ins[i]))?;
        return Some((Some(at), cast, m1));
    }
    let (cast, m1) = below_cast(v)?;
    Some((None, cast, m1))
}

/// `[Where] <- [Mul | Div] <- [Cast] <- MatMul` from value `v`: the Where (its scores operand the second or the
/// third) and the links below it.
#[allow(clippy::type_complexity)]
fn walk_select(k: &Kernel, v: ValueId) -> Option<(Option<usize>, (Option<usize>, Option<usize>, usize))> {
    let at = k.body.iter().position(|i| i.outputs.contains(&v))?;
    if matches!(k.body[at].op, Op::Where) {
        let ins = &k.body[at].inputs;
        return ins.iter().skip(1).find_map(|&u| walk_scores(k, u)).map(|below| (Some(at), below));
    }
    walk_scores(k, v).map(|below| (None, below))
}

/// The chain in kernel `k`'s body, or what is missing from it (a short phrase the backends prefix with the
/// kernel's name).
pub fn find(k: &Kernel) -> Result<AttentionChain, &'static str> {
    let body = &k.body;
    let producer = |v: ValueId| body.iter().position(|i| i.outputs.contains(&v));
    let softmax = body.iter().position(|i| matches!(i.op, Op::Softmax { .. })).ok_or("no Softmax")?;
    let p = *body[softmax].outputs.first().ok_or("Softmax without output")?;
    let cast_probs = body.iter().position(|i| matches!(i.op, Op::Cast { .. }) && i.inputs.first() == Some(&p));
    let probs = match cast_probs {
        Some(c) => *body[c].outputs.first().ok_or("Cast without output")?,
        None => p,
    };
    let m2 = body
        .iter()
        .position(|i| matches!(i.op, Op::MatMul) && i.inputs.first() == Some(&probs))
        .ok_or("no MatMul reads the probabilities")?;
    let x = *body[softmax].inputs.first().ok_or("Softmax without input")?;
    let mut mask = None;
    let mut below = None;
    if let Some(j) = producer(x).filter(|&j| matches!(body[j].op, Op::Add)) {
        below = body[j].inputs.iter().find_map(|&v| walk_select(k, v));
        mask = below.map(|_| j);
    }
    if mask.is_none() {
        below = walk_select(k, x);
    }
    let (select, (scale, cast_scores, m1)) = below.ok_or("the scores do not come from a MatMul")?;
    Ok(AttentionChain { m1, cast_scores, scale, select, mask, softmax, cast_probs, m2 })
}
