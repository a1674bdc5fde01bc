#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The timing evaluator on hand-made task sets with exact makespans.

use graph_passes::device::DeviceProfile;
use graph_passes::timing::{self, LaunchMode, SimStep, Task, TaskId, TimingError};
use graph_passes::StreamId;
use proptest::prelude::*;

fn task(stream: u32, d: f64, occ: f64, deps: &[u32]) -> Task {
    Task { stream: StreamId(stream), duration_us: d, occupancy: occ, deps: deps.iter().map(|&x| TaskId(x)).collect() }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * (1.0 + a.abs().max(b.abs()))
}

#[test]
fn serial_stream_adds_durations_and_overheads() {
    let tasks = vec![task(0, 3.0, 0.5, &[]), task(0, 2.0, 1.0, &[]), task(0, 5.0, 0.1, &[])];
    let t = timing::simulate(&tasks, 1.0).unwrap();
    assert_eq!(t.start_us, vec![0.0, 4.0, 7.0]);
    assert_eq!(t.end_us, vec![4.0, 7.0, 13.0]);
    assert_eq!(t.makespan_us, 13.0);
    assert_eq!(t.bound.critical_path_us, 13.0);
    assert!(close(t.bound.area_us, 4.0 * 0.5 + 3.0 + 6.0 * 0.1));
    assert_eq!(t.bound.critical_path, vec![TaskId(0), TaskId(1), TaskId(2)]);
    assert_eq!(t.stream_busy_us, vec![(StreamId(0), 13.0)]);
}

#[test]
fn two_streams_under_capacity_overlap_fully() {
    // 0.5 + 0.5 = 1: no slowdown.
    let tasks = vec![task(0, 10.0, 0.5, &[]), task(1, 6.0, 0.5, &[])];
    let t = timing::simulate(&tasks, 0.0).unwrap();
    assert_eq!(t.end_us, vec![10.0, 6.0]);
    assert_eq!(t.makespan_us, 10.0);
    assert_eq!(t.bound.bound_us, 10.0);
}

#[test]
fn two_full_streams_share_the_device() {
    // Both occupy the whole device: each runs at half speed while both run.
    let tasks = vec![task(0, 10.0, 1.0, &[]), task(1, 4.0, 1.0, &[])];
    let t = timing::simulate(&tasks, 0.0).unwrap();
    // Task 1 needs 4 us of full speed: at half speed it ends at 8; by then task 0 has done 4 of 10, then runs
    // alone for the remaining 6.
    assert!(close(t.end_us[1], 8.0));
    assert!(close(t.end_us[0], 14.0));
    assert!(close(t.makespan_us, 14.0));
    assert!(close(t.bound.area_us, 14.0));
    assert!(close(t.ratio_to_bound(), 1.0));
}

#[test]
fn partial_oversubscription_slows_proportionally() {
    // 0.75 + 0.75 = 1.5: speed 2/3 while both run.
    let tasks = vec![task(0, 6.0, 0.75, &[]), task(1, 6.0, 0.75, &[])];
    let t = timing::simulate(&tasks, 0.0).unwrap();
    assert!(close(t.end_us[0], 9.0));
    assert!(close(t.end_us[1], 9.0));
    // The area bound is tight here: 2 x 6 x 0.75 = 9.
    assert!(close(t.bound.bound_us, 9.0));
}

#[test]
fn a_wait_delays_the_waiting_stream() {
    // s0: a(5) ; s1: b(2) then c(3) which waits on a.
    let tasks = vec![task(0, 5.0, 0.1, &[]), task(1, 2.0, 0.1, &[]), task(1, 3.0, 0.1, &[0])];
    let t = timing::simulate(&tasks, 0.0).unwrap();
    assert_eq!(t.start_us, vec![0.0, 0.0, 5.0]);
    assert_eq!(t.end_us, vec![5.0, 2.0, 8.0]);
    assert_eq!(t.makespan_us, 8.0);
    assert_eq!(t.bound.critical_path, vec![TaskId(0), TaskId(2)]);
    assert_eq!(t.stream_busy_us, vec![(StreamId(0), 5.0), (StreamId(1), 5.0)]);
}

