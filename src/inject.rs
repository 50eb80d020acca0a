//! Crash points: places in the write, discard, compaction and packed
//! rewrite paths where a test can make the process die, to prove that a
//! store in shared memory recovers from a crash at any of them.
//!
//! With the `test-support` feature, every pass through a point counts; the
//! process exits at once (no destructor, no flush: as a `kill -9` would
//! leave its memory) on the pass numbered `ZBLK_CRASH_AT`. Without the
//! feature a point compiles to nothing.

#[cfg(feature = "test-support")]
mod imp {
    use std::io::Write;
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    use std::sync::OnceLock;

    static PASSED: AtomicU64 = AtomicU64::new(0);
    static AT: OnceLock<u64> = OnceLock::new();

    /// Counts a pass; exits the process on the chosen one.
    pub(crate) fn point(name: &'static str) {
        let at = *AT.get_or_init(|| {
            std::env::var("ZBLK_CRASH_AT")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        });
        let n = PASSED.fetch_add(1, Relaxed) + 1;
        if n == at {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "ZBLK crash {n} {name}");
            let _ = out.flush();
            // SAFETY: _exit ends the process at once; nothing runs after it.
            unsafe { libc::_exit(77) };
        }
    }

    /// Passes through crash points so far in this process.
    pub fn passed() -> u64 {
        PASSED.load(Relaxed)
    }
}

#[cfg(feature = "test-support")]
pub use imp::passed;
#[cfg(feature = "test-support")]
pub(crate) use imp::point;

/// A crash point (nothing without the `test-support` feature).
#[cfg(not(feature = "test-support"))]
#[inline(always)]
pub(crate) fn point(_name: &'static str) {}
