#![allow(clippy::unwrap_used, clippy::expect_used, clippy::needless_range_loop)] // brute-force checks index freely
//! The stream pass on plain DAGs: exact small cases, and properties checked against brute-force recomputation
//! (closure, transitive reduction, maximum matching) that shares no code with the pass.

use graph_passes::ids::{GroupId, StreamId};
use graph_passes::stream::{assign, StreamOptions, StreamPlan, SyncEdge};
use graph_passes::target::Effort;
use graph_passes::timing;
use proptest::prelude::*;

fn opts(k: usize) -> StreamOptions {
    StreamOptions::with_streams(k)
}

fn dag(preds: &[&[u32]]) -> Vec<Vec<GroupId>> {
    preds.iter().map(|ps| ps.iter().map(|&p| GroupId(p)).collect()).collect()
}

fn streams(p: &StreamPlan) -> Vec<u32> {
    p.stream_of.iter().map(|s| s.0).collect()
}

fn syncs(pairs: &[(u32, u32)]) -> Vec<SyncEdge> {
    pairs.iter().map(|&(f, t)| SyncEdge { from: GroupId(f), to: GroupId(t) }).collect()
}

#[test]
fn diamond() {
    // 0 -> {1, 2} -> 3.
    let d = dag(&[&[], &[0], &[0], &[1, 2]]);
    let p = assign(&d, &[1.0; 4], &[0.1; 4], &opts(4));
    assert_eq!(p.chains, 2);
    assert_eq!(streams(&p), vec![0, 0, 1, 0]);
    assert_eq!(p.syncs, syncs(&[(0, 2), (2, 3)]));
    assert_eq!((p.events_before_reduction, p.events), (2, 2));
    let one = assign(&d, &[1.0; 4], &[0.1; 4], &opts(1));
    assert_eq!((one.num_streams, one.syncs.len()), (1, 0));
}

#[test]
fn fork_join() {
    // 0 -> {1, 2, 3} -> 4: three chains.
    let d = dag(&[&[], &[0], &[0], &[0], &[1, 2, 3]]);
    let p = assign(&d, &[1.0; 5], &[0.1; 5], &opts(4));
    assert_eq!((p.chains, p.num_streams), (3, 3));
    assert_eq!(streams(&p), vec![0, 0, 1, 2, 0]);
    assert_eq!(p.syncs, syncs(&[(0, 2), (0, 3), (2, 4), (3, 4)]));
    assert_eq!(p.events, 3);
    // Two streams: the side branches share one; the wait on 3 covers 2 (stream order), and 0 -> 3 is covered
    // by 0 -> 2.
    let p = assign(&d, &[1.0; 5], &[0.1; 5], &opts(2));
    assert_eq!(streams(&p), vec![0, 0, 1, 1, 0]);
    assert_eq!(p.syncs, syncs(&[(0, 2), (3, 4)]));
    assert_eq!(p.events_before_reduction, 4);
}

#[test]
fn two_independent_chains() {
    // Interleaved in group order: 0 -> 2 -> 4 and 1 -> 3 -> 5.
    let d = dag(&[&[], &[], &[0], &[1], &[2], &[3]]);
    let p = assign(&d, &[1.0; 6], &[0.1; 6], &opts(8));
    assert_eq!(streams(&p), vec![0, 1, 0, 1, 0, 1]);
    assert!(p.syncs.is_empty());
    assert_eq!(p.events_before_reduction, 0);
}

#[test]
fn long_side_branch_keeps_the_critical_path_on_one_stream() {
    // Main chain 0 -> 1 -> 2 -> 3 -> 5 of short groups; side branch 0 -> 4 -> 5 with a long group 4.
    // The critical path 0 -> 4 -> 5 is matched first and runs on one stream without events.
    let d = dag(&[&[], &[0], &[1], &[2], &[0], &[3, 4]]);
    let time = [1.0, 1.0, 1.0, 1.0, 10.0, 1.0];
    let p = assign(&d, &time, &[0.1; 6], &opts(4));
    assert_eq!(streams(&p), vec![0, 1, 1, 1, 0, 0]);
    assert_eq!(p.syncs, syncs(&[(0, 1), (3, 5)]));
    let tasks = p.ordered_tasks(&time, &[0.1; 6]);
    assert_eq!(timing::simulate(&tasks, 0.0).unwrap().makespan_us, 12.0);
}

