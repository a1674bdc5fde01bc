//! The plan's kernel DAG as Graphviz DOT: one node per launch (labelled with its kernel, kind and fused nodes) or
//! copy, one cluster per stream; data edges solid (writer of a tensor's bytes to each reader, found through the
//! kernels' bindings by alias root), event edges dashed (the work a Record covers to the first work after the
//! matching Wait), reuse-order edges dotted (the memory plan's orderings, `ExecutionPlan::orders`, less those a
//! data edge between the same two launches already draws).

use graph_plan::{Access, BufferRef, ExecutionPlan, KernelId, PlanStep, StreamId};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write;

use super::explain::{fmt_us, kind_name};
use super::{ellipsize_front, human_bytes};

/// Fused node names shown in a DOT label before the rest are counted.
const LABEL_NODES: usize = 4;
/// Longest node name in a label (shortened from the front).
const LABEL_NAME: usize = 40;

/// A string as a DOT quoted id or label (backslashes and quotes escaped, line breaks as `\n`).
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => {}
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The DOT node id of a work step: `k3` for a launch, `c7` for the copy at step 7.
fn node_id(plan: &ExecutionPlan, step: usize) -> Option<String> {
    match &plan.steps[step] {
        PlanStep::Launch { kernel, .. } => Some(kernel.to_string()),
        PlanStep::Copy { .. } => Some(format!("c{step}")),
        _ => None,
    }
}

/// Edges of the DAG, by kind; each a pair of work-step indices with a tooltip.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Edges {
    /// Writer -> reader of some tensor's bytes, with the tensors.
    pub data: BTreeMap<(usize, usize), BTreeSet<String>>,
    /// Record side -> wait side, with the events.
    pub event: BTreeMap<(usize, usize), BTreeSet<String>>,
    /// Last reader of an old occupant -> writer of the new one (all of them, even where a data edge joins the
    /// same pair).
    pub reuse: BTreeSet<(usize, usize)>,
}

/// Derive the edges from the steps.
pub fn edges(plan: &ExecutionPlan) -> Edges {
    let mut e = Edges::default();
    let mut step_of_kernel: HashMap<KernelId, usize> = HashMap::new();
    // Data edges through alias roots: the launch that writes a root, then every later launch that reads it.
    let mut writer_of: HashMap<&str, usize> = HashMap::new();
    // Writes of copies, for readers that no kernel's binding names (Memcpy results).
    let mut copy_writes: Vec<(usize, BufferRef)> = Vec::new();
    let mut last_on: HashMap<StreamId, usize> = HashMap::new();
    let mut recorded: HashMap<u32, Option<usize>> = HashMap::new();
    let mut pending: HashMap<StreamId, Vec<(usize, String)>> = HashMap::new();
    for (i, s) in plan.steps.iter().enumerate() {
        match s {
            PlanStep::Launch { stream, kernel, .. } => {
                step_of_kernel.insert(*kernel, i);
                if let Some(k) = plan.kernel(*kernel) {
                    for p in k.params.iter().filter(|p| p.access == Access::Read) {
                        let from = writer_of
                            .get(p.root.as_ref())
                            .copied()
                            .or_else(|| copy_writes.iter().rev().find(|(_, b)| b.overlaps(&p.buffer)).map(|&(c, _)| c));
                        if let Some(from) = from {
                            e.data.entry((from, i)).or_default().insert(p.root.to_string());
                        }
                    }
                    for p in k.params.iter().filter(|p| p.access == Access::Write) {
                        writer_of.entry(p.root.as_ref()).or_insert(i);
                    }
                }
                work(&mut e, &mut last_on, &mut pending, *stream, i);
            }
            PlanStep::Copy { stream, src, dst, node, .. } => {
                // Its source: the latest earlier writer of overlapping bytes.
                let from = plan.steps[..i].iter().enumerate().rev().find_map(|(j, t)| match t {
                    PlanStep::Launch { writes, .. } if writes.iter().any(|w| w.overlaps(src)) => Some(j),
                    PlanStep::Copy { dst: d, .. } if d.overlaps(src) => Some(j),
                    _ => None,
                });
                if let Some(from) = from {
                    e.data
                        .entry((from, i))
                        .or_default()
                        .insert(node.clone().unwrap_or_else(|| "copy".into()).to_string());
                }
                copy_writes.push((i, *dst));
                work(&mut e, &mut last_on, &mut pending, *stream, i);
            }
            PlanStep::Record { stream, event } => {
                recorded.insert(event.0, last_on.get(stream).copied());
            }
            PlanStep::Wait { stream, event } => {
                if let Some(Some(from)) = recorded.get(&event.0) {
                    pending.entry(*stream).or_default().push((*from, event.to_string()));
                }
            }
        }
    }
    for o in plan.orders() {
        if let (Some(&a), Some(&b)) = (step_of_kernel.get(&o.from), step_of_kernel.get(&o.to)) {
            e.reuse.insert((a, b));
        }
    }
    e
}

/// A work step on `stream`: it takes the waits pending there.
fn work(
    e: &mut Edges,
    last_on: &mut HashMap<StreamId, usize>,
    pending: &mut HashMap<StreamId, Vec<(usize, String)>>,
    stream: StreamId,
    i: usize,
) {
    for (from, ev) in pending.remove(&stream).unwrap_or_default() {
        e.event.entry((from, i)).or_default().insert(ev);
    }
    last_on.insert(stream, i);
}

