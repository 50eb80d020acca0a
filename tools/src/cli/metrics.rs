//! The Prometheus text exposition of `zblk stat --format prometheus` and
//! `zblk exporter`: the fields of the daemon's `stats` reply (what
//! `stat --json` prints), counters as `zblk_<name>_total`, levels as
//! `zblk_<name>`, latency percentiles as gauges with a `quantile` label,
//! each series labelled `device="ublkbN"` and `id="N"`, per-queue counters
//! as `zblk_queue_<name>_total` with a `queue` label.

use serde_json::Value;

/// What one device gave a scrape.
#[derive(Debug, Clone)]
pub enum Scrape {
    /// Its `stats` reply: `{"device": .., "stats": ..}`.
    Up(Value),
    /// Device `id`, whose daemon did not answer.
    Down(u32),
}

/// A metric family's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Only goes up (and back to 0 when the device restarts its counts).
    Counter,
    /// A level.
    Gauge,
}

/// Which object of the reply a field is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Device,
    Stats,
}

/// One numeric (or boolean) field of the reply and how it is exported.
struct Field {
    part: Part,
    key: &'static str,
    kind: Kind,
    help: &'static str,
}

const fn f(part: Part, key: &'static str, kind: Kind, help: &'static str) -> Field {
    Field {
        part,
        key,
        kind,
        help,
    }
}

use Kind::{Counter as C, Gauge as G};
use Part::{Device as D, Stats as S};

