//! Compression workers: a request's groups compressed (or decoded) on
//! several cores at once.
//!
//! A store made with `StoreConfig::compress_workers` N > 0 keeps a pool of
//! N threads ([`Workers`]), each with a thread state of its own
//! (`CtxState`: codec, scratch, plan, statistics shard, free batch), made
//! with the store, faulted in on the worker's own thread before it waits
//! for work, as a queue thread's is. Each queue context owns one [`Job`],
//! reused by all of its requests.
//!
//! A request of more than one group ([`Workers::run`]) publishes its
//! parameters in its job, hands the job to as many *idle* workers as it
//! has groups beyond the first (a worker that is busy is never waited for
//! nor woken: a wake-up of a core that runs the workload only adds cost),
//! and then works through the groups itself. Every group, on the queue
//! thread or on a worker, is **claimed** first, with one compare-and-swap
//! on the job's claim word (generation, group count, next group), so each
//! group runs exactly once, and only a claimed group is ever waited for:
//! a worker that never wakes up, or wakes up late, claims nothing (its
//! generation is gone) and delays nothing; a worker that stalls in a group
//! delays that group alone. When no group is left to claim, the queue
//! thread waits (a short spin, then a futex) until every claimed group is
//! done, and returns the first failing group's error, if any.
//!
//! A worker that panics in a group (its thread then ends) hands the group
//! back as *abandoned*: the queue thread runs it again itself, so a
//! request is never lost nor wedged by a worker's death.
//!
//! No slot state is new: a request is complete only when every group is
//! installed (`write::write_group`, with its crash points, on whichever
//! thread claimed it), exactly as on one thread.

use crate::config::StoreConfig;
use crate::ctx::CtxState;
use crate::error::{Error, Result};
use crate::page::PAGE_SIZE;
use crate::stats::{Counter, StatsShard};
use crate::table::SlotTable;
use crossbeam_queue::ArrayQueue;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};
use std::sync::atomic::{
    AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize,
};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

/// How long a queue thread spins for the groups workers hold before it
/// sleeps on a futex: a group of lz4 takes tens of microseconds, a futex
/// sleep and wake a few of CPU on each side, and a sleeping core may take
/// longer than that to come back.
const SPIN: Duration = Duration::from_micros(5);

/// Most groups one request may fan out: the claim word keeps the count in
/// 16 bits (a larger request runs on its queue thread alone).
const MAX_JOB_GROUPS: usize = u16::MAX as usize;

/// The operation a job runs over its groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum JobOp {
    /// Compress and install each group (`write::write_group`).
    Write = 0,
    /// Read each page of each group (`read::read_page`).
    Read = 1,
}

/// One queue context's request as its groups' claimers see it; reused by
/// every request of that context, generation after generation.
pub(crate) struct Job {
    /// The generation (top 32 bits), the group count (16) and the next
    /// group to claim (16): a claim succeeds only for its generation and
    /// while groups are left.
    claim: AtomicU64,
    /// Groups of this generation done (run, failed or skipped); the futex
    /// word the queue thread sleeps on.
    done: AtomicU32,
    /// Whether the queue thread sleeps (or is about to) on `done`.
    waiting: AtomicBool,
    /// A group failed: groups claimed afterwards are skipped.
    failed: AtomicBool,
    /// The request's parameters, written by the queue thread before it
    /// publishes a generation and read by claimers after a claim: see
    /// [`Params`].
    op: AtomicU8,
    table: AtomicPtr<SlotTable>,
    cfg: AtomicPtr<StoreConfig>,
    data: AtomicPtr<u8>,
    len: AtomicUsize,
    first: AtomicU64,
    now: AtomicU32,
    /// The first failing group (lowest index) and its error.
    error: Mutex<Option<(usize, Error)>>,
    /// Groups whose worker died in them, for the queue thread to redo.
    abandoned: Mutex<Vec<usize>>,
}

