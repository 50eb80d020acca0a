//! The config file of `zblk setup` (`zblk_tools::cli::conf`) and the
//! column list of `zblk list --output` (`zblk_tools::cli::columns`): raw
//! text, and TOML built section by section from typed keys whose values
//! are either ones the file takes or anything (see the fuzz_target for
//! how a seed file is fed). Checks: no panic; a refusal is one line
//! naming the file (and, with a line number, a line of the file); every
//! device the file makes has a section name `ublkbN` with `N` its id, ids
//! unique and in order, a size that `eval_size` gives for its expression,
//! a multiple of 4096 and at least 4096, and is swap or a filesystem
//! (`mount-point`), never both; a file of
//! valid values only is taken whole (a device per section); a size
//! expression that evaluates is a multiple of 4096, at least 4096, and a
//! plain number evaluates to its MB rounded down to 4 KB; a parsed column
//! list has one column per name asked for, headed by that name.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use std::path::Path;
use zblk_tools::cli::columns::Columns;
use zblk_tools::cli::conf::{eval_size, parse};

const FILE: &str = "/etc/zblk/zblk.conf";
const PAGE: u64 = 4096;

/// Values each key takes: the first `*_OK` of each list are valid, the
/// rest are not.
const ALGOS: [&str; 9] = [
    "lz4",
    "zstd",
    "zstd:3",
    "zstd:19",
    "deflate:6",
    "none",
    "zstd:99",
    "lzo",
    "ZSTD",
];
const ALGOS_OK: usize = 6;
const MODES: [&str; 4] = ["per-page", "packed", "dense", ""];
const MODES_OK: usize = 2;
const LIMITS: [&str; 8] = [
    "0",
    "1G",
    "512M",
    "ram / 4",
    "min(ram / 8, 1024)",
    "1X",
    "-1",
    "ram / 0",
];
const LIMITS_OK: usize = 5;
const OPTIONS: [&str; 6] = [
    "discard",
    "discard=pages",
    "discard=once",
    "",
    "nofail",
    "discard,x",
];
const OPTIONS_OK: usize = 4;
const SIZES: [&str; 8] = [
    "ram / 2",
    "min(ram / 2, 4096)",
    "max(ram * 0.25, 1)",
    "ram",
    "-ram",
    "ram / 0",
    "rom",
    "((",
];
const SIZES_OK: usize = 4;
/// Section names that make no device.
const NAMES: [&str; 4] = ["zram0", "ublkb01", "ublkb", "ublkb-1"];

/// A value written for a key.
#[derive(Arbitrary, Debug)]
enum V {
    /// One from the key's list (a valid number for numeric keys).
    Pick(u8),
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
    /// Any TOML text after `key = `.
    Raw(String),
}

#[derive(Arbitrary, Debug)]
struct Section {
    /// `ublkbN` for `Ok`, else a name from `NAMES` or anything.
    name: Result<u8, Result<u8, String>>,
    size: V,
    algo: Option<V>,
    mode: Option<V>,
    group_pages: Option<V>,
    mem_limit: Option<V>,
    priority: Option<V>,
    options: Option<V>,
    recovery: Option<V>,
    /// Any key and value.
    extra: Option<(String, V)>,
}

#[derive(Arbitrary, Debug)]
enum Input {
    Text { text: String, ram_mb: f64 },
    Sections { sections: Vec<Section>, ram_mb: u32 },
    Size { expr: String, ram_mb: f64 },
    Number { mb: u32, frac: u16 },
    Columns(String),
}

