#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The hostile corpus (`tests/hostile/`, listed with expected outcomes in `tests/hostile/cases.tsv`) through
//! the `cuplan` binary: each case must exit with its code (1 for a user error) within a timeout, print one
//! line on stderr containing the expected fragment, and never panic. A few cases too large to commit are
//! generated here (a 10^6-rank shape, 100 000 levels of nesting, a file over the size limit).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Long enough for a debug build on a loaded machine; a hang takes forever.
const TIMEOUT: Duration = Duration::from_secs(60);

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

struct Outcome {
    code: Option<i32>,
    stderr: String,
}

/// Run cuplan with `args` (and `stdin` bytes), killing it after `TIMEOUT`.
fn run(args: &[String], stdin: Option<&[u8]>) -> Outcome {
    let mut child = Command::new(env!("CARGO_BIN_EXE_cuplan"))
        .args(args)
        .current_dir(workspace())
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(bytes) = stdin {
        child.stdin.take().unwrap().write_all(bytes).unwrap();
    }
    let mut err = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut err, &mut s).ok();
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > TIMEOUT {
            child.kill().ok();
            child.wait().ok();
            panic!("cuplan {args:?} did not finish within {TIMEOUT:?} (a hang)");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Outcome { code: status.code(), stderr: reader.join().unwrap() }
}

/// Assert one case's outcome.
fn check(label: &str, o: &Outcome, code: i32, fragment: &str) {
    assert!(!o.stderr.contains("panicked"), "{label}: panicked:\n{}", o.stderr);
    assert_eq!(o.code, Some(code), "{label}: exit code, stderr:\n{}", o.stderr);
    if code == 1 {
        let lines: Vec<&str> = o.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{label}: expected one line on stderr, got:\n{}", o.stderr);
        assert!(lines[0].starts_with("error: "), "{label}: {}", lines[0]);
    }
    assert!(o.stderr.contains(fragment), "{label}: stderr lacks {fragment:?}:\n{}", o.stderr);
}

#[test]
fn corpus_cases_fail_cleanly() {
    let dir = workspace().join("tests/hostile");
    let manifest = std::fs::read_to_string(dir.join("cases.tsv")).unwrap();
    let mut n = 0;
    for line in manifest.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let cols: Vec<&str> = line.split('\t').collect();
        assert_eq!(cols.len(), 4, "bad manifest line {line:?}");
        let path = dir.join(cols[0]);
        assert!(path.exists(), "{} is missing (run tests/hostile/make_corpus.py)", path.display());
        let args: Vec<String> = cols[1]
            .split_whitespace()
            .map(|a| if a == "FILE" { path.to_string_lossy().into_owned() } else { a.to_string() })
            .collect();
        let o = run(&args, None);
        check(&format!("{} ({})", cols[0], cols[1]), &o, cols[2].parse().unwrap(), cols[3]);
        n += 1;
    }
    // Every corpus file is named by some case.
    for entry in std::fs::read_dir(&dir).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if name.ends_with(".json") || name.ends_with(".onnx") {
            assert!(manifest.lines().any(|l| l.starts_with(&format!("{name}\t"))), "{name} has no case");
        }
    }
    assert!(n >= 40, "only {n} cases");
}

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cuplan-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn graph_with_shape(shape: &str) -> String {
    format!(
        r#"{{"format":"cuplan-graph","version":1,"name":"g","inputs":[{{"name":"x","dtype":"f32","shape":{shape}}}],
        "nodes":[{{"name":"r","op":"Relu","inputs":["x"]}}],"outputs":["r"]}}"#
    )
}

#[test]
fn million_rank_shape_is_a_rank_error() {
    let path = temp("rank.json");
    std::fs::write(&path, graph_with_shape(&format!("[{}]", vec!["1"; 1_000_000].join(",")))).unwrap();
    let o = run(&["validate".into(), path.to_string_lossy().into_owned()], None);
    check("rank 10^6", &o, 1, "tensor 'x' has rank 1000000, above the limit of 64");
}

#[test]
fn hundred_thousand_levels_of_nesting_is_an_error_not_a_stack_overflow() {
    let depth = 100_000;
    let doc = format!(
        r#"{{"format":"cuplan-graph","version":1,"name":"g","constants":[{{"name":"c","dtype":"f32","shape":[1],
        "data":[{}0{}]}}],"nodes":[],"outputs":[]}}"#,
        "[".repeat(depth),
        "]".repeat(depth)
    );
    let o = run(&["validate".into(), "-".into()], Some(doc.as_bytes()));
    check("nesting 10^5", &o, 1, "recursion limit exceeded");
}

#[test]
fn standard_input_that_is_not_utf8_or_empty() {
    let o = run(&["validate".into(), "-".into()], Some(&[0xff, 0xfe, 0x00]));
    check("stdin non-UTF-8", &o, 1, "standard input is not UTF-8");
    let o = run(&["validate".into(), "-".into()], Some(b""));
    check("stdin empty", &o, 1, "EOF while parsing");
}

#[test]
fn file_over_the_size_limit_fails_before_reading() {
    // A sparse 3 GiB file: the size check must come before any read (2 GiB would be allocated otherwise).
    let path = temp("huge.json");
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(3 << 30).unwrap();
    let start = Instant::now();
    let o = run(&["validate".into(), path.to_string_lossy().into_owned()], None);
    check("3 GiB file", &o, 1, "is larger than the limit of 2147483648 bytes");
    assert!(start.elapsed() < Duration::from_secs(20), "took {:?}", start.elapsed());
    std::fs::remove_file(&path).ok();
}

#[test]
fn missing_file_and_directory() {
    let o = run(&["validate".into(), "tests/hostile/no-such-file.json".into()], None);
    check("missing", &o, 1, "cannot open");
    let o = run(&["validate".into(), "tests/hostile".into()], None);
    assert!(!o.stderr.contains("panicked"), "{}", o.stderr);
    assert_eq!(o.code, Some(1), "{}", o.stderr);
}
