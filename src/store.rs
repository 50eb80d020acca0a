//! `Store`: the slot table and the four operations over page-aligned ranges.
//!
//! This is the zram_drv.c of zblk: one function per operation (write, read,
//! discard, write-zeroes), each taking the caller's per-thread state. Writes
//! go through compression groups (`group.rs`); reads, discards and
//! write-zeroes walk their slots one lock at a time.

use crate::alloc::{Handle, HeapAllocator, ObjAllocator, Relocate};
use crate::codec::{Algo, Codec};
use crate::ctx::{CtxState, QueueCtx};
use crate::error::{Error, Result};
use crate::free::{FreeConfig, Freer, DEFAULT_MAX_PENDING_BATCHES};
use crate::packed::{self, PackHeader, PACK_HEADER};
use crate::page::{fill_word, PAGE_SIZE, PAGE_SIZE_U64};
use crate::slab::{SlabAllocator, SlabConfig};
use crate::slot::{Entry, Kind, Slot, SlotGuard};
use crate::stats::{self, Counter, Counters, Latencies, Op, StatsShard};
use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Default compressed size at or above which a page is stored raw: 3/4 of a
/// page, near zram's huge_class_size. Storing such a page compressed would
/// save little memory and cost a decompression on every read.
pub const DEFAULT_HUGE_THRESHOLD: usize = PAGE_SIZE * 3 / 4;

/// Default pages per compression group (zswap's batch size).
pub const DEFAULT_GROUP_PAGES: usize = 8;

/// Largest compression group.
pub const MAX_GROUP_PAGES: usize = 64;

/// How the pages of a compression group are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Each page its own object: best for random swap-in.
    #[default]
    PerPage,
    /// A group's pages compressed together as one object: better ratio and
    /// faster writes, reads decompress the whole group.
    Packed,
}

impl std::str::FromStr for Mode {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s {
            "per-page" => Ok(Mode::PerPage),
            "packed" => Ok(Mode::Packed),
            _ => Err(format!("unknown mode '{s}': expected per-page or packed")),
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Mode::PerPage => "per-page",
            Mode::Packed => "packed",
        })
    }
}

/// How a store is built.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Device size in bytes; a non-zero multiple of 4 KB.
    pub size: u64,
    /// Compression algorithm.
    pub algo: Algo,
    /// Pages per compression group (1 disables grouping).
    pub group_pages: usize,
    /// Per-page or packed objects.
    pub mode: Mode,
    /// Compressed size at or above which a page is stored raw.
    pub huge_threshold: usize,
    /// Memory limit in bytes (0: none).
    pub mem_limit: u64,
    /// Which object allocator stores compressed pages.
    pub allocator: AllocatorKind,
    /// Free detached objects on the store's drain thread (true) or on the
    /// queue thread at the end of each request (false).
    pub deferred_free: bool,
    /// Full free batches the drain may fall behind by before queue threads
    /// free synchronously (see `crate::free`).
    pub deferred_free_max_batches: usize,
    /// Lock the slab's memory in RAM (for swap devices).
    pub mlock: bool,
    /// Makes each context's codec instead of `algo.new_codec()`: an
    /// accelerator codec on a chosen set of work queues (tests run
    /// `deflate-iaa` on the device model this way). Its codecs must
    /// implement `algo`.
    pub codecs: Option<CodecFactory>,
}

/// Makes one codec per queue context (see [`StoreConfig::codecs`]).
#[derive(Clone)]
pub struct CodecFactory(pub Arc<dyn Fn() -> Box<dyn Codec> + Send + Sync>);

impl std::fmt::Debug for CodecFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CodecFactory")
    }
}

/// The object allocator a store is built with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AllocatorKind {
    /// The size-class slab (`crate::slab`): zsmalloc's design, compaction.
    #[default]
    Slab,
    /// One heap allocation per object: the simple reference.
    Heap,
}

/// Fragmentation at which the store compacts by itself: when compaction
/// could give back this share (percent) of `mem_used_total`...
pub const AUTO_COMPACT_PERCENT: u64 = 10;
/// ...and at least this many pages (so small stores are left alone).
pub const AUTO_COMPACT_MIN_PAGES: u64 = 256;

