//! Every argument of every subcommand, in one place.

use super::columns::Columns;
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use zblk::PageRange;
use zblk_ublk::size::parse_size;
use zblk_ublk::DeviceConfig;

/// zblk: compressed RAM block devices (like zram) served through ublk.
#[derive(Debug, Parser)]
#[command(
    name = "zblk",
    version,
    about = "zblk: compressed RAM block devices (like zram) served through ublk",
    propagate_version = true
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub cmd: Cmd,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Cmd {
    /// Create a device (/dev/ublkbN) and start its daemon.
    Add(AddArgs),
    /// One line per device (zramctl's columns).
    List(ListArgs),
    /// Every statistic of one or all devices.
    Stat(StatArgs),
    /// Stop and delete devices.
    Del(DelArgs),
    /// Compact a device's memory now, or its backing device.
    Compact(CompactArgs),
    /// Change a device's settings at run time.
    Set(SetArgs),
    /// Mark a device's pages idle (all, or not accessed for --age seconds).
    Idle(IdleArgs),
    /// Recompress a device's pages with a stronger secondary algorithm.
    Recompress(RecompressArgs),
    /// Write a device's pages back to its backing device (--backing-dev), by type or by index.
    Writeback(WritebackArgs),
    /// One line per stored page: size, access time, flags, kind, algorithm (zram's block_state).
    ///
    /// Columns: INDEX; SIZE, the bytes the page takes (its object, 4096 raw,
    /// its share of a packed group, 0 same-filled); ATIME, its last access
    /// in seconds of the store's clock; FLAGS, one letter each or '.': s
    /// same-filled, w written back, h huge, p packed, i idle, n
    /// incompressible; KIND; ALGO, the primary or secondary algorithm ('-'
    /// raw or same-filled). Empty slots are left out. The daemon answers a
    /// chunk of slots at a time, one slot lock at a time, while it serves.
    Dump(DumpArgs),
    /// Compression dictionaries (zram's algorithm_params dict=PATH).
    #[command(subcommand)]
    Dict(DictCmd),
    /// Run the engine over a file of pages (no device, no root).
    Bench(BenchArgs),
    /// Start a daemon that takes over a device whose daemon died.
    Recover(RecoverArgs),
    /// Hand a device over to a new daemon (e.g. an upgraded binary), no swapoff.
    Restart(IdArgs),
    /// Bring up the devices of the configuration file (/etc/zblk/zblk.conf):
    /// swap, or filesystems on their mount-point.
    #[command(after_help = SETUP_KEYS)]
    Setup(SetupArgs),
    /// Serve every device's statistics to Prometheus over HTTP (/metrics).
    Exporter(ExporterArgs),
    /// One screen, refreshed: per device stored, ratio, memory, IOPS, p99.
    Top(TopArgs),
    /// Write the man pages and shell completions into a directory.
    #[command(hide = true)]
    GenDocs(GenDocsArgs),
    /// Write the systemd units of the filesystems of /etc/zblk/zblk.conf
    /// (what /usr/lib/systemd/system-generators/zblk-generator runs).
    #[command(hide = true)]
    Generator(GeneratorArgs),
    /// Serve a device (what `add` starts in the background).
    #[command(hide = true)]
    Daemon(DaemonArgs),
    /// Hold a device's store and restart its daemon (what `add` starts).
    #[command(hide = true)]
    Keeper(KeeperArgs),
}

/// How pages are compressed and grouped: the engine flags of `zblk add`
/// and `zblk bench`.
pub use zblk_ublk::EngineConfig as EngineArgs;

/// `zblk add`.
#[derive(Debug, Args)]
pub struct AddArgs {
    /// The device.
    #[command(flatten)]
    pub dev: DeviceConfig,
    /// Make it swap at once: mkswap, then swapon with discard.
    #[arg(long)]
    pub swap: bool,
    /// Swap priority (with --swap).
    #[arg(short, long, requires = "swap", default_value_t = 100,
          allow_negative_numbers = true, value_parser = clap::value_parser!(i32).range(-1..=32767))]
    pub priority: i32,
    /// Serve the device in this process, logging to stderr, until SIGTERM.
    #[arg(short, long)]
    pub foreground: bool,
    /// Print the device as JSON.
    #[arg(long)]
    pub json: bool,
}

/// The keys of a section, for `zblk setup --help` and its man page.
const SETUP_KEYS: &str = "\
A [ublkbN] section makes /dev/ublkbN: size (MB, or an expression of ram: \"ram / 2\"), \
compression-algorithm, mode, group-pages, mem-limit, recovery, backing-dev, \
recompress-idle-after, recompress-algorithm, writeback-idle-after, algorithm-params, io-threads, queue-cpus, poll-us, \
compress-workers, host-memory-limit; \
then swap (swap-priority, options: swapon's, default \"discard\") or, with \
mount-point = \"/PATH\", a filesystem mounted there: fs-type (ext4, the default, made \
without a journal; ext2, ext3, xfs, btrfs: its mkfs.TYPE must be installed) and options \
(mount options, default \"discard\"). At boot zblk-generator writes a mount unit for \
each mount-point, before local-fs.target, that pulls in zblk@N.service. \
Every key: /usr/share/doc/zblk/zblk.conf.example.";

/// Where `zblk setup` reads its devices from by default (the format is
/// `conf`'s).
pub const DEFAULT_CONF_PATH: &str = "/etc/zblk/zblk.conf";

