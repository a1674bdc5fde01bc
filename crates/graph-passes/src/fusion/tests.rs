//! Unit tests of the pass's internals; the pattern, rejection and property suites live in `tests/fusion_*.rs`.

use super::*;
use crate::topo;
use graph_ir::{DType, Op};

fn names(g: &ComputeGraph, p: &FusionPlan) -> Vec<Vec<String>> {
    p.groups.iter().map(|gr| gr.nodes.iter().map(|&n| g.node(n).name.to_string()).collect()).collect()
}

#[test]
fn diamond_after_an_anchor_is_one_kernel_and_off_is_one_per_node() {
    let mut g = ComputeGraph::new("f");
    let x = g.add_input("x", DType::F32, [8]).unwrap();
    let w = g.add_weight("w", DType::F32, [8, 8]).unwrap();
    let m = g.add_node("mm", Op::MatMul, &[x, w]).unwrap()[0];
    let a = g.add_node("a", Op::Relu, &[m]).unwrap()[0];
    let b = g.add_node("b", Op::Neg, &[a]).unwrap()[0];
    let c = g.add_node("c", Op::Abs, &[b]).unwrap()[0];
    let d = g.add_node("d", Op::Exp, &[b]).unwrap()[0];
    let e = g.add_node("e", Op::Add, &[c, d]).unwrap()[0];
    g.mark_output(e).unwrap();
    let order = topo::analyse(&g).unwrap();
    let p = analyse(&g, &order, &FusionOptions::default());
    assert_eq!(names(&g, &p), vec![vec!["mm", "a", "b", "c", "d", "e"]]);
    assert_eq!(p.groups[0].kind, GroupKind::Anchor);
    assert!(!p.is_materialized(&g, b));
    assert!(p.is_materialized(&g, e));
    assert!(p.rejections().next().is_none());
    let off = analyse(&g, &order, &FusionOptions { enabled: false, ..Default::default() });
    assert_eq!(off.groups.len(), 6);
    assert!(off.decisions.iter().all(|d| d.rejected == Some(RejectReason::Disabled)));
    assert_eq!(off.decisions.len(), 6);
}

#[test]
fn domains_compare_without_leading_ones() {
    let sm = Op::Softmax { axis: -1 };
    let a = rules_domain(&sm, &[1, 128, 768]);
    let b = rules_domain(&Op::ReduceMax { axes: Some(vec![1]), keepdims: true }, &[128, 768]);
    assert_eq!(a, b);
    let c = rules_domain(&Op::ReduceMax { axes: Some(vec![0]), keepdims: true }, &[128, 768]);
    assert_ne!(a, c);
}

fn rules_domain(op: &Op, dims: &[usize]) -> (Vec<usize>, Vec<usize>) {
    let mut g = ComputeGraph::new("d");
    let x = g.add_input("x", DType::F32, dims.to_vec()).unwrap();
    let y = g.add_node("r", op.clone(), &[x]).unwrap()[0];
    g.mark_output(y).unwrap();
    let order = topo::analyse(&g).unwrap();
    let d = dense::Dense::new(&g, &order);
    let groups = rules::Groups::new(&d, &[]);
    let dom = &groups.domains[groups.g[0].domain as usize];
    (dom.full.clone(), dom.axes.clone())
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 32, ..Default::default() })]

    /// The node flags the row rules and sibling scans read instead of the graph agree with their definitions on
    /// random DAGs (Concats, views, MatMuls): `PRODUCT` is a MatMul or Gemm, `SPLIT` a Split, `SOFTMAX` a Softmax, `READS_MOVE` reads a data-movement
    /// node's result through any chain of views.
    #[test]
    fn dense_flags_match_the_graph(n in 2usize..300, fan_in in 1usize..5, seed in proptest::prelude::any::<u64>()) {
        let g = graph_ir::synth::random_dag(n, fan_in, seed).unwrap();
        let order = topo::analyse(&g).unwrap();
        let d = dense::Dense::new(&g, &order);
        for (i, &id) in order.order.iter().enumerate() {
            let node = g.node(id);
            let product = matches!(node.op, Op::MatMul | Op::Gemm { .. });
            proptest::prop_assert_eq!(d.is(i as u32, dense::PRODUCT), product, "{}", node.name);
            let split = matches!(node.op, Op::Split { .. });
            proptest::prop_assert_eq!(d.is(i as u32, dense::SPLIT), split, "{}", node.name);
            let softmax = matches!(node.op, Op::Softmax { .. });
            proptest::prop_assert_eq!(d.is(i as u32, dense::SOFTMAX), softmax, "{}", node.name);
            // Walk back through views to the writer of each operand's bytes.
            let reads_move = node.inputs.iter().any(|&t| {
                let mut t = t;
                loop {
                    let Some(p) = g.producer(t) else { return false };
                    let pn = g.node(p);
                    if !pn.op.is_view() {
                        return pn.op.category() == graph_ir::OpCategory::DataMovement;
                    }
                    t = pn.inputs[0];
                }
            });
            proptest::prop_assert_eq!(d.is(i as u32, dense::READS_MOVE), reads_move, "{}", node.name);
        }
    }
}

