//! Compaction of the backing store: the written-back objects of sparsely
//! used blocks (per-page objects, kind 5, and packed groups, whose pages
//! are kind 6) are moved, packed, into fresh blocks, so that the sparse
//! blocks are free again.
//!
//! A backing block is free only once its last object dies; after
//! discards and overwrites many blocks hold a few live objects each, and
//! the blocks in use (`bd_used_bytes`) grow well past the live bytes
//! (`bd_bytes`). A call looks at most `max_blocks` blocks:
//!
//! 1. A walk of the slots tallies, per block, the live bytes on it
//!    (`Batch::tally`, made with the backing store): a per-page object's
//!    length; a group's header and blob where they lie in that block,
//!    counted once however many of its pages are live (a group moves
//!    whole or not at all, so its dead pages' bytes move too). The walk
//!    knows a group met before by its place in [`Recent`]: every page of
//!    a group lies within 64 pages of its first, so the last 64 groups
//!    met are all a page can belong to.
//! 2. The rule: a block is sparse when its live bytes are less than half
//!    a block. Its objects then fit, with those of other sparse blocks,
//!    into at most about half as many fresh blocks (what a sparse block
//!    holds is under 2 KB, so packing one after the other wastes less
//!    than half of each fresh block; a group that crosses blocks is moved
//!    only when every block it touches is sparse), so every block written
//!    gives back at least one: the I/O a move costs is bounded by the
//!    space it frees, and the fresh blocks, more than half full, are not
//!    chosen again. A round takes up to [`BATCH_BLOCKS`] sparse blocks in
//!    block order (fewer than two: nothing to gain, the call ends) and
//!    reads each with one `pread` into the batch's second buffer, with no
//!    slot lock held; a block that cannot be read stays as it is.
//! 3. A second walk of the slots takes each page whose slot names an
//!    object on the chosen blocks, checks it (a per-page object's CRC
//!    against the slot; a group's against its header and the slot's 24
//!    bits, `packed::check_backed_group`) and copies it into the batch
//!    buffer, as writeback packs objects (`writeback::Fill`): a group once,
//!    at the first of its pages met, with an item for each page still
//!    naming it. A corrupt object is left where it is: its pages go on
//!    failing their reads, never read a wrong page.
//! 4. The batch is written as writeback writes it (`place_and_write`:
//!    blocks reserved in the free map, one `pwrite` per run), then each
//!    slot is switched to its new place only if it still holds the very
//!    entry that was read (`Held::Backed`); a read, write or discard in
//!    between wins, and the copy's place is given back. A group's bytes
//!    are moved as they are (its CRC covers no place), so its pages keep
//!    their CRC tag and position. The switch releases the old place in the
//!    free map, so a sparse block is free once its last object moved.
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
//! slot on the copy. A crash between two pages of a group leaves some of
//! its pages on the old place and the rest on the copy, which hold the
//! same bytes. Either way the recovery scan rebuilds the free map from
//! the slots alone. Crash points: `backing-compact:written`,
//! `backing-compact:locked`, `backing-compact:released`, and for a
//! group's pages `backing-compact:group-locked` and
//! `backing-compact:group-released`.

use crate::backing::{object_crc, Backing, Batch, Extent, Pending, BATCH_BLOCKS};
use crate::ctx::CtxState;
use crate::error::Result;
use crate::packed;
use crate::page::PAGE_SIZE;
use crate::slot::{BackedAt, Entry, GroupAt, Kind, TAG_MASK};
use crate::table::{backed_extent, Held, MovePoints, SlotTable};
use crate::writeback::{file_blocks, place_and_write, Fill, Room};
use serde::Serialize;

/// A run of blocks whose live bytes are fewer than this many a block is
/// compacted.
pub const SPARSE_BYTES: u16 = (PAGE_SIZE / 2) as u16;

/// The bit of a block's tally that says a group crosses into it from the
/// block before: the two are in one run, chosen together or not at all.
const JOINED: u16 = 1 << 15;
/// The bits of a block's tally that count its live bytes.
const BYTES: u16 = JOINED - 1;
/// The byte count of a block never to choose: this call wrote it (its
/// tally, taken before, is stale).
const KEEP: u16 = BYTES;

