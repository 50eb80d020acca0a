//! A software model of an IAA device, to test the backend without hardware.
//!
//! The model publishes a fake sysfs tree ([`ModelDevice::write_sysfs`]) and
//! portals ([`ModelDevice::opener`]) that take the same 64-byte
//! descriptors the backend submits to hardware. Each descriptor is parsed
//! from its raw bytes, checked like the device would (opcode, flags, AECS,
//! completion record alignment, sizes), executed with a real raw deflate
//! (libdeflate; a page input keeps every distance within IAA's 4 KB
//! history), and answered with a real completion record (status, error
//! code, output size, CRC-32 of the uncompressed data) written to the
//! completion address, status last.
//!
//! Queue semantics follow the hardware: a shared WQ answers "retry" when
//! full (ENQCMD), a dedicated WQ silently drops a descriptor posted beyond
//! its size (MOVDIR64B) and counts it in [`ModelStats::dropped`]. Faults
//! can be injected: latency, queue-full, page faults, compress overflow,
//! corrupt output, late completions and arbitrary status codes.
//!
//! Like a real device, the model dereferences the addresses in the
//! descriptors: it must only be fed descriptors pointing at live memory,
//! which is what the backend guarantees.

use super::desc::*;
use super::portal::{PortalOpener, Submit, Submitter};
use super::sysfs::{WqInfo, WqMode};
use libdeflater::{CompressionLvl, Compressor, DecompressionError, Decompressor};
use std::collections::VecDeque;
use std::fs;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// `error_code` the model reports for a decompress of malformed data (the
/// backend treats every failed decompress alike: redo in software).
pub const MODEL_DECOMP_BAD_DATA: u8 = 0x01;

/// Where descriptors are executed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exec {
    /// On the submitting thread, before `submit` returns (a zero-latency
    /// device; deterministic).
    Inline,
    /// On one engine thread per WQ, asynchronously, like hardware.
    Thread,
}

/// A fault to inject into the next matching descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Page fault on the source (status `IAX_COMP_PAGE_FAULT_IR`).
    PageFault,
    /// Compress output overflow (analytics error, `error_code` 0x19).
    Overflow,
    /// Compress succeeds but the output is corrupt (block type 11).
    CorruptOutput,
    /// The completion arrives only after this delay.
    Delay(Duration),
    /// Complete with this status and no output.
    Status(u8),
}

/// Counters of the model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ModelStats {
    /// Descriptors accepted into a queue.
    pub accepted: u64,
    /// Compress descriptors executed.
    pub compress: u64,
    /// Decompress descriptors executed.
    pub decompress: u64,
    /// ENQCMD "retry" answers given.
    pub retries: u64,
    /// Descriptors posted to a full dedicated WQ and lost.
    pub dropped: u64,
    /// Descriptors rejected because the completion record was unusable.
    pub bad_completion: u64,
    /// Faults injected.
    pub faults: u64,
    /// Nanoseconds spent inside libdeflate and CRC (the "device time").
    pub busy_ns: u64,
    /// Most descriptors ever queued or executing at once in one WQ.
    pub peak_occupancy: u64,
}

#[derive(Default)]
struct Counters {
    accepted: AtomicU64,
    compress: AtomicU64,
    decompress: AtomicU64,
    retries: AtomicU64,
    dropped: AtomicU64,
    bad_completion: AtomicU64,
    faults: AtomicU64,
    busy_ns: AtomicU64,
    peak_occupancy: AtomicU64,
}

/// State shared by the device's work queues.
#[derive(Default)]
struct Shared {
    faults: Mutex<VecDeque<(Option<u8>, Fault)>>,
    reject_next: AtomicU32,
    paused: AtomicBool,
    latency_ns: AtomicU64,
    counters: Counters,
}

impl Shared {
    /// Takes the first queued fault meant for `opcode` (or for any).
    fn take_fault(&self, opcode: u8) -> Option<Fault> {
        let mut q = self.faults.lock().unwrap_or_else(|e| e.into_inner());
        let i = q
            .iter()
            .position(|(op, _)| op.map_or(true, |o| o == opcode))?;
        q.remove(i).map(|(_, f)| f)
    }
}

