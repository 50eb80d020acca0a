//! The idle policy: what zram leaves to cron jobs, run by the daemon on
//! its own thread. With `--recompress-idle-after R` it recompresses, with
//! the store's secondary algorithms in priority order, the pages not
//! accessed for R seconds;
//! with `--writeback-idle-after W` it writes back to the backing device the
//! pages not accessed for W seconds. Both are off (0) by default.
//!
//! Each [`Timing::tick`] the thread reads the queues' request counters; a
//! round is due every [`Timing::round_every`]. A round due while the
//! device served more than [`Timing::busy_rps`] requests per second over
//! the last tick is skipped (and tried again at the next tick). Why that
//! measure: it is this device's own swap traffic, the very thing a round
//! must not slow down, and it costs one relaxed atomic load per queue;
//! PSI would say the whole system is short of memory, which rises with
//! swap to any device, and it is missing where cgroups hide it.
//!
//! A round re-marks the idle pages for its threshold
//! (`Store::remark_idle`: exactly the pages that old, so that the marks
//! of the smaller threshold do not select pages for the larger one; the
//! policy owns the idle marks while it is on), recompresses or writes
//! back at most as many pages as the [`Budget`] allows (a token bucket of
//! [`Timing::rate`] pages per second, at most [`Timing::max_pages`] per
//! round), then compacts as the manual commands do. A round holds the
//! device's maintenance lock ([`Queues::maintenance`]), so it never
//! interleaves with a manual `compact`, `idle`, `recompress` or
//! `writeback` (the engine already runs its own jobs one at a time; the
//! lock keeps a round's marking and processing together).

use crate::config::DeviceConfig;
use crate::queue::Queues;
use serde::Serialize;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use zblk::{Algo, AlgoList, Recompress, RecompressType, Store, Writeback, WritebackType};

/// The oldest idle age slots can tell (access times are kept in 24 bits
/// of seconds, `src/slot.rs`: 194 days).
const MAX_AGE_SECS: u64 = (1 << 24) - 1;

/// How often the policy looks at the queues' counters, and how finely it
/// measures "busy".
pub const TICK: Duration = Duration::from_secs(1);

/// Least time between two rounds: a round scans the whole slot table once
/// per threshold (a 16 GiB device has 4M slots), so not every tick.
pub const ROUND_EVERY: Duration = Duration::from_secs(10);

/// Requests per second (all queues together) above which the device is
/// busy and a round waits. Swap-in storms run at thousands per second; a
/// quiet desktop's swap stays well under this.
pub const BUSY_RPS: u64 = 100;

/// Pages per second the policy processes (recompresses and writes back
/// together) on average: 1 MiB/s of pages, a few percent of one core at
/// zstd's speed and of a disk's write bandwidth.
pub const RATE_PAGES_PER_SEC: u64 = 256;

/// Pages one round processes at most (8 MiB), the budget's burst.
pub const MAX_PAGES_PER_ROUND: u64 = 2048;

/// How the policy paces itself; [`Timing::default`] is the documented
/// constants, tests use faster ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// How often the counters are read.
    pub tick: Duration,
    /// Least time between rounds.
    pub round_every: Duration,
    /// Requests per second above which a round is skipped.
    pub busy_rps: u64,
    /// Pages per second on average.
    pub rate: u64,
    /// Pages per round at most.
    pub max_pages: u64,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            tick: TICK,
            round_every: ROUND_EVERY,
            busy_rps: BUSY_RPS,
            rate: RATE_PAGES_PER_SEC,
            max_pages: MAX_PAGES_PER_ROUND,
        }
    }
}

/// Whether `served` requests over `elapsed` are more than `busy_rps`
/// requests per second.
pub fn is_busy(served: u64, elapsed: Duration, busy_rps: u64) -> bool {
    // An empty interval counts as a millisecond: a burst in it is busy.
    let ms = elapsed.as_millis().max(1);
    u128::from(served) * 1000 > u128::from(busy_rps) * ms
}

/// A token bucket of pages: `rate` per second, at most `cap` saved up.
/// The clock is passed in, so that tests need not sleep.
#[derive(Debug, Clone)]
pub struct Budget {
    rate: u64,
    cap: u64,
    /// Thousandths of a page, so that short intervals are not lost.
    milli: u128,
    last: Instant,
}

