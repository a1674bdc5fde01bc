#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `plan --dot`: a structural parse of the DOT (clusters, nodes, edges by style) checked against the plan, and,
//! where Graphviz is installed, a real layout with `dot -Tsvg`.

mod viz_common;

use graph_plan::{ExecutionPlan, PlanOptions, PlanStep};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;
use viz_common::*;

#[derive(Debug, Default)]
struct Dot {
    /// Cluster name -> node ids in it.
    clusters: BTreeMap<String, Vec<String>>,
    /// (from, to, attributes).
    edges: Vec<(String, String, String)>,
}

/// A small parser for the subset of DOT the command writes: one statement per line.
fn parse_dot(text: &str) -> Dot {
    let mut d = Dot::default();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("digraph plan {"));
    let mut cluster: Option<String> = None;
    let mut closed = false;
    for line in lines {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("subgraph cluster_") {
            let name = rest.strip_suffix(" {").unwrap().to_string();
            d.clusters.insert(name.clone(), Vec::new());
            cluster = Some(name);
        } else if t == "}" {
            if cluster.take().is_none() {
                closed = true;
            }
        } else if let Some((lhs, attrs)) = t.split_once(" [") {
            assert!(attrs.ends_with("];"), "unterminated statement: {t}");
            let attrs = attrs.trim_end_matches("];").to_string();
            if let Some((a, b)) = lhs.split_once(" -> ") {
                assert!(cluster.is_none(), "edge inside a cluster: {t}");
                d.edges.push((a.to_string(), b.to_string(), attrs));
            } else if let Some(c) = &cluster {
                d.clusters.get_mut(c).unwrap().push(lhs.to_string());
            } else {
                assert!(["graph", "node", "edge"].contains(&lhs), "node outside a cluster: {t}");
            }
        } else if !t.starts_with("label=") {
            panic!("unexpected DOT line: {t}");
        }
    }
    assert!(closed, "digraph not closed");
    d
}

fn attr<'a>(attrs: &'a str, key: &str) -> Option<&'a str> {
    let i = attrs.find(&format!("{key}="))?;
    let rest = &attrs[i + key.len() + 1..];
    Some(rest.split([',', ' ']).next().unwrap().trim_matches('"'))
}

fn node_of(plan: &ExecutionPlan, i: usize) -> Option<String> {
    match &plan.steps[i] {
        PlanStep::Launch { kernel, .. } => Some(kernel.to_string()),
        PlanStep::Copy { .. } => Some(format!("c{i}")),
        _ => None,
    }
}

/// Write the DOT for `graph` and check it against the plan built with the same options.
fn check(graph: &Path, streams: usize, name: &str) -> (Dot, String) {
    let dir = scratch(name);
    let out = dir.join("plan.dot");
    let s = streams.to_string();
    ok(&cuplan(&["plan", graph.to_str().unwrap(), "--streams", &s, "--dot", out.to_str().unwrap()]));
    let text = std::fs::read_to_string(&out).unwrap();
    let dot = parse_dot(&text);
    let plan = ExecutionPlan::build_with(&load(graph), &PlanOptions::with_streams(streams)).unwrap();

    // One cluster per stream that runs work, holding exactly that stream's launches and copies.
    let mut want: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut step_of: BTreeMap<String, usize> = BTreeMap::new();
    for (i, st) in plan.steps.iter().enumerate() {
        if let Some(n) = node_of(&plan, i) {
            want.entry(st.stream().to_string()).or_default().push(n.clone());
            step_of.insert(n, i);
        }
    }
    assert_eq!(dot.clusters, want, "{name}: clusters");

    let mut data = 0;
    let mut event_labels = BTreeSet::new();
    let orders: BTreeSet<(String, String)> =
        plan.orders().iter().map(|o| (o.from.to_string(), o.to.to_string())).collect();
    for (a, b, attrs) in &dot.edges {
        let (sa, sb) = (step_of[a.as_str()], step_of[b.as_str()]);
        assert!(sa < sb, "{name}: edge {a} -> {b} goes back in submission order");
        match attr(attrs, "style") {
            None => data += 1,
            Some("dashed") => {
                assert_ne!(plan.steps[sa].stream(), plan.steps[sb].stream(), "{name}: event edge within a stream");
                for ev in attr(attrs, "label").unwrap().split(", ") {
                    event_labels.insert(ev.to_string());
                }
            }
            Some("dotted") => assert!(orders.contains(&(a.clone(), b.clone())), "{name}: {a} -> {b} is no reuse order"),
            Some(other) => panic!("{name}: unexpected style {other}"),
        }
    }
    // Every event the plan waits on appears on a dashed edge.
    let waited: BTreeSet<String> = plan
        .steps
        .iter()
        .filter_map(|s| match s {
            PlanStep::Wait { event, .. } => Some(event.to_string()),
            _ => None,
        })
        .collect();
    assert_eq!(event_labels, waited, "{name}: events on dashed edges");
    // Every launch that reads the pool has a producer drawn.
    for (i, st) in plan.steps.iter().enumerate() {
        if let PlanStep::Launch { kernel, reads, .. } = st {
            if reads.iter().any(|r| r.region == graph_plan::Region::Pool) {
                let k = kernel.to_string();
                assert!(
                    dot.edges.iter().any(|(_, b, attrs)| *b == k && attr(attrs, "style").is_none()),
                    "{name}: {k} (step {i}) reads the pool but has no data edge in"
                );
            }
        }
    }
    assert!(data > 0, "{name}: no data edges");
    (dot, text)
}

