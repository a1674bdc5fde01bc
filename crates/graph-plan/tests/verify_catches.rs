#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The verifier catches what it must: each test corrupts a good plan one way and asserts the specific
//! violation, with the steps it names (and, where the corruption is clean, the exact list).

use graph_ir::{synth, ComputeGraph};
use graph_plan::verify::{Check, Field, Site, StepRef};
use graph_plan::{
    verify, Access, BufferRef, EventId, ExecutionPlan, KernelId, PlanOptions, PlanStep, Region, StepId, StreamId,
    Violation,
};

fn build(g: &ComputeGraph, streams: usize, fusion: bool, reuse: bool) -> ExecutionPlan {
    let mut o = PlanOptions::with_streams(streams);
    o.fusion.enabled = fusion;
    o.memory.reuse = reuse;
    let p = ExecutionPlan::build_with(g, &o).unwrap();
    verify(&p).unwrap();
    p
}

/// A single-stream plan with every buffer its own bytes: corruptions there have exactly predictable effects.
fn simple() -> ExecutionPlan {
    build(&synth::transformer(1, 32, 4, 8, 1).unwrap(), 1, false, false)
}

fn launch_kernel(p: &ExecutionPlan, i: usize) -> Option<KernelId> {
    match &p.steps[i] {
        PlanStep::Launch { kernel, .. } => Some(*kernel),
        _ => None,
    }
}

fn launch_of(p: &ExecutionPlan, k: KernelId) -> usize {
    p.steps.iter().position(|s| matches!(s, PlanStep::Launch { kernel, .. } if *kernel == k)).unwrap()
}

fn sref(p: &ExecutionPlan, i: usize) -> StepRef {
    StepRef { step: StepId::from_index(i), stream: p.steps[i].stream(), kernel: launch_kernel(p, i) }
}

/// Steps whose ranges include `b`.
fn users(p: &ExecutionPlan, b: BufferRef) -> Vec<usize> {
    (0..p.steps.len())
        .filter(|&i| match &p.steps[i] {
            PlanStep::Launch { reads, writes, .. } => reads.contains(&b) || writes.contains(&b),
            PlanStep::Copy { src, dst, .. } => *src == b || *dst == b,
            _ => false,
        })
        .collect()
}

/// Place a tensor elsewhere: replace `old` by `new` in every step, param and binding.
fn move_buffer(p: &mut ExecutionPlan, old: BufferRef, new: BufferRef) {
    let fix = |b: &mut BufferRef| {
        if *b == old {
            *b = new;
        }
    };
    for s in &mut p.steps {
        match s {
            PlanStep::Launch { reads, writes, .. } => reads.iter_mut().chain(writes.iter_mut()).for_each(fix),
            PlanStep::Copy { src, dst, .. } => {
                fix(src);
                fix(dst);
            }
            _ => {}
        }
    }
    for k in p.kernels_mut() {
        k.params.iter_mut().for_each(|q| fix(&mut q.buffer));
    }
    p.bindings_mut().iter_mut().for_each(|b| fix(&mut b.buffer));
}

/// The first launch writing a pool buffer: (step, buffer).
fn pool_write(p: &ExecutionPlan) -> (usize, BufferRef) {
    p.steps
        .iter()
        .enumerate()
        .find_map(|(i, s)| match s {
            PlanStep::Launch { writes, .. } => writes.iter().find(|b| b.region == Region::Pool).map(|b| (i, *b)),
            _ => None,
        })
        .unwrap()
}

fn multi_stream_plans() -> Vec<ExecutionPlan> {
    vec![
        build(&synth::random_dag(250, 3, 11).unwrap(), 4, false, false),
        build(&synth::random_dag(250, 3, 5).unwrap(), 4, true, true),
        build(&synth::transformer(2, 32, 4, 8, 1).unwrap(), 4, false, false),
        build(&synth::inception_like(3, 4).unwrap(), 4, true, true),
    ]
}

/// For the Wait at `w`: (the compute step before its event's Record, the compute step after the Wait).
fn wait_ends(p: &ExecutionPlan, w: usize) -> (usize, usize) {
    let PlanStep::Wait { stream, event } = p.steps[w] else { panic!("not a wait") };
    let r = p.steps.iter().position(|s| matches!(s, PlanStep::Record { event: e, .. } if *e == event)).unwrap();
    let rs = p.steps[r].stream();
    let writer = (0..r).rev().find(|&j| p.steps[j].stream() == rs && p.steps[j].is_compute()).unwrap();
    let reader = (w + 1..p.steps.len()).find(|&j| p.steps[j].stream() == stream && p.steps[j].is_compute()).unwrap();
    (writer, reader)
}

