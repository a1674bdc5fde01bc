//! The data of `cuplan explain` and its three renderings: a step table that fits a 120-column terminal, one JSON
//! object, and GitHub markdown.
//!
//! Per step: its stream, what it is, the kernel and the nodes it fuses, the bytes it reads and writes (the
//! kernel's modelled cost), the hull of the pool bytes it writes, its modelled time (`Kernel::estimate`, without
//! launch overhead) and, from one replay in exec-sim's timing model, when it starts and ends. The summary sets each figure beside
//! its bound (DESIGN.md section 5); the fusion section lists every candidate pair that was not fused, with its
//! reason code.

use graph_ir::ComputeGraph;
use graph_passes::fusion::FusionPlan;
use graph_plan::{ExecutionPlan, PlanStep, Region};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write;

use super::table::{self, Column};
use super::{abbreviate_nodes, copy_time_us, human_bytes, plan_device};

/// Widest text table `explain` prints.
pub const TEXT_WIDTH: usize = 120;

/// One row: one plan step.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepRow {
    /// Position in submission order.
    pub step: usize,
    /// Stream (`s0`).
    pub stream: String,
    /// `launch` kernel kind (`elementwise`, `anchor`, ...), `copy`, `record` or `wait`.
    pub kind: String,
    /// Kernel (`k3`) or event (`ev2`); empty for a copy.
    pub id: String,
    /// Graph nodes the step runs, in program order.
    pub nodes: Vec<String>,
    /// Bytes the step reads (modelled).
    pub bytes_read: u64,
    /// Bytes the step writes (modelled).
    pub bytes_written: u64,
    /// Hull `[lo, hi)` of the pool bytes the step writes, if it writes any.
    pub pool_write: Option<[u64; 2]>,
    /// Modelled time without launch overhead, microseconds (launches and copies).
    pub time_us: Option<f64>,
    /// Start in the simulated replay, microseconds (records and waits: when they take effect).
    pub start_us: f64,
    /// End in the simulated replay, microseconds.
    pub end_us: f64,
}

/// The plan's figures beside their bounds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Summary {
    /// Graph nodes.
    pub nodes: usize,
    /// Kernel launches without fusion (non-view nodes).
    pub launches_before: usize,
    /// Kernel launches of the plan.
    pub launches_after: usize,
    /// Copy steps.
    pub copies: usize,
    /// Activation pool bytes.
    pub pool_bytes: u64,
    /// Fixed-order lower bound of the pool.
    pub lower_bound_bytes: u64,
    /// Pool bytes without reuse.
    pub naive_bytes: u64,
    /// `pool / bound`.
    pub pool_ratio: f64,
    /// Streams.
    pub streams: usize,
    /// Events kept.
    pub events: usize,
    /// Cross-stream edges before event reduction.
    pub events_before_reduction: usize,
    /// Reuse edges (orderings the memory plan adds).
    pub reuse_edges: usize,
    /// Bytes moved by all launches.
    pub bytes_moved: u64,
    /// Bytes the unfused graph would move.
    pub bytes_moved_unfused: u64,
    /// Device profile of the estimates.
    pub device: String,
    /// Per-launch overhead of a CUDA-graph replay, microseconds.
    pub launch_overhead_us: f64,
    /// Simulated makespan of one replay, microseconds.
    pub makespan_us: f64,
    /// `max(energetic path, area)` (`graph_passes::timing`).
    pub makespan_bound_us: f64,
    /// The energetic path: the critical path, lengthened where launches between two ordered ones share the
    /// device.
    pub energy_us: f64,
    /// Longest path of launch times.
    pub critical_path_us: f64,
    /// Sum of launch time x occupancy.
    pub area_us: f64,
    /// `makespan / bound`.
    pub makespan_ratio: f64,
    /// Time each stream spends running launches and copies, by stream index.
    pub stream_busy_us: Vec<f64>,
}

/// One rejected fusion candidate.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Rejection {
    /// Producer node.
    pub producer: String,
    /// Consumer node.
    pub consumer: String,
    /// Reason code.
    pub reason: String,
}

