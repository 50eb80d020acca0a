//! `zblk bench`: the engine run over a file of pages, without a kernel.
//!
//! Writes every 4 KB page of the input into a store sized for it, reads
//! every page back and compares, and reports ratios, throughput and
//! per-page latency. The CLI parses arguments and prints; this module does
//! the work so that tests and criterion benches can call it too.

use crate::codec::Algo;
use serde::Serialize;

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Compression algorithm.
    pub algo: Algo,
    /// Pages per compression group.
    pub group_pages: usize,
    /// Threads, each with its own context, splitting the pages.
    pub threads: usize,
}

/// What `zblk bench --json` prints: exactly these keys.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    /// Pages in the input.
    pub pages: u64,
    /// Pages that did not read back identical (must be 0).
    pub verify_errors: u64,
    /// orig_data_size / compr_data_size.
    pub ratio_data: f64,
    /// orig_data_size / mem_used_total.
    pub ratio_mem: f64,
    /// Write throughput, MB/s of uncompressed data.
    pub write_mb_s: f64,
    /// Read throughput, MB/s of uncompressed data.
    pub read_mb_s: f64,
    /// Median per-page write latency, microseconds.
    pub write_p50_us: f64,
    /// 99th percentile per-page write latency, microseconds.
    pub write_p99_us: f64,
    /// Median per-page read latency, microseconds.
    pub read_p50_us: f64,
    /// 99th percentile per-page read latency, microseconds.
    pub read_p99_us: f64,
    /// Algorithm name.
    pub algo: String,
    /// Pages per group.
    pub group_pages: usize,
    /// Threads.
    pub threads: usize,
}
