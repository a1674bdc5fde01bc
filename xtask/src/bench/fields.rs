//! Figures the report reads by field name through serde, so that this task builds and runs on either side of
//! the branches that add them: an absent field prints `n/a` with the reason, never an error.
//!
//! - Plan statistics: every numeric field of `graph_plan::PlanStats` is read into a name -> value map
//!   ([`numeric_fields`]); the report's "Plan statistics" table shows the fields of [`STAT_FIELDS`]. To report
//!   a new `PlanStats` field, add one [`StatField`] line there (name, column header, unit, and the issue that
//!   adds it, for the `n/a` reason). Nothing else changes.
//! - Packer results: [`serde_json_of`] turns a value into JSON when its type implements `Serialize` and into
//!   `None` otherwise (decided at compile time), so the MiniMalloc table shows `optimal` and `strategy` of
//!   `graph_passes::memory::pack::Packing` once that type is serialisable (the packing issue), `n/a` before.

use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;

use super::fmt;

/// How a statistic is printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// A count (`1,234`).
    Count,
    /// Microseconds (three significant digits).
    Us,
    /// Bytes, printed as MiB.
    Bytes,
}

/// One `PlanStats` field the report shows.
#[derive(Clone, Copy, Debug)]
pub struct StatField {
    /// Field name in `PlanStats` (and in its JSON).
    pub name: &'static str,
    /// Column header.
    pub header: &'static str,
    /// How to print it.
    pub unit: Unit,
    /// Who adds the field: the reason printed when a build's `PlanStats` lacks it.
    pub added_by: &'static str,
}

/// The `PlanStats` fields of the "Plan statistics" table, in column order.
pub const STAT_FIELDS: [StatField; 13] = [
    StatField { name: "reuse_edges", header: "reuse edges", unit: Unit::Count, added_by: "the memory issue" },
    StatField {
        name: "reuse_edges_added",
        header: "reuse edges added",
        unit: Unit::Count,
        added_by: "the memory issue",
    },
    StatField { name: "in_place_count", header: "in place", unit: Unit::Count, added_by: "the memory issue" },
    StatField { name: "events_before_reduction", header: "cross edges", unit: Unit::Count, added_by: "the pipeline" },
    StatField { name: "waits", header: "waits", unit: Unit::Count, added_by: "the streams issue" },
    StatField { name: "chains", header: "chains", unit: Unit::Count, added_by: "the streams issue" },
    StatField { name: "critical_path_us", header: "critical path us", unit: Unit::Us, added_by: "the streams issue" },
    StatField {
        name: "energetic_bound_us",
        header: "energetic bound us",
        unit: Unit::Us,
        added_by: "the refactor issue",
    },
    StatField { name: "one_stream_us", header: "1-stream us", unit: Unit::Us, added_by: "the streams issue" },
    StatField { name: "data_bound_us", header: "data-only bound us", unit: Unit::Us, added_by: "the memory issue" },
    StatField {
        name: "stream_limit_bound_us",
        header: "bound at stream limit us",
        unit: Unit::Us,
        added_by: "the streams issue",
    },
    StatField { name: "bytes_moved", header: "MiB moved", unit: Unit::Bytes, added_by: "the fusion issue" },
    StatField {
        name: "bytes_moved_unfused",
        header: "MiB moved unfused",
        unit: Unit::Bytes,
        added_by: "the fusion issue",
    },
];

/// The field holding the assignment-independent makespan bound (DESIGN.md section 5), added by the streams
/// issue; the makespan columns print `n/a` for the bound without it.
pub const MAKESPAN_BOUND: StatField =
    StatField { name: "makespan_bound_us", header: "bound us", unit: Unit::Us, added_by: "the streams issue" };

/// Every top-level numeric (or boolean, as 0/1) field of `value`'s JSON; empty when it does not serialise to
/// an object.
pub fn numeric_fields(value: &impl Serialize) -> BTreeMap<String, f64> {
    let Ok(Value::Object(map)) = serde_json::to_value(value) else { return BTreeMap::new() };
    map.into_iter()
        .filter_map(|(k, v)| match v {
            Value::Number(n) => n.as_f64().map(|x| (k, x)),
            Value::Bool(b) => Some((k, if b { 1.0 } else { 0.0 })),
            _ => None,
        })
        .collect()
}

/// The value of `field`, if present and finite.
pub fn get(values: &BTreeMap<String, f64>, field: &StatField) -> Option<f64> {
    values.get(field.name).copied().filter(|x| x.is_finite())
}

/// The cell of `field`: its value in the field's unit, or `n/a` when absent.
pub fn cell(values: &BTreeMap<String, f64>, field: &StatField) -> String {
    match get(values, field) {
        None => "n/a".into(),
        Some(x) => match field.unit {
            Unit::Count => fmt::count(x.max(0.0).round() as u64),
            Unit::Us => fmt::ms(x),
            Unit::Bytes => fmt::mib(x.max(0.0).round() as u64),
        },
    }
}

/// One line per field of `fields` absent from every row: `` `name`: n/a — not in this build's `what` (added
/// by ...) ``. Fields present in some rows only are named as such.
pub fn absent_notes<'a>(
    rows: impl IntoIterator<Item = &'a BTreeMap<String, f64>> + Clone,
    fields: &[StatField],
    what: &str,
) -> Vec<String> {
    let mut out = Vec::new();
    for f in fields {
        let (mut with, mut total) = (0usize, 0usize);
        for r in rows.clone() {
            total += 1;
            with += usize::from(get(r, f).is_some());
        }
        if total > 0 && with == 0 {
            out.push(format!("`{}`: n/a — not in this build's {what} (added by {})", f.name, f.added_by));
        } else if with < total {
            out.push(format!("`{}`: n/a in {} of {total} rows (absent or not finite)", f.name, total - with));
        }
    }
    out
}