/// A job's parameters, as a claimer reads them after a successful claim.
#[derive(Clone, Copy)]
struct Params {
    op: JobOp,
    table: *const SlotTable,
    cfg: *const StoreConfig,
    data: *mut u8,
    len: usize,
    first: u64,
    now: u32,
}

impl Default for Job {
    fn default() -> Self {
        Job {
            claim: AtomicU64::new(0),
            done: AtomicU32::new(0),
            waiting: AtomicBool::new(false),
            failed: AtomicBool::new(false),
            op: AtomicU8::new(JobOp::Write as u8),
            table: AtomicPtr::new(std::ptr::null_mut()),
            cfg: AtomicPtr::new(std::ptr::null_mut()),
            data: AtomicPtr::new(std::ptr::null_mut()),
            len: AtomicUsize::new(0),
            first: AtomicU64::new(0),
            now: AtomicU32::new(0),
            error: Mutex::new(None),
            abandoned: Mutex::new(Vec::new()),
        }
    }
}

impl Job {
    /// Publishes a new generation of `groups` groups with `p`; returns the
    /// generation. Called by the queue thread only once the previous
    /// generation has no claimable group and every claimed one is done.
    fn publish(&self, p: &Params, groups: usize) -> u32 {
        self.op.store(p.op as u8, Relaxed);
        self.table.store(p.table.cast_mut(), Relaxed);
        self.cfg.store(p.cfg.cast_mut(), Relaxed);
        self.data.store(p.data, Relaxed);
        self.len.store(p.len, Relaxed);
        self.first.store(p.first, Relaxed);
        self.now.store(p.now, Relaxed);
        self.done.store(0, Relaxed);
        self.failed.store(false, Relaxed);
        let gen = ((self.claim.load(Relaxed) >> 32) as u32).wrapping_add(1);
        // Release: a claimer whose claim reads this word (or a later claim
        // of the same generation: a release sequence) sees the parameters.
        self.claim
            .store(u64::from(gen) << 32 | (groups as u64) << 16, Release);
        gen
    }

    /// Claims the next group of generation `gen`, if any is left.
    fn claim(&self, gen: u32) -> Option<usize> {
        let mut cur = self.claim.load(Acquire);
        loop {
            let (g, groups, next) = (cur >> 32, (cur >> 16) & 0xffff, cur & 0xffff);
            if g != u64::from(gen) || next >= groups {
                return None;
            }
            match self
                .claim
                .compare_exchange_weak(cur, cur + 1, Acquire, Acquire)
            {
                Ok(_) => return Some(next as usize),
                Err(now) => cur = now,
            }
        }
    }

    /// The parameters of the generation the caller has claimed a group of.
    fn params(&self) -> Params {
        let op = if self.op.load(Relaxed) == JobOp::Read as u8 {
            JobOp::Read
        } else {
            JobOp::Write
        };
        Params {
            op,
            table: self.table.load(Relaxed),
            cfg: self.cfg.load(Relaxed),
            data: self.data.load(Relaxed),
            len: self.len.load(Relaxed),
            first: self.first.load(Relaxed),
            now: self.now.load(Relaxed),
        }
    }

    /// Records group `i`'s failure: the lowest failing group's error is
    /// the request's.
    fn fail(&self, i: usize, e: Error) {
        self.failed.store(true, Relaxed);
        let mut slot = self.error.lock().unwrap_or_else(|p| p.into_inner());
        if !slot.as_ref().is_some_and(|(j, _)| *j < i) {
            *slot = Some((i, e));
        }
    }

    /// Counts one claimed group of a generation of `groups` done and wakes
    /// the queue thread when it was the last. After this the caller may
    /// touch nothing the request lent (its data, the store): only the job
    /// itself, which its `Arc` keeps.
    fn finish_one(&self, groups: u32) {
        // SeqCst with the waiter's store of `waiting` and load of `done`:
        // either it sees this count, or this sees it waiting.
        let d = self.done.fetch_add(1, SeqCst) + 1;
        if d == groups && self.waiting.load(SeqCst) {
            futex_wake(&self.done);
        }
    }

