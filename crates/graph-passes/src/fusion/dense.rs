//! A dense, view-transparent picture of the graph for the fusion pass: nodes by topological position, tensors
//! by dense index, data edges between non-view nodes looking through views, and who reads each tensor's bytes,
//! all in flat arrays (CSR) so the pass allocates little per node.

use graph_ir::{ComputeGraph, NodeId, Op, OpCategory, OpCost, TensorId, TensorRole};
use slotmap::SecondaryMap;

use crate::topo::TopoOrder;

/// Sentinel for "no node", "no tensor", "no group".
pub(super) const NONE: u32 = u32::MAX;

/// Compressed rows: `row(i)` is `data[off[i]..off[i + 1]]`.
#[derive(Clone, Debug, Default)]
pub(super) struct Csr {
    off: Vec<u32>,
    data: Vec<u32>,
}

impl Csr {
    /// Rows filled by `fill(row, push)` in row order.
    fn build(rows: usize, mut fill: impl FnMut(u32, &mut Vec<u32>)) -> Csr {
        let mut off = Vec::with_capacity(rows + 1);
        let mut data = Vec::new();
        for r in 0..rows as u32 {
            off.push(data.len() as u32);
            fill(r, &mut data);
        }
        off.push(data.len() as u32);
        Csr { off, data }
    }

    /// Rows from `(row, value)` items given in ascending value order: a counting sort, rows stay ascending;
    /// consecutive repeats of a value in a row are dropped.
    fn scatter(rows: usize, items: impl Iterator<Item = (u32, u32)> + Clone) -> Csr {
        let mut count = vec![0u32; rows + 1];
        for (r, _) in items.clone() {
            count[r as usize + 1] += 1;
        }
        for i in 0..rows {
            count[i + 1] += count[i];
        }
        let mut data = vec![NONE; count[rows] as usize];
        let mut fill = count.clone();
        for (r, v) in items {
            let (start, at) = (count[r as usize] as usize, fill[r as usize] as usize);
            if at > start && data[at - 1] == v {
                continue;
            }
            data[at] = v;
            fill[r as usize] += 1;
        }
        // Compact the rows that dropped repeats.
        let mut out = Vec::with_capacity(data.len());
        let mut off = Vec::with_capacity(rows + 1);
        for r in 0..rows {
            off.push(out.len() as u32);
            out.extend_from_slice(&data[count[r] as usize..fill[r] as usize]);
        }
        off.push(out.len() as u32);
        Csr { off, data: out }
    }

    pub fn row(&self, i: u32) -> &[u32] {
        &self.data[self.off[i as usize] as usize..self.off[i as usize + 1] as usize]
    }

    /// Index of `v` in row `i` as a global position, for rows kept sorted.
    pub fn find(&self, i: u32, v: u32) -> Option<usize> {
        let base = self.off[i as usize] as usize;
        self.row(i).binary_search(&v).ok().map(|k| base + k)
    }

    pub fn range(&self, i: u32) -> std::ops::Range<usize> {
        self.off[i as usize] as usize..self.off[i as usize + 1] as usize
    }

    pub fn total(&self) -> usize {
        self.data.len()
    }
}

/// [`Dense::flags`] bit: a load (`rules::is_load`, a data-movement op a row kernel computes inline).
pub(super) const LOAD: u8 = 1;
/// [`Dense::flags`] bit: a Cast.
pub(super) const CAST: u8 = 2;
/// [`Dense::flags`] bit: a selection (`rules::is_selection`).
pub(super) const SELECTION: u8 = 4;
/// [`Dense::flags`] bit: a Gather.
pub(super) const GATHER: u8 = 8;
/// [`Dense::flags`] bit: reads (through views) the result of a data-movement node. With the node's own category,
/// it says whether the row rules on loads (`Groups::check_loads`) have anything to check at it.
pub(super) const READS_MOVE: u8 = 16;
/// [`Dense::flags`] bit: a MatMul or a Gemm (a product that horizontal GEMMs and operand layouts look for; the flag
/// spares those scans a read of the graph's node).
pub(super) const PRODUCT: u8 = 32;
/// [`Dense::flags`] bit: a Split (a group with one may only be an anchor's selection epilogue).
pub(super) const SPLIT: u8 = 64;
/// [`Dense::flags`] bit: a Softmax (where the attention phase looks for a chain).
pub(super) const SOFTMAX: u8 = 128;