/// Every numeric field, in the order exported. A counter of the stats is
/// also exported per queue; the levels are not (per queue they are net
/// flows between queues, meaningful only summed, as `zblk stat` says).
const FIELDS: &[Field] = &[
    f(D, "queues", G, "Queues serving the device."),
    f(D, "depth", G, "Tags (requests in flight) per queue."),
    f(D, "io_threads", G, "I/O threads serving each queue."),
    f(
        D,
        "poll_us",
        G,
        "Microseconds a queue thread busy-polls after its last request (0: never).",
    ),
    f(
        D,
        "compress_workers",
        G,
        "Compression workers beside the queue threads (0: none).",
    ),
    f(D, "io_buf_bytes", G, "Bytes of each I/O buffer."),
    f(D, "pid", G, "Process id of the device's daemon."),
    f(
        D,
        "no_recovery",
        G,
        "1 if recovery was turned off at creation.",
    ),
    f(
        D,
        "huge_pages",
        G,
        "1 if the store was asked for 2 MB pages at creation.",
    ),
    f(S, "disksize", G, "Device size in bytes."),
    f(S, "group_pages", G, "Pages per compression group."),
    f(
        S,
        "orig_data_size",
        G,
        "Uncompressed bytes stored (4 KB per stored page).",
    ),
    f(S, "compr_data_size", G, "Compressed bytes stored."),
    f(
        S,
        "same_pages",
        G,
        "Same-filled pages stored in their slots.",
    ),
    f(S, "huge_pages", G, "Pages stored raw (incompressible)."),
    f(S, "huge_pages_since", C, "Pages stored raw since creation."),
    f(S, "stored_pages", G, "Slots holding data."),
    f(S, "failed_reads", C, "Failed read requests."),
    f(S, "failed_writes", C, "Failed write requests."),
    f(
        S,
        "invalid_io",
        C,
        "Requests refused for bad ranges or buffers.",
    ),
    f(
        S,
        "notify_free",
        C,
        "Pages freed by discard or write-zeroes.",
    ),
    f(S, "num_reads", C, "Read requests."),
    f(S, "num_writes", C, "Write requests."),
    f(S, "num_discards", C, "Discard and write-zeroes requests."),
    f(S, "pages_read", C, "Pages read."),
    f(S, "pages_written", C, "Pages written."),
    f(S, "groups", C, "Compression groups written."),
    f(
        S,
        "worker_groups",
        C,
        "Compression groups written on a compression worker.",
    ),
    f(
        S,
        "worker_read_groups",
        C,
        "Groups of read pages decoded on a compression worker.",
    ),
    f(S, "sw_pages", C, "Pages compressed in software."),
    f(
        S,
        "accel_pages",
        C,
        "Pages compressed by accelerator work queues.",
    ),
    f(S, "deferred_frees", C, "Handles handed to deferred free."),
    f(
        S,
        "packed_dead_bytes",
        G,
        "Compressed bytes of packed objects held only by dead pages.",
    ),
    f(
        S,
        "packed_pages_rewritten",
        C,
        "Pages moved out of sparse packed groups by the compactor.",
    ),
    f(
        S,
        "accel_page_faults",
        C,
        "Accelerator pages redone in software after a page fault.",
    ),
    f(
        S,
        "accel_timeouts",
        C,
        "Accelerator pages redone in software after a timeout.",
    ),
    f(
        S,
        "accel_verify_failures",
        C,
        "Accelerator pages redone in software because verify failed.",
    ),
    f(
        S,
        "accel_device_errors",
        C,
        "Accelerator pages redone in software after another device error.",
    ),
    f(
        S,
        "accel_submit_failures",
        C,
        "Pages done in software because no work queue took them.",
    ),
    f(
        S,
        "accel_decompressed",
        C,
        "Pages the accelerator decompressed.",
    ),
    f(
        S,
        "mem_used_total",
        G,
        "Bytes the allocator holds (metadata and waste included).",
    ),
    f(S, "mem_used_max", G, "Peak of mem_used_total in bytes."),
    f(S, "mem_limit", G, "Memory limit in bytes (0: none)."),
    f(S, "pages_compacted", C, "Pages given back by compaction."),
    f(
        S,
        "mem_spare",
        G,
        "Bytes of mem_used_total held as empty zspages kept for reuse.",
    ),
    f(S, "mem_huge", G, "Bytes of the store mapped as 2 MB pages."),
    f(
        S,
        "reserve_misses",
        C,
        "Objects whose size class had no room left in the memory reserve.",
    ),
    f(
        S,
        "reserve_fallbacks",
        C,
        "Objects the memory reserve placed in a larger size class.",
    ),
    f(
        S,
        "reserve_refusals",
        C,
        "Objects refused after waiting for the memory reserve (ENOMEM).",
    ),
    f(
        S,
        "deferred_free_pending",
        G,
        "Handles detached but not yet freed.",
    ),
    f(S, "slot_table_bytes", G, "Bytes of slot table."),
    f(
        S,
        "idle_pages",
        G,
        "Stored pages marked idle and not accessed since (zblk idle).",
    ),
    f(
        S,
        "recompressed_pages",
        G,
        "Stored pages held by the secondary algorithm (zblk recompress).",
    ),
    f(
        S,
        "recompress_saved_bytes",
        C,
        "Compressed bytes recompression saved since the daemon started.",
    ),
    f(
        S,
        "bd_count",
        G,
        "Stored pages written back to the backing device (zblk writeback).",
    ),
    f(
        S,
        "bd_bytes",
        G,
        "Compressed bytes of the written-back pages on the backing device.",
    ),
    f(S, "bd_reads", C, "Pages read from the backing device."),
    f(S, "bd_writes", C, "Pages written to the backing device."),
    f(S, "bd_size", G, "Bytes of backing device (0: none)."),
    f(
        S,
        "bd_used_bytes",
        G,
        "Bytes of backing device blocks holding written-back pages.",
    ),
    f(
        S,
        "bd_direct",
        G,
        "1 if the backing device is opened O_DIRECT (0: buffered).",
    ),
    f(
        S,
        "writeback_limit_enable",
        G,
        "1 if a writeback limit is in force (zblk set --writeback-limit).",
    ),
    f(
        S,
        "writeback_limit",
        G,
        "Pages writeback may still write while the limit is in force.",
    ),
    f(
        S,
        "shared",
        G,
        "1 if the store lives in shared memory (recoverable).",
    ),
    f(
        S,
        "recoveries",
        C,
        "Times the store was taken over from a dead daemon.",
    ),
    f(
        S,
        "recovered_at",
        G,
        "When the last recovery was, seconds since the epoch (0: never).",
    ),
    f(
        S,
        "recovery_dropped",
        G,
        "Slots the last recovery emptied because they could not be trusted.",
    ),
];