/// What the fusion pass decided.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FusionSection {
    /// Candidate pairs considered.
    pub candidates: usize,
    /// Pairs fused.
    pub fused: usize,
    /// Rejections per reason code.
    pub rejected_by_reason: BTreeMap<String, usize>,
    /// Every rejected pair, in the pass's order.
    pub rejected: Vec<Rejection>,
}

/// Everything `explain` shows.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Explain {
    /// The graph's name.
    pub graph: String,
    /// One row per plan step.
    pub steps: Vec<StepRow>,
    /// Figures and bounds.
    pub summary: Summary,
    /// Fusion decisions.
    pub fusion: FusionSection,
    /// Each node's precision and the policy rule that chose it (fp16/bf16 plans only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub precision: Option<PrecisionSection>,
}

/// The precision transform's decisions, for `explain`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PrecisionSection {
    /// The plan's precision (`fp16`, `bf16`).
    pub precision: String,
    /// Nodes per dtype of their float output.
    pub counts: Vec<(String, usize)>,
    /// Every node of the planned graph (inserted casts included): name, op, dtype, rule.
    pub nodes: Vec<graph_passes::precision::NodePrecision>,
}

impl PrecisionSection {
    /// From the transform's report on the graph it rewrote, and the plan's counts.
    pub fn new(
        r: &graph_passes::precision::PrecisionReport,
        rewritten: &graph_ir::ComputeGraph,
        plan: &ExecutionPlan,
    ) -> PrecisionSection {
        PrecisionSection {
            precision: r.precision.name().to_string(),
            counts: plan.stats().nodes_per_precision.clone(),
            nodes: r.nodes(rewritten),
        }
    }

    fn lines(&self) -> Vec<[String; 4]> {
        self.nodes
            .iter()
            .map(|n| {
                [
                    n.node.clone(),
                    n.op.to_string(),
                    match (n.dtype, n.store) {
                        (Some(d), Some(s)) => format!("{d} (stores {s})"),
                        (d, _) => d.map_or("-".to_string(), |d| d.to_string()),
                    },
                    n.rule.to_string(),
                ]
            })
            .collect()
    }
}

/// A reason code as the fusion pass names it.
pub fn reason_code(r: &impl std::fmt::Debug) -> String {
    format!("{r:?}")
}

/// The fusion section from the fusion pass's decisions (the decisions list the edges left between kernels;
/// merges are counted by the pass).
pub fn fusion_section(fusion: &FusionPlan) -> FusionSection {
    let mut by_reason: BTreeMap<String, usize> = BTreeMap::new();
    let mut rejected = Vec::new();
    for d in &fusion.decisions {
        if let Some(r) = &d.rejected {
            let code = reason_code(r);
            *by_reason.entry(code.clone()).or_default() += 1;
            rejected.push(Rejection { producer: d.producer.clone(), consumer: d.consumer.clone(), reason: code });
        }
    }
    let s = &fusion.stats;
    let fused = s.merges_vertical + s.merges_multi_output + s.merges_horizontal + s.merges_attention;
    FusionSection { candidates: fused + rejected.len(), fused, rejected_by_reason: by_reason, rejected }
}

/// The readable fusion explanation of `plan --explain-fusion`: each group with its kind and nodes, then each
/// rejected candidate with its reason code and specifics (the fusion pass's own `explain`).
pub fn fusion_text(graph: &ComputeGraph, fusion: &FusionPlan) -> String {
    fusion.explain(graph)
}

/// Lowercase name of a kernel kind.
pub fn kind_name(k: graph_plan::GroupKind) -> &'static str {
    use graph_plan::GroupKind as K;
    match k {
        K::Elementwise => "elementwise",
        K::Anchor => "anchor",
        K::Reduction => "reduction",
        K::DataMovement => "data-movement",
        K::Copy => "copy",
        K::Custom => "custom",
        K::Attention => "attention",
    }
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        1.0
    }
}

