//! `zblk list`, `zblk stat`, and the device line `zblk add` prints.

use super::args::{ListArgs, StatArgs, StatFormat};
use super::metrics::{self, Scrape};
use super::size::format_size;
use super::{
    base::{CliError, CliResult},
    fs,
};
use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;
use zblk_ublk::control::{self, DeviceInfo, Request};
use zblk_ublk::swap;

/// How long a stats request may take (the daemon waits for its queues).
const STATS_TIMEOUT: Duration = Duration::from_secs(10);

/// Prints rows under headers, columns padded to their widest cell.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    render_table(headers, rows, true)
}

/// [`table`], without the header line unless `show_headers` (whose width
/// then does not count, as in zramctl's `--noheadings`).
fn render_table(headers: &[&str], rows: &[Vec<String>], show_headers: bool) -> String {
    let mut width: Vec<usize> = match show_headers {
        true => headers.iter().map(|h| h.len()).collect(),
        false => vec![0; headers.len()],
    };
    for r in rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.len());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&width)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        padded.join(" ").trim_end().to_string()
    };
    let mut lines = Vec::with_capacity(rows.len() + 1);
    if show_headers {
        lines.push(line(headers.to_vec()));
    }
    lines.extend(
        rows.iter()
            .map(|r| line(r.iter().map(String::as_str).collect())),
    );
    lines.join("\n")
}

/// Prints a device as `zblk add` reports it.
pub fn print_device(info: &DeviceInfo, as_json: bool) -> CliResult {
    if as_json {
        let s = serde_json::to_string_pretty(info).map_err(|e| CliError(e.to_string()))?;
        println!("{s}");
        return Ok(());
    }
    let c = &info.config;
    let row = vec![
        info.path.clone(),
        info.id().to_string(),
        format_size(c.size),
        c.engine.algo.to_string(),
        c.queue_count().to_string(),
        c.depth.to_string(),
    ];
    println!(
        "{}",
        table(
            &["NAME", "ID", "DISKSIZE", "ALGORITHM", "QUEUES", "DEPTH"],
            &[row]
        )
    );
    Ok(())
}

/// The `stats` reply of device `id`: `{"device": .., "stats": ..}`.
fn fetch(id: u32) -> Result<Value, CliError> {
    Ok(control::request(id, &Request::Stats, STATS_TIMEOUT)?)
}

fn u(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or(0)
}

/// One `zblk list` row as JSON (raw numbers).
fn list_entry(reply: &Value) -> Value {
    let (d, s) = (&reply["device"], &reply["stats"]);
    let path = d["path"].as_str().unwrap_or("?");
    let (swap, mountpoint) = usage(path);
    json!({
        "name": path,
        "disksize": u(s, "disksize"),
        "data": u(s, "orig_data_size"),
        "compr": u(s, "compr_data_size"),
        "total": u(s, "mem_used_total"),
        "algorithm": s["algorithm"],
        "queues": u(d, "queues"),
        "zero_pages": u(s, "same_pages"),
        "mem_limit": u(s, "mem_limit"),
        "mem_used": u(s, "mem_used_max"),
        "swap": swap,
        "mountpoint": mountpoint,
        "state": "live",
        "recovery": d["recovery"].as_str().unwrap_or("off"),
        "recoveries": u(s, "recoveries"),
        "features": d["features"],
        "transport": d["transport_in_use"],
    })
}

/// A `zblk list` entry for device `id` whose daemon does not answer: its
/// keeper's word (`recovering` while a new daemon starts, `quiesced` while
/// none runs), else `dead`.
fn gone_entry(id: u32) -> Value {
    let k = zblk_ublk::keeper::status(id);
    let path = zblk_ublk::paths::bdev_path(id).display().to_string();
    let (swap, mountpoint) = usage(&path);
    json!({
        "name": path,
        "state": k.as_ref().map_or("dead", |k| k.state.as_str()),
        "recoveries": k.as_ref().map_or(0, |k| k.recoveries),
        "swap": swap,
        "mountpoint": mountpoint,
    })
}

/// The `swap` and `mountpoint` fields of the device at `path`: whether it
/// is active swap, and what lsblk's MOUNTPOINT shows for it (JSON null
/// for nothing, as in `lsblk --json`).
fn usage(path: &str) -> (bool, Value) {
    let dev = Path::new(path);
    let swap = swap::is_active_swap(dev);
    let mounts = if swap { Vec::new() } else { fs::mounts_of(dev) };
    (
        swap,
        mountpoint(swap, &mounts).map_or(Value::Null, Value::from),
    )
}

/// lsblk's MOUNTPOINT of a device: `[SWAP]` when it is active swap, else
/// where it was mounted first (of its `mounts`, in the order made), else
/// nothing.
fn mountpoint(swap: bool, mounts: &[String]) -> Option<String> {
    match swap {
        true => Some("[SWAP]".into()),
        false => mounts.first().cloned(),
    }
}

