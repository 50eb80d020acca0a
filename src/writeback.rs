//! Writeback: the store's half of `zblk writeback` (zram's `writeback`),
//! moving chosen pages' compressed objects, as they are, to the backing
//! store (`crate::backing`), where many share a 4 KB block.
//!
//! Pages are chosen as zram's `type=` does: `idle`, `huge` (stored raw),
//! `incompressible` (raw, and recompression could not shrink them either)
//! or `huge_idle`; or by index, as zram's `page_index=` and
//! `page_indexes=` do: every stored page of the ranges given, whatever its
//! type. Same-filled pages stay in their slots (they cost no object),
//! packed stores are refused (a group's object is shared).
//!
//! Each page is looked at under its slot's lock, and its object copied
//! into the batch buffer right there (a copy of at most 4 KB, what a read
//! does under the lock anyway). Everything slow happens with no slot lock
//! held: reserving blocks in the free map, the `pwrite` of the batch (one
//! per run of contiguous blocks), the CRCs. Then each slot is locked once
//! more, only to switch it: if it still holds the very object that was
//! copied (the same entry and the same bytes, `SlotTable::move_page`'s
//! `Held::Bytes`, as recompression checks), it becomes a
//! written-back entry (kind 5) with its access time and idle mark, and the
//! RAM object is released to the free batch; if a write or discard came in
//! between, that write wins and the object's place in the backing store is
//! given back. A swap-in never waits for a writeback's I/O: at most for
//! one slot's switch.
//!
//! # Crash consistency (a store in shared memory)
//!
//! The order is: write the objects to the backing store, switch the slot,
//! release the RAM object.
//! - A crash before or during the `pwrite`, or after it but before the
//!   switch: the slot still holds its RAM object, which is valid (nothing
//!   freed it); the blocks written are referenced by no slot, and the free
//!   map a recovery rebuilds from the slots counts them free.
//! - A crash between the switch and the release: the slot names the
//!   backing object, which was written before (the `pwrite` returned, so
//!   the data is in the file or the device, which outlive the process);
//!   the RAM object is referenced by no slot, and the recovery scan frees
//!   it as it frees every unreferenced object.
//!
//! Nothing here allocates: the batch buffer, its list of objects and the
//! list of reserved blocks were made with the backing store
//! (`backing::Batch`), mlocked as the rest, so a writeback run while the
//! system is short of memory cannot recurse into swapping to this device.

use crate::backing::{object_crc, Backing, Batch, Pending, BATCH_BLOCKS, BATCH_OBJECTS};
use crate::ctx::CtxState;
use crate::error::{Error, Result};
use crate::page::PAGE_SIZE;
use crate::page_range::{spans, PageRange};
use crate::slot::{BackedAt, Entry, Kind, INCOMPRESSIBLE};
use crate::stats::{Counter, Op};
use crate::table::{Held, MovePoints, SlotTable};
use serde::Serialize;
use std::ops::Range;
use std::time::Instant;

/// Which pages a writeback moves (zram's `type=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WritebackType {
    /// Pages marked idle.
    Idle,
    /// Pages stored raw.
    Huge,
    /// Pages stored raw that recompression could not shrink either.
    Incompressible,
    /// Pages stored raw and marked idle.
    HugeIdle,
}

crate::keyword::keywords!(WritebackType, "writeback type", {
    "idle" => WritebackType::Idle,
    "huge" => WritebackType::Huge,
    "incompressible" => WritebackType::Incompressible,
    "huge_idle" => WritebackType::HugeIdle,
});

/// Which pages a writeback looks at: a type over the whole device, or
/// every stored page of some index ranges (zram's `type=` and
/// `page_index=`/`page_indexes=`, which do not combine).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WritebackSelect {
    /// The pages of this type.
    Type(WritebackType),
    /// Every stored page in these ranges.
    Pages(Vec<PageRange>),
}

impl From<WritebackType> for WritebackSelect {
    fn from(kind: WritebackType) -> Self {
        WritebackSelect::Type(kind)
    }
}

impl WritebackSelect {
    /// The type a page must be (None: any stored page).
    fn kind(&self) -> Option<WritebackType> {
        match self {
            WritebackSelect::Type(k) => Some(*k),
            WritebackSelect::Pages(_) => None,
        }
    }

