//! The timing evaluator: an event-driven simulation of launches on streams of one device (DESIGN.md section 5),
//! shared by the stream pass (to judge assignments), graph-plan's report and exec-sim's timing model.
//!
//! The input is a list of plain [`Task`]s in submission order. Each task runs on one stream, takes
//! `duration_us` plus the launch overhead when it has the device share it asks for, and occupies a fraction of
//! the device's SMs. A task starts when the task before it on its stream and every task it depends on (through
//! events) have finished.
//!
//! **Processor sharing.** While the occupancies of the running tasks sum to `S <= 1`, every running task
//! progresses at full speed; when `S > 1`, every running task progresses at speed `1 / S`. All running tasks
//! thus share one slowdown factor, so the simulation keeps a single *virtual clock* `V` (`dV/dt = min(1, 1/S)`):
//! a task that starts at virtual time `v` finishes when `V = v + time`. Finishing order is a heap on those
//! virtual deadlines; each start or finish is one event. O(T log T + D) for T tasks and D dependencies, with no
//! floating-point drift between tasks that run together.
//!
//! **The bound** ([`MakespanBound`]): `max(energetic path, area)`. The area is the sum of launch time x
//! occupancy: the device never delivers more than one device-second per second. The critical path is the
//! longest path of launch times (duration plus overhead): no task runs faster than alone. Those two terms are
//! DESIGN.md section 5's bound; alone they miss that launches which must run between two ordered launches
//! share one device (three GEMMs of 0.73 occupancy each between a LayerNorm and the attention that reads all
//! three take at least their summed area, not one GEMM's time). The **energetic path** adds that: a lower
//! bound `H(v)` on each task's start, the largest of `H(p) + time(p)` over its predecessors and of
//! `H(d) + time(d) + area(d..v)` over its ancestors `d` in a window, where `area(d..v)` sums the tasks that
//! descend from `d` and lead to `v` (they all run after `d` ends and before `v` starts); the bound is the
//! largest `H(v) + tail(v)`, `tail` being the longest path from `v`'s start to the end. It is at least the
//! critical path and never more than any schedule of the fluid relaxation (any sharing of the device in
//! which no task runs faster than alone), of which processor sharing is one, so no schedule does better.
//! The window is 64 tasks, narrowed so that its worst case, O(T w^2), stays under a fixed budget on large lists
//! (paths that leave the window are not followed: smaller sums, still a bound); an ancestor's sum is taken only
//! when a cheap upper bound on its term could raise the task's start, which makes it about O(T w) in practice. [`simulate`] reports the
//! bound of the given streams (its paths follow stream order and dependencies) and never returns less;
//! [`dag_bound`] follows the dependencies alone, the bound of any assignment to streams, which is what a
//! stream assignment is judged against.
//!
//! Launch overhead is modelled as DESIGN.md section 5 states it: part of each launch's time, shared like the
//! rest (inside a CUDA graph the front end dispatches launches of independent branches concurrently). Eager
//! submission's host-side serialisation is not modelled.

use serde::{Deserialize, Serialize};
use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};
use thiserror::Error;

use crate::device::DeviceProfile;
use crate::ids::StreamId;

graph_ir::dense_id!(
    /// A task of the simulation: its index in the submission-ordered task list.
    TaskId,
    "t"
);

/// How launches are submitted, which sets their overhead.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LaunchMode {
    /// One API call per launch (`DeviceProfile::launch_overhead_eager_us`).
    Eager,
    /// Replay of a captured CUDA graph (`DeviceProfile::launch_overhead_graph_us`).
    #[default]
    Graph,
}

impl LaunchMode {
    /// The per-launch overhead of this mode on `device`, in microseconds.
    pub fn overhead_us(self, device: &DeviceProfile) -> f64 {
        match self {
            LaunchMode::Eager => device.launch_overhead_eager_us,
            LaunchMode::Graph => device.launch_overhead_graph_us,
        }
    }
}

/// One unit of work: a kernel launch or a copy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Task {
    /// The stream it is submitted to; tasks of one stream run in list order.
    pub stream: StreamId,
    /// Time on the device with its full occupancy available, without launch overhead (microseconds, >= 0).
    pub duration_us: f64,
    /// Fraction of the device it occupies, in `(0, 1]`.
    pub occupancy: f64,
    /// Earlier tasks (usually on other streams, through events) that must finish before it starts.
    pub deps: Vec<TaskId>,
}

