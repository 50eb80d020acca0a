//! zblk's engine: a compressed RAM page store, like the kernel's zram, with
//! no kernel in it.
//!
//! A [`Store`] holds a slot per 4 KB page of a fixed-size device. Each queue
//! thread gets a [`QueueCtx`] (its codec, scratch, statistics shard and
//! free batch) and calls `write`, `read`, `discard` and `write_zeroes` on
//! page-aligned byte ranges. See `design.md` in the project's shared notes.

#![warn(missing_docs)]

pub mod accel;
pub mod alloc;
pub mod codec;
pub mod ctx;
pub mod error;
pub mod free;
pub mod group;
pub mod packed;
pub mod page;
pub mod slab;
pub mod slot;
pub mod stats;
pub mod store;

pub use codec::Algo;
pub use ctx::QueueCtx;
pub use error::{Error, Result};
pub use page::{PAGE_SIZE, PAGE_SIZE_U64};
pub use store::{AllocatorKind, CodecFactory, Mode, Store, StoreConfig, StoreStats};
