#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `explain`: golden output for small graphs (rewritten only with `CUPLAN_BLESS=1`), the 120-column limit, the
//! JSON object against the plan, markdown table shape; `plan --explain-fusion`; per-pass timings at `-v`.

mod viz_common;

use graph_ir::{ComputeGraph, DType, Op};
use graph_plan::{ExecutionPlan, PlanOptions, PlanStep};
use std::path::Path;
use viz_common::*;

/// Compare `actual` with the golden file `name`, or rewrite it when `CUPLAN_BLESS=1`.
fn golden(name: &str, actual: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(name);
    if std::env::var("CUPLAN_BLESS").is_ok_and(|v| v == "1") {
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|_| panic!("missing golden file {}: run with CUPLAN_BLESS=1", path.display()));
    if want != actual {
        let first = want.lines().zip(actual.lines()).position(|(a, b)| a != b);
        panic!(
            "{name} differs from its golden file (first differing line: {first:?}); if the change is intended, rerun \
             with CUPLAN_BLESS=1 and review the diff\n--- actual ---\n{actual}"
        );
    }
}

#[test]
fn golden_mlp() {
    golden("explain_mlp.txt", &ok(&cuplan(&["explain", "examples/mlp.json"])));
    golden("explain_mlp.md", &ok(&cuplan(&["explain", "examples/mlp.json", "--format", "markdown"])));
    golden("explain_mlp.json", &ok(&cuplan(&["explain", "examples/mlp.json", "--format", "json"])));
}

#[test]
fn golden_diamond_on_two_streams() {
    // Two branches of a hand-made graph; without reuse (and without fusion, which makes the diamond one chain of
    // kernels) the branches run on two streams joined by events.
    let g = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/diamond.json");
    let g = g.to_str().unwrap();
    golden("explain_diamond_s2.txt", &ok(&cuplan(&["explain", g, "--streams", "2", "--no-reuse", "--no-fusion"])));
}

fn max_width(text: &str) -> usize {
    text.lines().map(|l| l.chars().count()).max().unwrap_or(0)
}

/// A graph whose fused kernels have long names: chains of elementwise ops named like ONNX exports.
fn long_names(dir: &Path) -> std::path::PathBuf {
    let mut g = ComputeGraph::new("long-names");
    let x = g.add_input("x", DType::F32, [64, 64]).unwrap();
    let w = g.add_weight("w", DType::F32, [64, 64]).unwrap();
    let mut t = x;
    for layer in 0..3 {
        t = g.add_node(&format!("/encoder/layer.{layer}/attention/output/dense/MatMul"), Op::MatMul, &[t, w]).unwrap()
            [0];
        for (i, op) in [Op::Relu, Op::Neg, Op::Abs, Op::Exp, Op::Neg, Op::Relu].into_iter().enumerate() {
            let name = format!("/encoder/layer.{layer}/intermediate/intermediate_act_fn/elementwise_{i}/{op:?}");
            t = g.add_node(&name, op, &[t]).unwrap()[0];
        }
    }
    g.mark_output(t).unwrap();
    let p = dir.join("long.json");
    std::fs::write(&p, g.to_json()).unwrap();
    p
}

#[test]
fn text_fits_120_columns() {
    let dir = scratch("width");
    let long = long_names(&dir);
    let text = ok(&cuplan(&["explain", long.to_str().unwrap()]));
    assert!(max_width(&text) <= 120, "{}", text);
    assert!(text.contains('…'), "long fused names should be abbreviated:\n{text}");
    // The abbreviation keeps the first and last node with the count between.
    assert!(text.contains(" + …5 + "), "{text}");
    for m in ["bert_base", "resnet50"] {
        let Some(p) = model(m) else { continue };
        let text = ok(&cuplan(&["explain", p.to_str().unwrap(), "--streams", "4"]));
        assert!(max_width(&text) <= 120, "{m}: a line of {} columns", max_width(&text));
    }
}

