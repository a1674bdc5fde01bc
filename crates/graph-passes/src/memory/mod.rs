//! The memory pass: where every materialised tensor lives.
//!
//! Regions: sources go to `Weights` (weights, constants) or `Io` (graph inputs); alias groups holding a graph
//! output go to `Io`; results of a Memcpy to the host go to `Host`; every other materialised alias group is a
//! buffer of the activation `Pool`. Fused-away intermediates take no memory.
//!
//! [`analyse`] reads top to bottom, one module per step; every fact about the fused program (alias roots,
//! writer and reader groups, data edges) comes from the [`GroupGraph`]:
//! 1. `regions`: which alias groups go where, and everything outside the pool placed by bumping.
//! 2. `model`: the pool's buffers (one per alias group), their writer and reader kernels, the in-place
//!    candidates — independent of the launch order.
//! 3. Lifetimes over launch steps (DESIGN.md section 5) in the fusion plan's order, and the in-place handovers
//!    (`MemoryOptions::in_place`): an elementwise kernel writes its output over an input that dies at that
//!    launch. `units`: the donor's lifetime then ends at the handover step, and donor and heir form one *unit*
//!    that shares one offset (a chain when the heir donates in turn). `concurrent`: with
//!    `concurrent_lifetimes`, units keep their bytes until their readers' branches meet.
//! 4. `pack`: offsets for the units — the greedy portfolio, then the exact search under `pack_effort` where the
//!    greedy result is above the lower bound and the component is small enough. Deterministic.
//! 5. `reuse::prefer_ordered` (`prefer_ordered_reuse`): units whose place would add an ordering the DAG does
//!    not imply move, when they can, to a gap of the packed pool that adds none.
//! 6. `reuse::edges`: the reuse edges the stream pass must honour, and how many the data edges do not imply.
//!
//! Steps 1-3 are also a value of their own, [`Prepared`] ([`prepare`]): the driver's Concat check reads the bound
//! from it, and the memory pass of the plan it keeps goes on from it ([`analyse_prepared`]) rather than derive
//! it again.
//!
//! `lower_bound_bytes` is the sweep bound of the buffers as packed (in-place donors end at their handover), so
//! `lower_bound_bytes <= pool_bytes <= naive_bytes`. Cost: O(N + E) for the model and lifetimes, O(n log n) for
//! the sweeps, the packer's near-linear greedy plus its bounded search; the ordering preference adds
//! O(k log k) per revisited unit beside k others (O(k) or less where their bounds count per slot) and bounded
//! ancestor queries.

mod concurrent;
mod model;
pub mod pack;
mod reach;
mod regions;
mod reuse;
mod units;

use graph_ir::{ComputeGraph, TensorId};
use serde::{Deserialize, Serialize};
use slotmap::SecondaryMap;

use crate::error::{InternalError, PlanError};
use crate::fusion::FusionPlan;
use crate::group_graph::GroupGraph;
use crate::ids::GroupId;
use crate::interval::Interval;
use crate::target::{Effort, Target};
use model::PoolModel;
use reach::Reach;
use regions::{align_up, Classes};
pub use regions::{outside_slots, OutsideSlot, SharedLayout};

/// A memory region of the plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Region {
    /// The activation pool: intermediates, with reuse.
    Pool,
    /// Weights and constants, uploaded once.
    Weights,
    /// Graph inputs and outputs.
    Io,
    /// Pinned host memory for Memcpy-to-host results.
    Host,
}

impl Region {
    /// Every region, in a stable order.
    pub const ALL: [Region; 4] = [Region::Pool, Region::Weights, Region::Io, Region::Host];

    /// Index in `ALL`.
    pub fn index(self) -> usize {
        match self {
            Region::Pool => 0,
            Region::Weights => 1,
            Region::Io => 2,
            Region::Host => 3,
        }
    }

    /// Lowercase name, as the plan dump prints it.
    pub fn name(self) -> &'static str {
        match self {
            Region::Pool => "pool",
            Region::Weights => "weights",
            Region::Io => "io",
            Region::Host => "host",
        }
    }
}

