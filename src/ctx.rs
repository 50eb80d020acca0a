//! `QueueCtx`: everything one queue thread owns.
//!
//! One per ublk queue (per CPU): its codec instance with context and scratch,
//! its statistics shard, its batch of handles to free. Nothing in it is
//! shared on the I/O path, which is what keeps the hot path free of locks.

use crate::codec::{AccelEvents, Codec};
use crate::free::FreeBatch;
use crate::group::GroupPlan;
use crate::packed::PackCache;
use crate::page::PAGE_SIZE;
use crate::stats::{Counter, StatsShard};
use crate::store::{Mode, Store, StoreConfig};
use std::sync::Arc;

/// The mutable state of one queue thread, passed to the store's operations.
pub(crate) struct CtxState {
    pub(crate) codec: Box<dyn Codec>,
    /// Compression output for one group: one page-sized area per page.
    pub(crate) scratch: Vec<u8>,
    pub(crate) shard: Arc<StatsShard>,
    pub(crate) free: FreeBatch,
    /// Reused per-group vectors, so a write allocates nothing on the heap.
    pub(crate) plan: GroupPlan,
    /// Packed mode: the input pages of a group gathered contiguously.
    pub(crate) gather: Vec<u8>,
    /// Packed mode: the last group decompressed by a read.
    pub(crate) pack_cache: PackCache,
    /// Packed mode: the id the next packed object gets (queue in the top bits).
    pub(crate) next_pack_id: u64,
}

impl CtxState {
    /// Fresh state for a thread of `cfg`'s store, writing into `shard`.
    pub(crate) fn new(cfg: &StoreConfig, id: usize, shard: Arc<StatsShard>) -> Self {
        let g = cfg.group_pages;
        let packed = cfg.mode == Mode::Packed;
        CtxState {
            codec: match &cfg.codecs {
                Some(make) => (make.0)(),
                None => cfg.algo.new_codec(),
            },
            scratch: vec![0u8; g * PAGE_SIZE],
            shard,
            free: FreeBatch::new(),
            plan: GroupPlan::with_capacity(g),
            gather: vec![0u8; if packed { g * PAGE_SIZE } else { 0 }],
            pack_cache: PackCache::with_capacity(if packed { g } else { 0 }),
            // Ids are never 0 (the empty cache) and never repeat across queues.
            next_pack_id: ((id as u64 + 1) << 40) + 1,
        }
    }
}

/// The per-thread context every store operation runs with.
pub struct QueueCtx {
    store: Arc<Store>,
    st: CtxState,
    id: usize,
}

impl QueueCtx {
    pub(crate) fn new(store: Arc<Store>, id: usize, shard: Arc<StatsShard>) -> Self {
        let st = CtxState::new(store.config(), id, shard);
        QueueCtx { store, st, id }
    }

    /// This context's index (its queue number).
    pub fn id(&self) -> usize {
        self.id
    }

    /// The store this context serves.
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// Writes `data` (a multiple of 4 KB) at byte `offset`.
    pub fn write(&mut self, offset: u64, data: &[u8]) -> crate::Result<()> {
        let r = self.store.write(&mut self.st, offset, data);
        self.count_accel_events();
        r
    }

    /// Reads `buf.len()` bytes (a multiple of 4 KB) at byte `offset`.
    pub fn read(&mut self, offset: u64, buf: &mut [u8]) -> crate::Result<()> {
        let r = self.store.read(&mut self.st, offset, buf);
        self.count_accel_events();
        r
    }

    /// Adds what the codec's accelerator went through to this queue's
    /// statistics (software codecs report nothing).
    fn count_accel_events(&mut self) {
        let ev = self.st.codec.take_accel_events();
        if ev == AccelEvents::default() {
            return;
        }
        let sh = &self.st.shard;
        sh.add(Counter::AccelPageFaults, ev.page_faults as i64);
        sh.add(Counter::AccelTimeouts, ev.timeouts as i64);
        sh.add(Counter::AccelVerifyFailures, ev.verify_failures as i64);
        sh.add(Counter::AccelDeviceErrors, ev.device_errors as i64);
        sh.add(Counter::AccelSubmitFailures, ev.submit_failures as i64);
        sh.add(Counter::AccelDecompressed, ev.decompressed as i64);
    }

    /// Discards `len` bytes at `offset`: the pages read as zeros afterwards
    /// and their memory is freed.
    pub fn discard(&mut self, offset: u64, len: u64) -> crate::Result<()> {
        self.store.discard(&mut self.st, offset, len)
    }

    /// Zeroes `len` bytes at `offset` (same effect as discard in zblk).
    pub fn write_zeroes(&mut self, offset: u64, len: u64) -> crate::Result<()> {
        self.store.write_zeroes(&mut self.st, offset, len)
    }

    /// Frees the handles this context has batched (idle timer, stat, exit).
    pub fn flush_frees(&mut self) {
        self.st.free.flush(self.store.frees());
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