    /// The pages to look at, of a device of `pages` pages: ascending,
    /// disjoint ranges (overlapping ones merged, so that no page is copied
    /// twice into a batch); an error names a range past the device's end.
    pub(crate) fn spans(&self, pages: u64) -> Result<Vec<Range<u64>>> {
        let WritebackSelect::Pages(list) = self else {
            return Ok(std::iter::once(0..pages).collect());
        };
        if list.is_empty() {
            return Err(Error::InvalidConfig(
                "writeback: no page range given".into(),
            ));
        }
        spans(list, pages)
    }
}

/// What to write back.
#[derive(Debug, Clone)]
pub struct Writeback {
    /// Which pages.
    pub select: WritebackSelect,
    /// Write back at most this many pages (0: no limit but the device's
    /// writeback limit).
    pub limit: u64,
}

/// What a writeback did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct WritebackReport {
    /// Pages selected and copied into a batch.
    pub selected: u64,
    /// Pages now on the backing store.
    pub written: u64,
    /// Pages a write or discard changed before their switch (kept theirs).
    pub raced: u64,
    /// Compressed bytes written back.
    pub bytes: u64,
    /// Backing blocks written.
    pub blocks: u64,
    /// The backing store ran out of free blocks.
    pub full: bool,
    /// The device's writeback limit stopped it.
    pub limited: bool,
}

/// Whether `e` is a page of type `kind` (None: any page with a RAM
/// object of its own).
fn selected(e: &Entry, kind: Option<WritebackType>) -> bool {
    let huge = e.kind == Kind::Huge;
    let stored = huge || e.kind == Kind::Compressed;
    stored
        && match kind {
            None => true,
            Some(WritebackType::Idle) => e.idle,
            Some(WritebackType::Huge) => huge,
            Some(WritebackType::Incompressible) => huge && e.n == INCOMPRESSIBLE,
            Some(WritebackType::HugeIdle) => huge && e.idle,
        }
}

/// Where the next object of a batch goes.
#[derive(Default)]
struct Fill {
    blk: usize,
    off: usize,
}

/// What looking at one page did.
enum Gather {
    Skipped,
    Added,
    /// Selected, but the batch has no room: write it out and look again.
    Full,
}

/// Writes back up to `budget` pages `p` selects, with the maintenance
/// thread state `st`.
pub(crate) fn run(
    table: &SlotTable,
    backing: &Backing,
    st: &mut CtxState,
    p: &Writeback,
    budget: u64,
) -> Result<WritebackReport> {
    let spans = p.select.spans(table.pages())?;
    let kind = p.select.kind();
    let mut guard = backing.batch.lock().unwrap_or_else(|e| e.into_inner());
    let batch = &mut *guard;
    batch.items.clear();
    let mut r = WritebackReport::default();
    let mut fill = Fill::default();
    for span in spans {
        let mut page = span.start;
        while page < span.end && r.selected < budget && !r.full {
            match gather(table, batch, &mut fill, page, kind) {
                Gather::Skipped => page += 1,
                Gather::Added => {
                    r.selected += 1;
                    page += 1;
                }
                Gather::Full => {
                    flush(table, backing, st, batch, &mut r)?;
                    fill = Fill::default();
                }
            }
        }
    }
    flush(table, backing, st, batch, &mut r)?;
    Ok(r)
}

/// Copies page `page`'s object into the batch if `kind` selects it.
fn gather(
    table: &SlotTable,
    batch: &mut Batch,
    fill: &mut Fill,
    page: u64,
    kind: Option<WritebackType>,
) -> Gather {
    let guard = table.lock(page);
    let e = guard.entry();
    if !selected(&e, kind) {
        return Gather::Skipped;
    }
    let Some(obj) = table.object_bytes(&guard) else {
        return Gather::Skipped;
    };
    let len = obj.len();
    let (mut blk, mut off) = (fill.blk, fill.off);
    if off + len > PAGE_SIZE {
        blk += 1;
        off = 0;
    }
    if blk >= BATCH_BLOCKS || batch.items.len() >= BATCH_OBJECTS {
        return Gather::Full;
    }
    let at = blk * PAGE_SIZE + off;
    batch.buf.as_mut_slice()[at..at + len].copy_from_slice(obj);
    drop(guard);
    batch.items.push(Pending {
        page,
        entry: e,
        blk,
        off: off as u16,
    });
    fill.blk = blk;
    fill.off = off + len;
    Gather::Added
}

