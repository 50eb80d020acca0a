//! The request path: [`QueueCtx`], one per queue thread, and the four
//! operations it runs over page-aligned byte ranges, each going down one
//! layer at a time, never back up:
//!
//! - write: [`QueueCtx::write`] -> `write::write_group` (per compression
//!   group) -> `packed::pack_group` or `write::plan_per_page` ->
//!   `alloc_bulk` -> `SlotTable::install_group`;
//! - read: [`QueueCtx::read_begin`] -> `read::read_page_or_backed` (per
//!   page, under its lock) -> the codec; a written-back page stops the
//!   request as a [`ReadStep::Wait`] for its block, which the caller reads
//!   (the daemon through its queue's io_uring; [`QueueCtx::read`] with
//!   `pread`) before [`QueueCtx::read_resume`] -> `read::finish_backed`
//!   goes on from that page;
//! - discard and write-zeroes: [`QueueCtx::discard`] ->
//!   `SlotTable::install` of an empty entry -> `SlotTable::release` -> the
//!   queue's free batch.
//!
//! Each request is timed and counted here, once, in its queue's
//! statistics shard.

use super::Store;
use crate::ctx::CtxState;
use crate::error::{Error, Result};
use crate::page::{PAGE_SIZE, PAGE_SIZE_U64};
use crate::read::{self, BackedRead, PageRead};
use crate::slot::Entry;
use crate::stats::{Counter, Op, Phase};
use crate::workers::{Job, JobOp};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A read request in progress: its pages, the next one to read, when it
/// began.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ReadReq {
    first: u64,
    pages: usize,
    next: usize,
    t0: Instant,
}

/// A read request waiting for blocks of the backing store: those holding
/// its next page, which is written back (one block for a per-page object,
/// a packed group's run for a page of a group).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackingWait {
    req: ReadReq,
    backed: BackedRead,
    /// Reads of this block so far beyond the first (one more is made when
    /// the first fails its checksum).
    tries: u8,
}

impl BackingWait {
    /// Where the blocks begin in the backing store, in bytes.
    pub fn offset(&self) -> u64 {
        self.backed.block_offset()
    }

    /// How many bytes to read: whole blocks, one for a per-page object, at
    /// most [`Store::backing_read_bytes`].
    pub fn bytes(&self) -> usize {
        self.backed.bytes()
    }
}

/// Where a read request stands after [`QueueCtx::read_begin`] or
/// [`QueueCtx::read_resume`]: done (the request's result is the call's),
/// or waiting for a block of the backing store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadStep {
    /// Every page is in the buffer.
    Done,
    /// The caller reads this block, then resumes.
    Wait(BackingWait),
}

/// The per-thread context every store operation runs with: one per queue
/// thread, holding its codec, scratch, statistics shard and free batch.
pub struct QueueCtx {
    store: Arc<Store>,
    st: CtxState,
    id: usize,
    /// This context's requests as the compression workers see them (one,
    /// reused), when the store has workers.
    job: Option<Arc<Job>>,
}

impl Store {
    /// Creates a per-thread context (one per queue).
    pub fn new_ctx(self: &Arc<Self>) -> QueueCtx {
        let (id, st) = self.new_state();
        QueueCtx {
            store: self.clone(),
            st,
            id,
            job: self.workers.as_ref().map(|_| Arc::new(Job::default())),
        }
    }
}

impl QueueCtx {
    /// This context's index (its queue number).
    pub fn id(&self) -> usize {
        self.id
    }

