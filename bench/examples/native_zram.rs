//! Kernel zram's whole block path against zblk's engine, natively, on the
//! same pages, in one process with the rounds interleaved. Usage:
//!
//!     native_zram FILE [--rounds N] [--copies N] [--request-pages N]
//!                      [--zram NAME] [--zram-algos A,B] [--engine-only] [--variants] [--only NAME]
//!                      [--compress-workers N,M]
//!
//! zram: the pages are written to `/dev/NAME` (default zram0, reset and
//! sized for them) with `O_DIRECT` in requests of `--request-pages` (default
//! 32) straight from a populated mapping, so zram's side copies nothing the
//! kernel would not copy for a swap-out; then read back the same way. Its
//! whole path (block layer, codec, zsmalloc) runs in the writing thread.
//!
//! The engine: a new store per round configured as the daemon configures
//! it (`zblk_bench::engine::BenchOptions::daemon`: shared memory, the memory
//! reserve and its provisioner, mlock) and, for reference, as
//! `zblk bench --private` runs it; the same requests from the same mapping.
//! With `--compress-workers N,M`, also the daemon's store with N (then M)
//! compression workers (`zblk add --compress-workers`).
//!
//! Per round and side: wall µs per page of the writing thread, and CPU µs
//! per page of every thread (from `/proc/self/task/*/schedstat`, in ns):
//! the writer, the reserve's provisioner (`zblk-reserve`), the free drain
//! (`zblk-free`) and the compression workers (`zblk-compress*`): a second
//! thread can hide cost from the writer, not from the machine. The median
//! time of one request, write and read, too. Every page read back is compared. Exit status 2 with
//! one line when the kernel has no zram device.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;
use std::time::Instant;
use zblk::{Algo, Store, PAGE_SIZE};
use zblk_bench::engine::{load_input, BenchOptions};
use zblk_bench::{max, median, min};

/// What one side did in one round.
#[derive(Clone, Copy, Default)]
struct Sample {
    write_us: f64,
    read_us: f64,
    /// CPU µs per page written: the writer, the provisioner, the drain.
    cpu_writer: f64,
    cpu_reserve: f64,
    cpu_free: f64,
    cpu_workers: f64,
    /// Median µs of one write request and of one read request.
    write_req_us: f64,
    read_req_us: f64,
    /// orig / memory used.
    ratio_mem: f64,
    /// Share of the store's memory mapped as 2 MB pages once written.
    huge_share: f64,
}

impl Sample {
    fn cpu_all(&self) -> f64 {
        self.cpu_writer + self.cpu_reserve + self.cpu_free + self.cpu_workers
    }
}

/// A side of the comparison.
#[derive(Clone)]
enum Side {
    Zram(String),
    Engine { name: String, opts: BenchOptions },
}

impl Side {
    fn name(&self) -> String {
        match self {
            Side::Zram(a) => format!("zram {a}"),
            Side::Engine { name, .. } => format!("zblk lz4 ({name})"),
        }
    }
}

struct Args {
    file: PathBuf,
    rounds: usize,
    copies: usize,
    request_pages: usize,
    zram: String,
    zram_algos: Vec<String>,
    engine_only: bool,
    /// Also the daemon's store with one of its three settings alone, and
    /// with its reserve serving every zspage (as when memory is short).
    variants: bool,
    /// Only the sides whose name contains this (for a profile of one).
    only: Option<String>,
    /// Worker counts to run the daemon's store with, besides none.
    workers: Vec<usize>,
}

fn parse_args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let mut a = Args {
        file: PathBuf::new(),
        rounds: 5,
        copies: 2,
        request_pages: 32,
        zram: "zram0".into(),
        zram_algos: vec!["lz4".into(), "lzo-rle".into()],
        engine_only: false,
        variants: false,
        only: None,
        workers: vec![],
    };
    let num = |v: Option<String>, what: &str| -> Result<usize, String> {
        v.and_then(|s| s.parse().ok())
            .filter(|&n: &usize| n > 0)
            .ok_or(format!("{what} takes a whole number above 0"))
    };
    while let Some(w) = it.next() {
        match w.as_str() {
            "--rounds" => a.rounds = num(it.next(), "--rounds")?,
            "--copies" => a.copies = num(it.next(), "--copies")?,
            "--request-pages" => a.request_pages = num(it.next(), "--request-pages")?,
            "--zram" => a.zram = it.next().ok_or("--zram takes a device name")?,
            "--zram-algos" => {
                let v = it.next().ok_or("--zram-algos takes a list")?;
                a.zram_algos = v.split(',').map(str::to_owned).collect();
            }
            "--engine-only" => a.engine_only = true,
            "--variants" => a.variants = true,
            "--only" => a.only = Some(it.next().ok_or("--only takes a side's name")?),
            "--compress-workers" => {
                let v = it.next().ok_or("--compress-workers takes a list")?;
                a.workers = v
                    .split(',')
                    .map(|n| n.parse().map_err(|_| format!("bad worker count {n:?}")))
                    .collect::<Result<_, String>>()?;
            }
            f if f.starts_with('-') => return Err(format!("unknown flag {f}")),
            f => a.file = PathBuf::from(f),
        }
    }
    if a.file.as_os_str().is_empty() {
        return Err("usage: native_zram FILE [--rounds N] [--copies N] [--request-pages N] [--zram NAME] [--zram-algos A,B] [--engine-only] [--variants] [--only NAME] [--compress-workers N,M]".into());
    }
    Ok(a)
}