/// The graph as the fusion pass sees it.
pub(super) struct Dense<'g> {
    pub graph: &'g ComputeGraph,
    /// Node at each topological position.
    pub ids: Vec<NodeId>,
    /// Category of each node.
    pub cat: Vec<OpCategory>,
    /// Cost of each node (`ComputeGraph::node_cost`; views cost nothing): taken here once for the pass's
    /// model, each group's flops and the report's unfused traffic, which would otherwise each cost every node.
    pub cost: Vec<OpCost>,
    /// What the row rules ask of each node's op ([`LOAD`], [`CAST`], [`SELECTION`], [`GATHER`]), read once
    /// here: the rules ask it of the same nodes many times, and the graph's node table is far from the pass's.
    pub flags: Vec<u8>,
    /// Tensor of each dense tensor index.
    pub tids: Vec<TensorId>,
    /// Alias root of each tensor (itself unless a view's output).
    pub root: Vec<u32>,
    /// Position of the non-view node whose kernel writes each tensor's bytes (`NONE` for sources).
    pub kprod: Vec<u32>,
    /// Position of each tensor's producer, views included (`NONE` for sources).
    pub prod: Vec<u32>,
    pub bytes: Vec<u64>,
    pub numel: Vec<u64>,
    /// Per tensor: it, or its alias root or a view of that, is a graph output ([`Dense::is_output`]).
    output: Vec<bool>,
    /// Per tensor: its extents, `dim_data[dim_off[t]..dim_off[t + 1]]` (read here, not in the graph's tensor
    /// table, by the row rules that ask for them many times).
    dim_off: Vec<u32>,
    dim_data: Vec<usize>,
    /// Per alias root: non-view nodes reading it or a view of it, ascending.
    readers: Csr,
    /// Per node: its inputs (tensor indices, op order) and outputs.
    ins: Csr,
    outs: Csr,
    /// Per node: its inputs sorted and deduplicated (a singleton group's inputs).
    ins_sorted: Csr,
    /// Per node: its outputs that are read or are graph outputs (a singleton group's escaping tensors).
    esc: Csr,
    /// Per node: non-view consumers through views, ascending. Edge ids are positions in this table.
    pub succ: Csr,
}

impl<'g> Dense<'g> {
    pub fn new(graph: &'g ComputeGraph, order: &TopoOrder) -> Self {
        let n = order.order.len();
        let ids = order.order.clone();
        let nt = graph.num_tensors();
        let mut tix: SecondaryMap<TensorId, u32> = SecondaryMap::with_capacity(nt);
        let mut tids = Vec::with_capacity(nt);
        let mut bytes = Vec::with_capacity(nt);
        let mut numel = Vec::with_capacity(nt);
        let mut role_output = Vec::with_capacity(nt);
        let (mut dim_off, mut dim_data) = (Vec::with_capacity(nt + 1), Vec::with_capacity(nt * 4));
        for (t, tensor) in graph.tensors() {
            tix.insert(t, tids.len() as u32);
            tids.push(t);
            let count = tensor.numel() as u64;
            numel.push(count);
            bytes.push(count.saturating_mul(tensor.dtype.size_bytes() as u64));
            role_output.push(tensor.role == TensorRole::Output);
            dim_off.push(dim_data.len() as u32);
            dim_data.extend_from_slice(tensor.shape.dims());
        }
        dim_off.push(dim_data.len() as u32);
        let mut cat = Vec::with_capacity(n);
        let mut cost = Vec::with_capacity(n);
        let mut flags = Vec::with_capacity(n);
        let (mut in_off, mut in_data) = (Vec::with_capacity(n + 1), Vec::new());
        let (mut out_off, mut out_data) = (Vec::with_capacity(n + 1), Vec::new());
        for &id in &ids {
            let node = graph.node(id);
            let c = node.op.category();
            cat.push(c);
            cost.push(if c == OpCategory::View { OpCost::default() } else { graph.node_cost(id) });
            flags.push(op_flags(graph, node, c));
            in_off.push(in_data.len() as u32);
            in_data.extend(node.inputs.iter().map(|&t| tix[t]));
            out_off.push(out_data.len() as u32);
            out_data.extend(node.outputs.iter().map(|&t| tix[t]));
        }
        in_off.push(in_data.len() as u32);
        out_off.push(out_data.len() as u32);
        let ins = Csr { off: in_off, data: in_data };
        let outs = Csr { off: out_off, data: out_data };
        let mut root: Vec<u32> = (0..nt as u32).collect();
        let mut kprod = vec![NONE; nt];
        let mut prod = vec![NONE; nt];
        for i in 0..n as u32 {
            for &t in outs.row(i) {
                prod[t as usize] = i;
            }
            if cat[i as usize] == OpCategory::View {
                if let (Some(&x), Some(&y)) = (ins.row(i).first(), outs.row(i).first()) {
                    root[y as usize] = root[x as usize];
                    kprod[y as usize] = kprod[x as usize];
                }
            } else {
                for &t in outs.row(i) {
                    kprod[t as usize] = i;
                }
            }
        }
        for (i, f) in flags.iter_mut().enumerate() {
            let moved = |&t: &u32| {
                let p = kprod[t as usize];
                p != NONE && cat[p as usize] == OpCategory::DataMovement
            };
            if ins.row(i as u32).iter().any(moved) {
                *f |= READS_MOVE;
            }
        }
        let mut root_output = vec![false; nt];
        for &o in graph.outputs() {
            root_output[root[tix[o] as usize] as usize] = true;
        }
        // Readers per root and consumers per node, both filled in ascending node order.
        let reads = || {
            (0..n as u32)
                .filter(|&c| cat[c as usize] != OpCategory::View)
                .flat_map(|c| ins.row(c).iter().map(move |&t| (t, c)))
        };
        let readers = Csr::scatter(nt, reads().map(|(t, c)| (root[t as usize], c)));
        let succ =
            Csr::scatter(n, reads().filter(|&(t, _)| kprod[t as usize] != NONE).map(|(t, c)| (kprod[t as usize], c)));
        let ins_sorted = Csr::build(n, |i, v| {
            let start = v.len();
            v.extend_from_slice(ins.row(i));
            crate::stream::sort_dedup_tail(v, start);
        });
        let esc = Csr::build(n, |i, v| {
            for &t in outs.row(i) {
                let r = root[t as usize];
                if (root_output[r as usize] || !readers.row(r).is_empty()) && !v.ends_with(&[t]) {
                    v.push(t);
                }
            }
        });
        let output = (0..nt).map(|t| root_output[root[t] as usize] || role_output[t]).collect();
        Dense {
            graph,
            ids,
            cat,
            cost,
            flags,
            tids,
            root,
            kprod,
            prod,
            bytes,
            numel,
            output,
            dim_off,
            dim_data,
            readers,
            ins,
            outs,
            ins_sorted,
            esc,
            succ,
        }
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether node `i`'s [`Dense::flags`] hold any of `bits`.
    pub fn is(&self, i: u32, bits: u8) -> bool {
        self.flags[i as usize] & bits != 0
    }

    pub fn op(&self, i: u32) -> &'g Op {
        &self.graph.node(self.ids[i as usize]).op
    }

