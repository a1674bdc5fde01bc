//! onnxruntime beside cuplan: the node counts models/README.md records, and, where the Python
//! package is installed, onnxruntime's session-creation time (ORT_ENABLE_ALL, CPU) measured in the same run
//! as cuplan's compile time.

use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

/// One row of the README's model table.
#[derive(Clone, Debug, PartialEq)]
pub struct ReadmeRow {
    /// Model name (file stem).
    pub model: String,
    /// ONNX nodes in the file.
    pub nodes: Option<usize>,
    /// Nodes after onnxruntime's ENABLE_ALL optimisations.
    pub ort_nodes: usize,
    /// The README's fixed-order lower bound of the intermediates, MiB.
    pub lower_bound_mib: Option<f64>,
}

fn cells(line: &str) -> Option<Vec<String>> {
    let t = line.trim();
    let inner = t.strip_prefix('|')?;
    let inner = inner.strip_suffix('|').unwrap_or(inner);
    Some(inner.split('|').map(|c| c.trim().to_string()).collect())
}

/// Parse the model table of `models/README.md`: the first Markdown table whose header has a `model`
/// column and a column naming onnxruntime. Other columns are found by header (`nodes`, `lower bound`), so
/// reordering them does not break the report.
pub fn parse_readme(text: &str) -> Result<Vec<ReadmeRow>> {
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let Some(head) = cells(line) else { continue };
        let lower: Vec<String> = head.iter().map(|h| h.to_ascii_lowercase()).collect();
        let Some(model_col) = lower.iter().position(|h| h == "model") else { continue };
        let Some(ort_col) = lower.iter().position(|h| h.contains("onnxruntime")) else { continue };
        let nodes_col = lower.iter().position(|h| h == "nodes");
        let lb_col = lower.iter().position(|h| h.contains("lower bound"));
        // The separator row.
        match lines.next().and_then(cells) {
            Some(sep) if sep.iter().all(|c| !c.is_empty() && c.chars().all(|ch| matches!(ch, '-' | ':'))) => {}
            _ => bail!("the table headed {line:?} has no separator row"),
        }
        let mut rows = Vec::new();
        while let Some(row) = lines.peek().and_then(|l| cells(l)) {
            lines.next();
            let get = |c: usize| row.get(c).map(String::as_str).unwrap_or("");
            let model = get(model_col).to_string();
            let ort_nodes = get(ort_col)
                .replace(',', "")
                .parse()
                .with_context(|| format!("model {model:?}: onnxruntime nodes {:?} is not a count", get(ort_col)))?;
            rows.push(ReadmeRow {
                nodes: nodes_col.and_then(|c| get(c).replace(',', "").parse().ok()),
                lower_bound_mib: lb_col.and_then(|c| get(c).parse().ok()),
                model,
                ort_nodes,
            });
        }
        return Ok(rows);
    }
    bail!("no table with `model` and `onnxruntime` columns")
}

/// onnxruntime's figures for one model, measured here.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct OrtMeasured {
    /// Session-creation times, process CPU milliseconds, one per repetition.
    pub session_ms: Vec<f64>,
    /// The same, wall milliseconds.
    pub session_wall_ms: Vec<f64>,
    /// Nodes of the optimised model onnxruntime writes out.
    pub optimized_nodes: Option<usize>,
}

/// What the onnxruntime run gave.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct OrtRun {
    /// onnxruntime's version.
    pub version: String,
    /// Per model.
    pub models: BTreeMap<String, OrtMeasured>,
}

/// The Python side. Stripped weights are filled as `xtask/python/ort_check.py` fills them (onnxruntime will not create a
/// session over initializers without data); the filled model is serialised once, and only
/// `InferenceSession(bytes)` is timed. One intra-op thread, as cuplan's compile uses one core.
const ORT_SCRIPT: &str = r#"
import json, os, sys, tempfile, time
tools, models_dir, reps = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.path.insert(0, tools)
import numpy as np
import onnx
import onnxruntime as ort
from ort_check import fill_weights

def options():
    o = ort.SessionOptions()
    o.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    o.intra_op_num_threads = 1
    o.inter_op_num_threads = 1
    o.log_severity_level = 3
    return o

out = {"version": ort.__version__, "models": {}}
for name in sys.argv[4:]:
    path = os.path.join(models_dir, name + ".onnx")
    if not os.path.exists(path):
        continue
    model = onnx.load(path)
    fill_weights(model, np.random.default_rng(0))
    data = model.SerializeToString()
    del model
    times, wall = [], []
    for _ in range(reps):
        c0, t0 = time.process_time(), time.perf_counter()
        s = ort.InferenceSession(data, options(), providers=["CPUExecutionProvider"])
        times.append((time.process_time() - c0) * 1e3)
        wall.append((time.perf_counter() - t0) * 1e3)
        del s
    nodes = None
    with tempfile.TemporaryDirectory() as d:
        o = options()
        o.optimized_model_filepath = os.path.join(d, "opt.onnx")
        ort.InferenceSession(data, o, providers=["CPUExecutionProvider"])
        nodes = len(onnx.load(o.optimized_model_filepath, load_external_data=False).graph.node)
    out["models"][name] = {"session_ms": times, "session_wall_ms": wall, "optimized_nodes": nodes}
