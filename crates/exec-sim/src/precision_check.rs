//! `check_precision`: a half-precision plan against the f32 reference plan of the same graph (DESIGN.md 9).
//!
//! Per output over `seeds` seeded inputs: the max absolute error and the max relative error (relative to the
//! reference output's max magnitude, as [`crate::compare`] defines it); for classifier outputs (rank 2,
//! `[batch, classes]` with at least two classes) the top-1 agreement, row by row. The overflow report runs the
//! half-precision *reference* plan (no fusion, no reuse, so every tensor keeps its bytes) and names the first
//! node, in submission order, whose output holds inf or NaN.

use graph_plan::ir::ComputeGraph;
use graph_plan::{verify, BindingRole, DType, ExecutionPlan, HostTensor, PlanOptions, TensorMap};
use serde::{Deserialize, Serialize};

use crate::reference_check::{compare, fill_tensors, CheckError};
use crate::{SimExecutor, SimOptions};

/// One output's figures over every seeded input.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PrecisionOutput {
    /// Output name.
    pub name: String,
    /// Max absolute error over all seeds.
    pub max_abs_err: f64,
    /// Max relative error (to the reference output's max magnitude) over all seeds.
    pub max_rel_err: f64,
    /// Non-finite values in the half plan's output (over all seeds).
    pub non_finite: usize,
    /// Classifier outputs: (rows whose arg-max agrees, rows), over all seeds.
    pub top1: Option<(usize, usize)>,
    /// Classifier rows whose arg-max differs only between near-tied scores: the reference scores of the two
    /// picks are within one rounding step of the half type (its unit roundoff times the row's max magnitude),
    /// so the half storage cannot tell them apart (saturated `tanh` outputs are all 1.0 to a half, say).
    #[serde(default)]
    pub top1_near_ties: usize,
}

/// The result of [`check_precision`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PrecisionCheck {
    /// Seeded inputs compared.
    pub seeds: usize,
    /// Relative tolerance.
    pub tolerance: f64,
    /// Per output.
    pub outputs: Vec<PrecisionOutput>,
    /// The first node whose output holds inf/NaN in the half reference plan (first seed): (node, tensor).
    pub overflow: Option<(String, String)>,
    /// Every output within tolerance, none non-finite, no overflow.
    pub passed: bool,
}

/// Inputs as a plan's bindings store them: an f32 tensor for a half input (`--io-precision half`) converted
/// with the numeric rule's rounding, every other tensor as it is.
pub fn inputs_for(plan: &ExecutionPlan, inputs: &TensorMap) -> TensorMap {
    let mut out = inputs.clone();
    for b in plan.bindings().iter().filter(|b| b.role == BindingRole::Input) {
        if let Some(t) = out.get_mut(&*b.name) {
            if t.dtype == DType::F32 && matches!(b.dtype, DType::F16 | DType::BF16) && t.shape == b.shape {
                *t = HostTensor {
                    dtype: b.dtype,
                    shape: t.shape.clone(),
                    data: graph_plan::exec::f32_to_half_bytes(&t.data, b.dtype),
                };
            }
        }
    }
    out
}

