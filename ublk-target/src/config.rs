//! One device's configuration, from the command line to the engine.
//!
//! [`DeviceConfig`] is what `zblk add` parses its flags into (it is a clap
//! argument group), what the hidden `zblk daemon` receives (as one JSON
//! argument, [`DeviceConfig::to_json`]), what builds the engine
//! ([`DeviceConfig::store_config`]) and what `zblk add --json`, `list` and
//! `stat` report (flattened into [`crate::DeviceInfo`], every automatic
//! choice resolved).

use crate::algo_params::{parse_algo_params, AlgoParams};
use crate::params;
use crate::placement::QueueCpus;
use crate::size::{parse_disk_size, parse_size};
use crate::transport::TransportChoice;
use clap::{Args, FromArgMatches};
use serde::{Deserialize, Serialize};
use zblk::{Algo, AlgoList, Mode, StoreConfig};

/// How pages are compressed and grouped: part of a device's configuration,
/// and on its own the engine flags of `zblk bench`.
#[derive(Debug, Clone, PartialEq, Eq, Args, Serialize, Deserialize)]
pub struct EngineConfig {
    /// Compression: lz4, lz4hc[:LEVEL], zstd[:LEVEL], deflate[:LEVEL], deflate-iaa or none (pages stored raw).
    #[arg(short, long, default_value = "lz4", value_parser = parse_algo)]
    #[serde(rename = "algorithm", with = "text")]
    pub algo: Algo,
    /// Pages per compression group (1 disables grouping).
    #[arg(short, long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub group_pages: u16,
    /// How a group is stored: per-page (one object per page) or packed.
    #[arg(short, long, default_value = "per-page", value_parser = parse_mode)]
    #[serde(with = "text")]
    pub mode: Mode,
    /// Compression workers: threads that compress a write's groups (and
    /// decode a read's) beside the queue thread serving it, whenever one is
    /// idle, so that one request uses several CPUs (0: none).
    #[arg(long, value_name = "N", default_value_t = 0,
          value_parser = clap::value_parser!(u16).range(0..=MAX_COMPRESS_WORKERS))]
    #[serde(default, skip_serializing_if = "is_zero")]
    pub compress_workers: u16,
}

/// The most `--compress-workers` takes (the engine's limit).
const MAX_COMPRESS_WORKERS: i64 = zblk::MAX_COMPRESS_WORKERS as i64;

