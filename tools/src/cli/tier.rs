//! `zblk writeback` and `zblk recompress`: the pages of a type, of index
//! ranges (`--pages`, zram's `page_indexes=`) or of a cgroup (`--cgroup`:
//! the ranges of the pages its processes map, found by the scan of `zblk
//! stat --by`), sent to the daemon [`RANGES_PER_REQUEST`] ranges a
//! request, the replies summed into one line.

use super::args::{RecompressArgs, WritebackArgs};
use super::attrib;
use super::base::{CliError, CliResult};
use serde_json::Value;
use std::time::Duration;
use zblk::PageRange;
use zblk_ublk::control::{self, Request};

/// How long one request may take: a whole device's worth of pages through
/// the backing device's I/O or a strong codec.
const TIMEOUT: Duration = Duration::from_secs(600);

/// Most page ranges one request carries: its line stays well under the
/// control socket's limit (at most 41 bytes a range).
const RANGES_PER_REQUEST: usize = 8192;

/// The counts of a writeback reply, in the order its line prints them.
const WRITEBACK_KEYS: [&str; 8] = [
    "selected",
    "written",
    "raced",
    "bytes",
    "blocks",
    "full",
    "limited",
    "pages_compacted",
];

/// The counts of a recompression reply, in the order its line prints
/// them.
const RECOMPRESS_KEYS: [&str; 4] = ["tried", "recompressed", "saved_bytes", "pages_compacted"];

/// Keys of a reply that are flags: the sum's is set when any reply's is.
const FLAGS: [&str; 2] = ["full", "limited"];

/// `zblk writeback -n ID --type T | --pages LOW-HIGH... | --cgroup PATH
/// [--limit PAGES]`.
pub fn writeback(a: WritebackArgs) -> CliResult {
    let sum = match ranges(
        a.id,
        &a.pages,
        a.cgroup.as_deref(),
        "zblk writeback --cgroup",
    )? {
        None => {
            let req = Request::Writeback {
                kind: a.kind,
                pages: Vec::new(),
                limit: a.limit,
            };
            let mut sum = ReplySum::new(&WRITEBACK_KEYS);
            sum.add(&control::request(a.id, &req, TIMEOUT)?);
            sum
        }
        Some(ranges) => writeback_pages(a.id, &ranges, a.limit)?,
    };
    println!("{}", sum.line());
    Ok(())
}

/// Writes back every stored page of `ranges` on device `id`, at most
/// `limit` (0: no limit but the device's).
pub fn writeback_pages(id: u32, ranges: &[PageRange], limit: u64) -> Result<ReplySum, CliError> {
    let mut sum = ReplySum::new(&WRITEBACK_KEYS);
    let make = |pages, sum: &ReplySum| {
        if sum.get("full") + sum.get("limited") > 0 {
            return None;
        }
        Some(Request::Writeback {
            kind: None,
            pages,
            limit: left(limit, sum.get("written"))?,
        })
    };
    send_ranges(ranges, &mut sum, make, |r| {
        Ok(control::request(id, r, TIMEOUT)?)
    })?;
    Ok(sum)
}

/// `zblk recompress -n ID [--algo ALGO | --priority N] [--type T]
/// [--threshold B] [--max-pages N] [--pages LOW-HIGH... | --cgroup PATH]`.
pub fn recompress(a: RecompressArgs) -> CliResult {
    let req = |pages, max_pages| Request::Recompress {
        algo: a.algo.clone().unwrap_or_default(),
        priority: a.priority,
        kind: a.kind.clone(),
        threshold: a.threshold,
        max_pages,
        pages,
    };
    let sum = match ranges(
        a.id,
        &a.pages,
        a.cgroup.as_deref(),
        "zblk recompress --cgroup",
    )? {
        None => {
            let mut sum = ReplySum::new(&RECOMPRESS_KEYS);
            sum.add(&control::request(
                a.id,
                &req(Vec::new(), a.max_pages),
                TIMEOUT,
            )?);
            sum
        }
        Some(ranges) => recompress_pages(a.id, &ranges, a.max_pages, req)?,
    };
    println!("{}", sum.line());
    Ok(())
}