/// What is wrong with a task list. Every variant names the task or step at fault.
#[derive(Clone, Debug, PartialEq, Error, Serialize, Deserialize)]
pub enum TimingError {
    /// A dependency does not point to an earlier task.
    #[error("task {task} depends on {dep}, which is not an earlier task")]
    DependencyNotEarlier {
        /// The task.
        task: TaskId,
        /// The dependency.
        dep: TaskId,
    },
    /// A duration is negative or not finite.
    #[error("task {task} has duration {value} us (must be finite and >= 0)")]
    BadDuration {
        /// The task.
        task: TaskId,
        /// The value given.
        value: f64,
    },
    /// An occupancy is outside `(0, 1]`.
    #[error("task {task} has occupancy {value} (must lie in (0, 1])")]
    BadOccupancy {
        /// The task.
        task: TaskId,
        /// The value given.
        value: f64,
    },
    /// The launch overhead is negative or not finite.
    #[error("launch overhead {0} us (must be finite and >= 0)")]
    BadOverhead(f64),
    /// A step waits on an event no earlier step recorded.
    #[error("step {step} waits on event {event}, which no earlier step recorded")]
    WaitBeforeRecord {
        /// Index of the wait in the step list.
        step: usize,
        /// The event.
        event: u32,
    },
}

/// The lower bound on the makespan of a task list (DESIGN.md section 5).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MakespanBound {
    /// Longest path of launch times over stream order and dependencies.
    pub critical_path_us: f64,
    /// Sum over tasks of launch time x occupancy.
    pub area_us: f64,
    /// The energetic path bound (module docs): the critical path, lengthened where the tasks between two
    /// ordered tasks need more device time than the longest path between them; `>= critical_path_us`.
    #[serde(default)]
    pub energy_us: f64,
    /// `max(energy_us, area_us)` (which is at least `max(critical_path_us, area_us)`).
    pub bound_us: f64,
    /// The tasks of one longest path, first to last.
    pub critical_path: Vec<TaskId>,
}

/// The simulated schedule of a task list.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Timeline {
    /// Start time of each task, indexed by `TaskId`.
    pub start_us: Vec<f64>,
    /// End time of each task, indexed by `TaskId`.
    pub end_us: Vec<f64>,
    /// Time at which the last task ends (0 for no tasks).
    pub makespan_us: f64,
    /// The lower bound the makespan is judged against.
    pub bound: MakespanBound,
    /// Wall time each stream has a task running, by stream, in stream order.
    pub stream_busy_us: Vec<(StreamId, f64)>,
    /// The launch overhead the simulation used.
    pub overhead_us: f64,
    /// Makespan of the same tasks one after another on one stream: the sum of launch times.
    pub serial_us: f64,
}

impl Timeline {
    /// `makespan / bound` (1 when both are 0).
    pub fn ratio_to_bound(&self) -> f64 {
        if self.bound.bound_us > 0.0 {
            self.makespan_us / self.bound.bound_us
        } else {
            1.0
        }
    }
}

/// A plan step as the evaluator sees it, for [`tasks_from_steps`].
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum SimStep {
    /// A launch or copy.
    Work {
        /// The stream.
        stream: StreamId,
        /// Time without overhead, microseconds.
        duration_us: f64,
        /// Fraction of the device.
        occupancy: f64,
    },
    /// Record `event` on `stream`: it completes when everything submitted to `stream` so far has.
    Record {
        /// The stream.
        stream: StreamId,
        /// The event.
        event: u32,
    },
    /// Make `stream`'s later work wait for the latest earlier record of `event`.
    Wait {
        /// The stream.
        stream: StreamId,
        /// The event.
        event: u32,
    },
}

/// Turn plan-like steps (submission order) into tasks: one per `Work` step, in order; a `Wait` makes the next
/// work on its stream depend on the last work submitted to the recording stream before the matching `Record`
/// (CUDA semantics: the latest record before the wait; a record on a stream with no work yet is complete at
/// once). Returns the tasks and, for each task, the index of its step.
pub fn tasks_from_steps(steps: &[SimStep]) -> Result<(Vec<Task>, Vec<usize>), TimingError> {
    let mut tasks: Vec<Task> = Vec::new();
    let mut step_of = Vec::new();
    // Stream and event ids (largest of each), which size the tables below.
    let (mut streams, mut events) = (0usize, 0usize);
    for step in steps {
        match *step {
            SimStep::Work { stream, .. } => streams = streams.max(stream.index() + 1),
            SimStep::Record { stream, event } | SimStep::Wait { stream, event } => {
                streams = streams.max(stream.index() + 1);
                events = events.max(event as usize + 1);
            }
        }
    }
    // Last task submitted to each stream, and the task each event captured (None: nothing to wait for).
    let mut last_on: IdTable<TaskId> = IdTable::new(streams, steps.len());
    let mut recorded: IdTable<Option<TaskId>> = IdTable::new(events, steps.len());
    let mut pending: IdTable<Vec<TaskId>> = IdTable::new(streams, steps.len());
    for (i, step) in steps.iter().enumerate() {
        match *step {
            SimStep::Work { stream, duration_us, occupancy } => {
                let mut deps = pending.take(stream.index()).unwrap_or_default();
                deps.sort_unstable();
                deps.dedup();
                let id = TaskId::from_index(tasks.len());
                tasks.push(Task { stream, duration_us, occupancy, deps });
                step_of.push(i);
                last_on.insert(stream.index(), id);
            }
            SimStep::Record { stream, event } => {
                recorded.insert(event as usize, last_on.get(stream.index()).copied());
            }
            SimStep::Wait { stream, event } => match recorded.get(event as usize) {
                None => return Err(TimingError::WaitBeforeRecord { step: i, event }),
                Some(None) => {}
                Some(Some(t)) => {
                    let t = *t;
                    pending.get_or_default(stream.index()).push(t);
                }
            },
        }
    }
    Ok((tasks, step_of))
}