/// `zblk list`.
pub fn list(a: ListArgs) -> CliResult {
    let mut entries = Vec::new();
    for id in super::base::device_ids()? {
        match control::request(id, &Request::Stats, STATS_TIMEOUT) {
            Ok(reply) => entries.push(list_entry(&reply)),
            // A socket with no daemon behind it: a keeper may be bringing
            // the next one up; otherwise the device is dead.
            Err(control::ClientError::NoDevice(_)) => {
                let e = gone_entry(id);
                if e["state"] == "dead" {
                    eprintln!(
                        "zblk: device {id}: its daemon is gone (zblk del -n {id} removes it)"
                    );
                }
                entries.push(e);
            }
            Err(e) => eprintln!("zblk: device {id}: {e}"),
        }
    }
    if a.json {
        println!("{}", json!({ "devices": entries }));
    } else {
        let cols = a.output.unwrap_or_default();
        let rows: Vec<Vec<String>> = entries.iter().map(|e| cols.row(e, a.bytes)).collect();
        let text = render_table(&cols.headers(), &rows, !a.noheadings);
        if !text.is_empty() {
            println!("{text}");
        }
    }
    Ok(())
}

/// Fields shown with a human size next to the byte count.
const BYTE_FIELDS: [&str; 12] = [
    "disksize",
    "orig_data_size",
    "compr_data_size",
    "mem_used_total",
    "mem_used_max",
    "mem_limit",
    "mem_spare",
    "mem_huge",
    "slot_table_bytes",
    "bd_bytes",
    "bd_size",
    "bd_used_bytes",
];

/// Counters that are levels, not events: a page written through one queue
/// may be freed through another, so per queue they are net flows (clamped
/// at 0), meaningful only summed. The per-queue table leaves them out; the
/// JSON keeps them.
const GAUGES: [&str; 10] = [
    "orig_data_size",
    "compr_data_size",
    "same_pages",
    "huge_pages",
    "stored_pages",
    "packed_dead_bytes",
    "idle_pages",
    "recompressed_pages",
    "bd_count",
    "bd_bytes",
];

