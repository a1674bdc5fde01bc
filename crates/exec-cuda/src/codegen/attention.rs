//! Fused attention kernels (`GroupKind::Attention`): `MatMul(Q, K^T) -> [Cast] -> [Mul or Div by a scalar] ->
//! [Where(cond, scores, fill)] -> [Add mask] -> Softmax(last axis) -> [Cast] -> MatMul(., V)` as one per-element
//! kernel with an online softmax, so the score matrix is never stored. The `Where` (a causal mask in an eager
//! GPT-2 export) replaces a score by its fill value where the condition says so, as exec-sim does.
//!
//! **Shape of the kernel.** A per-element kernel ([`super::emit`]): one thread per element of each output, every
//! other value of the kernel (the head-split Transposes that produce Q, K^T and V, elementwise producers of the
//! mask, the head-merge Transpose that consumes the output) indexed in its own shape as usual. The chain's output
//! `O[b, i, d]` (batch `b`, query row `i`, column `d` of V) is computed by the thread that needs it: it walks the
//! keys in tiles of [`TILE`], forms each tile's scores in registers (`Q[b, i, :] . K^T[b, :, j]`, scaled and
//! masked), and keeps a running maximum `m`, a running sum `l` and the accumulator `acc = sum_j p_j V[b, j, d]`,
//! rescaled by `exp(m_old - m_new)` once per tile (FlashAttention's online softmax). Where a whole warp computes
//! one query row (`dv` a multiple of 32, the row's columns innermost in the output, as in every head-merge
//! layout; checked at run time per warp), the warp forms each tile's scores once: lane `x` forms scores `x` and
//! `x + 32` in registers, the tile's maximum is a butterfly, and the accumulation reads each score from its lane
//! by shuffle (bert_base on an H200: 264 -> 35 us per kernel, `docs/gpu.md`). Other warps (narrow heads, a row
//! cut by the guard) walk alone, every thread forming its row's scores. Both walks use the same tiles, sums in the
//! same order and the same rounding, so they give the same bits. A block per query row sharing K/V tiles in
//! shared memory is the next step.
//!
//! **Semantics: exec-sim's (`exec_sim::attention`).** The chain is found the same way (`chain` mirrors its
//! matcher on the kernel program); Q and K^T broadcast their batch axes together (numpy rules), V broadcasts into
//! that batch, the mask into `[batch, sq, sk]`, and the scale is the scalar operand of the Mul or Div (on the
//! right of a Div). Scores are f32 dot products summed sequentially over `k`, then scaled and masked in f32, never
//! rounded to a half type; half Q, K, V are loaded through the PRELUDE's `h2f`/`bf2f` and the output is rounded
//! once, on the store, to its dtype. The statistics and the accumulator are f32 here (exec-sim keeps them in f64):
//! the host-emulator differential holds the kernel to `exec_sim::attention::ATTENTION_TOLERANCE` of the unfused
//! f32 chain. A NaN score makes the row NaN, a row whose scores are all `-inf` is `0 / 0` (NaN), as in exec-sim.
//!
//! Anything the generator cannot express (no chain, shapes that do not chain or broadcast, a non-float scale, an
//! intermediate of the chain read by another op) is [`crate::CudaError::Unsupported`], never a kernel.

use graph_plan::{DType, Kernel, Op, ValueId};

use super::emit::{self, Emitter};
use super::{unsupported, value_checked, KernelSource};
use crate::error::CudaResult;

/// Keys (rows of V) per tile: the scores of one tile live in registers, and the accumulator is rescaled once per
/// tile, as exec-sim's kernel does.
pub const TILE: usize = 64;

/// The chain inside an attention kernel's body (found by `graph_plan::attention`, shared with exec-sim).
pub(crate) type Chain = graph_plan::attention::AttentionChain;

/// Generates the per-element kernel of an attention group.
///
/// # Errors
/// [`crate::CudaError::Unsupported`] when the body holds no chain the generator can express.
pub(crate) fn generate(kernel: &Kernel) -> CudaResult<KernelSource> {
    let c = chain(kernel)?;
    emit::generate_with(kernel, None, Some(c))
}

