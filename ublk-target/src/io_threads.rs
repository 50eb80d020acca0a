//! Several I/O threads per queue (`--io-threads N`, the driver's
//! `UBLK_F_PER_IO_DAEMON`, Linux 6.16+).
//!
//! With one thread a queue, the requests of one blk-mq queue (one CPU's,
//! when there is a queue per CPU) are compressed one after another by one
//! thread. With `N` threads libublk splits the queue's tags between them
//! (thread `t` serves tags `t, t + N, t + 2N, ...`), each fetching and
//! completing its own, so one CPU's swap-out is compressed by `N` threads
//! at once, on other CPUs too under `--queue-cpus other` or `any`.
//!
//! Each I/O thread has its own engine context, tick eventfd and shared
//! state in [`crate::queue`], at index [`slot`]. A driver that has the
//! feature sets `UBLK_F_PER_IO_DAEMON` in the flags of every device it
//! adds, but for a `UBLK_F_BATCH_IO` one (asking for the flag is refused
//! with EINVAL); a recovering daemon serves the device with the count its
//! configuration names when the device has the flag, and with one thread
//! a queue otherwise ([`recovered`]).

use crate::features::Features;
use crate::transport::TransportChoice;
use libublk::sys;

/// Checks `n` I/O threads a queue for a new device of queue depth `depth`
/// on a driver with `features`, with the transport asked for; `Err` is
/// one line naming what is missing.
pub fn check(
    n: u16,
    depth: u16,
    transport: TransportChoice,
    features: Features,
) -> Result<(), String> {
    if n <= 1 {
        return Ok(());
    }
    if n > depth {
        return Err(format!(
            "--io-threads {n} is more than the queue depth {depth}: each thread needs a tag"
        ));
    }
    if !features.has(sys::UBLK_F_PER_IO_DAEMON) {
        return Err(format!(
            "--io-threads {n} needs the driver's UBLK_F_PER_IO_DAEMON (Linux 6.16+); \
             this kernel's ublk lacks it"
        ));
    }
    if transport == TransportChoice::Batch {
        return Err(format!(
            "--io-threads {n} cannot be combined with --transport batch: \
             UBLK_F_PER_IO_DAEMON excludes UBLK_F_BATCH_IO"
        ));
    }
    Ok(())
}

/// The transport to choose from for `n` threads a queue: `auto` cannot
/// take batch beside several threads, so it is classic then.
pub fn transport_choice(n: u16, choice: TransportChoice) -> TransportChoice {
    match choice {
        TransportChoice::Auto if n > 1 => TransportChoice::Classic,
        c => c,
    }
}

/// The threads a queue a recovering daemon serves a device with driver
/// flags `flags` with, its configuration asking for `n`: `n` when the
/// device was made with `UBLK_F_PER_IO_DAEMON`, else one (a device made
/// with one thread a queue cannot be served by more).
pub fn recovered(n: u16, flags: u64) -> u16 {
    if flags & u64::from(sys::UBLK_F_PER_IO_DAEMON) != 0 {
        n.max(1)
    } else {
        1
    }
}

/// Index of I/O thread `thread` of queue `qid` among all the device's I/O
/// threads, `n` a queue: queue by queue, the threads of one queue side by
/// side.
pub fn slot(qid: u16, thread: u16, n: u16) -> usize {
    usize::from(qid) * usize::from(n.max(1)) + usize::from(thread)
}

/// The queue and the I/O thread of slot `slot`, `n` threads a queue:
/// [`slot`]'s inverse.
pub fn of_slot(slot: usize, n: u16) -> (usize, usize) {
    let n = usize::from(n.max(1));
    (slot / n, slot % n)
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: Features = Features(0x1fe);
    const NEW: Features = Features(0x1fffff);

    #[test]
    fn one_thread_needs_nothing() {
        assert_eq!(check(1, 1, TransportChoice::Batch, Features(0)), Ok(()));
    }

    #[test]
    fn several_threads_need_the_driver_feature() {
        assert_eq!(check(2, 128, TransportChoice::Classic, NEW), Ok(()));
        let e = check(2, 128, TransportChoice::Classic, OLD).unwrap_err();
        assert!(
            e.contains("UBLK_F_PER_IO_DAEMON") && e.contains("6.16"),
            "{e}"
        );
    }

    #[test]
    fn several_threads_refuse_batch_and_a_shallow_queue() {
        let e = check(2, 128, TransportChoice::Batch, NEW).unwrap_err();
        assert!(e.contains("--transport batch"), "{e}");
        let e = check(9, 8, TransportChoice::Classic, NEW).unwrap_err();
        assert!(e.contains("queue depth 8"), "{e}");
        assert_eq!(check(8, 8, TransportChoice::Classic, NEW), Ok(()));
        assert_eq!(
            transport_choice(2, TransportChoice::Auto),
            TransportChoice::Classic
        );
        assert_eq!(
            transport_choice(1, TransportChoice::Auto),
            TransportChoice::Auto
        );
    }

    #[test]
    fn recovery_keeps_the_count_only_on_a_per_io_daemon_device() {
        let per_io = u64::from(sys::UBLK_F_PER_IO_DAEMON) | 0x18;
        assert_eq!(recovered(3, per_io), 3);
        assert_eq!(recovered(1, per_io), 1);
        assert_eq!(recovered(3, 0x18), 1);
    }

    #[test]
    fn slots_go_queue_by_queue() {
        assert_eq!(slot(0, 0, 1), 0);
        assert_eq!(slot(3, 0, 1), 3);
        assert_eq!(slot(0, 1, 2), 1);
        assert_eq!(slot(1, 0, 2), 2);
        assert_eq!(slot(2, 1, 3), 7);
        for n in 1..4 {
            for q in 0..3 {
                for t in 0..n {
                    let s = slot(q, t, n);
                    assert_eq!(of_slot(s, n), (usize::from(q), usize::from(t)));
                }
            }
        }
    }
}
