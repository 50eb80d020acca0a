//! The queue threads: one per ublk queue, or `--io-threads N` per queue
//! each serving its share of the queue's tags ([`crate::io_threads`]).
//! Each I/O thread owns one [`QueueCtx`] and its tags' I/O buffers;
//! requests are handled inline by [`crate::io::handle_io`] and completed
//! at once. Below, "a queue" is one I/O thread and what it serves.
//!
//! Queues hear from the control loop through one eventfd each, read by an
//! io_uring request in the queue's own ring: the queue thread wakes, frees
//! its batch (only it may touch its context) and publishes the tick it has
//! seen. [`Queues::flush_all`] waits for every queue to do so, so that
//! `stats` merges shards with nothing batched.
//!
//! A handover under `UBLK_F_QUIESCE` needs the same ticks for another
//! reason. Quiesce returns once every queue has at least one idle tag and
//! then aborts the idle ones; a tag that was busy at that moment is
//! committed afterwards and parks in the kernel for good, so a loaded
//! queue never sees all its commands come back and its thread never ends.
//! [`Queues::drain_for_handover`] instead waits until every queue has
//! answered ticks with nothing served in between: its commits are then
//! submitted, and the process may exit (the driver cancels the parked
//! commands; anything it still held is reissued to the next daemon).

use crate::backing_read::{BackingReads, BlockBufs, Unqueued, BACKING_OP};
use crate::config::DeviceConfig;
use crate::error::{Error, Result, Step, UblkCause};
use crate::io::{handle_io, handle_resume, Blocks, IoDesc, RateLimit, Served};
use crate::io_threads;
use crate::poll::PollWindow;
use crate::transport::Transport;
use libublk::helpers::IoBuf;
use libublk::io::{
    UblkBatchBuffers, UblkBatchCompletion, UblkBatchConfig, UblkBatchQueue, UblkDev, UblkIOCtx,
    UblkQueue,
};
use libublk::{BufDesc, BufDescList, UblkError, UblkIORes, UblkUringData};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use zblk::{QueueCtx, Store};

/// io_uring op tag of a queue's eventfd read (any value ublk commands do
/// not use in the target-I/O space).
const TICK_OP: u32 = 0xfe;

/// How long [`Queues::flush_all`] waits for the queues.
const FLUSH_WAIT: Duration = Duration::from_secs(2);

/// How long [`Queues::wait_exit`] waits for the queue threads to end.
const STOP_WAIT: Duration = Duration::from_secs(30);

/// How long [`Queues::drain_for_handover`] waits for the queues to go
/// quiet; past it the next daemon gets what is left reissued.
const DRAIN_WAIT: Duration = Duration::from_secs(2);

/// [`QueueShared::done`] of a queue whose thread has ended: it answers
/// every tick.
const GONE: u64 = u64::MAX;

/// What a queue thread shares with the control loop.
struct QueueShared {
    /// eventfd the control loop writes to wake the queue.
    kick: OwnedFd,
    /// Last tick generation the queue has handled ([`GONE`] once its
    /// thread has ended).
    done: AtomicU64,
    /// Requests the queue has served (for [`Queues::drain_for_handover`]).
    served: AtomicU64,
    /// Handles batched in the queue's context at that moment.
    pending: AtomicU64,
    /// Where the queue's ring reads the eventfd counter to (never read).
    kick_buf: AtomicU64,
    /// The queue thread's id (`gettid`; 0 until it starts), for
    /// [`crate::placement`].
    tid: AtomicI32,
    /// With a backing device: the blocks its reads land in, one per tag
    /// ([`crate::backing_read`]); here, not on the queue thread, so that
    /// a read in flight when the thread ends lands in live memory.
    blocks: Option<BlockBufs>,
}

