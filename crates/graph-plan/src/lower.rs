//! Kernel lowering: each fused group (but copies) becomes a [`Kernel`] — its expression program over dense
//! values, its parameters bound to the buffers the memory plan placed — and the graph's sources and outputs
//! become the plan's external [`Binding`]s. Reuse edges between kernels become [`KernelOrder`]s. Nothing here
//! decides an order or a synchronisation. O(N + E).

use graph_ir::{ComputeGraph, TensorId, TensorRole};
use graph_passes::device::DeviceProfile;
use graph_passes::estimate::estimate_group;
use graph_passes::fusion::{FusionPlan, GroupKind};
use graph_passes::group_graph::GroupGraph;
use graph_passes::memory::{MemoryPlan, Placement};
use graph_passes::PlanResult;
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

/// Lower the fused groups and the external bindings.
pub(crate) fn lower(
    graph: &ComputeGraph,
    fusion: &FusionPlan,
    groups: &GroupGraph,
    mem: &MemoryPlan,
    device: &DeviceProfile,
) -> PlanResult<Lowered> {
    let mut kernel_of_group: Vec<Option<KernelId>> = vec![None; fusion.groups.len()];
    let mut kernels: Vec<Kernel> = Vec::new();
    for (gi, g) in fusion.groups.iter().enumerate() {
        if g.kind == GroupKind::Copy {
            continue;
        }
        let id = KernelId::from_index(kernels.len());
        let mut values: Vec<Value> = Vec::new();
        let mut vid: HashMap<TensorId, ValueId> = HashMap::new();
        let mut value_of = |t: TensorId, values: &mut Vec<Value>| -> ValueId {
            *vid.entry(t).or_insert_with(|| {
                let tensor = graph.tensor(t);
                values.push(Value { name: tensor.name.clone(), dtype: tensor.dtype, shape: tensor.shape.clone() });
                ValueId::from_index(values.len() - 1)
            })
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
        let (cost, estimate) = estimate_group(graph, g, device);
        kernel_of_group[gi] = Some(id);
        kernels.push(Kernel { id, name: id.to_string(), kind: g.kind, values, params, body, cost, estimate });
    }
    let mut bindings = Vec::new();
    for &t in graph.inputs().iter().chain(graph.weights()).chain(graph.outputs()) {
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
    let nodes: Vec<PlanNode> = graph
        .nodes()
        .map(|(id, n)| PlanNode {
            name: n.name.clone(),
            op: n.op.name().to_string(),
            view: n.op.is_view(),
            eliminated: fusion.is_eliminated(graph, id),
        })
        .collect();
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
