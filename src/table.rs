//! `SlotTable`: the slots of a device and what happens when an entry enters
//! or leaves one.
//!
//! The table is zram's `zram->table` with the few operations every path
//! shares, so that each is written once: [`SlotTable::install`] puts a new
//! entry into a slot and releases the old one, [`SlotTable::move_page`]
//! does the same only if the slot still holds the object a maintenance
//! pass read (compaction, recompression, writeback), and `release`
//! accounts for an entry that left its slot and hands its object, once
//! nothing references it, to the queue's free batch. The
//! table also owns the objects' allocator and the deferred-free machinery,
//! because they are where a slot's objects come from and go to, and it
//! answers the allocator's compaction ([`Relocate`]), which must lock slots.
//!
//! Lock order: a slot lock is never held while calling into the allocator
//! (`crate::slab` takes a class lock and then slot locks while compacting);
//! whoever holds more than one slot lock takes them in ascending order.

use crate::alloc::{Handle, ObjAllocator, Relocate};
use crate::backing::{Backing, Extent};
use crate::crash_point;
use crate::ctx::CtxState;
use crate::error::{Error, Result};
use crate::free::{FreeConfig, Freer};
use crate::packed;
use crate::page::PAGE_SIZE;
use crate::shm::{SharedMem, SLOTS_AT};
use crate::slot::{Entry, Kind, Slot, SlotGuard};
use crate::stats::{Counter, StatsShard};
use std::sync::Arc;

/// What a slot must still hold for [`SlotTable::move_page`] to move its
/// page: the entry that was read, and the very object behind it. An
/// unchanged entry is not enough, since the page may have been overwritten
/// meanwhile and its new object, of the same size, given the old object's
/// freed handle: moving it then would bring the page's older version
/// back.
#[derive(Clone, Copy)]
pub(crate) enum Held<'a> {
    /// A per-page RAM object of exactly these bytes: equal bytes are the
    /// same page, whatever happened in between.
    Bytes(Entry, &'a [u8]),
    /// The packed object of this id (0: a per-page object, which the entry
    /// alone identifies).
    PackedId(Entry, u64),
    /// A written-back object (kind 5, or a page of a group: kind 6) at
    /// the place this entry names: the entry alone identifies it, since
    /// only the holder of the writeback batch, who is the mover, writes
    /// backing blocks, so no other object can take that place meanwhile.
    Backed(Entry),
}

/// The crash points a slot move passes, named by the pass that moves.
#[derive(Clone, Copy)]
pub(crate) struct MovePoints {
    /// Passed with the slot switched and still locked.
    pub(crate) locked: &'static str,
    /// Passed once the old entry was released (None: no point there).
    pub(crate) released: Option<&'static str>,
}

/// The slot table, the allocator behind it and its deferred free.
pub(crate) struct SlotTable {
    slots: SlotMem,
    alloc: Arc<dyn ObjAllocator>,
    frees: Freer,
    /// Slots an object may be referenced from, from its owner on (1 per
    /// page, the group size when packed): what a relocation locks.
    span: u64,
    /// The backing store written-back pages live in, if the store has one.
    backing: Option<Arc<Backing>>,
}

/// What leaving a slot gave back: the old entry, its position in its packed
/// blob, and whether its object is now unreferenced and must be freed.
struct Released {
    old: Entry,
    pos: usize,
    free: bool,
}

impl SlotTable {
    /// A table of `pages` slots over `alloc`: empty ones on the heap, or
    /// those of `shm`'s slot table (empty if the file is new).
    pub(crate) fn new(
        pages: usize,
        shm: Option<&Arc<SharedMem>>,
        alloc: Arc<dyn ObjAllocator>,
        free: FreeConfig,
        span: u64,
        backing: Option<Arc<Backing>>,
    ) -> Result<SlotTable> {
        let slots = match shm {
            Some(shm) => SlotMem::shared(shm, pages)?,
            None => SlotMem::Heap(new_slots(pages)?),
        };
        Ok(SlotTable {
            slots,
            frees: Freer::new(alloc.clone(), free),
            alloc,
            span,
            backing,
        })
    }