/// Where a tensor's bytes are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Placement {
    /// The region.
    pub region: Region,
    /// Byte offset in the region (aligned).
    pub offset: u64,
    /// The tensor's size in bytes (unaligned).
    pub bytes: u64,
}

/// An ordering the stream pass must honour: `from` (a reader of the old occupant) before `to` (the writer of
/// the new one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ReuseEdge {
    /// Group that must finish first.
    pub from: GroupId,
    /// Group that overwrites the bytes.
    pub to: GroupId,
}

/// Options of the memory pass.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryOptions {
    /// Share pool bytes between tensors with disjoint lifetimes (off: every buffer gets its own bytes).
    pub reuse: bool,
    /// Let an elementwise op write over an input that dies at that op.
    pub in_place: bool,
    /// Offset alignment in bytes (a power of two).
    pub alignment: u64,
    /// Largest pool accepted; above it planning fails with an error.
    pub max_pool_bytes: u64,
    /// Deterministic effort budget for the packer's exact search (work units, about 10^8 per second; 0: greedy
    /// portfolio only). Spent only on components the greedy result leaves above their lower bound. `None`: the
    /// target's effort level decides ([`search_budgets`]).
    #[serde(default)]
    pub pack_effort: Option<u64>,
    /// Seed for the packer.
    pub seed: u64,
    /// Among places of equal cost, prefer reuse the DAG already orders, and hand over bytes in place only when
    /// the input's other readers are ordered before the kernel: no reuse edge then serialises concurrent work.
    /// Only matters with several streams: the pass skips it when the target has one.
    pub prefer_ordered_reuse: bool,
    /// Trade pool bytes for overlap: each buffer's bytes stay reserved until the branches reading it have met
    /// (the nearest common post-dominator of its readers' first merges in the group DAG, or earlier a merge no
    /// data edge spans; to the end when they never meet), so no reuse edge chains branches the stream pass could
    /// run side by side. Off by default (the pool stays at the order's bound); `lower_bound_bytes` stays the bound
    /// of the plain lifetimes, so the report shows what the overlap costs. Only matters with several streams.
    #[serde(default)]
    pub concurrent_lifetimes: bool,
    /// A plan set's shared weights and io layout (`None`: this plan bumps its own regions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layout: Option<SharedLayout>,
}

/// The cap of the packer's search effort at the default level: at most about 0.1 s of search, spent only where
/// the greedy result is above the lower bound.
pub const DEFAULT_PACK_EFFORT: u64 = 10_000_000;

/// The memory pass's budgets for `units` pool units at `effort`: each linear in the size, capped, and spent
/// only where the greedy answer is above its bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SearchBudgets {
    /// The packer's exact search (work units).
    pub pack_search: u64,
    /// The packer's gap-scanning greedy runs beyond the online allocator (placed-buffer comparisons).
    pub pack_greedy: u64,
    /// The ordered-reuse preference's revisits (neighbour units looked at).
    pub prefer_ordered: u64,
}

/// The budgets of [`SearchBudgets`] for `units` units at `effort` (the default level's caps are today's fixed
/// budgets, reached from about 5,000 units up; smaller graphs get less).
pub fn search_budgets(units: usize, effort: Effort) -> SearchBudgets {
    SearchBudgets {
        pack_search: effort.scaled(units, 2_000, 1_000_000, DEFAULT_PACK_EFFORT),
        pack_greedy: effort.scaled(units, 8_000, 4_000_000, pack::WORK_LIMIT),
        prefer_ordered: effort.scaled(units, 128, 1 << 20, u64::MAX),
    }
}

impl Default for MemoryOptions {
    fn default() -> Self {
        MemoryOptions {
            reuse: true,
            in_place: true,
            alignment: 256,
            max_pool_bytes: 1 << 48,
            pack_effort: None,
            seed: 0,
            prefer_ordered_reuse: true,
            concurrent_lifetimes: false,
            layout: None,
        }
    }
}

/// A pool buffer: one alias group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolBuffer {
    /// The alias root.
    pub root: TensorId,
    /// Live steps (launch indices).
    pub live: Interval,
    /// Aligned size.
    pub size: u64,
    /// Offset in the pool.
    pub offset: u64,
}

