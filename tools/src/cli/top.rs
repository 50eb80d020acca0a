//! `zblk top`: one screen, refreshed, one row per device: what is stored,
//! the ratio, memory, IOPS and MB/s over the last interval (from the
//! counters' deltas), p99 latency and whether the daemon answers.
//!
//! Every round asks all daemons at once within one deadline
//! ([`super::scrape`]), so a stuck daemon costs a refresh at most that
//! deadline and shows as `no-answer`; the screen never freezes on it.

use super::args::TopArgs;
use super::base::CliResult;
use super::metrics::Scrape;
use super::scrape::{scrape, DEFAULT_TIMEOUT_SECS};
use super::show::table;
use super::size::format_size;
use super::term::{Term, Wake};
use serde_json::Value;
use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// The columns, in order.
pub const HEADERS: [&str; 13] = [
    "NAME", "STORED", "DATA", "COMPR", "RATIO", "MEM-USED", "R-IOPS", "W-IOPS", "R-MB/S", "W-MB/S",
    "W-P99-US", "R-P99-US", "STATE",
];

/// Bytes per page: the counters count 4 KB pages.
const PAGE: f64 = 4096.0;

/// Clears the screen and homes the cursor (on a terminal only).
const CLEAR: &str = "\x1b[H\x1b[2J";

/// The shortest wait for the daemons in one round: a daemon busy under
/// thrashing may need this long even when the interval is shorter.
const MIN_DEADLINE: Duration = Duration::from_secs(1);

/// The counters rates come from, as one device gave them at one time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// When the reply came.
    pub at: Instant,
    /// The daemon's process id: a new one restarted the counts.
    pub pid: u64,
    /// Read requests, write requests, pages read, pages written.
    pub counts: [u64; 4],
}

/// The keys of [`Sample::counts`], in the stats reply.
const COUNTERS: [&str; 4] = ["num_reads", "num_writes", "pages_read", "pages_written"];

impl Sample {
    /// The sample in a `stats` reply received at `at`.
    pub fn of(reply: &Value, at: Instant) -> Sample {
        let s = &reply["stats"];
        Sample {
            at,
            pid: reply["device"]["pid"].as_u64().unwrap_or(0),
            counts: COUNTERS.map(|k| s[k].as_u64().unwrap_or(0)),
        }
    }
}

/// Per-second rates over one interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rates {
    /// Read and write requests per second.
    pub iops: [f64; 2],
    /// Read and written megabytes (10^6 bytes) per second.
    pub mbps: [f64; 2],
}

/// The rate of a counter that went from `before` to `after` in `secs`:
/// none when it went down (the daemon restarted, or the counter wrapped),
/// since a rate is never negative, and none over no time.
pub fn rate(before: u64, after: u64, secs: f64) -> Option<f64> {
    let delta = after.checked_sub(before)?;
    (secs > 0.0).then(|| delta as f64 / secs)
}

/// The rates between two samples of one device; none when its daemon
/// changed in between or any counter went backwards.
pub fn rates(before: &Sample, after: &Sample) -> Option<Rates> {
    if before.pid != after.pid {
        return None;
    }
    let secs = after.at.checked_duration_since(before.at)?.as_secs_f64();
    let r = |i: usize| rate(before.counts[i], after.counts[i], secs);
    Some(Rates {
        iops: [r(0)?, r(1)?],
        mbps: [r(2)? * PAGE / 1e6, r(3)? * PAGE / 1e6],
    })
}

/// The row of a device that answered; rates `-` when there are none yet.
pub fn row(reply: &Value, rates: Option<Rates>) -> Vec<String> {
    let (d, s) = (&reply["device"], &reply["stats"]);
    let n = |k: &str| s[k].as_u64().unwrap_or(0);
    let (data, compr) = (n("orig_data_size"), n("compr_data_size"));
    let ratio = match compr {
        0 => "-".to_string(),
        c => format!("{:.2}", data as f64 / c as f64),
    };
    let shown = |f: fn(&Rates) -> f64, digits: usize| {
        rates.map_or("-".to_string(), |r| format!("{:.*}", digits, f(&r)))
    };
    let p99 = |op: &str| match &s["latency"][op] {
        l if l["count"].as_u64().unwrap_or(0) == 0 => "-".to_string(),
        l => l["p99_us"]
            .as_f64()
            .map_or("-".to_string(), |x| format!("{x:.0}")),
    };
    vec![
        d["path"].as_str().unwrap_or("?").to_string(),
        n("stored_pages").to_string(),
        format_size(data),
        format_size(compr),
        ratio,
        format_size(n("mem_used_total")),
        shown(|r| r.iops[0], 0),
        shown(|r| r.iops[1], 0),
        shown(|r| r.mbps[0], 1),
        shown(|r| r.mbps[1], 1),
        p99("write"),
        p99("read"),
        "live".to_string(),
    ]
}

