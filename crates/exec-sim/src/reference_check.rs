//! `check`: run the reference plan (fusion off, reuse off, one stream, submission order) and an optimised plan
//! on the same inputs and weights, and compare every output.
//!
//! Integers and bools must match exactly. Floats report the max absolute and max relative error per output,
//! relative to the output's magnitude (`max |reference|`, at least 1e-30): the simulator computes every
//! instruction with one formula whether fused or not and accumulates in a fixed order, so plans agree bitwise;
//! the tolerance (default 1e-5) is there for backends that reorder reductions. NaN matches NaN.

use graph_plan::exec::fill_missing;
use graph_plan::ir::ComputeGraph;
use graph_plan::{
    verify, BindingRole, DType, ExecutionPlan, HostTensor, Op, PlanError, PlanOptions, Shape, TensorMap, Violation,
};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::{positive_tensors, Schedule, SimError, SimExecutor, SimOptions};

/// How to check.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckOptions {
    /// Schedule of the optimised plan (the reference runs in submission order).
    pub schedule: Schedule,
    /// Race-check both runs.
    pub race_check: bool,
    /// Relative tolerance for floats (relative to each output's magnitude).
    pub tolerance: f64,
    /// Seed for inputs and weights the caller does not supply.
    pub seed: u64,
}

impl Default for CheckOptions {
    fn default() -> Self {
        CheckOptions { schedule: Schedule::Submission, race_check: true, tolerance: 1e-5, seed: 0 }
    }
}

/// One output compared.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OutputComparison {
    /// Output name.
    pub name: String,
    /// Its dtype.
    pub dtype: DType,
    /// Its shape.
    pub shape: Shape,
    /// Largest `|optimised - reference|` (infinite where exactly one side is NaN).
    pub max_abs_err: f64,
    /// `max_abs_err / max(max |reference|, 1e-30)`.
    pub max_rel_err: f64,
    /// Elements that differ at all (bitwise for floats, NaN = NaN).
    pub differing: usize,
    /// Identical bytes.
    pub bitwise_equal: bool,
    /// Within tolerance (exact for integers and bools).
    pub passed: bool,
    /// NaN or infinite elements of the reference output (a model fed values outside its domain, or a bug:
    /// such elements compare equal to themselves and would otherwise pass unnoticed).
    pub reference_non_finite: usize,
}

/// The result of a check.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckReport {
    /// Per output, sorted by name.
    pub outputs: Vec<OutputComparison>,
    /// The float tolerance used.
    pub tolerance: f64,
    /// Every output passed.
    pub passed: bool,
    /// Launches of the reference plan.
    pub reference_launches: usize,
    /// Launches of the optimised plan.
    pub optimised_launches: usize,
    /// Streams of the optimised plan.
    pub optimised_streams: usize,
}

/// Why a check could not be completed (a failed comparison is a report with `passed: false`, not an error).
#[derive(Debug, Clone, PartialEq, Error)]
pub enum CheckError {
    /// Building a plan failed.
    #[error("building the {which} plan: {source}")]
    Build {
        /// "reference" or "optimised".
        which: &'static str,
        /// The error.
        source: PlanError,
    },
    /// A plan failed `graph_plan::verify`.
    #[error("the {which} plan fails verify: {}", .violations.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Verify {
        /// "reference" or "optimised".
        which: &'static str,
        /// What verify found.
        violations: Vec<Violation>,
    },
    /// A run failed (bad tensors, a race, a kernel error).
    #[error("running the {which} plan: {source}")]
    Run {
        /// "reference" or "optimised".
        which: &'static str,
        /// The error.
        source: SimError,
    },
    /// The two plans disagree on the outputs they return.
    #[error("the plans return different outputs: {0}")]
    Outputs(String),
}

/// Fill the inputs and weights `plan` needs that the maps lack with seeded values, so that models without
/// weight files run: BatchNormalization variances positive, and f32 weights read as the second operand of
/// Conv, MatMul or Gemm scaled by `sqrt(6 / fan_in)` (He initialisation), so that deep models whose
/// normalisation was folded away (ResNet-50 as exported) keep finite activations.
pub fn fill_tensors(plan: &ExecutionPlan, inputs: &mut TensorMap, weights: &mut TensorMap, seed: u64) {
    let pos = positive_tensors(plan);
    fill_missing(plan, inputs, BindingRole::Input, seed, &pos);
    let supplied: Vec<String> = weights.keys().cloned().collect();
    fill_missing(plan, weights, BindingRole::Weight, seed, &pos);
    for (name, fan_in) in fan_ins(plan) {
        if supplied.contains(&name) || fan_in == 0 {
            continue;
        }
        if let Some(t) = weights.get_mut(&name) {
            if let Some(v) = t.to_f32() {
                let k = (6.0 / fan_in as f64).sqrt() as f32;
                *t = HostTensor::from_f32(t.shape.clone(), &v.iter().map(|x| x * k).collect::<Vec<_>>());
            }
        }
    }
}