/// The result of the memory pass.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MemoryPlan {
    /// Alignment used.
    pub alignment: u64,
    /// Where the slots of eliminated Concats may start (`target::slot_alignment_for` of `alignment`).
    pub slot_alignment: u64,
    /// The placements of the slots of eliminated Concats (and of their views) that do not start their
    /// output's allocation, sorted and distinct: the only placements off `alignment`, each at a multiple of
    /// `slot_alignment`.
    pub slots: Vec<Placement>,
    /// Bytes of each region, indexed by `Region::index`.
    pub region_bytes: [u64; 4],
    /// Placement of every materialised tensor (view outputs share their root's bytes).
    pub placement: SecondaryMap<TensorId, Placement>,
    /// The pool's buffers, one per materialised alias group in the pool.
    pub buffers: Vec<PoolBuffer>,
    /// Sum of the aligned sizes of the pool's buffers (no reuse).
    pub naive_bytes: u64,
    /// Largest sum of aligned sizes live at one launch, for this launch order.
    pub lower_bound_bytes: u64,
    /// Orderings the stream pass must honour.
    pub reuse_edges: Vec<ReuseEdge>,
    /// How many of `reuse_edges` the data edges do not already imply (`from` is not known to be an ancestor of
    /// `to`): the orderings reuse adds to the DAG. An upper bound: ancestor queries are budgeted.
    pub reuse_edges_not_implied: usize,
    /// Graph outputs whose bytes alias a source: (source tensor, output tensor) pairs to copy.
    pub output_copies: Vec<(TensorId, TensorId)>,
    /// Tensors written in place over a dying input.
    pub in_place_count: usize,
    /// The in-place handovers: (input alias root, output root written over it, kernel), in launch order.
    pub in_place: Vec<(TensorId, TensorId, GroupId)>,
    /// Whether the packer proved `pool_bytes` minimal for these lifetimes.
    pub pool_optimal: bool,
}

impl MemoryPlan {
    /// Bytes of the activation pool.
    pub fn pool_bytes(&self) -> u64 {
        self.region_bytes[Region::Pool.index()]
    }
}

/// The pool's buffers for a fusion plan, independent of the launch order: what memory-aware ordering needs to
/// evaluate `lower_bound_bytes` of other group orders (without in-place handovers). Indexed by
/// [`BufferId`](crate::ids::BufferId).
#[derive(Clone, Debug, Default)]
pub struct PoolBuffers {
    /// Aligned size of each buffer.
    pub size: Vec<u64>,
    /// The group that writes each buffer.
    pub writer: Vec<GroupId>,
    /// Groups that read any member of each buffer, ascending.
    pub readers: Vec<Vec<GroupId>>,
}

/// The pool's buffers of `fusion` at `alignment` (see [`PoolBuffers`]).
pub fn pool_buffers(graph: &ComputeGraph, fusion: &FusionPlan, groups: &GroupGraph, alignment: u64) -> PoolBuffers {
    let classes = Classes::new(graph, fusion, groups);
    let m = PoolModel::new(graph, fusion, groups, &classes, alignment, false, None);
    PoolBuffers { size: m.size, writer: m.writer, readers: m.readers }
}

/// Most groups one ancestor query of the memory pass may visit.
const REACH_LIMIT: usize = 4096;

fn bug(what: impl std::fmt::Display) -> PlanError {
    PlanError::Internal(InternalError::new("memory", what))
}

/// Steps 1-3 of the pass (regions, the pool model, lifetimes, in-place handovers and units, in group order):
/// what the bound, the Concat check and the packing all start from. Made once per fusion plan by [`prepare`]
/// and owned, so that a pipeline which asks for the bound first ([`Prepared::concat_bound`]) plans memory from
/// the same front ([`analyse_prepared`]) instead of deriving it again.
pub struct Prepared {
    classes: Classes,
    outside: regions::Outside,
    reach: reach::Detached,
    ordered: bool,
    model: PoolModel,
    live: Vec<Interval>,
    handovers: Vec<model::Handover>,
    units: units::Units,
    /// The fusion plan's groups when it was made (a check that it is used with the same plan).
    groups: usize,
}