/// A TOML string: JSON's escapes are TOML's.
fn quoted(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

/// `v` as TOML text, `Pick` choosing from `list`; and whether it is sure
/// to be taken (a pick among the first `ok`).
fn render(v: &V, list: &[&str], ok: usize) -> (String, bool) {
    match v {
        V::Pick(i) if !list.is_empty() => {
            let i = usize::from(*i) % list.len();
            (quoted(list[i]), i < ok)
        }
        V::Pick(i) => (i.to_string(), false),
        V::Int(n) => (n.to_string(), false),
        V::Float(f) => (format!("{f:?}"), false),
        V::Bool(b) => (b.to_string(), false),
        V::Str(s) => (quoted(s), false),
        V::Raw(r) => (r.replace('\n', " "), false),
    }
}

/// A numeric key: `Pick` is a valid number (`pick`), the rest anything.
fn number(v: &V, pick: impl Fn(u8) -> i64) -> (String, bool) {
    match v {
        V::Pick(i) => (pick(*i).to_string(), true),
        other => render(other, &[], 0),
    }
}

/// Appends the section as TOML; whether every value in it is taken.
fn section_text(s: &Section, out: &mut String) -> bool {
    let name = match &s.name {
        Ok(n) => format!("ublkb{}", n % 64),
        Err(Ok(i)) => NAMES[usize::from(*i) % NAMES.len()].to_string(),
        Err(Err(any)) => quoted(any),
    };
    let mut valid = s.name.is_ok();
    out.push_str(&format!("[{name}]\n"));
    let mut put = |k: &str, (text, ok): (String, bool)| {
        valid &= ok;
        out.push_str(&format!("{k} = {text}\n"));
    };
    put("size", render(&s.size, &SIZES, SIZES_OK));
    let lists: [(&str, &Option<V>, &[&str], usize); 4] = [
        ("compression-algorithm", &s.algo, &ALGOS, ALGOS_OK),
        ("mode", &s.mode, &MODES, MODES_OK),
        ("mem-limit", &s.mem_limit, &LIMITS, LIMITS_OK),
        ("options", &s.options, &OPTIONS, OPTIONS_OK),
    ];
    for (k, v, list, ok) in lists {
        if let Some(v) = v {
            put(k, render(v, list, ok));
        }
    }
    if let Some(v) = &s.group_pages {
        put("group-pages", number(v, |i| i64::from(i % 64) + 1));
    }
    if let Some(v) = &s.priority {
        put("swap-priority", number(v, |i| i64::from(i) * 100 - 1));
    }
    if let Some(v) = &s.recovery {
        let (text, _) = render(v, &[], 0);
        put("recovery", (text, matches!(v, V::Bool(_))));
    }
    if let Some((k, v)) = &s.extra {
        put(&quoted(k), (render(v, &[], 0).0, false));
    }
    valid
}

/// A refusal names the file, on one line; a line it names is in the file.
fn check_error(e: &str, text: &str) {
    assert!(!e.contains(['\n', '\r']), "not one line: {e:?}");
    let rest = e
        .strip_prefix(FILE)
        .and_then(|r| r.strip_prefix(':'))
        .unwrap_or_else(|| panic!("does not name the file: {e:?}"));
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    if !digits.is_empty() && rest[digits.len()..].starts_with(':') {
        let line: usize = digits.parse().expect("a line number");
        let lines = text.split('\n').count();
        assert!((1..=lines).contains(&line), "line {line} of {lines}: {e:?}");
    }
}

/// Every device the file makes, checked; `Ok` with how many.
fn check_file(text: &str, ram_mb: f64) -> Result<usize, String> {
    let entries = parse(Path::new(FILE), text, ram_mb).inspect_err(|e| check_error(e, text))?;
    let mut last = None;
    for e in &entries {
        let id = e.add.dev.id.expect("a section names its device");
        assert_eq!(e.name, format!("ublkb{id}"));
        assert!(last < Some(id), "ids not unique and in order: {entries:?}");
        last = Some(id);
        let size = e.add.dev.size;
        assert!(size >= PAGE && size % PAGE == 0, "size {size} of {e:?}");
        assert_eq!(eval_size(&e.size_expr, ram_mb), Ok(size), "{e:?}");
        assert!(e.add.swap != e.mount.is_some(), "swap or a filesystem: {e:?}");
    }
    Ok(entries.len())
}

fn check_size(expr: &str, ram_mb: f64) -> Option<u64> {
    match eval_size(expr, ram_mb) {
        Ok(b) => {
            assert!(
                b >= PAGE && b % PAGE == 0,
                "'{expr}' (ram {ram_mb}) gave {b}"
            );
            Some(b)
        }
        Err(e) => {
            assert!(!e.contains('\n'), "not one line: {e:?}");
            None
        }
    }
}

fn check_columns(s: &str) {
    match Columns::parse(s) {
        Ok(c) => {
            let asked: Vec<String> = s
                .split(',')
                .map(|n| n.trim().to_ascii_uppercase())
                .collect();
            assert_eq!(c.headers(), asked, "{s:?}");
            for entry in [
                serde_json::Value::Null,
                serde_json::json!({"name": "ublkb0", "data": 1u64 << 40, "swap": true}),
            ] {
                assert_eq!(c.row(&entry, false).len(), asked.len());
                assert_eq!(c.row(&entry, true).len(), asked.len());
            }
        }
        Err(e) => assert!(
            !e.contains('\n') && e.starts_with("unknown column '"),
            "{e:?}"
        ),
    }
}

// The first byte picks: `#` (as a file starts) takes the rest as the
// text of a file, on a 16 GB machine, so seeds are plain config files
// behind one byte; anything else builds an [`Input`] from the rest.
fuzz_target!(|data: &[u8]| {
    match data.split_first() {
        Some((b'#', text)) => {
            let _ = check_file(&String::from_utf8_lossy(text), 16384.0);
        }
        Some((_, rest)) => {
            if let Ok(input) = Input::arbitrary_take_rest(arbitrary::Unstructured::new(rest)) {
                run(input);
            }
        }
        None => {}
    }
});

fn run(input: Input) {
    match input {
        Input::Text { text, ram_mb } => {
            let _ = check_file(&text, ram_mb);
        }
        Input::Sections { sections, ram_mb } => {
            let mut text = String::new();
            let mut valid = true;
            let mut ids = std::collections::HashSet::new();
            for s in sections.iter().take(8) {
                valid &= section_text(s, &mut text);
                if let Ok(n) = s.name {
                    valid &= ids.insert(n % 64);
                }
                text.push('\n');
            }
            let ram = f64::from(ram_mb % (1 << 22) + 1);
            let got = check_file(&text, ram);
            if valid {
                assert_eq!(got, Ok(ids.len()), "{text}");
            }
        }
        Input::Size { expr, ram_mb } => {
            check_size(&expr, ram_mb);
        }
        Input::Number { mb, frac } => {
            let expr = format!("{mb}.{frac:05}");
            let want_bytes = expr.parse::<f64>().expect("a number") * 1024.0 * 1024.0;
            let want = ((want_bytes as u64) / PAGE * PAGE).max(PAGE);
            assert_eq!(check_size(&expr, 1.0), Some(want), "{expr}");
        }
        Input::Columns(s) => check_columns(&s),
    }
}
