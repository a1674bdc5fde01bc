#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Selection epilogues: a packed projection (a ViT's `qkv` Linear, then `q, k, v = qkv.unbind(0)`, exported as
//! Reshape, Transpose and three Gathers at constant scalar indices) writes q, K^T and v from its own kernel, with
//! no launch per part. The groups on hand-built graphs, the refusals with their reasons (a computation on a
//! selected value, a Gather by a tensor of indices, the caps), and exec-sim against the reference plan.

mod fusion_util;

use exec_sim::attention::ATTENTION_TOLERANCE;
use exec_sim::{check as sim_check, CheckOptions, Schedule};
use fusion_util::*;
use graph_ir::{ComputeGraph, DType, Op, TensorId};
use graph_passes::fusion::{FusionCaps, FusionOptions, GroupKind, RejectReason};
use graph_plan::{verify, ExecutionPlan, PlanOptions, TensorMap};

/// How the block picks its parts.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Pick {
    /// Gathers at constant scalar indices (torch's `unbind`).
    Constant,
    /// q and K^T are scaled right after the split, as torch's scaled_dot_product_attention exports it.
    Scaled,
    /// q is added to v right after the split (two selected values combined).
    Combined,
    /// The index of q is a graph input (not a constant).
    InputIndex,
    /// GPT-2's packed projection: `q, k, v = qkv.split(e, dim=-1)`, each part reshaped to heads and transposed.
    Split,
}

fn idx(g: &mut ComputeGraph, name: &str, v: i64) -> TensorId {
    g.add_constant(name, DType::I64, [], v.to_le_bytes().to_vec()).unwrap()
}

/// x [1, s, e] -> qkv = x W + b [1, s, 3e] -> [1, s, 3, h, d] -> [3, 1, h, s, d] -> q, k, v (Gather axis 0) ->
/// attention(q, k^T, v) with a scale -> head merge -> output projection.
fn vit_block(heads: usize, s: usize, d: usize, pick: Pick) -> ComputeGraph {
    let e = heads * d;
    let mut g = ComputeGraph::new(format!("vit_{heads}_{s}_{d}_{pick:?}"));
    let x = g.add_input("x", F, [1, s, e]).unwrap();
    let w = g.add_weight("w_qkv", F, [e, 3 * e]).unwrap();
    let b = g.add_weight("b_qkv", F, [3 * e]).unwrap();
    let m = n1(&mut g, "qkv_mm", Op::MatMul, &[x, w]);
    let a = n1(&mut g, "qkv_bias", Op::Add, &[m, b]);
    if pick == Pick::Split {
        let parts = g.add_node("qkv_split", Op::Split { axis: 2, splits: vec![e; 3] }, &[a]).unwrap();
        let heads_of = |g: &mut ComputeGraph, name: &str, t: TensorId, perm: Vec<usize>| {
            let shape = vec![1, s as i64, heads as i64, d as i64];
            let r = n1(g, &format!("{name}_view"), Op::Reshape { shape, allowzero: false }, &[t]);
            n1(g, name, Op::Transpose { perm: Some(perm) }, &[r])
        };
        let q = heads_of(&mut g, "q", parts[0], vec![0, 2, 1, 3]);
        let kt = heads_of(&mut g, "k_t", parts[1], vec![0, 2, 3, 1]);
        let v = heads_of(&mut g, "v", parts[2], vec![0, 2, 1, 3]);
        return attend(g, q, kt, v, s, d, e);
    }
    let shape = vec![1, s as i64, 3, heads as i64, d as i64];
    let r = n1(&mut g, "qkv_view", Op::Reshape { shape, allowzero: false }, &[a]);
    let t = n1(&mut g, "qkv_t", Op::Transpose { perm: Some(vec![2, 0, 3, 1, 4]) }, &[r]);
    let i0 = match pick {
        Pick::InputIndex => g.add_input("which", DType::I64, []).unwrap(),
        _ => idx(&mut g, "i0", 0),
    };
    let (i1, i2) = (idx(&mut g, "i1", 1), idx(&mut g, "i2", 2));
    let mut q = n1(&mut g, "q", Op::Gather { axis: 0 }, &[t, i0]);
    let k = n1(&mut g, "k", Op::Gather { axis: 0 }, &[t, i1]);
    let v = n1(&mut g, "v", Op::Gather { axis: 0 }, &[t, i2]);
    let mut kt = n1(&mut g, "k_t", Op::Transpose { perm: Some(vec![0, 1, 3, 2]) }, &[k]);
    match pick {
        Pick::Scaled => {
            let c = g.add_constant_f32("sqrt_scale", [1], &[(1.0 / (d as f32).sqrt()).sqrt()]).unwrap();
            q = n1(&mut g, "q_scaled", Op::Mul, &[q, c]);
            kt = n1(&mut g, "k_t_scaled", Op::Mul, &[kt, c]);
        }
        Pick::Combined => q = n1(&mut g, "q_plus_v", Op::Add, &[q, v]),
        Pick::Constant | Pick::InputIndex | Pick::Split => {}
    }
    attend(g, q, kt, v, s, d, e)
}