/// `zblk setup`.
#[derive(Debug, Args)]
pub struct SetupArgs {
    /// The configuration file: one [ublkbN] section per device [default:
    /// /etc/zblk/zblk.conf, then the drop-ins zblk.conf.d/*.conf of
    /// /usr/lib/zblk and /etc/zblk; a file given is read alone].
    #[arg(short, long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print what would be done, with each evaluated size; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Only the device N of the file (its [ublkbN] section).
    #[arg(short = 'n', long)]
    pub id: Option<u32>,
    /// Serve that device in this process until stopped, telling systemd
    /// when it is swap, or formatted for its mount-point (mounting it is
    /// the mount unit's); what zblk@N.service runs.
    #[arg(short, long, requires = "id", conflicts_with = "dry_run")]
    pub foreground: bool,
    /// Unmount that device or swap it off, and delete it, unless its
    /// daemon just died under systemd, which will restart it, or the
    /// unit's start made none (zblk@N.service's ExecStop).
    #[arg(long, requires = "id", conflicts_with_all = ["dry_run", "foreground"])]
    pub stop: bool,
    /// Bring up the swap devices only, leaving the sections with a
    /// mount-point to the units zblk's systemd generator writes for them
    /// (what zblk-setup.service runs).
    #[arg(long, conflicts_with_all = ["foreground", "stop"])]
    pub swap_only: bool,
    /// One round of that device's idle policy limited to or excluding
    /// cgroups (policy-cgroups, policy-exclude-cgroups): what the timer
    /// zblk's systemd generator writes for it runs (root).
    #[arg(long, requires = "id", conflicts_with_all = ["dry_run", "foreground", "stop", "swap_only"])]
    pub policy: bool,
}

impl SetupArgs {
    /// The file read first: `--config`'s, or the default.
    pub fn config_file(&self) -> &Path {
        self.config
            .as_deref()
            .unwrap_or(Path::new(DEFAULT_CONF_PATH))
    }
}

/// `zblk list`: zramctl's and lsblk's `--output`, `--noheadings` and
/// `--bytes`, with their short flags (`list` takes no device id, so its
/// `-n` is zramctl's `--noheadings`, not `--id`).
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Print JSON (every field, raw numbers; the column flags do not apply).
    #[arg(short = 'J', long)]
    pub json: bool,
    /// Columns to print, comma-separated (zramctl's names; STREAMS is
    /// zramctl's word for QUEUES) [default: all].
    #[arg(short, long, value_name = "COLUMNS", value_parser = Columns::parse)]
    pub output: Option<Columns>,
    /// Do not print the header line.
    #[arg(short, long)]
    pub noheadings: bool,
    /// Print sizes in bytes, not in human units.
    #[arg(short, long)]
    pub bytes: bool,
}

/// How `zblk stat` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StatFormat {
    /// A table of fields, latencies and queues.
    Text,
    /// One JSON document per device and round.
    Json,
    /// Prometheus text exposition (for node_exporter's textfile collector).
    Prometheus,
}

/// `zblk stat`.
#[derive(Debug, Args)]
pub struct StatArgs {
    /// Device id [default: every device].
    #[arg(short = 'n', long)]
    pub id: Option<u32>,
    /// Print JSON (one document per device and round): --format json.
    #[arg(long, conflicts_with = "format")]
    pub json: bool,
    /// Output format [default: text].
    #[arg(long, value_enum)]
    pub format: Option<StatFormat>,
    /// Print again every SECS seconds, until interrupted.
    #[arg(short, long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..))]
    pub watch: Option<u64>,
    /// Who holds the swapped pages: a row per cgroup (v2) or process and
    /// swap area, from every process's page tables (root).
    #[arg(long, value_enum, value_name = "WHO")]
    pub by: Option<By>,
    /// With --by and --format prometheus: the N rows of each zblk device
    /// with the most compressed bytes get series of their own, the rest
    /// are summed as "other".
    #[arg(long, value_name = "N", default_value_t = 10, requires = "by")]
    pub top: usize,
}

/// Whose pages `zblk stat --by` counts in a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum By {
    /// A row per cgroup (v2) and swap area.
    Cgroup,
    /// A row per process and swap area.
    Process,
}

impl StatArgs {
    /// The format asked for, `--json` being `--format json`.
    pub fn format(&self) -> StatFormat {
        match (self.json, self.format) {
            (true, _) => StatFormat::Json,
            (false, Some(f)) => f,
            (false, None) => StatFormat::Text,
        }
    }
}

/// `zblk exporter`.
#[derive(Debug, Args)]
pub struct ExporterArgs {
    /// Address to listen on (loopback by default: the statistics are root's).
    #[arg(short, long, value_name = "ADDR", default_value = "127.0.0.1:9586")]
    pub listen: SocketAddr,
    /// Longest one scrape waits for the devices' daemons, in seconds.
    #[arg(short, long, value_name = "SECS", default_value_t = super::scrape::DEFAULT_TIMEOUT_SECS,
          value_parser = clap::value_parser!(u64).range(1..=60))]
    pub timeout: u64,
    /// Add the series of `zblk stat --by WHO --format prometheus` to each
    /// scrape: a pass over every process's page tables per scrape (root).
    #[arg(long, value_enum, value_name = "WHO")]
    pub by: Option<By>,
    /// With --by: the N rows of each zblk device with the most compressed
    /// bytes get series of their own, the rest are summed as "other".
    #[arg(long, value_name = "N", default_value_t = 10, requires = "by")]
    pub top: usize,
    /// Directory of the control sockets (tests point it elsewhere).
    #[arg(long, hide = true, default_value = zblk_ublk::paths::RUN_DIR)]
    pub run_dir: PathBuf,
}