/// Longest a stat waits for the drain thread to free what is queued.
const STATS_SETTLE: Duration = Duration::from_millis(200);

impl StoreConfig {
    /// A configuration with defaults for everything but the size.
    pub fn new(size: u64) -> Self {
        StoreConfig {
            size,
            algo: Algo::Lz4,
            group_pages: DEFAULT_GROUP_PAGES,
            mode: Mode::PerPage,
            huge_threshold: DEFAULT_HUGE_THRESHOLD,
            mem_limit: 0,
            allocator: AllocatorKind::Slab,
            deferred_free: true,
            deferred_free_max_batches: DEFAULT_MAX_PENDING_BATCHES,
            mlock: false,
            codecs: None,
        }
    }

    fn validate(&self) -> Result<()> {
        if self.size == 0 || self.size % PAGE_SIZE_U64 != 0 {
            return Err(Error::InvalidConfig(format!(
                "size {} is not a non-zero multiple of 4096 bytes",
                self.size
            )));
        }
        if usize::try_from(self.size / PAGE_SIZE_U64).is_err() {
            return Err(Error::InvalidConfig(format!(
                "size {} is too large",
                self.size
            )));
        }
        if !(1..=MAX_GROUP_PAGES).contains(&self.group_pages) {
            return Err(Error::InvalidConfig(format!(
                "group pages {} is not in 1..={MAX_GROUP_PAGES}",
                self.group_pages
            )));
        }
        if !(64..=PAGE_SIZE).contains(&self.huge_threshold) {
            return Err(Error::InvalidConfig(format!(
                "huge threshold {} is not in 64..={PAGE_SIZE}",
                self.huge_threshold
            )));
        }
        if let Some(make) = &self.codecs {
            let made = (make.0)().algo();
            if made != self.algo {
                return Err(Error::InvalidConfig(format!(
                    "the codec factory makes {made} codecs, the store is configured for {}",
                    self.algo
                )));
            }
        }
        Ok(())
    }
}

/// Everything `zblk stat` shows about a store, merged from all shards.
#[derive(Debug, Clone, Serialize)]
pub struct StoreStats {
    /// Device size in bytes.
    pub disksize: u64,
    /// Compression algorithm.
    pub algorithm: String,
    /// Pages per compression group.
    pub group_pages: usize,
    /// Per-page or packed objects.
    pub mode: Mode,
    /// Counters summed over all queues.
    #[serde(flatten)]
    pub counters: Counters,
    /// Bytes the allocator holds (metadata and waste included).
    pub mem_used_total: u64,
    /// Peak of `mem_used_total`.
    pub mem_used_max: u64,
    /// Memory limit in bytes (0: none).
    pub mem_limit: u64,
    /// Pages given back by compaction since creation.
    pub pages_compacted: u64,
    /// Bytes of `mem_used_total` held as empty zspages kept for reuse
    /// (given back after a second without reuse, or by compaction).
    pub mem_spare: u64,
    /// Handles detached but not yet freed.
    pub deferred_free_pending: u64,
    /// Bytes of slot table (16 per page of device size).
    pub slot_table_bytes: u64,
    /// Per-page latency percentiles.
    pub latency: Latencies,
    /// The counters of each queue context, in queue order.
    pub queues: Vec<Counters>,
}

/// The compressed page store.
pub struct Store {
    cfg: StoreConfig,
    slots: Box<[Slot]>,
    alloc: Arc<dyn ObjAllocator>,
    frees: Freer,
    shards: Mutex<Vec<Arc<StatsShard>>>,
    pages_compacted: AtomicU64,
    /// The compactor's own thread state (codec, shard, free batch).
    compactor: Mutex<Option<CtxState>>,
}

/// What leaving a slot gave back: the old entry, its position in its packed
/// blob, and whether its object is now unreferenced and must be freed.
pub(crate) struct Released {
    old: Entry,
    pos: usize,
    free: bool,
}

impl Store {
    /// Creates a store with the allocator its configuration names.
    pub fn new(cfg: StoreConfig) -> Result<Arc<Store>> {
        let alloc: Box<dyn ObjAllocator> = match cfg.allocator {
            AllocatorKind::Slab => Box::new(SlabAllocator::new(SlabConfig { mlock: cfg.mlock })),
            AllocatorKind::Heap => Box::new(HeapAllocator::new()),
        };
        Self::with_allocator(cfg, alloc)
    }

