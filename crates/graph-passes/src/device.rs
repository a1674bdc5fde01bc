//! The cost model: device profiles and each launch's modelled time and occupancy (DESIGN.md section 5).
//!
//! A launch takes its roofline time, `max(flops / peak, bytes / bandwidth)`, plus a launch overhead (eager
//! submission or CUDA-graph replay), and occupies `min(1, grid blocks / (SMs x resident blocks per SM))` of the
//! device. The stream pass and exec-sim's timing model both use these figures.

use graph_ir::{ComputeGraph, DType, OpCost};
use serde::{Deserialize, Serialize};

use crate::fusion::{FusedGroup, GroupKind};

/// What the timing model knows of a GPU.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceProfile {
    /// Name shown in reports.
    pub name: String,
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// Thread blocks of 256 threads resident per SM.
    pub blocks_per_sm: u32,
    /// Peak FP32 FLOP/s (CUDA cores).
    pub peak_flops_f32: f64,
    /// Peak FP16/BF16 FLOP/s (tensor cores, dense).
    pub peak_flops_f16: f64,
    /// Peak integer op/s.
    pub peak_ops_int: f64,
    /// DRAM bandwidth in bytes/s.
    pub mem_bandwidth: f64,
    /// Per-launch overhead with eager submission, microseconds.
    pub launch_overhead_eager_us: f64,
    /// Per-launch overhead inside a replayed CUDA graph, microseconds.
    pub launch_overhead_graph_us: f64,
}

impl DeviceProfile {
    /// An H200-class device (132 SMs, 4.8 TB/s HBM3e).
    pub fn h200() -> Self {
        DeviceProfile {
            name: "h200".into(),
            sm_count: 132,
            blocks_per_sm: 8,
            peak_flops_f32: 67.0e12,
            peak_flops_f16: 989.0e12,
            peak_ops_int: 33.5e12,
            mem_bandwidth: 4.8e12,
            launch_overhead_eager_us: 4.0,
            launch_overhead_graph_us: 1.0,
        }
    }

    /// A small device (T4-class: 40 SMs, 320 GB/s), where overlap matters more.
    pub fn small() -> Self {
        DeviceProfile {
            name: "small".into(),
            sm_count: 40,
            blocks_per_sm: 4,
            peak_flops_f32: 8.1e12,
            peak_flops_f16: 65.0e12,
            peak_ops_int: 4.0e12,
            mem_bandwidth: 320.0e9,
            launch_overhead_eager_us: 5.0,
            launch_overhead_graph_us: 1.5,
        }
    }

    /// A built-in profile by name (`h200`, `small`).
    pub fn by_name(name: &str) -> Option<Self> {
        match name {
            "h200" => Some(Self::h200()),
            "small" => Some(Self::small()),
            _ => None,
        }
    }

    /// Peak arithmetic rate for `dtype`.
    pub fn peak_for(&self, dtype: DType) -> f64 {
        match dtype {
            DType::F32 => self.peak_flops_f32,
            DType::F16 | DType::BF16 => self.peak_flops_f16,
            _ => self.peak_ops_int,
        }
    }

    /// Roofline time of `cost` in microseconds, without launch overhead.
    pub fn roofline_us(&self, cost: &OpCost, dtype: DType) -> f64 {
        let compute = cost.flops as f64 / self.peak_for(dtype);
        let memory = cost.bytes() as f64 / self.mem_bandwidth;
        compute.max(memory) * 1e6
    }

    /// Fraction of the device a grid of `blocks` occupies (capped at 1).
    pub fn occupancy(&self, blocks: u64) -> f64 {
        let slots = (self.sm_count as u64 * self.blocks_per_sm as u64).max(1);
        (blocks as f64 / slots as f64).clamp(1.0 / slots as f64, 1.0)
    }
}

impl Default for DeviceProfile {
    fn default() -> Self {
        Self::h200()
    }
}

/// The modelled figures of one launch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LaunchEstimate {
    /// Roofline time in microseconds (without overhead).
    pub time_us: f64,
    /// Thread blocks of the launch.
    pub grid_blocks: u64,
    /// Fraction of the device it occupies.
    pub occupancy: f64,
}

/// Estimate a fused group's launch: its cost is the sum of its nodes' minus the traffic of intermediates that
/// never leave the kernel; its grid follows the kernel shape.
pub fn estimate_group(graph: &ComputeGraph, group: &FusedGroup, device: &DeviceProfile) -> (OpCost, LaunchEstimate) {
    let mut flops = 0u64;
    for &n in &group.nodes {
        flops = flops.saturating_add(graph.node_cost(n).flops);
    }
    let read: u64 = group.inputs.iter().map(|&t| graph.tensor(t).size_bytes() as u64).fold(0, u64::saturating_add);
    let written: u64 = group.outputs.iter().map(|&t| graph.tensor(t).size_bytes() as u64).fold(0, u64::saturating_add);
    let cost = OpCost { flops, bytes_read: read, bytes_written: written };
    let out_elems: u64 =
        group.outputs.iter().map(|&t| graph.tensor(t).shape.numel().unwrap_or(0) as u64).max().unwrap_or(1);
    let dtype = group.outputs.first().map_or(DType::F32, |&t| graph.tensor(t).dtype);
    let grid = grid_blocks(graph, group, out_elems);
    let est = LaunchEstimate {
        time_us: device.roofline_us(&cost, dtype),
        grid_blocks: grid,
        occupancy: device.occupancy(grid),
    };
    (cost, est)
}

/// Thread blocks a kernel of this shape launches (256 threads per block).
fn grid_blocks(graph: &ComputeGraph, group: &FusedGroup, out_elems: u64) -> u64 {
    match group.kind {
        GroupKind::Anchor => {
            // Tiled: one block per 64x64 output tile, approximated from the output element count.
            out_elems.div_ceil(64 * 64).max(1)
        }
        GroupKind::Reduction => {
            // One block per reduced row: the output rows of the reduction's input.
            let rows = group
                .nodes
                .iter()
                .find_map(|&n| {
                    let node = graph.node(n);
                    (node.op.category() == graph_ir::OpCategory::Reduction).then(|| {
                        let s = &graph.tensor(node.inputs[0]).shape;
                        let last = s.dims().last().copied().unwrap_or(1).max(1) as u64;
                        (s.numel().unwrap_or(0) as u64 / last).max(1)
                    })
                })
                .unwrap_or(1);
            rows
        }
        GroupKind::Custom => 1,
        _ => out_elems.div_ceil(256 * 4).max(1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roofline_picks_the_binding_resource() {
        let d = DeviceProfile::h200();
        let mem = OpCost { flops: 0, bytes_read: 4_800_000, bytes_written: 0 };
        assert!((d.roofline_us(&mem, DType::F32) - 1.0).abs() < 1e-9);
        let comp = OpCost { flops: 67_000_000, bytes_read: 0, bytes_written: 0 };
        assert!((d.roofline_us(&comp, DType::F32) - 1.0).abs() < 1e-9);
        assert_eq!(d.occupancy(10_000), 1.0);
        assert!((d.occupancy(132 * 4) - 0.5).abs() < 1e-12);
    }
}
