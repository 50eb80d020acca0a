//! `Store`: the device's pages, and the four operations over page-aligned
//! ranges.
//!
//! This is the zram_drv.c of zblk: one function per operation, each taking
//! the caller's per-thread state and going down, never back up:
//!
//! - write: [`Store::write`] -> `write::write_group` (per group) ->
//!   `packed::pack_group` or `write::plan_per_page` -> `alloc_bulk` ->
//!   `SlotTable::install_group`;
//! - read: [`Store::read`] -> `read::read_page` (per page, under its lock)
//!   -> the codec;
//! - discard and write-zeroes: [`Store::discard`] -> `SlotTable::install`
//!   of an empty entry -> `SlotTable::release` -> the queue's free batch;
//! - compaction: [`Store::compact`] -> `compact::rewrite_sparse_groups`,
//!   then the allocator's own compaction through `SlotTable`'s `Relocate`;
//! - idle marking and recompression: [`Store::mark_idle`],
//!   [`Store::recompress`] -> `recompress`;
//! - writeback to the backing store: [`Store::writeback`] -> `writeback`;
//! - what each slot holds (zram's `block_state`): [`Store::slot_states`]
//!   -> `block_state::collect`.
//!
//! Each queue thread calls them through its [`QueueCtx`].

use crate::alloc::{HeapAllocator, ObjAllocator};
use crate::backing::Backing;
use crate::block_state::{AlgoNames, SlotState};
use crate::clock::Clock;
use crate::codec::{AccelEvents, Algo};
use crate::config::{
    AllocatorKind, Mode, StoreConfig, AUTO_COMPACT_MIN_PAGES, AUTO_COMPACT_PERCENT,
};
use crate::ctx::CtxState;
use crate::error::{Error, Result};
use crate::free::FreeConfig;
use crate::page::{PAGE_SIZE, PAGE_SIZE_U64};
use crate::provision::Provisioner;
use crate::recompress::{Recompress, RecompressReport};
use crate::secondary::Secondaries;
use crate::shm::{Live, SharedMem, NOTE_BYTES};
use crate::slab::{SlabAllocator, SlabConfig};
use crate::slot::{Entry, ATIME_MASK};
// The object-corrupting hooks tell packed objects by their kind.
#[cfg(feature = "test-support")]
use crate::slot::Kind;
use crate::stats::{self, Counter, Counters, Latencies, Op, Phase, PhaseTimes, StatsShard};
use crate::table::SlotTable;
use crate::writeback::{Writeback, WritebackReport};
use serde::Serialize;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Longest a stat waits for the drain thread to free what is queued.
const STATS_SETTLE: Duration = Duration::from_millis(200);

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
    /// Objects whose size class had no room left in the memory reserve
    /// (`StoreConfig::reserve`) when a write asked.
    pub reserve_misses: u64,
    /// Of those, objects placed in a larger size class.
    pub reserve_fallbacks: u64,
    /// Of those, objects refused after waiting for the provisioner: their
    /// writes failed with ENOSPC (counted in `failed_writes` too).
    pub reserve_refusals: u64,
    /// Handles detached but not yet freed.
    pub deferred_free_pending: u64,
    /// Bytes of slot table (16 per page of device size).
    pub slot_table_bytes: u64,
    /// Whether the store lives in shared memory (recoverable).
    pub shared: bool,
    /// Times the store was taken over from a dead process; event counters
    /// (I/O counts, latencies) restart at each, gauges are recounted.
    pub recoveries: u64,
    /// When the last recovery was, seconds since the epoch (0: never).
    pub recovered_at: u64,
    /// Slots the last recovery emptied because their entries could not be
    /// trusted (0 unless memory was corrupted).
    pub recovery_dropped: u64,
    /// The secondary algorithms recompressed pages are held by, in the
    /// order slots name them, separated by spaces (empty, and left out of
    /// the JSON, until the first `recompress` chose one).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub recompress_algorithm: String,
    /// The backing device or file (empty, and left out of the JSON, when
    /// the store has none).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub backing_dev: String,
    /// Whether the backing store is opened `O_DIRECT` (false: buffered,
    /// the file system refused it).
    pub bd_direct: bool,
    /// Bytes of backing store.
    pub bd_size: u64,
    /// Bytes of backing blocks holding at least one written-back object.
    pub bd_used_bytes: u64,
    /// Whether a writeback limit is in force (zram's
    /// `writeback_limit_enable`).
    pub writeback_limit_enable: bool,
    /// Pages writeback may still write while the limit is in force (zram's
    /// `writeback_limit`); 0 when it is not.
    pub writeback_limit: u64,
    /// Per-page latency percentiles.
    pub latency: Latencies,
    /// With phase timers (`StoreConfig::phase_timers`): the time requests
    /// spent in each phase since this process made or recovered the store;
    /// left out of the JSON otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phases: Option<PhaseTimes>,
    /// The counters of each queue context, in queue order.
    pub queues: Vec<Counters>,
}