/// The row of device `id`, whose daemon did not answer in time.
pub fn down_row(id: u32) -> Vec<String> {
    let mut r = vec!["-".to_string(); HEADERS.len()];
    r[0] = zblk_ublk::paths::bdev_path(id).display().to_string();
    r[HEADERS.len() - 1] = "no-answer".to_string();
    r
}

/// One screen: a title line, then the table.
pub fn frame(rows: &[Vec<String>], interval: Duration) -> String {
    let title = format!(
        "zblk top: {} device(s), every {}s (q or Ctrl-C quits)",
        rows.len(),
        interval.as_secs_f64()
    );
    format!("{title}\n{}\n", table(&HEADERS, rows))
}

/// The rows of one round; remembers each answering device's sample in
/// `last` for the next round's rates (a device that did not answer keeps
/// its older one, so its next rates span the gap).
fn rows_of(scrapes: &[Scrape], at: Instant, last: &mut HashMap<u32, Sample>) -> Vec<Vec<String>> {
    scrapes
        .iter()
        .map(|s| match s {
            Scrape::Up(reply) => {
                let id = reply["device"]["id"].as_u64().unwrap_or(0) as u32;
                let now = Sample::of(reply, at);
                let r = last.get(&id).and_then(|before| rates(before, &now));
                last.insert(id, now);
                row(reply, r)
            }
            Scrape::Down(id) => down_row(*id),
        })
        .collect()
}

/// How long one round waits for the daemons: the interval, but at least
/// [`MIN_DEADLINE`] and at most what the exporter waits by default.
fn deadline(interval: Duration) -> Duration {
    interval.clamp(MIN_DEADLINE, Duration::from_secs(DEFAULT_TIMEOUT_SECS))
}

/// `zblk top`.
pub fn top(a: TopArgs) -> CliResult {
    if a.by.is_some() {
        super::sys::check_root("zblk top --by")?;
    }
    let term = Term::open()?;
    let on_terminal = std::io::stdout().is_terminal();
    let mut last = HashMap::new();
    let mut round = 0u64;
    loop {
        let started = Instant::now();
        let screen = match a.by {
            Some(by) => super::attrib::screen(by, a.interval)?,
            None => {
                let scrapes = scrape(&a.run_dir, deadline(a.interval))?;
                frame(&rows_of(&scrapes, Instant::now(), &mut last), a.interval)
            }
        };
        show(&screen, on_terminal, round)?;
        round += 1;
        if a.iterations.is_some_and(|n| round >= n) {
            return Ok(());
        }
        // The time the daemons took counts towards the interval.
        if term.wait(a.interval.saturating_sub(started.elapsed())) == Wake::Quit {
            return Ok(());
        }
    }
}

/// Prints a frame: over the last one on a terminal, after a blank line
/// otherwise (so that a log of successive tables stays readable).
fn show(frame: &str, on_terminal: bool, round: u64) -> CliResult {
    let text = match (on_terminal, round) {
        (true, _) => format!("{CLEAR}{frame}"),
        (false, 0) => frame.to_string(),
        (false, _) => format!("\n{frame}"),
    };
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| super::base::CliError(format!("cannot write to stdout: {e}")))
}

#[cfg(test)]
mod tests {
    use super::super::show::tests::sample;
    use super::*;

    fn at(start: Instant, ms: u64, pid: u64, counts: [u64; 4]) -> Sample {
        Sample {
            at: start + Duration::from_millis(ms),
            pid,
            counts,
        }
    }

    #[test]
    fn rate_is_the_delta_over_the_time_and_never_negative() {
        assert_eq!(rate(100, 300, 2.0), Some(100.0));
        assert_eq!(rate(5, 5, 1.0), Some(0.0));
        // Went down: a restart or a wrap, no rate rather than a negative one.
        assert_eq!(rate(300, 100, 2.0), None);
        assert_eq!(rate(u64::MAX, 3, 1.0), None);
        assert_eq!(rate(1, 2, 0.0), None);
    }

