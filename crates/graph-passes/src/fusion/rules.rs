//! Groups under construction and the legality of merging two of them: kernel-class rules, reduction domains,
//! and the caps. Rejections carry a typed `Why`, turned into text only for the decisions the plan keeps.

use graph_ir::{Op, OpCategory};
use std::collections::HashMap;

use super::dense::{Dense, CAST, GATHER, LOAD, NONE, PRODUCT, READS_MOVE, SELECTION, SPLIT};
use super::{FusionCaps, GroupKind, RejectReason, POOL_CHAIN_MAX_WINDOW};

/// The specifics of a rejection (node and tensor positions), formatted by `text` when reported.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Why {
    Disabled,
    Custom,
    Copy,
    Opaque { node: u32 },
    LoneSplit { node: u32 },
    ConcatPinned { node: u32 },
    TwoAnchors { a: u32, b: u32 },
    NotSiblings { a: u32, b: u32, what: &'static str },
    OtherRows { a: u32, b: u32 },
    AnchorReduction { anchor: u32 },
    AnchorMove { anchor: u32 },
    SelectCompute { node: u32, anchor: u32 },
    ReductionMove,
    RowLoad { node: u32 },
    CapOff(&'static str),
    Prologue { p: u32, anchor: u32 },
    EpilogueSize { t: u32, anchor: u32 },
    LoopSizes { a: u32, b: u32 },
    NotRowValue { t: u32 },
    RowEdge { c: u32, t: u32 },
    NotRowOp { node: u32 },
    MaxOps { ops: usize, cap: usize },
    MaxInputs { inputs: usize, cap: usize },
    MultiOutputOff,
    MultiConsumer { p: u32, kernels: usize, example: u32 },
    GraphOutput { p: u32 },
    Cycle { from: u32, via: u32, to: u32 },
    Budget { work: u64 },
    Concurrency { path: f64, critical: f64 },
    NotSmall { node: u32, bytes: u64, small: u64 },
    HorizontalAnchor { node: u32 },
    Dependent,
    AttnAxis { node: u32 },
    AttnEscapes { t: u32 },
    AttnNotPv { node: u32 },
    AttnBroadcast { t: u32 },
    AttnShape { node: u32 },
    AttnBatch { node: u32 },
    AttnDtype { t: u32, want: graph_ir::DType },
    AttnCast { node: u32, want: graph_ir::DType },
    AttnMember { node: u32 },
    AttnClosed { node: u32 },
}

impl Why {
    pub fn text(&self, d: &Dense<'_>) -> String {
        let n = |i: &u32| d.name(*i);
        let t = |i: &u32| d.tname(*i);
        match self {
            Why::Disabled => "fusion is off".into(),
            Why::Custom => "a custom kernel never fuses".into(),
            Why::Copy => "a host/device copy never fuses".into(),
            Why::Opaque { node } => format!("'{}' (a multi-output op) runs alone", n(node)),
            Why::LoneSplit { node } => {
                format!("'{}' (a Split) runs alone unless it routes the result of an anchor (a selection)", n(node))
            }
            Why::ConcatPinned { node } => {
                format!("'{}' is eliminated: its producers write into its output's slices", n(node))
            }
            Why::TwoAnchors { a, b } => format!("two anchors ('{}', '{}') in one kernel", n(a), n(b)),
            Why::NotSiblings { a, b, what } => {
                format!("'{}' and '{}' read one activation but are no sibling projections: {what}", n(a), n(b))
            }
            Why::OtherRows { a, b } => {
                format!("reductions over different rows or axes ('{}' and '{}')", n(a), n(b))
            }
            Why::AnchorReduction { anchor } => format!("an anchor ('{}') and a reduction in one kernel", n(anchor)),
            Why::AnchorMove { anchor } => format!(
                "a data-movement op other than a Transpose, a constant-index Gather or a Split in the epilogue of '{}'",
                n(anchor)
            ),
            Why::SelectCompute { node, anchor } => format!(
                "'{}' would combine a selection with another value of the epilogue of '{}' (after a Gather or a \
                 Split there, only Transposes, views and elementwise ops with operands from outside the kernel)",
                n(node),
                n(anchor)
            ),
            Why::ReductionMove => "a data-movement op in a reduction kernel (only Gather, Slice, Expand, Transpose \
                                   and Concat loads of tensors from outside the kernel join one)"
                .into(),
            Why::RowLoad { node } => format!(
                "'{}' (data movement) would read or feed a value computed in the row kernel; only loads of tensors from \
                 outside it join one",
                n(node)
            ),
            Why::CapOff(which) => format!("caps.{which} is off"),
            Why::Prologue { p, anchor } => {
                format!(
                    "'{}' would compute an operand of anchor '{}' (only a Transpose of the last two axes that the \
                     product alone reads joins it, as an operand layout)",
                    n(p),
                    n(anchor)
                )
            }
            Why::EpilogueSize { t: x, anchor } => format!(
                "'{}' ({} elements) leaves the epilogue of '{}' ({} elements)",
                t(x),
                d.numel[*x as usize],
                n(anchor),
                d.outputs(*anchor).first().map_or(0, |&o| d.numel[o as usize])
            ),
            Why::LoopSizes { a, b } => format!(
                "loop kernel outputs of different sizes: '{}' ({}) and '{}' ({})",
                t(a),
                d.numel[*a as usize],
                t(b),
                d.numel[*b as usize]
            ),
            Why::NotRowValue { t: x } => {
                format!("'{}' {:?} is not a row value of the kernel's reduction", t(x), d.dims(*x))
            }
            Why::RowEdge { c, t: x } => format!(
                "'{}' reads '{}' {:?} in a way that does not follow the reduction's rows",
                n(c),
                t(x),
                d.dims(*x)
            ),
            Why::NotRowOp { node } => format!("'{}' cannot run in a row kernel", n(node)),
            Why::MaxOps { ops, cap } => format!("{ops} ops exceed caps.max_ops = {cap}"),
            Why::MaxInputs { inputs, cap } => format!("{inputs} inputs exceed caps.max_inputs = {cap}"),
            Why::MultiOutputOff => "the kernel would write several results; caps.multi_output is off".into(),
            Why::MultiConsumer { p, kernels, example } => {
                format!("'{}' is read by {kernels} kernels (e.g. by '{}')", n(p), n(example))
            }
            Why::GraphOutput { p } => format!("'{}' writes a graph output", n(p)),
            Why::Cycle { from, via, to } => {
                format!("a path from '{}' through '{}' reaches '{}'", n(from), n(via), n(to))
            }
            Why::Budget { work } => format!("the cycle check stopped after {work} steps"),
            Why::Concurrency { path, critical } => format!(
                "the path through the merged kernel ({path:.2} us) would exceed the critical path ({critical:.2} us)"
            ),
            Why::NotSmall { node, bytes, small } => {
                format!("'{}' moves {bytes} bytes, more than one launch is worth ({small})", n(node))
            }
            Why::HorizontalAnchor { node } => {
                format!("'{}' is an anchor (horizontal fusion is for loop and row kernels)", n(node))
            }
            Why::Dependent => "one sibling reads the other".into(),
            Why::AttnAxis { node } => format!("attention: softmax '{}' is not over the last axis", n(node)),
            Why::AttnEscapes { t: x } => {
                format!(
                    "attention: '{}' is read outside the chain or is a graph output (it would be materialised)",
                    t(x)
                )
            }
            Why::AttnNotPv { node } => {
                format!("attention: the probabilities are not the left operand of a MatMul ('{}' reads them)", n(node))
            }
            Why::AttnBroadcast { t: x } => {
                format!("attention: '{}' {:?} broadcasts the scores to another shape", t(x), d.dims(*x))
            }
            Why::AttnShape { node } => format!("attention: '{}' has operands of rank below 2", n(node)),
            Why::AttnBatch { node } => format!("attention: V of '{}' broadcasts the batch of the scores", n(node)),
            Why::AttnDtype { t: x, want } => {
                let is = d.graph.tensor(d.tids[*x as usize]).dtype;
                format!("attention: '{}' is {is}, the chain needs {want} (f32 chains, or half ones cast to f32 around the softmax)", t(x))
            }
            Why::AttnCast { node, want } => {
                let from = d.inputs(*node).first().map(|&i| d.graph.tensor(d.tids[i as usize]).dtype);
                let to = d.outputs(*node).first().map(|&o| d.graph.tensor(d.tids[o as usize]).dtype);
                let name = |x: Option<graph_ir::DType>| x.map_or_else(|| "?".to_string(), |x| x.to_string());
                format!(
                    "attention: cast '{}' converts {} to {}, the chain needs {want} there",
                    n(node),
                    name(from),
                    name(to)
                )
            }
            Why::AttnMember { node } => {
                format!("attention: '{}' (fused with the chain) cannot run in an attention kernel", n(node))
            }
            Why::AttnClosed { node } => {
                format!("'{}' is in a fused attention kernel, which takes nothing more", n(node))
            }
        }
    }
}

/// A rejection with its specifics.
pub(super) type Reject = (RejectReason, Why);

fn reject<T>(reason: RejectReason, why: Why) -> Result<T, Reject> {
    Err((reason, why))
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
    /// Where a reduction op over an input of shape `dims` reduces, in canonical form: the full shape and the
    /// reduced axes (as in [`Domain`]), written to `key` as the full shape's rank, its extents, the axes (the rank
    /// first, so that no extent can be read as a separator). False when the
    /// op is not a reduction or its axes are out of range (a validated graph has none). Two reductions share a
    /// domain exactly when their keys are equal (the rest of a domain follows from these two), and the key costs
    /// no allocation, so [`Groups::new`] looks a domain up by it before building one.
    fn key(op: &Op, dims: &[usize], key: &mut Vec<usize>) -> bool {
        let rank = dims.len() as i64;
        let norm = |a: i64| -> Option<usize> {
            let v = if a < 0 { a + rank } else { a };
            (0..rank.max(1)).contains(&v).then_some(v as usize)
        };
        let k = dims.len() - canon(dims).len();
        key.clear();
        key.push(dims.len() - k);
        key.extend_from_slice(&dims[k..]);
        let start = key.len();
        match op {
            Op::ReduceSum { axes, .. } | Op::ReduceMean { axes, .. } | Op::ReduceMax { axes, .. } => match axes {
                None => key.extend(0..dims.len()),
                Some(v) => {
                    for &a in v {
                        let Some(a) = norm(a) else { return false };
                        key.push(a);
                    }
                }
            },
            Op::Softmax { axis } => {
                let Some(a) = norm(*axis) else { return false };
                key.push(a);
            }
            Op::LayerNormalization { axis, .. } => {
                let Some(a) = norm(*axis) else { return false };
                key.extend(a..dims.len());
            }
            Op::GlobalAveragePool => key.extend(2.min(dims.len())..dims.len()),
            _ => return false,
        }
        crate::stream::sort_dedup_tail(key, start);
        if key[start..].iter().any(|&a| a >= dims.len()) {
            return false;
        }
        // Extent-1 axes are dropped (reducing them is a no-op); the rest are counted from the canonical shape.
        let mut kept = start;
        for r in start..key.len() {
            let a = key[r];
            if a >= k && dims[a] != 1 {
                key[kept] = a - k;
                kept += 1;
            }
        }
        key.truncate(kept);
        true
    }

    /// The domain of a [`Domain::key`].
    fn from_key(key: &[usize]) -> Domain {
        let split = key.first().map_or(0, |&rank| rank.saturating_add(1)).min(key.len());
        let full = key.get(1..split).unwrap_or_default().to_vec();
        let axes = key[split..].to_vec();
        let mut keep = full.clone();
        for &a in &axes {
            keep[a] = 1;
        }
        let drop: Vec<usize> = full.iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, &d)| d).collect();
        Domain { keep: canon(&keep).to_vec(), drop: canon(&drop).to_vec(), full, axes }
    }

    /// True when a value of shape `dims` broadcasts (numpy rules) into the full shape without being a row value:
    /// BERT's position rows `[1, S, H]` in a `[B, S, H]` domain. A load may compute such a value inline (the
    /// elementwise op reading it indexes it by broadcast); it never leaves the kernel. Refused when its element
    /// count is a full or a per-row count, which a backend could not tell apart from those classes.
    fn broadcasts(&self, dims: &[usize]) -> bool {
        let c = canon(dims);
        if c.len() > self.full.len() || self.class(dims).is_some() {
            return false;
        }
        let aligned = self.full[self.full.len() - c.len()..].iter().zip(c).all(|(&f, &x)| x == f || x == 1);
        let n: usize = c.iter().product();
        let full: usize = self.full.iter().product();
        let rows: usize = self.drop.iter().product();
        aligned && n != full && n != rows
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

/// A group under construction: the scalar facts every candidate check reads, kept small (48 bytes) so that a
/// large graph's groups stay dense in cache; a merged group's lists live apart, in [`Lists`]. A group that never
/// merged is implicit: its member, inputs and escaping tensors are its node's (no lists, no allocation).
#[derive(Clone, Debug)]
pub(super) struct Group {
    pub alive: bool,
    pub kind: GroupKind,
    /// Position of the group's anchor, `NONE` if none.
    pub anchor: u32,
    /// Position of the first pool of a pool chain (`FusionCaps::pool_chain`) whose second pool is the anchor,
    /// `NONE` if none.
    pub chain: u32,
    /// Interned reduction domain, `NONE` if the group has no reduction.
    pub domain: u32,
    /// Never fuses (a multi-output op other than a Split, or a reduction whose domain is unknown).
    pub opaque: bool,
    /// Has a Split member: it may only be a selection in an anchor's epilogue (`select_epilogue`), never part of
    /// a loop kernel.
    pub splits: bool,
    /// An eliminable Concat (`fusion/concat.rs`): never merges, so that it can run no kernel at all.
    pub pinned: bool,
    /// Every data-movement member is a pure permutation (Transpose) or a selection (a Gather at a constant
    /// scalar index): the group only changes where values go, so an anchor's epilogue may take it (the
    /// permutation folds into an output index map, a selection routes part of the result to its own output).
    pub layout_only: bool,
    /// Has a selection member (see `is_selection`).
    pub selects: bool,
    /// Every data-movement member is a load op (`is_load`): a row kernel may take the group when those members
    /// read only tensors from outside it (an embedding Gather feeding its LayerNorm).
    pub loads_only: bool,
    /// Has a data-movement member (the row rules on loads apply).
    pub moves: bool,
    /// Index of the group's lists in `Groups::lists` (`NONE` until it first merges, [`Group::merged`]).
    lists: u32,
    /// Members (the length of its member list; kept here so that the op-count cap reads no list).
    size: u32,
    pub flops: u64,
    /// Lowest and highest member positions.
    pub lo: u32,
    pub hi: u32,
    /// Round of phase 2 in which the group last changed (at most `MAX_ROUNDS + 1`).
    pub epoch: u8,
}

impl Group {
    /// Has merged: its lists (`Groups::lists[lists]`) are authoritative.
    pub fn merged(&self) -> bool {
        self.lists != NONE
    }
}

// The candidate checks read two groups' scalar facts per pair: one cache line each (checked at compile time).
const _: () = assert!(std::mem::size_of::<Group>() <= 48);

/// The lists of a merged group.
#[derive(Clone, Debug, Default)]
struct Lists {
    /// The other products of a horizontal GEMM (`FusionCaps::horizontal_gemm`): MatMuls or Gemms like the
    /// anchor reading its left operand with weights of one shape; empty otherwise.
    siblings: Vec<u32>,
    /// Non-view member positions.
    members: Vec<u32>,
    /// Tensors the members read whose bytes another kernel (or no kernel) writes; sorted, distinct.
    inputs: Vec<u32>,
    /// Tensors members write that are read outside the group or are graph outputs; sorted, distinct.
    escaping: Vec<u32>,
}

/// The merged figures of two groups, before deciding.
#[derive(Clone, Debug, Default)]
pub(super) struct Preview {
    pub inputs: Vec<u32>,
    pub escaping: Vec<u32>,
    /// Distinct members whose results escape.
    pub writers: usize,
}

/// What a legal merge becomes.
#[derive(Clone, Copy, Debug)]
pub(super) struct Merged {
    pub kind: GroupKind,
    pub anchor: u32,
    /// The first pool of a pool chain (`Group::chain`).
    pub chain: u32,
    /// The merge joins two sibling products (`Group::siblings`).
    pub horizontal: bool,
    pub domain: u32,
}

/// Every group, the owner of every node, and the interned reduction domains.
#[derive(Clone)]
pub(super) struct Groups {
    /// Groups, initially one per node position (views: dead placeholders).
    pub g: Vec<Group>,
    /// The lists of the merged groups (`Group::lists`); an absorbed group's entry is emptied.
    lists: Vec<Lists>,
    /// Group of each non-view node (`NONE` for views).
    pub owner: Vec<u32>,
    /// For a dead group: the group it merged into (`NONE` if it never lived).
    merged_into: Vec<u32>,
    pub domains: Vec<Domain>,
    /// Domain of each reduction node (`NONE` otherwise).
    node_domain: Vec<u32>,
}

fn union_into(out: &mut Vec<u32>, a: &[u32], b: &[u32]) {
    out.clear();
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        let v = match (a.get(i), b.get(j)) {
            (Some(&x), Some(&y)) if x == y => {
                i += 1;
                j += 1;
                x
            }
            (Some(&x), Some(&y)) if x < y => {
                i += 1;
                x
            }
            (Some(_), Some(&y)) => {
                j += 1;
                y
            }
            (Some(&x), None) => {
                i += 1;
                x
            }
            (None, Some(&y)) => {
                j += 1;
                y
            }
            (None, None) => break,
        };
        out.push(v);
    }
}

