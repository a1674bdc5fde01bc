//! Plan sets: shared layout, padding analysis, select/pieces, verify_set and the typed errors of bad specs and
//! requests, on small graphs built at given dims.
#![allow(clippy::unwrap_used, clippy::expect_used)] // helpers of tests

use graph_ir::{ComputeGraph, DType, Op};
use graph_plan::set::{dims_label, BucketSpec, Dims, LoadError, SetError, SetOptions};
use graph_plan::{verify, verify_set, BindingRole, PlanSet, Region};

fn d(pairs: &[(&str, usize)]) -> Dims {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

/// x [batch, 8] -> MatMul [8, 16] -> Add bias -> Relu -> MatMul [16, 4] -> Softmax(-1) -> y, plus a position
/// constant [batch] of 0..batch added to a second output.
fn mlp(dims: &Dims) -> Result<ComputeGraph, LoadError> {
    let b = *dims.get("batch").ok_or("no batch")?;
    let mut g = ComputeGraph::new("mlp");
    let x = g.add_input("x", DType::F32, [b, 8])?;
    let w1 = g.add_weight("w1", DType::F32, [8, 16])?;
    let b1 = g.add_weight("b1", DType::F32, [16])?;
    let w2 = g.add_weight("w2", DType::F32, [16, 4])?;
    let h = g.add_node("mm1", Op::MatMul, &[x, w1])?[0];
    let h = g.add_node("bias", Op::Add, &[h, b1])?[0];
    let h = g.add_node("relu", Op::Relu, &[h])?[0];
    let h = g.add_node("mm2", Op::MatMul, &[h, w2])?[0];
    let y = g.add_node("softmax", Op::Softmax { axis: -1 }, &[h])?[0];
    g.mark_output(y)?;
    let pos: Vec<f32> = (0..b).map(|i| i as f32).collect();
    let p = g.add_constant_f32("pos", [b, 1], &pos)?;
    let z = g.add_node("pos_add", Op::Add, &[y, p])?[0];
    g.mark_output(z)?;
    Ok(g)
}

fn build(spec: &[&str], loader: fn(&Dims) -> Result<ComputeGraph, LoadError>) -> Result<PlanSet, SetError> {
    let spec = BucketSpec::parse(spec)?;
    PlanSet::build(&spec, &SetOptions::default(), loader)
}

#[test]
fn shared_layout_pool_and_addresses() {
    let set = build(&["batch=1,2,4"], mlp).unwrap();
    verify_set(&set).unwrap();
    assert_eq!(set.members().len(), 3);
    let pools: Vec<u64> = set.members().iter().map(|m| m.plan.region_bytes(Region::Pool)).collect();
    assert_eq!(set.pool_bytes(), *pools.iter().max().unwrap());
    assert_eq!(set.sum_pool_bytes(), pools.iter().sum::<u64>());
    for m in set.members() {
        assert!(verify(&m.plan).is_ok());
        for r in [Region::Weights, Region::Io] {
            assert_eq!(m.plan.region_bytes(r), set.region_bytes(r));
        }
    }
    // One address per weight and per io tensor in every member; io sized for the largest member.
    let largest = &set.members()[2].plan;
    for b in largest.bindings().iter().filter(|b| b.role != BindingRole::Constant) {
        for m in set.members() {
            let mb = m.plan.bindings().iter().find(|x| x.name == b.name).unwrap();
            assert_eq!(mb.buffer.offset, b.buffer.offset, "{} in {}", b.name, dims_label(&m.dims));
            assert!(mb.buffer.bytes <= b.buffer.bytes);
        }
    }
    // The position constant differs per member: three slots, none overlapping.
    let mut pos: Vec<(u64, u64)> = set
        .members()
        .iter()
        .map(|m| m.plan.bindings().iter().find(|b| &*b.name == "pos").unwrap().buffer)
        .map(|b| (b.offset, b.end()))
        .collect();
    pos.sort_unstable();
    pos.dedup();
    assert_eq!(pos.len(), 3);
    assert!(pos.windows(2).all(|w| w[0].1 <= w[1].0));
    // Padding is safe (the position constant's smaller versions are prefixes of the larger), extents exact.
    assert!(set.padding()[0].safe(), "{:?}", set.padding());
    let x = set.io().iter().find(|t| t.name == "x").unwrap();
    assert_eq!(x.shape_at(&d(&[("batch", 3)])), Some(vec![3, 8]));
}

#[test]
fn select_and_pieces() {
    let set = build(&["batch=1,2,4"], mlp).unwrap();
    let dims = |b| d(&[("batch", b)]);
    assert_eq!(set.select(&dims(1)).unwrap(), 0);
    assert_eq!(set.select(&dims(2)).unwrap(), 1);
    assert_eq!(set.select(&dims(3)).unwrap(), 2);
    assert_eq!(set.select(&dims(4)).unwrap(), 2);
    assert!(matches!(set.select(&dims(5)), Err(SetError::AboveLargest { value: 5, largest: 4, .. })));
    assert!(matches!(set.select(&dims(0)), Err(SetError::Request { .. })));
    assert!(matches!(set.select(&d(&[])), Err(SetError::Request { detail }) if detail.contains("batch")));
    assert!(
        matches!(set.select(&d(&[("batch", 2), ("seq", 3)])), Err(SetError::Request { detail }) if detail.contains("seq"))
    );
    // Chunks of the largest bucket, the rest on the smallest member that covers it.
    let p = set.pieces(&dims(11), true).unwrap();
    let got: Vec<(usize, usize, usize)> =
        p.iter().map(|p| (p.member, p.dims["batch"], p.chunk.as_ref().unwrap().1)).collect();
    assert_eq!(got, vec![(2, 4, 0), (2, 4, 4), (2, 3, 8)]);
    assert!(matches!(set.pieces(&dims(11), false), Err(SetError::AboveLargest { .. })));
}

#[test]
fn hostile_specs_are_typed_errors() {
    for bad in [&["batch="][..], &["batch=2,1"], &["batch=1,1"], &["batch=0,1"], &["batch=a"], &["batch"], &["=1"]] {
        assert!(matches!(BucketSpec::parse(bad), Err(SetError::InvalidBuckets { .. })), "{bad:?}");
    }
    assert!(matches!(BucketSpec::parse::<&str>(&[]), Err(SetError::InvalidBuckets { .. })));
    assert!(matches!(BucketSpec::parse(&["a=1", "b=1", "c=1"]), Err(SetError::InvalidBuckets { .. })));
    assert!(matches!(BucketSpec::parse(&["a=1", "a=2"]), Err(SetError::InvalidBuckets { .. })));
    let many: Vec<String> = vec![format!("a={}", (1..=9).map(|i| i.to_string()).collect::<Vec<_>>().join(",")); 1]
        .into_iter()
        .chain(std::iter::once(format!("b={}", (1..=9).map(|i| i.to_string()).collect::<Vec<_>>().join(","))))
        .collect();
    assert!(matches!(BucketSpec::parse(&many), Err(SetError::InvalidBuckets { detail, .. }) if detail.contains("64")));
    // A symbol the model does not have: no shape changes with it.
    let e = build(&["seq=1,2"], |dims| {
        let mut dd = dims.clone();
        dd.insert("batch".into(), 2);
        mlp(&dd)
    })
    .unwrap_err();
    assert!(matches!(&e, SetError::UnknownSymbol { symbol, .. } if symbol == "seq"), "{e}");
    // The loader's error names the member.
    let e = build(&["batch=1,2"], |_| Err("boom".into())).unwrap_err();
    assert!(e.to_string().contains("batch=1") && e.to_string().contains("boom"), "{e}");
    // A bucket symbol also fixed, and pad-safe on a symbol that is not bucketed.
    let spec = BucketSpec::parse(&["batch=1,2"]).unwrap();
    let opts = SetOptions { fixed: d(&[("batch", 2)]), ..Default::default() };
    assert!(matches!(PlanSet::build(&spec, &opts, mlp), Err(SetError::UnknownSymbol { .. })));
    let opts = SetOptions { pad_safe: vec!["seq".into()], ..Default::default() };
    assert!(matches!(PlanSet::build(&spec, &opts, mlp), Err(SetError::UnknownSymbol { .. })));
}

/// x [batch, 4] -> ReduceSum over axis 0 -> Add x: the sum mixes rows.
fn batch_sum(dims: &Dims) -> Result<ComputeGraph, LoadError> {
    let b = *dims.get("batch").ok_or("no batch")?;
    let mut g = ComputeGraph::new("sum");
    let x = g.add_input("x", DType::F32, [b, 4])?;
    let s = g.add_node("colsum", Op::ReduceSum { axes: Some(vec![0]), keepdims: true }, &[x])?[0];
    let y = g.add_node("add", Op::Add, &[x, s])?[0];
    g.mark_output(y)?;
    Ok(g)
}

/// x [batch, seq] -> Softmax over seq; a second symbol.
fn seq_softmax(dims: &Dims) -> Result<ComputeGraph, LoadError> {
    let (b, s) = (*dims.get("batch").ok_or("no batch")?, *dims.get("seq").ok_or("no seq")?);
    let mut g = ComputeGraph::new("att");
    let x = g.add_input("x", DType::F32, [b, s])?;
    let y = g.add_node("probs", Op::Softmax { axis: -1 }, &[x])?[0];
    let z = g.add_node("act", Op::Relu, &[y])?[0];
    g.mark_output(z)?;
    Ok(g)
}

#[test]
fn mixing_nodes_refuse_padding_by_name() {
    let set = build(&["batch=2,4"], batch_sum).unwrap();
    verify_set(&set).unwrap();
    let m = set.padding()[0].mixing.clone().unwrap();
    assert_eq!((m.node.as_str(), m.op.as_str()), ("colsum", "ReduceSum"));
    let e = set.select(&d(&[("batch", 3)])).unwrap_err();
    assert!(matches!(&e, SetError::NotPaddable { node, .. } if node == "colsum"), "{e}");
    assert!(e.to_string().contains("colsum"));
    // Exact buckets still run; marking the symbol safe lets padding through.
    assert_eq!(set.select(&d(&[("batch", 4)])).unwrap(), 1);
    let spec = BucketSpec::parse(&["batch=2,4"]).unwrap();
    let opts = SetOptions { pad_safe: vec!["batch".into()], ..Default::default() };
    let set = PlanSet::build(&spec, &opts, batch_sum).unwrap();
    assert!(set.padding()[0].marked_safe && set.padding()[0].safe());
    assert_eq!(set.select(&d(&[("batch", 3)])).unwrap(), 1);
    assert!(set.chunk_axes("batch").is_ok());

    // A grid: batch pads, seq does not (the softmax normalises over it).
    let set = build(&["batch=1,2", "seq=4,8"], seq_softmax).unwrap();
    verify_set(&set).unwrap();
    assert_eq!(set.members().len(), 4);
    assert_eq!(set.members()[1].dims, d(&[("batch", 1), ("seq", 8)]));
    let by = |s: &str| set.padding().iter().find(|p| p.symbol == s).unwrap().clone();
    assert!(by("batch").safe());
    assert_eq!(by("seq").mixing.unwrap().node, "probs");
    assert_eq!(set.select(&d(&[("batch", 2), ("seq", 8)])).unwrap(), 3);
    assert_eq!(set.select(&d(&[("batch", 1), ("seq", 4)])).unwrap(), 0);
    assert!(matches!(set.select(&d(&[("batch", 2), ("seq", 5)])), Err(SetError::NotPaddable { .. })));
    // Chunking along batch needs every io tensor's batch axis alone: x [batch, seq] qualifies.
    assert!(set.chunk_axes("batch").is_ok());
    assert!(set.chunk_axes("seq").is_err());
}

/// A constant whose smaller version is not the leading part of the larger: positions counted from the end.
fn reversed_positions(dims: &Dims) -> Result<ComputeGraph, LoadError> {
    let b = *dims.get("batch").ok_or("no batch")?;
    let mut g = ComputeGraph::new("rev");
    let x = g.add_input("x", DType::F32, [b])?;
    let pos: Vec<f32> = (0..b).rev().map(|i| i as f32).collect();
    let p = g.add_constant_f32("rev_pos", [b], &pos)?;
    let y = g.add_node("add", Op::Add, &[x, p])?[0];
    g.mark_output(y)?;
    Ok(g)
}

#[test]
fn a_constant_that_is_not_a_prefix_refuses_padding() {
    let set = build(&["batch=2,4"], reversed_positions).unwrap();
    verify_set(&set).unwrap();
    let m = set.padding()[0].mixing.clone().unwrap();
    assert_eq!(m.node, "rev_pos");
}

#[test]
fn a_single_bucket_is_analysed_with_a_probe() {
    let set = build(&["batch=4"], mlp).unwrap();
    verify_set(&set).unwrap();
    assert_eq!(set.members().len(), 1);
    assert!(set.padding()[0].safe());
    assert_eq!(set.select(&d(&[("batch", 3)])).unwrap(), 0);
    assert_eq!(set.pool_bytes(), set.sum_pool_bytes());
}

#[test]
fn verify_set_catches_a_moved_weight_and_a_grown_pool() {
    let mut set = build(&["batch=1,2"], mlp).unwrap();
    let json = set.to_json();
    // Move a weight in member 0 (via a JSON round trip, the way a tool would edit a set).
    let mut v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let bindings = v["members"][0]["plan"]["bindings"].as_array_mut().unwrap();
    let w = bindings.iter_mut().find(|b| b["name"] == "w2").unwrap();
    let off = w["buffer"]["offset"].as_u64().unwrap();
    w["buffer"]["offset"] = serde_json::json!(off + 256);
    let moved: PlanSet = serde_json::from_value(v).unwrap();
    let errs = verify_set(&moved).unwrap_err();
    assert!(errs.iter().any(|e| e.detail.contains("w2")), "{errs:?}");
    // A member whose io region differs from the set's.
    set = serde_json::from_str(&json).unwrap();
    verify_set(&set).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&json).unwrap();
    v["members"][1]["plan"]["region_bytes"][2] = serde_json::json!(1);
    let bad: PlanSet = serde_json::from_value(v).unwrap();
    assert!(verify_set(&bad).unwrap_err().iter().any(|e| e.detail.contains("io region")));
}

