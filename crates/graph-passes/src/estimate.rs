//! The cost model: each fused launch's grid, modelled time and occupancy on a device profile (DESIGN.md
//! section 5).
//!
//! **Grid.** Each kernel kind gets the grid a real implementation would launch:
//! - GEMM-like anchors (MatMul, Gemm, Conv as implicit GEMM with `M = N x OH x OW`, `N = Cout / group`,
//!   `K = Cin / group x KH x KW`, one GEMM per group): output tiles, the largest of 128x128, 128x64, 64x64, 32x32
//!   that still gives a block to every SM, and split-K (at most 16 ways, at least 128 of K per slice) when even
//!   the smallest tiles leave SMs idle, as cuBLAS's heuristics do;
//! - elementwise and data-movement kernels and pools: one 256-thread block per 1024 output elements (4 per
//!   thread);
//! - reductions: the reduced extent `len` and the `rows = numel / len` are read off the op's axes; rows of up
//!   to 1024 elements go one warp each (8 rows per block), longer rows a block each, split across several
//!   blocks (at least 2048 elements per block) when there are too few rows to fill the device;
//! - custom kernels: their declared grid and block; copies: one block (copy engines use no SMs to speak of).
//!
//! **Occupancy** is the fraction of the device's resident-block slots the grid fills, capped at 1:
//! `blocks / (SMs x resident blocks per SM)`, where residency follows threads per block (GEMM tiles are limited
//! by shared memory: one 128x128 tile per SM, two of the smaller ones).
//!
//! **Time.** The roofline `max(flops / peak(dtype), bytes / bandwidth)` is the time of a launch that has every
//! SM. A grid of fewer blocks than SMs reaches only `blocks / SMs` of the device's arithmetic and memory
//! pipelines, so its time is the roofline divided by that fraction (a one-block kernel runs on one SM). Launch
//! overhead (eager or graph replay) is added by the timing evaluator, not here. Copies to or from the host move
//! at `host_bandwidth`.

use graph_ir::op::MemSpace;
use graph_ir::shape::normalize_axis;
use graph_ir::{ComputeGraph, DType, NodeId, Op, OpCategory, OpCost, Shape};

use crate::device::{DeviceProfile, Grid, LaunchEstimate};
use crate::fusion::{FusedGroup, GroupKind};

/// Every fused group's cost and launch estimate, in group order: computed once per pipeline run and passed
/// to the stream pass (its task times) and to lowering (each kernel's figures), which would otherwise each
/// estimate every group again.
pub fn estimate_groups(
    graph: &ComputeGraph,
    fusion: &crate::fusion::FusionPlan,
    device: &DeviceProfile,
) -> Vec<(OpCost, LaunchEstimate)> {
    fusion.groups.iter().map(|g| estimate_group(graph, g, device)).collect()
}

/// Estimate a fused group's launch: its cost is the sum of its nodes' minus the traffic of intermediates that
/// never leave the kernel; its grid follows the kernel kind (module docs).
pub fn estimate_group(graph: &ComputeGraph, group: &FusedGroup, device: &DeviceProfile) -> (OpCost, LaunchEstimate) {
    let flops = group
        .flops
        .unwrap_or_else(|| group.nodes.iter().map(|&n| graph.node_cost(n).flops).fold(0, u64::saturating_add));
    let read = input_read_bytes(graph, group);
    let written: u64 = group.outputs.iter().map(|&t| graph.tensor(t).size_bytes() as u64).fold(0, u64::saturating_add);
    let cost = OpCost { flops, bytes_read: read, bytes_written: written };
    let dtype = group.outputs.first().map_or(DType::F32, |&t| graph.tensor(t).dtype);
    let grid = group_grid(graph, group, device);
    let roofline = device.roofline_us(&cost, dtype);
    let time = if group.kind == GroupKind::Copy && copies_host(graph, group) {
        cost.bytes_written.max(cost.bytes_read) as f64 / device.host_bandwidth.max(1.0) * 1e6
    } else {
        roofline / device.sm_fraction(grid.blocks)
    };
    let est = LaunchEstimate {
        time_us: time,
        grid_blocks: grid.blocks,
        occupancy: device.occupancy_of(&grid),
        roofline_us: roofline,
        threads_per_block: grid.threads,
    };
    (cost, est)
}

