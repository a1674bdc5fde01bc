//! `FusionPlan::explain` and its serialisable form: every group with its nodes and kind, and every rejected
//! candidate with its reason, so a user sees why two ops did not fuse.

use graph_ir::ComputeGraph;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write;

use super::{FusionDecision, FusionPlan, FusionStats, GroupKind};

/// One group as the report lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupReport {
    /// Display id (`g3`), the group's index in execution order.
    pub id: String,
    /// Kernel kind.
    pub kind: GroupKind,
    /// Node names in program order (views inside included).
    pub nodes: Vec<String>,
    /// Op names, parallel to `nodes`.
    pub ops: Vec<String>,
    /// Tensors read from outside.
    pub inputs: Vec<String>,
    /// Tensors written for other kernels or as graph outputs.
    pub outputs: Vec<String>,
    /// Bytes the kernel moves (inputs read plus outputs written).
    pub bytes: u64,
}

/// A decision as the report lists it.
pub type DecisionReport = FusionDecision;

/// The serialisable explanation of a fusion plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FusionReport {
    /// The graph's name.
    pub graph: String,
    /// Non-view nodes (kernels without fusion).
    pub kernels_unfused: usize,
    /// Groups (kernels with fusion).
    pub kernels_fused: usize,
    /// Groups in execution order.
    pub groups: Vec<GroupReport>,
    /// Every candidate that was not fused, with its reason.
    pub rejected: Vec<DecisionReport>,
    /// Rejections per reason code.
    pub rejected_by_reason: BTreeMap<String, usize>,
    /// Counters of the pass.
    pub stats: FusionStats,
}

impl FusionPlan {
    /// The explanation as data (what `explain` prints).
    pub fn report(&self, graph: &ComputeGraph) -> FusionReport {
        let names =
            |ts: &[graph_ir::TensorId]| ts.iter().map(|&t| graph.tensor(t).name.to_string()).collect::<Vec<_>>();
        let groups: Vec<GroupReport> = self
            .groups
            .iter()
            .enumerate()
            .map(|(i, g)| GroupReport {
                id: format!("g{i}"),
                kind: g.kind,
                nodes: g.nodes.iter().map(|&n| graph.node(n).name.to_string()).collect(),
                ops: g.nodes.iter().map(|&n| graph.node(n).op.name().to_string()).collect(),
                inputs: names(&g.inputs),
                outputs: names(&g.outputs),
                bytes: g
                    .inputs
                    .iter()
                    .chain(&g.outputs)
                    .map(|&t| graph.tensor(t).size_bytes() as u64)
                    .fold(0u64, u64::saturating_add),
            })
            .collect();
        let rejected: Vec<DecisionReport> = self.rejections().cloned().collect();
        let mut by_reason: BTreeMap<String, usize> = BTreeMap::new();
        for d in &rejected {
            if let Some(r) = d.rejected {
                *by_reason.entry(r.code().to_string()).or_default() += 1;
            }
        }
        FusionReport {
            graph: graph.name().to_string(),
            kernels_unfused: graph.nodes().filter(|(_, n)| !n.op.is_view()).count(),
            kernels_fused: self.groups.len(),
            groups,
            rejected,
            rejected_by_reason: by_reason,
            stats: self.stats.clone(),
        }
    }

    /// A readable explanation: each group with its nodes and kind, then each rejected candidate with its reason
    /// code and specifics.
    pub fn explain(&self, graph: &ComputeGraph) -> String {
        let r = self.report(graph);
        let mut s = String::new();
        let _ = writeln!(
            s,
            "fusion of '{}': {} ops -> {} kernels ({} merges vertical, {} multi-output, {} horizontal, {} attention \
             chains; {} of {} views inside kernels{})",
            r.graph,
            r.kernels_unfused,
            r.kernels_fused,
            r.stats.merges_vertical,
            r.stats.merges_multi_output,
            r.stats.merges_horizontal,
            r.stats.merges_attention,
            r.stats.views_absorbed,
            r.stats.views,
            match r.stats.concats_eliminated {
                0 => String::new(),
                n => format!("; {n} concats eliminated"),
            }
        );
        let _ = writeln!(s, "groups:");
        for g in &r.groups {
            let nodes: Vec<String> = g.nodes.iter().zip(&g.ops).map(|(n, o)| format!("{n}({o})")).collect();
            let _ = writeln!(s, "  {} {}: {}", g.id, g.kind.name(), nodes.join(" "));
            let _ = writeln!(s, "      reads {} writes {} ({} bytes)", list(&g.inputs), list(&g.outputs), g.bytes);
        }
        if r.rejected.is_empty() {
            let _ = writeln!(s, "rejected: none");
        } else {
            let counts: Vec<String> = r.rejected_by_reason.iter().map(|(k, v)| format!("{k} {v}")).collect();
            let _ = writeln!(s, "rejected ({}):", counts.join(", "));
            for d in &r.rejected {
                let code = d.rejected.map_or("", |x| x.code());
                let arrow = if d.phase == super::FusionPhase::Horizontal { "<->" } else { "->" };
                if d.producer == d.consumer {
                    // A verdict on one node (a Concat kept as a kernel), not an edge.
                    let _ = write!(s, "  {} [{code}] ({}", d.consumer, d.phase.name());
                } else {
                    let _ = write!(s, "  {} {arrow} {} [{code}] ({}", d.producer, d.consumer, d.phase.name());
                }
                if !d.tensor.is_empty() {
                    let _ = write!(s, ", via {}", d.tensor);
                }
                let _ = write!(s, ")");
                if !d.detail.is_empty() {
                    let _ = write!(s, ": {}", d.detail);
                }
                let _ = writeln!(s);
            }
        }
        s
    }
}

fn list(v: &[String]) -> String {
    if v.is_empty() {
        "-".to_string()
    } else {
        v.join(", ")
    }
}