    /// Waits until `groups` groups are done: spins for [`SPIN`], then
    /// sleeps on the futex.
    fn wait_done(&self, groups: u32) {
        let t0 = Instant::now();
        while self.done.load(Acquire) != groups {
            if t0.elapsed() < SPIN {
                std::hint::spin_loop();
                continue;
            }
            self.waiting.store(true, SeqCst);
            let d = self.done.load(SeqCst);
            if d != groups {
                futex_wait(&self.done, d);
            }
            self.waiting.store(false, Relaxed);
        }
    }

    /// The groups workers abandoned in this generation (normally none).
    fn take_abandoned(&self) -> Vec<usize> {
        std::mem::take(&mut *self.abandoned.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// The request's result once every group is done.
    fn take_result(&self) -> Result<()> {
        match self.error.lock().unwrap_or_else(|p| p.into_inner()).take() {
            Some((_, e)) => Err(e),
            None => Ok(()),
        }
    }
}

/// Runs group `i` of a request with parameters `p` on the calling thread.
///
/// # Safety
/// The caller holds a claim on group `i` of the generation `p` was
/// published with, not yet counted done: the queue thread that published
/// it has not returned from [`Workers::run`] (it waits for every claimed
/// group), so the store (`table`, `cfg`) and the request's buffer (`data`,
/// `len`) are alive, and no other thread touches group `i`'s bytes.
unsafe fn run_group(p: &Params, st: &mut CtxState, i: usize) -> Result<()> {
    // SAFETY: the caller's contract: the queue thread holds the store (its
    // `Arc`) for the whole request.
    let (table, cfg) = unsafe { (&*p.table, &*p.cfg) };
    let g = cfg.group_pages;
    let start = (i * g * PAGE_SIZE).min(p.len);
    let end = (start + g * PAGE_SIZE).min(p.len);
    let first = p.first + (i * g) as u64;
    st.now = p.now;
    match p.op {
        JobOp::Write => {
            // SAFETY: `data..data + len` is the request's buffer, alive
            // for the request (the caller's contract) and only read.
            let data = unsafe { std::slice::from_raw_parts(p.data.add(start), end - start) };
            crate::write::write_group(table, cfg, st, first, data)
        }
        JobOp::Read => {
            // SAFETY: as above; the bytes of group `i` are written by its
            // claimer alone (groups do not overlap, each is claimed once),
            // and the queue thread reads its buffer only after every
            // group is done.
            let buf = unsafe { std::slice::from_raw_parts_mut(p.data.add(start), end - start) };
            for (k, out) in buf.chunks_exact_mut(PAGE_SIZE).enumerate() {
                crate::read::read_page(table, st, first + k as u64, out)?;
            }
            Ok(())
        }
    }
}

/// What a worker's mailbox holds: a job and the generation it is for.
struct Posted {
    job: Arc<Job>,
    gen: u32,
}

/// One worker as the pool sees it.
struct Slot {
    /// The job handed to this worker while it was idle.
    mailbox: Mutex<Option<Posted>>,
    /// The worker's thread, to wake it.
    thread: OnceLock<Thread>,
    /// Its statistics shard (merged into the store's).
    shard: Arc<StatsShard>,
    /// Its thread id, once started (tests look at its faults).
    tid: AtomicI32,
}

/// What the queue threads and the workers share.
struct Pool {
    /// Workers parked with an empty mailbox: a queue thread that pops one
    /// owns its mailbox until the worker takes the job.
    idle: ArrayQueue<usize>,
    slots: Box<[Slot]>,
    stop: AtomicBool,
    /// Tests: workers given a job wait before they claim anything.
    #[cfg(feature = "test-support")]
    paused: AtomicBool,
    /// Tests: the next group a worker claims panics.
    #[cfg(feature = "test-support")]
    panic_next: AtomicBool,
}

/// A store's compression workers.
pub(crate) struct Workers {
    pool: Arc<Pool>,
    threads: Vec<JoinHandle<()>>,
}

impl Workers {
    /// Starts one worker per state in `states` (each made for this store,
    /// with its own shard); `None` if none could be started (logged).
    pub(crate) fn start(states: Vec<CtxState>) -> Option<Workers> {
        let n = states.len();
        if n == 0 {
            return None;
        }
        let slots = states
            .iter()
            .map(|st| Slot {
                mailbox: Mutex::new(None),
                thread: OnceLock::new(),
                shard: st.shard.clone(),
                tid: AtomicI32::new(0),
            })
            .collect();
        let pool = Arc::new(Pool {
            idle: ArrayQueue::new(n),
            slots,
            stop: AtomicBool::new(false),
            #[cfg(feature = "test-support")]
            paused: AtomicBool::new(false),
            #[cfg(feature = "test-support")]
            panic_next: AtomicBool::new(false),
        });
        let mut threads = Vec::with_capacity(n);
        for (id, st) in states.into_iter().enumerate() {
            let p = pool.clone();
            match std::thread::Builder::new()
                .name(format!("zblk-compress{id}"))
                .spawn(move || worker_loop(&p, id, st))
            {
                Ok(t) => threads.push(t),
                Err(e) => log::error!("cannot start compression worker {id}: {e}"),
            }
        }
        (!threads.is_empty()).then_some(Workers { pool, threads })
    }

    /// The workers' statistics shards.
    pub(crate) fn shards(&self) -> impl Iterator<Item = &Arc<StatsShard>> {
        self.pool.slots.iter().map(|s| &s.shard)
    }

    /// Runs `op` over the request of `len` bytes at `data` (pages from
    /// `first`) with `job`, its groups shared with the idle workers; `None`
    /// (nothing done) when the request has one group or no worker is
    /// idle: the caller then runs it alone, as without workers.
    ///
    /// # Safety
    /// `data..data + len` is the request's buffer, valid (and, for a read,
    /// writable and not otherwise accessed) until this returns; `table` and
    /// `cfg` are the store's, alive until this returns; `job` is the
    /// calling context's own, run by one thread at a time.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn run(
        &self,
        job: &Arc<Job>,
        op: JobOp,
        table: &SlotTable,
        cfg: &StoreConfig,
        st: &mut CtxState,
        first: u64,
        data: *mut u8,
        len: usize,
    ) -> Option<Result<()>> {
        let groups = len.div_ceil(cfg.group_pages * PAGE_SIZE);
        if !(2..=MAX_JOB_GROUPS).contains(&groups) || self.pool.idle.is_empty() {
            return None;
        }
        let p = Params {
            op,
            table,
            cfg,
            data,
            len,
            first,
            now: st.now,
        };
        let gen = job.publish(&p, groups);
        self.pool.hand_out(job, gen, groups - 1);
        {
            // Waits for every group when dropped, even if a group of ours
            // panics: see `Drain` for why the borrows end there.
            let _drain = Drain {
                job,
                gen,
                groups: groups as u32,
            };
            while let Some(i) = job.claim(gen) {
                run_claimed(job, &p, st, i);
            }
        }
        for i in job.take_abandoned() {
            // SAFETY: the abandoning worker's claim was counted done after
            // its thread stopped touching the group: the group is ours.
            if let Err(e) = unsafe { run_group(&p, st, i) } {
                job.fail(i, e);
            }
        }
        Some(job.take_result())
    }
}

/// The end of a request's fan-out: when dropped (returning or unwinding)
/// it claims and skips whatever group is left, then waits until every
/// group of the generation is done.
///
/// SAFETY of the workers' borrows (see `run_group`): a worker touches the
/// request's buffer and the store only while it holds a claim, and counts
/// the claim done (`Job::finish_one`) after its last touch. Once every
/// group is claimed no claim of this generation can be made any more (the
/// claim word says none is left, and only the next generation, published
/// by this same thread, changes it); once `done` counts every group none
/// is held. So when this drop returns, no worker touches the request's
/// memory nor will, and [`Workers::run`] may return and its caller free
/// or reuse the buffer.
struct Drain<'a> {
    job: &'a Job,
    gen: u32,
    groups: u32,
}