/// The text form of one device's statistics: every scalar field, derived
/// ratios, latency percentiles and the per-queue breakdown.
pub fn stat_text(reply: &Value) -> String {
    let (d, s) = (&reply["device"], &reply["stats"]);
    let mut out = format!(
        "{} (id {}, pid {}, {} queues x {} tags, {} I/O threads a queue, {} I/O buffers, recovery {})\n",
        d["path"].as_str().unwrap_or("?"),
        u(d, "id"),
        u(d, "pid"),
        u(d, "queues"),
        u(d, "depth"),
        u(d, "io_threads").max(1),
        format_size(u(d, "io_buf_bytes")),
        d["recovery"].as_str().unwrap_or("off"),
    );
    let mut rows = Vec::new();
    if let Some(obj) = s.as_object() {
        for (k, v) in obj {
            let shown = match v {
                Value::Number(n) if BYTE_FIELDS.contains(&k.as_str()) => {
                    format!("{n} ({})", format_size(n.as_u64().unwrap_or(0)))
                }
                Value::Number(n) => n.to_string(),
                Value::String(t) => t.clone(),
                _ => continue,
            };
            rows.push(vec![format!("  {k}"), shown]);
        }
    }
    let ratio = |a: u64, b: u64| {
        if b == 0 {
            "-".to_string()
        } else {
            format!("{:.2}", a as f64 / b as f64)
        }
    };
    // Groups that ran on queue threads, the rest of what workers ran.
    rows.push(vec![
        "  queue_groups".into(),
        u(s, "groups")
            .saturating_sub(u(s, "worker_groups"))
            .to_string(),
    ]);
    let orig = u(s, "orig_data_size");
    rows.push(vec![
        "  ratio_data".into(),
        ratio(orig, u(s, "compr_data_size")),
    ]);
    rows.push(vec![
        "  ratio_mem".into(),
        ratio(orig, u(s, "mem_used_total")),
    ]);
    out.push_str(&table(&["FIELD", "VALUE"], &rows));
    out.push('\n');
    if let Some(p) = reply["policy"].as_object() {
        let rows: Vec<Vec<String>> = p
            .iter()
            .map(|(k, v)| {
                let v = v.as_str().map_or_else(|| v.to_string(), str::to_string);
                vec![format!("  {k}"), v]
            })
            .collect();
        out.push_str(&table(&["IDLE POLICY", "VALUE"], &rows));
        out.push('\n');
    }

    let lat: Vec<Vec<String>> = ["write", "read", "discard", "writeback"]
        .iter()
        .map(|op| {
            let l = &s["latency"][op];
            let f = |k: &str| l[k].as_f64().map_or("-".into(), |x| format!("{x:.2}"));
            vec![
                format!("  {op}"),
                u(l, "count").to_string(),
                f("p50_us"),
                f("p95_us"),
                f("p99_us"),
            ]
        })
        .collect();
    out.push_str(&table(
        &["LATENCY", "PAGES", "P50_US", "P95_US", "P99_US"],
        &lat,
    ));
    out.push('\n');

    let queues = s["queues"].as_array().cloned().unwrap_or_default();
    let mut headers = vec!["PER-QUEUE".to_string()];
    headers.extend(
        (0..queues.len()).map(|i| match metrics::queue_thread(d, i) {
            (q, None) => format!("q{q}"),
            (q, Some(t)) => format!("q{q}.{t}"),
        }),
    );
    let keys: Vec<String> = queues
        .first()
        .and_then(Value::as_object)
        .map(|o| {
            o.keys()
                .filter(|k| !GAUGES.contains(&k.as_str()))
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    let rows: Vec<Vec<String>> = keys
        .iter()
        .map(|k| {
            let mut r = vec![format!("  {k}")];
            r.extend(queues.iter().map(|q| u(q, k).to_string()));
            r
        })
        .collect();
    let h: Vec<&str> = headers.iter().map(String::as_str).collect();
    out.push_str(&table(&h, &rows));
    out
}

/// `zblk stat`.
pub fn stat(a: StatArgs) -> CliResult {
    let format = a.format();
    loop {
        match format {
            StatFormat::Prometheus => print!("{}", metrics::render(&scrape(a.id)?)),
            StatFormat::Json => {
                for r in fetch_all(a.id)? {
                    println!("{r}");
                }
            }
            StatFormat::Text => {
                let texts: Vec<String> = fetch_all(a.id)?.iter().map(stat_text).collect();
                println!("{}", texts.join("\n"));
            }
        }
        let Some(secs) = a.watch else { return Ok(()) };
        std::thread::sleep(Duration::from_secs(secs));
        if format == StatFormat::Text {
            println!();
        }
    }
}

/// The replies of device `id`, or of every device: all or an error.
fn fetch_all(id: Option<u32>) -> Result<Vec<Value>, CliError> {
    let ids = match id {
        Some(id) => vec![id],
        None => super::base::device_ids()?,
    };
    ids.into_iter().map(fetch).collect()
}

/// What `--format prometheus` shows: device `id`, which must answer, or
/// every device, one that does not answer becoming `zblk_up 0` (and a
/// warning on stderr), so that one dead daemon does not blank a textfile.
fn scrape(id: Option<u32>) -> Result<Vec<Scrape>, CliError> {
    match id {
        Some(id) => Ok(vec![Scrape::Up(fetch(id)?)]),
        None => super::scrape::scrape(Path::new(zblk_ublk::paths::RUN_DIR), STATS_TIMEOUT),
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::super::columns::Columns;
    use super::*;
    use zblk_ublk::DeviceConfig;

    /// A stats reply of a 1 MB device with two queues and a backing file:
    /// queue 0 wrote two text pages, queue 1 a zero page and read the two
    /// back.
    pub fn sample() -> Value {
        let bd = tempfile::NamedTempFile::new().unwrap();
        bd.as_file().set_len(1 << 16).unwrap();
        let path = bd.path().to_str().unwrap().to_string();
        let mut cfg = zblk::StoreConfig::new(1 << 20);
        cfg.backing = Some(path.clone().into());
        let store = zblk::Store::new(cfg).unwrap();
        let mut ctx0 = store.new_ctx();
        let mut ctx1 = store.new_ctx();
        let text: Vec<u8> = b"zblk stat sample "
            .iter()
            .cycle()
            .take(8192)
            .copied()
            .collect();
        ctx0.write(0, &text).unwrap();
        ctx1.write(8192, &[0u8; 4096]).unwrap();
        let mut back = vec![0u8; 8192];
        ctx1.read(0, &mut back).unwrap();
        // Settings left out of the JSON at their defaults are set, so that
        // every field a device can show is in the sample.
        let flags = [
            "--size",
            "1M",
            "--queues",
            "2",
            "--backing-dev",
            &path,
            "--queue-cpus",
            "other",
            "--poll-us",
            "300",
            "--compress-workers",
            "1",
        ];
        let config = DeviceConfig::from_flags(flags).unwrap();
        let mut info = DeviceInfo::new(0, "/dev/ublkb0".into(), &config, 1 << 21);
        info.pid = 1;
        json!({"device": info, "stats": serde_json::to_value(store.stats()).unwrap()})
    }

    #[test]
    fn stat_shows_every_field_latencies_and_queues() {
        let reply = sample();
        let text = stat_text(&reply);
        for (k, v) in reply["stats"].as_object().unwrap() {
            if v.is_number() || v.is_string() {
                assert!(text.contains(&format!("  {k} ")), "missing {k}:\n{text}");
            }
        }
        for k in [
            "stored_pages",
            "deferred_free_pending",
            "same_pages",
            "notify_free",
            "ratio_data",
        ] {
            assert!(text.contains(k), "missing {k}");
        }
        assert!(text.contains("P99_US") && text.contains("  write") && text.contains("  discard"));
        let header: Vec<&str> = text
            .lines()
            .find(|l| l.starts_with("PER-QUEUE"))
            .unwrap()
            .split_whitespace()
            .collect();
        assert_eq!(header, ["PER-QUEUE", "q0", "q1"]);
        let row = |name: &str| -> Vec<String> {
            let l = text
                .lines()
                .rfind(|l| l.split_whitespace().next() == Some(name))
                .unwrap();
            l.split_whitespace().map(String::from).collect()
        };
        // Per queue: queue 0 wrote 2 pages, queue 1 wrote 1 and read 2.
        assert_eq!(row("pages_written"), ["pages_written", "2", "1"]);
        assert_eq!(row("pages_read"), ["pages_read", "0", "2"]);
        assert_eq!(row("num_reads"), ["num_reads", "0", "1"]);
        // Gauges appear once, for the device, not per queue.
        assert_eq!(row("same_pages"), ["same_pages", "1"]);
        assert_eq!(row("stored_pages"), ["stored_pages", "3"]);
    }

    #[test]
    fn stat_shows_the_idle_policy() {
        let mut reply = sample();
        assert!(
            !stat_text(&reply).contains("IDLE POLICY"),
            "no policy: no table"
        );
        reply["policy"] = json!({
            "recompress_idle_after": 600,
            "recompress_algo": "zstd:9",
            "rounds_skipped_busy": 3,
        });
        let text = stat_text(&reply);
        let rows: Vec<Vec<&str>> = text
            .lines()
            .skip_while(|l| !l.starts_with("IDLE POLICY"))
            .skip(1)
            .take(3)
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(
            rows,
            [
                ["recompress_idle_after", "600"],
                ["recompress_algo", "zstd:9"],
                ["rounds_skipped_busy", "3"]
            ]
        );
    }

    #[test]
    fn list_rows_use_zramctl_columns() {
        let e = list_entry(&sample());
        assert_eq!(e["name"], "/dev/ublkb0");
        assert_eq!(e["disksize"], 1 << 20);
        assert_eq!(e["zero_pages"], 1);
        assert_eq!(e["queues"], 2);
        assert_eq!(e["swap"], false);
        assert_eq!(e["mountpoint"], Value::Null);
        let cols = Columns::default();
        let row = cols.row(&e, false);
        assert_eq!(row.len(), cols.headers().len());
        assert_eq!(row[1], "1M");
        assert_eq!(row[10], "-");
        let t = table(&cols.headers(), &[row]);
        assert!(t.starts_with("NAME        DISKSIZE DATA"), "{t}");
        // --bytes: the same row, raw.
        let row = Columns::parse("DISKSIZE,DATA").unwrap().row(&e, true);
        assert_eq!(row, ["1048576", "12288"]);
    }

    #[test]
    fn mountpoint_is_swap_or_the_first_mount() {
        let mounts = ["/mnt/a b".to_string(), "/srv/b".to_string()];
        assert_eq!(mountpoint(true, &[]).as_deref(), Some("[SWAP]"));
        assert_eq!(mountpoint(false, &mounts).as_deref(), Some("/mnt/a b"));
        assert_eq!(mountpoint(false, &[]), None);
        let cols = Columns::parse("NAME,MOUNTPOINT").unwrap();
        let mut e = list_entry(&sample());
        assert_eq!(cols.row(&e, false), ["/dev/ublkb0", ""]);
        e["mountpoint"] = json!("/mnt/a b");
        assert_eq!(cols.row(&e, false), ["/dev/ublkb0", "/mnt/a b"]);
    }

    #[test]
    fn table_pads_columns() {
        let t = table(&["A", "BB"], &[vec!["xxx".into(), "y".into()]]);
        assert_eq!(t, "A   BB\nxxx y");
    }

    #[test]
    fn noheadings_drops_the_header_and_its_width() {
        let rows = [vec!["x".into(), "y".into()], vec!["xyz".into(), "w".into()]];
        assert_eq!(render_table(&["AAAA", "B"], &rows, false), "x   y\nxyz w");
        assert_eq!(render_table(&["AAAA", "B"], &[], false), "");
        assert_eq!(
            render_table(&["AAAA", "B"], &rows, true),
            "AAAA B\nx    y\nxyz  w"
        );
    }
}
