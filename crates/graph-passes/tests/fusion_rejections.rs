#![allow(clippy::unwrap_used, clippy::expect_used)]
//! One negative test per rejection reason: the pair does not fuse, and the decision names why.

mod fusion_util;

use fusion_util::*;
use graph_ir::op::{ConvAttrs, CustomOp, MemSpace};
use graph_ir::{ComputeGraph, DType, Op, TensorSpec};
use graph_passes::fusion::{FusionCaps, FusionOptions, FusionPhase, RejectReason};

fn chain3() -> ComputeGraph {
    let mut g = ComputeGraph::new("c3");
    let x = g.add_input("x", F, [16]).unwrap();
    let a = n1(&mut g, "a", Op::Exp, &[x]);
    let b = n1(&mut g, "b", Op::Neg, &[a]);
    let c = n1(&mut g, "c", Op::Abs, &[b]);
    g.mark_output(c).unwrap();
    g
}

#[test]
fn disabled() {
    let g = chain3();
    let p = fuse(&g, &FusionOptions { enabled: false, ..Default::default() });
    assert_eq!(names(&g, &p), vec![vec!["a"], vec!["b"], vec!["c"]]);
    assert_eq!(verdict(&p, "a", "b"), Some(RejectReason::Disabled));
    assert_eq!(verdict(&p, "b", "c"), Some(RejectReason::Disabled));
}

#[test]
fn would_cycle() {
    // a feeds the anchor chain mm1 -> mm2 and the residual add in mm2's epilogue: merging a into that kernel
    // would put mm1 both before and after it.
    let mut g = ComputeGraph::new("cyc");
    let x = g.add_input("x", F, [4, 4]).unwrap();
    let w = g.add_weight("w", F, [4, 4]).unwrap();
    let a = n1(&mut g, "a", Op::Exp, &[x]);
    let m1 = n1(&mut g, "mm1", Op::MatMul, &[a, w]);
    let m2 = n1(&mut g, "mm2", Op::MatMul, &[m1, w]);
    let r = n1(&mut g, "res", Op::Add, &[a, m2]);
    g.mark_output(r).unwrap();
    let p = fuse(&g, &FusionOptions::default());
    check(&g, &p, &FusionCaps::all());
    assert_eq!(names(&g, &p), vec![vec!["a"], vec!["mm1"], vec!["mm2", "res"]]);
    assert_eq!(verdict(&p, "a", "res"), Some(RejectReason::WouldCycle));
    let d = p.decisions.iter().find(|d| d.producer == "a" && d.consumer == "res").unwrap();
    assert_eq!(d.phase, FusionPhase::MultiOutput);
    assert!(d.detail.contains("through 'mm1'"), "{}", d.detail);
    assert_eq!(verdict(&p, "a", "mm1"), Some(RejectReason::Pattern));
}

#[test]
fn multi_consumer() {
    let mut g = ComputeGraph::new("mc");
    let x = g.add_input("x", F, [4, 8]).unwrap();
    let w = g.add_weight("w", F, [8, 8]).unwrap();
    let a = n1(&mut g, "a", Op::Exp, &[x]);
    let b = n1(&mut g, "b", Op::Neg, &[a]);
    let m = n1(&mut g, "mm", Op::MatMul, &[a, w]);
    g.mark_output(b).unwrap();
    g.mark_output(m).unwrap();
    let caps = FusionCaps { multi_output: false, ..FusionCaps::all() };
    let p = fuse(&g, &FusionOptions { caps: caps.clone(), ..Default::default() });
    check(&g, &p, &caps);
    assert_eq!(names(&g, &p), vec![vec!["a"], vec!["b"], vec!["mm"]]);
    assert_eq!(verdict(&p, "a", "b"), Some(RejectReason::MultiConsumer));
    assert_eq!(verdict(&p, "a", "mm"), Some(RejectReason::MultiConsumer));
    // With multi-output kernels, a and b share one (a written for the MatMul).
    let p = fuse(&g, &FusionOptions::default());
    assert_eq!(names(&g, &p), vec![vec!["a", "b"], vec!["mm"]]);
}

