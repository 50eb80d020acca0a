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
}

const LOCK: u64 = 1 << 63;
const KIND_SHIFT: u32 = 60;
const KIND_MASK: u64 = 0b111 << KIND_SHIFT;
const LEN_MASK: u64 = (1 << 20) - 1;
const IDX_SHIFT: u32 = 20;
const N_SHIFT: u32 = 28;

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
}

impl Entry {
    /// The empty entry.
    pub const EMPTY: Entry = Entry {
        kind: Kind::Empty,
        len: 0,
        val: 0,
        idx: 0,
        n: 0,
    };

    /// An entry of `kind` with length `len` and value `val`.
    pub fn new(kind: Kind, len: u32, val: u64) -> Entry {
        Entry {
            kind,
            len,
            val,
            idx: 0,
            n: 0,
        }
    }

    /// The object handle this entry owns, if any.
    pub fn handle(&self) -> Option<Handle> {
        match self.kind {
            Kind::Huge | Kind::Compressed | Kind::Packed => Some(self.val),
            Kind::Empty | Kind::Same => None,
        }
    }

    fn encode(&self) -> u64 {
        let k: u64 = match self.kind {
            Kind::Empty => 0,
            Kind::Same => 1,
            Kind::Huge => 2,
            Kind::Compressed => 3,
            Kind::Packed => 4,
        };
        (k << KIND_SHIFT)
            | (self.len as u64 & LEN_MASK)
            | ((self.idx as u64 & 0x3f) << IDX_SHIFT)
            | ((self.n as u64 & 0x7f) << N_SHIFT)
    }

    fn decode(meta: u64, val: u64) -> Entry {
        let kind = match (meta & KIND_MASK) >> KIND_SHIFT {
            1 => Kind::Same,
            2 => Kind::Huge,
            3 => Kind::Compressed,
            4 => Kind::Packed,
            _ => Kind::Empty,
        };
        Entry {
            kind,
            len: (meta & LEN_MASK) as u32,
            val,
            idx: ((meta >> IDX_SHIFT) & 0x3f) as u8,
            n: ((meta >> N_SHIFT) & 0x7f) as u8,
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
            },
        ] {
            let mut g = s.lock();
            g.replace(e);
            drop(g);
            assert_eq!(s.lock().entry(), e);
        }
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
