//! Writeback: the store's half of `zblk writeback` (zram's `writeback`),
//! moving chosen pages' compressed objects, as they are, to the backing
//! store (`crate::backing`), where many share a 4 KB block.
//!
//! Pages are chosen as zram's `type=` does: `idle`, `huge` (stored raw),
//! `incompressible` (raw, and recompression could not shrink them either)
//! or `huge_idle`; or by index, as zram's `page_index=` and
//! `page_indexes=` do: every stored page of the ranges given, whatever its
//! type. Same-filled pages stay in their slots (they cost no object).
//!
//! # Packed groups
//!
//! A packed store's group object is shared by its pages, so it moves
//! whole: met at the first of its pages the walk selects, it is written
//! back only if every page still live in it is selected (a group with a
//! page to keep in RAM stays there whole: moving part of it would free
//! none of its RAM) and fits what is left of the budget. Its blob goes to
//! the backing store as it is, behind a 24-byte header (CRC-32, length,
//! the group's page mask and first page: `crate::packed`, "Packed groups
//! on the backing store"); each live page's slot becomes kind 6
//! (`Kind::BackedGroup`: the group's first block, its header's offset
//! there, 24 bits of its CRC, and the page's position in the blob, as
//! `crate::slot` tables). Groups are packed one after the other across
//! block boundaries, 16-byte aligned, so a group costs its bytes, its
//! header and at most 15 bytes of padding; a run of blocks that groups
//! cross is reserved contiguous (a group is read in one `pread`) and
//! kept to [`MAX_RUN_BLOCKS`], a group that would make it longer starting
//! the next block afresh. On the real-memory corpus (12,800 pages) with
//! zstd:1 and groups of 8 pages, the backing store's used blocks are 1.028
//! bytes per byte of compressed group (`ZBLK_CORPUS=../shared/corpus/realmem-dev.bin.zst
//! cargo test --release --features test-support --test store_writeback
//! packed_writeback_wastes -- --nocapture`; the 96 pages of the tests'
//! fixture: 1.043). The free map counts a page
//! of a group once in every block the group touches, so the group's
//! blocks are free again when its last live page is discarded or
//! overwritten; the slot of each page is switched as a per-page object's
//! is, checked with `Held::PackedId` (the same group object), and the RAM
//! object is freed by the last page that leaves it, as any packed page
//! leaves its group.
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
//! A packed group's pages are switched one slot at a time, with their
//! own crash points (`writeback:group-locked`, `writeback:group-released`):
//! a crash in between leaves some pages on the backing store and the
//! others in the RAM object, which stays live for them; the recovery scan
//! counts the first in the free map and rebuilds the object's live mask
//! from the second.
//!
//! Nothing here allocates: the batch buffer, its list of objects and the
//! list of reserved blocks were made with the backing store
//! (`backing::Batch`), mlocked as the rest, so a writeback run while the
//! system is short of memory cannot recurse into swapping to this device.

use crate::backing::{object_crc, Backing, Batch, Pending, BATCH_BLOCKS, BATCH_OBJECTS, NO_BLOCK};
use crate::ctx::CtxState;
use crate::error::{Error, Result};
use crate::packed::{self, GROUP_HEADER};
use crate::page::PAGE_SIZE;
use crate::page_range::{spans, PageRange};
use crate::slot::{
    BackedAt, Entry, GroupAt, Kind, SlotGuard, GROUP_ALIGN, INCOMPRESSIBLE, TAG_MASK,
};
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
/// object, its own or its packed group's).
fn selected(e: &Entry, kind: Option<WritebackType>) -> bool {
    let huge = e.kind == Kind::Huge;
    let stored = huge || e.kind == Kind::Compressed || e.kind == Kind::Packed;
    stored
        && match kind {
            None => true,
            Some(WritebackType::Idle) => e.idle,
            Some(WritebackType::Huge) => huge,
            Some(WritebackType::Incompressible) => huge && e.n == INCOMPRESSIBLE,
            Some(WritebackType::HugeIdle) => huge && e.idle,
        }
}

/// Which pages a writeback moves: of a type, in the spans looked at.
struct Selector<'a> {
    kind: Option<WritebackType>,
    spans: &'a [Range<u64>],
}

impl Selector<'_> {
    /// Whether page `page`, whose slot holds `e`, is one to move.
    fn takes(&self, page: u64, e: &Entry) -> bool {
        selected(e, self.kind) && self.spans.iter().any(|r| r.contains(&page))
    }
}

/// Where the next object of a batch goes (the backing store's compaction
/// fills its batches the same way).
#[derive(Default)]
pub(crate) struct Fill {
    blk: usize,
    off: usize,
    /// The first batch block of the run the next object joins if it
    /// crosses into the next block: the blocks of a run are reserved
    /// contiguous, since a group's read reads its blocks in one go.
    run: usize,
    /// The packed object looked at last: its other pages are skipped.
    group: u64,
}