#[test]
fn graph_output() {
    let mut g = ComputeGraph::new("go");
    let x = g.add_input("x", F, [16]).unwrap();
    let a = n1(&mut g, "a", Op::Exp, &[x]);
    let b = n1(&mut g, "b", Op::Neg, &[a]);
    g.mark_output(a).unwrap();
    g.mark_output(b).unwrap();
    let caps = FusionCaps { multi_output: false, ..FusionCaps::all() };
    let p = fuse(&g, &FusionOptions { caps: caps.clone(), ..Default::default() });
    check(&g, &p, &caps);
    assert_eq!(names(&g, &p), vec![vec!["a"], vec!["b"]]);
    assert_eq!(verdict(&p, "a", "b"), Some(RejectReason::GraphOutput));
    let p = fuse(&g, &FusionOptions::default());
    assert_eq!(names(&g, &p), vec![vec!["a", "b"]]);
    assert_eq!(outputs(&g, &p, 0), vec!["a", "b"]);
}

#[test]
fn caps_exceeded_ops_inputs_and_epilogues() {
    let g = chain3();
    let caps = FusionCaps { max_ops: 2, ..FusionCaps::all() };
    let p = fuse(&g, &FusionOptions { caps: caps.clone(), ..Default::default() });
    check(&g, &p, &caps);
    assert_eq!(names(&g, &p), vec![vec!["a"], vec!["b", "c"]]);
    assert_eq!(verdict(&p, "a", "b"), Some(RejectReason::CapsExceeded));

    let mut g = ComputeGraph::new("inputs");
    let ins: Vec<_> = ["x", "y", "z"].iter().map(|n| g.add_input(n, F, [8]).unwrap()).collect();
    let s1 = n1(&mut g, "s1", Op::Add, &[ins[0], ins[1]]);
    let s2 = n1(&mut g, "s2", Op::Add, &[s1, ins[2]]);
    g.mark_output(s2).unwrap();
    let caps = FusionCaps { max_inputs: 2, ..FusionCaps::all() };
    let p = fuse(&g, &FusionOptions { caps: caps.clone(), ..Default::default() });
    check(&g, &p, &caps);
    assert_eq!(names(&g, &p), vec![vec!["s1"], vec!["s2"]]);
    assert_eq!(verdict(&p, "s1", "s2"), Some(RejectReason::CapsExceeded));
    let d = p.decisions.iter().find(|d| d.producer == "s1").unwrap();
    assert!(d.detail.contains("max_inputs"), "{}", d.detail);

    let mut g = ComputeGraph::new("conv");
    let x = g.add_input("x", F, [1, 2, 4, 4]).unwrap();
    let w = g.add_weight("w", F, [2, 2, 1, 1]).unwrap();
    let c = n1(&mut g, "conv", Op::Conv(ConvAttrs::default()), &[x, w]);
    let r = n1(&mut g, "relu", Op::Relu, &[c]);
    g.mark_output(r).unwrap();
    let caps = FusionCaps { conv_epilogue: false, ..FusionCaps::all() };
    let p = fuse(&g, &FusionOptions { caps: caps.clone(), ..Default::default() });
    check(&g, &p, &caps);
    assert_eq!(names(&g, &p), vec![vec!["conv"], vec!["relu"]]);
    assert_eq!(verdict(&p, "conv", "relu"), Some(RejectReason::CapsExceeded));
}

#[test]
fn across_custom() {
    let mut g = ComputeGraph::new("cu");
    let x = g.add_input("x", F, [8]).unwrap();
    let a = n1(&mut g, "a", Op::Exp, &[x]);
    let custom = CustomOp {
        source: "extern \"C\" __global__ void k(const float* x, float* y) {}".into(),
        entry: "k".into(),
        grid: [1, 1, 1],
        block: [8, 1, 1],
        outputs: vec![TensorSpec { dtype: F, shape: [8].into() }],
        ..Default::default()
    };
    let k = n1(&mut g, "k", Op::Custom(custom), &[a]);
    let b = n1(&mut g, "b", Op::Neg, &[k]);
    g.mark_output(b).unwrap();
    let p = fuse(&g, &FusionOptions::default());
    check(&g, &p, &FusionCaps::all());
    assert_eq!(names(&g, &p), vec![vec!["a"], vec!["k"], vec!["b"]]);
    assert_eq!(verdict(&p, "a", "k"), Some(RejectReason::AcrossCustom));
    assert_eq!(verdict(&p, "k", "b"), Some(RejectReason::AcrossCustom));
}

