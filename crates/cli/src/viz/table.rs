//! A small table renderer: fixed-width text for terminals (numbers right-aligned, one flexible column shortened
//! with an ellipsis so the whole fits a width) and GitHub markdown.

use super::ellipsize;

/// How a column aligns its cells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Align {
    /// Text.
    Left,
    /// Numbers.
    Right,
}

/// A column: header, alignment, and whether it absorbs the room left over (at most one should).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Column {
    /// Header text.
    pub header: String,
    /// Alignment.
    pub align: Align,
    /// The column that is shortened (or given the room) so the table fits.
    pub flexible: bool,
}

impl Column {
    /// A left-aligned column.
    pub fn left(header: &str) -> Self {
        Column { header: header.to_string(), align: Align::Left, flexible: false }
    }

    /// A right-aligned column.
    pub fn right(header: &str) -> Self {
        Column { header: header.to_string(), align: Align::Right, flexible: false }
    }

    /// A left-aligned column that takes the leftover width.
    pub fn flexible(header: &str) -> Self {
        Column { header: header.to_string(), align: Align::Left, flexible: true }
    }
}

/// Width of `s` in terminal columns (one per char: names are not expected to hold wide characters).
fn width(s: &str) -> usize {
    s.chars().count()
}

/// The width the flexible column gets so the table fits `max_width` (at least 8), or its natural width.
pub fn flexible_width(columns: &[Column], rows: &[Vec<String>], max_width: usize) -> usize {
    let natural =
        |i: usize| rows.iter().map(|r| r.get(i).map_or(0, |c| width(c))).chain([width(&columns[i].header)]).max();
    let fixed: usize = (0..columns.len()).filter(|&i| !columns[i].flexible).map(|i| natural(i).unwrap_or(0)).sum();
    let gaps = columns.len().saturating_sub(1) * 2;
    let flex = columns.iter().position(|c| c.flexible);
    let room = max_width.saturating_sub(fixed + gaps).max(8);
    flex.and_then(natural).map_or(0, |n| n.min(room))
}

/// Render as fixed-width text: a header line, a rule, one line per row; columns two spaces apart; no trailing
/// spaces. Cells of the flexible column longer than its width are ellipsized (callers that abbreviate better
/// should do so first, using [`flexible_width`]).
pub fn render_text(columns: &[Column], rows: &[Vec<String>], max_width: usize) -> String {
    let flex_w = flexible_width(columns, rows, max_width);
    let widths: Vec<usize> = (0..columns.len())
        .map(|i| {
            if columns[i].flexible {
                flex_w
            } else {
                rows.iter()
                    .map(|r| r.get(i).map_or(0, |c| width(c)))
                    .chain([width(&columns[i].header)])
                    .max()
                    .unwrap_or(0)
            }
        })
        .collect();
    let mut out = String::new();
    let line = |cells: &[String], out: &mut String| {
        let mut s = String::new();
        for (i, c) in columns.iter().enumerate() {
            let cell = cells.get(i).map_or("", String::as_str);
            let cell = if c.flexible { ellipsize(cell, widths[i]) } else { cell.to_string() };
            let pad = widths[i].saturating_sub(width(&cell));
            if i > 0 {
                s.push_str("  ");
            }
            match c.align {
                Align::Left => {
                    s.push_str(&cell);
                    s.push_str(&" ".repeat(pad));
                }
                Align::Right => {
                    s.push_str(&" ".repeat(pad));
                    s.push_str(&cell);
                }
            }
        }
        out.push_str(s.trim_end());
        out.push('\n');
    };
    let headers: Vec<String> = columns.iter().map(|c| c.header.clone()).collect();
    line(&headers, &mut out);
    let rule: Vec<String> = widths.iter().map(|&w| "-".repeat(w)).collect();
    line(&rule, &mut out);
    for r in rows {
        line(r, &mut out);
    }
    out
}

/// A markdown table cell: pipes escaped, line breaks flattened.
pub fn md_cell(s: &str) -> String {
    s.replace('\\', "\\\\").replace('|', "\\|").replace(['\n', '\r'], " ")
}

/// Render as a GitHub markdown table (numbers right-aligned).
pub fn render_markdown(columns: &[Column], rows: &[Vec<String>]) -> String {
    let mut out = String::new();
    let headers: Vec<String> = columns.iter().map(|c| md_cell(&c.header)).collect();
    out.push_str(&format!("| {} |\n", headers.join(" | ")));
    let rules: Vec<&str> = columns.iter().map(|c| if c.align == Align::Right { "---:" } else { "---" }).collect();
    out.push_str(&format!("|{}|\n", rules.iter().map(|r| format!(" {r} ")).collect::<Vec<_>>().join("|")));
    for r in rows {
        let cells: Vec<String> = (0..columns.len()).map(|i| md_cell(r.get(i).map_or("", String::as_str))).collect();
        out.push_str(&format!("| {} |\n", cells.join(" | ")));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cols() -> Vec<Column> {
        vec![Column::right("n"), Column::flexible("name"), Column::right("bytes")]
    }

    #[test]
    fn text_fits_and_aligns() {
        let rows = vec![
            vec!["1".to_string(), "short".to_string(), "2.00 KiB".to_string()],
            vec!["10".to_string(), "a-very-long-name-that-will-not-fit".to_string(), "12 B".to_string()],
        ];
        let t = render_text(&cols(), &rows, 30);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], " n  name                 bytes");
        assert_eq!(lines[1], "--  ----------------  --------");
        assert_eq!(lines[2], " 1  short             2.00 KiB");
        assert_eq!(lines[3], "10  a-very-long-nam…      12 B");
        assert!(lines.iter().all(|l| l.chars().count() <= 30));
    }

    #[test]
    fn markdown_escapes_pipes() {
        let rows = vec![vec!["1".into(), "a|b".into(), "3".into()]];
        let m = render_markdown(&cols(), &rows);
        assert_eq!(m, "| n | name | bytes |\n| ---: | --- | ---: |\n| 1 | a\\|b | 3 |\n");
    }
}