/// Steps 1-3 of the memory pass for `fusion` (see [`Prepared`]); `groups`, `target` and `opts` must be those
/// later given to [`analyse_prepared`].
pub fn prepare(
    graph: &ComputeGraph,
    fusion: &FusionPlan,
    groups: &GroupGraph,
    target: &Target,
    opts: &MemoryOptions,
) -> Result<Prepared, PlanError> {
    let a = opts.alignment.max(1);
    // 1. Regions.
    let classes = Classes::new(graph, fusion, groups);
    let outside = regions::place_outside_pool(graph, groups, &classes, a, opts.layout.as_ref())
        .map_err(|e| PlanError::Graph(graph_ir::GraphError::InvalidOption { option: "layout".into(), detail: e }))?;

    // 2. The pool model, and 3. lifetimes, in-place handovers and units, in group order.
    let mut reach = Reach::new(groups, REACH_LIMIT);
    // With one stream every reuse is ordered by stream order: the preference would only cost time.
    let ordered = opts.reuse && opts.prefer_ordered_reuse && target.streams > 1;
    let in_place = opts.reuse && opts.in_place;
    let model =
        PoolModel::new(graph, fusion, groups, &classes, a, in_place, if ordered { Some(&mut reach) } else { None });
    let pos: Vec<u32> = (0..fusion.groups.len() as u32).collect();
    let mut live = model.lifetimes(groups, &pos);
    let handovers = if in_place { model.choose_in_place(&pos, &live) } else { Vec::new() };
    let units = units::form(&mut live, &handovers, &pos);
    let reach = reach.detach();
    Ok(Prepared { classes, outside, reach, ordered, model, live, handovers, units, groups: fusion.groups.len() })
}

/// The pool's lower bound (DESIGN.md 5) of `fusion` in group order, exactly [`analyse`]'s `lower_bound_bytes`,
/// without packing: for a caller comparing fusion plans by their memory bound (the driver's Concat elimination
/// check, which keeps the [`Prepared`] front instead, to plan memory from it for the plan it keeps).
pub fn lower_bound(
    graph: &ComputeGraph,
    fusion: &FusionPlan,
    groups: &GroupGraph,
    target: &Target,
    opts: &MemoryOptions,
) -> Result<u64, PlanError> {
    let _span = tracing::debug_span!("memory_bound").entered();
    Ok(prepare(graph, fusion, groups, target, opts)?.lower_bound(opts))
}

/// [`Prepared::concat_bound`] of a front made here.
pub fn concat_bound(
    graph: &ComputeGraph,
    fusion: &FusionPlan,
    groups: &GroupGraph,
    target: &Target,
    opts: &MemoryOptions,
) -> Result<(u64, bool), PlanError> {
    let _span = tracing::debug_span!("memory_bound").entered();
    Ok(prepare(graph, fusion, groups, target, opts)?.concat_bound(graph, fusion, opts))
}

impl Prepared {
    /// [`lower_bound`] of the plan this front was made for.
    pub fn lower_bound(&self, opts: &MemoryOptions) -> u64 {
        pack::lower_bound(&unit_buffers(&self.units, &self.model, &self.units.live), opts.alignment.max(1))
    }

