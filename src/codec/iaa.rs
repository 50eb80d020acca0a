//! `IaaCodec`: the `deflate-iaa` codec, compressing pages on IAA work queues
//! with the software raw-deflate path as its fallback.
//!
//! Per compression group, up to [`IaaOptions::max_in_flight`] compress
//! descriptors (one per page; IAA has no batch descriptor) are submitted
//! round-robin over the work queues, then their completion records are
//! polled with a deadline. Each outcome is mapped so nothing is lost:
//! success (optionally verified by a device decompress whose CRC must match
//! the compress CRC) is accepted; "compress output overflow" means the page
//! does not fit its budget and is stored raw; a page fault, a timeout, a
//! failed verify or any other error redoes that page in software.
//!
//! The device reads and writes only buffers this codec owns (a per-slot
//! page copy, output buffer and completion record), so a descriptor that
//! times out and completes later can never scribble on the caller's memory:
//! its slot is quarantined until its record is written, and leaked if the
//! codec is dropped first.

use super::{AccelEvents, Algo, Codec, CodecError, DeflateCodec, DEFLATE_DEFAULT_LEVEL};
use crate::accel::desc::*;
use crate::accel::portal::Submit;
use crate::accel::router::{Router, WorkQueue};
use crate::page::PAGE_SIZE;
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// The kernel's IAA batch size (`IAA_CRYPTO_MAX_BATCH_SIZE`).
pub const IAA_MAX_BATCH: usize = 8;

/// Tunables of the IAA path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IaaOptions {
    /// Verify each device compression by decompressing it on the device and
    /// comparing CRCs (on by default, like iaa_crypto's `verify_compress`).
    pub verify: bool,
    /// Descriptors in flight per codec (at most [`IAA_MAX_BATCH`]).
    pub max_in_flight: usize,
    /// How long a descriptor may take before its page is redone in software.
    pub timeout: Duration,
    /// ENQCMD "retry" answers tolerated per submission before trying the
    /// next work queue (and finally software).
    pub enqcmd_retries: u32,
}

impl Default for IaaOptions {
    fn default() -> Self {
        IaaOptions {
            verify: true,
            max_in_flight: IAA_MAX_BATCH,
            timeout: Duration::from_millis(50),
            enqcmd_retries: 64,
        }
    }
}

/// Environment variable: `0` turns verification off (default on).
pub const VERIFY_ENV: &str = "ZBLK_IAA_VERIFY";
/// Environment variable: descriptor timeout in microseconds.
pub const TIMEOUT_ENV: &str = "ZBLK_IAA_TIMEOUT_US";

impl IaaOptions {
    /// The defaults, with `$ZBLK_IAA_VERIFY` and `$ZBLK_IAA_TIMEOUT_US`
    /// applied when set (an unparsable value is ignored with a warning).
    pub fn from_env() -> Self {
        let mut o = IaaOptions::default();
        if let Ok(v) = std::env::var(VERIFY_ENV) {
            match v.as_str() {
                "0" | "false" | "off" => o.verify = false,
                "1" | "true" | "on" => o.verify = true,
                _ => log::warn!("deflate-iaa: ignoring {VERIFY_ENV}={v:?} (expected 0 or 1)"),
            }
        }
        if let Ok(v) = std::env::var(TIMEOUT_ENV) {
            match v.parse::<u64>() {
                Ok(us) if us > 0 => o.timeout = Duration::from_micros(us),
                _ => log::warn!(
                    "deflate-iaa: ignoring {TIMEOUT_ENV}={v:?} (expected microseconds > 0)"
                ),
            }
        }
        o
    }
}

/// Counters of one codec instance: where pages went and why.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IaaStats {
    /// Pages the device compressed (and verify accepted).
    pub hw_pages: u64,
    /// Pages the device found incompressible within budget (stored raw).
    pub hw_overflow: u64,
    /// Pages compressed in software (no queue, fallback, or not a page).
    pub sw_pages: u64,
    /// Pages redone in software after a page fault.
    pub page_faults: u64,
    /// Pages redone in software after a timeout.
    pub timeouts: u64,
    /// Pages redone in software because verify failed.
    pub verify_failures: u64,
    /// Pages redone in software after another device error.
    pub device_errors: u64,
    /// Pages done in software because no queue took the descriptor.
    pub submit_failures: u64,
    /// Decompressions done by the device.
    pub hw_decompress: u64,
    /// Decompressions done in software (including device fallbacks).
    pub sw_decompress: u64,
}

