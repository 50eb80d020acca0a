//! The IAA path with a device that misbehaves: arbitrary sysfs attribute
//! contents for discovery (`accel::sysfs`, `accel::Router`), then the
//! `deflate-iaa` codec on the software device model (`accel::model`,
//! feature `test-support`) behind a portal that rewrites completion
//! records (`accel::desc::IaxCompletionRecord`) after the model wrote
//! them, and the model's own injected faults.
//!
//! The rewritten device is faulty, never lying twice: a failed record may
//! get any status (including "never completes"), error code, fault info,
//! sizes and garbage in the output buffer; a successful one may turn into
//! a failure, or keep success with a wrong output size or a wrong CRC.
//! (With verify off, a success is trusted, so only failures are made up.)
//! Checks: no panic; every page the codec says it compressed decodes (in
//! software, and through the codec) to exactly that page; every decompress
//! the codec answers is the right page (software fallback).
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use std::collections::VecDeque;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use zblk::accel::desc::{
    IaxCompletionRecord, IaxHwDesc, COMP_STATUS_MASK, DESC_SIZE, IAX_COMP_SUCCESS,
};
use zblk::accel::model::{Exec, Fault, ModelDevice, ModelWqConfig};
use zblk::accel::portal::{PortalOpener, Submit, Submitter};
use zblk::accel::sysfs::{discover, WqInfo, WqMode};
use zblk::accel::Router;
use zblk::codec::{Algo, Codec, IaaCodec, IaaOptions};
use zblk::PAGE_SIZE;
use zblk_fuzz::Fill;

#[derive(Arbitrary, Debug, Clone)]
struct Mutation {
    what: u8,
    status: u8,
    error_code: u8,
    fault_info: u8,
    bytes_completed: u32,
    output_size: u32,
    crc_xor: u32,
    garbage: Option<u8>,
}

type Plan = Arc<Mutex<VecDeque<Mutation>>>;

struct Rewriter {
    inner: Box<dyn Submitter>,
    plan: Plan,
    /// Verify is on: a success with a wrong size or CRC is caught by it.
    /// Without verify the codec trusts a successful record (as iaa_crypto
    /// with verify_compress off), so success is only turned into failure.
    verify: bool,
}

impl Submitter for Rewriter {
    fn submit(&self, desc: &[u8; DESC_SIZE]) -> io::Result<Submit> {
        let r = self.inner.submit(desc)?;
        if r != Submit::Accepted {
            return Ok(r);
        }
        let Some(m) = self.plan.lock().unwrap().pop_front() else {
            return Ok(r);
        };
        let d = IaxHwDesc::from_bytes(desc);
        let rec = d.completion_addr as *mut IaxCompletionRecord;
        // SAFETY: the codec handed the model this live, aligned record and
        // polls it only after submit returns (the model runs inline).
        let mut c = unsafe { rec.read_volatile() };
        if c.status == 0 {
            return Ok(r);
        }
        let success = c.status & COMP_STATUS_MASK == IAX_COMP_SUCCESS;
        let mut scribble = false;
        if success {
            let what = if self.verify { m.what % 4 } else { m.what % 2 };
            match what {
                0 => {}
                1 => {
                    // Turns into a failure (0 in the low bits: never completes).
                    c.status = if m.status & COMP_STATUS_MASK == IAX_COMP_SUCCESS {
                        0x0a
                    } else {
                        m.status
                    };
                    c.error_code = m.error_code;
                    c.fault_info = m.fault_info;
                    c.bytes_completed = m.bytes_completed;
                    scribble = true;
                }
                2 if m.output_size != c.output_size => c.output_size = m.output_size,
                3 => c.crc ^= m.crc_xor.max(1),
                _ => {}
            }
        } else {
            if m.status & COMP_STATUS_MASK != IAX_COMP_SUCCESS {
                c.status = m.status;
            }
            c.error_code = m.error_code;
            c.fault_info = m.fault_info;
            c.bytes_completed = m.bytes_completed;
            c.output_size = m.output_size;
            scribble = true;
        }
        if scribble && d.dst_addr != 0 {
            if let Some(g) = m.garbage {
                // SAFETY: the descriptor names the codec's own output
                // buffer of max_dst_size bytes, which nothing reads until
                // the record is looked at.
                unsafe { std::ptr::write_bytes(d.dst_addr as *mut u8, g, d.max_dst_size as usize) };
            }
        }
        // SAFETY: as above.
        unsafe { rec.write_volatile(c) };
        Ok(r)
    }
    fn kind(&self) -> &'static str {
        "fuzz"
    }
}

struct Opener<O> {
    inner: O,
    plan: Plan,
    verify: bool,
}

impl<O: PortalOpener> PortalOpener for Opener<O> {
    fn open(&self, wq: &WqInfo) -> io::Result<Box<dyn Submitter>> {
        Ok(Box::new(Rewriter {
            inner: self.inner.open(wq)?,
            plan: self.plan.clone(),
            verify: self.verify,
        }))
    }
}

#[derive(Arbitrary, Debug)]
enum Inject {
    PageFault,
    Overflow,
    CorruptOutput,
    Status(u8),
}

#[derive(Arbitrary, Debug)]
struct Input {
    /// Attribute overrides: (attribute index, contents).
    sysfs: Vec<(u8, String)>,
    dedicated: bool,
    wq_size: u8,
    verify: bool,
    budget: u16,
    mutations: Vec<Mutation>,
    injects: Vec<(Option<bool>, Inject)>,
    pages: Vec<Fill>,
}

