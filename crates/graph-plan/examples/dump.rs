//! Print the plan of a small synthetic graph (a quick look at the listing).
#![allow(clippy::unwrap_used)]
fn main() {
    let g = graph_ir::synth::random_dag(12, 3, 1).unwrap();
    let p = graph_plan::ExecutionPlan::build(&g, 2).unwrap();
    println!("{p}");
}