/// Configuration of one model work queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelWqConfig {
    /// Name, e.g. `wq1.0`.
    pub name: String,
    /// Dedicated or shared.
    pub mode: WqMode,
    /// Queue entries.
    pub size: u32,
}

impl ModelWqConfig {
    /// A work queue named `name` of `mode` with `size` entries.
    pub fn new(name: &str, mode: WqMode, size: u32) -> Self {
        ModelWqConfig {
            name: name.to_string(),
            mode,
            size,
        }
    }
}

/// One model work queue: its queue, occupancy and engine thread.
struct ModelWq {
    cfg: ModelWqConfig,
    shared: Arc<Shared>,
    exec: Exec,
    occupancy: AtomicU32,
    queue: Mutex<VecDeque<[u8; DESC_SIZE]>>,
    wake: Condvar,
    stop: AtomicBool,
}

impl ModelWq {
    /// The engine loop of a `Thread` WQ: runs until stopped and drained.
    fn run(&self) {
        let mut engine = Engine::new();
        loop {
            let next = {
                let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
                loop {
                    if let Some(d) = q.pop_front() {
                        break Some(d);
                    }
                    if self.stop.load(Ordering::Acquire) {
                        break None;
                    }
                    q = self.wake.wait(q).unwrap_or_else(|e| e.into_inner());
                }
            };
            let Some(desc) = next else { return };
            // A paused engine holds its descriptors, like a stalled device.
            while self.shared.paused.load(Ordering::Acquire) && !self.stop.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_micros(100));
            }
            engine.execute(&self.shared, &desc);
            self.occupancy.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// The model's portal for one WQ.
struct ModelPortal {
    wq: Arc<ModelWq>,
    inline: Mutex<Engine>,
}

impl Submitter for ModelPortal {
    fn submit(&self, desc: &[u8; DESC_SIZE]) -> io::Result<Submit> {
        let wq = &self.wq;
        let c = &wq.shared.counters;
        if wq.cfg.mode == WqMode::Shared {
            let rejected = wq
                .shared
                .reject_next
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                .is_ok();
            if rejected || wq.occupancy.load(Ordering::Acquire) >= wq.cfg.size {
                c.retries.fetch_add(1, Ordering::Relaxed);
                return Ok(Submit::Retry);
            }
        } else if wq.occupancy.load(Ordering::Acquire) >= wq.cfg.size {
            // A posted write to a full dedicated WQ is lost without a word.
            c.dropped.fetch_add(1, Ordering::Relaxed);
            return Ok(Submit::Accepted);
        }
        let now = wq.occupancy.fetch_add(1, Ordering::AcqRel) + 1;
        c.peak_occupancy
            .fetch_max(u64::from(now), Ordering::Relaxed);
        c.accepted.fetch_add(1, Ordering::Relaxed);
        match wq.exec {
            Exec::Inline => {
                let mut e = self.inline.lock().unwrap_or_else(|e| e.into_inner());
                e.execute(&wq.shared, desc);
                wq.occupancy.fetch_sub(1, Ordering::AcqRel);
            }
            Exec::Thread => {
                wq.queue
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push_back(*desc);
                wq.wake.notify_one();
            }
        }
        Ok(Submit::Accepted)
    }

    fn kind(&self) -> &'static str {
        "model"
    }
}

/// A model IAA device with its work queues.
pub struct ModelDevice {
    id: u32,
    shared: Arc<Shared>,
    wqs: Vec<Arc<ModelWq>>,
    threads: Vec<JoinHandle<()>>,
}

