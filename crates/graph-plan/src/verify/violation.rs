//! What `verify` reports: one `Violation` per broken invariant, naming the steps, streams, kernels, events,
//! nodes and byte ranges involved, with a `Display` a user can read.

use serde::{Deserialize, Serialize};
use std::fmt;

use crate::ids::{EventId, KernelId, StepId, StreamId};
use crate::plan::{Access, BufferRef};

/// The five checks of DESIGN.md section 4.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Check {
    /// Every non-view node runs exactly once; launches agree with their kernels.
    Coverage,
    /// Data dependencies and reuse edges are ordered; records precede their waits.
    Order,
    /// No unordered conflicting accesses; every read sees the bytes its tensor's writer left.
    Memory,
    /// Ranges lie inside their regions, aligned.
    Bounds,
    /// The header fields agree with the steps.
    Counters,
}

impl Check {
    /// Lowercase name, as `Display` prefixes a violation with it.
    pub fn name(self) -> &'static str {
        match self {
            Check::Coverage => "coverage",
            Check::Order => "order",
            Check::Memory => "memory",
            Check::Bounds => "bounds",
            Check::Counters => "counters",
        }
    }
}

/// A step as a violation names it: its position, its stream and the kernel it launches (`None` for a copy).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct StepRef {
    /// Position in submission order.
    pub step: StepId,
    /// Stream it is submitted to.
    pub stream: StreamId,
    /// Kernel it launches; `None` for a copy.
    pub kernel: Option<KernelId>,
}

impl fmt::Display for StepRef {
    /// `#4 (s1, k3)`, or `#4 (s1, copy)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kernel {
            Some(k) => write!(f, "{} ({}, {k})", self.step, self.stream),
            None => write!(f, "{} ({}, copy)", self.step, self.stream),
        }
    }
}

/// Where a buffer range was found: a step's reads, writes, source or destination, or an external binding.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Site {
    /// A launch's or a copy's range.
    Step(StepId),
    /// An external binding, by tensor name.
    Binding(String),
    /// A slot of an eliminated Concat the plan lists (`ExecutionPlan::slots`), by its index there.
    Slot(usize),
}

impl fmt::Display for Site {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Site::Step(s) => write!(f, "{s}"),
            Site::Binding(name) => write!(f, "binding '{name}'"),
            Site::Slot(i) => write!(f, "concat slot #{i}"),
        }
    }
}

/// A header field of the plan that the counters check compares with the steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Field {
    /// `kernel_count_original`: non-view nodes.
    KernelCountOriginal,
    /// `kernel_count_fused`: launch steps.
    KernelCountFused,
    /// `event_count`: distinct events recorded or waited on.
    EventCount,
    /// `num_streams`: at least 1 (the check reports `actual` as the streams the steps use, at least 1).
    NumStreams,
    /// `pool_bytes`: the pool region's size.
    PoolBytes,
}

impl Field {
    /// The field's name in `ExecutionPlan`.
    pub fn name(self) -> &'static str {
        match self {
            Field::KernelCountOriginal => "kernel_count_original",
            Field::KernelCountFused => "kernel_count_fused",
            Field::EventCount => "event_count",
            Field::NumStreams => "num_streams",
            Field::PoolBytes => "pool_bytes",
        }
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One way a plan breaks an invariant. `check()` says which of the five checks found it; `steps()` lists the
/// steps it names.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Violation {
    // ---- coverage ----
    /// A non-view node runs in no launched kernel and no copy.
    NodeNotRun {
        /// The node.
        node: String,
    },
    /// A non-view node runs more than once (in several kernels or copies, or twice in one body).
    NodeRunTwice {
        /// The node.
        node: String,
        /// Every step that runs it, in order.
        steps: Vec<StepId>,
    },
    /// A launched kernel's body or a copy names a node the plan does not list as a non-view node.
    UnknownNode {
        /// The step.
        step: StepId,
        /// The name it gives.
        node: String,
    },
    /// A launch or a reuse edge names a kernel the plan does not have.
    UnknownKernel {
        /// The launch; `None` for a reuse edge.
        step: Option<StepId>,
        /// The kernel id.
        kernel: KernelId,
    },
    /// A kernel is launched more than once (reported for each launch after the first).
    KernelLaunchedTwice {
        /// The kernel.
        kernel: KernelId,
        /// Its first launch.
        first: StepId,
        /// The later launch.
        again: StepId,
    },
    /// A launch's `reads` (or `writes`) are not the set of its kernel's Read (or Write) param buffers.
    StepParams {
        /// The launch.
        step: StepId,
        /// Its kernel.
        kernel: KernelId,
        /// Which list disagrees.
        access: Access,
        /// Param buffers the step does not list.
        missing: Vec<BufferRef>,
        /// Step ranges no param binds.
        extra: Vec<BufferRef>,
    },