/// Everything a device is made with: the one configuration type from the
/// command line to the daemon.
///
/// A new setting goes in two places:
/// 1. a field here (or in [`EngineConfig`]), whose `#[arg]` attribute is its
///    `zblk add` flag and whose serde name is its key in the daemon's
///    `--config-json` and in the JSON of `add --json`, `list` and `stat`;
/// 2. the code it configures: [`DeviceConfig::store_config`] for an engine
///    setting, the daemon step that uses it otherwise.
///
/// `None` in an optional field means "choose automatically"; the daemon
/// resolves it ([`DeviceConfig::resolved`]) before reporting the device.
#[derive(Debug, Clone, PartialEq, Eq, Args, Serialize, Deserialize)]
pub struct DeviceConfig {
    /// Device size, a multiple of 4 KB (suffixes K, M, G, T).
    #[arg(short, long, value_parser = parse_disk_size)]
    pub size: u64,
    /// Compression and grouping.
    #[command(flatten)]
    #[serde(flatten)]
    pub engine: EngineConfig,
    /// Memory limit for stored data (0: none; suffixes K, M, G, T).
    #[arg(long, default_value = "0", value_parser = parse_size)]
    #[serde(default)]
    pub mem_limit: u64,
    /// Number of queues, each served by --io-threads threads [default:
    /// one per CPU].
    #[arg(short, long, value_parser = clap::value_parser!(u16).range(1..=4096))]
    #[serde(default)]
    pub queues: Option<u16>,
    /// Where each queue's thread runs: queue (on its queue's CPUs, where
    /// the request was submitted), other (on the other CPUs: compression
    /// beside the workload) or any.
    #[arg(long, value_enum, default_value_t = QueueCpus::Queue)]
    #[serde(default)]
    pub queue_cpus: QueueCpus,
    /// I/O threads per queue, each serving its share of the queue's tags,
    /// so that one queue's requests are compressed on several CPUs at
    /// once (with --queue-cpus other or any); more than 1 needs the
    /// driver's UBLK_F_PER_IO_DAEMON (Linux 6.16+), at most --depth.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..=4096))]
    #[serde(default = "one")]
    pub io_threads: u16,
    /// Busy-poll: a queue thread keeps polling its ring for this many µs
    /// after the last request it served before it sleeps, so that the next
    /// request needs no wake-up (0: never). It spends the CPU the thread
    /// runs on: use it with --queue-cpus other, where that CPU is not the
    /// one whose task waits for the request.
    #[arg(long, value_name = "US", default_value_t = 0,
          value_parser = clap::value_parser!(u32).range(0..=MAX_POLL_US))]
    #[serde(default, skip_serializing_if = "is_zero")]
    pub poll_us: u32,
    /// Queue depth (requests in flight per queue).
    #[arg(short, long, default_value_t = 128, value_parser = clap::value_parser!(u16).range(1..=4096))]
    pub depth: u16,
    /// Device id N of /dev/ublkbN [default: the first free one].
    #[arg(short = 'n', long, value_parser = clap::value_parser!(u32).range(0..=1_048_575))]
    #[serde(default)]
    pub id: Option<u32>,
    /// Largest request, in bytes (every tag mlocks a buffer this big)
    /// [default: 2M when queues x depth x 2M stays under 1/32 of RAM].
    #[arg(long = "io-buf", value_name = "IO_BUF", value_parser = parse_io_buf)]
    #[serde(default, rename = "io_buf_bytes")]
    pub io_buf: Option<u32>,
    /// Let the device die with its daemon: no shared-memory store, no
    /// keeper, no USER_RECOVERY (by default a new daemon takes over).
    #[arg(long)]
    #[serde(default)]
    pub no_recovery: bool,
    /// Give the store's larger size classes 2 MB pages: its file on a
    /// tmpfs of its own mounted huge=always (4 KB pages where the kernel
    /// has no 2 MB page, or no transparent huge pages).
    #[arg(long)]
    #[serde(default)]
    pub huge_pages: bool,
    /// How requests reach the queues: classic (one command per request),
    /// batch (UBLK_F_BATCH_IO, Linux 7.x), or auto (batch where the
    /// driver has it).
    #[arg(long, value_enum, default_value_t = TransportChoice::Classic)]
    #[serde(default)]
    pub transport: TransportChoice,
    /// A block device or regular file that `zblk writeback` moves pages
    /// to (zram's backing_dev), opened O_DIRECT; none: no writeback.
    #[arg(long, value_name = "PATH")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backing_dev: Option<std::path::PathBuf>,
    /// The idle policy: recompress, on its own, pages not accessed for
    /// this many seconds (0: off; see `crate::policy`).
    #[arg(
        long,
        value_name = "SECS",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    #[serde(default, skip_serializing_if = "is_zero")]
    pub recompress_idle_after: u64,
    /// The idle policy: write back, on its own, pages not accessed for
    /// this many seconds (0: off; needs --backing-dev).
    #[arg(
        long,
        value_name = "SECS",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    #[serde(default, skip_serializing_if = "is_zero")]
    pub writeback_idle_after: u64,
    /// The secondary algorithms, 1 to 3 in priority order separated by
    /// spaces ("lz4hc zstd:3 zstd:19"), that recompression (the idle
    /// policy's and `zblk recompress`'s) tries in turn, keeping the first
    /// result 5 % smaller [default: those the store's recompressions
    /// recorded].
    #[arg(
        long = "recompress-algos",
        alias = "recompress-algo",
        value_name = "ALGOS",
        value_parser = parse_algo_list
    )]
    #[serde(default, skip_serializing_if = "Option::is_none", with = "opt_text")]
    pub recompress_algo: Option<AlgoList>,
    /// An algorithm's parameters, as zram's algorithm_params: "dict=PATH"
    /// primes the primary algorithm (lz4, lz4hc or zstd) with a dictionary
    /// of at most 64 KB; "priority=N dict=PATH" (N of --recompress-algos)
    /// or "algo=NAME [level=L] dict=PATH" another algorithm. Repeatable,
    /// or several separated by ";". The store keeps the bytes: a restart
    /// or a take-over needs no file.
    #[arg(
        long = "algo-params",
        value_name = "PARAMS",
        value_parser = parse_algo_params,
        value_delimiter = ';'
    )]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub algo_params: Vec<AlgoParams>,
    /// Time the phases of every request (codec, allocation, copies, slot
    /// installs) and show them in `zblk stat --json` under "phases": the
    /// per-page breakdown, for measuring. Costs a few clock reads a request.
    #[arg(long)]
    #[serde(default, skip_serializing_if = "is_false")]
    pub phase_timers: bool,
}

