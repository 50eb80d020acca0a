//! Freeing detached objects: per-queue batches and the drain thread.
//!
//! Discard, write-zeroes and overwrites detach handles from slots and hand
//! them to the queue's [`FreeBatch`] with no lock and no atomic. A full batch
//! (64 handles, as in the zsmalloc deferred-free patch) goes, in deferred
//! mode, to a lock-free queue (crossbeam's `ArrayQueue`) that the store's
//! drain thread empties, freeing the objects grouped by size class, off the
//! I/O path. In immediate mode the queue thread frees its batch itself at
//! the end of each request.
//!
//! Bound: the queue holds at most [`FreeConfig::max_pending_batches`] full
//! batches (default [`DEFAULT_MAX_PENDING_BATCHES`]: 4096 batches = 262,144
//! handles, the objects of 1 GiB of discarded pages, so that a process
//! exiting with up to 1 GiB swapped out never waits for the allocator).
//! When it is full the drain has fallen that far behind, and the discarding
//! thread frees its batch synchronously, so detached-but-unfreed objects
//! never number more than the bound, plus what the drain, or a thread
//! settling the queue ([`Freer::settle`]: a stat, a compaction), is freeing
//! at that moment (at most `DRAIN_CHUNK`, 1024, each), plus one partial
//! batch per queue.
//! They are objects the store held just before, so the bound caps how long
//! memory lags behind discards, not growth beyond the store's peak.
//!
//! A slot discarded and rewritten before its old object is drained reads the
//! new data, and a discarded slot reads zeros at once: the slot changes at
//! detach time; only the object's memory waits.

use crate::alloc::{Handle, ObjAllocator};
use crossbeam_queue::ArrayQueue;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

/// Handles per batch, as in the zsmalloc deferred-free patch.
pub const FREE_BATCH: usize = 64;

/// Default bound on full batches waiting for the drain (262,144 handles).
pub const DEFAULT_MAX_PENDING_BATCHES: usize = 4096;

/// How long the drain sleeps when it has nothing to do before it looks at
/// the queue again on its own (a missed wake-up costs at most this much).
const DRAIN_IDLE: Duration = Duration::from_millis(20);

/// How often the idle drain runs its idle hook (automatic compaction).
const IDLE_HOOK_EVERY: Duration = Duration::from_secs(1);

/// Handles the drain frees per `free_bulk` call: batches are merged so
/// that each size-class lock is taken once for many objects.
const DRAIN_CHUNK: usize = 16 * FREE_BATCH;

/// How detached objects are freed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FreeConfig {
    /// Hand full batches to a drain thread (true) or free them on the
    /// queue thread at the end of each request (false).
    pub deferred: bool,
    /// Full batches the drain may fall behind by before discarding threads
    /// free synchronously.
    pub max_pending_batches: usize,
}

impl Default for FreeConfig {
    fn default() -> Self {
        FreeConfig {
            deferred: true,
            max_pending_batches: DEFAULT_MAX_PENDING_BATCHES,
        }
    }
}

/// A queue's batch of detached handles waiting to be freed.
#[derive(Debug, Default)]
pub struct FreeBatch {
    handles: Vec<Handle>,
}

impl FreeBatch {
    /// Creates an empty batch.
    pub fn new() -> Self {
        FreeBatch {
            handles: Vec::with_capacity(FREE_BATCH),
        }
    }

    /// Adds a detached handle; hands the batch on when it is full.
    #[inline]
    pub fn push(&mut self, h: Handle, frees: &Freer) {
        self.handles.push(h);
        if self.handles.len() >= FREE_BATCH {
            self.flush(frees);
        }
    }

    /// Hands the batch on now: to the drain in deferred mode, freed here
    /// in immediate mode (idle timer, stat, exit).
    pub fn flush(&mut self, frees: &Freer) {
        if !self.handles.is_empty() {
            frees.hand_off(&mut self.handles);
        }
    }

