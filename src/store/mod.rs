//! `Store`: the device's pages, built, recovered and put together here;
//! what is done with them lives in the submodules:
//!
//! - [`ops`]: the request path, [`QueueCtx`] and its four operations over
//!   page-aligned byte ranges (zram's `zram_submit_bio` and
//!   `zram_bvec_write`/`zram_bvec_read` in one file);
//! - [`maintenance`]: the passes the control loop runs with the store's
//!   maintenance thread state (idle marking, recompression, writeback,
//!   compaction, what each slot holds, sampling) and the limits set at
//!   run time;
//! - [`stats`]: [`StoreStats`], every queue's statistics merged.
//!
//! Every function goes down, never back up: a request goes
//! [`QueueCtx::write`] -> `write::write_group` (per group) ->
//! `packed::pack_group` or `write::plan_per_page` -> `alloc_bulk` ->
//! `SlotTable::install_group`; [`QueueCtx::read_begin`] ->
//! `read::read_page_or_backed` (per page, under its lock) -> the codec; [`QueueCtx::discard`] ->
//! `SlotTable::install` of an empty entry -> `SlotTable::release` -> the
//! queue's free batch.

mod maintenance;
mod ops;
mod stats;

pub use ops::{BackingWait, QueueCtx, ReadStep};
pub use stats::StoreStats;

use crate::alloc::ObjAllocator;
use crate::backing::Backing;
use crate::clock::Clock;
use crate::codec::Algo;
use crate::config::{AllocatorKind, StoreConfig};
use crate::ctx::CtxState;
use crate::error::{Error, Result};
use crate::free::FreeConfig;
use crate::page::PAGE_SIZE_U64;
use crate::provision::Provisioner;
use crate::secondary::Secondaries;
use crate::shm::{RuntimeSettings, SharedMem};
use crate::slab::{SlabAllocator, SlabConfig};
use crate::slot::ATIME_MASK;
use crate::stats::StatsShard;
use crate::table::SlotTable;
use crate::workers::Workers;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

/// The compressed page store.
pub struct Store {
    pub(crate) cfg: StoreConfig,
    pub(crate) table: SlotTable,
    shards: Mutex<Vec<Arc<StatsShard>>>,
    pages_compacted: AtomicU64,
    /// The maintenance thread state (codec, shard, free batch) that
    /// compaction, idle marking and recompression run with, one at a time.
    compactor: Mutex<Option<CtxState>>,
    inherited: Inherited,
    /// What slots' access times count.
    pub(crate) clock: Clock,
    /// The secondary algorithms, as recompressions chose them.
    pub(crate) secondaries: Arc<Secondaries>,
    /// Pages writeback may still write; `u64::MAX`: no limit.
    wb_limit: AtomicU64,
    /// The memory reserve's thread, when the configuration asks for one.
    pub(crate) provisioner: Mutex<Option<Provisioner>>,
    /// The compression workers (`StoreConfig::compress_workers`), if any.
    pub(crate) workers: Option<Workers>,
}

/// The thread id the first compression worker's state is made with (the
/// next ones count down): far from the queues' ids, which count up from
/// 0, so that packed object ids (12 bits of thread id) never collide.
const FIRST_WORKER_ID: usize = 0xffe;

/// What a store carries over from the processes it was recovered from.
#[derive(Default)]
struct Inherited {
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
    runtime: Option<RuntimeSettings>,
}

impl Inherited {
    /// A new store's: nothing inherited, its clock starting now.
    fn new(clock_base: u64) -> Inherited {
        Inherited {
            clock_base,
            ..Inherited::default()
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
            #[cfg(feature = "test-support")]
            AllocatorKind::Heap => (Arc::new(crate::alloc::HeapAllocator::new()), None),
        };
        let table = Self::table(&cfg, shm.as_ref(), alloc)?;
        Ok(Self::assemble(cfg, table, Inherited::new(clock_base)))
    }

