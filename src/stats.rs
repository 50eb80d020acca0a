//! Per-CPU statistics: counters and latency histograms, merged on read.
//!
//! Each [`crate::ctx::QueueCtx`] owns one [`StatsShard`] and is the only
//! writer of it, so an update is a plain load and store (no locked
//! read-modify-write, no shared cache line). A snapshot sums all shards.
//! Gauges that one queue raises and another lowers (a page written on queue 0
//! and discarded on queue 1) are kept as wrapping deltas: each shard may go
//! "negative", the sum is exact.

use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// The counters every shard keeps, by index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum Counter {
    /// Compressed bytes stored (huge pages count 4096).
    ComprDataSize,
    /// Slots holding a same-filled page.
    SamePages,
    /// Slots holding a page stored raw.
    HugePages,
    /// Huge pages stored since creation (zram's huge_pages_since).
    HugePagesSince,
    /// Slots holding anything (same-filled, huge or compressed).
    StoredPages,
    /// Read requests that failed.
    FailedReads,
    /// Write requests that failed.
    FailedWrites,
    /// Requests refused for bad ranges or buffers.
    InvalidIo,
    /// Pages freed by discard or write-zeroes.
    NotifyFree,
    /// Read requests completed.
    NumReads,
    /// Write requests completed.
    NumWrites,
    /// Discard and write-zeroes requests completed.
    NumDiscards,
    /// Pages read.
    PagesRead,
    /// Pages written.
    PagesWritten,
    /// Compression groups written.
    Groups,
    /// Compression groups written on a compression worker (the rest of
    /// `Groups` ran on queue threads).
    WorkerGroups,
    /// Read requests' groups of pages decoded on a compression worker.
    WorkerReadGroups,
    /// Pages compressed by the software codec.
    SwPages,
    /// Pages compressed by an accelerator work queue.
    AccelPages,
    /// Handles handed to deferred free (not necessarily freed yet).
    DeferredFrees,
    /// Compressed bytes of packed objects held only by discarded or
    /// overwritten pages (packed mode).
    PackedDeadBytes,
    /// Pages moved out of sparse packed groups by the compactor.
    PackedPagesRewritten,
    /// Slots marked idle and not accessed since (a gauge).
    IdlePages,
    /// Slots whose object the secondary algorithm holds (a gauge).
    RecompressedPages,
    /// Compressed bytes recompression saved (old size less new).
    RecompressSavedBytes,
    /// Accelerator: pages redone in software after a page fault.
    AccelPageFaults,
    /// Accelerator: pages redone in software after a timeout.
    AccelTimeouts,
    /// Accelerator: pages redone in software because verify failed.
    AccelVerifyFailures,
    /// Accelerator: pages redone in software after another device error.
    AccelDeviceErrors,
    /// Accelerator: pages done in software because no queue took them.
    AccelSubmitFailures,
    /// Accelerator: pages the device decompressed.
    AccelDecompressed,
    /// Slots whose page is written back to the backing store (a gauge).
    BdCount,
    /// Compressed bytes of written-back pages in the backing store (a gauge).
    BdBytes,
    /// Pages read from the backing store.
    BdReads,
    /// Pages written back to the backing store.
    BdWrites,
}

const NUM_COUNTERS: usize = Counter::BdWrites as usize + 1;

/// The operations whose per-page latency is recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum Op {
    /// Write.
    Write,
    /// Read.
    Read,
    /// Discard or write-zeroes.
    Discard,
    /// Writeback of a page to the backing store (its share of a batch).
    Writeback,
}

const NUM_OPS: usize = 4;

/// The parts of a request's time that the phase timers
/// (`StoreConfig::phase_timers`) add up, in nanoseconds summed over every
/// request: the per-page breakdown of BENCHMARKS.md. A request's total is
/// timed too, so what no phase covers (range checks, the same-filled scan,
/// the plan, statistics) is the total less its phases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum Phase {
    /// A whole write request.
    Write,
    /// Codec calls of writes (one per group, or per page without groups;
    /// a packed group that does not compress is counted twice: its try as
    /// a group, then its pages one by one).
    Compress,
    /// Bulk allocations of writes (slab: class locks, fresh zspages).
    Alloc,
    /// Copies of compressed or raw bytes into their new objects.
    Copy,
    /// Installing a group's pages in their slots (slot locks, the old
    /// objects to the free batch).
    Install,
    /// A whole read request.
    Read,
    /// Codec calls of reads (packed: the whole group, once per cache miss).
    Decode,
    /// A whole discard or write-zeroes request.
    Discard,
}

