//! The three phases of the pass and the final assembly of groups (module docs of `fusion`).

use graph_ir::{ComputeGraph, NodeId, OpCost, TensorRole};
use slotmap::SecondaryMap;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::attention::{self, Chain, Found};
use super::concat::Candidates;
use super::dag::{Dag, Plan, Stop};
use super::dense::{Dense, NONE, PRODUCT, SOFTMAX};
use super::model::Model;
use super::rules::{Groups, Merged, Reject, Why};
use super::{FusedGroup, FusionDecision, FusionOptions, FusionPhase, FusionPlan, FusionStats, GroupKind, RejectReason};
use crate::ids::GroupId;
use crate::target::Target;
use crate::topo::TopoOrder;

/// Most work one cycle check may do (groups and edges visited).
const LOCAL_BUDGET: u64 = 1 << 11;
/// Work every cycle check may do even when the pass's total budget is spent (local merges stay exact).
const FLOOR_BUDGET: u64 = 1 << 8;
/// Total work of all cycle checks, per node and edge of the graph.
const GLOBAL_BUDGET_PER_ITEM: u64 = 32;
/// Most rounds of phase 2.
const MAX_ROUNDS: u32 = 8;
/// A round of phase 2 scans only the producers of the groups the round before changed while those are at most
/// one in this many groups (of the graph's nodes); more, and their producers are most groups anyway.
const INCREMENTAL_SHARE: usize = 32;
/// Candidate pairs from which a phase-2 round scores them on several threads ([`Pass::score_pairs`]): below,
/// waking the pool costs more than the split saves.
const PARALLEL_PAIRS: usize = 1 << 16;

/// A verdict on an edge or a horizontal pair.
#[derive(Clone, Debug)]
struct Verdict {
    reason: Option<RejectReason>,
    phase: FusionPhase,
    score: i64,
    why: Option<Why>,
}

struct Pass<'a, 'g> {
    d: &'a Dense<'g>,
    opts: &'a FusionOptions,
    groups: Groups,
    model: &'a Model,
    dag: Option<Dag>,
    /// Work left for cycle checks.
    budget_left: u64,
    verdicts: Vec<Verdict>,
    /// Verdict index of each edge (`NONE`: never evaluated).
    edge_verdict: Vec<u32>,
    /// Horizontal candidates: (first sibling's node, second sibling's node, shared tensor, verdict).
    horizontal: Vec<(u32, u32, u32, u32)>,
    stats: FusionStats,
    /// Scratch of `record_between` (kept between calls).
    edges_scratch: Vec<usize>,
}

/// What every fusion run over one graph, order and target starts from: the dense view, the cost model and one
/// group per node. Built once when the driver runs the pass twice (with and without Concat elimination).
pub(super) struct Start<'g> {
    d: Dense<'g>,
    model: Model,
    groups: Groups,
}

impl<'g> Start<'g> {
    pub fn new(graph: &'g ComputeGraph, order: &'g TopoOrder, target: &Target) -> Start<'g> {
        let d = Dense::new(graph, order);
        let model = Model::new(&d, target);
        let groups = Groups::new(&d, &model.flops);
        Start { d, model, groups }
    }
}

/// One run of the phases from `start`, then the plan.
pub(super) fn run(
    start: &Start<'_>,
    order: &TopoOrder,
    opts: &FusionOptions,
    concats: Option<&Candidates>,
) -> FusionPlan {
    let d = &start.d;
    let model = &start.model;
    let items = (d.len() + d.num_edges()) as u64;
    let mut groups = start.groups.clone();
    if let Some(c) = concats {
        // Concats to be eliminated stay alone: their producers keep their epilogues.
        for i in 0..d.len() {
            if c.pinned(d.ids[i]) {
                groups.g[i].pinned = true;
            }
        }
    }
    let mut p = Pass {
        groups,
        model,
        d,
        opts,
        dag: None,
        budget_left: GLOBAL_BUDGET_PER_ITEM.saturating_mul(items).saturating_add(1 << 16),
        verdicts: Vec::new(),
        // Verdicts only become decisions: without them nothing is kept (`Pass::verdict`).
        edge_verdict: vec![NONE; if opts.decisions { d.num_edges() } else { 0 }],
        horizontal: Vec::new(),
        stats: FusionStats::default(),
        edges_scratch: Vec::new(),
    };
    if opts.enabled {
        p.vertical();
        p.attention();
        if opts.caps.multi_output {
            p.multi_output();
        }
        // Also under caps that refuse them: every pair of sibling products gets its reason.
        p.sibling_products();
        if opts.caps.multi_output && opts.horizontal {
            p.horizontal();
        }
    } else {
        let v = p.verdict(Verdict {
            reason: Some(RejectReason::Disabled),
            phase: FusionPhase::Vertical,
            score: 0,
            why: Some(Why::Disabled),
        });
        p.edge_verdict.iter_mut().for_each(|e| *e = v);
    }
    if let Some(dag) = &p.dag {
        p.stats.dag_visits = dag.visits;
        p.stats.dag_visits_max = dag.max_visits;
    }
    p.finish(order)
}

impl Pass<'_, '_> {
    /// Keep `v` and return its index; without decisions nothing reads verdicts (`finish` makes no decisions),
    /// so none is kept and the index is `NONE` (one verdict per edge of a large graph, grown one by one).
    fn verdict(&mut self, v: Verdict) -> u32 {
        if !self.opts.decisions {
            return NONE;
        }
        self.verdicts.push(v);
        (self.verdicts.len() - 1) as u32
    }