#[test]
fn dropping_a_needed_wait_leaves_a_dependency_unordered_and_a_race() {
    let (mut needed, mut deps, mut reuses) = (0, 0, 0);
    for p in multi_stream_plans() {
        for w in 0..p.steps.len() {
            if !matches!(p.steps[w], PlanStep::Wait { .. }) {
                continue;
            }
            let (writer, reader) = wait_ends(&p, w);
            let mut q = p.clone();
            q.steps.remove(w);
            let Err(v) = verify(&q) else { continue };
            needed += 1;
            // After the removal the reader moved up by one; the writer (before the record) did not.
            let (wr, rd) = (StepId::from_index(writer), StepId::from_index(reader - 1));
            let dep = v.iter().find_map(|x| match x {
                Violation::Dependency { writer, reader, tensor } if writer.step == wr && reader.step == rd => {
                    Some(tensor.clone())
                }
                _ => None,
            });
            let reuse =
                v.iter().any(|x| matches!(x, Violation::ReuseOrder { from, to } if from.step == wr && to.step == rd));
            assert!(dep.is_some() || reuse, "wait {w} ({wr} -> {rd}) is needed, yet: {v:#?}");
            if dep.is_some() {
                deps += 1;
                // The writer's output is what the reader reads: a write/read race on the same pair.
                assert!(
                    v.iter().any(|x| matches!(x, Violation::Race { earlier: Access::Write, later: Access::Read,
                        first, second, .. } if first.step == wr && second.step == rd)),
                    "{v:#?}"
                );
            }
            if reuse {
                reuses += 1;
            }
            for x in &v {
                assert!(matches!(x.check(), Check::Order | Check::Memory), "{x}");
            }
        }
    }
    assert!(needed > 10 && deps > 0, "needed {needed}, dependencies {deps}");
    assert!(reuses > 0, "some wait should guard a reuse edge (fused, reuse-on plans)");
}

#[test]
fn a_record_moved_after_its_wait_is_reported_at_both_steps() {
    let p = build(&synth::random_dag(250, 3, 11).unwrap(), 4, false, false);
    let (r, event) = p
        .steps
        .iter()
        .enumerate()
        .find_map(|(i, s)| match s {
            PlanStep::Record { event, .. } => Some((i, *event)),
            _ => None,
        })
        .unwrap();
    let w = (r..p.steps.len()).find(|&j| matches!(p.steps[j], PlanStep::Wait { event: e, .. } if e == event)).unwrap();
    let mut q = p.clone();
    let rec = q.steps.remove(r);
    q.steps.insert(w, rec); // the wait is now at w - 1, the record right after it
    let v = verify(&q).unwrap_err();
    let wbr = Violation::WaitBeforeRecord { event, wait: StepId::from_index(w - 1), record: StepId::from_index(w) };
    assert!(v.contains(&wbr), "{v:#?}");
    assert_eq!(wbr.steps(), vec![StepId::from_index(w - 1), StepId::from_index(w)]);
    assert!(!v.iter().any(|x| matches!(x, Violation::WaitNeverRecorded { .. } | Violation::RecordTwice { .. })));
}

