//! Kernel lowering: each fused group (but copies) becomes a [`Kernel`] — its expression program over dense
//! values, its parameters bound to the buffers the memory plan placed — and the graph's sources and outputs
//! become the plan's external [`Binding`]s. Reuse edges between kernels become [`KernelOrder`]s. Nothing here
//! decides an order or a synchronisation. O(N + E).

use graph_ir::{ComputeGraph, Node, NodeId, OpCost, TensorId, TensorRole};
use graph_passes::device::LaunchEstimate;
use graph_passes::fusion::{FusedGroup, FusionPlan, GroupKind};
use graph_passes::group_graph::GroupGraph;
use graph_passes::memory::{MemoryPlan, Placement};
use graph_passes::PlanResult;
use rayon::prelude::*;
use std::borrow::Cow;
use std::collections::HashMap;

use crate::build::bug;
use crate::ids::{KernelId, ValueId};
use crate::plan::{Access, Binding, BindingRole, BufferRef, Instr, Kernel, KernelOrder, Param, PlanNode, Value};

/// What lowering produced.
pub(crate) struct Lowered {
    /// The kernels, in group order.
    pub kernels: Vec<Kernel>,
    /// The kernel of each group (`None` for copy groups, which become copy steps).
    pub kernel_of_group: Vec<Option<KernelId>>,
    /// Inputs, weights and constants, outputs.
    pub bindings: Vec<Binding>,
    /// The graph's nodes as the plan records them.
    pub nodes: Vec<PlanNode>,
    /// Reuse edges between kernels, sorted and deduplicated.
    pub orders: Vec<KernelOrder>,
}

/// Where a placement is, as a plan buffer reference.
pub(crate) fn buffer(p: &Placement) -> BufferRef {
    BufferRef { region: p.region, offset: p.offset, bytes: p.bytes }
}

/// The buffer of tensor `t` (a bug when the memory plan did not place it).
pub(crate) fn place(graph: &ComputeGraph, mem: &MemoryPlan, t: TensorId) -> PlanResult<BufferRef> {
    mem.placement
        .get(t)
        .map(buffer)
        .ok_or_else(|| bug("lower", format!("tensor '{}' has no placement", graph.tensor(t).name)))
}

/// Lower the fused groups and the external bindings. `estimates` are the groups' cost and launch estimates
/// (`estimate::estimate_groups`, made once for the stream pass). A large plan's kernels are lowered in
/// parallel ([`PARALLEL_KERNELS`]): each is a function of its group alone, and their order (and ids) is the
/// groups' order whatever the threads do.
pub(crate) fn lower(
    graph: &ComputeGraph,
    fusion: &FusionPlan,
    groups: &GroupGraph,
    mem: &MemoryPlan,
    estimates: &[(OpCost, LaunchEstimate)],
) -> PlanResult<Lowered> {
    if estimates.len() != fusion.groups.len() {
        return Err(bug("lower", format!("{} estimates for {} groups", estimates.len(), fusion.groups.len())));
    }
    let mut kernel_of_group: Vec<Option<KernelId>> = vec![None; fusion.groups.len()];
    let mut todo: Vec<(usize, KernelId)> = Vec::with_capacity(fusion.groups.len());
    for (gi, g) in fusion.groups.iter().enumerate() {
        if g.kind != GroupKind::Copy {
            let id = KernelId::from_index(todo.len());
            kernel_of_group[gi] = Some(id);
            todo.push((gi, id));
        }
    }
    let one = |&(gi, id): &(usize, KernelId)| lower_group(graph, &fusion.groups[gi], id, groups, mem, estimates[gi]);
    let kernels: Vec<Kernel> = if todo.len() >= PARALLEL_KERNELS {
        todo.par_iter().map(one).collect::<PlanResult<_>>()?
    } else {
        // Sized once: collecting through a `Result` knows no length and would grow (and copy) the list.
        let mut kernels = Vec::with_capacity(todo.len());
        for k in &todo {
            kernels.push(one(k)?);
        }
        kernels
    };
    let external = graph.inputs().iter().chain(graph.weights()).chain(graph.outputs());
    let mut bindings = Vec::with_capacity(graph.inputs().len() + graph.weights().len() + graph.outputs().len());
    for &t in external {
        let tensor = graph.tensor(t);
        let role = match tensor.role {
            TensorRole::Input => BindingRole::Input,
            TensorRole::Weight => BindingRole::Weight,
            TensorRole::Constant => BindingRole::Constant,
            _ => BindingRole::Output,
        };
        bindings.push(Binding {
            name: tensor.name.clone(),
            role,
            dtype: tensor.dtype,
            shape: tensor.shape.clone(),
            buffer: place(graph, mem, t)?,
            data: tensor.data.as_ref().map(|d| d.to_vec()),
        });
    }
    let plan_node = |&(id, n): &(NodeId, &Node)| PlanNode {
        name: n.name.clone(),
        op: Cow::Borrowed(n.op.name()),
        view: n.op.is_view(),
        eliminated: fusion.is_eliminated(graph, id),
    };
    let nodes: Vec<PlanNode> = if todo.len() >= PARALLEL_KERNELS {
        graph.nodes().collect::<Vec<(NodeId, &Node)>>().par_iter().map(plan_node).collect()
    } else {
        graph.nodes().map(|n| plan_node(&n)).collect()
    };
    let mut orders: Vec<KernelOrder> = mem
        .reuse_edges
        .iter()
        .filter_map(|e| match (kernel_of_group[e.from.index()], kernel_of_group[e.to.index()]) {
            (Some(from), Some(to)) => Some(KernelOrder { from, to }),
            _ => None,
        })
        .collect();
    orders.sort_unstable();
    orders.dedup();
    Ok(Lowered { kernels, kernel_of_group, bindings, nodes, orders })
}

