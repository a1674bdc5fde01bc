#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Operand layouts (`FusionCaps::operand_layout`): a Transpose that swaps the last two axes and feeds one
//! MatMul or Gemm alone joins the product's kernel, which reads the Transpose's input transposed; anything else
//! keeps its own kernel and says why. exec-sim checks every fused plan against the reference plan, bitwise.

mod fusion_util;

use exec_sim::{check as sim_check, CheckOptions, Schedule};
use fusion_util::*;
use graph_ir::{ComputeGraph, Op, TensorId};
use graph_passes::fusion::{FusionCaps, FusionOptions, GroupKind, RejectReason};
use graph_plan::{ExecutionPlan, PlanOptions, TensorMap};

fn transpose(g: &mut ComputeGraph, name: &str, perm: Option<Vec<usize>>, x: TensorId) -> TensorId {
    n1(g, name, Op::Transpose { perm }, &[x])
}

/// The fused plan (3 streams, random schedule, race check) against the reference plan: bitwise equal.
fn agrees(g: &ComputeGraph, seed: u64) {
    let opts = PlanOptions::with_streams(3);
    graph_plan::verify(&ExecutionPlan::build_with(g, &opts).unwrap()).unwrap();
    let co = CheckOptions { schedule: Schedule::Random { seed }, seed, ..CheckOptions::default() };
    let r = sim_check(g, &opts, &TensorMap::new(), &TensorMap::new(), &co).unwrap();
    assert!(r.passed, "{}: {r:#?}", g.name());
    for o in &r.outputs {
        assert!(o.bitwise_equal, "{}: '{}' differs: {o:?}", g.name(), o.name);
    }
}

fn detail(p: &graph_passes::fusion::FusionPlan, producer: &str, consumer: &str) -> String {
    p.decisions.iter().find(|d| d.producer == producer && d.consumer == consumer).unwrap().detail.clone()
}

#[test]
fn transposed_operands_fold_into_their_products() {
    let mut g = ComputeGraph::new("layouts");
    let x = g.add_input("x", F, [2, 4, 8]).unwrap();
    // x . W^T with W [6, 8] (a weight stored as PyTorch's Linear stores it).
    let w = g.add_weight("w", F, [6, 8]).unwrap();
    let wt = transpose(&mut g, "wt", None, w);
    let y = n1(&mut g, "mm", Op::MatMul, &[x, wt]);
    let y = n1(&mut g, "mm_relu", Op::Relu, &[y]);
    // Scores q . k^T per batch, without a softmax: no attention kernel.
    let k = g.add_input("k", F, [2, 5, 8]).unwrap();
    let kt = transpose(&mut g, "kt", Some(vec![0, 2, 1]), k);
    let s = n1(&mut g, "scores", Op::MatMul, &[x, kt]);
    // A transposed left operand (token mixing): [2, 8, 4] -> [2, 4, 8] . [8, 3].
    let tokens = g.add_input("tokens", F, [2, 8, 4]).unwrap();
    let tt = transpose(&mut g, "tokens_t", Some(vec![0, 2, 1]), tokens);
    let w2 = g.add_weight("w2", F, [8, 3]).unwrap();
    let z = n1(&mut g, "mix", Op::MatMul, &[tt, w2]);
    // A Gemm whose A is transposed by a node (its own trans_a stays false) and whose B it transposes itself.
    let a = g.add_input("a", F, [8, 4]).unwrap();
    let at = transpose(&mut g, "a_t", Some(vec![1, 0]), a);
    let w3 = g.add_weight("w3", F, [6, 8]).unwrap();
    let c = g.add_weight("c", F, [6]).unwrap();
    let gm = n1(&mut g, "gemm", Op::Gemm { alpha: 0.5, beta: 1.0, trans_a: false, trans_b: true }, &[at, w3, c]);
    for t in [y, s, z, gm] {
        g.mark_output(t).unwrap();
    }
    let p = fuse(&g, &FusionOptions::default());
    check(&g, &p, &FusionCaps::all());
    let mut got = names(&g, &p);
    got.sort();
    let want: Vec<Vec<String>> =
        [vec!["a_t", "gemm"], vec!["kt", "scores"], vec!["tokens_t", "mix"], vec!["wt", "mm", "mm_relu"]]
            .iter()
            .map(|v| v.iter().map(|s| s.to_string()).collect())
            .collect();
    assert_eq!(got, want);
    assert!(kinds(&p).iter().all(|&k| k == GroupKind::Anchor));
    // No transposed copy is materialised.
    for t in ["wt", "kt", "tokens_t", "a_t"] {
        assert!(!p.is_materialized(&g, g.tensor_id(t).unwrap()), "{t}");
        assert_eq!(verdict(&p, t, "gemm").or(verdict(&p, t, "mm")).or(verdict(&p, t, "scores")), None);
    }
    agrees(&g, 3);
    // Without operand layouts every Transpose is a kernel of its own that writes the transposed copy.
    let caps = FusionCaps { operand_layout: false, ..FusionCaps::all() };
    let off = fuse(&g, &FusionOptions { caps: caps.clone(), ..FusionOptions::default() });
    check(&g, &off, &caps);
    assert_eq!(off.groups.len(), 8);
    assert!(["wt", "kt", "tokens_t", "a_t"].iter().all(|t| off.is_materialized(&g, g.tensor_id(t).unwrap())));
}

