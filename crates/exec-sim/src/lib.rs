//! exec-sim: cuplan's CPU backend and our proof that plans are right. It runs an `ExecutionPlan` for real,
//! inside byte regions laid out exactly as the plan says (one buffer per region: pool, weights, io, host), so a
//! wrong offset, a missing event or a bad fusion shows up as wrong numbers.
//!
//! - `SimExecutor` implements `graph_plan::Executor`: `prepare` allocates the regions and writes weights and
//!   constants; `run` writes inputs, poisons the scratch regions, executes the steps in a chosen `Schedule`
//!   (submission order, or a seeded adversarial order consistent with stream order and Record/Wait) while the
//!   race detector checks every access, and reads the outputs.
//! - Kernels run from their expression programs (`Kernel::body`), never from graph nodes (`kernel`, `ops`,
//!   `linalg`); custom kernels run through CPU closures registered by entry name.
//! - `timing` is the event-driven timing model of the streams on a device profile (DESIGN.md section 5);
//!   `trace` writes it as Chrome trace event JSON; `check` compares the optimised plan with the reference plan.
//!
//! Depends on graph-plan alone (which re-exports the IR types).

// Library code returns typed errors; tests may unwrap (clippy.toml allows it inside #[test] and #[cfg(test)]).
#![deny(clippy::unwrap_used, clippy::expect_used)]

pub mod attention;
pub mod fuzz_entry;
mod kernel;
mod linalg;
pub mod math;
mod ops;
pub mod precision_check;
pub mod race;
mod reference_check;
pub mod schedule;
pub mod timing;
pub mod trace;
mod value;

use graph_plan::exec::check_tensors;
use graph_plan::{
    set::Dims, BindingRole, ExecError, ExecutionPlan, Executor, HostTensor, Op, PlanSet, PlanStep, PreparedPlan,
    SetError, TensorMap, Unavailable,
};
use std::collections::HashMap;
use std::sync::Arc;
use thiserror::Error;

pub use kernel::CustomFn;
pub use precision_check::{check_precision, inputs_for, PrecisionCheck, PrecisionOutput};
pub use race::{RaceAccess, RaceReport};
pub use reference_check::{
    check, check_plans, compare, fill_tensors, CheckError, CheckOptions, CheckReport, OutputComparison,
};
pub use schedule::Schedule;
pub use timing::{simulate, LaunchMode, StepTiming, TimingError, TimingOptions, TimingReport};
pub use trace::{chrome_trace, chrome_trace_json};

use kernel::{backend, Memory, SCRATCH_REGIONS};
use race::{RaceDetector, StepLabel};

/// Byte written over scratch memory before each run: f32/f16 NaN, integer -1, bool true.
pub const POISON: u8 = 0xFF;

/// How the simulator runs plans.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimOptions {
    /// The order of execution.
    pub schedule: Schedule,
    /// Check every access for races (on by default; costs little).
    pub race_check: bool,
    /// Fill the pool, host region and output buffers with `POISON` before each run (on by default), so a read
    /// of bytes nobody wrote this run yields NaN rather than last run's value.
    pub poison: bool,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions { schedule: Schedule::Submission, race_check: true, poison: true }
    }
}

/// What can go wrong in a simulated run.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum SimError {
    /// The caller's tensors, the plan or a kernel (missing input, bad index, unsupported custom kernel...).
    #[error(transparent)]
    Exec(#[from] ExecError),
    /// Two unordered accesses to the same bytes, at least one a write.
    #[error("{0}")]
    Race(Box<RaceReport>),
}

impl From<SimError> for ExecError {
    fn from(e: SimError) -> ExecError {
        match e {
            SimError::Exec(e) => e,
            SimError::Race(r) => backend(r.to_string()),
        }
    }
}

/// The CPU simulator backend.
#[derive(Clone, Default)]
pub struct SimExecutor {
    options: SimOptions,
    customs: HashMap<String, CustomFn>,
}

impl std::fmt::Debug for SimExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut names: Vec<&String> = self.customs.keys().collect();
        names.sort();
        f.debug_struct("SimExecutor").field("options", &self.options).field("customs", &names).finish()
    }
}

impl SimExecutor {
    /// A simulator with default options (submission order, race check and poisoning on).
    pub fn new() -> Self {
        Self::default()
    }

    /// A simulator with the given options.
    pub fn with_options(options: SimOptions) -> Self {
        SimExecutor { options, customs: HashMap::new() }
    }

    /// The options.
    pub fn options(&self) -> SimOptions {
        self.options
    }

