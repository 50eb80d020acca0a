//! Property test of the slab: random sequences of bulk allocations, frees,
//! detaches (a slot dropping its handle before the object is freed, as with
//! deferred free) and compactions; after every compaction and at the end,
//! every live object's bytes must be exactly what was written, wherever
//! compaction moved it.

use proptest::prelude::*;
use zblk::alloc::{Handle, ObjAllocator};
use zblk::slab::{SlabAllocator, SlabConfig};
use zblk::testing::OwnerTable as Table;

const SLOTS: usize = 400;

#[derive(Debug, Clone)]
enum Op {
    /// Allocate a group of objects of these sizes into free slots.
    Alloc(Vec<u32>),
    /// Free the objects of some live slots (selected by a seed).
    Free(u64, usize),
    /// Detach some slots' handles (slot reads empty) without freeing yet.
    Detach(u64, usize),
    /// Free everything detached.
    Drain,
    /// Compact everything.
    Compact,
    /// Compact one class for a bounded number of steps.
    CompactStep(usize, usize),
}

fn op() -> impl Strategy<Value = Op> {
    // Sizes skewed like compressed pages: mostly small-to-mid, some huge.
    let size = prop_oneof![
        4 => 1u32..1600,
        2 => 1600u32..3072,
        1 => Just(4096u32),
        1 => 1u32..=4096,
        // Larger than a page: packed groups of up to 8 pages.
        1 => 4097u32..=9 * 4096,
    ];
    prop_oneof![
        6 => prop::collection::vec(size, 1..=16).prop_map(Op::Alloc),
        4 => (any::<u64>(), 1usize..40).prop_map(|(s, n)| Op::Free(s, n)),
        1 => (any::<u64>(), 1usize..10).prop_map(|(s, n)| Op::Detach(s, n)),
        1 => Just(Op::Drain),
        2 => Just(Op::Compact),
        1 => (0usize..255, 1usize..4).prop_map(|(c, n)| Op::CompactStep(c, n)),
    ]
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

struct Model {
    a: SlabAllocator,
    table: Table,
    /// Per slot: (size, seed) of its live object.
    live: Vec<Option<(u32, u64)>>,
    detached: Vec<Handle>,
    next_seed: u64,
}

impl Model {
    fn check_all(&self) {
        for (i, e) in self.live.iter().enumerate() {
            if let Some((size, seed)) = *e {
                let h = *self.table.0[i].lock().unwrap();
                // SAFETY: the slot's live object of `size` bytes; nothing writes it.
                let got = unsafe { self.a.bytes(h, 0, size as usize) }.to_vec();
                assert!(got == pattern(seed, size as usize), "slot {i} corrupted");
            }
        }
    }

    fn pick(&self, seed: u64, n: usize) -> Vec<usize> {
        let live: Vec<usize> = (0..SLOTS).filter(|&i| self.live[i].is_some()).collect();
        if live.is_empty() {
            return Vec::new();
        }
        let mut x = seed | 1;
        let mut out: Vec<usize> = (0..n.min(live.len()))
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                live[(x >> 33) as usize % live.len()]
            })
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    fn apply(&mut self, op: &Op) {
        match op {
            Op::Alloc(sizes) => {
                let free: Vec<usize> = (0..SLOTS).filter(|&i| self.live[i].is_none()).collect();
                let n = sizes.len().min(free.len());
                let owners: Vec<u64> = free[..n].iter().map(|&i| i as u64).collect();
                let mut hs = Vec::new();
                self.a.alloc_bulk(&sizes[..n], &owners, &mut hs).unwrap();
                for ((&slot, &size), &h) in free.iter().zip(sizes).zip(&hs) {
                    self.next_seed += 1;
                    let seed = self.next_seed;
                    // SAFETY: fresh from alloc_bulk, `size` bytes, unpublished.
                    unsafe { self.a.write_fresh(h, 0, &pattern(seed, size as usize)) };
                    *self.table.0[slot].lock().unwrap() = h;
                    self.live[slot] = Some((size, seed));
                }
            }
            Op::Free(seed, n) => {
                let slots = self.pick(*seed, *n);
                let hs: Vec<Handle> = slots
                    .iter()
                    .map(|&i| {
                        self.live[i] = None;
                        std::mem::take(&mut *self.table.0[i].lock().unwrap())
                    })
                    .collect();
                self.a.free_bulk(&hs);
            }
            Op::Detach(seed, n) => {
                for i in self.pick(*seed, *n) {
                    self.live[i] = None;
                    let h = std::mem::take(&mut *self.table.0[i].lock().unwrap());
                    self.detached.push(h);
                }
            }
            Op::Drain => {
                self.a.free_bulk(&self.detached);
                self.detached.clear();
            }
            Op::Compact => {
                let before = self.a.mem_used_total();
                let freed = self.a.compact(&self.table);
                if self.detached.is_empty() {
                    assert_eq!(self.a.compactable_pages(), 0, "compaction left work");
                }
                assert!(self.a.mem_used_total() <= before - freed * 4096);
                self.check_all();
            }
            Op::CompactStep(c, n) => {
                self.a.compact_class(*c, &self.table, *n);
                self.check_all();
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn live_objects_survive_alloc_free_compact(ops in prop::collection::vec(op(), 1..120)) {
        let mut m = Model {
            a: SlabAllocator::new(SlabConfig::default()),
            table: Table::new(SLOTS),
            live: vec![None; SLOTS],
            detached: Vec::new(),
            next_seed: 0,
        };
        for op in &ops {
            m.apply(op);
            prop_assert!(m.a.mem_used_total() <= m.a.mem_used_max());
        }
        m.check_all();
        m.apply(&Op::Drain);
        m.apply(&Op::Compact);
        let all: Vec<Handle> = m.table.0.iter().map(|s| *s.lock().unwrap()).filter(|&h| h != 0).collect();
        prop_assert_eq!(all.len() as u64, m.a.objects());
        m.a.free_bulk(&all);
        prop_assert_eq!(m.a.mem_used_total(), 0);
        prop_assert_eq!(m.a.zspages(), 0);
    }
}