/// `zblk top`.
#[derive(Debug, Args)]
pub struct TopArgs {
    /// Seconds between refreshes (fractions allowed, at least 0.1).
    #[arg(short = 'd', long, value_name = "SECS", default_value = "1", value_parser = parse_interval)]
    pub interval: Duration,
    /// Stop after N refreshes [default: until q or Ctrl-C].
    #[arg(short = 'n', long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub iterations: Option<u64>,
    /// A row per cgroup (v2) or process and swap area instead of per
    /// device, largest compressed size first: `zblk stat --by`'s pass
    /// each round (root).
    #[arg(long, value_enum, value_name = "WHO")]
    pub by: Option<By>,
    /// Directory of the control sockets (tests point it elsewhere).
    #[arg(long, hide = true, default_value = zblk_ublk::paths::RUN_DIR)]
    pub run_dir: PathBuf,
}

/// Parses `--interval`: seconds, a fraction allowed, from 0.1 to an hour.
fn parse_interval(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("invalid interval '{s}': seconds, such as 1 or 0.5"))?;
    if !(0.1..=3600.0).contains(&secs) {
        return Err(format!(
            "interval {s} is out of range (0.1 to 3600 seconds)"
        ));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// The hidden `zblk gen-docs`: what tools/scripts/gen-docs.sh runs.
#[derive(Debug, Args)]
pub struct GenDocsArgs {
    /// Directory to write into (created if missing): zblk.1, zblk-SUB.1
    /// per subcommand, and completions/zblk.bash, _zblk, zblk.fish.
    pub out_dir: PathBuf,
}

/// The hidden `zblk generator`: systemd runs generators with three
/// directories (normal, early, late); the units go into the first.
#[derive(Debug, Args)]
pub struct GeneratorArgs {
    /// The directories systemd gives a generator.
    #[arg(required = true, num_args = 1..=3)]
    pub dirs: Vec<PathBuf>,
}

/// `zblk del`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("which").required(true).args(["id", "all"])))]
pub struct DelArgs {
    /// Device id.
    #[arg(short = 'n', long)]
    pub id: Option<u32>,
    /// Every zblk device but a mounted one (a filesystem's device goes
    /// after its unmount: by -n, or by its unit).
    #[arg(short, long)]
    pub all: bool,
    /// swapoff first if the device is active swap.
    #[arg(short, long)]
    pub force: bool,
}

/// `zblk compact`: the device's memory, or its backing device.
#[derive(Debug, Args)]
pub struct CompactArgs {
    /// Device id.
    #[arg(short = 'n', long)]
    pub id: u32,
    /// Compact the backing device instead: move the written-back pages of
    /// blocks less than half used into fresh blocks, freeing those blocks.
    #[arg(long)]
    pub backing: bool,
    /// With --backing: look at most at this many blocks (default: every
    /// such block).
    #[arg(long, value_name = "N", requires = "backing",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub max_blocks: Option<u64>,
}

/// A device id (`zblk restart`).
#[derive(Debug, Args)]
pub struct IdArgs {
    /// Device id.
    #[arg(short = 'n', long)]
    pub id: u32,
}

/// `zblk set`: at least one setting.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("setting").required(true).multiple(true)))]
pub struct SetArgs {
    /// Device id.
    #[arg(short = 'n', long)]
    pub id: u32,
    /// New memory limit (0: none; suffixes K, M, G, T).
    #[arg(long, value_parser = parse_size, group = "setting")]
    pub mem_limit: Option<u64>,
    /// Pages writeback may write from now on (zram's writeback_limit;
    /// 0: no limit).
    #[arg(long, value_name = "PAGES", group = "setting")]
    pub writeback_limit: Option<u64>,
    /// The idle policy: recompress pages not accessed for SECS seconds,
    /// on its own (0: off).
    #[arg(long, value_name = "SECS", group = "setting")]
    pub recompress_idle_after: Option<u64>,
    /// The idle policy: write back pages not accessed for SECS seconds,
    /// on its own (0: off; needs a backing device).
    #[arg(long, value_name = "SECS", group = "setting")]
    pub writeback_idle_after: Option<u64>,
    /// The secondary algorithms, 1 to 3 in priority order separated by
    /// spaces ("lz4hc zstd:3 zstd:19"): recompression (the idle policy's,
    /// and `zblk recompress` without --algo) tries them in turn and keeps
    /// the first result 5 % smaller (zram's recomp_algorithm priorities).
    #[arg(
        long = "recompress-algos",
        alias = "recompress-algo",
        value_name = "ALGOS",
        group = "setting"
    )]
    pub recompress_algo: Option<String>,
}

