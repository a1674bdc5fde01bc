//! Packing units: the in-place handovers turned into what the packer places. A unit is a buffer, or a chain of
//! buffers each written in place over the one before (a donor's lifetime ends at its handover step, its heir
//! starts there), sharing one offset. A unit lives from its head's first step to the end of its longest-lived
//! member; that member's readers are the ones that free the unit's bytes. O(n).

use crate::ids::{BufferId, UnitId};
use crate::interval::Interval;
use crate::memory::model::Handover;

/// The units of a pool (see the module docs).
pub(crate) struct Units {
    /// Unit of each buffer.
    pub of: Vec<UnitId>,
    /// First buffer (the chain's head) of each unit.
    pub head: Vec<BufferId>,
    /// The member of each unit that lives longest.
    pub last: Vec<BufferId>,
    /// Live steps of each unit.
    pub live: Vec<Interval>,
}

impl Units {
    /// Number of units.
    pub fn len(&self) -> usize {
        self.head.len()
    }
}

/// Apply `handovers` (in step order; group `g` runs at step `pos[g]`) to the buffers' lifetimes `live` — each
/// donor now ends at its handover — and form the units.
pub(crate) fn form(live: &mut [Interval], handovers: &[Handover], pos: &[u32]) -> Units {
    let n = live.len();
    // The chain head of each buffer (handovers come in step order, so a donor's head is known first).
    let mut head_of: Vec<BufferId> = (0..n).map(BufferId::from_index).collect();
    for h in handovers {
        live[h.input.index()].end = pos[h.group.index()];
        head_of[h.output.index()] = head_of[h.input.index()];
    }
    let mut of = vec![UnitId(u32::MAX); n];
    let mut head: Vec<BufferId> = Vec::new();
    for (b, h) in head_of.iter().enumerate() {
        if h.index() == b {
            of[b] = UnitId::from_index(head.len());
            head.push(*h);
        }
    }
    let mut last = head.clone();
    let mut unit_live: Vec<Interval> = head.iter().map(|h| live[h.index()]).collect();
    for b in 0..n {
        let u = of[head_of[b].index()];
        of[b] = u;
        let ul = &mut unit_live[u.index()];
        if live[b].end > ul.end {
            ul.end = live[b].end;
            last[u.index()] = BufferId::from_index(b);
        }
    }
    Units { of, head, last, live: unit_live }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::GroupId;

    #[test]
    fn a_chain_of_two_handovers_is_one_unit() {
        // b0 [0,2) -> b1 written over it at step 1, b1 [1,3) -> b2 over it at step 2, b2 [2,5); b3 alone.
        let mut live = vec![Interval::new(0, 2), Interval::new(1, 3), Interval::new(2, 5), Interval::new(0, 1)];
        let hs = [
            Handover { input: BufferId(0), output: BufferId(1), group: GroupId(1) },
            Handover { input: BufferId(1), output: BufferId(2), group: GroupId(2) },
        ];
        let u = form(&mut live, &hs, &[0, 1, 2, 3, 4]);
        assert_eq!(live[0], Interval::new(0, 1));
        assert_eq!(live[1], Interval::new(1, 2));
        assert_eq!(u.len(), 2);
        assert_eq!(u.of, vec![UnitId(0), UnitId(0), UnitId(0), UnitId(1)]);
        assert_eq!(u.head, vec![BufferId(0), BufferId(3)]);
        assert_eq!(u.last, vec![BufferId(2), BufferId(3)]);
        assert_eq!(u.live, vec![Interval::new(0, 5), Interval::new(0, 1)]);
    }
}