impl Budget {
    /// An empty bucket at `now`: the first round waits for its pages, so a
    /// daemon that just started does not burst.
    pub fn new(rate: u64, cap: u64, now: Instant) -> Self {
        Budget {
            rate,
            cap,
            milli: 0,
            last: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let ms = now.saturating_duration_since(self.last).as_millis();
        self.last = now.max(self.last);
        let full = u128::from(self.cap) * 1000;
        self.milli = (self.milli + u128::from(self.rate) * ms).min(full);
    }

    /// Takes up to `want` pages at `now`; returns how many it got.
    pub fn take(&mut self, now: Instant, want: u64) -> u64 {
        self.refill(now);
        let n = u64::try_from(self.milli / 1000)
            .unwrap_or(u64::MAX)
            .min(want);
        self.milli -= u128::from(n) * 1000;
        n
    }

    /// Returns `n` pages a round took but did not use.
    pub fn give_back(&mut self, n: u64) {
        let full = u128::from(self.cap) * 1000;
        self.milli = (self.milli + u128::from(n) * 1000).min(full);
    }
}

/// The policy's settings (0: that half is off).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Settings {
    /// Recompress pages not accessed for this many seconds.
    pub recompress_idle_after: u64,
    /// Write back pages not accessed for this many seconds.
    pub writeback_idle_after: u64,
    /// The secondary algorithms, in priority order (none: the store's).
    pub recompress_algo: Option<AlgoList>,
}

/// The settings as the store keeps them for a recovering daemon
/// (`Store::set_owner_note`), so that a `zblk set` outlives the daemon.
#[derive(Debug, Serialize, serde::Deserialize)]
struct Note {
    policy: NotedSettings,
}

#[derive(Debug, Serialize, serde::Deserialize)]
struct NotedSettings {
    recompress_idle_after: u64,
    writeback_idle_after: u64,
    recompress_algo: Option<String>,
}

impl Settings {
    /// The settings a device was made with.
    pub fn of(cfg: &DeviceConfig) -> Self {
        Settings {
            recompress_idle_after: cfg.recompress_idle_after,
            writeback_idle_after: cfg.writeback_idle_after,
            recompress_algo: cfg.recompress_algo,
        }
    }

    /// The settings a recovered device runs with: those its last daemon
    /// kept with the store (a `zblk set` since the device was made), else
    /// those it was made with.
    pub fn recovered(cfg: &DeviceConfig, store: &Store) -> Self {
        let Some(note) = store.owner_note() else {
            return Settings::of(cfg);
        };
        match Settings::from_note(&note) {
            Ok(s) => s,
            Err(e) => {
                log::warn!("the store's note of the idle policy is unreadable ({e}): using the device's settings");
                Settings::of(cfg)
            }
        }
    }

    /// The note [`Settings::recovered`] reads.
    pub fn to_note(self) -> String {
        let n = Note {
            policy: NotedSettings {
                recompress_idle_after: self.recompress_idle_after,
                writeback_idle_after: self.writeback_idle_after,
                recompress_algo: self.recompress_algo.map(|a| a.to_string()),
            },
        };
        serde_json::to_string(&n).unwrap_or_default()
    }

    fn from_note(note: &str) -> Result<Self, String> {
        let n: Note = serde_json::from_str(note).map_err(|e| e.to_string())?;
        let p = n.policy;
        Ok(Settings {
            recompress_idle_after: p.recompress_idle_after,
            writeback_idle_after: p.writeback_idle_after,
            recompress_algo: p.recompress_algo.map(|a| a.parse()).transpose()?,
        })
    }

    /// Whether either half is on.
    pub fn is_on(&self) -> bool {
        self.recompress_idle_after > 0 || self.writeback_idle_after > 0
    }

    /// The algorithms recompression would try on `store`, in order.
    fn algos(&self, store: &Store) -> Option<AlgoList> {
        self.recompress_algo
            .or_else(|| AlgoList::new(&store.secondary_algos()).ok())
    }

    /// Checks the settings against `store`; says in one line why not.
    pub fn check(&self, store: &Store) -> Result<(), String> {
        let cfg = store.config();
        for (name, age) in [
            ("recompress-idle-after", self.recompress_idle_after),
            ("writeback-idle-after", self.writeback_idle_after),
        ] {
            if age > MAX_AGE_SECS {
                return Err(format!(
                    "--{name} {age} is past what slots keep ({MAX_AGE_SECS} s, 194 days)"
                ));
            }
        }
        if self.writeback_idle_after > 0 && cfg.backing.is_none() {
            return Err("--writeback-idle-after needs a backing device: \
                        create the device with --backing-dev PATH"
                .into());
        }
        if self.recompress_idle_after > 0 {
            self.check_algo(store)?;
        }
        Ok(())
    }

