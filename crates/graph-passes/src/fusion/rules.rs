//! Groups under construction and the legality of merging two of them: kernel-class rules, reduction domains,
//! and the caps.

use graph_ir::{Op, OpCategory, TensorId};
use std::collections::HashMap;

use super::dense::{Dense, NONE};
use super::{FusionCaps, GroupKind, RejectReason};

/// A rejection with its specifics.
pub(super) type Reject = (RejectReason, String);

fn reject<T>(reason: RejectReason, detail: impl Into<String>) -> Result<T, Reject> {
    Err((reason, detail.into()))
}

/// Shape with leading extent-1 axes stripped: numpy broadcasting and row-major layout do not see them.
fn canon(d: &[usize]) -> &[usize] {
    let k = d.iter().take_while(|&&x| x == 1).count();
    &d[k..]
}

/// How a value lines up with the rows of a reduction domain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Class {
    /// The shape of the reduction's input: one value per element of a row.
    Full,
    /// The reduced shape with kept (extent-1) axes: one value per row, broadcastable against full values.
    Keep,
    /// The reduced shape with the axes removed: one value per row.
    Drop,
}

impl Class {
    fn reduced(self) -> bool {
        self != Class::Full
    }
}

/// A reduction domain in canonical form (leading extent-1 axes stripped).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct Domain {
    /// The reduction's input shape.
    pub full: Vec<usize>,
    /// Reduced axes of `full`, ascending (extent-1 axes dropped: reducing them is a no-op).
    pub axes: Vec<usize>,
    keep: Vec<usize>,
    drop: Vec<usize>,
}

impl Domain {
    /// The domain of a reduction op over an input of shape `dims`; `None` when the op is not a reduction or its
    /// axes are out of range (a validated graph has none).
    fn of(op: &Op, dims: &[usize]) -> Option<Domain> {
        let rank = dims.len() as i64;
        let norm = |a: i64| -> Option<usize> {
            let v = if a < 0 { a + rank } else { a };
            (0..rank.max(1)).contains(&v).then_some(v as usize)
        };
        let mut axes: Vec<usize> = match op {
            Op::ReduceSum { axes, .. } | Op::ReduceMean { axes, .. } | Op::ReduceMax { axes, .. } => match axes {
                None => (0..dims.len()).collect(),
                Some(v) => v.iter().map(|&a| norm(a)).collect::<Option<Vec<_>>>()?,
            },
            Op::Softmax { axis } => vec![norm(*axis)?],
            Op::LayerNormalization { axis, .. } => (norm(*axis)?..dims.len()).collect(),
            Op::GlobalAveragePool => (2.min(dims.len())..dims.len()).collect(),
            _ => return None,
        };
        axes.sort_unstable();
        axes.dedup();
        let k = dims.len() - canon(dims).len();
        let full = dims[k..].to_vec();
        let axes: Vec<usize> = axes.into_iter().filter(|&a| a >= k && dims[a] != 1).map(|a| a - k).collect();
        let mut keep = full.clone();
        for &a in &axes {
            keep[a] = 1;
        }
        let drop: Vec<usize> = full.iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, &d)| d).collect();
        Some(Domain { keep: canon(&keep).to_vec(), drop: canon(&drop).to_vec(), full, axes })
    }

    /// The class of a value of shape `dims`, `None` when it is not a row value of this domain.
    pub fn class(&self, dims: &[usize]) -> Option<Class> {
        let c = canon(dims);
        if c == self.full.as_slice() {
            Some(Class::Full)
        } else if c == self.keep.as_slice() {
            Some(Class::Keep)
        } else if c == self.drop.as_slice() {
            Some(Class::Drop)
        } else {
            None
        }
    }
}