const NUM_PHASES: usize = Phase::Discard as usize + 1;

/// Sub-buckets per power of two: 8 gives at most 12.5 % bucket width.
const SUB_BITS: u32 = 3;
const SUB: usize = 1 << SUB_BITS;
/// Buckets cover 0 ns to 2^40 ns (18 minutes); larger values land in the last.
const NUM_BUCKETS: usize = 41 * SUB;

/// A log-linear histogram of nanoseconds written by one thread.
pub struct Histogram {
    buckets: Box<[AtomicU64]>,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            buckets: (0..NUM_BUCKETS).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

fn bucket_of(ns: u64) -> usize {
    if ns < SUB as u64 {
        return ns as usize;
    }
    let log = 63 - ns.leading_zeros();
    let sub = ((ns >> (log - SUB_BITS)) as usize) & (SUB - 1);
    (((log - SUB_BITS + 1) as usize) * SUB + sub).min(NUM_BUCKETS - 1)
}

/// The upper bound (ns) of bucket `b`, what percentiles report.
fn bucket_upper(b: usize) -> u64 {
    if b < SUB {
        return b as u64;
    }
    let log = (b / SUB) as u32 + SUB_BITS - 1;
    let sub = (b % SUB) as u64;
    ((SUB as u64 + sub + 1) << (log - SUB_BITS)) - 1
}

impl Histogram {
    /// Records `count` samples of `ns` nanoseconds (single writer).
    pub fn record(&self, ns: u64, count: u64) {
        let b = &self.buckets[bucket_of(ns)];
        b.store(b.load(Relaxed).wrapping_add(count), Relaxed);
    }

