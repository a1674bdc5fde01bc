#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The command line as a user sees it: exit codes, one-line errors, the README's commands.

use std::io::Write;
use std::process::{Command, Output, Stdio};

fn cuplan(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cuplan")).args(args).current_dir(workspace()).output().unwrap()
}

fn workspace() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn examples_validate() {
    for ex in ["examples/mlp.json", "examples/transformer_block.json", "examples/residual_block.json"] {
        let o = cuplan(&["validate", ex]);
        assert!(o.status.success(), "{ex}: {}", stderr(&o));
        assert!(stdout(&o).contains(": valid"), "{}", stdout(&o));
    }
}

#[test]
fn readme_main_command_reports_figures() {
    let o = cuplan(&["plan", "examples/transformer_block.json", "--streams", "4", "--report"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    for key in [
        "nodes",
        "tensors",
        "kernel_count_original",
        "kernel_count_fused",
        "pool_bytes",
        "naive_bytes",
        "lower_bound_bytes",
        "num_streams",
        "event_count",
        "events_before_reduction",
        "makespan_us",
        "makespan_bound_us",
        "critical_path_us",
        "one_stream_us",
        "speedup_vs_one_stream",
        "total_steps",
        "compile_ms",
        "pass_ms",
    ] {
        assert!(v.get(key).is_some(), "missing {key} in {v}");
    }
    assert!(v["pool_bytes"].as_u64().unwrap() >= v["lower_bound_bytes"].as_u64().unwrap());
    // The timing figures are consistent: bound <= makespan <= one stream, and the reduction never adds events.
    let f = |k: &str| v[k].as_f64().unwrap();
    assert!(f("makespan_us") + 1e-3 >= f("makespan_bound_us"), "{v}");
    assert!(f("makespan_us") <= f("one_stream_us") + 1e-3, "{v}");
    assert!(f("makespan_bound_us") + 1e-3 >= f("critical_path_us"), "{v}");
    assert!(v["event_count"].as_u64().unwrap() <= v["events_before_reduction"].as_u64().unwrap());
}

#[test]
fn synth_pipes_into_validate() {
    let synth = cuplan(&["synth", "transformer", "--layers", "12"]);
    assert!(synth.status.success());
    let mut child = Command::new(env!("CARGO_BIN_EXE_cuplan"))
        .args(["validate", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(&synth.stdout).unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("graph 'transformer_12l_256h': valid"));
}

fn write_tmp(name: &str, text: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("cuplan-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn malformed_files_exit_1_with_one_line() {
    let good = std::fs::read_to_string(workspace().join("examples/mlp.json")).unwrap();
    let cases: Vec<(&str, String, &str)> = vec![
        ("truncated.json", good[..good.len() / 3].to_string(), "JSON error"),
        ("unknown_op.json", good.replacen("\"MatMul\"", "\"Frobnicate\"", 1), "Frobnicate"),
        ("negative.json", good.replacen("\"shape\": [\n        4,", "\"shape\": [\n        -4,", 1), "extent -4"),
        ("wrong_format.json", "{\"format\": \"onnx\"}".to_string(), "not a cuplan graph"),
        (
            "cycle.json",
            r#"{"format": "cuplan-graph", "version": 1, "name": "c",
            "inputs": [{"name": "x", "dtype": "f32", "shape": [2]}],
            "nodes": [{"name": "a", "op": "Add", "inputs": ["x", "b"]}, {"name": "b", "op": "Relu", "inputs": ["a"]}],
            "outputs": ["b"]}"#
                .to_string(),
            "cycle",
        ),
    ];
    for (name, text, needle) in cases {
        let p = write_tmp(name, &text);
        let o = cuplan(&["validate", p.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(1), "{name}: {}", stderr(&o));
        let err = stderr(&o);
        assert_eq!(err.trim_end().lines().count(), 1, "{name}: {err}");
        assert!(err.contains(needle), "{name}: {err}");
    }
    let o = cuplan(&["validate", "does/not/exist.json"]);
    assert_eq!(o.status.code(), Some(1));
}

#[test]
fn usage_errors_exit_2_and_bad_options_exit_1() {
    assert_eq!(cuplan(&["plan"]).status.code(), Some(2));
    assert_eq!(cuplan(&["frobnicate"]).status.code(), Some(2));
    let o = cuplan(&["plan", "examples/mlp.json", "--streams", "0"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("max_streams"));
    let o = cuplan(&["plan", "examples/mlp.json", "--streams", "1000000000"]);
    assert_eq!(o.status.code(), Some(1));
    let o = cuplan(&["plan", "examples/mlp.json", "--device", "tpu"]);
    assert_eq!(o.status.code(), Some(1));
}

#[test]
fn plan_formats() {
    let o = cuplan(&["plan", "examples/mlp.json", "--format", "json"]);
    assert!(o.status.success());
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert!(v["steps"].as_array().is_some_and(|s| !s.is_empty()));
    let o = cuplan(&["plan", "examples/mlp.json"]);
    assert!(stdout(&o).starts_with("plan 'mlp_3x128'"));
}

#[test]
fn run_checks_and_writes_outputs() {
    let dir = std::env::temp_dir().join(format!("cuplan-run-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("out.safetensors");
    let trace = dir.join("trace.json");
    let o = cuplan(&[
        "run",
        "examples/transformer_block.json",
        "--streams",
        "4",
        "--schedule",
        "random",
        "--seed",
        "5",
        "--check",
        "--output",
        out.to_str().unwrap(),
        "--trace",
        trace.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("ok   l0.residual2"), "{}", stdout(&o));
    let bytes = std::fs::read(&out).unwrap();
    // safetensors: 8-byte header length, then a JSON header naming the output.
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = std::str::from_utf8(&bytes[8..8 + n]).unwrap();
    assert!(header.contains("\"l0.residual2\"") && header.contains("[1,32,128]"), "{header}");
    let t: serde_json::Value = serde_json::from_slice(&std::fs::read(&trace).unwrap()).unwrap();
    assert!(t["traceEvents"].as_array().is_some_and(|e| !e.is_empty()));
    // Feeding the outputs file back as inputs names the offending tensor.
    let o = cuplan(&["run", "examples/transformer_block.json", "--inputs", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("'l0.residual2' is a graph output"), "{}", stderr(&o));
}

#[test]
fn stop_after_prints_each_pass_up_to_the_named_one() {
    let o = cuplan(&["plan", "examples/transformer_block.json", "--streams", "2", "--stop-after", "memory"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["stopped_after"], "memory");
    assert!(v["topo"].as_array().is_some_and(|t| !t.is_empty()));
    assert!(v["fusion"]["groups"].as_array().is_some_and(|g| !g.is_empty()));
    assert!(v["memory"]["lower_bound_bytes"].as_u64().is_some_and(|b| b > 0));
    assert!(v["stream"].is_null(), "the stream pass ran after memory");
    let passes: Vec<&str> = v["pass_ms"].as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(passes.len(), 4, "{passes:?}");
    for p in ["topo", "fusion", "groups", "memory"] {
        assert!(passes.contains(&p), "{passes:?}");
    }
    let o = cuplan(&["plan", "examples/transformer_block.json", "--stop-after", "liveness"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("unknown pass") && stderr(&o).contains("liveness"), "{}", stderr(&o));
    let o = cuplan(&["plan", "examples/transformer_block.json", "--stop-after", "emit"]);
    assert_eq!(o.status.code(), Some(1));
}