impl Groups {
    /// One singleton group per non-view node; `flops` per node (zeros when the model does not need them).
    pub fn new(d: &Dense<'_>, flops: &[u64]) -> Groups {
        let n = d.len();
        let mut domains: Vec<Domain> = Vec::new();
        // Domains by their key: most reductions share one with an earlier reduction, found without allocating.
        let mut index: HashMap<Vec<usize>, u32> = HashMap::new();
        let mut key = Vec::new();
        let mut node_domain = vec![NONE; n];
        let mut g = Vec::with_capacity(n);
        let mut owner = vec![NONE; n];
        for i in 0..n as u32 {
            let cat = d.cat[i as usize];
            let view = cat == OpCategory::View;
            let split = d.is(i, SPLIT);
            let mut opaque = d.outputs(i).len() != 1 && !split;
            if cat == OpCategory::Reduction {
                if d.inputs(i).first().is_some_and(|&x| Domain::key(d.op(i), d.dims(x), &mut key)) {
                    let id = match index.get(key.as_slice()) {
                        Some(&id) => id,
                        None => {
                            let id = domains.len() as u32;
                            domains.push(Domain::from_key(&key));
                            index.insert(key.clone(), id);
                            id
                        }
                    };
                    node_domain[i as usize] = id;
                } else {
                    opaque = true;
                }
            }
            if !view {
                owner[i as usize] = i;
            }
            g.push(Group {
                alive: !view,
                kind: GroupKind::of(cat),
                anchor: if cat == OpCategory::Anchor { i } else { NONE },
                chain: NONE,
                domain: node_domain[i as usize],
                opaque,
                splits: split,
                pinned: false,
                layout_only: cat != OpCategory::DataMovement
                    || matches!(d.op(i), Op::Transpose { .. })
                    || is_selection(d, i),
                selects: is_selection(d, i),
                loads_only: cat != OpCategory::DataMovement || d.is(i, LOAD),
                moves: cat == OpCategory::DataMovement,
                lists: NONE,
                size: 1,
                flops: flops.get(i as usize).copied().unwrap_or(0),
                lo: i,
                hi: i,
                epoch: 0,
            });
        }
        Groups { g, lists: Vec::new(), owner, merged_into: vec![NONE; n], domains, node_domain }
    }

