//! Check 1, coverage: every non-view node runs in exactly one launched kernel or one copy; each kernel is
//! launched at most once and exists; a launch's `reads`/`writes` are the sets of its kernel's Read/Write param
//! buffers. One pass over the steps and the launched kernels' bodies and params: O(steps + instrs + params)
//! expected (a string comparison, or a hash lookup, per instruction).

use std::cell::OnceCell;

use crate::ids::{KernelId, StepId};
use crate::plan::{Access, BufferRef, PlanStep};

use super::index::{FastMap, Index, NONE};
use super::violation::Violation;

/// A node's runs: its first step, and how many steps run it.
#[derive(Clone, Copy)]
struct Runs {
    first: u32,
    count: u32,
}

pub(super) fn check(ix: &Index<'_>, out: &mut Vec<Violation>) {
    let plan = ix.plan;
    // Name -> (node index, is a view), built on first need: launches usually run the nodes in the plan's own
    // order (a plan lists nodes topologically and launches follow a topological order), so a cursor over the
    // nodes answers most lookups with one string comparison. Names are unique in a valid graph; on duplicates
    // the table's last one wins.
    let nodes = plan.nodes();
    let table: OnceCell<FastMap<&str, (u32, bool)>> = OnceCell::new();
    let mut cursor = 0usize;
    let mut lookup = |name: &str| -> Option<(u32, bool)> {
        while nodes.get(cursor).is_some_and(|n| n.view || n.eliminated) {
            cursor += 1;
        }
        if nodes.get(cursor).is_some_and(|n| *n.name == *name) {
            cursor += 1;
            return Some(((cursor - 1) as u32, false));
        }
        let table = table.get_or_init(|| {
            let mut t = FastMap::with_capacity_and_hasher(nodes.len(), Default::default());
            for (i, n) in nodes.iter().enumerate() {
                t.insert(n.name.as_ref(), (i as u32, n.view || n.eliminated));
            }
            t
        });
        table.get(name).copied()
    };
    let mut runs = vec![Runs { first: NONE, count: 0 }; plan.nodes().len()];
    // Steps of nodes run more than once, beyond the first: (node, step).
    let mut again: Vec<(u32, u32)> = Vec::new();
    let mut run = |name: &str, step: u32, copy: bool, out: &mut Vec<Violation>| match lookup(name) {
        // Views and eliminated Concats have no kernel; a fused body may still list a view (it only renames),
        // a copy may not.
        Some((_, true)) if !copy => {}
        Some((n, false)) => {
            let r = &mut runs[n as usize];
            if r.count == 0 {
                r.first = step;
            } else {
                again.push((n, step));
            }
            r.count += 1;
        }
        _ => out.push(Violation::UnknownNode { step: StepId(step), node: name.to_string() }),
    };

    let (mut want, mut have) = (Vec::new(), Vec::new());
    for (i, step) in plan.steps.iter().enumerate() {
        let i = i as u32;
        match step {
            PlanStep::Launch { kernel, reads, writes, .. } => {
                let Some(k) = plan.kernel(*kernel) else {
                    out.push(Violation::UnknownKernel { step: Some(StepId(i)), kernel: *kernel });
                    continue;
                };
                let first = ix.first_launch[kernel.index()];
                if first != i {
                    out.push(Violation::KernelLaunchedTwice {
                        kernel: *kernel,
                        first: StepId(first),
                        again: StepId(i),
                    });
                    // Its nodes were counted at the first launch; the params were compared there too.
                    continue;
                }
                for instr in &k.body {
                    run(&instr.node, i, false, out);
                }
                for (access, list) in [(Access::Read, reads), (Access::Write, writes)] {
                    want.clear();
                    want.extend(k.params.iter().filter(|p| p.access == access).map(|p| p.buffer));
                    params_agree(StepId(i), *kernel, access, &mut want, list, &mut have, out);
                }
            }
            PlanStep::Copy { node: Some(name), .. } => run(name, i, true, out),
            _ => {}
        }
    }

    again.sort_unstable();
    let mut a = 0;
    for (n, node) in plan.nodes().iter().enumerate() {
        if node.view || node.eliminated {
            continue;
        }
        let r = runs[n];
        if r.count == 0 {
            out.push(Violation::NodeNotRun { node: node.name.to_string() });
        } else if r.count > 1 {
            let mut steps = vec![StepId(r.first)];
            while a < again.len() && again[a].0 < n as u32 {
                a += 1;
            }
            while a < again.len() && again[a].0 == n as u32 {
                steps.push(StepId(again[a].1));
                a += 1;
            }
            out.push(Violation::NodeRunTwice { node: node.name.to_string(), steps });
        }
    }
}

/// Compare the step's list with the params' buffers as sets.
fn params_agree(
    step: StepId,
    kernel: KernelId,
    access: Access,
    want: &mut Vec<BufferRef>,
    list: &[BufferRef],
    have: &mut Vec<BufferRef>,
    out: &mut Vec<Violation>,
) {
    // A kernel binds a handful of buffers: mutual inclusion, quadratic in that handful, beats sorting.
    if want.len() <= 8
        && list.len() <= 8
        && want.iter().all(|b| list.contains(b))
        && list.iter().all(|b| want.contains(b))
    {
        return;
    }
    want.sort_unstable();
    want.dedup();
    have.clear();
    have.extend_from_slice(list);
    have.sort_unstable();
    have.dedup();
    if want == have {
        return;
    }
    let missing: Vec<BufferRef> = want.iter().filter(|b| have.binary_search(b).is_err()).copied().collect();
    let extra: Vec<BufferRef> = have.iter().filter(|b| want.binary_search(b).is_err()).copied().collect();
    out.push(Violation::StepParams { step, kernel, access, missing, extra });
}
