//! The memory map as SVG: time across (work steps, or the packing instance's time), address down (offset 0 at the
//! top), one rectangle per buffer with a hover `<title>`, coloured by a key with a legend, and the fixed-order
//! lower bound curve (reserved bytes live at each time) drawn over it, with the pool's end and the bound as
//! horizontal lines. A packing that meets the bound shows the curve touching the pool's end at the peak.
//!
//! Scales are linear; rectangles are at least one pixel wide and tall so the small tensors of a 1,000-tensor model
//! stay visible; axis ticks are round numbers of B/KiB/MiB/GiB and of steps. Each `<rect>` of the buffers carries
//! `data-start`, `data-end`, `data-offset` and `data-size` (its exact values) for tools and tests.

use anyhow::{bail, Result};
use graph_passes::memory::pack::Buffer;
use graph_plan::ExecutionPlan;
use std::collections::HashMap;
use std::fmt::Write;

use super::explain::kind_name;
use super::{human_bytes, pool_map, xml_escape};

/// One rectangle: a buffer live over `[start, end)` at `[offset, offset + size)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block {
    /// First time (inclusive).
    pub start: u64,
    /// One past the last time.
    pub end: u64,
    /// First byte.
    pub offset: u64,
    /// Bytes (reserved: aligned).
    pub size: u64,
    /// Index into the legend (its colour).
    pub key: usize,
    /// Hover text.
    pub title: String,
}

/// A memory picture before rendering.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Picture {
    /// First line of the heading.
    pub title: String,
    /// Second line (figures).
    pub subtitle: String,
    /// What the horizontal axis counts.
    pub x_label: String,
    /// First time shown.
    pub t0: u64,
    /// One past the last time shown.
    pub t1: u64,
    /// The pool's size (drawn as a line).
    pub height: u64,
    /// What the line at `height` is called (`pool`, `height`).
    pub height_label: String,
    /// The buffers.
    pub blocks: Vec<Block>,
    /// Legend labels, indexed by `Block::key`.
    pub legend: Vec<String>,
    /// Heading of the legend.
    pub legend_title: String,
}

/// Colours of the legend keys (Tableau 10 and two more); keys past the end share the last, grey one.
pub const PALETTE: [&str; 13] = [
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#86bcb6",
    "#d37295", "#a0cbe8", "#bab0ac",
];

/// Colour of legend key `k`.
pub fn color(k: usize) -> &'static str {
    PALETTE[k.min(PALETTE.len() - 1)]
}

const WIDTH: f64 = 1320.0;
const LEFT: f64 = 92.0;
const RIGHT: f64 = 310.0;
const TOP: f64 = 66.0;
const PLOT_H: f64 = 640.0;
const BOTTOM: f64 = 58.0;

/// A round step near `raw` (1, 2 or 5 times a power of ten).
fn nice(raw: f64) -> f64 {
    if raw.is_nan() || raw <= 0.0 || !raw.is_finite() {
        return 1.0;
    }
    let mag = 10f64.powf(raw.log10().floor());
    let r = raw / mag;
    let m = if r <= 1.0 {
        1.0
    } else if r <= 2.0 {
        2.0
    } else if r <= 5.0 {
        5.0
    } else {
        10.0
    };
    m * mag
}

/// Byte-axis ticks up to `max`: `(bytes, label)`, about `target` of them, in one binary unit.
pub fn byte_ticks(max: u64, target: u32) -> Vec<(f64, String)> {
    let units: [(f64, &str); 5] =
        [(1.0, "B"), (1024.0, "KiB"), (1048576.0, "MiB"), (1073741824.0, "GiB"), (1099511627776.0, "TiB")];
    let maxf = max.max(1) as f64;
    let (unit, name) = units.iter().rev().find(|(u, _)| maxf >= *u).copied().unwrap_or(units[0]);
    let mut step = nice(maxf / unit / target.max(1) as f64);
    if unit == 1.0 {
        step = step.max(1.0);
    }
    let decimals = if step >= 1.0 { 0 } else { (-step.log10().floor()) as usize };
    let mut ticks = Vec::new();
    let mut k = 0u32;
    loop {
        let v = k as f64 * step;
        if v * unit > maxf * (1.0 + 1e-9) || k > 1000 {
            break;
        }
        let label = if k == 0 { "0".to_string() } else { format!("{v:.decimals$} {name}") };
        ticks.push((v * unit, label));
        k += 1;
    }
    ticks
}