#[test]
fn a_buffer_shifted_onto_a_live_neighbour_clobbers_its_readers() {
    let p = simple();
    let pool = p.region_bytes(Region::Pool);
    // Launch i writes X at bx; root Y (bytes by, at least as large) is written by W < i and read after i.
    let mut found = None;
    'search: for (i, s) in p.steps.iter().enumerate() {
        let PlanStep::Launch { kernel, .. } = s else { continue };
        let k = p.kernel(*kernel).unwrap();
        for px in k.params.iter().filter(|q| q.access == Access::Write && q.buffer.region == Region::Pool) {
            for (wi, ws) in p.steps.iter().enumerate().take(i) {
                let PlanStep::Launch { kernel: wk, .. } = ws else { continue };
                for py in p.kernel(*wk).unwrap().params.iter().filter(|q| q.access == Access::Write) {
                    let (bx, by) = (px.buffer, py.buffer);
                    if by.region != Region::Pool
                        || by.overlaps(&bx)
                        || bx.bytes > by.bytes
                        || by.offset + bx.bytes > pool
                    {
                        continue;
                    }
                    let readers: Vec<usize> = (i + 1..p.steps.len())
                        .filter(|&j| {
                            launch_kernel(&p, j).is_some_and(|rk| {
                                p.kernel(rk)
                                    .unwrap()
                                    .params
                                    .iter()
                                    .any(|q| q.access == Access::Read && q.root == py.root)
                            })
                        })
                        .collect();
                    if !readers.is_empty() {
                        found = Some((i, bx, wi, by, py.root.clone(), readers));
                        break 'search;
                    }
                }
            }
        }
    }
    let (i, bx, wi, by, y, readers) = found.expect("a live neighbour");
    let mut q = p.clone();
    let nb = BufferRef { region: Region::Pool, offset: by.offset, bytes: bx.bytes };
    move_buffer(&mut q, bx, nb);
    let v = verify(&q).unwrap_err();
    let expected: Vec<Violation> = readers
        .iter()
        .map(|&r| Violation::Clobbered {
            tensor: y.to_string(),
            range: nb,
            reader: sref(&q, r),
            writer: Some(sref(&q, wi)),
            by: Some(sref(&q, i)),
        })
        .collect();
    assert_eq!(v, expected);
    assert!(v[0].to_string().contains(&format!(
        "last written by {} instead of its writer {}",
        sref(&q, i),
        sref(&q, wi)
    )));
}

#[test]
fn a_read_bound_where_its_writer_did_not_write_sees_someone_elses_bytes() {
    // The reader's param (and step range) points at another tensor's bytes: it reads what that tensor's
    // writer left, not its own tensor.
    let p = simple();
    let writer_of = |q: &ExecutionPlan, root: &str| {
        (0..q.steps.len())
            .find(|&w| {
                launch_kernel(q, w).is_some_and(|k| {
                    q.kernel(k).unwrap().params.iter().any(|x| x.access == Access::Write && *x.root == *root)
                })
            })
            .unwrap()
    };
    // A reader j of a pool tensor (param pi, bytes br), and another tensor of that size written before j.
    let (j, k, pi, br, root, wz, bz) = (0..p.steps.len())
        .find_map(|j| {
            let k = launch_kernel(&p, j)?;
            p.kernel(k).unwrap().params.iter().enumerate().find_map(|(pi, x)| {
                if x.access != Access::Read || x.buffer.region != Region::Pool {
                    return None;
                }
                let br = x.buffer;
                let (wz, bz) = (0..j).find_map(|w| match &p.steps[w] {
                    PlanStep::Launch { writes, .. } => writes
                        .iter()
                        .find(|b| b.region == Region::Pool && b.bytes == br.bytes && !b.overlaps(&br))
                        .map(|b| (w, *b)),
                    _ => None,
                })?;
                Some((j, k, pi, br, x.root.clone(), wz, bz))
            })
        })
        .unwrap();
    let mut q = p.clone();
    q.kernels_mut()[k.index()].params[pi].buffer = bz;
    if let PlanStep::Launch { reads, .. } = &mut q.steps[j] {
        for b in reads.iter_mut().filter(|b| **b == br) {
            *b = bz;
        }
    }
    let w = writer_of(&q, &root);
    assert_eq!(
        verify(&q).unwrap_err(),
        vec![Violation::Clobbered {
            tensor: root.to_string(),
            range: bz,
            reader: sref(&q, j),
            writer: Some(sref(&q, w)),
            by: Some(sref(&q, wz)),
        }]
    );
}

