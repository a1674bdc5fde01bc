//! The timing model (DESIGN.md section 5) of a plan: its steps handed to the shared event-driven evaluator
//! (`graph_plan::timing`, also used by the stream pass), and the result mapped back onto the steps.
//!
//! - A launch lasts its roofline time (`kernel.estimate.time_us`) plus the launch overhead of the mode (eager
//!   submission or CUDA-graph replay) and occupies `kernel.estimate.occupancy` of the SMs.
//! - Concurrent launches share the SMs (processor sharing: while the occupancies of the running launches sum
//!   to more than 1, each progresses at `1 / sum`).
//! - A copy lasts `2 * bytes / bandwidth` plus the overhead; it occupies a single block slot (copy engines do
//!   the work; the evaluator needs a positive share).
//! - Record takes no time; a Wait holds its stream until the work recorded by the latest earlier Record of its
//!   event has finished.
//!
//! Reported: makespan, the bound `max(critical path, sum of duration x occupancy)` (no schedule on the device
//! does better: `makespan >= bound` always), per-stream busy time, the total launch overhead eager vs graph
//! replay, and per-step start and end times (for traces).

use graph_plan::timing::{self as eval, SimStep};
use graph_plan::{DeviceProfile, ExecutionPlan, KernelId, PlanStep, StepId, StreamId};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::schedule::stream_count;

/// Which launch overhead applies (the shared evaluator's mode).
pub use graph_plan::timing::LaunchMode;

/// What the timing model runs on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TimingOptions {
    /// The device (the plan's estimates should have been made for it).
    pub device: DeviceProfile,
    /// Launch overhead mode.
    pub overhead: LaunchMode,
}

impl TimingOptions {
    /// The device the plan was built for (the profile the plan carries), graph replay.
    pub fn for_plan(plan: &ExecutionPlan) -> Self {
        TimingOptions { device: plan.device().clone(), overhead: LaunchMode::Graph }
    }
}

/// When one step ran in the model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepTiming {
    /// The step.
    pub step: StepId,
    /// Its stream.
    pub stream: StreamId,
    /// The kernel, for launches.
    pub kernel: Option<KernelId>,
    /// Start, microseconds.
    pub start_us: f64,
    /// End, microseconds (equal to the start for records and waits).
    pub end_us: f64,
    /// Duration alone on the device (roofline + overhead); 0 for records and waits.
    pub duration_us: f64,
    /// Fraction of the SMs it occupies (0 for records and waits).
    pub occupancy: f64,
}

/// The timing model's figures for one replay.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TimingReport {
    /// Device profile name.
    pub device: String,
    /// Overhead mode of the simulation.
    pub overhead: LaunchMode,
    /// Time at which the last step ends.
    pub makespan_us: f64,
    /// `max(energy_us, area_us)`: no schedule of these launches on these streams does better.
    pub bound_us: f64,
    /// Longest chain of durations along stream order and Record -> Wait.
    pub critical_path_us: f64,
    /// The energetic path (`graph_passes::timing`): the critical path, lengthened where launches between two
    /// ordered ones share the device; at least `critical_path_us`.
    pub energy_us: f64,
    /// Sum over launches of duration x occupancy.
    pub area_us: f64,
    /// Per stream (indexed by stream), the time it spends running launches and copies.
    pub stream_busy_us: Vec<f64>,
    /// Launches and copies.
    pub launches: usize,
    /// Total launch overhead with eager submission.
    pub launch_overhead_eager_us: f64,
    /// Total launch overhead with graph replay.
    pub launch_overhead_graph_us: f64,
    /// Every step, indexed by step.
    pub steps: Vec<StepTiming>,
}

/// A plan the timing model cannot run.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum TimingError {
    /// A launch names a kernel the plan lacks.
    #[error("step {step} launches unknown kernel {kernel}")]
    UnknownKernel {
        /// The step.
        step: StepId,
        /// The kernel.
        kernel: KernelId,
    },
    /// The shared evaluator rejected the steps (a wait with no earlier record, a bad estimate).
    #[error(transparent)]
    Evaluator(#[from] eval::TimingError),
}