/// Build the f32 reference plan, the plan of `opts` (a half precision) and the half reference plan of `graph`;
/// run them on `seeds` seeded inputs (the supplied `inputs` for the first; missing weights seeded once from
/// `seed`) and compare.
pub fn check_precision(
    graph: &ComputeGraph,
    opts: &PlanOptions,
    inputs: &TensorMap,
    weights: &TensorMap,
    seeds: usize,
    seed: u64,
    tolerance: f64,
) -> Result<PrecisionCheck, CheckError> {
    let build = |o: &PlanOptions, which: &'static str| {
        let p = ExecutionPlan::build_with(graph, o).map_err(|source| CheckError::Build { which, source })?;
        verify(&p).map_err(|violations| CheckError::Verify { which, violations })?;
        Ok::<_, CheckError>(p)
    };
    let reference = build(&PlanOptions::reference(), "reference")?;
    let half = build(opts, "optimised")?;
    let mut half_ref_opts = PlanOptions::reference();
    half_ref_opts.precision = opts.precision.clone();
    let half_ref = build(&half_ref_opts, "half reference")?;

    let mut weights = weights.clone();
    let mut first = inputs.clone();
    fill_tensors(&reference, &mut first, &mut weights, seed);
    let exec = SimExecutor::with_options(SimOptions::default());
    let run_err = |which: &'static str| move |source| CheckError::Run { which, source };
    let prep =
        |p: &ExecutionPlan, which: &'static str| exec.prepare_sim(p, &weights).map_err(|e| run_err(which)(e.into()));
    let (mut r, mut h, mut hr) =
        (prep(&reference, "reference")?, prep(&half, "optimised")?, prep(&half_ref, "half reference")?);
    let mut outputs: Vec<PrecisionOutput> = Vec::new();
    let mut overflow = None;
    for i in 0..seeds.max(1) {
        let mut ins = if i == 0 { first.clone() } else { TensorMap::new() };
        fill_tensors(&reference, &mut ins, &mut weights.clone(), seed.wrapping_add(i as u64));
        let want = r.run_sim(&ins).map_err(run_err("reference"))?;
        let got = h.run_sim(&inputs_for(&half, &ins)).map_err(run_err("optimised"))?;
        if i == 0 {
            hr.run_sim(&inputs_for(&half_ref, &ins)).map_err(run_err("half reference"))?;
            overflow = hr.first_non_finite();
        }
        for (name, w) in &want {
            let g = got.get(name).ok_or_else(|| CheckError::Outputs(format!("'{name}' missing from the half plan")))?;
            let c = compare(name, w, g, tolerance);
            let non_finite = g.to_f64().iter().filter(|x| !x.is_finite()).count();
            let (top1, near_ties) = classifier_top1(w, g, unit_roundoff(opts.precision.precision.dtype()));
            match outputs.iter_mut().find(|o| &o.name == name) {
                Some(o) => {
                    o.max_abs_err = o.max_abs_err.max(c.max_abs_err);
                    o.max_rel_err = o.max_rel_err.max(c.max_rel_err);
                    o.non_finite += non_finite;
                    o.top1_near_ties += near_ties;
                    o.top1 = match (o.top1, top1) {
                        (Some((a, n)), Some((b, m))) => Some((a + b, n + m)),
                        (x, y) => x.or(y),
                    };
                }
                None => outputs.push(PrecisionOutput {
                    name: name.clone(),
                    max_abs_err: c.max_abs_err,
                    max_rel_err: c.max_rel_err,
                    non_finite,
                    top1,
                    top1_near_ties: near_ties,
                }),
            }
        }
    }
    let passed = overflow.is_none() && outputs.iter().all(|o| o.non_finite == 0 && o.max_rel_err <= tolerance);
    Ok(PrecisionCheck { seeds: seeds.max(1), tolerance, outputs, overflow, passed })
}

/// The unit roundoff of a storage type: half the distance from 1.0 to the next value (0 for f32 and others).
fn unit_roundoff(d: DType) -> f64 {
    match d {
        DType::F16 => 2f64.powi(-11),
        DType::BF16 => 2f64.powi(-8),
        _ => 0.0,
    }
}

/// For a `[batch, classes]` float output with at least two classes: (rows whose arg-max agrees, rows), and the
/// disagreeing rows whose two picks have reference scores within `u` times the row's max magnitude (near ties).
fn classifier_top1(want: &HostTensor, got: &HostTensor, u: f64) -> (Option<(usize, usize)>, usize) {
    let d = want.shape.dims();
    if d.len() != 2 || d[1] < 2 || !want.dtype.is_float() {
        return (None, 0);
    }
    let (w, g) = (want.to_f64(), got.to_f64());
    let argmax = |v: &[f64]| {
        v.iter().enumerate().fold((0usize, f64::NEG_INFINITY), |b, (i, &x)| if x > b.1 { (i, x) } else { b }).0
    };
    let (rows, cols) = (d[0], d[1]);
    let (mut agree, mut near) = (0, 0);
    for r in 0..rows {
        let (wr, gr) = (&w[r * cols..(r + 1) * cols], &g[r * cols..(r + 1) * cols]);
        let (a, b) = (argmax(wr), argmax(gr));
        if a == b {
            agree += 1;
        } else {
            let scale = wr.iter().fold(0f64, |m, x| m.max(x.abs()));
            near += usize::from((wr[a] - wr[b]).abs() <= u * scale);
        }
    }
    (Some((agree, rows)), near)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top1_counts_agreement_and_near_ties_per_row() {
        // Row 0 agrees; row 1 picks class 2 where the reference has 1.0 vs 0.9999 (a near tie in f16, whose
        // unit roundoff is 2^-11 ~ 4.9e-4); row 2 picks class 0 where the reference has 0.5 vs 1.0 (not a tie).
        let want = HostTensor::from_f32([3, 3], &[0.1, 0.9, 0.2, 0.3, 1.0, 0.9999, 0.5, 1.0, 0.0]);
        let got = HostTensor::from_f32([3, 3], &[0.1, 0.9, 0.2, 0.3, 0.9995, 1.0, 1.0, 0.5, 0.0]);
        assert_eq!(classifier_top1(&want, &got, unit_roundoff(DType::F16)), (Some((1, 3)), 1));
        // In bf16 (2^-8) the same rows: still one near tie; with f32's zero roundoff, none.
        assert_eq!(classifier_top1(&want, &got, unit_roundoff(DType::BF16)), (Some((1, 3)), 1));
        assert_eq!(classifier_top1(&want, &got, unit_roundoff(DType::F32)), (Some((1, 3)), 0));
        // Not a classifier shape: no figure.
        let flat = HostTensor::from_f32([4], &[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(classifier_top1(&flat, &flat, 0.0), (None, 0));
    }
}