    /// Give edge `e` verdict `k` (nothing without decisions: `Pass::verdict`).
    fn mark_edge(&mut self, e: usize, k: u32) {
        if let Some(slot) = self.edge_verdict.get_mut(e) {
            *slot = k;
        }
    }

    /// Set edge `e`'s verdict, unless it already has one with the same reason (the first phase to decide) or an
    /// attention verdict (the more specific reason: why the whole chain did not become one kernel).
    fn set_edge(&mut self, e: usize, v: u32) {
        if !self.opts.decisions {
            return;
        }
        let old = self.edge_verdict[e];
        if old != NONE && self.verdicts[old as usize].phase == FusionPhase::Attention {
            return;
        }
        if old == NONE || self.verdicts[old as usize].reason != self.verdicts[v as usize].reason {
            self.edge_verdict[e] = v;
        }
    }

    /// Record one verdict on every edge from group `a` to group `b`, walking the smaller side. Nothing without
    /// decisions: the verdicts only become decisions (`finish`), so a plan build skips the walk.
    fn record_between(&mut self, a: u32, b: u32, v: Verdict) {
        if !self.opts.decisions {
            return;
        }
        let d = self.d;
        let k = self.verdict(v);
        let mut edges = std::mem::take(&mut self.edges_scratch);
        edges.clear();
        if self.groups.size(a) <= self.groups.size(b) {
            for &m in self.groups.members(a) {
                for (e, &c) in d.edges(m).zip(d.succ(m)) {
                    if self.groups.owner[c as usize] == b {
                        edges.push(e);
                    }
                }
            }
        } else {
            for &c in self.groups.members(b) {
                for &t in d.inputs(c) {
                    let p = d.kprod[t as usize];
                    if p != NONE && self.groups.owner[p as usize] == a {
                        edges.extend(d.edge(p, c));
                    }
                }
            }
        }
        for &e in &edges {
            self.set_edge(e, k);
        }
        self.edges_scratch = edges;
    }

    /// Phase 1: in reverse topological order, a producer joins the group of its consumers when all of them are
    /// in one group and the merge is legal.
    fn vertical(&mut self) {
        let d = self.d;
        for p in (0..d.len() as u32).rev() {
            let cons = d.succ(p);
            if d.is_view(p) || cons.is_empty() {
                continue;
            }
            let first = self.groups.owner[cons[0] as usize];
            let v = if let Some(&other) = cons.iter().find(|&&c| self.groups.owner[c as usize] != first) {
                // The number of kernels is for the decision's text only.
                let kernels = if self.opts.decisions {
                    let mut owners: Vec<u32> = cons.iter().map(|&c| self.groups.owner[c as usize]).collect();
                    owners.sort_unstable();
                    owners.dedup();
                    owners.len()
                } else {
                    0
                };
                Verdict {
                    reason: Some(RejectReason::MultiConsumer),
                    phase: FusionPhase::Vertical,
                    score: 0,
                    why: Some(Why::MultiConsumer { p, kernels, example: other }),
                }
            } else {
                match self.try_join(p, first) {
                    Ok(score) => {
                        self.stats.merges_vertical += 1;
                        Verdict { reason: None, phase: FusionPhase::Vertical, score, why: None }
                    }
                    Err((reason, why)) => {
                        Verdict { reason: Some(reason), phase: FusionPhase::Vertical, score: 0, why: Some(why) }
                    }
                }
            };
            let k = self.verdict(v);
            for e in d.edges(p) {
                self.mark_edge(e, k);
            }
        }
    }

    /// Phase 1b: every attention chain becomes one group (module docs); a candidate that cannot fuse gets its
    /// reason on the edge out of its first MatMul.
    fn attention(&mut self) {
        let d = self.d;
        for s in 0..d.len() as u32 {
            if !d.is(s, SOFTMAX) {
                continue;
            }
            let (m1, next, reason, why) = match attention::find(d, s) {
                Found::No => continue,
                Found::Refused { m1, next, why } => (m1, next, RejectReason::Pattern, why),
                Found::Chain(c) => match self.try_attention(&c) {
                    Ok(()) => {
                        self.stats.merges_attention += 1;
                        continue;
                    }
                    Err((r, w)) => (c.m1, c.after_m1(), r, w),
                },
            };
            // A cast that phase 1 made the MatMul's epilogue (a half chain's cast of the scores) leaves no kernel
            // edge there: the verdict goes on the edge out of the cast.
            let (mut m1, mut next) = (m1, next);
            while self.groups.owner[m1 as usize] == self.groups.owner[next as usize]
                && matches!(d.op(next), graph_ir::Op::Cast { .. })
            {
                match d.outputs(next).first().map(|&t| d.readers(t)) {
                    Some(&[r]) => (m1, next) = (next, r),
                    _ => break,
                }
            }
            let k =
                self.verdict(Verdict { reason: Some(reason), phase: FusionPhase::Attention, score: 0, why: Some(why) });
            if let Some(e) = d.edge(m1, next) {
                self.mark_edge(e, k);
            }
        }
    }

