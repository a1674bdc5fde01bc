//! The three phases of the pass and the final assembly of groups (module docs of `fusion`).

use graph_ir::{ComputeGraph, NodeId, OpCategory, TensorId};
use slotmap::SecondaryMap;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};

use super::dag::{Dag, Stop};
use super::dense::{Dense, NONE};
use super::model::Model;
use super::rules::{Groups, Reject};
use super::{
    FusedGroup, FusionDecision, FusionOptions, FusionPhase, FusionPlan, FusionStats, FusionTarget, GroupKind,
    RejectReason,
};
use crate::ids::GroupId;
use crate::topo::TopoOrder;

/// Work budget of one cycle check and reorder (groups and edges visited).
const DAG_BUDGET: u64 = 1 << 14;
/// Most rounds of phase 2.
const MAX_ROUNDS: usize = 8;

/// The latest verdict on one producer -> consumer edge.
#[derive(Clone, Debug)]
struct Verdict {
    reason: Option<RejectReason>,
    phase: FusionPhase,
    score: i64,
    detail: String,
}

struct Pass<'a, 'g> {
    d: &'a Dense<'g>,
    opts: &'a FusionOptions,
    groups: Groups,
    model: Model,
    verdicts: HashMap<(u32, u32), Verdict>,
    horizontal: Vec<FusionDecision>,
    stats: FusionStats,
}

pub(super) fn run(graph: &ComputeGraph, order: &TopoOrder, opts: &FusionOptions, target: &FusionTarget) -> FusionPlan {
    let d = Dense::new(graph, order);
    let mut p = Pass {
        groups: Groups::new(&d),
        model: Model::new(&d, target),
        d: &d,
        opts,
        verdicts: HashMap::new(),
        horizontal: Vec::new(),
        stats: FusionStats::default(),
    };
    if opts.enabled {
        p.vertical();
        if opts.caps.multi_output {
            let mut dag = Dag::new(&d, &p.groups, DAG_BUDGET);
            p.multi_output(&mut dag);
            if opts.horizontal {
                p.horizontal(&mut dag);
            }
            p.stats.dag_visits = dag.visits;
            p.stats.dag_visits_max = dag.max_visits;
        }
    } else {
        for i in 0..d.len() as u32 {
            for &c in &d.succ[i as usize] {
                p.record(i, c, Some(RejectReason::Disabled), FusionPhase::Vertical, 0, "fusion is off".into());
            }
        }
    }
    p.finish(order)
}

impl Pass<'_, '_> {
    fn record(&mut self, p: u32, c: u32, reason: Option<RejectReason>, phase: FusionPhase, score: i64, detail: String) {
        self.verdicts.insert((p, c), Verdict { reason, phase, score, detail });
    }

    /// Record one verdict on every edge from group `a` to group `b`.
    fn record_between(&mut self, a: u32, b: u32, v: &Verdict) {
        let d = self.d;
        let mut edges = Vec::new();
        for &m in &self.groups.g[a as usize].members {
            for &c in &d.succ[m as usize] {
                if self.groups.owner[c as usize] == b {
                    edges.push((m, c));
                }
            }
        }
        for e in edges {
            // A later phase that reaches the same verdict keeps the earlier record (the first phase to decide).
            if self.verdicts.get(&e).is_none_or(|old| old.reason != v.reason) {
                self.verdicts.insert(e, v.clone());
            }
        }
    }

    /// Phase 1: in reverse topological order, a producer joins the group of its consumers when all of them are
    /// in one group and the merge is legal.
    fn vertical(&mut self) {
        let d = self.d;
        for p in (0..d.len() as u32).rev() {
            if d.is_view(p) || d.succ[p as usize].is_empty() {
                continue;
            }
            let cons = &d.succ[p as usize];
            let mut owners: Vec<u32> = cons.iter().map(|&c| self.groups.owner[c as usize]).collect();
            owners.sort_unstable();
            owners.dedup();
            let pg = self.groups.owner[p as usize];
            let escapes_graph = d.outputs(p).iter().any(|&t| d.is_output(t));
            let verdict: Result<i64, Reject> = if owners.len() > 1 {
                let ex = cons.iter().find(|&&c| self.groups.owner[c as usize] != owners[0]).copied().unwrap_or(p);
                Err((
                    RejectReason::MultiConsumer,
                    format!("'{}' is read by {} kernels (e.g. by '{}')", d.name(p), owners.len(), d.name(ex)),
                ))
            } else {
                self.try_join(pg, owners[0], escapes_graph)
            };
            match verdict {
                Ok(score) => {
                    for &c in cons {
                        self.record(p, c, None, FusionPhase::Vertical, score, String::new());
                    }
                    self.stats.merges_vertical += 1;
                }
                Err((reason, detail)) => {
                    for &c in cons {
                        self.record(p, c, Some(reason), FusionPhase::Vertical, 0, detail.clone());
                    }
                }
            }
        }
    }

