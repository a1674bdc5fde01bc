//! Indices the checks share, built in one pass over the steps and kernels: dense stream and event numbers,
//! each kernel's first launch, and the writer kernels of each alias root.

use std::collections::HashMap;

use crate::ids::{KernelId, StepId};
use crate::plan::{Access, ExecutionPlan, PlanStep};

use super::violation::StepRef;

/// "No such step / kernel / dense id".
pub(super) const NONE: u32 = u32::MAX;

/// Map sparse `u32` ids to dense `0..n` in order of first appearance: a table when the ids are small (plans
/// number them densely), a hash map otherwise (a hand-edited plan may use any id).
pub(super) enum Densify {
    Table(Vec<u32>),
    Map(HashMap<u32, u32>),
}

impl Densify {
    pub(super) fn new(max_id: u32, len: usize) -> Self {
        if (max_id as usize) <= len.saturating_mul(2).saturating_add(64) {
            Densify::Table(vec![NONE; max_id as usize + 1])
        } else {
            Densify::Map(HashMap::new())
        }
    }

    /// The dense number of `id`, `next` assigned when it is new.
    pub(super) fn get_or_insert(&mut self, id: u32, next: &mut u32) -> u32 {
        let slot = match self {
            Densify::Table(t) => match t.get_mut(id as usize) {
                Some(s) => s,
                None => return NONE,
            },
            Densify::Map(m) => m.entry(id).or_insert(NONE),
        };
        if *slot == NONE {
            *slot = *next;
            *next += 1;
        }
        *slot
    }
}

/// What the checks look up.
pub(super) struct Index<'p> {
    pub plan: &'p ExecutionPlan,
    /// Dense stream number of each step.
    pub stream: Vec<u32>,
    /// Distinct streams the steps use.
    pub num_streams: usize,
    /// Dense event number of each Record/Wait step (`NONE` for other steps).
    pub event: Vec<u32>,
    /// Distinct events the steps use.
    pub num_events: usize,
    /// First launch step of each kernel (`NONE` when never launched).
    pub first_launch: Vec<u32>,
    /// Writer kernels of each alias root (Write params naming it), deduplicated.
    pub writers: HashMap<&'p str, Vec<KernelId>>,
}

impl<'p> Index<'p> {
    pub(super) fn new(plan: &'p ExecutionPlan) -> Self {
        let steps = &plan.steps;
        let (mut max_stream, mut max_event) = (0u32, 0u32);
        for s in steps {
            max_stream = max_stream.max(s.stream().0);
            if let PlanStep::Record { event, .. } | PlanStep::Wait { event, .. } = s {
                max_event = max_event.max(event.0);
            }
        }
        let mut streams = Densify::new(max_stream, steps.len());
        let mut events = Densify::new(max_event, steps.len());
        let (mut ns, mut ne) = (0u32, 0u32);
        let mut stream = Vec::with_capacity(steps.len());
        let mut event = Vec::with_capacity(steps.len());
        let mut first_launch = vec![NONE; plan.kernels().len()];
        for (i, s) in steps.iter().enumerate() {
            stream.push(streams.get_or_insert(s.stream().0, &mut ns));
            event.push(match s {
                PlanStep::Record { event, .. } | PlanStep::Wait { event, .. } => events.get_or_insert(event.0, &mut ne),
                _ => NONE,
            });
            if let PlanStep::Launch { kernel, .. } = s {
                if let Some(f) = first_launch.get_mut(kernel.index()) {
                    if *f == NONE {
                        *f = i as u32;
                    }
                }
            }
        }
        let mut writers: HashMap<&'p str, Vec<KernelId>> = HashMap::with_capacity(plan.kernels().len());
        for (ki, k) in plan.kernels().iter().enumerate() {
            for p in k.params.iter().filter(|p| p.access == Access::Write) {
                let w = writers.entry(p.root.as_str()).or_default();
                let id = KernelId::from_index(ki);
                if !w.contains(&id) {
                    w.push(id);
                }
            }
        }
        Index { plan, stream, num_streams: ns as usize, event, num_events: ne as usize, first_launch, writers }
    }

    /// The step at `i` as violations name it.
    pub(super) fn step_ref(&self, i: u32) -> StepRef {
        let step = &self.plan.steps[i as usize];
        let kernel = match step {
            PlanStep::Launch { kernel, .. } => Some(*kernel),
            _ => None,
        };
        StepRef { step: StepId(i), stream: step.stream(), kernel }
    }
}
