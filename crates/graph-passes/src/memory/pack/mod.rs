//! Packing core: offsets for plain buffers with lifetimes, so that buffers live at the same time never share bytes
//! and the pool (the highest byte used) is as small as we can make it.
//!
//! **Problem.** Buffer `i` is live over the half-open time interval `[lower, upper)` and needs `size` bytes,
//! rounded up to `alignment`. Find offsets (multiples of `alignment`) minimising the height
//! `max(offset + aligned size)`. The sweep [`lower_bound`] (largest aligned total live at one time) bounds it below.
//!
//! **Algorithm.** (1) The instance splits into time-disjoint components, packed independently; a buffer live
//! over its component's whole span is pinned at the bottom (never a loss) and the rest split again.
//! (2) A greedy portfolio in the spirit of XLA's heap simulator: six orderings (size, area, lifetime,
//! conflicting size, peak pressure, start time), each placed by best-fit and by first-fit into the gaps left by
//! already placed, time-overlapping buffers; each component keeps its best run. A time-indexed structure
//! (per-section slot lists for short buffers, a segment tree for long ones, a bit tree over start times) answers
//! "placed buffers overlapping `[lower, upper)`", so a run costs O(n log T + sum of k log k), k the overlapping
//! placed buffers of each step. Above 200,000 buffers the portfolio shrinks to two runs, above 500,000 to one.
//! (3) Under the effort [`Budget`], an exact branch-and-bound search after MiniMalloc (Moffitt, ASPLOS 2023)
//! improves the components that set the height (see `search.rs`: canonical solutions, section and dominance
//! pruning, dynamic decomposition with memoised subproblems, restarts). It aims at the lower bound while a
//! descent probes heights below the best found; an exhausted search proves a bound. Components larger than
//! [`SEARCH_MAX_BUFFERS`] keep their greedy layout, and the stats say so.
//!
//! **Invariants.** Every returned packing passed [`check`] (an independent O(n log n) sweep validator) and
//! `lower_bound <= height <= naive` (the sum of aligned sizes). With no wall-clock limit, the result is a pure
//! function of the buffers and the options (bit-for-bit deterministic).
//!
//! **Zero-size buffers** get offset 0 and never conflict. Offsets are computed with checked arithmetic: a pool
//! that does not fit in `u64` is an error, never a wrap.

pub mod csv;
mod greedy;
mod instance;
mod occupancy;
mod search;
mod validate;

use std::fmt;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use thiserror::Error;

pub use greedy::{Fit, Order, WORK_LIMIT};
pub use validate::{check, PackViolation};

use instance::Instance;

/// Components with more buffers than this are not searched (the greedy result stands).
pub const SEARCH_MAX_BUFFERS: usize = 4096;

/// A buffer to place: live over the half-open time interval `[lower, upper)`, `size` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Buffer {
    /// First time step at which the buffer is live.
    pub lower: u64,
    /// First time step at which it is no longer live (exclusive).
    pub upper: u64,
    /// Size in bytes (0 is allowed: such a buffer gets offset 0 and never conflicts).
    pub size: u64,
}

impl Buffer {
    /// A buffer live over `[lower, upper)` with `size` bytes.
    pub fn new(lower: u64, upper: u64, size: u64) -> Self {
        Buffer { lower, upper, size }
    }

    /// Whether the two lifetimes intersect (half-open: `[0, 3)` and `[3, 5)` do not).
    pub fn overlaps_in_time(&self, other: &Buffer) -> bool {
        self.lower < other.upper && other.lower < self.upper
    }
}

/// How much work the packer may spend beyond the greedy portfolio.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Budget {
    /// Deterministic effort limit for the search phase, in work units (one unit is one buffer or section
    /// touched by the search; about 1.3-1.6 ns of one core each on the reference machine). 0 skips the search.
    pub effort: u64,
    /// Optional wall-clock limit for the search phase. When set, results may depend on machine speed.
    pub time_limit: Option<Duration>,
    /// Most placed-buffer comparisons the greedy portfolio's gap-scanning runs may cost together (`None`:
    /// [`greedy::WORK_LIMIT`]); the online run always runs. Spent only on components above their lower bound.
    #[serde(default)]
    pub greedy_work: Option<u64>,
}

impl Budget {
    /// The default effort: at most about 4-5 s of one core, spent only on components whose height is above their
    /// lower bound and not proved optimal (easy instances stop much earlier).
    pub const DEFAULT_EFFORT: u64 = 3_000_000_000;

    /// Greedy portfolio only, no search.
    pub fn greedy_only() -> Self {
        Budget { effort: 0, time_limit: None, greedy_work: None }
    }

