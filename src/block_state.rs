//! What each slot holds, page by page: the store's half of `zblk dump`
//! (zram's debugfs `block_state`).
//!
//! Each slot is locked only long enough to copy its entry (what a read
//! does first anyway), one after the other, so a dump never holds more
//! than one slot at a time and never the maintenance lock: the device
//! serves its requests meanwhile, and a dump of a page that changes while
//! it is looked at shows the page as it was or as it is, never half of
//! each. Callers walk a large device in ranges, which bounds what one
//! call returns.

use crate::packed;
use crate::page::PAGE_SIZE;
use crate::slot::{Entry, Kind, INCOMPRESSIBLE};
use crate::table::SlotTable;
use serde::{Deserialize, Serialize};
use std::ops::Range;

/// How a stored page is held (`Kind` without the empty slot).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SlotKind {
    /// A page of one repeated word, kept in the slot (no object).
    Same,
    /// A page stored raw (it did not compress below the huge threshold).
    Huge,
    /// A compressed object of its own.
    Compressed,
    /// A page of a packed group object (packed mode).
    Packed,
    /// Written back to the backing device (`zblk writeback`).
    WrittenBack,
}

impl SlotKind {
    /// Its name, as the JSON says it.
    pub fn name(self) -> &'static str {
        match self {
            SlotKind::Same => "same",
            SlotKind::Huge => "huge",
            SlotKind::Compressed => "compressed",
            SlotKind::Packed => "packed",
            SlotKind::WrittenBack => "written_back",
        }
    }
}

/// One stored page, as its slot says (zram's `block_state` line).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotState {
    /// The page's index on the device.
    pub index: u64,
    /// How it is held.
    pub kind: SlotKind,
    /// Bytes it takes: its object (4096 raw), its share of a packed
    /// group's object (rounded up), or 0 for a same-filled page.
    pub size: u32,
    /// The algorithm its object was compressed with (the store's primary
    /// or its secondary); none for a page kept raw or same-filled.
    pub algo: Option<String>,
    /// Marked idle since its last access.
    pub idle: bool,
    /// A raw page recompression could not shrink either.
    pub incompressible: bool,
    /// Last access, in seconds of the store's clock (as slots keep it:
    /// modulo 2^24).
    pub atime: u32,
}

/// The names of the store's algorithms, by `Entry::algo`.
pub(crate) struct AlgoNames {
    /// The primary's.
    pub(crate) primary: String,
    /// The secondaries', in the order slots name them (`algo` 1-3).
    pub(crate) secondaries: Vec<String>,
}

/// The state of every stored page of `range` (clipped to the device), in
/// page order; empty slots are left out. One slot lock at a time.
pub(crate) fn collect(table: &SlotTable, range: Range<u64>, names: &AlgoNames) -> Vec<SlotState> {
    let range = range.start.min(table.pages())..range.end.min(table.pages());
    collect_pages(table, range, names)
}

/// The state of each stored page of `pages`, in the order given (a page
/// asked twice is there twice); empty slots and pages past the device's
/// end are left out. One slot lock at a time, as [`collect`]: what the
/// attribution of swapped pages to processes asks for the offsets it
/// found, a batch at a time.
pub(crate) fn collect_at(table: &SlotTable, pages: &[u64], names: &AlgoNames) -> Vec<SlotState> {
    let end = table.pages();
    collect_pages(table, pages.iter().copied().filter(|&p| p < end), names)
}

/// The state of each stored page of `pages`, all on the device.
fn collect_pages(
    table: &SlotTable,
    pages: impl Iterator<Item = u64>,
    names: &AlgoNames,
) -> Vec<SlotState> {
    pages
        .filter_map(|page| {
            let e = table.lock(page).entry();
            state(page, &e, names)
        })
        .collect()
}