    /// Try to merge producer group `pg` into consumer group `cg` in phase 1; Ok carries the score.
    fn try_join(&mut self, pg: u32, cg: u32, escapes_graph: bool) -> Result<i64, Reject> {
        let d = self.d;
        let caps = &self.opts.caps;
        let pv = self.groups.preview(d, pg, cg);
        // Across-custom/copy come first: they hold whatever else is true.
        let (a, b) = (&self.groups.g[pg as usize], &self.groups.g[cg as usize]);
        for g in [a, b] {
            match g.kind {
                GroupKind::Custom => return Err((RejectReason::AcrossCustom, "a custom kernel never fuses".into())),
                GroupKind::Copy => return Err((RejectReason::AcrossCopy, "a host/device copy never fuses".into())),
                _ => {}
            }
        }
        if escapes_graph {
            return Err((RejectReason::GraphOutput, format!("'{}' writes a graph output", d.name(a.members[0]))));
        }
        let merged = self.groups.legal(d, caps, pg, cg, &pv)?;
        let score = self.model.score(d, a, b, &pv);
        if let Some(why) = self.model.loses_concurrency(d, a, b, &pv, &self.groups.owner, (pg, cg)) {
            return Err((RejectReason::LosesConcurrency, why));
        }
        self.groups.merge(pg, cg, pv, merged);
        Ok(score)
    }

    /// Phase 2: producer/consumer group pairs, best score first, in rounds; the merged kernel may write several
    /// results.
    fn multi_output(&mut self, dag: &mut Dag) {
        let d = self.d;
        for _ in 0..MAX_ROUNDS {
            self.stats.multi_output_rounds += 1;
            // Candidates: one per (producer group, consumer group), named by its first edge.
            let mut seen: HashSet<(u32, u32)> = HashSet::new();
            let mut cands: Vec<(i64, u32, u32, u32, u32)> = Vec::new();
            for (gi, g) in self.groups.g.iter().enumerate() {
                if !g.alive {
                    continue;
                }
                let mut ms = g.members.clone();
                ms.sort_unstable();
                for &m in &ms {
                    for &c in &d.succ[m as usize] {
                        let h = self.groups.owner[c as usize];
                        if h != gi as u32 && seen.insert((gi as u32, h)) {
                            let pv = self.groups.preview(d, gi as u32, h);
                            let s = self.model.score(d, g, &self.groups.g[h as usize], &pv);
                            cands.push((s, dag.slot[h as usize], dag.slot[gi], m, c));
                        }
                    }
                }
            }
            cands.sort_unstable_by_key(|&(s, sy, sx, m, c)| (Reverse(s), sy, sx, m, c));
            let mut merged_any = false;
            for (_, _, _, m, c) in cands {
                let (x, y) = (self.groups.owner[m as usize], self.groups.owner[c as usize]);
                if x == y {
                    continue;
                }
                let v = match self.try_merge(dag, x, y) {
                    Ok(score) => {
                        merged_any = true;
                        self.stats.merges_multi_output += 1;
                        // Every edge between the two is now inside one kernel.
                        self.record(m, c, None, FusionPhase::MultiOutput, score, String::new());
                        continue;
                    }
                    Err((reason, score, detail)) => {
                        Verdict { reason: Some(reason), phase: FusionPhase::MultiOutput, score, detail }
                    }
                };
                self.record_between(x, y, &v);
            }
            if !merged_any {
                break;
            }
        }
    }