    /// Merge the groups holding chain `c` into one attention group, when the caps and their members allow.
    fn try_attention(&mut self, c: &Chain) -> Result<(), Reject> {
        let d = self.d;
        let caps = &self.opts.caps;
        if !caps.attention {
            return Err((RejectReason::CapsExceeded, Why::CapOff("attention")));
        }
        let mut gs: Vec<u32> = c.nodes().map(|n| self.groups.owner[n as usize]).collect();
        gs.sort_unstable();
        gs.dedup();
        let mut ops = 0;
        for &g in &gs {
            for &m in self.groups.members(g) {
                ops += 1;
                if !c.contains(m) && !attention::may_ride(d, m) {
                    return Err((RejectReason::Pattern, Why::AttnMember { node: m }));
                }
            }
        }
        if ops > caps.max_ops {
            return Err((RejectReason::CapsExceeded, Why::MaxOps { ops, cap: caps.max_ops }));
        }
        let owner = &self.groups.owner;
        let inside = |n: u32| n != NONE && gs.contains(&owner[n as usize]);
        let mut inputs: Vec<u32> = gs
            .iter()
            .flat_map(|&g| self.groups.inputs(d, g).iter().copied())
            .filter(|&t| !inside(d.kprod[t as usize]))
            .collect();
        inputs.sort_unstable();
        inputs.dedup();
        if inputs.len() > caps.max_inputs {
            return Err((RejectReason::CapsExceeded, Why::MaxInputs { inputs: inputs.len(), cap: caps.max_inputs }));
        }
        let m = Merged { kind: GroupKind::Attention, anchor: NONE, chain: NONE, horizontal: false, domain: NONE };
        let mut acc = gs[0];
        for &g in &gs[1..] {
            let pv = self.groups.preview(d, acc, g);
            acc = self.groups.merge(acc, g, pv, m, 0).0;
        }
        let g = &mut self.groups.g[acc as usize];
        (g.kind, g.anchor, g.domain) = (GroupKind::Attention, NONE, NONE);
        Ok(())
    }

    /// Try to merge producer `p` (still alone) into consumer group `cg` in phase 1; Ok carries the score.
    fn try_join(&mut self, p: u32, cg: u32) -> Result<i64, Reject> {
        let d = self.d;
        let caps = &self.opts.caps;
        let pg = self.groups.owner[p as usize];
        for g in [pg, cg] {
            match self.groups.g[g as usize].kind {
                GroupKind::Custom => return Err((RejectReason::AcrossCustom, Why::Custom)),
                GroupKind::Copy => return Err((RejectReason::AcrossCopy, Why::Copy)),
                _ => {}
            }
        }
        if d.outputs(p).iter().any(|&t| d.is_output(t)) {
            return Err((RejectReason::GraphOutput, Why::GraphOutput { p }));
        }
        let merged = self.groups.structural(d, caps, pg, cg)?;
        let quiet = !self.opts.decisions;
        if quiet {
            // No decision records which rule refused: the row rules, which need no merged lists, go before the
            // preview (as in `try_merge`). Same verdict.
            self.groups.shaped_rows(d, caps, pg, cg, &merged, false)?;
        }
        let pv = self.groups.preview(d, pg, cg);
        self.groups.shaped(d, caps, pg, cg, &merged, &pv, quiet)?;
        if let Some(why) = self.model.loses_concurrency(d, &self.groups, pg, cg, &pv) {
            return Err((RejectReason::LosesConcurrency, why));
        }
        // The score only goes into the decision (phase 1 merges whatever is legal).
        let score = if self.opts.decisions { self.model.score(d, &self.groups, pg, cg) } else { 0 };
        self.groups.merge(pg, cg, pv, merged, 0);
        Ok(score)
    }

    /// Phase 2: producer/consumer group pairs, best score first, in rounds; the merged kernel may write several
    /// results. Round 1 tries every pair; later rounds only pairs with a group that changed in the round before.
    fn multi_output(&mut self) {
        let d = self.d;
        // The groups kept by the round before's merges (some absorbed since: `producers_of_changed` skips those).
        let mut changed: Vec<u32> = Vec::new();
        for round in 1..=MAX_ROUNDS {
            self.stats.multi_output_rounds += 1;
            let pairs = match self.producers_of_changed(&changed, round) {
                Some(xs) => {
                    let pairs = self.fresh_pairs(round, xs.iter().copied(), xs.len() * 4);
                    debug_assert!(
                        pairs == self.fresh_pairs(round, 0..self.groups.g.len() as u32, d.num_edges()),
                        "round {round}: the changed groups' producers miss a fresh pair"
                    );
                    pairs
                }
                None => self.fresh_pairs(round, 0..self.groups.g.len() as u32, d.num_edges()),
            };
            changed.clear();
            // Best score first, then by the consumer's and the producer's lowest member: one integer key per
            // candidate (distinct, as groups' lowest members are), which sorts faster than the tuple it encodes.
            let mut cands: Vec<(u128, u32, u32)> = Vec::with_capacity(pairs.len());
            for (&(x, y, m, c), scored) in pairs.iter().zip(self.score_pairs(&pairs)) {
                match scored {
                    Ok(key) => cands.push((key, m, c)),
                    Err((reason, why)) => {
                        let v =
                            Verdict { reason: Some(reason), phase: FusionPhase::MultiOutput, score: 0, why: Some(why) };
                        self.record_between(x, y, v);
                    }
                }
            }
            // Distinct keys, so any sort gives this order: a radix sort, linear in the candidates.
            crate::counting::sort_by_u128_key(&mut cands, |e| e.0);
            let mut merged_any = false;
            for (_, m, c) in cands {
                let (x, y) = (self.groups.owner[m as usize], self.groups.owner[c as usize]);
                if x == y {
                    continue;
                }
                match self.try_merge(x, y, round, Some((m, c))) {
                    Ok(score) => {
                        merged_any = true;
                        changed.push(self.groups.owner[m as usize]);
                        self.stats.merges_multi_output += 1;
                        let k =
                            self.verdict(Verdict { reason: None, phase: FusionPhase::MultiOutput, score, why: None });
                        if let Some(e) = d.edge(m, c) {
                            self.mark_edge(e, k);
                        }
                    }
                    Err((reason, score, why)) => {
                        let v =
                            Verdict { reason: Some(reason), phase: FusionPhase::MultiOutput, score, why: Some(why) };
                        self.record_between(x, y, v);
                    }
                }
            }
            if !merged_any {
                break;
            }
        }
    }