impl Fill {
    /// Where an object of `bytes` bytes goes: the batch block and offset,
    /// or `None` if the batch has no room left. A per-page object never
    /// crosses a block; a packed group starts 16-byte aligned and crosses
    /// blocks, unless that makes its run longer than [`MAX_RUN_BLOCKS`]
    /// (it then starts a run of its own at the next block).
    pub(crate) fn place(&self, bytes: usize, group: bool) -> Option<(usize, usize)> {
        let (mut blk, mut off) = (self.blk, self.off);
        if group {
            off = off.next_multiple_of(GROUP_ALIGN);
        }
        let crosses = off + bytes > PAGE_SIZE;
        let run = blk - self.run + (off + bytes).div_ceil(PAGE_SIZE);
        if off >= PAGE_SIZE || (crosses && off > 0 && (!group || run > MAX_RUN_BLOCKS)) {
            blk += 1;
            off = 0;
        }
        let end = blk * PAGE_SIZE + off + bytes;
        (end <= BATCH_BLOCKS * PAGE_SIZE).then_some((blk, off))
    }

    /// Where an object of `bytes` bytes for `pages` items (a group's
    /// live pages, or 1) goes in `batch`, if it has room for both.
    pub(crate) fn room(&self, batch: &Batch, bytes: usize, pages: usize, group: bool) -> Room {
        let Some((blk, off)) = self.place(bytes, group) else {
            return if batch.items.is_empty() {
                Room::Never
            } else {
                Room::Full
            };
        };
        if batch.items.len() + pages > BATCH_OBJECTS {
            return Room::Full;
        }
        Room::At(blk, off)
    }

    /// Records an object of `bytes` bytes placed at `blk`, `off`.
    pub(crate) fn advance(&mut self, blk: usize, off: usize, bytes: usize) {
        if off == 0 {
            // Nothing before it crosses into this block: a new run.
            self.run = blk;
        }
        let end = blk * PAGE_SIZE + off + bytes;
        (self.blk, self.off) = (end / PAGE_SIZE, end % PAGE_SIZE);
    }
}

/// Whether a batch has room for an object ([`Fill::room`]).
pub(crate) enum Room {
    /// At this batch block and offset.
    At(usize, usize),
    /// Not with what the batch holds: write it out, look again.
    Full,
    /// Not even in an empty batch (a group too big): never moved.
    Never,
}

/// Blocks a run of packed groups crossing blocks may take at most: the
/// longer the run, the fewer free runs a fragmented backing store has for
/// it; the shorter, the more often a group starts a block afresh.
const MAX_RUN_BLOCKS: usize = 16;