    /// The store this context serves.
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// Writes `data` (a multiple of 4 KB) at byte `offset`, one
    /// compression group at a time.
    pub fn write(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        let (store, st) = (&*self.store, &mut self.st);
        let t0 = Instant::now();
        let r = 'request: {
            let (first, pages) = match check_range(store, st, offset, data.len() as u64) {
                Ok(range) => range,
                Err(e) => break 'request Err(e),
            };
            st.now = store.now();
            keep_heap_room(store, st);
            if let Err(e) = write_groups(store, st, self.job.as_ref(), first, data) {
                st.shard.add(Counter::FailedWrites, 1);
                charge_total(st, Phase::Write, t0.elapsed());
                break 'request Err(e);
            }
            st.free.end_request(store.table.frees());
            st.shard.add(Counter::NumWrites, 1);
            st.shard.add(Counter::PagesWritten, pages as i64);
            record_latency(st, Op::Write, t0, pages);
            Ok(())
        };
        st.count_accel_events();
        r
    }

    /// Reads `buf.len()` bytes (a multiple of 4 KB) at byte `offset`,
    /// written-back pages' blocks read here, with `pread`.
    pub fn read(&mut self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let mut step = self.read_begin(offset, buf)?;
        while let ReadStep::Wait(w) = step {
            step = self.read_here(w, buf)?;
        }
        Ok(())
    }

    /// Starts reading `buf.len()` bytes (a multiple of 4 KB) at byte
    /// `offset`, as far as the first written-back page: its block is the
    /// caller's to read (from [`Store::backing_fd`], at
    /// [`BackingWait::offset`], into an aligned buffer) before it calls
    /// [`QueueCtx::read_resume`] with the same `buf`. A store without a
    /// backing store always answers [`ReadStep::Done`].
    pub fn read_begin(&mut self, offset: u64, buf: &mut [u8]) -> Result<ReadStep> {
        let (store, st) = (&*self.store, &mut self.st);
        let t0 = Instant::now();
        let (first, pages) = check_range(store, st, offset, buf.len() as u64)?;
        st.now = store.now();
        keep_heap_room(store, st);
        let req = ReadReq {
            first,
            pages,
            next: 0,
            t0,
        };
        // With a backing store a read runs here alone, so that a
        // written-back page stops it rather than a worker's group.
        if store.table.backing().is_none() {
            let r = read_pages(store, st, self.job.as_ref(), first, buf);
            return end_read(st, &req, r).map(|()| ReadStep::Done);
        }
        self.read_on(req, buf)
    }

    /// Goes on with the read `w` once its block has landed (`block`: its
    /// bytes, or why they could not be read, which fails the request).
    pub fn read_resume(
        &mut self,
        mut w: BackingWait,
        buf: &mut [u8],
        block: std::io::Result<&[u8]>,
    ) -> Result<ReadStep> {
        let (store, st) = (&*self.store, &mut self.st);
        let at = w.req.next * PAGE_SIZE;
        let Some(out) = buf.get_mut(at..at + PAGE_SIZE) else {
            let e = Error::Backing(format!("a read resumed with {} bytes", buf.len()));
            return end_read(st, &w.req, Err(e)).map(|()| ReadStep::Done);
        };
        let r = block
            .map_err(|e| {
                let block = w.backed.blocks().start;
                Error::Backing(format!("reading backing block {block}: {e}"))
            })
            .and_then(|bytes| read::finish_backed(&store.table, st, &w.backed, bytes, out));
        match r {
            Ok(true) => {
                w.req.next += 1;
                self.read_on(w.req, buf)
            }
            Ok(false) => self.read_on(w.req, buf),
            // Once more: the block may have been freed and reused between
            // its read and the slot's check (see `read::finish_backed`).
            Err(Error::Corrupt { .. }) if w.tries == 0 => {
                w.tries += 1;
                Ok(ReadStep::Wait(w))
            }
            Err(e) => end_read(st, &w.req, Err(e)).map(|()| ReadStep::Done),
        }
    }

    /// Reads the pages of `req` from its next one on, in this thread, as
    /// far as the next written-back page.
    fn read_on(&mut self, mut req: ReadReq, buf: &mut [u8]) -> Result<ReadStep> {
        let (table, st) = (&self.store.table, &mut self.st);
        let pages = buf.chunks_exact_mut(PAGE_SIZE).enumerate().skip(req.next);
        for (i, out) in pages {
            match read::read_page_or_backed(table, st, req.first + i as u64, out) {
                Ok(PageRead::Done) => {}
                Ok(PageRead::Backed(backed)) => {
                    req.next = i;
                    let tries = 0;
                    return Ok(ReadStep::Wait(BackingWait { req, backed, tries }));
                }
                Err(e) => return end_read(st, &req, Err(e)).map(|()| ReadStep::Done),
            }
        }
        end_read(st, &req, Ok(())).map(|()| ReadStep::Done)
    }

    /// [`QueueCtx::read_resume`] with `w`'s blocks read here, with
    /// `pread`, into this thread's backing buffer: for a caller that
    /// cannot read them itself just now.
    pub fn read_here(&mut self, w: BackingWait, buf: &mut [u8]) -> Result<ReadStep> {
        let Some(mut block) = self.st.bd_buf.take() else {
            let e = Error::Backing("this queue has no backing read buffer".into());
            return end_read(&mut self.st, &w.req, Err(e)).map(|()| ReadStep::Done);
        };
        let landed = match self.store.table.backing() {
            Some(b) => b.read_blocks(w.backed.blocks(), &mut block),
            None => Err("the store has no backing device".into()),
        };
        // Every written-back page a request meets comes back as a wait
        // (`read_on`), so nothing reads into the buffer while the request
        // goes on with its bytes; it is given back once that returns.
        let bytes = landed
            .map(|()| &block.as_slice()[..w.bytes()])
            .map_err(std::io::Error::other);
        let r = self.read_resume(w, buf, bytes);
        self.st.bd_buf = Some(block);
        r
    }

    /// Discards `len` bytes at `offset`: the pages read as zeros afterwards
    /// and their memory is freed.
    pub fn discard(&mut self, offset: u64, len: u64) -> Result<()> {
        let (store, st) = (&*self.store, &mut self.st);
        let t0 = Instant::now();
        let (first, pages) = check_range(store, st, offset, len)?;
        keep_heap_room(store, st);
        for page in first..first + pages as u64 {
            store.table.install(st, page, Entry::EMPTY, 0);
        }
        st.free.end_request(store.table.frees());
        st.shard.add(Counter::NotifyFree, pages as i64);
        st.shard.add(Counter::NumDiscards, 1);
        record_latency(st, Op::Discard, t0, pages);
        Ok(())
    }

    /// Zeroes `len` bytes at `offset`. An empty slot reads as zeros and
    /// costs nothing, so this is a discard, as in zram.
    pub fn write_zeroes(&mut self, offset: u64, len: u64) -> Result<()> {
        self.discard(offset, len)
    }

    /// Faults in, on the calling thread, the memory this context's requests
    /// use (its buffers and its codec's workspace), so that the first
    /// request, which a swap device gets when memory has run out, takes no
    /// fresh page. A queue thread calls it before serving.
    pub fn prefault(&mut self) {
        self.st.prefault();
    }

    /// Frees the handles this context has batched (idle timer, stat, exit).
    pub fn flush_frees(&mut self) {
        self.st.free.flush(self.store.table.frees());
    }

    /// Handles batched in this context and not yet freed.
    pub fn pending_frees(&self) -> usize {
        self.st.free.pending()
    }
}