    /// Called at the end of each request: immediate mode frees what the
    /// request detached before returning; deferred mode keeps batching.
    #[inline]
    pub fn end_request(&mut self, frees: &Freer) {
        if !frees.is_deferred() {
            self.flush(frees);
        }
    }

    /// Handles waiting in this batch.
    pub fn pending(&self) -> usize {
        self.handles.len()
    }
}

/// What the store's queue threads and its drain thread share.
struct Shared {
    alloc: Arc<dyn ObjAllocator>,
    queue: ArrayQueue<Vec<Handle>>,
    /// Emptied batch vectors, recycled so a hand-off rarely allocates.
    spare: ArrayQueue<Vec<Handle>>,
    /// Handles freed so far, by any path.
    freed: AtomicU64,
    /// Handles in the queue or being freed right now (by the drain or a
    /// settling thread).
    queued: AtomicU64,
    sleeping: AtomicBool,
    stop: AtomicBool,
    /// A simulated crash: the drain stops at once and frees nothing more.
    abandoned: AtomicBool,
    /// The drain thread has returned.
    exited: AtomicBool,
    /// Tests: the drain waits, freeing nothing, while this is set.
    #[cfg(feature = "test-support")]
    stalled: AtomicBool,
    idle_hook: Mutex<Option<IdleHook>>,
}

/// Work the drain thread does now and then while idle (the store uses it to
/// compact when fragmentation passes its threshold).
pub type IdleHook = Box<dyn Fn() + Send>;

impl Shared {
    fn free_now(&self, hs: &[Handle]) {
        crate::crash_point::point("free:batch");
        self.alloc.free_bulk(hs);
        self.freed.fetch_add(hs.len() as u64, Ordering::Relaxed);
    }

    fn recycle(&self, mut v: Vec<Handle>) {
        v.clear();
        let _ = self.spare.push(v);
    }

    /// Tests: whether the drain is stalled (never, without test support).
    fn is_stalled(&self) -> bool {
        #[cfg(feature = "test-support")]
        return self.stalled.load(Ordering::SeqCst);
        #[cfg(not(feature = "test-support"))]
        false
    }

    /// Frees queued batches up to about [`DRAIN_CHUNK`] handles; returns
    /// whether there was anything.
    fn drain_chunk(&self, buf: &mut Vec<Handle>) -> bool {
        let mut any = false;
        while buf.len() < DRAIN_CHUNK {
            let Some(b) = self.queue.pop() else { break };
            any = true;
            buf.extend_from_slice(&b);
            self.recycle(b);
        }
        self.free_chunk(buf);
        any
    }

    /// Frees everything queued, a chunk at a time; returns whether there
    /// was anything.
    fn drain_once(&self, buf: &mut Vec<Handle>) -> bool {
        let mut any = false;
        while self.drain_chunk(buf) {
            any = true;
        }
        any
    }

    fn free_chunk(&self, buf: &mut Vec<Handle>) {
        if !buf.is_empty() {
            // Sorted, the slab frees the chunk without copying it and
            // finds neighbouring objects together.
            buf.sort_unstable();
            self.free_now(buf);
            self.queued.fetch_sub(buf.len() as u64, Ordering::Release);
            buf.clear();
        }
    }
}

/// The store's freeing machinery: the allocator, and in deferred mode the
/// queue and the drain thread (stopped, with everything freed, on drop).
pub struct Freer {
    shared: Arc<Shared>,
    deferred: bool,
    thread: Option<JoinHandle<()>>,
    drain_thread: Option<Thread>,
}

impl std::fmt::Debug for Freer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Freer")
            .field("deferred", &self.deferred)
            .field("queued", &self.shared.queued.load(Ordering::Relaxed))
            .finish()
    }
}