impl ModelDevice {
    /// A device `iax{id}` with `wqs`, executing descriptors per `exec`.
    pub fn new(id: u32, wqs: &[ModelWqConfig], exec: Exec) -> io::Result<Self> {
        let shared = Arc::new(Shared::default());
        let mut dev = ModelDevice {
            id,
            shared: shared.clone(),
            wqs: Vec::new(),
            threads: Vec::new(),
        };
        for cfg in wqs {
            let wq = Arc::new(ModelWq {
                cfg: cfg.clone(),
                shared: shared.clone(),
                exec,
                occupancy: AtomicU32::new(0),
                queue: Mutex::new(VecDeque::new()),
                wake: Condvar::new(),
                stop: AtomicBool::new(false),
            });
            if exec == Exec::Thread {
                let w = wq.clone();
                let t = std::thread::Builder::new()
                    .name(format!("iaa-model-{}", cfg.name))
                    .spawn(move || w.run())?;
                dev.threads.push(t);
            }
            dev.wqs.push(wq);
        }
        Ok(dev)
    }

    /// Writes `iax{id}` and its work queues (all enabled, type `user`) as
    /// sysfs attribute files under `root`.
    pub fn write_sysfs(&self, root: &Path) -> io::Result<()> {
        let dev = root.join(format!("iax{}", self.id));
        fs::create_dir_all(&dev)?;
        fs::write(dev.join("state"), "enabled\n")?;
        for wq in &self.wqs {
            let dir = dev.join(&wq.cfg.name);
            fs::create_dir_all(&dir)?;
            let mode = match wq.cfg.mode {
                WqMode::Dedicated => "dedicated",
                WqMode::Shared => "shared",
            };
            let attrs = [
                ("state", "enabled".to_string()),
                ("type", "user".to_string()),
                ("mode", mode.to_string()),
                ("size", wq.cfg.size.to_string()),
                ("name", "zblk".to_string()),
                ("max_transfer_size", "2097152".to_string()),
            ];
            for (k, v) in attrs {
                fs::write(dir.join(k), format!("{v}\n"))?;
            }
        }
        Ok(())
    }

    /// An opener that hands out this device's portals by WQ name.
    pub fn opener(&self) -> impl PortalOpener {
        ModelOpener {
            wqs: self.wqs.clone(),
        }
    }

    /// Queues `fault` for the next descriptor with `opcode` (any opcode
    /// when `None`).
    pub fn inject(&self, opcode: Option<u8>, fault: Fault) {
        self.shared
            .faults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back((opcode, fault));
    }

    /// Makes the next `n` ENQCMD submissions answer "retry".
    pub fn reject_next(&self, n: u32) {
        self.shared.reject_next.store(n, Ordering::Release);
    }

    /// Stops (`true`) or restarts the engines of `Thread` work queues:
    /// while paused, descriptors are accepted and held, none completes.
    pub fn pause(&self, paused: bool) {
        self.shared.paused.store(paused, Ordering::Release);
    }

    /// Adds `latency` before every descriptor completes.
    pub fn set_latency(&self, latency: Duration) {
        self.shared
            .latency_ns
            .store(latency.as_nanos() as u64, Ordering::Release);
    }

    /// The counters so far.
    pub fn stats(&self) -> ModelStats {
        let c = &self.shared.counters;
        let g = |a: &AtomicU64| a.load(Ordering::Acquire);
        ModelStats {
            accepted: g(&c.accepted),
            compress: g(&c.compress),
            decompress: g(&c.decompress),
            retries: g(&c.retries),
            dropped: g(&c.dropped),
            bad_completion: g(&c.bad_completion),
            faults: g(&c.faults),
            busy_ns: g(&c.busy_ns),
            peak_occupancy: g(&c.peak_occupancy),
        }
    }
}

impl Drop for ModelDevice {
    fn drop(&mut self) {
        for wq in &self.wqs {
            wq.stop.store(true, Ordering::Release);
            let _guard = wq.queue.lock().unwrap_or_else(|e| e.into_inner());
            wq.wake.notify_all();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

struct ModelOpener {
    wqs: Vec<Arc<ModelWq>>,
}

impl PortalOpener for ModelOpener {
    fn open(&self, info: &WqInfo) -> io::Result<Box<dyn Submitter>> {
        let wq = self
            .wqs
            .iter()
            .find(|w| w.cfg.name == info.name)
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("no model WQ {}", info.name),
                )
            })?;
        Ok(Box::new(ModelPortal {
            wq: wq.clone(),
            inline: Mutex::new(Engine::new()),
        }))
    }
}

