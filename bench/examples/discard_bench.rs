//! The discard and churn measurements of `zblk_bench::discard`, one JSON
//! line each. Usage:
//! `discard_bench FILE [--threads 1,2,4] [--copies N] [--request-pages N]
//!  [--rounds N] [--algo lz4] [--churn [--huge-threshold BYTES] [--mode per-page|packed]]`.

use std::path::PathBuf;
use zblk::Mode;
use zblk_bench::discard::{churn_bench, discard_bench, ChurnOptions, DiscardOptions};
use zblk_bench::engine::load_input;

fn num(v: Option<String>, what: &str) -> Result<usize, String> {
    v.and_then(|s| s.parse().ok())
        .ok_or(format!("{what} needs a number"))
}

const USAGE: &str = "usage: discard_bench FILE [--threads 1,2,4] [--copies N] [--request-pages N]
  [--rounds N] [--algo lz4] [--churn [--huge-threshold BYTES] [--mode per-page|packed]]
  FILE: pages, zstd-compressed if it ends in .zst";

fn main() -> Result<(), String> {
    if std::env::args().any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return Ok(());
    }
    let mut args = std::env::args().skip(1);
    let path = PathBuf::from(args.next().ok_or("no FILE given (--help: usage)")?);
    let mut opts = DiscardOptions::default();
    let mut threads = vec![1, 2, 4];
    let mut churn = false;
    let mut huge = None;
    let mut mode = Mode::PerPage;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--threads" => {
                threads = args
                    .next()
                    .ok_or("--threads needs a list")?
                    .split(',')
                    .map(|t| t.parse().map_err(|_| format!("bad thread count {t}")))
                    .collect::<Result<_, _>>()?
            }
            "--copies" => opts.copies = num(args.next(), "--copies")?,
            "--request-pages" => opts.request_pages = num(args.next(), "--request-pages")?,
            "--rounds" => opts.rounds = num(args.next(), "--rounds")?,
            "--algo" => opts.algo = args.next().ok_or("--algo needs a name")?.parse()?,
            "--churn" => churn = true,
            "--mode" => mode = args.next().ok_or("--mode needs a name")?.parse()?,
            "--huge-threshold" => huge = Some(num(args.next(), "--huge-threshold")?),
            _ => return Err(format!("unknown argument {a}")),
        }
    }
    let data = load_input(&path).map_err(|e| e.to_string())?;
    if churn {
        let copt = ChurnOptions {
            algo: opts.algo,
            copies: opts.copies,
            huge_threshold: huge,
            mode,
            ..ChurnOptions::default()
        };
        let r = churn_bench(&copt, &data).map_err(|e| e.to_string())?;
        println!("{}", serde_json::to_string(&r).map_err(|e| e.to_string())?);
        return Ok(());
    }
    for t in threads {
        opts.discard_threads = t;
        let r = discard_bench(&opts, &data).map_err(|e| e.to_string())?;
        println!("{}", serde_json::to_string(&r).map_err(|e| e.to_string())?);
    }
    Ok(())
}
