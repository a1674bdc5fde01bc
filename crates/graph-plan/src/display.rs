//! The plan's readable listing: a header with the counts, then one line per step.

use std::fmt;

use crate::plan::{ExecutionPlan, PlanStep};

impl fmt::Display for ExecutionPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "plan '{}': {} steps on {} stream{}, {} launches ({} nodes), {} event{}, pool {} B (bound {} B, naive {} B)",
            self.graph_name,
            self.steps.len(),
            self.num_streams,
            if self.num_streams == 1 { "" } else { "s" },
            self.kernel_count_fused,
            self.kernel_count_original,
            self.event_count,
            if self.event_count == 1 { "" } else { "s" },
            self.pool_bytes,
            self.stats.lower_bound_bytes,
            self.stats.naive_bytes,
        )?;
        for (i, step) in self.steps.iter().enumerate() {
            write!(f, "  #{i:<4} {:<4} ", step.stream().to_string())?;
            match step {
                PlanStep::Launch { kernel, reads, writes, .. } => {
                    let nodes: Vec<&str> = self.kernel(*kernel).map(|k| k.node_names().collect()).unwrap_or_default();
                    write!(f, "launch {kernel} [{}]", nodes.join(" + "))?;
                    if !reads.is_empty() {
                        let r: Vec<String> = reads.iter().map(ToString::to_string).collect();
                        write!(f, " reads {}", r.join(" "))?;
                    }
                    if !writes.is_empty() {
                        let w: Vec<String> = writes.iter().map(ToString::to_string).collect();
                        write!(f, " writes {}", w.join(" "))?;
                    }
                    writeln!(f)?;
                }
                PlanStep::Record { event, .. } => writeln!(f, "record {event}")?,
                PlanStep::Wait { event, .. } => writeln!(f, "wait   {event}")?,
                PlanStep::Copy { src, dst, bytes, node, .. } => writeln!(
                    f,
                    "copy   {src} -> {dst} ({bytes} B){}",
                    node.as_ref().map(|n| format!(" [{n}]")).unwrap_or_default()
                )?,
            }
        }
        Ok(())
    }
}