    /// Each pair's candidate key (score, then the two groups' lowest members: [`candidate_key`]), or why the
    /// kernel-class rules refuse it, in the order of `pairs`. Every pair reads the groups as the round found
    /// them, so from [`PARALLEL_PAIRS`] pairs on a multi-core machine they are scored on rayon's threads; the
    /// results, and so the candidates' order, are the same either way. At random_dag 1M (1.27 M pairs in round
    /// 1) that takes 133 ms against 259 ms; at 10k (7 k pairs) the hand-off cost more than it saved.
    fn score_pairs(&self, pairs: &[(u32, u32, u32, u32)]) -> Vec<Result<u128, Reject>> {
        let parallel = pairs.len() >= PARALLEL_PAIRS && crate::multi_core();
        score_candidates(self.d, &self.groups, self.model, &self.opts.caps, pairs, parallel)
    }

    /// The candidates of `round` whose producer group is in `scan` (ascending), as `(producer group, consumer
    /// group, producer, consumer)`: one per pair of groups, named by its first edge, each producer's edges sorted
    /// on their own (a few each, not one sort of every edge of the graph). After round 1, only fresh pairs (a
    /// side kept by a merge of the round before). `most` sizes the list once (at most one per edge), so a large
    /// graph's is not grown through copies.
    fn fresh_pairs(&self, round: u32, scan: impl Iterator<Item = u32>, most: usize) -> Vec<(u32, u32, u32, u32)> {
        let d = self.d;
        let mut pairs = Vec::with_capacity(most);
        let mut out: Vec<(u32, u32, u32)> = Vec::new();
        for x in scan {
            let gx = &self.groups.g[x as usize];
            if !gx.alive {
                continue;
            }
            out.clear();
            for &m in self.groups.members(x) {
                for &c in d.succ(m) {
                    let y = self.groups.owner[c as usize];
                    let fresh = round == 1
                        || u32::from(gx.epoch) + 1 == round
                        || u32::from(self.groups.g[y as usize].epoch) + 1 == round;
                    if y != x && fresh {
                        out.push((y, m, c));
                    }
                }
            }
            out.sort_unstable();
            out.dedup_by_key(|p| p.0);
            pairs.extend(out.iter().map(|&(y, m, c)| (x, y, m, c)));
        }
        pairs
    }

    /// The producer groups with a fresh pair in `round` (a pair with a side kept by a merge of the round before),
    /// ascending, when few groups changed; `None` when the caller should scan every group (round 1, or so many
    /// changed that their producers are most groups anyway). `changed` holds the groups the round before's
    /// merges kept: a fresh pair's producer is one of them or produces for one of them. The caller's scan over
    /// these visits the producers with a fresh pair in the full scan's order, so the candidates are the same.
    fn producers_of_changed(&self, changed: &[u32], round: u32) -> Option<Vec<u32>> {
        let d = self.d;
        let fresh = |x: u32| {
            let g = &self.groups.g[x as usize];
            g.alive && u32::from(g.epoch) + 1 == round
        };
        if round == 1 || changed.len().saturating_mul(INCREMENTAL_SHARE) > self.groups.g.len() {
            return None;
        }
        let mut xs: Vec<u32> = Vec::with_capacity(changed.len() * 4);
        for &y in changed.iter().filter(|&&y| fresh(y)) {
            xs.push(y);
            for &c in self.groups.members(y) {
                for &t in d.inputs(c) {
                    let p = d.kprod[t as usize];
                    if p != NONE {
                        xs.push(self.groups.owner[p as usize]);
                    }
                }
            }
        }
        xs.sort_unstable();
        xs.dedup();
        Some(xs)
    }