impl QueueShared {
    fn new(blocks: Option<BlockBufs>) -> Result<Self> {
        // SAFETY: eventfd has no memory preconditions; a valid result is a
        // new descriptor we own.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(Error::last_os(Step::Eventfd));
        }
        Ok(QueueShared {
            // SAFETY: fd is a fresh descriptor owned by nobody else.
            kick: unsafe { OwnedFd::from_raw_fd(fd) },
            done: AtomicU64::new(0),
            served: AtomicU64::new(0),
            pending: AtomicU64::new(0),
            kick_buf: AtomicU64::new(0),
            tid: AtomicI32::new(0),
            blocks,
        })
    }

    /// Adds one to the queue's eventfd, waking its ring.
    fn kick(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writing 8 bytes from a valid buffer to an eventfd we own.
        let r = unsafe { libc::write(self.kick.as_raw_fd(), one.as_ptr().cast(), one.len()) };
        if r < 0 {
            log::warn!("kick eventfd: {}", std::io::Error::last_os_error());
        }
    }
}

/// The engine and the queues of one device, shared by the queue threads
/// and the control loop.
pub struct Queues {
    store: Arc<Store>,
    /// One per I/O thread, at [`io_threads::slot`].
    threads: Vec<QueueShared>,
    /// I/O threads per ublk queue.
    per_queue: u16,
    /// How long a queue thread polls its ring past the last request it
    /// served, in µs ([`crate::poll`]; 0: never).
    poll_us: u32,
    /// Engine contexts waiting for their I/O thread, as [`Self::threads`].
    ctxs: Mutex<Vec<Option<QueueCtx>>>,
    /// Generation of the latest tick.
    tick_gen: AtomicU64,
    /// Queue threads still serving.
    alive: AtomicUsize,
    /// Whether the first request served is to be logged (after a recovery).
    log_first: AtomicBool,
    /// Set before a quiesce: queues keep answering ticks once stopping.
    handover: AtomicBool,
    /// Held by each maintenance job (a manual compact, idle, recompress or
    /// writeback, or one round of `crate::policy`), so that a policy
    /// round's marking and processing are not interleaved with a manual
    /// command's.
    maintenance: Mutex<()>,
}

impl Queues {
    /// A new engine for `cfg` and one context and eventfd per I/O thread.
    pub fn new(cfg: &DeviceConfig) -> Result<Self> {
        Self::with_store(cfg, Store::new(cfg.store_config())?)
    }

    /// The engine `store` (new or recovered) for `cfg`, and one context
    /// and eventfd per I/O thread (`cfg.io_threads` a queue).
    pub fn with_store(cfg: &DeviceConfig, store: Arc<Store>) -> Result<Self> {
        let per_queue = cfg.io_threads.max(1);
        let n = usize::from(cfg.queue_count()) * usize::from(per_queue);
        let backing = store.backing_fd().is_some();
        let read_bytes = store.backing_read_bytes();
        let threads = (0..n)
            .map(|_| QueueShared::new(backing.then(|| BlockBufs::new(cfg.depth, read_bytes))))
            .collect::<Result<Vec<_>>>()?;
        // Created in slot order so that stats list I/O thread i as
        // context i.
        let ctxs = (0..n).map(|_| Some(store.new_ctx())).collect();
        Ok(Queues {
            store,
            alive: AtomicUsize::new(threads.len()),
            threads,
            per_queue,
            poll_us: cfg.poll_us,
            ctxs: Mutex::new(ctxs),
            tick_gen: AtomicU64::new(0),
            log_first: AtomicBool::new(false),
            handover: AtomicBool::new(false),
            maintenance: Mutex::new(()),
        })
    }

    /// Logs the moment the first request is served (as seconds since boot,
    /// the clock of `/proc/uptime`): how long the device was without a
    /// daemon is read from it.
    pub fn log_first_request(&self) {
        self.log_first.store(true, Ordering::SeqCst);
    }

    /// After each request of queue `qs`: counts it; the first one, when
    /// asked for, is logged.
    fn served(&self, qs: &QueueShared, qid: u16) {
        qs.served.fetch_add(1, Ordering::Relaxed);
        if self.log_first.load(Ordering::Relaxed) && self.log_first.swap(false, Ordering::SeqCst) {
            log::info!(
                "queue {qid}: first request served at uptime {:.3}",
                uptime_s()
            );
        }
    }