    fn add_into(&self, acc: &mut [u64]) {
        for (a, b) in acc.iter_mut().zip(self.buckets.iter()) {
            *a += b.load(Relaxed);
        }
    }
}

/// One queue thread's statistics; written only by its owner.
pub struct StatsShard {
    counters: [AtomicU64; NUM_COUNTERS],
    hist: [Histogram; NUM_OPS],
    phase_ns: [AtomicU64; NUM_PHASES],
}

impl Default for StatsShard {
    fn default() -> Self {
        StatsShard {
            counters: std::array::from_fn(|_| AtomicU64::new(0)),
            hist: std::array::from_fn(|_| Histogram::default()),
            phase_ns: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl StatsShard {
    /// Adds this shard's counters to `sum` (wrapping: a gauge may be
    /// "negative" in one shard and positive in another).
    fn add_counters_into(&self, sum: &mut [u64; NUM_COUNTERS]) {
        for (acc, c) in sum.iter_mut().zip(self.counters.iter()) {
            *acc = acc.wrapping_add(c.load(Relaxed));
        }
    }

    /// Adds `delta` (may be negative) to counter `c`. Only the owning thread
    /// calls this, so load-then-store cannot lose updates.
    #[inline]
    pub fn add(&self, c: Counter, delta: i64) {
        let a = &self.counters[c as usize];
        a.store(a.load(Relaxed).wrapping_add(delta as u64), Relaxed);
    }

    /// Records `pages` per-page samples of `ns_per_page` for `op`.
    #[inline]
    pub fn record(&self, op: Op, ns_per_page: u64, pages: u64) {
        self.hist[op as usize].record(ns_per_page, pages);
    }

    /// Adds `ns` to phase `p` (single writer, as [`StatsShard::add`]).
    #[inline]
    pub fn charge(&self, p: Phase, ns: u64) {
        let a = &self.phase_ns[p as usize];
        a.store(a.load(Relaxed).wrapping_add(ns), Relaxed);
    }
}

/// The phase timers of a set of shards, summed: nanoseconds spent in each
/// `Phase` by requests since this process made or recovered the store
/// (like the event counters, they restart at a recovery). Divided by
/// `pages_written` / `pages_read`, each is a per-page time.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct PhaseTimes {
    /// Whole write requests.
    pub write_ns: u64,
    /// Of which: codec calls.
    pub compress_ns: u64,
    /// Of which: bulk allocations.
    pub alloc_ns: u64,
    /// Of which: copies into new objects.
    pub copy_ns: u64,
    /// Of which: installs into slots.
    pub install_ns: u64,
    /// Whole read requests.
    pub read_ns: u64,
    /// Of which: codec calls.
    pub decode_ns: u64,
    /// Whole discard and write-zeroes requests.
    pub discard_ns: u64,
}

/// Sums the phase timers of `shards`.
pub fn merge_phases<'a>(shards: impl IntoIterator<Item = &'a StatsShard>) -> PhaseTimes {
    let mut sum = [0u64; NUM_PHASES];
    for s in shards {
        for (acc, c) in sum.iter_mut().zip(s.phase_ns.iter()) {
            *acc = acc.wrapping_add(c.load(Relaxed));
        }
    }
    let p = |x: Phase| sum[x as usize];
    PhaseTimes {
        write_ns: p(Phase::Write),
        compress_ns: p(Phase::Compress),
        alloc_ns: p(Phase::Alloc),
        copy_ns: p(Phase::Copy),
        install_ns: p(Phase::Install),
        read_ns: p(Phase::Read),
        decode_ns: p(Phase::Decode),
        discard_ns: p(Phase::Discard),
    }
}

/// Percentiles of one operation's per-page latency, in microseconds.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Latency {
    /// Samples (pages) recorded.
    pub count: u64,
    /// Median.
    pub p50_us: f64,
    /// 95th percentile.
    pub p95_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
}

impl Latency {
    fn from_buckets(b: &[u64]) -> Self {
        let count: u64 = b.iter().sum();
        let pct = |p: f64| -> f64 {
            if count == 0 {
                return 0.0;
            }
            let rank = ((count as f64) * p).ceil().max(1.0) as u64;
            let mut seen = 0;
            for (i, &n) in b.iter().enumerate() {
                seen += n;
                if seen >= rank {
                    return bucket_upper(i) as f64 / 1000.0;
                }
            }
            bucket_upper(b.len() - 1) as f64 / 1000.0
        };
        Latency {
            count,
            p50_us: pct(0.50),
            p95_us: pct(0.95),
            p99_us: pct(0.99),
        }
    }
}

/// Per-operation latency percentiles.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Latencies {
    /// Per-page write latency.
    pub write: Latency,
    /// Per-page read latency.
    pub read: Latency,
    /// Per-page discard / write-zeroes latency.
    pub discard: Latency,
    /// Per-page writeback latency (a batch's time over its pages).
    pub writeback: Latency,
}