/// Finds the chain (`graph_plan::attention::find`, shared with exec-sim) and checks what this generator relies on.
pub(crate) fn chain(k: &Kernel) -> CudaResult<Chain> {
    let body = &k.body;
    let no = |what: &str| unsupported(k, format!("attention kernel: {what}"));
    let producer = |v: ValueId| body.iter().position(|i| i.outputs.contains(&v));
    let c = graph_plan::attention::find(k).map_err(no)?;
    let (softmax, m2) = (c.softmax, c.m2);
    let x = *body[softmax].inputs.first().ok_or_else(|| no("Softmax without input"))?;
    // The softmax must run over the last axis of the scores, and every intermediate must be read only by the next
    // link (the planner guarantees both; a kernel that breaks them is refused, not miscomputed).
    let Op::Softmax { axis } = body[softmax].op else { return Err(no("no Softmax")) };
    let rank = value_checked(k, x)?.shape.rank();
    let last = i64::try_from(rank).is_ok_and(|r| axis == r - 1 || axis == -1);
    if !last {
        return Err(no(&format!("Softmax over axis {axis} of a rank-{rank} score")));
    }
    for (ii, instr) in body.iter().enumerate() {
        if c.skipped(ii) || ii == m2 {
            continue;
        }
        for v in &instr.inputs {
            if let Some(j) = producer(*v).filter(|&j| c.skipped(j)) {
                return Err(no(&format!(
                    "node '{}' reads '{}', an intermediate of the chain",
                    instr.node, body[j].node
                )));
            }
        }
    }
    for prm in &k.params {
        if producer(prm.value).is_some_and(|j| c.skipped(j)) {
            return Err(no(&format!("value {} of the chain is a kernel parameter", prm.value)));
        }
    }
    Ok(c)
}

/// Numpy broadcast of two batch shapes, `None` when they do not broadcast.
fn broadcast(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let n = a.len().max(b.len());
    (0..n)
        .map(|i| {
            let x = if i + a.len() >= n { a[i + a.len() - n] } else { 1 };
            let y = if i + b.len() >= n { b[i + b.len() - n] } else { 1 };
            match (x, y) {
                _ if x == y => Some(x),
                (1, _) => Some(y),
                (_, 1) => Some(x),
                _ => None,
            }
        })
        .collect()
}

/// Whether `from` broadcasts into `to` (numpy rules, `to` unchanged).
fn broadcasts_into(from: &[usize], to: &[usize]) -> bool {
    from.len() <= to.len() && from.iter().rev().zip(to.iter().rev()).all(|(&f, &t)| f == 1 || f == t)
}