/// A map from stream or event ids to values: a vector indexed by the id while the ids stay within a few times
/// the steps (a plan's are dense from 0), a hash map otherwise (a hand-written or hostile step list may use any
/// `u32`), so that the table never takes more than linear memory.
enum IdTable<V> {
    Dense(Vec<Option<V>>),
    Sparse(HashMap<usize, V>),
}

impl<V> IdTable<V> {
    /// A table for ids below `ids`, given `steps` steps.
    fn new(ids: usize, steps: usize) -> IdTable<V> {
        if ids <= steps.saturating_mul(4).saturating_add(1024) {
            IdTable::Dense(Vec::with_capacity(ids))
        } else {
            IdTable::Sparse(HashMap::new())
        }
    }

    fn get(&self, id: usize) -> Option<&V> {
        match self {
            IdTable::Dense(v) => v.get(id).and_then(Option::as_ref),
            IdTable::Sparse(m) => m.get(&id),
        }
    }

    fn insert(&mut self, id: usize, value: V) {
        match self {
            IdTable::Dense(v) => *Self::slot(v, id) = Some(value),
            IdTable::Sparse(m) => {
                m.insert(id, value);
            }
        }
    }

    /// The dense table's slot of `id`, grown to it (ids are below the bound `new` checked).
    fn slot(v: &mut Vec<Option<V>>, id: usize) -> &mut Option<V> {
        if id >= v.len() {
            v.resize_with(id + 1, || None);
        }
        &mut v[id]
    }

    fn take(&mut self, id: usize) -> Option<V> {
        match self {
            IdTable::Dense(v) => v.get_mut(id).and_then(Option::take),
            IdTable::Sparse(m) => m.remove(&id),
        }
    }

    fn get_or_default(&mut self, id: usize) -> &mut V
    where
        V: Default,
    {
        match self {
            IdTable::Dense(v) => Self::slot(v, id).get_or_insert_with(V::default),
            IdTable::Sparse(m) => m.entry(id).or_default(),
        }
    }
}

/// Dense stream indices (in `StreamId` order) and each task's.
fn compact_streams(tasks: &[Task]) -> (Vec<StreamId>, Vec<usize>) {
    let mut streams: Vec<StreamId> = tasks.iter().map(|t| t.stream).collect();
    streams.sort_unstable();
    streams.dedup();
    let of = tasks.iter().map(|t| streams.binary_search(&t.stream).unwrap_or(0)).collect();
    (streams, of)
}

fn validate(tasks: &[Task], overhead_us: f64) -> Result<(), TimingError> {
    if !overhead_us.is_finite() || overhead_us < 0.0 {
        return Err(TimingError::BadOverhead(overhead_us));
    }
    for (i, t) in tasks.iter().enumerate() {
        let task = TaskId::from_index(i);
        if !t.duration_us.is_finite() || t.duration_us < 0.0 {
            return Err(TimingError::BadDuration { task, value: t.duration_us });
        }
        if !(t.occupancy > 0.0 && t.occupancy <= 1.0) {
            return Err(TimingError::BadOccupancy { task, value: t.occupancy });
        }
        if let Some(&dep) = t.deps.iter().find(|d| d.index() >= i) {
            return Err(TimingError::DependencyNotEarlier { task, dep });
        }
    }
    Ok(())
}

/// The makespan bound of `tasks` with `overhead_us` per launch, without simulating: the critical path follows
/// stream order and dependencies, so it bounds this assignment to streams.
pub fn bound(tasks: &[Task], overhead_us: f64) -> Result<MakespanBound, TimingError> {
    validate(tasks, overhead_us)?;
    Ok(bound_unchecked(tasks, overhead_us, true))
}

/// The makespan bound of `tasks` on any assignment to streams: the critical path follows the dependencies
/// alone (pass the full dependency DAG, e.g. data and reuse edges, as `deps`; `stream` is ignored).
pub fn dag_bound(tasks: &[Task], overhead_us: f64) -> Result<MakespanBound, TimingError> {
    validate(tasks, overhead_us)?;
    Ok(bound_unchecked(tasks, overhead_us, false))
}

/// As [`dag_bound`] without the energetic path (its windowed part): `energy_us` is the critical path and
/// `bound_us` is `max(critical_path_us, area_us)`. For callers that need only DESIGN.md section 5's two terms.
pub fn dag_critical_path(tasks: &[Task], overhead_us: f64) -> Result<MakespanBound, TimingError> {
    validate(tasks, overhead_us)?;
    Ok(bound_core(tasks, overhead_us, false, false))
}