/// The bytes the kernel reads of its inputs: all of an input, unless every member reading it picks parts of it
/// (`graph_ir::cost::operand_read_bytes`: Gathers from a table, Slices), then at most what those members write.
/// One pass over the members' operands, so a tensor read by many nodes outside the group (a weight shared
/// across a graph) costs nothing here; the per-input state of a kernel with few inputs lives on the stack.
fn input_read_bytes(graph: &ComputeGraph, group: &FusedGroup) -> u64 {
    const FEW: usize = 16;
    let whole = |k: usize| group.inputs.get(k).map_or(0, |&t| graph.tensor(t).size_bytes() as u64);
    // Per input: the parts its readers pick so far, `None` once a member reads it whole.
    let mut few = [Some(0u64); FEW];
    let mut many = Vec::new();
    let picked: &mut [Option<u64>] = if group.inputs.len() <= FEW {
        &mut few[..group.inputs.len()]
    } else {
        many.resize(group.inputs.len(), Some(0u64));
        &mut many
    };
    for &n in &group.nodes {
        let node = graph.node(n);
        let mut out = None;
        for (i, &x) in node.inputs.iter().enumerate() {
            let Some(k) = group.inputs.iter().position(|&t| t == x) else { continue };
            let Some(sum) = picked[k] else { continue };
            let out = *out
                .get_or_insert_with(|| node.outputs.iter().map(|&o| graph.tensor(o).size_bytes() as u64).sum::<u64>());
            let w = whole(k);
            let part = graph_ir::cost::operand_read_bytes(&node.op, i, w, out);
            picked[k] = (part != w).then(|| sum.saturating_add(part));
        }
    }
    picked
        .iter()
        .enumerate()
        .map(|(k, p)| match *p {
            Some(p) if p > 0 => p.min(whole(k)),
            _ => whole(k),
        })
        .fold(0, u64::saturating_add)
}

fn copies_host(graph: &ComputeGraph, group: &FusedGroup) -> bool {
    group.nodes.iter().any(|&n| {
        let node = graph.node(n);
        match node.op {
            Op::Memcpy { to: MemSpace::Host } => true,
            // A copy to the device reads host bytes when its source is not produced on the device.
            Op::Memcpy { to: MemSpace::Device } => node.inputs.first().is_some_and(|&t| {
                graph.producer(t).is_some_and(|p| matches!(graph.node(p).op, Op::Memcpy { to: MemSpace::Host }))
            }),
            _ => false,
        }
    })
}

fn numel(s: &Shape) -> u64 {
    s.numel().unwrap_or(0) as u64
}

/// The first node of `group` in `cat`.
fn first_of(graph: &ComputeGraph, group: &FusedGroup, cat: OpCategory) -> Option<NodeId> {
    group.nodes.iter().copied().find(|&n| graph.node(n).op.category() == cat)
}