    /// Try to merge groups `x` and `y` (`x` ordered first) in phases 2 and 3.
    fn try_merge(&mut self, dag: &mut Dag, x: u32, y: u32) -> Result<i64, (RejectReason, i64, String)> {
        let d = self.d;
        let pv = self.groups.preview(d, x, y);
        let (a, b) = (&self.groups.g[x as usize], &self.groups.g[y as usize]);
        let score = self.model.score(d, a, b, &pv);
        let merged = self.groups.legal(d, &self.opts.caps, x, y, &pv).map_err(|(r, s)| (r, score, s))?;
        let (x, y) = dag.ordered(x, y);
        let plan = match dag.check(&self.groups, x, y) {
            Ok(p) => p,
            Err(Stop::Cycle(z)) => {
                let via = self.groups.g[z as usize].members.first().map_or("?", |&n| d.name(n));
                return Err((
                    RejectReason::WouldCycle,
                    score,
                    format!(
                        "a path from '{}' through '{}' reaches '{}'",
                        d.name(a.members[0]),
                        via,
                        d.name(b.members[0])
                    ),
                ));
            }
            Err(Stop::Budget) => {
                return Err((RejectReason::CycleCheckBudget, score, format!("more than {DAG_BUDGET} steps")));
            }
        };
        let (a, b) = (&self.groups.g[x as usize], &self.groups.g[y as usize]);
        if let Some(why) = self.model.loses_concurrency(d, a, b, &pv, &self.groups.owner, (x, y)) {
            return Err((RejectReason::LosesConcurrency, score, why));
        }
        let (keep, gone) = self.groups.merge(x, y, pv, merged);
        dag.contract(&self.groups, plan, x, y, keep, gone);
        Ok(score)
    }

    /// Phase 3: launch-bound groups that read the same tensor and do not depend on each other.
    fn horizontal(&mut self, dag: &mut Dag) {
        let d = self.d;
        let small = self.model.launch_bytes;
        let mut roots: Vec<TensorId> = d.readers.keys().collect();
        roots.sort_unstable_by_key(|&t| (d.producer(t).map_or(0, |p| p + 1), t));
        for t in roots {
            let Some(r) = d.readers.get(t) else { continue };
            let mut sib: Vec<u32> = r.cons.iter().map(|&c| self.groups.owner[c as usize]).collect();
            sib.sort_unstable();
            sib.dedup();
            if sib.len() < 2 {
                continue;
            }
            sib.sort_unstable_by_key(|&g| dag.slot[g as usize]);
            let mut acc: Option<u32> = None;
            for g in sib {
                let g = self.groups.resolve(g);
                let Some(a) = acc.map(|a| self.groups.resolve(a)).filter(|&a| a != g) else {
                    acc = Some(g);
                    continue;
                };
                let (an, gn) = (self.groups.g[a as usize].members[0], self.groups.g[g as usize].members[0]);
                let mut dec = FusionDecision {
                    producer: d.name(an).to_string(),
                    consumer: d.name(gn).to_string(),
                    rejected: None,
                    phase: FusionPhase::Horizontal,
                    tensor: d.graph.tensor(t).name.clone(),
                    score: 0,
                    detail: String::new(),
                };
                let (ga, gg) = (&self.groups.g[a as usize], &self.groups.g[g as usize]);
                let big = [ga, gg]
                    .into_iter()
                    .map(|x| (x, Model::bytes(d, &x.inputs, &x.escaping)))
                    .find(|&(x, b)| b > small || x.kind == GroupKind::Anchor);
                let (o1, o2) = dag.ordered(a, g);
                let outcome = if let Some((x, bytes)) = big {
                    let name = d.name(x.members[0]);
                    if x.kind == GroupKind::Anchor {
                        Err((
                            RejectReason::Pattern,
                            0,
                            format!("'{name}' is an anchor (horizontal fusion is for loop and row kernels)"),
                        ))
                    } else {
                        Err((
                            RejectReason::NotSmall,
                            0,
                            format!("'{name}' moves {bytes} bytes, more than one launch is worth ({small})"),
                        ))
                    }
                } else if dag.has_edge(&self.groups, o1, o2) {
                    Err((RejectReason::WouldCycle, 0, "one sibling reads the other".to_string()))
                } else {
                    self.try_merge(dag, o1, o2)
                };
                match outcome {
                    Ok(score) => {
                        dec.score = score;
                        self.stats.merges_horizontal += 1;
                        acc = Some(self.groups.owner[an as usize]);
                    }
                    Err((reason, score, detail)) => {
                        dec.rejected = Some(reason);
                        dec.score = score;
                        dec.detail = detail;
                        acc = Some(g);
                    }
                }
                self.horizontal.push(dec);
            }
        }
    }