impl Drop for QueueCtx {
    fn drop(&mut self) {
        self.flush_frees();
    }
}

/// Stores `data` at page `first`, one compression group at a time: shared
/// with the store's idle compression workers when it has any and the
/// request has more than one group, else all on this thread. Stops at
/// (alone) or reports (shared) the first failing group.
fn write_groups(
    store: &Store,
    st: &mut CtxState,
    job: Option<&Arc<Job>>,
    first: u64,
    data: &[u8],
) -> Result<()> {
    if let (Some(w), Some(job)) = (&store.workers, job) {
        let (table, cfg) = (&store.table, &store.cfg);
        let ptr = data.as_ptr().cast_mut();
        // SAFETY: `data` is borrowed for this whole call and only read
        // (`JobOp::Write`); the store outlives it; `job` is this
        // context's own, and `&mut self` of the caller makes its requests
        // one at a time.
        let shared = unsafe { w.run(job, JobOp::Write, table, cfg, st, first, ptr, data.len()) };
        if let Some(r) = shared {
            return r;
        }
    }
    let g = store.cfg.group_pages;
    for (i, chunk) in data.chunks(g * PAGE_SIZE).enumerate() {
        let at = first + (i * g) as u64;
        crate::write::write_group(&store.table, &store.cfg, st, at, chunk)?;
    }
    Ok(())
}

