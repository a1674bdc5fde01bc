//! Profitability: the score of a merge (bytes and launches in one unit) and the concurrency model that rejects
//! merges which lengthen the critical path (module docs of `fusion`).

use graph_ir::{DType, OpCost};

use super::dense::{Dense, NONE};
use super::rules::{Groups, Preview, Why};
use crate::device::DeviceProfile;
use crate::target::Target;

/// The cost model of one run of the pass.
pub(super) struct Model {
    device: DeviceProfile,
    /// Launch overhead per kernel, microseconds (graph replay: plans are captured).
    overhead_us: f64,
    /// Bytes the device moves during one launch overhead.
    pub launch_bytes: u64,
    /// Concurrency check on (more than one stream).
    pub concurrent: bool,
    /// Per node: FLOPs (zeros unless concurrent).
    pub flops: Vec<u64>,
    /// Per node: earliest finish in the unfused schedule with unlimited streams.
    finish: Vec<f64>,
    /// Per node: longest time from the node's start to the end of the graph.
    tail: Vec<f64>,
    /// The unfused critical path.
    critical: f64,
}

impl Model {
    pub fn new(d: &Dense<'_>, target: &Target) -> Model {
        let device = target.device.clone();
        let overhead_us = device.launch_overhead_graph_us.max(0.0);
        let launch_bytes = (overhead_us * device.mem_bandwidth / 1e6).max(0.0) as u64;
        let concurrent = target.streams > 1;
        let n = d.len();
        let (mut flops, mut finish, mut tail) = (Vec::new(), Vec::new(), Vec::new());
        let mut critical = 0f64;
        if concurrent {
            flops = vec![0u64; n];
            finish = vec![0f64; n];
            tail = vec![0f64; n];
            let mut tau = vec![0f64; n];
            let mut start = vec![0f64; n];
            for i in 0..n {
                if d.is_view(i as u32) {
                    continue;
                }
                let cost = d.cost[i];
                flops[i] = cost.flops;
                let dtype =
                    d.outputs(i as u32).first().map_or(DType::F32, |&t| d.graph.tensor(d.tids[t as usize]).dtype);
                tau[i] = device.roofline_us(&cost, dtype) + overhead_us;
                finish[i] = start[i] + tau[i];
                for &c in d.succ(i as u32) {
                    start[c as usize] = start[c as usize].max(finish[i]);
                }
            }
            for i in (0..n).rev() {
                if d.is_view(i as u32) {
                    continue;
                }
                let after = d.succ(i as u32).iter().map(|&c| tail[c as usize]).fold(0f64, f64::max);
                tail[i] = tau[i] + after;
                critical = critical.max(start[i] + tail[i]);
            }
        }
        Model { device, overhead_us, launch_bytes, concurrent, flops, finish, tail, critical }
    }

    /// `bytes saved + launch_bytes` (see the module docs).
    pub fn score(&self, d: &Dense<'_>, groups: &Groups, a: u32, b: u32) -> i64 {
        let s = groups.bytes_saved(d, a, b).saturating_add(self.launch_bytes);
        i64::try_from(s).unwrap_or(i64::MAX)
    }

    /// The longest modelled path through a kernel with these lists: when its inputs are ready, plus its
    /// roofline time and overhead, plus the longest tail after the readers of what it writes.
    /// Also returns the kernel's roofline time (its work on the whole device).
    fn path(
        &self,
        d: &Dense<'_>,
        inputs: &[u32],
        escaping: &[u32],
        flops: u64,
        inside: &dyn Fn(u32) -> bool,
    ) -> (f64, f64) {
        let mut ready = 0f64;
        for &t in inputs {
            let p = d.kprod[t as usize];
            if p != NONE {
                ready = ready.max(self.finish[p as usize]);
            }
        }
        let bytes = inputs.iter().chain(escaping).map(|&t| d.bytes[t as usize]).fold(0u64, u64::saturating_add);
        let cost = OpCost { flops, bytes_read: bytes, bytes_written: 0 };
        let roofline = self.device.roofline_us(&cost, DType::F32);
        let time = roofline + self.overhead_us;
        let mut after = 0f64;
        for &t in escaping {
            for &c in d.readers(t).iter().filter(|&&c| !inside(c)) {
                after = after.max(self.tail[c as usize]);
            }
        }
        (ready + time + after, roofline)
    }

    /// `Some(why)` when merging `a` and `b` into `pv` lengthens the critical path (module docs).
    pub fn loses_concurrency(&self, d: &Dense<'_>, groups: &Groups, a: u32, b: u32, pv: &Preview) -> Option<Why> {
        if !self.concurrent {
            return None;
        }
        let owner = &groups.owner;
        let only = |g: u32| move |n: u32| owner[n as usize] == g;
        let both = |n: u32| owner[n as usize] == a || owner[n as usize] == b;
        let (fa, fb) = (groups.g[a as usize].flops, groups.g[b as usize].flops);
        let (pm, _) = self.path(d, &pv.inputs, &pv.escaping, fa.saturating_add(fb), &both);
        // Most merges keep the merged kernel's path within the critical path: the two paths apart are then
        // not needed (the verdict is the same).
        if pm <= self.critical + self.overhead_us {
            return None;
        }
        let pa = self.path(d, groups.inputs(d, a), groups.escaping(d, a), fa, &only(a));
        let pb = self.path(d, groups.inputs(d, b), groups.escaping(d, b), fb, &only(b));
        // Independent kernels run apart share the device: the longer path also waits for the other's work. (After
        // the cycle check, a and b are independent unless an edge joins them; a producer's path already holds
        // its consumer.)
        let feeds = |x: u32, y: u32| {
            groups.inputs(d, y).iter().any(|&t| d.kprod[t as usize] != NONE && only(x)(d.kprod[t as usize]))
        };
        let shared = if feeds(a, b) || feeds(b, a) { 0.0 } else { pa.1.min(pb.1) };
        let apart = pa.0.max(pb.0) + shared;
        (pm > apart + 1e-9).then_some(Why::Concurrency { path: pm, critical: self.critical })
    }
}