    /// Creates a store over the given allocator.
    pub fn with_allocator(cfg: StoreConfig, alloc: Box<dyn ObjAllocator>) -> Result<Arc<Store>> {
        cfg.validate()?;
        let pages = (cfg.size / PAGE_SIZE_U64) as usize;
        alloc.set_mem_limit(cfg.mem_limit);
        let alloc: Arc<dyn ObjAllocator> = Arc::from(alloc);
        let frees = Freer::new(
            alloc.clone(),
            FreeConfig {
                deferred: cfg.deferred_free,
                max_pending_batches: cfg.deferred_free_max_batches,
            },
        );
        let store = Arc::new(Store {
            slots: new_slot_table(pages)?,
            alloc,
            frees,
            shards: Mutex::new(Vec::new()),
            pages_compacted: AtomicU64::new(0),
            compactor: Mutex::new(None),
            cfg,
        });
        // The drain thread compacts when fragmentation passes the threshold.
        let weak = Arc::downgrade(&store);
        store.frees.set_idle_hook(Box::new(move || {
            if let Some(s) = weak.upgrade() {
                s.maybe_compact();
            }
        }));
        Ok(store)
    }

    /// Creates a per-thread context (one per queue).
    pub fn new_ctx(self: &Arc<Self>) -> QueueCtx {
        let (id, shard) = self.new_shard();
        QueueCtx::new(self.clone(), id, shard)
    }

    /// Registers a statistics shard; returns its index and the shard.
    fn new_shard(&self) -> (usize, Arc<StatsShard>) {
        let shard = Arc::new(StatsShard::default());
        let mut shards = self.shards.lock().unwrap_or_else(|e| e.into_inner());
        shards.push(shard.clone());
        (shards.len() - 1, shard)
    }

    /// The configuration the store was built with.
    pub fn config(&self) -> &StoreConfig {
        &self.cfg
    }

    /// Device size in bytes.
    pub fn size(&self) -> u64 {
        self.cfg.size
    }

    /// The object allocator.
    pub fn allocator(&self) -> &dyn ObjAllocator {
        &*self.alloc
    }

    /// Sets the memory limit in bytes (0: none), at run time.
    pub fn set_mem_limit(&self, bytes: u64) {
        self.alloc.set_mem_limit(bytes);
    }

    /// Runs compaction now: rewrites sparse packed groups, lets the drain
    /// free what is queued, then lets the allocator move objects. Returns
    /// the 4 KB pages given back.
    pub fn compact(&self) -> u64 {
        if self.cfg.mode == Mode::Packed {
            let mut guard = self.compactor.lock().unwrap_or_else(|e| e.into_inner());
            let st = guard.get_or_insert_with(|| {
                let (id, shard) = self.new_shard();
                CtxState::new(&self.cfg, id, shard)
            });
            crate::group::rewrite_sparse_groups(self, st);
            st.free.flush(&self.frees);
        }
        self.settle_frees(Duration::from_secs(5));
        self.compact_now()
    }

    fn compact_now(&self) -> u64 {
        let n = self.alloc.compact(self);
        self.pages_compacted.fetch_add(n, Relaxed);
        n
    }

    /// Compacts if fragmentation passed the threshold
    /// ([`AUTO_COMPACT_PERCENT`] of `mem_used_total` and at least
    /// [`AUTO_COMPACT_MIN_PAGES`] could be given back). The drain thread
    /// calls this about once a second while idle; a daemon without deferred
    /// free calls it from its idle timer. Empty zspages kept for reuse that
    /// were not reused since the previous call are given back first.
    /// Returns the pages given back.
    pub fn maybe_compact(&self) -> u64 {
        let trimmed = self.alloc.trim();
        let pages = self.alloc.compactable_pages();
        let used = self.alloc.mem_used_total();
        if pages >= AUTO_COMPACT_MIN_PAGES
            && pages * PAGE_SIZE_U64 * 100 >= used * AUTO_COMPACT_PERCENT
        {
            trimmed + self.compact_now()
        } else {
            trimmed
        }
    }