/// The grid of a fused group's kernel (module docs).
pub fn group_grid(graph: &ComputeGraph, group: &FusedGroup, device: &DeviceProfile) -> Grid {
    let out_elems = group.outputs.iter().map(|&t| numel(&graph.tensor(t).shape)).max().unwrap_or(1);
    let flat = |elems: u64| Grid { blocks: elems.div_ceil(256 * 4).max(1), threads: 256, tiles_per_sm: None };
    match group.kind {
        GroupKind::Anchor => match first_of(graph, group, OpCategory::Anchor) {
            Some(n) => anchor_grid(graph, n, products(graph, group), device).unwrap_or_else(|| flat(out_elems)),
            None => flat(out_elems),
        },
        GroupKind::Reduction => match first_of(graph, group, OpCategory::Reduction) {
            Some(n) => reduction_grid(graph, n, device),
            None => flat(out_elems),
        },
        GroupKind::Custom => group
            .nodes
            .iter()
            .find_map(|&n| match &graph.node(n).op {
                Op::Custom(c) => {
                    let blocks = c.grid.iter().map(|&d| d.max(1) as u64).fold(1u64, u64::saturating_mul);
                    let threads = c.block.iter().map(|&d| d.max(1)).product::<u32>();
                    Some(Grid { blocks, threads: threads.clamp(1, 1024), tiles_per_sm: None })
                }
                _ => None,
            })
            .unwrap_or(Grid { blocks: 1, threads: 256, tiles_per_sm: None }),
        GroupKind::Copy => Grid { blocks: 1, threads: 256, tiles_per_sm: None },
        GroupKind::Elementwise | GroupKind::DataMovement => flat(out_elems),
        // FlashAttention's grid: one block of 4 warps per tile of 64 query rows of every (batch, head).
        GroupKind::Attention => {
            let rows = group
                .outputs
                .first()
                .and_then(|&t| {
                    let d = graph.tensor(t).shape.dims();
                    d.last().map(|&last| numel(&graph.tensor(t).shape) / (last.max(1) as u64))
                })
                .unwrap_or(1);
            Grid { blocks: rows.div_ceil(64).max(1), threads: 128, tiles_per_sm: Some(2) }
        }
    }
}

/// A GEMM of `batch` independent `m x n x k` products, tiled as module docs say.
pub fn gemm_grid(batch: u64, m: u64, n: u64, k: u64, device: &DeviceProfile) -> Grid {
    const TILES: [(u64, u64, u32); 4] = [(128, 128, 1), (128, 64, 2), (64, 64, 2), (32, 32, 2)];
    let sms = device.sm_count.max(1) as u64;
    let tiles =
        |tm: u64, tn: u64| batch.max(1).saturating_mul(m.max(1).div_ceil(tm)).saturating_mul(n.max(1).div_ceil(tn));
    let (tm, tn, per_sm) = TILES.iter().copied().find(|&(tm, tn, _)| tiles(tm, tn) >= sms).unwrap_or(TILES[3]);
    let base = tiles(tm, tn);
    let split_k = if base < sms { sms.div_ceil(base).min(k / 128).clamp(1, 16) } else { 1 };
    Grid {
        blocks: base.saturating_mul(split_k),
        threads: if tm * tn >= 128 * 64 { 256 } else { 128 },
        tiles_per_sm: Some(per_sm),
    }
}

/// MatMul and Gemm nodes of an anchor group: more than one when it is a horizontal GEMM (sibling products of one
/// shape, run as one product over the concatenated weights).
fn products(graph: &ComputeGraph, group: &FusedGroup) -> u64 {
    group.nodes.iter().filter(|&&n| matches!(graph.node(n).op, Op::MatMul | Op::Gemm { .. })).count().max(1) as u64
}

/// The grid of anchor `n`; `siblings` products of its shape share the kernel (their columns side by side).
fn anchor_grid(graph: &ComputeGraph, n: NodeId, siblings: u64, device: &DeviceProfile) -> Option<Grid> {
    let node = graph.node(n);
    let shape = |i: usize| node.inputs.get(i).map(|&t| &graph.tensor(t).shape);
    let out = &graph.tensor(*node.outputs.first()?).shape;
    let od = out.dims();
    match &node.op {
        Op::MatMul => {
            let a = shape(0)?.dims();
            let k = *a.last()? as u64;
            let (m, nn) = match od.len() {
                0 => (1, 1),
                1 => (1, od[0] as u64),
                r => (od[r - 2] as u64, od[r - 1] as u64),
            };
            let batch = od.iter().rev().skip(2).map(|&d| d as u64).fold(1u64, u64::saturating_mul);
            Some(gemm_grid(batch, m, nn.saturating_mul(siblings), k, device))
        }
        Op::Gemm { trans_a, .. } => {
            let a = shape(0)?.dims();
            let k = if *trans_a { *a.first()? } else { *a.get(1)? } as u64;
            Some(gemm_grid(1, *od.first()? as u64, (*od.get(1)? as u64).saturating_mul(siblings), k, device))
        }
        Op::Conv(attrs) => {
            let w = shape(1)?.dims();
            let group = attrs.group.max(1) as u64;
            let cout = *w.first()? as u64;
            let k = w[1..].iter().map(|&d| d as u64).fold(1u64, u64::saturating_mul);
            let m = numel(out) / cout.max(1);
            Some(gemm_grid(group, m, cout / group, k, device))
        }
        // Pools: one thread per output element, like elementwise kernels.
        _ => Some(Grid { blocks: numel(out).div_ceil(256 * 4).max(1), threads: 256, tiles_per_sm: None }),
    }
}