print(json.dumps(out))
"#;

/// Why onnxruntime could not be measured, or `None` when `python3 -c "import onnxruntime"` works.
pub fn unavailable() -> Option<String> {
    match Command::new("python3").args(["-c", "import onnxruntime, onnx, numpy"]).output() {
        Err(e) => Some(format!("python3 not runnable: {e}")),
        Ok(o) if !o.status.success() => Some(format!(
            "python3 cannot import onnxruntime/onnx/numpy (`cargo xtask ort-check` sets up target/ort-venv; run with its python3 first on PATH): {}",
            String::from_utf8_lossy(&o.stderr).lines().last().unwrap_or("").trim()
        )),
        Ok(_) => None,
    }
}

/// Time onnxruntime's session creation for `models` (those present in `models_dir`), `reps` times each.
pub fn measure(models_dir: &Path, models: &[&str], reps: usize, scratch: &Path) -> Result<OrtRun> {
    let script = scratch.join("ort_session.py");
    std::fs::write(&script, ORT_SCRIPT).with_context(|| format!("writing {}", script.display()))?;
    let out = Command::new("python3")
        .arg(&script)
        .arg(cuplan_benches::workspace_root().join("xtask").join("python"))
        .arg(models_dir)
        .arg(reps.to_string())
        .args(models)
        .output()
        .context("running python3")?;
    if !out.status.success() {
        bail!("onnxruntime script failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().rev().find(|l| l.trim_start().starts_with('{')).context("no JSON from the script")?;
    parse_ort_json(line)
}

/// Parse the script's JSON line.
pub fn parse_ort_json(line: &str) -> Result<OrtRun> {
    let v: serde_json::Value = serde_json::from_str(line).context("onnxruntime script output")?;
    let mut run = OrtRun { version: v["version"].as_str().unwrap_or("?").to_string(), models: BTreeMap::new() };
    if let Some(models) = v["models"].as_object() {
        for (name, m) in models {
            let list = |k: &str| -> Vec<f64> {
                m[k].as_array().map(|a| a.iter().filter_map(|x| x.as_f64()).collect()).unwrap_or_default()
            };
            run.models.insert(
                name.clone(),
                OrtMeasured {
                    session_ms: list("session_ms"),
                    session_wall_ms: list("session_wall_ms"),
                    optimized_nodes: m["optimized_nodes"].as_u64().map(|n| n as usize),
                },
            );
        }
    }
    Ok(run)
}

#[cfg(test)]
mod tests {
    use super::*;

    const README: &str = "\
# Real model graphs

Some prose | with a bar.

| model | nodes | intermediates | naive MiB (sum of intermediates) | lower bound MiB (ONNX node order) | onnxruntime ENABLE_ALL nodes |
|---|---|---|---|---|---|
| resnet50 | 122 | 121 | 100.89 | 9.19 | 58 |
| bert_base | 419 | 417 | 267.44 | 4.94 | 449 |

Lower bound: ...
";

    #[test]
    fn readme_counts_are_read_by_column_name() {
        let rows = parse_readme(README).unwrap();
        assert_eq!(
            rows,
            vec![
                ReadmeRow { model: "resnet50".into(), nodes: Some(122), ort_nodes: 58, lower_bound_mib: Some(9.19) },
                ReadmeRow { model: "bert_base".into(), nodes: Some(419), ort_nodes: 449, lower_bound_mib: Some(4.94) },
            ]
        );
    }

    #[test]
    fn readme_columns_may_move_and_separate_thousands() {
        let text = "| onnxruntime nodes | model |\n|:--|--:|\n| 1,058 | big |\n";
        let rows = parse_readme(text).unwrap();
        assert_eq!(rows[0].model, "big");
        assert_eq!(rows[0].ort_nodes, 1058);
        assert_eq!(rows[0].nodes, None);
    }

    #[test]
    fn readme_without_the_table_or_with_bad_counts_is_an_error() {
        assert!(parse_readme("# nothing here\n| a | b |\n|---|---|\n").is_err());
        let bad = "| model | onnxruntime |\n|---|---|\n| m | many |\n";
        let err = parse_readme(bad).unwrap_err();
        assert!(format!("{err:#}").contains("\"m\""), "{err:#}");
        assert!(parse_readme("| model | onnxruntime |\n| m | 3 |\n").is_err());
    }

    #[test]
    fn the_models_readme_parses() {
        let text = std::fs::read_to_string(cuplan_benches::models_dir().join("README.md")).unwrap();
        let rows = parse_readme(&text).unwrap();
        let names: Vec<&str> = rows.iter().map(|r| r.model.as_str()).collect();
        assert_eq!(names, cuplan_benches::SHARED_MODELS);
    }

    #[test]
    fn script_json_round_trip() {
        let run = parse_ort_json(
            r#"{"version": "1.32.0", "models": {"resnet50": {"session_ms": [10.5, 9.5], "session_wall_ms": [11.0], "optimized_nodes": 58}}}"#,
        )
        .unwrap();
        assert_eq!(run.version, "1.32.0");
        assert_eq!(
            run.models["resnet50"],
            OrtMeasured { session_ms: vec![10.5, 9.5], session_wall_ms: vec![11.0], optimized_nodes: Some(58) }
        );
        assert!(parse_ort_json("not json").is_err());
    }
}