    /// Waits up to `timeout` until the drain has freed every full batch
    /// handed to it (partial batches live in each `QueueCtx`: see
    /// `QueueCtx::flush_frees`). Returns whether it settled.
    pub fn settle_frees(&self, timeout: Duration) -> bool {
        self.frees.settle(timeout)
    }

    /// The freeing machinery (the queue contexts hand their batches to it).
    pub(crate) fn frees(&self) -> &Freer {
        &self.frees
    }

    /// Merges every queue's statistics into one snapshot.
    pub fn stats(&self) -> StoreStats {
        // A stat asks for the truth: let the drain free what is queued
        // (bounded, so a stat never hangs behind a very long queue).
        self.frees.settle(STATS_SETTLE);
        let shards = self
            .shards
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let (counters, latency) = stats::merge(shards.iter().map(|s| &**s));
        let queues = shards.iter().map(|s| stats::merge([&**s]).0).collect();
        // Handles detached (counted per queue) minus those freed so far:
        // partial batches in contexts plus what the drain has not reached.
        let deferred_free_pending = counters.deferred_frees.saturating_sub(self.frees.freed());
        StoreStats {
            disksize: self.cfg.size,
            algorithm: self.cfg.algo.to_string(),
            group_pages: self.cfg.group_pages,
            mode: self.cfg.mode,
            counters,
            mem_used_total: self.alloc.mem_used_total(),
            mem_used_max: self.alloc.mem_used_max(),
            mem_limit: self.alloc.mem_limit(),
            pages_compacted: self.pages_compacted.load(Relaxed),
            mem_spare: self.alloc.spare_pages() * PAGE_SIZE_U64,
            deferred_free_pending,
            slot_table_bytes: (self.slots.len() * std::mem::size_of::<Slot>()) as u64,
            latency,
            queues,
        }
    }

    pub(crate) fn slot(&self, page: u64) -> &Slot {
        &self.slots[page as usize]
    }

    /// Pages of device.
    pub(crate) fn pages(&self) -> u64 {
        self.slots.len() as u64
    }

    /// Checks a byte range and returns its first page and page count.
    fn check_range(&self, st: &CtxState, offset: u64, len: u64) -> Result<(u64, usize)> {
        let r = (|| {
            if offset % PAGE_SIZE_U64 != 0 || len % PAGE_SIZE_U64 != 0 {
                return Err(Error::Misaligned { offset, len });
            }
            match offset.checked_add(len) {
                Some(end) if end <= self.cfg.size => {
                    Ok((offset / PAGE_SIZE_U64, (len / PAGE_SIZE_U64) as usize))
                }
                _ => Err(Error::OutOfRange {
                    offset,
                    len,
                    size: self.cfg.size,
                }),
            }
        })();
        if r.is_err() {
            st.shard.add(Counter::InvalidIo, 1);
        }
        r
    }

    /// Writes whole pages at `offset`, one compression group at a time.
    pub(crate) fn write(&self, st: &mut CtxState, offset: u64, data: &[u8]) -> Result<()> {
        let t0 = Instant::now();
        let (first, pages) = self.check_range(st, offset, data.len() as u64)?;
        let g = self.cfg.group_pages;
        for (i, chunk) in data.chunks(g * PAGE_SIZE).enumerate() {
            if let Err(e) = crate::group::write_group(self, st, first + (i * g) as u64, chunk) {
                st.shard.add(Counter::FailedWrites, 1);
                return Err(e);
            }
        }
        st.free.end_request(&self.frees);
        st.shard.add(Counter::NumWrites, 1);
        st.shard.add(Counter::PagesWritten, pages as i64);
        record_latency(st, Op::Write, t0, pages);
        Ok(())
    }

    /// Reads whole pages at `offset` into `buf`.
    pub(crate) fn read(&self, st: &mut CtxState, offset: u64, buf: &mut [u8]) -> Result<()> {
        let t0 = Instant::now();
        let (first, pages) = self.check_range(st, offset, buf.len() as u64)?;
        for (i, out) in buf.chunks_exact_mut(PAGE_SIZE).enumerate() {
            if let Err(e) = self.read_page(st, first + i as u64, out) {
                // Reported by the caller (the daemon logs it rate-limited):
                // a corrupt page read over and over must not flood the log.
                st.shard.add(Counter::FailedReads, 1);
                return Err(e);
            }
        }
        st.shard.add(Counter::NumReads, 1);
        st.shard.add(Counter::PagesRead, pages as i64);
        record_latency(st, Op::Read, t0, pages);
        Ok(())
    }