/// Memory a descriptor points at. The device writes `comp` and `dst`
/// (DMA), so they are only touched through raw pointers.
#[repr(C, align(64))]
struct SlotBufs {
    comp: UnsafeCell<IaxCompletionRecord>,
    src: UnsafeCell<[u8; PAGE_SIZE]>,
    dst: UnsafeCell<[u8; PAGE_SIZE]>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotState {
    Idle,
    Compress {
        page: usize,
    },
    Verify {
        page: usize,
        len: usize,
        crc: u32,
    },
    /// Compressed, waiting for a queue entry to submit its verify.
    VerifyWait {
        page: usize,
        len: usize,
        crc: u32,
    },
    /// Timed out: owned by the device until its record is written.
    Stale,
}

impl SlotState {
    /// The device owns the slot's buffers and will write its record.
    fn in_device(self) -> bool {
        matches!(self, SlotState::Compress { .. } | SlotState::Verify { .. })
    }

    /// The slot holds a page of the current group.
    fn busy(self) -> bool {
        self.in_device() || matches!(self, SlotState::VerifyWait { .. })
    }
}

/// What a submission attempt came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sent {
    /// A queue took the descriptor.
    Submitted,
    /// Every queue was full (no credit, or ENQCMD kept answering retry).
    Full,
    /// Submission failed with an error on every queue.
    Failed,
}

struct Slot {
    bufs: Box<SlotBufs>,
    state: SlotState,
    wq: usize,
    deadline: Instant,
}

impl Slot {
    fn new() -> Self {
        Slot {
            bufs: Box::new(SlotBufs {
                comp: UnsafeCell::new(IaxCompletionRecord::default()),
                src: UnsafeCell::new([0; PAGE_SIZE]),
                dst: UnsafeCell::new([0; PAGE_SIZE]),
            }),
            state: SlotState::Idle,
            wq: 0,
            deadline: Instant::now(),
        }
    }

    fn comp_addr(&self) -> u64 {
        self.bufs.comp.get() as u64
    }

    fn src_addr(&self) -> u64 {
        self.bufs.src.get() as u64
    }

    fn dst_addr(&self) -> u64 {
        self.bufs.dst.get() as u64
    }

    /// Zeroes the completion record before a submission.
    fn clear_record(&self) {
        // SAFETY: the slot is idle, so the device does not own the record.
        unsafe { std::ptr::write_volatile(self.bufs.comp.get(), IaxCompletionRecord::default()) };
    }

    /// The record's status with its "written" bit masked off; 0 while the
    /// device has not finished.
    fn status(&self) -> u8 {
        // SAFETY: the record is 64-byte aligned and alive; the device
        // writes `status` last, so an Acquire load orders the other fields.
        let s = unsafe { AtomicU8::from_ptr(self.bufs.comp.get().cast::<u8>()) };
        s.load(Ordering::Acquire) & COMP_STATUS_MASK
    }

    /// A copy of the record; only after `status()` returned non-zero.
    fn record(&self) -> IaxCompletionRecord {
        // SAFETY: the device is done with the record (status was non-zero).
        unsafe { std::ptr::read_volatile(self.bufs.comp.get()) }
    }

    /// Copies `page` into the slot's source buffer.
    fn load_src(&mut self, page: &[u8]) {
        // SAFETY: the slot is idle; `page.len() <= PAGE_SIZE` (checked by
        // the callers) and the buffers do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(
                page.as_ptr(),
                self.bufs.src.get().cast::<u8>(),
                page.len(),
            )
        };
    }

    /// The first `len` bytes the device wrote to the output buffer.
    fn output(&self, len: usize) -> &[u8] {
        // SAFETY: the descriptor completed, the device no longer writes
        // `dst`, and `len <= PAGE_SIZE` (checked by the callers).
        unsafe { std::slice::from_raw_parts(self.bufs.dst.get().cast::<u8>(), len.min(PAGE_SIZE)) }
    }
}

/// The fixed-Huffman AECS every compress descriptor points at. It lives for
/// the whole process, so a late device read can never hit freed memory.
fn aecs() -> &'static AecsCompTable {
    static AECS: OnceLock<Box<AecsCompTable>> = OnceLock::new();
    AECS.get_or_init(|| Box::new(AecsCompTable::fixed()))
}

/// How a finished compress descriptor's page is resolved.
enum Outcome {
    Done(Option<usize>),
    Verify { len: usize, crc: u32 },
    Software,
}

