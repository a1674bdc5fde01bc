//! The report's SVG plots (plotters' SVG backend; text is left to the viewer's fonts).

use anyhow::Result;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::path::Path;

const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

fn color(i: usize) -> RGBColor {
    COLORS[i % COLORS.len()]
}

/// One named line of points.
#[derive(Clone, Debug)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// `(x, y)` points, both positive.
    pub points: Vec<(f64, f64)>,
}

fn span(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    let (lo, hi) = values
        .filter(|v| v.is_finite() && *v > 0.0)
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)));
    (lo <= hi).then_some((lo, hi))
}

fn num_label(v: f64) -> String {
    let a = v.abs();
    if a >= 1e6 {
        format!("{}M", v / 1e6)
    } else if a >= 1e3 {
        format!("{}k", v / 1e3)
    } else if a >= 1.0 || a == 0.0 {
        format!("{v}")
    } else {
        let t = format!("{v:.3}");
        t.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// A log-log plot of `series`, with a dashed line of slope `reference_slope` through the middle of the
/// first series (to read the others' growth against).
pub fn loglog(
    path: &Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[Series],
    reference_slope: Option<f64>,
) -> Result<()> {
    let all = || series.iter().flat_map(|s| s.points.iter().copied());
    let (Some((x0, x1)), Some((y0, y1))) = (span(all().map(|p| p.0)), span(all().map(|p| p.1))) else {
        return Ok(());
    };
    let root = SVGBackend::new(path, (960, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(70)
        .build_cartesian_2d((x0 / 1.5..x1 * 1.5).log_scale(), (y0 / 2.0..y1 * 2.0).log_scale())?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_label_formatter(&|v| num_label(*v))
        .y_label_formatter(&|v| num_label(*v))
        .draw()?;
    for (i, s) in series.iter().enumerate() {
        let c = color(i);
        chart
            .draw_series(LineSeries::new(s.points.iter().copied(), c.stroke_width(2)))?
            .label(s.name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
        chart.draw_series(s.points.iter().map(|&p| Circle::new(p, 3, c.filled())))?;
    }
    if let (Some(k), Some(first)) = (reference_slope, series.iter().find(|s| !s.points.is_empty())) {
        // Through the geometric mean of the first series' points.
        let n = first.points.len() as f64;
        let (lx, ly) = first.points.iter().fold((0.0, 0.0), |(a, b), p| (a + p.0.ln() / n, b + p.1.ln() / n));
        let at = |x: f64| (ly + k * (x.ln() - lx)).exp();
        let dashes: Vec<(f64, f64)> =
            (0..=40).map(|i| x0 * (x1 / x0).powf(i as f64 / 40.0)).map(|x| (x, at(x))).collect();
        let grey = RGBColor(90, 90, 90);
        chart
            .draw_series(dashes.chunks(2).map(|seg| PathElement::new(seg.to_vec(), grey.stroke_width(1))))?
            .label(format!("slope {k} (linear) through {}", first.name))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 8, y), (x + 12, y), (x + 20, y)], grey));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

/// How bars of several groups share a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Side by side.
    Grouped,
    /// End to end (shares that add up).
    Stacked,
}

/// Horizontal bars: one row per label, one bar (or segment) per group. With `log_x` the x axis is
/// logarithmic (values must be >= 1). `reference` draws a vertical line at that x (e.g. 1.0 for ratios).
pub struct Bars<'a> {
    /// Chart title.
    pub title: &'a str,
    /// X axis text.
    pub x_desc: &'a str,
    /// Row labels, top to bottom.
    pub rows: &'a [String],
    /// `(legend, value per row)`.
    pub groups: &'a [(String, Vec<f64>)],
    /// Grouped or stacked.
    pub layout: Layout,
    /// Logarithmic x axis.
    pub log_x: bool,
    /// A vertical reference line.
    pub reference: Option<f64>,
}

impl Bars<'_> {
    /// Draw to `path`.
    pub fn draw(&self, path: &Path) -> Result<()> {
        let n = self.rows.len();
        if n == 0 || self.groups.is_empty() {
            return Ok(());
        }
        let tx = |v: f64| if self.log_x { v.max(1.0).log10() } else { v };
        let max = match self.layout {
            Layout::Grouped => self.groups.iter().flat_map(|g| g.1.iter().copied()).map(tx).fold(0.0, f64::max),
            Layout::Stacked => (0..n)
                .map(|r| self.groups.iter().map(|g| g.1.get(r).copied().unwrap_or(0.0)).sum::<f64>())
                .fold(0.0, f64::max),
        };
        let max = max.max(self.reference.map_or(0.0, tx)) * 1.08;
        let x_max = if self.log_x { max.ceil().max(1.0) } else { max.max(1e-9) };
        let height = (120 + n * 28 * if self.layout == Layout::Grouped { self.groups.len().min(4) } else { 1 })
            .clamp(260, 1400) as u32;
        let root = SVGBackend::new(path, (960, height)).into_drawing_area();
        root.fill(&WHITE)?;
        let label_w = self.rows.iter().map(|r| r.chars().count()).max().unwrap_or(4) as u32 * 8 + 16;
        let log_x = self.log_x;
        let mut chart = ChartBuilder::on(&root)
            .caption(self.title, ("sans-serif", 20))
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(label_w.min(320))
            .build_cartesian_2d(0.0..x_max, -0.5..n as f64 - 0.5)?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(0)
            .x_desc(self.x_desc)
            .x_label_formatter(&|v| if log_x { num_label(10f64.powf(*v).round()) } else { num_label(*v) })
            .draw()?;
        // Row labels, drawn beside the axis at each row's centre (row 0 at the top).
        let style = TextStyle::from(("sans-serif", 13).into_font()).pos(Pos::new(HPos::Right, VPos::Center));
        for (r, label) in self.rows.iter().enumerate() {
            let (px, py) = chart.backend_coord(&(0.0, (n - 1 - r) as f64));
            root.draw(&Text::new(label.clone(), (px - 6, py), style.clone()))?;
        }
        let k = self.groups.len() as f64;
        for (gi, (name, values)) in self.groups.iter().enumerate() {
            let c = color(gi);
            let bars = values.iter().enumerate().take(n).map(|(r, &v)| {
                let y = (n - 1 - r) as f64;
                let (x_lo, x_hi, y_lo, y_hi) = match self.layout {
                    Layout::Grouped => {
                        let band = 0.8 / k;
                        let top = y + 0.4 - gi as f64 * band;
                        (0.0, tx(v), top - band * 0.9, top)
                    }
                    Layout::Stacked => {
                        let before: f64 = self.groups[..gi].iter().map(|g| g.1.get(r).copied().unwrap_or(0.0)).sum();
                        (before, before + v, y - 0.35, y + 0.35)
                    }
                };
                Rectangle::new([(x_lo, y_lo), (x_hi, y_hi)], c.filled())
            });
            chart
                .draw_series(bars)?
                .label(name.clone())
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], c.filled()));
        }
        if let Some(r) = self.reference {
            let x = tx(r);
            chart.draw_series(std::iter::once(PathElement::new(
                vec![(x, -0.5), (x, n as f64 - 0.5)],
                BLACK.stroke_width(1),
            )))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()?;
        root.present()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_labels_are_short() {
        assert_eq!(num_label(0.2), "0.2");
        assert_eq!(num_label(0.125), "0.125");
        assert_eq!(num_label(0.0), "0");
        assert_eq!(num_label(3.0), "3");
        assert_eq!(num_label(1500.0), "1.5k");
        assert_eq!(num_label(1e6), "1M");
    }

    #[test]
    fn plots_are_written_as_svg() {
        let dir = std::env::temp_dir().join(format!("cuplan-plot-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let s = [Series { name: "a".into(), points: vec![(1e3, 1.0), (1e4, 10.0), (1e5, 100.0)] }];
        loglog(&dir.join("l.svg"), "t", "x", "y", &s, Some(1.0)).unwrap();
        let rows = vec!["r0".to_string(), "r1".to_string()];
        let groups = vec![("g".to_string(), vec![1.0, 2.0]), ("h".to_string(), vec![3.0, 4.0])];
        for (layout, log_x) in [(Layout::Grouped, false), (Layout::Stacked, false), (Layout::Grouped, true)] {
            let b = Bars { title: "t", x_desc: "x", rows: &rows, groups: &groups, layout, log_x, reference: Some(1.0) };
            b.draw(&dir.join("b.svg")).unwrap();
            let svg = std::fs::read_to_string(dir.join("b.svg")).unwrap();
            assert!(svg.starts_with("<svg") && svg.contains("\nr1\n</text>"), "{layout:?} {log_x}");
        }
        let svg = std::fs::read_to_string(dir.join("l.svg")).unwrap();
        assert!(svg.contains("slope 1 (linear) through a"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
