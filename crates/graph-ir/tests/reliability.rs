#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The fuzz targets' checks (`graph_ir::fuzz_entry`) under proptest with fixed case counts: the CI smoke run of
//! `fuzz/fuzz_targets/json_load.rs` and of the graph generator every planning target starts from. Also the
//! limits that keep hostile documents from exhausting the stack or memory.

use graph_ir::fuzz_entry::{graph_from_bytes, graph_from_bytes_with_stats, json_load, json_roundtrip};
use graph_ir::json::from_json;
use graph_ir::{synth, GraphError};
use proptest::prelude::*;

fn example(name: &str) -> String {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    std::fs::read_to_string(dir.join(name)).unwrap()
}

/// A document with an unknown field `depth` arrays deep.
fn nested(depth: usize) -> String {
    format!(
        r#"{{"format":"cuplan-graph","version":1,"name":"deep","nodes":[],"outputs":[],"extra":{}{}}}"#,
        "[".repeat(depth),
        "]".repeat(depth)
    )
}

#[test]
fn deeply_nested_json_is_an_error_not_a_stack_overflow() {
    // Skipped by the header pass and unknown to the document: an error either way, at any depth.
    for depth in [200, 100_000] {
        let e = from_json(&nested(depth)).unwrap_err();
        assert!(matches!(&e, GraphError::Json { .. }), "{e}");
    }
    // Where the typed document holds untyped values (constant data), serde_json stops at 128 levels;
    // 100 000 levels would overflow the stack of a parser without a limit.
    for depth in [129, 100_000] {
        let doc = format!(
            r#"{{"format":"cuplan-graph","version":1,"name":"deep","constants":[{{"name":"c","dtype":"f32",
            "shape":[1],"data":[{}1{}]}}],"nodes":[],"outputs":[]}}"#,
            "[".repeat(depth),
            "]".repeat(depth)
        );
        let e = from_json(&doc).unwrap_err();
        assert!(matches!(&e, GraphError::Json { message, .. } if message.contains("recursion limit")), "{e}");
    }
}

#[test]
fn float_constants_out_of_range_are_errors_not_infinities() {
    let doc = |dtype: &str, v: &str| {
        format!(
            r#"{{"format":"cuplan-graph","version":1,"name":"g","inputs":[{{"name":"x","dtype":"{dtype}","shape":[1]}}],
            "constants":[{{"name":"c","dtype":"{dtype}","shape":[1],"data":[{v}]}}],
            "nodes":[{{"name":"a","op":"Add","inputs":["x","c"]}}],"outputs":["a"]}}"#
        )
    };
    for (dtype, v) in [("f32", "1e300"), ("f16", "1e5"), ("bf16", "1e39"), ("f32", "-1e39")] {
        let e = from_json(&doc(dtype, v)).unwrap_err();
        assert!(
            matches!(&e, GraphError::ConstantData { tensor, detail } if tensor == "c" && detail.contains("out of range")),
            "{dtype} {v}: {e}"
        );
    }
    // The largest finite values still load, and round trip.
    for (dtype, v) in [("f32", "3.4028234663852886e38"), ("f16", "65504"), ("f32", "1e-50")] {
        let g = from_json(&doc(dtype, v)).unwrap();
        json_roundtrip(&g).unwrap();
    }
}

#[test]
fn non_finite_slopes_and_scales_are_rejected() {
    let mut g = graph_ir::ComputeGraph::new("g");
    let x = g.add_input("x", graph_ir::DType::F32, [2, 2]).unwrap();
    for (op, attr) in [
        (graph_ir::Op::LeakyRelu { alpha: f32::NAN }, "alpha"),
        (graph_ir::Op::HardSigmoid { alpha: 0.2, beta: f32::INFINITY }, "beta"),
        (graph_ir::Op::Gemm { alpha: f32::NAN, beta: 1.0, trans_a: false, trans_b: false }, "alpha"),
    ] {
        let ins: &[graph_ir::TensorId] = if matches!(op, graph_ir::Op::Gemm { .. }) { &[x, x] } else { &[x] };
        let e = g.add_node("n", op, ins).unwrap_err();
        assert!(matches!(&e, GraphError::InvalidAttribute { attr: a, .. } if *a == attr), "{e}");
    }
    // Pad may fill with -inf (before a max); such a graph cannot be saved as JSON, which says so.
    let p = g
        .add_node(
            "p",
            graph_ir::Op::Pad { pads: vec![0, 1, 0, 1], mode: Default::default(), value: f32::NEG_INFINITY },
            &[x],
        )
        .unwrap();
    g.mark_output(p[0]).unwrap();
    assert!(json_roundtrip(&g).unwrap_err().contains("not representable"));
}

