#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Loads in row kernels: a Gather, Slice, Expand or Transpose of tensors from outside the kernel (an embedding
//! lookup, a window of a position table) joins the LayerNorm that normalises it, computed inline at each element;
//! data movement that reads a value the kernel computes, or that is no load, keeps its own launch and says why.

mod fusion_util;

use fusion_util::*;
use graph_ir::op::PadMode;
use graph_ir::OpCost;
use graph_ir::{ComputeGraph, DType, Op, TensorId};
use graph_passes::device::DeviceProfile;
use graph_passes::fusion::{FusionCaps, FusionOptions, FusionPlan, GroupKind, RejectReason};

/// The modelled traffic of group `i`.
fn cost(g: &ComputeGraph, p: &FusionPlan, i: usize) -> OpCost {
    graph_passes::estimate::estimate_group(g, &p.groups[i], &DeviceProfile::default()).0
}

fn ln() -> Op {
    Op::LayerNormalization { axis: -1, epsilon: 1e-5 }
}

/// A LayerNorm's scale and bias over rows of 16.
fn ln_weights(g: &mut ComputeGraph) -> (TensorId, TensorId) {
    (g.add_weight("gamma", F, [16]).unwrap(), g.add_weight("beta", F, [16]).unwrap())
}

/// The fusion plan of `g` under `caps`, checked against them.
fn fused(g: &ComputeGraph, caps: FusionCaps) -> FusionPlan {
    let p = fuse(g, &FusionOptions { caps: caps.clone(), ..Default::default() });
    check(g, &p, &caps);
    p
}

/// BERT's embeddings at batch 1: word rows gathered by id, plus a window of the position table (as exports
/// write `position_embeddings[:, :seq]`), plus token-type rows, then LayerNorm.
fn embeddings() -> ComputeGraph {
    let mut g = ComputeGraph::new("embeddings");
    let ids = g.add_input("ids", DType::I64, [1, 8]).unwrap();
    let tt = g.add_input("tt", DType::I64, [1, 8]).unwrap();
    let word = g.add_weight("word", F, [50, 16]).unwrap();
    let pos = g.add_weight("pos", F, [1, 32, 16]).unwrap();
    let types = g.add_weight("types", F, [2, 16]).unwrap();
    let (gamma, beta) = ln_weights(&mut g);
    let w = n1(&mut g, "word_rows", Op::Gather { axis: 0 }, &[word, ids]);
    let window = Op::Slice { starts: vec![0], ends: vec![8], axes: Some(vec![1]), steps: None };
    let p = n1(&mut g, "pos_rows", window, &[pos]);
    let a = n1(&mut g, "add_pos", Op::Add, &[w, p]);
    let t = n1(&mut g, "type_rows", Op::Gather { axis: 0 }, &[types, tt]);
    let b = n1(&mut g, "add_type", Op::Add, &[a, t]);
    let y = n1(&mut g, "ln", ln(), &[b, gamma, beta]);
    g.mark_output(y).unwrap();
    g
}

#[test]
fn embedding_lookups_are_loads_of_the_layernorm_kernel() {
    let g = embeddings();
    let p = fused(&g, FusionCaps::all());
    assert_eq!(names(&g, &p), vec![vec!["word_rows", "pos_rows", "add_pos", "type_rows", "add_type", "ln"]]);
    assert_eq!(kinds(&p), vec![GroupKind::Reduction]);
    // The kernel reads the gathered rows and the window, not the tables: 8 rows of 16 f32 from each table (the
    // type table has only 2: read whole); the ids, gamma and beta whole; it writes [1, 8, 16].
    let row = 16 * 4;
    let read = 8 * row + 8 * row + 2 * row + 2 * (8 * 8) + 2 * row;
    assert_eq!(cost(&g, &p, 0).bytes_read, read as u64);
    assert_eq!(cost(&g, &p, 0).bytes_written, (8 * row) as u64);
}