    /// [`lower_bound`], and whether `fusion`'s Concat eliminations may be what sets it. An eliminated Concat's
    /// output is live from its first slot's producer on, where separate inputs would only fill up to its last
    /// producer: in that early window elimination can hold more bytes, at any later step it holds no more than the
    /// inputs or the output would. So when some step at the peak lies outside every early window, the same groups
    /// with each eliminated Concat as a kernel of its own peak at least as high, and the eliminations cannot have
    /// raised the bound (`false`; also when nothing is eliminated). O(B log B) in the pool's buffers.
    pub fn concat_bound(&self, graph: &ComputeGraph, fusion: &FusionPlan, opts: &MemoryOptions) -> (u64, bool) {
        let buffers = unit_buffers(&self.units, &self.model, &self.units.live);
        let (bound, spans) = pack::peak_spans(&buffers, opts.alignment.max(1));
        // Each eliminated Concat's early window: [first producer's step, last producer's step), steps being group
        // positions (the front's order).
        let mut window: std::collections::HashMap<graph_ir::NodeId, (u64, u64)> = std::collections::HashMap::new();
        for (t, slot) in &fusion.concat_slots {
            let Some(g) = graph.producer(t).and_then(|p| fusion.group_of.get(p)) else {
                // A slot without a producing group is not a case this check understands: ask for the full
                // comparison.
                return (bound, true);
            };
            let s = g.index() as u64;
            let w = window.entry(slot.concat).or_insert((s, s));
            w.0 = w.0.min(s);
            w.1 = w.1.max(s);
        }
        let mut windows: Vec<(u64, u64)> = window.into_values().filter(|w| w.0 < w.1).collect();
        windows.sort_unstable();
        // A step of a peak span outside the union of the windows: walk both lists in time order.
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(windows.len());
        for w in windows {
            match merged.last_mut() {
                Some(last) if w.0 <= last.1 => last.1 = last.1.max(w.1),
                _ => merged.push(w),
            }
        }
        let outside = spans.iter().any(|&(from, to)| {
            // The first step of [from, to) not inside a window.
            let mut t = from;
            for &(a, b) in &merged {
                if b <= t {
                    continue;
                }
                if a > t {
                    break;
                }
                t = b;
            }
            t < to
        });
        (bound, !outside)
    }
}

/// The packer's input: each unit's bytes (its head buffer's) over `live`, its lifetime.
fn unit_buffers(units: &units::Units, model: &PoolModel, live: &[Interval]) -> Vec<pack::Buffer> {
    units
        .head
        .iter()
        .zip(live)
        .map(|(h, lt)| pack::Buffer { lower: lt.start.into(), upper: lt.end.into(), size: model.bytes[h.index()] })
        .collect()
}

/// Run the memory pass over `fusion`'s groups in their order (see the module docs for the steps).
pub fn analyse(
    graph: &ComputeGraph,
    fusion: &FusionPlan,
    groups: &GroupGraph,
    target: &Target,
    opts: &MemoryOptions,
) -> Result<MemoryPlan, PlanError> {
    let prepared = {
        let _span = tracing::debug_span!("memory").entered();
        prepare(graph, fusion, groups, target, opts)?
    };
    analyse_prepared(graph, fusion, groups, target, opts, prepared)
}

