#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The `onnx_import` fuzz target's check (`graph_onnx::fuzz_entry::import`) under proptest with fixed case counts
//! (the CI smoke run when no fuzzer runs), and the fixes the checks led to.

mod common;

use common::*;
use graph_ir::Op;
use graph_onnx::fuzz_entry::import as check_import;
use graph_onnx::proto::{NodeProto, TensorProto};
use proptest::prelude::*;

#[test]
fn non_clamping_infinite_clip_bounds_are_no_bound() {
    // graph-ir rejects infinite Clip bounds (JSON would write them as null and read them back as no bound):
    // the importer turns the ones that do not clamp into no bound, so such models still import.
    let m = imp(
        13,
        vec![NodeProto::new("Clip", "clip", &["x", "lo", "hi"], &["y"])],
        vec![f32v("x", &[2])],
        vec![out("y")],
        vec![TensorProto::f32("lo", &[], &[f32::NEG_INFINITY]), TensorProto::f32("hi", &[], &[6.0])],
    );
    assert_eq!(node(&m, "clip").op, Op::Clip { min: None, max: Some(6.0) });
    let e = try_import(
        13,
        vec![NodeProto::new("Clip", "clip", &["x", "lo"], &["y"])],
        vec![f32v("x", &[2])],
        vec![out("y")],
        vec![TensorProto::f32("lo", &[], &[f32::INFINITY])],
    )
    .unwrap_err();
    assert!(e.to_string().contains("finite"), "{e}");
}

#[test]
fn tiny_model_passes_the_check() {
    check_import(&tiny_model()).unwrap();
    assert!(check_import(&[]).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// The `onnx_import` fuzz target on the tiny model with bits flipped.
    #[test]
    fn bit_flipped_models_pass_the_check(flips in prop::collection::vec((any::<prop::sample::Index>(), 0u8..8), 1..8)) {
        let mut bytes = tiny_model();
        for (i, bit) in flips {
            let k = i.index(bytes.len());
            bytes[k] ^= 1 << bit;
        }
        let _ = check_import(&bytes);
    }

    /// The `onnx_import` fuzz target on arbitrary bytes.
    #[test]
    fn random_bytes_pass_the_check(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = check_import(&bytes);
    }
}