/// `zblk writeback`: by type, by page index or by cgroup, exactly one of
/// the three (the group makes them conflict, as zram's `type=` and
/// `page_index=`).
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("which").required(true).args(["kind", "pages", "cgroup"])))]
pub struct WritebackArgs {
    /// Device id.
    #[arg(short = 'n', long)]
    pub id: u32,
    /// Which pages: idle, huge, incompressible or huge_idle (or --pages,
    /// not both).
    #[arg(long = "type", value_name = "TYPE")]
    pub kind: Option<String>,
    /// Every stored page of these, whatever its type: a page index N or
    /// an inclusive range LOW-HIGH (repeatable; zram's page_index= and
    /// page_indexes=). Same-filled pages stay in RAM.
    #[arg(long, value_name = "LOW-HIGH", value_parser = parse_page_range, action = clap::ArgAction::Append)]
    pub pages: Vec<PageRange>,
    /// Every stored page on this device that a process of this cgroup
    /// (v2 path, its descendants included) maps, found by the scan of
    /// `zblk stat --by` (root; not with --type or --pages).
    #[arg(long, value_name = "PATH")]
    pub cgroup: Option<String>,
    /// Write back at most this many pages (0: no limit but the device's
    /// --writeback-limit).
    #[arg(long, value_name = "PAGES", default_value_t = 0)]
    pub limit: u64,
}

/// Parses `--pages`: N or LOW-HIGH, LOW <= HIGH.
fn parse_page_range(s: &str) -> Result<PageRange, String> {
    s.parse()
}

/// `zblk dump`.
#[derive(Debug, Args)]
pub struct DumpArgs {
    /// Device id.
    #[arg(short = 'n', long)]
    pub id: u32,
    /// One JSON object per page and line (JSON lines): index, kind, size,
    /// algo, idle, incompressible, atime.
    #[arg(long)]
    pub json: bool,
}

/// `zblk dict`.
#[derive(Debug, Subcommand)]
pub enum DictCmd {
    /// Make a dictionary from the device's own stored pages, sampled
    /// evenly across it (empty and same-filled pages left out), read by
    /// the daemon without counting as an access. The dictionary is raw
    /// content, for lz4, lz4hc or zstd: give it to a new device with
    /// `zblk add --algo-params dict=FILE`. An empty device has no pages
    /// to make one of.
    Train(DictTrainArgs),
}

/// `zblk dict train`.
#[derive(Debug, Args)]
pub struct DictTrainArgs {
    /// Device id.
    #[arg(short = 'n', long)]
    pub id: u32,
    /// Write the dictionary here [default: standard output, refused on a
    /// terminal].
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<std::path::PathBuf>,
    /// Dictionary size, whole 4 KB pages (suffixes K; at most 64K, LZ4's
    /// window).
    #[arg(long, default_value = "64K", value_parser = parse_dict_size)]
    pub size: u64,
}

/// Parses `--size` of `zblk dict train`: a size from one page to
/// `zblk::MAX_DICT_BYTES`.
fn parse_dict_size(s: &str) -> Result<u64, String> {
    let n = zblk_ublk::size::parse_size(s)?;
    let max = zblk::MAX_DICT_BYTES as u64;
    if !(4096..=max).contains(&n) {
        return Err(format!("{n} bytes is not 4K to {max}"));
    }
    Ok(n)
}

/// `zblk idle`.
#[derive(Debug, Args)]
pub struct IdleArgs {
    /// Device id.
    #[arg(short = 'n', long)]
    pub id: u32,
    /// Mark only pages not accessed for this many seconds.
    #[arg(long, conflicts_with = "all", required_unless_present = "all")]
    pub age: Option<u64>,
    /// Mark every stored page.
    #[arg(long)]
    pub all: bool,
}

/// `zblk recompress`.
#[derive(Debug, Args)]
pub struct RecompressArgs {
    /// Device id.
    #[arg(short = 'n', long)]
    pub id: u32,
    /// Recompress with this secondary algorithm alone (lz4hc[:LEVEL],
    /// zstd:LEVEL, deflate:LEVEL, ...) [default: the device's list, set
    /// with `zblk set --recompress-algos`, tried in priority order]. A
    /// device records up to 3 secondary algorithms, for good.
    #[arg(long, conflicts_with = "priority")]
    pub algo: Option<String>,
    /// Recompress with the entry N (1-3) of the device's list alone.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u8).range(1..=3))]
    pub priority: Option<u8>,
    /// Which pages: all, idle, huge or huge_idle.
    #[arg(long = "type", default_value = "all")]
    pub kind: String,
    /// Only pages stored in at least this many bytes.
    #[arg(long, default_value_t = 0)]
    pub threshold: u64,
    /// Try at most this many pages (0: no limit).
    #[arg(long, default_value_t = 0)]
    pub max_pages: u64,
    /// Only the pages of these, of the type asked for: a page index N or
    /// an inclusive range LOW-HIGH (repeatable; as `zblk writeback
    /// --pages`).
    #[arg(long, value_name = "LOW-HIGH", value_parser = parse_page_range, action = clap::ArgAction::Append, conflicts_with = "cgroup")]
    pub pages: Vec<PageRange>,
    /// Only the pages, of the type asked for, that a process of this
    /// cgroup (v2 path, its descendants included) maps, found by the scan
    /// of `zblk stat --by` (root).
    #[arg(long, value_name = "PATH")]
    pub cgroup: Option<String>,
}

/// `zblk bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// File of 4 KB pages (.zst files are decompressed first).
    #[arg(short, long)]
    pub input: PathBuf,
    /// Compression and grouping.
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Threads, each with its own engine context.
    #[arg(short, long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub threads: u16,
    /// Pages per write and read request.
    #[arg(short, long, default_value_t = zblk_bench::engine::DEFAULT_REQUEST_PAGES as u16,
          value_parser = clap::value_parser!(u16).range(1..=512))]
    pub request_pages: u16,
    /// After the write and verify phases, discard every page from N threads,
    /// once with deferred and once with immediate free on two identical
    /// stores, and report both times.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub discard_threads: Option<u16>,
    /// Run the engine on a private, unlocked store without the memory
    /// reserve, instead of the store the daemon runs (shared memory, the
    /// reserve and its provisioner, mlock).
    #[arg(long)]
    pub private: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// The hidden `zblk daemon`: serves a device, reports readiness as one