    /// Try to merge groups `x` and `y` in phases 2 and 3: legality, the exact cycle check, concurrency.
    /// `edge` is the producer (in `x`) and consumer (in `y`) that named the candidate, when one did.
    fn try_merge(
        &mut self,
        x: u32,
        y: u32,
        epoch: u32,
        edge: Option<(u32, u32)>,
    ) -> Result<i64, (RejectReason, i64, Why)> {
        let d = self.d;
        let caps = &self.opts.caps;
        let merged = self.groups.structural(d, caps, x, y).map_err(|(r, w)| (r, 0, w))?;
        // The row rules would refuse it (from the edge alone); a plan build stops here, since no decision
        // records which rule did.
        let row_load = edge.is_some_and(|e| self.groups.load_reads_computed(d, x, y, &merged, e));
        if row_load && !self.opts.decisions {
            let node = edge.map_or(NONE, |e| e.1);
            return Err((RejectReason::Pattern, 0, Why::RowLoad { node }));
        }
        // The cycle check goes before the row rules and the preview, which cost several times more: it refuses a
        // third of a random DAG's candidates that get this far (random_dag 100k: 15.6 k of 49 k), mostly in a
        // few word operations (the landmark labels). A plan build stops at its refusal. With decisions the rules
        // still run and their refusal is the one recorded, as before; both runs do the same checks, so their
        // work and budget agree. When the rules refuse a merge the check allowed, its work goes back to the
        // budget: the check did not decide.
        let early = if row_load { None } else { Some(self.cycle_check(x, y)) };
        let work = match &early {
            Some(Ok(c)) => c.3,
            _ => 0,
        };
        if !self.opts.decisions {
            if let Some(Err((r, w))) = early {
                return Err((r, 0, w));
            }
            // No merged lists needed: most refused candidates of a branchy graph stop here.
            if let Err((r, w)) = self.groups.shaped_rows(d, caps, x, y, &merged, false) {
                self.budget_left = self.budget_left.saturating_add(work);
                return Err((r, 0, w));
            }
        }
        // The score only goes into the verdict (the candidates were ranked by their own).
        let score = if self.opts.decisions { self.model.score(d, &self.groups, x, y) } else { 0 };
        let pv = self.groups.preview(d, x, y);
        if let Err((r, w)) = self.groups.shaped(d, caps, x, y, &merged, &pv, !self.opts.decisions) {
            self.budget_left = self.budget_left.saturating_add(work);
            return Err((r, score, w));
        }
        let (x, y, plan, _) = match early {
            Some(checked) => checked,
            None => self.cycle_check(x, y),
        }
        .map_err(|(r, w)| (r, score, w))?;
        if let Some(why) = self.model.loses_concurrency(d, &self.groups, x, y, &pv) {
            return Err((RejectReason::LosesConcurrency, score, why));
        }
        let (keep, gone) = self.groups.merge(x, y, pv, merged, epoch);
        if let Some(dag) = self.dag.as_mut() {
            dag.contract(&self.groups, plan, x, y, keep, gone);
        }
        Ok(score)
    }

    /// The exact cycle check of merging groups `a` and `b` (`Dag::check`, under the pass's budget): the two in
    /// the DAG's order, how to reorder after the contraction, and the work the check did.
    fn cycle_check(&mut self, a: u32, b: u32) -> Result<(u32, u32, Plan, u64), Reject> {
        let dag = self.dag.get_or_insert_with(|| Dag::new(self.d, &self.groups));
        let (x, y) = dag.ordered(a, b);
        let budget = LOCAL_BUDGET.min(FLOOR_BUDGET.max(self.budget_left));
        let before = dag.visits;
        let checked = dag.check(&self.groups, x, y, budget);
        let work = dag.visits - before;
        self.budget_left = self.budget_left.saturating_sub(work);
        match checked {
            Ok(plan) => Ok((x, y, plan, work)),
            Err(Stop::Cycle(z)) => {
                let (from, via, to) =
                    (self.groups.g[x as usize].lo, self.groups.g[z as usize].lo, self.groups.g[y as usize].lo);
                Err((RejectReason::WouldCycle, Why::Cycle { from, via, to }))
            }
            Err(Stop::Budget(work)) => Err((RejectReason::CycleCheckBudget, Why::Budget { work })),
        }
    }

    /// Phase 2b: sibling products (`FusionCaps::horizontal_gemm`). Per activation, the anchor groups whose
    /// MatMul or Gemm reads it as the left operand with a weight on the right are merged in position order, each
    /// into the kernel accumulated so far, when legal (siblings in `rules::siblings`, then what any merge needs:
    /// caps, iteration spaces, the cycle check and the concurrency check). Every pair tried is a horizontal
    /// candidate in the decisions.
    fn sibling_products(&mut self) {
        let d = self.d;
        let mut sib: Vec<u32> = Vec::new();
        for t in 0..d.tids.len() as u32 {
            if d.root[t as usize] != t || d.readers(t).len() < 2 {
                continue;
            }
            sib.clear();
            for &c in d.readers(t) {
                let lhs = d.inputs(c).first().is_some_and(|&a| d.root[a as usize] == t);
                let g = self.groups.owner[c as usize];
                let gc = &self.groups.g[g as usize];
                if lhs && d.is(c, PRODUCT) && gc.anchor == c && gc.alive {
                    sib.push(g);
                }
            }
            if sib.len() < 2 {
                continue;
            }
            sib.sort_unstable_by_key(|&g| self.groups.g[g as usize].lo);
            let mut acc = sib[0];
            for &g in &sib[1..] {
                let a = self.groups.resolve(acc);
                let (an, gn) = (self.groups.g[a as usize].anchor, self.groups.g[g as usize].anchor);
                let v = match self.try_merge(a, g, MAX_ROUNDS + 1, None) {
                    Ok(score) => {
                        self.stats.merges_horizontal += 1;
                        acc = self.groups.owner[an as usize];
                        Verdict { reason: None, phase: FusionPhase::Horizontal, score, why: None }
                    }
                    Err((reason, score, why)) => {
                        acc = g;
                        Verdict { reason: Some(reason), phase: FusionPhase::Horizontal, score, why: Some(why) }
                    }
                };
                let k = self.verdict(v);
                self.horizontal.push((an, gn, t, k));
            }
        }
    }