    /// A deterministic budget of `effort` work units.
    pub fn with_effort(effort: u64) -> Self {
        Budget { effort, time_limit: None, greedy_work: None }
    }

    /// The same budget, also stopped after `limit` of wall-clock time.
    pub fn with_time_limit(self, limit: Duration) -> Self {
        Budget { time_limit: Some(limit), ..self }
    }
}

impl Default for Budget {
    fn default() -> Self {
        Budget::with_effort(Budget::DEFAULT_EFFORT)
    }
}

/// Options of [`pack`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PackOptions {
    /// Every offset is a multiple of this, and sizes are rounded up to it (1 for the CSV instances; the graph
    /// planner uses 256). Must be non-zero.
    pub alignment: u64,
    /// Effort and time limits of the search.
    pub budget: Budget,
    /// Seed of the search's randomised restarts.
    pub seed: u64,
}

impl Default for PackOptions {
    fn default() -> Self {
        PackOptions { alignment: 1, budget: Budget::default(), seed: 0 }
    }
}

/// Which phase produced the final layout of the component that sets the height.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Strategy {
    /// Nothing to place (no buffers, or only zero-size ones).
    Trivial,
    /// A greedy heuristic: an ordering and a placement rule.
    Greedy {
        /// The order in which buffers were placed.
        order: Order,
        /// How a gap was chosen.
        fit: Fit,
    },
    /// The branch-and-bound search.
    Search,
    /// Buffers live over their whole component, stacked at its bottom (optimal without any choice).
    Pinned,
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Strategy::Trivial => write!(f, "trivial"),
            Strategy::Greedy { order, fit } => write!(f, "greedy {order} {fit}"),
            Strategy::Search => write!(f, "search"),
            Strategy::Pinned => write!(f, "pinned"),
        }
    }
}

/// Why the search phase did not run (or not fully) on some component.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SearchSkip {
    /// The budget's effort is 0.
    NoBudget,
    /// A component that needed improving has more than [`SEARCH_MAX_BUFFERS`] buffers.
    TooLarge {
        /// Buffers in the largest such component.
        buffers: usize,
    },
    /// A component that needed improving has too many overlapping pairs for the search's overlap lists.
    TooDense {
        /// Buffers in that component.
        buffers: usize,
    },
}

/// What the packer did, for reports and tuning. Deterministic under an effort-only budget.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct PackStats {
    /// Time-disjoint components the instance split into.
    pub components: usize,
    /// Height of the best single greedy run over the whole instance.
    pub greedy_height: u64,
    /// Height after taking the best greedy run per component.
    pub portfolio_height: u64,
    /// Greedy runs made: the online run, then gap-scanning runs only while some component is above its lower
    /// bound and the greedy work budget lasts.
    #[serde(default)]
    pub greedy_runs: usize,
    /// Search nodes visited.
    pub search_nodes: u64,
    /// Work units spent by the search.
    pub search_effort: u64,
    /// Components searched.
    pub searched_components: usize,
    /// Set when a component that sets the height was not searched.
    pub search_skipped: Option<SearchSkip>,
    /// A lower bound proved by exhaustive search (at least [`Packing::lower_bound`]).
    pub proved_lower_bound: u64,
    /// Whether the wall-clock limit stopped the search (the result then depends on machine speed).
    pub timed_out: bool,
}

/// The result of [`pack`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Packing {
    /// Offset of each buffer, in input order; multiples of the alignment.
    pub offsets: Vec<u64>,
    /// Pool size: the largest `offset + aligned size` (0 when nothing is placed).
    pub height: u64,
    /// The sweep lower bound ([`lower_bound`]).
    pub lower_bound: u64,
    /// The phase that produced the component setting the height.
    pub strategy: Strategy,
    /// Whether `height` is proved minimal (it reached a proved lower bound).
    pub optimal: bool,
    /// What the packer did.
    pub stats: PackStats,
}

/// Why [`pack`] could not produce a packing. Indices are positions in the `buffers` slice.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PackError {
    /// The alignment is 0.
    #[error("alignment must be non-zero")]
    ZeroAlignment,
    /// A buffer's lifetime is empty or reversed.
    #[error("buffer {index}: empty lifetime [{lower}, {upper}) (lower must be < upper)")]
    InvalidInterval {
        /// Index of the buffer.
        index: usize,
        /// Its `lower`.
        lower: u64,
        /// Its `upper`.
        upper: u64,
    },
    /// Sizes or offsets do not fit in a `u64` (after rounding up to the alignment).
    #[error("buffer {index}: size {size} at this alignment makes the pool overflow u64")]
    Overflow {
        /// Index of the buffer.
        index: usize,
        /// Its size.
        size: u64,
    },
    /// The packer produced an invalid layout. This is a bug in the packer, not in the input.
    #[error("internal error (a bug in the packer): {0}")]
    Internal(PackViolation),
}