    /// Reads one page under its slot's lock, so it sees one whole version.
    fn read_page(&self, st: &mut CtxState, page: u64, out: &mut [u8]) -> Result<()> {
        let guard = self.slot(page).lock();
        self.read_entry(st, page, &guard.entry(), out)
    }

    /// Produces the page `e` stores. The caller holds the slot's lock.
    pub(crate) fn read_entry(
        &self,
        st: &mut CtxState,
        page: u64,
        e: &Entry,
        out: &mut [u8],
    ) -> Result<()> {
        let r = match e.kind {
            Kind::Empty => {
                out.fill(0);
                Ok(())
            }
            Kind::Same => {
                fill_word(out, e.val);
                Ok(())
            }
            Kind::Huge => {
                // SAFETY: the slot lock keeps the object from being freed or moved.
                out.copy_from_slice(unsafe { self.alloc.object(e.val, PAGE_SIZE) });
                Ok(())
            }
            Kind::Compressed => {
                // SAFETY: as above.
                let obj = unsafe { self.alloc.object(e.val, e.len as usize) };
                st.codec.decompress(obj, out).map_err(|err| err.to_string())
            }
            Kind::Packed => self.read_packed(st, e, out),
        };
        r.map_err(|detail| {
            // Never hand out a partly decoded page.
            out.fill(0);
            Error::Corrupt { page, detail }
        })
    }

    /// Serves a packed page from the thread's cache of the last group it
    /// decompressed, or decompresses the group into that cache.
    fn read_packed(
        &self,
        st: &mut CtxState,
        e: &Entry,
        out: &mut [u8],
    ) -> std::result::Result<(), String> {
        // SAFETY: the caller holds the slot lock, so the object stays alive.
        let obj = unsafe { self.alloc.object(e.val, PACK_HEADER + e.len as usize) };
        let hdr = PackHeader::read(obj);
        let pos = hdr.position(e.idx);
        if hdr.orig.count_ones() != e.n as u32 || pos >= e.n as usize {
            return Err("packed group header does not match its slot".into());
        }
        if let Some(p) = st.pack_cache.get(hdr.id, pos) {
            out.copy_from_slice(p);
            return Ok(());
        }
        let buf = st.pack_cache.buffer(e.n as usize);
        st.codec
            .decompress(&obj[PACK_HEADER..], buf)
            .map_err(|err| err.to_string())?;
        out.copy_from_slice(&buf[pos * PAGE_SIZE..(pos + 1) * PAGE_SIZE]);
        st.pack_cache.set(hdr.id);
        Ok(())
    }

    /// Discards whole pages: they read as zeros and their objects are freed.
    pub(crate) fn discard(&self, st: &mut CtxState, offset: u64, len: u64) -> Result<()> {
        let t0 = Instant::now();
        let (first, pages) = self.check_range(st, offset, len)?;
        for page in first..first + pages as u64 {
            let r = self.swap_slot(page, Entry::EMPTY);
            self.release(st, r);
        }
        st.free.end_request(&self.frees);
        st.shard.add(Counter::NotifyFree, pages as i64);
        st.shard.add(Counter::NumDiscards, 1);
        record_latency(st, Op::Discard, t0, pages);
        Ok(())
    }

    /// Zeroes whole pages. An empty slot reads as zeros and costs nothing,
    /// so this is a discard, as in zram.
    pub(crate) fn write_zeroes(&self, st: &mut CtxState, offset: u64, len: u64) -> Result<()> {
        self.discard(st, offset, len)
    }

    /// Puts `new` into the slot of `page` and takes out what it held. A
    /// packed page's live bit is cleared under the slot lock, so that the
    /// object cannot move or be freed in between.
    pub(crate) fn swap_slot(&self, page: u64, new: Entry) -> Released {
        let mut guard = self.slot(page).lock();
        self.take_locked(&mut guard, new)
    }