/// An anonymous mapping, page-aligned (what `O_DIRECT` needs), every page
/// written once before any clock starts.
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

impl Mapping {
    fn new(len: usize) -> Result<Mapping, String> {
        // SAFETY: a fresh private anonymous mapping; checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(format!("mmap of {len} bytes failed"));
        }
        let mut m = Mapping { ptr: p.cast(), len };
        m.bytes_mut().fill(1);
        Ok(m)
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` maps `len` readable bytes for the mapping's life.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as `bytes`, and `&mut self` makes this view the only one.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new`, no view outlives it.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// CPU time of each of this process's threads, ns, by thread name.
fn thread_cpu_ns() -> Vec<(String, u64)> {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return vec![];
    };
    dir.flatten()
        .filter_map(|e| {
            let p = e.path();
            let comm = std::fs::read_to_string(p.join("comm")).ok()?;
            let st = std::fs::read_to_string(p.join("schedstat")).ok()?;
            let ns = st.split_whitespace().next()?.parse().ok()?;
            Some((comm.trim().to_owned(), ns))
        })
        .collect()
}

/// Per-name CPU ns spent between two `thread_cpu_ns` looks: the writer
/// (this thread), `zblk-reserve`, `zblk-free`, the compression workers
/// (`zblk-compress*`, summed); threads that came or went in between count
/// from 0.
fn cpu_between(before: &[(String, u64)], after: &[(String, u64)]) -> [u64; 4] {
    let me = std::fs::read_to_string("/proc/thread-self/comm").unwrap_or_default();
    let sum = |v: &[(String, u64)], name: &str| -> u64 {
        v.iter()
            .filter(|(n, _)| {
                n == name || (name.ends_with('*') && n.starts_with(&name[..name.len() - 1]))
            })
            .map(|(_, ns)| ns)
            .sum()
    };
    let d = |name: &str| sum(after, name).saturating_sub(sum(before, name));
    [
        d(me.trim()),
        d("zblk-reserve"),
        d("zblk-free"),
        d("zblk-compress*"),
    ]
}

fn sysfs_write(dev: &str, file: &str, value: &str) -> Result<(), String> {
    let path = format!("/sys/block/{dev}/{file}");
    std::fs::write(&path, value).map_err(|e| format!("writing {value:?} to {path}: {e}"))
}

fn sysfs_read(dev: &str, file: &str) -> Result<String, String> {
    let path = format!("/sys/block/{dev}/{file}");
    std::fs::read_to_string(&path).map_err(|e| format!("reading {path}: {e}"))
}

/// Resets zram device `dev` and sizes it for `bytes` with `algo`.
fn zram_setup(dev: &str, algo: &str, bytes: usize) -> Result<File, String> {
    sysfs_write(dev, "reset", "1")?;
    sysfs_write(dev, "comp_algorithm", algo)?;
    sysfs_write(dev, "disksize", &bytes.to_string())?;
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(format!("/dev/{dev}"))
        .map_err(|e| format!("opening /dev/{dev} with O_DIRECT: {e}"))
}