    /// Change the options (prepared plans keep the options they were prepared with).
    pub fn set_options(&mut self, options: SimOptions) {
        self.options = options;
    }

    /// Register the CPU implementation of custom kernels with entry point `entry`: it receives the kernel's
    /// inputs in order and returns its outputs (dtype and shape as the op declares).
    pub fn register_custom<F>(&mut self, entry: impl Into<String>, f: F)
    where
        F: Fn(&[HostTensor]) -> Result<Vec<HostTensor>, String> + Send + Sync + 'static,
    {
        self.customs.insert(entry.into(), Arc::new(f));
    }

    /// Prepare with concrete type (same as `Executor::prepare`).
    pub fn prepare_sim(&self, plan: &ExecutionPlan, weights: &TensorMap) -> Result<SimPrepared, ExecError> {
        let sizes: [u64; 4] = graph_plan::Region::ALL.map(|r| plan.region_bytes(r));
        let mut mem = self.memory(&sizes)?;
        self.upload(plan, &mut mem, weights)?;
        Ok(SimPrepared { plan: plan.clone(), mem, options: self.options, customs: self.customs.clone() })
    }

    /// Prepare a plan set once: one memory of the set's region sizes (one pool, the largest member's), every
    /// member's weights and constants uploaded at their shared addresses. Requests of any covered size then run
    /// without preparing again.
    pub fn prepare_set(&self, set: &PlanSet, weights: &TensorMap) -> Result<SimPreparedSet, ExecError> {
        let sizes: [u64; 4] = graph_plan::Region::ALL.map(|r| set.region_bytes(r));
        let mut mem = self.memory(&sizes)?;
        for m in set.members() {
            self.upload(&m.plan, &mut mem, weights)?;
        }
        Ok(SimPreparedSet { set: set.clone(), mem, options: self.options, customs: self.customs.clone() })
    }

    /// Zeroed regions of the given sizes.
    fn memory(&self, sizes: &[u64; 4]) -> Result<Memory, ExecError> {
        let mut mem = Memory::default();
        for r in graph_plan::Region::ALL {
            let b = sizes[r.index()];
            let n = usize::try_from(b)
                .map_err(|_| backend(format!("region {} of {b} bytes does not fit memory", r.name())))?;
            mem.regions[r.index()] = vec![0u8; n];
        }
        Ok(mem)
    }

    /// Check that this executor can run `plan`, and write its weights and constants into `mem`.
    fn upload(&self, plan: &ExecutionPlan, mem: &mut Memory, weights: &TensorMap) -> Result<(), ExecError> {
        check_tensors(plan, weights, BindingRole::Weight)?;
        // Fail early on kernels this executor cannot run.
        for k in plan.kernels() {
            for ins in &k.body {
                if let Op::Custom(c) = &ins.op {
                    if !self.customs.contains_key(&c.entry) {
                        return Err(kernel::missing_custom(k, &ins.node, &c.entry));
                    }
                }
            }
        }
        for b in plan.bindings() {
            let data = match b.role {
                BindingRole::Weight => weights.get(&*b.name).map(|t| graph_plan::exec::weight_bytes(b, t)),
                BindingRole::Constant => b.data.as_deref().map(std::borrow::Cow::Borrowed),
                _ => continue,
            };
            let Some(data) = data else {
                return Err(ExecError::Missing {
                    role: if b.role == BindingRole::Weight { "weight" } else { "constant" },
                    name: b.name.to_string(),
                });
            };
            let dst = mem.bytes_mut(&b.buffer).map_err(|e| backend(format!("binding '{}': {e}", b.name)))?;
            if dst.len() != data.len() {
                return Err(ExecError::Mismatch {
                    role: "constant",
                    name: b.name.to_string(),
                    expected: format!("{} bytes", dst.len()),
                    got: format!("{} bytes", data.len()),
                });
            }
            dst.copy_from_slice(&data);
        }
        Ok(())
    }
}

/// A plan set prepared on the simulator: one memory for every member.
pub struct SimPreparedSet {
    set: PlanSet,
    mem: Memory,
    options: SimOptions,
    customs: HashMap<String, CustomFn>,
}

impl std::fmt::Debug for SimPreparedSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimPreparedSet")
            .field("members", &self.set.members().len())
            .field("options", &self.options)
            .finish()
    }
}

impl SimPreparedSet {
    /// The prepared set.
    pub fn set(&self) -> &PlanSet {
        &self.set
    }