/// Tensors read as the weight operand of Conv, MatMul or Gemm, with their fan-in.
fn fan_ins(plan: &ExecutionPlan) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    for k in plan.kernels() {
        for ins in &k.body {
            let Some(w) = ins.inputs.get(1).and_then(|&v| k.values.get(v.index())) else { continue };
            let d = w.shape.dims();
            let fan_in = match &ins.op {
                Op::Conv(_) => d.iter().skip(1).product(),
                Op::Gemm { trans_b, .. } if d.len() == 2 => {
                    if *trans_b {
                        d[1]
                    } else {
                        d[0]
                    }
                }
                Op::MatMul if d.len() >= 2 => d[d.len() - 2],
                Op::MatMul if d.len() == 1 => d[0],
                _ => continue,
            };
            out.push((w.name.to_string(), fan_in));
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Build the reference plan and one with `optimised` options, verify both, run both and compare.
pub fn check(
    graph: &ComputeGraph,
    optimised: &PlanOptions,
    inputs: &TensorMap,
    weights: &TensorMap,
    opts: &CheckOptions,
) -> Result<CheckReport, CheckError> {
    let reference = ExecutionPlan::build_with(graph, &PlanOptions::reference())
        .map_err(|source| CheckError::Build { which: "reference", source })?;
    let optimised = ExecutionPlan::build_with(graph, optimised)
        .map_err(|source| CheckError::Build { which: "optimised", source })?;
    verify(&reference).map_err(|violations| CheckError::Verify { which: "reference", violations })?;
    verify(&optimised).map_err(|violations| CheckError::Verify { which: "optimised", violations })?;
    check_plans(&reference, &optimised, inputs, weights, opts)
}

/// Run two plans of one graph (the first the reference) on the same tensors and compare their outputs.
/// Missing inputs and weights are filled with seeded values.
pub fn check_plans(
    reference: &ExecutionPlan,
    optimised: &ExecutionPlan,
    inputs: &TensorMap,
    weights: &TensorMap,
    opts: &CheckOptions,
) -> Result<CheckReport, CheckError> {
    let (mut inputs, mut weights) = (inputs.clone(), weights.clone());
    fill_tensors(reference, &mut inputs, &mut weights, opts.seed);
    let run = |plan: &ExecutionPlan, schedule: Schedule, which: &'static str| {
        let exec = SimExecutor::with_options(SimOptions { schedule, race_check: opts.race_check, poison: true });
        crate::run_plan(&exec, plan, &weights, &inputs).map_err(|source| CheckError::Run { which, source })
    };
    let want = run(reference, Schedule::Submission, "reference")?;
    let got = run(optimised, opts.schedule, "optimised")?;
    let names_w: Vec<&String> = want.keys().collect();
    let names_g: Vec<&String> = got.keys().collect();
    if names_w != names_g {
        return Err(CheckError::Outputs(format!("reference {names_w:?}, optimised {names_g:?}")));
    }
    let mut outputs = Vec::with_capacity(want.len());
    for (name, w) in &want {
        let g = &got[name];
        if g.dtype != w.dtype || g.shape != w.shape {
            return Err(CheckError::Outputs(format!(
                "'{name}': reference {} {}, optimised {} {}",
                w.dtype, w.shape, g.dtype, g.shape
            )));
        }
        outputs.push(compare(name, w, g, opts.tolerance));
    }
    let launches = |p: &ExecutionPlan| {
        p.kernel_count_fused + p.steps.iter().filter(|s| matches!(s, graph_plan::PlanStep::Copy { .. })).count()
    };
    Ok(CheckReport {
        passed: outputs.iter().all(|o| o.passed),
        outputs,
        tolerance: opts.tolerance,
        reference_launches: launches(reference),
        optimised_launches: launches(optimised),
        optimised_streams: optimised.num_streams,
    })
}

/// Compare `got` with the reference `want` (same dtype and shape).
pub fn compare(
    name: &str,
    want: &graph_plan::HostTensor,
    got: &graph_plan::HostTensor,
    tolerance: f64,
) -> OutputComparison {
    let (w, g) = (want.to_f64(), got.to_f64());
    let mut max_abs = 0f64;
    let mut mag = 0f64;
    let mut differing = 0usize;
    let reference_non_finite = w.iter().filter(|a| !a.is_finite()).count();
    for (&a, &b) in w.iter().zip(&g) {
        if a.is_finite() {
            mag = mag.max(a.abs());
        }
        let same = a == b || (a.is_nan() && b.is_nan());
        if !same {
            differing += 1;
            let d = if a.is_nan() || b.is_nan() { f64::INFINITY } else { (a - b).abs() };
            max_abs = max_abs.max(if d.is_nan() { f64::INFINITY } else { d });
        }
    }
    let max_rel = max_abs / mag.max(1e-30);
    let passed = if want.dtype.is_float() { differing == 0 || max_rel <= tolerance } else { differing == 0 };
    OutputComparison {
        name: name.to_string(),
        dtype: want.dtype,
        shape: want.shape.clone(),
        max_abs_err: max_abs,
        max_rel_err: if differing == 0 { 0.0 } else { max_rel },
        differing,
        bitwise_equal: want.data == got.data,
        passed,
        reference_non_finite,
    }
}
