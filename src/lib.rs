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
//! Modules import only from the layers below them:
//!
//! 1. `store`: [`Store`] and [`QueueCtx`], the four operations and stats;
//! 2. `compact` (packed groups), `recompress` (idle marking and
//!    recompression), `writeback` (to the backing store), then `write` and
//!    `read`, the two paths;
//! 3. `table`: the slot table and what entering or leaving a slot does;
//! 4. `packed`: the packed object format, packing and unpacking a group;
//! 5. `ctx`: one queue thread's state; `config`: how a store is built;
//! 6. the parts: `slot` (entry encoding and lock), `codec` (with the IAA
//!    codec), `accel` (the IAA device interface), `alloc` and `slab` (the
//!    object allocator), `free` (deferred free), `backing` (the backing
//!    store and its free map), `stats`, `error`, `page`.

#![warn(missing_docs)]

pub mod accel;
pub mod alloc;
mod backing;
mod clock;
pub mod codec;
mod compact;
mod config;
mod ctx;
mod error;
mod fault;
mod free;
mod inject;
mod packed;
mod page;
mod provision;
mod read;
mod recompress;
mod recover;
mod shm;
pub mod slab;
mod slot;
mod stats;
mod store;
mod table;
#[cfg(any(test, feature = "test-support"))]
pub mod testing;
mod write;
mod writeback;

pub use codec::Algo;
pub use config::{
    AllocatorKind, CodecFactory, Mode, StoreConfig, AUTO_COMPACT_MIN_PAGES, AUTO_COMPACT_PERCENT,
    DEFAULT_GROUP_PAGES, DEFAULT_HUGE_THRESHOLD, MAX_GROUP_PAGES,
};
pub use error::{Error, Result};
pub use page::{PAGE_SIZE, PAGE_SIZE_U64};
pub use recompress::{Recompress, RecompressReport, RecompressType, MIN_SAVING_PERCENT};
pub use stats::{Counters, Latencies, Latency, PhaseTimes};
pub use store::{QueueCtx, Store, StoreStats};
// Hooks for tests: corrupting objects, crashing, older layouts.
#[cfg(feature = "test-support")]
pub use store::{debug_as_layout3, debug_corrupt_object, debug_crash, debug_flip_object_byte};
pub use writeback::{Writeback, WritebackReport, WritebackType};