/// One execution engine: libdeflate contexts and scratch.
struct Engine {
    comp: Compressor,
    decomp: Decompressor,
    scratch: Vec<u8>,
}

/// What an executed descriptor reports.
#[derive(Default)]
struct Result_ {
    status: u8,
    error_code: u8,
    output_size: u32,
    crc: u32,
    fault_addr: u64,
    bytes_completed: u32,
}

impl Result_ {
    fn status(status: u8) -> Self {
        Result_ {
            status,
            ..Default::default()
        }
    }
}

impl Engine {
    fn new() -> Self {
        Engine {
            comp: Compressor::new(CompressionLvl::new(1).unwrap_or_default()),
            decomp: Decompressor::new(),
            scratch: vec![0; 2 << 20],
        }
    }

    /// Executes one descriptor and writes its completion record.
    fn execute(&mut self, shared: &Shared, bytes: &[u8; DESC_SIZE]) {
        let d = IaxHwDesc::from_bytes(bytes);
        let c = &shared.counters;
        let want = IDXD_OP_FLAG_CRAV | IDXD_OP_FLAG_RCR;
        if d.flags() & want != want || d.completion_addr == 0 || d.completion_addr % 64 != 0 {
            // No usable record: real hardware reports this through its
            // software error register; the submitter would time out.
            c.bad_completion.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let fault = shared.take_fault(d.opcode());
        if fault.is_some() {
            c.faults.fetch_add(1, Ordering::Relaxed);
        }
        let latency = Duration::from_nanos(shared.latency_ns.load(Ordering::Acquire));
        let extra = match fault {
            Some(Fault::Delay(t)) => t,
            _ => Duration::ZERO,
        };
        wait(latency + extra);
        let r = match fault {
            Some(Fault::Status(s)) => Result_::status(s),
            Some(Fault::PageFault) => Result_ {
                status: IAX_COMP_PAGE_FAULT_IR,
                fault_addr: d.src1_addr + u64::from(d.src1_size / 2),
                bytes_completed: d.src1_size / 2,
                ..Default::default()
            },
            _ => match d.opcode() {
                IAX_OPCODE_COMPRESS => {
                    c.compress.fetch_add(1, Ordering::Relaxed);
                    self.compress(c, &d, fault)
                }
                IAX_OPCODE_DECOMPRESS => {
                    c.decompress.fetch_add(1, Ordering::Relaxed);
                    self.decompress(c, &d)
                }
                _ => Result_::status(IAX_COMP_BAD_OPCODE),
            },
        };
        write_record(d.completion_addr, &r);
    }

    /// A compress: checks the descriptor like the device, then deflates.
    fn compress(&mut self, c: &Counters, d: &IaxHwDesc, fault: Option<Fault>) -> Result_ {
        if d.flags() & IDXD_OP_FLAG_RD_SRC2_AECS == 0
            || d.src2_size as usize != AECS_COMP_SIZE
            || d.src2_addr == 0
            || d.op_flags != IAA_COMP_FLAGS
        {
            return Result_::status(IAX_COMP_INVALID_FLAGS);
        }
        // SAFETY: src2 names a live AECS of AECS_COMP_SIZE bytes (checked
        // size; the submitter guarantees liveness, as with hardware DMA).
        let aecs = unsafe { &*(d.src2_addr as *const AecsCompTable) };
        if aecs.num_output_accum_bits != FIXED_HDR_SIZE || aecs.output_accum[0] != FIXED_HDR | 1 {
            return Result_::status(IAX_COMP_INVALID_FLAGS);
        }
        if d.src1_size == 0 || d.src1_size as usize > self.scratch.len() || d.max_dst_size == 0 {
            return Result_::status(IAX_COMP_INVALID_SIZE);
        }
        // SAFETY: as for the AECS: the descriptor names live buffers.
        let src =
            unsafe { std::slice::from_raw_parts(d.src1_addr as *const u8, d.src1_size as usize) };
        let cap = (d.max_dst_size as usize).min(self.scratch.len());
        let t = Instant::now();
        let out = self.comp.deflate_compress(src, &mut self.scratch[..cap]);
        let crc = libdeflater::crc32(src);
        c.busy_ns
            .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        let n = match (out, fault) {
            (_, Some(Fault::Overflow)) | (Err(_), _) => {
                return Result_ {
                    status: IAX_COMP_ANALYTICS_ERROR,
                    error_code: IAA_ERROR_COMP_BUF_OVERFLOW,
                    ..Default::default()
                }
            }
            (Ok(n), _) => n,
        };
        if fault == Some(Fault::CorruptOutput) {
            // BFINAL=1, BTYPE=11: a reserved block type no inflater accepts.
            self.scratch[0] = 0xff;
        }
        // SAFETY: dst names a live buffer of max_dst_size >= n bytes.
        unsafe { std::ptr::copy_nonoverlapping(self.scratch.as_ptr(), d.dst_addr as *mut u8, n) };
        Result_ {
            status: IAX_COMP_SUCCESS,
            output_size: n as u32,
            crc,
            ..Default::default()
        }
    }

    /// A decompress (output optionally suppressed, for verification).
    fn decompress(&mut self, c: &Counters, d: &IaxHwDesc) -> Result_ {
        if d.op_flags & IAA_DECOMP_ENABLE == 0 {
            return Result_::status(IAX_COMP_INVALID_FLAGS);
        }
        if d.src1_size == 0 || d.max_dst_size == 0 {
            return Result_::status(IAX_COMP_INVALID_SIZE);
        }
        // SAFETY: the descriptor names a live source buffer.
        let src =
            unsafe { std::slice::from_raw_parts(d.src1_addr as *const u8, d.src1_size as usize) };
        let cap = (d.max_dst_size as usize).min(self.scratch.len());
        let t = Instant::now();
        let out = self
            .decomp
            .deflate_decompress(src, &mut self.scratch[..cap]);
        let r = match out {
            Ok(n) => {
                let crc = libdeflater::crc32(&self.scratch[..n]);
                if d.op_flags & IAA_DECOMP_SUPPRESS_OUTPUT == 0 {
                    // SAFETY: dst names a live buffer of max_dst_size >= n.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            self.scratch.as_ptr(),
                            d.dst_addr as *mut u8,
                            n,
                        )
                    };
                }
                Result_ {
                    status: IAX_COMP_SUCCESS,
                    output_size: n as u32,
                    crc,
                    ..Default::default()
                }
            }
            Err(DecompressionError::InsufficientSpace) => Result_::status(IAX_COMP_OUTBUF_OVERFLOW),
            Err(DecompressionError::BadData) => Result_ {
                status: IAX_COMP_ANALYTICS_ERROR,
                error_code: MODEL_DECOMP_BAD_DATA,
                ..Default::default()
            },
        };
        c.busy_ns
            .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        r
    }
}

/// Waits `d`: spins for short waits (sleep granularity is too coarse).
fn wait(d: Duration) {
    if d.is_zero() {
        return;
    }
    if d >= Duration::from_micros(200) {
        std::thread::sleep(d);
        return;
    }
    let end = Instant::now() + d;
    while Instant::now() < end {
        std::hint::spin_loop();
    }
}

/// Writes a completion record at `addr`: every field, then `status` with
/// Release ordering (the submitter polls it with Acquire).
fn write_record(addr: u64, r: &Result_) {
    let rec = IaxCompletionRecord {
        status: 0,
        error_code: r.error_code,
        bytes_completed: r.bytes_completed,
        fault_addr: r.fault_addr,
        output_size: r.output_size,
        crc: r.crc,
        ..Default::default()
    };
    let p = addr as *mut IaxCompletionRecord;
    // SAFETY: the address is a live, 64-byte-aligned completion record
    // (alignment checked by `execute`); the submitter only reads it.
    unsafe {
        std::ptr::write_volatile(p, rec);
        AtomicU8::from_ptr(p.cast::<u8>()).store(r.status, Ordering::Release);
    }
}
