#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Golden `Display` listings of plans for three small bundled graphs. A change in the pipeline that changes a plan
//! shows up here as a readable diff; rerun with `CUPLAN_BLESS=1` to accept it after reading that diff.

use graph_ir::ComputeGraph;
use graph_plan::{verify, ExecutionPlan, PlanOptions};
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn example(name: &str) -> ComputeGraph {
    let text = std::fs::read_to_string(root().join("examples").join(format!("{name}.json"))).unwrap();
    graph_ir::json::from_json(&text).unwrap()
}

/// Compare `text` with `tests/golden/NAME`, or write it there when `CUPLAN_BLESS` is set.
fn golden(name: &str, text: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(name);
    if std::env::var("CUPLAN_BLESS").is_ok_and(|v| v == "1") {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run with CUPLAN_BLESS=1 to create it)", path.display()));
    assert!(
        want == text,
        "{name} differs from its golden listing; rerun with CUPLAN_BLESS=1 if the change is intended.\n--- golden\n{want}\n--- now\n{text}"
    );
}

fn check(name: &str, streams: usize) {
    let g = example(name);
    let plan = ExecutionPlan::build_with(&g, &PlanOptions::with_streams(streams)).unwrap();
    verify(&plan).unwrap_or_else(|v| panic!("{name}: {v:?}"));
    golden(&format!("{name}_s{streams}.txt"), &plan.to_string());
}

#[test]
fn mlp_one_stream() {
    check("mlp", 1);
}

#[test]
fn residual_block_two_streams() {
    check("residual_block", 2);
}

#[test]
fn transformer_block_four_streams() {
    check("transformer_block", 4);
}