/// Fields of the reply that are labels of `zblk_device_info`.
const INFO_LABELS: [(Part, &str); 9] = [
    (D, "path"),
    (D, "backing_dev"),
    (S, "algorithm"),
    (S, "recompress_algorithm"),
    (S, "mode"),
    (D, "recovery"),
    (D, "features"),
    (D, "transport_in_use"),
    (D, "queue_cpus"),
];

/// Fields left out: the same value as an exported one (`size` is
/// `disksize`, the device's `mem_limit` the store's), the `device` and
/// `id` labels (`name` is `device`), the stats' `backing_dev` (the
/// device's is a label), the transport asked for (the one in
/// use is a label),
/// the engine settings the stats repeat, and the latency and queue
/// objects, exported in their own families. (Only the test that checks
/// every field is accounted for reads it.)
#[cfg(test)]
const NOT_SERIES: [(Part, &str); 13] = [
    (D, "transport"),
    (S, "backing_dev"),
    (D, "name"),
    (D, "size"),
    (D, "mem_limit"),
    (D, "id"),
    (D, "algorithm"),
    (D, "mode"),
    (D, "group_pages"),
    (S, "latency"),
    (S, "phases"),
    (S, "queues"),
    (D, "phase_timers"),
];

/// The operations whose latency the engine records.
const OPS: [&str; 4] = ["write", "read", "discard", "writeback"];

/// The percentiles of the reply, and their `quantile` label.
const QUANTILES: [(&str, &str); 3] = [("p50_us", "0.5"), ("p95_us", "0.95"), ("p99_us", "0.99")];

/// One family: its samples, already formatted, in scrape order.
struct Family {
    name: String,
    kind: Kind,
    help: &'static str,
    samples: Vec<String>,
}

/// The families of one exposition, in the order first met (the format
/// wants each family's samples together, so devices go inside families).
#[derive(Default)]
struct Exposition {
    families: Vec<Family>,
}

impl Exposition {
    /// Adds one sample of family `name`.
    fn add(
        &mut self,
        name: &str,
        kind: Kind,
        help: &'static str,
        labels: &[(&str, &str)],
        v: &str,
    ) {
        let i = match self.families.iter().position(|f| f.name == name) {
            Some(i) => i,
            None => {
                self.families.push(Family {
                    name: name.to_string(),
                    kind,
                    help,
                    samples: Vec::new(),
                });
                self.families.len() - 1
            }
        };
        let labels: Vec<String> = labels
            .iter()
            .map(|(k, v)| format!("{k}=\"{}\"", escape_label(v)))
            .collect();
        self.families[i]
            .samples
            .push(format!("{name}{{{}}} {v}", labels.join(",")));
    }

    fn render(&self) -> String {
        let mut out = String::new();
        for f in &self.families {
            let kind = match f.kind {
                Kind::Counter => "counter",
                Kind::Gauge => "gauge",
            };
            out.push_str(&format!(
                "# HELP {} {}\n# TYPE {} {kind}\n",
                f.name, f.help, f.name
            ));
            for s in &f.samples {
                out.push_str(s);
                out.push('\n');
            }
        }
        out
    }
}

/// A label value as the format quotes it.
pub(crate) fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The exposition of every scraped device.
pub fn render(scrapes: &[Scrape]) -> String {
    let mut x = Exposition::default();
    for s in scrapes {
        match s {
            Scrape::Up(reply) => device(&mut x, reply),
            Scrape::Down(id) => {
                let (name, id) = (format!("ublkb{id}"), id.to_string());
                x.add(
                    "zblk_up",
                    G,
                    UP_HELP,
                    &[("device", &name), ("id", &id)],
                    "0",
                );
            }
        }
    }
    x.render()
}

const UP_HELP: &str = "1 if the device's daemon answered, 0 if not.";