    /// The device's engine.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The thread ids of the queue threads that have started.
    pub fn thread_ids(&self) -> Vec<libc::pid_t> {
        self.threads
            .iter()
            .map(|q| q.tid.load(Ordering::SeqCst))
            .filter(|&t| t > 0)
            .collect()
    }

    /// Queue threads still serving.
    pub fn alive(&self) -> usize {
        self.alive.load(Ordering::SeqCst)
    }

    /// Requests served by all queues since the daemon started: what
    /// `crate::policy` measures how busy the device is by.
    pub fn served_total(&self) -> u64 {
        self.threads
            .iter()
            .map(|q| q.served.load(Ordering::Relaxed))
            .sum()
    }

    /// Takes the device's maintenance lock (see [`Queues`]'s field): one
    /// maintenance job at a time, a manual one or a policy round.
    pub fn maintenance(&self) -> std::sync::MutexGuard<'_, ()> {
        self.maintenance.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wakes every queue; returns the generation they will report.
    pub fn kick_all(&self) -> u64 {
        let gen = self.tick_gen.fetch_add(1, Ordering::SeqCst) + 1;
        self.threads.iter().for_each(QueueShared::kick);
        gen
    }

    /// Kicks every queue and waits until each has freed its batch (or is
    /// gone, or `FLUSH_WAIT` passed). Returns the handles still pending.
    pub fn flush_all(&self) -> u64 {
        let gen = self.kick_all();
        if !self.wait_ticks(gen, FLUSH_WAIT) {
            log::warn!("stats: a queue did not answer within {FLUSH_WAIT:?}");
        }
        self.threads
            .iter()
            .map(|q| q.pending.load(Ordering::SeqCst))
            .sum()
    }

    /// Called before `UBLK_U_CMD_QUIESCE_DEV`: from now on the queues
    /// answer ticks even after the driver aborted their commands.
    pub fn begin_handover(&self) {
        self.handover.store(true, Ordering::SeqCst);
    }

    /// After a successful quiesce: kicks the queues until a round of ticks
    /// passes with no request served on any queue, twice in a row (the
    /// first quiet round may still hold commits not yet submitted; the
    /// tick read of the second is submitted after them), or [`DRAIN_WAIT`]
    /// passes. True when the queues went quiet.
    pub fn drain_for_handover(&self) -> bool {
        let t0 = Instant::now();
        let mut quiet_rounds = 0;
        let mut served = self.served_counts();
        while quiet_rounds < 2 {
            let gen = self.kick_all();
            if !self.wait_ticks(gen, DRAIN_WAIT.saturating_sub(t0.elapsed())) {
                return false;
            }
            let now = self.served_counts();
            quiet_rounds = if now == served { quiet_rounds + 1 } else { 0 };
            served = now;
        }
        true
    }

    fn served_counts(&self) -> Vec<u64> {
        self.threads
            .iter()
            .map(|q| q.served.load(Ordering::SeqCst))
            .collect()
    }