fn label_of(plan: &ExecutionPlan, step: usize) -> String {
    match &plan.steps[step] {
        PlanStep::Launch { kernel, .. } => {
            let Some(k) = plan.kernel(*kernel) else { return kernel.to_string() };
            let names: Vec<&str> = k.node_names().collect();
            let mut lines = vec![format!("{} · {} · {} us", k.name, kind_name(k.kind), fmt_us(k.estimate.time_us))];
            for n in names.iter().take(LABEL_NODES) {
                lines.push(ellipsize_front(n, LABEL_NAME));
            }
            if names.len() > LABEL_NODES {
                lines.push(format!("… +{} more", names.len() - LABEL_NODES));
            }
            lines.join("\n")
        }
        PlanStep::Copy { bytes, node, .. } => {
            let mut l = format!("copy #{step} · {}", human_bytes(*bytes));
            if let Some(n) = node {
                l.push('\n');
                l.push_str(&ellipsize_front(n, LABEL_NAME));
            }
            l
        }
        _ => String::new(),
    }
}

fn tooltip(set: &BTreeSet<String>) -> String {
    let v: Vec<&str> = set.iter().map(String::as_str).collect();
    let s = v.join(", ");
    super::ellipsize(&s, 300)
}

/// The plan as a DOT digraph.
pub fn plan_dot(plan: &ExecutionPlan) -> String {
    let e = edges(plan);
    let mut s = String::new();
    let _ = writeln!(s, "digraph plan {{");
    let _ = writeln!(
        s,
        "  graph [rankdir=TB, newrank=true, fontname=\"Helvetica\", fontsize=12, labelloc=t, label={}];",
        quote(&format!(
            "plan '{}': {} launches on {} stream{}, {} events · solid: data, dashed: event (record -> wait), dotted: reuse order",
            plan.graph_name(),
            plan.kernel_count_fused,
            plan.num_streams,
            if plan.num_streams == 1 { "" } else { "s" },
            plan.event_count
        ))
    );
    let _ = writeln!(
        s,
        "  node [shape=box, style=\"rounded,filled\", fillcolor=\"#f4f4f4\", fontname=\"Helvetica\", fontsize=10];"
    );
    let _ = writeln!(s, "  edge [fontname=\"Helvetica\", fontsize=9];");
    let mut by_stream: BTreeMap<StreamId, Vec<usize>> = BTreeMap::new();
    for (i, st) in plan.steps.iter().enumerate() {
        if st.is_compute() {
            by_stream.entry(st.stream()).or_default().push(i);
        }
    }
    for (stream, steps) in &by_stream {
        let _ = writeln!(s, "  subgraph cluster_{stream} {{");
        let _ = writeln!(s, "    label={}; style=rounded; color=\"#888888\";", quote(&format!("stream {stream}")));
        for &i in steps {
            let Some(id) = node_id(plan, i) else { continue };
            let fill = match &plan.steps[i] {
                PlanStep::Launch { kernel, .. } => {
                    plan.kernel(*kernel).map_or("#f4f4f4", |k| super::svg::color(kind_index(k.kind)))
                }
                _ => "#dddddd",
            };
            let _ = writeln!(
                s,
                "    {id} [label={}, fillcolor={}, tooltip={}];",
                quote(&label_of(plan, i)),
                quote(&lighten(fill)),
                quote(&format!("step #{i}"))
            );
        }
        let _ = writeln!(s, "  }}");
    }
    let id = |i: usize| node_id(plan, i).unwrap_or_else(|| format!("step{i}"));
    for ((a, b), tensors) in &e.data {
        let _ = writeln!(s, "  {} -> {} [tooltip={}];", id(*a), id(*b), quote(&tooltip(tensors)));
    }
    for ((a, b), events) in &e.event {
        let evs = tooltip(events);
        let _ = writeln!(
            s,
            "  {} -> {} [style=dashed, color=\"#c0392b\", fontcolor=\"#c0392b\", label={}, tooltip={}];",
            id(*a),
            id(*b),
            quote(&evs),
            quote(&evs)
        );
    }
    for (a, b) in e.reuse.iter().filter(|p| !e.data.contains_key(p)) {
        let _ = writeln!(
            s,
            "  {} -> {} [style=dotted, color=\"#666666\", constraint=false, tooltip=\"reuse order\"];",
            id(*a),
            id(*b)
        );
    }
    let _ = writeln!(s, "}}");
    s
}

/// Palette index of a kernel kind (the SVG's colours, so the two pictures agree).
fn kind_index(k: graph_plan::GroupKind) -> usize {
    use graph_plan::GroupKind as K;
    match k {
        K::Anchor => 0,
        K::Elementwise => 1,
        K::Reduction => 2,
        K::DataMovement => 3,
        K::Copy => 4,
        K::Custom => 6,
        K::Attention => 5,
    }
}

/// A palette colour mixed halfway to white, so black labels stay readable on it.
fn lighten(hex: &str) -> String {
    let v = u32::from_str_radix(hex.trim_start_matches('#'), 16).unwrap_or(0xf4f4f4);
    let mix = |c: u32| (c + 255) / 2;
    format!("#{:02x}{:02x}{:02x}", mix((v >> 16) & 0xff), mix((v >> 8) & 0xff), mix(v & 0xff))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(quote("a\"b\\c\nd"), "\"a\\\"b\\\\c\\nd\"");
        assert_eq!(lighten("#000000"), "#7f7f7f");
    }
}