/// Writes `pages` in requests of `req` bytes through `put`, timing only
/// the calls; returns wall seconds, the CPU ns of each thread and the
/// median µs of one request.
fn timed_writes(
    pages: &[u8],
    req: usize,
    mut put: impl FnMut(u64, &[u8]) -> Result<(), String>,
) -> Result<(f64, [u64; 4], f64), String> {
    let mut each = Vec::with_capacity(pages.len() / req + 1);
    let before = thread_cpu_ns();
    let t0 = Instant::now();
    for (i, r) in pages.chunks(req).enumerate() {
        let t = Instant::now();
        put((i * req) as u64, r)?;
        each.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let secs = t0.elapsed().as_secs_f64();
    Ok((secs, cpu_between(&before, &thread_cpu_ns()), median(each)))
}

/// Reads every request back through `get` into `buf`, timing only the
/// calls, and compares each with the pages written; returns seconds and
/// the median µs of one request.
fn timed_reads(
    pages: &[u8],
    buf: &mut [u8],
    mut get: impl FnMut(u64, &mut [u8]) -> Result<(), String>,
) -> Result<(f64, f64), String> {
    let req = buf.len();
    let mut secs = 0.0;
    let mut each = Vec::with_capacity(pages.len() / req + 1);
    for (i, want) in pages.chunks(req).enumerate() {
        let out = &mut buf[..want.len()];
        let t0 = Instant::now();
        get((i * req) as u64, out)?;
        let took = t0.elapsed().as_secs_f64();
        secs += took;
        each.push(took * 1e6);
        if out != want {
            return Err(format!("request {i} did not read back identical"));
        }
    }
    Ok((secs, median(each)))
}

/// One side's round: (wall seconds, median µs of a request) of its
/// writes and its reads, the CPU ns of its threads, its memory ratio.
fn sample(pages: usize, w: (f64, f64), r: (f64, f64), cpu: [u64; 4], ratio_mem: f64) -> Sample {
    let per = |ns: u64| ns as f64 / 1e3 / pages as f64;
    Sample {
        write_us: w.0 * 1e6 / pages as f64,
        read_us: r.0 * 1e6 / pages as f64,
        cpu_writer: per(cpu[0]),
        cpu_reserve: per(cpu[1]),
        cpu_free: per(cpu[2]),
        cpu_workers: per(cpu[3]),
        write_req_us: w.1,
        read_req_us: r.1,
        ratio_mem,
        huge_share: 0.0,
    }
}

fn run_zram(a: &Args, algo: &str, data: &Mapping, buf: &mut Mapping) -> Result<Sample, String> {
    let bytes = data.len;
    let f = zram_setup(&a.zram, algo, bytes)?;
    let req = a.request_pages * PAGE_SIZE;
    let (write_s, cpu, write_req) = timed_writes(data.bytes(), req, |off, r| {
        f.write_all_at(r, off)
            .map_err(|e| format!("zram write: {e}"))
    })?;
    let mm = sysfs_read(&a.zram, "mm_stat")?;
    let used: f64 = mm
        .split_whitespace()
        .nth(2)
        .and_then(|s| s.parse().ok())
        .ok_or("mm_stat has no mem_used_total")?;
    let read = timed_reads(data.bytes(), buf.bytes_mut(), |off, out| {
        f.read_exact_at(out, off)
            .map_err(|e| format!("zram read: {e}"))
    })?;
    drop(f);
    sysfs_write(&a.zram, "reset", "1")?;
    let pages = bytes / PAGE_SIZE;
    let ratio = bytes as f64 / used;
    Ok(sample(pages, (write_s, write_req), read, cpu, ratio))
}

fn run_engine(
    a: &Args,
    opts: &BenchOptions,
    data: &Mapping,
    buf: &mut Mapping,
) -> Result<Sample, String> {
    let bytes = data.len;
    let store = Store::new(opts.store_config(bytes as u64)).map_err(|e| e.to_string())?;
    let mut ctx = store.new_ctx();
    let req = a.request_pages * PAGE_SIZE;
    let (write_s, cpu, write_req) = timed_writes(data.bytes(), req, |off, r| {
        ctx.write(off, r).map_err(|e| format!("engine write: {e}"))
    })?;
    let used = store.stats().mem_used_total as f64;
    // The store is the only shared memory this process maps.
    let huge = zblk::huge_mapped_bytes() as f64;
    let read = timed_reads(data.bytes(), buf.bytes_mut(), |off, out| {
        ctx.read(off, out).map_err(|e| format!("engine read: {e}"))
    })?;
    let pages = bytes / PAGE_SIZE;
    let ratio = bytes as f64 / used;
    Ok(Sample {
        huge_share: huge / used,
        ..sample(pages, (write_s, write_req), read, cpu, ratio)
    })
}

/// A sample as its median and range.
fn spread(v: &[f64]) -> String {
    format!("{:.2} ({:.2}-{:.2})", median(v.to_vec()), min(v), max(v))
}

fn print_sides(sides: &[Side], s: &[Vec<Sample>]) {
    println!("| side | write µs/page | read µs/page | CPU µs/page: writer | reserve | free | workers | all | write µs/request | read µs/request | ratio_mem | in 2 MB pages |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for (side, v) in sides.iter().zip(s) {
        let col = |f: fn(&Sample) -> f64| spread(&v.iter().map(f).collect::<Vec<_>>());
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            side.name(),
            col(|x| x.write_us),
            col(|x| x.read_us),
            col(|x| x.cpu_writer),
            col(|x| x.cpu_reserve),
            col(|x| x.cpu_free),
            col(|x| x.cpu_workers),
            col(Sample::cpu_all),
            col(|x| x.write_req_us),
            col(|x| x.read_req_us),
            col(|x| x.ratio_mem),
            col(|x| x.huge_share),
        );
    }
}

