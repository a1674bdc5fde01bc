#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `plan --memory-svg`: the picture parses as XML, has one titled rectangle per pool buffer of the memory pass
//! (same offsets, sizes and live ranges, derived independently from the plan's bindings), no two rectangles share
//! a time and a byte, and the curve's peak is the plan's lower bound.

mod viz_common;

use graph_plan::{run_pipeline, Pass, PlanOptions};
use std::path::Path;
use viz_common::*;

/// Draw `graph` with `streams` and check the picture against the memory pass.
fn check(graph: &Path, streams: usize, name: &str) -> SvgDoc {
    let dir = scratch(name);
    let svg_path = dir.join("pool.svg");
    let s = streams.to_string();
    let report = ok(&cuplan(&[
        "plan",
        graph.to_str().unwrap(),
        "--streams",
        &s,
        "--report",
        "--memory-svg",
        svg_path.to_str().unwrap(),
    ]));
    let report: serde_json::Value = serde_json::from_str(&report).unwrap();
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    let doc = parse_svg(&svg);
    assert_eq!(doc.root, "svg");
    assert!(doc.ids.iter().any(|i| i == "bound-curve"), "no bound curve");
    assert!(doc.ids.iter().any(|i| i == "legend"), "no legend");

    // The memory pass's own buffers, for the same options.
    let g = load(graph);
    let opts = PlanOptions::with_streams(streams);
    let mem = run_pipeline(&g, &opts, Some(Pass::Memory)).unwrap().memory.unwrap();
    let mut want: Vec<(u64, u64, u64, u64)> =
        mem.buffers.iter().map(|b| (b.live.start as u64, b.live.end as u64, b.offset, b.size)).collect();
    let mut got: Vec<(u64, u64, u64, u64)> = doc.rects.iter().map(|r| (r.start, r.end, r.offset, r.size)).collect();
    want.sort_unstable();
    got.sort_unstable();
    assert_eq!(got, want, "{name}: rectangles differ from the memory pass's buffers");

    // Every rectangle is titled with its tensor's name and size, inside the pool, and none overlap.
    let pool = report["pool_bytes"].as_u64().unwrap();
    for r in &doc.rects {
        assert!(r.title.contains(" at pool ["), "{name}: title {:?}", r.title);
        assert!(r.title.contains("live over steps ["), "{name}: title {:?}", r.title);
        assert!(r.offset + r.size <= pool, "{name}: rect past the pool end: {r:?}");
    }
    let clashes = overlapping(&doc.rects);
    assert!(clashes.is_empty(), "{name}: overlapping rects {:?}", &clashes[..clashes.len().min(3)]);

    // The curve's peak, recomputed from the rectangles, is the plan's fixed-order lower bound.
    let mut peak = 0u64;
    for r in &doc.rects {
        let live: u64 = doc.rects.iter().filter(|q| q.start <= r.start && r.start < q.end).map(|q| q.size).sum();
        peak = peak.max(live);
    }
    assert_eq!(peak, report["lower_bound_bytes"].as_u64().unwrap(), "{name}: peak live bytes");
    doc
}

#[test]
fn examples_draw_one_rect_per_pool_buffer() {
    for ex in ["mlp", "transformer_block", "residual_block"] {
        for streams in [1, 3] {
            let p = workspace().join(format!("examples/{ex}.json"));
            let doc = check(&p, streams, &format!("{ex}-{streams}"));
            assert!(!doc.rects.is_empty(), "{ex}: an empty pool");
        }
    }
}

#[test]
fn mlp_titles_name_the_tensors() {
    let doc = check(&workspace().join("examples/mlp.json"), 1, "mlp-titles");
    // mlp: each layer is one kernel (MatMul, bias and Relu fused), so only the two activations between layers
    // live in the pool (the last layer writes the output).
    let mut names: Vec<String> = doc.rects.iter().map(|r| r.title.lines().next().unwrap().to_string()).collect();
    names.sort();
    assert_eq!(names, ["l0.relu", "l1.relu"], "{names:?}");
    for r in &doc.rects {
        assert!(r.title.contains("2.00 KiB (2048 B; 2048 B reserved)"), "{:?}", r.title);
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 10, ..Default::default() })]
    /// Random DAGs, any stream count, reuse on or off: the picture always matches the memory pass.
    #[test]
    fn random_dags_match_the_memory_pass(n in 2usize..60, fan_in in 1usize..4, seed in 0u64..1000, streams in 1usize..5) {
        let g = graph_ir::synth::random_dag(n, fan_in, seed).unwrap();
        let dir = scratch(&format!("rdag-{seed}-{n}"));
        let p = dir.join("g.json");
        std::fs::write(&p, g.to_json()).unwrap();
        check(&p, streams, &format!("rdag-{seed}-{n}-plan"));
    }
}