/// The compressed page store.
pub struct Store {
    cfg: StoreConfig,
    table: SlotTable,
    shards: Mutex<Vec<Arc<StatsShard>>>,
    pages_compacted: AtomicU64,
    /// The maintenance thread state (codec, shard, free batch) that
    /// compaction, idle marking and recompression run with, one at a time.
    compactor: Mutex<Option<CtxState>>,
    past: PastLives,
    /// What slots' access times count.
    clock: Clock,
    /// The secondary algorithms, as recompressions chose them.
    secondaries: Arc<Secondaries>,
    /// Pages writeback may still write; `u64::MAX`: no limit.
    wb_limit: AtomicU64,
    /// The memory reserve's thread, when the configuration asks for one.
    provisioner: Mutex<Option<Provisioner>>,
}

/// What a store carries over from the processes it was recovered from.
#[derive(Default)]
struct PastLives {
    /// Recoveries so far (the packed object id epoch).
    recoveries: u64,
    /// When the last one was, seconds since the epoch (0: never).
    recovered_at: u64,
    /// The gauges the recovery scan recounted.
    gauges: Option<Arc<StatsShard>>,
    /// Slots the scan emptied because their entries could not be trusted.
    dropped: u64,
    /// The clock's base (`crate::clock`): from the header, or now.
    clock_base: u64,
    /// The secondary algorithms the header names.
    secondaries: Vec<Algo>,
    /// The settings the store last ran with, if any changed at run time.
    live: Option<Live>,
}

impl PastLives {
    /// A new store's: no past, its clock starting now.
    fn new(clock_base: u64) -> PastLives {
        PastLives {
            clock_base,
            ..PastLives::default()
        }
    }
}

impl Store {
    /// Creates a store with the allocator its configuration names, in
    /// shared memory if `cfg.shared`.
    pub fn new(cfg: StoreConfig) -> Result<Arc<Store>> {
        cfg.validate()?;
        let slab_cfg = slab_config(&cfg);
        let mut clock_base = crate::clock::boot_seconds();
        let (alloc, shm): (Arc<dyn ObjAllocator>, _) = match cfg.allocator {
            AllocatorKind::Slab if cfg.shared => {
                let (shm, header) = crate::recover::create(&cfg)?;
                clock_base = header.clock_base;
                let shm = Arc::new(shm);
                let slab = SlabAllocator::shared(slab_cfg, shm.clone());
                (Arc::new(slab), Some(shm))
            }
            AllocatorKind::Slab => (Arc::new(SlabAllocator::new(slab_cfg)), None),
            AllocatorKind::Heap => (Arc::new(HeapAllocator::new()), None),
        };
        let table = Self::table(&cfg, shm.as_ref(), alloc)?;
        Ok(Self::assemble(cfg, table, PastLives::new(clock_base)))
    }

    /// Creates a store over the given allocator (in private memory).
    pub fn with_allocator(cfg: StoreConfig, alloc: Box<dyn ObjAllocator>) -> Result<Arc<Store>> {
        cfg.validate()?;
        if cfg.shared {
            return Err(Error::InvalidConfig(
                "a store in shared memory brings its own allocator: use Store::new".into(),
            ));
        }
        let table = Self::table(&cfg, None, Arc::from(alloc))?;
        let past = PastLives::new(crate::clock::boot_seconds());
        Ok(Self::assemble(cfg, table, past))
    }

    /// Takes over the store a dead process left in the shared memory `fd`
    /// (see [`Store::memory_fd`]), with every page it held: the slot table
    /// is scanned, the allocator's bookkeeping and the gauges rebuilt, and
    /// every object no slot references freed. `cfg` must describe the same
    /// store (size, algorithm, group shape), with `shared` set; settings
    /// that only steer the process (memory limit, mlock, deferred free)
    /// may differ, but a memory or writeback limit set at run time
    /// ([`Store::set_mem_limit`], [`Store::set_writeback_limit`]) is kept
    /// over `cfg`'s, as it was when the process died, and the pages decode
    /// with the dictionaries the store recorded when it was made, whatever
    /// `cfg.dictionaries` says. Nothing else may use the memory meanwhile.
    pub fn recover(mut cfg: StoreConfig, fd: OwnedFd) -> Result<Arc<Store>> {
        cfg.validate()?;
        // (validate refuses shared memory without the slab.)
        if !cfg.shared {
            return Err(Error::InvalidConfig(
                "only a store in shared memory (StoreConfig::shared) can be recovered".into(),
            ));
        }
        let (shm, header, layout) = crate::recover::open(&cfg, fd)?;
        let secondaries = crate::recover::secondaries(&header)?;
        let recorded = crate::recover::dictionaries(&shm)?;
        if !cfg.dictionaries.is_empty() && recorded != cfg.dictionaries {
            log::warn!(
                "recovery: decoding with the dictionaries the store was made with, not those configured now"
            );
        }
        cfg.dictionaries = recorded;
        let shm = Arc::new(shm);
        let slab = Arc::new(SlabAllocator::shared(slab_config(&cfg), shm.clone()));
        let table = Self::table(&cfg, Some(&shm), slab.clone())?;
        let gauges = Arc::new(StatsShard::default());
        let unsealed = layout < crate::shm::SEALED_PACKS;
        let scan = crate::recover::scan(&table, &slab, &gauges, secondaries.len(), unsealed);
        if scan.backed > 0 {
            log::info!("recovery: {} pages are on the backing store", scan.backed);
        }
        let header = crate::recover::record(&shm, header)?;
        log::info!(
            "recovered a store of {} pages ({} stored, {} emptied as untrustworthy), recovery {}",
            table.pages(),
            scan.stored,
            scan.dropped,
            header.recoveries
        );
        let past = PastLives {
            recoveries: header.recoveries,
            recovered_at: header.recovered_at,
            gauges: Some(gauges),
            dropped: scan.dropped,
            clock_base: header.clock_base,
            secondaries,
            live: header.live,
        };
        if let Some(l) = &past.live {
            log::info!(
                "recovery: keeping the limits set at run time (mem_limit {} bytes, writeback limit {})",
                l.mem_limit,
                if l.writeback_limit == u64::MAX { "off".to_string() } else { format!("{} pages", l.writeback_limit) }
            );
        }
        Ok(Self::assemble(cfg, table, past))
    }

