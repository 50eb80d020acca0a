//! zblk's engine: a compressed RAM page store, like the kernel's zram, with
//! no kernel in it.
//!
//! A [`Store`] holds a slot per 4 KB page of a fixed-size device. Each queue
//! thread gets a [`QueueCtx`] (its codec, scratch, statistics shard and
//! free batch) and calls `write`, `read`, `discard` and `write_zeroes` on
//! page-aligned byte ranges.
//!
//! # Layers
//!
//! The modules form layers, each importing only from its own layer or the
//! layers below it. Their one description is the table "The engine's
//! layers" in `docs/architecture.md` (in the source tree), which
//! `tools/scripts/engine-dag.py` reads to check every import on every
//! test run.

#![warn(missing_docs)]

// `accel`, `alloc`, `codec` and `slab` are public only for the tests,
// benchmarks and fuzz targets (cargo feature `test-support`): the shipped
// library's API is the re-exports below.
#[cfg(feature = "test-support")]
pub mod accel;
#[cfg(not(feature = "test-support"))]
mod accel;
#[cfg(feature = "test-support")]
pub mod alloc;
#[cfg(not(feature = "test-support"))]
mod alloc;
mod backing;
mod backing_compact;
mod block_state;
mod clock;
#[cfg(feature = "test-support")]
pub mod codec;
#[cfg(not(feature = "test-support"))]
mod codec;
mod compact;
mod config;
mod crash_point;
mod ctx;
mod error;
mod fail_point;
mod free;
mod keyword;
mod packed;
mod page;
mod page_range;
mod provision;
mod read;
mod recompress;
mod recover;
mod sample;
mod secondary;
mod shm;
#[cfg(feature = "test-support")]
pub mod slab;
#[cfg(not(feature = "test-support"))]
mod slab;
mod slot;
mod stats;
mod store;
mod table;
#[cfg(any(test, feature = "test-support"))]
pub mod testing;
mod tmpfs;
mod workers;
mod write;
mod writeback;

pub use backing_compact::{BackingCompactReport, SPARSE_BYTES};
pub use block_state::{SlotKind, SlotState};
pub use codec::{Algo, Dictionaries, MAX_DICT_BYTES};
#[cfg(feature = "test-support")]
pub use config::CodecFactory;
pub use config::{
    AllocatorKind, Mode, StoreConfig, AUTO_COMPACT_MIN_PAGES, AUTO_COMPACT_PERCENT,
    DEFAULT_GROUP_PAGES, DEFAULT_HUGE_THRESHOLD, MAX_COMPRESS_WORKERS, MAX_GROUP_PAGES,
};
pub use error::{Error, Result};
pub use page::{PAGE_SIZE, PAGE_SIZE_U64};
pub use recompress::{Recompress, RecompressReport, RecompressType, MIN_SAVING_PERCENT};
pub use secondary::{AlgoList, MAX_SECONDARIES};
pub use stats::{Counters, Latencies, Latency, PhaseTimes};
pub use store::{BackingWait, QueueCtx, ReadStep, Store, StoreStats};
pub use tmpfs::huge_mapped_bytes;
// Hooks for tests: corrupting objects, crashing, older layouts.
pub use page_range::PageRange;
#[cfg(feature = "test-support")]
pub use testing::{
    debug_as_layout3, debug_as_layout4, debug_as_layout5, debug_corrupt_object, debug_crash,
    debug_flip_object_byte,
};
pub use writeback::{Writeback, WritebackReport, WritebackSelect, WritebackType};
