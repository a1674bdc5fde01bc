#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `--buckets` and `cuplan buckets` as a user sees them: the set's report, padded runs checked against the
//! exact plan, and every malformed bucket list, request, histogram and budget a one-line error with exit 1.

use std::process::{Command, Output};

fn cuplan(args: &[&str]) -> Output {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    Command::new(env!("CARGO_BIN_EXE_cuplan")).args(args).current_dir(root).output().unwrap()
}

fn out(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

const ATT: &str = "examples/dynamic_attention.json";

#[test]
fn set_report_has_each_member_and_the_shared_figures() {
    let o = cuplan(&["plan", ATT, "--buckets", "batch=1,2,4", "--buckets", "seq=16,32", "--report"]);
    assert!(o.status.success(), "{}", err(&o));
    let v: serde_json::Value = serde_json::from_str(&out(&o)).unwrap();
    let buckets = v["buckets"].as_array().unwrap();
    assert_eq!(buckets.len(), 6);
    let pools: Vec<u64> = buckets.iter().map(|b| b["pool_bytes"].as_u64().unwrap()).collect();
    assert_eq!(v["set_pool_bytes"].as_u64().unwrap(), *pools.iter().max().unwrap());
    assert_eq!(v["sum_pool_bytes"].as_u64().unwrap(), pools.iter().sum::<u64>());
    assert!(v["set_weights_bytes"].as_u64().unwrap() > 0);
    assert_eq!(buckets[5]["dims"], serde_json::json!({"batch": 4, "seq": 32}));
    let seq = v["padding"].as_array().unwrap().iter().find(|p| p["symbol"] == "seq").unwrap();
    assert_eq!(seq["safe"], false);
    assert_eq!(seq["mixing"]["node"], "probs");
    // explain shows the set.
    let o = cuplan(&["explain", ATT, "--buckets", "batch=1,2", "--dim", "seq=8"]);
    assert!(o.status.success(), "{}", err(&o));
    assert!(out(&o).contains("plan set of 'dynamic_attention': 2 members"), "{}", out(&o));
}

#[test]
fn padded_and_chunked_runs_check_against_the_exact_plan() {
    for (dims, chunk) in [(["batch=3", "seq=16"], false), (["batch=9", "seq=32"], true)] {
        let mut args =
            vec!["run", ATT, "--buckets", "batch=1,2,4", "--buckets", "seq=16,32", "--dim", dims[0], "--dim", dims[1]];
        args.extend(["--check", "--schedule", "random", "--streams", "2"]);
        if chunk {
            args.push("--chunk");
        }
        let o = cuplan(&args);
        assert!(o.status.success(), "{dims:?}: {}", err(&o));
        assert!(out(&o).contains("(bitwise equal)"), "{}", out(&o));
    }
}

#[test]
fn bad_buckets_and_requests_exit_1_naming_what_was_wrong() {
    let cases: [(&[&str], &str); 9] = [
        (&["plan", ATT, "--buckets", "batch="], "empty value"),
        (&["plan", ATT, "--buckets", "batch=4,2"], "ascend"),
        (&["plan", ATT, "--buckets", "batch=2,2"], "twice"),
        (&["plan", ATT, "--buckets", "batch=0,2"], "0"),
        (&["plan", ATT, "--buckets", "heads=1,2", "--dim", "batch=1", "--dim", "seq=4"], "heads"),
        (&["plan", ATT, "--buckets", "batch=1,2", "--dim", "batch=2", "--dim", "seq=4"], "fixed"),
        (
            &["run", ATT, "--buckets", "batch=1,2", "--dim", "batch=3", "--dim", "seq=4"],
            "above the largest bucket batch=2",
        ),
        (&["run", ATT, "--buckets", "seq=4,8", "--dim", "batch=1", "--dim", "seq=5"], "'probs'"),
        (&["run", ATT, "--buckets", "batch=1,2", "--dim", "seq=4"], "--dim batch"),
    ];
    for (args, want) in cases {
        let o = cuplan(args);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", err(&o));
        let e = err(&o);
        assert!(e.contains(want), "{args:?}: {e}");
        assert_eq!(e.trim_end().lines().count(), 1, "{e}");
    }
}

#[test]
fn buckets_command_chooses_exactly_and_checks_the_budget() {
    let dir = std::env::temp_dir().join(format!("cuplan-buckets-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let h = dir.join("h.txt");
    std::fs::write(&h, "# size count\n1 10\n7 1\n8 5\n").unwrap();
    let hs = h.to_str().unwrap();
    let o = cuplan(&["buckets", "--histogram", hs, "--max-buckets", "2", "--json"]);
    assert!(o.status.success(), "{}", err(&o));
    let v: serde_json::Value = serde_json::from_str(&out(&o)).unwrap();
    assert_eq!(v["buckets"], serde_json::json!([1, 8]));
    assert_eq!(v["padded_work"].as_f64().unwrap(), 58.0);
    assert_eq!(v["powers_of_two"], serde_json::json!([1, 2, 4, 8]));
    // The budget against the model's largest bucket.
    let model = ["--model", ATT, "--symbol", "batch", "--dim", "seq=16"];
    let mut args = vec!["buckets", "--histogram", hs, "--max-buckets", "2", "--memory-budget", "1000"];
    args.extend(model);
    let o = cuplan(&args);
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains("too small for the largest bucket batch=8"), "{}", err(&o));
    let mut args = vec!["buckets", "--histogram", hs, "--max-buckets", "2", "--memory-budget", "100000000"];
    args.extend(model);
    assert!(cuplan(&args).status.success());
    // Malformed histograms and options.
    for (text, k, want) in
        [("", "2", "no requests"), ("0 3\n", "2", "line 1"), ("4 x\n", "2", "line 1"), ("4\n", "0", "at least 1")]
    {
        std::fs::write(&h, text).unwrap();
        let o = cuplan(&["buckets", "--histogram", hs, "--max-buckets", k]);
        assert_eq!(o.status.code(), Some(1), "{text:?}");
        assert!(err(&o).contains(want), "{text:?}: {}", err(&o));
    }
    let o = cuplan(&["buckets", "--histogram", hs, "--max-buckets", "2", "--memory-budget", "10"]);
    assert_eq!(o.status.code(), Some(1));
    let _ = std::fs::remove_dir_all(&dir);
}