    /// The slot table of a store of `cfg` over `alloc`.
    fn table(
        cfg: &StoreConfig,
        shm: Option<&Arc<SharedMem>>,
        alloc: Arc<dyn ObjAllocator>,
    ) -> Result<SlotTable> {
        let pages = (cfg.size / PAGE_SIZE_U64) as usize;
        let free = FreeConfig {
            deferred: cfg.deferred_free,
            max_pending_batches: cfg.deferred_free_max_batches,
        };
        let backing = match &cfg.backing {
            Some(path) => Some(Arc::new(Backing::open(path, cfg.mlock)?)),
            None => None,
        };
        let table = SlotTable::new(pages, shm, alloc, free, cfg.object_span(), backing)?;
        // A table of more than 1/32 of RAM (a very large, sparse device)
        // faults in as it is used, as without a reserve: faulting it all in
        // could take the machine's memory.
        let small = table.bytes() <= crate::slab::total_ram() / 32;
        if cfg.reserve && !(small && table.prefault()) {
            log::warn!(
                "memory reserve: the slot table ({} MB) is not faulted in up front",
                table.bytes() >> 20
            );
        }
        Ok(table)
    }

    /// Puts a store together; a recovered one keeps the limits its last
    /// process set at run time over those of `cfg`.
    fn assemble(cfg: StoreConfig, table: SlotTable, past: PastLives) -> Arc<Store> {
        let (mem_limit, wb_limit) = past.live.as_ref().map_or((cfg.mem_limit, u64::MAX), |l| {
            (l.mem_limit, l.writeback_limit)
        });
        table.allocator().set_mem_limit(mem_limit);
        let secondaries = Arc::new(Secondaries::from_list(&past.secondaries));
        let store = Arc::new(Store {
            table,
            shards: Mutex::new(Vec::new()),
            pages_compacted: AtomicU64::new(0),
            compactor: Mutex::new(None),
            clock: Clock::from_base(past.clock_base),
            secondaries,
            wb_limit: AtomicU64::new(wb_limit),
            provisioner: Mutex::new(None),
            cfg,
            past,
        });
        if store.cfg.reserve {
            let p = Provisioner::start(store.table.allocator_arc());
            *store.provisioner.lock().unwrap_or_else(|e| e.into_inner()) = p;
        }
        // The drain thread compacts when fragmentation passes the threshold.
        let weak = Arc::downgrade(&store);
        store.table.frees().set_idle_hook(Box::new(move || {
            if let Some(s) = weak.upgrade() {
                s.maybe_compact();
            }
        }));
        store
    }