/// What looking at one page did.
enum Gather {
    Skipped,
    /// Added this many pages (a packed group's live pages all at once).
    Added(u64),
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
    let sel = Selector {
        kind: p.select.kind(),
        spans: &spans,
    };
    let mut guard = backing.batch.lock().unwrap_or_else(|e| e.into_inner());
    let batch = &mut *guard;
    batch.items.clear();
    let mut r = WritebackReport::default();
    let mut fill = Fill::default();
    for span in &spans {
        let mut page = span.start;
        while page < span.end && r.selected < budget && !r.full {
            match gather(table, batch, &mut fill, page, &sel, budget - r.selected) {
                Gather::Skipped => page += 1,
                Gather::Added(n) => {
                    r.selected += n;
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

/// Copies page `page`'s object (a packed page's: its group's) into the
/// batch if `sel` takes it, adding at most `room` pages.
fn gather(
    table: &SlotTable,
    batch: &mut Batch,
    fill: &mut Fill,
    page: u64,
    sel: &Selector<'_>,
    room: u64,
) -> Gather {
    let guard = table.lock(page);
    let e = guard.entry();
    if !sel.takes(page, &e) {
        return Gather::Skipped;
    }
    if e.kind == Kind::Packed {
        return gather_group(table, batch, fill, guard, sel, room);
    }
    let Some(obj) = table.object_bytes(&guard) else {
        return Gather::Skipped;
    };
    let len = obj.len();
    let (blk, off) = match fill.room(batch, len, 1, false) {
        Room::At(blk, off) => (blk, off),
        Room::Full => return Gather::Full,
        Room::Never => return Gather::Skipped,
    };
    let at = blk * PAGE_SIZE + off;
    batch.buf.as_mut_slice()[at..at + len].copy_from_slice(obj);
    drop(guard);
    batch.items.push(Pending {
        page,
        entry: e,
        blk,
        off: off as u16,
        bytes: len as u32,
        group: None,
        crc: 0,
    });
    fill.advance(blk, off, len);
    Gather::Added(1)
}

/// Copies the packed group the slot `guard` holds into the batch, whole,
/// with an item for each of its live pages, if `sel` takes every one of
/// them and they are at most `room`; a group with a page to keep in RAM
/// stays there whole (moving part of it would free none of its RAM). The
/// group is looked at once, from the first of its pages the walk meets.
fn gather_group(
    table: &SlotTable,
    batch: &mut Batch,
    fill: &mut Fill,
    guard: SlotGuard<'_>,
    sel: &Selector<'_>,
    room: u64,
) -> Gather {
    let alloc = table.allocator();
    let e = guard.entry();
    let id = packed::object_id(alloc, &guard);
    if id == fill.group {
        return Gather::Skipped;
    }
    let bytes = GROUP_HEADER + e.len as usize;
    let (blk, off) = match fill.room(batch, bytes, usize::from(e.n), true) {
        Room::At(blk, off) => (blk, off),
        Room::Full => return Gather::Full,
        Room::Never => return Gather::Skipped,
    };
    fill.group = id;
    let at = blk * PAGE_SIZE + off;
    let dst = &mut batch.buf.as_mut_slice()[at..at + bytes];
    let Some(copy) = packed::copy_group(alloc, &guard, dst) else {
        return Gather::Skipped;
    };
    drop(guard);
    let first = batch.items.len();
    if !add_members(table, batch, sel, e, &copy, room) {
        batch.items.truncate(first);
        return Gather::Skipped;
    }
    let crc = packed::seal_group(&mut batch.buf.as_mut_slice()[at..at + bytes]);
    for it in &mut batch.items[first..] {
        it.blk = blk;
        it.off = off as u16;
        it.bytes = bytes as u32;
        it.crc = crc;
    }
    fill.advance(blk, off, bytes);
    Gather::Added((batch.items.len() - first) as u64)
}

/// Adds an item for each page still live in the group `copy` describes
/// (`e`, its slots' entry but for the page's offset), each slot locked in
/// turn to look; false if `sel` does not take one of them, or they are
/// more than `room`.
fn add_members(
    table: &SlotTable,
    batch: &mut Batch,
    sel: &Selector<'_>,
    e: Entry,
    copy: &packed::GroupCopy,
    room: u64,
) -> bool {
    let alloc = table.allocator();
    let first = batch.items.len() as u64;
    let mut live = copy.live;
    while live != 0 {
        let idx = live.trailing_zeros();
        live &= live - 1;
        let page = copy.base + u64::from(idx);
        let held = Entry {
            idx: idx as u8,
            ..e
        };
        let guard = table.lock(page);
        let cur = guard.entry();
        if !cur.same_object(&held) || packed::object_id(alloc, &guard) != copy.id {
            // Discarded or overwritten since: no longer one of its pages.
            continue;
        }
        if !sel.takes(page, &cur) || batch.items.len() as u64 - first >= room {
            return false;
        }
        let pos = (copy.orig & ((1u64 << idx) - 1)).count_ones() as u8;
        batch.items.push(Pending {
            page,
            entry: held,
            blk: 0,
            off: 0,
            bytes: 0,
            group: Some((copy.id, pos)),
            crc: 0,
        });
    }
    true
}

/// Writes the batch out and switches its slots; empties it.
fn flush(
    table: &SlotTable,
    backing: &Backing,
    st: &mut CtxState,
    batch: &mut Batch,
    r: &mut WritebackReport,
) -> Result<()> {
    if batch.items.is_empty() {
        return Ok(());
    }
    let t0 = Instant::now();
    r.blocks += place_and_write(backing, batch, &mut r.full)?;
    crate::crash_point::point("writeback:written");
    let before = r.written;
    for i in 0..batch.items.len() {
        let it = batch.items[i];
        // A page without a place (the backing store was full) stays in RAM.
        if let Some(blocks) = file_blocks(batch, &it) {
            switch(table, backing, st, batch, it, blocks, r);
        }
    }
    let n = r.written - before;
    if let Some(per_page) = (t0.elapsed().as_nanos() as u64).checked_div(n) {
        st.shard.record(Op::Writeback, per_page, n);
    }
    batch.items.clear();
    Ok(())
}

/// Reserves file blocks for the batch (`reserve`) and writes it there;
/// returns the blocks reserved. On a failed write nothing is switched:
/// the blocks are given back, the batch emptied, and every object stays
/// where it was.
pub(crate) fn place_and_write(
    backing: &Backing,
    batch: &mut Batch,
    full: &mut bool,
) -> Result<u64> {
    let blocks = reserve(backing, batch, full);
    if let Err(e) = write_runs(backing, batch) {
        for it in &batch.items {
            if let Some(blocks) = file_blocks(batch, it) {
                backing.release_blocks(blocks);
            }
        }
        batch.items.clear();
        return Err(Error::Backing(format!(
            "writing to {}: {e}",
            backing.path().display()
        )));
    }
    Ok(blocks)
}

/// The file blocks item `it` was given, `None` if none were.
pub(crate) fn file_blocks(batch: &Batch, it: &Pending) -> Option<Range<u32>> {
    let first = *batch.blocks.get(it.blk).filter(|&&b| b != NO_BLOCK)?;
    Some(first..first + it.blks().len() as u32)
}

/// Reserves file blocks for the batch's blocks, each for as many pages
/// as have objects on it, and each run of blocks that groups cross
/// contiguous; leaves them in `batch.blocks` ([`NO_BLOCK`] from the first
/// run the backing store had no room for, with `full` set). Returns the
/// blocks reserved.
fn reserve(backing: &Backing, batch: &mut Batch, full: &mut bool) -> u64 {
    let mut counts = [0u16; BATCH_BLOCKS];
    // Whether an object crosses from the block before into this one.
    let mut joined = [false; BATCH_BLOCKS];
    let mut used = 0;
    for it in &batch.items {
        let blks = it.blks();
        used = used.max(blks.end);
        for b in blks.clone() {
            counts[b] += 1;
            joined[b] |= b > blks.start;
        }
    }
    batch.blocks.clear();
    batch.blocks.resize(used, NO_BLOCK);
    let mut start = 0;
    while start < used && !*full {
        let end = (start + 1..used).find(|&b| !joined[b]).unwrap_or(used);
        match backing.reserve_run(&counts[start..end]) {
            Some(first) => {
                for (i, b) in batch.blocks[start..end].iter_mut().enumerate() {
                    *b = first + i as u32;
                }
            }
            None => *full = true,
        }
        start = end;
    }
    batch.blocks.iter().filter(|&&b| b != NO_BLOCK).count() as u64
}

/// One `pwrite` per run of contiguous reserved blocks.
fn write_runs(backing: &Backing, batch: &Batch) -> std::io::Result<()> {
    let b = &batch.blocks;
    let mut i = 0;
    while i < b.len() {
        if b[i] == NO_BLOCK {
            i += 1;
            continue;
        }
        let mut j = i + 1;
        while j < b.len() && b[j] != NO_BLOCK && b[j] == b[j - 1].wrapping_add(1) {
            j += 1;
        }
        backing.write_blocks(b[i], &batch.buf.as_slice()[i * PAGE_SIZE..j * PAGE_SIZE])?;
        i = j;
    }
    Ok(())
}

/// Switches one written page's slot to its backing object on `blocks`,
/// if the slot still holds what was copied; else gives the backing place
/// back.
fn switch(
    table: &SlotTable,
    backing: &Backing,
    st: &mut CtxState,
    batch: &Batch,
    it: Pending,
    blocks: Range<u32>,
    r: &mut WritebackReport,
) {
    let at = it.blk * PAGE_SIZE + usize::from(it.off);
    let obj = &batch.buf.as_slice()[at..at + it.bytes as usize];
    let (held, new, pos, points) = match it.group {
        None => {
            let place = BackedAt {
                block: blocks.start,
                off: it.off,
                crc: object_crc(it.page, obj),
            };
            let new = Entry::backed(place, it.bytes, it.entry.algo);
            let points = MovePoints {
                locked: "writeback:locked",
                released: Some("writeback:released"),
            };
            (Held::Bytes(it.entry, obj), new, 0, points)
        }
        Some((id, pos)) => {
            let place = GroupAt {
                block: blocks.start,
                off: it.off,
                tag: it.crc & TAG_MASK,
            };
            let e = it.entry;
            let new = Entry::backed_group(place, e.len, e.n, pos, e.algo);
            let points = MovePoints {
                locked: "writeback:group-locked",
                released: Some("writeback:group-released"),
            };
            (Held::PackedId(e, id), new, usize::from(pos), points)
        }
    };
    if !table.move_page(st, it.page, held, new, pos, points) {
        backing.release_blocks(blocks);
        r.raced += 1;
        return;
    }
    st.shard.add(Counter::BdWrites, 1);
    r.written += 1;
    r.bytes += match it.group {
        None => u64::from(it.bytes),
        Some(_) => packed::share(new.len, new.n, pos) as u64,
    };
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
        assert!(selected(&e(Kind::Packed, false), None));
        for k in [Kind::Empty, Kind::Same, Kind::Backed, Kind::BackedGroup] {
            assert!(!selected(&e(k, true), None), "{k:?}");
        }
        let idle = Some(WritebackType::Idle);
        assert!(!selected(&e(Kind::Compressed, false), idle));
        assert!(selected(&e(Kind::Compressed, true), idle));
    }
}