/// [`analyse`] from its steps 1-3 made already ([`prepare`], with the same `fusion`, `groups`, `target` and
/// `opts`): the same plan, without deriving the front a second time.
pub fn analyse_prepared(
    graph: &ComputeGraph,
    fusion: &FusionPlan,
    groups: &GroupGraph,
    target: &Target,
    opts: &MemoryOptions,
    prepared: Prepared,
) -> Result<MemoryPlan, PlanError> {
    let _span = tracing::debug_span!("memory").entered();
    let a = opts.alignment.max(1);
    let Prepared { classes, outside, reach, ordered, model, live, handovers, mut units, groups: made_for } = prepared;
    let mut reach = match Reach::attach(groups, reach) {
        Some(r) if made_for == fusion.groups.len() => r,
        _ => return Err(bug("a memory front used with another fusion plan than the one it was made for")),
    };
    // The groups that free each buffer's bytes: its readers, or its writer when nobody reads it.
    let froms: Vec<&[GroupId]> =
        (0..model.len())
            .map(|b| {
                if model.readers[b].is_empty() {
                    std::slice::from_ref(&model.writer[b])
                } else {
                    &model.readers[b][..]
                }
            })
            .collect();
    let naive_bytes = model.size.iter().fold(0u64, |s, &x| s.saturating_add(x));
    // DESIGN.md 5's bound is over the plain lifetimes, before concurrent lifetimes extend them.
    let lower_bound_bytes = pack::lower_bound(&unit_buffers(&units, &model, &units.live), a);
    if opts.reuse && opts.concurrent_lifetimes {
        concurrent::extend(groups, &mut units.live, &units.last, &froms);
    }
    let unit_bufs = unit_buffers(&units, &model, &units.live);
    let budgets = search_budgets(unit_bufs.len(), target.effort);

    // 4. Offsets.
    // With the ordered-reuse preference below, the layout is checked once, after its moves.
    let prefer = ordered && unit_bufs.len() > 1;
    let (mut unit_off, pool_optimal) = unit_offsets(graph, &unit_bufs, opts, &budgets, a, prefer)?;
    let pool_bytes =
        unit_bufs.iter().zip(&unit_off).map(|(b, &o)| o.saturating_add(align_up(b.size, a))).max().unwrap_or(0);

    // 5. Prefer places the DAG already orders.
    if prefer {
        let mut placed: Vec<reuse::Unit> = (0..units.len())
            .map(|u| reuse::Unit {
                live: units.live[u],
                size: align_up(unit_bufs[u].size, a),
                offset: unit_off[u],
                writers: groups.writers(model.roots[units.head[u].index()]),
                froms: froms[units.last[u].index()],
            })
            .collect();
        let stats = reuse::prefer_ordered(&mut placed, pool_bytes, &mut reach, budgets.prefer_ordered);
        tracing::debug!(revisited = stats.revisited, moved = stats.moved, "memory: ordered-reuse preference");
        unit_off = placed.iter().map(|u| u.offset).collect();
        // The packer's layout and these moves, checked together (the packer did not check its own here).
        pack::check(&unit_bufs, &unit_off)
            .map_err(|v| bug(format!("the packed layout after the ordered-reuse moves is invalid: {v}")))?;
    }
    if pool_bytes > opts.max_pool_bytes {
        return Err(PlanError::Graph(graph_ir::GraphError::LimitExceeded {
            what: format!("activation pool of graph '{}' (bytes)", graph.name()),
            value: pool_bytes,
            limit: opts.max_pool_bytes,
        }));
    }

    // Buffers and placements.
    let regions::Outside { mut region_bytes, mut root_place, mut placement, output_copies } = outside;
    let buffers: Vec<PoolBuffer> = (0..model.len())
        .map(|b| {
            let offset = unit_off[units.of[b].index()];
            root_place.insert(model.roots[b], (Region::Pool, offset));
            PoolBuffer { root: model.roots[b], live: live[b], size: model.size[b], offset }
        })
        .collect();
    region_bytes[Region::Pool.index()] = pool_bytes;
    let mut slots: Vec<Placement> = Vec::new();
    for (t, tensor) in graph.tensors() {
        if placement.contains_key(t) {
            continue;
        }
        let r = groups.root(t);
        if let Some(&(region, offset)) = root_place.get(r) {
            if classes.materialized.contains_key(r) || tensor.role.is_source() {
                // A slot of an eliminated Concat sits at its offset inside the Concat output's bytes.
                let within = groups.offset(t);
                let p = Placement { region, offset: offset.saturating_add(within), bytes: tensor.size_bytes() as u64 };
                if within != 0 {
                    slots.push(p);
                }
                placement.insert(t, p);
            }
        }
    }

    // 6. Reuse edges.
    let sweep: Vec<reuse::SweepBuffer<'_>> = (0..model.len())
        .map(|b| reuse::SweepBuffer {
            live: live[b],
            offset: buffers[b].offset,
            size: model.size[b],
            writers: groups.writers(model.roots[b]),
            froms: froms[b],
        })
        .collect();
    let edges = reuse::edges(&sweep);
    let reuse_edges_not_implied = edges.iter().filter(|&&(f, t)| !reach.ordered(f, t)).count();
    let reuse_edges = edges.into_iter().map(|(from, to)| ReuseEdge { from, to }).collect();
    let in_place: Vec<(TensorId, TensorId, GroupId)> =
        handovers.iter().map(|h| (model.roots[h.input.index()], model.roots[h.output.index()], h.group)).collect();
    slots.sort_unstable_by_key(|p| (p.region.index(), p.offset, p.bytes));
    slots.dedup();
    Ok(MemoryPlan {
        alignment: a,
        slot_alignment: crate::target::slot_alignment_for(a),
        slots,
        region_bytes,
        placement,
        buffers,
        naive_bytes,
        lower_bound_bytes,
        reuse_edges,
        reuse_edges_not_implied,
        output_copies,
        in_place_count: in_place.len(),
        in_place,
        pool_optimal,
    })
}