/// The `deflate-iaa` codec.
pub struct IaaCodec {
    queues: Vec<Arc<WorkQueue>>,
    opts: IaaOptions,
    sw: DeflateCodec,
    slots: Vec<Slot>,
    next_wq: usize,
    results: Vec<Option<Option<usize>>>,
    stats: IaaStats,
    /// `stats` as last handed out by `take_accel_events`.
    reported: IaaStats,
    warned_stale: bool,
}

impl IaaCodec {
    /// A codec on the process-wide router's queues (software when none),
    /// with [`IaaOptions::from_env`].
    pub fn new() -> Self {
        Self::with_router(Router::global(), IaaOptions::from_env())
    }

    /// A codec on `router`'s queues with `opts`.
    pub fn with_router(router: &Router, opts: IaaOptions) -> Self {
        let in_flight = opts.max_in_flight.clamp(1, IAA_MAX_BATCH);
        let queues = router.queues().to_vec();
        let slots = if queues.is_empty() {
            Vec::new()
        } else {
            (0..in_flight).map(|_| Slot::new()).collect()
        };
        IaaCodec {
            queues,
            opts: IaaOptions {
                max_in_flight: in_flight,
                ..opts
            },
            sw: DeflateCodec::new(DEFLATE_DEFAULT_LEVEL, Algo::DeflateIaa),
            slots,
            next_wq: 0,
            results: Vec::with_capacity(IAA_MAX_BATCH),
            stats: IaaStats::default(),
            reported: IaaStats::default(),
            warned_stale: false,
        }
    }

    /// Whether this codec submits to hardware (else: software only).
    #[cfg(any(test, feature = "test-support"))]
    pub fn uses_hardware(&self) -> bool {
        !self.queues.is_empty()
    }