fn synth(dir: &Path, args: &[&str]) -> std::path::PathBuf {
    let json = ok(&cuplan(args));
    let p = dir.join(format!("{}.json", args[1]));
    std::fs::write(&p, json).unwrap();
    p
}

#[test]
fn examples_and_branchy_graphs() {
    for ex in ["mlp", "transformer_block", "residual_block"] {
        check(&workspace().join(format!("examples/{ex}.json")), 2, ex);
    }
    let dir = scratch("synth");
    let inc = synth(&dir, &["synth", "inception-like", "--modules", "2", "--branches", "3"]);
    check(&inc, 3, "inception");
    // Streams, events and reuse on a branchy graph. (The inception graph packs its pool so tightly that the
    // memory pass's reuse edges order its branches onto one stream, with or without fusion.)
    let dag = synth(&dir, &["synth", "random-dag", "--n", "60", "--seed", "7"]);
    let (dot, _) = check(&dag, 4, "random-dag");
    assert!(dot.clusters.len() >= 2, "the random DAG should use several streams: {:?}", dot.clusters.keys());
    assert!(dot.edges.iter().any(|e| attr(&e.2, "style") == Some("dashed")), "no event edges");
    assert!(dot.edges.iter().any(|e| attr(&e.2, "style") == Some("dotted")), "no reuse edges");
}

#[test]
fn shared_bert_has_event_edges() {
    let Some(p) = model("bert_base") else { return };
    let (dot, _) = check(&p, 4, "bert");
    // `check` already matched every waited event to a dashed edge; here the plan must use them at all.
    assert!(dot.clusters.len() >= 2, "bert should use several streams: {:?}", dot.clusters.keys());
    assert!(dot.edges.iter().any(|e| attr(&e.2, "style") == Some("dashed")), "bert: no event edges");
}

#[test]
fn graphviz_lays_it_out() {
    let probe = Command::new("dot").arg("-V").output();
    if !probe.is_ok_and(|o| o.status.success()) {
        eprintln!("skipping: Graphviz `dot` is not installed (apt-get install graphviz to run this check)");
        return;
    }
    let dir = scratch("graphviz");
    let inc = synth(&dir, &["synth", "inception-like", "--modules", "2", "--branches", "3"]);
    for (g, streams) in [(workspace().join("examples/transformer_block.json"), 1), (inc, 3)] {
        let (_, text) = check(&g, streams, "graphviz-input");
        let path = dir.join("g.dot");
        std::fs::write(&path, text).unwrap();
        let o = Command::new("dot").arg("-Tsvg").arg(&path).output().unwrap();
        assert!(o.status.success(), "dot failed: {}", String::from_utf8_lossy(&o.stderr));
        let svg = String::from_utf8(o.stdout).unwrap();
        let doc = parse_svg(&svg);
        assert_eq!(doc.root, "svg");
        assert!(svg.contains("class=\"cluster\""), "no cluster drawn");
    }
}

#[test]
fn hostile_names_are_quoted() {
    use graph_ir::{ComputeGraph, DType, Op};
    let mut g = ComputeGraph::new("q\"uote");
    let x = g.add_input("x", DType::F32, [16, 16]).unwrap();
    let w = g.add_weight("w", DType::F32, [16, 16]).unwrap();
    let a = g.add_node("a\"b\\\"c", Op::MatMul, &[x, w]).unwrap()[0];
    let b = g.add_node("line\nbreak {x} -> y;", Op::Neg, &[a]).unwrap()[0];
    let c = g.add_node("brace } [label=", Op::MatMul, &[b, w]).unwrap()[0];
    g.mark_output(c).unwrap();
    let dir = scratch("dot-names");
    let gp = dir.join("g.json");
    std::fs::write(&gp, g.to_json()).unwrap();
    let (_, text) = check(&gp, 1, "dot-names-plan");
    assert!(text.contains(r#"a\"b\\\"c"#), "{text}");
    assert!(text.contains(r"line\nbreak {x} -> y;"), "{text}");
    let probe = Command::new("dot").arg("-V").output();
    if !probe.is_ok_and(|o| o.status.success()) {
        eprintln!("skipping the Graphviz half: `dot` is not installed");
        return;
    }
    let path = dir.join("g.dot");
    std::fs::write(&path, &text).unwrap();
    let o = Command::new("dot").arg("-Tsvg").arg(&path).output().unwrap();
    assert!(o.status.success(), "dot failed: {}", String::from_utf8_lossy(&o.stderr));
    parse_svg(&String::from_utf8(o.stdout).unwrap());
}
