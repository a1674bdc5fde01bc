//! Check 1, coverage: every non-view node runs in exactly one launched kernel or one copy; each kernel is
//! launched at most once and exists; a launch's `reads`/`writes` are the sets of its kernel's Read/Write param
//! buffers. One pass over the steps and the launched kernels' bodies and params: O(steps + instrs + params)
//! expected (a hash lookup per instruction), plus a sort of each launch's few ranges.

use std::collections::HashMap;

use crate::ids::{KernelId, StepId};
use crate::plan::{Access, BufferRef, PlanStep};

use super::index::{Index, NONE};
use super::violation::Violation;

/// A node's runs: its first step, and how many steps run it.
#[derive(Clone, Copy)]
struct Runs {
    first: u32,
    count: u32,
}

pub(super) fn check(ix: &Index<'_>, out: &mut Vec<Violation>) {
    let plan = ix.plan;
    // Name -> (node index, is a view). Names are unique in a valid graph; on duplicates the last one wins,
    // and the first goes unreported as "not run" only if no step names it.
    let mut node_of: HashMap<&str, (u32, bool)> = HashMap::with_capacity(plan.nodes().len());
    for (i, n) in plan.nodes().iter().enumerate() {
        node_of.insert(n.name.as_str(), (i as u32, n.view));
    }
    let mut runs = vec![Runs { first: NONE, count: 0 }; plan.nodes().len()];
    // Steps of nodes run more than once, beyond the first: (node, step).
    let mut again: Vec<(u32, u32)> = Vec::new();
    let mut run = |name: &str, step: u32, copy: bool, out: &mut Vec<Violation>| match node_of.get(name) {
        // Views have no kernel; a fused body may still list them (they only rename), a copy may not.
        Some(&(_, true)) if !copy => {}
        Some(&(n, false)) => {
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
        if node.view {
            continue;
        }
        let r = runs[n];
        if r.count == 0 {
            out.push(Violation::NodeNotRun { node: node.name.clone() });
        } else if r.count > 1 {
            let mut steps = vec![StepId(r.first)];
            while a < again.len() && again[a].0 < n as u32 {
                a += 1;
            }
            while a < again.len() && again[a].0 == n as u32 {
                steps.push(StepId(again[a].1));
                a += 1;
            }
            out.push(Violation::NodeRunTwice { node: node.name.clone(), steps });
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