/// JSON line on stdout.
#[derive(Debug, Args)]
pub struct DaemonArgs {
    /// The device, as JSON (the configuration `add` parsed its flags into).
    #[arg(long, value_parser = DeviceConfig::from_json)]
    pub config_json: DeviceConfig,
    /// Log file to rename to /run/zblk/<id>.log once the id is known.
    #[arg(long)]
    pub log_file: Option<PathBuf>,
    /// Inherited socket on which to hand the store's memfd to the keeper.
    #[arg(long)]
    pub keeper_fd: Option<i32>,
}

/// The hidden `zblk keeper`: starts the daemon of a new device, holds its
/// store, restarts it; reports readiness as `daemon` does.
#[derive(Debug, Args)]
pub struct KeeperArgs {
    /// The device, as JSON.
    #[arg(long, value_parser = DeviceConfig::from_json)]
    pub config_json: DeviceConfig,
    /// Log file to rename to /run/zblk/<id>.log once the id is known.
    #[arg(long)]
    pub log_file: Option<PathBuf>,
    /// Keep this running daemon (whose keeper died) instead of starting
    /// one; the memfd comes on --link-fd.
    #[arg(long, requires = "link_fd")]
    pub adopt: Option<u32>,
    /// The inherited link to the daemon of --adopt.
    #[arg(long, requires = "adopt")]
    pub link_fd: Option<i32>,
}