/// The default of a count that is one unless set (a configuration
/// written before the setting existed).
fn one() -> u16 {
    1
}

/// Whether a flag is off (left out of the JSON).
fn is_false(v: &bool) -> bool {
    !*v
}

/// Whether a numeric setting is at its "off" value, zero (left out of the
/// JSON).
fn is_zero<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

/// The longest busy-poll window `--poll-us` takes: 10 ms.
pub const MAX_POLL_US: i64 = 10_000;

impl DeviceConfig {
    /// Parses `zblk add`'s device flags alone (`["--size", "1G", "-q", "2"]`):
    /// what is not given takes the flag's default, so that code building a
    /// configuration (tests, tools) needs no list of defaults of its own.
    pub fn from_flags<I, T>(flags: I) -> Result<DeviceConfig, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let cmd = DeviceConfig::augment_args(clap::Command::new("zblk"));
        let words = std::iter::once(std::ffi::OsString::from("zblk"))
            .chain(flags.into_iter().map(Into::into));
        DeviceConfig::from_arg_matches(&cmd.try_get_matches_from(words)?)
    }

    /// The engine configuration of this device.
    pub fn store_config(&self) -> StoreConfig {
        StoreConfig {
            algo: self.engine.algo,
            group_pages: usize::from(self.engine.group_pages),
            mode: self.engine.mode,
            mem_limit: self.mem_limit,
            // The device may become swap at any time: zspages the slab
            // reuses after giving them back are locked again.
            mlock: true,
            // Queue threads never fault in zspages: they may be what the
            // kernel's reclaim waits on (see zblk's `slab::reserve`).
            reserve: true,
            // In one memfd that outlives the daemon, so that the next one
            // takes the store over (see `crate::keeper`).
            shared: !self.no_recovery,
            huge_pages: self.huge_pages,
            backing: self.backing_dev.clone(),
            phase_timers: self.phase_timers,
            compress_workers: usize::from(self.engine.compress_workers),
            ..StoreConfig::new(self.size)
        }
    }

    /// The dictionaries `--algo-params` names, read from their files (a
    /// new store's: a recovered one decodes with those it recorded).
    pub fn dictionaries(&self) -> Result<zblk::Dictionaries, String> {
        crate::algo_params::dictionaries(
            &self.algo_params,
            self.engine.algo,
            self.recompress_algo.as_ref(),
        )
    }

    /// The id to ask the driver for: the chosen one, or -1 for any.
    pub fn ublk_id(&self) -> i32 {
        self.id.and_then(|i| i32::try_from(i).ok()).unwrap_or(-1)
    }

    /// Number of queues: the chosen number, or one per CPU.
    pub fn queue_count(&self) -> u16 {
        self.queues.unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(1, |n| n.get().min(4096) as u16)
        })
    }

    /// Per-tag I/O buffer bytes: the chosen size, or
    /// [`params::auto_io_buf_bytes`] for this machine.
    pub fn io_buf_bytes(&self) -> u32 {
        self.io_buf.unwrap_or_else(|| {
            params::auto_io_buf_bytes(
                self.queue_count().into(),
                self.depth.into(),
                params::mem_total().unwrap_or(0),
            )
        })
    }

    /// This configuration as device `id` runs it: every automatic choice
    /// made, with the I/O buffer size the driver settled on.
    pub fn resolved(&self, id: u32, io_buf_bytes: u32) -> DeviceConfig {
        DeviceConfig {
            id: Some(id),
            queues: Some(self.queue_count()),
            io_buf: Some(io_buf_bytes),
            ..self.clone()
        }
    }

    /// The JSON form (the hidden `zblk daemon --config-json` argument).
    pub fn to_json(&self) -> String {
        // Plain data (numbers, strings, options): serialising cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Reads the JSON form.
    pub fn from_json(s: &str) -> Result<DeviceConfig, String> {
        serde_json::from_str(s).map_err(|e| format!("bad device configuration: {e}"))
    }
}

fn parse_algo(s: &str) -> Result<Algo, String> {
    s.parse()
}

fn parse_algo_list(s: &str) -> Result<AlgoList, String> {
    s.parse()
}