    /// Group `x`'s lists, when it has merged (an unmerged group's are its node's).
    fn lists_of(&self, x: u32) -> Option<&Lists> {
        let g = &self.g[x as usize];
        g.merged().then(|| &self.lists[g.lists as usize])
    }

    pub fn members(&self, x: u32) -> &[u32] {
        self.lists_of(x).map_or(std::slice::from_ref(&self.g[x as usize].lo), |l| &l.members)
    }

    pub fn size(&self, x: u32) -> usize {
        self.g[x as usize].size as usize
    }

    /// The other products of group `x`'s horizontal GEMM (`Lists::siblings`); empty for an unmerged group.
    fn siblings(&self, x: u32) -> &[u32] {
        self.lists_of(x).map_or(&[], |l| &l.siblings)
    }

    pub fn inputs<'a>(&'a self, d: &'a Dense<'_>, x: u32) -> &'a [u32] {
        self.lists_of(x).map_or_else(|| d.inputs_sorted(self.g[x as usize].lo), |l| &l.inputs)
    }

    pub fn escaping<'a>(&'a self, d: &'a Dense<'_>, x: u32) -> &'a [u32] {
        self.lists_of(x).map_or_else(|| d.escaping(self.g[x as usize].lo), |l| &l.escaping)
    }

    /// The live group a possibly dead group id now belongs to.
    /// Reads only `merged_into` (a live group, or a view outside every group, has none): one compact array,
    /// not the groups' records, because the cycle checks resolve every neighbour they visit.
    pub fn resolve(&self, mut x: u32) -> u32 {
        loop {
            let next = self.merged_into[x as usize];
            if next == NONE {
                return x;
            }
            x = next;
        }
    }

    fn inside(&self, a: u32, b: u32) -> impl Fn(u32) -> bool + '_ {
        move |n: u32| {
            let o = self.owner[n as usize];
            o == a || o == b
        }
    }

    /// The merged figures of groups `a` and `b`.
    pub fn preview(&self, d: &Dense<'_>, a: u32, b: u32) -> Preview {
        let inside = self.inside(a, b);
        let (ia, ib) = (self.inputs(d, a), self.inputs(d, b));
        let mut inputs = Vec::with_capacity(ia.len() + ib.len());
        union_into(&mut inputs, ia, ib);
        inputs.retain(|&t| {
            let p = d.kprod[t as usize];
            p == NONE || !inside(p)
        });
        let (ea, eb) = (self.escaping(d, a), self.escaping(d, b));
        let mut escaping = Vec::with_capacity(ea.len() + eb.len());
        union_into(&mut escaping, ea, eb);
        escaping.retain(|&t| d.is_output(t) || d.readers(t).iter().any(|&c| !inside(c)));
        // Distinct writers: a scan of the few before each one (no sorted copy for the usual short list).
        const SCAN: usize = 32;
        let writer = |t: &u32| d.kprod[*t as usize];
        let writers = if escaping.len() <= SCAN {
            let ws = || escaping.iter().map(writer);
            ws().enumerate().filter(|&(i, w)| !ws().take(i).any(|v| v == w)).count()
        } else {
            let mut ws: Vec<u32> = escaping.iter().map(writer).collect();
            ws.sort_unstable();
            ws.dedup();
            ws.len()
        };
        Preview { inputs, escaping, writers }
    }

    /// Bytes saved by merging `a` and `b`: inputs both read, and tensors from one to the other that are no
    /// longer read (and, when nothing outside reads them, no longer written). Cheap: no merged lists are built.
    pub fn bytes_saved(&self, d: &Dense<'_>, a: u32, b: u32) -> u64 {
        let inside = self.inside(a, b);
        let (ia, ib) = (self.inputs(d, a), self.inputs(d, b));
        let mut saved = 0u64;
        let (mut i, mut j) = (0, 0);
        while i < ia.len() && j < ib.len() {
            match ia[i].cmp(&ib[j]) {
                std::cmp::Ordering::Equal => {
                    let t = ia[i];
                    // Read once instead of twice, unless it is now produced inside (counted below).
                    if !(d.kprod[t as usize] != NONE && inside(d.kprod[t as usize])) {
                        saved = saved.saturating_add(d.bytes[t as usize]);
                    }
                    i += 1;
                    j += 1;
                }
                std::cmp::Ordering::Less => i += 1,
                std::cmp::Ordering::Greater => j += 1,
            }
        }
        for (x, list) in [(b, ia), (a, ib)] {
            let from_x = |t: &u32| {
                let p = d.kprod[*t as usize];
                p != NONE && self.owner[p as usize] == x
            };
            for (k, t) in list.iter().enumerate().filter(|(_, t)| from_x(t)) {
                saved = saved.saturating_add(d.bytes[*t as usize]);
                // The write is saved once per root, when nothing outside reads it any more.
                let r = d.root[*t as usize];
                let first = !list[..k].iter().any(|u| from_x(u) && d.root[*u as usize] == r);
                if first && !d.is_output(r) && d.readers(r).iter().all(|&c| inside(c)) {
                    saved = saved.saturating_add(d.bytes[r as usize]);
                }
            }
        }
        saved
    }

    /// Bytes group `x` moves: its inputs read plus what it writes.
    pub fn bytes(&self, d: &Dense<'_>, x: u32) -> u64 {
        self.inputs(d, x).iter().chain(self.escaping(d, x)).map(|&t| d.bytes[t as usize]).fold(0, u64::saturating_add)
    }

    /// Merge `a` and `b` (the larger absorbs the smaller); returns `(kept, absorbed)`.
    pub fn merge(&mut self, a: u32, b: u32, pv: Preview, m: Merged, epoch: u32) -> (u32, u32) {
        let (keep, gone) = if self.size(a) >= self.size(b) { (a, b) } else { (b, a) };
        let g_gone = &mut self.g[gone as usize];
        g_gone.alive = false;
        let gone_size = g_gone.size;
        let (lo, hi, flops, layout_only, selects, splits, loads_only, moves) = (
            g_gone.lo,
            g_gone.hi,
            g_gone.flops,
            g_gone.layout_only,
            g_gone.selects,
            g_gone.splits,
            g_gone.loads_only,
            g_gone.moves,
        );
        // A group that never merged is its one node: no list to move (and none allocated for it).
        let single = !g_gone.merged();
        let (mut moved, mut siblings) = if !single {
            let l = std::mem::take(&mut self.lists[g_gone.lists as usize]);
            (l.members, l.siblings)
        } else {
            (Vec::new(), Vec::new())
        };
        if m.horizontal {
            for x in [self.g[a as usize].anchor, self.g[b as usize].anchor] {
                if x != m.anchor {
                    siblings.push(x);
                }
            }
        }
        if single {
            self.owner[lo as usize] = keep;
        }
        for &n in &moved {
            self.owner[n as usize] = keep;
        }
        let k = &mut self.g[keep as usize];
        if !k.merged() {
            k.lists = self.lists.len() as u32;
            let mut members = Vec::with_capacity(1 + moved.len().max(1));
            members.push(k.lo);
            self.lists.push(Lists { members, ..Lists::default() });
        }
        let l = &mut self.lists[k.lists as usize];
        if single {
            l.members.push(lo);
        }
        l.members.append(&mut moved);
        l.siblings.append(&mut siblings);
        l.siblings.retain(|&x| x != m.anchor);
        l.siblings.sort_unstable();
        l.inputs = pv.inputs;
        l.escaping = pv.escaping;
        k.kind = m.kind;
        k.anchor = m.anchor;
        k.chain = m.chain;
        k.domain = m.domain;
        k.flops = k.flops.saturating_add(flops);
        k.layout_only &= layout_only;
        k.loads_only &= loads_only;
        k.moves |= moves;
        k.selects |= selects;
        k.splits |= splits;
        k.lo = k.lo.min(lo);
        k.hi = k.hi.max(hi);
        k.epoch = u8::try_from(epoch).unwrap_or(u8::MAX);
        k.size = k.size.saturating_add(gone_size);
        self.merged_into[gone as usize] = keep;
        (keep, gone)
    }

    /// The part of legality that needs no merged lists: custom and copy kernels, kernel classes, class caps, the
    /// anchor's operands, and the op count.
    pub fn structural(&self, d: &Dense<'_>, caps: &FusionCaps, a: u32, b: u32) -> Result<Merged, Reject> {
        let (ga, gb) = (&self.g[a as usize], &self.g[b as usize]);
        for g in [ga, gb] {
            match g.kind {
                GroupKind::Custom => return reject(RejectReason::AcrossCustom, Why::Custom),
                GroupKind::Copy => return reject(RejectReason::AcrossCopy, Why::Copy),
                _ => {}
            }
        }
        for g in [ga, gb] {
            if g.opaque {
                return reject(RejectReason::Pattern, Why::Opaque { node: g.lo });
            }
            if g.pinned {
                return reject(RejectReason::Pattern, Why::ConcatPinned { node: g.lo });
            }
            if g.kind == GroupKind::Attention {
                return reject(RejectReason::Pattern, Why::AttnClosed { node: g.lo });
            }
        }
        let mut chain = if ga.chain != NONE { ga.chain } else { gb.chain };
        let mut horizontal = false;
        let anchor = if ga.anchor != NONE && gb.anchor != NONE {
            // Two pools, the second reading the first's result, may chain, and sibling projections may share a
            // product; any other pair of anchors is two kernels.
            match pool_chain(d, caps, ga.anchor, gb.anchor, chain) {
                Some((first, second)) => {
                    chain = first;
                    second
                }
                None => {
                    siblings(d, caps, ga.anchor, gb.anchor)?;
                    horizontal = true;
                    ga.anchor.min(gb.anchor)
                }
            }
        } else if ga.anchor != NONE {
            ga.anchor
        } else {
            gb.anchor
        };
        let domain = match (ga.domain, gb.domain) {
            (NONE, x) | (x, NONE) => x,
            (x, y) if x == y => x,
            _ => return reject(RejectReason::Pattern, Why::OtherRows { a: ga.lo, b: gb.lo }),
        };
        let dm = ga.kind == GroupKind::DataMovement || gb.kind == GroupKind::DataMovement;
        if anchor != NONE && domain != NONE {
            return reject(RejectReason::Pattern, Why::AnchorReduction { anchor });
        }
        // A lone Transpose joining its product as an operand layout (`FusionCaps::operand_layout`; the operand
        // loop below checks the rest).
        let operand_layout = anchor != NONE
            && [(ga, gb), (gb, ga)].iter().any(|(t, other)| {
                t.kind == GroupKind::DataMovement
                    && !t.merged()
                    && other.anchor == anchor
                    && is_operand_layout(d, t.lo, anchor)
            });
        if operand_layout {
            if !caps.operand_layout {
                return reject(RejectReason::CapsExceeded, Why::CapOff("operand_layout"));
            }
        } else if anchor != NONE && dm {
            // A permutation after the anchor folds into its output index map (a permuted output layout), and a
            // selection routes part of the result to an output of its own; any other data movement (a slice, a
            // gather by a tensor of indices, a concat) changes what is computed, not where.
            if !(ga.layout_only && gb.layout_only) {
                return reject(RejectReason::Pattern, Why::AnchorMove { anchor });
            }
            for (on, which) in [(caps.injective_fusion, "injective_fusion"), (caps.layout_epilogue, "layout_epilogue")]
            {
                if !on {
                    return reject(RejectReason::CapsExceeded, Why::CapOff(which));
                }
            }
            if (ga.selects || gb.selects) && !caps.select_epilogue {
                return reject(RejectReason::CapsExceeded, Why::CapOff("select_epilogue"));
            }
        }
        if domain != NONE && dm {
            // Loads of outside tensors (an embedding lookup, a slice of a position table) are computed inline
            // at each element of the row kernel; `check_rows` refuses one whose operand the kernel computes.
            if !(ga.loads_only && gb.loads_only) {
                return reject(RejectReason::Pattern, Why::ReductionMove);
            }
            if !caps.injective_fusion {
                return reject(RejectReason::CapsExceeded, Why::CapOff("injective_fusion"));
            }
        }
        // A Split routes the parts of an anchor's result; in any other kernel it would have to be computed.
        if anchor == NONE && (ga.splits || gb.splits) {
            let node = if ga.splits { ga.lo } else { gb.lo };
            return reject(RejectReason::Pattern, Why::LoneSplit { node });
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
        match kind {
            GroupKind::Anchor => {
                let (cap, which) = match d.op(anchor) {
                    Op::MatMul => (caps.matmul_epilogue, "matmul_epilogue"),
                    Op::Gemm { .. } => (caps.gemm_epilogue, "gemm_epilogue"),
                    Op::Conv(_) => (caps.conv_epilogue, "conv_epilogue"),
                    _ => (caps.pool_epilogue, "pool_epilogue"),
                };
                if !cap {
                    return reject(RejectReason::CapsExceeded, Why::CapOff(which));
                }
                let inside = self.inside(a, b);
                // Only the chain's first pool may compute an operand of its anchor; nothing computes the first
                // pool's, nor a sibling product's.
                let others = [ga.anchor, gb.anchor].into_iter().filter(|&x| horizontal && x != anchor);
                // A lone product may read a transposed operand through its layout (`is_operand_layout`) when
                // nothing in the kernel computes the Transpose's input.
                let (sa, sb) = (self.siblings(a), self.siblings(b));
                let lone = chain == NONE && !horizontal && sa.is_empty() && sb.is_empty();
                for x in std::iter::once(anchor).chain(sa.iter().chain(sb).copied()).chain(others) {
                    for &t in d.inputs(x) {
                        let p = d.kprod[t as usize];
                        if p != NONE && p != chain && inside(p) {
                            let layout = caps.operand_layout
                                && lone
                                && x == anchor
                                && is_operand_layout(d, p, x)
                                && d.inputs(p).iter().all(|&u| {
                                    let q = d.kprod[u as usize];
                                    q == NONE || !inside(q)
                                });
                            if !layout {
                                return reject(RejectReason::Pattern, Why::Prologue { p, anchor: x });
                            }
                        }
                    }
                }
                if chain != NONE {
                    for &t in d.inputs(chain) {
                        let p = d.kprod[t as usize];
                        if p != NONE && inside(p) {
                            return reject(RejectReason::Pattern, Why::Prologue { p, anchor: chain });
                        }
                    }
                }
            }
            GroupKind::Reduction if !caps.reduction_fusion => {
                return reject(RejectReason::CapsExceeded, Why::CapOff("reduction_fusion"));
            }
            GroupKind::DataMovement if !caps.injective_fusion => {
                return reject(RejectReason::CapsExceeded, Why::CapOff("injective_fusion"));
            }
            _ => {}
        }
        let ops = self.size(a) + self.size(b);
        if ops > caps.max_ops {
            return reject(RejectReason::CapsExceeded, Why::MaxOps { ops, cap: caps.max_ops });
        }
        Ok(Merged { kind, anchor, chain, horizontal, domain })
    }

    /// The rest of legality, on the merged lists: input count, several writers, iteration spaces, and the row
    /// rules unless `rows_checked` (the caller ran [`Groups::shaped_rows`] already).
    #[allow(clippy::too_many_arguments)] // the merge's two groups, its summary and preview, and the flag
    pub fn shaped(
        &self,
        d: &Dense<'_>,
        caps: &FusionCaps,
        a: u32,
        b: u32,
        m: &Merged,
        pv: &Preview,
        rows_checked: bool,
    ) -> Result<(), Reject> {
        if pv.inputs.len() > caps.max_inputs {
            return reject(
                RejectReason::CapsExceeded,
                Why::MaxInputs { inputs: pv.inputs.len(), cap: caps.max_inputs },
            );
        }
        if pv.writers > 1 && !caps.multi_output {
            return reject(RejectReason::CapsExceeded, Why::MultiOutputOff);
        }
        match m.kind {
            GroupKind::Anchor => {
                let want = d.outputs(m.anchor).first().map_or(0, |&t| d.numel[t as usize]);
                let selected = if self.g[a as usize].selects || self.g[b as usize].selects {
                    self.selected(d, a, b, m.anchor)?
                } else {
                    Vec::new()
                };
                if let Some(&t) = pv
                    .escaping
                    .iter()
                    .find(|&&t| d.numel[t as usize] != want && !selected.contains(&through_views(d, t)))
                {
                    return reject(RejectReason::Pattern, Why::EpilogueSize { t, anchor: m.anchor });
                }
            }
            GroupKind::Elementwise | GroupKind::DataMovement => {
                if let Some(&first) = pv.escaping.first() {
                    let want = d.numel[first as usize];
                    if let Some(&t) = pv.escaping.iter().find(|&&t| d.numel[t as usize] != want) {
                        return reject(RejectReason::Pattern, Why::LoopSizes { a: first, b: t });
                    }
                }
            }
            GroupKind::Reduction if !rows_checked => self.shaped_rows(d, caps, a, b, m, true)?,
            _ => {}
        }
        Ok(())
    }

    /// The row rules of a merged reduction kernel (the part of [`Groups::shaped`] that needs no merged lists):
    /// every member maps onto the domain's rows, and data movement only loads from outside. Ok for other kinds.
    ///
    /// Without `reasons` only the verdict matters (a plan build records no decisions): the walk over the loads
    /// goes first, since it is short and refuses most candidates of a graph with many loads (a Concat reading a
    /// value the kernel computes). Either order refuses the same merges; only the rule named may differ.
    pub fn shaped_rows(
        &self,
        d: &Dense<'_>,
        caps: &FusionCaps,
        a: u32,
        b: u32,
        m: &Merged,
        reasons: bool,
    ) -> Result<(), Reject> {
        if m.kind != GroupKind::Reduction {
            return Ok(());
        }
        let Some(dom) = self.domains.get(m.domain as usize) else {
            return reject(RejectReason::Pattern, Why::ReductionMove);
        };
        // Validate the side never checked against this domain, or the smaller side (every edge between the two
        // touches it).
        let (da, db) = (self.g[a as usize].domain, self.g[b as usize].domain);
        let side = match (da == NONE, db == NONE) {
            (true, _) => a,
            (_, true) => b,
            _ if self.size(a) <= self.size(b) => a,
            _ => b,
        };
        let inside = self.inside(a, b);
        let moves = self.has_moves(a) || self.has_moves(b);
        if moves && !reasons {
            self.check_loads(d, dom, a, b, &inside)?;
        }
        self.check_rows(d, caps, m.domain, dom, self.members(side), &inside)?;
        if moves && reasons {
            self.check_loads(d, dom, a, b, &inside)?;
        }
        Ok(())
    }

    /// Whether the edge `m -> c` (`m` in `a`, `c` in `b`) alone refuses the merged row kernel `m`: `c` is one of
    /// its loads, not a row selection, and reads `m`'s result, which `m` computes (it is neither a load nor a
    /// Cast, so never `pure`). `check_loads` refuses every such kernel; this finds the common case (a branchy
    /// graph's Concat after a computed value) from the edge, without walking the members.
    pub fn load_reads_computed(&self, d: &Dense<'_>, a: u32, b: u32, m: &Merged, (p, c): (u32, u32)) -> bool {
        if m.kind != GroupKind::Reduction || d.cat[c as usize] != OpCategory::DataMovement || d.is(p, LOAD | CAST) {
            return false;
        }
        let Some(dom) = self.domains.get(m.domain as usize) else {
            return false;
        };
        let inside = self.inside(a, b);
        self.owner[p as usize] == a && self.owner[c as usize] == b && !Self::row_selection(d, dom, c, &inside)
    }

    /// The tensors of the merged group `a + b` that hold selected values: written by a selection, or by a
    /// Transpose, or by an elementwise op that reads one selected value (and writes as many elements) and
    /// otherwise only tensors from outside the kernel (a scale, a bias). Any other member reading them is refused: after a selection the epilogue
    /// still maps each element of the anchor's result to at most one element of each output, it never combines
    /// two of them.
    fn selected(&self, d: &Dense<'_>, a: u32, b: u32, anchor: u32) -> Result<Vec<u32>, Reject> {
        let mut members: Vec<u32> = self.members(a).iter().chain(self.members(b)).copied().collect();
        members.sort_unstable();
        let inside = |t: u32| {
            let p = d.prod[through_views(d, t) as usize];
            p != NONE && members.binary_search(&p).is_ok()
        };
        let mut selected: Vec<u32> = Vec::new();
        for &m in &members {
            let ins = d.inputs(m);
            let picked: Vec<u32> = ins.iter().copied().filter(|&t| selected.contains(&through_views(d, t))).collect();
            // An elementwise op routes when it maps the selected elements one to one (no broadcast past them).
            let same_size = |&t: &u32| d.outputs(m).iter().all(|&o| d.numel[o as usize] == d.numel[t as usize]);
            let routes = is_selection(d, m)
                || (!picked.is_empty() && matches!(d.op(m), Op::Transpose { .. }))
                || (picked.len() == 1
                    && picked.iter().all(same_size)
                    && d.op(m).category() == OpCategory::Elementwise
                    && ins.iter().filter(|&&t| inside(t)).count() == 1);
            if routes {
                selected.extend_from_slice(d.outputs(m));
            } else if !picked.is_empty() {
                return reject(RejectReason::Pattern, Why::SelectCompute { node: m, anchor });
            }
        }
        Ok(selected)
    }

    /// Whether group `x` has a data-movement member.
    fn has_moves(&self, x: u32) -> bool {
        self.g[x as usize].moves
    }

    /// The loads of the merged row kernel `a + b`, over all its members (a merge may make a chain impure far
    /// from the edge between the two sides): each reads only `pure` members' results, but a row selection
    /// (`row_selection`); and an op of the kernel that reads a load reads a pure one. (`check_rows` refuses the
    /// same on the edges it checks, before this walk: the cheap, common refusal.)
    fn check_loads(
        &self,
        d: &Dense<'_>,
        dom: &Domain,
        a: u32,
        b: u32,
        inside: &dyn Fn(u32) -> bool,
    ) -> Result<(), Reject> {
        for &m in self.members(a).iter().chain(self.members(b)) {
            let load = d.cat[m as usize] == OpCategory::DataMovement;
            // A member that moves no data and reads no moved data has nothing to check (the rules below need
            // one or the other): skipped on its flags, without reading its operands.
            if !load && !d.is(m, READS_MOVE) {
                continue;
            }
            if load && Self::row_selection(d, dom, m, inside) {
                continue;
            }
            for &t in d.inputs(m) {
                let p = d.kprod[t as usize];
                if p == NONE || !inside(p) {
                    continue;
                }
                if load && !pure(d, inside, p) {
                    return reject(RejectReason::Pattern, Why::RowLoad { node: m });
                }
                if !load && d.cat[p as usize] == OpCategory::DataMovement && !pure(d, inside, p) {
                    return reject(RejectReason::Pattern, Why::RowLoad { node: p });
                }
            }
        }
        Ok(())
    }

    /// Row-kernel rules for `members` and every edge touching them inside the merged group.
    fn check_rows(
        &self,
        d: &Dense<'_>,
        caps: &FusionCaps,
        dom_id: u32,
        dom: &Domain,
        members: &[u32],
        inside: &dyn Fn(u32) -> bool,
    ) -> Result<(), Reject> {
        let load = |m: u32| d.cat[m as usize] == OpCategory::DataMovement;
        let selects = |m: u32| Self::row_selection(d, dom, m, inside);
        // What a load may read inside the kernel: a `pure` member's result, which depends on no row the block
        // computes, so the kernel computes it at whatever element the load asks for.
        let source = |p: u32| pure(d, inside, p);
        // A Cast whose result a load of the kernel reads: it must stay a `source`.
        let feeds_load =
            |c: u32| d.is(c, CAST) && d.outputs(c).iter().any(|&o| d.readers(o).iter().any(|&r| inside(r) && load(r)));
        for &m in members {
            match d.cat[m as usize] {
                OpCategory::Reduction if self.node_domain[m as usize] == dom_id => {}
                OpCategory::Elementwise => {}
                OpCategory::DataMovement if d.is(m, LOAD) && d.outputs(m).len() == 1 => {}
                _ => return reject(RejectReason::Pattern, Why::NotRowOp { node: m }),
            }
            if load(m) && selects(m) {
                if !caps.select_rows {
                    return reject(RejectReason::CapsExceeded, Why::CapOff("select_rows"));
                }
                // Its data operand is a full row value of the kernel (or from outside); the index is a constant.
                continue;
            }
            for &t in d.outputs(m) {
                let readers = d.readers(t);
                // An inner link of a chain of loads (a transposed patch grid into a Concat, a converted table into
                // its Gather): read only by loads of the kernel, computed inline at whatever element they ask
                // for; it needs no row shape.
                if source(m) && !d.is_output(t) && readers.iter().all(|&c| inside(c) && load(c)) {
                    continue;
                }
                if load(m) && Self::broadcast_load(d, dom, t) {
                    // Computed inline where an elementwise op of the kernel reads it; it leaves the kernel nowhere.
                    if readers.iter().any(|&c| !inside(c)) {
                        return reject(RejectReason::Pattern, Why::NotRowValue { t });
                    }
                    for &c in readers {
                        Self::check_edge(d, dom, t, c)?;
                    }
                    continue;
                }
                if dom.class(d.dims(t)).is_none() {
                    return reject(RejectReason::Pattern, Why::NotRowValue { t });
                }
                for &c in readers.iter().filter(|&&c| inside(c)) {
                    if load(c) {
                        if source(m) {
                            continue;
                        }
                        if selects(c) && d.inputs(c).first() == Some(&t) {
                            if !caps.select_rows {
                                return reject(RejectReason::CapsExceeded, Why::CapOff("select_rows"));
                            }
                            continue;
                        }
                        return reject(RejectReason::Pattern, Why::RowLoad { node: c });
                    }
                    if feeds_load(c) && !source(m) {
                        return reject(RejectReason::Pattern, Why::RowLoad { node: c });
                    }
                    Self::check_edge(d, dom, t, c)?;
                }
            }
            for &t in d.inputs(m) {
                let p = d.kprod[t as usize];
                if p != NONE && inside(p) {
                    // A load reads tensors from outside the kernel or `source` values, never a value the kernel
                    // computes (that element's row may be another block's).
                    if load(m) {
                        if source(p) {
                            continue;
                        }
                        return reject(RejectReason::Pattern, Why::RowLoad { node: m });
                    }
                    if feeds_load(m) && !source(p) {
                        return reject(RejectReason::Pattern, Why::RowLoad { node: m });
                    }
                    // A load read by an op of the kernel reads pure values itself (checked again here: it may have
                    // joined as a row selection, read by nothing then).
                    if load(p) && !source(p) {
                        return reject(RejectReason::Pattern, Why::RowLoad { node: p });
                    }
                    Self::check_edge(d, dom, d.root[t as usize], m)?;
                }
            }
        }
        Ok(())
    }

    /// Member `m` is a row selection (`select_epilogue`): a constant-index Gather of a full row value along an axis
    /// that is not reduced, read by nothing in the kernel (BERT's and a ViT's class token after the last
    /// LayerNorm). It picks whole rows: the blocks of the selected rows also write them to its output.
    fn row_selection(d: &Dense<'_>, dom: &Domain, m: u32, inside: &dyn Fn(u32) -> bool) -> bool {
        d.is(m, SELECTION)
            && d.is(m, GATHER)
            && Self::selected_axis(d, dom, m).is_some()
            && d.outputs(m).iter().all(|&o| d.readers(o).iter().all(|&c| !inside(c)))
    }

    /// The axis of the domain's full shape that the constant-index Gather `m` selects from, when its data operand
    /// is a full row value and that axis is not reduced (so it picks whole rows); `None` otherwise.
    fn selected_axis(d: &Dense<'_>, dom: &Domain, m: u32) -> Option<usize> {
        let Op::Gather { axis } = d.op(m) else { return None };
        let data = *d.inputs(m).first()?;
        let dims = d.dims(data);
        if dom.class(dims) != Some(Class::Full) {
            return None;
        }
        let a = graph_ir::shape::normalize_axis(*axis, dims.len())?;
        // Leading extent-1 axes are stripped from the domain's shape.
        let a = a.checked_sub(dims.len() - canon(dims).len())?;
        (!dom.axes.contains(&a)).then_some(a)
    }

    /// `t` is the result of a load (written by no view) that broadcasts into the domain's rows without being a row
    /// value (`Domain::broadcasts`), and no graph output.
    fn broadcast_load(d: &Dense<'_>, dom: &Domain, t: u32) -> bool {
        let p = d.prod[t as usize];
        p != NONE && d.root[t as usize] == t && d.is(p, LOAD) && !d.is_output(t) && dom.broadcasts(d.dims(t))
    }

    /// An edge from the value `t` (a kernel-written tensor) to consumer `c`, inside a row kernel.
    fn check_edge(d: &Dense<'_>, dom: &Domain, t: u32, c: u32) -> Result<(), Reject> {
        if Self::broadcast_load(d, dom, t) {
            // Only an elementwise op writing full row values reads a broadcast load (by broadcast indexing).
            let full = d.outputs(c).iter().all(|&o| dom.class(d.dims(o)) == Some(Class::Full));
            if d.cat[c as usize] != OpCategory::Elementwise || !full {
                return reject(RejectReason::Pattern, Why::RowEdge { c, t });
            }
            return Ok(());
        }
        let from = dom.class(d.dims(t));
        let c_red = d.cat[c as usize] == OpCategory::Reduction;
        let out = d.outputs(c).first().and_then(|&o| dom.class(d.dims(o)));
        for &read in d.inputs(c).iter().filter(|&&x| d.root[x as usize] == d.root[t as usize]) {
            let to = dom.class(d.dims(read));
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
                return reject(RejectReason::Pattern, Why::RowEdge { c, t: read });
            }
        }
        Ok(())
    }
}

