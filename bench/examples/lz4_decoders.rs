//! Which decoder the `lz4hc` codec uses, for BENCHMARKS.md: lz4_flex's
//! (the `lz4` codec's) against liblz4's `LZ4_decompress_safe`, over the
//! pages of FILE compressed alone with `lz4hc` (and `lz4`), the two timed
//! in turn round after round (each first in every other round) in this one process. Usage:
//!
//!     lz4_decoders FILE [--rounds N]

use std::path::PathBuf;
use std::time::Instant;
use zblk::{Algo, PAGE_SIZE};
use zblk_bench::engine::load_input;
use zblk_bench::{max, median, min};

/// The compressed pages of `data` (those that compress), back to back.
fn compress_all(algo: Algo, data: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    let mut codec = algo.new_codec();
    let mut dst = vec![0u8; PAGE_SIZE];
    let mut objs = Vec::new();
    for page in data.chunks_exact(PAGE_SIZE) {
        if let Some(n) = codec
            .compress(page, &mut dst[..zblk::DEFAULT_HUGE_THRESHOLD - 1])
            .map_err(|e| e.to_string())?
        {
            objs.push(dst[..n].to_vec());
        }
    }
    Ok(objs)
}

/// MB/s of decoded pages through `decode`.
fn time(objs: &[Vec<u8>], decode: &dyn Fn(&[u8], &mut [u8]) -> bool) -> Result<f64, String> {
    let mut out = vec![0u8; PAGE_SIZE];
    let t0 = Instant::now();
    for o in objs {
        if !decode(o, &mut out) {
            return Err("a page did not decode".into());
        }
    }
    Ok((objs.len() * PAGE_SIZE) as f64 / 1e6 / t0.elapsed().as_secs_f64().max(1e-9))
}

fn flex(src: &[u8], dst: &mut [u8]) -> bool {
    matches!(lz4_flex::block::decompress_into(src, dst), Ok(PAGE_SIZE))
}

fn liblz4(src: &[u8], dst: &mut [u8]) -> bool {
    // SAFETY: both buffers are valid for the lengths passed; liblz4 writes
    // at most `dst.len()` bytes and reads at most `src.len()`.
    let n = unsafe {
        lz4_sys::LZ4_decompress_safe(
            src.as_ptr().cast(),
            dst.as_mut_ptr().cast(),
            src.len() as i32,
            dst.len() as i32,
        )
    };
    n == PAGE_SIZE as i32
}

fn main() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let path = PathBuf::from(args.next().ok_or("usage: lz4_decoders FILE [--rounds N]")?);
    let mut rounds = 5;
    if args.next().as_deref() == Some("--rounds") {
        rounds = args
            .next()
            .and_then(|n| n.parse().ok())
            .ok_or("--rounds needs a number")?;
    }
    let data = load_input(&path).map_err(|e| e.to_string())?;
    println!("| pages of | lz4_flex MB/s | liblz4 MB/s | liblz4 / lz4_flex (median, min-max) |");
    println!("| --- | --- | --- | --- |");
    for algo in [Algo::Lz4Hc(9), Algo::Lz4] {
        let objs = compress_all(algo, &data)?;
        let (mut a, mut b, mut r) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..rounds {
            // Each goes first in every other round.
            let (f, l) = if i % 2 == 0 {
                (time(&objs, &flex)?, time(&objs, &liblz4)?)
            } else {
                let l = time(&objs, &liblz4)?;
                (time(&objs, &flex)?, l)
            };
            a.push(f);
            b.push(l);
            r.push(l / f);
        }
        println!(
            "| {algo} | {:.0} | {:.0} | {:.2} ({:.2}-{:.2}) |",
            median(a),
            median(b),
            median(r.clone()),
            min(&r),
            max(&r)
        );
    }
    Ok(())
}
