//! The timing model (DESIGN.md section 5): an event-driven simulation of one replay of the plan's streams on a
//! `DeviceProfile`.
//!
//! - A launch lasts its roofline time (`kernel.estimate.time_us`) plus a launch overhead (eager submission or
//!   CUDA-graph replay) and occupies `kernel.estimate.occupancy` of the SMs for its whole duration.
//! - Concurrent launches share the SMs: while the occupancies of the running launches sum to more than 1, each
//!   progresses at rate `1 / sum` (processor sharing), so the device never does more than one device-second of
//!   work per second.
//! - A copy lasts `2 * bytes / bandwidth` plus the overhead and uses no SMs (copy engines).
//! - Record takes no time; a Wait holds its stream until the Record it depends on (the latest one of its event
//!   submitted before it) has been reached.
//!
//! Reported: makespan, the bound `max(critical path, sum of duration x occupancy)` (no schedule on the device
//! does better, so `makespan >= bound` always), per-stream busy time, and the total launch overhead eager vs graph
//! replay. O(steps x running launches).

use graph_plan::{DeviceProfile, ExecutionPlan, KernelId, PlanStep, StepId, StreamId};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::schedule::{stream_count, wait_dependencies};

/// Which launch overhead applies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum OverheadMode {
    /// Eager submission (`launch_overhead_eager_us` per launch).
    #[default]
    Eager,
    /// Replay of a captured CUDA graph (`launch_overhead_graph_us` per launch).
    Graph,
}

/// What the timing model runs on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TimingOptions {
    /// The device (the plan's estimates should have been made for it).
    pub device: DeviceProfile,
    /// Launch overhead mode.
    pub overhead: OverheadMode,
}

impl TimingOptions {
    /// The device the plan was built for (by name; the default profile when unknown), eager overhead.
    pub fn for_plan(plan: &ExecutionPlan) -> Self {
        let device = DeviceProfile::by_name(&plan.stats().device).unwrap_or_default();
        TimingOptions { device, overhead: OverheadMode::Eager }
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
    /// Fraction of the SMs it occupies (0 for copies, records and waits).
    pub occupancy: f64,
}

/// The timing model's figures for one replay.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TimingReport {
    /// Device profile name.
    pub device: String,
    /// Overhead mode of the simulation.
    pub overhead: OverheadMode,
    /// Time at which the last step ends.
    pub makespan_us: f64,
    /// `max(critical_path_us, area_us)`.
    pub bound_us: f64,
    /// Longest chain of durations along stream order and Record -> Wait.
    pub critical_path_us: f64,
    /// Sum over launches of duration x occupancy.
    pub area_us: f64,
    /// Per stream, the time it spends running launches and copies.
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
    /// No stream can make progress (cannot happen when every Wait follows its Record in submission order).
    #[error("the streams deadlock at step {step} on {stream}")]
    Deadlock {
        /// A blocked step.
        step: StepId,
        /// Its stream.
        stream: StreamId,
    },
}

/// Duration (roofline + overhead) and occupancy of every step.
fn costs(plan: &ExecutionPlan, opts: &TimingOptions) -> Result<Vec<(f64, f64)>, TimingError> {
    let overhead = match opts.overhead {
        OverheadMode::Eager => opts.device.launch_overhead_eager_us,
        OverheadMode::Graph => opts.device.launch_overhead_graph_us,
    };
    plan.steps
        .iter()
        .enumerate()
        .map(|(i, s)| match s {
            PlanStep::Launch { kernel, .. } => {
                let k = plan
                    .kernel(*kernel)
                    .ok_or(TimingError::UnknownKernel { step: StepId::from_index(i), kernel: *kernel })?;
                let t = k.estimate.time_us.max(0.0);
                Ok((t + overhead, k.estimate.occupancy.clamp(0.0, 1.0)))
            }
            PlanStep::Copy { bytes, .. } => {
                let t = 2.0 * *bytes as f64 / opts.device.mem_bandwidth.max(1.0) * 1e6;
                Ok((t + overhead, 0.0))
            }
            _ => Ok((0.0, 0.0)),
        })
        .collect()
}

