//! The shared conformance suite (`graph_plan::conformance`) on the simulator: every case, under the reference
//! plan and optimised plans (fusion, reuse, several streams), in submission order and under random schedules.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use exec_sim::{Schedule, SimExecutor, SimOptions};
use graph_plan::conformance::{cases, run_all, run_case};
use graph_plan::PlanOptions;

fn plan_variants() -> Vec<(&'static str, PlanOptions)> {
    vec![
        ("reference", PlanOptions::reference()),
        ("default", PlanOptions::default()),
        ("4 streams", PlanOptions::with_streams(4)),
    ]
}

#[test]
fn every_case_passes_on_every_plan_variant() {
    let cases = cases().unwrap();
    assert!(cases.len() >= 90, "suite has {} cases", cases.len());
    for schedule in [Schedule::Submission, Schedule::Random { seed: 0 }, Schedule::Random { seed: 1 }] {
        let exec = SimExecutor::with_options(SimOptions { schedule, ..Default::default() });
        for (label, opts) in plan_variants() {
            let failures = run_all(&exec, &cases, &opts, 0.0);
            assert!(
                failures.is_empty(),
                "{label} {schedule:?}: {}",
                failures.iter().map(|(n, e)| format!("\n  {n}: {e}")).collect::<String>()
            );
        }
    }
}

#[test]
fn case_names_are_unique_and_every_case_has_expected_outputs() {
    let cases = cases().unwrap();
    let mut names: Vec<&str> = cases.iter().map(|c| c.name.as_str()).collect();
    names.sort_unstable();
    let n = names.len();
    names.dedup();
    assert_eq!(names.len(), n);
    for c in &cases {
        assert!(!c.expected.is_empty(), "{}", c.name);
        assert_eq!(c.expected.len(), c.graph.outputs().len(), "{}", c.name);
    }
}

#[test]
fn a_wrong_expectation_is_reported_with_the_element() {
    let mut case = cases().unwrap().into_iter().find(|c| c.name == "add/broadcast_row").unwrap();
    let want = case.expected.get_mut("y").unwrap();
    want.data[4..8].copy_from_slice(&99f32.to_le_bytes());
    let err = run_case(&SimExecutor::new(), &case, &PlanOptions::default()).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("element 1") && text.contains("want 99"), "{text}");
}