/// Every engine side against every zram side, per round: throughput
/// ratios (zram's µs / the engine's: above 1 the engine is faster) and the
/// engine's CPU per page on all threads over zram's.
fn print_ratios(sides: &[Side], s: &[Vec<Sample>]) {
    println!();
    println!("| engine | against | write speed | read speed | CPU per page written, all threads |");
    println!("| --- | --- | --- | --- | --- |");
    for (ei, e) in sides.iter().enumerate() {
        let Side::Engine { .. } = e else { continue };
        for (zi, z) in sides.iter().enumerate() {
            let Side::Zram(_) = z else { continue };
            let per = |f: fn(&Sample) -> f64| {
                s[ei]
                    .iter()
                    .zip(&s[zi])
                    .map(|(e, z)| f(z) / f(e))
                    .collect::<Vec<_>>()
            };
            let cpu: Vec<f64> = s[ei]
                .iter()
                .zip(&s[zi])
                .map(|(e, z)| e.cpu_all() / z.cpu_all())
                .collect();
            println!(
                "| {} | {} | {}x | {}x | {}x |",
                e.name(),
                z.name(),
                spread(&per(|x| x.write_us)),
                spread(&per(|x| x.read_us)),
                spread(&cpu),
            );
        }
    }
}

fn zram_present(dev: &str) -> bool {
    std::path::Path::new(&format!("/sys/block/{dev}")).exists()
}

fn main() {
    if let Err(e) = run() {
        eprintln!("native_zram: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let a = parse_args()?;
    if !a.engine_only && !zram_present(&a.zram) {
        eprintln!(
            "native_zram: no /sys/block/{}: this kernel has no zram device (modprobe zram, or --engine-only)",
            a.zram
        );
        std::process::exit(2);
    }
    let input = load_input(&a.file).map_err(|e| e.to_string())?;
    let mut data = Mapping::new(input.len() * a.copies)?;
    for chunk in data.bytes_mut().chunks_mut(input.len()) {
        chunk.copy_from_slice(&input);
    }
    drop(input);
    let mut buf = Mapping::new(a.request_pages * PAGE_SIZE)?;
    let mut sides: Vec<Side> = vec![];
    if !a.engine_only {
        sides.extend(a.zram_algos.iter().map(|z| Side::Zram(z.clone())));
    }
    let engine = |name: &str, opts: BenchOptions| Side::Engine {
        name: name.to_owned(),
        opts: BenchOptions {
            algo: Algo::Lz4,
            ..opts
        },
    };
    sides.push(engine("daemon's store", BenchOptions::daemon()));
    sides.push(engine(
        "daemon's store, 2 MB pages",
        BenchOptions {
            huge_pages: true,
            ..BenchOptions::daemon()
        },
    ));
    sides.push(engine("private store", BenchOptions::default()));
    for &n in &a.workers {
        sides.push(engine(
            &format!("daemon's store, {n} compress workers"),
            BenchOptions {
                compress_workers: n,
                ..BenchOptions::daemon()
            },
        ));
    }
    if a.variants {
        let private = BenchOptions::default();
        sides.push(engine(
            "shared only",
            BenchOptions {
                shared: true,
                ..private.clone()
            },
        ));
        sides.push(engine(
            "reserve only",
            BenchOptions {
                reserve: true,
                ..private.clone()
            },
        ));
        sides.push(engine(
            "mlock only",
            BenchOptions {
                mlock: true,
                ..private
            },
        ));
        // The reserve as when memory is short: every zspage from a spare.
        sides.push(engine(
            "daemon's store, memory short",
            BenchOptions {
                reserve_free_below: u64::MAX,
                ..BenchOptions::daemon()
            },
        ));
    }
    if let Some(only) = &a.only {
        sides.retain(|s| s.name().contains(only.as_str()));
    }
    let mut samples = vec![Vec::new(); sides.len()];
    for round in 0..a.rounds {
        // Each round starts with another side, so drift hits all alike.
        for k in 0..sides.len() {
            let i = (round + k) % sides.len();
            let s = match &sides[i] {
                Side::Zram(algo) => run_zram(&a, algo, &data, &mut buf)?,
                Side::Engine { opts, .. } => run_engine(&a, opts, &data, &mut buf)?,
            };
            samples[i].push(s);
        }
    }
    println!(
        "{} pages ({} cop{} of {}), {}-page requests, {} rounds: medians (min-max)",
        data.len / PAGE_SIZE,
        a.copies,
        if a.copies == 1 { "y" } else { "ies" },
        a.file.display(),
        a.request_pages,
        a.rounds
    );
    println!();
    print_sides(&sides, &samples);
    print_ratios(&sides, &samples);
    Ok(())
}
