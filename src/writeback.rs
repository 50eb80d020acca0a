//! Writeback: the store's half of `zblk writeback` (zram's `writeback`),
//! moving chosen pages' compressed objects, as they are, to the backing
//! store (`crate::backing`), where many share a 4 KB block.
//!
//! Pages are chosen as zram's `type=` does: `idle`, `huge` (stored raw),
//! `incompressible` (raw, and recompression could not shrink them either)
//! or `huge_idle`; same-filled pages stay in their slots (they cost no
//! object), packed stores are refused (a group's object is shared).
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
use crate::slot::{BackedAt, Entry, Kind, INCOMPRESSIBLE};
use crate::stats::{Counter, Op};
use crate::table::{Held, MovePoints, SlotTable};
use serde::Serialize;
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

impl std::str::FromStr for WritebackType {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s {
            "idle" => Ok(WritebackType::Idle),
            "huge" => Ok(WritebackType::Huge),
            "incompressible" => Ok(WritebackType::Incompressible),
            "huge_idle" => Ok(WritebackType::HugeIdle),
            _ => Err(format!(
                "unknown writeback type '{s}': expected idle, huge, incompressible or huge_idle"
            )),
        }
    }
}

/// What to write back.
#[derive(Debug, Clone, Copy)]
pub struct Writeback {
    /// Which pages.
    pub kind: WritebackType,
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

/// Whether `e` is a page of type `kind`.
fn selected(e: &Entry, kind: WritebackType) -> bool {
    let huge = e.kind == Kind::Huge;
    let stored = huge || e.kind == Kind::Compressed;
    stored
        && match kind {
            WritebackType::Idle => e.idle,
            WritebackType::Huge => huge,
            WritebackType::Incompressible => huge && e.n == INCOMPRESSIBLE,
            WritebackType::HugeIdle => huge && e.idle,
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
    let mut guard = backing.batch.lock().unwrap_or_else(|e| e.into_inner());
    let batch = &mut *guard;
    batch.items.clear();
    let mut r = WritebackReport::default();
    let mut fill = Fill::default();
    let mut page = 0;
    while page < table.pages() && r.selected < budget && !r.full {
        match gather(table, batch, &mut fill, page, p.kind) {
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
    flush(table, backing, st, batch, &mut r)?;
    Ok(r)
}

/// Copies page `page`'s object into the batch if `kind` selects it.
fn gather(
    table: &SlotTable,
    batch: &mut Batch,
    fill: &mut Fill,
    page: u64,
    kind: WritebackType,
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
    crate::inject::point("writeback:written");
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