    /// The memfd that holds the store (slot table and objects), for
    /// whoever keeps it while no process serves the store; `None` unless
    /// the store is in shared memory.
    pub fn memory_fd(&self) -> Option<BorrowedFd<'_>> {
        self.table.shared().map(|shm| shm.fd())
    }

    /// Creates a per-thread context (one per queue).
    pub fn new_ctx(self: &Arc<Self>) -> QueueCtx {
        let st = self.new_state();
        let id = st.id;
        QueueCtx {
            store: self.clone(),
            st: st.st,
            id,
        }
    }

    /// Thread state with a shard of its own.
    fn new_state(&self) -> StateWithId {
        let (id, shard) = self.new_shard();
        let secondaries = self.secondaries.clone();
        StateWithId {
            id,
            st: CtxState::new(&self.cfg, id, self.past.recoveries, shard, secondaries),
        }
    }

    /// Runs `f` with the maintenance thread state (made on first use), then
    /// hands what it freed to the drain. One maintenance job at a time.
    fn with_maintenance<R>(&self, f: impl FnOnce(&mut CtxState) -> R) -> R {
        let mut guard = self.compactor.lock().unwrap_or_else(|e| e.into_inner());
        // Untimed: the phase timers measure requests, and maintenance
        // (compaction, recompression) would add its codec and allocation
        // time to theirs with no request total or pages to divide by.
        let st = guard.get_or_insert_with(|| self.new_state().st.untimed());
        let r = f(st);
        st.free.flush(self.table.frees());
        r
    }

    /// The store clock's time now, as slots keep it.
    fn now(&self) -> u32 {
        (self.clock.now() & u64::from(ATIME_MASK)) as u32
    }

    /// Marks idle every stored page not accessed for at least `age_secs`
    /// seconds, or every stored page if `None` (zram's `idle` file: `all`
    /// or an age); a later read or write of a page clears its mark.
    /// Returns the pages newly marked; `stats().counters.idle_pages`
    /// counts all marked ones.
    pub fn mark_idle(&self, age_secs: Option<u64>) -> Result<u64> {
        let age = age_secs.map(Self::idle_age).transpose()?;
        let now = self.now();
        Ok(self.with_maintenance(|st| crate::recompress::mark_idle(&self.table, st, now, age)))
    }

    /// Marks idle exactly the stored pages not accessed for `age_secs`
    /// seconds and clears the mark of every younger page (what an
    /// automatic policy with its own thresholds needs; `mark_idle` only
    /// ever adds marks, as zram's `idle` file). Returns (marked, cleared).
    pub fn remark_idle(&self, age_secs: u64) -> Result<(u64, u64)> {
        let age = Self::idle_age(age_secs)?;
        let now = self.now();
        Ok(self.with_maintenance(|st| crate::recompress::remark_idle(&self.table, st, now, age)))
    }

    /// Checks an idle age against what slots' access times can hold.
    fn idle_age(a: u64) -> Result<u32> {
        u32::try_from(a)
            .ok()
            .filter(|&a| a <= ATIME_MASK)
            .ok_or_else(|| {
                Error::InvalidConfig(format!(
                    "an idle age of {a} s is past what slots keep ({ATIME_MASK} s, 194 days)"
                ))
            })
    }

    /// Recompresses the pages `p` selects with the secondary algorithms
    /// `p.algos` (zram's `recompress` with its priorities): each page (a
    /// packed store: each group) with the first of them whose result is at
    /// least `MIN_SAVING_PERCENT` smaller. The algorithms become the
    /// store's secondaries for good (recorded in shared memory, for a
    /// recovery to read the pages back): up to [`crate::MAX_SECONDARIES`]
    /// in all, an algorithm asked for again keeping its place; one past
    /// that is refused. A packed store recompresses into packed groups.
    pub fn recompress(&self, p: &Recompress) -> Result<RecompressReport> {
        self.check_secondaries(&p.algos)?;
        self.with_maintenance(|st| {
            let ids = self.assign_secondaries(&p.algos)?;
            let mut codecs: Vec<(u8, Box<dyn crate::codec::Codec>)> = ids
                .iter()
                .zip(&p.algos)
                .map(|(&id, &a)| {
                    let codec = self.cfg.dictionaries.codec_for(a, self.cfg.codec_pages());
                    (id, codec)
                })
                .collect();
            let (mode, span) = (self.cfg.mode, self.cfg.object_span());
            Ok(crate::recompress::run(
                &self.table,
                st,
                &mut codecs,
                p,
                mode,
                span,
            ))
        })
    }

    /// Makes `algos` the store's secondary algorithms (those it lacks are
    /// added after those it has) without recompressing anything, so that
    /// a list set before the first recompression gives slots its order.
    pub fn set_secondaries(&self, algos: &[Algo]) -> Result<()> {
        self.check_secondaries(algos)?;
        self.with_maintenance(|_| self.assign_secondaries(algos).map(drop))
    }

    /// Refuses an empty list and the primary algorithm in it.
    fn check_secondaries(&self, algos: &[Algo]) -> Result<()> {
        if algos.is_empty() {
            return Err(Error::InvalidConfig(
                "recompression needs at least one secondary algorithm".into(),
            ));
        }
        if algos.contains(&self.cfg.algo) {
            return Err(Error::InvalidConfig(format!(
                "a secondary algorithm must differ from the primary ({})",
                self.cfg.algo
            )));
        }
        Ok(())
    }

    /// Writes back the pages `p` selects to the backing store (zram's
    /// `writeback`): their compressed objects are packed into 4 KB blocks
    /// of the backing store and their RAM is freed. At most `p.limit`
    /// pages (0: any number), and no more than the device's writeback
    /// limit allows, which it consumes. Per-page stores with a backing
    /// device only.
    pub fn writeback(&self, p: &Writeback) -> Result<WritebackReport> {
        let Some(backing) = self.table.backing() else {
            return Err(Error::InvalidConfig(
                "this device has no backing device: create it with --backing-dev PATH".into(),
            ));
        };
        if self.cfg.mode == Mode::Packed {
            return Err(Error::InvalidConfig(
                "writeback of packed stores is not supported yet: use a per-page device".into(),
            ));
        }
        self.with_maintenance(|st| {
            let allowed = self.wb_limit.load(Relaxed);
            let asked = if p.limit == 0 { u64::MAX } else { p.limit };
            let budget = asked.min(allowed);
            let mut r = crate::writeback::run(&self.table, backing, st, p, budget)?;
            if allowed != u64::MAX {
                // Only this thread (under the maintenance lock) lowers it; a
                // `set` in between wins.
                let left = allowed.saturating_sub(r.written);
                let _ = self
                    .wb_limit
                    .compare_exchange(allowed, left, Relaxed, Relaxed);
                r.limited = r.selected >= allowed && allowed < asked;
                self.record_live(None);
            }
            Ok(r)
        })
    }

    /// The state of every stored page in `range` (zram's `block_state`),
    /// in page order, empty slots left out; the part of `range` past the
    /// device's end is ignored. Each slot is locked only to read it,
    /// nothing else is held: call it range by range to walk a device
    /// while it serves.
    pub fn slot_states(&self, range: std::ops::Range<u64>) -> Vec<SlotState> {
        let names = AlgoNames {
            primary: self.cfg.algo.to_string(),
            secondaries: self.secondary_algos().iter().map(Algo::to_string).collect(),
        };
        crate::block_state::collect(&self.table, range, &names)
    }

    /// Up to `bytes` of the device's stored pages (whole pages: empty and
    /// same-filled ones left out), sampled evenly across it and decoded:
    /// the content a dictionary for this device is made of (`zblk dict
    /// train`). Reading them is not an access.
    pub fn sample(&self, bytes: usize) -> Vec<u8> {
        let want = bytes / PAGE_SIZE;
        self.with_maintenance(|st| crate::sample::sample(&self.table, st, want))
    }

    /// Sets the writeback limit (zram's `writeback_limit` with
    /// `writeback_limit_enable`): writeback may write `pages` more pages
    /// from now on; 0 turns the limit off.
    pub fn set_writeback_limit(&self, pages: u64) {
        let v = if pages == 0 { u64::MAX } else { pages };
        self.wb_limit.store(v, Relaxed);
        self.record_live(None);
    }

    /// The slot values of `algos`, adding those the store lacks to its
    /// secondaries; a store in shared memory records the grown list in its
    /// header first, before any slot can name a new entry. The caller
    /// holds the maintenance lock.
    fn assign_secondaries(&self, algos: &[Algo]) -> Result<Vec<u8>> {
        self.secondaries
            .assign(algos, |list| match self.table.shared() {
                Some(shm) => crate::recover::record_secondaries(shm, list),
                None => Ok(()),
            })
    }

    /// The secondary algorithms recompressed pages are held by, in the
    /// order slots name them (a recovered store knows them from its
    /// header); empty until a recompression chose one.
    pub fn secondary_algos(&self) -> Vec<Algo> {
        self.secondaries.list()
    }

    /// Moves the store's clock `secs` seconds forward, so that tests of
    /// idle marking need not sleep.
    #[cfg(feature = "test-support")]
    #[doc(hidden)]
    pub fn debug_advance_clock(&self, secs: u64) {
        self.clock.advance(secs);
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
        self.table.allocator()
    }

    /// Sets the memory limit in bytes (0: none), at run time. A store in
    /// shared memory keeps it for the process that recovers it.
    pub fn set_mem_limit(&self, bytes: u64) {
        self.allocator().set_mem_limit(bytes);
        self.record_live(None);
    }

    /// Keeps `note` (at most 2048 bytes, opaque to the engine) with a store
    /// in shared memory, for the process that recovers it to read with
    /// [`Store::owner_note`]: the daemon keeps its idle policy there. A
    /// store in private memory has nowhere to keep it and ignores it.
    pub fn set_owner_note(&self, note: &str) -> Result<()> {
        if note.len() > NOTE_BYTES {
            return Err(Error::InvalidConfig(format!(
                "a note of {} bytes is more than the {NOTE_BYTES} a store keeps",
                note.len()
            )));
        }
        self.record_live_result(Some(note))
    }

    /// The note the store's last process kept with it (see
    /// [`Store::set_owner_note`]), if any.
    pub fn owner_note(&self) -> Option<String> {
        let shm = self.table.shared()?;
        let note = shm.read_header().ok()?.live?.note;
        (!note.is_empty()).then_some(note)
    }

    /// Records the limits now in force, and `note` if given (else the note
    /// recorded before), in the header of a store in shared memory; a
    /// failure is logged (the limits still hold in this process).
    fn record_live(&self, note: Option<&str>) {
        if let Err(e) = self.record_live_result(note) {
            log::warn!("the store's header could not keep its limits: {e}");
        }
    }

    fn record_live_result(&self, note: Option<&str>) -> Result<()> {
        let Some(shm) = self.table.shared() else {
            return Ok(());
        };
        shm.update_header(|h| {
            // Read under the header lock: two threads recording one after
            // the other write what was in force last, never an older pair.
            let mem_limit = self.allocator().mem_limit();
            let writeback_limit = self.wb_limit.load(Relaxed);
            let note = match (note, h.live.take()) {
                (Some(n), _) => n.to_string(),
                (None, Some(old)) => old.note,
                (None, None) => String::new(),
            };
            h.live = Some(Live {
                mem_limit,
                writeback_limit,
                note,
            });
        })
        .map(drop)
    }

    /// Runs compaction now: rewrites sparse packed groups, lets the drain
    /// free what is queued, then lets the allocator move objects. Returns
    /// the 4 KB pages given back.
    pub fn compact(&self) -> u64 {
        if self.cfg.mode == Mode::Packed {
            self.with_maintenance(|st| {
                crate::compact::rewrite_sparse_groups(&self.table, &self.cfg, st);
            });
        }
        self.settle_frees(Duration::from_secs(5));
        self.compact_now()
    }

    fn compact_now(&self) -> u64 {
        let n = self.allocator().compact(&self.table);
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
        let alloc = self.allocator();
        let trimmed = alloc.trim();
        let pages = alloc.compactable_pages();
        let used = alloc.mem_used_total();
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
        self.table.frees().settle(timeout)
    }

    /// Tests: stalls the free drain (`on`) or lets it go; see
    /// `tests/store_drain_stall.rs`.
    #[cfg(feature = "test-support")]
    #[doc(hidden)]
    pub fn debug_stall_drain(&self, on: bool) {
        self.table.frees().stall(on);
    }

    /// Merges every queue's statistics into one snapshot.
    pub fn stats(&self) -> StoreStats {
        // A stat asks for the truth: let the drain free what is queued
        // (bounded, so a stat never hangs behind a very long queue).
        self.settle_frees(STATS_SETTLE);
        let shards = self
            .shards
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let recounted = self.past.gauges.iter().map(|s| &**s);
        let (counters, latency) = stats::merge(recounted.chain(shards.iter().map(|s| &**s)));
        let queues = shards.iter().map(|s| stats::sum_counters([&**s])).collect();
        // Handles detached (counted per queue) minus those freed so far:
        // partial batches in contexts plus what the drain has not reached.
        let freed = self.table.frees().freed();
        let deferred_free_pending = counters.deferred_frees.saturating_sub(freed);
        let alloc = self.allocator();
        let backing = self.table.backing();
        let wb_limit = self.wb_limit.load(Relaxed);
        let reserve = alloc.reserve_stats();
        StoreStats {
            disksize: self.cfg.size,
            algorithm: self.cfg.algo.to_string(),
            group_pages: self.cfg.group_pages,
            mode: self.cfg.mode,
            counters,
            mem_used_total: alloc.mem_used_total(),
            mem_used_max: alloc.mem_used_max(),
            mem_limit: alloc.mem_limit(),
            pages_compacted: self.pages_compacted.load(Relaxed),
            mem_spare: alloc.spare_pages() * PAGE_SIZE_U64,
            reserve_misses: reserve.misses,
            reserve_fallbacks: reserve.fallbacks,
            reserve_refusals: reserve.refusals,
            deferred_free_pending,
            slot_table_bytes: self.table.bytes(),
            shared: self.table.shared().is_some(),
            recoveries: self.past.recoveries,
            recovered_at: self.past.recovered_at,
            recovery_dropped: self.past.dropped,
            recompress_algorithm: crate::secondary::list_to_string(&self.secondaries.list()),
            backing_dev: backing
                .map(|b| b.path().display().to_string())
                .unwrap_or_default(),
            bd_direct: backing.is_some_and(|b| b.is_direct()),
            bd_size: backing.map_or(0, |b| b.size()),
            bd_used_bytes: backing.map_or(0, |b| b.used_bytes()),
            writeback_limit_enable: wb_limit != u64::MAX,
            writeback_limit: if wb_limit == u64::MAX { 0 } else { wb_limit },
            latency,
            phases: self
                .cfg
                .phase_timers
                .then(|| stats::merge_phases(shards.iter().map(|s| &**s))),
            queues,
        }
    }

    /// Checks a byte range and returns its first page and page count.
    fn check_range(&self, st: &CtxState, offset: u64, len: u64) -> Result<(u64, usize)> {
        let r = if offset % PAGE_SIZE_U64 != 0 || len % PAGE_SIZE_U64 != 0 {
            Err(Error::Misaligned { offset, len })
        } else {
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
        };
        if r.is_err() {
            st.shard.add(Counter::InvalidIo, 1);
        }
        r
    }

    /// Writes whole pages at `offset`, one compression group at a time.
    fn write(&self, st: &mut CtxState, offset: u64, data: &[u8]) -> Result<()> {
        let t0 = Instant::now();
        let (first, pages) = self.check_range(st, offset, data.len() as u64)?;
        st.now = self.now();
        let g = self.cfg.group_pages;
        for (i, chunk) in data.chunks(g * PAGE_SIZE).enumerate() {
            let at = first + (i * g) as u64;
            if let Err(e) = crate::write::write_group(&self.table, &self.cfg, st, at, chunk) {
                st.shard.add(Counter::FailedWrites, 1);
                charge_total(st, Phase::Write, t0.elapsed());
                return Err(e);
            }
        }
        st.free.end_request(self.table.frees());
        st.shard.add(Counter::NumWrites, 1);
        st.shard.add(Counter::PagesWritten, pages as i64);
        record_latency(st, Op::Write, t0, pages);
        Ok(())
    }

    /// Reads whole pages at `offset` into `buf`.
    fn read(&self, st: &mut CtxState, offset: u64, buf: &mut [u8]) -> Result<()> {
        let t0 = Instant::now();
        let (first, pages) = self.check_range(st, offset, buf.len() as u64)?;
        st.now = self.now();
        for (i, out) in buf.chunks_exact_mut(PAGE_SIZE).enumerate() {
            if let Err(e) = crate::read::read_page(&self.table, st, first + i as u64, out) {
                // Reported by the caller (the daemon logs it rate-limited):
                // a corrupt page read over and over must not flood the log.
                st.shard.add(Counter::FailedReads, 1);
                charge_total(st, Phase::Read, t0.elapsed());
                return Err(e);
            }
        }
        st.shard.add(Counter::NumReads, 1);
        st.shard.add(Counter::PagesRead, pages as i64);
        record_latency(st, Op::Read, t0, pages);
        Ok(())
    }

    /// Discards whole pages: they read as zeros and their objects are freed.
    fn discard(&self, st: &mut CtxState, offset: u64, len: u64) -> Result<()> {
        let t0 = Instant::now();
        let (first, pages) = self.check_range(st, offset, len)?;
        for page in first..first + pages as u64 {
            self.table.install(st, page, Entry::EMPTY, 0);
        }
        st.free.end_request(self.table.frees());
        st.shard.add(Counter::NotifyFree, pages as i64);
        st.shard.add(Counter::NumDiscards, 1);
        record_latency(st, Op::Discard, t0, pages);
        Ok(())
    }

    /// Zeroes whole pages. An empty slot reads as zeros and costs nothing,
    /// so this is a discard, as in zram.
    fn write_zeroes(&self, st: &mut CtxState, offset: u64, len: u64) -> Result<()> {
        self.discard(st, offset, len)
    }
}

