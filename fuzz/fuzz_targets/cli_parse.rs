//! The command line's value parsers: sizes (`zblk_ublk::size`), algorithms
//! (`Algo: FromStr`), modes (`Mode: FromStr`) and the whole set of device
//! flags (`DeviceConfig::from_flags`). Checks: no panic; a parsed size
//! round-trips (plain bytes and every suffix it divides by), a disk size is
//! a non-zero multiple of 4 KB and agrees with `parse_size`; an algorithm
//! or mode round-trips through its `Display` name; a parsed configuration
//! round-trips through its JSON form with the same invariants.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use zblk::{Algo, Mode};
use zblk_ublk::size::{parse_disk_size, parse_size};
use zblk_ublk::DeviceConfig;

const FLAGS: [&str; 16] = [
    "--size",
    "-s",
    "--algo",
    "-a",
    "--group-pages",
    "-g",
    "--mode",
    "-m",
    "--mem-limit",
    "--queues",
    "-q",
    "--depth",
    "-d",
    "--id",
    "-n",
    "--io-buf",
];
const SUFFIXES: [(&str, u32); 13] = [
    ("", 0),
    ("b", 0),
    ("K", 10),
    ("k", 10),
    ("KB", 10),
    ("KiB", 10),
    ("M", 20),
    ("mib", 20),
    ("G", 30),
    ("gB", 30),
    ("T", 40),
    ("TiB", 40),
    ("t", 40),
];

#[derive(Arbitrary, Debug)]
enum Word {
    Flag(u8),
    Text(String),
    Size { n: u64, suffix: u8 },
}

#[derive(Arbitrary, Debug)]
struct Input {
    text: String,
    n: u64,
    suffix: u8,
    pad: bool,
    words: Vec<Word>,
}

fn check_size(s: &str) {
    match parse_size(s) {
        Ok(n) => {
            assert_eq!(parse_size(&n.to_string()), Ok(n), "{s:?}");
            for (suf, shift) in SUFFIXES {
                if n % (1u64 << shift) == 0 {
                    let again = format!("{}{suf}", n >> shift);
                    assert_eq!(parse_size(&again), Ok(n), "{s:?} as {again:?}");
                }
            }
            match parse_disk_size(s) {
                Ok(d) => assert!(d == n && d != 0 && d % 4096 == 0, "{s:?}: {d}"),
                Err(_) => assert!(n == 0 || n % 4096 != 0, "{s:?}: {n} refused as a disk size"),
            }
        }
        Err(e) => {
            assert!(!e.is_empty());
            assert!(parse_disk_size(s).is_err(), "{s:?}");
        }
    }
}

fn check_names(s: &str) {
    if let Ok(a) = s.parse::<Algo>() {
        assert_eq!(a.to_string().parse::<Algo>(), Ok(a), "{s:?}");
    }
    if let Ok(m) = s.parse::<Mode>() {
        assert_eq!(m.to_string().parse::<Mode>(), Ok(m), "{s:?}");
        assert_eq!(m.to_string(), s);
    }
}

fuzz_target!(|input: Input| {
    check_size(&input.text);
    check_names(&input.text);
    // A well-formed size: the number with a suffix, maybe padded.
    let (suf, shift) = SUFFIXES[usize::from(input.suffix) % SUFFIXES.len()];
    let s = if input.pad {
        format!("  {}{suf} ", input.n)
    } else {
        format!("{}{suf}", input.n)
    };
    match input.n.checked_mul(1u64 << shift) {
        Some(v) => assert_eq!(parse_size(&s), Ok(v), "{s:?}"),
        None => assert!(parse_size(&s).unwrap_err().contains("too large"), "{s:?}"),
    }
    check_size(&s);
    // Whole flag sets, as `zblk add` gets them.
    let words: Vec<String> = input
        .words
        .iter()
        .take(24)
        .map(|w| match w {
            Word::Flag(i) => FLAGS[usize::from(*i) % FLAGS.len()].to_string(),
            Word::Text(t) => t.clone(),
            Word::Size { n, suffix } => {
                let (suf, _) = SUFFIXES[usize::from(*suffix) % SUFFIXES.len()];
                format!("{n}{suf}")
            }
        })
        .collect();
    for w in &words {
        check_names(w);
    }
    if let Ok(cfg) = DeviceConfig::from_flags(&words) {
        assert!(cfg.size != 0 && cfg.size % 4096 == 0, "{cfg:?}");
        assert!((1..=64).contains(&cfg.engine.group_pages), "{cfg:?}");
        if let Some(b) = cfg.io_buf {
            assert!(b >= 4096 && b % 4096 == 0, "{cfg:?}");
        }
        let json = cfg.to_json();
        assert_eq!(DeviceConfig::from_json(&json).as_ref(), Ok(&cfg), "{json}");
        let sc = cfg.store_config();
        assert_eq!(sc.size, cfg.size);
    }
});