/// Time-axis ticks over `[t0, t1]`: round steps.
pub fn time_ticks(t0: u64, t1: u64, target: u32) -> Vec<u64> {
    let span = t1.saturating_sub(t0).max(1);
    let step = (nice(span as f64 / target.max(1) as f64).round() as u64).max(1);
    let first = t0.div_ceil(step).saturating_mul(step);
    let mut out = Vec::new();
    let mut t = first;
    while t <= t1 && out.len() < 1000 {
        out.push(t);
        t = match t.checked_add(step) {
            Some(n) => n,
            None => break,
        };
    }
    out
}

/// The step function of reserved bytes live over time: `(time, bytes live from then on)`, times increasing.
pub fn live_curve(blocks: &[Block]) -> Vec<(u64, u64)> {
    let mut ev: Vec<(u64, i128)> = Vec::with_capacity(blocks.len() * 2);
    for b in blocks {
        ev.push((b.start, b.size as i128));
        ev.push((b.end, -(b.size as i128)));
    }
    ev.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::new();
    let mut cur = 0i128;
    let mut i = 0;
    while i < ev.len() {
        let t = ev[i].0;
        while i < ev.len() && ev[i].0 == t {
            cur += ev[i].1;
            i += 1;
        }
        let v = cur.max(0) as u64;
        match out.last_mut() {
            Some(last) if last.1 == v => {}
            _ => out.push((t, v)),
        }
    }
    out
}

