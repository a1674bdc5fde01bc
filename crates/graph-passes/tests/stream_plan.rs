#![allow(clippy::unwrap_used, clippy::expect_used, clippy::needless_range_loop)] // brute-force checks index freely
//! Whole plans with several streams, in group order and with the stream pass's own submission order:
//! `graph_plan::verify` accepts them, and an independent recomputation from the plan's steps alone finds every
//! conflicting access ordered, no redundant wait, and a modelled makespan at or above the bound.

use graph_ir::{synth, ComputeGraph};
use graph_passes::stream::{self, StreamOptions};
use graph_plan::{run_pipeline, BufferRef, ExecutionPlan, Pass, PlanOptions, PlanStep};
use proptest::prelude::*;
use std::collections::HashMap;

/// What the steps say: compute steps with their stream and accesses, and the happens-before edges between them
/// (stream order, and record -> wait), each wait edge tagged.
struct Hb {
    stream: Vec<u32>,
    access: Vec<(Vec<BufferRef>, Vec<BufferRef>)>,
    stream_edges: Vec<(usize, usize)>,
    wait_edges: Vec<(usize, usize)>,
    useless_waits: usize,
}

fn happens_before(plan: &ExecutionPlan) -> Hb {
    let mut hb = Hb { stream: vec![], access: vec![], stream_edges: vec![], wait_edges: vec![], useless_waits: 0 };
    let mut last: HashMap<u32, usize> = HashMap::new();
    let mut recorded: HashMap<u32, Option<usize>> = HashMap::new();
    let mut pending: HashMap<u32, Vec<usize>> = HashMap::new();
    for step in &plan.steps {
        match step {
            PlanStep::Launch { stream, reads, writes, .. } => {
                push(&mut hb, &mut last, &mut pending, stream.0, reads.clone(), writes.clone());
            }
            PlanStep::Copy { stream, src, dst, .. } => {
                push(&mut hb, &mut last, &mut pending, stream.0, vec![*src], vec![*dst]);
            }
            PlanStep::Record { stream, event } => {
                recorded.insert(event.0, last.get(&stream.0).copied());
            }
            PlanStep::Wait { stream, event } => {
                let src = recorded.get(&event.0).expect("wait before its record");
                match src {
                    Some(s) => pending.entry(stream.0).or_default().push(*s),
                    None => hb.useless_waits += 1,
                }
            }
        }
    }
    hb.useless_waits += pending.values().map(Vec::len).sum::<usize>();
    hb
}

fn push(
    hb: &mut Hb,
    last: &mut HashMap<u32, usize>,
    pending: &mut HashMap<u32, Vec<usize>>,
    stream: u32,
    reads: Vec<BufferRef>,
    writes: Vec<BufferRef>,
) {
    let id = hb.stream.len();
    hb.stream.push(stream);
    hb.access.push((reads, writes));
    if let Some(&p) = last.get(&stream) {
        hb.stream_edges.push((p, id));
    }
    for s in pending.remove(&stream).unwrap_or_default() {
        hb.wait_edges.push((s, id));
    }
    last.insert(stream, id);
}

/// reach[u][v]: u happens before v (u != v). Edges go forward in submission order.
fn closure(n: usize, edges: &[(usize, usize)]) -> Vec<Vec<u64>> {
    let words = n.div_ceil(64).max(1);
    let mut pred: Vec<Vec<usize>> = vec![Vec::new(); n];
    for &(u, v) in edges {
        pred[v].push(u);
    }
    // anc[v]: every u that reaches v.
    let mut anc = vec![vec![0u64; words]; n];
    for v in 0..n {
        for &u in &pred[v].clone() {
            anc[v][u / 64] |= 1 << (u % 64);
            let a = anc[u].clone();
            for (x, y) in anc[v].iter_mut().zip(a) {
                *x |= y;
            }
        }
    }
    anc
}

fn has(set: &[u64], i: usize) -> bool {
    set[i / 64] >> (i % 64) & 1 == 1
}

/// The plan `build_with` makes, or with `reorder` the same pipeline with a stream pass allowed to choose its
/// own submission order, linearised by graph-plan.
fn plan_for(graph: &ComputeGraph, k: usize, reorder: bool) -> ExecutionPlan {
    let opts = PlanOptions::with_streams(k);
    if !reorder {
        return ExecutionPlan::build_with(graph, &opts).unwrap();
    }
    let mut r = run_pipeline(graph, &opts, Some(Pass::Memory)).unwrap();
    let (fusion, groups, mem) = (r.fusion.as_ref().unwrap(), r.groups.as_ref().unwrap(), r.memory.as_ref().unwrap());
    let sopts = StreamOptions { reorder: true, ..StreamOptions::new(opts.target()) };
    r.stream = Some(stream::analyse(graph, fusion, groups, mem, &sopts));
    ExecutionPlan::finish(graph, &r).unwrap()
}

fn check(graph: &ComputeGraph, k: usize) -> Result<(), TestCaseError> {
    check_plan(&plan_for(graph, k, false), k)?;
    check_plan(&plan_for(graph, k, true), k)
}