#[test]
fn a_shift_onto_a_live_neighbour_across_streams_is_a_race_too() {
    // With several streams, writing over bytes another stream still has to read is also, often, unordered.
    let p = build(&synth::random_dag(250, 3, 11).unwrap(), 4, false, false);
    let writer_of = |root: &str| {
        (0..p.steps.len()).find(|&w| {
            launch_kernel(&p, w).is_some_and(|k| {
                p.kernel(k).unwrap().params.iter().any(|q| q.access == Access::Write && *q.root == *root)
            })
        })
    };
    let (mut tried, mut races) = (0, 0);
    for (i, s) in p.steps.iter().enumerate() {
        let PlanStep::Launch { writes, .. } = s else { continue };
        let Some(bx) = writes.iter().find(|b| b.region == Region::Pool).copied() else { continue };
        // A tensor Y written before i and read after i on another stream: live across i.
        let live = (i + 1..p.steps.len()).find_map(|j| {
            let k = launch_kernel(&p, j)?;
            if p.steps[j].stream() == s.stream() {
                return None;
            }
            let py = p.kernel(k).unwrap().params.iter().find(|q| {
                q.access == Access::Read
                    && q.buffer.region == Region::Pool
                    && q.buffer.bytes >= bx.bytes
                    && !q.buffer.overlaps(&bx)
                    && writer_of(&q.root).is_some_and(|w| w < i)
            })?;
            Some((j, py.buffer, py.root.clone()))
        });
        let Some((j, by, y)) = live else { continue };
        let mut q = p.clone();
        move_buffer(&mut q, bx, BufferRef { bytes: bx.bytes, ..by });
        let v = verify(&q).unwrap_err();
        tried += 1;
        assert!(
            v.iter().any(|x| matches!(x, Violation::Clobbered { tensor, reader, by: Some(b), .. }
                if **tensor == *y && reader.step == StepId::from_index(j) && b.step == StepId::from_index(i))),
            "{v:#?}"
        );
        if v.iter().any(|x| {
            matches!(x, Violation::Race { first, second, .. }
            if first.step == StepId::from_index(i) && second.step == StepId::from_index(j))
        }) {
            races += 1;
        }
        assert!(v.iter().all(|x| x.check() == Check::Memory || x.check() == Check::Order), "{v:#?}");
    }
    assert!(tried > 0 && races > 0, "tried {tried}, races {races}");
}

#[test]
fn a_range_past_the_pool_is_out_of_region_at_every_step_using_it() {
    let p = simple();
    let (_, bx) = pool_write(&p);
    let pool = p.region_bytes(Region::Pool);
    let a = p.alignment();
    let nb = BufferRef { region: Region::Pool, offset: pool.div_ceil(a) * a, bytes: bx.bytes };
    let mut q = p.clone();
    move_buffer(&mut q, bx, nb);
    let v = verify(&q).unwrap_err();
    let expected: Vec<Violation> = users(&q, nb)
        .into_iter()
        .map(|i| Violation::OutOfRegion { site: Site::Step(StepId::from_index(i)), range: nb, region_bytes: pool })
        .collect();
    assert!(expected.len() >= 2, "a writer and a reader");
    assert_eq!(v, expected);
    // An end that wraps past u64::MAX is out of the region too, not inside it.
    let mut q = p.clone();
    let huge = BufferRef { region: Region::Pool, offset: u64::MAX - a + 1, bytes: 2 * a };
    move_buffer(&mut q, bx, huge);
    let v = verify(&q).unwrap_err();
    assert!(v.iter().any(|x| matches!(x, Violation::OutOfRegion { range, .. } if *range == huge)), "{v:#?}");
}

#[test]
fn a_misaligned_offset_is_reported_at_every_step_and_binding() {
    let p = simple();
    let (_, bx) = pool_write(&p);
    // Shrink from the front so that the range stays inside its old bytes: only the alignment is wrong.
    let nb = BufferRef { region: bx.region, offset: bx.offset + 4, bytes: bx.bytes - 4 };
    let mut q = p.clone();
    move_buffer(&mut q, bx, nb);
    let v = verify(&q).unwrap_err();
    let expected: Vec<Violation> = users(&q, nb)
        .into_iter()
        .map(|i| Violation::Misaligned { site: Site::Step(StepId::from_index(i)), range: nb, alignment: p.alignment() })
        .collect();
    assert_eq!(v, expected);

    let mut q = p.clone();
    let b = &mut q.bindings_mut()[0];
    b.buffer.offset += 4;
    b.buffer.bytes -= 4;
    let (name, range) = (b.name.clone(), b.buffer);
    let v = verify(&q).unwrap_err();
    assert_eq!(
        v,
        vec![Violation::Misaligned { site: Site::Binding(name.to_string()), range, alignment: p.alignment() }]
    );
    assert!(v[0].to_string().starts_with(&format!("bounds: binding '{name}' uses ")));
}