/// The counters of a set of shards, summed.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Counters {
    /// Uncompressed bytes stored: 4 KB per stored page, same-filled pages
    /// included, as zram's `orig_data_size` (derived from `stored_pages`).
    pub orig_data_size: u64,
    /// Compressed bytes stored.
    pub compr_data_size: u64,
    /// Same-filled pages stored in their slots.
    pub same_pages: u64,
    /// Pages stored raw because they did not compress enough.
    pub huge_pages: u64,
    /// Huge pages stored since creation.
    pub huge_pages_since: u64,
    /// Slots holding data.
    pub stored_pages: u64,
    /// Failed read requests.
    pub failed_reads: u64,
    /// Failed write requests.
    pub failed_writes: u64,
    /// Requests refused for bad ranges or buffers.
    pub invalid_io: u64,
    /// Pages freed by discard or write-zeroes.
    pub notify_free: u64,
    /// Read requests.
    pub num_reads: u64,
    /// Write requests.
    pub num_writes: u64,
    /// Discard and write-zeroes requests.
    pub num_discards: u64,
    /// Pages read.
    pub pages_read: u64,
    /// Pages written.
    pub pages_written: u64,
    /// Compression groups written, wherever they ran.
    pub groups: u64,
    /// Of those, groups compressed on a compression worker; the rest ran on
    /// queue threads.
    pub worker_groups: u64,
    /// Groups of pages of read requests decoded on a compression worker.
    pub worker_read_groups: u64,
    /// Pages compressed in software.
    pub sw_pages: u64,
    /// Pages compressed by accelerator work queues.
    pub accel_pages: u64,
    /// Handles handed to deferred free.
    pub deferred_frees: u64,
    /// Compressed bytes of packed objects held only by dead pages.
    pub packed_dead_bytes: u64,
    /// Pages moved out of sparse packed groups by the compactor.
    pub packed_pages_rewritten: u64,
    /// Pages marked idle (`zblk idle`) and not accessed since.
    pub idle_pages: u64,
    /// Pages now held by the secondary algorithm (`zblk recompress`).
    pub recompressed_pages: u64,
    /// Compressed bytes recompression saved, summed over every page it
    /// replaced (since the process started).
    pub recompress_saved_bytes: u64,
    /// Accelerator: pages redone in software after a page fault.
    pub accel_page_faults: u64,
    /// Accelerator: pages redone in software after a timeout.
    pub accel_timeouts: u64,
    /// Accelerator: pages redone in software because verify failed.
    pub accel_verify_failures: u64,
    /// Accelerator: pages redone in software after another device error.
    pub accel_device_errors: u64,
    /// Accelerator: pages done in software because no work queue took them.
    pub accel_submit_failures: u64,
    /// Accelerator: pages the device decompressed.
    pub accel_decompressed: u64,
    /// Pages written back to the backing store (zram's `bd_count`).
    pub bd_count: u64,
    /// Compressed bytes those pages take in the backing store.
    pub bd_bytes: u64,
    /// Pages read from the backing store (zram's `bd_reads`).
    pub bd_reads: u64,
    /// Pages written to the backing store (zram's `bd_writes`).
    pub bd_writes: u64,
}

/// Merges shards into counters and latency percentiles.
pub fn merge<'a>(shards: impl IntoIterator<Item = &'a StatsShard>) -> (Counters, Latencies) {
    let mut sum = [0u64; NUM_COUNTERS];
    let mut hist = vec![vec![0u64; NUM_BUCKETS]; NUM_OPS];
    for s in shards {
        s.add_counters_into(&mut sum);
        for (acc, h) in hist.iter_mut().zip(s.hist.iter()) {
            h.add_into(acc);
        }
    }
    let lat = Latencies {
        write: Latency::from_buckets(&hist[Op::Write as usize]),
        read: Latency::from_buckets(&hist[Op::Read as usize]),
        discard: Latency::from_buckets(&hist[Op::Discard as usize]),
        writeback: Latency::from_buckets(&hist[Op::Writeback as usize]),
    };
    (counters_of(&sum), lat)
}

/// The counters of `shards`, summed, without the latency histograms: a
/// queue's line of `zblk stat` (merging four histograms of 328 buckets per
/// queue only to drop the percentiles was most of a stat's time).
pub fn sum_counters<'a>(shards: impl IntoIterator<Item = &'a StatsShard>) -> Counters {
    let mut sum = [0u64; NUM_COUNTERS];
    for s in shards {
        s.add_counters_into(&mut sum);
    }
    counters_of(&sum)
}