#[test]
fn across_copy() {
    let mut g = ComputeGraph::new("cp");
    let x = g.add_input("x", F, [8]).unwrap();
    let a = n1(&mut g, "a", Op::Exp, &[x]);
    let h = n1(&mut g, "to_host", Op::Memcpy { to: MemSpace::Host }, &[a]);
    let d = n1(&mut g, "to_dev", Op::Memcpy { to: MemSpace::Device }, &[h]);
    let b = n1(&mut g, "b", Op::Neg, &[d]);
    g.mark_output(b).unwrap();
    let p = fuse(&g, &FusionOptions::default());
    check(&g, &p, &FusionCaps::all());
    assert_eq!(names(&g, &p), vec![vec!["a"], vec!["to_host"], vec!["to_dev"], vec!["b"]]);
    assert_eq!(verdict(&p, "a", "to_host"), Some(RejectReason::AcrossCopy));
    assert_eq!(verdict(&p, "to_dev", "b"), Some(RejectReason::AcrossCopy));
}

#[test]
fn pattern_prologue_two_anchors_other_domain_and_size_change() {
    let mut g = ComputeGraph::new("pat");
    let x = g.add_input("x", F, [4, 8]).unwrap();
    let w = g.add_weight("w", F, [8, 8]).unwrap();
    let r = n1(&mut g, "relu", Op::Relu, &[x]);
    let m1 = n1(&mut g, "mm1", Op::MatMul, &[r, w]);
    let m2 = n1(&mut g, "mm2", Op::MatMul, &[m1, w]);
    let s0 = n1(&mut g, "sum0", Op::ReduceSum { axes: Some(vec![0]), keepdims: true }, &[m2]);
    let s1 = n1(&mut g, "sum1", Op::ReduceSum { axes: Some(vec![1]), keepdims: true }, &[s0]);
    g.mark_output(s1).unwrap();
    // A [4, 1] MatMul result broadcast up to [4, 8] by its epilogue changes the iteration space.
    let v = g.add_weight("v", F, [8, 1]).unwrap();
    let col = n1(&mut g, "col", Op::MatMul, &[x, v]);
    let wide = n1(&mut g, "wide", Op::Add, &[col, x]);
    g.mark_output(wide).unwrap();
    let p = fuse(&g, &FusionOptions::default());
    check(&g, &p, &FusionCaps::all());
    assert_eq!(
        names(&g, &p),
        vec![vec!["relu"], vec!["mm1"], vec!["mm2"], vec!["sum0"], vec!["sum1"], vec!["col"], vec!["wide"]]
    );
    for (a, b) in [("relu", "mm1"), ("mm1", "mm2"), ("mm2", "sum0"), ("sum0", "sum1"), ("col", "wide")] {
        assert_eq!(verdict(&p, a, b), Some(RejectReason::Pattern), "{a} -> {b}");
    }
    let why =
        |a: &str, b: &str| p.decisions.iter().find(|d| d.producer == a && d.consumer == b).unwrap().detail.clone();
    assert!(why("relu", "mm1").contains("would compute an operand of anchor"));
    assert!(why("mm2", "sum0").contains("an anchor ('mm2') and a reduction"));
    assert!(why("sum0", "sum1").contains("different rows"));
    assert!(why("col", "wide").contains("leaves the epilogue"));
}