#[test]
fn json_matches_the_plan() {
    for (ex, streams) in [("transformer_block", 1), ("residual_block", 3), ("mlp", 2)] {
        let path = workspace().join(format!("examples/{ex}.json"));
        let s = streams.to_string();
        let v: serde_json::Value = serde_json::from_str(&ok(&cuplan(&[
            "explain",
            path.to_str().unwrap(),
            "--streams",
            &s,
            "--format",
            "json",
        ])))
        .unwrap();
        let plan = ExecutionPlan::build_with(&load(&path), &PlanOptions::with_streams(streams)).unwrap();
        let steps = v["steps"].as_array().unwrap();
        assert_eq!(steps.len(), plan.total_steps(), "{ex}");
        for (i, (row, step)) in steps.iter().zip(&plan.steps).enumerate() {
            assert_eq!(row["step"].as_u64().unwrap() as usize, i);
            assert_eq!(row["stream"].as_str().unwrap(), step.stream().to_string());
            if let PlanStep::Launch { kernel, .. } = step {
                let k = plan.kernel(*kernel).unwrap();
                assert_eq!(row["id"].as_str().unwrap(), kernel.to_string());
                assert_eq!(row["bytes_read"].as_u64().unwrap(), k.cost.bytes_read);
                assert_eq!(row["bytes_written"].as_u64().unwrap(), k.cost.bytes_written);
                // serde_json's default float parsing may differ in the last bit.
                let t = row["time_us"].as_f64().unwrap();
                assert!((t - k.estimate.time_us).abs() <= 1e-12 * t.abs().max(1.0), "{t} vs {}", k.estimate.time_us);
                let names: Vec<&str> = row["nodes"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()).collect();
                assert_eq!(names, k.node_names().collect::<Vec<_>>());
                let (s, e) = (row["start_us"].as_f64().unwrap(), row["end_us"].as_f64().unwrap());
                assert!(s >= 0.0 && e >= s + k.estimate.time_us - 1e-9, "{ex} step {i}: [{s}, {e})");
            }
        }
        let sum = &v["summary"];
        assert_eq!(sum["pool_bytes"].as_u64().unwrap(), plan.pool_bytes as u64);
        assert_eq!(sum["lower_bound_bytes"].as_u64().unwrap(), plan.stats().lower_bound_bytes);
        assert_eq!(sum["naive_bytes"].as_u64().unwrap(), plan.stats().naive_bytes);
        assert_eq!(sum["launches_before"].as_u64().unwrap() as usize, plan.kernel_count_original);
        assert_eq!(sum["launches_after"].as_u64().unwrap() as usize, plan.kernel_count_fused);
        assert_eq!(sum["events"].as_u64().unwrap() as usize, plan.event_count);
        let (m, b) = (sum["makespan_us"].as_f64().unwrap(), sum["makespan_bound_us"].as_f64().unwrap());
        assert!(m >= b - 1e-9 && b > 0.0, "{ex}: makespan {m} below its bound {b}");
        let last_end = steps.iter().filter_map(|r| r["end_us"].as_f64()).fold(0.0, f64::max);
        assert!((last_end - m).abs() < 1e-9, "{ex}: makespan {m} is not the last end {last_end}");
        let f = &v["fusion"];
        let rejected = f["rejected"].as_array().unwrap().len() as u64;
        assert_eq!(f["fused"].as_u64().unwrap() + rejected, f["candidates"].as_u64().unwrap());
        let by: u64 = f["rejected_by_reason"].as_object().unwrap().values().map(|n| n.as_u64().unwrap()).sum();
        assert_eq!(by, rejected);
    }
}

/// Cells of a markdown row (escaped pipes stay inside cells).
fn md_cells(line: &str) -> usize {
    let inner = line.strip_prefix('|').and_then(|l| l.strip_suffix('|')).unwrap();
    inner.replace("\\|", "").split('|').count()
}

#[test]
fn markdown_tables_are_rectangular() {
    let dir = scratch("md");
    let long = long_names(&dir);
    for g in [workspace().join("examples/transformer_block.json"), long] {
        let md = ok(&cuplan(&["explain", g.to_str().unwrap(), "--format", "markdown", "--streams", "2"]));
        let mut table: Vec<&str> = Vec::new();
        let mut tables = 0;
        for line in md.lines().chain([""]) {
            if line.starts_with('|') {
                table.push(line);
            } else if !table.is_empty() {
                let n = md_cells(table[0]);
                assert!(table.len() >= 3, "a table without rows");
                assert!(table[1].contains("---"), "no header rule: {}", table[1]);
                for l in &table {
                    assert_eq!(md_cells(l), n, "ragged row: {l}");
                }
                tables += 1;
                table.clear();
            }
        }
        assert!(tables >= 1);
        assert!(md.contains("### Summary") && md.contains("### Fusion"));
    }
}