impl Freer {
    /// Creates the freeing machinery; starts the drain thread in deferred
    /// mode. If the thread cannot be started, frees are immediate.
    pub fn new(alloc: Arc<dyn ObjAllocator>, cfg: FreeConfig) -> Self {
        let cap = cfg.max_pending_batches.max(1);
        let shared = Arc::new(Shared {
            alloc,
            queue: ArrayQueue::new(cap),
            spare: ArrayQueue::new(cap),
            freed: AtomicU64::new(0),
            queued: AtomicU64::new(0),
            sleeping: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            abandoned: AtomicBool::new(false),
            exited: AtomicBool::new(false),
            #[cfg(feature = "test-support")]
            stalled: AtomicBool::new(false),
            idle_hook: Mutex::new(None),
        });
        let mut f = Freer {
            shared,
            deferred: false,
            thread: None,
            drain_thread: None,
        };
        if cfg.deferred {
            let sh = f.shared.clone();
            match std::thread::Builder::new()
                .name("zblk-free".into())
                .spawn(move || drain_loop(&sh))
            {
                Ok(t) => {
                    f.drain_thread = Some(t.thread().clone());
                    f.thread = Some(t);
                    f.deferred = true;
                }
                Err(e) => log::warn!("cannot start the free drain ({e}); freeing immediately"),
            }
        }
        f
    }

    /// Whether full batches go to the drain thread.
    pub fn is_deferred(&self) -> bool {
        self.deferred
    }

    /// Handles freed so far.
    pub fn freed(&self) -> u64 {
        self.shared.freed.load(Ordering::Relaxed)
    }

    /// Handles handed to the drain and not yet freed.
    #[cfg(test)]
    fn queued(&self) -> u64 {
        self.shared.queued.load(Ordering::Relaxed)
    }

    /// Sets the drain's idle hook, run about once a second while idle.
    pub fn set_idle_hook(&self, hook: IdleHook) {
        *self
            .shared
            .idle_hook
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(hook);
    }

