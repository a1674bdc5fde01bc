#![allow(clippy::unwrap_used, clippy::expect_used)]
//! No function in the library crates calls itself: graphs of a million nodes (a million-deep chain) must not
//! overflow the stack, so every traversal uses an explicit worklist. This is a textual scan of the sources
//! (direct self-calls only; the million-node tests behind `cargo xtask fuzz --big` cover the rest). It reads
//! every library crate's `src/` from here so that one test guards the workspace.

use std::path::{Path, PathBuf};

/// Library crates whose code sees user graphs. exec-cuda (FFI) and the CLI are thin layers over these.
const CRATES: [&str; 5] = ["graph-ir", "graph-onnx", "graph-passes", "graph-plan", "exec-sim"];

/// Self-calls that are bounded by construction, each with its reason.
const ALLOWED: [(&str, &str); 4] = [
    // On a cyclic group graph (a legality bug) it calls itself once with one kernel per node, which is acyclic:
    // depth at most 2.
    ("graph-passes/src/fusion/build.rs", "assemble"),
    // The packer's exact search descends one level per placed buffer of one component, and components above
    // SEARCH_MAX_BUFFERS (4096) are never searched: depth at most 4096 small frames.
    ("graph-passes/src/memory/pack/search.rs", "dfs"),
    // Test-only brute force over instances of a few buffers (inside the search module's tests).
    ("graph-passes/src/memory/pack/search.rs", "go"),
    // One level per 64-ary bit-tree level: at most 11 for any usize index.
    ("graph-passes/src/memory/pack/greedy.rs", "next_in"),
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
}

/// The source with `//` comments, string and char literals blanked (so braces in them do not count).
fn code_only(src: &str) -> Vec<u8> {
    let b = src.as_bytes();
    let mut out = b.to_vec();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                out[i] = b' ';
                i += 1;
            }
        } else if b[i] == b'"' {
            // Raw strings are rare in these crates and hold no unbalanced braces; plain strings are handled.
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    out[i] = b' ';
                    i += 1;
                }
                if i < b.len() {
                    out[i] = b' ';
                }
                i += 1;
            }
            i += 1;
        } else if b[i] == b'\'' && b.get(i + 2) == Some(&b'\'') {
            out[i + 1] = b' ';
            i += 3;
        } else if b[i] == b'\'' && b.get(i + 1) == Some(&b'\\') {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'\'' {
                out[j] = b' ';
                j += 1;
            }
            i = j + 1;
        } else {
            i += 1;
        }
    }
    out
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// `(line, name)` of each function whose body calls a function of the same name (`name(`, `self.name(`,
/// `Self::name(`; not `other.name(` or `path::name(`, which are usually different functions).
fn self_calls(src: &str) -> Vec<(usize, String)> {
    let c = code_only(src);
    let mut found = Vec::new();
    let mut i = 0;
    while i + 3 < c.len() {
        let at_fn = &c[i..i + 3] == b"fn " && (i == 0 || !is_ident(c[i - 1]));
        if !at_fn {
            i += 1;
            continue;
        }
        let mut j = i + 3;
        while j < c.len() && c[j] == b' ' {
            j += 1;
        }
        let s = j;
        while j < c.len() && is_ident(c[j]) {
            j += 1;
        }
        let name = String::from_utf8_lossy(&c[s..j]).to_string();
        // The body: the first `{` before any `;` (a declaration without a body has none).
        let mut k = j;
        while k < c.len() && c[k] != b'{' && c[k] != b';' {
            k += 1;
        }
        if name.is_empty() || k >= c.len() || c[k] == b';' {
            i = j;
            continue;
        }
        let start = k;
        let mut depth = 0usize;
        while k < c.len() {
            match c[k] {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                _ => {}
            }
            k += 1;
        }
        let body = &c[start..k.min(c.len())];
        let n = name.as_bytes();
        let mut p = 0;
        while p + n.len() < body.len() {
            if &body[p..p + n.len()] == n && !is_ident(body[p - 1]) && body[p + n.len()] == b'(' {
                let before = &body[..p];
                let qualified_other = (before.ends_with(b".") && !before.ends_with(b"self."))
                    || (before.ends_with(b"::") && !before.ends_with(b"Self::"));
                if !qualified_other {
                    found.push((src[..i].matches('\n').count() + 1, name.clone()));
                    break;
                }
            }
            p += 1;
        }
        // Nested functions are scanned too: continue just after this `fn`'s name.
        i = j;
    }
    found
}

#[test]
fn the_scan_finds_direct_recursion() {
    let src = "fn walk(n: u32) -> u32 { if n == 0 { 0 } else { walk(n - 1) } }\n\
               fn fine(v: &[u32]) -> usize { v.iter().map(|x| other.fine(*x)).count() }\n\
               impl T { fn go(&self) { let s = \"go( {\"; self.go() } }";
    let names: Vec<String> = self_calls(src).into_iter().map(|f| f.1).collect();
    assert_eq!(names, ["walk", "go"]);
}

#[test]
fn library_crates_have_no_self_recursive_functions() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut bad = Vec::new();
    let mut allowed_seen = Vec::new();
    let mut scanned = 0;
    for krate in CRATES {
        let mut files = Vec::new();
        rust_files(&root.join(krate).join("src"), &mut files);
        for f in files {
            let rel = f.strip_prefix(&root).unwrap().to_string_lossy().replace('\\', "/");
            let src = std::fs::read_to_string(&f).unwrap();
            scanned += 1;
            for (line, name) in self_calls(&src) {
                if ALLOWED.iter().any(|(p, n)| *p == rel && *n == name) {
                    allowed_seen.push(name);
                } else {
                    bad.push(format!("{rel}:{line}: fn {name} calls itself"));
                }
            }
        }
    }
    assert!(scanned > 20, "only {scanned} files scanned: wrong root?");
    // Each exception is still there (else it is stale and should go).
    assert_eq!(allowed_seen.len(), ALLOWED.len(), "stale exceptions: found only {allowed_seen:?}");
    assert!(bad.is_empty(), "recursion in library code (use a worklist):\n{}", bad.join("\n"));
}
