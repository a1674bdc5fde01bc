//! The MiniMalloc CSV format: a header naming the columns `id,lower,upper,size` (any order, an optional `offset`
//! column is read too), then one buffer a row. Output adds `offset`: `id,lower,upper,size,offset`.
//! Blank lines are skipped; fields are trimmed; errors name the 1-based line and the field.

use std::collections::HashMap;
use std::fmt::Write as _;

use thiserror::Error;

use super::Buffer;

/// A buffer read from CSV, with its id and, if the file had an `offset` column, its offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsvBuffer {
    /// The `id` field, as written.
    pub id: String,
    /// Lifetime and size.
    pub buffer: Buffer,
    /// The `offset` field, when present.
    pub offset: Option<u64>,
}

/// What is wrong with a CSV file.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CsvError {
    /// The file has no header line.
    #[error("empty input: expected a header line `id,lower,upper,size`")]
    Empty,
    /// The header lacks a required column.
    #[error("line {line}: header has no `{column}` column")]
    MissingColumn {
        /// Line of the header.
        line: usize,
        /// The missing column.
        column: &'static str,
    },
    /// A column name appears twice in the header.
    #[error("line {line}: column `{column}` appears twice in the header")]
    DuplicateColumn {
        /// Line of the header.
        line: usize,
        /// The repeated column.
        column: String,
    },
    /// A row has a different number of fields than the header.
    #[error("line {line}: {found} fields, the header has {expected}")]
    FieldCount {
        /// The row's line.
        line: usize,
        /// Fields in the header.
        expected: usize,
        /// Fields in the row.
        found: usize,
    },
    /// A numeric field is not an unsigned integer.
    #[error("line {line}: field `{field}` is `{value}`, not an unsigned integer")]
    BadNumber {
        /// The row's line.
        line: usize,
        /// The field.
        field: &'static str,
        /// Its text.
        value: String,
    },
    /// `lower >= upper`.
    #[error("line {line}: buffer `{id}` has lower {lower} >= upper {upper}")]
    EmptyLifetime {
        /// The row's line.
        line: usize,
        /// The buffer's id.
        id: String,
        /// Its lower.
        lower: u64,
        /// Its upper.
        upper: u64,
    },
    /// The `id` field is empty.
    #[error("line {line}: field `id` is empty")]
    EmptyId {
        /// The row's line.
        line: usize,
    },
    /// Two rows share an id.
    #[error("line {line}: id `{id}` already used on line {first}")]
    DuplicateId {
        /// The second row's line.
        line: usize,
        /// The id.
        id: String,
        /// The first row's line.
        first: usize,
    },
}

/// Parses the CSV text into buffers, in file order.
pub fn parse(text: &str) -> Result<Vec<CsvBuffer>, CsvError> {
    let mut lines = text.lines().enumerate().map(|(k, l)| (k + 1, l.trim())).filter(|(_, l)| !l.is_empty());
    let (header_line, header) = lines.next().ok_or(CsvError::Empty)?;
    let names: Vec<&str> = header.split(',').map(str::trim).collect();
    for (k, name) in names.iter().enumerate() {
        if names[..k].contains(name) {
            return Err(CsvError::DuplicateColumn { line: header_line, column: (*name).to_string() });
        }
    }
    let column = |c: &'static str| {
        names.iter().position(|n| *n == c).ok_or(CsvError::MissingColumn { line: header_line, column: c })
    };
    let (id_col, lower_col, upper_col, size_col) = (column("id")?, column("lower")?, column("upper")?, column("size")?);
    let offset_col = names.iter().position(|n| *n == "offset");

    let mut out = Vec::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (line, row) in lines {
        let fields: Vec<&str> = row.split(',').map(str::trim).collect();
        if fields.len() != names.len() {
            return Err(CsvError::FieldCount { line, expected: names.len(), found: fields.len() });
        }
        let num = |col: usize, field: &'static str| {
            fields[col].parse::<u64>().map_err(|_| CsvError::BadNumber { line, field, value: fields[col].to_string() })
        };
        let id = fields[id_col].to_string();
        if id.is_empty() {
            return Err(CsvError::EmptyId { line });
        }
        let lower = num(lower_col, "lower")?;
        let upper = num(upper_col, "upper")?;
        let size = num(size_col, "size")?;
        let offset = offset_col.map(|c| num(c, "offset")).transpose()?;
        if lower >= upper {
            return Err(CsvError::EmptyLifetime { line, id, lower, upper });
        }
        if let Some(&first) = seen.get(&id) {
            return Err(CsvError::DuplicateId { line, id, first });
        }
        seen.insert(id.clone(), line);
        out.push(CsvBuffer { id, buffer: Buffer { lower, upper, size }, offset });
    }
    Ok(out)
}

/// Writes `id,lower,upper,size,offset` rows for `buffers` placed at `offsets` (same order and length).
pub fn write(buffers: &[CsvBuffer], offsets: &[u64]) -> String {
    let mut s = String::from("id,lower,upper,size,offset\n");
    for (b, o) in buffers.iter().zip(offsets) {
        // Writing to a String cannot fail.
        let _ = writeln!(s, "{},{},{},{},{}", b.id, b.buffer.lower, b.buffer.upper, b.buffer.size, o);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let text = "id,lower,upper,size\nb1,0,3,4\nb2,3,9,4\n";
        let bufs = parse(text).unwrap();
        assert_eq!(bufs.len(), 2);
        assert_eq!(bufs[1].buffer, Buffer::new(3, 9, 4));
        let out = write(&bufs, &[0, 4]);
        assert_eq!(out, "id,lower,upper,size,offset\nb1,0,3,4,0\nb2,3,9,4,4\n");
        let again = parse(&out).unwrap();
        assert_eq!(again[1].offset, Some(4));
        assert_eq!(again[0].buffer, bufs[0].buffer);
    }

    #[test]
    fn errors_name_line_and_field() {
        assert_eq!(parse(""), Err(CsvError::Empty));
        assert!(matches!(parse("id,lower,size\n"), Err(CsvError::MissingColumn { line: 1, column: "upper" })));
        assert!(matches!(
            parse("id,lower,upper,size\n\nb1,0,x,4\n"),
            Err(CsvError::BadNumber { line: 3, field: "upper", .. })
        ));
        assert!(matches!(
            parse("id,lower,upper,size\nb1,0,3\n"),
            Err(CsvError::FieldCount { line: 2, expected: 4, found: 3 })
        ));
        assert!(matches!(parse("id,lower,upper,size\nb1,3,3,4\n"), Err(CsvError::EmptyLifetime { line: 2, .. })));
        assert!(matches!(
            parse("id,lower,upper,size\nb1,0,3,4\nb1,0,3,4\n"),
            Err(CsvError::DuplicateId { line: 3, first: 2, .. })
        ));
        assert!(matches!(
            parse("id,lower,upper,size\nb1,0,3,-4\n"),
            Err(CsvError::BadNumber { line: 2, field: "size", .. })
        ));
    }
}