/// The samples of one answering device.
fn device(x: &mut Exposition, reply: &Value) {
    let part = |p: Part| match p {
        Part::Device => &reply["device"],
        Part::Stats => &reply["stats"],
    };
    let id = part(D)["id"].as_u64().unwrap_or(0).to_string();
    let name = format!("ublkb{id}");
    let base = [("device", name.as_str()), ("id", id.as_str())];
    x.add("zblk_up", G, UP_HELP, &base, "1");
    info(x, &base, |p, k| text(&part(p)[k]));
    for fld in FIELDS {
        if let Some(v) = number(&part(fld.part)[fld.key]) {
            x.add(&series_name("zblk_", fld), fld.kind, fld.help, &base, &v);
        }
    }
    latency(x, &base, &part(S)["latency"]);
    phases(x, &base, &part(S)["phases"]);
    queues(x, &base, part(D), &part(S)["queues"]);
}

/// Queue and I/O thread of entry `i` of the stats' per-queue list (one
/// entry per I/O thread, `zblk_ublk::io_threads::slot`) of the device
/// `device` describes; no thread when it has one a queue.
pub fn queue_thread(device: &Value, i: usize) -> (usize, Option<usize>) {
    let n = device["io_threads"]
        .as_u64()
        .and_then(|n| u16::try_from(n).ok())
        .unwrap_or(1);
    let (q, t) = zblk_ublk::io_threads::of_slot(i, n);
    (q, (n > 1).then_some(t))
}

/// The phase timers of a device made with `--phase-timers` (none
/// otherwise): whole requests as `zblk_request_seconds_total{op}`, their
/// parts as `zblk_phase_seconds_total{phase}` (two families, so that
/// neither sum counts a part twice).
fn phases(x: &mut Exposition, base: &[(&str, &str)], phases: &Value) {
    let Some(p) = phases.as_object() else { return };
    for (key, v) in p {
        let (Some(name), Some(ns)) = (key.strip_suffix("_ns"), v.as_u64()) else {
            continue;
        };
        let mut labels = base.to_vec();
        let secs = (ns as f64 / 1e9).to_string();
        if REQUEST_PHASES.contains(&name) {
            labels.push(("op", name));
            let help = "Time spent in whole requests of an operation (--phase-timers), in seconds.";
            x.add("zblk_request_seconds_total", C, help, &labels, &secs);
        } else {
            labels.push(("phase", name));
            let help = "Time requests spent in one of their phases (--phase-timers), in seconds.";
            x.add("zblk_phase_seconds_total", C, help, &labels, &secs);
        }
    }
}

/// The phase timers that time whole requests, not parts of them.
const REQUEST_PHASES: [&str; 3] = ["write", "read", "discard"];

/// `zblk_device_info`: the device's text fields as labels, value 1.
fn info(x: &mut Exposition, base: &[(&str, &str)], get: impl Fn(Part, &str) -> String) {
    let values: Vec<(&str, String)> = INFO_LABELS.iter().map(|(p, k)| (*k, get(*p, k))).collect();
    let mut labels: Vec<(&str, &str)> = base.to_vec();
    labels.extend(values.iter().map(|(k, v)| (*k, v.as_str())));
    let help = "The device's settings as labels (features comma-separated).";
    x.add("zblk_device_info", G, help, &labels, "1");
}

/// `zblk_latency_seconds{op,quantile}` and `zblk_latency_samples_total{op}`.
fn latency(x: &mut Exposition, base: &[(&str, &str)], lat: &Value) {
    for op in OPS {
        let l = &lat[op];
        for (key, q) in QUANTILES {
            let Some(us) = l[key].as_f64() else { continue };
            let mut labels = base.to_vec();
            labels.extend([("op", op), ("quantile", q)]);
            let help = "Per-page latency percentile of an operation, in seconds.";
            x.add(
                "zblk_latency_seconds",
                G,
                help,
                &labels,
                &(us / 1e6).to_string(),
            );
        }
        if let Some(n) = number(&l["count"]) {
            let mut labels = base.to_vec();
            labels.push(("op", op));
            let help = "Pages whose latency was recorded, per operation.";
            x.add("zblk_latency_samples_total", C, help, &labels, &n);
        }
    }
}