/// With phase timers, charges a request's whole time (`took`) to its
/// operation's phase; a failed request too, whose parts were charged as
/// they ran.
fn charge_total(st: &CtxState, phase: Phase, took: Duration) {
    if st.timing() {
        st.shard.charge(phase, took.as_nanos() as u64);
    }
}

/// Records a request's per-page latency, and with phase timers its whole
/// time in the phase of its operation.
fn record_latency(st: &CtxState, op: Op, t0: Instant, pages: usize) {
    if pages > 0 {
        let took = t0.elapsed();
        st.shard
            .record(op, took.as_nanos() as u64 / pages as u64, pages as u64);
        let phase = match op {
            Op::Write => Phase::Write,
            Op::Read => Phase::Read,
            Op::Discard => Phase::Discard,
            Op::Writeback => return,
        };
        charge_total(st, phase, took);
    }
}

/// Fresh thread state and its shard's index.
struct StateWithId {
    id: usize,
    st: CtxState,
}

/// The per-thread context every store operation runs with: one per queue
/// thread, holding its codec, scratch, statistics shard and free batch.
pub struct QueueCtx {
    store: Arc<Store>,
    st: CtxState,
    id: usize,
}

impl QueueCtx {
    /// This context's index (its queue number).
    pub fn id(&self) -> usize {
        self.id
    }