#[test]
fn redundant_edges_are_reduced_before_matching() {
    // 0 -> 1 -> 2 plus the shortcut 0 -> 2: one chain, no events, one edge reduced away.
    let d = dag(&[&[], &[0], &[0, 1]]);
    let p = assign(&d, &[1.0; 3], &[0.1; 3], &opts(4));
    assert_eq!((p.chains, p.num_streams, p.dag_edges, p.reduced_edges), (1, 1, 3, 2));
    assert!(p.exact_reduction);
}

#[test]
fn empty_dag() {
    let p = assign(&[], &[], &[], &opts(4));
    assert_eq!(p.num_streams, 1);
    assert!(p.stream_of.is_empty());
}

// ---- brute-force recomputation ----

/// reach[u] has bit v when u reaches v (u != v) through `succ`.
fn closure(n: usize, edges: &[(usize, usize)]) -> Vec<Vec<bool>> {
    let mut reach = vec![vec![false; n]; n];
    let mut succ = vec![Vec::new(); n];
    for &(u, v) in edges {
        succ[u].push(v);
    }
    for u in 0..n {
        let mut stack = succ[u].clone();
        while let Some(v) = stack.pop() {
            if !reach[u][v] {
                reach[u][v] = true;
                stack.extend(succ[v].iter().copied());
            }
        }
    }
    reach
}

/// Edges (u, v) of the transitive reduction of the relation `reach`.
fn reduction(reach: &[Vec<bool>]) -> Vec<(usize, usize)> {
    let n = reach.len();
    let mut out = Vec::new();
    for u in 0..n {
        for v in 0..n {
            if reach[u][v] && !(0..n).any(|w| reach[u][w] && reach[w][v]) {
                out.push((u, v));
            }
        }
    }
    out
}

/// Maximum bipartite matching size by Kuhn's augmenting paths.
fn max_matching(n: usize, edges: &[(usize, usize)]) -> usize {
    let mut adj = vec![Vec::new(); n];
    for &(u, v) in edges {
        adj[u].push(v);
    }
    let mut match_r = vec![usize::MAX; n];
    fn try_kuhn(u: usize, adj: &[Vec<usize>], seen: &mut [bool], match_r: &mut [usize]) -> bool {
        for &v in &adj[u] {
            if !seen[v] {
                seen[v] = true;
                if match_r[v] == usize::MAX || try_kuhn(match_r[v], adj, seen, match_r) {
                    match_r[v] = u;
                    return true;
                }
            }
        }
        false
    }
    (0..n).filter(|&u| try_kuhn(u, &adj, &mut vec![false; n], &mut match_r)).count()
}

/// Happens-before edges of a stream plan: consecutive groups of a stream in submission order, plus the waits.
fn hb_edges(p: &StreamPlan) -> Vec<(usize, usize)> {
    let mut last: std::collections::HashMap<StreamId, usize> = Default::default();
    let mut edges = Vec::new();
    for g in p.submission_order() {
        let s = p.stream_of[g.index()];
        if let Some(&prev) = last.get(&s) {
            edges.push((prev, g.index()));
        }
        last.insert(s, g.index());
    }
    edges.extend(p.syncs.iter().map(|e| (e.from.index(), e.to.index())));
    edges
}