    /// Run member `i` on inputs of exactly its shapes.
    pub fn run_member(&mut self, i: usize, inputs: &TensorMap) -> Result<TensorMap, SimError> {
        let m = self.set.members().get(i).ok_or_else(|| backend(format!("the set has no member {i}")))?;
        run_on(&m.plan, &mut self.mem, self.options, &self.customs, inputs)
    }

    /// Run a request of `dims` (`PlanSet::run_with`: select, pad, run, slice; with `chunk`, above the largest
    /// bucket in chunks of it).
    pub fn run_request(&mut self, dims: &Dims, inputs: &TensorMap, chunk: bool) -> Result<TensorMap, SetError> {
        let Self { set, mem, options, customs } = self;
        set.run_with(dims, inputs, chunk, |i, feed| {
            let m = &set.members()[i];
            run_on(&m.plan, mem, *options, customs, feed).map_err(ExecError::from)
        })
    }
}

impl Executor for SimExecutor {
    type Prepared = SimPrepared;

    fn name(&self) -> &'static str {
        "sim"
    }

    fn availability(&self) -> Result<(), Unavailable> {
        Ok(())
    }

    fn prepare(&self, plan: &ExecutionPlan, weights: &TensorMap) -> Result<SimPrepared, ExecError> {
        self.prepare_sim(plan, weights)
    }
}

/// A plan prepared on the simulator: its regions hold the weights and constants.
pub struct SimPrepared {
    plan: ExecutionPlan,
    mem: Memory,
    options: SimOptions,
    customs: HashMap<String, CustomFn>,
}

impl std::fmt::Debug for SimPrepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimPrepared").field("graph", &self.plan.graph_name()).field("options", &self.options).finish()
    }
}

impl SimPrepared {
    /// The prepared plan.
    pub fn plan(&self) -> &ExecutionPlan {
        &self.plan
    }

    /// Change the schedule, race check or poisoning for later runs.
    pub fn set_options(&mut self, options: SimOptions) {
        self.options = options;
    }

    /// The first launch, in submission order, that wrote a non-finite float (inf or NaN) in the last run, as
    /// (node, tensor): the overflow report of `cuplan run --check`. Exact on plans without memory reuse (the
    /// reference options), where every buffer still holds what its writer wrote when the run ends.
    pub fn first_non_finite(&self) -> Option<(String, String)> {
        for step in &self.plan.steps {
            let graph_plan::PlanStep::Launch { kernel, .. } = step else { continue };
            let Some(k) = self.plan.kernel(*kernel) else { continue };
            for p in k.params.iter().filter(|p| p.access == graph_plan::Access::Write) {
                let v = k.value(p.value);
                let Ok(bytes) = self.mem.bytes(&p.buffer) else { continue };
                let bad = match v.dtype {
                    graph_plan::DType::F32 => {
                        bytes.chunks_exact(4).any(|c| !f32::from_le_bytes([c[0], c[1], c[2], c[3]]).is_finite())
                    }
                    graph_plan::DType::F16 => {
                        bytes.chunks_exact(2).any(|c| !half::f16::from_le_bytes([c[0], c[1]]).is_finite())
                    }
                    graph_plan::DType::BF16 => {
                        bytes.chunks_exact(2).any(|c| !half::bf16::from_le_bytes([c[0], c[1]]).is_finite())
                    }
                    _ => false,
                };
                if bad {
                    let node = k
                        .body
                        .iter()
                        .find(|i| i.outputs.contains(&p.value))
                        .map_or_else(|| k.name.clone(), |i| i.node.to_string());
                    return Some((node, v.name.to_string()));
                }
            }
        }
        None
    }

    /// Run with the typed error (`SimError::Race` carries the race report).
    pub fn run_sim(&mut self, inputs: &TensorMap) -> Result<TensorMap, SimError> {
        run_on(&self.plan, &mut self.mem, self.options, &self.customs, inputs)
    }
}