/// Scaled attention over q, K^T and v, the head merge and the output projection.
fn attend(mut g: ComputeGraph, q: TensorId, kt: TensorId, v: TensorId, s: usize, d: usize, e: usize) -> ComputeGraph {
    let sc = n1(&mut g, "qk", Op::MatMul, &[q, kt]);
    let c = g.add_constant_f32("scale_c", [], &[1.0 / (d as f32).sqrt()]).unwrap();
    let sc = n1(&mut g, "scale", Op::Mul, &[sc, c]);
    let p = n1(&mut g, "softmax", Op::Softmax { axis: -1 }, &[sc]);
    let o = n1(&mut g, "pv", Op::MatMul, &[p, v]);
    let o = n1(&mut g, "merge_t", Op::Transpose { perm: Some(vec![0, 2, 1, 3]) }, &[o]);
    let o = n1(&mut g, "merge", Op::Reshape { shape: vec![1, s as i64, e as i64], allowzero: false }, &[o]);
    let wo = g.add_weight("wo", F, [e, e]).unwrap();
    let y = n1(&mut g, "out_proj", Op::MatMul, &[o, wo]);
    g.mark_output(y).unwrap();
    g
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

/// exec-sim: the fused plan (4 streams, random schedule, race check) against the reference plan.
fn agrees(g: &ComputeGraph, inputs: &TensorMap, seed: u64) {
    let opts = PlanOptions::with_streams(4);
    verify(&ExecutionPlan::build_with(g, &opts).unwrap()).unwrap();
    let co = CheckOptions { schedule: Schedule::Random { seed }, seed, ..CheckOptions::default() };
    let r = sim_check(g, &opts, inputs, &TensorMap::new(), &co).unwrap_or_else(|e| panic!("{}: {e}", g.name()));
    assert!(r.passed, "{}: {r:#?}", g.name());
    let worst = r.outputs.iter().map(|o| o.max_rel_err).fold(0f64, f64::max);
    assert!(worst <= ATTENTION_TOLERANCE, "{}: relative error {worst:e}", g.name());
}

#[test]
fn a_packed_projection_writes_its_parts_from_one_kernel() {
    for (heads, seq, d) in [(2, 8, 4), (3, 70, 8)] {
        let g = vit_block(heads, seq, d, Pick::Constant);
        let p = fuse(&g, &FusionOptions::default());
        check(&g, &p, &FusionCaps::all());
        assert_eq!(
            names(&g, &p),
            vec![
                s(&["qkv_mm", "qkv_bias", "qkv_view", "qkv_t", "q", "k", "v"]),
                // K^T is the first product's operand layout (`caps.operand_layout`): the attention kernel reads K.
                s(&["k_t", "qk", "scale", "softmax", "pv", "merge_t"]),
                s(&["out_proj"]),
            ]
        );
        assert_eq!(kinds(&p), vec![GroupKind::Anchor, GroupKind::Attention, GroupKind::Anchor]);
        // The projection kernel writes the three parts; the packed tensor stays inside.
        assert_eq!(outputs(&g, &p, 0), vec!["q", "k", "v"]);
        assert!(!p.is_materialized(&g, g.tensor_id("qkv_t").unwrap()));
        agrees(&g, &TensorMap::new(), 5);
    }
}

#[test]
fn a_split_packed_projection_writes_its_parts_from_one_kernel() {
    // GPT-2: the Split routes each third of the product to its part, each written in its head layout.
    for (heads, seq, d) in [(2, 8, 4), (3, 70, 8)] {
        let g = vit_block(heads, seq, d, Pick::Split);
        let p = fuse(&g, &FusionOptions::default());
        check(&g, &p, &FusionCaps::all());
        assert_eq!(
            names(&g, &p),
            vec![
                s(&["qkv_mm", "qkv_bias", "qkv_split", "q_view", "q", "k_t_view", "k_t", "v_view", "v"]),
                s(&["qk", "scale", "softmax", "pv", "merge_t"]),
                s(&["out_proj"]),
            ]
        );
        assert_eq!(outputs(&g, &p, 0), vec!["q", "k_t", "v"]);
        agrees(&g, &TensorMap::new(), 17);
    }
    // Without selection epilogues the Split runs alone and says why; a Split never joins a loop kernel.
    let g = vit_block(2, 8, 4, Pick::Split);
    let caps = FusionCaps { select_epilogue: false, ..FusionCaps::all() };
    let p = fuse(&g, &FusionOptions { caps: caps.clone(), ..Default::default() });
    check(&g, &p, &caps);
    assert!(names(&g, &p).contains(&s(&["qkv_split"])), "{:?}", names(&g, &p));
    assert!(p.decisions.iter().any(|d| d.producer == "qkv_bias"
        && d.consumer == "qkv_split"
        && d.rejected == Some(RejectReason::CapsExceeded)
        && d.detail == "caps.select_epilogue is off"));
    assert!(p.decisions.iter().any(|d| d.producer == "qkv_split"
        && d.detail == "'qkv_split' (a Split) runs alone unless it routes the result of an anchor (a selection)"));
    agrees(&g, &TensorMap::new(), 19);
}

#[test]
fn an_sdpa_export_scales_its_parts_in_the_projection_kernel() {
    // torch's scaled_dot_product_attention multiplies q and K^T by sqrt(scale): per element, by a constant, so
    // the projection kernel writes the scaled parts.
    let g = vit_block(2, 70, 4, Pick::Scaled);
    let p = fuse(&g, &FusionOptions::default());
    check(&g, &p, &FusionCaps::all());
    assert_eq!(
        names(&g, &p)[0],
        s(&["qkv_mm", "qkv_bias", "qkv_view", "qkv_t", "q", "k", "v", "k_t", "q_scaled", "k_t_scaled"])
    );
    assert_eq!(kinds(&p), vec![GroupKind::Anchor, GroupKind::Attention, GroupKind::Anchor]);
    agrees(&g, &TensorMap::new(), 13);
}

#[test]
fn selections_need_the_caps_and_a_constant_index_and_are_not_combined() {
    // Two selected values combined stay out of the epilogue.
    let g = vit_block(2, 8, 4, Pick::Combined);
    let p = fuse(&g, &FusionOptions::default());
    check(&g, &p, &FusionCaps::all());
    let group_of = |name: &str| names(&g, &p).iter().position(|grp| grp.iter().any(|n| n == name)).unwrap();
    assert_ne!(group_of("q_plus_v"), group_of("qkv_mm"));
    let want = "'q_plus_v' would combine a selection with another value of the epilogue of 'qkv_mm' (after a \
                Gather or a Split there, only Transposes, views and elementwise ops with operands from outside the \
                kernel)";
    assert!(
        p.decisions.iter().any(|d| d.rejected == Some(RejectReason::Pattern) && d.detail == want),
        "{:#?}",
        p.decisions
    );
    agrees(&g, &TensorMap::new(), 9);

    // A Gather by an index the caller supplies is not a selection: it cannot join the epilogue.
    let g = vit_block(2, 8, 4, Pick::InputIndex);
    let p = fuse(&g, &FusionOptions::default());
    check(&g, &p, &FusionCaps::all());
    let group_of = |name: &str| names(&g, &p).iter().position(|grp| grp.iter().any(|n| n == name)).unwrap();
    assert_ne!(group_of("q"), group_of("qkv_mm"));
    assert_eq!(group_of("k"), group_of("qkv_mm"));
    assert!(p.decisions.iter().any(|d| d.consumer == "q"
        && d.detail
            == "a data-movement op other than a Transpose, a constant-index Gather or a Split in the epilogue of \
                'qkv_mm'"));
    let mut inputs = TensorMap::new();
    inputs.insert(
        "which".into(),
        graph_plan::HostTensor {
            dtype: DType::I64,
            shape: graph_ir::Shape::new(Vec::<usize>::new()),
            data: 0i64.to_le_bytes().to_vec(),
        },
    );
    agrees(&g, &inputs, 11);

    // A backend without selection epilogues (exec-cuda today): each part is its own launch, and says why.
    let caps = FusionCaps { select_epilogue: false, ..FusionCaps::all() };
    let g = vit_block(2, 8, 4, Pick::Constant);
    let p = fuse(&g, &FusionOptions { caps: caps.clone(), ..Default::default() });
    check(&g, &p, &caps);
    assert_eq!(p.groups.len(), 6, "{:?}", names(&g, &p));
    assert!(p
        .decisions
        .iter()
        .any(|d| d.rejected == Some(RejectReason::CapsExceeded) && d.detail == "caps.select_epilogue is off"));
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 24, ..proptest::prelude::ProptestConfig::default() })]

    /// Random packed-projection blocks: head counts, lengths across the attention tile, head sizes, the way the
    /// parts are picked. Every plan obeys the rules (the checker restates them), verifies, and agrees with the
    /// reference plan; constant picks always put the three parts in the projection kernel.
    #[test]
    fn random_packed_projections_fuse_by_the_rules(
        heads in 1usize..4,
        seq in 1usize..80,
        d in 1usize..9,
        pick in 0usize..5,
        seed in 0u64..1000,
    ) {
        let pick = [Pick::Constant, Pick::Scaled, Pick::Combined, Pick::InputIndex, Pick::Split][pick];
        let g = vit_block(heads, seq, d, pick);
        let p = fuse(&g, &FusionOptions::default());
        check(&g, &p, &FusionCaps::all());
        let all = names(&g, &p);
        let first = &all[0];
        if matches!(pick, Pick::Constant | Pick::Scaled | Pick::Split) {
            let parts: &[&str] = if pick == Pick::Split { &["q", "v"] } else { &["q", "k", "v"] };
            for &part in parts {
                proptest::prop_assert!(first.iter().any(|n| n == part), "{part} not in {first:?}");
            }
            // K^T: in the projection's epilogue, or the attention kernel's operand layout of K.
            let kt = all.iter().find(|g| g.iter().any(|n| n == "k_t")).unwrap();
            proptest::prop_assert!(kt == first || kt.iter().any(|n| n == "qk"), "k_t in {kt:?}");
        }
        let mut inputs = TensorMap::new();
        if pick == Pick::InputIndex {
            inputs.insert("which".into(), graph_plan::HostTensor {
                dtype: DType::I64,
                shape: graph_ir::Shape::new(Vec::<usize>::new()),
                data: (seed as i64 % 3).to_le_bytes().to_vec(),
            });
        }
        agrees(&g, &inputs, seed);
    }
}