fn arb_dag() -> impl Strategy<Value = (Vec<Vec<GroupId>>, Vec<f64>)> {
    (1usize..28, 1usize..5, any::<u64>()).prop_map(|(n, fan_in, seed)| {
        let mut rng = graph_ir::rng::SplitMix64::new(seed);
        let preds: Vec<Vec<GroupId>> = (0..n)
            .map(|g| {
                if g == 0 {
                    return Vec::new();
                }
                let k = rng.below(fan_in as u64 + 1) as usize;
                (0..k)
                    .map(|_| {
                        let back = if rng.below(4) == 0 { g } else { g.min(4) };
                        GroupId((g - 1 - rng.below(back as u64) as usize) as u32)
                    })
                    .collect()
            })
            .collect();
        let time = (0..n).map(|_| 0.5 + rng.below(8) as f64).collect();
        (preds, time)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Every dependency is ordered, no wait is redundant (the waits are exactly the cross-stream edges of the
    /// transitive reduction of the final happens-before order), the stream limit holds, the chain count is the
    /// minimum (n - maximum matching of the reduction), unordered groups never share a stream when streams
    /// suffice, and the modelled makespan is at least the bound.
    #[test]
    fn assignment_is_correct_and_minimal(
        (preds, time) in arb_dag(),
        k in 1usize..9,
        window in prop::sample::select(vec![1usize, 3, 4096]),
        reorder in any::<bool>(),
    ) {
        let n = preds.len();
        let occ: Vec<f64> = time.iter().map(|t| (t / 10.0).min(1.0)).collect();
        let o = StreamOptions { window, reorder, ..StreamOptions::with_streams(k) };
        let p = assign(&preds, &time, &occ, &o);
        prop_assert!(p.num_streams >= 1 && p.num_streams <= k);
        let dag_edges: Vec<(usize, usize)> = {
            let mut e: Vec<(usize, usize)> =
                preds.iter().enumerate().flat_map(|(g, ps)| ps.iter().map(move |p| (p.index(), g))).collect();
            e.sort_unstable();
            e.dedup();
            e
        };
        let dag_reach = closure(n, &dag_edges);
        let tr = reduction(&dag_reach);
        prop_assert_eq!(p.dag_edges, dag_edges.len());
        if window >= n {
            prop_assert_eq!(p.reduced_edges, tr.len());
        } else {
            prop_assert!(p.reduced_edges >= tr.len() && p.reduced_edges <= dag_edges.len());
        }
        // Submission order is a permutation and topological, and group order unless reordering is allowed.
        let order = p.submission_order();
        if !reorder {
            prop_assert!(p.order.is_empty());
        }
        let mut pos = vec![usize::MAX; n];
        for (i, g) in order.iter().enumerate() {
            prop_assert_eq!(pos[g.index()], usize::MAX);
            pos[g.index()] = i;
        }
        for &(u, v) in &dag_edges {
            prop_assert!(pos[u] < pos[v]);
        }
        // Ordering: the happens-before closure contains every dependency.
        let hb = hb_edges(&p);
        let hb_reach = closure(n, &hb);
        for &(u, v) in &dag_edges {
            prop_assert!(hb_reach[u][v], "dependency {} -> {} unordered", u, v);
        }
        // Minimal events: waits == cross-stream edges of the reduction of happens-before.
        let mut cross_tr: Vec<(usize, usize)> = reduction(&hb_reach)
            .into_iter()
            .filter(|&(u, v)| p.stream_of[u] != p.stream_of[v])
            .collect();
        cross_tr.sort_unstable();
        let mut waits: Vec<(usize, usize)> = p.syncs.iter().map(|e| (e.from.index(), e.to.index())).collect();
        waits.sort_unstable();
        prop_assert_eq!(&waits, &cross_tr);
        let cross_before = dag_edges.iter().filter(|&&(u, v)| p.stream_of[u] != p.stream_of[v]).count();
        prop_assert_eq!(p.events_before_reduction, cross_before);
        // Minimum chain cover of the reduction (only exact when the window covers the graph).
        if window >= n {
            prop_assert_eq!(p.chains, n - max_matching(n, &tr));
        }
        if k >= p.chains && window >= n {
            prop_assert_eq!(p.num_streams, p.chains.max(1));
            for u in 0..n {
                for v in u + 1..n {
                    if p.stream_of[u] == p.stream_of[v] {
                        prop_assert!(dag_reach[u][v], "unordered {} and {} share a stream", u, v);
                    }
                }
            }
        }
        // Timing: never below the bound of any assignment.
        let tasks = p.ordered_tasks(&time, &occ);
        let t = timing::simulate(&tasks, 0.0).unwrap();
        let mut dag_tasks = tasks.clone();
        for (i, task) in dag_tasks.iter_mut().enumerate() {
            let g = order[i].index();
            task.deps = preds[g].iter().map(|q| timing::TaskId(pos[q.index()] as u32)).collect();
        }
        let b = timing::dag_bound(&dag_tasks, 0.0).unwrap();
        prop_assert!(t.makespan_us + 1e-9 >= b.bound_us);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// The default effort skips the chain merge's local search once a schedule reaches the bound, so it must
    /// model the same makespan as `max` (which always runs it), and `max`, whose refined merge is the unrefined
    /// one whenever that is already at the bound, never needs more waits at that makespan.
    #[test]
    fn skipping_the_local_search_at_the_bound_loses_nothing((preds, time) in arb_dag(), k in 2usize..6) {
        let occ: Vec<f64> = time.iter().map(|t| (t / 10.0).min(1.0)).collect();
        let with = |effort: Effort| {
            let mut o = StreamOptions::with_streams(k);
            o.target.effort = effort;
            let p = assign(&preds, &time, &occ, &o);
            let m = timing::simulate(&p.ordered_tasks(&time, &occ), 0.0).unwrap().makespan_us;
            (m, p.syncs.len())
        };
        let (m_default, waits_default) = with(Effort::Default);
        let (m_max, waits_max) = with(Effort::Max);
        prop_assert!((m_default - m_max).abs() <= 1e-9 * m_max, "default {} max {}", m_default, m_max);
        prop_assert!(waits_max <= waits_default);
    }
}
