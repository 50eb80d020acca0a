//! Failure points: the places where the engine obtains memory, where a test
//! can make that allocation fail, to prove that every failure a write can
//! meet becomes an errno for that request and loses or leaks nothing.
//!
//! The sibling of the crash points (`crate::crash_point`): a crash point kills
//! the process, a failure point makes one allocation return its error and
//! lets the caller's error handling run. docs/fault-injection.md lists each
//! point, what it simulates and what `tests/store_faults.rs` checks.
//!
//! With the `test-support` feature a test arms one point by name for its
//! Nth pass ([`arm`]); passes are counted per thread, so that tests running
//! side by side in one process never trip each other's points, and the
//! drain thread (which allocates nothing) is never affected. Without the
//! feature [`fail`] is the constant `false` and compiles to nothing.

/// Every failure point, by name. Keep docs/fault-injection.md in step.
#[cfg_attr(not(feature = "test-support"), allow(dead_code))]
pub const POINTS: &[&str] = &[
    // `MemAccount::try_charge`: mem_limit reached (any allocator).
    "mem:charge",
    // `HeapAllocator::alloc_bulk`, after charging: malloc refused.
    "heap:alloc",
    // The slab takes one object for a group: refused in the middle of a
    // bulk allocation, after earlier objects of the group were taken.
    "slab:obj",
    // The slab makes a new zspage (no spare to reuse), after charging it:
    // the OS refused its pages.
    "slab:zspage",
    // The slab maps a new chunk of a class's address space: mmap refused.
    "slab:chunk",
    // A shared store maps part of its memfd: mmap refused.
    "shm:map",
    // A shared store backs a new zspage from its memfd: the memfd could
    // not grow (populate refused), which would otherwise fault later.
    "shm:grow",
];

#[cfg(feature = "test-support")]
mod imp {
    use super::POINTS;
    use std::cell::RefCell;

    #[derive(Default)]
    struct State {
        /// Passes through each point (index in `POINTS`) on this thread.
        passes: Vec<u64>,
        /// The armed point and the pass count at which it fails.
        armed: Option<(usize, u64)>,
        /// Whether the armed point has failed since it was armed.
        fired: bool,
    }

    thread_local! {
        static STATE: RefCell<State> = RefCell::new(State {
            passes: vec![0; POINTS.len()],
            ..State::default()
        });
    }

    fn index(name: &str) -> Option<usize> {
        POINTS.iter().position(|p| *p == name)
    }

    /// Counts a pass through point `name`; true if the allocation there is
    /// to fail now (the armed point's chosen pass, once).
    pub(crate) fn fail(name: &'static str) -> bool {
        let Some(i) = index(name) else {
            debug_assert!(false, "failure point {name} is not in fail_point::POINTS");
            return false;
        };
        STATE.with(|s| {
            let mut s = s.borrow_mut();
            s.passes[i] += 1;
            match s.armed {
                Some((a, at)) if a == i && s.passes[i] == at => {
                    s.armed = None;
                    s.fired = true;
                    true
                }
                _ => false,
            }
        })
    }

    /// Arms point `name` to fail on its `nth` pass (1: the next) on this
    /// thread, counting from now; clears the fired flag. Returns false for
    /// an unknown name or `nth == 0`.
    pub fn arm(name: &str, nth: u64) -> bool {
        let Some(i) = index(name).filter(|_| nth > 0) else {
            return false;
        };
        STATE.with(|s| {
            let mut s = s.borrow_mut();
            s.armed = Some((i, s.passes[i] + nth));
            s.fired = false;
        });
        true
    }

    /// Disarms whatever is armed on this thread.
    pub fn disarm() {
        STATE.with(|s| s.borrow_mut().armed = None);
    }

    /// Whether the armed point failed since [`arm`]; clears the flag.
    pub fn take_fired() -> bool {
        STATE.with(|s| std::mem::take(&mut s.borrow_mut().fired))
    }

    /// Passes through point `name` on this thread so far (0 if unknown).
    pub fn passes(name: &str) -> u64 {
        index(name).map_or(0, |i| STATE.with(|s| s.borrow().passes[i]))
    }
}

#[cfg(feature = "test-support")]
pub use imp::{arm, disarm, passes, take_fired};

#[cfg(feature = "test-support")]
pub(crate) use imp::fail;

/// A failure point (always `false` without the `test-support` feature).
#[cfg(not(feature = "test-support"))]
#[inline(always)]
pub(crate) fn fail(_name: &'static str) -> bool {
    false
}

/// The provisioner's stall point (test-support builds only): while a test
/// holds it on ([`stall_provisioner`]), the provisioner waits where it
/// would back new spares, as when its page faults wait in reclaim for a
/// long time, so that a test can prove writes meanwhile fail or succeed
/// within their bounded waits and never hang.
#[cfg(feature = "test-support")]
static STALL: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Holds the provisioner at its stall point (`true`) or lets it go.
#[cfg(feature = "test-support")]
pub fn stall_provisioner(on: bool) {
    STALL.store(on, std::sync::atomic::Ordering::SeqCst);
}

/// The provisioner's stall point: waits while a test holds it on.
#[cfg(feature = "test-support")]
pub(crate) fn provisioner_stall_point() {
    while STALL.load(std::sync::atomic::Ordering::SeqCst) {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// The provisioner's stall point (nothing without `test-support`).
#[cfg(not(feature = "test-support"))]
#[inline(always)]
pub(crate) fn provisioner_stall_point() {}