#[test]
fn loses_concurrency_with_two_streams() {
    // Two heavy independent MatMuls (over different inputs: no sibling products) joined by an add: fusing the
    // add into either serialises them.
    let mut g = ComputeGraph::new("conc");
    let x = g.add_input("x", F, [512, 512]).unwrap();
    let y = g.add_input("y", F, [512, 512]).unwrap();
    let w1 = g.add_weight("w1", F, [512, 512]).unwrap();
    let w2 = g.add_weight("w2", F, [512, 512]).unwrap();
    let a = n1(&mut g, "left", Op::MatMul, &[x, w1]);
    let b = n1(&mut g, "right", Op::MatMul, &[y, w2]);
    let c = n1(&mut g, "join", Op::Add, &[a, b]);
    g.mark_output(c).unwrap();
    let one = fuse_streams(&g, &FusionOptions::default(), 1);
    assert_eq!(names(&g, &one), vec![vec!["left"], vec!["right", "join"]]);
    let two = fuse_streams(&g, &FusionOptions::default(), 2);
    check(&g, &two, &FusionCaps::all());
    assert_eq!(names(&g, &two), vec![vec!["left"], vec!["right"], vec!["join"]]);
    assert_eq!(verdict(&two, "left", "join"), Some(RejectReason::LosesConcurrency));
    assert_eq!(verdict(&two, "right", "join"), Some(RejectReason::LosesConcurrency));
    // A cheap producer off the critical path still fuses with two streams: a chain loses nothing.
    let g = chain3();
    assert_eq!(names(&g, &fuse_streams(&g, &FusionOptions::default(), 2)), vec![vec!["a", "b", "c"]]);
}

#[test]
fn cycle_check_budget() {
    // a feeds the first of a chain of 9000 anchors, whose end is an output, and res, which also reads the end of
    // another chain of 9000: the merge of a into res is legal, but proving it would walk both chains, past the
    // budget, so the pass gives up.
    let mut g = ComputeGraph::new("budget");
    let x = g.add_input("x", F, [2, 2]).unwrap();
    let x2 = g.add_input("x2", F, [2, 2]).unwrap();
    let w = g.add_weight("w", F, [2, 2]).unwrap();
    let a = n1(&mut g, "a", Op::Exp, &[x]);
    let (mut t, mut u) = (a, x2);
    for i in 0..9000 {
        t = n1(&mut g, &format!("mm{i}"), Op::MatMul, &[t, w]);
    }
    for i in 0..9000 {
        u = n1(&mut g, &format!("other{i}"), Op::MatMul, &[u, w]);
    }
    g.mark_output(t).unwrap();
    let r = n1(&mut g, "res", Op::Add, &[a, u]);
    g.mark_output(r).unwrap();
    let p = fuse(&g, &FusionOptions::default());
    assert_eq!(verdict(&p, "a", "res"), Some(RejectReason::CycleCheckBudget));
    assert_eq!(p.groups.len(), 18001);
    assert!(p.stats.dag_visits_max > 1 << 11);
}

#[test]
fn long_cycle_is_proved_by_landmarks() {
    // a feeds both ends of a chain of 9000 anchors: merging a into the last kernel would close a cycle through
    // the whole chain. The landmark labels prove it without walking the chain (a search would give up at its
    // budget and refuse for that reason instead).
    let mut g = ComputeGraph::new("landmarks");
    let x = g.add_input("x", F, [2, 2]).unwrap();
    let w = g.add_weight("w", F, [2, 2]).unwrap();
    let a = n1(&mut g, "a", Op::Exp, &[x]);
    let mut t = a;
    for i in 0..9000 {
        t = n1(&mut g, &format!("mm{i}"), Op::MatMul, &[t, w]);
    }
    let r = n1(&mut g, "res", Op::Add, &[a, t]);
    g.mark_output(r).unwrap();
    let p = fuse(&g, &FusionOptions::default());
    assert_eq!(verdict(&p, "a", "res"), Some(RejectReason::WouldCycle));
    assert_eq!(p.groups.len(), 9001);
    assert!(p.stats.dag_visits_max < 16, "{}", p.stats.dag_visits_max);
}

#[test]
fn horizontal_not_small() {
    let mut g = ComputeGraph::new("big");
    let x = g.add_input("x", F, [1 << 21]).unwrap();
    let a = n1(&mut g, "exp", Op::Exp, &[x]);
    let b = n1(&mut g, "neg", Op::Neg, &[x]);
    g.mark_output(a).unwrap();
    g.mark_output(b).unwrap();
    let p = fuse(&g, &FusionOptions { horizontal: true, ..Default::default() });
    check(&g, &p, &FusionCaps::all());
    assert_eq!(names(&g, &p), vec![vec!["exp"], vec!["neg"]]);
    let d = p.decisions.iter().find(|d| d.phase == FusionPhase::Horizontal).unwrap();
    assert_eq!(d.rejected, Some(RejectReason::NotSmall));
}

