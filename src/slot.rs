//! The slot table entry: 16 bytes per 4 KB page of device, with its own lock.
//!
//! Like zram's `zram_table_entry`, each slot carries a lock bit in its flags
//! word, so locking is per page and nothing global is taken on the I/O path.
//! Critical sections are short (a decompression at most), so the lock spins
//! briefly and then yields.
//!
//! The flags word and the value word form one 16-byte atomic. Taking the
//! lock sets the lock bit; a holder's changes stay in its [`SlotGuard`] and
//! reach the slot in the one 16-byte store that also unlocks it. So at any
//! instruction the slot's memory holds one whole entry, old or new, which
//! is what lets a store in shared memory be recovered after its process
//! died in the middle of a write (a slot found locked holds its old entry).
//!
//! # The `meta` word
//!
//! | bits | field | what |
//! | --- | --- | --- |
//! | 0-19 | `len` | object length in bytes |
//! | 20-25 | `idx` | packed: the page's offset in its group (0..64) |
//! | 26-27 | `algo` | which algorithm holds the object: 0 the store's primary, 1-3 one of its secondaries (recompression), the entry of its list |
//! | 28-34 | `n` | packed: pages in the group object (1..=64) |
//! | 35 | `idle` | marked idle (`Store::mark_idle`); any access clears it |
//! | 36-59 | `atime` | last access, seconds of the store's clock (`crate::clock`), wrapping at 2^24 (194 days) |
//! | 60-62 | kind | [`Kind`]: 0-6 as listed (5: a per-page object written back to the backing store, 6: a page of a packed group written back); 7 reserved |
//! | 63 | lock | the slot lock |
//!
//! A written-back page (kind 5, [`Kind::Backed`]) has no RAM object; its
//! fields say where its object lies in the backing store (`crate::backing`):
//!
//! | field | kind 5 holds |
//! | --- | --- |
//! | `len` | the object's length (4096: the page raw, else compressed by `algo`) |
//! | `idx` | bits 0-5 of the object's byte offset in its 4 KB block |
//! | `n` | bits 6-11 of that offset (objects never cross a block) |
//! | `val` bits 0-31 | CRC-32 of the page number and the object: a read that finds other bytes fails (EIO), never returns a wrong page |
//! | `val` bits 32-63 | the backing block (16 TiB of backing store at most) |
//!
//! A page of a written-back packed group (kind 6, [`Kind::BackedGroup`])
//! names the group's place on the backing store and its own position in
//! the group's blob; the rest (the group's mask of pages, its first page,
//! the whole CRC) is in the group's header on the backing store
//! (`crate::packed`, "Packed groups on the backing store"):
//!
//! | field | kind 6 holds |
//! | --- | --- |
//! | `len` | the group's compressed blob, in bytes (the group's header not included) |
//! | `idx` | the page's position in the blob (0..`n`), not its offset in the group |
//! | `n` | pages in the blob |
//! | `algo` | the algorithm that compressed the blob |
//! | `val` bits 0-23 | the low 24 bits of the group's CRC-32, whose whole value its header holds: a slot naming a place another group took fails its read |
//! | `val` bits 24-31 | the byte offset of the group's header in its first block, in units of 16 bytes (groups start 16-byte aligned, and may cross blocks) |
//! | `val` bits 32-63 | the group's first block |
//!
//! A huge page (kind 2) uses `n` as a mark: 1 when recompression could not
//! compress it either (zram's `ZRAM_INCOMPRESSIBLE`), which `writeback
//! --type incompressible` selects and recompression skips.
//!
//! A read updates `atime` and clears `idle` in its guard (`SlotGuard::touch`),
//! so the unlock store it makes anyway carries them: no second atomic.

use crate::alloc::Handle;
use portable_atomic::AtomicU128;
use std::sync::atomic::Ordering;

/// What a slot holds, from its flags word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Never written or discarded: reads as zeros.
    Empty,
    /// A page of one repeated 8-byte word, kept in `val`.
    Same,
    /// A page stored raw (did not compress below the huge threshold).
    Huge,
    /// A compressed object of `len` bytes at handle `val`.
    Compressed,
    /// Page `idx` of a packed group object at handle `val`, whose
    /// compressed blob of `n` pages is `len` bytes (packed mode).
    Packed,
    /// Written back: an object of `len` bytes in the backing store, where
    /// [`Entry::backed_at`] says.
    Backed,
    /// Written back packed: position `idx` of a group's blob of `n` pages
    /// and `len` bytes in the backing store, where [`Entry::group_at`]
    /// says.
    BackedGroup,
}

