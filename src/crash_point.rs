//! Crash points: places in the write, discard, compaction and packed
//! rewrite paths where a test can make the process die, to prove that a
//! store in shared memory recovers from a crash at any of them.
//!
//! With the `test-support` feature, every pass through a point counts; the
//! process exits at once (no destructor, no flush: as a `kill -9` would
//! leave its memory) on the pass numbered `ZBLK_CRASH_AT`. Without the
//! feature a point compiles to nothing.
//!
//! A test can also run code of its own at the points its thread passes
//! ([`on_point`]): to make a race happen at the one place it can, every
//! time, instead of hoping two threads meet there.

#[cfg(feature = "test-support")]
mod imp {
    use std::io::Write;
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    use std::sync::OnceLock;

    static PASSED: AtomicU64 = AtomicU64::new(0);
    static AT: OnceLock<u64> = OnceLock::new();

    /// What a test runs at the points this thread passes.
    type Hook = Box<dyn FnMut(&'static str)>;

    thread_local! {
        static HOOK: std::cell::RefCell<Option<Hook>> = const { std::cell::RefCell::new(None) };
    }

    /// Runs `hook` with each point's name at every point this thread
    /// passes from now on (None: no more). The points the hook itself
    /// passes do not call it again.
    pub fn on_point(hook: Option<Box<dyn FnMut(&'static str)>>) {
        HOOK.with(|h| *h.borrow_mut() = hook);
    }

    /// Calls this thread's hook, taken out meanwhile so that the points it
    /// passes find none.
    fn run_hook(name: &'static str) {
        let Some(mut hook) = HOOK.with(|h| h.borrow_mut().take()) else {
            return;
        };
        hook(name);
        HOOK.with(|h| {
            let mut h = h.borrow_mut();
            if h.is_none() {
                *h = Some(hook);
            }
        });
    }

    /// Counts a pass; exits the process on the chosen one; else runs the
    /// thread's hook, if it has one.
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
        run_hook(name);
    }

    /// Passes through crash points so far in this process.
    pub fn passed() -> u64 {
        PASSED.load(Relaxed)
    }
}

#[cfg(feature = "test-support")]
pub(crate) use imp::point;
#[cfg(feature = "test-support")]
pub use imp::{on_point, passed};

/// A crash point (nothing without the `test-support` feature).
#[cfg(not(feature = "test-support"))]
#[inline(always)]
pub(crate) fn point(_name: &'static str) {}
