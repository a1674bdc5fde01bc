//! Helpers shared by the visualisation tests: running the binary, finding the shared models, reading SVG with a
//! real XML parser.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use graph_ir::ComputeGraph;
use quick_xml::events::Event;
use quick_xml::Reader;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn cuplan(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cuplan"))
        .args(args)
        .current_dir(workspace())
        .env_remove("RUST_LOG")
        .env_remove("CUPLAN_BLESS")
        .output()
        .unwrap()
}

pub fn ok(o: &Output) -> String {
    assert!(o.status.success(), "cuplan failed: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout.clone()).unwrap()
}

/// A fresh scratch directory for one test.
pub fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cuplan-viz-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The repository's ONNX models (`models/`, or `$CUPLAN_MODELS_DIR`), if present.
pub fn model(name: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("CUPLAN_MODELS_DIR").map_or_else(|| workspace().join("models"), PathBuf::from);
    let p = dir.join(format!("{name}.onnx"));
    if p.exists() {
        Some(p)
    } else {
        eprintln!("skipping {name}: {} not found (set CUPLAN_MODELS_DIR)", p.display());
        None
    }
}

/// Load a graph the way the CLI does (JSON or ONNX).
pub fn load(path: &Path) -> ComputeGraph {
    let bytes = std::fs::read(path).unwrap();
    if path.extension().is_some_and(|e| e == "onnx") {
        graph_onnx::import(&bytes, &graph_onnx::ImportOptions::default()).unwrap().graph
    } else {
        graph_ir::json::from_json(std::str::from_utf8(&bytes).unwrap()).unwrap()
    }
}

/// A buffer rectangle of the memory SVG.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rect {
    pub start: u64,
    pub end: u64,
    pub offset: u64,
    pub size: u64,
    pub title: String,
}

/// What the SVG parser saw.
#[derive(Debug, Default)]
pub struct SvgDoc {
    pub root: String,
    pub rects: Vec<Rect>,
    pub ids: Vec<String>,
    pub elements: usize,
}

/// Parse `svg` completely with quick-xml (end names checked), collecting the buffer rects (those with data
/// attributes) and the text of their `<title>`s.
pub fn parse_svg(svg: &str) -> SvgDoc {
    let mut r = Reader::from_str(svg);
    r.config_mut().check_end_names = true;
    let mut doc = SvgDoc::default();
    let mut depth = 0usize;
    let mut rect: Option<Rect> = None;
    let mut in_title = false;
    loop {
        let ev = r.read_event().unwrap_or_else(|e| panic!("SVG not well-formed at {}: {e}", r.buffer_position()));
        match ev {
            Event::Start(e) => {
                depth += 1;
                doc.elements += 1;
                let name = String::from_utf8(e.name().as_ref().to_vec()).unwrap();
                if doc.root.is_empty() {
                    doc.root = name.clone();
                }
                if let Some(id) = e.try_get_attribute("id").unwrap() {
                    doc.ids.push(id.unescape_value().unwrap().into_owned());
                }
                let get = |k: &str| {
                    e.try_get_attribute(k).unwrap().map(|a| a.unescape_value().unwrap().parse::<u64>().unwrap())
                };
                if name == "rect" {
                    if let (Some(start), Some(end), Some(offset), Some(size)) =
                        (get("data-start"), get("data-end"), get("data-offset"), get("data-size"))
                    {
                        rect = Some(Rect { start, end, offset, size, title: String::new() });
                    }
                }
                if name == "title" {
                    in_title = true;
                }
            }
            Event::Empty(e) => {
                doc.elements += 1;
                if let Some(id) = e.try_get_attribute("id").unwrap() {
                    doc.ids.push(id.unescape_value().unwrap().into_owned());
                }
                assert!(e.try_get_attribute("data-start").unwrap().is_none(), "a buffer rect without a <title>");
            }
            Event::Text(t) if in_title => {
                if let Some(r) = rect.as_mut() {
                    r.title.push_str(&t.decode().unwrap());
                }
            }
            Event::GeneralRef(g) if in_title => {
                if let Some(r) = rect.as_mut() {
                    let s = format!("&{};", g.decode().unwrap());
                    r.title.push_str(&quick_xml::escape::unescape(&s).unwrap());
                }
            }
            Event::End(e) => {
                depth -= 1;
                match e.name().as_ref() {
                    b"title" => in_title = false,
                    b"rect" => {
                        if let Some(r) = rect.take() {
                            doc.rects.push(r);
                        }
                    }
                    _ => {}
                }
            }
            Event::Eof => break,
            _ => {}
        }
    }
    assert_eq!(depth, 0, "unclosed elements");
    doc
}

/// Pairs of rects that share both a time and a byte.
pub fn overlapping(rects: &[Rect]) -> Vec<(usize, usize)> {
    let mut by_start: Vec<usize> = (0..rects.len()).collect();
    by_start.sort_by_key(|&i| rects[i].start);
    let mut out = Vec::new();
    for (k, &i) in by_start.iter().enumerate() {
        for &j in &by_start[k + 1..] {
            if rects[j].start >= rects[i].end {
                break;
            }
            let (a, b) = (&rects[i], &rects[j]);
            if a.offset < b.offset + b.size && b.offset < a.offset + a.size {
                out.push((i, j));
            }
        }
    }
    out
}
