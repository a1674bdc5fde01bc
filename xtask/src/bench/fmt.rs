//! Text helpers of the report: Markdown tables and the few number formats it uses.

/// Column alignment in a Markdown table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Align {
    /// Text columns.
    Left,
    /// Number columns.
    Right,
}

/// A Markdown table. Cells are padded to their column's width so that the source reads as a table too;
/// a `|` inside a cell is escaped; rows shorter than the header are padded with empty cells and longer ones
/// are cut (a table row cannot carry more columns than its header).
pub fn md_table(headers: &[&str], align: &[Align], rows: &[Vec<String>]) -> String {
    let cols = headers.len();
    let esc = |s: &str| s.replace('|', "\\|");
    let cells: Vec<Vec<String>> =
        rows.iter().map(|r| (0..cols).map(|c| r.get(c).map_or_else(String::new, |s| esc(s))).collect()).collect();
    let head: Vec<String> = headers.iter().map(|h| esc(h)).collect();
    let width: Vec<usize> = (0..cols)
        .map(|c| cells.iter().map(|r| r[c].chars().count()).chain([head[c].chars().count(), 3]).max().unwrap_or(3))
        .collect();
    let al = |c: usize| align.get(c).copied().unwrap_or(if c == 0 { Align::Left } else { Align::Right });
    let line = |r: &[String]| {
        let mut s = String::from("|");
        for (c, cell) in r.iter().enumerate() {
            let pad = width[c] - cell.chars().count();
            match al(c) {
                Align::Left => s.push_str(&format!(" {cell}{} |", " ".repeat(pad))),
                Align::Right => s.push_str(&format!(" {}{cell} |", " ".repeat(pad))),
            }
        }
        s.push('\n');
        s
    };
    let mut out = line(&head);
    out.push('|');
    for (c, w) in width.iter().enumerate() {
        match al(c) {
            Align::Left => out.push_str(&format!(" {} |", "-".repeat(*w))),
            Align::Right => out.push_str(&format!(" {}: |", "-".repeat(w - 1))),
        }
    }
    out.push('\n');
    for r in &cells {
        out.push_str(&line(r));
    }
    out
}

/// Milliseconds with about three significant digits (`0.0123`, `1.23`, `12.3`, `1234`).
pub fn ms(v: f64) -> String {
    if !v.is_finite() {
        return "-".into();
    }
    let a = v.abs();
    if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else if a >= 0.1 {
        format!("{v:.3}")
    } else {
        format!("{v:.4}")
    }
}

/// An integer with thousands separators (`1,234,567`).
pub fn count(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

/// Bytes as MiB with two decimals.
pub fn mib(bytes: u64) -> String {
    format!("{:.2}", bytes as f64 / (1u64 << 20) as f64)
}

/// A ratio with two decimals (`-` when undefined).
pub fn ratio(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.2}")
    } else {
        "-".into()
    }
}

/// `(year, month, day, hour, minute)` in UTC of a Unix time (proleptic Gregorian calendar).
pub fn utc_from_unix(secs: u64) -> (i64, u32, u32, u32, u32) {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Days since 1970-01-01 to a civil date (the usual era-based conversion: 400-year eras of 146097 days).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d, (rem / 3600) as u32, (rem % 3600 / 60) as u32)
}

/// `YYYY-MM-DD HH:MM UTC` of a Unix time.
pub fn utc_string(secs: u64) -> String {
    let (y, m, d, h, min) = utc_from_unix(secs);
    format!("{y:04}-{m:02}-{d:02} {h:02}:{min:02} UTC")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_pads_aligns_and_escapes() {
        let t = md_table(
            &["model", "nodes"],
            &[Align::Left, Align::Right],
            &[vec!["a|b".into(), "7".into()], vec!["resnet50".into(), "122".into()]],
        );
        let want = "\
| model    | nodes |
| -------- | ----: |
| a\\|b     |     7 |
| resnet50 |   122 |
";
        assert_eq!(t, want);
    }

    #[test]
    fn table_rows_of_the_wrong_length_fit_the_header() {
        let t = md_table(&["a", "b"], &[], &[vec!["x".into()], vec!["1".into(), "2".into(), "3".into()]]);
        assert_eq!(t, "| a   |   b |\n| --- | --: |\n| x   |     |\n| 1   |   2 |\n");
    }

    #[test]
    fn numbers() {
        assert_eq!(ms(1234.4), "1234");
        assert_eq!(ms(12.34), "12.3");
        assert_eq!(ms(1.234), "1.23");
        assert_eq!(ms(0.1234), "0.123");
        assert_eq!(ms(0.01234), "0.0123");
        assert_eq!(ms(f64::NAN), "-");
        assert_eq!(count(0), "0");
        assert_eq!(count(999), "999");
        assert_eq!(count(1000), "1,000");
        assert_eq!(count(1_234_567), "1,234,567");
        assert_eq!(mib(3 << 19), "1.50");
        assert_eq!(ratio(1.0 / 3.0), "0.33");
        assert_eq!(ratio(f64::INFINITY), "-");
    }

    #[test]
    fn utc_dates() {
        assert_eq!(utc_from_unix(0), (1970, 1, 1, 0, 0));
        assert_eq!(utc_from_unix(951_782_400), (2000, 2, 29, 0, 0));
        assert_eq!(utc_from_unix(1_700_000_000), (2023, 11, 14, 22, 13));
        assert_eq!(utc_from_unix(4_107_542_400), (2100, 3, 1, 0, 0));
        assert_eq!(utc_string(1_700_000_000), "2023-11-14 22:13 UTC");
    }
}