/// The chain's output (the second MatMul's value, shape `[batch.., sq, dv]`) at linear index `idx`, emitted into
/// `e` as a C variable name (module docs for the algorithm and numerics).
pub(crate) fn output_at(e: &mut Emitter<'_>, c: &Chain, idx: &str) -> CudaResult<String> {
    let k = e.kernel();
    let body = &k.body;
    let no = |what: String| unsupported(k, format!("attention kernel: {what}"));
    let m1 = &body[c.m1];
    let (&qv, &kv) = match (m1.inputs.first(), m1.inputs.get(1)) {
        (Some(q), Some(kt)) => (q, kt),
        _ => return Err(no(format!("node '{}' lacks an operand", m1.node))),
    };
    let m2 = &body[c.m2];
    let (Some(&vv), Some(&ov)) = (m2.inputs.get(1), m2.outputs.first()) else {
        return Err(no(format!("node '{}' lacks an operand", m2.node)));
    };
    // The scores as the scale reads them, then the scale's other operand, then the mask's (exec-sim's walk).
    let mut score_v = match c.cast_scores {
        Some(j) => *body[j].outputs.first().ok_or_else(|| no("Cast without output".into()))?,
        None => *m1.outputs.first().ok_or_else(|| no("MatMul without output".into()))?,
    };
    let mut scale = None;
    if let Some(j) = c.scale {
        let ins = &body[j].inputs;
        let other = *ins.get(usize::from(ins.first() == Some(&score_v))).ok_or_else(|| no("scale operand".into()))?;
        scale = Some((other, matches!(body[j].op, Op::Div)));
        score_v = *body[j].outputs.first().ok_or_else(|| no("scale without output".into()))?;
    }
    // The select: condition, fill, and whether the scores are kept where the condition holds (exec-sim's walk).
    let mut select = None;
    if let Some(j) = c.select {
        let ins = &body[j].inputs;
        let [cond, t, f] = ins[..] else { return Err(no("the select needs three operands".into())) };
        let on_true = t == score_v;
        select = Some((cond, if on_true { f } else { t }, on_true));
        score_v = *body[j].outputs.first().ok_or_else(|| no("select without output".into()))?;
    }
    let mask = match c.mask {
        Some(j) => {
            let ins = &body[j].inputs;
            let (a, b) = (ins.first().copied(), ins.get(1).copied());
            Some(if a == Some(score_v) { b } else { a }.ok_or_else(|| no("mask operand".into()))?)
        }
        None => None,
    };
    let (q, kt, v, o) = (value_checked(k, qv)?, value_checked(k, kv)?, value_checked(k, vv)?, value_checked(k, ov)?);
    let (qd, kd, vd, od) = (q.shape.dims(), kt.shape.dims(), v.shape.dims(), o.shape.dims());
    if qd.len() < 2 || kd.len() < 2 || vd.len() < 2 {
        return Err(no(format!("operands of rank < 2: Q {}, K^T {}, V {}", q.shape, kt.shape, v.shape)));
    }
    let (sq, dk) = (qd[qd.len() - 2], qd[qd.len() - 1]);
    let sk = kd[kd.len() - 1];
    let dv = vd[vd.len() - 1];
    let shapes = || format!("Q {}, K^T {}, V {}, output {}", q.shape, kt.shape, v.shape, o.shape);
    if kd[kd.len() - 2] != dk || vd[vd.len() - 2] != sk {
        return Err(no(format!("shapes do not chain: {}", shapes())));
    }
    let batch = broadcast(&qd[..qd.len() - 2], &kd[..kd.len() - 2])
        .ok_or_else(|| no(format!("Q and K^T batches do not broadcast: {}", shapes())))?;
    let full = |tail: [usize; 2]| -> Vec<usize> { batch.iter().copied().chain(tail).collect() };
    if od != full([sq, dv]).as_slice() || !broadcasts_into(vd, &full([sk, dv])) {
        return Err(no(format!("the output is not [batch, sq, dv]: {}", shapes())));
    }
    for dt in [q.dtype, kt.dtype, v.dtype, o.dtype] {
        if !matches!(dt, DType::F32 | DType::F16 | DType::BF16) {
            return Err(no(format!("{dt} operands")));
        }
    }
    let mask = match mask {
        Some(mv) => {
            let m = value_checked(k, mv)?;
            if !m.dtype.is_float() || !broadcasts_into(m.shape.dims(), &full([sq, sk])) {
                return Err(no(format!("mask {} {} for scores {:?}", m.dtype, m.shape, full([sq, sk]))));
            }
            Some((mv, m.shape.dims().to_vec()))
        }
        None => None,
    };
    let select = match select {
        Some((cv, fv, on_true)) => {
            let (cond, fill) = (value_checked(k, cv)?, value_checked(k, fv)?);
            let scores = full([sq, sk]);
            if cond.dtype != DType::Bool || !broadcasts_into(cond.shape.dims(), &scores) {
                return Err(no(format!("select condition {} {} for scores {scores:?}", cond.dtype, cond.shape)));
            }
            if !fill.dtype.is_float() || !broadcasts_into(fill.shape.dims(), &scores) {
                return Err(no(format!("select fill {} {} for scores {scores:?}", fill.dtype, fill.shape)));
            }
            Some(Select {
                cond: (cv, cond.shape.dims().to_vec()),
                fill: (fv, fill.shape.dims().to_vec()),
                on_true,
                scores,
            })
        }
        None => None,
    };
    // The scale: loop-invariant, one load before the loops.
    let scale = match scale {
        Some((sv, div)) => {
            let s = value_checked(k, sv)?;
            if !s.dtype.is_float() || s.shape.numel() != Some(1) {
                return Err(no(format!("scale {} {} is not a float scalar", s.dtype, s.shape)));
            }
            Some((e.at(sv, "0LL")?, div))
        }
        None => None,
    };
    let ops = Operands {
        q: (qv, qd.to_vec(), full([sq, dk])),
        k: (kv, kd.to_vec(), full([dk, sk])),
        v: (vv, vd.to_vec(), full([sk, dv])),
        mask: mask.map(|(mv, mshape)| (mv, mshape, full([sq, sk]))),
        select,
        scale,
        sq,
        sk,
        dk,
        dv,
    };
    let b = e.def("long long", "t", &format!("{idx} / {}LL", (sq * dv).max(1)));
    let i = e.def("long long", "t", &format!("({idx} / {}LL) % {}LL", dv.max(1), sq.max(1)));
    let d = e.def("long long", "t", &format!("{idx} % {}LL", dv.max(1)));
    let neg_inf = "-__int_as_float(0x7f800000)";
    let (m, l, acc) = (e.fresh("m"), e.fresh("l"), e.fresh("acc"));
    e.line(&format!("float {m} = {neg_inf}, {l} = 0.0f, {acc} = 0.0f;"));
    // One thread per output element, so the `dv` threads of a query row would each form the row's scores: where a
    // whole warp is inside the guard and computes one row (the output's last axis is the row's columns, and its
    // 32 consecutive elements share the row, as in every head-merge layout), the warp forms each tile's scores
    // once, lane by lane, and passes them round by shuffles. Same tiles, same sums in the same order, same
    // rounding: the two paths give the same bits.
    let coop = match e.guard {
        Some(n) if dv >= WARP && dv % WARP == 0 && TILE % WARP == 0 => {
            let lane = e.def("long long", "t", "(long long)(threadIdx.x & 31u)");
            let row = e.def("long long", "t", &format!("{b} * {sq}LL + {i}"));
            let coop = e.fresh("coop");
            e.line(&format!(
                "const bool {coop} = i - {lane} + {WARP}LL <= {n}LL && __all_sync(0xffffffffu, {row} == \
                 __shfl_sync(0xffffffffu, {row}, 0));"
            ));
            e.open(&format!("if ({coop})"));
            tiles(e, &Tiles { b: &b, i: &i, d: &d, m: &m, l: &l, acc: &acc, lane: Some(&lane) }, &ops)?;
            e.close();
            true
        }
        _ => false,
    };
    if coop {
        e.open("else");
    }
    tiles(e, &Tiles { b: &b, i: &i, d: &d, m: &m, l: &l, acc: &acc, lane: None }, &ops)?;
    if coop {
        e.close();
    }
    // One rounding, to the output's dtype, on the store.
    Ok(e.def("float", "v", &emit::round(&format!("{acc} / {l}"), o.dtype)))
}