/// The pool chain of anchors `x` and `y` as `(first, second)`: both MaxPool or AveragePool, the second reading
/// the first's result directly as its data operand, with a window of at most [`POOL_CHAIN_MAX_WINDOW`]
/// elements; `None` when the caps refuse chains, a chain is already there (`chain`), or they do not chain.
fn pool_chain(d: &Dense<'_>, caps: &FusionCaps, x: u32, y: u32, chain: u32) -> Option<(u32, u32)> {
    if !caps.pool_chain || chain != NONE {
        return None;
    }
    let window = |i: u32| match d.op(i) {
        Op::MaxPool(a) | Op::AveragePool(a) => Some(a.kernel_shape.iter().product::<usize>()),
        _ => None,
    };
    window(x)?;
    window(y)?;
    let reads = |second: u32, first: u32| d.inputs(second).first().is_some_and(|t| d.outputs(first).contains(t));
    let (first, second) = if reads(y, x) {
        (x, y)
    } else if reads(x, y) {
        (y, x)
    } else {
        return None;
    };
    (window(second)? <= POOL_CHAIN_MAX_WINDOW).then_some((first, second))
}

/// Member `p` of a row kernel (`inside`) is pure: a load, or a Cast (the precision transform's conversion), whose
/// operands are tensors from outside the kernel or pure members' results. Its value depends on no row the kernel
/// computes, so a load may read it at any element. (An explicit stack: chains of loads can be long.)
fn pure(d: &Dense<'_>, inside: &dyn Fn(u32) -> bool, p: u32) -> bool {
    let kind = |x: u32| d.is(x, LOAD | CAST);
    let within = |t: &u32| {
        let q = d.kprod[*t as usize];
        (q != NONE && inside(q)).then_some(q)
    };
    if !kind(p) {
        return false;
    }
    // The usual case, a load of tensors from outside the kernel, allocates nothing.
    if !d.inputs(p).iter().any(|t| within(t).is_some()) {
        return true;
    }
    let mut stack: Vec<u32> = d.inputs(p).iter().filter_map(within).collect();
    let mut seen: Vec<u32> = vec![p];
    while let Some(x) = stack.pop() {
        if seen.contains(&x) {
            continue;
        }
        seen.push(x);
        if !kind(x) {
            return false;
        }
        stack.extend(d.inputs(x).iter().filter_map(within));
    }
    true
}