    /// Phase 3: launch-bound groups that read the same tensor and do not depend on each other.
    fn horizontal(&mut self) {
        let d = self.d;
        let small = self.model.launch_bytes;
        for t in 0..d.tids.len() as u32 {
            if d.root[t as usize] != t || d.readers(t).len() < 2 {
                continue;
            }
            let mut sib: Vec<u32> = d.readers(t).iter().map(|&c| self.groups.owner[c as usize]).collect();
            sib.sort_unstable();
            sib.dedup();
            if sib.len() < 2 {
                continue;
            }
            sib.sort_unstable_by_key(|&g| self.groups.g[g as usize].lo);
            let mut acc: Option<u32> = None;
            for g in sib {
                let g = self.groups.resolve(g);
                let Some(a) = acc.map(|a| self.groups.resolve(a)).filter(|&a| a != g) else {
                    acc = Some(g);
                    continue;
                };
                let (an, gn) = (self.groups.g[a as usize].lo, self.groups.g[g as usize].lo);
                let outcome = self.try_horizontal(a, g, small);
                let v = match outcome {
                    Ok(score) => {
                        self.stats.merges_horizontal += 1;
                        acc = Some(self.groups.owner[an as usize]);
                        Verdict { reason: None, phase: FusionPhase::Horizontal, score, why: None }
                    }
                    Err((reason, score, why)) => {
                        acc = Some(g);
                        Verdict { reason: Some(reason), phase: FusionPhase::Horizontal, score, why: Some(why) }
                    }
                };
                let k = self.verdict(v);
                self.horizontal.push((an, gn, t, k));
            }
        }
    }

    fn try_horizontal(&mut self, a: u32, g: u32, small: u64) -> Result<i64, (RejectReason, i64, Why)> {
        let d = self.d;
        for x in [a, g] {
            let gx = &self.groups.g[x as usize];
            if gx.kind == GroupKind::Anchor {
                return Err((RejectReason::Pattern, 0, Why::HorizontalAnchor { node: gx.anchor }));
            }
            let bytes = self.groups.bytes(d, x);
            if bytes > small {
                return Err((RejectReason::NotSmall, 0, Why::NotSmall { node: gx.lo, bytes, small }));
            }
        }
        let dag = self.dag.get_or_insert_with(|| Dag::new(d, &self.groups));
        let (o1, o2) = dag.ordered(a, g);
        if dag.has_edge(&self.groups, o1, o2) {
            return Err((RejectReason::WouldCycle, 0, Why::Dependent));
        }
        self.try_merge(o1, o2, MAX_ROUNDS + 1, None)
    }

    /// Absorb views, order the groups topologically, and build the plan.
    fn finish(self, order: &TopoOrder) -> FusionPlan {
        let d = self.d;
        let groups = &self.groups;
        let mut stats = self.stats;
        stats.nodes = d.len();
        let n = d.len();
        // Live groups, densely numbered in order of their lowest member; `gof[i]`: group of node i, views
        // included once absorbed.
        let mut live: Vec<u32> = (0..groups.g.len() as u32).filter(|&g| groups.g[g as usize].alive).collect();
        live.sort_unstable_by_key(|&g| groups.g[g as usize].lo);
        let mut dense_of = vec![NONE; groups.g.len()];
        for (i, &g) in live.iter().enumerate() {
            dense_of[g as usize] = i as u32;
        }
        let mut gof: Vec<u32> =
            groups.owner.iter().map(|&o| if o == NONE { NONE } else { dense_of[o as usize] }).collect();
        // A view joins the group that writes its bytes when one of its (view-transparent) readers is in that
        // group: the kernel must not read through an outside alias what it writes itself.
        for i in 0..n as u32 {
            if !d.is_view(i) {
                continue;
            }
            stats.views += 1;
            let Some(&x) = d.inputs(i).first() else { continue };
            let p = d.kprod[x as usize];
            if p == NONE {
                continue;
            }
            let g = groups.owner[p as usize];
            if view_readers(d, order, d.outputs(i)).any(|c| groups.owner[c as usize] == g) {
                gof[i as usize] = dense_of[g as usize];
                stats.views_absorbed += 1;
            }
        }
        let kinds: Vec<GroupKind> = live.iter().map(|&g| groups.g[g as usize].kind).collect();
        if !self.opts.decisions {
            let mut plan = assemble(d, order, gof, kinds, Vec::new());
            stats.groups = plan.groups.len();
            plan.stats = stats;
            return plan;
        }
        // Each verdict's text is formatted once: many edges share one (every edge between two groups).
        let mut texts: Vec<Option<String>> = vec![None; self.verdicts.len()];
        let mut text = |k: u32| -> String {
            let slot = &mut texts[k as usize];
            if slot.is_none() {
                let v = &self.verdicts[k as usize];
                *slot = Some(v.why.as_ref().map_or(String::new(), |w| w.text(d)));
            }
            slot.clone().unwrap_or_default()
        };
        // Decisions: every edge between two kernels, with the verdict that kept them apart (fused edges are the
        // groups themselves), then the horizontal candidates.
        let across = (0..n as u32)
            .map(|p| d.succ(p).iter().filter(|&&c| groups.owner[p as usize] != groups.owner[c as usize]).count())
            .sum::<usize>();
        let mut decisions = Vec::with_capacity(across + self.horizontal.len());
        for p in 0..n as u32 {
            for (e, &c) in d.edges(p).zip(d.succ(p)) {
                if groups.owner[p as usize] == groups.owner[c as usize] {
                    continue;
                }
                let tensor = d
                    .inputs(c)
                    .iter()
                    .find(|&&t| d.kprod[t as usize] == p)
                    .map_or(String::new(), |&t| d.tname(t).into());
                let k = self.edge_verdict[e];
                let (rejected, phase, score, detail) = match (k != NONE).then(|| &self.verdicts[k as usize]) {
                    Some(v) if v.reason.is_some() => (v.reason, v.phase, v.score, text(k)),
                    // Unreachable: every edge between two kernels was evaluated and rejected.
                    _ => (Some(RejectReason::Pattern), FusionPhase::MultiOutput, 0, "not evaluated".to_string()),
                };
                decisions.push(FusionDecision {
                    producer: d.name(p).to_string(),
                    consumer: d.name(c).to_string(),
                    rejected,
                    phase,
                    tensor,
                    score,
                    detail,
                });
            }
        }
        for &(a, b, t, k) in &self.horizontal {
            let v = &self.verdicts[k as usize];
            decisions.push(FusionDecision {
                producer: d.name(a).to_string(),
                consumer: d.name(b).to_string(),
                rejected: v.reason,
                phase: FusionPhase::Horizontal,
                tensor: d.tname(t).to_string(),
                score: v.score,
                detail: text(k),
            });
        }
        let mut plan = assemble(d, order, gof, kinds, decisions);
        stats.groups = plan.groups.len();
        plan.stats = stats;
        plan
    }
}