/// Values up to which a kernel finds a tensor's value by scanning (then by a map).
const SCAN_VALUES: usize = 32;

/// Kernels from which [`lower`] splits the work across threads. Below it the hand-off costs more than it saves:
/// kernels built on a worker are memory the main thread later frees, and under glibc's malloc (per-thread
/// arenas) that made lowering 3.7k kernels slower on two threads than on one, while 37k kernels gained
/// (docs/benchmarks.md, "Planning speed, fourth round").
const PARALLEL_KERNELS: usize = 16_384;

/// One kernel: the group's values (each graph tensor it touches, once), parameters and instructions.
fn lower_group(
    graph: &ComputeGraph,
    g: &FusedGroup,
    id: KernelId,
    groups: &GroupGraph,
    mem: &MemoryPlan,
    (cost, estimate): (OpCost, LaunchEstimate),
) -> PlanResult<Kernel> {
    // Every value is a group input or a member's output: sized once, not grown.
    let most = g.inputs.len() + g.nodes.iter().map(|&n| graph.node(n).outputs.len()).sum::<usize>();
    let mut values: Vec<Value> = Vec::with_capacity(most);
    // Value of each tensor seen so far: most kernels have a handful, so a scan beats hashing; the map takes
    // over in a large kernel so that lowering stays linear.
    let mut seen: Vec<TensorId> = Vec::with_capacity(most);
    let mut index: HashMap<TensorId, ValueId> = HashMap::new();
    let mut value_of = |t: TensorId, values: &mut Vec<Value>| -> ValueId {
        if seen.len() <= SCAN_VALUES {
            if let Some(i) = seen.iter().position(|&u| u == t) {
                return ValueId::from_index(i);
            }
        } else if let Some(&v) = index.get(&t) {
            return v;
        }
        let tensor = graph.tensor(t);
        let v = ValueId::from_index(values.len());
        values.push(Value { name: tensor.name.clone(), dtype: tensor.dtype, shape: tensor.shape.clone() });
        seen.push(t);
        if seen.len() > SCAN_VALUES {
            if index.is_empty() {
                index.extend(seen.iter().enumerate().map(|(i, &u)| (u, ValueId::from_index(i))));
            } else {
                index.insert(t, v);
            }
        }
        v
    };
    let param = |t: TensorId, value: ValueId, access: Access| -> PlanResult<Param> {
        let root = graph.tensor(groups.root(t)).name.clone();
        Ok(Param { value, root, buffer: place(graph, mem, t)?, access })
    };
    let mut params = Vec::with_capacity(g.inputs.len() + g.outputs.len());
    for &t in &g.inputs {
        let v = value_of(t, &mut values);
        params.push(param(t, v, Access::Read)?);
    }
    let mut body = Vec::with_capacity(g.nodes.len());
    for &n in &g.nodes {
        let node = graph.node(n);
        let inputs = node.inputs.iter().map(|&t| value_of(t, &mut values)).collect();
        let outputs = node.outputs.iter().map(|&t| value_of(t, &mut values)).collect();
        body.push(Instr { node: node.name.clone(), op: node.op.clone(), inputs, outputs });
    }
    for &t in &g.outputs {
        let v = value_of(t, &mut values);
        params.push(param(t, v, Access::Write)?);
    }
    Ok(Kernel { id, name: id.to_string(), kind: g.kind, values, params, body, cost, estimate })
}
