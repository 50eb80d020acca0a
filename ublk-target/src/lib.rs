//! zblk's ublk daemon: serves a [`zblk::Store`] as `/dev/ublkbN`.
//!
//! One concern per module; each imports only those listed before it:
//!
//! - [`paths`]: where run-time files live (`/run/zblk/`, `/dev/ublk*`);
//! - [`error`]: [`Error`], the failed step and its cause, worded once;
//! - [`size`]: sizes on the command line (`512K`, `8G`);
//! - [`params`]: the block device's limits (4 KB blocks, discard) and the
//!   automatic I/O buffer size;
//! - [`placement`]: where the queue threads run (their queue's CPUs, or
//!   the others: compression beside the workload);
//! - [`config`]: [`DeviceConfig`], the one configuration from the command
//!   line to the daemon and the engine;
//! - [`features`]: the driver's feature bits in words, and the recovery a
//!   device gets from them;
//! - [`fdpass`]: a descriptor over a Unix socket (`SCM_RIGHTS`);
//! - [`io_threads`]: several I/O threads a queue (`UBLK_F_PER_IO_DAEMON`):
//!   the driver check, the recovered count, each thread's index;
//! - [`io`]: request decoding and dispatch, pure and unit-tested;
//! - [`poll`]: when a queue thread polls its ring instead of sleeping;
//! - [`safety`]: what a swap device's server needs so that it never waits
//!   on swap (mlockall, io-flusher, OOM score);
//! - [`privileges`]: dropping the capabilities a started daemon or keeper
//!   does not need, and `no_new_privs`;
//! - [`swap`]: whether a device is active swap (`/proc/swaps`), swapon,
//!   swapoff;
//! - [`notify`]: `READY=1` to systemd once a device serves I/O;
//! - `signals`: SIGTERM and SIGINT through a signalfd;
//! - `queue`: the queue threads, one engine context each, and their ticks;
//! - `policy`: the idle policy's thread: recompression and writeback of
//!   idle pages on its own, paced, and backing off while the device is
//!   busy;
//! - [`control`]: the per-device control socket: its protocol, the client
//!   ([`control::client`]) and the daemon's server ([`control::server`]);
//! - [`device`]: adding, taking over, stopping and deleting ublk devices
//!   (orphans too);
//! - [`keeper`]: the process that holds a device's store while its daemon
//!   is dead and starts the next daemon;
//! - [`daemon`]: the lifecycle: harden, create or recover, serve, stop or
//!   hand over.

#![warn(missing_docs)]

pub mod algo_params;
pub mod backing_read;
pub mod config;
pub mod control;
pub mod daemon;
pub mod device;
pub mod error;
pub mod fdpass;
pub mod features;
pub mod io;
pub mod io_threads;
pub mod keeper;
pub mod logsink;
pub mod notify;
pub mod params;
pub mod paths;
pub mod placement;
mod policy;
pub mod poll;
pub mod privileges;
mod queue;
pub mod safety;
pub mod signals;
pub mod size;
pub mod swap;
#[cfg(test)]
mod testing;
pub mod transport;

pub use config::{DeviceConfig, EngineConfig};
pub use control::{DeviceInfo, Request, Response};
pub use daemon::{Holder, Ready, Start};
pub use error::{Error, Result, Step};
pub use features::{Features, Recovery};
pub use io::{dispatch, handle_io, IoDesc, RateLimit};