    /// Checks that recompression has algorithms the store accepts.
    fn check_algo(&self, store: &Store) -> Result<(), String> {
        let Some(list) = self.algos(store) else {
            return Err("--recompress-idle-after needs --recompress-algos ALGOS: \
                        this device has no secondary algorithm yet"
                .into());
        };
        check_list(store, &list)
    }
}

/// Checks that `store` can take `list` as (some of) its secondary
/// algorithms: none is its primary, and with those it has, there are at
/// most `MAX_SECONDARIES`.
pub fn check_list(store: &Store, list: &AlgoList) -> Result<(), String> {
    let primary = store.config().algo;
    if list.as_slice().contains(&primary) {
        return Err(format!(
            "--recompress-algos must not name the device's algorithm ({primary})"
        ));
    }
    let mut all = store.secondary_algos();
    let had = AlgoList::new(&all).map(|l| l.to_string());
    let new: Vec<Algo> = list
        .as_slice()
        .iter()
        .copied()
        .filter(|a| !all.contains(a))
        .collect();
    all.extend(new);
    if all.len() > zblk::MAX_SECONDARIES {
        return Err(format!(
            "this device's secondary algorithms are {} (recorded by its recompressions) \
             and it has room for {}: name those",
            had.unwrap_or_default(),
            zblk::MAX_SECONDARIES
        ));
    }
    Ok(())
}

impl Settings {
    /// Records the list (if set) as the store's secondary algorithms, so
    /// that slots name them in its order; after [`Settings::check`].
    pub fn record(&self, store: &Store) -> Result<(), String> {
        match &self.recompress_algo {
            Some(list) => store
                .set_secondaries(list.as_slice())
                .map_err(|e| e.to_string()),
            None => Ok(()),
        }
    }
}

/// What `zblk set` changes (none: keep).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Update {
    /// New recompression age.
    pub recompress_idle_after: Option<u64>,
    /// New writeback age.
    pub writeback_idle_after: Option<u64>,
    /// New secondary algorithms.
    pub recompress_algo: Option<AlgoList>,
}

/// The policy's settings and counters as `stat` shows them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Report {
    /// Seconds of no access after which pages are recompressed (0: off).
    pub recompress_idle_after: u64,
    /// Seconds of no access after which pages are written back (0: off).
    pub writeback_idle_after: u64,
    /// The secondary algorithms it recompresses with, in priority order,
    /// separated by spaces (empty: none yet).
    pub recompress_algo: String,
    /// Pages per second it processes on average.
    pub rate_pages_per_sec: u64,
    /// Pages it processes per round at most.
    pub max_pages_per_round: u64,
    /// Requests per second above which it skips a round.
    pub busy_requests_per_sec: u64,
    /// Rounds run.
    pub rounds: u64,
    /// Rounds skipped because the device was busy.
    pub rounds_skipped_busy: u64,
    /// Pages it recompressed.
    pub recompressed_pages: u64,
    /// Pages it wrote back.
    pub written_back_pages: u64,
    /// Rounds the engine refused (logged).
    pub errors: u64,
}

/// One device's policy: settings, pacing and counters, shared by the
/// policy thread and the control loop.
pub struct Policy {
    settings: Mutex<Settings>,
    timing: Timing,
    rounds: AtomicU64,
    skipped_busy: AtomicU64,
    recompressed: AtomicU64,
    written_back: AtomicU64,
    errors: AtomicU64,
}

impl Policy {
    /// A policy with `settings`, paced by `timing`.
    pub fn new(settings: Settings, timing: Timing) -> Self {
        Policy {
            settings: Mutex::new(settings),
            timing,
            rounds: AtomicU64::new(0),
            skipped_busy: AtomicU64::new(0),
            recompressed: AtomicU64::new(0),
            written_back: AtomicU64::new(0),
            errors: AtomicU64::new(0),
        }
    }