fn bound_unchecked(tasks: &[Task], overhead_us: f64, stream_order: bool) -> MakespanBound {
    bound_core(tasks, overhead_us, stream_order, true)
}

/// The critical path and area of `tasks` (stream order counted when `stream_order`), and with `energy` the
/// energetic path bound too.
fn bound_core(tasks: &[Task], overhead_us: f64, stream_order: bool, energy: bool) -> MakespanBound {
    let (streams, stream_of) = compact_streams(tasks);
    let mut last_on: Vec<Option<usize>> = vec![None; streams.len()];
    // Each task's predecessors (compressed rows): its dependencies and, when stream order counts, the task before
    // it on its stream.
    let mut pred_start: Vec<usize> = Vec::with_capacity(tasks.len() + 1);
    let mut preds: Vec<u32> = Vec::with_capacity(tasks.iter().map(|t| t.deps.len() + 1).sum());
    pred_start.push(0);
    // finish[i]: longest path ending with task i; via[i]: its predecessor on that path.
    let mut finish = vec![0f64; tasks.len()];
    let mut via: Vec<Option<usize>> = vec![None; tasks.len()];
    let mut area = 0f64;
    let mut best: Option<usize> = None;
    for (i, t) in tasks.iter().enumerate() {
        let time = t.duration_us + overhead_us;
        area += time * t.occupancy;
        let s = stream_of[i];
        preds.extend(t.deps.iter().map(|d| d.0));
        if stream_order {
            preds.extend(last_on[s].map(|p| p as u32));
        }
        let mut from: Option<usize> = None;
        for &d in &preds[pred_start[i]..] {
            let d = d as usize;
            if from.is_none_or(|f| finish[d] > finish[f]) {
                from = Some(d);
            }
        }
        pred_start.push(preds.len());
        finish[i] = from.map_or(0.0, |f| finish[f]) + time;
        via[i] = from;
        last_on[s] = Some(i);
        if best.is_none_or(|b| finish[i] > finish[b]) {
            best = Some(i);
        }
    }
    let mut path = Vec::new();
    let mut cur = best;
    while let Some(i) = cur {
        path.push(TaskId::from_index(i));
        cur = via[i];
    }
    path.reverse();
    let cp = best.map_or(0.0, |b| finish[b]);
    let energy = if energy { energy_bound(tasks, overhead_us, &pred_start, &preds).max(cp) } else { cp };
    MakespanBound {
        critical_path_us: cp,
        area_us: area,
        energy_us: energy,
        bound_us: energy.max(area),
        critical_path: path,
    }
}

/// Most `tasks x window^2` steps [`energy_bound`] spends; the window shrinks on large task lists to stay within.
const ENERGY_BUDGET: usize = 1 << 24;

/// The energetic path bound (module docs): the longest `H(v) + tail(v)`, where `tail(v)` is the longest path
/// from `v`'s start to the end and `H(v)` a lower bound on `v`'s start: the longest of `H(p) + time(p)` over
/// its predecessors `p` and of `H(d) + time(d) + area(between)` over its ancestors `d` in a window of the
/// `w` tasks before it, `between` being the tasks that descend from `d` and lead to `v` (all of them run
/// after `d` ends and before `v` starts, and the device does at most one unit of area per unit of time).
/// Ancestry is known through the window only (paths that leave it are not followed), which can only lower the
/// sums, so the bound stays valid. `preds[pred_start[v]..pred_start[v + 1]]` are `v`'s predecessors. The
/// window is `w <= 64` tasks with `T w^2 <= ENERGY_BUDGET`.
///
/// **Pruned.** Each ancestor's term is first bounded by the area of every window ancestor of `v` nearer than it
/// (a superset of `between`); only an ancestor whose bound beats the `H(v)` found so far has its sum taken. The
/// bound is exact arithmetic's upper bound in floating point too (the same non-negative areas in the same order,
/// a subset of them never summing to more), so `H(v)` is bit for bit the full computation's. On the bench
/// families about one ancestor in fifty survives, so the cost is O(T w) where the full sums were O(T w^2).
fn energy_bound(tasks: &[Task], overhead_us: f64, pred_start: &[usize], preds: &[u32]) -> f64 {
    energy_bound_with(tasks, overhead_us, pred_start, preds, pruned_start)
}

/// What the energetic bound knows when it lowers task `v`'s start: launch times, areas, the window ancestors of
/// every task (`anc[u]` bit `j`: task `u - 1 - j` is an ancestor of `u` through paths inside the window) and the
/// start bounds `head` of the tasks before `v`.
struct Window<'a> {
    time: &'a [f64],
    area: &'a [f64],
    anc: &'a [u64],
    head: &'a [f64],
}