#[test]
fn plan_explain_fusion_text_and_json() {
    let text = ok(&cuplan(&["plan", "examples/mlp.json", "--explain-fusion"]));
    assert!(text.starts_with("plan 'mlp_3x128'"), "{text}");
    assert!(text.contains("fusion of 'mlp_3x128': 8 ops -> 3 kernels"), "{text}");
    assert!(text.contains("  g0 anchor: l0.matmul(MatMul) l0.bias(Add) l0.relu(Relu)"), "{text}");
    assert!(text.contains("  l0.relu -> l1.matmul [Pattern]"), "{text}");
    let o = cuplan(&["plan", "examples/mlp.json", "--explain-fusion", "--format", "json"]);
    let v: serde_json::Value = serde_json::from_str(&ok(&o)).unwrap();
    assert!(v.get("steps").is_some());
    assert!(String::from_utf8_lossy(&o.stderr).contains("rejected (Pattern 2):"));
}

#[test]
fn verbose_shows_per_pass_timings_and_quiet_shows_nothing() {
    let o = cuplan(&["-v", "plan", "examples/mlp.json"]);
    let err = String::from_utf8_lossy(&o.stderr);
    for pass in graph_plan::Pass::ALL.map(graph_plan::Pass::name) {
        let line = err
            .lines()
            .find(|l| l.contains(&format!("pass{{name=\"{pass}\"}}")) && l.contains("close"))
            .unwrap_or_else(|| panic!("no timing line for {pass} in:\n{err}"));
        assert!(line.contains("time.busy="), "{line}");
    }
    assert!(!err.contains('\u{1b}'), "colour codes on a non-terminal stderr");
    let quiet = cuplan(&["plan", "examples/mlp.json"]);
    assert!(quiet.stderr.is_empty(), "{}", String::from_utf8_lossy(&quiet.stderr));
}

#[test]
fn explain_errors_are_one_line() {
    let o = cuplan(&["explain", "examples/missing.json"]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(String::from_utf8_lossy(&o.stderr).lines().count(), 1);
    let o = cuplan(&["explain", "examples/mlp.json", "--format", "yaml"]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn explain_names_every_node_of_the_half_plan_with_its_rule() {
    // The transform keeps its rules per node position; explain names them from the rewritten graph. The MLP's
    // first MatMul reads the f32 input (kept f32); the Add after it reads that f32 product and stores the half
    // the next MatMul reads, and the last Add reads the half product and stores the f32 graph output: both are
    // mixed-precision nodes (computing in f32), so the graph has no cast.
    let out = ok(&cuplan(&["explain", "examples/mlp.json", "--precision", "fp16", "--format", "json"]));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let p = &v["precision"];
    assert_eq!(p["precision"], "fp16");
    let nodes = p["nodes"].as_array().unwrap();
    let row = |i: usize| {
        let n = &nodes[i];
        (
            n["node"].as_str().unwrap(),
            n["op"].as_str().unwrap(),
            n["dtype"].as_str().unwrap(),
            n["store"].as_str().unwrap_or("-"),
            n["rule"]["rule"].as_str().unwrap(),
        )
    };
    assert_eq!(nodes.len(), 8);
    assert_eq!(row(0), ("l0.matmul", "MatMul", "f32", "-", "anchor_reads_f32"));
    assert_eq!(nodes[0]["rule"]["tensor"], "x");
    assert_eq!(row(1), ("l0.bias", "Add", "f32", "f16", "default"));
    assert_eq!(row(2), ("l0.relu", "Relu", "f16", "-", "default"));
    assert_eq!(row(6), ("l2.matmul", "MatMul", "f16", "-", "default"));
    assert_eq!(row(7), ("l2.bias", "Add", "f32", "f32", "default"));
    let text = ok(&cuplan(&["explain", "examples/mlp.json", "--precision", "fp16"]));
    assert!(text.contains("l0.bias Add f32 (stores f16) [policy default]"), "{text}");
    // The counts agree with the listed dtypes.
    let f16 = (0..nodes.len()).filter(|&i| row(i).2 == "f16").count();
    assert_eq!(p["counts"], serde_json::json!([["f16", f16], ["f32", nodes.len() - f16]]));
}