/// Lanes of a warp.
const WARP: usize = 32;

/// The chain's operands as the tile loop reads them: value, own dims, and the dims it broadcasts to.
struct Operands {
    q: (ValueId, Vec<usize>, Vec<usize>),
    k: (ValueId, Vec<usize>, Vec<usize>),
    v: (ValueId, Vec<usize>, Vec<usize>),
    mask: Option<(ValueId, Vec<usize>, Vec<usize>)>,
    select: Option<Select>,
    /// The scale's C expression and whether it divides.
    scale: Option<(String, bool)>,
    sq: usize,
    sk: usize,
    dk: usize,
    dv: usize,
}

/// A `Where` link: the condition and fill values with their own dims, whether the scores are kept where the
/// condition holds, and the scores' dims they broadcast to.
struct Select {
    cond: (ValueId, Vec<usize>),
    fill: (ValueId, Vec<usize>),
    on_true: bool,
    scores: Vec<usize>,
}

/// The C names the tile loop reads and updates: the thread's batch, query row and column, the running maximum,
/// sum and accumulator, and with `lane` the warp-cooperative form.
struct Tiles<'a> {
    b: &'a str,
    i: &'a str,
    d: &'a str,
    m: &'a str,
    l: &'a str,
    acc: &'a str,
    lane: Option<&'a str>,
}