/// Writes the batch out and switches its slots; empties it.
fn flush(
    table: &SlotTable,
    backing: &Backing,
    st: &mut CtxState,
    batch: &mut Batch,
    r: &mut WritebackReport,
) -> Result<()> {
    let Some(last) = batch.items.last() else {
        return Ok(());
    };
    let t0 = Instant::now();
    let mut objects = [0u16; BATCH_BLOCKS];
    for it in &batch.items {
        objects[it.blk] += 1;
    }
    batch.blocks.clear();
    for &n in &objects[..=last.blk] {
        match backing.reserve(n) {
            Some(b) => batch.blocks.push(b),
            None => {
                r.full = true;
                break;
            }
        }
    }
    if let Err(e) = write_runs(backing, batch) {
        // Nothing switched: every page keeps its RAM object.
        for it in batch.items.iter().filter(|it| it.blk < batch.blocks.len()) {
            backing.release(batch.blocks[it.blk]);
        }
        batch.items.clear();
        return Err(Error::Backing(format!(
            "writing to {}: {e}",
            backing.path().display()
        )));
    }
    crate::crash_point::point("writeback:written");
    r.blocks += batch.blocks.len() as u64;
    let before = r.written;
    for i in 0..batch.items.len() {
        let it = batch.items[i];
        let Some(&block) = batch.blocks.get(it.blk) else {
            // No room for this block: these pages stay in RAM.
            continue;
        };
        switch(table, backing, st, batch, it, block, r);
    }
    let n = r.written - before;
    if let Some(per_page) = (t0.elapsed().as_nanos() as u64).checked_div(n) {
        st.shard.record(Op::Writeback, per_page, n);
    }
    batch.items.clear();
    Ok(())
}

/// One `pwrite` per run of contiguous reserved blocks.
fn write_runs(backing: &Backing, batch: &Batch) -> std::io::Result<()> {
    let b = &batch.blocks;
    let mut i = 0;
    while i < b.len() {
        let mut j = i + 1;
        while j < b.len() && b[j] == b[j - 1].wrapping_add(1) {
            j += 1;
        }
        backing.write_blocks(b[i], &batch.buf.as_slice()[i * PAGE_SIZE..j * PAGE_SIZE])?;
        i = j;
    }
    Ok(())
}

/// Switches one written page's slot to its backing object, if the slot
/// still holds what was copied; else gives the backing place back.
fn switch(
    table: &SlotTable,
    backing: &Backing,
    st: &mut CtxState,
    batch: &Batch,
    it: Pending,
    block: u32,
    r: &mut WritebackReport,
) {
    let len = it.entry.len as usize;
    let at = it.blk * PAGE_SIZE + usize::from(it.off);
    let crc = object_crc(it.page, &batch.buf.as_slice()[at..at + len]);
    let place = BackedAt {
        block,
        off: it.off,
        crc,
    };
    let held = Held::Bytes(it.entry, &batch.buf.as_slice()[at..at + len]);
    let new = Entry::backed(place, len as u32, it.entry.algo);
    let points = MovePoints {
        locked: "writeback:locked",
        released: Some("writeback:released"),
    };
    if !table.move_page(st, it.page, held, new, 0, points) {
        backing.release(block);
        r.raced += 1;
        return;
    }
    st.shard.add(Counter::BdWrites, 1);
    r.written += 1;
    r.bytes += len as u64;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranges(list: &[&str]) -> WritebackSelect {
        WritebackSelect::Pages(list.iter().map(|s| s.parse().unwrap()).collect())
    }

    #[test]
    fn a_type_spans_the_device_and_ranges_their_pages() {
        let all = WritebackSelect::Type(WritebackType::Idle);
        assert_eq!(
            all.spans(10).unwrap(),
            std::iter::once(0..10).collect::<Vec<_>>()
        );
        assert_eq!(
            ranges(&["8-9", "0", "2-4"]).spans(10).unwrap(),
            vec![0..1, 2..5, 8..10]
        );
        assert!(ranges(&["2-10"]).spans(10).is_err());
        assert!(ranges(&[]).spans(10).is_err());
    }

    #[test]
    fn a_range_selects_every_page_with_an_object_of_its_own() {
        let e = |kind, idle| Entry {
            idle,
            ..Entry::new(kind, 100, 1)
        };
        assert!(selected(&e(Kind::Compressed, false), None));
        assert!(selected(&e(Kind::Huge, false), None));
        for k in [Kind::Empty, Kind::Same, Kind::Packed, Kind::Backed] {
            assert!(!selected(&e(k, true), None), "{k:?}");
        }
        let idle = Some(WritebackType::Idle);
        assert!(!selected(&e(Kind::Compressed, false), idle));
        assert!(selected(&e(Kind::Compressed, true), idle));
    }
}