impl Drop for Drain<'_> {
    fn drop(&mut self) {
        while self.job.claim(self.gen).is_some() {
            self.job.failed.store(true, Relaxed);
            self.job.finish_one(self.groups);
        }
        self.job.wait_done(self.groups);
    }
}

/// Runs claimed group `i` on the queue thread and counts it done.
fn run_claimed(job: &Job, p: &Params, st: &mut CtxState, i: usize) {
    let _claim = Claim {
        job,
        index: i,
        groups: groups_of(job),
    };
    if !job.failed.load(Relaxed) {
        // SAFETY: `_claim` holds group `i` and we are the thread that
        // published `p`, inside `Workers::run`.
        if let Err(e) = unsafe { run_group(p, st, i) } {
            job.fail(i, e);
        }
    }
}

/// The group count of the job's current generation.
fn groups_of(job: &Job) -> u32 {
    ((job.claim.load(Relaxed) >> 16) & 0xffff) as u32
}

impl Pool {
    /// Hands `job`'s generation `gen` to at most `most` idle workers.
    fn hand_out(&self, job: &Arc<Job>, gen: u32, most: usize) {
        for _ in 0..most {
            let Some(id) = self.idle.pop() else {
                return;
            };
            let slot = &self.slots[id];
            *slot.mailbox.lock().unwrap_or_else(|p| p.into_inner()) = Some(Posted {
                job: job.clone(),
                gen,
            });
            if let Some(t) = slot.thread.get() {
                t.unpark();
            }
        }
    }