/// A group under construction.
#[derive(Clone, Debug)]
pub(super) struct Group {
    pub alive: bool,
    pub kind: GroupKind,
    /// Position of the group's anchor, `NONE` if none.
    pub anchor: u32,
    /// Interned reduction domain, `NONE` if the group has no reduction.
    pub domain: u32,
    /// Never fuses (a multi-output op such as Split, or a reduction whose domain is unknown).
    pub opaque: bool,
    /// Non-view member positions.
    pub members: Vec<u32>,
    pub flops: u64,
    /// Tensors the members read whose bytes another kernel (or no kernel) writes; sorted, distinct.
    pub inputs: Vec<TensorId>,
    /// Tensors members write that are read outside the group or are graph outputs; sorted, distinct.
    pub escaping: Vec<TensorId>,
    /// Lowest and highest member positions.
    pub lo: u32,
    pub hi: u32,
}

impl Group {
    pub fn ops(&self) -> usize {
        self.members.len()
    }
}

/// The merged figures of two groups, before deciding.
#[derive(Clone, Debug, Default)]
pub(super) struct Preview {
    pub inputs: Vec<TensorId>,
    pub escaping: Vec<TensorId>,
    pub ops: usize,
    pub flops: u64,
    /// Distinct members whose results escape.
    pub writers: usize,
}

/// What a legal merge becomes.
#[derive(Clone, Copy, Debug)]
pub(super) struct Merged {
    pub kind: GroupKind,
    pub anchor: u32,
    pub domain: u32,
}

/// Every group, the owner of every node, and the interned reduction domains.
pub(super) struct Groups {
    /// Groups, initially one per node position (views: dead placeholders).
    pub g: Vec<Group>,
    /// Group of each non-view node (`NONE` for views).
    pub owner: Vec<u32>,
    /// For a dead group: the group it merged into (`NONE` if it never lived).
    pub merged_into: Vec<u32>,
    domains: Vec<Domain>,
    /// Domain of each reduction node (`NONE` otherwise).
    node_domain: Vec<u32>,
}

fn sorted_union(a: &[TensorId], b: &[TensorId]) -> Vec<TensorId> {
    let mut v = Vec::with_capacity(a.len() + b.len());
    v.extend_from_slice(a);
    v.extend_from_slice(b);
    v.sort_unstable();
    v.dedup();
    v
}

impl Groups {
    /// One singleton group per non-view node.
    pub fn new(d: &Dense<'_>) -> Groups {
        let n = d.len();
        let mut domains: Vec<Domain> = Vec::new();
        let mut index: HashMap<Domain, u32> = HashMap::new();
        let mut node_domain = vec![NONE; n];
        let mut g = Vec::with_capacity(n);
        let mut owner = vec![NONE; n];
        for i in 0..n as u32 {
            let cat = d.cat[i as usize];
            let view = cat == OpCategory::View;
            let mut opaque = d.outputs(i).len() != 1;
            if cat == OpCategory::Reduction {
                let dom = d.inputs(i).first().and_then(|&x| Domain::of(d.op(i), d.graph.tensor(x).shape.dims()));
                match dom {
                    Some(dom) => {
                        let next = domains.len() as u32;
                        let id = *index.entry(dom.clone()).or_insert(next);
                        if id == next {
                            domains.push(dom);
                        }
                        node_domain[i as usize] = id;
                    }
                    None => opaque = true,
                }
            }
            let mut inputs: Vec<TensorId> = d.inputs(i).to_vec();
            inputs.sort_unstable();
            inputs.dedup();
            let mut escaping: Vec<TensorId> = d
                .outputs(i)
                .iter()
                .copied()
                .filter(|&t| d.is_output(t) || d.readers(t).is_some_and(|r| !r.cons.is_empty()))
                .collect();
            escaping.sort_unstable();
            escaping.dedup();
            if !view {
                owner[i as usize] = i;
            }
            g.push(Group {
                alive: !view,
                kind: GroupKind::of(cat),
                anchor: if cat == OpCategory::Anchor { i } else { NONE },
                domain: node_domain[i as usize],
                opaque,
                members: if view { Vec::new() } else { vec![i] },
                flops: if view { 0 } else { d.graph.node_cost(d.ids[i as usize]).flops },
                inputs: if view { Vec::new() } else { inputs },
                escaping: if view { Vec::new() } else { escaping },
                lo: i,
                hi: i,
            });
        }
        Groups { g, owner, merged_into: vec![NONE; n], domains, node_domain }
    }