/// A load: a data-movement op that a row kernel computes inline at each element from tensors outside it or from
/// other loads (a gathered embedding row, a slice of a position table, a broadcast, a permutation, a class token
/// concatenated before a patch grid), as generated kernels read any operand through an index map.
pub(super) fn is_load(op: &Op) -> bool {
    matches!(op, Op::Gather { .. } | Op::Slice { .. } | Op::Expand { .. } | Op::Transpose { .. } | Op::Concat { .. })
}

/// Whether node `p` is an operand layout of product `x` (`FusionCaps::operand_layout`): a Transpose that swaps
/// the last two axes and keeps the others, whose one result `x` (a MatMul, or a Gemm) alone reads, once, as its A
/// or B operand, and which is no graph output. A backend then reads the Transpose's input transposed (cuBLAS
/// `op_T` with batch strides) and no kernel moves the bytes.
pub(super) fn is_operand_layout(d: &Dense<'_>, p: u32, x: u32) -> bool {
    // A Transpose is a load: anything else is refused on its flags, without reading its op from the graph.
    if !d.is(p, LOAD) {
        return false;
    }
    let Op::Transpose { perm } = d.op(p) else {
        return false;
    };
    let (&[t], true) = (d.outputs(p), d.is(x, PRODUCT)) else {
        return false;
    };
    let r = d.dims(t).len();
    let swaps = r >= 2
        && match perm {
            None => r == 2,
            Some(q) => {
                q.len() == r
                    && q[..r - 2].iter().enumerate().all(|(i, &a)| a == i)
                    && q[r - 2] == r - 1
                    && q[r - 1] == r - 2
            }
        };
    let ins = d.inputs(x);
    swaps
        && !d.is_output(t)
        && d.readers(t) == [x]
        && ins.iter().filter(|&&u| u == t).count() == 1
        && ins.iter().take(2).any(|&u| u == t)
}