fn check_plan(plan: &ExecutionPlan, k: usize) -> Result<(), TestCaseError> {
    if let Err(v) = graph_plan::verify(plan) {
        return Err(TestCaseError::fail(format!("verify: {v:?}")));
    }
    prop_assert!(plan.num_streams <= k);
    let hb = happens_before(plan);
    prop_assert_eq!(hb.useless_waits, 0);
    let n = hb.stream.len();
    let mut all = hb.stream_edges.clone();
    all.extend(hb.wait_edges.iter().copied());
    let anc = closure(n, &all);
    // Memory and data: two accesses that overlap, one a write, are ordered.
    for v in 0..n {
        for u in 0..v {
            let (ru, wu) = &hb.access[u];
            let (rv, wv) = &hb.access[v];
            let conflict = wu.iter().any(|a| rv.iter().chain(wv).any(|b| a.overlaps(b)))
                || ru.iter().any(|a| wv.iter().any(|b| a.overlaps(b)));
            if conflict {
                prop_assert!(has(&anc[v], u), "steps {} and {} conflict but are unordered", u, v);
            }
        }
    }
    // No redundant wait: its source does not reach its target by any other path (stream predecessor of the
    // target or another wait into it), and the waits are exactly the cross-stream edges of the reduction.
    let mut into: Vec<Vec<usize>> = vec![Vec::new(); n];
    for &(u, v) in &all {
        into[v].push(u);
    }
    for &(u, v) in &hb.wait_edges {
        let other = into[v].iter().filter(|&&w| w != u).any(|&w| has(&anc[w], u));
        let dup = into[v].iter().filter(|&&w| w == u).count() > 1;
        prop_assert!(!other && !dup, "wait {} -> {} is redundant", u, v);
    }
    let mut cross_tr = 0usize;
    for v in 0..n {
        for u in 0..v {
            if hb.stream[u] != hb.stream[v]
                && has(&anc[v], u)
                && !(u + 1..v).any(|w| has(&anc[w], u) && has(&anc[v], w))
            {
                cross_tr += 1;
            }
        }
    }
    prop_assert_eq!(hb.wait_edges.len(), cross_tr);
    let records = plan.steps.iter().filter(|s| matches!(s, PlanStep::Record { .. })).count();
    prop_assert_eq!(plan.event_count, records);
    let s = plan.stats();
    prop_assert_eq!(s.waits, hb.wait_edges.len());
    prop_assert!(
        s.makespan_us + 1e-9 >= s.makespan_bound_us,
        "makespan {} < bound {}",
        s.makespan_us,
        s.makespan_bound_us
    );
    prop_assert!(s.makespan_us <= s.one_stream_us + 1e-9);
    Ok(())
}

#[test]
fn families_plan_cleanly_on_every_stream_count() {
    let graphs = [
        synth::inception_like(2, 4).unwrap(),
        synth::transformer(1, 32, 2, 8, 1).unwrap(),
        synth::resnet_like(2, 8, 8).unwrap(),
        synth::random_dag(150, 4, 7).unwrap(),
    ];
    for g in &graphs {
        for k in [1, 2, 3, 4, 8] {
            check(g, k).unwrap();
        }
    }
}

#[test]
fn inception_runs_its_branches_concurrently() {
    // With concurrent lifetimes the memory plan keeps branch buffers until the branches meet, so its reuse
    // edges do not chain the branches: same schedule as without reuse, smaller pool.
    let g = synth::inception_like(3, 4).unwrap();
    let one = ExecutionPlan::build(&g, 1).unwrap();
    let mut conc = PlanOptions::with_streams(4);
    conc.memory.concurrent_lifetimes = true;
    let four = ExecutionPlan::build_with(&g, &conc).unwrap();
    assert!(graph_plan::verify(&four).is_ok());
    let mut no_reuse = PlanOptions::with_streams(4);
    no_reuse.memory.reuse = false;
    let naive = ExecutionPlan::build_with(&g, &no_reuse).unwrap();
    assert_eq!(four.num_streams, naive.num_streams);
    assert!((four.stats().makespan_us - naive.stats().makespan_us).abs() < 1e-9);
    assert!(four.pool_bytes < naive.pool_bytes);
    assert!(four.pool_bytes >= one.pool_bytes);
    assert!(four.num_streams > 1);
    assert_eq!(four.num_streams, four.stats().chains.min(4));
    assert!(four.stats().makespan_us < one.stats().makespan_us);
    assert!(four.stats().makespan_us <= 1.05 * four.stats().makespan_bound_us);
    // The default keeps the pool at the order's bound, paying in overlap instead.
    let tight = ExecutionPlan::build(&g, 4).unwrap();
    assert!(graph_plan::verify(&tight).is_ok());
    assert_eq!(tight.pool_bytes as u64, tight.stats().lower_bound_bytes);
    assert!(tight.pool_bytes <= four.pool_bytes);
    assert!(tight.stats().makespan_us >= four.stats().makespan_us - 1e-9);
    // What the tight pool's reuse edges cost: its bound rises above the data-only bound; the concurrent plan's
    // reuse edges cost nothing.
    assert!((tight.stats().data_bound_us - four.stats().data_bound_us).abs() < 1e-9);
    assert!(tight.stats().makespan_bound_us > tight.stats().data_bound_us);
    assert!((four.stats().makespan_bound_us - four.stats().data_bound_us).abs() < 1e-9);
    // One stream: no events, and the makespan is the sum of launch times.
    assert_eq!(one.event_count, 0);
    assert!((one.stats().makespan_us - one.stats().one_stream_us).abs() < 1e-9);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    #[test]
    fn random_dags_plan_cleanly(n in 2usize..90, fan_in in 1usize..6, seed in any::<u64>(), k in 1usize..9) {
        let g = synth::random_dag(n, fan_in, seed).unwrap();
        check(&g, k)?;
    }
}