/// The energetic bound's sweep: the tails, the window ancestors and each task's start bound, with `start(win, v,
/// h)` raising `h` (the bound from `v`'s predecessors) by the terms of `v`'s window ancestors.
fn energy_bound_with(
    tasks: &[Task],
    overhead_us: f64,
    pred_start: &[usize],
    preds: &[u32],
    mut start: impl FnMut(&Window<'_>, usize, f64) -> f64,
) -> f64 {
    let n = tasks.len();
    let time: Vec<f64> = tasks.iter().map(|t| t.duration_us + overhead_us).collect();
    let mut tail = time.clone();
    let row = |v: usize| &preds[pred_start[v]..pred_start[v + 1]];
    for v in (0..n).rev() {
        for &p in row(v) {
            let p = p as usize;
            tail[p] = tail[p].max(time[p] + tail[v]);
        }
    }
    let w = energy_window(n);
    let area: Vec<f64> = tasks.iter().zip(&time).map(|(t, &d)| d * t.occupancy).collect();
    let mut anc = vec![0u64; n];
    let mut head = vec![0f64; n];
    let mut best = 0f64;
    for v in 0..n {
        let mut h = 0f64;
        let mut bits = 0u64;
        for &p in row(v) {
            let p = p as usize;
            h = h.max(head[p] + time[p]);
            let dist = v - p;
            if dist <= w {
                bits |= 1u64 << (dist - 1);
                if dist < 64 {
                    bits |= anc[p] << dist;
                }
            }
        }
        anc[v] = bits & window_mask(w);
        let h = start(&Window { time: &time, area: &area, anc: &anc, head: &head }, v, h);
        head[v] = h;
        best = best.max(h + tail[v]);
    }
    best
}

/// [`energy_bound`]'s start bound of task `v` from `h`, pruned (see there).
fn pruned_start(win: &Window<'_>, v: usize, mut h: f64) -> f64 {
    let Window { time, area, anc, head } = *win;
    let bits = anc[v];
    // ub[j]: the term of ancestor d = v - 1 - j with every nearer window ancestor's area, summed nearest first.
    let mut ub = [0f64; 64];
    let mut nearer = 0f64;
    let mut ds = bits;
    while ds != 0 {
        let j = ds.trailing_zeros() as usize;
        ds &= ds - 1;
        let d = v - 1 - j;
        ub[j] = head[d] + time[d] + nearer;
        nearer += area[d];
    }
    let mut ds = bits;
    while ds != 0 {
        let j = ds.trailing_zeros() as usize;
        ds &= ds - 1;
        if ub[j] <= h {
            continue;
        }
        // The areas of the window ancestors of v that descend from d (x = v - 1 - i descends from d when bit
        // j - i - 1 of anc[x] is set), nearest first.
        let d = v - 1 - j;
        let mut between = 0f64;
        let mut xs = bits & ((1u64 << j) - 1);
        while xs != 0 {
            let i = xs.trailing_zeros() as usize;
            xs &= xs - 1;
            let x = v - 1 - i;
            if (anc[x] >> (j - i - 1)) & 1 == 1 {
                between += area[x];
            }
        }
        h = h.max(head[d] + time[d] + between);
    }
    h
}

/// The window of [`energy_bound`] over `n` tasks: at most 64, and `n w^2 <= ENERGY_BUDGET`.
fn energy_window(n: usize) -> usize {
    (((ENERGY_BUDGET / n.max(1)) as f64).sqrt() as usize).min(64)
}

/// The bits of a window of `w` tasks.
fn window_mask(w: usize) -> u64 {
    match w {
        0 => 0,
        64.. => u64::MAX,
        w => (1u64 << w) - 1,
    }
}

/// A running task in the heap: ordered by virtual deadline, earliest first, then by id (also the stream
/// pass's list scheduler's heap entry, with a group index as the id).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Running {
    /// Virtual time at which it completes.
    pub(crate) deadline: f64,
    /// The task (or group) index.
    pub(crate) task: usize,
}