/// Gather what `explain` shows. Fails only if the plan's steps are inconsistent (a wait before its record, an
/// unknown kernel), which `verify` rules out.
pub fn explain(plan: &ExecutionPlan, fusion: &FusionPlan) -> anyhow::Result<Explain> {
    let device = plan_device(plan);
    let t = exec_sim::timing::simulate(plan, &exec_sim::TimingOptions::for_plan(plan))?;
    let mut steps = Vec::with_capacity(plan.steps.len());
    for (i, s) in plan.steps.iter().enumerate() {
        let (start_us, end_us) = t.steps.get(i).map_or((0.0, 0.0), |st| (st.start_us, st.end_us));
        let row = match s {
            PlanStep::Launch { stream, kernel, writes, .. } => {
                let k = plan.kernel(*kernel);
                let hull = writes.iter().filter(|b| b.region == Region::Pool).fold(None, |acc: Option<[u64; 2]>, b| {
                    Some(acc.map_or([b.offset, b.end()], |[lo, hi]| [lo.min(b.offset), hi.max(b.end())]))
                });
                StepRow {
                    step: i,
                    stream: stream.to_string(),
                    kind: k.map_or("?", |k| kind_name(k.kind)).to_string(),
                    id: kernel.to_string(),
                    nodes: k.map(|k| k.node_names().map(str::to_string).collect()).unwrap_or_default(),
                    bytes_read: k.map_or(0, |k| k.cost.bytes_read),
                    bytes_written: k.map_or(0, |k| k.cost.bytes_written),
                    pool_write: hull,
                    time_us: k.map(|k| k.estimate.time_us),
                    start_us,
                    end_us,
                }
            }
            PlanStep::Copy { stream, dst, bytes, node, .. } => StepRow {
                step: i,
                stream: stream.to_string(),
                kind: "copy".into(),
                id: String::new(),
                nodes: node.iter().map(|n| n.to_string()).collect(),
                bytes_read: *bytes,
                bytes_written: *bytes,
                pool_write: (dst.region == Region::Pool).then(|| [dst.offset, dst.end()]),
                time_us: Some(copy_time_us(*bytes, &device)),
                start_us,
                end_us,
            },
            PlanStep::Record { stream, event } | PlanStep::Wait { stream, event } => StepRow {
                step: i,
                stream: stream.to_string(),
                kind: if matches!(s, PlanStep::Record { .. }) { "record" } else { "wait" }.into(),
                id: event.to_string(),
                nodes: Vec::new(),
                bytes_read: 0,
                bytes_written: 0,
                pool_write: None,
                time_us: None,
                start_us,
                end_us,
            },
        };
        steps.push(row);
    }
    let st = plan.stats();
    let opts = exec_sim::TimingOptions::for_plan(plan);
    let summary = Summary {
        nodes: st.nodes,
        launches_before: plan.kernel_count_original,
        launches_after: plan.kernel_count_fused,
        copies: plan.steps.iter().filter(|s| matches!(s, PlanStep::Copy { .. })).count(),
        pool_bytes: plan.pool_bytes as u64,
        lower_bound_bytes: st.lower_bound_bytes,
        naive_bytes: st.naive_bytes,
        pool_ratio: ratio(plan.pool_bytes as f64, st.lower_bound_bytes as f64),
        streams: plan.num_streams,
        events: plan.event_count,
        events_before_reduction: st.events_before_reduction,
        reuse_edges: st.reuse_edges,
        bytes_moved: st.bytes_moved,
        bytes_moved_unfused: st.bytes_moved_unfused,
        device: plan.device().name.clone(),
        launch_overhead_us: opts.overhead.overhead_us(&opts.device),
        makespan_us: t.makespan_us,
        makespan_bound_us: t.bound_us,
        critical_path_us: t.critical_path_us,
        energy_us: t.energy_us,
        area_us: t.area_us,
        makespan_ratio: ratio(t.makespan_us, t.bound_us),
        stream_busy_us: t.stream_busy_us,
    };
    Ok(Explain {
        graph: plan.graph_name().to_string(),
        steps,
        summary,
        fusion: fusion_section(fusion),
        precision: None,
    })
}

fn us(v: Option<f64>) -> String {
    v.map_or(String::new(), fmt_us)
}