    /// The store this context serves.
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// Writes `data` (a multiple of 4 KB) at byte `offset`.
    pub fn write(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        let r = self.store.write(&mut self.st, offset, data);
        self.count_accel_events();
        r
    }

    /// Reads `buf.len()` bytes (a multiple of 4 KB) at byte `offset`.
    pub fn read(&mut self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let r = self.store.read(&mut self.st, offset, buf);
        self.count_accel_events();
        r
    }

    /// Adds what the codec's accelerator went through to this queue's
    /// statistics (software codecs report nothing).
    fn count_accel_events(&mut self) {
        let ev = self.st.codec.take_accel_events();
        if ev == AccelEvents::default() {
            return;
        }
        let sh = &self.st.shard;
        sh.add(Counter::AccelPageFaults, ev.page_faults as i64);
        sh.add(Counter::AccelTimeouts, ev.timeouts as i64);
        sh.add(Counter::AccelVerifyFailures, ev.verify_failures as i64);
        sh.add(Counter::AccelDeviceErrors, ev.device_errors as i64);
        sh.add(Counter::AccelSubmitFailures, ev.submit_failures as i64);
        sh.add(Counter::AccelDecompressed, ev.decompressed as i64);
    }

    /// Discards `len` bytes at `offset`: the pages read as zeros afterwards
    /// and their memory is freed.
    pub fn discard(&mut self, offset: u64, len: u64) -> Result<()> {
        self.store.discard(&mut self.st, offset, len)
    }