/// Recompresses the idle pages of `ranges` on device `id` with its
/// secondary algorithms (the idle policy's recompression).
pub fn recompress_idle_pages(id: u32, ranges: &[PageRange]) -> Result<ReplySum, CliError> {
    let req = |pages, max_pages| Request::Recompress {
        algo: String::new(),
        priority: None,
        kind: "idle".into(),
        threshold: 0,
        max_pages,
        pages,
    };
    recompress_pages(id, ranges, 0, req)
}

/// Recompresses within `ranges` on device `id`, trying at most
/// `max_pages` (0: no limit): `req(pages, max_pages)` is the request of
/// a chunk. No range, no request: an empty list would mean the whole
/// device.
fn recompress_pages(
    id: u32,
    ranges: &[PageRange],
    max_pages: u64,
    req: impl Fn(Vec<String>, u64) -> Request,
) -> Result<ReplySum, CliError> {
    let mut sum = ReplySum::new(&RECOMPRESS_KEYS);
    let make = |pages, sum: &ReplySum| Some(req(pages, left(max_pages, sum.get("tried"))?));
    send_ranges(ranges, &mut sum, make, |r| {
        Ok(control::request(id, r, TIMEOUT)?)
    })?;
    Ok(sum)
}

/// The page ranges `--pages` (`pages`) or `--cgroup` (`cgroup`, found by
/// a scan as root; `cmd` names the command in a refusal) select on device
/// `id`; None when neither is given.
fn ranges(
    id: u32,
    pages: &[PageRange],
    cgroup: Option<&str>,
    cmd: &str,
) -> Result<Option<Vec<PageRange>>, CliError> {
    match cgroup {
        Some(path) => attrib::cgroup_pages(id, path, cmd).map(Some),
        None if pages.is_empty() => Ok(None),
        None => Ok(Some(pages.to_vec())),
    }
}

/// What a limit of `limit` (0: none) leaves after `done`: the next
/// request's limit (0: none), or None when it is reached.
fn left(limit: u64, done: u64) -> Option<u64> {
    match limit {
        0 => Some(0),
        l if done >= l => None,
        l => Some(l - done),
    }
}

/// Sends `ranges`, [`RANGES_PER_REQUEST`] a request: `make` turns a
/// chunk's ranges and the sum so far into the request (None: stop
/// there), `send` sends it; each reply is added to `sum`.
fn send_ranges(
    ranges: &[PageRange],
    sum: &mut ReplySum,
    make: impl Fn(Vec<String>, &ReplySum) -> Option<Request>,
    send: impl Fn(&Request) -> Result<Value, CliError>,
) -> CliResult {
    for chunk in ranges.chunks(RANGES_PER_REQUEST) {
        let Some(req) = make(chunk.iter().map(ToString::to_string).collect(), sum) else {
            break;
        };
        sum.add(&send(&req)?);
    }
    Ok(())
}

/// The counts of one or more replies, by key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplySum {
    /// The keys, in the order the line prints them.
    keys: &'static [&'static str],
    /// Their sums (a flag: 1 when any reply's was true).
    n: Vec<u64>,
}

