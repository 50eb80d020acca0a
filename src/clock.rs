//! The store's coarse clock: whole seconds since the store was created,
//! for the slots' access times (`crate::slot`'s `atime`).
//!
//! It counts `CLOCK_BOOTTIME` (which keeps counting through suspend, as
//! zram's `ktime_get_boottime` does, and is the same in every process of
//! one boot), from a base taken when the store was created. A store in
//! shared memory keeps that base in its header, so that a process that
//! recovers the store reads the same clock its slots were stamped with
//! (the memfd cannot outlive the boot). The store reads it once per
//! request, not per page.
//!
//! Tests move it forward by hand ([`Clock::advance`]) instead of sleeping.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Seconds of `CLOCK_BOOTTIME`, now.
pub(crate) fn boot_seconds() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec, which `ts` is.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    if r != 0 {
        // Cannot happen for CLOCK_BOOTTIME on Linux; 0 keeps times sane.
        return 0;
    }
    ts.tv_sec as u64
}

/// A store's clock.
#[derive(Debug)]
pub(crate) struct Clock {
    /// `boot_seconds()` when the store was created.
    base: u64,
    /// Seconds tests added.
    offset: AtomicU64,
}

impl Clock {
    /// A clock counting from `base` (a `boot_seconds()` value).
    pub(crate) fn from_base(base: u64) -> Clock {
        Clock {
            base,
            offset: AtomicU64::new(0),
        }
    }

    /// Seconds since the base (slots keep the low 24 bits).
    pub(crate) fn now(&self) -> u64 {
        boot_seconds().saturating_sub(self.base) + self.offset.load(Relaxed)
    }

    /// Moves the clock `secs` forward (tests).
    #[cfg(any(test, feature = "test-support"))]
    pub(crate) fn advance(&self, secs: u64) {
        self.offset.fetch_add(secs, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_from_its_base_and_advances() {
        let c = Clock::from_base(boot_seconds());
        let t0 = c.now();
        assert!(t0 <= 1, "a fresh clock starts near 0, not {t0}");
        c.advance(1000);
        assert!((1000..1002).contains(&c.now()));
        let past = Clock::from_base(boot_seconds().saturating_sub(50));
        assert!(past.now() >= 50);
    }
}