impl PartialEq for Running {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Running {}
impl PartialOrd for Running {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Running {
    fn cmp(&self, o: &Self) -> Ordering {
        // Reversed: BinaryHeap is a max-heap and we want the earliest deadline on top.
        o.deadline.total_cmp(&self.deadline).then(o.task.cmp(&self.task))
    }
}

/// Simulate `tasks` (in submission order) with `overhead_us` added to every launch.
pub fn simulate(tasks: &[Task], overhead_us: f64) -> Result<Timeline, TimingError> {
    simulate_with(tasks, overhead_us, true)
}

/// The simulated makespan of `tasks` alone, without computing the bound: for callers that compare many
/// candidate schedules (the stream pass). Same value as `simulate(..).makespan_us`.
pub fn simulate_makespan(tasks: &[Task], overhead_us: f64) -> Result<f64, TimingError> {
    Simulator::default().makespan(tasks, overhead_us)
}

/// The event-driven simulation with its working memory kept between runs: a caller that simulates many
/// candidate schedules of one size (the stream pass's local search) allocates once. Same values as
/// [`simulate`].
#[derive(Debug, Default)]
pub struct Simulator {
    stream_ids: Vec<StreamId>,
    stream_of: Vec<usize>,
    queue_start: Vec<usize>,
    queue: Vec<usize>,
    cursor: Vec<usize>,
    waiting: Vec<u32>,
    out_start: Vec<usize>,
    fill: Vec<usize>,
    dependents: Vec<usize>,
    start: Vec<f64>,
    end: Vec<f64>,
    busy_on: Vec<bool>,
    heap: BinaryHeap<Running>,
    finished: Vec<usize>,
}

impl Simulator {
    /// The simulated makespan of `tasks` (in submission order) with `overhead_us` added to every launch.
    pub fn makespan(&mut self, tasks: &[Task], overhead_us: f64) -> Result<f64, TimingError> {
        self.run(tasks, overhead_us)?;
        Ok(self.end.iter().copied().fold(0f64, f64::max))
    }

    /// Dense stream indices in `StreamId` order (as [`compact_streams`]) into `stream_ids` and `stream_of`.
    fn compact_streams(&mut self, tasks: &[Task]) {
        self.stream_ids.clear();
        self.stream_ids.extend(tasks.iter().map(|t| t.stream));
        self.stream_ids.sort_unstable();
        self.stream_ids.dedup();
        let ids = &self.stream_ids;
        self.stream_of.clear();
        self.stream_of.extend(tasks.iter().map(|t| ids.binary_search(&t.stream).unwrap_or(0)));
    }