#[test]
fn every_reason_has_a_code() {
    let codes: Vec<&str> = RejectReason::ALL.iter().map(|r| r.code()).collect();
    assert_eq!(
        codes,
        vec![
            "Disabled",
            "WouldCycle",
            "MultiConsumer",
            "GraphOutput",
            "CapsExceeded",
            "AcrossCustom",
            "AcrossCopy",
            "Pattern",
            "LosesConcurrency",
            "CycleCheckBudget",
            "NotSmall",
            "ConcatFused",
            "ConcatInput",
            "ConcatLayout",
            "ConcatOutput",
            "ConcatMemory"
        ]
    );
}

/// The `concat` decision on Concat `cat`, if any.
fn concat_verdict<'p>(
    p: &'p graph_passes::fusion::FusionPlan,
    cat: &str,
) -> Option<&'p graph_passes::fusion::FusionDecision> {
    p.decisions.iter().find(|d| d.phase == FusionPhase::Concat && d.consumer == cat)
}

#[test]
fn concat_of_two_conv_producers_is_eliminated() {
    // Batch 1, axis 1: each branch's result is one byte range of the output (4 x 8 x 8 f32 = 1024 bytes).
    let g = concat_of_convs(1, 4, 8, 8);
    let p = fuse(&g, &FusionOptions::default());
    check(&g, &p, &FusionCaps::all());
    // The relus stay in their convs' epilogues; the Concat runs no kernel.
    assert_eq!(names(&g, &p), vec![vec!["a.conv", "a.relu"], vec!["b.conv", "b.relu"], vec!["neg"]]);
    assert_eq!(p.stats.concats_eliminated, 1);
    let slot = |t: &str| {
        let (id, _) = g.tensors().find(|(_, x)| *x.name == *t).unwrap();
        p.concat_slots.get(id).map(|s| s.offset)
    };
    assert_eq!((slot("a.relu"), slot("b.relu")), (Some(0), Some(1024)));
    assert!(concat_verdict(&p, "cat").is_none());
    // Off in the caps: the Concat is a kernel again (the relus join it as a loop kernel), with no concat verdict.
    let caps = FusionCaps { concat_elimination: false, ..FusionCaps::all() };
    let off = fuse(&g, &FusionOptions { caps: caps.clone(), ..Default::default() });
    check(&g, &off, &caps);
    assert_eq!(off.stats.concats_eliminated, 0);
    assert!(off.concat_slots.is_empty());
    assert!(off.groups.iter().any(|gr| gr.nodes.iter().any(|&n| &*g.node(n).name == "cat")));
}

#[test]
fn concat_with_a_strided_slice_is_refused() {
    // Batch 2: each input's slice is two byte ranges of the output.
    let g = concat_of_convs(2, 4, 4, 8);
    let p = fuse(&g, &FusionOptions::default());
    check(&g, &p, &FusionCaps::all());
    assert_eq!(p.stats.concats_eliminated, 0);
    let d = concat_verdict(&p, "cat").expect("a concat verdict");
    assert_eq!(d.rejected, Some(RejectReason::ConcatLayout));
    assert!(d.detail.contains("dim 0 before axis 1 has extent 2"), "{}", d.detail);
}

#[test]
fn concat_with_an_unaligned_slice_is_refused() {
    // 3 channels of 3 x 3 f32: the second slice would start at byte 108.
    let g = concat_of_convs(1, 3, 4, 3);
    let p = fuse(&g, &FusionOptions::default());
    check(&g, &p, &FusionCaps::all());
    let d = concat_verdict(&p, "cat").expect("a concat verdict");
    assert_eq!(d.rejected, Some(RejectReason::ConcatLayout));
    assert_eq!((d.producer.as_str(), d.tensor.as_str()), ("b.relu", "b.relu"));
    assert!(d.detail.contains("byte 108"), "{}", d.detail);
}