#[test]
fn layouts_that_cannot_fold_keep_their_kernel_and_say_why() {
    let mut g = ComputeGraph::new("no_layouts");
    let x = g.add_input("x", F, [2, 4, 8]).unwrap();
    // Read by the product and by a Relu: the transposed tensor is needed anyway.
    let k = g.add_input("k", F, [2, 5, 8]).unwrap();
    let kt = transpose(&mut g, "kt", Some(vec![0, 2, 1]), k);
    let s = n1(&mut g, "scores", Op::MatMul, &[x, kt]);
    let r = n1(&mut g, "kt_relu", Op::Relu, &[kt]);
    // A permutation of the batch axes is no operand layout.
    let v = g.add_input("v", F, [4, 2, 8]).unwrap();
    let vp = transpose(&mut g, "v_p", Some(vec![1, 0, 2]), v);
    let w = g.add_weight("w", F, [8, 3]).unwrap();
    let m = n1(&mut g, "batch_perm", Op::MatMul, &[vp, w]);
    // A transposed operand that is itself a graph output.
    let u = g.add_input("u", F, [8, 4]).unwrap();
    let ut = transpose(&mut g, "u_t", None, u);
    let w2 = g.add_weight("w2", F, [8, 6]).unwrap();
    let o = n1(&mut g, "out_mm", Op::MatMul, &[ut, w2]);
    for t in [s, r, m, o, ut] {
        g.mark_output(t).unwrap();
    }
    let p = fuse(&g, &FusionOptions::default());
    check(&g, &p, &FusionCaps::all());
    for (t, mm) in [("kt", "scores"), ("v_p", "batch_perm"), ("u_t", "out_mm")] {
        assert_eq!(verdict(&p, t, mm), Some(RejectReason::Pattern), "{t} -> {mm}");
        assert!(detail(&p, t, mm).contains("would compute an operand of anchor"), "{}", detail(&p, t, mm));
        let group = names(&g, &p).into_iter().find(|gr| gr.iter().any(|n| n == mm)).unwrap();
        assert!(!group.iter().any(|n| n == t), "{t} in {group:?}");
    }
    agrees(&g, 4);

    // Under caps without operand layouts the foldable one says so.
    let mut h = ComputeGraph::new("caps_off");
    let x = h.add_input("x", F, [4, 8]).unwrap();
    let w = h.add_weight("w", F, [6, 8]).unwrap();
    let wt = transpose(&mut h, "wt", None, w);
    let y = n1(&mut h, "mm", Op::MatMul, &[x, wt]);
    h.mark_output(y).unwrap();
    let caps = FusionCaps { operand_layout: false, ..FusionCaps::all() };
    let p = fuse(&h, &FusionOptions { caps: caps.clone(), ..FusionOptions::default() });
    check(&h, &p, &caps);
    assert_eq!(names(&h, &p), vec![vec!["wt".to_string()], vec!["mm".to_string()]]);
    assert_eq!(verdict(&p, "wt", "mm"), Some(RejectReason::CapsExceeded));
    assert_eq!(detail(&p, "wt", "mm"), "caps.operand_layout is off");
}