    /// Takes the job posted to worker `id`, if any.
    fn take_posted(&self, id: usize) -> Option<Posted> {
        self.slots[id]
            .mailbox
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    /// Tests: waits while workers are paused.
    #[cfg(feature = "test-support")]
    fn wait_unpaused(&self) {
        while self.paused.load(Acquire) && !self.stop.load(Acquire) {
            std::thread::park_timeout(Duration::from_millis(1));
        }
    }

    /// Tests: panics if told to, in the group just claimed.
    #[cfg(feature = "test-support")]
    fn maybe_panic(&self) {
        if self.panic_next.swap(false, Relaxed) {
            panic!("compression worker: test-support panic");
        }
    }
}

/// A claim on one group, counted done when dropped; if its thread panics
/// meanwhile the group is handed back (abandoned) first, for the queue
/// thread to run again.
struct Claim<'a> {
    job: &'a Job,
    index: usize,
    groups: u32,
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            log::error!(
                "group {} panicked; handed back to its queue thread",
                self.index
            );
            self.job
                .abandoned
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(self.index);
        }
        self.job.finish_one(self.groups);
    }
}

/// A worker's life: fault its state in, then serve jobs until the store
/// stops it.
fn worker_loop(pool: &Pool, id: usize, mut st: CtxState) {
    let _ = pool.slots[id].thread.set(std::thread::current());
    // SAFETY: gettid has no preconditions.
    pool.slots[id].tid.store(unsafe { libc::gettid() }, Relaxed);
    // Before the first job, which comes when memory is short (as a queue
    // thread does before its first request).
    st.prefault();
    loop {
        if pool.idle.push(id).is_err() {
            log::error!("compression worker {id}: idle list full; stopping");
            return;
        }
        let posted = loop {
            if pool.stop.load(Acquire) {
                return;
            }
            if let Some(p) = pool.take_posted(id) {
                break p;
            }
            std::thread::park();
        };
        #[cfg(feature = "test-support")]
        pool.wait_unpaused();
        serve(pool, &posted, &mut st);
        st.count_accel_events();
    }
}