    pub fn domain(&self, id: u32) -> Option<&Domain> {
        self.domains.get(id as usize)
    }

    /// The live group a possibly dead group id now belongs to.
    pub fn resolve(&self, mut x: u32) -> u32 {
        while !self.g[x as usize].alive {
            let next = self.merged_into[x as usize];
            if next == NONE {
                return x;
            }
            x = next;
        }
        x
    }

    /// The merged figures of groups `a` and `b`.
    pub fn preview(&self, d: &Dense<'_>, a: u32, b: u32) -> Preview {
        let (ga, gb) = (&self.g[a as usize], &self.g[b as usize]);
        let inside = |n: u32| {
            let o = self.owner[n as usize];
            o == a || o == b
        };
        let mut inputs = sorted_union(&ga.inputs, &gb.inputs);
        inputs.retain(|&t| !d.producer(t).is_some_and(inside));
        let mut escaping = sorted_union(&ga.escaping, &gb.escaping);
        escaping.retain(|&t| d.is_output(t) || d.readers(t).is_some_and(|r| r.cons.iter().any(|&c| !inside(c))));
        let mut writers: Vec<u32> = escaping.iter().filter_map(|&t| d.producer(t)).collect();
        writers.sort_unstable();
        writers.dedup();
        Preview {
            ops: ga.ops() + gb.ops(),
            flops: ga.flops.saturating_add(gb.flops),
            writers: writers.len(),
            inputs,
            escaping,
        }
    }

    /// Merge `a` and `b` (the larger absorbs the smaller); returns `(kept, absorbed)`.
    pub fn merge(&mut self, a: u32, b: u32, pv: Preview, m: Merged) -> (u32, u32) {
        let (keep, gone) =
            if self.g[a as usize].members.len() >= self.g[b as usize].members.len() { (a, b) } else { (b, a) };
        let moved = std::mem::take(&mut self.g[gone as usize].members);
        for &n in &moved {
            self.owner[n as usize] = keep;
        }
        let (lo, hi) = (self.g[gone as usize].lo, self.g[gone as usize].hi);
        {
            let k = &mut self.g[keep as usize];
            k.members.extend_from_slice(&moved);
            k.kind = m.kind;
            k.anchor = m.anchor;
            k.domain = m.domain;
            k.flops = pv.flops;
            k.inputs = pv.inputs;
            k.escaping = pv.escaping;
            k.lo = k.lo.min(lo);
            k.hi = k.hi.max(hi);
        }
        let dead = &mut self.g[gone as usize];
        dead.alive = false;
        dead.inputs = Vec::new();
        dead.escaping = Vec::new();
        self.merged_into[gone as usize] = keep;
        (keep, gone)
    }

