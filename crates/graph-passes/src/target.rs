//! The target a plan is made for: the stream limit, the device profile and the planning effort. The pipeline
//! driver derives it once from its options and passes it to every pass that needs it (fusion's score and
//! concurrency check, the memory pass's ordered-reuse preference and search budgets, the stream pass's cost model
//! and refinement budget), so no pass re-derives any of them.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::device::DeviceProfile;

/// How much work the planner's search stages may spend beyond their greedy results (the analogue of TensorRT's
/// builder optimisation level). Every stage first takes its greedy answer and searches only while that answer is
/// above its bound; the effort sets how much search each may then do, in budgets that scale with the graph.
/// `Default` keeps the quality figures of `docs/benchmarks.md` (pool at the order's bound); `Fast` plans big
/// graphs several times faster for a pool or makespan that may be a little above; `Max` searches longer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Effort {
    /// A tenth of the default's budgets: mostly greedy answers (packing search, extra greedy packing runs,
    /// ordered-reuse revisits and order searches cut short; no stream refinement).
    Fast,
    /// Searches with budgets linear in the graph's size (capped), only where the greedy result is above its bound.
    #[default]
    Default,
    /// Ten times the default's budgets (and their caps): slower, sometimes better plans on hard graphs. The
    /// stream pass's local search runs even when a schedule already reaches the bound (a tie with fewer waits
    /// can still win).
    Max,
}

impl Effort {
    /// Every level, fastest first.
    pub const ALL: [Effort; 3] = [Effort::Fast, Effort::Default, Effort::Max];

    /// The level's name (`fast`, `default`, `max`), as the CLI and the Python API spell it.
    pub fn name(self) -> &'static str {
        match self {
            Effort::Fast => "fast",
            Effort::Default => "default",
            Effort::Max => "max",
        }
    }

    /// A budget of `per_item` work units per item of an instance of `items` items, plus `base`, capped at `cap`
    /// (at `Default`); a tenth of each at `Fast`, ten times each at `Max`.
    pub fn scaled(self, items: usize, per_item: u64, base: u64, cap: u64) -> u64 {
        let (mul, div) = match self {
            Effort::Fast => (1, 10),
            Effort::Default => (1, 1),
            Effort::Max => (10, 1),
        };
        let f = |x: u64| x.saturating_mul(mul) / div;
        f(per_item).saturating_mul(items as u64).saturating_add(f(base)).min(f(cap))
    }
}

impl fmt::Display for Effort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Effort {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Effort::ALL
            .into_iter()
            .find(|e| e.name() == s)
            .ok_or_else(|| format!("unknown effort {s:?} (known: fast, default, max)"))
    }
}

/// What the plan will run on, and how hard to plan for it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Target {
    /// Most streams the plan may use (>= 1); with 1, fusion cannot lose concurrency and every reuse is ordered.
    pub streams: usize,
    /// The device whose cost model the passes use.
    pub device: DeviceProfile,
    /// How much search the passes may spend.
    #[serde(default)]
    pub effort: Effort,
    /// Offset alignment of the plan's buffers (a power of two): every allocation in a region starts at a
    /// multiple of it. Concat slots inside an allocation need only [`Target::slot_alignment`].
    #[serde(default = "default_alignment")]
    pub alignment: u64,
}

fn default_alignment() -> u64 {
    DEFAULT_ALIGNMENT
}

/// The default offset alignment (bytes), as `MemoryOptions` defaults it.
pub const DEFAULT_ALIGNMENT: u64 = 256;

/// The alignment (bytes) a slice of an eliminated Concat's output needs: the widest access a backend makes into
/// a buffer it is given (a 128-bit vector access; cuBLAS's tensor-core operands want 16 bytes; exec-cuda's
/// generated kernels access single elements). The allocation alignment (256 by default, as `cudaMalloc`'s) is
/// for allocations; a slot is a range inside one, as a half plan's slots are at half the f32 plan's offsets.
pub const SLOT_ALIGNMENT: u64 = 16;

/// The alignment of Concat slots in a plan whose buffers are aligned to `alignment`: [`SLOT_ALIGNMENT`], or
/// `alignment` where that is smaller (a power of two dividing it either way). The one rule, used by fusion to
/// place slots and by the memory pass to record it in the plan.
pub fn slot_alignment_for(alignment: u64) -> u64 {
    alignment.clamp(1, SLOT_ALIGNMENT)
}

impl Target {
    /// `streams` streams on `device`, at the default effort.
    pub fn new(streams: usize, device: DeviceProfile) -> Target {
        Target { streams, device, effort: Effort::Default, alignment: DEFAULT_ALIGNMENT }
    }

    /// The same target with buffers aligned to `alignment` bytes.
    pub fn with_alignment(self, alignment: u64) -> Target {
        Target { alignment, ..self }
    }

    /// The alignment of the slots of eliminated Concats ([`slot_alignment_for`] of [`Target::alignment`]).
    pub fn slot_alignment(&self) -> u64 {
        slot_alignment_for(self.alignment)
    }

    /// The same target at `effort`.
    pub fn with_effort(self, effort: Effort) -> Target {
        Target { effort, ..self }
    }
}

impl Default for Target {
    fn default() -> Self {
        Target::new(1, DeviceProfile::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_scale_with_size_and_level_and_stop_at_the_cap() {
        assert_eq!(Effort::Fast.scaled(1000, 10, 50, 1 << 40), 1_005);
        assert_eq!(Effort::Fast.scaled(1000, 10, 50, 700), 70);
        assert_eq!(Effort::Default.scaled(1000, 10, 5, 1 << 40), 10_005);
        assert_eq!(Effort::Default.scaled(1000, 10, 5, 7_000), 7_000);
        assert_eq!(Effort::Max.scaled(1000, 10, 5, 7_000), 70_000);
        assert_eq!(Effort::Max.scaled(10, 10, 5, 1 << 40), 1_050);
        assert_eq!(Effort::Default.scaled(usize::MAX, u64::MAX, 1, 9), 9);
    }

    #[test]
    fn names_round_trip() {
        for e in Effort::ALL {
            assert_eq!(e.name().parse::<Effort>(), Ok(e));
            assert_eq!(serde_json::to_string(&e).unwrap(), format!("\"{}\"", e.name()));
        }
        assert!("medium".parse::<Effort>().unwrap_err().contains("fast, default, max"));
        assert!(Effort::Fast < Effort::Default && Effort::Default < Effort::Max);
    }
}