/// `zblk_queue_<counter>_total{queue}`: each counter, per queue (and
/// `thread`, per I/O thread of a device with several a queue).
fn queues(x: &mut Exposition, base: &[(&str, &str)], device: &Value, queues: &Value) {
    let Some(qs) = queues.as_array() else { return };
    for fld in FIELDS.iter().filter(|f| f.part == S && f.kind == C) {
        for (i, q) in qs.iter().enumerate() {
            let Some(v) = number(&q[fld.key]) else {
                continue;
            };
            let (queue, thread) = queue_thread(device, i);
            let (queue, thread) = (queue.to_string(), thread.map(|t| t.to_string()));
            let mut labels = base.to_vec();
            labels.push(("queue", &queue));
            if let Some(t) = &thread {
                labels.push(("thread", t));
            }
            x.add(&series_name("zblk_queue_", fld), C, fld.help, &labels, &v);
        }
    }
}

/// `prefix<key>`, with `_total` for a counter; a gauge never ends in
/// `_total`, which Prometheus keeps for counters (`mem_used_total` is
/// exported as `zblk_mem_used`).
fn series_name(prefix: &str, fld: &Field) -> String {
    match fld.kind {
        Kind::Counter => format!("{prefix}{}_total", fld.key),
        Kind::Gauge => format!("{prefix}{}", fld.key.trim_end_matches("_total")),
    }
}

/// A number as the format writes it (booleans as 0 and 1); none for
/// anything else, so a field an older daemon lacks is left out.
fn number(v: &Value) -> Option<String> {
    match v {
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(u8::from(*b).to_string()),
        _ => None,
    }
}

