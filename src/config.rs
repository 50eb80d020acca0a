//! How a store is built: [`StoreConfig`] and the settings it carries.
//!
//! Everything the engine can be told lives here, with its default and its
//! validation, so that the layers below the store read settings from one
//! place and a new setting is added in one place.

use crate::codec::{Algo, Codec, Dictionaries};
use crate::error::{Error, Result};
use crate::free::DEFAULT_MAX_PENDING_BATCHES;
use crate::page::{MAX_PAGES, PAGE_SIZE, PAGE_SIZE_U64};
use serde::Serialize;
#[cfg(feature = "test-support")]
use std::sync::Arc;

/// Default compressed size at or above which a page is stored raw: 3/4 of a
/// page, near zram's huge_class_size. Storing such a page compressed would
/// save little memory and cost a decompression on every read.
pub const DEFAULT_HUGE_THRESHOLD: usize = PAGE_SIZE * 3 / 4;

/// Default pages per compression group (zswap's batch size); a codec made
/// without a store's shape is sized for it.
pub const DEFAULT_GROUP_PAGES: usize = crate::codec::DEFAULT_CODEC_PAGES;

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

crate::keyword::keywords!(Mode, "mode", {
    "per-page" => Mode::PerPage,
    "packed" => Mode::Packed,
});

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
    /// Keep a memory reserve: new zspages are backed ahead of need by a
    /// provisioner thread, never by the writing thread, which fails a write
    /// with ENOMEM rather than fault in fresh memory (the daemon's setting:
    /// a queue thread in direct reclaim can wedge a machine that swaps to
    /// it). Needs the slab.
    pub reserve: bool,
    /// With a reserve: free memory (bytes) below which writing threads stop
    /// backing zspages themselves and take them only from the reserve; 0
    /// picks 1/16 of RAM, at least 64 MB and at least twice the zones'
    /// high watermarks. Above it a fault is served from free pages, without
    /// reclaim, and costs less than waiting for the provisioner.
    /// `u64::MAX`: always from the reserve.
    pub reserve_free_below: u64,
    /// Keep the slot table and the slab in one memfd that outlives the
    /// process (`Store::memory_fd`), so that a new process can take the
    /// store over with every page (`Store::recover`). Needs the slab.
    pub shared: bool,
    /// With `shared`: put the store's file on a tmpfs of its own that
    /// gives the slab's larger chunks 2 MB pages (one fault backs 512
    /// pages), where the system allows it (`crate::tmpfs`); false: a memfd,
    /// 4 KB pages.
    pub huge_pages: bool,
    /// Makes each context's codec instead of `algo.new_codec()`: an
    /// accelerator codec on a chosen set of work queues (tests run
    /// `deflate-iaa` on the device model this way). Its codecs must
    /// implement `algo`. Tests only (cargo feature `test-support`).
    #[cfg(feature = "test-support")]
    pub codecs: Option<CodecFactory>,
    /// A block device or regular file that `Store::writeback` moves pages'
    /// compressed objects to (zram's `backing_dev`); none: no writeback.
    pub backing: Option<std::path::PathBuf>,
    /// Dictionaries of the primary and secondary algorithms (zram's
    /// `algorithm_params dict=PATH`), fixed for the store's life: a store
    /// in shared memory records them, and a recovered store decodes with
    /// the recorded ones, whatever this says.
    pub dictionaries: Dictionaries,
    /// Time the phases of every request (codec, allocation, copies,
    /// installs: `crate::stats::Phase`) and report them in
    /// `StoreStats::phases`: the per-page breakdown. Off by default: a few
    /// clock reads per group.
    pub phase_timers: bool,
    /// Compression workers: threads that compress (and decode) the groups
    /// of a request of more than one group alongside the queue thread that
    /// serves it, when they are idle (`crate::workers`). 0: none, every
    /// group runs on its queue thread.
    pub compress_workers: usize,
}

/// Most compression workers a store may have.
pub const MAX_COMPRESS_WORKERS: usize = 64;

/// Makes one codec per queue context (see [`StoreConfig::codecs`]).
#[cfg(feature = "test-support")]
#[derive(Clone)]
pub struct CodecFactory(pub Arc<dyn Fn() -> Box<dyn Codec> + Send + Sync>);

#[cfg(feature = "test-support")]
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
    /// One heap allocation per object: the simple reference tests check
    /// the slab against (cargo feature `test-support`).
    #[cfg(feature = "test-support")]
    Heap,
}

/// Fragmentation at which the store compacts by itself: when compaction
/// could give back this share (percent) of `mem_used_total`...
pub const AUTO_COMPACT_PERCENT: u64 = 10;
/// ...and at least this many pages (so small stores are left alone).
pub const AUTO_COMPACT_MIN_PAGES: u64 = 256;

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
            reserve: false,
            reserve_free_below: 0,
            shared: false,
            huge_pages: false,
            #[cfg(feature = "test-support")]
            codecs: None,
            backing: None,
            dictionaries: Dictionaries::new(),
            phase_timers: false,
            compress_workers: 0,
        }
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if self.reserve && self.allocator != AllocatorKind::Slab {
            return Err(Error::InvalidConfig(
                "a memory reserve needs the slab allocator".into(),
            ));
        }
        if self.shared && self.allocator != AllocatorKind::Slab {
            return Err(Error::InvalidConfig(
                "shared memory needs the slab allocator".into(),
            ));
        }
        if self.shared && !portable_atomic::AtomicU128::is_lock_free() {
            return Err(Error::InvalidConfig(
                "shared memory needs 16-byte atomics (cmpxchg16b), which this CPU lacks".into(),
            ));
        }
        if self.size == 0 || self.size % PAGE_SIZE_U64 != 0 {
            return Err(Error::InvalidConfig(format!(
                "size {} is not a non-zero multiple of 4096 bytes",
                self.size
            )));
        }
        if self.size / PAGE_SIZE_U64 > MAX_PAGES {
            return Err(Error::InvalidConfig(format!(
                "size {} is too large: at most {} bytes (256 TiB)",
                self.size,
                MAX_PAGES * PAGE_SIZE_U64
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
        if self.compress_workers > MAX_COMPRESS_WORKERS {
            return Err(Error::InvalidConfig(format!(
                "compress workers {} is more than {MAX_COMPRESS_WORKERS}",
                self.compress_workers
            )));
        }
        if !(64..=PAGE_SIZE).contains(&self.huge_threshold) {
            return Err(Error::InvalidConfig(format!(
                "huge threshold {} is not in 64..={PAGE_SIZE}",
                self.huge_threshold
            )));
        }
        #[cfg(feature = "test-support")]
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

impl StoreConfig {
    /// A codec for one queue context: the factory's if one is set, else
    /// the software codec of `algo`.
    pub(crate) fn new_codec(&self) -> Box<dyn Codec> {
        #[cfg(feature = "test-support")]
        if let Some(make) = &self.codecs {
            return (make.0)();
        }
        self.dictionaries.codec_for(self.algo, self.codec_pages())
    }

    /// The largest input, in pages, this store gives a codec: a group when
    /// packed, else a page.
    pub(crate) fn codec_pages(&self) -> usize {
        match self.mode {
            Mode::PerPage => 1,
            Mode::Packed => self.group_pages,
        }
    }

    /// Slots an object may be referenced from, counting from its owner: the
    /// owner alone per page, the owner's whole group when packed.
    pub(crate) fn object_span(&self) -> u64 {
        match self.mode {
            Mode::PerPage => 1,
            Mode::Packed => self.group_pages as u64,
        }
    }
}