/// Reduced extent and number of rows of a reduction node.
fn reduction_rows(graph: &ComputeGraph, n: NodeId) -> (u64, u64) {
    let node = graph.node(n);
    let Some(x) = node.inputs.first().map(|&t| &graph.tensor(t).shape) else { return (1, 1) };
    let dims = x.dims();
    let rank = dims.len();
    let total = numel(x).max(1);
    let mut reduced = vec![false; rank];
    match &node.op {
        Op::GlobalAveragePool => reduced.iter_mut().skip(2).for_each(|r| *r = true),
        Op::Softmax { axis } => {
            if let Some(a) = normalize_axis(*axis, rank) {
                reduced[a] = true;
            }
        }
        Op::LayerNormalization { axis, .. } => {
            if let Some(a) = normalize_axis(*axis, rank) {
                reduced.iter_mut().skip(a).for_each(|r| *r = true);
            }
        }
        Op::ReduceSum { axes, .. } | Op::ReduceMean { axes, .. } | Op::ReduceMax { axes, .. } => match axes {
            None => reduced.iter_mut().for_each(|r| *r = true),
            Some(list) => {
                for &a in list {
                    if let Some(a) = normalize_axis(a, rank) {
                        reduced[a] = true;
                    }
                }
            }
        },
        _ => reduced.iter_mut().skip(rank.saturating_sub(1)).for_each(|r| *r = true),
    }
    let len =
        dims.iter().zip(&reduced).filter(|(_, &r)| r).map(|(&d, _)| d as u64).fold(1u64, u64::saturating_mul).max(1);
    (len, (total / len).max(1))
}