    /// As [`Store::swap_slot`] with the slot already locked.
    pub(crate) fn take_locked(&self, guard: &mut SlotGuard<'_>, new: Entry) -> Released {
        let old = guard.replace(new);
        match old.kind {
            Kind::Packed => {
                // SAFETY: the slot referenced the object until now and we
                // hold its lock: the object is alive and was checked aligned.
                let (pos, free) = unsafe {
                    let hdr = PackHeader::read(self.alloc.object(old.val, PACK_HEADER));
                    (
                        hdr.position(old.idx),
                        packed::clear_live(&*self.alloc, old.val, old.idx),
                    )
                };
                Released { old, pos, free }
            }
            _ => Released {
                old,
                pos: 0,
                free: old.handle().is_some(),
            },
        }
    }

    /// Accounts for an entry that left its slot and hands its object, once
    /// unreferenced, to the queue's free batch.
    pub(crate) fn release(&self, st: &mut CtxState, r: Released) {
        let old = &r.old;
        account(&st.shard, old, r.pos, -1);
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

impl Relocate for Store {
    /// Locks every slot that may reference the object (the owner alone, or
    /// in packed mode the owner's whole group, in ascending order, the one
    /// order in which anyone holds more than one slot lock) and points those
    /// that do at the new copy.
    fn relocate(&self, owner: u64, old: Handle, mv: &mut dyn FnMut() -> Option<Handle>) -> bool {
        let span = match self.cfg.mode {
            Mode::PerPage => 1,
            Mode::Packed => self.cfg.group_pages as u64,
        };
        let end = owner.saturating_add(span).min(self.pages());
        let mut guards: Vec<SlotGuard<'_>> = (owner..end).map(|p| self.slot(p).lock()).collect();
        let holders: Vec<usize> = (0..guards.len())
            .filter(|&i| guards[i].entry().handle() == Some(old))
            .collect();
        if holders.is_empty() {
            return false;
        }
        if guards[holders[0]].entry().kind == Kind::Packed {
            // A group is installed slot by slot: until every live page
            // references the object, moving it would leave the pages still
            // to be installed pointing at the freed copy. Live bits are only
            // cleared by holders under their lock, so equal counts mean the
            // install is complete.
            // SAFETY: the holders reference `old` and we hold their locks.
            let live = unsafe { packed::live_count(&*self.alloc, old) };
            if live as usize != holders.len() {
                return false;
            }
        }
        let Some(new) = mv() else {
            return false;
        };
        for i in holders {
            let e = guards[i].entry();
            guards[i].replace(Entry { val: new, ..e });
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
        Kind::Packed => {
            shard.add(
                Counter::ComprDataSize,
                sign * packed::share(e.len, e.n, pos),
            );
        }
    }
    shard.add(Counter::StoredPages, sign);
}

fn record_latency(st: &CtxState, op: Op, t0: Instant, pages: usize) {
    if pages > 0 {
        let ns = t0.elapsed().as_nanos() as u64;
        st.shard.record(op, ns / pages as u64, pages as u64);
    }
}

/// Allocates a zeroed slot table without touching it: the OS hands out zero
/// pages lazily, so a large sparse device costs nothing until it is written.
fn new_slot_table(pages: usize) -> Result<Box<[Slot]>> {
    let layout = std::alloc::Layout::array::<Slot>(pages)
        .map_err(|_| Error::InvalidConfig(format!("{pages} pages is too many")))?;
    // SAFETY: the layout is non-zero (pages > 0 was validated); a zeroed
    // Slot is a valid Slot (two zero atomics: empty, unlocked).
    unsafe {
        let p = std::alloc::alloc_zeroed(layout) as *mut Slot;
        if p.is_null() {
            return Err(Error::NoSpace { limit: 0 });
        }
        Ok(Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, pages)))
    }
}

/// The handle and length of the object behind `page`, if it has one: for
/// tests that need to reach a stored object (to corrupt it, say).
#[doc(hidden)]
pub fn debug_handle(store: &Store, page: u64) -> Option<(Handle, u32)> {
    let e = store.slots.get(page as usize)?.lock().entry();
    let header = if e.kind == Kind::Packed {
        PACK_HEADER as u32
    } else {
        0
    };
    e.handle().map(|h| (h, e.len + header))
}