#[test]
fn concat_of_a_graph_input_is_refused() {
    let mut g = ComputeGraph::new("cat_in");
    let x = g.add_input("x", F, [1, 64]).unwrap();
    let a = n1(&mut g, "a", Op::Exp, &[x]);
    let cat = n1(&mut g, "cat", Op::Concat { axis: 1 }, &[a, x]);
    let y = n1(&mut g, "neg", Op::Neg, &[cat]);
    g.mark_output(y).unwrap();
    let p = fuse(&g, &FusionOptions::default());
    check(&g, &p, &FusionCaps::all());
    assert_eq!(p.stats.concats_eliminated, 0);
    // Refused before the phases, so the Concat was free to fuse (with `a` and `neg` into one loop kernel); the
    // reason shows all the same.
    assert_eq!(names(&g, &p), vec![vec!["a", "cat", "neg"]]);
    assert_eq!(concat_verdict(&p, "cat").and_then(|d| d.rejected), Some(RejectReason::ConcatInput));
    // Where it stays a kernel of its own (a MatMul consumer takes no prologue).
    let mut g = ComputeGraph::new("cat_in_mm");
    let x = g.add_input("x", F, [1, 64]).unwrap();
    let w = g.add_weight("w", F, [128, 8]).unwrap();
    let w0 = g.add_weight("w0", F, [64, 64]).unwrap();
    let a = n1(&mut g, "a", Op::MatMul, &[x, w0]);
    let cat = n1(&mut g, "cat", Op::Concat { axis: 1 }, &[a, x]);
    let y = n1(&mut g, "mm", Op::MatMul, &[cat, w]);
    g.mark_output(y).unwrap();
    let p = fuse(&g, &FusionOptions::default());
    check(&g, &p, &FusionCaps::all());
    let d = concat_verdict(&p, "cat").expect("a concat verdict");
    assert_eq!(d.rejected, Some(RejectReason::ConcatInput));
    assert_eq!(d.tensor, "x");
    assert!(d.detail.contains("graph input"), "{}", d.detail);
    assert!(p.explain(&g).contains("[ConcatInput] (concat, via x)"), "{}", p.explain(&g));
}

#[test]
fn concat_of_loop_values_read_only_there_keeps_its_kernel() {
    // Two casts of graph inputs read only by the Concat (a precision policy's widening casts): they join the
    // Concat's loop kernel; eliminating it would give each cast a launch of its own.
    let mut g = ComputeGraph::new("cat_casts");
    let x = g.add_input("x", DType::F16, [1, 64]).unwrap();
    let y = g.add_input("y", DType::F16, [1, 64]).unwrap();
    let a = n1(&mut g, "a", Op::Cast { to: F }, &[x]);
    let b = n1(&mut g, "b", Op::Cast { to: F }, &[y]);
    let cat = n1(&mut g, "cat", Op::Concat { axis: 1 }, &[a, b]);
    let w = g.add_weight("w", F, [128, 8]).unwrap();
    let out = n1(&mut g, "mm", Op::MatMul, &[cat, w]);
    g.mark_output(out).unwrap();
    let p = fuse(&g, &FusionOptions::default());
    check(&g, &p, &FusionCaps::all());
    assert_eq!(names(&g, &p), vec![vec!["a", "b", "cat"], vec!["mm"]]);
    let d = concat_verdict(&p, "cat").expect("a concat verdict");
    assert_eq!((d.rejected, d.tensor.as_str()), (Some(RejectReason::ConcatInput), "a"));
    assert!(d.detail.contains("read only here and computed from graph sources by loop ops only"), "{}", d.detail);
}

#[test]
fn concat_whose_output_is_a_graph_output_is_refused() {
    let mut g = ComputeGraph::new("cat_out");
    let x = g.add_input("x", F, [1, 64]).unwrap();
    let w = g.add_weight("w", F, [64, 64]).unwrap();
    let a = n1(&mut g, "a", Op::MatMul, &[x, w]);
    let b = n1(&mut g, "b", Op::MatMul, &[a, w]);
    let cat = n1(&mut g, "cat", Op::Concat { axis: 1 }, &[a, b]);
    g.mark_output(cat).unwrap();
    let p = fuse(&g, &FusionOptions::default());
    check(&g, &p, &FusionCaps::all());
    let d = concat_verdict(&p, "cat").expect("a concat verdict");
    assert_eq!(d.rejected, Some(RejectReason::ConcatOutput));
}