#[test]
fn launch_mode_sets_the_overhead() {
    let d = DeviceProfile::h200();
    let tasks = vec![task(0, 1.0, 1.0, &[]), task(0, 1.0, 1.0, &[])];
    let g = timing::simulate_on(&tasks, &d, LaunchMode::Graph).unwrap();
    let e = timing::simulate_on(&tasks, &d, LaunchMode::Eager).unwrap();
    assert!(close(g.makespan_us, 2.0 + 2.0 * d.launch_overhead_graph_us));
    assert!(close(e.makespan_us, 2.0 + 2.0 * d.launch_overhead_eager_us));
}

#[test]
fn steps_become_tasks_with_event_dependencies() {
    let w = |s: u32, d: f64| SimStep::Work { stream: StreamId(s), duration_us: d, occupancy: 0.2 };
    let steps = vec![
        SimStep::Record { stream: StreamId(1), event: 9 }, // empty stream: complete at once
        w(0, 4.0),
        SimStep::Record { stream: StreamId(0), event: 0 },
        w(0, 1.0),
        SimStep::Wait { stream: StreamId(1), event: 9 },
        SimStep::Wait { stream: StreamId(1), event: 0 },
        w(1, 2.0),
    ];
    let (tasks, step_of) = timing::tasks_from_steps(&steps).unwrap();
    assert_eq!(step_of, vec![1, 3, 6]);
    assert_eq!(tasks[2].deps, vec![TaskId(0)]);
    let t = timing::simulate(&tasks, 0.0).unwrap();
    assert_eq!(t.end_us, vec![4.0, 5.0, 6.0]);
    let bad = vec![SimStep::Wait { stream: StreamId(0), event: 3 }];
    assert_eq!(timing::tasks_from_steps(&bad).unwrap_err(), TimingError::WaitBeforeRecord { step: 0, event: 3 });
}

#[test]
fn bad_tasks_are_named() {
    let e = timing::simulate(&[task(0, 1.0, 1.0, &[0])], 0.0).unwrap_err();
    assert_eq!(e, TimingError::DependencyNotEarlier { task: TaskId(0), dep: TaskId(0) });
    let e = timing::simulate(&[task(0, 1.0, 1.0, &[]), task(0, f64::NAN, 1.0, &[])], 0.0).unwrap_err();
    assert!(matches!(e, TimingError::BadDuration { task: TaskId(1), .. }));
    let e = timing::simulate(&[task(0, 1.0, 0.0, &[])], 0.0).unwrap_err();
    assert!(matches!(e, TimingError::BadOccupancy { task: TaskId(0), .. }));
    assert!(matches!(timing::simulate(&[], -1.0), Err(TimingError::BadOverhead(_))));
    assert_eq!(timing::simulate(&[], 0.0).unwrap().makespan_us, 0.0);
}

#[test]
fn gemms_between_two_launches_cost_their_area() {
    // A LayerNorm-like launch, three GEMMs of 0.75 occupancy that all read it, a join that reads all three,
    // and a small independent launch elsewhere (so the area alone is not the answer).
    let chain = vec![
        task(0, 2.0, 0.1, &[]),
        task(0, 4.0, 0.75, &[0]),
        task(1, 4.0, 0.75, &[0]),
        task(2, 4.0, 0.75, &[0]),
        task(0, 1.0, 0.5, &[1, 2, 3]),
    ];
    let mut tasks = chain.clone();
    tasks.push(task(3, 30.0, 0.01, &[]));
    let b = timing::dag_bound(&tasks, 0.0).unwrap();
    // Critical path 2 + 4 + 1 (and the lone launch's 30); area 0.2 + 9 + 0.5 + 0.3 = 10.
    assert!(close(b.critical_path_us, 30.0));
    assert!(close(b.area_us, 10.0));
    // Without the lone launch: the GEMMs run after the first launch ends and before the join starts:
    // 2 + 9 + 1 = 12.
    let c = timing::dag_bound(&chain, 0.0).unwrap();
    assert!(close(c.critical_path_us, 7.0));
    assert!(close(c.energy_us, 12.0));
    assert!(close(c.bound_us, 12.0));
    // Three streams, all GEMMs at once: they share the device (load 2.25) and end together at 2 + 9.
    let t = timing::simulate(&chain, 0.0).unwrap();
    assert!(close(t.makespan_us, 12.0));
    assert!(close(t.ratio_to_bound(), 1.0));
    // With overhead every launch is longer by it, area included.
    let o = timing::dag_bound(&chain, 1.0).unwrap();
    assert!(close(o.energy_us, 3.0 + 15.0 * 0.75 + 2.0));
}

