#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The example in docs/graph-format.md loads, validates and round-trips.

#[test]
fn documented_example_loads() {
    let doc = include_str!("../../../docs/graph-format.md");
    let start = doc.rfind("```json\n{\n  \"format\"").expect("example block") + "```json\n".len();
    let end = start + doc[start..].find("```").unwrap();
    let g = graph_ir::json::from_json(&doc[start..end]).unwrap();
    assert_eq!(g.name(), "tiny_mlp");
    assert_eq!(g.num_nodes(), 6);
    let p = g.tensor(g.outputs()[0]);
    assert_eq!((&*p.name, p.shape.dims()), ("p", &[4usize, 8][..]));
    let again = graph_ir::json::from_json(&g.to_json()).unwrap();
    assert_eq!(again.to_json(), g.to_json());
}