#[test]
fn an_in_place_handover_ends_where_its_successor_starts() {
    // The case the proptest found: at 2 streams a kernel reads a buffer for the last time and writes its
    // successor over the same bytes; the picture used to keep the first one live through that step.
    let g = graph_ir::synth::random_dag(35, 2, 436).unwrap();
    let dir = scratch("rdag-436-35");
    let p = dir.join("g.json");
    std::fs::write(&p, g.to_json()).unwrap();
    for streams in 1..5 {
        check(&p, streams, &format!("rdag-436-35-{streams}"));
    }
}

#[test]
fn shared_models_draw_without_overlap() {
    for m in ["resnet50", "bert_base", "mobilenet_v2", "googlenet"] {
        let Some(p) = model(m) else { continue };
        let doc = check(&p, 4, m);
        // `check` matched every rect to a pool buffer; fused and in-place plans still hold dozens.
        assert!(doc.rects.len() >= 40, "{m}: only {} rects", doc.rects.len());
    }
}

#[test]
fn no_reuse_stacks_every_buffer() {
    // Without reuse the pool is the naive sum: rectangles stack, and the pool line sits below the bound line.
    let dir = scratch("noreuse");
    let svg = dir.join("p.svg");
    ok(&cuplan(&["plan", "examples/transformer_block.json", "--no-reuse", "--memory-svg", svg.to_str().unwrap()]));
    let text = std::fs::read_to_string(&svg).unwrap();
    let doc = parse_svg(&text);
    assert!(overlapping(&doc.rects).is_empty());
    let total: u64 = doc.rects.iter().map(|r| r.size).sum();
    let end = doc.rects.iter().map(|r| r.offset + r.size).max().unwrap();
    assert_eq!(total, end, "no-reuse rectangles should tile the pool exactly");
    assert!(text.contains(">bound "), "the bound line is labelled separately when pool > bound");
}

#[test]
fn unwritable_svg_path_is_a_user_error() {
    let o = cuplan(&["plan", "examples/mlp.json", "--memory-svg", "/nonexistent-dir/x.svg"]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.starts_with("error: --memory-svg: cannot write '/nonexistent-dir/x.svg'"), "{err}");
    assert_eq!(err.lines().count(), 1);
}

#[test]
fn hostile_names_stay_well_formed() {
    use graph_ir::{ComputeGraph, DType, Op};
    let mut g = ComputeGraph::new("names <&> \"q\" 'a'");
    let x = g.add_input("x", DType::F32, [16, 16]).unwrap();
    let a = g.add_node("a<b>&amp;\"c\"", Op::Relu, &[x]).unwrap()[0];
    let b = g.add_node("]]> <!-- \\ '", Op::Neg, &[a]).unwrap()[0];
    let c = g.add_node("ctl\u{1}\u{7f}é…", Op::Abs, &[b]).unwrap()[0];
    let d = g.add_node("out", Op::Exp, &[c]).unwrap()[0];
    g.mark_output(d).unwrap();
    let dir = scratch("names");
    let gp = dir.join("g.json");
    std::fs::write(&gp, g.to_json()).unwrap();
    let svg = dir.join("p.svg");
    ok(&cuplan(&["plan", gp.to_str().unwrap(), "--no-fusion", "--memory-svg", svg.to_str().unwrap()]));
    let doc = parse_svg(&std::fs::read_to_string(&svg).unwrap());
    let mut names: Vec<String> = doc.rects.iter().map(|r| r.title.lines().next().unwrap().to_string()).collect();
    names.sort();
    // The XML parser gives back the names exactly, except the control character XML 1.0 cannot carry.
    let mut want = vec!["a<b>&amp;\"c\"".to_string(), "]]> <!-- \\ '".to_string(), "ctl?\u{7f}é…".to_string()];
    want.sort();
    assert_eq!(names, want);
}
