//! Seeing a plan: the step table of `explain`, the memory map as SVG, the kernel DAG as Graphviz DOT, and a
//! progress bar for long commands.
//!
//! Everything here reads a finished `ExecutionPlan` (plus, for fusion decisions, the fusion pass's result), never
//! the passes' internal bookkeeping: the pool tensors and their live ranges are re-derived from the kernels'
//! buffer bindings and the launch order, as `graph_plan::verify` re-derives ordering. A picture that disagrees with
//! the plan's own figures is then a finding, not a tautology (the tests compare the two).

pub mod dot;
pub mod explain;
pub mod progress;
pub mod svg;
pub mod table;

pub use progress::Progress;
pub use svg::memory_svg;
pub use svg::pack_svg;

use graph_plan::{Access, BufferRef, DeviceProfile, ExecutionPlan, GroupKind, KernelId, PlanStep, Region, ValueId};
use std::collections::HashMap;

/// Human-readable bytes in binary units with three significant digits: `512 B`, `2.00 KiB`, `12.5 MiB`.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if b < 1024 {
        return format!("{b} B");
    }
    let mut v = b as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    // Rounding may carry into the next unit's range (1023.96 KiB prints as "1024 KiB"): say 1.00 MiB instead.
    if v >= 999.5 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    let digits = if v < 9.995 {
        2
    } else if v < 99.95 {
        1
    } else {
        0
    };
    format!("{v:.digits$} {}", UNITS[u])
}

/// `s` shortened to at most `width` characters, an ellipsis replacing the end.
pub fn ellipsize(s: &str, width: usize) -> String {
    let n = s.chars().count();
    if n <= width {
        return s.to_string();
    }
    if width == 0 {
        return String::new();
    }
    let mut out: String = s.chars().take(width - 1).collect();
    out.push('…');
    out
}

/// `s` shortened to at most `width` characters, an ellipsis replacing the start: node names such as
/// `/encoder/layer.3/attention/self/query/MatMul` say most at their end.
pub fn ellipsize_front(s: &str, width: usize) -> String {
    let n = s.chars().count();
    if n <= width {
        return s.to_string();
    }
    if width == 0 {
        return String::new();
    }
    let mut out = String::from("…");
    out.extend(s.chars().skip(n - (width - 1)));
    out
}

/// Fused node names abbreviated to fit `width` characters: all of them joined with ` + ` when that fits, else
/// the first and last with the count between, else the first alone with the count, shortened from the front.
pub fn abbreviate_nodes(names: &[&str], width: usize) -> String {
    let full = names.join(" + ");
    if full.chars().count() <= width || names.len() <= 1 {
        return ellipsize_front(&full, width);
    }
    let n = names.len();
    let (first, last) = (names[0], names[n - 1]);
    let middle = format!(" + …{} + ", n - 2);
    let fixed = middle.chars().count();
    if width > fixed + 8 {
        // Share the room between the two names, the last one (usually the epilogue) taking the rest.
        let room = width - fixed;
        let f = first.chars().count().min(room / 2);
        let l = last.chars().count().min(room - f);
        let f = first.chars().count().min(room - l);
        return format!("{}{middle}{}", ellipsize_front(first, f), ellipsize_front(last, l));
    }
    let suffix = format!(" (+{})", n - 1);
    let room = width.saturating_sub(suffix.chars().count());
    if room >= 4 {
        format!("{}{suffix}", ellipsize_front(first, room))
    } else {
        ellipsize(&full, width)
    }
}

/// Text escaped for XML character data and attribute values.
pub fn xml_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            // Control characters are not allowed in XML 1.0; names never need them.
            c if (c as u32) < 0x20 && c != '\t' && c != '\n' && c != '\r' => out.push('?'),
            c => out.push(c),
        }
    }
    out
}

fn align_up(v: u64, a: u64) -> u64 {
    let a = a.max(1);
    v.div_ceil(a).saturating_mul(a)
}

/// A tensor of the activation pool as the plan shows it.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct PoolTensor {
    /// Name of the alias root (the tensor whose writer produces the bytes).
    pub name: String,
    /// First byte in the pool.
    pub offset: u64,
    /// Bytes the tensor needs (the largest binding of the root).
    pub bytes: u64,
    /// Bytes it reserves: `bytes` rounded up to the plan's alignment (what the lower bound counts).
    pub reserved: u64,
    /// First step of its live range (its writer), counting launches and Memcpy copies in submission order: the
    /// launch order of DESIGN.md section 5.
    pub start: u32,
    /// One past its last reader (half-open; a tensor nobody reads lives for its writer's step only).
    pub end: u32,
    /// The kernel that writes it, if a kernel does (a copy may instead).
    pub writer: Option<KernelId>,
    /// The op that produces its bytes (`MatMul`, `Add`, ...; `Copy` for a Memcpy).
    pub op: String,
    /// The writing kernel's shape.
    pub kind: Option<GroupKind>,
}

