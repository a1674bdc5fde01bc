//! Indices the checks share, built in one pass over the steps and kernels: dense stream and event numbers,
//! each kernel's first launch, the source tensors' names, and (on demand) the writer kernels of each alias root.

use std::cell::OnceCell;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::ids::{KernelId, StepId};
use crate::plan::{Access, BindingRole, ExecutionPlan, PlanStep};

use super::violation::StepRef;

/// A multiply-rotate hasher (the Fx scheme, with a finaliser) for the name tables: on a million names SipHash costs more than
/// the rest of the lookup. Worst case under crafted colliding names is slower verification, not a wrong one.
#[derive(Clone, Copy, Default)]
pub(super) struct FastHasher(u64);

impl FastHasher {
    fn add(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for FastHasher {
    fn finish(&self) -> u64 {
        // The multiply leaves the low bits (the bucket index) depending only on the keys' low bytes, which
        // names like "n123456" share: mix the high bits down (murmur3's finaliser).
        let mut h = self.0;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^ (h >> 33)
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.add(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(w));
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.add(u64::from(n));
    }

    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }
}

/// A hash map with `FastHasher`.
pub(super) type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;

/// "No such step / kernel / dense id".
pub(super) const NONE: u32 = u32::MAX;

/// Map sparse `u32` ids to dense `0..n` in order of first appearance: a table when the ids are small (plans
/// number them densely), a hash map otherwise (a hand-edited plan may use any id).
pub(super) enum Densify {
    Table(Vec<u32>),
    Map(FastMap<u32, u32>),
}

impl Densify {
    pub(super) fn new(max_id: u32, len: usize) -> Self {
        if (max_id as usize) <= len.saturating_mul(2).saturating_add(64) {
            Densify::Table(vec![NONE; max_id as usize + 1])
        } else {
            Densify::Map(FastMap::default())
        }
    }

    /// The dense number of `id`, `next` assigned when it is new.
    pub(super) fn get_or_insert(&mut self, id: u32, next: &mut u32) -> u32 {
        let slot = match self {
            Densify::Table(t) => match t.get_mut(id as usize) {
                Some(s) => s,
                None => return NONE,
            },
            Densify::Map(m) => m.entry(id).or_insert(NONE),
        };
        if *slot == NONE {
            *slot = *next;
            *next += 1;
        }
        *slot
    }
}

/// What the checks look up.
pub(super) struct Index<'p> {
    pub plan: &'p ExecutionPlan,
    /// Dense stream number of each step.
    pub stream: Vec<u32>,
    /// Distinct streams the steps use.
    pub num_streams: usize,
    /// Dense event number of each Record/Wait step (`NONE` for other steps).
    pub event: Vec<u32>,
    /// Distinct events the steps use.
    pub num_events: usize,
    /// First launch step of each kernel (`NONE` when never launched).
    pub first_launch: Vec<u32>,
    /// Names of the inputs, weights and constants (tensors no launch writes).
    sources: FastMap<&'p str, ()>,
    /// Writer kernels by root name, built on first use (`replay` asks only when the bytes a read sees do not
    /// already name their writer).
    writers: OnceCell<Writers<'p>>,
}

impl<'p> Index<'p> {
    pub(super) fn new(plan: &'p ExecutionPlan) -> Self {
        let steps = &plan.steps;
        let (mut max_stream, mut max_event) = (0u32, 0u32);
        for s in steps {
            max_stream = max_stream.max(s.stream().0);
            if let PlanStep::Record { event, .. } | PlanStep::Wait { event, .. } = s {
                max_event = max_event.max(event.0);
            }
        }
        let mut streams = Densify::new(max_stream, steps.len());
        let mut events = Densify::new(max_event, steps.len());
        let (mut ns, mut ne) = (0u32, 0u32);
        let mut stream = Vec::with_capacity(steps.len());
        let mut event = Vec::with_capacity(steps.len());
        let mut first_launch = vec![NONE; plan.kernels().len()];
        for (i, s) in steps.iter().enumerate() {
            stream.push(streams.get_or_insert(s.stream().0, &mut ns));
            event.push(match s {
                PlanStep::Record { event, .. } | PlanStep::Wait { event, .. } => events.get_or_insert(event.0, &mut ne),
                _ => NONE,
            });
            if let PlanStep::Launch { kernel, .. } = s {
                if let Some(f) = first_launch.get_mut(kernel.index()) {
                    if *f == NONE {
                        *f = i as u32;
                    }
                }
            }
        }
        let sources = plan
            .bindings()
            .iter()
            .filter(|b| matches!(b.role, BindingRole::Input | BindingRole::Weight | BindingRole::Constant))
            .map(|b| (b.name.as_ref(), ()))
            .collect();
        Index {
            plan,
            stream,
            num_streams: ns as usize,
            event,
            num_events: ne as usize,
            first_launch,
            sources,
            writers: OnceCell::new(),
        }
    }

    /// The kernels with a Write param of alias root `root`; `None` when there is none.
    pub(super) fn writers(&self, root: &str) -> Option<&[KernelId]> {
        self.writers.get_or_init(|| Writers::new(self.plan)).get(root)
    }

    /// Is `name` an input, weight or constant binding?
    pub(super) fn is_source(&self, name: &str) -> bool {
        self.sources.contains_key(name)
    }

    /// The step at `i` as violations name it.
    pub(super) fn step_ref(&self, i: u32) -> StepRef {
        let step = &self.plan.steps[i as usize];
        let kernel = match step {
            PlanStep::Launch { kernel, .. } => Some(*kernel),
            _ => None,
        };
        StepRef { step: StepId(i), stream: step.stream(), kernel }
    }
}

/// Writer kernels of each alias root: root r's are `list[at[r]..at[r + 1]]`, sorted and deduplicated (one flat
/// list rather than a `Vec` per root: a million small allocations cost more than the lookups).
pub(super) struct Writers<'p> {
    roots: FastMap<&'p str, u32>,
    at: Vec<u32>,
    list: Vec<KernelId>,
}

impl<'p> Writers<'p> {
    fn new(plan: &'p ExecutionPlan) -> Self {
        let mut roots: FastMap<&'p str, u32> =
            FastMap::with_capacity_and_hasher(plan.kernels().len(), Default::default());
        let mut pairs: Vec<(u32, KernelId)> = Vec::with_capacity(plan.kernels().len());
        for (ki, k) in plan.kernels().iter().enumerate() {
            for p in k.params.iter().filter(|p| p.access == Access::Write) {
                let next = roots.len() as u32;
                let r = *roots.entry(p.root.as_ref()).or_insert(next);
                pairs.push((r, KernelId::from_index(ki)));
            }
        }
        pairs.sort_unstable();
        pairs.dedup();
        let mut at = vec![0u32; roots.len() + 1];
        for &(r, _) in &pairs {
            at[r as usize + 1] += 1;
        }
        for r in 0..roots.len() {
            at[r + 1] += at[r];
        }
        Writers { roots, at, list: pairs.into_iter().map(|(_, k)| k).collect() }
    }

    fn get(&self, root: &str) -> Option<&[KernelId]> {
        let r = *self.roots.get(root)? as usize;
        self.list.get(self.at[r] as usize..self.at[r + 1] as usize)
    }
}