/// What a compaction of the backing store did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct BackingCompactReport {
    /// Sparse blocks read.
    pub blocks_looked: u64,
    /// Objects moved to fresh blocks: per-page objects, and the pages of
    /// the packed groups moved.
    pub objects_moved: u64,
    /// Packed groups moved (whole, with their pages counted above).
    pub groups_moved: u64,
    /// Bytes moved (a group's header and blob once).
    pub bytes_moved: u64,
    /// Fresh blocks written.
    pub blocks_written: u64,
    /// Blocks in use before the call minus after it (discards meanwhile
    /// included).
    pub blocks_freed: u64,
    /// Objects a read, write or discard changed before their switch (the
    /// page kept what that gave it).
    pub raced: u64,
    /// Objects that failed their check, left where they are (a group
    /// counts once).
    pub corrupt: u64,
    /// Sparse blocks that could not be read, left as they are.
    pub unreadable: u64,
    /// The backing store had no free block for a copy.
    pub full: bool,
}

/// The places of the last [`Recent::LEN`] written-back groups a walk of
/// the slots met, so that it takes each group once: every page of a
/// group lies within 64 pages of its first (`orig` is a 64-bit mask), and
/// a page belongs to one group, so a group met again in a walk in page
/// order was met at most 63 groups ago.
struct Recent {
    vals: [u64; Recent::LEN],
    len: usize,
    next: usize,
}

impl Recent {
    const LEN: usize = 64;

    fn new() -> Recent {
        Recent {
            vals: [0; Recent::LEN],
            len: 0,
            next: 0,
        }
    }

    /// Whether the group whose slots' `val` is `val` was met already;
    /// remembers it if not.
    fn met(&mut self, val: u64) -> bool {
        if self.vals[..self.len].contains(&val) {
            return true;
        }
        self.vals[self.next] = val;
        self.next = (self.next + 1) % Recent::LEN;
        self.len = (self.len + 1).min(Recent::LEN);
        false
    }
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

/// Fills `batch.tally`: per block, the live bytes on it (a group's once)
/// and whether a group crosses into it ([`JOINED`]).
fn tally(table: &SlotTable, batch: &mut Batch) {
    batch.tally.fill(0);
    let mut groups = Recent::new();
    for page in 0..table.pages() {
        let e = table.lock(page).entry();
        let Some(place) = backed_extent(&e) else {
            continue;
        };
        if e.kind == Kind::BackedGroup && groups.met(e.val) {
            continue;
        }
        for (b, bytes) in block_bytes(&place) {
            let Some(t) = batch.tally.get_mut(b as usize) else {
                continue;
            };
            let joined = if b > place.block { JOINED } else { *t & JOINED };
            *t = joined | (*t & BYTES).saturating_add(bytes).min(KEEP - 1);
        }
    }
}

/// The blocks `place` touches, with the bytes of it each holds.
fn block_bytes(place: &Extent) -> impl Iterator<Item = (u32, u16)> + '_ {
    let end = place.off + place.len;
    place.blocks().enumerate().map(move |(i, b)| {
        let from = place.off.max(i * PAGE_SIZE);
        let to = end.min((i + 1) * PAGE_SIZE);
        (b, (to - from) as u16)
    })
}

/// Puts into `batch.chosen` the blocks of the sparse runs from block
/// `from` on (the start of a run), at most `want` blocks; returns the
/// block to go on from. A run longer than `want` is passed over.
fn choose(batch: &mut Batch, from: usize, want: usize) -> usize {
    batch.chosen.clear();
    let t = &batch.tally;
    let mut b = from;
    while b < t.len() && batch.chosen.len() < want {
        let end = run_end(t, b);
        if sparse_run(&t[b..end]) {
            if batch.chosen.len() + (end - b) > want && !batch.chosen.is_empty() {
                break;
            }
            if end - b <= want {
                batch.chosen.extend(b as u32..end as u32);
            }
        }
        b = end;
    }
    b
}

/// The block after the run that starts at block `b`: the blocks groups
/// cross into from `b` on.
fn run_end(tally: &[u16], b: usize) -> usize {
    let mut end = b + 1;
    while tally.get(end).is_some_and(|t| t & JOINED != 0) {
        end += 1;
    }
    end
}