#[test]
fn a_duplicated_launch_is_reported_with_both_steps() {
    let p = simple();
    let (i, _) = pool_write(&p);
    let k = launch_kernel(&p, i).unwrap();
    let mut q = p.clone();
    q.steps.insert(i + 1, p.steps[i].clone());
    let n = p.kernel_count_fused as u64;
    assert_eq!(
        verify(&q).unwrap_err(),
        vec![
            Violation::KernelLaunchedTwice {
                kernel: k,
                first: StepId::from_index(i),
                again: StepId::from_index(i + 1)
            },
            Violation::Counter { field: Field::KernelCountFused, claimed: n, actual: n + 1 },
        ]
    );
}

#[test]
fn a_removed_launch_leaves_its_nodes_unrun() {
    // Fused: the removed kernel runs several nodes, each reported.
    let p = build(&synth::transformer(1, 32, 4, 8, 1).unwrap(), 1, true, false);
    let (i, k) = (0..p.steps.len())
        .filter_map(|i| launch_kernel(&p, i).map(|k| (i, k)))
        .find(|&(_, k)| p.kernel(k).unwrap().body.len() >= 2)
        .unwrap();
    let mut q = p.clone();
    q.steps.remove(i);
    let body: Vec<&str> = p.kernel(k).unwrap().node_names().collect();
    let mut expected: Vec<Violation> = p
        .nodes()
        .iter()
        .filter(|n| !n.view && body.contains(&n.name.as_ref()))
        .map(|n| Violation::NodeNotRun { node: n.name.to_string() })
        .collect();
    assert!(expected.len() >= 2);
    let n = p.kernel_count_fused as u64;
    expected.push(Violation::Counter { field: Field::KernelCountFused, claimed: n, actual: n - 1 });
    assert_eq!(verify(&q).unwrap_err(), expected);
}

#[test]
fn wrong_counters_are_each_reported() {
    let p = build(&synth::random_dag(120, 3, 2).unwrap(), 3, true, true);
    assert!(p.event_count > 0);
    let mut q = p.clone();
    q.event_count += 1;
    q.kernel_count_original -= 1;
    q.pool_bytes += 256;
    let (e, o, b) = (p.event_count as u64, p.kernel_count_original as u64, p.pool_bytes);
    assert_eq!(
        verify(&q).unwrap_err(),
        vec![
            Violation::Counter { field: Field::KernelCountOriginal, claimed: o - 1, actual: o },
            Violation::Counter { field: Field::EventCount, claimed: e + 1, actual: e },
            Violation::Counter { field: Field::PoolBytes, claimed: b as u64 + 256, actual: b as u64 },
        ]
    );
    let mut q = p.clone();
    q.num_streams = 0;
    let v = verify(&q).unwrap_err();
    assert_eq!(v, vec![Violation::Counter { field: Field::NumStreams, claimed: 0, actual: p.num_streams as u64 }]);
    assert_eq!(v[0].to_string(), format!("counters: num_streams is 0, but the plan has {}", p.num_streams));
}

#[test]
fn a_step_on_a_stream_past_num_streams_is_reported() {
    let p = simple();
    let i = (0..p.steps.len()).rev().find(|&i| launch_kernel(&p, i).is_some()).unwrap();
    let mut q = p.clone();
    let PlanStep::Launch { stream, .. } = &mut q.steps[i] else { unreachable!() };
    *stream = StreamId(1);
    let v = verify(&q).unwrap_err();
    assert!(
        v.contains(&Violation::StreamOutOfRange { step: StepId::from_index(i), stream: StreamId(1), num_streams: 1 }),
        "{v:#?}"
    );
    // Moved off its stream, the launch is no longer ordered after its producers.
    assert!(v
        .iter()
        .any(|x| matches!(x, Violation::Dependency { reader, .. } if reader.step == StepId::from_index(i))));
    assert!(v.iter().all(|x| matches!(x.check(), Check::Counters | Check::Order | Check::Memory)));
}