/// The activation pool of a plan over time.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct PoolMap {
    /// The graph's name.
    pub graph: String,
    /// Pool tensors in order of their first write.
    pub tensors: Vec<PoolTensor>,
    /// Steps of the launch order (launches and Memcpy copies): the time axis.
    pub work_steps: u32,
    /// The plan's pool size.
    pub pool_bytes: u64,
    /// The plan's alignment.
    pub alignment: u64,
}

impl PoolMap {
    /// Reserved bytes live at each work step (the fixed-order lower bound curve of DESIGN.md section 5).
    pub fn live_bytes(&self) -> Vec<u64> {
        let mut delta = vec![0i128; self.work_steps as usize + 1];
        for t in &self.tensors {
            delta[t.start as usize] += t.reserved as i128;
            delta[t.end as usize] -= t.reserved as i128;
        }
        let mut cur = 0i128;
        delta[..self.work_steps as usize]
            .iter()
            .map(|d| {
                cur += d;
                cur.max(0) as u64
            })
            .collect()
    }

    /// The largest value of `live_bytes`.
    pub fn lower_bound(&self) -> u64 {
        self.live_bytes().into_iter().max().unwrap_or(0)
    }
}

/// A root's accesses while the plan is swept.
struct RootUse {
    buffer: BufferRef,
    first_write: Option<u32>,
    last_use: u32,
    /// The step of a kernel that read this root and wrote another one at overlapping bytes (an in-place
    /// handover: the memory pass ends the read root where the written one starts).
    handed_over: Option<u32>,
    writer: Option<KernelId>,
    op: String,
    kind: Option<GroupKind>,
}

/// The op that produces value `v` inside kernel `k`, looking through views to the op that made the bytes.
fn producing_op(k: &graph_plan::Kernel, v: ValueId) -> String {
    let mut v = v;
    for _ in 0..=k.body.len() {
        let Some(instr) = k.body.iter().find(|i| i.outputs.contains(&v)) else { break };
        if instr.op.is_view() {
            if let Some(&inp) = instr.inputs.first() {
                v = inp;
                continue;
            }
        }
        return instr.op.name().to_string();
    }
    // A value the kernel writes without computing it cannot happen; say what we know.
    "?".to_string()
}

/// Derive the pool's tensors and live ranges from the plan alone: kernel parameters bound to the pool give each
/// alias root's bytes, and the steps that write and read them give its live range; Memcpy copies are matched to
/// roots by their buffers. Time counts launches and Memcpy copies in submission order (the copies that fill
/// graph outputs aliasing a source never touch the pool and are left out), so the live ranges are those of the
/// memory pass's `MemoryPlan::buffers` (the tests check that they agree).
pub fn pool_map(plan: &ExecutionPlan) -> PoolMap {
    let mut roots: Vec<RootUse> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut names: Vec<String> = Vec::new();
    let mut time = 0u32;
    // Copies (Memcpy nodes) carry no tensor names: keep them for a second sweep.
    let mut copies: Vec<(u32, BufferRef, BufferRef, Option<String>)> = Vec::new();
    for step in &plan.steps {
        match step {
            PlanStep::Launch { kernel, .. } => {
                if let Some(k) = plan.kernel(*kernel) {
                    for p in &k.params {
                        let i = *index.entry(p.root.to_string()).or_insert_with(|| {
                            roots.push(RootUse {
                                buffer: p.buffer,
                                first_write: None,
                                last_use: time,
                                handed_over: None,
                                writer: None,
                                op: String::new(),
                                kind: None,
                            });
                            names.push(p.root.to_string());
                            roots.len() - 1
                        });
                        let r = &mut roots[i];
                        // Views of a root may bind a shorter range at the same bytes: keep the hull.
                        if p.buffer.region == r.buffer.region {
                            let lo = r.buffer.offset.min(p.buffer.offset);
                            let hi = r.buffer.end().max(p.buffer.end());
                            r.buffer = BufferRef { region: r.buffer.region, offset: lo, bytes: hi - lo };
                        }
                        r.last_use = r.last_use.max(time);
                        if p.access == Access::Write && r.first_write.is_none() {
                            r.first_write = Some(time);
                            r.writer = Some(k.id);
                            r.op = producing_op(k, p.value);
                            r.kind = Some(k.kind);
                        }
                    }
                    for p in k.params.iter().filter(|p| p.access == Access::Read) {
                        let in_place = k
                            .params
                            .iter()
                            .any(|q| q.access == Access::Write && q.root != p.root && q.buffer.overlaps(&p.buffer));
                        if let (true, Some(&i)) = (in_place, index.get(&*p.root)) {
                            roots[i].handed_over = Some(time);
                        }
                    }
                }
                time += 1;
            }
            // A copy that runs a Memcpy node is a step of the launch order; the copies that fill graph outputs
            // aliasing a source are not (they read and write outside the pool, before everything else).
            PlanStep::Copy { src, dst, node: Some(node), .. } => {
                copies.push((time, *src, *dst, Some(node.to_string())));
                time += 1;
            }
            PlanStep::Copy { node: None, .. } => {}
            PlanStep::Record { .. } | PlanStep::Wait { .. } => {}
        }
    }
    for (t, src, dst, node) in copies {
        // The destination: a root some kernel reads but no kernel writes, at exactly these bytes.
        let found = roots
            .iter()
            .position(|r| r.first_write.is_none() && r.buffer.region == dst.region && r.buffer.offset == dst.offset);
        let i = match found {
            Some(i) => i,
            None => {
                names.push(node.clone().map_or_else(|| format!("copy@{t}"), |n| format!("{n} (copy)")));
                roots.push(RootUse {
                    buffer: dst,
                    first_write: None,
                    last_use: t,
                    handed_over: None,
                    writer: None,
                    op: String::new(),
                    kind: None,
                });
                roots.len() - 1
            }
        };
        let r = &mut roots[i];
        r.first_write = Some(r.first_write.map_or(t, |w| w.min(t)));
        r.last_use = r.last_use.max(t);
        r.op = "Copy".into();
        r.kind = Some(GroupKind::Copy);
        // The source: the root at those bytes written most recently before the copy.
        if let Some(j) = roots
            .iter()
            .enumerate()
            .filter(|(_, r)| r.buffer.overlaps(&src) && r.first_write.is_some_and(|w| w < t))
            .max_by_key(|(_, r)| r.first_write)
            .map(|(j, _)| j)
        {
            roots[j].last_use = roots[j].last_use.max(t);
        }
    }
    let a = plan.alignment();
    let mut tensors: Vec<PoolTensor> = roots
        .into_iter()
        .zip(names)
        .filter(|(r, _)| r.buffer.region == Region::Pool)
        .map(|(r, name)| {
            let start = r.first_write.unwrap_or(0);
            PoolTensor {
                name,
                offset: r.buffer.offset,
                bytes: r.buffer.bytes,
                reserved: align_up(r.buffer.bytes.max(1), a),
                start,
                // A root handed over in place at its last use ends where its successor starts, as in the memory
                // pass; any other root is live through its last use.
                end: if r.handed_over == Some(r.last_use) && r.last_use > start {
                    r.last_use
                } else {
                    r.last_use.max(start) + 1
                },
                writer: r.writer,
                op: if r.op.is_empty() { "?".into() } else { r.op },
                kind: r.kind,
            }
        })
        .collect();
    tensors.sort_by(|x, y| (x.start, x.offset, &x.name).cmp(&(y.start, y.offset, &y.name)));
    PoolMap {
        graph: plan.graph_name().to_string(),
        tensors,
        work_steps: time,
        pool_bytes: plan.pool_bytes as u64,
        alignment: a,
    }
}

