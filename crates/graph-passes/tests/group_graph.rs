#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The group graph's derived facts against their definitions, on the synth families with views, eliminated
//! Concats and random DAGs: each alias group's readers are the groups of the nodes that read any of its members.

use graph_ir::{synth, ComputeGraph, TensorId};
use graph_passes::ids::GroupId;
use graph_plan::{run_pipeline, Pass, PlanOptions};
use proptest::prelude::*;
use std::collections::BTreeMap;

/// Check `readers` on `g` planned with `streams` streams.
fn check_readers(g: &ComputeGraph, streams: usize) {
    let r = run_pipeline(g, &PlanOptions::with_streams(streams), Some(Pass::Groups)).unwrap();
    let (fusion, groups) = (r.fusion.unwrap(), r.groups.unwrap());
    let mut expected: BTreeMap<TensorId, Vec<GroupId>> = BTreeMap::new();
    for (t, _) in g.tensors() {
        let list = expected.entry(groups.root(t)).or_default();
        list.extend(g.consumers(t).iter().filter_map(|&c| fusion.group_of.get(c)).copied());
    }
    for list in expected.values_mut() {
        list.sort_unstable();
        list.dedup();
    }
    for (t, _) in g.tensors() {
        let want = expected.get(&t).filter(|_| groups.root(t) == t).map_or(&[][..], Vec::as_slice);
        assert_eq!(groups.readers(t), want, "{}: readers of {}", g.name(), g.tensor(t).name);
    }
}

#[test]
fn readers_on_the_families() {
    for s in [1, 4] {
        check_readers(&synth::inception_like(3, 4).unwrap(), s);
        check_readers(&synth::transformer(2, 64, 4, 16, 1).unwrap(), s);
        check_readers(&synth::resnet_like(2, 8, 16).unwrap(), s);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn readers_on_random_dags(n in 2usize..120, fan_in in 1usize..5, seed in 0u64..1_000_000, streams in 1usize..5) {
        check_readers(&synth::random_dag(n, fan_in, seed).unwrap(), streams);
    }
}