/// `zblk recover`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("daemon").multiple(true).args(["memfd", "config_json"])))]
pub struct RecoverArgs {
    /// Device id.
    #[arg(short = 'n', long)]
    pub id: u32,
    /// Become the daemon, with the store in this inherited descriptor
    /// (what the keeper runs; needs --config-json).
    #[arg(long, hide = true, requires = "config_json")]
    pub memfd: Option<i32>,
    /// The device as it was resolved (with --memfd).
    #[arg(long, hide = true, requires = "memfd", value_parser = DeviceConfig::from_json)]
    pub config_json: Option<DeviceConfig>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::error::ErrorKind;
    use zblk::{Algo, Mode};

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("zblk").chain(args.iter().copied()))
    }

    #[test]
    fn add_defaults() {
        let Cmd::Add(a) = parse(&["add", "--size", "1G"]).unwrap().cmd else {
            panic!("not add")
        };
        assert_eq!(a.dev.size, 1 << 30);
        assert_eq!(a.dev.engine.algo, Algo::Lz4);
        assert_eq!(a.dev.engine.group_pages, 8);
        assert_eq!(a.dev.mem_limit, 0);
        assert_eq!(a.dev.queues, None);
        assert_eq!(a.dev.depth, 128);
        assert_eq!(a.dev.id, None);
        assert_eq!(a.dev.engine.mode, Mode::PerPage);
        assert_eq!(a.priority, 100);
        assert!(!a.swap && !a.foreground && !a.json);
    }

    #[test]
    fn add_with_everything() {
        let args = [
            "add",
            "-s",
            "8G",
            "--algo",
            "zstd:3",
            "--group-pages",
            "16",
            "--mem-limit",
            "2G",
            "--queues",
            "4",
            "--depth",
            "64",
            "--id",
            "7",
            "--swap",
            "--priority",
            "-1",
            "--foreground",
            "--json",
            "--io-buf",
            "512K",
            "--mode",
            "packed",
        ];
        let Cmd::Add(a) = parse(&args).unwrap().cmd else {
            panic!("not add")
        };
        assert_eq!(a.dev.size, 8 << 30);
        assert_eq!(a.dev.engine.algo, Algo::Zstd(3));
        assert_eq!(a.dev.engine.group_pages, 16);
        assert_eq!(a.dev.mem_limit, 2 << 30);
        assert_eq!(
            (a.dev.queues, a.dev.depth, a.dev.id),
            (Some(4), 64, Some(7))
        );
        assert_eq!(a.dev.io_buf, Some(512 << 10));
        assert_eq!(a.dev.engine.mode, Mode::Packed);
        assert!(a.swap && a.foreground && a.json);
        assert_eq!(a.priority, -1);
    }

    #[test]
    fn add_refusals_say_why() {
        let cases: &[(&[&str], &str)] = &[
            (&["add"], "--size"),
            (&["add", "--size", "0"], "size must not be zero"),
            (&["add", "--size", "1000"], "not a multiple of 4 KB"),
            (&["add", "--size", "1X"], "invalid size '1X'"),
            (
                &["add", "--size", "1G", "--algo", "lzo"],
                "unknown algorithm 'lzo'",
            ),
            (
                &["add", "--size", "1G", "--algo", "zstd:99"],
                "invalid level",
            ),
            (&["add", "--size", "1G", "--group-pages", "65"], "65"),
            (&["add", "--size", "1G", "--queues", "0"], "0"),
            (&["add", "--size", "1G", "--depth", "5000"], "5000"),
            (&["add", "--size", "1G", "--priority", "5"], "--swap"),
            (
                &["add", "--size", "1G", "--io-buf", "3000"],
                "multiple of 4 KB",
            ),
            (
                &["add", "--size", "1G", "--mode", "dense"],
                "unknown mode 'dense'",
            ),
        ];
        for (args, want) in cases {
            let e = parse(args).unwrap_err();
            assert!(e.to_string().contains(want), "{args:?}: {e}");
        }
    }

    #[test]
    fn del_needs_an_id_or_all() {
        assert_eq!(
            parse(&["del"]).unwrap_err().kind(),
            ErrorKind::MissingRequiredArgument
        );
        assert_eq!(
            parse(&["del", "-n", "1", "--all"]).unwrap_err().kind(),
            ErrorKind::ArgumentConflict
        );
        let Cmd::Del(d) = parse(&["del", "-a", "--force"]).unwrap().cmd else {
            panic!()
        };
        assert!(d.all && d.force && d.id.is_none());
    }

    #[test]
    fn other_subcommands_parse() {
        assert!(matches!(
            parse(&["list", "--json"]).unwrap().cmd,
            Cmd::List(ListArgs { json: true, .. })
        ));
        let Cmd::Stat(s) = parse(&["stat", "-n", "3", "--watch", "2"]).unwrap().cmd else {
            panic!()
        };
        assert_eq!((s.id, s.watch, s.json), (Some(3), Some(2), false));
        assert_eq!(s.format(), StatFormat::Text);
        assert!(parse(&["stat", "--watch", "0"]).is_err());
        assert!(matches!(
            parse(&["compact", "-n", "2"]).unwrap().cmd,
            Cmd::Compact(CompactArgs {
                id: 2,
                backing: false,
                max_blocks: None
            })
        ));
        assert!(matches!(
            parse(&["compact", "-n", "2", "--backing", "--max-blocks", "64"])
                .unwrap()
                .cmd,
            Cmd::Compact(CompactArgs {
                id: 2,
                backing: true,
                max_blocks: Some(64)
            })
        ));
        assert!(
            parse(&["compact", "-n", "2", "--max-blocks", "64"]).is_err(),
            "--backing only"
        );
        assert!(parse(&["compact", "-n", "2", "--backing", "--max-blocks", "0"]).is_err());
        let Cmd::Idle(i) = parse(&["idle", "-n", "1", "--age", "600"]).unwrap().cmd else {
            panic!()
        };
        assert_eq!((i.id, i.age, i.all), (1, Some(600), false));
        assert!(parse(&["idle", "-n", "1"]).is_err(), "--age or --all");
        assert!(parse(&["idle", "-n", "1", "--all", "--age", "5"]).is_err());
        let Cmd::Recompress(r) = parse(&["recompress", "-n", "3", "--algo", "zstd:9"])
            .unwrap()
            .cmd
        else {
            panic!()
        };
        assert_eq!(
            (r.id, r.algo.as_deref(), r.kind.as_str()),
            (3, Some("zstd:9"), "all")
        );
        let Cmd::Set(s) = parse(&["set", "-n", "1", "--mem-limit", "1G"]).unwrap().cmd else {
            panic!()
        };
        assert_eq!((s.mem_limit, s.writeback_limit), (Some(1 << 30), None));
        assert!(parse(&["set", "-n", "1"]).is_err(), "set needs a setting");
        let Cmd::Set(s) = parse(&["set", "-n", "1", "--writeback-limit", "500"])
            .unwrap()
            .cmd
        else {
            panic!()
        };
        assert_eq!((s.mem_limit, s.writeback_limit), (None, Some(500)));
        let Cmd::Set(s) = parse(&[
            "set",
            "-n",
            "1",
            "--writeback-idle-after",
            "3600",
            "--recompress-idle-after",
            "600",
            "--recompress-algo",
            "zstd:9",
        ])
        .unwrap()
        .cmd
        else {
            panic!()
        };
        assert_eq!(
            (s.writeback_idle_after, s.recompress_idle_after),
            (Some(3600), Some(600))
        );
        assert_eq!(s.recompress_algo.as_deref(), Some("zstd:9"));
        let Cmd::Set(s) = parse(&["set", "-n", "1", "--recompress-algos", "lz4hc zstd:3"])
            .unwrap()
            .cmd
        else {
            panic!()
        };
        assert_eq!(s.recompress_algo.as_deref(), Some("lz4hc zstd:3"));
        let Cmd::Recompress(r) = parse(&["recompress", "-n", "1", "--priority", "2"])
            .unwrap()
            .cmd
        else {
            panic!()
        };
        assert_eq!((r.algo, r.priority), (None, Some(2)));
        for bad in [
            &["recompress", "-n", "1", "--priority", "4"][..],
            &["recompress", "-n", "1", "--priority", "1", "--algo", "zstd"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        let Cmd::Writeback(w) = parse(&["writeback", "-n", "2", "--type", "huge_idle"])
            .unwrap()
            .cmd
        else {
            panic!()
        };
        assert_eq!(
            (w.id, w.kind.as_deref(), w.limit),
            (2, Some("huge_idle"), 0)
        );
        assert!(w.pages.is_empty());
        assert_eq!(
            parse(&["writeback", "-n", "2"]).unwrap_err().kind(),
            ErrorKind::MissingRequiredArgument,
            "--type or --pages"
        );
        let Cmd::Bench(b) = parse(&["bench", "--input", "x.zst", "--threads", "2"])
            .unwrap()
            .cmd
        else {
            panic!()
        };
        assert_eq!(
            (b.threads, b.engine.group_pages, b.request_pages),
            (2, 8, 16)
        );
        assert!(parse(&["bench"]).is_err());
        assert!(matches!(
            parse(&["restart", "-n", "4"]).unwrap().cmd,
            Cmd::Restart(IdArgs { id: 4 })
        ));
        let Cmd::Recover(r) = parse(&["recover", "-n", "2"]).unwrap().cmd else {
            panic!()
        };
        assert_eq!((r.id, r.memfd), (2, None));
        assert!(parse(&["recover", "-n", "2", "--memfd", "3"]).is_err());
        let Cmd::Add(a) = parse(&["add", "-s", "1G", "--no-recovery"]).unwrap().cmd else {
            panic!()
        };
        assert!(a.dev.no_recovery);
        let Cmd::Setup(s) = parse(&["setup", "--dry-run"]).unwrap().cmd else {
            panic!()
        };
        assert_eq!(s.config, None);
        assert_eq!(s.config_file(), Path::new("/etc/zblk/zblk.conf"));
        assert!(s.dry_run && !s.foreground && s.id.is_none());
        let Cmd::Setup(s) = parse(&["setup", "-c", "x.conf", "-n", "2", "-f"])
            .unwrap()
            .cmd
        else {
            panic!()
        };
        assert_eq!(
            (s.config, s.id, s.foreground),
            (Some("x.conf".into()), Some(2), true)
        );
        assert!(parse(&["setup", "--foreground"]).is_err(), "needs --id");
        assert!(parse(&["setup", "-n", "1", "-f", "--dry-run"]).is_err());
    }

    #[test]
    fn writeback_by_page_index() {
        let Cmd::Writeback(w) = parse(&[
            "writeback",
            "-n",
            "1",
            "--pages",
            "10-20",
            "--pages",
            "7",
            "--limit",
            "5",
        ])
        .unwrap()
        .cmd
        else {
            panic!()
        };
        let range = |first, last| PageRange { first, last };
        assert_eq!(w.pages, [range(10, 20), range(7, 7)]);
        assert_eq!((w.kind, w.limit), (None, 5));
        let e = parse(&["writeback", "-n", "1", "--pages", "3", "--type", "idle"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ArgumentConflict);
        let line = super::super::one_line(&e.to_string());
        assert!(
            line.contains("--type") && line.contains("--pages"),
            "{line}"
        );
        for (bad, why) in [
            ("20-10", "first page is past its last"),
            ("ten", "invalid page range 'ten'"),
            ("1-", "invalid page range"),
        ] {
            let e = parse(&["writeback", "-n", "1", "--pages", bad]).unwrap_err();
            assert!(e.to_string().contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn dump_takes_an_id_and_json() {
        let Cmd::Dump(d) = parse(&["dump", "-n", "3", "--json"]).unwrap().cmd else {
            panic!()
        };
        assert_eq!((d.id, d.json), (3, true));
        let Cmd::Dict(DictCmd::Train(t)) = parse(&["dict", "train", "-n", "2", "-o", "/tmp/d"])
            .unwrap()
            .cmd
        else {
            panic!()
        };
        assert_eq!((t.id, t.size), (2, 65536));
        assert_eq!(t.output.as_deref(), Some(std::path::Path::new("/tmp/d")));
        for bad in ["1K", "65537", "1M"] {
            assert!(
                parse(&["dict", "train", "-n", "2", "--size", bad]).is_err(),
                "{bad}"
            );
        }
        let Cmd::Dump(d) = parse(&["dump", "--id", "0"]).unwrap().cmd else {
            panic!()
        };
        assert_eq!((d.id, d.json), (0, false));
        assert!(parse(&["dump"]).is_err(), "needs --id");
    }

    #[test]
    fn stat_formats() {
        let fmt = |args: &[&str]| {
            let Cmd::Stat(s) = parse(args).unwrap().cmd else {
                panic!()
            };
            s.format()
        };
        assert_eq!(fmt(&["stat", "--json"]), StatFormat::Json);
        assert_eq!(fmt(&["stat", "--format", "json"]), StatFormat::Json);
        assert_eq!(
            fmt(&["stat", "--format", "prometheus"]),
            StatFormat::Prometheus
        );
        assert_eq!(fmt(&["stat", "--format", "text"]), StatFormat::Text);
        let e = parse(&["stat", "--format", "xml"]).unwrap_err();
        assert!(e.to_string().contains("prometheus"), "{e}");
        let e = parse(&["stat", "--json", "--format", "text"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ArgumentConflict);
    }

    #[test]
    fn recompress_by_type_within_pages_or_a_cgroup() {
        let rc = |args: &[&str]| {
            let mut all = vec!["recompress", "-n", "0"];
            all.extend(args);
            match parse(&all).map(|c| c.cmd) {
                Ok(Cmd::Recompress(r)) => Ok(r),
                Ok(_) => panic!("not recompress"),
                Err(e) => Err(e),
            }
        };
        let r = rc(&["--type", "idle", "--cgroup", "/a/b"]).unwrap();
        assert_eq!(
            (r.kind.as_str(), r.cgroup.as_deref()),
            ("idle", Some("/a/b"))
        );
        assert!(r.pages.is_empty());
        let r = rc(&["--pages", "3-9", "--pages", "12"]).unwrap();
        let range = |first, last| PageRange { first, last };
        assert_eq!(r.pages, [range(3, 9), range(12, 12)]);
        assert_eq!((r.kind.as_str(), r.cgroup), ("all", None));
        let e = rc(&["--pages", "1", "--cgroup", "/a"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ArgumentConflict);
        assert!(rc(&["--pages", "9-3"]).is_err());
    }

    #[test]
    fn the_exporter_adds_the_series_by_cgroup_on_request() {
        let Cmd::Exporter(e) = parse(&["exporter", "--by", "cgroup", "--top", "3"])
            .unwrap()
            .cmd
        else {
            panic!()
        };
        assert_eq!((e.by, e.top), (Some(By::Cgroup), 3));
        let Cmd::Exporter(e) = parse(&["exporter"]).unwrap().cmd else {
            panic!()
        };
        assert_eq!(e.by, None);
        assert!(
            parse(&["exporter", "--top", "3"]).is_err(),
            "--top needs --by"
        );
    }

    #[test]
    fn writeback_by_cgroup_alone() {
        let Cmd::Writeback(w) = parse(&["writeback", "-n", "0", "--cgroup", "/a/b"])
            .unwrap()
            .cmd
        else {
            panic!()
        };
        assert_eq!(w.cgroup.as_deref(), Some("/a/b"));
        for other in [["--type", "idle"], ["--pages", "1-2"]] {
            let mut args = vec!["writeback", "-n", "0", "--cgroup", "/a"];
            args.extend(other);
            let e = parse(&args).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::ArgumentConflict, "{other:?}");
        }
    }

    #[test]
    fn stat_by_cgroup_or_process() {
        let by = |args: &[&str]| {
            let Cmd::Stat(s) = parse(args).unwrap().cmd else {
                panic!()
            };
            (s.by, s.format())
        };
        assert_eq!(by(&["stat"]), (None, StatFormat::Text));
        assert_eq!(
            by(&["stat", "--by", "cgroup", "--json"]),
            (Some(By::Cgroup), StatFormat::Json)
        );
        assert_eq!(
            by(&["stat", "--by", "process"]),
            (Some(By::Process), StatFormat::Text)
        );
        let e = parse(&["stat", "--by", "user"]).unwrap_err();
        assert!(e.to_string().contains("cgroup"), "{e}");
        assert!(parse(&["stat", "--top", "3"]).is_err(), "--top needs --by");
        let Cmd::Stat(s) = parse(&[
            "stat",
            "--by",
            "cgroup",
            "--format",
            "prometheus",
            "--top",
            "3",
        ])
        .unwrap()
        .cmd
        else {
            panic!()
        };
        assert_eq!((s.top, s.format()), (3, StatFormat::Prometheus));
        let Cmd::Top(t) = parse(&["top", "--by", "cgroup"]).unwrap().cmd else {
            panic!()
        };
        assert_eq!(t.by, Some(By::Cgroup));
    }

    #[test]
    fn list_takes_zramctl_flags() {
        let Cmd::List(l) = parse(&["list", "-o", "name,DATA", "-n", "-b"]).unwrap().cmd else {
            panic!()
        };
        assert!(l.noheadings && l.bytes && !l.json);
        let names: Vec<&str> = l.output.unwrap().0.iter().map(|c| c.name).collect();
        assert_eq!(names, ["NAME", "DATA"]);
        let e = parse(&["list", "--output", "NAME,FOO"]).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("unknown column 'FOO'"), "{msg}");
        assert!(
            msg.contains("DISKSIZE") && msg.contains("MOUNTPOINT"),
            "{msg}"
        );
    }

    #[test]
    fn exporter_listens_on_loopback_by_default() {
        let Cmd::Exporter(x) = parse(&["exporter"]).unwrap().cmd else {
            panic!()
        };
        assert!(x.listen.ip().is_loopback());
        assert_eq!((x.listen.port(), x.timeout), (9586, 5));
        let Cmd::Exporter(x) = parse(&["exporter", "--listen", "[::1]:0"]).unwrap().cmd else {
            panic!()
        };
        assert_eq!(x.listen.port(), 0);
        assert!(parse(&["exporter", "--listen", "nowhere"]).is_err());
        assert!(parse(&["exporter", "--timeout", "0"]).is_err());
    }

    #[test]
    fn top_takes_intervals_in_seconds_and_iterations() {
        let Cmd::Top(t) = parse(&["top"]).unwrap().cmd else {
            panic!()
        };
        assert_eq!((t.interval, t.iterations), (Duration::from_secs(1), None));
        let Cmd::Top(t) = parse(&["top", "--interval", "0.2", "--iterations", "2"])
            .unwrap()
            .cmd
        else {
            panic!()
        };
        assert_eq!(
            (t.interval, t.iterations),
            (Duration::from_millis(200), Some(2))
        );
        let Cmd::Top(t) = parse(&["top", "-d", "3", "-n", "1"]).unwrap().cmd else {
            panic!()
        };
        assert_eq!(
            (t.interval, t.iterations),
            (Duration::from_secs(3), Some(1))
        );
        for (bad, why) in [
            ("0", "out of range"),
            ("0.05", "out of range"),
            ("-1", "unexpected argument"),
            ("soon", "invalid interval 'soon'"),
            ("NaN", "out of range"),
        ] {
            let e = parse(&["top", "--interval", bad]).unwrap_err();
            assert!(e.to_string().contains(why), "{bad}: {e}");
        }
        assert!(parse(&["top", "--iterations", "0"]).is_err());
    }
}