/// A selection: a Gather whose indices are a constant scalar (`qkv[1]` of a packed projection, a class token),
/// or a Split (`q, k, v = qkv.split(e, dim=-1)` of GPT-2's packed projection). It picks slices of its input, so
/// in an anchor's epilogue it only routes parts of the result.
pub(super) fn is_selection(d: &Dense<'_>, i: u32) -> bool {
    d.is(i, SELECTION)
}

/// `Ok` when anchors `x` and `y` are sibling products that may share a kernel (`FusionCaps::horizontal_gemm`):
/// MatMuls, or Gemms with one set of attributes and operand count, whose left operands are one tensor seen
/// with one shape, whose right operands are weights of one shape and dtype, and whose results have one shape
/// and dtype, so a backend runs them as one product over the weights concatenated at prepare. Two anchors that
/// are not products over one activation are `TwoAnchors`; products over one activation that differ otherwise
/// say how (`NotSiblings`).
fn siblings(d: &Dense<'_>, caps: &FusionCaps, x: u32, y: u32) -> Result<(), Reject> {
    let product = |i: u32| d.is(i, PRODUCT) && d.inputs(i).len() >= 2;
    if !product(x) || !product(y) || d.root[d.inputs(x)[0] as usize] != d.root[d.inputs(y)[0] as usize] {
        return reject(RejectReason::Pattern, Why::TwoAnchors { a: x, b: y });
    }
    let (ix, iy) = (d.inputs(x), d.inputs(y));
    let (ox, oy) = (d.outputs(x)[0], d.outputs(y)[0]);
    let dtype = |t: u32| d.graph.tensor(d.tids[t as usize]).dtype;
    let weight = |t: u32| {
        d.kprod[t as usize] == NONE
            && matches!(
                d.graph.tensor(d.tids[t as usize]).role,
                graph_ir::TensorRole::Weight | graph_ir::TensorRole::Constant
            )
    };
    let what = if d.op(x) != d.op(y) || ix.len() != iy.len() {
        Some("different ops, attributes or operand counts")
    } else if d.dims(ix[0]) != d.dims(iy[0]) {
        Some("the shared operand is read in different shapes")
    } else if !weight(ix[1]) || !weight(iy[1]) {
        Some("a right operand is not a weight")
    } else if d.dims(ix[1]) != d.dims(iy[1]) || dtype(ix[1]) != dtype(iy[1]) {
        Some("weights of different shapes or dtypes")
    } else if d.dims(ox) != d.dims(oy) || dtype(ox) != dtype(oy) {
        Some("results of different shapes or dtypes")
    } else {
        None
    };
    if let Some(what) = what {
        return reject(RejectReason::Pattern, Why::NotSiblings { a: x, b: y, what });
    }
    if !caps.horizontal_gemm {
        return reject(RejectReason::CapsExceeded, Why::CapOff("horizontal_gemm"));
    }
    Ok(())
}