    /// Waits up to `limit` until every queue has answered tick `gen`.
    fn wait_ticks(&self, gen: u64, limit: Duration) -> bool {
        let t0 = Instant::now();
        while self
            .threads
            .iter()
            .any(|q| q.done.load(Ordering::SeqCst) < gen)
        {
            if t0.elapsed() > limit {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        true
    }

    /// Keeps kicking the queues (so none sleeps in its ring wait) until all
    /// their threads have ended.
    pub fn wait_exit(&self) {
        let t0 = Instant::now();
        while self.alive() > 0 {
            if t0.elapsed() > STOP_WAIT {
                log::error!("queues did not stop within {STOP_WAIT:?}");
                return;
            }
            self.kick_all();
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Body of an I/O thread of queue `qid` (libublk has already made it
    /// an io-flusher and told it its index among the queue's threads):
    /// serves its tags until the device stops.
    pub fn serve(&self, qid: u16, dev: &UblkDev) {
        let thread = libublk::io::io_thread_idx();
        let slot = self.slot(qid, thread);
        let qs = slot.and_then(|s| self.threads.get(s));
        if let Some(q) = qs {
            // SAFETY: gettid has no preconditions.
            q.tid.store(unsafe { libc::gettid() }, Ordering::SeqCst);
        }
        let _alive = AliveGuard(&self.alive, qs.map(|q| &q.done));
        let (Some(ctx), Some(qs)) = (slot.and_then(|s| self.take_ctx(s)), qs) else {
            log::error!("queue {qid} thread {thread}: no engine context");
            // Makes start_dev fail instead of waiting for this queue forever.
            dev.notify_buffer_registration_complete(true);
            return;
        };
        self.serve_queue(qs, ctx, qid, dev);
    }

    /// The slot of I/O thread `thread` of queue `qid`, if the device has
    /// that thread.
    fn slot(&self, qid: u16, thread: u16) -> Option<usize> {
        let s = io_threads::slot(qid, thread, self.per_queue);
        (thread < self.per_queue && s < self.threads.len()).then_some(s)
    }

    /// Hands the engine context of slot `slot` to its thread (once).
    fn take_ctx(&self, slot: usize) -> Option<QueueCtx> {
        self.ctxs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(slot)
            .and_then(Option::take)
    }

    /// Serves queue `qid` with the transport the device was created with.
    fn serve_queue(&self, qs: &QueueShared, mut ctx: QueueCtx, qid: u16, dev: &UblkDev) {
        // Before the first request, which comes when memory is short.
        ctx.prefault();
        match Transport::of_flags(dev.dev_info.flags) {
            Transport::Classic => self.serve_classic(qs, ctx, qid, dev),
            Transport::Batch => self.serve_batch(qs, ctx, qid, dev),
        }
    }

    /// One command per request: each completion is the next fetch.
    fn serve_classic(&self, qs: &QueueShared, mut ctx: QueueCtx, qid: u16, dev: &UblkDev) {
        let Some(q) = new_queue(qid, dev) else {
            return;
        };
        let mut bufs = locked_io_bufs(&q, dev);
        let q = match q.submit_fetch_commands_unified(BufDescList::Slices(Some(&bufs))) {
            Ok(q) => q,
            Err(e) => return setup_failed(qid, dev, &e),
        };
        submit_tick_read(&q, qs);
        let mut reads =
            BackingReads::new(&self.store, qs.blocks.as_ref(), dev.dev_info.queue_depth);
        let mut rl = RateLimit::default();
        let mut poll = PollWindow::new(self.poll_us);
        loop {
            let mut served = 0;
            let r = q.flush_and_wake_io_tasks(
                |data, cqe, _| {
                    let tag = UblkIOCtx::user_data_to_tag(data) as u16;
                    let mut io = TagIo {
                        q: &q,
                        ctx: &mut ctx,
                        rl: &mut rl,
                        reads: &mut reads,
                    };
                    let done = if data & UblkUringData::Target as u64 == 0 {
                        // Any other result is the driver aborting the
                        // command: nothing to serve (as libublk's
                        // `wait_and_handle_io`).
                        (cqe.result() == libublk::sys::UBLK_IO_RES_OK as i32)
                            .then(|| io.serve_request(tag, &mut bufs))
                    } else if UblkIOCtx::user_data_to_op(data) == BACKING_OP {
                        Some(io.resume_request(tag, &mut bufs, cqe.result()))
                    } else {
                        let own = (data, cqe.result());
                        self.on_target_cqe(&q, qs, io.ctx, own, q.is_stopping());
                        None
                    };
                    if let Some(completed) = done {
                        served += 1;
                        if completed {
                            self.served(qs, qid);
                        }
                    }
                },
                poll.to_wait(Instant::now),
            );
            if let Err(e) = r {
                queue_ended(qid, &e);
                break;
            }
            poll.after(served, Instant::now);
        }
        if reads.in_flight() > 0 {
            log::warn!(
                "queue {qid}: ended with {} backing reads in flight",
                reads.in_flight()
            );
        }
        finish(qs, &mut ctx, qid);
    }

    /// `UBLK_F_BATCH_IO`: multishot fetches hand over groups of tags, whose
    /// results go back in one commit per wake-up (see `crate::transport`).
    fn serve_batch(&self, qs: &QueueShared, mut ctx: QueueCtx, qid: u16, dev: &UblkDev) {
        let Some(q) = new_queue(qid, dev) else {
            return;
        };
        let bufs = UblkBatchBuffers::IoBufs(locked_io_bufs(&q, dev));
        // On failure it tells the device's start itself.
        let mut batch = match UblkBatchQueue::new(&q, bufs, UblkBatchConfig::default()) {
            Ok(b) => b,
            Err(e) => {
                log::error!("queue {qid}: batch setup failed: {}", UblkCause(&e));
                return;
            }
        };
        submit_tick_read(&q, qs);
        let mut reads =
            BackingReads::new(&self.store, qs.blocks.as_ref(), dev.dev_info.queue_depth);
        let mut rl = RateLimit::default();
        let mut done: Vec<UblkBatchCompletion> =
            Vec::with_capacity(usize::from(dev.dev_info.queue_depth));
        let mut poll = PollWindow::new(self.poll_us);
        loop {
            let mut failed = None;
            let mut resumed = 0;
            // Completions a full commit left for the next pass are no
            // new request: only this pass's may keep the window open.
            let carried = done.len();
            let r = q.flush_and_wake_io_tasks(
                |_, cqe, _| {
                    let mut io = TagIo {
                        q: &q,
                        ctx: &mut ctx,
                        rl: &mut rl,
                        reads: &mut reads,
                    };
                    let mine = batch.handle_cqe(cqe, |b, tags| {
                        for &tag in tags {
                            let iod = IoDesc::from(q.get_iod(tag));
                            let served = match b.io_buf_mut(tag) {
                                Some(buf) => {
                                    let s = handle_io(io.ctx, &iod, buf.as_mut_slice(), io.rl);
                                    io.result_or_wait(tag, &iod, buf.as_mut_slice(), s)
                                }
                                None => Some(-libc::EIO),
                            };
                            if let Some(res) = served {
                                done.push(UblkBatchCompletion::new(tag, res));
                                self.served(qs, qid);
                            }
                        }
                        Ok(())
                    });
                    let data = cqe.user_data();
                    match mine {
                        Ok(true) => {}
                        Ok(false) if UblkIOCtx::user_data_to_op(data) == BACKING_OP => {
                            resumed += 1;
                            let tag = UblkIOCtx::user_data_to_tag(data) as u16;
                            if let Some(res) = io.resume_batch(tag, &mut batch, cqe.result()) {
                                done.push(UblkBatchCompletion::new(tag, res));
                                self.served(qs, qid);
                            }
                        }
                        Ok(false) => {
                            let own = (data, cqe.result());
                            self.on_target_cqe(&q, qs, io.ctx, own, batch.all_fetches_stopped());
                        }
                        Err(e) => failed = Some(e),
                    }
                },
                poll.to_wait(Instant::now),
            );
            if let Some(e) = failed.or(r.err()) {
                queue_ended(qid, &e);
                break;
            }
            poll.after(done.len() - carried + resumed, Instant::now);
            if !commit_round(&mut batch, &mut done, qid) {
                break;
            }
        }
        finish(qs, &mut ctx, qid);
    }

    /// A completion of the queue's own (not a request): the tick, armed
    /// again unless the queue is ending (`stopping`): a tick armed again
    /// would keep an ending queue busy, except in a handover, where the
    /// queue never ends by itself and the ticks are what drains it.
    fn on_target_cqe(
        &self,
        q: &UblkQueue,
        qs: &QueueShared,
        ctx: &mut QueueCtx,
        (user_data, result): (u64, i32),
        stopping: bool,
    ) {
        if UblkIOCtx::user_data_to_op(user_data) != TICK_OP {
            return;
        }
        if result < 0 && !stopping {
            // Not armed again: the control loop's kicks go unanswered
            // from here on, and it says so when it next waits for them.
            log::error!(
                "queue {}: the tick's eventfd read failed: {}",
                q.get_qid(),
                std::io::Error::from_raw_os_error(-result)
            );
        }
        self.on_tick(qs, ctx);
        if result >= 0 && (!stopping || self.handover.load(Ordering::SeqCst)) {
            submit_tick_read(q, qs);
        }
    }

    /// A queue's answer to a kick: only the queue's own thread may touch
    /// its context, so it frees its batch here and publishes the
    /// generation the control loop asked for.
    fn on_tick(&self, qs: &QueueShared, ctx: &mut QueueCtx) {
        let gen = self.tick_gen.load(Ordering::SeqCst);
        ctx.flush_frees();
        qs.pending
            .store(ctx.pending_frees() as u64, Ordering::SeqCst);
        qs.done.store(gen, Ordering::SeqCst);
    }
}

/// The end of a wake-up of a batch queue: commits the results gathered
/// (kept for the next round while every commit slot is in flight) and
/// says whether the queue goes on (false once it has shut down, or on an
/// error, logged here).
fn commit_round(batch: &mut UblkBatchQueue, done: &mut Vec<UblkBatchCompletion>, qid: u16) -> bool {
    match batch.try_submit_completions(done) {
        Ok(true) => done.clear(),
        Ok(false) => {}
        Err(e) => {
            log::error!("queue {qid}: commit: {}", UblkCause(&e));
            return false;
        }
    }
    match batch.try_begin_shutdown() {
        Ok(shutting) => !(shutting && batch.is_shutdown_complete()),
        Err(e) => {
            log::error!("queue {qid}: shutdown: {}", UblkCause(&e));
            false
        }
    }
}

/// This thread's share of queue `qid`, logged and told to the device's
/// start if it cannot be set up.
fn new_queue(qid: u16, dev: &UblkDev) -> Option<UblkQueue<'_>> {
    UblkQueue::new(qid, dev)
        .map_err(|e| setup_failed(qid, dev, &e))
        .ok()
}

/// Logs a queue that could not be set up and makes the device's start
/// fail instead of waiting for it forever.
fn setup_failed(qid: u16, dev: &UblkDev, e: &UblkError) {
    log::error!("queue {qid}: setup failed: {}", UblkCause(e));
    dev.notify_buffer_registration_complete(true);
}

/// The queue's per-tag I/O buffers (indexed by tag), the buffers of the
/// tags this thread serves locked and so faulted in now: the driver
/// copies a write's data into its buffer in this process's context, and
/// a first touch there under memory pressure would send the queue into
/// direct reclaim, waiting on the swap writes it is to complete (the
/// daemon's `mlockall` is `MCL_ONFAULT`, which locks pages only once
/// touched). The other I/O threads' tags keep buffers never touched, so
/// never backed by memory. A buffer that cannot be locked is logged once
/// and used as is.
fn locked_io_bufs(q: &UblkQueue, dev: &UblkDev) -> Vec<IoBuf<u8>> {
    let bufs = dev.alloc_queue_io_bufs();
    let failed = q
        .tags()
        .filter_map(|t| bufs.get(usize::from(t)))
        .filter(|b| !b.mlock())
        .count();
    if failed > 0 {
        log::warn!(
            "queue {}: {failed} of {} I/O buffers could not be locked ({})",
            q.get_qid(),
            q.nr_tags(),
            std::io::Error::last_os_error()
        );
    }
    bufs
}

/// What a queue thread does last, whichever transport it served: frees its
/// batch and clears its pending gauge.
fn finish(qs: &QueueShared, ctx: &mut QueueCtx, qid: u16) {
    ctx.flush_frees();
    qs.pending.store(0, Ordering::SeqCst);
    log::info!("queue {qid} thread {}: done", libublk::io::io_thread_idx());
}

/// Seconds since boot (`CLOCK_BOOTTIME`, the clock of `/proc/uptime`).
pub fn uptime_s() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the local `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

/// Counts a queue thread out when it ends, however it ends, and marks its
/// tick answer [`GONE`] so that no one waits for it.
struct AliveGuard<'a>(&'a AtomicUsize, Option<&'a AtomicU64>);

impl Drop for AliveGuard<'_> {
    fn drop(&mut self) {
        if let Some(done) = self.1 {
            done.store(GONE, Ordering::SeqCst);
        }
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What serving one tag needs of its queue thread: the ring, the engine
/// context, the log's rate limit, the backing reads out.
struct TagIo<'t, 'q, 'a> {
    q: &'t UblkQueue<'q>,
    ctx: &'t mut QueueCtx,
    rl: &'t mut RateLimit,
    reads: &'t mut BackingReads<'a>,
}

impl TagIo<'_, '_, '_> {
    /// Handles the request in `tag`; true when it is completed, false
    /// while it waits for a backing read (or the tag has no buffer).
    fn serve_request(&mut self, tag: u16, bufs: &mut [IoBuf<u8>]) -> bool {
        let iod = IoDesc::from(self.q.get_iod(tag));
        let Some(buf) = bufs.get_mut(usize::from(tag)) else {
            log::error!("queue {}: tag {tag} out of range", self.q.get_qid());
            return false;
        };
        let served = handle_io(self.ctx, &iod, buf.as_mut_slice(), self.rl);
        self.complete_or_wait(tag, &iod, buf, served)
    }

    /// Goes on with the request in `tag` whose backing read landed with
    /// `res`; true when it is completed.
    fn resume_request(&mut self, tag: u16, bufs: &mut [IoBuf<u8>], res: i32) -> bool {
        let (Some((w, bytes)), Some(buf)) =
            (self.reads.landed(tag, res), bufs.get_mut(usize::from(tag)))
        else {
            return false;
        };
        let iod = IoDesc::from(self.q.get_iod(tag));
        let landed = (w, Blocks::Landed(bytes));
        let served = handle_resume(self.ctx, &iod, buf.as_mut_slice(), landed, self.rl);
        self.complete_or_wait(tag, &iod, buf, served)
    }

    /// A batch queue's [`TagIo::resume_request`]: the request's result
    /// once it has one.
    fn resume_batch(&mut self, tag: u16, batch: &mut UblkBatchQueue, res: i32) -> Option<i32> {
        let (w, bytes) = self.reads.landed(tag, res)?;
        let Some(buf) = batch.io_buf_mut(tag) else {
            return Some(-libc::EIO);
        };
        let iod = IoDesc::from(self.q.get_iod(tag));
        let landed = (w, Blocks::Landed(bytes));
        let served = handle_resume(self.ctx, &iod, buf.as_mut_slice(), landed, self.rl);
        self.result_or_wait(tag, &iod, buf.as_mut_slice(), served)
    }

    /// Completes the request in `tag` when `served` has its result; true
    /// then.
    fn complete_or_wait(
        &mut self,
        tag: u16,
        iod: &IoDesc,
        buf: &mut IoBuf<u8>,
        served: Served,
    ) -> bool {
        let Some(res) = self.result_or_wait(tag, iod, buf.as_mut_slice(), served) else {
            return false;
        };
        let done = self.q.complete_io_cmd_unified(
            tag,
            BufDesc::Slice(buf.as_slice()),
            Ok(UblkIORes::Result(res)),
        );
        if let Err(e) = done {
            log::error!(
                "queue {}: completing tag {tag}: {}",
                self.q.get_qid(),
                UblkCause(&e)
            );
        }
        true
    }

    /// The result of the request in `tag` once `served` has one; `None`
    /// while it waits for the backing read queued here (a read that finds
    /// every group buffer taken is read here instead; one that cannot be
    /// queued fails the request with EIO).
    fn result_or_wait(
        &mut self,
        tag: u16,
        iod: &IoDesc,
        buf: &mut [u8],
        mut served: Served,
    ) -> Option<i32> {
        loop {
            match served {
                Served::Done(res) => return Some(res),
                Served::Wait(w) => {
                    let blocks = match self.reads.submit(self.q, tag, w) {
                        Ok(()) => return None,
                        Err(Unqueued::Busy(w)) => (w, Blocks::ReadHere),
                        Err(Unqueued::Failed(w, e)) => (w, Blocks::Landed(Err(e))),
                    };
                    served = handle_resume(self.ctx, iod, buf, blocks, self.rl);
                }
            }
        }
    }
}

/// Logs why queue `qid`'s loop ended, unless it is the queue going down.
fn queue_ended(qid: u16, e: &UblkError) {
    if !matches!(e, UblkError::QueueIsDown) {
        log::error!("queue {qid}: {}", UblkCause(e));
    }
}

/// Queues a read of the kick eventfd on this thread's ring.
fn submit_tick_read(q: &UblkQueue, qs: &QueueShared) {
    // The kernel writes the counter into `kick_buf`, which lives in the
    // shared state: a read still pending when the queue thread ends never
    // lands on a dead stack frame.
    let buf = qs.kick_buf.as_ptr().cast::<u8>();
    let fd = io_uring::types::Fd(qs.kick.as_raw_fd());
    let sqe = io_uring::opcode::Read::new(fd, buf, 8)
        .build()
        .user_data(UblkIOCtx::build_user_data(0, TICK_OP, 0, true));
    if let Err(e) = q.ublk_submit_sqe_sync(sqe) {
        log::warn!(
            "queue {}: cannot arm the tick: {}",
            q.get_qid(),
            UblkCause(&e)
        );
    }
}

/// Stand-ins for queue threads, for tests of the control side.
#[cfg(test)]
pub(crate) mod fake {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use zblk::PAGE_SIZE;

    /// Counts `n` requests as served by queue `qid`, as a busy device would.
    pub fn serve_requests(q: &Queues, qid: usize, n: u64) {
        q.threads[qid].served.fetch_add(n, Ordering::Relaxed);
    }

    /// Marks every queue thread gone (for tests that start none).
    pub fn no_threads(q: &Queues) {
        q.alive.store(0, Ordering::SeqCst);
        q.threads
            .iter()
            .for_each(|s| s.done.store(GONE, Ordering::SeqCst));
    }

    /// Stands in for queue thread `qid`: writes ten pages and discards them
    /// with its context (leaving ten handles batched), then answers kicks
    /// on its eventfd as the real queue does, until a kick finds `stop`.
    pub fn queue(
        shared: Arc<Queues>,
        qid: u16,
        stop: Arc<AtomicBool>,
    ) -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || {
            let _alive = AliveGuard(&shared.alive, Some(&shared.threads[usize::from(qid)].done));
            let mut ctx = shared.take_ctx(usize::from(qid)).unwrap();
            let page: Vec<u8> = (0..PAGE_SIZE)
                .map(|i| (i % 251) as u8 ^ qid as u8)
                .collect();
            let base = u64::from(qid) * 100 * PAGE_SIZE as u64;
            for i in 0..10u64 {
                ctx.write(base + i * PAGE_SIZE as u64, &page).unwrap();
            }
            // Ten handles detached: fewer than a free batch, so they wait.
            ctx.discard(base, 10 * PAGE_SIZE as u64).unwrap();
            assert_eq!(ctx.pending_frees(), 10);
            let qs = &shared.threads[usize::from(qid)];
            loop {
                let mut b = [0u8; 8];
                // SAFETY: blocking read of 8 bytes into a local buffer from
                // an eventfd the shared state owns.
                let n = unsafe { libc::read(qs.kick.as_raw_fd(), b.as_mut_ptr().cast(), 8) };
                assert_eq!(n, 8);
                shared.on_tick(qs, &mut ctx);
                if stop.load(Ordering::SeqCst) {
                    return;
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_io_thread_has_its_own_slot() {
        let flags = ["-s", "1M", "-q", "2", "-d", "4", "--io-buf", "4K"];
        let cfg = DeviceConfig::from_flags(flags.iter().chain(&["--io-threads", "2"])).unwrap();
        let q = Queues::new(&cfg).unwrap();
        assert_eq!(q.threads.len(), 4);
        assert_eq!(q.alive(), 4);
        assert_eq!(q.slot(1, 1), Some(3));
        assert_eq!(q.slot(0, 2), None, "no third thread a queue");
        assert_eq!(q.slot(2, 0), None, "no third queue");
        assert!(q.take_ctx(3).is_some() && q.take_ctx(3).is_none());
        fake::serve_requests(&q, 3, 5);
        assert_eq!(q.served_total(), 5);
        let one = Queues::new(&DeviceConfig::from_flags(flags).unwrap()).unwrap();
        assert_eq!((one.threads.len(), one.slot(1, 0)), (2, Some(1)));
    }
}