    /// The backing store, if the store has one.
    pub(crate) fn backing(&self) -> Option<&Arc<Backing>> {
        self.backing.as_ref()
    }

    /// For a recovery scan, with no other thread in the store: every
    /// slot's entry, in page order, unlocked (see `Slot::recover`);
    /// `keep(page, entry)` returning false empties that slot.
    pub(crate) fn scan(&self, mut keep: impl FnMut(u64, &Entry) -> bool) {
        for (page, slot) in self.slots.iter().enumerate() {
            let e = slot.recover();
            if !keep(page as u64, &e) {
                slot.lock().replace(Entry::EMPTY);
            }
        }
    }

    /// Pages of device.
    pub(crate) fn pages(&self) -> u64 {
        self.slots.len() as u64
    }

    /// Bytes of slot table.
    pub(crate) fn bytes(&self) -> u64 {
        std::mem::size_of_val(&*self.slots) as u64
    }

    /// The shared memory the slots live in, if they do.
    pub(crate) fn shared(&self) -> Option<&Arc<SharedMem>> {
        match &self.slots {
            SlotMem::Shared { shm, .. } => Some(shm),
            SlotMem::Heap(_) => None,
        }
    }

    /// The object allocator.
    pub(crate) fn allocator(&self) -> &dyn ObjAllocator {
        &*self.alloc
    }

    /// Faults the whole slot table in now (and, under the daemon's
    /// `mlockall`, locks it), as zram allocates its table when the disk
    /// size is set: with a memory reserve, a queue thread must not take a
    /// page fault on the first write to each 256 slots. Returns false if
    /// the OS refused the memory.
    pub(crate) fn prefault(&self) -> bool {
        let start = self.slots.as_ptr() as usize;
        let end = start + std::mem::size_of_val::<[Slot]>(&self.slots);
        // madvise wants a page-aligned start; populating the rest of the
        // first page (heap memory around a heap table) changes no byte.
        let first = start & !(PAGE_SIZE - 1);
        crate::slab::populate_range(first, end - first)
    }