    /// Creates a store over the given allocator (in private memory).
    /// Tests only (cargo feature `test-support`).
    #[cfg(feature = "test-support")]
    pub fn with_allocator(cfg: StoreConfig, alloc: Box<dyn ObjAllocator>) -> Result<Arc<Store>> {
        cfg.validate()?;
        if cfg.shared {
            return Err(Error::InvalidConfig(
                "a store in shared memory brings its own allocator: use Store::new".into(),
            ));
        }
        let table = Self::table(&cfg, None, Arc::from(alloc))?;
        let inherited = Inherited::new(crate::clock::boot_seconds());
        Ok(Self::assemble(cfg, table, inherited))
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
        let inherited = Inherited {
            recoveries: header.recoveries,
            recovered_at: header.recovered_at,
            gauges: Some(gauges),
            dropped: scan.dropped,
            clock_base: header.clock_base,
            secondaries,
            runtime: header.runtime,
        };
        if let Some(l) = &inherited.runtime {
            log::info!(
                "recovery: keeping the limits set at run time (mem_limit {} bytes, writeback limit {})",
                l.mem_limit,
                if l.writeback_limit == u64::MAX { "off".to_string() } else { format!("{} pages", l.writeback_limit) }
            );
        }
        Ok(Self::assemble(cfg, table, inherited))
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
    fn assemble(cfg: StoreConfig, table: SlotTable, inherited: Inherited) -> Arc<Store> {
        let (mem_limit, wb_limit) = inherited
            .runtime
            .as_ref()
            .map_or((cfg.mem_limit, u64::MAX), |l| {
                (l.mem_limit, l.writeback_limit)
            });
        table.allocator().set_mem_limit(mem_limit);
        let secondaries = Arc::new(Secondaries::from_list(&inherited.secondaries));
        let workers = start_workers(&cfg, inherited.recoveries, &secondaries);
        let store = Arc::new(Store {
            table,
            shards: Mutex::new(Vec::new()),
            pages_compacted: AtomicU64::new(0),
            compactor: Mutex::new(None),
            clock: Clock::from_base(inherited.clock_base),
            secondaries,
            wb_limit: AtomicU64::new(wb_limit),
            provisioner: Mutex::new(None),
            workers,
            cfg,
            inherited,
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

    /// The backing store's file, which the blocks of a read's
    /// [`ReadStep::Wait`] are read from (`O_DIRECT` unless its file system
    /// refuses it: read whole aligned blocks into aligned memory); `None`
    /// without one.
    pub fn backing_fd(&self) -> Option<BorrowedFd<'_>> {
        self.table.backing().map(|b| b.fd())
    }

    /// The most bytes a read's [`ReadStep::Wait`] asks for: one block in
    /// per-page mode, a written-back group's run (its pages and two
    /// blocks) in packed mode; 0 without a backing store.
    pub fn backing_read_bytes(&self) -> usize {
        match self.table.backing() {
            Some(_) => crate::ctx::backed_read_blocks(&self.cfg) * crate::page::PAGE_SIZE,
            None => 0,
        }
    }

    /// Thread state with a shard of its own, and the shard's index.
    fn new_state(&self) -> (usize, CtxState) {
        let (id, shard) = self.new_shard();
        let secondaries = self.secondaries.clone();
        let st = CtxState::new(&self.cfg, id, self.inherited.recoveries, shard, secondaries);
        (id, st)
    }

    /// The store clock's time now, as slots keep it.
    fn now(&self) -> u32 {
        (self.clock.now() & u64::from(ATIME_MASK)) as u32
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

    /// The object allocator (tests look into it: cargo feature
    /// `test-support`).
    #[cfg(feature = "test-support")]
    pub fn allocator(&self) -> &dyn ObjAllocator {
        self.table.allocator()
    }
}

/// Starts `cfg`'s compression workers, each with a thread state and a
/// statistics shard of its own (`epoch`: the store's recovery count).
fn start_workers(cfg: &StoreConfig, epoch: u64, sec: &Arc<Secondaries>) -> Option<Workers> {
    let states = (0..cfg.compress_workers)
        .map(|w| {
            let shard = Arc::new(StatsShard::default());
            CtxState::new(cfg, FIRST_WORKER_ID - w, epoch, shard, sec.clone())
        })
        .collect();
    Workers::start(states)
}

/// The slab's part of a store's configuration.
fn slab_config(cfg: &StoreConfig) -> SlabConfig {
    SlabConfig {
        mlock: cfg.mlock,
        reserve: cfg.reserve,
        reserve_free_below: cfg.reserve_free_below,
    }
}