/// Raw counter sums as [`Counters`].
fn counters_of(sum: &[u64; NUM_COUNTERS]) -> Counters {
    // A gauge read while pages move between shards can be momentarily
    // "negative"; show 0 rather than 2^64.
    let g = |c: Counter| -> u64 {
        let v = sum[c as usize];
        if (v as i64) < 0 {
            0
        } else {
            v
        }
    };
    Counters {
        orig_data_size: g(Counter::StoredPages) * crate::page::PAGE_SIZE as u64,
        compr_data_size: g(Counter::ComprDataSize),
        same_pages: g(Counter::SamePages),
        huge_pages: g(Counter::HugePages),
        huge_pages_since: g(Counter::HugePagesSince),
        stored_pages: g(Counter::StoredPages),
        failed_reads: g(Counter::FailedReads),
        failed_writes: g(Counter::FailedWrites),
        invalid_io: g(Counter::InvalidIo),
        notify_free: g(Counter::NotifyFree),
        num_reads: g(Counter::NumReads),
        num_writes: g(Counter::NumWrites),
        num_discards: g(Counter::NumDiscards),
        pages_read: g(Counter::PagesRead),
        pages_written: g(Counter::PagesWritten),
        groups: g(Counter::Groups),
        worker_groups: g(Counter::WorkerGroups),
        worker_read_groups: g(Counter::WorkerReadGroups),
        sw_pages: g(Counter::SwPages),
        accel_pages: g(Counter::AccelPages),
        deferred_frees: g(Counter::DeferredFrees),
        packed_dead_bytes: g(Counter::PackedDeadBytes),
        packed_pages_rewritten: g(Counter::PackedPagesRewritten),
        idle_pages: g(Counter::IdlePages),
        recompressed_pages: g(Counter::RecompressedPages),
        recompress_saved_bytes: g(Counter::RecompressSavedBytes),
        accel_page_faults: g(Counter::AccelPageFaults),
        accel_timeouts: g(Counter::AccelTimeouts),
        accel_verify_failures: g(Counter::AccelVerifyFailures),
        accel_device_errors: g(Counter::AccelDeviceErrors),
        accel_submit_failures: g(Counter::AccelSubmitFailures),
        accel_decompressed: g(Counter::AccelDecompressed),
        bd_count: g(Counter::BdCount),
        bd_bytes: g(Counter::BdBytes),
        bd_reads: g(Counter::BdReads),
        bd_writes: g(Counter::BdWrites),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_bound_their_values() {
        let mut last = 0;
        for ns in (0..100_000u64).chain([1 << 20, 1 << 30, 1 << 39]) {
            let b = bucket_of(ns);
            assert!(b >= last || ns == 1 << 20, "ns {ns}");
            last = b;
            assert!(
                bucket_upper(b) >= ns,
                "ns {ns} bucket {b} upper {}",
                bucket_upper(b)
            );
            assert!(bucket_upper(b) <= ns + ns / 4 + 1, "ns {ns} too coarse");
        }
        assert_eq!(bucket_of(u64::MAX), NUM_BUCKETS - 1);
    }

    #[test]
    fn percentiles_of_known_distribution() {
        let s = StatsShard::default();
        s.record(Op::Write, 1_000, 90);
        s.record(Op::Write, 100_000, 10);
        let (_, lat) = merge([&s]);
        assert_eq!(lat.write.count, 100);
        assert!((1.0..=1.13).contains(&lat.write.p50_us), "{:?}", lat.write);
        assert!(
            (100.0..=113.0).contains(&lat.write.p95_us),
            "{:?}",
            lat.write
        );
        assert_eq!(lat.read.count, 0);
        assert_eq!(lat.read.p99_us, 0.0);
    }

    #[test]
    fn gauges_sum_across_shards_with_negative_deltas() {
        let a = StatsShard::default();
        let b = StatsShard::default();
        a.add(Counter::StoredPages, 5);
        b.add(Counter::StoredPages, -3);
        let (c, _) = merge([&a, &b]);
        assert_eq!(c.stored_pages, 2);
        let (c, _) = merge([&b]);
        assert_eq!(c.stored_pages, 0, "negative partial sums clamp to 0");
    }

    #[test]
    fn counters_alone_are_the_counters_of_a_merge() {
        let a = StatsShard::default();
        let b = StatsShard::default();
        a.add(Counter::StoredPages, 7);
        a.add(Counter::ComprDataSize, 900);
        b.add(Counter::StoredPages, -2);
        b.add(Counter::NumWrites, 3);
        a.record(Op::Write, 1500, 7);
        assert_eq!(sum_counters([&a, &b]), merge([&a, &b]).0);
        assert_eq!(sum_counters([&b]).stored_pages, 0);
        assert_eq!(sum_counters([&a]).compr_data_size, 900);
    }
}