    /// The bytes of the per-page RAM object (huge or compressed, at most
    /// a page) the slot `guard` holds, or None for any other entry. The
    /// guard (the caller's slot lock) keeps the object alive and in place
    /// while the bytes are borrowed.
    pub(crate) fn object_bytes<'g>(&'g self, guard: &'g SlotGuard<'_>) -> Option<&'g [u8]> {
        let e = guard.entry();
        let len = e.len as usize;
        if !matches!(e.kind, Kind::Huge | Kind::Compressed) || len == 0 || len > PAGE_SIZE {
            return None;
        }
        // SAFETY: the guard, borrowed as long as the bytes, keeps the slot
        // locked, so its object (of the entry's length) stays alive and in
        // place; published objects are never written.
        Some(unsafe { self.alloc.bytes(e.val, 0, len) })
    }

    /// Whether the slot `guard` holds (locked by the caller) keeps its page
    /// in a RAM object of exactly `bytes` (see [`Held::Bytes`]).
    fn holds_object(&self, guard: &SlotGuard<'_>, bytes: &[u8]) -> bool {
        self.object_bytes(guard) == Some(bytes)
    }

    /// Whether the slot `guard` holds (locked by the caller) still holds
    /// what `held` says was read.
    fn still_holds(&self, guard: &SlotGuard<'_>, held: Held<'_>) -> bool {
        match held {
            Held::Bytes(e, bytes) => {
                guard.entry().same_object(&e) && self.holds_object(guard, bytes)
            }
            Held::PackedId(e, id) => {
                guard.entry().same_object(&e) && packed::object_id(&*self.alloc, guard) == id
            }
            Held::Backed(e) => {
                matches!(e.kind, Kind::Backed | Kind::BackedGroup) && guard.entry().same_object(&e)
            }
        }
    }

    /// The allocator, shared (for a thread that outlives a borrow).
    pub(crate) fn allocator_arc(&self) -> Arc<dyn ObjAllocator> {
        self.alloc.clone()
    }

    /// The freeing machinery (the queue contexts hand their batches to it).
    pub(crate) fn frees(&self) -> &Freer {
        &self.frees
    }

    /// Locks the slot of `page` (which the caller checked is in range).
    pub(crate) fn lock(&self, page: u64) -> SlotGuard<'_> {
        self.slots[page as usize].lock()
    }

    /// Installs the group planned as `entries` (one per page) from page
    /// `first`: each slot takes its new entry, and what it held is
    /// released.
    pub(crate) fn install_group(&self, st: &mut CtxState, entries: &[Entry], first: u64) {
        let mut pos = 0;
        for (i, &new) in entries.iter().enumerate() {
            self.install(st, first + i as u64, new, pos);
            if new.kind == Kind::Packed {
                pos += 1;
            }
        }
    }

    /// Puts `new` (at position `pos` of its packed blob, if packed) into the
    /// slot of `page`, accounts for it and releases what the slot held.
    /// A stored page is stamped with the request's time (`st.now`), as an
    /// access.
    pub(crate) fn install(&self, st: &mut CtxState, page: u64, mut new: Entry, pos: usize) {
        if new.kind != Kind::Empty {
            new.atime = st.now;
        }
        let released = {
            let mut guard = self.lock(page);
            let released = self.take_locked(&mut guard, new);
            crash_point::point("install:locked");
            released
        };
        crash_point::point("install:swapped");
        self.entered(st, &new, pos);
        if new.kind == Kind::Huge {
            st.shard.add(Counter::HugePagesSince, 1);
        }
        self.release(st, released);
        crash_point::point("install:released");
    }

    /// Moves the page of `page` to `new` (at position `pos` of its packed
    /// blob, if packed) if its slot still holds what `held` says was read,
    /// then accounts for `new` and releases the old entry, passing the
    /// crash points `points` names. Moving is no access: `new` takes the
    /// slot's access time and idle mark. Returns false, having changed
    /// nothing, if the slot holds something else (a write or discard came
    /// in between and wins): the caller then lets go of what it made for
    /// `new`.
    pub(crate) fn move_page(
        &self,
        st: &mut CtxState,
        page: u64,
        held: Held<'_>,
        new: Entry,
        pos: usize,
        points: MovePoints,
    ) -> bool {
        let (new, released) = {
            let mut guard = self.lock(page);
            if !self.still_holds(&guard, held) {
                return false;
            }
            let cur = guard.entry();
            let new = Entry {
                atime: cur.atime,
                idle: cur.idle,
                ..new
            };
            let released = self.take_locked(&mut guard, new);
            crash_point::point(points.locked);
            (new, released)
        };
        self.entered(st, &new, pos);
        self.release(st, released);
        if let Some(point) = points.released {
            crash_point::point(point);
        }
        true
    }

    /// Accounts for `new`, just put into a slot at position `pos` of its
    /// packed blob.
    fn entered(&self, st: &CtxState, new: &Entry, pos: usize) {
        account(&st.shard, new, pos, 1);
    }

    /// Replaces the content of a locked slot with `new` and takes out what
    /// it held. A packed page's live bit is cleared under the slot lock, so
    /// that the object cannot move or be freed in between.
    fn take_locked(&self, guard: &mut SlotGuard<'_>, new: Entry) -> Released {
        let old = guard.replace(new);
        if old.kind == Kind::Packed {
            // SAFETY: the slot referenced the object until now and we hold
            // its lock: the object is alive, stays put, and was checked
            // aligned when it was stored.
            let (pos, free) = unsafe { packed::clear_live(&*self.alloc, &old) };
            return Released { old, pos, free };
        }
        Released {
            old,
            pos: 0,
            free: old.handle().is_some(),
        }
    }

    /// Accounts for an entry that left its slot and hands its object, once
    /// unreferenced, to the queue's free batch; a written-back page's
    /// object gives its place in the backing store back. Called after the
    /// slot lock was dropped: nothing references the old object any more.
    fn release(&self, st: &mut CtxState, r: Released) {
        let old = &r.old;
        account(&st.shard, old, r.pos, -1);
        if let (Some(b), Some(place)) = (&self.backing, backed_extent(old)) {
            b.release_blocks(place.blocks());
        }
        if old.kind == Kind::Packed {
            let mine = packed::share(old.len, old.n, r.pos);
            // Dead bytes: this page's share while the object lives on; the
            // shares of the pages that died before, once it is freed.
            let dead = if r.free {
                -(old.len as i64 - mine)
            } else {
                mine
            };
            st.shard.add(Counter::PackedDeadBytes, dead);
        }
        if r.free {
            if let Some(h) = old.handle() {
                st.shard.add(Counter::DeferredFrees, 1);
                st.free.push(h, &self.frees);
            }
        }
    }
}