/// Render a picture as a standalone SVG document.
pub fn render(p: &Picture) -> String {
    let (t0, t1) = (p.t0, p.t1.max(p.t0.saturating_add(1)));
    let curve = live_curve(&p.blocks);
    let (peak_t, bound) = curve.iter().fold((t0, 0u64), |best, &(t, v)| if v > best.1 { (t, v) } else { best });
    let top_end = p.blocks.iter().map(|b| b.offset.saturating_add(b.size)).max().unwrap_or(0);
    let ymax = p.height.max(bound).max(top_end).max(1);
    let plot_w = WIDTH - LEFT - RIGHT;
    let height = TOP + PLOT_H + BOTTOM;
    let x = |t: u64| LEFT + (t.saturating_sub(t0)) as f64 / (t1 - t0) as f64 * plot_w;
    let y = |b: u64| TOP + b as f64 / ymax as f64 * PLOT_H;
    let mut s = String::with_capacity(512 + p.blocks.len() * 320);
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="Helvetica, Arial, sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r##"<rect x="0" y="0" width="{WIDTH}" height="{height}" fill="#ffffff"/>"##);
    let _ = writeln!(s, r#"<text x="{LEFT}" y="24" font-size="16" font-weight="bold">{}</text>"#, xml_escape(&p.title));
    let _ = writeln!(s, r##"<text x="{LEFT}" y="44" fill="#333333">{}</text>"##, xml_escape(&p.subtitle));
    // Plot frame and grid.
    let _ = writeln!(
        s,
        r##"<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{PLOT_H}" fill="#f6f6f6" stroke="#999999" stroke-width="1"/>"##
    );
    let _ = writeln!(s, r##"<g id="y-axis" fill="#333333" stroke="none">"##);
    for (b, label) in byte_ticks(ymax, 10) {
        let yy = TOP + b / ymax as f64 * PLOT_H;
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{yy:.2}" x2="{:.2}" y2="{yy:.2}" stroke="#e0e0e0" stroke-width="1"/><text x="{:.2}" y="{:.2}" text-anchor="end">{}</text>"##,
            LEFT + plot_w,
            LEFT - 6.0,
            yy + 4.0,
            xml_escape(&label)
        );
    }
    let _ = writeln!(
        s,
        r#"<text transform="translate(18,{:.2}) rotate(-90)" text-anchor="middle">pool offset (address grows down)</text>"#,
        TOP + PLOT_H / 2.0
    );
    let _ = writeln!(s, "</g>");
    let _ = writeln!(s, r##"<g id="x-axis" fill="#333333">"##);
    for t in time_ticks(t0, t1, 12) {
        let xx = x(t);
        let _ = writeln!(
            s,
            r##"<line x1="{xx:.2}" y1="{}" x2="{xx:.2}" y2="{:.2}" stroke="#999999" stroke-width="1"/><text x="{xx:.2}" y="{:.2}" text-anchor="middle">{t}</text>"##,
            TOP + PLOT_H,
            TOP + PLOT_H + 5.0,
            TOP + PLOT_H + 19.0
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{:.2}" y="{:.2}" text-anchor="middle">{}</text>"#,
        LEFT + plot_w / 2.0,
        TOP + PLOT_H + 42.0,
        xml_escape(&p.x_label)
    );
    let _ = writeln!(s, "</g>");
    // The buffers.
    // Outlines separate neighbours of one colour; where steps are under 3 px wide they would darken everything.
    let px_per_step = plot_w / (t1 - t0) as f64;
    let outline = (0.1 * px_per_step).min(0.3);
    let _ = writeln!(s, r##"<g id="buffers" stroke="#222222" stroke-opacity="0.45" stroke-width="{outline:.2}">"##);
    for b in &p.blocks {
        let x0 = x(b.start);
        let w = (x(b.end) - x0).max(1.0);
        let y0 = y(b.offset);
        let h = (y(b.offset.saturating_add(b.size)) - y0).max(1.0);
        let _ = writeln!(
            s,
            r#"<rect x="{x0:.2}" y="{y0:.2}" width="{w:.2}" height="{h:.2}" fill="{}" data-start="{}" data-end="{}" data-offset="{}" data-size="{}"><title>{}</title></rect>"#,
            color(b.key),
            b.start,
            b.end,
            b.offset,
            b.size,
            xml_escape(&b.title)
        );
    }
    let _ = writeln!(s, "</g>");
    // The pool's end and the bound.
    let label_x = LEFT + plot_w + 6.0;
    let same = p.height == bound;
    let _ = writeln!(
        s,
        r##"<g id="limits"><line x1="{LEFT}" y1="{:.2}" x2="{:.2}" y2="{:.2}" stroke="#222222" stroke-width="1.5"/><text x="{label_x:.2}" y="{:.2}" fill="#222222">{} {}</text>"##,
        y(p.height),
        LEFT + plot_w,
        y(p.height),
        y(p.height) + 4.0,
        if same { format!("{} = bound", p.height_label) } else { p.height_label.clone() },
        xml_escape(&human_bytes(p.height))
    );
    if !same {
        // Labels 14 px apart at least, so a near miss stays readable.
        let mut ly = y(bound) + 4.0;
        if (ly - (y(p.height) + 4.0)).abs() < 14.0 {
            ly = y(p.height) + 4.0 - 14.0;
        }
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{:.2}" x2="{:.2}" y2="{:.2}" stroke="#c0392b" stroke-width="1" stroke-dasharray="5,4"/><text x="{label_x:.2}" y="{ly:.2}" fill="#c0392b">bound {}</text>"##,
            y(bound),
            LEFT + plot_w,
            y(bound),
            xml_escape(&human_bytes(bound))
        );
    }
    let _ = writeln!(s, "</g>");
    // The bound curve.
    let mut d = format!("M{:.2},{:.2}", x(t0), y(0));
    for &(t, v) in &curve {
        let _ = write!(d, " H{:.2} V{:.2}", x(t.max(t0)), y(v));
    }
    let _ = write!(d, " H{:.2}", x(t1));
    // Thinner where steps are narrow, so the rectangles under a dense curve stay visible.
    let curve_w = (0.8 * px_per_step).clamp(0.6, 1.6);
    let _ = writeln!(
        s,
        r##"<path id="bound-curve" d="{d}" fill="none" stroke="#c0392b" stroke-width="{curve_w:.2}"><title>reserved bytes live at each step: the fixed-order lower bound curve (peak {} at step {peak_t})</title></path>"##,
        xml_escape(&human_bytes(bound))
    );
    let _ = writeln!(
        s,
        r##"<circle cx="{:.2}" cy="{:.2}" r="3.5" fill="#c0392b"><title>peak: {} live at step {peak_t}</title></circle>"##,
        x(peak_t),
        y(bound),
        xml_escape(&human_bytes(bound))
    );
    // Legend.
    let lx = LEFT + plot_w + 118.0;
    let _ = writeln!(
        s,
        r#"<g id="legend"><text x="{lx:.2}" y="{:.2}" font-weight="bold">{}</text>"#,
        TOP + 4.0,
        xml_escape(&p.legend_title)
    );
    for (k, label) in p.legend.iter().enumerate() {
        let ly = TOP + 16.0 + k as f64 * 18.0;
        let _ = writeln!(
            s,
            r##"<rect x="{lx:.2}" y="{ly:.2}" width="12" height="12" fill="{}" stroke="#222222" stroke-width="0.3"/><text x="{:.2}" y="{:.2}">{}</text>"##,
            color(k),
            lx + 18.0,
            ly + 10.0,
            xml_escape(&super::ellipsize(label, 28))
        );
    }
    let ly = TOP + 16.0 + p.legend.len() as f64 * 18.0 + 8.0;
    let _ = writeln!(
        s,
        r##"<line x1="{lx:.2}" y1="{:.2}" x2="{:.2}" y2="{:.2}" stroke="#c0392b" stroke-width="1.6"/><text x="{:.2}" y="{:.2}">live bytes (bound)</text></g>"##,
        ly + 6.0,
        lx + 12.0,
        ly + 6.0,
        lx + 18.0,
        ly + 10.0
    );
    if p.blocks.is_empty() {
        let _ = writeln!(
            s,
            r##"<text x="{:.2}" y="{:.2}" text-anchor="middle" fill="#666666">no buffers</text>"##,
            LEFT + plot_w / 2.0,
            TOP + PLOT_H / 2.0
        );
    }
    s.push_str("</svg>\n");
    s
}

/// Legend keys for labels, most frequent first (ties by name); labels beyond the palette share "other".
fn keys_by_frequency(labels: &[String]) -> (Vec<String>, HashMap<String, usize>) {
    let mut count: HashMap<&str, usize> = HashMap::new();
    for l in labels {
        *count.entry(l.as_str()).or_default() += 1;
    }
    let mut order: Vec<(&str, usize)> = count.into_iter().collect();
    order.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let named = if order.len() > PALETTE.len() { PALETTE.len() - 1 } else { order.len() };
    let mut key = HashMap::new();
    let mut legend = Vec::new();
    for (i, (l, n)) in order.iter().enumerate() {
        if i < named {
            key.insert(l.to_string(), i);
            legend.push(format!("{l} ({n})"));
        } else {
            key.insert(l.to_string(), named);
        }
    }
    if named < order.len() {
        let rest: usize = order[named..].iter().map(|(_, n)| n).sum();
        legend.push(format!("other ({rest})"));
    }
    (legend, key)
}

/// The activation pool of `plan` as SVG. Pool tensors and live ranges come from the plan itself
/// ([`super::pool_map`]); rectangles are coloured by the op that writes the tensor.
pub fn memory_svg(plan: &ExecutionPlan) -> String {
    let m = pool_map(plan);
    let ops: Vec<String> = m.tensors.iter().map(|t| t.op.clone()).collect();
    let (legend, key) = keys_by_frequency(&ops);
    let blocks: Vec<Block> = m
        .tensors
        .iter()
        .map(|t| {
            let writer = match (t.writer, t.kind) {
                (Some(k), Some(kind)) => format!("{k} ({}, {} kernel)", t.op, kind_name(kind)),
                _ => t.op.clone(),
            };
            Block {
                start: t.start as u64,
                end: t.end as u64,
                offset: t.offset,
                size: t.reserved,
                key: key.get(&t.op).copied().unwrap_or(0),
                title: format!(
                    "{}\n{} ({} B; {} B reserved) at pool [{}, {})\nlive over steps [{}, {}), written by {}",
                    t.name,
                    human_bytes(t.bytes),
                    t.bytes,
                    t.reserved,
                    t.offset,
                    t.offset + t.reserved,
                    t.start,
                    t.end,
                    writer
                ),
            }
        })
        .collect();
    let bound = m.lower_bound();
    let st = plan.stats();
    let ratio = if bound > 0 { plan.pool_bytes as f64 / bound as f64 } else { 1.0 };
    let p = Picture {
        title: format!("plan '{}': activation pool", m.graph),
        subtitle: format!(
            "pool {} · lower bound {} (ratio {ratio:.3}) · naive {} · {} tensors · {} steps · {} stream{}",
            human_bytes(plan.pool_bytes as u64),
            human_bytes(bound),
            human_bytes(st.naive_bytes),
            m.tensors.len(),
            m.work_steps,
            plan.num_streams,
            if plan.num_streams == 1 { "" } else { "s" }
        ),
        x_label: "step (launches and Memcpy copies in submission order)".into(),
        t0: 0,
        t1: m.work_steps as u64,
        height: plan.pool_bytes as u64,
        height_label: "pool".into(),
        blocks,
        legend,
        legend_title: "written by".into(),
    };
    render(&p)
}

/// Size classes of the pack picture's legend: upper limits (exclusive) and labels.
const SIZE_CLASSES: [(u64, &str); 6] = [
    (1 << 10, "< 1 KiB"),
    (16 << 10, "1-16 KiB"),
    (256 << 10, "16-256 KiB"),
    (4 << 20, "256 KiB-4 MiB"),
    (64 << 20, "4-64 MiB"),
    (u64::MAX, ">= 64 MiB"),
];

/// A plain packing instance as SVG: `buffers[i]` at `offsets[i]`, sizes rounded up to `alignment`, coloured by
/// size class. Fails when the two lists differ in length or a buffer's interval is empty.
pub fn pack_svg(buffers: &[Buffer], offsets: &[u64], alignment: u64, title: &str) -> Result<String> {
    if buffers.len() != offsets.len() {
        bail!("{} buffers but {} offsets", buffers.len(), offsets.len());
    }
    let a = alignment.max(1);
    let mut used = [0usize; SIZE_CLASSES.len()];
    let mut blocks = Vec::with_capacity(buffers.len());
    for (i, (b, &off)) in buffers.iter().zip(offsets).enumerate() {
        if b.lower >= b.upper {
            bail!("buffer {i}: interval [{}, {}) is empty", b.lower, b.upper);
        }
        let size = b.size.div_ceil(a).saturating_mul(a);
        let class = SIZE_CLASSES.iter().position(|(lim, _)| b.size < *lim).unwrap_or(SIZE_CLASSES.len() - 1);
        used[class] += 1;
        blocks.push(Block {
            start: b.lower,
            end: b.upper,
            offset: off,
            size,
            key: class,
            title: format!(
                "buffer {i}: {} ({} B; {size} B aligned) at [{off}, {})\nlive over [{}, {})",
                human_bytes(b.size),
                b.size,
                off.saturating_add(size),
                b.lower,
                b.upper
            ),
        });
    }
    // Only the classes that occur get a legend entry; renumber keys densely.
    let mut dense = [0usize; SIZE_CLASSES.len()];
    let mut legend = Vec::new();
    for (c, &(_, label)) in SIZE_CLASSES.iter().enumerate() {
        if used[c] > 0 {
            dense[c] = legend.len();
            legend.push(format!("{label} ({})", used[c]));
        }
    }
    for b in &mut blocks {
        b.key = dense[b.key];
    }
    let height = blocks.iter().map(|b| b.offset.saturating_add(b.size)).max().unwrap_or(0);
    let bound = live_curve(&blocks).iter().map(|&(_, v)| v).max().unwrap_or(0);
    let t0 = buffers.iter().map(|b| b.lower).min().unwrap_or(0);
    let t1 = buffers.iter().map(|b| b.upper).max().unwrap_or(1);
    let ratio = if bound > 0 { height as f64 / bound as f64 } else { 1.0 };
    let p = Picture {
        title: title.to_string(),
        subtitle: format!(
            "height {} · lower bound {} (ratio {ratio:.3}) · {} buffers · alignment {a} B · time [{t0}, {t1})",
            human_bytes(height),
            human_bytes(bound),
            buffers.len()
        ),
        x_label: "time".into(),
        t0,
        t1,
        height,
        height_label: "height".into(),
        blocks,
        legend,
        legend_title: "buffer size".into(),
    };
    Ok(render(&p))
}

#[cfg(test)]
mod tests {
    use super::*;
    use graph_passes::memory::pack::{pack, PackOptions};
    use proptest::prelude::*;
    use quick_xml::events::Event;
    use quick_xml::Reader;

    /// Parse `svg` fully; return each buffer rect's data attributes and whether it has a title.
    fn rects(svg: &str) -> Vec<([u64; 4], bool)> {
        let mut r = Reader::from_str(svg);
        let mut out = Vec::new();
        let mut in_rect: Option<[u64; 4]> = None;
        let mut titled = false;
        loop {
            match r.read_event().unwrap() {
                Event::Start(e) if e.name().as_ref() == b"rect" => {
                    let get = |k: &[u8]| {
                        e.try_get_attribute(k)
                            .unwrap()
                            .map(|a| String::from_utf8_lossy(&a.value).parse::<u64>().unwrap())
                    };
                    if let (Some(s), Some(en), Some(o), Some(z)) =
                        (get(b"data-start"), get(b"data-end"), get(b"data-offset"), get(b"data-size"))
                    {
                        in_rect = Some([s, en, o, z]);
                        titled = false;
                    }
                }
                Event::Start(e) if e.name().as_ref() == b"title" => titled = true,
                Event::End(e) if e.name().as_ref() == b"rect" => {
                    if let Some(v) = in_rect.take() {
                        out.push((v, titled));
                    }
                }
                Event::Eof => break,
                _ => {}
            }
        }
        out
    }

    #[test]
    fn ticks_are_round() {
        let t = byte_ticks(5_177_344, 10);
        assert_eq!(t[0].1, "0");
        assert_eq!(t[1].1, "0.5 MiB");
        assert_eq!(t.last().unwrap().1, "4.5 MiB");
        assert_eq!(byte_ticks(3000, 5).iter().map(|t| t.1.as_str()).collect::<Vec<_>>(), ["0", "1 KiB", "2 KiB"]);
        assert_eq!(byte_ticks(3000, 10).len(), 6); // 0 .. 2.5 KiB by 0.5
        assert_eq!(
            byte_ticks(7, 10).iter().map(|t| t.1.as_str()).collect::<Vec<_>>(),
            ["0", "1 B", "2 B", "3 B", "4 B", "5 B", "6 B", "7 B"]
        );
        assert_eq!(time_ticks(0, 310, 12), (0..=300).step_by(50).collect::<Vec<_>>());
        assert_eq!(time_ticks(3, 7, 12), vec![3, 4, 5, 6, 7]);
    }

    #[test]
    fn curve_is_the_live_sum() {
        let b = |start, end, size| Block { start, end, offset: 0, size, key: 0, title: String::new() };
        let c = live_curve(&[b(0, 2, 10), b(1, 3, 5), b(2, 4, 7)]);
        assert_eq!(c, vec![(0, 10), (1, 15), (2, 12), (3, 7), (4, 0)]);
    }

    #[test]
    fn pack_svg_rejects_mismatch() {
        let b = [Buffer { lower: 0, upper: 1, size: 8 }];
        assert!(pack_svg(&b, &[], 1, "x").unwrap_err().to_string().contains("1 buffers but 0 offsets"));
        let e = [Buffer { lower: 3, upper: 3, size: 8 }];
        assert!(pack_svg(&e, &[0], 1, "x").unwrap_err().to_string().contains("buffer 0: interval [3, 3) is empty"));
    }

    #[test]
    fn titles_are_escaped() {
        let b = [Buffer { lower: 0, upper: 2, size: 100 }];
        let svg = pack_svg(&b, &[0], 256, "a <b> & 'c'").unwrap();
        assert!(svg.contains("a &lt;b&gt; &amp; &apos;c&apos;"));
        assert_eq!(rects(&svg), vec![([0, 2, 0, 256], true)]);
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
        #[test]
        fn pack_svg_is_well_formed_with_one_titled_rect_per_buffer(
            raw in prop::collection::vec((0u64..50, 1u64..20, 1u64..100_000), 0..60),
            align in prop::sample::select(vec![1u64, 64, 256]),
        ) {
            let buffers: Vec<Buffer> = raw.iter().map(|&(l, d, s)| Buffer { lower: l, upper: l + d, size: s }).collect();
            let p = pack(&buffers, &PackOptions { alignment: align, ..Default::default() }).unwrap();
            let svg = pack_svg(&buffers, &p.offsets, align, "instance").unwrap();
            let rs = rects(&svg);
            prop_assert_eq!(rs.len(), buffers.len());
            for (i, (v, titled)) in rs.iter().enumerate() {
                prop_assert!(titled);
                prop_assert_eq!(v[0], buffers[i].lower);
                prop_assert_eq!(v[2], p.offsets[i]);
            }
            let blocks: Vec<Block> = rs.iter().map(|(v, _)| Block { start: v[0], end: v[1], offset: v[2], size: v[3], key: 0, title: String::new() }).collect();
            let peak = live_curve(&blocks).iter().map(|c| c.1).max().unwrap_or(0);
            prop_assert_eq!(peak, p.lower_bound);
        }
    }
}
