//! Frozen plans: the whole JSON plan of the shared models and the synthetic families, at 1 and 4 streams, with
//! the given order and with `--order memory`, must stay byte-identical unless a change means to alter them.
//!
//! A full plan is up to a megabyte of JSON, so `tests/golden/frozen_plans.txt` keeps, per plan, a 64-bit
//! FNV-1a digest of its canonical JSON (the plan as `ExecutionPlan::to_json` writes it, minus the per-pass
//! milliseconds, which are wall time) beside its headline figures, so a reviewer sees which plans moved and how.
//! On a mismatch the test writes every plan it built to `target/frozen-plans/` for a diff against the same
//! folder made by the previous commit. Rerun with `CUPLAN_BLESS=1` to accept a change after reading that diff.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

use graph_ir::{synth, ComputeGraph};
use graph_plan::{ExecutionPlan, OrderStrategy, PlanOptions};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3))
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The real models: the repository's `models/` when present, else the workspace's shared folder.
fn model_dir() -> Option<PathBuf> {
    [repo().join("models"), repo().join("../shared/models")].into_iter().find(|d| d.join("resnet50.onnx").is_file())
}

fn graphs() -> Vec<(String, ComputeGraph)> {
    let mut out = vec![
        ("chain".to_string(), synth::chain(200).unwrap()),
        ("mlp".to_string(), synth::mlp(2, 256, 1).unwrap()),
        ("transformer".to_string(), synth::transformer(2, 256, 4, 128, 1).unwrap()),
        ("resnet_like".to_string(), synth::resnet_like(4, 32, 32).unwrap()),
        ("inception_like".to_string(), synth::inception_like(3, 4).unwrap()),
        ("random_dag".to_string(), synth::random_dag(300, 3, 1).unwrap()),
    ];
    match model_dir() {
        Some(dir) => {
            for m in ["bert_base", "googlenet", "mobilenet_v2", "resnet50"] {
                let path = dir.join(format!("{m}.onnx"));
                let model = graph_onnx::import_file(&path, &graph_onnx::ImportOptions::default()).unwrap();
                out.push((m.to_string(), model.graph));
            }
        }
        None => eprintln!("frozen_plans: no models folder found; checking the synthetic families only"),
    }
    out
}

/// The plan's JSON without the wall-clock pass timings.
fn canonical(plan: &ExecutionPlan) -> String {
    let mut v: serde_json::Value = serde_json::from_str(&plan.to_json()).unwrap();
    if let Some(stats) = v.get_mut("stats").and_then(|s| s.as_object_mut()) {
        stats.remove("pass_ms");
    }
    serde_json::to_string_pretty(&v).unwrap()
}

#[test]
fn plans_are_frozen() {
    let out_dir = repo().join("target/frozen-plans");
    let mut table = String::from("# plan: fnv1a64 of the canonical JSON | pool_bytes kernels events makespan_us\n");
    let mut built = Vec::new();
    for (name, g) in graphs() {
        for streams in [1usize, 4] {
            for (oname, order) in [("given", OrderStrategy::Given), ("memory", OrderStrategy::Memory)] {
                let opts = PlanOptions { order, ..PlanOptions::with_streams(streams) };
                let plan = ExecutionPlan::build_with(&g, &opts).unwrap();
                assert!(graph_plan::verify(&plan).is_ok(), "{name} s{streams} {oname}: plan fails verify");
                let json = canonical(&plan);
                let key = format!("{name}_s{streams}_{oname}");
                writeln!(
                    table,
                    "{key}: {:016x} | {} {} {} {:.3}",
                    fnv1a(json.as_bytes()),
                    plan.pool_bytes,
                    plan.kernel_count_fused,
                    plan.event_count,
                    plan.stats().makespan_us
                )
                .unwrap();
                built.push((key, json));
            }
        }
    }
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/frozen_plans.txt");
    if std::env::var("CUPLAN_BLESS").is_ok_and(|v| v == "1") {
        std::fs::write(&golden, &table).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&golden).unwrap_or_default();
    // Without the models folder only the synthetic families can be compared.
    let missing: Vec<&str> = table.lines().filter(|l| !want.lines().any(|w| w == *l)).collect();
    if !missing.is_empty() {
        std::fs::create_dir_all(&out_dir).unwrap();
        for (key, json) in &built {
            std::fs::write(out_dir.join(format!("{key}.json")), json).unwrap();
        }
        panic!(
            "{} plan(s) differ from tests/golden/frozen_plans.txt (plans written to {}; diff them against the \
             previous commit's, then rerun with CUPLAN_BLESS=1 if the change is meant):\n{}",
            missing.len(),
            out_dir.display(),
            missing.join("\n")
        );
    }
}