/// What entry `e` of page `index` says (None: an empty slot).
fn state(index: u64, e: &Entry, names: &AlgoNames) -> Option<SlotState> {
    let (kind, size, compressed) = match e.kind {
        Kind::Empty => return None,
        Kind::Same => (SlotKind::Same, 0, false),
        Kind::Huge => (SlotKind::Huge, PAGE_SIZE as u32, false),
        Kind::Compressed => (SlotKind::Compressed, e.len, true),
        Kind::Packed => {
            let share = packed::share(e.len, e.n, 0) as u32;
            (SlotKind::Packed, share, true)
        }
        Kind::Backed => (SlotKind::WrittenBack, e.len, e.len as usize != PAGE_SIZE),
        Kind::BackedGroup => {
            let share = packed::share(e.len, e.n, 0) as u32;
            (SlotKind::WrittenBack, share, true)
        }
    };
    let algo = compressed
        .then(|| match usize::from(e.algo) {
            0 => Some(names.primary.clone()),
            k => names.secondaries.get(k - 1).cloned(),
        })
        .flatten();
    Some(SlotState {
        index,
        kind,
        size,
        algo,
        idle: e.idle,
        incompressible: e.kind == Kind::Huge && e.n == INCOMPRESSIBLE,
        atime: e.atime,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> AlgoNames {
        AlgoNames {
            primary: "lz4".into(),
            secondaries: vec!["zstd:9".into(), "lz4hc".into()],
        }
    }

    #[test]
    fn each_kind_says_its_size_and_algorithm() {
        let n = names();
        assert_eq!(state(0, &Entry::EMPTY, &n), None);
        let same = state(1, &Entry::new(Kind::Same, 0, 7), &n).unwrap();
        assert_eq!((same.kind, same.size, same.algo), (SlotKind::Same, 0, None));
        let huge = Entry {
            n: INCOMPRESSIBLE,
            ..Entry::new(Kind::Huge, PAGE_SIZE as u32, 1)
        };
        let h = state(2, &huge, &n).unwrap();
        assert_eq!(
            (h.kind, h.size, h.algo.as_deref()),
            (SlotKind::Huge, 4096, None)
        );
        assert!(h.incompressible);
        let rec = Entry {
            algo: 1,
            idle: true,
            atime: 42,
            ..Entry::new(Kind::Compressed, 900, 1)
        };
        let c = state(3, &rec, &n).unwrap();
        assert_eq!(
            (c.kind, c.size, c.algo.as_deref(), c.idle, c.atime),
            (SlotKind::Compressed, 900, Some("zstd:9"), true, 42)
        );
        let second = Entry {
            algo: 2,
            ..Entry::new(Kind::Compressed, 800, 1)
        };
        let c2 = state(3, &second, &n).unwrap();
        assert_eq!(c2.algo.as_deref(), Some("lz4hc"));
        let packed = Entry {
            n: 8,
            idx: 3,
            ..Entry::new(Kind::Packed, 1001, 1)
        };
        let p = state(4, &packed, &n).unwrap();
        assert_eq!(
            (p.kind, p.size, p.algo.as_deref()),
            (SlotKind::Packed, 126, Some("lz4"))
        );
    }

    #[test]
    fn a_written_back_page_names_its_algorithm_unless_raw() {
        let n = names();
        let at = crate::slot::BackedAt {
            block: 3,
            off: 100,
            crc: 5,
        };
        let c = state(5, &Entry::backed(at, 700, 0), &n).unwrap();
        assert_eq!(
            (c.kind, c.size, c.algo.as_deref()),
            (SlotKind::WrittenBack, 700, Some("lz4"))
        );
        let raw = state(6, &Entry::backed(at, PAGE_SIZE as u32, 0), &n).unwrap();
        assert_eq!((raw.size, raw.algo), (4096, None));
    }

    #[test]
    fn kinds_are_named_as_the_json_says() {
        for k in [
            SlotKind::Same,
            SlotKind::Huge,
            SlotKind::Compressed,
            SlotKind::Packed,
            SlotKind::WrittenBack,
        ] {
            let json = serde_json::to_string(&k).unwrap();
            assert_eq!(json, format!("\"{}\"", k.name()));
        }
    }
}