impl ReplySum {
    /// Zero of each of `keys`.
    fn new(keys: &'static [&'static str]) -> Self {
        ReplySum {
            keys,
            n: vec![0; keys.len()],
        }
    }

    /// Adds reply `r`'s counts (a key it lacks counts 0).
    fn add(&mut self, r: &Value) {
        for (k, n) in self.keys.iter().zip(&mut self.n) {
            match FLAGS.contains(k) {
                true => *n |= u64::from(r[k].as_bool().unwrap_or(false)),
                false => *n += r[k].as_u64().unwrap_or(0),
            }
        }
    }

    /// The sum of `key` (0 if it is not one of the keys).
    fn get(&self, key: &str) -> u64 {
        self.keys
            .iter()
            .position(|k| *k == key)
            .map_or(0, |i| self.n[i])
    }

    /// `KEY VALUE` for each key, on one line (flags as true or false).
    pub fn line(&self) -> String {
        let words: Vec<String> = self
            .keys
            .iter()
            .zip(&self.n)
            .map(|(k, n)| match FLAGS.contains(k) {
                true => format!("{k} {}", *n != 0),
                false => format!("{k} {n}"),
            })
            .collect();
        words.join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::cell::RefCell;

    #[test]
    fn writeback_replies_add_up() {
        let a = json!({"selected": 5, "written": 4, "raced": 1, "bytes": 900,
            "blocks": 1, "full": false, "limited": false, "pages_compacted": 2});
        let b = json!({"selected": 3, "written": 3, "bytes": 600, "blocks": 1,
            "full": true, "pages_compacted": 0});
        let mut sum = ReplySum::new(&WRITEBACK_KEYS);
        sum.add(&a);
        sum.add(&b);
        assert_eq!(
            sum.line(),
            "selected 8 written 7 raced 1 bytes 1500 blocks 2 full true limited false \
             pages_compacted 2"
        );
        assert_eq!(sum.get("written"), 7);
        assert_eq!(sum.get("nothing"), 0);
        let mut none = ReplySum::new(&RECOMPRESS_KEYS);
        none.add(&Value::Null);
        assert_eq!(
            none.line(),
            "tried 0 recompressed 0 saved_bytes 0 pages_compacted 0"
        );
    }

    #[test]
    fn a_limit_leaves_what_is_not_done() {
        assert_eq!(left(0, 500), Some(0), "no limit");
        assert_eq!(left(10, 3), Some(7));
        assert_eq!(left(10, 10), None);
        assert_eq!(left(10, 12), None);
    }

    /// `n` one-page ranges, every other page.
    fn sparse(n: u64) -> Vec<PageRange> {
        (0..n)
            .map(|i| PageRange {
                first: 2 * i,
                last: 2 * i,
            })
            .collect()
    }

    #[test]
    fn ranges_go_a_chunk_a_request_until_the_limit() {
        let sent = RefCell::new(Vec::new());
        // Each request tries every page it names.
        let send = |r: &Request| {
            let Request::Recompress { pages, .. } = r else {
                return Err(CliError("not a recompression".into()));
            };
            sent.borrow_mut().push(r.clone());
            Ok(json!({"tried": pages.len(), "recompressed": 1}))
        };
        let make = |pages, sum: &ReplySum| {
            Some(Request::Recompress {
                algo: String::new(),
                priority: None,
                kind: "idle".into(),
                threshold: 0,
                max_pages: left(10_000, sum.get("tried"))?,
                pages,
            })
        };
        let n = RANGES_PER_REQUEST as u64 * 2 + 5;
        let mut sum = ReplySum::new(&RECOMPRESS_KEYS);
        send_ranges(&sparse(n), &mut sum, make, send).unwrap();
        // The first chunk tries 8192, the second is asked for what is
        // left of the 10000; the third is not sent.
        let sent = sent.into_inner();
        assert_eq!(sent.len(), 2);
        let Request::Recompress {
            pages, max_pages, ..
        } = &sent[1]
        else {
            unreachable!()
        };
        assert_eq!(*max_pages, 10_000 - RANGES_PER_REQUEST as u64);
        assert_eq!(pages[0], (2 * RANGES_PER_REQUEST).to_string());
        assert_eq!(sum.get("tried"), 2 * RANGES_PER_REQUEST as u64);
        assert_eq!(sum.get("recompressed"), 2);
        // An error stops it and is the command's.
        let mut sum = ReplySum::new(&RECOMPRESS_KEYS);
        let fail = |_: &Request| Err(CliError("device 0: gone".into()));
        let e = send_ranges(&sparse(3), &mut sum, make, fail).unwrap_err();
        assert_eq!(e.0, "device 0: gone");
    }
}