#[test]
fn position_rows_broadcast_over_the_batch_are_loads_too() {
    // At batch 2 the position rows `[1, 8, 16]` are no row value of the `[2, 8, 16]` LayerNorm: the kernel
    // computes them inline where the Add reads them (by broadcast). Read by anything but an elementwise op of the
    // kernel, such a value would have to be written: it stays out.
    let mut g = ComputeGraph::new("batch2");
    let ids = g.add_input("ids", DType::I64, [2, 8]).unwrap();
    let word = g.add_weight("word", F, [50, 16]).unwrap();
    let pos = g.add_weight("pos", F, [1, 32, 16]).unwrap();
    let (gamma, beta) = ln_weights(&mut g);
    let w = n1(&mut g, "word_rows", Op::Gather { axis: 0 }, &[word, ids]);
    let window = Op::Slice { starts: vec![0], ends: vec![8], axes: Some(vec![1]), steps: None };
    let p = n1(&mut g, "pos_rows", window, &[pos]);
    let a = n1(&mut g, "add_pos", Op::Add, &[w, p]);
    let y = n1(&mut g, "ln", ln(), &[a, gamma, beta]);
    g.mark_output(y).unwrap();
    let plan = fused(&g, FusionCaps::all());
    assert_eq!(names(&g, &plan), vec![vec!["word_rows", "pos_rows", "add_pos", "ln"]]);
    // The position rows are read by the kernel once per batch element: charged as the window (8 rows) once.
    assert_eq!(cost(&g, &plan, 0).bytes_read, (16 * 64 + 8 * 64 + 16 * 8 + 2 * 64) as u64);

    // The same rows also normalised on their own (a second LayerNorm, over [1, 8, 16]): they are a row value of
    // that kernel, which writes them once; the first kernel reads them as an operand from outside.
    let mut g2 = g.clone();
    let z = n1(&mut g2, "ln2", ln(), &[p, gamma, beta]);
    g2.mark_output(z).unwrap();
    let plan = fused(&g2, FusionCaps::all());
    assert_eq!(names(&g2, &plan), vec![vec!["pos_rows", "ln2"], vec!["word_rows", "add_pos", "ln"]]);
}

#[test]
fn a_class_token_and_a_patch_grid_concatenated_are_a_chain_of_loads() {
    // A vision transformer's embeddings: the patch grid transposed to tokens, a class token expanded before them
    // (inner links: read only by the Concat, no row shape needed), the position table added, LayerNorm. The
    // sum is the residual stream, read by a later Add too: the kernel writes it and the normalised rows.
    let mut g = ComputeGraph::new("vit_embeddings");
    let grid = g.add_input("grid", F, [1, 16, 2, 2]).unwrap();
    let cls = g.add_weight("cls", F, [1, 1, 16]).unwrap();
    let pos = g.add_weight("pos", F, [1, 5, 16]).unwrap();
    let (gamma, beta) = ln_weights(&mut g);
    let flat = n1(&mut g, "flat", Op::Reshape { shape: vec![1, 16, 4], allowzero: false }, &[grid]);
    let tokens = n1(&mut g, "tokens", Op::Transpose { perm: Some(vec![0, 2, 1]) }, &[flat]);
    let c = n1(&mut g, "cls_b", Op::Expand { shape: vec![1, 1, 16] }, &[cls]);
    let cat = n1(&mut g, "cat", Op::Concat { axis: 1 }, &[c, tokens]);
    let h = n1(&mut g, "h", Op::Add, &[cat, pos]);
    let y = n1(&mut g, "ln", ln(), &[h, gamma, beta]);
    let r = n1(&mut g, "res", Op::Add, &[h, y]);
    g.mark_output(r).unwrap();
    let p = fused(&g, FusionCaps::all());
    assert_eq!(names(&g, &p), vec![vec!["tokens", "cls_b", "cat", "h", "ln", "res"]]);
    assert_eq!(kinds(&p), vec![GroupKind::Reduction]);
    // A Concat of a computed value is no load: ln(concat(exp(a), b)) keeps the Exp apart.
    let mut g = ComputeGraph::new("cat_of_computed");
    let a = g.add_input("a", F, [2, 16]).unwrap();
    let b = g.add_input("b", F, [2, 16]).unwrap();
    let e = n1(&mut g, "exp", Op::Exp, &[a]);
    let cat = n1(&mut g, "cat", Op::Concat { axis: 0 }, &[e, b]);
    let (gamma, beta) = ln_weights(&mut g);
    let y = n1(&mut g, "ln", ln(), &[cat, gamma, beta]);
    g.mark_output(y).unwrap();
    let p = fused(&g, FusionCaps::all());
    assert_eq!(verdict(&p, "exp", "cat"), Some(RejectReason::Pattern));
    assert!(names(&g, &p).contains(&vec!["exp".to_string()]), "{:?}", names(&g, &p));
}