/// [`Pass::score_pairs`] over `groups` as they are: each pair's candidate key, or the kernel-class rules'
/// refusal, in the order of `pairs`; on rayon's threads when `parallel` (the same results either way, as each
/// pair only reads).
fn score_candidates(
    d: &Dense<'_>,
    groups: &Groups,
    model: &Model,
    caps: &super::FusionCaps,
    pairs: &[(u32, u32, u32, u32)],
    parallel: bool,
) -> Vec<Result<u128, Reject>> {
    let one = |&(x, y, _, _): &(u32, u32, u32, u32)| -> Result<u128, Reject> {
        groups.structural(d, caps, x, y)?;
        let s = model.score(d, groups, x, y);
        Ok(candidate_key(s, groups.g[y as usize].lo, groups.g[x as usize].lo))
    };
    if parallel {
        use rayon::prelude::*;
        pairs.par_iter().with_min_len(PARALLEL_PAIRS / 4).map(one).collect()
    } else {
        pairs.iter().map(one).collect()
    }
}

/// Positions of the non-view nodes reading any of `ts` (tensor indices) or a view of them.
/// The order of a phase-2 candidate as one integer: score descending, then the consumer group's and the producer
/// group's lowest member positions ascending (the order of `(Reverse(score), lo_y, lo_x)`).
pub(super) fn candidate_key(score: i64, lo_y: u32, lo_x: u32) -> u128 {
    // The score's bits with the sign flipped order like the score; complemented, they order descending.
    let descending = !((score as u64) ^ (1 << 63));
    (u128::from(descending) << 64) | (u128::from(lo_y) << 32) | u128::from(lo_x)
}

fn view_readers<'a>(d: &'a Dense<'_>, order: &'a TopoOrder, ts: &[u32]) -> impl Iterator<Item = u32> + 'a {
    let mut out = Vec::new();
    let mut stack: Vec<u32> = ts.to_vec();
    while let Some(t) = stack.pop() {
        for &c in d.graph.consumers(d.tids[t as usize]) {
            let i = order.position[c];
            if d.is_view(i) {
                stack.extend_from_slice(d.outputs(i));
            } else {
                out.push(i);
            }
        }
    }
    out.into_iter()
}