/// The sweep lower bound: the largest total aligned size live at any one time. Buffers with an empty lifetime
/// count for nothing; an `alignment` of 0 counts as 1; the sum saturates at `u64::MAX`.
pub fn lower_bound(buffers: &[Buffer], alignment: u64) -> u64 {
    let (mut live, mut peak) = (0u128, 0u128);
    for (_, start, size) in sweep_events(buffers, alignment) {
        if start {
            live += size;
            peak = peak.max(live);
        } else {
            live -= size;
        }
    }
    u64::try_from(peak).unwrap_or(u64::MAX)
}

/// [`lower_bound`] and the time spans `[from, to)` over which the live total equals it, in time order.
pub fn peak_spans(buffers: &[Buffer], alignment: u64) -> (u64, Vec<(u64, u64)>) {
    let events = sweep_events(buffers, alignment);
    // The live total after each time's events, per distinct time.
    let mut steps: Vec<(u64, u128)> = Vec::new();
    let mut live = 0u128;
    for (t, start, size) in events {
        if start {
            live += size;
        } else {
            live -= size;
        }
        match steps.last_mut() {
            Some(last) if last.0 == t => last.1 = live,
            _ => steps.push((t, live)),
        }
    }
    let peak = steps.iter().map(|s| s.1).max().unwrap_or(0);
    let mut spans: Vec<(u64, u64)> = Vec::new();
    for (i, &(t, v)) in steps.iter().enumerate() {
        if v != peak || peak == 0 {
            continue;
        }
        // The total holds until the next time with events (the last time has none live after it).
        let to = steps.get(i + 1).map_or(t, |s| s.0);
        match spans.last_mut() {
            Some(last) if last.1 == t => last.1 = to,
            _ => spans.push((t, to)),
        }
    }
    (u64::try_from(peak).unwrap_or(u64::MAX), spans)
}

/// The sweep's events: `(time, starts, aligned size)`, ends before starts at equal times (half-open lifetimes).
/// Both sweeps read only the totals after each time's events, so the order among one time's starts (or ends)
/// does not matter: by counting when the times are small, as a plan's steps are.
fn sweep_events(buffers: &[Buffer], alignment: u64) -> Vec<(u64, bool, u128)> {
    let align = alignment.max(1);
    let mut events: Vec<(u64, bool, u128)> = Vec::with_capacity(2 * buffers.len());
    for b in buffers {
        if b.lower < b.upper && b.size > 0 {
            let aligned = u128::from(b.size).div_ceil(u128::from(align)) * u128::from(align);
            // `false` sorts first.
            events.push((b.lower, true, aligned));
            events.push((b.upper, false, aligned));
        }
    }
    if !crate::counting::sort_small(&mut events, |e| e.0.saturating_mul(2).saturating_add(u64::from(e.1))) {
        events.sort_unstable();
    }
    events
}

/// Packs `buffers` into one pool. See the module docs for the algorithm and guarantees. The layout is checked by
/// the independent validator before it is handed out.
pub fn pack(buffers: &[Buffer], opts: &PackOptions) -> Result<Packing, PackError> {
    let p = pack_unchecked(buffers, opts)?;
    check(buffers, &p.offsets).map_err(PackError::Internal)?;
    Ok(p)
}