    /// Decide whether groups `a` and `b` may form one kernel under `caps`, ignoring cycles and profitability.
    /// `multi_output_ok` is false in phase 1 (the caller rejects multi-output merges with its own reason).
    pub fn legal(&self, d: &Dense<'_>, caps: &FusionCaps, a: u32, b: u32, pv: &Preview) -> Result<Merged, Reject> {
        let (ga, gb) = (&self.g[a as usize], &self.g[b as usize]);
        for g in [ga, gb] {
            match g.kind {
                GroupKind::Custom => return reject(RejectReason::AcrossCustom, "a custom kernel never fuses"),
                GroupKind::Copy => return reject(RejectReason::AcrossCopy, "a host/device copy never fuses"),
                _ => {}
            }
        }
        for g in [ga, gb] {
            if g.opaque {
                let name = d.name(g.members[0]);
                return reject(RejectReason::Pattern, format!("'{name}' (a multi-output op) runs alone"));
            }
        }
        if ga.anchor != NONE && gb.anchor != NONE {
            return reject(
                RejectReason::Pattern,
                format!("two anchors ('{}', '{}') in one kernel", d.name(ga.anchor), d.name(gb.anchor)),
            );
        }
        let anchor = if ga.anchor != NONE { ga.anchor } else { gb.anchor };
        let domain = match (ga.domain, gb.domain) {
            (NONE, x) | (x, NONE) => x,
            (x, y) if x == y => x,
            _ => return reject(RejectReason::Pattern, "reductions over different rows or axes"),
        };
        let dm = ga.kind == GroupKind::DataMovement || gb.kind == GroupKind::DataMovement;
        if anchor != NONE && domain != NONE {
            return reject(RejectReason::Pattern, "an anchor and a reduction in one kernel");
        }
        if anchor != NONE && dm {
            return reject(RejectReason::Pattern, "a data-movement op in an anchor's epilogue");
        }
        if domain != NONE && dm {
            return reject(RejectReason::Pattern, "a data-movement op in a reduction kernel");
        }
        let kind = if anchor != NONE {
            GroupKind::Anchor
        } else if domain != NONE {
            GroupKind::Reduction
        } else if dm {
            GroupKind::DataMovement
        } else {
            GroupKind::Elementwise
        };
        // Kernel-class caps.
        match kind {
            GroupKind::Anchor => {
                let (cap, which) = match d.op(anchor) {
                    Op::MatMul => (caps.matmul_epilogue, "matmul_epilogue"),
                    Op::Gemm { .. } => (caps.gemm_epilogue, "gemm_epilogue"),
                    Op::Conv(_) => (caps.conv_epilogue, "conv_epilogue"),
                    _ => (caps.pool_epilogue, "pool_epilogue"),
                };
                if !cap {
                    return reject(RejectReason::CapsExceeded, format!("caps.{which} is off"));
                }
            }
            GroupKind::Reduction if !caps.reduction_fusion => {
                return reject(RejectReason::CapsExceeded, "caps.reduction_fusion is off");
            }
            GroupKind::DataMovement if !caps.injective_fusion => {
                return reject(RejectReason::CapsExceeded, "caps.injective_fusion is off");
            }
            _ => {}
        }
        let inside = |n: u32| {
            let o = self.owner[n as usize];
            o == a || o == b
        };
        // Class rules.
        match kind {
            GroupKind::Anchor => {
                for &t in d.inputs(anchor) {
                    if let Some(p) = d.producer(t).filter(|&p| inside(p)) {
                        return reject(
                            RejectReason::Pattern,
                            format!(
                                "'{}' would compute an operand of anchor '{}' (no prologue fusion)",
                                d.name(p),
                                d.name(anchor)
                            ),
                        );
                    }
                }
                let want = d.outputs(anchor).first().map_or(0, |&t| d.numel(t));
                if let Some(&t) = pv.escaping.iter().find(|&&t| d.numel(t) != want) {
                    return reject(
                        RejectReason::Pattern,
                        format!(
                            "'{}' ({} elements) leaves the epilogue of '{}' ({} elements)",
                            d.graph.tensor(t).name,
                            d.numel(t),
                            d.name(anchor),
                            want
                        ),
                    );
                }
            }
            GroupKind::Elementwise | GroupKind::DataMovement => {
                if let Some(&first) = pv.escaping.first() {
                    let want = d.numel(first);
                    if let Some(&t) = pv.escaping.iter().find(|&&t| d.numel(t) != want) {
                        return reject(
                            RejectReason::Pattern,
                            format!(
                                "loop kernel outputs of different sizes: '{}' ({}) and '{}' ({})",
                                d.graph.tensor(first).name,
                                want,
                                d.graph.tensor(t).name,
                                d.numel(t)
                            ),
                        );
                    }
                }
            }
            GroupKind::Reduction => {
                let dom = match self.domain(domain) {
                    Some(x) => x,
                    None => return reject(RejectReason::Pattern, "unknown reduction domain"),
                };
                // Validate the side never checked against this domain, or the smaller side (every edge
                // between the two touches it).
                let side = match (ga.domain == NONE, gb.domain == NONE) {
                    (true, _) => ga,
                    (_, true) => gb,
                    _ if ga.members.len() <= gb.members.len() => ga,
                    _ => gb,
                };
                self.check_rows(d, domain, dom, &side.members, &inside)?;
            }
            _ => {}
        }
        // Size caps.
        if pv.ops > caps.max_ops {
            return reject(
                RejectReason::CapsExceeded,
                format!("{} ops exceed caps.max_ops = {}", pv.ops, caps.max_ops),
            );
        }
        if pv.inputs.len() > caps.max_inputs {
            return reject(
                RejectReason::CapsExceeded,
                format!("{} inputs exceed caps.max_inputs = {}", pv.inputs.len(), caps.max_inputs),
            );
        }
        if pv.writers > 1 && !caps.multi_output {
            return reject(
                RejectReason::CapsExceeded,
                "the kernel would write several results; caps.multi_output is off",
            );
        }
        Ok(Merged { kind, anchor, domain })
    }