fn parse_mode(s: &str) -> Result<Mode, String> {
    s.parse()
}

/// Parses `--io-buf`: a multiple of 4 KB from 4K to
/// [`params::MAX_IO_BUF_BYTES`].
fn parse_io_buf(s: &str) -> Result<u32, String> {
    let n = parse_size(s)?;
    if !(4096..=u64::from(params::MAX_IO_BUF_BYTES)).contains(&n) || n % 4096 != 0 {
        return Err(format!(
            "I/O buffer {s} must be a multiple of 4 KB between 4K and 32M"
        ));
    }
    u32::try_from(n).map_err(|e| e.to_string())
}

/// Serde through `Display` and `FromStr`: the engine's [`Algo`] and
/// [`Mode`] as their command-line names (`zstd:3`, `per-page`).
mod text {
    use serde::{de, Deserialize, Deserializer, Serializer};
    use std::fmt::Display;
    use std::str::FromStr;

    /// Writes `v` as its `Display` text.
    pub fn serialize<T: Display, S: Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(v)
    }

    /// Reads a value from its `FromStr` text.
    pub fn deserialize<'de, T, D>(d: D) -> Result<T, D::Error>
    where
        T: FromStr,
        T::Err: Display,
        D: Deserializer<'de>,
    {
        String::deserialize(d)?.parse().map_err(de::Error::custom)
    }
}

/// [`text`] for an optional value: absent or `null` is `None`.
mod opt_text {
    use serde::{de, Deserialize, Deserializer, Serializer};
    use std::fmt::Display;
    use std::str::FromStr;