/// x [batch, 8] -> MatMul w1 [8, 16] -> Relu -> MatMul w2 [16, 16] -> Relu -> MatMul w3 [16, 4] -> y.
fn deep(dims: &Dims) -> Result<ComputeGraph, LoadError> {
    let b = *dims.get("batch").ok_or("no batch")?;
    let mut g = ComputeGraph::new("deep");
    let mut h = g.add_input("x", DType::F32, [b, 8])?;
    for (i, (k, n)) in [(8, 16), (16, 16), (16, 4)].into_iter().enumerate() {
        let w = g.add_weight(&format!("w{}", i + 1), DType::F32, [k, n])?;
        h = g.add_node(&format!("mm{}", i + 1), Op::MatMul, &[h, w])?[0];
        if i < 2 {
            h = g.add_node(&format!("relu{}", i + 1), Op::Relu, &[h])?[0];
        }
    }
    g.mark_output(h)?;
    Ok(g)
}

/// A set planned in half precision lays out the rewritten graphs: the weight a half MatMul reads takes a
/// half-width slot at one address in every member, every member verifies, and the io slots keep the declared
/// f32 width.
#[test]
fn a_half_precision_set_shares_half_width_weights() {
    use graph_passes::precision::{Precision, PrecisionPolicy};
    let spec = BucketSpec::parse(&["batch=1,2,4"]).unwrap();
    let f32_set = PlanSet::build(&spec, &SetOptions::default(), deep).unwrap();
    let bytes = |set: &PlanSet, name: &str| -> Vec<(u64, u64)> {
        set.members()
            .iter()
            .map(|m| {
                let b = m.plan.bindings().iter().find(|b| *b.name == *name).unwrap();
                (b.buffer.offset, b.buffer.bytes)
            })
            .collect()
    };
    assert!(bytes(&f32_set, "w2").iter().all(|&(_, n)| n == 16 * 16 * 4));
    for p in [Precision::Fp16, Precision::Bf16] {
        let mut opts = SetOptions::default();
        opts.plan.precision = PrecisionPolicy::new(p);
        let set = PlanSet::build(&spec, &opts, deep).unwrap();
        verify_set(&set).unwrap();
        for m in set.members() {
            assert!(verify(&m.plan).is_ok());
            assert_eq!(m.plan.region_bytes(Region::Weights), set.region_bytes(Region::Weights));
        }
        let w2 = bytes(&set, "w2");
        assert!(w2.iter().all(|&x| x == (w2[0].0, 16 * 16 * 2)), "{p:?}: w2 slots {w2:?}");
        assert!(set.region_bytes(Region::Weights) < f32_set.region_bytes(Region::Weights), "{p:?}");
        assert_eq!(set.region_bytes(Region::Io), f32_set.region_bytes(Region::Io), "{p:?}: io keeps f32");
    }
}