/// Whether a run of blocks with these tallies holds some live bytes,
/// fewer than [`SPARSE_BYTES`] a block, and none of this call's blocks.
fn sparse_run(run: &[u16]) -> bool {
    let mut live = 0usize;
    for &t in run {
        if t & BYTES == KEEP {
            return false;
        }
        live += usize::from(t & BYTES);
    }
    live > 0 && live < run.len() * usize::from(SPARSE_BYTES)
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

/// Where `place` lies in `batch.src`, if every block it touches was
/// chosen and read (they are then consecutive there, as in the file).
fn in_chosen(batch: &Batch, place: &Extent) -> Option<usize> {
    let k = batch.chosen.binary_search(&place.block).ok()?;
    let n = place.blocks().len();
    let run = batch.chosen.get(k..k + n)?;
    let consecutive = run.iter().zip(place.blocks()).all(|(&c, b)| c == b);
    consecutive.then_some(k * PAGE_SIZE + place.off)
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
    let mut groups = Recent::new();
    let mut page = 0;
    while page < table.pages() && !r.full {
        match gather(table, batch, &mut fill, &mut groups, page, r) {
            Gather::Next => page += 1,
            Gather::Full => {
                flush(table, backing, st, batch, r)?;
                fill = Fill::default();
            }
        }
    }
    flush(table, backing, st, batch, r)
}

/// Copies page `page`'s object (its group, the first time one of the
/// group's pages is met) into the batch if its slot names a place on the
/// chosen blocks and the object passes its check.
fn gather(
    table: &SlotTable,
    batch: &mut Batch,
    fill: &mut Fill,
    groups: &mut Recent,
    page: u64,
    r: &mut BackingCompactReport,
) -> Gather {
    let e = table.lock(page).entry();
    let Some(place) = backed_extent(&e) else {
        return Gather::Next;
    };
    let Some(at) = in_chosen(batch, &place) else {
        return Gather::Next;
    };
    let found = Found {
        page,
        e,
        at,
        len: place.len,
    };
    match e.kind {
        Kind::BackedGroup => gather_group(table, batch, fill, groups, found, r),
        _ => gather_object(batch, fill, found, r),
    }
}

/// An object of the chosen blocks that a page's slot names.
#[derive(Clone, Copy)]
struct Found {
    /// The page.
    page: u64,
    /// Its slot's entry.
    e: Entry,
    /// Where the object lies in the blocks read (`Batch::src`).
    at: usize,
    /// Its bytes (a group's header and blob).
    len: usize,
}

/// Copies the per-page object `found` into the batch if it passes its
/// CRC.
fn gather_object(
    batch: &mut Batch,
    fill: &mut Fill,
    found: Found,
    r: &mut BackingCompactReport,
) -> Gather {
    let Found { page, e, at, len } = found;
    let obj = &batch.src.as_slice()[at..at + len];
    if object_crc(page, obj) != e.backed_at().crc {
        r.corrupt += 1;
        return Gather::Next;
    }
    let (blk, off) = match fill.room(batch, len, 1, false) {
        Room::At(blk, off) => (blk, off),
        Room::Full => return Gather::Full,
        Room::Never => return Gather::Next,
    };
    let to = blk * PAGE_SIZE + off;
    batch.buf.as_mut_slice()[to..to + len].copy_from_slice(obj);
    batch.items.push(Pending {
        page,
        entry: e,
        blk,
        off: off as u16,
        bytes: len as u32,
        group: None,
        crc: e.backed_at().crc,
    });
    fill.advance(blk, off, len);
    Gather::Next
}

/// Copies the written-back group `found` into the batch, with an item
/// for each of its pages still naming it, unless the walk met it before
/// or it fails its check.
fn gather_group(
    table: &SlotTable,
    batch: &mut Batch,
    fill: &mut Fill,
    groups: &mut Recent,
    found: Found,
    r: &mut BackingCompactReport,
) -> Gather {
    let Found { page, e, at, len } = found;
    let (blk, off) = match fill.room(batch, len, usize::from(e.n), true) {
        Room::At(blk, off) => (blk, off),
        Room::Full => return Gather::Full,
        Room::Never => return Gather::Next,
    };
    if groups.met(e.val) {
        return Gather::Next;
    }
    let group = &batch.src.as_slice()[at..at + len];
    let shape = match packed::check_backed_group(page, &e, group) {
        Ok(shape) => shape,
        Err(why) => {
            log::warn!("backing compaction leaves a group as it is: {why}");
            r.corrupt += 1;
            return Gather::Next;
        }
    };
    let to = blk * PAGE_SIZE + off;
    batch.buf.as_mut_slice()[to..to + len].copy_from_slice(group);
    for (p, pos) in shape.pages() {
        let held = Entry { idx: pos, ..e };
        let cur = table.lock(p).entry();
        if cur.kind != Kind::BackedGroup || !cur.same_object(&held) {
            // Discarded or overwritten since: no longer one of its pages.
            continue;
        }
        batch.items.push(Pending {
            page: p,
            entry: held,
            blk,
            off: off as u16,
            bytes: len as u32,
            group: Some((0, pos)),
            crc: shape.crc,
        });
    }
    fill.advance(blk, off, len);
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
    // The batch place of the last group a page of which was switched: a
    // group's items follow one another.
    let mut counted = None;
    for i in 0..batch.items.len() {
        let it = batch.items[i];
        // An object without a place (the backing store was full) stays.
        let Some(blocks) = file_blocks(batch, &it) else {
            continue;
        };
        if !switch(table, backing, st, it, blocks, r) {
            continue;
        }
        r.objects_moved += 1;
        let here = Some((it.blk, it.off));
        if it.group.is_none() || counted != here {
            r.bytes_moved += u64::from(it.bytes);
            r.groups_moved += u64::from(it.group.is_some());
            counted = here.filter(|_| it.group.is_some());
        }
    }
    batch.items.clear();
    Ok(())
}

/// Switches one moved object's slot (a group's page's) to its copy on
/// `blocks` if the slot still holds the entry that was read; else gives
/// the copy's place back. True if it switched.
fn switch(
    table: &SlotTable,
    backing: &Backing,
    st: &mut CtxState,
    it: Pending,
    blocks: std::ops::Range<u32>,
    r: &mut BackingCompactReport,
) -> bool {
    let e = it.entry;
    let (new, points) = match it.group {
        None => {
            let place = BackedAt {
                block: blocks.start,
                off: it.off,
                crc: it.crc,
            };
            let points = MovePoints {
                locked: "backing-compact:locked",
                released: Some("backing-compact:released"),
            };
            (Entry::backed(place, it.bytes, e.algo), points)
        }
        Some((_, pos)) => {
            let place = GroupAt {
                block: blocks.start,
                off: it.off,
                tag: it.crc & TAG_MASK,
            };
            let points = MovePoints {
                locked: "backing-compact:group-locked",
                released: Some("backing-compact:group-released"),
            };
            (Entry::backed_group(place, e.len, e.n, pos, e.algo), points)
        }
    };
    if !table.move_page(st, it.page, Held::Backed(e), new, 0, points) {
        backing.release_blocks(blocks);
        r.raced += 1;
        return false;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backing::AlignedBuf;

    fn batch(tally: Vec<u16>) -> Batch {
        Batch {
            buf: AlignedBuf::new(1, false).unwrap(),
            items: Vec::new(),
            blocks: Vec::new(),
            src: AlignedBuf::new(1, false).unwrap(),
            chosen: Vec::new(),
            tally,
        }
    }

    #[test]
    fn chooses_blocks_with_some_live_bytes_under_half() {
        let mut batch = batch(vec![0, 100, SPARSE_BYTES, KEEP, SPARSE_BYTES - 1, 4096, 5]);
        assert_eq!(choose(&mut batch, 0, 2), 5);
        assert_eq!(batch.chosen, [1, 4]);
        assert_eq!(choose(&mut batch, 5, 2), 7);
        assert_eq!(batch.chosen, [6]);
        assert_eq!(choose(&mut batch, 7, 2), 7);
        assert!(batch.chosen.is_empty());
    }

    #[test]
    fn chooses_runs_that_groups_join_whole_when_sparse_together() {
        let half = SPARSE_BYTES;
        let mut batch = batch(vec![
            // A run of two blocks under half full together, though its
            // second block alone is not: chosen whole.
            100,
            JOINED | (half + 100),
            // A run over half full together: passed over.
            half,
            JOINED | half,
            // A lone sparse block, then a run with one of this call's
            // blocks.
            7,
            100,
            JOINED | KEEP,
            // A run of three: too long for `want` 2 alone.
            1,
            JOINED | 1,
            JOINED | 1,
        ]);
        assert_eq!(choose(&mut batch, 0, 3), 5);
        assert_eq!(batch.chosen, [0, 1, 4]);
        assert_eq!(choose(&mut batch, 5, 2), 10);
        assert!(batch.chosen.is_empty(), "{:?}", batch.chosen);
        assert_eq!(choose(&mut batch, 5, 3), 10);
        assert_eq!(batch.chosen, [7, 8, 9]);
    }

    #[test]
    fn a_group_counts_its_bytes_where_they_lie() {
        let place = Extent {
            block: 3,
            off: 4000,
            len: 5000,
        };
        let v: Vec<_> = block_bytes(&place).collect();
        assert_eq!(v, [(3, 96), (4, 4096), (5, 808)]);
    }
}