proptest::proptest! {
    /// Phase 2's integer candidate keys sort as the tuples they encode: score descending (over the whole i64
    /// range, both signs), then the consumer's and the producer's lowest positions ascending.
    #[test]
    fn candidate_keys_sort_as_their_tuples(
        a in (proptest::prelude::any::<i64>(), proptest::prelude::any::<u32>(), proptest::prelude::any::<u32>()),
        b in (proptest::prelude::any::<i64>(), proptest::prelude::any::<u32>(), proptest::prelude::any::<u32>()),
        near in -3i64..3,
    ) {
        use std::cmp::Reverse;
        for (x, y) in [(a, b), (a, (a.0.saturating_add(near), b.1, b.2)), (a, (a.0, a.1, b.2))] {
            let tuples = (Reverse(x.0), x.1, x.2).cmp(&(Reverse(y.0), y.1, y.2));
            let keys = build::candidate_key(x.0, x.1, x.2).cmp(&build::candidate_key(y.0, y.1, y.2));
            proptest::prop_assert_eq!(tuples, keys, "{:?} vs {:?}", x, y);
        }
    }
}

proptest::proptest! {
    /// The figures the pass takes from its own node costs are the ones the graph gives: each group's flops is
    /// the sum of its nodes' (what `estimate::estimate_group` sums without them, so the estimates are equal),
    /// and the unfused traffic is every non-view node's bytes, on random DAGs with and without Concat
    /// elimination and at one and four streams (the cost model reads the same costs at four).
    #[test]
    fn cached_costs_are_the_graphs(n in 2usize..300, fan_in in 1usize..5, seed in proptest::prelude::any::<u64>()) {
        let g = graph_ir::synth::random_dag(n, fan_in, seed).unwrap();
        let order = topo::analyse(&g).unwrap();
        let unfused = g
            .nodes()
            .filter(|(_, node)| node.op.category() != graph_ir::OpCategory::View)
            .map(|(id, _)| g.node_cost(id).bytes())
            .fold(0u64, u64::saturating_add);
        let device = crate::device::DeviceProfile::h200();
        for (streams, concat) in [(1, true), (4, true), (4, false)] {
            let target = crate::target::Target { streams, ..Default::default() };
            let mut opts = FusionOptions::default();
            opts.caps.concat_elimination = concat;
            let p = analyse_for(&g, &order, &opts, &target);
            proptest::prop_assert_eq!(p.unfused_bytes, Some(unfused));
            for group in &p.groups {
                let flops = group.nodes.iter().map(|&id| g.node_cost(id).flops).fold(0u64, u64::saturating_add);
                proptest::prop_assert_eq!(group.flops, Some(flops));
                let recomputed = FusedGroup { flops: None, ..group.clone() };
                let (a, b) = (
                    crate::estimate::estimate_group(&g, group, &device),
                    crate::estimate::estimate_group(&g, &recomputed, &device),
                );
                proptest::prop_assert_eq!(a.0, b.0);
                proptest::prop_assert_eq!(a.1.time_us.to_bits(), b.1.time_us.to_bits());
            }
        }
    }
}

/// Late rounds of phase 2, where few groups changed, scan only the changed groups' producers; in this (debug)
/// build each such round also runs the full scan and asserts the same candidates (`Pass::multi_output`). Random
/// DAGs of a few thousand nodes reach those rounds; with and without decisions the stats agree.
#[test]
fn late_rounds_scan_only_the_changed_groups_producers() {
    let mut late = 0;
    for seed in 1..=12 {
        let g = graph_ir::synth::random_dag(2000 + 700 * seed as usize, 2 + seed as usize % 3, seed).unwrap();
        let order = topo::analyse(&g).unwrap();
        let quiet = analyse(&g, &order, &FusionOptions { decisions: false, ..Default::default() });
        let loud = analyse(&g, &order, &FusionOptions::default());
        assert_eq!(quiet.stats, loud.stats, "seed {seed}");
        if quiet.stats.multi_output_rounds >= 3 {
            late += 1;
        }
    }
    assert!(late >= 2, "only {late} graphs reached a third round");
}