/// Run `plan` over the memory `mem` (its regions prepared): the one run loop of a plan and of a set's member.
fn run_on(
    plan: &ExecutionPlan,
    mem: &mut Memory,
    options: SimOptions,
    customs: &HashMap<String, CustomFn>,
    inputs: &TensorMap,
) -> Result<TensorMap, SimError> {
    let _span = tracing::debug_span!("sim_run", graph = plan.graph_name()).entered();
    check_tensors(plan, inputs, BindingRole::Input)?;
    if options.poison {
        for r in SCRATCH_REGIONS {
            mem.regions[r.index()].fill(POISON);
        }
        for b in plan.bindings().iter().filter(|b| b.role == BindingRole::Output) {
            if let Ok(out) = mem.bytes_mut(&b.buffer) {
                out.fill(POISON);
            }
        }
    }
    for b in plan.bindings().iter().filter(|b| b.role == BindingRole::Input) {
        let t = inputs.get(&*b.name).ok_or_else(|| ExecError::Missing { role: "input", name: b.name.to_string() })?;
        let dst = mem.bytes_mut(&b.buffer).map_err(|e| backend(format!("input '{}': {e}", b.name)))?;
        dst.copy_from_slice(&t.data);
    }
    let order = schedule::execution_order(plan, options.schedule);
    let deps = schedule::wait_dependencies(plan);
    let ns = schedule::stream_count(plan);
    let mut race = options.race_check.then(|| {
        let labels = plan
            .steps
            .iter()
            .map(|s| match s {
                PlanStep::Launch { kernel, .. } => StepLabel {
                    kernel: Some(*kernel),
                    what: plan
                        .kernel(*kernel)
                        .map(|k| k.node_names().collect::<Vec<_>>().join(" + "))
                        .unwrap_or_default(),
                },
                PlanStep::Copy { node, .. } => StepLabel {
                    kernel: None,
                    what: node.as_ref().map_or("copy".to_string(), |n| format!("copy [{n}]")),
                },
                PlanStep::Record { event, .. } => StepLabel { kernel: None, what: format!("record {event}") },
                PlanStep::Wait { event, .. } => StepLabel { kernel: None, what: format!("wait {event}") },
            })
            .collect();
        RaceDetector::new(ns, labels, plan.steps.iter().map(PlanStep::stream).collect())
    });
    for &i in &order {
        let step = &plan.steps[i];
        let s = step.stream().index();
        let epoch = race.as_mut().map_or(0, |r| r.begin(s));
        match step {
            PlanStep::Launch { kernel, .. } => {
                let k = plan
                    .kernel(*kernel)
                    .ok_or_else(|| backend(format!("step #{i} launches unknown kernel {kernel}")))?;
                if let Some(r) = race.as_mut() {
                    r.access(i, s, epoch, &kernel::accesses(k)).map_err(SimError::Race)?;
                }
                kernel::run(k, mem, customs)?;
            }
            PlanStep::Copy { src, dst, bytes, .. } => {
                if let Some(r) = race.as_mut() {
                    let n = (*bytes).min(src.bytes).min(dst.bytes);
                    let acc = [
                        (graph_plan::BufferRef { bytes: n, ..*src }, graph_plan::Access::Read),
                        (graph_plan::BufferRef { bytes: n, ..*dst }, graph_plan::Access::Write),
                    ];
                    r.access(i, s, epoch, &acc).map_err(SimError::Race)?;
                }
                mem.copy(src, dst, *bytes).map_err(|e| backend(format!("copy at step #{i}: {e}")))?;
            }
            PlanStep::Record { .. } => {
                if let Some(r) = race.as_mut() {
                    r.record(i, s);
                }
            }
            PlanStep::Wait { .. } => {
                if let Some(r) = race.as_mut() {
                    r.wait(s, deps[i]);
                }
            }
        }
    }
    let mut outputs = TensorMap::new();
    for b in plan.bindings().iter().filter(|b| b.role == BindingRole::Output) {
        let data = mem.bytes(&b.buffer).map_err(|e| backend(format!("output '{}': {e}", b.name)))?.to_vec();
        outputs.insert(b.name.to_string(), HostTensor { dtype: b.dtype, shape: b.shape.clone(), data });
    }
    Ok(outputs)
}

impl PreparedPlan for SimPrepared {
    fn run(&mut self, inputs: &TensorMap) -> Result<TensorMap, ExecError> {
        self.run_sim(inputs).map_err(ExecError::from)
    }
}

/// Convenience: prepare `plan` with `weights` and run it once on `inputs`.
pub fn run_plan(
    exec: &SimExecutor,
    plan: &ExecutionPlan,
    weights: &TensorMap,
    inputs: &TensorMap,
) -> Result<TensorMap, SimError> {
    exec.prepare_sim(plan, weights)?.run_sim(inputs)
}

/// Names of tensors that should get positive seeded values (BatchNormalization variances), for
/// `graph_plan::exec::fill_missing`.
pub fn positive_tensors(plan: &ExecutionPlan) -> Vec<String> {
    let mut names = Vec::new();
    for k in plan.kernels() {
        for ins in &k.body {
            if matches!(ins.op, Op::BatchNormalization { .. }) {
                if let Some(v) = ins.inputs.get(4).and_then(|&v| k.values.get(v.index())) {
                    names.push(v.name.to_string());
                }
            }
        }
    }
    names.sort();
    names.dedup();
    names
}