    pub fn name(&self, i: u32) -> &'g str {
        &self.graph.node(self.ids[i as usize]).name
    }

    pub fn tname(&self, t: u32) -> &'g str {
        &self.graph.tensor(self.tids[t as usize]).name
    }

    pub fn dims(&self, t: u32) -> &[usize] {
        &self.dim_data[self.dim_off[t as usize] as usize..self.dim_off[t as usize + 1] as usize]
    }

    /// Inputs of node `i` in op order.
    pub fn inputs(&self, i: u32) -> &[u32] {
        self.ins.row(i)
    }

    pub fn outputs(&self, i: u32) -> &[u32] {
        self.outs.row(i)
    }

    /// Inputs of node `i`, sorted and deduplicated.
    pub fn inputs_sorted(&self, i: u32) -> &[u32] {
        self.ins_sorted.row(i)
    }

    /// Outputs of node `i` that are read or are graph outputs.
    pub fn escaping(&self, i: u32) -> &[u32] {
        self.esc.row(i)
    }

    pub fn is_view(&self, i: u32) -> bool {
        self.cat[i as usize] == OpCategory::View
    }

    /// Readers of `t`'s bytes (non-view nodes reading it or any view of its root), ascending.
    pub fn readers(&self, t: u32) -> &[u32] {
        self.readers.row(self.root[t as usize])
    }

    /// True when `t` or a view of its root is a graph output.
    pub fn is_output(&self, t: u32) -> bool {
        self.output[t as usize]
    }

    /// Consumers of node `i` (edge ids `succ_base(i)..`).
    pub fn succ(&self, i: u32) -> &[u32] {
        self.succ.row(i)
    }

    /// Edge id of `p -> c`.
    pub fn edge(&self, p: u32, c: u32) -> Option<usize> {
        self.succ.find(p, c)
    }

    pub fn num_edges(&self) -> usize {
        self.succ.total()
    }

    /// Edge ids of node `p`'s consumers, parallel to `succ(p)`.
    pub fn edges(&self, p: u32) -> std::ops::Range<usize> {
        self.succ.range(p)
    }
}

/// The [`Dense::flags`] of `node` (category `cat`).
fn op_flags(graph: &ComputeGraph, node: &graph_ir::Node, cat: OpCategory) -> u8 {
    let mut f = 0;
    if cat == OpCategory::DataMovement && super::rules::is_load(&node.op) {
        f |= LOAD;
    }
    match node.op {
        Op::Cast { .. } => f |= CAST,
        Op::MatMul | Op::Gemm { .. } => f |= PRODUCT,
        Op::Split { .. } => f |= SELECTION | SPLIT,
        Op::Softmax { .. } => f |= SOFTMAX,
        Op::Gather { .. } => {
            f |= GATHER;
            // A constant scalar index picks one slice.
            let scalar_index = node.inputs.get(1).is_some_and(|&t| {
                let tensor = graph.tensor(t);
                tensor.role == TensorRole::Constant && tensor.shape.rank() == 0
            });
            if scalar_index {
                f |= SELECTION;
            }
        }
        _ => {}
    }
    f
}