    // ---- order ----
    /// A launch reads a tensor whose writer does not happen before it (unordered, or submitted later).
    Dependency {
        /// The alias root the reader's param names.
        tensor: String,
        /// The launch that writes it.
        writer: StepRef,
        /// The launch that reads it.
        reader: StepRef,
    },
    /// A reuse edge of the memory plan (`from` before `to`) is not ordered by the steps.
    ReuseOrder {
        /// The launch that must finish first.
        from: StepRef,
        /// The launch that must start after.
        to: StepRef,
    },
    /// An event is recorded more than once (waits then see only the latest record).
    RecordTwice {
        /// The event.
        event: EventId,
        /// Its first record.
        first: StepId,
        /// The later record.
        again: StepId,
    },
    /// A wait comes before its event's record in submission order (it waits for nothing).
    WaitBeforeRecord {
        /// The event.
        event: EventId,
        /// The wait.
        wait: StepId,
        /// The first record, later in submission order.
        record: StepId,
    },
    /// A wait on an event no step records.
    WaitNeverRecorded {
        /// The event.
        event: EventId,
        /// The wait.
        wait: StepId,
    },
    /// The steps use more distinct streams than the checker's vector clocks handle; the order and memory
    /// checks were skipped.
    TooManyStreams {
        /// Distinct streams the steps use.
        streams: usize,
        /// Most the checker handles.
        limit: usize,
    },

    // ---- memory ----
    /// Two accesses to overlapping bytes, at least one a write, with no happens-before between them.
    Race {
        /// What the earlier step (in submission order) does to the bytes.
        earlier: Access,
        /// What the later step does.
        later: Access,
        /// The bytes both touch (the hull of the overlapping parts).
        range: BufferRef,
        /// The earlier step.
        first: StepRef,
        /// The later step.
        second: StepRef,
    },
    /// A launch reads a tensor whose bytes were last written (in submission order) by someone other than the
    /// tensor's writer: a buffer placed over live bytes, or read where its writer did not write it.
    Clobbered {
        /// The alias root the reader's param names.
        tensor: String,
        /// The bytes in question (the hull of the wrong parts).
        range: BufferRef,
        /// The launch that reads.
        reader: StepRef,
        /// The tensor's writer; `None` when no launch should write it (an input, weight, constant or copy
        /// destination).
        writer: Option<StepRef>,
        /// The step that last wrote the bytes; `None` when nothing wrote them.
        by: Option<StepRef>,
    },

    // ---- bounds ----
    /// A range ends past its region's size.
    OutOfRegion {
        /// Where the range was found.
        site: Site,
        /// The range.
        range: BufferRef,
        /// The region's size.
        region_bytes: u64,
    },
    /// A range's offset is not a multiple of the plan's alignment.
    Misaligned {
        /// Where the range was found.
        site: Site,
        /// The range.
        range: BufferRef,
        /// The plan's alignment.
        alignment: u64,
    },
    /// A copy moves more bytes than its source or destination holds.
    CopyLength {
        /// The copy.
        step: StepId,
        /// Bytes it claims to copy.
        bytes: u64,
        /// Source.
        src: BufferRef,
        /// Destination.
        dst: BufferRef,
    },

    // ---- counters ----
    /// A header field disagrees with the steps.
    Counter {
        /// The field.
        field: Field,
        /// Its value.
        claimed: u64,
        /// What the steps (or nodes, or regions) say.
        actual: u64,
    },
    /// A step is submitted to a stream at or past `num_streams`.
    StreamOutOfRange {
        /// The step.
        step: StepId,
        /// Its stream.
        stream: StreamId,
        /// The plan's stream count.
        num_streams: u64,
    },
}

impl Violation {
    /// Which check found it.
    pub fn check(&self) -> Check {
        use Violation::*;
        match self {
            NodeNotRun { .. }
            | NodeRunTwice { .. }
            | UnknownNode { .. }
            | UnknownKernel { .. }
            | KernelLaunchedTwice { .. }
            | StepParams { .. } => Check::Coverage,
            Dependency { .. }
            | ReuseOrder { .. }
            | RecordTwice { .. }
            | WaitBeforeRecord { .. }
            | WaitNeverRecorded { .. }
            | TooManyStreams { .. } => Check::Order,
            Race { .. } | Clobbered { .. } => Check::Memory,
            OutOfRegion { .. } | Misaligned { .. } | CopyLength { .. } => Check::Bounds,
            Counter { .. } | StreamOutOfRange { .. } => Check::Counters,
        }
    }

    /// The steps it names, in the order its fields list them.
    pub fn steps(&self) -> Vec<StepId> {
        use Violation::*;
        match self {
            NodeNotRun { .. } | TooManyStreams { .. } | Counter { .. } => Vec::new(),
            NodeRunTwice { steps, .. } => steps.clone(),
            UnknownNode { step, .. } | StepParams { step, .. } | CopyLength { step, .. } => vec![*step],
            StreamOutOfRange { step, .. } => vec![*step],
            UnknownKernel { step, .. } => step.iter().copied().collect(),
            KernelLaunchedTwice { first, again, .. } | RecordTwice { first, again, .. } => vec![*first, *again],
            Dependency { writer, reader, .. } => vec![writer.step, reader.step],
            ReuseOrder { from, to } => vec![from.step, to.step],
            WaitBeforeRecord { wait, record, .. } => vec![*wait, *record],
            WaitNeverRecorded { wait, .. } => vec![*wait],
            Race { first, second, .. } => vec![first.step, second.step],
            Clobbered { reader, writer, by, .. } => {
                let mut v = vec![reader.step];
                v.extend(writer.map(|w| w.step));
                v.extend(by.map(|b| b.step));
                v
            }
            OutOfRegion { site, .. } | Misaligned { site, .. } => match site {
                Site::Step(s) => vec![*s],
                Site::Binding(_) | Site::Slot(_) => Vec::new(),
            },
        }
    }
}

