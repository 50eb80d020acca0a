//! Engine-level ratios in one process: the store path against the bare codec
//! on the same pages, interleaved over several rounds so that machine noise
//! hits both alike. Usage: `engine_ratios FILE [ALGO...] [--rounds N]`.
//!
//! Prints one JSON line per algorithm and group size with the medians and
//! the ratios store/codec for write (vs compress) and read (vs decompress).

use std::path::PathBuf;
use zblk::bench::{codec_ceiling, load_input, run, BenchOptions};
use zblk::Algo;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let path = PathBuf::from(
        args.next()
            .ok_or("usage: engine_ratios FILE [ALGO...] [--rounds N]")?,
    );
    let mut algos = Vec::new();
    let mut rounds = 5;
    while let Some(a) = args.next() {
        if a == "--rounds" {
            rounds = args
                .next()
                .and_then(|n| n.parse().ok())
                .ok_or("--rounds needs a number")?;
        } else {
            algos.push(a.parse::<Algo>()?);
        }
    }
    if algos.is_empty() {
        algos = vec![Algo::Lz4, Algo::Zstd(1)];
    }
    let data = load_input(&path)?;
    for algo in algos {
        for g in [1, 8] {
            let opts = BenchOptions {
                algo,
                group_pages: g,
                ..BenchOptions::default()
            };
            let (mut w, mut r, mut c, mut d) = (vec![], vec![], vec![], vec![]);
            let mut last = None;
            for _ in 0..rounds {
                let ceil = codec_ceiling(algo, &data).map_err(|e| e.to_string())?;
                let rep = run(&opts, &data).map_err(|e| e.to_string())?;
                if rep.verify_errors != 0 {
                    return Err(format!("{} pages did not verify", rep.verify_errors));
                }
                c.push(ceil.compress_mb_s);
                d.push(ceil.decompress_mb_s);
                w.push(rep.write_mb_s);
                r.push(rep.read_mb_s);
                last = Some(rep);
            }
            let rep = last.ok_or("no rounds")?;
            let (w, r, c, d) = (
                median(&mut w),
                median(&mut r),
                median(&mut c),
                median(&mut d),
            );
            println!(
                "{{\"algo\":\"{algo}\",\"group_pages\":{g},\"rounds\":{rounds},\"ratio_data\":{:.3},\"ratio_mem\":{:.3},\"write_mb_s\":{w:.0},\"codec_compress_mb_s\":{c:.0},\"write_vs_codec\":{:.3},\"read_mb_s\":{r:.0},\"codec_decompress_mb_s\":{d:.0},\"read_vs_codec\":{:.3},\"write_p99_us\":{:.1},\"read_p99_us\":{:.1}}}",
                rep.ratio_data, rep.ratio_mem, w / c, r / d, rep.write_p99_us, rep.read_p99_us
            );
        }
    }
    Ok(())
}