    /// The simulation (processor sharing by occupancy); fills `start`, `end` and `stream_of`. One piece on
    /// purpose: the event loop's state (running set, ready queues, stream heads, rates) changes at every event
    /// and each update reads all of it.
    fn run(&mut self, tasks: &[Task], overhead_us: f64) -> Result<(), TimingError> {
        validate(tasks, overhead_us)?;
        let n = tasks.len();
        self.compact_streams(tasks);
        let ns = self.stream_ids.len();
        let Simulator {
            stream_of,
            queue_start,
            queue,
            cursor,
            waiting,
            out_start,
            fill,
            dependents,
            start,
            end,
            busy_on,
            heap,
            finished,
            ..
        } = self;
        let stream_of: &[usize] = stream_of;
        // Each stream's tasks in order (compressed rows), and a cursor to its next unstarted task.
        queue_start.clear();
        queue_start.resize(ns + 1, 0);
        for &s in stream_of {
            queue_start[s + 1] += 1;
        }
        for s in 0..ns {
            queue_start[s + 1] += queue_start[s];
        }
        cursor.clear();
        cursor.extend_from_slice(&queue_start[..ns]);
        queue.clear();
        queue.resize(n, 0);
        for (i, &s) in stream_of.iter().enumerate() {
            queue[cursor[s]] = i;
            cursor[s] += 1;
        }
        cursor.clear();
        cursor.extend_from_slice(&queue_start[..ns]);
        // Unfinished dependencies per task, and dependents of each task (CSR).
        waiting.clear();
        waiting.resize(n, 0);
        out_start.clear();
        out_start.resize(n + 1, 0);
        for t in tasks {
            for d in &t.deps {
                out_start[d.index() + 1] += 1;
            }
        }
        for i in 0..n {
            out_start[i + 1] += out_start[i];
        }
        fill.clear();
        fill.extend_from_slice(out_start);
        dependents.clear();
        dependents.resize(out_start[n], 0);
        for (i, t) in tasks.iter().enumerate() {
            waiting[i] = t.deps.len() as u32;
            for d in &t.deps {
                dependents[fill[d.index()]] = i;
                fill[d.index()] += 1;
            }
        }
        start.clear();
        start.resize(n, f64::NAN);
        end.clear();
        end.resize(n, f64::NAN);
        busy_on.clear();
        busy_on.resize(ns, false);
        heap.clear();
        let (mut now, mut virt, mut load) = (0f64, 0f64, 0f64);
        let mut running = 0usize;
        let queue: &[usize] = queue;

        // Start the next task of stream `s` if nothing runs there and its dependencies are done.
        let try_start = |s: usize,
                         now: f64,
                         virt: f64,
                         cursor: &[usize],
                         busy_on: &mut [bool],
                         waiting: &[u32],
                         start: &mut [f64],
                         heap: &mut BinaryHeap<Running>,
                         load: &mut f64,
                         running: &mut usize| {
            if busy_on[s] || cursor[s] >= queue_start[s + 1] {
                return;
            }
            let i = queue[cursor[s]];
            if waiting[i] > 0 {
                return;
            }
            busy_on[s] = true;
            start[i] = now;
            *load += tasks[i].occupancy;
            *running += 1;
            heap.push(Running { deadline: virt + tasks[i].duration_us + overhead_us, task: i });
        };

        for s in 0..ns {
            try_start(s, now, virt, cursor, busy_on, waiting, start, heap, &mut load, &mut running);
        }
        finished.clear();
        while let Some(&first) = heap.peek() {
            let speed = if load > 1.0 { 1.0 / load } else { 1.0 };
            now += (first.deadline - virt).max(0.0) / speed;
            virt = virt.max(first.deadline);
            finished.clear();
            while heap.peek().is_some_and(|r| r.deadline <= virt) {
                if let Some(r) = heap.pop() {
                    finished.push(r.task);
                }
            }
            for &i in finished.iter() {
                end[i] = now;
                let s = stream_of[i];
                busy_on[s] = false;
                cursor[s] += 1;
                load -= tasks[i].occupancy;
                running -= 1;
                for &j in &dependents[out_start[i]..out_start[i + 1]] {
                    waiting[j] -= 1;
                }
            }
            if running == 0 {
                // Exact zero, so rounding never leaves a phantom load behind.
                load = 0.0;
            }
            // Finishing may unblock the finished tasks' streams and their dependents' streams.
            for &i in finished.iter() {
                let s = stream_of[i];
                try_start(s, now, virt, cursor, busy_on, waiting, start, heap, &mut load, &mut running);
                for &j in &dependents[out_start[i]..out_start[i + 1]] {
                    let sj = stream_of[j];
                    try_start(sj, now, virt, cursor, busy_on, waiting, start, heap, &mut load, &mut running);
                }
            }
        }
        // Dependencies point to earlier tasks, so the earliest unfinished task can always start: nothing is left.
        Ok(())
    }
}

/// The simulation as a [`Timeline`], optionally with the bound.
fn simulate_with(tasks: &[Task], overhead_us: f64, with_bound: bool) -> Result<Timeline, TimingError> {
    let mut sim = Simulator::default();
    sim.run(tasks, overhead_us)?;
    let ns = sim.stream_ids.len();
    let mut busy = vec![0f64; ns];
    for i in 0..tasks.len() {
        busy[sim.stream_of[i]] += sim.end[i] - sim.start[i];
    }
    let makespan = sim.end.iter().copied().fold(0f64, f64::max);
    let Simulator { stream_ids, start, end, .. } = sim;
    Ok(Timeline {
        start_us: start,
        end_us: end,
        makespan_us: makespan,
        bound: if with_bound { bound_unchecked(tasks, overhead_us, true) } else { MakespanBound::default() },
        stream_busy_us: stream_ids.into_iter().zip(busy).collect(),
        overhead_us,
        serial_us: tasks.iter().map(|t| t.duration_us + overhead_us).sum(),
    })
}

/// Simulate `tasks` on `device` with the overhead of `mode`.
pub fn simulate_on(tasks: &[Task], device: &DeviceProfile, mode: LaunchMode) -> Result<Timeline, TimingError> {
    simulate(tasks, mode.overhead_us(device))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random step lists (records, waits, work on a few streams, waits on events not yet recorded): the tasks
    /// (or the error) are the same with the ids spread far apart (the hash-map tables) as with small ids (the
    /// dense tables).
    #[test]
    fn steps_read_the_same_with_far_ids_as_with_near_ones() {
        let mut rng = crate::test_rng::XorShift::new(0x7A5C_0F57_3E95_0001);
        let far_stream = |s: u32| StreamId(s.wrapping_mul(0x3FFF_FFF1) | 1 << 20);
        let far_event = |e: u32| e.wrapping_mul(0x9E37_79B1) | 1 << 30;
        let mut errors = 0;
        for _ in 0..300 {
            let n = 1 + rng.below(40) as usize;
            let near: Vec<SimStep> = (0..n)
                .map(|_| {
                    let stream = StreamId(rng.below(4) as u32);
                    let event = rng.below(6) as u32;
                    match rng.below(3) {
                        0 => SimStep::Work { stream, duration_us: rng.below(9) as f64, occupancy: 0.5 },
                        1 => SimStep::Record { stream, event },
                        _ => SimStep::Wait { stream, event },
                    }
                })
                .collect();
            let far: Vec<SimStep> = near
                .iter()
                .map(|s| match *s {
                    SimStep::Work { stream, duration_us, occupancy } => {
                        SimStep::Work { stream: far_stream(stream.0), duration_us, occupancy }
                    }
                    SimStep::Record { stream, event } => {
                        SimStep::Record { stream: far_stream(stream.0), event: far_event(event) }
                    }
                    SimStep::Wait { stream, event } => {
                        SimStep::Wait { stream: far_stream(stream.0), event: far_event(event) }
                    }
                })
                .collect();
            let strip = |r: Result<(Vec<Task>, Vec<usize>), TimingError>| {
                r.map(|(tasks, at)| (tasks.into_iter().map(|t| (t.duration_us, t.deps)).collect::<Vec<_>>(), at))
                    .map_err(|e| match e {
                        TimingError::WaitBeforeRecord { step, .. } => step,
                        other => panic!("unexpected error {other:?}"),
                    })
            };
            let (a, b) = (strip(tasks_from_steps(&near)), strip(tasks_from_steps(&far)));
            errors += usize::from(a.is_err());
            assert_eq!(a, b, "{near:?}");
        }
        assert!(errors > 0 && errors < 300, "{errors} of 300 step lists waited before a record");
    }

    fn task(stream: u32, d: f64, occ: f64, deps: &[u32]) -> Task {
        Task {
            stream: StreamId(stream),
            duration_us: d,
            occupancy: occ,
            deps: deps.iter().map(|&x| TaskId(x)).collect(),
        }
    }

    /// The energetic bound without pruning: every window ancestor's sum is taken (the reference for
    /// [`energy_bound`], on the same sweep; the algorithm before the pruning, bit loops only).
    fn energy_bound_full(tasks: &[Task], overhead_us: f64, pred_start: &[usize], preds: &[u32]) -> f64 {
        let mut acc = [0f64; 64];
        energy_bound_with(tasks, overhead_us, pred_start, preds, |win, v, mut h| {
            let bits = win.anc[v];
            for i in (0..64).filter(|&i| bits >> i & 1 == 1) {
                let x = v - 1 - i;
                let ds = if i + 1 < 64 { (win.anc[x] << (i + 1)) & bits } else { 0 };
                for j in (0..64).filter(|&j| ds >> j & 1 == 1) {
                    acc[j] += win.area[x];
                }
            }
            for j in (0..64).filter(|&j| bits >> j & 1 == 1) {
                let d = v - 1 - j;
                h = h.max(win.head[d] + win.time[d] + acc[j]);
                acc[j] = 0.0;
            }
            h
        })
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 48, ..Default::default() })]

