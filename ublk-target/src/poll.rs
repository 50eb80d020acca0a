//! Busy-polling a queue's ring for a short while after it served requests
//! (`zblk add --poll-us N`), before it sleeps in the ring's wait.
//!
//! A request reaches a sleeping queue thread as a wake-up: the driver adds
//! task work to the thread, the scheduler wakes it (an inter-processor
//! interrupt when it sleeps on another CPU, a CPU leaving its idle state),
//! and only then does the thread run the task work that posts the command's
//! completion. A thread that keeps entering the ring without waiting
//! (`io_uring_enter` with nothing to wait for: its queued commits are
//! submitted, and any task work runs on the way back) finds the next
//! request without that wake-up. Polling costs the CPU it runs on, so it
//! lasts only `N` µs past the last request served: a busy queue keeps
//! polling, an idle one sleeps as before.
//!
//! [`PollWindow`] is the policy alone, so it is tested without a device;
//! the queue loop (`crate::queue`) asks it how many completions each ring
//! wait is to block for.

use std::time::{Duration, Instant};

/// When a queue thread polls its ring instead of sleeping in it.
#[derive(Debug, Clone)]
pub struct PollWindow {
    /// How long to poll past the last request served; zero never polls.
    budget: Duration,
    /// The end of the current window, if one is open.
    until: Option<Instant>,
}

impl PollWindow {
    /// A window of `budget_us` µs past each pass that served a request.
    pub fn new(budget_us: u32) -> Self {
        PollWindow {
            budget: Duration::from_micros(u64::from(budget_us)),
            until: None,
        }
    }

    /// How many completions the next ring wait blocks for: 0 (a poll)
    /// inside an open window, else 1 (sleep until one comes); the window
    /// closes once it has passed. `now` is read only while a window is
    /// open, so a queue that never polls never reads the clock.
    pub fn to_wait(&mut self, now: impl FnOnce() -> Instant) -> usize {
        match self.until {
            Some(end) if now() < end => 0,
            _ => {
                self.until = None;
                1
            }
        }
    }

    /// After a pass over the ring's completions that served `served`
    /// requests: serving any (re)opens the window, from `now`.
    pub fn after(&mut self, served: usize, now: impl FnOnce() -> Instant) {
        if served > 0 && !self.budget.is_zero() {
            self.until = Some(now() + self.budget);
        }
    }

    /// Whether a window is open (the thread is polling): for the tests,
    /// the queue loop needs only [`Self::to_wait`].
    #[cfg(test)]
    fn polling(&self) -> bool {
        self.until.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    #[test]
    fn an_idle_queue_sleeps() {
        let mut w = PollWindow::new(50);
        let t = Instant::now();
        assert_eq!(w.to_wait(|| t), 1);
        w.after(0, || t);
        assert_eq!(w.to_wait(|| t + US), 1);
        assert!(!w.polling());
    }

    #[test]
    fn serving_opens_a_window_that_lapses() {
        let mut w = PollWindow::new(50);
        let t = Instant::now();
        w.after(3, || t);
        assert!(w.polling());
        assert_eq!(w.to_wait(|| t + 10 * US), 0);
        assert_eq!(w.to_wait(|| t + 49 * US), 0);
        // Passes that find nothing do not extend it.
        w.after(0, || t + 49 * US);
        assert_eq!(w.to_wait(|| t + 50 * US), 1);
        assert!(!w.polling());
        assert_eq!(w.to_wait(|| t + 51 * US), 1);
    }

    #[test]
    fn each_request_served_extends_the_window() {
        let mut w = PollWindow::new(50);
        let t = Instant::now();
        w.after(1, || t);
        w.after(1, || t + 40 * US);
        assert_eq!(w.to_wait(|| t + 80 * US), 0);
        assert_eq!(w.to_wait(|| t + 90 * US), 1);
    }

    #[test]
    fn a_zero_budget_never_polls() {
        let mut w = PollWindow::new(0);
        let t = Instant::now();
        w.after(8, || t);
        assert!(!w.polling());
        assert_eq!(w.to_wait(|| t), 1);
    }
}