    /// Zeroes `len` bytes at `offset` (same effect as discard in zblk).
    pub fn write_zeroes(&mut self, offset: u64, len: u64) -> Result<()> {
        self.store.write_zeroes(&mut self.st, offset, len)
    }

    /// Faults in, on the calling thread, the memory this context's requests
    /// use (its buffers and its codec's workspace), so that the first
    /// request, which a swap device gets when memory has run out, takes no
    /// fresh page. A queue thread calls it before serving.
    pub fn prefault(&mut self) {
        self.st.prefault();
    }

    /// Frees the handles this context has batched (idle timer, stat, exit).
    pub fn flush_frees(&mut self) {
        self.st.free.flush(self.store.table.frees());
    }

    /// Handles batched in this context and not yet freed.
    pub fn pending_frees(&self) -> usize {
        self.st.free.pending()
    }
}

impl Drop for QueueCtx {
    fn drop(&mut self) {
        self.flush_frees();
    }
}

/// Overwrites the bytes of the object behind `page`, from offset `at` to
/// its end, with `byte`, as a bit flip in RAM would: for tests of how
/// corrupt objects are handled. Returns false when the page has no object
/// or `at` is past its end.
///
/// # Safety
/// No other thread uses the store meanwhile: the object is published, and
/// readers of other slots of its packed group would see the bytes change.
#[cfg(feature = "test-support")]
#[doc(hidden)]
pub unsafe fn debug_corrupt_object(store: &Store, page: u64, at: usize, byte: u8) -> bool {
    // SAFETY: `p` points at `n` bytes of the object (the helper's
    // contract); the caller's contract covers everyone else.
    unsafe { with_object_bytes(store, page, at, |p, n| std::ptr::write_bytes(p, byte, n)) }
}