/// Microseconds with three significant digits for small values (`0.00512`, `2.25`, `677`), whole beyond.
pub fn fmt_us(t: f64) -> String {
    let a = t.abs();
    if a == 0.0 {
        "0".into()
    } else if a < 0.01 {
        format!("{t:.5}")
    } else if a < 0.1 {
        format!("{t:.4}")
    } else if a < 1.0 {
        format!("{t:.3}")
    } else if a < 10.0 {
        format!("{t:.2}")
    } else if a < 100.0 {
        format!("{t:.1}")
    } else {
        format!("{t:.0}")
    }
}

fn pool_range(r: Option<[u64; 2]>) -> String {
    r.map_or(String::new(), |[lo, hi]| format!("{}..{}", compact_bytes(lo), compact_bytes(hi)))
}

/// Bytes without the space and the `iB` (`2.00K`, `12.5M`): pool ranges are two of them side by side.
fn compact_bytes(b: u64) -> String {
    if b == 0 {
        return "0".into();
    }
    let h = human_bytes(b);
    h.replace(" B", "").replace(" KiB", "K").replace(" MiB", "M").replace(" GiB", "G").replace(" TiB", "T")
}

fn bytes_cell(b: u64, shown: bool) -> String {
    if shown {
        human_bytes(b)
    } else {
        String::new()
    }
}

fn columns() -> Vec<Column> {
    vec![
        Column::right("step"),
        Column::left("stream"),
        Column::left("kind"),
        Column::left("id"),
        Column::flexible("nodes"),
        Column::right("read"),
        Column::right("written"),
        Column::right("pool writes"),
        Column::right("time us"),
    ]
}

/// Rows as strings; `nodes_width` abbreviates the fused node list (`None`: the full list).
fn rows(e: &Explain, nodes_width: Option<usize>) -> Vec<Vec<String>> {
    e.steps
        .iter()
        .map(|r| {
            let names: Vec<&str> = r.nodes.iter().map(String::as_str).collect();
            let nodes = match nodes_width {
                Some(w) => abbreviate_nodes(&names, w),
                None => names.join(" + "),
            };
            let work = r.time_us.is_some();
            vec![
                format!("#{}", r.step),
                r.stream.clone(),
                r.kind.clone(),
                r.id.clone(),
                nodes,
                bytes_cell(r.bytes_read, work),
                bytes_cell(r.bytes_written, work),
                pool_range(r.pool_write),
                us(r.time_us),
            ]
        })
        .collect()
}

fn summary_lines(s: &Summary) -> Vec<(String, String)> {
    let saved = s.launches_before.saturating_sub(s.launches_after);
    vec![
        (
            "launches".into(),
            format!(
                "{} -> {} ({} fused away{})",
                s.launches_before,
                s.launches_after,
                saved,
                if s.copies > 0 { format!(", plus {} copies", s.copies) } else { String::new() }
            ),
        ),
        (
            "pool".into(),
            format!(
                "{} vs bound {} (ratio {:.3}); naive {} ({:.1}x the pool)",
                human_bytes(s.pool_bytes),
                human_bytes(s.lower_bound_bytes),
                s.pool_ratio,
                human_bytes(s.naive_bytes),
                ratio(s.naive_bytes as f64, s.pool_bytes as f64)
            ),
        ),
        (
            "events".into(),
            format!(
                "{} on {} stream{} ({} cross-stream edges before reduction); {} reuse edges",
                s.events,
                s.streams,
                if s.streams == 1 { "" } else { "s" },
                s.events_before_reduction,
                s.reuse_edges
            ),
        ),
        (
            "makespan".into(),
            format!(
                "{} us vs bound {} us (ratio {:.3}), one replay on {} with {} us per launch",
                fmt_us(s.makespan_us),
                fmt_us(s.makespan_bound_us),
                s.makespan_ratio,
                s.device,
                fmt_us(s.launch_overhead_us)
            ),
        ),
        (
            "bound".into(),
            format!(
                "max(energetic path {} us, area {} us); critical path {} us: no schedule does better",
                fmt_us(s.energy_us),
                fmt_us(s.area_us),
                fmt_us(s.critical_path_us)
            ),
        ),
        (
            "busy".into(),
            super::ellipsize(
                &s.stream_busy_us
                    .iter()
                    .enumerate()
                    .map(|(i, b)| format!("s{i} {} us ({:.0}%)", fmt_us(*b), 100.0 * ratio(*b, s.makespan_us)))
                    .collect::<Vec<_>>()
                    .join(", "),
                TEXT_WIDTH - 15,
            ),
        ),
        (
            "bytes moved".into(),
            format!(
                "{} (unfused {}, {:.1}% saved)",
                human_bytes(s.bytes_moved),
                human_bytes(s.bytes_moved_unfused),
                100.0 * (1.0 - ratio(s.bytes_moved as f64, s.bytes_moved_unfused as f64))
            ),
        ),
    ]
}