#[test]
fn energetic_bound_follows_stream_order_in_simulate() {
    // Two launches on one stream, then a third on another stream that waits for the second: stream order
    // makes the first an ancestor of the third, so the second's area counts between them.
    let tasks = vec![task(0, 1.0, 1.0, &[]), task(0, 5.0, 0.5, &[]), task(1, 1.0, 1.0, &[1])];
    let t = timing::simulate(&tasks, 0.0).unwrap();
    assert!(close(t.bound.critical_path_us, 7.0));
    assert!(close(t.bound.energy_us, 7.0));
    assert!(close(t.makespan_us, 7.0));
    // Without stream order the three are a fork of two roots: the bound is the longer chain, 6.
    let d = timing::dag_bound(&tasks, 0.0).unwrap();
    assert!(close(d.bound_us, 6.0));
}

fn arb_tasks() -> impl Strategy<Value = Vec<Task>> {
    prop::collection::vec(
        (0u32..4, 0.0f64..20.0, 0.01f64..1.0, prop::collection::vec(any::<prop::sample::Index>(), 0..3)),
        1..40,
    )
    .prop_map(|raw| {
        raw.into_iter()
            .enumerate()
            .map(|(i, (s, d, o, deps))| {
                let mut deps: Vec<TaskId> =
                    if i == 0 { Vec::new() } else { deps.iter().map(|x| TaskId(x.index(i) as u32)).collect() };
                deps.sort_unstable();
                deps.dedup();
                Task { stream: StreamId(s), duration_us: d, occupancy: o, deps }
            })
            .collect()
    })
}

proptest! {
    /// The simulated schedule respects stream order and dependencies, never beats the bound, and never
    /// exceeds running everything one after another.
    #[test]
    fn schedule_is_feasible_and_bounded(tasks in arb_tasks(), overhead in 0.0f64..3.0) {
        let t = timing::simulate(&tasks, overhead).unwrap();
        let eps = 1e-6;
        let mut last: std::collections::HashMap<StreamId, usize> = Default::default();
        for (i, task) in tasks.iter().enumerate() {
            prop_assert!(t.end_us[i] + eps >= t.start_us[i] + task.duration_us + overhead);
            if let Some(&p) = last.get(&task.stream) {
                prop_assert!(t.start_us[i] + eps >= t.end_us[p]);
            }
            for d in &task.deps {
                prop_assert!(t.start_us[i] + eps >= t.end_us[d.index()]);
            }
            last.insert(task.stream, i);
        }
        prop_assert!(t.makespan_us + eps >= t.bound.bound_us);
        prop_assert!(t.bound.energy_us + eps >= t.bound.critical_path_us);
        prop_assert!(t.bound.bound_us + eps >= t.bound.area_us);
        // The dependency-only bound holds for this stream assignment and for one stream per task.
        let d = timing::dag_bound(&tasks, overhead).unwrap();
        prop_assert!(t.makespan_us + eps >= d.bound_us);
        let spread: Vec<Task> =
            tasks.iter().enumerate().map(|(i, x)| Task { stream: StreamId(i as u32), ..x.clone() }).collect();
        let u = timing::simulate(&spread, overhead).unwrap();
        prop_assert!(u.makespan_us + eps >= d.bound_us);
        prop_assert!(t.bound.bound_us + eps >= d.bound_us);
        let serial: f64 = tasks.iter().map(|x| x.duration_us + overhead).sum();
        prop_assert!(t.makespan_us <= serial + eps);
        let busy: f64 = t.stream_busy_us.iter().map(|x| x.1).sum();
        prop_assert!(busy + eps >= serial);
    }
}
