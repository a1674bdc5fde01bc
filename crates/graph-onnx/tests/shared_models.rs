#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The four real models of the repository (`models/`, or `$CUPLAN_MODELS_DIR`) import and validate, with the
//! node and tensor counts of their README and the attributes of representative nodes.

use std::path::PathBuf;

use graph_ir::op::{ConvAttrs, PoolAttrs};
use graph_ir::{DType, Op, OpCategory, TensorRole};
use graph_onnx::{import_file, ImportOptions, OnnxModel};

fn models_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("CUPLAN_MODELS_DIR")
        .map_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../models")), PathBuf::from);
    // The models are part of the repository: a missing one is a failure, not a skip.
    assert!(dir.join("resnet50.onnx").is_file(), "ONNX models not found in {}", dir.display());
    Some(dir)
}

fn load(name: &str) -> Option<OnnxModel> {
    let path = models_dir()?.join(format!("{name}.onnx"));
    Some(import_file(&path, &ImportOptions::default()).unwrap_or_else(|e| panic!("{name}: {e}")))
}

fn count(m: &OnnxModel, role: TensorRole) -> usize {
    m.graph.tensors().filter(|(_, t)| t.role == role).count()
}

fn ops_named<'a>(m: &'a OnnxModel, name: &'a str) -> impl Iterator<Item = &'a Op> + 'a {
    m.graph.nodes().map(|(_, n)| &n.op).filter(move |op| op.name() == name)
}

/// Node count, intermediates and the single image input / logits output of a CNN.
fn check_cnn(m: &OnnxModel, nodes: usize, intermediates: usize) {
    m.graph.validate().unwrap();
    assert_eq!(m.opset, 18);
    assert_eq!(m.stats.onnx_nodes, nodes);
    assert_eq!(m.stats.folded_nodes, 0);
    assert_eq!(m.graph.num_nodes(), nodes);
    assert_eq!(count(m, TensorRole::Intermediate), intermediates);
    let input = m.graph.tensor(m.graph.inputs()[0]);
    assert_eq!(
        (input.name.as_ref(), input.dtype, input.shape.0.to_vec()),
        ("pixels", DType::F32, vec![1, 3, 224, 224])
    );
    let output = m.graph.tensor(m.graph.outputs()[0]);
    assert_eq!((output.name.as_ref(), output.shape.0.to_vec()), ("logits", vec![1, 1000]));
    // The stripped weights are weights of known shape with no data to hand over.
    assert!(m.weights.is_empty());
    // Classifier head: ReduceMean over the spatial axes (axes input in opset 18), Reshape, Gemm with trans_b.
    assert_eq!(
        ops_named(m, "ReduceMean").collect::<Vec<_>>(),
        vec![&Op::ReduceMean { axes: Some(vec![-1, -2]), keepdims: true }]
    );
    assert_eq!(
        ops_named(m, "Gemm").collect::<Vec<_>>(),
        vec![&Op::Gemm { alpha: 1.0, beta: 1.0, trans_a: false, trans_b: true }]
    );
}

#[test]
fn resnet50() {
    let Some(m) = load("resnet50") else { return };
    check_cnn(&m, 122, 121);
    assert_eq!(ops_named(&m, "Conv").count(), 53);
    assert_eq!(ops_named(&m, "Relu").count(), 49);
    assert_eq!(ops_named(&m, "Add").count(), 16);
    let stem = &m.graph.node(m.graph.node_id("node_Conv_753").unwrap());
    assert_eq!(stem.op, Op::Conv(ConvAttrs { strides: vec![2, 2], pads: vec![3; 4], dilations: vec![1, 1], group: 1 }));
    let w = m.graph.tensor(m.graph.tensor_id("conv1.weight").unwrap());
    assert_eq!((w.role, w.shape.0.to_vec(), w.data.is_none()), (TensorRole::Weight, vec![64, 3, 7, 7], true));
    let pool = ops_named(&m, "MaxPool").next().unwrap();
    assert_eq!(
        pool,
        &Op::MaxPool(PoolAttrs {
            kernel_shape: vec![3, 3],
            strides: vec![2, 2],
            pads: vec![1; 4],
            dilations: vec![1, 1],
            ceil_mode: false,
            count_include_pad: false
        })
    );
    assert_eq!(ops_named(&m, "Reshape").next(), Some(&Op::Reshape { shape: vec![1, 2048], allowzero: true }));
}