/// The text rendering: the step table (at most [`TEXT_WIDTH`] columns), the summary, the fusion decisions.
pub fn render_text(e: &Explain) -> String {
    let cols = columns();
    let full = rows(e, None);
    let w = table::flexible_width(&cols, &full, TEXT_WIDTH);
    let mut out = format!("plan '{}': {} steps\n", e.graph, e.steps.len());
    out.push_str(&table::render_text(&cols, &rows(e, Some(w)), TEXT_WIDTH));
    out.push_str("\nsummary:\n");
    for (k, v) in summary_lines(&e.summary) {
        let _ = writeln!(out, "  {k:<12} {v}");
    }
    let f = &e.fusion;
    let _ =
        writeln!(out, "\nfusion: {} candidate pairs, {} fused, {} rejected", f.candidates, f.fused, f.rejected.len());
    if !f.rejected.is_empty() {
        let counts: Vec<String> = f.rejected_by_reason.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let _ = writeln!(out, "  by reason: {}", counts.join(", "));
        for r in &f.rejected {
            let line = format!("  {} -> {} [{}]", r.producer, r.consumer, r.reason);
            let _ = writeln!(out, "{}", super::ellipsize(&line, TEXT_WIDTH));
        }
    }
    if let Some(p) = &e.precision {
        let counts: Vec<String> = p.counts.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let _ = writeln!(out, "\nprecision {}: nodes {}", p.precision, counts.join(", "));
        for [node, op, dtype, rule] in p.lines() {
            let line = format!("  {node} {op} {dtype} [{rule}]");
            let _ = writeln!(out, "{}", super::ellipsize(&line, TEXT_WIDTH));
        }
    }
    out
}

/// The markdown rendering: a heading, the step table, the summary as a list, the rejections as a table.
pub fn render_markdown(e: &Explain) -> String {
    let mut out = format!("## Plan `{}`\n\n", e.graph.replace('`', "'"));
    out.push_str(&table::render_markdown(&columns(), &rows(e, Some(80))));
    out.push_str("\n### Summary\n\n");
    for (k, v) in summary_lines(&e.summary) {
        let _ = writeln!(out, "- **{k}**: {v}");
    }
    let f = &e.fusion;
    let _ = writeln!(
        out,
        "\n### Fusion\n\n{} candidate pairs, {} fused, {} rejected.",
        f.candidates,
        f.fused,
        f.rejected.len()
    );
    if !f.rejected.is_empty() {
        out.push('\n');
        let cols = vec![Column::left("producer"), Column::left("consumer"), Column::left("reason")];
        let rows: Vec<Vec<String>> =
            f.rejected.iter().map(|r| vec![r.producer.clone(), r.consumer.clone(), r.reason.clone()]).collect();
        out.push_str(&table::render_markdown(&cols, &rows));
    }
    if let Some(p) = &e.precision {
        let counts: Vec<String> = p.counts.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let _ = writeln!(out, "\n### Precision {}\n\nNodes: {}.\n", p.precision, counts.join(", "));
        let cols = vec![Column::left("node"), Column::left("op"), Column::left("dtype"), Column::left("rule")];
        let rows: Vec<Vec<String>> = p.lines().into_iter().map(|l| l.to_vec()).collect();
        out.push_str(&table::render_markdown(&cols, &rows));
    }
    out
}

/// The JSON rendering: one object.
pub fn render_json(e: &Explain) -> anyhow::Result<String> {
    Ok(serde_json::to_string_pretty(e)?)
}
