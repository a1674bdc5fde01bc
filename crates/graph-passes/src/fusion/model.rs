//! Profitability: the score of a merge (bytes and launches in one unit) and the concurrency model that rejects
//! merges which lengthen the critical path (module docs of `fusion`).

use graph_ir::{DType, OpCost, TensorId};

use super::dense::Dense;
use super::rules::{Group, Preview};
use super::FusionTarget;
use crate::device::DeviceProfile;

/// The cost model of one run of the pass.
pub(super) struct Model {
    device: DeviceProfile,
    /// Launch overhead per kernel, microseconds (graph replay: plans are captured).
    overhead_us: f64,
    /// Bytes the device moves during one launch overhead.
    pub launch_bytes: u64,
    /// Concurrency check on (more than one stream).
    pub concurrent: bool,
    /// Per node: earliest finish in the unfused schedule with unlimited streams.
    finish: Vec<f64>,
    /// Per node: longest time from the node's start to the end of the graph.
    tail: Vec<f64>,
    /// The unfused critical path.
    pub critical: f64,
}

impl Model {
    pub fn new(d: &Dense<'_>, target: &FusionTarget) -> Model {
        let device = target.device.clone();
        let overhead_us = device.launch_overhead_graph_us.max(0.0);
        let launch_bytes = (overhead_us * device.mem_bandwidth / 1e6).max(0.0) as u64;
        let concurrent = target.streams > 1;
        let n = d.len();
        let mut finish = vec![0f64; n];
        let mut tail = vec![0f64; n];
        let mut critical = 0f64;
        if concurrent {
            let mut tau = vec![0f64; n];
            let mut start = vec![0f64; n];
            for i in 0..n {
                if d.is_view(i as u32) {
                    continue;
                }
                let id = d.ids[i];
                let dtype = d.outputs(i as u32).first().map_or(DType::F32, |&t| d.graph.tensor(t).dtype);
                tau[i] = device.roofline_us(&d.graph.node_cost(id), dtype) + overhead_us;
                finish[i] = start[i] + tau[i];
                for &c in &d.succ[i] {
                    start[c as usize] = start[c as usize].max(finish[i]);
                }
            }
            for i in (0..n).rev() {
                if d.is_view(i as u32) {
                    continue;
                }
                let after = d.succ[i].iter().map(|&c| tail[c as usize]).fold(0f64, f64::max);
                tail[i] = tau[i] + after;
                critical = critical.max(start[i] + tail[i]);
            }
        }
        Model { device, overhead_us, launch_bytes, concurrent, finish, tail, critical }
    }

    /// Bytes a kernel moves: its distinct inputs read plus the tensors it writes.
    pub fn bytes(d: &Dense<'_>, inputs: &[TensorId], escaping: &[TensorId]) -> u64 {
        inputs.iter().chain(escaping).map(|&t| d.bytes(t)).fold(0u64, u64::saturating_add)
    }

    /// `bytes(a) + bytes(b) - bytes(merged)` plus one launch's worth of bytes (see the module docs).
    pub fn score(&self, d: &Dense<'_>, a: &Group, b: &Group, pv: &Preview) -> i64 {
        let before = Self::bytes(d, &a.inputs, &a.escaping).saturating_add(Self::bytes(d, &b.inputs, &b.escaping));
        let after = Self::bytes(d, &pv.inputs, &pv.escaping);
        let saved = before as i128 - after as i128 + self.launch_bytes as i128;
        saved.clamp(i64::MIN as i128, i64::MAX as i128) as i64
    }

    /// The longest modelled path through a kernel with these figures: when its inputs are ready, plus its
    /// roofline time and overhead, plus the longest tail after the readers of what it writes.
    pub fn path(
        &self,
        d: &Dense<'_>,
        inputs: &[TensorId],
        escaping: &[TensorId],
        flops: u64,
        inside: &dyn Fn(u32) -> bool,
    ) -> f64 {
        let ready = inputs.iter().filter_map(|&t| d.producer(t)).map(|p| self.finish[p as usize]).fold(0f64, f64::max);
        let bytes = Self::bytes(d, inputs, escaping);
        let cost = OpCost { flops, bytes_read: bytes, bytes_written: 0 };
        let time = self.device.roofline_us(&cost, DType::F32) + self.overhead_us;
        let mut after = 0f64;
        for &t in escaping {
            if let Some(r) = d.readers(t) {
                for &c in r.cons.iter().filter(|&&c| !inside(c)) {
                    after = after.max(self.tail[c as usize]);
                }
            }
        }
        ready + time + after
    }

    /// `Some(detail)` when merging `a` and `b` into `pv` lengthens the critical path (module docs).
    pub fn loses_concurrency(
        &self,
        d: &Dense<'_>,
        a: &Group,
        b: &Group,
        pv: &Preview,
        owner: &[u32],
        ids: (u32, u32),
    ) -> Option<String> {
        if !self.concurrent {
            return None;
        }
        let only = |g: u32| move |n: u32| owner[n as usize] == g;
        let both = |n: u32| owner[n as usize] == ids.0 || owner[n as usize] == ids.1;
        let pa = self.path(d, &a.inputs, &a.escaping, a.flops, &only(ids.0));
        let pb = self.path(d, &b.inputs, &b.escaping, b.flops, &only(ids.1));
        let pm = self.path(d, &pv.inputs, &pv.escaping, pv.flops, &both);
        let slack = self.overhead_us;
        (pm > self.critical + slack && pm > pa.max(pb) + 1e-9).then(|| {
            format!(
                "the path through the merged kernel ({pm:.2} us) would exceed the critical path ({:.2} us)",
                self.critical
            )
        })
    }
}