/// XORs the byte at offset `at` of the object behind `page` (a packed
/// object's header included) with `mask`: one precise flip, for tests.
/// Returns false when the page has no object or `at` is past its end.
///
/// # Safety
/// As [`debug_corrupt_object`].
#[cfg(feature = "test-support")]
#[doc(hidden)]
pub unsafe fn debug_flip_object_byte(store: &Store, page: u64, at: usize, mask: u8) -> bool {
    // SAFETY: `p` points at a byte of the object (the helper's contract).
    unsafe { with_object_bytes(store, page, at, |p, _| *p ^= mask) }
}

/// Runs `f` with a pointer to byte `at` of the object behind `page` and
/// the bytes from there to its end (a packed object's header counted),
/// under the page's slot lock; false when there is no such byte.
///
/// # Safety
/// As [`debug_corrupt_object`]; `f` touches no byte outside the ones it
/// is given.
#[cfg(feature = "test-support")]
unsafe fn with_object_bytes(
    store: &Store,
    page: u64,
    at: usize,
    f: impl FnOnce(*mut u8, usize),
) -> bool {
    if page >= store.table.pages() {
        return false;
    }
    let guard = store.table.lock(page);
    let e = guard.entry();
    let len = e.len as usize
        + if e.kind == Kind::Packed {
            crate::packed::PACK_HEADER
        } else {
            0
        };
    let Some(h) = e.handle().filter(|_| at < len) else {
        return false;
    };
    // SAFETY: the slot lock keeps the object alive and in place, `at..len`
    // lies inside it, and the caller guarantees nobody else reads or writes
    // it meanwhile. A raw write forms no reference to published bytes.
    unsafe { f(store.allocator().object_ptr(h, len).add(at), len - at) };
    true
}

/// Makes `store`'s shared memory look as a zblk of layout 3 (before
/// packed headers had a seal) left it: every packed header unsealed and the
/// file's header naming layout 3, so a test can check that a recovery
/// still takes such a store over. Returns the packed pages found, or
/// `None` for a store without shared memory.
///
/// # Safety
/// No other thread uses the store meanwhile.
#[cfg(feature = "test-support")]
#[doc(hidden)]
pub unsafe fn debug_as_layout3(store: &Store) -> Option<u64> {
    let shm = store.table.shared()?;
    let mut packed = 0;
    for page in 0..store.table.pages() {
        let guard = store.table.lock(page);
        let e = guard.entry();
        if e.kind == Kind::Packed {
            // SAFETY: the slot lock is held and nobody else uses the store
            // (the caller's contract).
            unsafe { crate::packed::debug_unseal(store.table.allocator(), &e) };
            packed += 1;
        }
    }
    let fingerprint = SlabAllocator::fingerprint_for(3);
    shm.debug_write_layout(3, fingerprint).ok()?;
    Some(packed)
}

/// Rewrites `store`'s header as layout 4 wrote it (a test's stand-in for a
/// store made by the build before several secondary algorithms): the
/// layout and its fingerprint; the header's bytes for a second and third
/// secondary are zeros as layout 4 left them, so the store must have at
/// most one. `None` for a private store.
///
/// # Safety
///
/// Nothing else may use the store meanwhile or afterwards (crash it).
#[cfg(feature = "test-support")]
pub unsafe fn debug_as_layout4(store: &Store) -> Option<()> {
    let shm = store.table.shared()?;
    if store.secondaries.list().len() > 1 {
        return None;
    }
    shm.debug_write_layout(4, SlabAllocator::fingerprint_for(4))
        .ok()
}

/// Makes `store`'s shared memory look as a zblk of layout 5 left it: the
/// header naming layout 5 with its fingerprint, and the file ending after
/// the classes' regions, with no room for dictionaries. `None` for a
/// private store or one with dictionaries (layout 5 had none).
///
/// # Safety
///
/// Nothing else may use the store meanwhile or afterwards (crash it).
#[cfg(feature = "test-support")]
pub unsafe fn debug_as_layout5(store: &Store) -> Option<()> {
    let shm = store.table.shared()?;
    if !store.cfg.dictionaries.is_empty() {
        return None;
    }
    shm.debug_write_layout(5, SlabAllocator::fingerprint_for(5))
        .ok()?;
    shm.debug_drop_dictionary_room().ok()
}

/// The slab's part of a store's configuration.
fn slab_config(cfg: &StoreConfig) -> SlabConfig {
    SlabConfig {
        mlock: cfg.mlock,
        reserve: cfg.reserve,
        reserve_free_below: cfg.reserve_free_below,
    }
}

/// Simulates the death of the process serving `store`: the drain thread
/// stops where it is and everything is leaked, nothing freed or flushed,
/// so that a test can recover the store from [`Store::memory_fd`] (dup it
/// first) as a new process would. Queue contexts must be leaked too
/// (`std::mem::forget`), as a crash would leave them.
#[cfg(feature = "test-support")]
#[doc(hidden)]
pub fn debug_crash(store: Arc<Store>) {
    store.table.frees().abandon();
    // A dead process's provisioner makes no more spares.
    if let Some(mut p) = store
        .provisioner
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take()
    {
        p.stop();
        std::mem::forget(p);
    }
    std::mem::forget(store);
}