impl Relocate for SlotTable {
    /// Locks every slot that may reference the object (the owner alone, or
    /// in packed mode the owner's whole group, in ascending order, the one
    /// order in which anyone holds more than one slot lock) and points those
    /// that do at the new copy.
    fn relocate(&self, owner: u64, old: Handle, mv: &mut dyn FnMut() -> Option<Handle>) -> bool {
        let end = owner.saturating_add(self.span).min(self.pages());
        let mut guards: Vec<SlotGuard<'_>> = (owner..end).map(|p| self.lock(p)).collect();
        let holders: Vec<usize> = (0..guards.len())
            .filter(|&i| guards[i].entry().handle() == Some(old))
            .collect();
        if holders.is_empty() {
            return false;
        }
        // A packed group is installed slot by slot: until every live page
        // references the object, moving it would leave the pages still to
        // be installed pointing at the freed copy. Live bits are only
        // cleared by holders under their lock, so equal counts mean the
        // install is complete.
        let live = packed::live_count(&*self.alloc, &guards[holders[0]]);
        if live.is_some_and(|live| live as usize != holders.len()) {
            return false;
        }
        let Some(new) = mv() else {
            return false;
        };
        crash_point::point("relocate:copied");
        for i in holders {
            let e = guards[i].entry();
            guards[i].replace(Entry { val: new, ..e });
            crash_point::point("relocate:holder");
        }
        true
    }
}

/// Adds (`sign` 1) or removes (`sign` -1) an entry's share of the gauges;
/// `pos` is a packed page's position in its blob.
pub(crate) fn account(shard: &StatsShard, e: &Entry, pos: usize, sign: i64) {
    match e.kind {
        Kind::Empty => return,
        Kind::Same => shard.add(Counter::SamePages, sign),
        Kind::Huge => {
            shard.add(Counter::HugePages, sign);
            shard.add(Counter::ComprDataSize, sign * PAGE_SIZE as i64);
        }
        Kind::Compressed => shard.add(Counter::ComprDataSize, sign * e.len as i64),
        Kind::Backed => {
            shard.add(Counter::BdCount, sign);
            shard.add(Counter::BdBytes, sign * e.len as i64);
        }
        Kind::BackedGroup => {
            shard.add(Counter::BdCount, sign);
            let share = packed::share(e.len, e.n, usize::from(e.idx));
            shard.add(Counter::BdBytes, sign * share);
        }
        Kind::Packed => {
            shard.add(
                Counter::ComprDataSize,
                sign * packed::share(e.len, e.n, pos),
            );
        }
    }
    shard.add(Counter::StoredPages, sign);
    if e.idle {
        shard.add(Counter::IdlePages, sign);
    }
    if e.algo != 0 {
        shard.add(Counter::RecompressedPages, sign);
    }
}