thread_local! {
    /// The software decoder that checks what the codec stored: one for the
    /// process (a new deflate codec per input allocated and faulted in
    /// libdeflate's state every time; decoding keeps no state between
    /// pages).
    static SOFT: std::cell::RefCell<Box<dyn Codec>> = std::cell::RefCell::new(Algo::Deflate(1).new_codec());
}

const ATTRS: [&str; 7] = [
    "state",
    "type",
    "mode",
    "size",
    "name",
    "max_transfer_size",
    "../state",
];

/// The fake sysfs tree, one per process: in /dev/shm where there is one
/// (tmpfs), else the temporary directory. Removed once, at the first input;
/// every input then rewrites every attribute the model has
/// (`ModelDevice::write_sysfs`), so each starts from the model's tree as a
/// fresh one would. Removing and recreating the tree on disk (ext4) for
/// every input was over half of this target's time, in the kernel (perf).
fn root() -> PathBuf {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        let shm = Path::new("/dev/shm");
        let base = if shm.is_dir() {
            shm.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let root = base.join(format!("zblk-fuzz-iaa-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        root
    })
    .clone()
}

fn check_discovery(root: &Path) {
    let d = discover(root, Path::new("/dev/iax"));
    for q in &d.queues {
        assert!(
            q.size > 0 && q.max_transfer_size >= PAGE_SIZE as u64,
            "{q:?}"
        );
        let dir = root.join(&q.device).join(&q.name);
        let attr = |n: &str| {
            std::fs::read_to_string(dir.join(n))
                .unwrap_or_default()
                .trim()
                .to_string()
        };
        assert_eq!(attr("state"), "enabled");
        assert_eq!(attr("type"), "user");
        let mode = match q.mode {
            WqMode::Dedicated => "dedicated",
            WqMode::Shared => "shared",
        };
        assert_eq!(attr("mode"), mode);
    }
    if d.queues.is_empty() {
        assert!(!d.why_none().is_empty());
    }
}

fuzz_target!(|input: Input| {
    let root = root();
    let mode = if input.dedicated {
        WqMode::Dedicated
    } else {
        WqMode::Shared
    };
    let wq = ModelWqConfig::new("wq1.0", mode, 1 + u32::from(input.wq_size % 16));
    let model = ModelDevice::new(1, &[wq], Exec::Inline).expect("model");
    model.write_sysfs(&root).expect("sysfs");
    for (i, text) in input.sysfs.iter().take(4) {
        let name = ATTRS[usize::from(*i) % ATTRS.len()];
        let _ = std::fs::write(root.join("iax1/wq1.0").join(name), text);
    }
    check_discovery(&root);
    let plan: Plan = Arc::new(Mutex::new(
        input.mutations.iter().take(32).cloned().collect(),
    ));
    let opener = Opener {
        inner: model.opener(),
        plan: plan.clone(),
        verify: input.verify,
    };
    let router = Router::open(&root, Path::new("/dev/iax"), &opener);
    for (op, f) in input.injects.iter().take(8) {
        let opcode = op.map(|c| if c { 0x43 } else { 0x42 });
        let fault = match f {
            Inject::PageFault => Fault::PageFault,
            Inject::Overflow => Fault::Overflow,
            // Corrupt output that claims success is what verify is for.
            Inject::CorruptOutput if input.verify => Fault::CorruptOutput,
            Inject::CorruptOutput => Fault::PageFault,
            Inject::Status(s) => Fault::Status(*s),
        };
        model.inject(opcode, fault);
    }
    let opts = IaaOptions {
        verify: input.verify,
        // The model runs inline: a descriptor it completes has its record
        // written before `submit` returns, and the codec looks at the
        // record before the clock, so the timeout only bounds the wait for
        // one that never completes (and retries on a full queue, which
        // nothing but the codec drains). The shorter, the less time spun
        // in `sched_yield`/`spin_loop` (perf: ~15% at 2 ms); same paths.
        timeout: Duration::from_micros(200),
        ..IaaOptions::default()
    };
    let mut codec = IaaCodec::with_router(&router, opts);
    let budget = 64 + usize::from(input.budget) % (PAGE_SIZE - 63);
    let pages: Vec<Vec<u8>> = input
        .pages
        .iter()
        .take(16)
        .enumerate()
        .map(|(i, f)| {
            let mut p = vec![0u8; PAGE_SIZE];
            f.fill(&mut p, i as u64);
            p
        })
        .collect();
    for group in pages.chunks(8) {
        let refs: Vec<&[u8]> = group.iter().map(|p| p.as_slice()).collect();
        let mut dst = vec![0u8; group.len() * PAGE_SIZE];
        let mut out = Vec::new();
        let Ok(_) = codec.compress_batch(&refs, &mut dst, budget, &mut out) else {
            continue;
        };
        assert_eq!(out.len(), group.len());
        for (i, r) in out.iter().enumerate() {
            let Some(n) = *r else { continue };
            assert!(
                n > 0 && n <= budget,
                "compressed length {n} outside the budget {budget}"
            );
            let z = &dst[i * PAGE_SIZE..i * PAGE_SIZE + n];
            let mut back = vec![0u8; PAGE_SIZE];
            SOFT.with_borrow_mut(|soft| soft.decompress(z, &mut back))
                .expect("what the codec stored decodes in software");
            assert!(back == group[i], "page {i} stored wrong");
            let mut back = vec![0xA5u8; PAGE_SIZE];
            codec
                .decompress(z, &mut back)
                .expect("the codec decodes its own page");
            assert!(back == group[i], "page {i} decoded wrong");
        }
    }
    let _ = codec.take_accel_events();
    let _ = codec.stats();
});