/// Claims and runs groups of `posted` until none is left. The worker's
/// free batch is handed on before its last claim is counted done: after
/// that the store may be gone.
fn serve(pool: &Pool, posted: &Posted, st: &mut CtxState) {
    let job = &*posted.job;
    let Some(mut i) = job.claim(posted.gen) else {
        return;
    };
    let p = job.params();
    let groups = groups_of(job);
    // SAFETY: group `i` is claimed and not yet counted done (its `Claim`
    // is made below): the queue thread waits, so the store is alive.
    let (table, cfg) = unsafe { (&*p.table, &*p.cfg) };
    if cfg.reserve {
        // As a queue thread does (`CtxState::keep_heap_room`): a worker's
        // owner tables grow its arena too.
        st.keep_heap_room(table.allocator().memory_short());
    }
    loop {
        let claim = Claim {
            job,
            index: i,
            groups,
        };
        #[cfg(feature = "test-support")]
        pool.maybe_panic();
        #[cfg(not(feature = "test-support"))]
        let _ = pool;
        if !job.failed.load(Relaxed) {
            // SAFETY: `claim` holds group `i` of the generation `p` was
            // published with, and is counted done only when dropped below.
            match unsafe { run_group(&p, st, i) } {
                Ok(()) => st.shard.add(worker_counter(p.op), 1),
                Err(e) => job.fail(i, e),
            }
        }
        let next = job.claim(posted.gen);
        if next.is_none() {
            // SAFETY: `claim` still holds a group: the store is alive.
            let table = unsafe { &*p.table };
            st.free.flush(table.frees());
        }
        drop(claim);
        match next {
            Some(n) => i = n,
            None => return,
        }
    }
}

/// The counter of groups a worker ran for `op`.
fn worker_counter(op: JobOp) -> Counter {
    match op {
        JobOp::Write => Counter::WorkerGroups,
        JobOp::Read => Counter::WorkerReadGroups,
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.pool.stop.store(true, Release);
        for s in self.pool.slots.iter() {
            if let Some(t) = s.thread.get() {
                t.unpark();
            }
        }
        for t in self.threads.drain(..) {
            if t.join().is_err() {
                log::error!("a compression worker panicked");
            }
        }
    }
}

/// Tests: pausing and failing workers (`crate::testing`).
#[cfg(feature = "test-support")]
impl Workers {
    /// Pauses (`on`) workers before they claim anything, or lets them go.
    pub(crate) fn pause(&self, on: bool) {
        self.pool.paused.store(on, Release);
    }

    /// Makes the next group a worker claims panic (its thread ends).
    pub(crate) fn panic_next(&self) {
        self.pool.panic_next.store(true, Relaxed);
    }

    /// Workers parked idle now.
    pub(crate) fn idle(&self) -> usize {
        self.pool.idle.len()
    }

    /// The workers' thread ids (0 for one not started yet).
    pub(crate) fn tids(&self) -> Vec<i32> {
        self.pool
            .slots
            .iter()
            .map(|s| s.tid.load(Relaxed))
            .collect()
    }
}

/// Sleeps while `word` holds `expected` (or until woken).
fn futex_wait(word: &AtomicU32, expected: u32) {
    // SAFETY: FUTEX_WAIT reads the aligned u32 `word` points at, which
    // lives as long as this borrow; a null timeout waits until woken, and
    // a changed word or a signal returns at once (the caller loops).
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            expected,
            std::ptr::null::<libc::timespec>(),
        )
    };
}

/// Wakes the thread sleeping on `word`.
fn futex_wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE only uses `word`'s address as a key.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            1,
        )
    };
}