    #[test]
    fn rates_over_an_interval_in_iops_and_megabytes() {
        let t = Instant::now();
        let a = at(t, 0, 7, [10, 20, 100, 1000]);
        let b = at(t, 500, 7, [60, 20, 100 + 250, 1000 + 2500]);
        let r = rates(&a, &b).unwrap();
        assert_eq!(r.iops, [100.0, 0.0]);
        assert_eq!(r.mbps, [500.0 * PAGE / 1e6, 5000.0 * PAGE / 1e6]);
    }

    #[test]
    fn a_restarted_daemon_gives_no_rates() {
        let t = Instant::now();
        let a = at(t, 0, 7, [10, 20, 30, 40]);
        // A new daemon counts from 0 again: lower counters.
        assert_eq!(rates(&a, &at(t, 1000, 7, [1, 20, 30, 40])), None);
        // A new pid, even with counters that happen to be higher.
        assert_eq!(rates(&a, &at(t, 1000, 8, [11, 21, 31, 41])), None);
        // Samples out of order.
        assert_eq!(rates(&at(t, 1000, 7, [0; 4]), &at(t, 0, 7, [0; 4])), None);
    }

    #[test]
    fn a_row_shows_the_device_its_ratio_and_its_rates() {
        let reply = sample();
        let r = row(&reply, None);
        assert_eq!(r.len(), HEADERS.len());
        let compr = reply["stats"]["compr_data_size"].as_u64().unwrap();
        let ratio = format!("{:.2}", 12288.0 / compr as f64);
        let want = ["/dev/ublkb0", "3", "12K", &format_size(compr), &ratio];
        assert_eq!(&r[..5], want);
        // No rates yet: dashes; latency was recorded, so p99 is a number.
        assert_eq!(&r[6..10], ["-", "-", "-", "-"]);
        assert!(
            r[10].parse::<u64>().is_ok() && r[11].parse::<u64>().is_ok(),
            "{r:?}"
        );
        assert_eq!(r[12], "live");
        let rates = Rates {
            iops: [1234.4, 0.6],
            mbps: [5.06, 0.0],
        };
        assert_eq!(
            &row(&reply, Some(rates))[6..10],
            ["1234", "1", "5.1", "0.0"]
        );
    }

    #[test]
    fn a_device_that_does_not_answer_says_so() {
        let r = down_row(4);
        assert_eq!(r[0], "/dev/ublkb4");
        assert_eq!(r[12], "no-answer");
        assert!(r[1..12].iter().all(|c| c == "-"));
    }

    #[test]
    fn rows_take_rates_from_the_previous_round() {
        let mut last = HashMap::new();
        let mut reply = sample();
        let t = Instant::now();
        let up = |r: &Value| vec![Scrape::Up(r.clone()), Scrape::Down(9)];
        let first = rows_of(&up(&reply), t, &mut last);
        assert_eq!(
            (first[0][7].as_str(), first[1][12].as_str()),
            ("-", "no-answer")
        );
        let w = reply["stats"]["num_writes"].as_u64().unwrap();
        reply["stats"]["num_writes"] = (w + 500).into();
        let second = rows_of(&up(&reply), t + Duration::from_millis(250), &mut last);
        assert_eq!(second[0][7], "2000");
        assert_eq!(second[0][6], "0");
    }

    #[test]
    fn a_frame_has_a_title_a_header_and_a_row_per_device() {
        let f = frame(
            &[row(&sample(), None), down_row(1)],
            Duration::from_millis(500),
        );
        let lines: Vec<&str> = f.lines().collect();
        assert_eq!(lines.len(), 4, "{f}");
        assert!(lines[0].starts_with("zblk top: 2 device(s), every 0.5s"));
        assert!(lines[1].starts_with("NAME ") && lines[1].ends_with("STATE"));
        assert!(lines[2].starts_with("/dev/ublkb0 ") && lines[2].ends_with("live"));
        assert!(lines[3].starts_with("/dev/ublkb1 ") && lines[3].ends_with("no-answer"));
    }

    #[test]
    fn the_deadline_follows_the_interval_within_bounds() {
        assert_eq!(deadline(Duration::from_millis(200)), MIN_DEADLINE);
        assert_eq!(deadline(Duration::from_secs(2)), Duration::from_secs(2));
        assert_eq!(deadline(Duration::from_secs(60)), Duration::from_secs(5));
    }
}
