//! Element types and their sizes.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The element type of a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// IEEE 754 binary32.
    F32,
    /// IEEE 754 binary16.
    F16,
    /// bfloat16 (8-bit exponent, 7-bit mantissa).
    BF16,
    /// Signed 64-bit integer.
    I64,
    /// Signed 32-bit integer.
    I32,
    /// Signed 8-bit integer.
    I8,
    /// Unsigned 8-bit integer.
    U8,
    /// Boolean, one byte per element (0 or 1).
    Bool,
}

impl DType {
    /// Every dtype, in a stable order.
    pub const ALL: [DType; 8] =
        [DType::F32, DType::F16, DType::BF16, DType::I64, DType::I32, DType::I8, DType::U8, DType::Bool];

    /// Bytes one element occupies.
    pub const fn size_bytes(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::I64 => 8,
            DType::I8 | DType::U8 | DType::Bool => 1,
        }
    }

    /// True for the floating-point types.
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }

    /// True for the signed and unsigned integer types (not bool).
    pub const fn is_int(self) -> bool {
        matches!(self, DType::I64 | DType::I32 | DType::I8 | DType::U8)
    }

    /// The lowercase name used in the JSON format and in messages.
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I64 => "i64",
            DType::I32 => "i32",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::Bool => "bool",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