    /// Writes `v` as its `Display` text (`None` is left out by the field).
    pub fn serialize<T: Display, S: Serializer>(v: &Option<T>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(v) => s.collect_str(v),
            None => s.serialize_none(),
        }
    }

    /// Reads an optional value from its `FromStr` text.
    pub fn deserialize<'de, T, D>(d: D) -> Result<Option<T>, D::Error>
    where
        T: FromStr,
        T::Err: Display,
        D: Deserializer<'de>,
    {
        Option::<String>::deserialize(d)?
            .map(|t| t.parse().map_err(de::Error::custom))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> DeviceConfig {
        DeviceConfig::from_flags(args).unwrap()
    }

    #[test]
    fn json_round_trips_with_the_reported_names() {
        let c = parse(&["-s", "2G", "-a", "zstd:5", "-m", "packed", "-n", "9"]);
        let v: serde_json::Value = serde_json::from_str(&c.to_json()).unwrap();
        assert_eq!(v["algorithm"], "zstd:5");
        assert_eq!(v["mode"], "packed");
        assert_eq!(v["group_pages"], 8);
        assert_eq!(v["id"], 9);
        assert!(v["io_buf_bytes"].is_null() && v["queues"].is_null());
        assert_eq!(DeviceConfig::from_json(&c.to_json()).unwrap(), c);
        let e = DeviceConfig::from_json(
            r#"{"size":4096,"algorithm":"lzo","group_pages":1,"mode":"per-page","depth":1}"#,
        )
        .unwrap_err();
        assert!(e.contains("unknown algorithm 'lzo'"), "{e}");
    }

    #[test]
    fn the_engine_gets_the_device_settings() {
        let c = parse(&[
            "-s",
            "1G",
            "-a",
            "deflate:6",
            "-g",
            "4",
            "--mem-limit",
            "64M",
        ]);
        let s = c.store_config();
        assert_eq!(s.size, 1 << 30);
        assert_eq!(s.algo, Algo::Deflate(6));
        assert_eq!(s.group_pages, 4);
        assert_eq!(s.mode, Mode::PerPage);
        assert_eq!(s.mem_limit, 64 << 20);
        assert!(s.mlock);
        assert!(s.shared, "recoverable by default");
        assert!(!parse(&["-s", "1G", "--no-recovery"]).store_config().shared);
    }

    #[test]
    fn the_idle_policy_is_off_by_default_and_round_trips() {
        let c = parse(&["-s", "1G"]);
        assert_eq!((c.recompress_idle_after, c.writeback_idle_after), (0, 0));
        assert_eq!(c.recompress_algo, None);
        let v: serde_json::Value = serde_json::from_str(&c.to_json()).unwrap();
        assert!(v.get("recompress_idle_after").is_none(), "off: left out");
        let c = parse(&[
            "-s",
            "1G",
            "--recompress-idle-after",
            "600",
            "--writeback-idle-after",
            "3600",
            "--recompress-algo",
            "zstd:9",
        ]);
        let v: serde_json::Value = serde_json::from_str(&c.to_json()).unwrap();
        assert_eq!(v["recompress_idle_after"], 600);
        assert_eq!(v["writeback_idle_after"], 3600);
        assert_eq!(v["recompress_algo"], "zstd:9");
        assert_eq!(DeviceConfig::from_json(&c.to_json()).unwrap(), c);
        assert!(DeviceConfig::from_flags(["-s", "1G", "--recompress-algo", "lzo"]).is_err());
        let c = parse(&["-s", "1G", "--recompress-algos", "lz4hc zstd:3 zstd:19"]);
        let list = c.recompress_algo.expect("a list");
        assert_eq!(list.to_string(), "lz4hc zstd:3 zstd:19");
        assert_eq!(DeviceConfig::from_json(&c.to_json()).unwrap(), c);
        for bad in ["zstd zstd", "lz4hc zstd:3 zstd:19 deflate", ""] {
            assert!(
                DeviceConfig::from_flags(["-s", "1G", "--recompress-algos", bad]).is_err(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn automatic_choices_are_resolved() {
        let c = parse(&["-s", "1G", "-d", "16"]);
        assert_eq!((c.id, c.queues, c.io_buf), (None, None, None));
        assert_eq!(c.ublk_id(), -1);
        assert!(c.queue_count() >= 1);
        assert!(c.io_buf_bytes() >= params::MIN_AUTO_IO_BUF_BYTES);
        let r = c.resolved(3, 1 << 20);
        assert_eq!(r.id, Some(3));
        assert_eq!(r.queues, Some(c.queue_count()));
        assert_eq!(r.io_buf, Some(1 << 20));
        assert_eq!((r.size, r.depth, &r.engine), (c.size, c.depth, &c.engine));
        let c = parse(&["-s", "1G", "-q", "3", "--io-buf", "256K", "-n", "7"]);
        assert_eq!(
            (c.ublk_id(), c.queue_count(), c.io_buf_bytes()),
            (7, 3, 256 << 10)
        );
    }

    #[test]
    fn poll_us_defaults_to_off_is_bounded_and_round_trips() {
        let c = parse(&["-s", "1G"]);
        assert_eq!(c.poll_us, 0);
        assert!(!c.to_json().contains("poll_us"), "off is left out");
        let c = parse(&["-s", "1G", "--poll-us", "300", "--queue-cpus", "other"]);
        assert_eq!(c.poll_us, 300);
        assert_eq!(DeviceConfig::from_json(&c.to_json()).unwrap(), c);
        assert!(DeviceConfig::from_flags(["-s", "1G", "--poll-us", "10001"]).is_err());
        assert!(DeviceConfig::from_flags(["-s", "1G", "--poll-us", "-1"]).is_err());
    }

    #[test]
    fn io_threads_default_to_one_and_round_trip() {
        let c = parse(&["-s", "1G"]);
        assert_eq!(c.io_threads, 1);
        let c = parse(&["-s", "1G", "--io-threads", "2", "--queue-cpus", "any"]);
        assert_eq!(c.io_threads, 2);
        let v: serde_json::Value = serde_json::from_str(&c.to_json()).unwrap();
        assert_eq!(v["io_threads"], 2);
        assert_eq!(DeviceConfig::from_json(&c.to_json()).unwrap(), c);
        // A configuration written before the setting: one thread a queue.
        let old = DeviceConfig::from_json(
            r#"{"size":4096,"algorithm":"lz4","group_pages":1,"mode":"per-page","depth":1}"#,
        )
        .unwrap();
        assert_eq!(old.io_threads, 1);
        assert!(DeviceConfig::from_flags(["-s", "1G", "--io-threads", "0"]).is_err());
    }

    #[test]
    fn flags_are_checked_and_defaulted() {
        let c = parse(&["--size", "4K"]);
        assert_eq!((c.size, c.depth, c.mem_limit), (4096, 128, 0));
        assert_eq!(c.engine.algo, Algo::Lz4);
        assert!(DeviceConfig::from_flags(["--size", "1000"]).is_err());
        assert!(DeviceConfig::from_flags(["--size", "1G", "--io-buf", "3000"]).is_err());
        assert!(DeviceConfig::from_flags(["--depth", "8"]).is_err());
    }
}