/// A reference that picks [`SerdeProbe::probe_json`] when `T: Serialize` and [`NoSerde::probe_json`]
/// otherwise (autoref specialisation: the method on `Probe<T>` itself wins when its bound holds, else the one
/// on `&Probe<T>` applies). Use through [`serde_json_of`]. (Outside tests the serialisable case is unused
/// until `Packing` derives `Serialize`, and the fallback after, hence the `dead_code` allowances.)
#[allow(dead_code)]
pub struct Probe<'a, T>(pub &'a T);

/// The serialisable case of [`Probe`].
#[allow(dead_code)]
pub trait SerdeProbe {
    /// The value as JSON.
    fn probe_json(&self) -> Option<Value>;
}

impl<T: Serialize> SerdeProbe for Probe<'_, T> {
    fn probe_json(&self) -> Option<Value> {
        serde_json::to_value(self.0).ok()
    }
}

/// The fallback case of [`Probe`].
#[allow(dead_code)]
pub trait NoSerde {
    /// Always `None`.
    fn probe_json(&self) -> Option<Value>;
}

impl<T> NoSerde for &Probe<'_, T> {
    fn probe_json(&self) -> Option<Value> {
        None
    }
}

/// `$v` as `Option<serde_json::Value>`: `Some` when its (concrete) type implements `Serialize`, else `None`.
macro_rules! serde_json_of {
    ($v:expr) => {{
        #[allow(unused_imports)]
        use $crate::bench::fields::{NoSerde as _, SerdeProbe as _};
        (&$crate::bench::fields::Probe(&$v)).probe_json()
    }};
}
pub(crate) use serde_json_of;

/// A short text of a serialised enum: a string variant as is, `{"Greedy": {"order": "Size", "fit": "Best"}}`
/// as `Greedy fit=Best order=Size` (fields in name order); `None` for anything else.
pub fn enum_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Object(m) if m.len() == 1 => {
            let (k, inner) = m.iter().next()?;
            let mut parts = vec![k.clone()];
            match inner {
                Value::Object(fields) => parts.extend(
                    fields.iter().map(|(f, x)| format!("{f}={}", enum_text(x).unwrap_or_else(|| x.to_string()))),
                ),
                other => parts.push(enum_text(other).unwrap_or_else(|| other.to_string())),
            }
            Some(parts.join(" "))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct WithBound {
        reuse_edges: usize,
        makespan_bound_us: f64,
        device: String,
        flag: bool,
    }

    struct Opaque {
        #[allow(dead_code)]
        x: u32,
    }

    fn map(pairs: &[(&str, f64)]) -> BTreeMap<String, f64> {
        pairs.iter().map(|&(k, v)| (k.to_string(), v)).collect()
    }

    #[test]
    fn numeric_fields_keep_numbers_and_booleans_only() {
        let m =
            numeric_fields(&WithBound { reuse_edges: 3, makespan_bound_us: 12.5, device: "h200".into(), flag: true });
        assert_eq!(m, map(&[("flag", 1.0), ("makespan_bound_us", 12.5), ("reuse_edges", 3.0)]));
        assert!(numeric_fields(&7u32).is_empty());
    }

    #[test]
    fn absent_fields_print_na_with_the_issue_that_adds_them() {
        let rows = [map(&[("reuse_edges", 1234.0), ("bytes_moved", 3.0 * 1048576.0)])];
        assert_eq!(cell(&rows[0], &STAT_FIELDS[0]), "1,234");
        assert_eq!(cell(&rows[0], &STAT_FIELDS[11]), "3.00");
        assert_eq!(cell(&rows[0], &MAKESPAN_BOUND), "n/a");
        assert_eq!(cell(&map(&[("critical_path_us", 12.345)]), &STAT_FIELDS[6]), "12.3");
        let notes = absent_notes(rows.iter(), &[STAT_FIELDS[0], MAKESPAN_BOUND], "PlanStats");
        assert_eq!(
            notes,
            vec!["`makespan_bound_us`: n/a — not in this build's PlanStats (added by the streams issue)".to_string()]
        );
        let mixed = [map(&[("waits", 2.0)]), map(&[])];
        assert_eq!(
            absent_notes(mixed.iter(), &[STAT_FIELDS[4]], "PlanStats"),
            vec!["`waits`: n/a in 1 of 2 rows (absent or not finite)".to_string()]
        );
        assert!(absent_notes(std::iter::empty::<&BTreeMap<String, f64>>(), &STAT_FIELDS, "x").is_empty());
    }

    #[test]
    fn the_probe_serialises_only_serialisable_types() {
        let s = WithBound { reuse_edges: 1, makespan_bound_us: 2.0, device: "d".into(), flag: false };
        let v = serde_json_of!(s).expect("a Serialize type gives JSON");
        assert_eq!(v["reuse_edges"], 1);
        let o = Opaque { x: 1 };
        assert!(serde_json_of!(o).is_none(), "a type without Serialize gives None");
    }

    #[test]
    fn enum_texts() {
        let greedy: Value = serde_json::json!({"Greedy": {"order": "Size", "fit": "BestFit"}});
        assert_eq!(enum_text(&greedy).as_deref(), Some("Greedy fit=BestFit order=Size"));
        assert_eq!(enum_text(&Value::String("Search".into())).as_deref(), Some("Search"));
        assert_eq!(enum_text(&serde_json::json!(3)), None);
    }
}