/// Where the object of a written-back page (kind 5 or 6) lies in the
/// backing store, or `None` for any other entry and for a place no
/// writeback makes (an empty object, one crossing its block, a group
/// position past its pages, blocks past the 32-bit block numbers).
pub(crate) fn backed_extent(e: &Entry) -> Option<Extent> {
    let place = match e.kind {
        Kind::Backed => {
            let at = e.backed_at();
            let len = e.len as usize;
            let fits = (1..=PAGE_SIZE).contains(&len) && usize::from(at.off) + len <= PAGE_SIZE;
            fits.then_some(Extent {
                block: at.block,
                off: usize::from(at.off),
                len,
            })?
        }
        Kind::BackedGroup => {
            let at = e.group_at();
            let fits = e.len > 0 && e.n >= 1 && e.idx < e.n;
            fits.then_some(Extent {
                block: at.block,
                off: usize::from(at.off),
                len: packed::GROUP_HEADER + e.len as usize,
            })?
        }
        _ => return None,
    };
    let blocks = (place.off + place.len).div_ceil(PAGE_SIZE) as u64;
    (u64::from(place.block) + blocks <= u64::from(u32::MAX)).then_some(place)
}

/// Allocates a zeroed slot table without touching it: the OS hands out zero
/// pages lazily, so a large sparse device costs nothing until it is written.
fn new_slots(pages: usize) -> Result<Box<[Slot]>> {
    let layout = std::alloc::Layout::array::<Slot>(pages)
        .map_err(|_| Error::InvalidConfig(format!("{pages} pages is too many")))?;
    if layout.size() == 0 {
        return Err(Error::InvalidConfig(
            "a device needs at least one page".into(),
        ));
    }
    // SAFETY: the layout is non-zero (checked above); a zeroed Slot is a
    // valid Slot (two zero atomics: empty, unlocked), and a non-null block
    // of this layout from the global allocator is what Box frees.
    unsafe {
        let p = std::alloc::alloc_zeroed(layout) as *mut Slot;
        if p.is_null() {
            return Err(Error::NoSpace { limit: 0 });
        }
        Ok(Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, pages)))
    }
}

/// Where the slots live: the heap, or a mapping of a store's shared memory.
enum SlotMem {
    Heap(Box<[Slot]>),
    Shared {
        /// The mapping: the header page, then the slots.
        base: usize,
        map_len: usize,
        pages: usize,
        shm: Arc<SharedMem>,
    },
}

impl SlotMem {
    /// Maps the slot table of `shm` (the header page with it, so that the
    /// mapping starts at offset 0 and the slots stay 16-byte aligned).
    fn shared(shm: &Arc<SharedMem>, pages: usize) -> Result<SlotMem> {
        let too_big = || Error::InvalidConfig(format!("{pages} pages is too many"));
        let bytes = pages
            .checked_mul(std::mem::size_of::<Slot>())
            .ok_or_else(too_big)?;
        let map_len = (SLOTS_AT as usize)
            .checked_add(bytes)
            .ok_or_else(too_big)?
            .next_multiple_of(PAGE_SIZE);
        // 4 KB pages: the table grows as pages are written anywhere on the
        // device, and a 2 MB page would back 512 MB of device at once.
        let base = shm
            .map(0, map_len, crate::shm::Pages::Small)
            .ok_or(Error::NoSpace { limit: 0 })?;
        Ok(SlotMem::Shared {
            base,
            map_len,
            pages,
            shm: shm.clone(),
        })
    }
}

impl std::ops::Deref for SlotMem {
    type Target = [Slot];

    fn deref(&self) -> &[Slot] {
        match self {
            SlotMem::Heap(b) => b,
            // SAFETY: the mapping holds `pages` slots from SLOTS_AT (4096,
            // a multiple of Slot's alignment, 16), lives as long as `self`,
            // and a Slot is one atomic, valid for any bytes (zeros: empty,
            // unlocked), so shared access through `&[Slot]` is sound even
            // while another process maps the same file.
            SlotMem::Shared { base, pages, .. } => unsafe {
                std::slice::from_raw_parts((*base + SLOTS_AT as usize) as *const Slot, *pages)
            },
        }
    }
}

impl Drop for SlotMem {
    fn drop(&mut self) {
        if let SlotMem::Shared { base, map_len, .. } = *self {
            // SAFETY: unmapping what `shared` mapped; no slot reference
            // outlives the table that owns this memory.
            unsafe { libc::munmap(base as *mut libc::c_void, map_len) };
        }
    }
}