/// Order the groups topologically (ties: the group's first node position) and compute their external inputs and
/// outputs. `gof[i]` is the group of node `i` (`NONE` for views outside groups). One piece on purpose: the
/// renumbering and the input/output lists are computed in the same walk over the nodes.
fn assemble(
    d: &Dense<'_>,
    order: &TopoOrder,
    gof: Vec<u32>,
    kinds: Vec<GroupKind>,
    decisions: Vec<FusionDecision>,
) -> FusionPlan {
    let graph = d.graph;
    let n = d.len();
    let k = kinds.len();
    // Members of each group in position order (a counting sort): `members[moff[g]..moff[g + 1]]`.
    let mut moff = vec![0u32; k + 1];
    for &g in &gof {
        if g != NONE {
            moff[g as usize + 1] += 1;
        }
    }
    for g in 0..k {
        moff[g + 1] += moff[g];
    }
    let mut members = vec![0u32; moff[k] as usize];
    let mut fill = moff.clone();
    for (i, &g) in gof.iter().enumerate() {
        if g != NONE {
            members[fill[g as usize] as usize] = i as u32;
            fill[g as usize] += 1;
        }
    }
    let mem = |g: u32| &members[moff[g as usize] as usize..moff[g as usize + 1] as usize];
    // Group DAG through the writers of each input's bytes.
    let mut edges: Vec<(u32, u32)> = Vec::new();
    let mut indeg = vec![0u32; k];
    let mut mark = vec![NONE; k];
    for g in 0..k as u32 {
        for &i in mem(g) {
            for &t in d.inputs(i) {
                let p = d.kprod[t as usize];
                if p == NONE {
                    continue;
                }
                let w = gof[p as usize];
                if w != g && mark[w as usize] != g {
                    mark[w as usize] = g;
                    edges.push((w, g));
                    indeg[g as usize] += 1;
                }
            }
        }
    }
    // Successors per group, by a counting sort on the writer: the edges came in reader order and each pair once,
    // so each group's successors are in increasing order.
    let mut soff = vec![0usize; k + 1];
    for &(w, _) in &edges {
        soff[w as usize + 1] += 1;
    }
    for g in 0..k {
        soff[g + 1] += soff[g];
    }
    let mut targets = vec![0u32; edges.len()];
    let mut at = soff.clone();
    for &(w, g) in &edges {
        targets[at[w as usize]] = g;
        at[w as usize] += 1;
    }
    let succ = |g: u32| targets[soff[g as usize]..soff[g as usize + 1]].iter().copied();
    let first: Vec<u32> = (0..k as u32).map(|g| mem(g).first().copied().unwrap_or(0)).collect();
    let mut ready: BinaryHeap<Reverse<(u32, u32)>> =
        (0..k as u32).filter(|&g| indeg[g as usize] == 0).map(|g| Reverse((first[g as usize], g))).collect();
    let mut new_index = vec![NONE; k];
    let mut sequence = Vec::with_capacity(k);
    while let Some(Reverse((_, g))) = ready.pop() {
        new_index[g as usize] = sequence.len() as u32;
        sequence.push(g);
        for s in succ(g) {
            indeg[s as usize] -= 1;
            if indeg[s as usize] == 0 {
                ready.push(Reverse((first[s as usize], s)));
            }
        }
    }
    if sequence.len() != k {
        // A cycle between groups: a bug in the legality checks. Fall back to one kernel per node, which is
        // always legal, rather than hand the later passes an unorderable plan.
        tracing::error!(groups = k, ordered = sequence.len(), "fusion produced a cyclic group graph; falling back");
        let mut gof = vec![NONE; n];
        let mut kinds = Vec::new();
        for i in 0..n as u32 {
            if !d.is_view(i) {
                gof[i as usize] = kinds.len() as u32;
                kinds.push(GroupKind::of(d.cat[i as usize]));
            }
        }
        return assemble(d, order, gof, kinds, decisions);
    }
    let mut group_of: SecondaryMap<NodeId, GroupId> = SecondaryMap::with_capacity(n);
    for i in 0..n {
        if gof[i] != NONE {
            group_of.insert(d.ids[i], GroupId(new_index[gof[i] as usize]));
        }
    }
    let mut seen = vec![NONE; d.tids.len()];
    let mut groups = Vec::with_capacity(k);
    // Each group's lists are gathered in scratch and stored at their exact size (one allocation each).
    let (mut inputs, mut outputs) = (Vec::new(), Vec::new());
    for &g in &sequence {
        let nodes = mem(g);
        inputs.clear();
        outputs.clear();
        for &i in nodes {
            for &t in d.inputs(i) {
                let p = d.prod[t as usize];
                let inside = p != NONE && gof[p as usize] == g;
                if !inside && seen[t as usize] != g {
                    seen[t as usize] = g;
                    inputs.push(d.tids[t as usize]);
                }
            }
            for &t in d.outputs(i) {
                let id = d.tids[t as usize];
                let escapes = graph.tensor(id).role == TensorRole::Output
                    || graph.consumers(id).iter().any(|&c| gof[order.position[c] as usize] != g);
                if escapes {
                    outputs.push(id);
                }
            }
        }
        let flops = nodes.iter().map(|&i| d.cost[i as usize].flops).fold(0, u64::saturating_add);
        let nodes = nodes.iter().map(|&i| d.ids[i as usize]).collect();
        let (inputs, outputs) = (inputs.as_slice().to_vec(), outputs.as_slice().to_vec());
        groups.push(FusedGroup { nodes, kind: kinds[g as usize], inputs, outputs, flops: Some(flops) });
    }
    let unfused_bytes = Some(d.cost.iter().map(OpCost::bytes).fold(0, u64::saturating_add));
    FusionPlan {
        groups,
        group_of,
        decisions,
        stats: FusionStats::default(),
        concat_slots: SecondaryMap::new(),
        unfused_bytes,
    }
}

#[cfg(test)]
mod score_tests {
    use super::*;

    /// Scoring on rayon's threads gives each pair the key or refusal a sequential scan gives, in the same
    /// order: on random DAGs large enough to split into several jobs.
    #[test]
    fn parallel_scores_are_the_sequential_ones() {
        for seed in 1..=3u64 {
            let g = graph_ir::synth::random_dag(30_000, 3 + seed as usize % 2, seed).unwrap();
            let order = crate::topo::analyse(&g).unwrap();
            let start = Start::new(&g, &order, &Target::default());
            let (d, groups) = (&start.d, &start.groups);
            let mut pairs = Vec::new();
            for m in 0..d.len() as u32 {
                for &c in d.succ(m) {
                    let (x, y) = (groups.owner[m as usize], groups.owner[c as usize]);
                    if x != NONE && y != NONE && x != y {
                        pairs.push((x, y, m, c));
                    }
                }
            }
            assert!(pairs.len() >= 2 * (PARALLEL_PAIRS / 4), "seed {seed}: {} pairs, one job", pairs.len());
            let caps = FusionOptions::default().caps;
            let seq = score_candidates(d, groups, &start.model, &caps, &pairs, false);
            let par = score_candidates(d, groups, &start.model, &caps, &pairs, true);
            assert_eq!(seq.len(), pairs.len());
            assert!(seq.iter().any(Result::is_ok), "seed {seed}: every pair refused");
            assert!(seq == par, "seed {seed}: the parallel scores differ");
        }
    }
}