    /// Takes a batch's handles: queues them for the drain, or frees them
    /// here when deferral is off or the drain is too far behind.
    fn hand_off(&self, handles: &mut Vec<Handle>) {
        if !self.deferred {
            self.shared.free_now(handles);
            handles.clear();
            return;
        }
        let fresh = self
            .shared
            .spare
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(FREE_BATCH));
        let batch = std::mem::replace(handles, fresh);
        let n = batch.len() as u64;
        self.shared.queued.fetch_add(n, Ordering::Relaxed);
        match self.shared.queue.push(batch) {
            Ok(()) => self.wake(),
            Err(batch) => {
                // Bound reached: pay for this batch on this thread.
                self.shared.queued.fetch_sub(n, Ordering::Relaxed);
                self.shared.free_now(&batch);
                self.shared.recycle(batch);
            }
        }
    }

    /// Stops the drain where it is, freeing nothing more, as a crash of the
    /// process would: for tests that recover a store from its shared
    /// memory while the crashed store's objects are leaked, not freed.
    #[cfg(feature = "test-support")]
    pub fn abandon(&self) {
        self.shared.abandoned.store(true, Ordering::SeqCst);
        let Some(t) = &self.drain_thread else {
            return;
        };
        let t0 = Instant::now();
        while !self.shared.exited.load(Ordering::SeqCst) && t0.elapsed() < Duration::from_secs(5) {
            t.unpark();
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Tests: stalls the drain (it frees nothing until un-stalled, as a
    /// drain starved of CPU would) or lets it go again. Queue threads keep
    /// handing batches on and free synchronously once the queue is full.
    #[cfg(feature = "test-support")]
    pub fn stall(&self, on: bool) {
        self.shared.stalled.store(on, Ordering::SeqCst);
        if let Some(t) = &self.drain_thread {
            t.unpark();
        }
    }

    /// Wakes the drain if it sleeps (a stat or compact wants the truth soon).
    pub fn wake(&self) {
        // Pairs with the fence in `drain_loop`: either the drain sees the
        // pushed batch, or this thread sees it asleep and unparks it.
        fence(Ordering::SeqCst);
        if self.shared.sleeping.load(Ordering::Relaxed) {
            if let Some(t) = &self.drain_thread {
                t.unpark();
            }
        }
    }

    /// Frees every queued handle, on this thread or by the drain, waiting
    /// up to `timeout`. Returns whether the queue emptied. Partial batches
    /// still held by queue contexts are not seen: flush them first. The
    /// caller must hold no slot lock (it may call into the allocator).
    pub fn settle(&self, timeout: Duration) -> bool {
        if !self.deferred {
            return true;
        }
        if self.drain_thread.as_ref().map(|t| t.id()) == Some(std::thread::current().id()) {
            // The drain itself (idle hook) has just emptied the queue.
            return true;
        }
        let t0 = Instant::now();
        let mut buf = Vec::new();
        while self.shared.queued.load(Ordering::Acquire) != 0 {
            if t0.elapsed() >= timeout {
                return false;
            }
            // Free what is queued here rather than wait for the drain: it
            // runs at batch priority and a busy machine starves it (a fuzz
            // target spent more than half its wall time in this wait). A
            // stalled drain (tests) stands for nobody freeing at all.
            // A chunk at a time, so the timeout holds against a queue that
            // discards keep refilling.
            if !self.shared.is_stalled() && self.shared.drain_chunk(&mut buf) {
                continue;
            }
            // What is left is being freed by the drain right now.
            self.wake();
            std::thread::sleep(Duration::from_micros(200));
        }
        true
    }
}

impl Drop for Freer {
    fn drop(&mut self) {
        if self.shared.abandoned.load(Ordering::SeqCst) {
            return;
        }
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(t) = &self.drain_thread {
            t.unpark();
        }
        if let Some(handle) = self.thread.take() {
            if handle.thread().id() == std::thread::current().id() {
                // Dropped from the drain's own idle hook: it sees `stop` and
                // frees the rest itself when the hook returns.
                return;
            }
            if handle.join().is_err() {
                log::error!("the free drain thread panicked");
            }
        }
        // Whatever is left (the drain exited, or never ran).
        let mut buf = Vec::new();
        self.shared.drain_once(&mut buf);
    }
}

/// Makes the calling thread `SCHED_BATCH`: it keeps its fair share of the
/// CPU but never preempts the thread that woke it, so handing a batch to
/// the drain does not cost the discarding thread its CPU.
fn no_wakeup_preemption() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 is the calling thread; `param` is a valid sched_param.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) } != 0 {
        log::debug!(
            "free drain stays SCHED_OTHER: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// The drain thread: frees queued batches, sleeps when there are none.
fn drain_loop(sh: &Shared) {
    no_wakeup_preemption();
    let mut buf = Vec::with_capacity(DRAIN_CHUNK + FREE_BATCH);
    let mut last_hook = Instant::now();
    loop {
        if sh.abandoned.load(Ordering::SeqCst) {
            sh.exited.store(true, Ordering::SeqCst);
            return;
        }
        #[cfg(feature = "test-support")]
        if sh.stalled.load(Ordering::SeqCst) && !sh.stop.load(Ordering::SeqCst) {
            std::thread::park_timeout(DRAIN_IDLE);
            continue;
        }
        sh.drain_once(&mut buf);
        if sh.stop.load(Ordering::SeqCst) {
            sh.drain_once(&mut buf);
            return;
        }
        if last_hook.elapsed() >= IDLE_HOOK_EVERY {
            last_hook = Instant::now();
            run_idle_hook(sh);
            continue;
        }
        sh.sleeping.store(true, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if sh.queue.is_empty() && !sh.stop.load(Ordering::SeqCst) {
            std::thread::park_timeout(DRAIN_IDLE);
        }
        sh.sleeping.store(false, Ordering::Relaxed);
    }
}

fn run_idle_hook(sh: &Shared) {
    let guard = sh.idle_hook.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(hook) = guard.as_ref() {
        hook();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::HeapAllocator;

    fn alloc_n(a: &dyn ObjAllocator, n: usize) -> Vec<Handle> {
        let mut hs = Vec::new();
        a.alloc_bulk(&vec![100; n], &vec![0; n], &mut hs).unwrap();
        hs
    }

    #[test]
    fn deferred_batches_reach_the_drain_and_are_freed() {
        let a: Arc<dyn ObjAllocator> = Arc::new(HeapAllocator::new());
        let f = Freer::new(a.clone(), FreeConfig::default());
        assert!(f.is_deferred());
        let mut b = FreeBatch::new();
        let hs = alloc_n(&*a, 1000);
        for &h in &hs {
            b.push(h, &f);
        }
        b.end_request(&f);
        assert_eq!(
            b.pending(),
            1000 % FREE_BATCH,
            "deferred keeps the partial batch"
        );
        b.flush(&f);
        assert_eq!(b.pending(), 0);
        assert!(f.settle(Duration::from_secs(10)));
        assert_eq!(f.freed(), 1000);
        assert_eq!(a.mem_used_total(), 0);
    }

    #[test]
    fn immediate_frees_at_end_of_request() {
        let a: Arc<dyn ObjAllocator> = Arc::new(HeapAllocator::new());
        let f = Freer::new(
            a.clone(),
            FreeConfig {
                deferred: false,
                ..FreeConfig::default()
            },
        );
        assert!(!f.is_deferred());
        let mut b = FreeBatch::new();
        for h in alloc_n(&*a, 70) {
            b.push(h, &f);
        }
        assert_eq!(f.freed(), 64, "a full batch is freed at once");
        b.end_request(&f);
        assert_eq!(f.freed(), 70);
        assert_eq!(a.mem_used_total(), 0);
    }

    #[test]
    fn full_queue_frees_synchronously() {
        let a: Arc<dyn ObjAllocator> = Arc::new(HeapAllocator::new());
        // Stop the drain from running by holding its idle hook lock? No: use
        // a queue of one batch and push faster than a sleeping drain wakes;
        // whatever path each batch takes, all must be freed exactly once.
        let f = Freer::new(
            a.clone(),
            FreeConfig {
                deferred: true,
                max_pending_batches: 1,
            },
        );
        let mut b = FreeBatch::new();
        for h in alloc_n(&*a, 64 * 50) {
            b.push(h, &f);
        }
        // The bound (one batch), plus what the drain is freeing right now
        // (a chunk and the batch that tipped it over), plus a batch counted
        // by a pusher just before its push is refused.
        let most = FREE_BATCH + (DRAIN_CHUNK + FREE_BATCH) + FREE_BATCH;
        assert!(f.queued() <= most as u64, "bound exceeded");
        assert!(f.settle(Duration::from_secs(10)));
        assert_eq!(f.freed(), 64 * 50);
        assert_eq!(a.mem_used_total(), 0);
    }

    #[test]
    fn drop_frees_everything_queued() {
        let a: Arc<dyn ObjAllocator> = Arc::new(HeapAllocator::new());
        let f = Freer::new(a.clone(), FreeConfig::default());
        let mut b = FreeBatch::new();
        for h in alloc_n(&*a, 64 * 10 + 3) {
            b.push(h, &f);
        }
        b.flush(&f);
        drop(f);
        assert_eq!(a.mem_used_total(), 0);
    }

    #[test]
    fn idle_hook_runs() {
        let a: Arc<dyn ObjAllocator> = Arc::new(HeapAllocator::new());
        let f = Freer::new(a, FreeConfig::default());
        let (tx, rx) = std::sync::mpsc::channel();
        let tx = Mutex::new(tx);
        f.set_idle_hook(Box::new(move || {
            let _ = tx.lock().unwrap().send(());
        }));
        assert!(rx.recv_timeout(Duration::from_secs(10)).is_ok());
    }
}