/// Simulate one replay of `plan`.
pub fn simulate(plan: &ExecutionPlan, opts: &TimingOptions) -> Result<TimingReport, TimingError> {
    let n = plan.steps.len();
    let ns = stream_count(plan);
    let copy_occupancy = opts.device.occupancy(1);
    let mut sim = Vec::with_capacity(n);
    for (i, s) in plan.steps.iter().enumerate() {
        sim.push(match s {
            PlanStep::Launch { stream, kernel, .. } => {
                let k = plan
                    .kernel(*kernel)
                    .ok_or(TimingError::UnknownKernel { step: StepId::from_index(i), kernel: *kernel })?;
                SimStep::Work { stream: *stream, duration_us: k.estimate.time_us, occupancy: k.estimate.occupancy }
            }
            PlanStep::Copy { stream, bytes, .. } => SimStep::Work {
                stream: *stream,
                duration_us: 2.0 * *bytes as f64 / opts.device.mem_bandwidth.max(1.0) * 1e6,
                occupancy: copy_occupancy,
            },
            PlanStep::Record { stream, event } => SimStep::Record { stream: *stream, event: event.0 },
            PlanStep::Wait { stream, event } => SimStep::Wait { stream: *stream, event: event.0 },
        });
    }
    let (tasks, step_of) = eval::tasks_from_steps(&sim)?;
    let overhead = opts.overhead.overhead_us(&opts.device);
    let tl = eval::simulate(&tasks, overhead)?;
    // Map back: work steps take their task's times; a Record sits at the end of its stream's previous work; a
    // Wait at the later of its stream's previous work and the end of the work its record captured.
    let mut task_of_step = vec![None; n];
    for (t, &i) in step_of.iter().enumerate() {
        task_of_step[i] = Some(t);
    }
    let mut last_end = vec![0f64; ns];
    let mut record_time: std::collections::HashMap<u32, f64> = std::collections::HashMap::new();
    let mut steps = Vec::with_capacity(n);
    let mut stream_busy_us = vec![0f64; ns];
    for (i, s) in plan.steps.iter().enumerate() {
        let st = s.stream().index();
        let (start, end, dur, occ, kernel) = match (s, task_of_step[i]) {
            (PlanStep::Record { event, .. }, _) => {
                record_time.insert(event.0, last_end[st]);
                (last_end[st], last_end[st], 0.0, 0.0, None)
            }
            (PlanStep::Wait { event, .. }, _) => {
                let t = last_end[st].max(record_time.get(&event.0).copied().unwrap_or(0.0));
                (t, t, 0.0, 0.0, None)
            }
            (_, Some(t)) => {
                let task = &tasks[t];
                let (a, b) = (tl.start_us[t], tl.end_us[t]);
                last_end[st] = b;
                stream_busy_us[st] += b - a;
                let kernel = match s {
                    PlanStep::Launch { kernel, .. } => Some(*kernel),
                    _ => None,
                };
                (a, b, task.duration_us + overhead, task.occupancy, kernel)
            }
            (_, None) => (last_end[st], last_end[st], 0.0, 0.0, None),
        };
        steps.push(StepTiming {
            step: StepId::from_index(i),
            stream: s.stream(),
            kernel,
            start_us: start,
            end_us: end,
            duration_us: dur,
            occupancy: occ,
        });
    }
    let launches = tasks.len();
    Ok(TimingReport {
        device: opts.device.name.clone(),
        overhead: opts.overhead,
        makespan_us: tl.makespan_us,
        bound_us: tl.bound.bound_us,
        critical_path_us: tl.bound.critical_path_us,
        energy_us: tl.bound.energy_us,
        area_us: tl.bound.area_us,
        stream_busy_us,
        launches,
        launch_overhead_eager_us: launches as f64 * opts.device.launch_overhead_eager_us,
        launch_overhead_graph_us: launches as f64 * opts.device.launch_overhead_graph_us,
        steps,
    })
}
