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
//! The nine layers of `docs/architecture.md`, top first. A module imports
//! only modules of its own layer or of the layers below it, never above
//! (`tools/scripts/engine-dag.py` checks that the imports form no cycle):
//!
//! 1. `store`: [`Store`] and [`QueueCtx`], the four operations (write,
//!    read, discard, write-zeroes) over byte ranges, compaction, stats;
//! 2. `compact` (rewriting the pages of sparse packed groups),
//!    `recompress` (idle marking and recompression with the secondary
//!    algorithm), `writeback` (compressed objects out to the backing
//!    store), `recover` (taking over a dead process's store);
//! 3. `write` and `read`: the two paths;
//! 4. `table`: the slot table and what entering or leaving a slot does;
//! 5. `packed`: the packed object format, packing and unpacking a group;
//! 6. `ctx`: one queue thread's state;
//! 7. `config`: how a store is built;
//! 8. `backing` (the backing store and its free map), `slot` (entry
//!    encoding and lock), `free` (deferred free), `error`, `codec` (with
//!    the IAA codec), `provision` (the memory reserve's provisioner);
//! 9. `accel` (the IAA device interface), `alloc` and `slab` (the object
//!    allocator), `stats`, `page`, `shm` (the memfd a recoverable store
//!    lives in), `inject` and `fault` (crash and allocation-failure
//!    points for tests), `clock` (the coarse clock of access times).
//!
//! `testing` (test doubles, with the `test-support` feature) sits beside
//! them, used by tests only.

#![warn(missing_docs)]

pub mod accel;
pub mod alloc;
mod backing;
mod block_state;
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
mod sample;
mod secondary;
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

pub use block_state::{SlotKind, SlotState};
pub use codec::{Algo, Dictionaries, MAX_DICT_BYTES};
pub use config::{
    AllocatorKind, CodecFactory, Mode, StoreConfig, AUTO_COMPACT_MIN_PAGES, AUTO_COMPACT_PERCENT,
    DEFAULT_GROUP_PAGES, DEFAULT_HUGE_THRESHOLD, MAX_GROUP_PAGES,
};
pub use error::{Error, Result};
pub use page::{PAGE_SIZE, PAGE_SIZE_U64};
pub use recompress::{Recompress, RecompressReport, RecompressType, MIN_SAVING_PERCENT};
pub use secondary::{AlgoList, MAX_SECONDARIES};
pub use stats::{Counters, Latencies, Latency, PhaseTimes};
pub use store::{QueueCtx, Store, StoreStats};
// Hooks for tests: corrupting objects, crashing, older layouts.
#[cfg(feature = "test-support")]
pub use testing::{
    debug_as_layout3, debug_as_layout4, debug_as_layout5, debug_corrupt_object, debug_crash,
    debug_flip_object_byte,
};
pub use writeback::{PageRange, Writeback, WritebackReport, WritebackSelect, WritebackType};