/// Where a written-back page's object lies in the backing store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackedAt {
    /// The 4 KB block.
    pub block: u32,
    /// Byte offset in the block.
    pub off: u16,
    /// CRC-32 of the page number and the object.
    pub crc: u32,
}

/// Where a written-back packed group lies in the backing store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupAt {
    /// The group's first 4 KB block.
    pub block: u32,
    /// Byte offset of the group's header in that block (a multiple of
    /// [`GROUP_ALIGN`]).
    pub off: u16,
    /// The low 24 bits of the group's CRC-32.
    pub tag: u32,
}

/// Alignment of a written-back group's header in its first block.
pub const GROUP_ALIGN: usize = 16;
/// Bits of a group's CRC-32 its slots keep ([`GroupAt::tag`]).
const TAG_BITS: u32 = 24;
/// The mask of [`GroupAt::tag`].
pub const TAG_MASK: u32 = (1 << TAG_BITS) - 1;

const LOCK: u64 = 1 << 63;
const KIND_SHIFT: u32 = 60;
const KIND_MASK: u64 = 0b111 << KIND_SHIFT;
const LEN_MASK: u64 = (1 << 20) - 1;
const IDX_SHIFT: u32 = 20;
const IDX_MASK: u64 = 0x3f;
const ALGO_SHIFT: u32 = 26;
const ALGO_MASK: u64 = 0b11;
const N_SHIFT: u32 = 28;
const N_MASK: u64 = 0x7f;
const IDLE: u64 = 1 << 35;
const ATIME_SHIFT: u32 = 36;
/// Bits of a slot's access time.
pub const ATIME_BITS: u32 = 24;
/// The access time's mask (after the shift): times wrap at 2^24 seconds.
pub const ATIME_MASK: u32 = (1 << ATIME_BITS) - 1;
/// `Entry::n` of a huge page recompression could not compress.
pub const INCOMPRESSIBLE: u8 = 1;

/// One slot: the low 64 bits (`meta`) hold the lock bit, the kind and the
/// object length; the high 64 bits (`val`) hold the handle, or the fill
/// word of a same-filled page.
#[derive(Debug, Default)]
#[repr(C)]
pub struct Slot {
    word: AtomicU128,
}

fn join(meta: u64, val: u64) -> u128 {
    (u128::from(val) << 64) | u128::from(meta)
}

fn split(word: u128) -> (u64, u64) {
    (word as u64, (word >> 64) as u64)
}

/// The decoded content of a slot: what a writer installs or takes out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// What the slot holds.
    pub kind: Kind,
    /// Object length in bytes (compressed or huge), 0 otherwise.
    pub len: u32,
    /// Handle (huge, compressed, packed) or fill word (same-filled).
    pub val: u64,
    /// Packed: the page's offset within its group (0..64).
    pub idx: u8,
    /// Packed: how many pages the group object holds (1..=64).
    pub n: u8,
    /// Which algorithm compressed the object: 0 the primary, 1-3 an entry
    /// of the store's secondaries (recompression).
    pub algo: u8,
    /// Marked idle since its last access.
    pub idle: bool,
    /// Last access, in seconds of the store's clock, modulo 2^24.
    pub atime: u32,
}

impl Entry {
    /// The empty entry.
    pub const EMPTY: Entry = Entry {
        kind: Kind::Empty,
        len: 0,
        val: 0,
        idx: 0,
        n: 0,
        algo: 0,
        idle: false,
        atime: 0,
    };

    /// An entry of `kind` with length `len` and value `val`.
    pub fn new(kind: Kind, len: u32, val: u64) -> Entry {
        Entry {
            kind,
            len,
            val,
            idx: 0,
            n: 0,
            algo: 0,
            idle: false,
            atime: 0,
        }
    }

    /// Whether `self` and `other` hold the same object the same way, access
    /// time and idle mark aside (a read in between changes those).
    pub fn same_object(&self, other: &Entry) -> bool {
        Entry {
            idle: false,
            atime: 0,
            ..*self
        } == Entry {
            idle: false,
            atime: 0,
            ..*other
        }
    }

    /// The object handle this entry owns, if any (a written-back page's
    /// object is not in RAM).
    pub fn handle(&self) -> Option<Handle> {
        match self.kind {
            Kind::Huge | Kind::Compressed | Kind::Packed => Some(self.val),
            Kind::Empty | Kind::Same | Kind::Backed | Kind::BackedGroup => None,
        }
    }