    /// The settings now.
    pub fn settings(&self) -> Settings {
        *self.settings.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The algorithms a recompression tries on `store`, in order: the
    /// list set (`--recompress-algos`), else the store's.
    pub fn algos(&self, store: &Store) -> Option<AlgoList> {
        self.settings().algos(store)
    }

    /// Applies `u` if the result passes [`Settings::check`] on `store`,
    /// and keeps it with the store for a daemon that recovers it; returns
    /// the new settings, or why not in one line.
    pub fn set(&self, store: &Store, u: Update) -> Result<Settings, String> {
        let mut cur = self.settings.lock().unwrap_or_else(|e| e.into_inner());
        let new = Settings {
            recompress_idle_after: u.recompress_idle_after.unwrap_or(cur.recompress_idle_after),
            writeback_idle_after: u.writeback_idle_after.unwrap_or(cur.writeback_idle_after),
            recompress_algo: u.recompress_algo.or(cur.recompress_algo),
        };
        new.check(store)?;
        if u.recompress_algo.is_some() {
            new.record(store)?;
        }
        *cur = new;
        // Kept with the store, so that a recovered daemon goes on with it.
        if let Err(e) = store.set_owner_note(&new.to_note()) {
            log::warn!("the idle policy will not outlive this daemon: {e}");
        }
        Ok(new)
    }

    /// Settings and counters, for `stat`.
    pub fn report(&self, store: &Store) -> Report {
        let s = self.settings();
        Report {
            recompress_idle_after: s.recompress_idle_after,
            writeback_idle_after: s.writeback_idle_after,
            recompress_algo: s.algos(store).map(|l| l.to_string()).unwrap_or_default(),
            rate_pages_per_sec: self.timing.rate,
            max_pages_per_round: self.timing.max_pages,
            busy_requests_per_sec: self.timing.busy_rps,
            rounds: self.rounds.load(Relaxed),
            rounds_skipped_busy: self.skipped_busy.load(Relaxed),
            recompressed_pages: self.recompressed.load(Relaxed),
            written_back_pages: self.written_back.load(Relaxed),
            errors: self.errors.load(Relaxed),
        }
    }

    /// Runs one round with at most `budget` pages; returns the pages used.
    pub fn round(&self, queues: &Queues, budget: u64) -> u64 {
        let s = self.settings();
        let _one_job = queues.maintenance();
        let store = queues.store();
        let r = self.process(store, &s, budget);
        self.rounds.fetch_add(1, Relaxed);
        let (used, changed) = match r {
            Ok(r) => r,
            Err(e) => {
                self.errors.fetch_add(1, Relaxed);
                log::warn!("idle policy: {e}");
                (budget, false)
            }
        };
        if changed {
            // As after a manual recompress or writeback: the freed objects
            // are all over their zspages, which only compaction gives back.
            queues.flush_all();
            store.compact();
        }
        used
    }

    /// Recompression, then writeback, within `budget` pages; returns the
    /// pages used and whether any page moved.
    fn process(&self, store: &Store, s: &Settings, budget: u64) -> zblk::Result<(u64, bool)> {
        let (mut used, mut changed) = (0, false);
        if let (true, Some(list)) = (s.recompress_idle_after > 0, s.algos(store)) {
            store.remark_idle(s.recompress_idle_after)?;
            // Known limit: the engine walks pages from the first, and a
            // compressed page no secondary shrank by 5 % or more is
            // not marked (only huge ones are, as incompressible), so such
            // pages are tried again each round and use its budget first.
            let r = store.recompress(&Recompress {
                algos: list.as_slice().to_vec(),
                kind: RecompressType::Idle,
                threshold: 0,
                max_pages: budget,
                pages: Vec::new(),
            })?;
            used += r.tried;
            changed |= r.recompressed > 0;
            self.recompressed.fetch_add(r.recompressed, Relaxed);
        }
        if s.writeback_idle_after > 0 && used < budget {
            store.remark_idle(s.writeback_idle_after)?;
            let r = store.writeback(&Writeback {
                select: WritebackType::Idle.into(),
                limit: budget - used,
            })?;
            used += r.selected;
            changed |= r.written > 0;
            self.written_back.fetch_add(r.written, Relaxed);
        }
        Ok((used.min(budget), changed))
    }
}

/// Starts the policy thread of `queues`; it ends soon after `stop` is set.
pub fn spawn(
    queues: Arc<Queues>,
    policy: Arc<Policy>,
    stop: Arc<AtomicBool>,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("zblk-policy".into())
        .spawn(move || run(&queues, &policy, &stop))
}

/// Sleeps `d` in short steps; false if `stop` was set meanwhile.
fn sleep_unless_stopped(d: Duration, stop: &AtomicBool) -> bool {
    let step = Duration::from_millis(50);
    let t0 = Instant::now();
    while t0.elapsed() < d {
        if stop.load(Relaxed) {
            return false;
        }
        std::thread::sleep(step.min(d.saturating_sub(t0.elapsed())));
    }
    !stop.load(Relaxed)
}

/// The policy thread's loop: one look at the counters per tick, a round
/// when one is due, the device is quiet and the budget has pages.
fn run(queues: &Queues, policy: &Policy, stop: &AtomicBool) {
    let t = policy.timing;
    let mut budget = Budget::new(t.rate, t.max_pages, Instant::now());
    let (mut then, mut served) = (Instant::now(), queues.served_total());
    let mut last_round = Instant::now();
    while sleep_unless_stopped(t.tick, stop) {
        let now = Instant::now();
        let total = queues.served_total();
        let busy = is_busy(total.saturating_sub(served), now - then, t.busy_rps);
        (then, served) = (now, total);
        if !policy.settings().is_on() || now - last_round < t.round_every {
            continue;
        }
        if busy {
            policy.skipped_busy.fetch_add(1, Relaxed);
            continue;
        }
        let pages = budget.take(now, t.max_pages);
        if pages == 0 {
            continue;
        }
        let used = policy.round(queues, pages);
        budget.give_back(pages - used);
        last_round = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zblk::Mode;

    #[test]
    fn busy_is_requests_per_second_over_the_tick() {
        let s = Duration::from_secs(1);
        assert!(!is_busy(0, s, 100));
        assert!(!is_busy(100, s, 100), "at the threshold: not busy");
        assert!(is_busy(101, s, 100));
        assert!(!is_busy(150, 2 * s, 100), "75/s");
        assert!(is_busy(30, Duration::from_millis(100), 100), "300/s");
        assert!(is_busy(1, Duration::ZERO, 100), "a burst in no time");
        assert!(!is_busy(0, Duration::ZERO, 0));
        assert!(is_busy(u64::MAX, s, u64::MAX - 1), "no overflow");
    }

    #[test]
    fn the_budget_refills_at_its_rate_up_to_its_cap() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut b = Budget::new(100, 50, t0);
        assert_eq!(b.take(t0, 10), 0, "starts empty");
        assert_eq!(b.take(t0 + ms(100), 100), 10, "100/s for 0.1 s");
        assert_eq!(b.take(t0 + ms(100), 100), 0, "spent");
        assert_eq!(b.take(t0 + ms(115), 100), 1, "1.5 pages: one now");
        assert_eq!(b.take(t0 + ms(120), 100), 1, "the half is kept");
        assert_eq!(b.take(t0 + ms(10_000), 100), 50, "capped");
        assert_eq!(b.take(t0 + ms(10_200), 5), 5, "at most what is asked");
        assert_eq!(b.take(t0 + ms(10_200), 100), 15);
        b.give_back(7);
        assert_eq!(b.take(t0 + ms(10_200), 100), 7, "unused pages return");
        b.give_back(1000);
        assert_eq!(b.take(t0 + ms(10_200), 1000), 50, "returns are capped");
        assert_eq!(b.take(t0, 10), 0, "a clock going back adds nothing");
    }

    #[test]
    fn settings_round_trip_through_the_store_note() {
        let s = Settings {
            recompress_idle_after: 60,
            writeback_idle_after: 3600,
            recompress_algo: Some(AlgoList::one(Algo::Zstd(9))),
        };
        assert_eq!(Settings::from_note(&s.to_note()), Ok(s));
        let off = Settings::default();
        assert_eq!(Settings::from_note(&off.to_note()), Ok(off));
        assert!(Settings::from_note("{}").is_err());
        assert!(Settings::from_note(
            r#"{"policy":{"recompress_idle_after":1,"writeback_idle_after":0,"recompress_algo":"zz"}}"#
        )
        .is_err());
    }

    #[test]
    fn a_packed_device_takes_the_recompression_and_writeback_policies() {
        let (_dir, bd) = crate::testing::backing_file(1 << 20);
        let mut cfg = zblk::StoreConfig::new(1 << 20);
        cfg.mode = Mode::Packed;
        cfg.backing = Some(bd);
        let store = Store::new(cfg).expect("a small heap store");
        let recompress = Settings {
            recompress_idle_after: 60,
            writeback_idle_after: 0,
            recompress_algo: Some(AlgoList::one(Algo::Zstd(9))),
        };
        assert_eq!(recompress.check(&store), Ok(()));
        let writeback = Settings {
            writeback_idle_after: 60,
            ..recompress
        };
        assert_eq!(writeback.check(&store), Ok(()), "packed groups write back");
    }
}