#[test]
fn mobilenet_v2() {
    let Some(m) = load("mobilenet_v2") else { return };
    check_cnn(&m, 100, 99);
    let clips: Vec<&Op> = ops_named(&m, "Clip").collect();
    assert_eq!(clips.len(), 35);
    assert!(clips.iter().all(|op| **op == Op::Clip { min: Some(0.0), max: Some(6.0) }));
    let groups: Vec<usize> =
        ops_named(&m, "Conv").filter_map(|op| if let Op::Conv(a) = op { Some(a.group) } else { None }).collect();
    assert_eq!(groups.len(), 52);
    assert!(groups.contains(&960) && groups.contains(&1));
    // The Clip bounds are attributes: their scalar initializers never become tensors.
    assert!(m.graph.tensor_id("min_val_cast").is_none());
}

#[test]
fn googlenet() {
    let Some(m) = load("googlenet") else { return };
    check_cnn(&m, 139, 138);
    assert_eq!(ops_named(&m, "Concat").count(), 9);
    let pools: Vec<&Op> = ops_named(&m, "MaxPool").collect();
    assert_eq!(pools.len(), 13);
    assert!(pools.iter().any(|op| matches!(op, Op::MaxPool(a) if a.ceil_mode)));
    // ceil_mode pools keep the spatial extents torchvision expects: 112 -> 56 -> 28 -> 14 -> 7.
    let spatial: Vec<usize> = m
        .graph
        .nodes()
        .filter(|(_, n)| n.op.name() == "MaxPool")
        .map(|(_, n)| m.graph.tensor(n.outputs[0]).shape.0[2])
        .collect();
    for want in [56, 28, 14, 7] {
        assert!(spatial.contains(&want), "{spatial:?}");
    }
}

#[test]
fn bert_base() {
    let Some(m) = load("bert_base") else { return };
    m.graph.validate().unwrap();
    // GatherElements over two constant tables (the token type ids) folds to a constant; nothing else does.
    assert_eq!(m.stats.onnx_nodes, 419);
    assert_eq!(m.stats.folded_nodes, 1);
    assert_eq!(m.graph.num_nodes(), 418);
    // README: 417 intermediates; the folded one is now a constant.
    assert_eq!(count(&m, TensorRole::Intermediate), 417 - 1);
    let ids = m.graph.tensor(m.graph.tensor_id("gather").unwrap());
    assert_eq!((ids.role, ids.dtype, ids.shape.0.to_vec()), (TensorRole::Constant, DType::I64, vec![1, 128]));
    assert!(ids.data.as_deref().unwrap().iter().all(|&b| b == 0), "token type ids are all zero");
    let input = m.graph.tensor(m.graph.inputs()[0]);
    assert_eq!((input.name.as_ref(), input.dtype, input.shape.0.to_vec()), ("input_ids", DType::I64, vec![1, 128]));
    let outs: Vec<(String, Vec<usize>)> = m
        .graph
        .outputs()
        .iter()
        .map(|&t| (m.graph.tensor(t).name.to_string(), m.graph.tensor(t).shape.0.to_vec()))
        .collect();
    assert_eq!(outs, vec![("last_hidden_state".into(), vec![1, 128, 768]), ("pooler_output".into(), vec![1, 768])]);
    let lns: Vec<&Op> = ops_named(&m, "LayerNormalization").collect();
    assert_eq!(lns.len(), 25);
    assert!(lns.iter().all(|op| **op == Op::LayerNormalization { axis: -1, epsilon: 1e-12 }));
    assert_eq!(ops_named(&m, "MatMul").count(), 96);
    assert_eq!(ops_named(&m, "Softmax").count(), 12);
    assert_eq!(ops_named(&m, "Erf").count(), 12);
    assert!(ops_named(&m, "Transpose").any(|op| *op == Op::Transpose { perm: Some(vec![0, 2, 3, 1]) }));
    assert_eq!(ops_named(&m, "Reshape").count(), 48);
    // The attention mask: Where over a constant bool [1,1,128,128] stays a node (float result).
    assert_eq!(ops_named(&m, "Where").count(), 1);
    assert_eq!(m.graph.tensor(m.graph.tensor_id("expand_2").unwrap()).role, TensorRole::Constant);
    let cats = m.graph.category_counts();
    assert!(cats.contains(&(OpCategory::View, 48)), "{cats:?}");
}