/// A text field as a label value (a list comma-joined; "" if absent).
fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(a) => {
            let items: Vec<String> = a.iter().map(text).collect();
            items.join(",")
        }
        Value::Number(n) => n.to_string(),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::super::show::tests::sample;
    use super::*;
    use prometheus_parse::{Scrape as Parsed, Value as PValue};

    fn parse(text: &str) -> Parsed {
        let lines = text.lines().map(|l| Ok(l.to_string()));
        Parsed::parse(lines).expect("the exposition parses")
    }

    /// The value of the one sample of `name` whose labels include `want`.
    fn value(p: &Parsed, name: &str, want: &[(&str, &str)]) -> f64 {
        let hits: Vec<_> = p
            .samples
            .iter()
            .filter(|s| s.metric == name)
            .filter(|s| want.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
            .collect();
        assert_eq!(hits.len(), 1, "{name} {want:?}: {} samples", hits.len());
        match hits[0].value {
            PValue::Counter(v) | PValue::Gauge(v) | PValue::Untyped(v) => v,
            ref v => panic!("{name}: {v:?}"),
        }
    }

    #[test]
    fn every_line_parses_and_values_match_the_reply() {
        let reply = sample();
        let text = render(&[Scrape::Up(reply.clone()), Scrape::Down(3)]);
        let p = parse(&text);
        let dev = [("device", "ublkb0"), ("id", "0")];
        assert_eq!(value(&p, "zblk_up", &dev), 1.0);
        assert_eq!(
            value(&p, "zblk_up", &[("id", "3"), ("device", "ublkb3")]),
            0.0
        );
        assert_eq!(value(&p, "zblk_disksize", &dev), (1 << 20) as f64);
        assert_eq!(value(&p, "zblk_stored_pages", &dev), 3.0);
        assert_eq!(value(&p, "zblk_same_pages", &dev), 1.0);
        assert_eq!(value(&p, "zblk_pages_written_total", &dev), 3.0);
        assert_eq!(value(&p, "zblk_queues", &dev), 2.0);
        let mem = reply["stats"]["mem_used_total"].as_f64().unwrap();
        assert!(mem > 0.0);
        assert_eq!(value(&p, "zblk_mem_used", &dev), mem);
        // Per queue: queue 0 wrote 2 pages, queue 1 wrote 1 and read 2.
        let q = |i: &'static str| [("device", "ublkb0"), ("queue", i)];
        assert_eq!(value(&p, "zblk_queue_pages_written_total", &q("0")), 2.0);
        assert_eq!(value(&p, "zblk_queue_pages_written_total", &q("1")), 1.0);
        assert_eq!(value(&p, "zblk_queue_pages_read_total", &q("1")), 2.0);
        assert_eq!(value(&p, "zblk_queue_num_reads_total", &q("0")), 0.0);
        // Levels are not per queue.
        assert!(!text.contains("zblk_queue_stored_pages"));
        let w = [("op", "write"), ("quantile", "0.99")];
        let p99 = reply["stats"]["latency"]["write"]["p99_us"]
            .as_f64()
            .unwrap();
        assert!(p99 > 0.0);
        assert_eq!(value(&p, "zblk_latency_seconds", &w), p99 / 1e6);
        let reads = [("op", "read")];
        assert_eq!(value(&p, "zblk_latency_samples_total", &reads), 2.0);
        let info = [
            ("algorithm", "lz4"),
            ("path", "/dev/ublkb0"),
            ("mode", "per-page"),
        ];
        assert_eq!(value(&p, "zblk_device_info", &info), 1.0);
    }

    #[test]
    fn every_family_has_help_and_type_once_before_its_samples() {
        let text = render(&[Scrape::Up(sample()), Scrape::Up(other_device())]);
        let mut seen = std::collections::HashSet::new();
        let mut current = String::new();
        for l in text.lines() {
            if let Some(rest) = l.strip_prefix("# HELP ") {
                current = rest.split(' ').next().unwrap().to_string();
                assert!(seen.insert(current.clone()), "{current} twice");
            } else if let Some(rest) = l.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                assert_eq!(name, current);
                assert_eq!(kind == "counter", name.ends_with("_total"), "{l}");
            } else {
                let name = l.split(['{', ' ']).next().unwrap();
                assert_eq!(name, current, "{l} outside its family");
            }
        }
        // Both devices are in, as one family each.
        let p = parse(&text);
        assert_eq!(value(&p, "zblk_up", &[("id", "5")]), 1.0);
        assert_eq!(
            value(&p, "zblk_pages_written_total", &[("device", "ublkb5")]),
            3.0
        );
    }

    /// The sample, renamed device 5.
    fn other_device() -> Value {
        let mut r = sample();
        r["device"]["id"] = 5.into();
        r
    }

    #[test]
    fn every_field_of_the_reply_is_exported_or_said_why_not() {
        let reply = sample();
        for (part, p) in [(D, "device"), (S, "stats")] {
            for key in reply[p].as_object().unwrap().keys() {
                let k = key.as_str();
                let known = FIELDS.iter().any(|f| f.part == part && f.key == k)
                    || INFO_LABELS.contains(&(part, k))
                    || NOT_SERIES.contains(&(part, k));
                assert!(known, "{p}.{k} is neither a series, a label nor left out");
            }
        }
        for key in reply["stats"]["queues"][0].as_object().unwrap().keys() {
            assert!(
                FIELDS.iter().any(|f| f.part == S && f.key == key),
                "queue {key}"
            );
        }
    }

    #[test]
    fn phase_timers_become_request_and_phase_families() {
        let mut r = sample();
        r["stats"]["phases"] =
            serde_json::json!({ "write_ns": 1_500_000_000u64, "compress_ns": 250_000_000u64 });
        let p = parse(&render(&[Scrape::Up(r)]));
        let op = [("op", "write")];
        assert_eq!(value(&p, "zblk_request_seconds_total", &op), 1.5);
        let phase = [("phase", "compress")];
        assert_eq!(value(&p, "zblk_phase_seconds_total", &phase), 0.25);
        let write_as_phase = p.samples.iter().any(|s| {
            s.metric == "zblk_phase_seconds_total" && s.labels.get("phase") == Some("write")
        });
        assert!(!write_as_phase, "a whole request is not a phase");
    }

    #[test]
    fn label_values_are_escaped() {
        let mut r = sample();
        r["device"]["path"] = "/dev/a\"b\\c\nd".into();
        let text = render(&[Scrape::Up(r)]);
        assert!(text.contains(r#"path="/dev/a\"b\\c\nd""#), "{text}");
        parse(&text);
    }
}
