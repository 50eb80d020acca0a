//! Compaction of the backing store: the per-page objects (kind 5) of
//! sparsely used blocks are moved, packed, into fresh blocks, so that the
//! sparse blocks are free again.
//!
//! A backing block is free only once its last object dies; after
//! discards and overwrites many blocks hold a few live objects each, and
//! the blocks in use (`bd_used_bytes`) grow well past the live bytes
//! (`bd_bytes`). A call looks at most `max_blocks` blocks:
//!
//! 1. A walk of the slots tallies, per block, the live bytes of the
//!    per-page objects on it (`Batch::tally`, made with the backing
//!    store); a block that a written-back packed group touches is marked
//!    and never chosen: a group moves whole or not at all, and this
//!    version does not move groups.
//! 2. The rule: a block is sparse when its live bytes are less than half
//!    a block. Its objects then fit, with those of other sparse blocks,
//!    into at most about half as many fresh blocks (an object of a sparse
//!    block is under 2 KB, so packing one after the other wastes less
//!    than half of each fresh block), so every block written gives back
//!    at least one: the I/O a move costs is bounded by the space it
//!    frees, and the fresh blocks, more than half full, are not chosen
//!    again. A round takes up to [`BATCH_BLOCKS`] sparse blocks in block
//!    order (fewer than two: nothing to gain, the call ends) and reads
//!    each with one `pread` into the batch's second buffer, with no slot
//!    lock held; a block that cannot be read stays as it is.
//! 3. A second walk of the slots takes each page whose slot names an
//!    object on a chosen block, checks the object's CRC against the slot
//!    (a corrupt object is left where it is: its page goes on failing its
//!    reads, never reads a wrong page) and copies it into the batch
//!    buffer, as writeback packs objects (`writeback::Fill`).
//! 4. The batch is written as writeback writes it (`place_and_write`:
//!    blocks reserved in the free map, one `pwrite` per run), then each
//!    slot is switched to its new place only if it still holds the very
//!    entry that was read (`Held::Backed`); a read, write or discard in
//!    between wins, and the copy's place is given back. The switch
//!    releases the old place in the free map, so a sparse block is free
//!    once its last object moved.
//!
//! The work of a call is bounded by `max_blocks` blocks read and at most
//! as many written; the two walks lock each slot once, briefly, as
//! writeback's does. Nothing allocates: the buffers, the lists and the
//! tally were made with the backing store, mlocked as the rest.
//!
//! No slot lock is held during I/O. The blocks read cannot change
//! meanwhile: only the holder of the writeback batch writes blocks, and
//! compaction holds it for the whole call.
//!
//! # Crash consistency (a store in shared memory)
//!
//! As writeback's: the copy is written (the `pwrite` returned) before any
//! slot names it, and the old place is released only once the slot names
//! the copy. A crash before a switch leaves the slot on its old place,
//! untouched (nothing writes there while the slot names it); the copy's
//! blocks are referenced by no slot. A crash after a switch leaves the
//! slot on the copy. Either way the recovery scan rebuilds the free map
//! from the slots alone. Crash points: `backing-compact:written`,
//! `backing-compact:locked`, `backing-compact:released`.

use crate::backing::{object_crc, Backing, Batch, Pending, BATCH_BLOCKS, BATCH_OBJECTS};
use crate::ctx::CtxState;
use crate::error::Result;
use crate::page::PAGE_SIZE;
use crate::slot::{BackedAt, Entry, Kind};
use crate::table::{backed_extent, Held, MovePoints, SlotTable};
use crate::writeback::{file_blocks, place_and_write, Fill};
use serde::Serialize;

/// A block whose per-page objects' live bytes are fewer is compacted.
pub const SPARSE_BYTES: u16 = (PAGE_SIZE / 2) as u16;

/// The tally of a block never to choose: a written-back packed group
/// touches it, or this call wrote it (its tally, taken before, is stale).
const KEEP: u16 = u16::MAX;