    /// Changes how long a descriptor may take from now on.
    #[cfg(any(test, feature = "test-support"))]
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.opts.timeout = timeout;
    }

    /// This instance's counters.
    #[cfg(any(test, feature = "test-support"))]
    pub fn stats(&self) -> IaaStats {
        self.stats
    }

    /// Compresses `page` in software into `area`, counting it.
    fn software(&mut self, page: &[u8], area: &mut [u8]) -> Result<Option<usize>, CodecError> {
        self.stats.sw_pages += 1;
        self.sw.compress(page, area)
    }

    /// Frees quarantined slots whose late completion has arrived.
    fn reclaim_stale(&mut self) {
        for s in &mut self.slots {
            if s.state == SlotState::Stale && s.status() != IAX_COMP_NONE {
                self.queues[s.wq].release();
                s.state = SlotState::Idle;
            }
        }
    }

    /// Submits `desc` from slot `si` to some work queue, round-robin.
    fn submit(&mut self, si: usize, desc: &mut IaxHwDesc) -> Sent {
        let slot = &mut self.slots[si];
        desc.completion_addr = slot.comp_addr();
        let bytes = desc.to_bytes();
        let n = self.queues.len();
        let mut full = false;
        for k in 0..n {
            let qi = (self.next_wq + k) % n;
            let q = &self.queues[qi];
            if !q.acquire() {
                full = true;
                continue;
            }
            slot.clear_record();
            match q.submit(&bytes, self.opts.enqcmd_retries) {
                Ok(Submit::Accepted) => {
                    slot.wq = qi;
                    slot.deadline = Instant::now() + self.opts.timeout;
                    self.next_wq = qi + 1;
                    return Sent::Submitted;
                }
                Ok(Submit::Retry) => {
                    full = true;
                    q.release();
                }
                Err(e) => {
                    log::warn!("deflate-iaa: submit to {} failed: {e}", q.info.name);
                    q.release();
                }
            }
        }
        if full {
            Sent::Full
        } else {
            Sent::Failed
        }
    }

    /// Starts compressing `page` on slot `si`.
    fn start_compress(&mut self, si: usize, page_idx: usize, page: &[u8], budget: usize) -> Sent {
        let slot = &mut self.slots[si];
        slot.load_src(page);
        let mut d = IaxHwDesc::new(IAX_OPCODE_COMPRESS, COMPRESS_DESC_FLAGS);
        d.src1_addr = slot.src_addr();
        d.src1_size = PAGE_SIZE as u32;
        d.dst_addr = slot.dst_addr();
        d.max_dst_size = budget as u32;
        d.op_flags = IAA_COMP_FLAGS;
        d.src2_addr = aecs() as *const AecsCompTable as u64;
        d.src2_size = AECS_COMP_SIZE as u32;
        let sent = self.submit(si, &mut d);
        if sent == Sent::Submitted {
            self.slots[si].state = SlotState::Compress { page: page_idx };
        }
        sent
    }

    /// Starts the verify decompress (output suppressed) of `len` bytes
    /// sitting in slot `si`'s output buffer, as iaa_crypto does.
    fn start_verify(&mut self, si: usize, page: usize, len: usize, crc: u32) -> Sent {
        let slot = &self.slots[si];
        let mut d = IaxHwDesc::new(IAX_OPCODE_DECOMPRESS, DECOMPRESS_DESC_FLAGS);
        d.src1_addr = slot.dst_addr();
        d.src1_size = len as u32;
        d.dst_addr = slot.src_addr();
        d.max_dst_size = PAGE_SIZE as u32;
        d.op_flags = IAA_DECOMP_FLAGS | IAA_DECOMP_SUPPRESS_OUTPUT;
        let sent = self.submit(si, &mut d);
        if sent == Sent::Submitted {
            self.slots[si].state = SlotState::Verify { page, len, crc };
        }
        sent
    }

    /// Tries again to submit the verify of a slot waiting for a queue
    /// entry; past its deadline the page is redone in software.
    fn retry_verify(
        &mut self,
        si: usize,
        pages: &[&[u8]],
        dst: &mut [u8],
        budget: usize,
    ) -> Result<(), CodecError> {
        let SlotState::VerifyWait { page, len, crc } = self.slots[si].state else {
            return Ok(());
        };
        let deadline = self.slots[si].deadline;
        match self.start_verify(si, page, len, crc) {
            Sent::Submitted => {}
            Sent::Full if Instant::now() < deadline => self.slots[si].deadline = deadline,
            Sent::Full | Sent::Failed => {
                self.slots[si].state = SlotState::Idle;
                self.stats.submit_failures += 1;
                let area = &mut dst[page * PAGE_SIZE..page * PAGE_SIZE + budget];
                self.results[page] = Some(self.software(pages[page], area)?);
            }
        }
        Ok(())
    }

    /// Maps a finished compress record to what happens to its page.
    fn compress_outcome(&mut self, rec: &IaxCompletionRecord, budget: usize) -> Outcome {
        let len = rec.output_size as usize;
        match rec.status & COMP_STATUS_MASK {
            IAX_COMP_SUCCESS if len > 0 && len <= budget => {
                if self.opts.verify {
                    Outcome::Verify { len, crc: rec.crc }
                } else {
                    Outcome::Done(Some(len))
                }
            }
            IAX_COMP_ANALYTICS_ERROR if rec.error_code == IAA_ERROR_COMP_BUF_OVERFLOW => {
                self.stats.hw_overflow += 1;
                Outcome::Done(None)
            }
            IAX_COMP_PAGE_FAULT_IR | 0x03 => {
                self.stats.page_faults += 1;
                Outcome::Software
            }
            s => {
                log::debug!(
                    "deflate-iaa: compress status {s:#x} error {:#x}",
                    rec.error_code
                );
                self.stats.device_errors += 1;
                Outcome::Software
            }
        }
    }

    /// Handles slot `si` whose record is written (or whose deadline passed
    /// when `timed_out`), filling `results` and the page's area.
    fn finish(
        &mut self,
        si: usize,
        timed_out: bool,
        pages: &[&[u8]],
        dst: &mut [u8],
        budget: usize,
    ) -> Result<(), CodecError> {
        let state = self.slots[si].state;
        let page = match state {
            SlotState::Compress { page } | SlotState::Verify { page, .. } => page,
            SlotState::Idle | SlotState::Stale | SlotState::VerifyWait { .. } => return Ok(()),
        };
        let area = &mut dst[page * PAGE_SIZE..page * PAGE_SIZE + budget];
        if timed_out {
            self.slots[si].state = SlotState::Stale;
            self.stats.timeouts += 1;
            self.results[page] = Some(self.software(pages[page], area)?);
            return Ok(());
        }
        let rec = self.slots[si].record();
        self.queues[self.slots[si].wq].release();
        self.slots[si].state = SlotState::Idle;
        let outcome = match state {
            SlotState::Verify { len, crc, .. } => {
                let ok = rec.status & COMP_STATUS_MASK == IAX_COMP_SUCCESS
                    && rec.output_size as usize == PAGE_SIZE
                    && rec.crc == crc;
                if ok {
                    Outcome::Done(Some(len))
                } else {
                    self.stats.verify_failures += 1;
                    Outcome::Software
                }
            }
            _ => self.compress_outcome(&rec, budget),
        };
        match outcome {
            Outcome::Done(Some(len)) => {
                area[..len].copy_from_slice(self.slots[si].output(len));
                self.stats.hw_pages += 1;
                self.results[page] = Some(Some(len));
            }
            Outcome::Done(None) => self.results[page] = Some(None),
            Outcome::Verify { len, crc } => match self.start_verify(si, page, len, crc) {
                Sent::Submitted => {}
                Sent::Full => {
                    let slot = &mut self.slots[si];
                    slot.state = SlotState::VerifyWait { page, len, crc };
                    slot.deadline = Instant::now() + self.opts.timeout;
                }
                Sent::Failed => {
                    self.stats.submit_failures += 1;
                    self.results[page] = Some(self.software(pages[page], area)?);
                }
            },
            Outcome::Software => self.results[page] = Some(self.software(pages[page], area)?),
        }
        Ok(())
    }

    /// Polls every busy slot once; true while any is still busy.
    fn poll(&mut self, pages: &[&[u8]], dst: &mut [u8], budget: usize) -> Result<bool, CodecError> {
        let now = Instant::now();
        let mut busy = false;
        for si in 0..self.slots.len() {
            let s = &self.slots[si];
            if matches!(s.state, SlotState::VerifyWait { .. }) {
                self.retry_verify(si, pages, dst, budget)?;
            } else if !s.state.in_device() {
                continue;
            } else if s.status() != IAX_COMP_NONE {
                self.finish(si, false, pages, dst, budget)?;
            } else if now >= s.deadline {
                self.finish(si, true, pages, dst, budget)?;
            }
            busy |= self.slots[si].state.busy();
        }
        Ok(busy)
    }

    /// Warns (once per codec) that every slot is stuck on the device.
    fn all_stale_warning(&mut self) {
        if !self.warned_stale {
            self.warned_stale = true;
            log::warn!("deflate-iaa: all descriptors in flight timed out and never completed; using software until they do");
        }
    }

    /// The device path for a group of whole pages.
    fn hw_batch(
        &mut self,
        pages: &[&[u8]],
        dst: &mut [u8],
        budget: usize,
    ) -> Result<usize, CodecError> {
        self.reclaim_stale();
        let before = self.stats.hw_pages + self.stats.hw_overflow;
        let mut next = 0;
        loop {
            while next < pages.len() {
                let Some(si) = self.slots.iter().position(|s| s.state == SlotState::Idle) else {
                    break;
                };
                match self.start_compress(si, next, pages[next], budget) {
                    Sent::Submitted => {}
                    // Our own descriptors will free queue entries: wait.
                    Sent::Full if self.slots.iter().any(|s| s.state.in_device()) => break,
                    Sent::Full | Sent::Failed => {
                        self.stats.submit_failures += 1;
                        let area = &mut dst[next * PAGE_SIZE..next * PAGE_SIZE + budget];
                        self.results[next] = Some(self.software(pages[next], area)?);
                    }
                }
                next += 1;
            }
            if self.poll(pages, dst, budget)? {
                std::hint::spin_loop();
                continue;
            }
            if next >= pages.len() {
                break;
            }
            if !self.slots.iter().any(|s| s.state == SlotState::Idle) {
                // Every slot is held by a descriptor that never completed:
                // the device is stuck for us, the rest goes to software.
                self.all_stale_warning();
                while next < pages.len() {
                    let area = &mut dst[next * PAGE_SIZE..next * PAGE_SIZE + budget];
                    self.results[next] = Some(self.software(pages[next], area)?);
                    next += 1;
                }
            }
        }
        Ok((self.stats.hw_pages + self.stats.hw_overflow - before) as usize)
    }

    /// Decompresses one page on the device; false when it did not succeed
    /// (the caller then decodes in software).
    fn hw_decompress(&mut self, src: &[u8], dst: &mut [u8]) -> bool {
        self.reclaim_stale();
        let Some(si) = self.slots.iter().position(|s| s.state == SlotState::Idle) else {
            return false;
        };
        self.slots[si].load_src(src);
        let mut d = IaxHwDesc::new(IAX_OPCODE_DECOMPRESS, DECOMPRESS_DESC_FLAGS);
        d.src1_addr = self.slots[si].src_addr();
        d.src1_size = src.len() as u32;
        d.dst_addr = self.slots[si].dst_addr();
        d.max_dst_size = PAGE_SIZE as u32;
        d.op_flags = IAA_DECOMP_FLAGS;
        if self.submit(si, &mut d) != Sent::Submitted {
            return false;
        }
        let slot = &mut self.slots[si];
        while slot.status() == IAX_COMP_NONE {
            if Instant::now() >= slot.deadline {
                slot.state = SlotState::Stale;
                return false;
            }
            std::hint::spin_loop();
        }
        let rec = slot.record();
        self.queues[slot.wq].release();
        let ok = rec.status & COMP_STATUS_MASK == IAX_COMP_SUCCESS
            && rec.output_size as usize == dst.len();
        if ok {
            dst.copy_from_slice(slot.output(dst.len()));
        }
        ok
    }
}

