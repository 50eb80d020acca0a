//! [`StoreStats`]: everything `zblk stat` shows about a store, every
//! queue's statistics shard merged into one snapshot.

use super::Store;
use crate::config::Mode;
use crate::page::PAGE_SIZE_U64;
use crate::stats::{self, Counters, Latencies, PhaseTimes};
use serde::Serialize;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

/// Longest a stat waits for the drain thread to free what is queued.
const STATS_SETTLE: Duration = Duration::from_millis(200);

/// Everything `zblk stat` shows about a store, merged from all shards.
#[derive(Debug, Clone, Serialize)]
pub struct StoreStats {
    /// Device size in bytes.
    pub disksize: u64,
    /// Compression algorithm.
    pub algorithm: String,
    /// Pages per compression group.
    pub group_pages: usize,
    /// Per-page or packed objects.
    pub mode: Mode,
    /// Counters summed over all queues.
    #[serde(flatten)]
    pub counters: Counters,
    /// Bytes the allocator holds (metadata and waste included).
    pub mem_used_total: u64,
    /// Peak of `mem_used_total`.
    pub mem_used_max: u64,
    /// Memory limit in bytes (0: none).
    pub mem_limit: u64,
    /// Pages given back by compaction since creation.
    pub pages_compacted: u64,
    /// Bytes of `mem_used_total` held as empty zspages kept for reuse
    /// (given back after a second without reuse, or by compaction).
    pub mem_spare: u64,
    /// Objects whose size class had no room left in the memory reserve
    /// (`StoreConfig::reserve`) when a write asked.
    pub reserve_misses: u64,
    /// Of those, objects placed in a larger size class.
    pub reserve_fallbacks: u64,
    /// Of those, objects refused after waiting for the provisioner: their
    /// writes failed with ENOSPC (counted in `failed_writes` too).
    pub reserve_refusals: u64,
    /// Handles detached but not yet freed.
    pub deferred_free_pending: u64,
    /// Bytes of slot table (16 per page of device size).
    pub slot_table_bytes: u64,
    /// Whether the store lives in shared memory (recoverable).
    pub shared: bool,
    /// Times the store was taken over from a dead process; event counters
    /// (I/O counts, latencies) restart at each, gauges are recounted.
    pub recoveries: u64,
    /// When the last recovery was, seconds since the epoch (0: never).
    pub recovered_at: u64,
    /// Slots the last recovery emptied because their entries could not be
    /// trusted (0 unless memory was corrupted).
    pub recovery_dropped: u64,
    /// The secondary algorithms recompressed pages are held by, in the
    /// order slots name them, separated by spaces (empty, and left out of
    /// the JSON, until the first `recompress` chose one).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub recompress_algorithm: String,
    /// The backing device or file (empty, and left out of the JSON, when
    /// the store has none).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub backing_dev: String,
    /// Whether the backing store is opened `O_DIRECT` (false: buffered,
    /// the file system refused it).
    pub bd_direct: bool,
    /// Bytes of backing store.
    pub bd_size: u64,
    /// Bytes of backing blocks holding at least one written-back object.
    pub bd_used_bytes: u64,
    /// Whether a writeback limit is in force (zram's
    /// `writeback_limit_enable`).
    pub writeback_limit_enable: bool,
    /// Pages writeback may still write while the limit is in force (zram's
    /// `writeback_limit`); 0 when it is not.
    pub writeback_limit: u64,
    /// Per-page latency percentiles.
    pub latency: Latencies,
    /// With phase timers (`StoreConfig::phase_timers`): the time requests
    /// spent in each phase since this process made or recovered the store;
    /// left out of the JSON otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phases: Option<PhaseTimes>,
    /// The counters of each queue context, in queue order (the compression
    /// workers' are in the totals alone).
    pub queues: Vec<Counters>,
}

impl Store {
    /// Merges every queue's statistics into one snapshot.
    pub fn stats(&self) -> StoreStats {
        // A stat asks for the truth: let the drain free what is queued
        // (bounded, so a stat never hangs behind a very long queue).
        self.settle_frees(STATS_SETTLE);
        let shards = self
            .shards
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let recounted = self.inherited.gauges.iter().map(|s| &**s);
        let workers: Vec<_> = self.workers.iter().flat_map(|w| w.shards()).collect();
        let all = || shards.iter().chain(workers.iter().copied()).map(|s| &**s);
        let (counters, latency) = stats::merge(recounted.chain(all()));
        let queues = shards.iter().map(|s| stats::sum_counters([&**s])).collect();
        // Handles detached (counted per queue) minus those freed so far:
        // partial batches in contexts plus what the drain has not reached.
        let freed = self.table.frees().freed();
        let deferred_free_pending = counters.deferred_frees.saturating_sub(freed);
        let alloc = self.table.allocator();
        let backing = self.table.backing();
        let wb_limit = self.wb_limit.load(Relaxed);
        let reserve = alloc.reserve_stats();
        StoreStats {
            disksize: self.cfg.size,
            algorithm: self.cfg.algo.to_string(),
            group_pages: self.cfg.group_pages,
            mode: self.cfg.mode,
            counters,
            mem_used_total: alloc.mem_used_total(),
            mem_used_max: alloc.mem_used_max(),
            mem_limit: alloc.mem_limit(),
            pages_compacted: self.pages_compacted.load(Relaxed),
            mem_spare: alloc.spare_pages() * PAGE_SIZE_U64,
            reserve_misses: reserve.misses,
            reserve_fallbacks: reserve.fallbacks,
            reserve_refusals: reserve.refusals,
            deferred_free_pending,
            slot_table_bytes: self.table.bytes(),
            shared: self.table.shared().is_some(),
            recoveries: self.inherited.recoveries,
            recovered_at: self.inherited.recovered_at,
            recovery_dropped: self.inherited.dropped,
            recompress_algorithm: crate::secondary::list_to_string(&self.secondaries.list()),
            backing_dev: backing
                .map(|b| b.path().display().to_string())
                .unwrap_or_default(),
            bd_direct: backing.is_some_and(|b| b.is_direct()),
            bd_size: backing.map_or(0, |b| b.size()),
            bd_used_bytes: backing.map_or(0, |b| b.used_bytes()),
            writeback_limit_enable: wb_limit != u64::MAX,
            writeback_limit: if wb_limit == u64::MAX { 0 } else { wb_limit },
            latency,
            phases: self.cfg.phase_timers.then(|| stats::merge_phases(all())),
            queues,
        }
    }
}
