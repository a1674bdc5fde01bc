#![allow(clippy::unwrap_used, clippy::print_stdout)]
use graph_passes::stream::{group_costs, group_predecessors, StreamOptions};
use graph_passes::timing;
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = &args[1];
    let k: usize = args[2].parse().unwrap();
    let g = if path.ends_with(".onnx") {
        graph_onnx::import_file(path, &graph_onnx::ImportOptions::default()).unwrap().graph
    } else {
        graph_ir::json::from_json(&std::fs::read_to_string(path).unwrap()).unwrap()
    };
    let opts = graph_plan::PlanOptions::with_streams(k);
    let r = graph_plan::run_pipeline(&g, &opts, None).unwrap();
    let fusion = r.fusion.as_ref().unwrap();
    let mem = r.memory.as_ref().unwrap();
    let sp = r.stream.as_ref().unwrap();
    let sopts = StreamOptions::new(k, opts.device.clone());
    let (time, occ) = group_costs(&g, fusion, &sopts);
    let preds = group_predecessors(&g, fusion, mem);
    let dpreds = graph_passes::stream::group_data_predecessors(&g, fusion);
    let n = time.len();
    let mut top = vec![0f64; n];
    for i in 0..n {
        top[i] = preds[i].iter().map(|p| top[p.index()] + time[p.index()]).fold(0.0, f64::max);
    }
    let tasks = sp.ordered_tasks(&time, &occ);
    let tl = timing::simulate(&tasks, 0.0).unwrap();
    let order = sp.submission_order();
    println!("makespan {:.1}", tl.makespan_us);
    for (i, gid) in order.iter().enumerate() {
        let gi = gid.index();
        let reuse: Vec<usize> = preds[gi].iter().filter(|p| !dpreds[gi].contains(p)).map(|p| p.index()).collect();
        println!(
            "g{gi:4} s{} t={:7.3} occ={:.3} asap={:8.2} start={:8.2} end={:8.2} delay={:6.2} preds={:?} reuse={:?} {}",
            sp.stream_of[gi].0,
            time[gi],
            occ[gi],
            top[gi],
            tl.start_us[i],
            tl.end_us[i],
            tl.start_us[i] - top[gi],
            dpreds[gi].iter().map(|p| p.index()).collect::<Vec<_>>(),
            reuse,
            fusion.groups[gi].nodes.first().map(|&nd| g.node(nd).name.clone()).unwrap_or_default()
        );
    }
}
