//! Overhead of the IAA descriptor path against calling software deflate
//! directly, on real memory pages, with the device model's own compression
//! time excluded.
//!
//! Run: `cargo bench -p zblk-bench --bench accel_overhead [-- PAGES ROUNDS]`. The corpus is
//! `$ZBLK_CORPUS` or `../shared/corpus/realmem-dev.bin.zst`, else the test
//! fixture. The model executes descriptors inline (a zero-latency device),
//! so `wall - model busy time` is what the backend itself costs: page copy
//! into the slot, descriptor build and encoding, submission, completion
//! polling, result mapping and copy-out, plus the model's descriptor
//! parsing and record writing. Figures are per page; the best of ROUNDS.

use std::path::{Path, PathBuf};
use std::time::Instant;
use zblk::accel::model::{Exec, ModelDevice, ModelWqConfig};
use zblk::accel::sysfs::WqMode;
use zblk::accel::Router;
use zblk::codec::{Algo, Codec, DeflateCodec, IaaCodec, IaaOptions};
use zblk::PAGE_SIZE;

const BUDGET: usize = 3071;

fn corpus(limit: usize) -> Vec<Vec<u8>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let candidates = [
        std::env::var_os("ZBLK_CORPUS").map(PathBuf::from),
        Some(root.join("../../shared/corpus/realmem-dev.bin.zst")),
        Some(zblk_bench::fixture_path()),
    ];
    for p in candidates.into_iter().flatten() {
        if let Ok(z) = std::fs::read(&p) {
            let raw = zstd::decode_all(&z[..]).expect("corpus decodes");
            eprintln!("corpus: {} ({} pages)", p.display(), raw.len() / PAGE_SIZE);
            return raw
                .chunks_exact(PAGE_SIZE)
                .take(limit)
                .map(|c| c.to_vec())
                .collect();
        }
    }
    panic!("no corpus found");
}

/// Best-of-`rounds` nanoseconds of `f`, and the model busy time in that run.
fn best(rounds: usize, mut f: impl FnMut() -> u64) -> (u64, u64) {
    let mut out = (u64::MAX, 0);
    for _ in 0..rounds {
        let t = Instant::now();
        let busy = f();
        let ns = t.elapsed().as_nanos() as u64;
        if ns < out.0 {
            out = (ns, busy);
        }
    }
    out
}

fn groups(pages: &[Vec<u8>]) -> Vec<Vec<&[u8]>> {
    pages
        .chunks(8)
        .map(|g| g.iter().map(|p| p.as_slice()).collect())
        .collect()
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let n = args.first().copied().unwrap_or(4096);
    let rounds = args.get(1).copied().unwrap_or(5);
    let pages = corpus(n);
    let n = pages.len() as f64;
    let gs = groups(&pages);
    let mut dst = vec![0u8; 8 * PAGE_SIZE];
    let mut out = Vec::with_capacity(8);

    // Software deflate called directly, page by page.
    let mut sw = DeflateCodec::new(1, Algo::DeflateIaa);
    let (sw_ns, _) = best(rounds, || {
        for p in &pages {
            std::hint::black_box(sw.compress(p, &mut dst[..BUDGET]).ok());
        }
        0
    });

    let dir = std::env::temp_dir().join(format!("zblk-accel-bench-{}", std::process::id()));
    let model = ModelDevice::new(
        1,
        &[ModelWqConfig::new("wq1.0", WqMode::Shared, 64)],
        Exec::Inline,
    )
    .unwrap();
    model.write_sysfs(&dir).unwrap();
    let router = Router::open(&dir, Path::new("/dev/iax"), &model.opener());
    let mut run = |verify: bool| {
        let mut codec = IaaCodec::with_router(
            &router,
            IaaOptions {
                verify,
                ..IaaOptions::default()
            },
        );
        best(rounds, || {
            let before = model.stats().busy_ns;
            for g in &gs {
                out.clear();
                std::hint::black_box(codec.compress_batch(g, &mut dst, BUDGET, &mut out).ok());
            }
            model.stats().busy_ns - before
        })
    };
    let (hw_ns, hw_busy) = run(false);
    let (hv_ns, hv_busy) = run(true);

    // Decompression: software vs device path.
    let mut comp: Vec<Vec<u8>> = Vec::new();
    for p in &pages {
        if let Ok(Some(k)) = sw.compress(p, &mut dst[..BUDGET]) {
            comp.push(dst[..k].to_vec());
        }
    }
    let mut page = vec![0u8; PAGE_SIZE];
    let m = comp.len() as f64;
    let (swd_ns, _) = best(rounds, || {
        for c in &comp {
            std::hint::black_box(sw.decompress(c, &mut page).ok());
        }
        0
    });
    let mut codec = IaaCodec::with_router(&router, IaaOptions::default());
    let (hwd_ns, hwd_busy) = best(rounds, || {
        let before = model.stats().busy_ns;
        for c in &comp {
            std::hint::black_box(codec.decompress(c, &mut page).ok());
        }
        model.stats().busy_ns - before
    });
    let _ = std::fs::remove_dir_all(&dir);

    let per = |ns: u64, k: f64| ns as f64 / k;
    let sw_p = per(sw_ns, n);
    println!(
        "pages: {} compress (budget {BUDGET}), {} decompress; best of {rounds}",
        n, m
    );
    println!("| path | wall ns/page | model busy ns/page | overhead ns/page | overhead vs sw |");
    println!("|---|---|---|---|---|");
    println!("| software deflate:1 compress | {sw_p:.0} | - | - | - |");
    for (name, ns, busy) in [
        ("IAA path, verify off", hw_ns, hw_busy),
        ("IAA path, verify on", hv_ns, hv_busy),
    ] {
        let ov = per(ns, n) - per(busy, n);
        println!(
            "| {name} | {:.0} | {:.0} | {ov:.0} | {:+.1} % |",
            per(ns, n),
            per(busy, n),
            100.0 * ov / sw_p
        );
    }
    let swd = per(swd_ns, m);
    let ovd = per(hwd_ns, m) - per(hwd_busy, m);
    println!("| software inflate | {swd:.0} | - | - | - |");
    println!(
        "| IAA path decompress | {:.0} | {:.0} | {ovd:.0} | {:+.1} % |",
        per(hwd_ns, m),
        per(hwd_busy, m),
        100.0 * ovd / swd
    );
}