/// One score `Q[b, i, :] . K^T[b, :, j]`, scaled and masked, into a new local.
fn score(e: &mut Emitter<'_>, t: &Tiles<'_>, o: &Operands, j: &str) -> CudaResult<String> {
    let (b, i, sq, sk, dk) = (t.b, t.i, o.sq, o.sk, o.dk);
    let dot = e.fresh("dot");
    e.line(&format!("float {dot} = 0.0f;"));
    let kk = e.fresh("k");
    e.open(&format!("for (long long {kk} = 0; {kk} < {dk}LL; ++{kk})"));
    let qi = e.def("long long", "t", &format!("({b} * {sq}LL + {i}) * {dk}LL + {kk}"));
    let qi = e.broadcast_index(&qi, &o.q.2, &o.q.1);
    let ki = e.def("long long", "t", &format!("({b} * {dk}LL + {kk}) * {sk}LL + {j}"));
    let ki = e.broadcast_index(&ki, &o.k.2, &o.k.1);
    let qx = e.at(o.q.0, &qi)?;
    let kx = e.at(o.k.0, &ki)?;
    e.line(&format!("{dot} += {qx} * {kx};"));
    e.close();
    if let Some((sc, div)) = &o.scale {
        let op = if *div { '/' } else { '*' };
        e.line(&format!("{dot} = {dot} {op} {sc};"));
    }
    if let Some(sel) = &o.select {
        let si = e.def("long long", "t", &format!("({b} * {sq}LL + {i}) * {sk}LL + {j}"));
        let ci = e.broadcast_index(&si, &sel.scores, &sel.cond.1);
        let fi = e.broadcast_index(&si, &sel.scores, &sel.fill.1);
        let cx = e.at(sel.cond.0, &ci)?;
        let fx = e.at(sel.fill.0, &fi)?;
        let keep = if sel.on_true { cx } else { format!("!({cx})") };
        e.line(&format!("if (!({keep})) {dot} = {fx};"));
    }
    if let Some((mv, mshape, mfull)) = &o.mask {
        let mi = e.def("long long", "t", &format!("({b} * {sq}LL + {i}) * {sk}LL + {j}"));
        let mi = e.broadcast_index(&mi, mfull, mshape);
        let mx = e.at(*mv, &mi)?;
        e.line(&format!("{dot} = {dot} + {mx};"));
    }
    Ok(dot)
}