    /// A written-back page: `len` bytes at `at`, compressed by `algo`
    /// (ignored when `len` is a whole page: raw).
    pub fn backed(at: BackedAt, len: u32, algo: u8) -> Entry {
        Entry {
            kind: Kind::Backed,
            len,
            val: (u64::from(at.block) << 32) | u64::from(at.crc),
            idx: (at.off & 0x3f) as u8,
            n: ((at.off >> 6) & 0x3f) as u8,
            algo,
            idle: false,
            atime: 0,
        }
    }

    /// Where a written-back page's object lies (meaningful for
    /// [`Kind::Backed`] only).
    pub fn backed_at(&self) -> BackedAt {
        BackedAt {
            block: (self.val >> 32) as u32,
            off: u16::from(self.idx) | (u16::from(self.n & 0x3f) << 6),
            crc: self.val as u32,
        }
    }

    /// Page `pos` of a written-back packed group at `at` whose blob of `n`
    /// pages is `len` bytes, compressed by `algo`.
    pub fn backed_group(at: GroupAt, len: u32, n: u8, pos: u8, algo: u8) -> Entry {
        let off = u64::from(at.off) / GROUP_ALIGN as u64;
        Entry {
            kind: Kind::BackedGroup,
            len,
            val: (u64::from(at.block) << 32) | (off << TAG_BITS) | u64::from(at.tag & TAG_MASK),
            idx: pos,
            n,
            algo,
            idle: false,
            atime: 0,
        }
    }

    /// Where a written-back packed group lies (meaningful for
    /// [`Kind::BackedGroup`] only).
    pub fn group_at(&self) -> GroupAt {
        GroupAt {
            block: (self.val >> 32) as u32,
            off: ((self.val >> TAG_BITS) & 0xff) as u16 * GROUP_ALIGN as u16,
            tag: self.val as u32 & TAG_MASK,
        }
    }

    fn encode(&self) -> u64 {
        let k: u64 = match self.kind {
            Kind::Empty => 0,
            Kind::Same => 1,
            Kind::Huge => 2,
            Kind::Compressed => 3,
            Kind::Packed => 4,
            Kind::Backed => 5,
            Kind::BackedGroup => 6,
        };
        (k << KIND_SHIFT)
            | (self.len as u64 & LEN_MASK)
            | ((self.idx as u64 & IDX_MASK) << IDX_SHIFT)
            | ((self.algo as u64 & ALGO_MASK) << ALGO_SHIFT)
            | ((self.n as u64 & N_MASK) << N_SHIFT)
            | if self.idle { IDLE } else { 0 }
            | ((self.atime & ATIME_MASK) as u64) << ATIME_SHIFT
    }

    fn decode(meta: u64, val: u64) -> Entry {
        let kind = match (meta & KIND_MASK) >> KIND_SHIFT {
            1 => Kind::Same,
            2 => Kind::Huge,
            3 => Kind::Compressed,
            4 => Kind::Packed,
            5 => Kind::Backed,
            6 => Kind::BackedGroup,
            _ => Kind::Empty,
        };
        Entry {
            kind,
            len: (meta & LEN_MASK) as u32,
            val,
            idx: ((meta >> IDX_SHIFT) & IDX_MASK) as u8,
            n: ((meta >> N_SHIFT) & N_MASK) as u8,
            algo: ((meta >> ALGO_SHIFT) & ALGO_MASK) as u8,
            idle: meta & IDLE != 0,
            atime: (meta >> ATIME_SHIFT) as u32 & ATIME_MASK,
        }
    }
}

/// A locked slot; writes its content back and unlocks on drop.
pub struct SlotGuard<'a> {
    slot: &'a Slot,
    meta: u64,
    val: u64,
}

