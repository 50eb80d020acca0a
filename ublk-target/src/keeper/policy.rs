//! When the keeper stops starting new daemons: too many crashes too fast.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Crashes within [`GIVE_UP_WINDOW`] after which the keeper gives up.
pub const GIVE_UP_CRASHES: usize = 5;

/// The window of [`GIVE_UP_CRASHES`]. A daemon that dies on the same
/// request again dies within a few hundred ms of its start, so 5 crashes
/// take about a second or two there; isolated crashes (a kill, an OOM kill
/// that slipped through) are seconds apart and never reach it.
pub const GIVE_UP_WINDOW: Duration = Duration::from_secs(10);

/// The recent crashes of one device's daemons.
#[derive(Debug)]
pub struct CrashWindow {
    times: VecDeque<Instant>,
    max: usize,
    window: Duration,
}

impl Default for CrashWindow {
    fn default() -> Self {
        CrashWindow::new(GIVE_UP_CRASHES, GIVE_UP_WINDOW)
    }
}

impl CrashWindow {
    /// Gives up at `max` crashes within `window`.
    pub fn new(max: usize, window: Duration) -> Self {
        CrashWindow {
            times: VecDeque::new(),
            max,
            window,
        }
    }

    /// Counts a crash at `now`; true when it is time to give up.
    pub fn crash(&mut self, now: Instant) -> bool {
        self.forget_before(now);
        self.times.push_back(now);
        self.times.len() >= self.max
    }

    /// Crashes within the window before `now`.
    pub fn recent(&mut self, now: Instant) -> usize {
        self.forget_before(now);
        self.times.len()
    }

    fn forget_before(&mut self, now: Instant) {
        while let Some(&t) = self.times.front() {
            if now.duration_since(t) < self.window {
                break;
            }
            self.times.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gives_up_at_five_crashes_within_the_window() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut w = CrashWindow::default();
        for i in 0..4 {
            assert!(!w.crash(t0 + s * i), "crash {i}");
        }
        assert!(w.crash(t0 + s * 4));
        let mut w = CrashWindow::default();
        // Spread out: one every 3 s never reaches 5 within 10 s.
        for i in 0..20 {
            assert!(!w.crash(t0 + s * 3 * i), "crash {i}");
        }
        assert_eq!(w.recent(t0 + s * 57), 4);
        assert_eq!(w.recent(t0 + s * 200), 0);
    }
}