    /// Absorb views, order the groups topologically, and build the plan.
    fn finish(self, order: &TopoOrder) -> FusionPlan {
        let d = self.d;
        let graph = d.graph;
        let groups = &self.groups;
        let mut stats = self.stats;
        stats.nodes = d.len();
        // Live groups, densely numbered in order of their lowest member.
        let mut live: Vec<u32> = (0..groups.g.len() as u32).filter(|&g| groups.g[g as usize].alive).collect();
        live.sort_unstable_by_key(|&g| groups.g[g as usize].lo);
        let mut dense_of = vec![NONE; groups.g.len()];
        for (i, &g) in live.iter().enumerate() {
            dense_of[g as usize] = i as u32;
        }
        let mut gid: SecondaryMap<NodeId, usize> = SecondaryMap::with_capacity(graph.num_nodes());
        let mut members: Vec<Vec<NodeId>> = vec![Vec::new(); live.len()];
        for i in 0..d.len() as u32 {
            let o = groups.owner[i as usize];
            if o != NONE {
                let g = dense_of[o as usize] as usize;
                gid.insert(d.ids[i as usize], g);
                members[g].push(d.ids[i as usize]);
            }
        }
        // A view joins the group that writes its bytes when one of its (view-transparent) readers is in that
        // group: the kernel must not read through an outside alias what it writes itself.
        for i in 0..d.len() as u32 {
            if !d.is_view(i) {
                continue;
            }
            stats.views += 1;
            let Some(&x) = d.inputs(i).first() else { continue };
            let Some(p) = d.producer(x) else { continue };
            let g = groups.owner[p as usize];
            if view_readers(graph, order, d.outputs(i)).iter().any(|&c| groups.owner[c as usize] == g) {
                let gi = dense_of[g as usize] as usize;
                gid.insert(d.ids[i as usize], gi);
                members[gi].push(d.ids[i as usize]);
                stats.views_absorbed += 1;
            }
        }
        let kinds: Vec<GroupKind> = live.iter().map(|&g| groups.g[g as usize].kind).collect();
        let mut decisions = Vec::new();
        for p in 0..d.len() as u32 {
            for &c in &d.succ[p as usize] {
                let same = groups.owner[p as usize] == groups.owner[c as usize];
                let tensor = d
                    .inputs(c)
                    .iter()
                    .find(|&&t| d.producer(t) == Some(p))
                    .map_or(String::new(), |&t| graph.tensor(t).name.clone());
                let v = self.verdicts.get(&(p, c));
                let (rejected, phase, score, detail) = match (same, v) {
                    (true, Some(v)) if v.reason.is_none() => (None, v.phase, v.score, String::new()),
                    (true, Some(v)) => (None, v.phase, v.score, "fused through another edge".to_string()),
                    (true, None) => (None, FusionPhase::MultiOutput, 0, "fused through another edge".to_string()),
                    (false, Some(v)) => (v.reason, v.phase, v.score, v.detail.clone()),
                    (false, None) => {
                        (Some(RejectReason::Pattern), FusionPhase::Vertical, 0, "not evaluated".to_string())
                    }
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
        decisions.extend(self.horizontal);
        let mut plan = assemble(graph, order, members, kinds, gid, decisions);
        stats.groups = plan.groups.len();
        plan.stats = stats;
        plan
    }
}

/// Positions of the non-view nodes reading any of `ts` or a view of them.
fn view_readers(graph: &ComputeGraph, order: &TopoOrder, ts: &[TensorId]) -> Vec<u32> {
    let mut out = Vec::new();
    let mut stack: Vec<TensorId> = ts.to_vec();
    while let Some(t) = stack.pop() {
        for &c in graph.consumers(t) {
            let n = graph.node(c);
            if n.op.category() == OpCategory::View {
                stack.extend(n.outputs.iter().copied());
            } else {
                out.push(order.position[c]);
            }
        }
    }
    out
}

/// Order the groups topologically (ties: the group's first node position) and compute their external inputs and
/// outputs.
fn assemble(
    graph: &ComputeGraph,
    order: &TopoOrder,
    members: Vec<Vec<NodeId>>,
    kinds: Vec<GroupKind>,
    gid: SecondaryMap<NodeId, usize>,
    decisions: Vec<FusionDecision>,
) -> FusionPlan {
    let k = members.len();
    let mut succ: Vec<Vec<usize>> = vec![Vec::new(); k];
    let mut indeg = vec![0u32; k];
    for (g, nodes) in members.iter().enumerate() {
        for &n in nodes {
            for &t in &graph.node(n).inputs {
                if let Some(p) = kernel_producer(graph, &gid, t) {
                    if p != g && !succ[p].contains(&g) {
                        succ[p].push(g);
                        indeg[g] += 1;
                    }
                }
            }
        }
    }
    let first: Vec<u32> = members.iter().map(|m| m.iter().map(|&n| order.position[n]).min().unwrap_or(0)).collect();
    let mut ready: BinaryHeap<Reverse<(u32, usize)>> =
        (0..k).filter(|&g| indeg[g] == 0).map(|g| Reverse((first[g], g))).collect();
    let mut new_index = vec![usize::MAX; k];
    let mut sequence = Vec::with_capacity(k);
    while let Some(Reverse((_, g))) = ready.pop() {
        new_index[g] = sequence.len();
        sequence.push(g);
        for &s in &succ[g] {
            indeg[s] -= 1;
            if indeg[s] == 0 {
                ready.push(Reverse((first[s], s)));
            }
        }
    }
    if sequence.len() != k {
        // A cycle between groups: a bug in the legality checks. Fall back to one kernel per node, which is
        // always legal, rather than hand the later passes an unorderable plan.
        tracing::error!(groups = k, ordered = sequence.len(), "fusion produced a cyclic group graph; falling back");
        return unfused(graph, order, decisions);
    }
    let mut group_of: SecondaryMap<NodeId, GroupId> = SecondaryMap::with_capacity(graph.num_nodes());
    for (n, &g) in gid.iter() {
        group_of.insert(n, GroupId::from_index(new_index[g]));
    }
    let mut groups = Vec::with_capacity(k);
    let mut members = members;
    for &g in &sequence {
        let mut nodes = std::mem::take(&mut members[g]);
        nodes.sort_by_key(|&n| order.position[n]);
        let me = GroupId::from_index(new_index[g]);
        let mut inputs: Vec<TensorId> = Vec::new();
        let mut outputs: Vec<TensorId> = Vec::new();
        let mut seen_in: HashSet<TensorId> = HashSet::new();
        for &n in &nodes {
            let node = graph.node(n);
            for &t in &node.inputs {
                let inside = graph.producer(t).is_some_and(|p| group_of.get(p) == Some(&me));
                if !inside && seen_in.insert(t) {
                    inputs.push(t);
                }
            }
            for &t in &node.outputs {
                let escapes = graph.tensor(t).role == graph_ir::TensorRole::Output
                    || graph.consumers(t).iter().any(|&c| group_of.get(c) != Some(&me));
                if escapes {
                    outputs.push(t);
                }
            }
        }
        groups.push(FusedGroup { nodes, kind: kinds[g], inputs, outputs });
    }
    FusionPlan { groups, group_of, decisions, stats: FusionStats::default() }
}

/// One group per non-view node, in topological order.
fn unfused(graph: &ComputeGraph, order: &TopoOrder, decisions: Vec<FusionDecision>) -> FusionPlan {
    let mut members = Vec::new();
    let mut kinds = Vec::new();
    let mut gid: SecondaryMap<NodeId, usize> = SecondaryMap::new();
    for &n in &order.order {
        let cat = graph.node(n).op.category();
        if cat != OpCategory::View {
            gid.insert(n, members.len());
            members.push(vec![n]);
            kinds.push(GroupKind::of(cat));
        }
    }
    assemble(graph, order, members, kinds, gid, decisions)
}

/// The group of the kernel that produces `t`'s bytes, looking through views outside groups.
fn kernel_producer(graph: &ComputeGraph, gid: &SecondaryMap<NodeId, usize>, mut t: TensorId) -> Option<usize> {
    loop {
        let p = graph.producer(t)?;
        if let Some(&g) = gid.get(p) {
            return Some(g);
        }
        t = *graph.node(p).inputs.first()?;
    }
}