impl Slot {
    /// Locks the slot, spinning briefly and then yielding to the scheduler.
    pub fn lock(&self) -> SlotGuard<'_> {
        let mut spins = 0u32;
        loop {
            let w = self.word.load(Ordering::Relaxed);
            let (meta, val) = split(w);
            if meta & LOCK == 0
                && self
                    .word
                    .compare_exchange_weak(
                        w,
                        join(meta | LOCK, val),
                        Ordering::Acquire,
                        Ordering::Relaxed,
                    )
                    .is_ok()
            {
                return SlotGuard {
                    slot: self,
                    meta,
                    val,
                };
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// For a recovery scan, with no other thread in the store: the slot's
    /// entry, unlocking a slot whose lock its dead holder left set (it
    /// still holds the entry from before that holder's change).
    pub(crate) fn recover(&self) -> Entry {
        let (meta, val) = split(self.word.load(Ordering::Acquire));
        if meta & LOCK != 0 {
            self.word.store(join(meta & !LOCK, val), Ordering::Release);
        }
        Entry::decode(meta, val)
    }
}

impl SlotGuard<'_> {
    /// The slot's current content.
    pub fn entry(&self) -> Entry {
        Entry::decode(self.meta, self.val)
    }

    /// Replaces the content, returning the old one (whose handle the caller
    /// now owns and must free). The slot's memory changes when the guard is
    /// dropped.
    pub fn replace(&mut self, new: Entry) -> Entry {
        let old = self.entry();
        self.meta = new.encode();
        self.val = new.val;
        old
    }

    /// Records an access at `now` (seconds of the store's clock): the
    /// access time is set and the idle mark cleared, in the guard, so the
    /// unlocking store carries them. An empty slot is left as it is.
    /// Returns whether the slot was marked idle.
    pub fn touch(&mut self, now: u32) -> bool {
        if self.meta & KIND_MASK == 0 {
            return false;
        }
        let was_idle = self.meta & IDLE != 0;
        let time = u64::from(ATIME_MASK) << ATIME_SHIFT;
        self.meta = (self.meta & !(IDLE | time)) | (u64::from(now & ATIME_MASK) << ATIME_SHIFT);
        was_idle
    }

    /// Marks the slot idle. Returns false if it was already, or is empty.
    pub fn set_idle(&mut self) -> bool {
        if self.meta & KIND_MASK == 0 || self.meta & IDLE != 0 {
            return false;
        }
        self.meta |= IDLE;
        true
    }

    /// Clears the slot's idle mark without touching its access time.
    /// Returns false if it was not marked.
    pub fn clear_idle(&mut self) -> bool {
        if self.meta & IDLE == 0 {
            return false;
        }
        self.meta &= !IDLE;
        true
    }
}

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        // One store publishes the entry (and, by Release, the object bytes
        // written before install) and unlocks.
        self.slot
            .word
            .store(join(self.meta & !LOCK, self.val), Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn slot_is_16_bytes() {
        assert_eq!(std::mem::size_of::<Slot>(), 16);
    }

    #[test]
    fn entries_round_trip() {
        let s = Slot::default();
        for e in [
            Entry::EMPTY,
            Entry::new(Kind::Same, 0, u64::MAX),
            Entry::new(Kind::Huge, 4096, 77),
            Entry::new(Kind::Compressed, (1 << 20) - 1, 1 << 62),
            Entry {
                kind: Kind::Packed,
                len: 9000,
                val: 5,
                idx: 63,
                n: 64,
                algo: 1,
                idle: true,
                atime: ATIME_MASK,
            },
        ] {
            let mut g = s.lock();
            g.replace(e);
            drop(g);
            assert_eq!(s.lock().entry(), e);
        }
    }

    /// Every field of `meta` with its mask, shifted into place.
    fn fields() -> [(&'static str, u64); 8] {
        [
            ("len", LEN_MASK),
            ("idx", IDX_MASK << IDX_SHIFT),
            ("algo", ALGO_MASK << ALGO_SHIFT),
            ("n", N_MASK << N_SHIFT),
            ("idle", IDLE),
            ("atime", u64::from(ATIME_MASK) << ATIME_SHIFT),
            ("kind", KIND_MASK),
            ("lock", LOCK),
        ]
    }

    #[test]
    fn meta_fields_do_not_overlap() {
        let f = fields();
        for (i, (a, ma)) in f.iter().enumerate() {
            for (b, mb) in &f[i + 1..] {
                assert_eq!(ma & mb, 0, "{a} and {b} share bits");
            }
        }
        let all = f.iter().fold(0u64, |acc, (_, m)| acc | m);
        assert_eq!(all, u64::MAX, "every bit of meta belongs to a field");
    }

    /// Each field at its extremes, every other field at the opposite one:
    /// a field that spills into a neighbour shows.
    #[test]
    fn every_field_round_trips_at_its_extremes() {
        let full = Entry {
            kind: Kind::Packed,
            len: LEN_MASK as u32,
            val: u64::MAX,
            idx: IDX_MASK as u8,
            n: N_MASK as u8,
            algo: ALGO_MASK as u8,
            idle: true,
            atime: ATIME_MASK,
        };
        let zero = Entry {
            kind: Kind::Same,
            ..Entry::EMPTY
        };
        let variants: [fn(Entry, &Entry) -> Entry; 7] = [
            |e, f| Entry { len: f.len, ..e },
            |e, f| Entry { idx: f.idx, ..e },
            |e, f| Entry { n: f.n, ..e },
            |e, f| Entry { algo: f.algo, ..e },
            |e, f| Entry { idle: f.idle, ..e },
            |e, f| Entry {
                atime: f.atime,
                ..e
            },
            |e, f| Entry { val: f.val, ..e },
        ];
        for set in variants {
            for (base, from) in [(zero, &full), (full, &zero)] {
                let e = set(base, from);
                assert_eq!(Entry::decode(e.encode(), e.val), e);
                assert_eq!(e.encode() & LOCK, 0, "no field reaches the lock bit");
            }
        }
        for kind in [
            Kind::Empty,
            Kind::Same,
            Kind::Huge,
            Kind::Compressed,
            Kind::Packed,
            Kind::Backed,
            Kind::BackedGroup,
        ] {
            let e = Entry { kind, ..full };
            assert_eq!(Entry::decode(e.encode(), e.val).kind, kind);
        }
    }

    #[test]
    fn backed_locations_round_trip_at_their_extremes() {
        for at in [
            BackedAt {
                block: 0,
                off: 0,
                crc: 0,
            },
            BackedAt {
                block: u32::MAX,
                off: 4095,
                crc: u32::MAX,
            },
            BackedAt {
                block: 7,
                off: 64,
                crc: 0xdead_beef,
            },
            BackedAt {
                block: 1 << 31,
                off: 63,
                crc: 1,
            },
        ] {
            let e = Entry {
                idle: true,
                atime: 99,
                ..Entry::backed(at, 4000, 1)
            };
            let d = Entry::decode(e.encode(), e.val);
            assert_eq!(d, e);
            assert_eq!(d.kind, Kind::Backed);
            assert_eq!(d.backed_at(), at);
            assert_eq!((d.len, d.algo, d.idle, d.atime), (4000, 1, true, 99));
            assert_eq!(d.handle(), None, "a written-back page owns no RAM object");
        }
    }

    #[test]
    fn group_places_round_trip_at_their_extremes() {
        for (at, pos, n) in [
            (
                GroupAt {
                    block: 0,
                    off: 0,
                    tag: 0,
                },
                0,
                1,
            ),
            (
                GroupAt {
                    block: u32::MAX,
                    off: 4080,
                    tag: TAG_MASK,
                },
                63,
                64,
            ),
            (
                GroupAt {
                    block: 9,
                    off: 16,
                    tag: 0x00ab_cdef,
                },
                3,
                8,
            ),
        ] {
            let e = Entry {
                idle: true,
                atime: 7,
                ..Entry::backed_group(at, 30_000, n, pos, 2)
            };
            let d = Entry::decode(e.encode(), e.val);
            assert_eq!(d, e);
            assert_eq!(d.kind, Kind::BackedGroup);
            assert_eq!(d.group_at(), at);
            assert_eq!((d.len, d.n, d.idx, d.algo), (30_000, n, pos, 2));
            assert_eq!(d.handle(), None, "a written-back group is not in RAM");
        }
    }

    #[test]
    fn touch_sets_the_time_and_clears_idle_and_leaves_empty_slots() {
        let s = Slot::default();
        let mut g = s.lock();
        assert!(!g.touch(5) && !g.set_idle(), "an empty slot takes no mark");
        g.replace(Entry::new(Kind::Compressed, 100, 9));
        assert!(g.set_idle() && !g.set_idle());
        drop(g);
        let mut g = s.lock();
        assert!(g.entry().idle);
        assert!(g.touch(ATIME_MASK + 7), "was idle");
        drop(g);
        let e = s.lock().entry();
        assert_eq!((e.idle, e.atime, e.len, e.val), (false, 6, 100, 9));
    }

    #[test]
    fn lock_excludes_other_threads() {
        let s = Arc::new(Slot::default());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let s = s.clone();
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        let mut g = s.lock();
                        let e = g.entry();
                        // A non-atomic increment: lost updates would show.
                        g.replace(Entry {
                            val: e.val + 1,
                            ..e
                        });
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(s.lock().entry().val, 80_000);
    }
}