#[test]
fn a_violated_reuse_edge_is_reported_with_both_launches() {
    // One stream, reuse on: the memory plan's reuse edges hold by stream order. Move the later launch of an
    // edge onto a second stream and nothing orders it any more.
    let p = build(&synth::transformer(1, 32, 4, 8, 1).unwrap(), 1, false, true);
    assert!(!p.orders().is_empty());
    let mut checked = 0;
    for o in p.orders().iter().take(12) {
        let (f, t) = (launch_of(&p, o.from), launch_of(&p, o.to));
        let mut q = p.clone();
        q.num_streams = 2;
        let PlanStep::Launch { stream, .. } = &mut q.steps[t] else { unreachable!() };
        *stream = StreamId(1);
        let v = verify(&q).unwrap_err();
        let want = Violation::ReuseOrder { from: sref(&q, f), to: sref(&q, t) };
        assert!(v.contains(&want), "{o:?}: {v:#?}");
        assert_eq!(
            want.to_string(),
            format!(
                "order: reuse edge {} -> {} is not ordered: {} must happen before {}",
                o.from,
                o.to,
                sref(&q, f),
                sref(&q, t)
            )
        );
        assert!(v.iter().all(|x| matches!(x.check(), Check::Order | Check::Memory)), "{v:#?}");
        checked += 1;
    }
    assert!(checked > 0);
}

#[test]
fn a_reuse_edge_moved_behind_is_reported_even_on_one_stream() {
    // Submission order itself breaks the edge: launch `to` before `from` on the one stream. In place, the chain
    // would be one buffer handed down the chain, with no reuse edge to move.
    let mut o = PlanOptions::with_streams(1);
    o.fusion.enabled = false;
    o.memory.in_place = false;
    let p = ExecutionPlan::build_with(&synth::chain(20).unwrap(), &o).unwrap();
    let o = *p.orders().iter().find(|o| launch_of(&p, o.to) > launch_of(&p, o.from) + 1).unwrap_or(&p.orders()[0]);
    let (f, t) = (launch_of(&p, o.from), launch_of(&p, o.to));
    let mut q = p.clone();
    let step = q.steps.remove(t);
    q.steps.insert(f, step); // `to` now at f, `from` at f + 1
    let v = verify(&q).unwrap_err();
    assert!(v.contains(&Violation::ReuseOrder { from: sref(&q, f + 1), to: sref(&q, f) }), "{v:#?}");
}

#[test]
fn unknown_kernels_nodes_and_events_are_named() {
    let p = build(&synth::random_dag(120, 3, 2).unwrap(), 3, true, true);
    let nk = p.kernels().len();
    let i = (0..p.steps.len()).find(|&i| launch_kernel(&p, i).is_some()).unwrap();
    let k = launch_kernel(&p, i).unwrap();

    let mut q = p.clone();
    if let PlanStep::Launch { kernel, .. } = &mut q.steps[i] {
        *kernel = KernelId::from_index(nk);
    }
    let v = verify(&q).unwrap_err();
    assert!(
        v.contains(&Violation::UnknownKernel { step: Some(StepId::from_index(i)), kernel: KernelId::from_index(nk) })
    );
    // Its nodes now run nowhere.
    for n in p.kernel(k).unwrap().node_names() {
        if p.nodes().iter().any(|x| *x.name == *n && !x.view) {
            assert!(v.contains(&Violation::NodeNotRun { node: n.to_string() }));
        }
    }

    let mut q = p.clone();
    q.kernels_mut()[k.index()].body[0].node = "ghost".into();
    let v = verify(&q).unwrap_err();
    assert!(v.contains(&Violation::UnknownNode { step: StepId::from_index(i), node: "ghost".into() }), "{v:#?}");

    let w = p.steps.iter().position(|s| matches!(s, PlanStep::Wait { .. })).unwrap();
    let mut q = p.clone();
    let ghost = EventId(9999);
    if let PlanStep::Wait { event, .. } = &mut q.steps[w] {
        *event = ghost;
    }
    let v = verify(&q).unwrap_err();
    assert!(v.contains(&Violation::WaitNeverRecorded { event: ghost, wait: StepId::from_index(w) }), "{v:#?}");
    assert!(v.iter().any(|x| matches!(x, Violation::Counter { field: Field::EventCount, .. })));
}

#[test]
fn an_event_recorded_twice_is_reported() {
    let p = build(&synth::random_dag(120, 3, 2).unwrap(), 3, true, true);
    let r = p.steps.iter().position(|s| matches!(s, PlanStep::Record { .. })).unwrap();
    let PlanStep::Record { event, .. } = p.steps[r] else { unreachable!() };
    let mut q = p.clone();
    q.steps.push(p.steps[r].clone());
    let again = StepId::from_index(q.steps.len() - 1);
    assert_eq!(verify(&q).unwrap_err(), vec![Violation::RecordTwice { event, first: StepId::from_index(r), again }]);
}