/// The tensor whose bytes `t` aliases through views (itself when a member or a source writes it).
fn through_views(d: &Dense<'_>, mut t: u32) -> u32 {
    loop {
        let p = d.prod[t as usize];
        if p == NONE || !d.is_view(p) {
            return t;
        }
        match d.inputs(p).first() {
            Some(&i) => t = i,
            None => return t,
        }
    }
}

#[cfg(test)]
mod domain_tests {
    use super::*;
    use crate::test_rng::XorShift;

    /// The domain by its definition (normalise, sort and deduplicate the axes, strip leading extent-1 axes, drop
    /// reduced extent-1 axes), built with plain vectors.
    fn reference(op: &Op, dims: &[usize]) -> Option<Domain> {
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
        if axes.iter().any(|&a| a >= dims.len()) {
            return None;
        }
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

    #[test]
    fn a_domain_from_its_key_is_the_domain_by_definition() {
        // Random reductions (repeated, negative and out-of-range axes; extent-1 axes, leading or not; huge extents;
        // rank 0) and two ops that are no reduction. The key gives the same domain or the same refusal, and equal
        // keys are equal domains (one key scratch reused throughout, as in `Groups::new`).
        let mut rng = XorShift::new(23);
        let mut key = Vec::new();
        let mut seen: Vec<(Vec<usize>, Domain)> = Vec::new();
        let (mut some, mut none) = (0, 0);
        for _ in 0..4000 {
            let rank = rng.below(5) as usize;
            // Extents as large as `usize::MAX` too: the key must not read one as part of its layout.
            let dims: Vec<usize> = (0..rank).map(|_| [1, 1, 2, 3, 4, usize::MAX][rng.below(6) as usize]).collect();
            let axis = |rng: &mut XorShift| rng.below(2 * rank as u64 + 3) as i64 - rank as i64 - 1;
            let axes = (rng.below(4) > 0).then(|| (0..rng.below(4)).map(|_| axis(&mut rng)).collect::<Vec<_>>());
            let op = match rng.below(8) {
                0 => Op::ReduceSum { axes, keepdims: true },
                1 => Op::ReduceMean { axes, keepdims: false },
                2 => Op::ReduceMax { axes, keepdims: true },
                3 => Op::Softmax { axis: axis(&mut rng) },
                4 => Op::LayerNormalization { axis: axis(&mut rng), epsilon: 1e-5 },
                5 => Op::GlobalAveragePool,
                6 => Op::Relu,
                _ => Op::MatMul,
            };
            let want = reference(&op, &dims);
            let got = Domain::key(&op, &dims, &mut key).then(|| Domain::from_key(&key));
            assert_eq!(got, want, "{op:?} over {dims:?}");
            match got {
                Some(dom) => {
                    some += 1;
                    if let Some((_, other)) = seen.iter().find(|(k, _)| *k == key) {
                        assert_eq!(*other, dom, "one key, two domains");
                    } else {
                        seen.push((key.clone(), dom));
                    }
                }
                None => none += 1,
            }
        }
        assert!(some > 1000 && none > 500, "{some} domains, {none} refusals");
    }
}