/// Reads the pages from `first` into `buf`: in groups shared with idle
/// compression workers as [`write_groups`] does, or page by page here.
fn read_pages(
    store: &Store,
    st: &mut CtxState,
    job: Option<&Arc<Job>>,
    first: u64,
    buf: &mut [u8],
) -> Result<()> {
    if let (Some(w), Some(job)) = (&store.workers, job) {
        let (table, cfg) = (&store.table, &store.cfg);
        let (ptr, len) = (buf.as_mut_ptr(), buf.len());
        // SAFETY: `buf` is borrowed mutably for this whole call and not
        // touched here until `run` returns, after every group is done; the
        // rest as in `write_groups`.
        let shared = unsafe { w.run(job, JobOp::Read, table, cfg, st, first, ptr, len) };
        if let Some(r) = shared {
            return r;
        }
    }
    for (i, out) in buf.chunks_exact_mut(PAGE_SIZE).enumerate() {
        crate::read::read_page(&store.table, st, first + i as u64, out)?;
    }
    Ok(())
}

/// Checks a byte range against `store`'s size and returns its first page
/// and page count; a range that fails counts as an invalid request.
/// Ends read request `req` with `r`: counted, timed, its codec's
/// accelerator events taken.
fn end_read(st: &mut CtxState, req: &ReadReq, r: Result<()>) -> Result<()> {
    match &r {
        Ok(()) => {
            st.shard.add(Counter::NumReads, 1);
            st.shard.add(Counter::PagesRead, req.pages as i64);
            record_latency(st, Op::Read, req.t0, req.pages);
        }
        Err(_) => {
            // Reported by the caller (the daemon logs it rate-limited): a
            // corrupt page read over and over must not flood the log.
            st.shard.add(Counter::FailedReads, 1);
            charge_total(st, Phase::Read, req.t0.elapsed());
        }
    }
    st.count_accel_events();
    r
}

/// With a memory reserve, keeps heap room for this thread's allocations
/// while memory is short (`CtxState::keep_heap_room`); a store without one
/// never runs short by its own measure.
fn keep_heap_room(store: &Store, st: &mut CtxState) {
    if store.cfg.reserve {
        st.keep_heap_room(store.table.allocator().memory_short());
    }
}

fn check_range(store: &Store, st: &CtxState, offset: u64, len: u64) -> Result<(u64, usize)> {
    let r = if offset % PAGE_SIZE_U64 != 0 || len % PAGE_SIZE_U64 != 0 {
        Err(Error::Misaligned { offset, len })
    } else {
        match offset.checked_add(len) {
            Some(end) if end <= store.cfg.size => {
                Ok((offset / PAGE_SIZE_U64, (len / PAGE_SIZE_U64) as usize))
            }
            _ => Err(Error::OutOfRange {
                offset,
                len,
                size: store.cfg.size,
            }),
        }
    };
    if r.is_err() {
        st.shard.add(Counter::InvalidIo, 1);
    }
    r
}

/// With phase timers, charges a request's whole time (`took`) to its
/// operation's phase; a failed request too, whose parts were charged as
/// they ran.
fn charge_total(st: &CtxState, phase: Phase, took: Duration) {
    if st.timing() {
        st.shard.charge(phase, took.as_nanos() as u64);
    }
}

/// Records a request's per-page latency, and with phase timers its whole
/// time in the phase of its operation.
fn record_latency(st: &CtxState, op: Op, t0: Instant, pages: usize) {
    if pages > 0 {
        let took = t0.elapsed();
        st.shard
            .record(op, took.as_nanos() as u64 / pages as u64, pages as u64);
        let phase = match op {
            Op::Write => Phase::Write,
            Op::Read => Phase::Read,
            Op::Discard => Phase::Discard,
            Op::Writeback => return,
        };
        charge_total(st, phase, took);
    }
}