/// What a compaction of the backing store did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct BackingCompactReport {
    /// Sparse blocks read.
    pub blocks_looked: u64,
    /// Objects moved to fresh blocks.
    pub objects_moved: u64,
    /// Their bytes.
    pub bytes_moved: u64,
    /// Fresh blocks written.
    pub blocks_written: u64,
    /// Blocks in use before the call minus after it (discards meanwhile
    /// included).
    pub blocks_freed: u64,
    /// Objects a read, write or discard changed before their switch (the
    /// page kept what that gave it).
    pub raced: u64,
    /// Objects that failed their CRC, left where they are.
    pub corrupt: u64,
    /// Sparse blocks that could not be read, left as they are.
    pub unreadable: u64,
    /// The backing store had no free block for a copy.
    pub full: bool,
}

/// Compacts up to `max_blocks` sparse blocks of `backing`, with the
/// maintenance thread state `st`.
pub(crate) fn run(
    table: &SlotTable,
    backing: &Backing,
    st: &mut CtxState,
    max_blocks: u64,
) -> Result<BackingCompactReport> {
    let mut guard = backing.batch.lock().unwrap_or_else(|e| e.into_inner());
    let batch = &mut *guard;
    batch.items.clear();
    let used_before = backing.used_blocks();
    tally(table, batch);
    let mut r = BackingCompactReport::default();
    let mut next = 0;
    while r.blocks_looked < max_blocks && !r.full {
        let want = (max_blocks - r.blocks_looked).min(BATCH_BLOCKS as u64) as usize;
        next = choose(batch, next, want);
        if batch.chosen.len() < 2 {
            break;
        }
        r.blocks_looked += batch.chosen.len() as u64;
        read_chosen(backing, batch, &mut r);
        move_objects(table, backing, st, batch, &mut r)?;
    }
    batch.chosen.clear();
    r.blocks_freed = used_before.saturating_sub(backing.used_blocks());
    Ok(r)
}

/// Fills `batch.tally`: per block, the live bytes of its per-page
/// objects, [`KEEP`] where a written-back packed group lies.
fn tally(table: &SlotTable, batch: &mut Batch) {
    batch.tally.fill(0);
    for page in 0..table.pages() {
        let e = table.lock(page).entry();
        let Some(place) = backed_extent(&e) else {
            continue;
        };
        for b in place.blocks() {
            let Some(t) = batch.tally.get_mut(b as usize) else {
                continue;
            };
            *t = match (e.kind, *t) {
                (Kind::BackedGroup, _) | (_, KEEP) => KEEP,
                (_, t) => t.saturating_add(e.len as u16).min(KEEP - 1),
            };
        }
    }
}

/// Puts into `batch.chosen` up to `want` sparse blocks from block `from`
/// on; returns the block to go on from.
fn choose(batch: &mut Batch, from: usize, want: usize) -> usize {
    batch.chosen.clear();
    let mut b = from;
    while b < batch.tally.len() && batch.chosen.len() < want {
        if (1..SPARSE_BYTES).contains(&batch.tally[b]) {
            batch.chosen.push(b as u32);
        }
        b += 1;
    }
    b
}

/// Reads the chosen blocks into `batch.src`, in order; a block that
/// cannot be read is dropped from the list.
fn read_chosen(backing: &Backing, batch: &mut Batch, r: &mut BackingCompactReport) {
    let mut kept = 0;
    for i in 0..batch.chosen.len() {
        let b = batch.chosen[i];
        let dst = &mut batch.src.as_mut_slice()[kept * PAGE_SIZE..(kept + 1) * PAGE_SIZE];
        match backing.read_into(b, dst) {
            Ok(()) => {
                batch.chosen[kept] = b;
                kept += 1;
            }
            Err(e) => {
                log::warn!("backing compaction leaves block {b} as it is: {e}");
                r.unreadable += 1;
            }
        }
    }
    batch.chosen.truncate(kept);
}

/// What looking at one page did.
enum Gather {
    Next,
    /// Its object has no room in the batch: write the batch, look again.
    Full,
}

/// Copies the objects of the chosen blocks into batches, writes them and
/// switches their slots.
fn move_objects(
    table: &SlotTable,
    backing: &Backing,
    st: &mut CtxState,
    batch: &mut Batch,
    r: &mut BackingCompactReport,
) -> Result<()> {
    let mut fill = Fill::default();
    let mut page = 0;
    while page < table.pages() && !r.full {
        match gather(table, batch, &mut fill, page, r) {
            Gather::Next => page += 1,
            Gather::Full => {
                flush(table, backing, st, batch, r)?;
                fill = Fill::default();
            }
        }
    }
    flush(table, backing, st, batch, r)
}