fn word(a: Access) -> &'static str {
    match a {
        Access::Read => "read",
        Access::Write => "write",
    }
}

fn list(f: &mut fmt::Formatter<'_>, items: &[BufferRef]) -> fmt::Result {
    f.write_str("[")?;
    for (i, b) in items.iter().enumerate() {
        if i > 0 {
            f.write_str(", ")?;
        }
        write!(f, "{b}")?;
    }
    f.write_str("]")
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use Violation::*;
        write!(f, "{}: ", self.check().name())?;
        match self {
            NodeNotRun { node } => write!(f, "node '{node}' runs in no launched kernel and no copy"),
            NodeRunTwice { node, steps } => {
                write!(f, "node '{node}' runs {} times, at", steps.len())?;
                for (i, s) in steps.iter().enumerate() {
                    write!(f, "{}{s}", if i == 0 { " " } else { ", " })?;
                }
                Ok(())
            }
            UnknownNode { step, node } => {
                write!(f, "{step} runs '{node}', which is not a non-view node of the plan")
            }
            UnknownKernel { step: Some(step), kernel } => {
                write!(f, "{step} launches {kernel}, which the plan does not have")
            }
            UnknownKernel { step: None, kernel } => {
                write!(f, "a reuse edge names {kernel}, which the plan does not have")
            }
            KernelLaunchedTwice { kernel, first, again } => {
                write!(f, "{kernel} is launched more than once: at {first} and again at {again}")
            }
            StepParams { step, kernel, access, missing, extra } => {
                write!(
                    f,
                    "{step} ({kernel}) lists {}s that disagree with the kernel's params: missing ",
                    word(*access)
                )?;
                list(f, missing)?;
                f.write_str(", extra ")?;
                list(f, extra)
            }
            Dependency { tensor, writer, reader } => {
                if writer.step > reader.step {
                    write!(f, "{reader} reads '{tensor}' before its writer {writer} is submitted")
                } else {
                    write!(f, "{reader} reads '{tensor}' written by {writer}, but nothing orders them")
                }
            }
            ReuseOrder { from, to } => {
                let (a, b) = (from.kernel, to.kernel);
                let name = |k: Option<KernelId>| k.map_or_else(|| "?".to_string(), |k| k.to_string());
                write!(f, "reuse edge {} -> {} is not ordered: {from} must happen before {to}", name(a), name(b))
            }
            RecordTwice { event, first, again } => {
                write!(f, "{event} is recorded more than once: at {first} and again at {again}")
            }
            WaitBeforeRecord { event, wait, record } => {
                write!(f, "{wait} waits for {event}, which is only recorded later, at {record}")
            }
            WaitNeverRecorded { event, wait } => write!(f, "{wait} waits for {event}, which no step records"),
            TooManyStreams { streams, limit } => write!(
                f,
                "the steps use {streams} streams, more than the {limit} the checker handles; order and memory \
                 checks skipped"
            ),
            Race { earlier, later, range, first, second } => {
                write!(f, "unordered {}/{} on {range}: {first} and {second}", word(*earlier), word(*later))
            }
            Clobbered { tensor, range, reader, writer, by } => {
                write!(f, "{reader} reads '{tensor}' at {range}, ")?;
                match (writer, by) {
                    (Some(w), Some(b)) => write!(f, "last written by {b} instead of its writer {w}"),
                    (Some(w), None) => write!(f, "which its writer {w} never wrote"),
                    (None, Some(b)) => write!(f, "which no launch should write, but {b} wrote it"),
                    (None, None) => write!(f, "which nothing wrote"),
                }
            }
            OutOfRegion { site, range, region_bytes } => {
                write!(f, "{site} uses {range}, past the end of the region's {region_bytes} bytes")
            }
            Misaligned { site, range, alignment } => {
                write!(f, "{site} uses {range}, whose offset is not a multiple of {alignment}")
            }
            CopyLength { step, bytes, src, dst } => {
                write!(f, "{step} copies {bytes} bytes from {src} to {dst}, more than one of them holds")
            }
            Counter { field, claimed, actual } => write!(f, "{field} is {claimed}, but the plan has {actual}"),
            StreamOutOfRange { step, stream, num_streams } => {
                write!(f, "{step} is submitted to {stream}, but the plan has {num_streams} streams")
            }
        }
    }
}

impl std::error::Error for Violation {}