/// Offsets for the units: the packer with reuse (its failures mapped to user limits or planner bugs), one
/// after the other without. `checked_later`: the caller checks the layout it keeps, so the packer need not.
fn unit_offsets(
    graph: &ComputeGraph,
    unit_bufs: &[pack::Buffer],
    opts: &MemoryOptions,
    budgets: &SearchBudgets,
    a: u64,
    checked_later: bool,
) -> Result<(Vec<u64>, bool), PlanError> {
    if !opts.reuse {
        return Ok((bump_offsets(unit_bufs, a), false));
    }
    let popts = pack::PackOptions {
        alignment: a,
        budget: pack::Budget {
            effort: opts.pack_effort.unwrap_or(budgets.pack_search),
            time_limit: None,
            greedy_work: Some(budgets.pack_greedy),
        },
        seed: opts.seed,
    };
    let packed = if checked_later { pack::pack_unchecked(unit_bufs, &popts) } else { pack::pack(unit_bufs, &popts) };
    let p = packed.map_err(|e| match e {
        // A graph whose tensors are too large for 64-bit offsets: the user's limit, not a bug.
        pack::PackError::Overflow { size, .. } => PlanError::Graph(graph_ir::GraphError::LimitExceeded {
            what: format!("activation pool of graph '{}' (bytes; offsets overflow 64 bits)", graph.name()),
            value: size,
            limit: u64::MAX,
        }),
        pack::PackError::Internal(v) => bug(format!("the packer's layout is invalid: {v}")),
        e => bug(format!("the packer rejected the pool's units: {e}")),
    })?;
    Ok((p.offsets, p.optimal))
}

/// Offsets without reuse: every unit after the one before.
fn bump_offsets(bufs: &[pack::Buffer], a: u64) -> Vec<u64> {
    let mut off = 0u64;
    bufs.iter()
        .map(|b| {
            let o = off;
            off = off.saturating_add(align_up(b.size, a));
            o
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{fusion, topo};
    use graph_ir::{DType, Op};

    #[test]
    fn chain_reuses_two_slots_exactly_without_in_place() {
        // x -> a -> b -> c -> d (output), 1 KiB each, fusion off: a, b, c in the pool.
        let mut g = ComputeGraph::new("m");
        let x = g.add_input("x", DType::F32, [256]).unwrap();
        let a = g.add_node("a", Op::Relu, &[x]).unwrap()[0];
        let b = g.add_node("b", Op::Neg, &[a]).unwrap()[0];
        let c = g.add_node("c", Op::Abs, &[b]).unwrap()[0];
        let d = g.add_node("d", Op::Exp, &[c]).unwrap()[0];
        g.mark_output(d).unwrap();
        let order = topo::analyse(&g).unwrap();
        let f = fusion::analyse(&g, &order, &fusion::FusionOptions { enabled: false, ..Default::default() });
        let gg = GroupGraph::new(&g, &order, &f);
        let opts = MemoryOptions { in_place: false, ..Default::default() };
        let m = analyse(&g, &f, &gg, &Target::default(), &opts).unwrap();
        assert_eq!(m.naive_bytes, 3 * 1024);
        assert_eq!(m.lower_bound_bytes, 2 * 1024);
        assert_eq!(m.pool_bytes(), 2 * 1024);
        assert_eq!(m.in_place_count, 0);
        assert_eq!(m.placement[x].region, Region::Io);
        assert_eq!(m.placement[d].region, Region::Io);
        assert_eq!(m.placement[a].offset, m.placement[c].offset);
        assert_ne!(m.placement[a].offset, m.placement[b].offset);
        // c takes a's bytes: a's reader (b, group 1) must precede c's writer (group 2).
        assert_eq!(m.reuse_edges, vec![ReuseEdge { from: GroupId(1), to: GroupId(2) }]);
        assert_eq!(m.reuse_edges_not_implied, 0);
        let naive =
            analyse(&g, &f, &gg, &Target::default(), &MemoryOptions { reuse: false, ..Default::default() }).unwrap();
        assert_eq!(naive.pool_bytes(), 3 * 1024);
        assert!(naive.reuse_edges.is_empty());
        assert_eq!(naive.in_place_count, 0);
    }
}