/// The device profile a plan's estimates were made for (the plan carries it).
pub fn plan_device(plan: &ExecutionPlan) -> DeviceProfile {
    plan.device().clone()
}

/// Modelled time of a copy of `bytes` without launch overhead: read and write at DRAM bandwidth (as exec-sim's
/// timing model has it).
pub fn copy_time_us(bytes: u64, device: &DeviceProfile) -> f64 {
    2.0 * bytes as f64 / device.mem_bandwidth * 1e6
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn human_bytes_examples() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1024), "1.00 KiB");
        assert_eq!(human_bytes(1536), "1.50 KiB");
        assert_eq!(human_bytes(12 * 1024 + 512), "12.5 KiB");
        assert_eq!(human_bytes(768 * 1024), "768 KiB");
        assert_eq!(human_bytes(1024 * 1024 - 1), "1.00 MiB");
        assert_eq!(human_bytes(5_177_344), "4.94 MiB");
        assert_eq!(human_bytes(u64::MAX), "16.0 EiB");
    }

    #[test]
    fn ellipsis_examples() {
        assert_eq!(ellipsize("abcdef", 4), "abc…");
        assert_eq!(ellipsize("abc", 4), "abc");
        assert_eq!(ellipsize_front("/a/b/MatMul", 7), "…MatMul");
        assert_eq!(abbreviate_nodes(&["a", "b"], 20), "a + b");
        assert_eq!(abbreviate_nodes(&["l0.bias", "l0.relu", "l0.gelu", "l0.out"], 24), "l0.bias + …2 + l0.out");
        assert_eq!(abbreviate_nodes(&["first", "x", "y"], 12), "first (+2)");
    }

    proptest! {
        #[test]
        fn abbreviations_fit(names in prop::collection::vec("[a-z/._]{0,30}", 1..8), width in 0usize..80) {
            let refs: Vec<&str> = names.iter().map(String::as_str).collect();
            let s = abbreviate_nodes(&refs, width);
            prop_assert!(s.chars().count() <= width, "{s:?} wider than {width}");
            prop_assert!(ellipsize(&names[0], width).chars().count() <= width);
            prop_assert!(ellipsize_front(&names[0], width).chars().count() <= width);
            if names.join(" + ").chars().count() <= width {
                prop_assert_eq!(s, names.join(" + "));
            }
        }

        #[test]
        fn human_bytes_is_short_and_monotone_in_unit(b in any::<u64>()) {
            let s = human_bytes(b);
            prop_assert!(s.len() <= 9, "{s}");
            let number: f64 = s.split(' ').next().unwrap().parse().unwrap();
            prop_assert!(number < 1024.0);
        }
    }
}