/// [`pack`] without its closing check, for the memory pass when it moves units after packing and checks the
/// layout it finally keeps (one check of the same buffers instead of two).
pub(crate) fn pack_unchecked(buffers: &[Buffer], opts: &PackOptions) -> Result<Packing, PackError> {
    let started = Instant::now();
    let inst = Instance::new(buffers, opts.alignment)?;
    let lower = inst.lower_bound;
    let mut stats = PackStats { components: inst.components.len(), ..PackStats::default() };
    if inst.len() == 0 {
        stats.proved_lower_bound = 0;
        return finish(vec![0; buffers.len()], 0, lower, Strategy::Trivial, true, stats);
    }

    // Greedy portfolio, best run per component. Offsets and heights below are relative to component bases.
    let portfolio = greedy::portfolio(&inst, opts.budget.greedy_work.unwrap_or(greedy::WORK_LIMIT))?;
    stats.greedy_height = portfolio.best_single_height.max(inst.pinned_height());
    stats.greedy_runs = portfolio.runs;
    let mut offsets = portfolio.offsets;
    let mut comp_height = portfolio.component_heights;
    let mut comp_strategy: Vec<Strategy> =
        portfolio.component_runs.iter().map(|&(order, fit)| Strategy::Greedy { order, fit }).collect();
    let mut comp_proved: Vec<u64> = inst.components.iter().map(|c| c.lower_bound).collect();
    let base: Vec<u64> = inst.components.iter().map(|c| c.base).collect();
    let absolute = |c: usize, h: u64| base[c].saturating_add(h);
    stats.portfolio_height =
        (0..inst.components.len()).map(|c| absolute(c, comp_height[c])).max().unwrap_or(0).max(inst.pinned_height());

    // Search, on the components that set the height, tallest first. `goal`: the height already forced by the
    // lower bound and by components settled so far; lowering any component below it gains nothing.
    let deadline = opts.budget.time_limit.map(|d| started + d);
    let mut order: Vec<usize> = (0..inst.components.len()).collect();
    order.sort_by_key(|&c| (std::cmp::Reverse(absolute(c, comp_height[c])), c));
    let mut goal = lower.max(inst.pinned_height());
    let mut effort_left = opts.budget.effort;
    let needs_work = |c: usize, h: u64, goal: u64, proved: u64| absolute(c, h) > goal && h > proved;
    let needing: Vec<usize> =
        order.iter().copied().filter(|&c| needs_work(c, comp_height[c], goal, comp_proved[c])).collect();
    for (k, &c) in needing.iter().enumerate() {
        // Earlier components may have settled at a height that makes this one's improvement pointless.
        if !needs_work(c, comp_height[c], goal, comp_proved[c]) {
            continue;
        }
        let comp = &inst.components[c];
        if opts.budget.effort == 0 {
            stats.search_skipped = Some(SearchSkip::NoBudget);
            goal = goal.max(absolute(c, comp_height[c]));
            continue;
        }
        if comp.members.len() > SEARCH_MAX_BUFFERS {
            let buffers = match stats.search_skipped {
                Some(SearchSkip::TooLarge { buffers }) => buffers.max(comp.members.len()),
                _ => comp.members.len(),
            };
            stats.search_skipped = Some(SearchSkip::TooLarge { buffers });
            goal = goal.max(absolute(c, comp_height[c]));
            continue;
        }
        // The tallest component matters most; later ones keep a quarter in reserve (plus whatever is unused).
        let share = if k + 1 == needing.len() { effort_left } else { effort_left - effort_left / 4 };
        let Some(outcome) = search::improve(
            &inst,
            c,
            comp_height[c],
            goal.saturating_sub(base[c]),
            &search::Limits {
                effort: share,
                deadline,
                seed: opts.seed ^ (c as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
            },
        ) else {
            stats.search_skipped = Some(SearchSkip::TooDense { buffers: comp.members.len() });
            goal = goal.max(absolute(c, comp_height[c]));
            continue;
        };
        stats.searched_components += 1;
        stats.search_nodes += outcome.nodes;
        stats.search_effort += outcome.effort;
        effort_left = effort_left.saturating_sub(outcome.effort);
        stats.timed_out |= outcome.timed_out;
        comp_proved[c] = comp_proved[c].max(outcome.proved_lower_bound);
        if let Some((sol, height)) = outcome.improved {
            for (&i, &o) in comp.members.iter().zip(&sol) {
                offsets[i] = o;
            }
            comp_height[c] = height;
            comp_strategy[c] = Strategy::Search;
        }
        goal = goal.max(absolute(c, comp_height[c]));
    }

    let height =
        (0..inst.components.len()).map(|c| absolute(c, comp_height[c])).max().unwrap_or(0).max(inst.pinned_height());
    // Every component needs at least its base plus its proved bound; the height is optimal when one of them
    // (or the sweep bound) reaches it.
    let proved = (0..inst.components.len()).map(|c| absolute(c, comp_proved[c])).max().unwrap_or(0).max(lower);
    stats.proved_lower_bound = proved;
    let strategy = order
        .iter()
        .copied()
        .filter(|&c| absolute(c, comp_height[c]) == height)
        .min()
        .map_or(Strategy::Pinned, |c| comp_strategy[c]);
    let full = inst.scatter(&offsets, buffers.len())?;
    finish(full, height, lower, strategy, proved >= height, stats)
}

/// The packing of `offsets` (checked by the caller, [`pack`]).
fn finish(
    offsets: Vec<u64>,
    height: u64,
    lower_bound: u64,
    strategy: Strategy,
    optimal: bool,
    stats: PackStats,
) -> Result<Packing, PackError> {
    Ok(Packing { offsets, height, lower_bound, strategy, optimal, stats })
}