/// Copies page `page`'s object into the batch if its slot names an
/// object of a chosen block and the object passes its CRC.
fn gather(
    table: &SlotTable,
    batch: &mut Batch,
    fill: &mut Fill,
    page: u64,
    r: &mut BackingCompactReport,
) -> Gather {
    let e = table.lock(page).entry();
    if e.kind != Kind::Backed {
        return Gather::Next;
    }
    let Some(place) = backed_extent(&e) else {
        return Gather::Next;
    };
    let Ok(k) = batch.chosen.binary_search(&place.block) else {
        return Gather::Next;
    };
    let at = k * PAGE_SIZE + place.off;
    let obj = &batch.src.as_slice()[at..at + place.len];
    if object_crc(page, obj) != e.backed_at().crc {
        r.corrupt += 1;
        return Gather::Next;
    }
    let Some((blk, off)) = fill.place(place.len, false) else {
        return Gather::Full;
    };
    if batch.items.len() >= BATCH_OBJECTS {
        return Gather::Full;
    }
    let to = blk * PAGE_SIZE + off;
    batch.buf.as_mut_slice()[to..to + place.len].copy_from_slice(obj);
    batch.items.push(Pending {
        page,
        entry: e,
        blk,
        off: off as u16,
        bytes: place.len as u32,
        group: None,
        crc: e.backed_at().crc,
    });
    fill.advance(blk, off, place.len);
    Gather::Next
}

/// Writes the batch out and switches its slots; empties it.
fn flush(
    table: &SlotTable,
    backing: &Backing,
    st: &mut CtxState,
    batch: &mut Batch,
    r: &mut BackingCompactReport,
) -> Result<()> {
    if batch.items.is_empty() {
        return Ok(());
    }
    r.blocks_written += place_and_write(backing, batch, &mut r.full)?;
    crate::crash_point::point("backing-compact:written");
    for &b in &batch.blocks {
        if let Some(t) = batch.tally.get_mut(b as usize) {
            *t = KEEP;
        }
    }
    for i in 0..batch.items.len() {
        let it = batch.items[i];
        // An object without a place (the backing store was full) stays.
        if let Some(blocks) = file_blocks(batch, &it) {
            switch(table, backing, st, it, blocks, r);
        }
    }
    batch.items.clear();
    Ok(())
}

/// Switches one moved object's slot to its copy on `blocks` if the slot
/// still holds the entry that was read; else gives the copy's place
/// back.
fn switch(
    table: &SlotTable,
    backing: &Backing,
    st: &mut CtxState,
    it: Pending,
    blocks: std::ops::Range<u32>,
    r: &mut BackingCompactReport,
) {
    let place = BackedAt {
        block: blocks.start,
        off: it.off,
        crc: it.crc,
    };
    let new = Entry::backed(place, it.bytes, it.entry.algo);
    let points = MovePoints {
        locked: "backing-compact:locked",
        released: Some("backing-compact:released"),
    };
    if !table.move_page(st, it.page, Held::Backed(it.entry), new, 0, points) {
        backing.release_blocks(blocks);
        r.raced += 1;
        return;
    }
    r.objects_moved += 1;
    r.bytes_moved += u64::from(it.bytes);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backing::AlignedBuf;

    #[test]
    fn chooses_blocks_with_some_live_bytes_under_half_and_no_group() {
        let mut batch = Batch {
            buf: AlignedBuf::new(1, false).unwrap(),
            items: Vec::new(),
            blocks: Vec::new(),
            src: AlignedBuf::new(1, false).unwrap(),
            chosen: Vec::new(),
            tally: vec![0, 100, SPARSE_BYTES, KEEP, SPARSE_BYTES - 1, 4096, 5],
        };
        assert_eq!(choose(&mut batch, 0, 2), 5);
        assert_eq!(batch.chosen, [1, 4]);
        assert_eq!(choose(&mut batch, 5, 2), 7);
        assert_eq!(batch.chosen, [6]);
        assert_eq!(choose(&mut batch, 7, 2), 7);
        assert!(batch.chosen.is_empty());
    }
}