#[test]
fn a_node_run_twice_and_step_params_that_disagree() {
    let p = simple();
    let (i, bx) = pool_write(&p);
    let k = launch_kernel(&p, i).unwrap();
    let node = p.kernel(k).unwrap().body[0].node.clone();
    // A copy that also claims to run the node (a zero-byte copy inside the pool touches nothing).
    let mut q = p.clone();
    let z = BufferRef { region: Region::Pool, offset: 0, bytes: 0 };
    q.steps.push(PlanStep::Copy { stream: StreamId(0), src: z, dst: z, bytes: 0, node: Some(node.clone()) });
    let last = StepId::from_index(q.steps.len() - 1);
    assert_eq!(
        verify(&q).unwrap_err(),
        vec![Violation::NodeRunTwice { node: node.to_string(), steps: vec![StepId::from_index(i), last] }]
    );
    // A launch that forgets one of its writes.
    let mut q = p.clone();
    if let PlanStep::Launch { writes, .. } = &mut q.steps[i] {
        writes.retain(|b| *b != bx);
    }
    let v = verify(&q).unwrap_err();
    assert_eq!(
        v[0],
        Violation::StepParams {
            step: StepId::from_index(i),
            kernel: k,
            access: Access::Write,
            missing: vec![bx],
            extra: vec![]
        }
    );
    // Its readers then read bytes nobody wrote.
    assert!(v[1..].iter().all(|x| matches!(x, Violation::Clobbered { by: None, .. })), "{v:#?}");
}

#[test]
fn a_copy_longer_than_its_ranges_is_reported() {
    let p = simple();
    let (_, bx) = pool_write(&p);
    let mut q = p.clone();
    q.steps.push(PlanStep::Copy { stream: StreamId(0), src: bx, dst: bx, bytes: bx.bytes + 1, node: None });
    let last = StepId::from_index(q.steps.len() - 1);
    assert!(verify(&q).unwrap_err().contains(&Violation::CopyLength {
        step: last,
        bytes: bx.bytes + 1,
        src: bx,
        dst: bx
    }));
}

#[test]
fn too_many_streams_skips_the_clock_checks_and_says_so() {
    let p = build(&synth::chain(300).unwrap(), 1, false, false);
    let mut q = p.clone();
    q.num_streams = 300;
    for (i, s) in q.steps.iter_mut().enumerate() {
        if let PlanStep::Launch { stream, .. } = s {
            *stream = StreamId::from_index(i);
        }
    }
    let v = verify(&q).unwrap_err();
    let limit = graph_plan::verify::MAX_CHECKED_STREAMS;
    assert_eq!(v, vec![Violation::TooManyStreams { streams: 300, limit }]);
}

#[test]
fn display_names_steps_streams_kernels_and_ranges() {
    let race = Violation::Race {
        earlier: Access::Write,
        later: Access::Read,
        range: BufferRef { region: Region::Pool, offset: 256, bytes: 256 },
        first: StepRef { step: StepId(4), stream: StreamId(1), kernel: Some(KernelId(3)) },
        second: StepRef { step: StepId(9), stream: StreamId(0), kernel: Some(KernelId(5)) },
    };
    assert_eq!(race.to_string(), "memory: unordered write/read on pool[256..512): #4 (s1, k3) and #9 (s0, k5)");
    assert_eq!(race.steps(), vec![StepId(4), StepId(9)]);
    let dep = Violation::Dependency {
        tensor: "h".into(),
        writer: StepRef { step: StepId(2), stream: StreamId(1), kernel: Some(KernelId(1)) },
        reader: StepRef { step: StepId(7), stream: StreamId(0), kernel: None },
    };
    assert_eq!(dep.to_string(), "order: #7 (s0, copy) reads 'h' written by #2 (s1, k1), but nothing orders them");
    let late = Violation::Dependency {
        tensor: "h".into(),
        writer: StepRef { step: StepId(9), stream: StreamId(0), kernel: Some(KernelId(1)) },
        reader: StepRef { step: StepId(7), stream: StreamId(0), kernel: Some(KernelId(2)) },
    };
    assert_eq!(late.to_string(), "order: #7 (s0, k2) reads 'h' before its writer #9 (s0, k1) is submitted");
    let json = serde_json::to_string(&race).unwrap();
    assert_eq!(serde_json::from_str::<Violation>(&json).unwrap(), race);
}