impl Default for IaaCodec {
    fn default() -> Self {
        Self::new()
    }
}

impl Codec for IaaCodec {
    fn algo(&self) -> Algo {
        Algo::DeflateIaa
    }

    fn take_accel_events(&mut self) -> AccelEvents {
        let (now, was) = (
            self.stats,
            std::mem::replace(&mut self.reported, self.stats),
        );
        AccelEvents {
            page_faults: now.page_faults - was.page_faults,
            timeouts: now.timeouts - was.timeouts,
            verify_failures: now.verify_failures - was.verify_failures,
            device_errors: now.device_errors - was.device_errors,
            submit_failures: now.submit_failures - was.submit_failures,
            decompressed: now.hw_decompress - was.hw_decompress,
        }
    }

    fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<Option<usize>, CodecError> {
        // The device takes single pages into at most a page of output; a
        // larger destination would turn its overflow into a wrong "None".
        if self.queues.is_empty()
            || src.len() != PAGE_SIZE
            || dst.len() > PAGE_SIZE
            || dst.is_empty()
        {
            return self.software(src, dst);
        }
        // A group of one: page 0's area is `dst[..budget]`, all of `dst`.
        let budget = dst.len();
        self.results.clear();
        self.results.resize(1, None);
        self.hw_batch(&[src], dst, budget)?;
        match self.results[0] {
            Some(r) => Ok(r),
            None => self.software(src, dst),
        }
    }

    fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(), CodecError> {
        let fits = dst.len() == PAGE_SIZE && !src.is_empty() && src.len() <= PAGE_SIZE;
        if !self.queues.is_empty() && fits && self.hw_decompress(src, dst) {
            self.stats.hw_decompress += 1;
            return Ok(());
        }
        self.stats.sw_decompress += 1;
        self.sw.decompress(src, dst)
    }

    fn compress_batch(
        &mut self,
        pages: &[&[u8]],
        dst: &mut [u8],
        budget: usize,
        out: &mut Vec<Option<usize>>,
    ) -> Result<usize, CodecError> {
        if dst.len() < pages.len() * PAGE_SIZE || budget > PAGE_SIZE {
            return Err(CodecError::Internal(format!(
                "compress_batch: {} pages need {} bytes of destination at budget <= {PAGE_SIZE}, got {} at {budget}",
                pages.len(),
                pages.len() * PAGE_SIZE,
                dst.len()
            )));
        }
        self.results.clear();
        self.results.resize(pages.len(), None);
        let all_pages = pages.iter().all(|p| p.len() == PAGE_SIZE);
        let accel = if !self.queues.is_empty() && all_pages && budget > 0 {
            self.hw_batch(pages, dst, budget)?
        } else {
            0
        };
        for i in 0..pages.len() {
            let r = match self.results[i] {
                Some(r) => r,
                None => {
                    let area = &mut dst[i * PAGE_SIZE..i * PAGE_SIZE + budget];
                    self.software(pages[i], area)?
                }
            };
            out.push(r);
        }
        Ok(accel)
    }
}

impl Drop for IaaCodec {
    /// Waits (up to the timeout) for descriptors still owned by the device,
    /// and leaks the buffers of any that never complete: a late DMA write
    /// must land in memory nobody else owns.
    fn drop(&mut self) {
        let deadline = Instant::now() + self.opts.timeout;
        for slot in self.slots.drain(..) {
            if !(slot.state.in_device() || slot.state == SlotState::Stale) {
                continue;
            }
            while slot.status() == IAX_COMP_NONE && Instant::now() < deadline {
                std::thread::yield_now();
            }
            if slot.status() == IAX_COMP_NONE {
                log::warn!(
                    "deflate-iaa: a descriptor never completed; leaking its 8 KB of buffers"
                );
                std::mem::forget(slot.bufs);
            } else {
                self.queues[slot.wq].release();
            }
        }
    }
}