/// The online-softmax walk over the keys in tiles of [`TILE`] (module docs). Alone, the thread forms each tile's
/// scores itself; with `lane`, lane `x` forms scores `x, x + 32, ..` of the tile (`TILE / 32` registers), the
/// tile's maximum is a butterfly over the warp, and the accumulation reads each score from its lane.
fn tiles(e: &mut Emitter<'_>, t: &Tiles<'_>, o: &Operands) -> CudaResult<()> {
    let (b, d, m, l, acc, sk, dv) = (t.b, t.d, t.m, t.l, t.acc, o.sk, o.dv);
    let neg_inf = "-__int_as_float(0x7f800000)";
    let nan = "__int_as_float(0x7fc00000)";
    let j0 = e.fresh("j");
    e.open(&format!("for (long long {j0} = 0; {j0} < {sk}LL; {j0} += {TILE}LL)"));
    let (cols, tmax) = (e.fresh("n"), e.fresh("m"));
    e.line(&format!("const long long {cols} = min({TILE}LL, {sk}LL - {j0});"));
    e.line(&format!("float {tmax} = {neg_inf};"));
    // The tile's scores: in a local array, or one register per 32 keys in each lane (slot `r` holds key
    // `32 r + lane`; the loop over slots is unrolled, so the registers are never indexed at run time).
    let s = e.fresh("s");
    let (jj, slot) = match t.lane {
        None => {
            e.line(&format!("float {s}[{TILE}];"));
            let jj = e.fresh("j");
            e.open(&format!("for (long long {jj} = 0; {jj} < {cols}; ++{jj})"));
            (jj.clone(), format!("{s}[{jj}]"))
        }
        Some(lane) => {
            e.line(&format!("float {s}[{}];", TILE / WARP));
            let r = e.fresh("r");
            e.line("#pragma unroll");
            e.open(&format!("for (int {r} = 0; {r} < {}; ++{r})", TILE / WARP));
            let jj = e.def("long long", "j", &format!("{r} * {WARP}LL + {lane}"));
            // Lanes past the tile's end hold -inf: they never raise the maximum and are never read.
            e.line(&format!("{s}[{r}] = {neg_inf};"));
            e.line(&format!("if ({jj} >= {cols}) continue;"));
            (jj, format!("{s}[{r}]"))
        }
    };
    let j = e.def("long long", "t", &format!("{j0} + {jj}"));
    let dot = score(e, t, o, &j)?;
    e.line(&format!("{slot} = {dot};"));
    e.line(&format!("if ({dot} > {tmax} || {dot} != {dot}) {tmax} = {dot};"));
    e.close();
    if t.lane.is_some() {
        // The tile's maximum over the warp; a NaN anywhere makes it NaN, as the sequential scan does.
        let x = e.fresh("x");
        e.open(&format!("for (int {x} = 16; {x} > 0; {x} >>= 1)"));
        let other = e.def("float", "m", &format!("__shfl_xor_sync(0xffffffffu, {tmax}, {x})"));
        e.line(&format!("{tmax} = ({tmax} != {tmax} || {other} != {other}) ? {nan} : fmaxf({tmax}, {other});"));
        e.close();
    }
    // Rescale, then accumulate the tile.
    let mnew = e.fresh("m");
    e.line(&format!("const float {mnew} = ({m} != {m} || {tmax} != {tmax}) ? {nan} : fmaxf({m}, {tmax});"));
    e.line(&format!("if ({mnew} == {neg_inf}) continue;"));
    let corr = e.fresh("c");
    e.line(&format!("const float {corr} = {m} == {neg_inf} ? 0.0f : expf({m} - {mnew});"));
    e.line(&format!("{l} *= {corr};"));
    e.line(&format!("{acc} *= {corr};"));
    let jj = e.fresh("j");
    e.open(&format!("for (long long {jj} = 0; {jj} < {cols}; ++{jj})"));
    let sj = match t.lane {
        None => format!("{s}[{jj}]"),
        Some(_) => {
            // Every lane reads the same slot of the same source lane (jj is uniform over the warp).
            let sel = e.fresh("s");
            e.line(&format!("float {sel} = {};", s.clone() + "[0]"));
            for r in 1..TILE / WARP {
                e.line(&format!("if ({jj} / {WARP}LL == {r}LL) {sel} = {s}[{r}];"));
            }
            e.def("float", "s", &format!("__shfl_sync(0xffffffffu, {sel}, (int)({jj} % {WARP}LL))"))
        }
    };
    let p = e.def("float", "p", &format!("expf({sj} - {mnew})"));
    e.line(&format!("{l} += {p};"));
    let vi = e.def("long long", "t", &format!("({b} * {sk}LL + {j0} + {jj}) * {dv}LL + {d}"));
    let vi = e.broadcast_index(&vi, &o.v.2, &o.v.1);
    let vx = e.at(o.v.0, &vi)?;
    e.line(&format!("{acc} += {p} * {vx};"));
    e.close();
    e.line(&format!("{m} = {mnew};"));
    e.close();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_broadcasting() {
        assert_eq!(broadcast(&[2, 1, 3], &[4, 1]), Some(vec![2, 4, 3]));
        assert_eq!(broadcast(&[], &[2, 3]), Some(vec![2, 3]));
        assert_eq!(broadcast(&[2], &[3]), None);
        assert!(broadcasts_into(&[1, 1, 1, 70], &[1, 2, 70, 70]));
        assert!(broadcasts_into(&[70, 70], &[1, 2, 70, 70]));
        assert!(!broadcasts_into(&[2, 70], &[1, 2, 70, 70]));
        assert!(!broadcasts_into(&[1, 1, 2, 70, 70], &[2, 70, 70]));
    }
}
