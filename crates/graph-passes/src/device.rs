//! Device profiles: what the cost model knows of a GPU (SMs, residency, peak FLOPs per dtype, DRAM and host
//! bandwidth, launch overheads), the occupancy of a grid, and the roofline time of a cost. What each fused
//! launch costs on a profile is in [`crate::estimate`]; this module knows nothing of fusion, so fusion,
//! the estimate and the timing evaluator all depend on it and it on none of them.

use graph_ir::{DType, OpCost};
use serde::{Deserialize, Serialize};

/// What the timing model knows of a GPU.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceProfile {
    /// Name shown in reports.
    pub name: String,
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// Thread blocks of 256 threads resident per SM (threads per SM / 256).
    pub blocks_per_sm: u32,
    /// Peak FP32 FLOP/s (CUDA cores).
    pub peak_flops_f32: f64,
    /// Peak FP16/BF16 FLOP/s (tensor cores, dense).
    pub peak_flops_f16: f64,
    /// Peak integer op/s.
    pub peak_ops_int: f64,
    /// DRAM bandwidth in bytes/s.
    pub mem_bandwidth: f64,
    /// Host <-> device bandwidth (pinned memory) in bytes/s.
    #[serde(default = "default_host_bandwidth")]
    pub host_bandwidth: f64,
    /// Per-launch overhead with eager submission, microseconds.
    pub launch_overhead_eager_us: f64,
    /// Per-launch overhead inside a replayed CUDA graph, microseconds.
    pub launch_overhead_graph_us: f64,
}

fn default_host_bandwidth() -> f64 {
    25.0e9
}

impl DeviceProfile {
    /// An H200-class device (132 SMs, 2048 threads per SM, 4.8 TB/s HBM3e, PCIe 5).
    pub fn h200() -> Self {
        DeviceProfile {
            name: "h200".into(),
            sm_count: 132,
            blocks_per_sm: 8,
            peak_flops_f32: 67.0e12,
            peak_flops_f16: 989.0e12,
            peak_ops_int: 33.5e12,
            mem_bandwidth: 4.8e12,
            host_bandwidth: 55.0e9,
            launch_overhead_eager_us: 4.0,
            launch_overhead_graph_us: 1.0,
        }
    }

    /// A small device (T4-class: 40 SMs, 1024 threads per SM, 320 GB/s, PCIe 3), where overlap matters more.
    pub fn small() -> Self {
        DeviceProfile {
            name: "small".into(),
            sm_count: 40,
            blocks_per_sm: 4,
            peak_flops_f32: 8.1e12,
            peak_flops_f16: 65.0e12,
            peak_ops_int: 4.0e12,
            mem_bandwidth: 320.0e9,
            host_bandwidth: 12.0e9,
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

    /// Roofline time of `cost` in microseconds on the whole device, without launch overhead.
    pub fn roofline_us(&self, cost: &OpCost, dtype: DType) -> f64 {
        let compute = cost.flops as f64 / self.peak_for(dtype).max(1.0);
        let memory = cost.bytes() as f64 / self.mem_bandwidth.max(1.0);
        compute.max(memory) * 1e6
    }

    /// Fraction of the device a grid of `blocks` 256-thread blocks occupies (capped at 1).
    pub fn occupancy(&self, blocks: u64) -> f64 {
        self.occupancy_of(&Grid { blocks, threads: 256, tiles_per_sm: None })
    }

    /// Resident blocks of `grid`'s shape per SM.
    fn resident_per_sm(&self, grid: &Grid) -> u64 {
        let by_threads = (self.blocks_per_sm as u64 * 256 / grid.threads.max(1) as u64).max(1);
        grid.tiles_per_sm.map_or(by_threads, |t| by_threads.min(t as u64))
    }

    /// Fraction of the device's resident-block slots `grid` fills, in `(0, 1]`.
    pub fn occupancy_of(&self, grid: &Grid) -> f64 {
        let slots = (self.sm_count.max(1) as u64).saturating_mul(self.resident_per_sm(grid)).max(1);
        (grid.blocks.max(1) as f64 / slots as f64).clamp(1.0 / slots as f64, 1.0)
    }

    /// Fraction of the SMs a grid of `blocks` reaches (the share of the device's pipelines it can use).
    pub fn sm_fraction(&self, blocks: u64) -> f64 {
        (blocks.max(1) as f64 / self.sm_count.max(1) as f64).min(1.0)
    }
}

impl Default for DeviceProfile {
    fn default() -> Self {
        Self::h200()
    }
}

/// The launch shape of a kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grid {
    /// Thread blocks.
    pub blocks: u64,
    /// Threads per block.
    pub threads: u32,
    /// Shared-memory limit on resident blocks per SM (GEMM tiles), if any.
    pub tiles_per_sm: Option<u32>,
}

/// The modelled figures of one launch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LaunchEstimate {
    /// Modelled time in microseconds, without launch overhead: the roofline over the SMs the grid reaches.
    pub time_us: f64,
    /// Thread blocks of the launch.
    pub grid_blocks: u64,
    /// Fraction of the device it occupies, in `(0, 1]`.
    pub occupancy: f64,
    /// Roofline time on the whole device, microseconds (`time_us` when the grid reaches every SM).
    #[serde(default)]
    pub roofline_us: f64,
    /// Threads per block.
    #[serde(default)]
    pub threads_per_block: u32,
}