        /// The pruned energetic bound is bit for bit the full computation's, on random DAGs dense and sparse:
        /// edges near and far (past the window), zero and tiny durations and occupancies, and lists long enough
        /// (past 4,096 tasks) that the window narrows below 64.
        #[test]
        fn pruned_energy_bound_is_the_full_one_bitwise(
            n in proptest::prop_oneof![1usize..300, 4_000usize..6_000],
            fan in 1u64..7,
            reach in 2u64..200,
            seed in proptest::prelude::any::<u64>(),
        ) {
            let mut rng = crate::test_rng::XorShift::new(seed | 1);
            let tasks: Vec<Task> = (0..n)
                .map(|i| {
                    let deps: Vec<u32> =
                        (0..fan).filter(|_| i > 0).map(|_| (i as u64 - 1 - rng.below((i as u64).min(reach))) as u32).collect();
                    let d = match rng.below(8) {
                        0 => 0.0,
                        1 => 1e-9,
                        _ => rng.below(1000) as f64 / 7.0,
                    };
                    let occ = rng.below(101) as f64 / 100.0;
                    task(rng.below(3) as u32, d, occ, &deps)
                })
                .collect();
            let mut pred_start = vec![0];
            let mut preds = Vec::new();
            for t in &tasks {
                preds.extend(t.deps.iter().map(|d| d.0));
                pred_start.push(preds.len());
            }
            for overhead in [0.0, 0.5] {
                let full = energy_bound_full(&tasks, overhead, &pred_start, &preds);
                let pruned = energy_bound(&tasks, overhead, &pred_start, &preds);
                proptest::prop_assert_eq!(pruned.to_bits(), full.to_bits(), "{} vs {}", pruned, full);
            }
        }
    }

    #[test]
    fn a_reused_simulator_gives_each_list_its_own_makespan() {
        // Two lists of different sizes and stream sets, simulated by one Simulator in turn, match fresh runs.
        let a = vec![task(0, 2.0, 0.5, &[]), task(3, 3.0, 0.75, &[]), task(0, 1.0, 1.0, &[1])];
        let b = vec![task(1, 4.0, 1.0, &[]), task(1, 1.0, 0.25, &[0])];
        let mut sim = Simulator::default();
        for list in [&a, &b, &a] {
            let fresh = simulate(list, 0.5).unwrap();
            assert_eq!(sim.makespan(list, 0.5).unwrap(), fresh.makespan_us);
        }
        // b runs on one stream, one task after the other: (4 + 0.5) + (1 + 0.5).
        assert_eq!(simulate(&b, 0.5).unwrap().makespan_us, 6.0);
        assert!(sim.makespan(&[task(0, 1.0, 1.0, &[0])], 0.0).is_err());
    }

    #[test]
    fn zero_duration_tasks_finish_at_once() {
        let t = simulate(&[task(0, 0.0, 1.0, &[]), task(1, 0.0, 1.0, &[0])], 0.0).unwrap();
        assert_eq!(t.makespan_us, 0.0);
        assert_eq!(t.end_us, vec![0.0, 0.0]);
    }
}