    /// Row-kernel rules for `members` and every edge touching them inside the merged group.
    fn check_rows(
        &self,
        d: &Dense<'_>,
        dom_id: u32,
        dom: &Domain,
        members: &[u32],
        inside: &dyn Fn(u32) -> bool,
    ) -> Result<(), Reject> {
        let shape = |t: TensorId| d.graph.tensor(t).shape.dims();
        let name = |t: TensorId| d.graph.tensor(t).name.as_str();
        for &m in members {
            if d.cat[m as usize] == OpCategory::Reduction {
                if self.node_domain[m as usize] != dom_id {
                    return reject(RejectReason::Pattern, format!("'{}' reduces other rows", d.name(m)));
                }
            } else if d.cat[m as usize] != OpCategory::Elementwise {
                return reject(RejectReason::Pattern, format!("'{}' cannot run in a row kernel", d.name(m)));
            }
            for &t in d.outputs(m) {
                if dom.class(shape(t)).is_none() {
                    return reject(
                        RejectReason::Pattern,
                        format!("'{}' {:?} is not a row value of reduction domain {:?}", name(t), shape(t), dom.full),
                    );
                }
                if let Some(r) = d.readers(t) {
                    for &c in r.cons.iter().filter(|&&c| inside(c)) {
                        self.check_edge(d, dom, t, c)?;
                    }
                }
            }
            for &t in d.inputs(m) {
                if d.producer(t).is_some_and(inside) {
                    self.check_edge(d, dom, d.root[t], m)?;
                }
            }
        }
        Ok(())
    }

    /// An edge from the value `t` (a kernel-written tensor) to consumer `c`, inside a row kernel.
    fn check_edge(&self, d: &Dense<'_>, dom: &Domain, t: TensorId, c: u32) -> Result<(), Reject> {
        let shape = |t: TensorId| d.graph.tensor(t).shape.dims();
        let from = dom.class(shape(t));
        let c_red = d.cat[c as usize] == OpCategory::Reduction;
        let out = d.outputs(c).first().and_then(|&o| dom.class(shape(o)));
        for &read in d.inputs(c).iter().filter(|&&x| d.root[x] == d.root[t]) {
            let to = dom.class(shape(read));
            let ok = match (from, to) {
                (Some(f), Some(r)) if f.reduced() == r.reduced() => {
                    if c_red {
                        r == Class::Full
                    } else {
                        match out {
                            Some(Class::Full) => r != Class::Drop,
                            Some(_) => r.reduced(),
                            None => false,
                        }
                    }
                }
                _ => false,
            };
            if !ok {
                return reject(
                    RejectReason::Pattern,
                    format!(
                        "'{}' reads '{}' {:?} in a way that does not follow the rows of domain {:?}",
                        d.name(c),
                        d.graph.tensor(read).name,
                        shape(read),
                        dom.full
                    ),
                );
            }
        }
        Ok(())
    }
}