fn reduction_grid(graph: &ComputeGraph, n: NodeId, device: &DeviceProfile) -> Grid {
    let (len, rows) = reduction_rows(graph, n);
    if len <= 1024 {
        // One warp per row, eight rows per 256-thread block.
        return Grid { blocks: rows.div_ceil(8).max(1), threads: 256, tiles_per_sm: None };
    }
    let slots = device.sm_count.max(1) as u64 * device.blocks_per_sm.max(1) as u64;
    let per_row = if rows < slots { slots.div_ceil(rows).min(len.div_ceil(2048)).max(1) } else { 1 };
    Grid { blocks: rows.saturating_mul(per_row), threads: 256, tiles_per_sm: None }
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

    #[test]
    fn gemm_tiles_shrink_then_split_k() {
        let d = DeviceProfile::h200();
        // 4096 x 4096: 1024 tiles of 128x128, one resident per SM.
        let g = gemm_grid(1, 4096, 4096, 4096, &d);
        assert_eq!((g.blocks, g.tiles_per_sm), (1024, Some(1)));
        assert_eq!(d.occupancy_of(&g), 1.0);
        // 1024 x 1024: 64 tiles of 128x128 are too few; 128x64 gives 128, still < 132; 64x64 gives 256.
        assert_eq!(gemm_grid(1, 1024, 1024, 64, &d).blocks, 256);
        // 64 x 64 with a long K: 4 tiles of 32x32, split 16 ways (K / 128 = 32 allows it, the cap is 16).
        assert_eq!(gemm_grid(1, 64, 64, 4096, &d).blocks, 4 * 16);
        // The same with a short K cannot split.
        assert_eq!(gemm_grid(1, 64, 64, 64, &d).blocks, 4);
    }

    /// A one-node group around `op` on the given input shape (plus extra inputs).
    fn one(op: Op, x: &[usize], extra: &[(&str, Vec<usize>)]) -> (ComputeGraph, FusedGroup) {
        let mut g = ComputeGraph::new("t");
        let mut ins = vec![g.add_input("x", DType::F32, x.to_vec()).unwrap()];
        for (name, shape) in extra {
            ins.push(g.add_weight(name, DType::F32, shape.clone()).unwrap());
        }
        let kind = GroupKind::of(op.category());
        let out = g.add_node("n", op, &ins).unwrap();
        let node = g.node_id("n").unwrap();
        let group = FusedGroup { nodes: vec![node], kind, inputs: ins, outputs: out, flops: None };
        (g, group)
    }

    #[test]
    fn conv_is_an_implicit_gemm() {
        let d = DeviceProfile::h200();
        // 1x1 conv 64 -> 16 channels on 28x28: M = 784, N = 16, K = 64. Too few tiles for 132 SMs even at
        // 32x32 (25 tiles) and K too short to split: 25 blocks of 128 threads, two resident per SM.
        let op = Op::Conv(graph_ir::op::ConvAttrs::default());
        let (g, grp) = one(op, &[1, 64, 28, 28], &[("w", vec![16, 64, 1, 1])]);
        let grid = group_grid(&g, &grp, &d);
        assert_eq!(grid, Grid { blocks: 25, threads: 128, tiles_per_sm: Some(2) });
        let (cost, e) = estimate_group(&g, &grp, &d);
        assert!((e.occupancy - 25.0 / 264.0).abs() < 1e-12);
        // 25 blocks reach 25 of 132 SMs: the roofline stretches by 132 / 25.
        assert!((e.time_us - d.roofline_us(&cost, DType::F32) * 132.0 / 25.0).abs() < 1e-9);
        assert_eq!(e.roofline_us, d.roofline_us(&cost, DType::F32));
    }

    #[test]
    fn reductions_go_by_rows() {
        let d = DeviceProfile::h200();
        // Softmax over 1000 classes, 4 rows: a warp per row, one block.
        let (g, grp) = one(Op::Softmax { axis: -1 }, &[4, 1000], &[]);
        assert_eq!(group_grid(&g, &grp, &d).blocks, 1);
        // LayerNorm over 768 on 128 tokens: 16 blocks of 8 rows.
        let ln = Op::LayerNormalization { axis: -1, epsilon: 1e-5 };
        let (g, grp) = one(ln, &[1, 128, 768], &[("s", vec![768])]);
        assert_eq!(group_grid(&g, &grp, &d).blocks, 16);
        // Global average pool: 2048 rows of 49.
        let (g, grp) = one(Op::GlobalAveragePool, &[1, 2048, 7, 7], &[]);
        assert_eq!(group_grid(&g, &grp, &d).blocks, 256);
        // One long row of 2^20: split over min(1056 slots, 2^20 / 2048 = 512) blocks.
        let (g, grp) = one(Op::ReduceSum { axes: None, keepdims: true }, &[1 << 20], &[]);
        assert_eq!(group_grid(&g, &grp, &d).blocks, 512);
    }

    #[test]
    fn elementwise_goes_by_elements() {
        let d = DeviceProfile::h200();
        let (g, grp) = one(Op::Relu, &[1, 64, 56, 56], &[]);
        let grid = group_grid(&g, &grp, &d);
        assert_eq!(grid.blocks, (64u64 * 56 * 56).div_ceil(1024));
        let e = estimate_group(&g, &grp, &d).1;
        assert!((e.occupancy - 196.0 / 1056.0).abs() < 1e-12);
        // 196 blocks cover every SM: the plain roofline.
        assert_eq!(e.time_us, e.roofline_us);
    }
}
