//! zblk's ublk daemon: serves a [`zblk::Store`] as `/dev/ublkbN`.
//!
//! - [`io`]: request decoding and dispatch, pure and unit-tested;
//! - [`params`]: the block device's limits (4 KB blocks, discard);
//! - [`daemon`]: the libublk queues, one thread and one engine context per
//!   queue, and the control loop;
//! - [`control`]: the per-device control socket under `/run/zblk/`;
//! - [`safety`]: what a swap device's server needs so that it never waits
//!   on swap (mlockall, io-flusher, OOM score);
//! - [`swap`]: whether a device is active swap (`/proc/swaps`).

#![warn(missing_docs)]

pub mod control;
pub mod daemon;
pub mod io;
pub mod params;
pub mod paths;
pub mod safety;
pub mod swap;

pub use control::{DeviceInfo, Request, Response};
pub use daemon::{DaemonConfig, Ready};
pub use io::{dispatch, handle_io, IoDesc, RateLimit};