#[test]
fn the_class_token_is_a_row_selection_of_the_last_layernorm() {
    // BERT's pooler and a ViT's head read row 0 of the last LayerNorm's result: the blocks of those rows also
    // write them to the selection's output, so the Gather costs no launch.
    let build = || {
        let mut g = ComputeGraph::new("cls");
        let x = g.add_input("x", F, [2, 5, 16]).unwrap();
        let (gamma, beta) = ln_weights(&mut g);
        let w = g.add_weight("w", F, [4, 16]).unwrap();
        let zero = g.add_constant("zero", DType::I64, [], 0i64.to_le_bytes().to_vec()).unwrap();
        let y = n1(&mut g, "ln", ln(), &[x, gamma, beta]);
        let c = n1(&mut g, "cls", Op::Gather { axis: 1 }, &[y, zero]);
        let gemm = Op::Gemm { alpha: 1.0, beta: 1.0, trans_a: false, trans_b: true };
        let z = n1(&mut g, "head", gemm, &[c, w]);
        g.mark_output(y).unwrap();
        g.mark_output(z).unwrap();
        (g, zero)
    };
    let (g, _) = build();
    let p = fused(&g, FusionCaps::all());
    assert_eq!(names(&g, &p), vec![vec!["ln", "cls"], vec!["head"]]);
    assert_eq!(kinds(&p), vec![GroupKind::Reduction, GroupKind::Anchor]);

    let caps = FusionCaps { select_rows: false, ..FusionCaps::all() };
    let p = fused(&g, caps);
    assert_eq!(verdict(&p, "ln", "cls"), Some(RejectReason::CapsExceeded));
    let d = p.decisions.iter().find(|d| d.producer == "ln" && d.consumer == "cls").unwrap();
    assert!(d.detail.contains("select_rows"), "{}", d.detail);

    // Along the normalised axis the Gather picks one element per row, not a row: refused.
    let (mut g, zero) = build();
    let y = g.node(g.node_id("ln").unwrap()).outputs[0];
    let e = n1(&mut g, "elem", Op::Gather { axis: -1 }, &[y, zero]);
    g.mark_output(e).unwrap();
    let p = fused(&g, FusionCaps::all());
    assert_eq!(verdict(&p, "ln", "elem"), Some(RejectReason::Pattern));
    assert!(names(&g, &p).contains(&vec!["elem".to_string()]), "{:?}", names(&g, &p));
}

#[test]
fn loads_in_row_kernels_follow_the_injective_cap() {
    let g = embeddings();
    let caps = FusionCaps { injective_fusion: false, ..FusionCaps::all() };
    let p = fused(&g, caps);
    assert_eq!(verdict(&p, "word_rows", "add_pos"), Some(RejectReason::CapsExceeded));
    assert_eq!(verdict(&p, "type_rows", "add_type"), Some(RejectReason::CapsExceeded));
    let d = p.decisions.iter().find(|d| d.producer == "type_rows").unwrap();
    assert!(d.detail.contains("injective_fusion"), "{}", d.detail);
    assert_eq!(names(&g, &p).last().unwrap(), &vec!["add_pos", "add_type", "ln"]);
}

#[test]
fn a_load_of_a_value_the_row_kernel_computes_keeps_its_producer_apart() {
    // ln(gather(exp(x), idx)), rows permuted by idx: the row kernel would need exp(x) at rows other than its own;
    // the Gather itself (reading exp's result from memory) joins the LayerNorm.
    let mut g = ComputeGraph::new("gather_of_computed");
    let x = g.add_input("x", F, [4, 16]).unwrap();
    let idx = g.add_input("idx", DType::I64, [4]).unwrap();
    let (gamma, beta) = ln_weights(&mut g);
    let e = n1(&mut g, "exp", Op::Exp, &[x]);
    let r = n1(&mut g, "rows", Op::Gather { axis: 0 }, &[e, idx]);
    let y = n1(&mut g, "ln", ln(), &[r, gamma, beta]);
    g.mark_output(y).unwrap();
    let p = fused(&g, FusionCaps::all());
    assert_eq!(names(&g, &p), vec![vec!["exp"], vec!["rows", "ln"]]);
    assert_eq!(verdict(&p, "exp", "rows"), Some(RejectReason::Pattern));
    let d = p.decisions.iter().find(|d| d.producer == "exp" && d.consumer == "rows").unwrap();
    assert!(
        d.detail.contains("'rows' (data movement) would read or feed a value computed in the row kernel"),
        "{}",
        d.detail
    );
    // The kernel reads the 4 gathered rows (64 bytes each), the ids, gamma and beta.
    assert_eq!(cost(&g, &p, 1).bytes_read, (4 * 16 * 4 + 4 * 8 + 2 * 16 * 4) as u64);
}

#[test]
fn data_movement_that_is_no_load_keeps_its_launch() {
    // A Pad computes values (its fill) rather than loading them: it stays a loop kernel of its own.
    let mut g = ComputeGraph::new("pad_ln");
    let x = g.add_input("x", F, [4, 12]).unwrap();
    let (gamma, beta) = ln_weights(&mut g);
    let pad = Op::Pad { pads: vec![0, 2, 0, 2], mode: PadMode::Constant, value: 0.0 };
    let pd = n1(&mut g, "pad", pad, &[x]);
    let y = n1(&mut g, "ln", ln(), &[pd, gamma, beta]);
    g.mark_output(y).unwrap();
    let p = fused(&g, FusionCaps::all());
    assert_eq!(names(&g, &p), vec![vec!["pad"], vec!["ln"]]);
    assert_eq!(verdict(&p, "pad", "ln"), Some(RejectReason::Pattern));
    let d = p.decisions.iter().find(|d| d.producer == "pad").unwrap();
    assert!(d.detail.contains("only Gather, Slice, Expand, Transpose and Concat loads"), "{}", d.detail);
}