#[test]
fn infinite_clip_bounds_are_rejected_since_json_cannot_carry_them() {
    // Before: Clip { min: +inf } saved as `"min": null` and loaded back as no bound at all.
    let mut g = graph_ir::ComputeGraph::new("clip");
    let x = g.add_input("x", graph_ir::DType::F32, [2]).unwrap();
    for (min, max, attr) in [(Some(f32::INFINITY), None, "min"), (None, Some(f32::NEG_INFINITY), "max")] {
        let e = g.add_node("c", graph_ir::Op::Clip { min, max }, &[x]).unwrap_err();
        assert!(matches!(&e, GraphError::InvalidAttribute { attr: a, .. } if *a == attr), "{e}");
    }
    g.add_node("c", graph_ir::Op::Clip { min: Some(-1.0), max: Some(f32::MAX) }, &[x]).unwrap();
}

#[test]
fn rank_and_size_limits_name_the_tensor() {
    let doc = |shape: &str| {
        format!(
            r#"{{"format":"cuplan-graph","version":1,"name":"g","inputs":[{{"name":"x","dtype":"f32","shape":{shape}}}],
            "nodes":[{{"name":"r","op":"Relu","inputs":["x"]}}],"outputs":["r"]}}"#
        )
    };
    let million = format!("[{}]", vec!["1"; 1_000_000].join(","));
    let e = from_json(&doc(&million)).unwrap_err();
    assert!(matches!(&e, GraphError::RankTooLarge { tensor, rank: 1_000_000, .. } if tensor == "x"), "{e}");
    let e = from_json(&doc("[4294967296, 4294967296, 4294967296]")).unwrap_err();
    assert!(matches!(&e, GraphError::SizeOverflow { tensor, .. } if tensor == "x"), "{e}");
    let e = from_json(&doc("[1048576, 1048576, 1048576]")).unwrap_err();
    assert!(matches!(&e, GraphError::LimitExceeded { .. }), "{e}");
    let e = from_json(&doc("[2, -3]")).unwrap_err();
    assert!(matches!(&e, GraphError::InvalidDim { axis: 1, value: -3, .. }), "{e}");
    // A zero extent is an empty tensor, not an error (as in ONNX).
    from_json(&doc("[0, 3]")).unwrap();
}

#[test]
fn extents_above_i64_are_rejected_even_in_empty_tensors() {
    // Before: [0, usize::MAX] has 0 bytes, so it was accepted, and saved as [0, -1], which does not load.
    let mut g = graph_ir::ComputeGraph::new("g");
    let e = g.add_input("x", graph_ir::DType::F32, [0, usize::MAX]).unwrap_err();
    assert!(matches!(&e, GraphError::LimitExceeded { what, .. } if what.contains("'x' extent on axis 1")), "{e}");
    g.add_input("y", graph_ir::DType::F32, [0, i64::MAX as usize]).unwrap();
}

#[test]
fn examples_round_trip() {
    for name in ["mlp.json", "residual_block.json", "transformer_block.json"] {
        json_load(example(name).as_bytes()).unwrap();
    }
    for g in
        [synth::chain(10).unwrap(), synth::transformer(1, 16, 2, 4, 1).unwrap(), synth::random_dag(50, 3, 7).unwrap()]
    {
        json_roundtrip(&g).unwrap();
    }
}

#[test]
fn generator_builds_something_from_typical_bytes() {
    // A fixed pseudo-random recipe must build at least a few nodes: a generator that only ever produces
    // rejected nodes would make every downstream fuzz target vacuous.
    let mut built = 0;
    for seed in 0..64u64 {
        let mut rng = graph_ir::rng::SplitMix64::new(seed);
        let bytes: Vec<u8> = (0..256).map(|_| rng.next_u64() as u8).collect();
        let (g, stats) = graph_from_bytes_with_stats(&bytes);
        built += stats.built;
        if let Ok(g) = g {
            graph_ir::fuzz_entry::assert_valid(&g);
        }
    }
    assert!(built >= 64, "only {built} nodes built from 64 recipes");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// The `json_load` fuzz target on arbitrary bytes.
    #[test]
    fn json_load_never_panics_on_bytes(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = json_load(&bytes);
    }

    /// The `json_load` fuzz target on an example with a few bytes overwritten (mostly still JSON-shaped).
    #[test]
    fn json_load_never_panics_on_mutated_examples(
        which in 0usize..3,
        writes in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
    ) {
        let name = ["mlp.json", "residual_block.json", "transformer_block.json"][which];
        let mut bytes = example(name).into_bytes();
        for (i, v) in writes {
            let k = i.index(bytes.len());
            bytes[k] = v;
        }
        let _ = json_load(&bytes);
    }

    /// Truncation at any point inside the document is an error, never a panic. (Cutting only the trailing
    /// newline leaves a complete document, which loads: the cut falls inside the trimmed text.)
    #[test]
    fn truncated_examples_are_errors(cut in any::<prop::sample::Index>()) {
        let text = example("transformer_block.json");
        let body = text.trim_end();
        let k = cut.index(body.len());
        prop_assert!(json_load(&body.as_bytes()[..k]).is_err());
    }

    /// Generated graphs validate and survive a JSON round trip.
    #[test]
    fn generated_graphs_validate_and_round_trip(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        if let Ok(g) = graph_from_bytes(&bytes) {
            graph_ir::fuzz_entry::assert_valid(&g);
            let _ = json_roundtrip(&g);
        }
    }
}