/// Simulate one replay of `plan`.
pub fn simulate(plan: &ExecutionPlan, opts: &TimingOptions) -> Result<TimingReport, TimingError> {
    let n = plan.steps.len();
    let ns = stream_count(plan);
    let deps = wait_dependencies(plan);
    let cost = costs(plan, opts)?;

    // Critical path: infinite SMs, one pass in submission order (every dependency is submitted earlier).
    let mut ready = vec![0f64; ns];
    let mut fin = vec![0f64; n];
    for (i, s) in plan.steps.iter().enumerate() {
        let st = s.stream().index();
        let mut start = ready[st];
        if let Some(r) = deps[i] {
            start = start.max(fin[r]);
        }
        fin[i] = start + cost[i].0;
        ready[st] = fin[i];
    }
    let critical_path_us = fin.iter().copied().fold(0f64, f64::max);
    let area_us: f64 = cost.iter().map(|&(d, o)| d * o).sum();

    // Event-driven processor sharing.
    let mut queues: Vec<Vec<usize>> = vec![Vec::new(); ns];
    for (i, s) in plan.steps.iter().enumerate() {
        queues[s.stream().index()].push(i);
    }
    let mut head = vec![0usize; ns];
    let mut busy: Vec<Option<usize>> = vec![None; ns];
    let mut reached = vec![false; n];
    let mut start = vec![0f64; n];
    let mut end = vec![0f64; n];
    let mut remaining = vec![0f64; n];
    let mut running: Vec<usize> = Vec::new();
    let mut now = 0f64;
    let mut finished = 0usize;
    loop {
        // Let idle streams take their zero-time steps and start their next launch.
        let mut progress = true;
        while progress {
            progress = false;
            for s in 0..ns {
                while busy[s].is_none() {
                    let Some(&i) = queues[s].get(head[s]) else { break };
                    match &plan.steps[i] {
                        PlanStep::Wait { .. } if deps[i].is_some_and(|r| !reached[r]) => break,
                        PlanStep::Record { .. } | PlanStep::Wait { .. } => {
                            start[i] = now;
                            end[i] = now;
                            reached[i] = true;
                            finished += 1;
                        }
                        _ => {
                            start[i] = now;
                            remaining[i] = cost[i].0;
                            busy[s] = Some(i);
                            running.push(i);
                        }
                    }
                    head[s] += 1;
                    progress = true;
                }
            }
        }
        if running.is_empty() {
            if finished == n {
                break;
            }
            let s = (0..ns).find(|&s| head[s] < queues[s].len()).unwrap_or(0);
            let step = queues[s].get(head[s]).copied().unwrap_or(0);
            return Err(TimingError::Deadlock { step: StepId::from_index(step), stream: StreamId::from_index(s) });
        }
        let load: f64 = running.iter().map(|&i| cost[i].1).sum();
        let rate = if load > 1.0 { 1.0 / load } else { 1.0 };
        let dt = running.iter().map(|&i| remaining[i] / rate).fold(f64::INFINITY, f64::min);
        now += dt;
        let mut still = Vec::with_capacity(running.len());
        for &i in &running {
            remaining[i] -= dt * rate;
            // Relative slack for the float error of repeated subtraction.
            if remaining[i] <= 1e-9 * cost[i].0.max(1e-9) {
                end[i] = now;
                reached[i] = true;
                finished += 1;
                busy[plan.steps[i].stream().index()] = None;
            } else {
                still.push(i);
            }
        }
        running = still;
    }

    let mut stream_busy_us = vec![0f64; ns];
    let mut launches = 0usize;
    let mut steps = Vec::with_capacity(n);
    for (i, s) in plan.steps.iter().enumerate() {
        let kernel = match s {
            PlanStep::Launch { kernel, .. } => Some(*kernel),
            _ => None,
        };
        if s.is_compute() {
            launches += 1;
            stream_busy_us[s.stream().index()] += end[i] - start[i];
        }
        steps.push(StepTiming {
            step: StepId::from_index(i),
            stream: s.stream(),
            kernel,
            start_us: start[i],
            end_us: end[i],
            duration_us: cost[i].0,
            occupancy: cost[i].1,
        });
    }
    let makespan_us = end.iter().copied().fold(0f64, f64::max);
    Ok(TimingReport {
        device: opts.device.name.clone(),
        overhead: opts.overhead,
        makespan_us,
        bound_us: critical_path_us.max(area_us),
        critical_path_us,
        area_us,
        stream_busy_us,
        launches,
        launch_overhead_eager_us: launches as f64 * opts.device.launch_overhead_eager_us,
        launch_overhead_graph_us: launches as f64 * opts.device.launch_overhead_graph_us,
        steps,
    })
}
