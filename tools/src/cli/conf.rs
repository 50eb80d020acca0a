//! The configuration file of `zblk setup`, `/etc/zblk/zblk.conf`: TOML, in
//! the spirit of zram-generator's `zram-generator.conf`, one section per
//! device:
//!
//! ```toml
//! [ublkb0]
//! size = "min(ram / 2, 4096)"     # MB; ram is this machine's, in MB
//! compression-algorithm = "zstd:3"
//! swap-priority = 100
//! backing-dev = "/dev/sdb2"       # optional: zblk writeback's target
//! recompress-idle-after = 600     # optional: seconds; the idle policy
//! recompress-algorithm = "lz4hc zstd:9" #   tries these in turn
//! writeback-idle-after = 3600     # optional: needs backing-dev
//! policy-cgroups = ["/batch.slice"] # optional: the policy acts on these
//!                                 #   cgroups' pages only (or
//!                                 #   policy-exclude-cgroups: all others')
//! algorithm-params = "dict=/etc/zblk/swap.dict" # optional: zram's algorithm_params
//!
//! [ublkb1]
//! size = 1024
//! mount-point = "/var/tmp/zblk"   # a filesystem there, not swap
//! fs-type = "ext4"                # the default
//! options = "discard"             # mount options (the default)
//! ```
//!
//! A section is named after the device it makes (`[ublkb0]` makes
//! `/dev/ublkb0`), as zram-generator's `[zram0]` is: the name is what
//! `swapon --show` and `zblk list` print, and TOML itself refuses the same
//! section twice, so no two sections can claim one device.
//!
//! After the file, `zblk setup` reads the drop-ins `zblk.conf.d/*.conf`
//! of `/usr/lib/zblk` and `/etc/zblk` ([`drop_ins`]), as zram-generator
//! does its own: a key a later file writes replaces the same key of the
//! same section; a drop-in may add sections.
//!
//! Each section becomes the [`AddArgs`] of `zblk add --swap`: its values
//! go through `zblk add`'s own flag parsers, so the file takes exactly
//! what the flags take (`zstd:3`, `2G`) and gets the same defaults. A
//! section with `mount-point` is a filesystem instead ([`Mount`]): not
//! swap, its `options` mount options.

use super::args::AddArgs;
use super::attrib::CgroupFilter;
use super::fs::{self, FsType, Mount};
use clap::{Args, FromArgMatches};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use toml::Spanned;
use zblk_ublk::swap::Discard;

/// One 4 KB page: sizes are rounded down to it.
const PAGE: u64 = 4096;

/// One `[ublkbN]` section as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct Section {
    /// MB, an expression of `ram` (a string) or a number; required, but
    /// maybe in another file of the section.
    size: Option<Spanned<toml::Value>>,
    compression_algorithm: Option<Spanned<String>>,
    mode: Option<Spanned<String>>,
    group_pages: Option<Spanned<i64>>,
    /// Like `--mem-limit` (a size with a suffix, or bytes), or an
    /// expression of `ram` in MB ([`is_expression`]).
    mem_limit: Option<Spanned<toml::Value>>,
    swap_priority: Option<Spanned<i64>>,
    /// swapon options, as in fstab (`discard`, `discard=pages`); mount
    /// options with `mount-point`.
    options: Option<Spanned<String>>,
    /// Makes the device a filesystem mounted there instead of swap
    /// (zram-generator's key of that name).
    mount_point: Option<Spanned<String>>,
    /// The filesystem of `mount-point` (default ext4).
    fs_type: Option<Spanned<String>>,
    recovery: Option<bool>,
    /// Like `--backing-dev`: the block device or file `zblk writeback`
    /// moves pages to (zram-generator's `writeback-device`).
    backing_dev: Option<Spanned<String>>,
    /// Like `--recompress-idle-after`: seconds (the idle policy).
    recompress_idle_after: Option<Spanned<i64>>,
    /// Like `--recompress-algos`: the secondary algorithms, in priority
    /// order, separated by spaces.
    recompress_algorithm: Option<Spanned<String>>,
    /// Like `--writeback-idle-after`: seconds (the idle policy).
    writeback_idle_after: Option<Spanned<i64>>,
    /// The idle policy acts only on the pages these cgroups' processes
    /// map (v2 paths): a timer's `zblk policy` does it, not the daemon.
    policy_cgroups: Option<Spanned<Vec<String>>>,
    /// The idle policy acts on the pages no process of these cgroups
    /// maps.
    policy_exclude_cgroups: Option<Spanned<Vec<String>>>,
    /// Like `--algo-params` (zram's `algorithm_params`): `dict=PATH`,
    /// with `priority=N` or `algo=NAME` for a recompression algorithm;
    /// several separated by `;`.
    algorithm_params: Option<Spanned<String>>,
    /// Like `--io-threads`: I/O threads per queue.
    io_threads: Option<Spanned<i64>>,
    /// Like `--queue-cpus`: queue, other or any.
    queue_cpus: Option<Spanned<String>>,
    /// Like `--poll-us`: the queue threads' busy-poll window in µs.
    poll_us: Option<Spanned<i64>>,
    /// Like `--compress-workers`: threads compressing a request's groups
    /// beside its queue thread.
    compress_workers: Option<Spanned<i64>>,
    /// MB or `"none"`: no device on a machine with more memory
    /// (zram-generator's key of that name).
    host_memory_limit: Option<Spanned<toml::Value>>,
}

/// A device the file asks for, ready for `zblk add --swap`'s code.
#[derive(Debug)]
pub struct Entry {
    /// The section name, `ublkbN`.
    pub name: String,
    /// The `size` as written.
    pub size_expr: String,
    /// The `mem-limit` as written when it is an expression of `ram`.
    pub mem_limit_expr: Option<String>,
    /// What `zblk add` would have parsed its flags into (`swap` set, but
    /// for a filesystem).
    pub add: AddArgs,
    /// The discard policy from `options` (swap only).
    pub discard: Discard,
    /// The filesystem, for a section with `mount-point`: no swap then.
    pub mount: Option<Mount>,
    /// `host-memory-limit` in MB: none for `"none"` or no key.
    pub host_memory_limit: Option<u64>,
    /// The idle policy limited to or excluding cgroups: `zblk policy`'s,
    /// run by a timer; the daemon's own is off then.
    pub policy: Option<CgroupPolicy>,
}

/// The idle policy of a section with `policy-cgroups` or
/// `policy-exclude-cgroups`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupPolicy {
    /// Whose pages.
    pub filter: CgroupFilter,
    /// Recompress its pages not accessed for this many seconds (0: no).
    pub recompress_after: u64,
    /// Write back its pages not accessed for this many seconds (0: no).
    pub writeback_after: u64,
}

impl Entry {
    /// Why this device is not made on a machine with `ram_mb` MB of
    /// memory, if it is not: more than its `host-memory-limit`.
    pub fn skip_reason(&self, ram_mb: f64) -> Option<String> {
        let limit = self.host_memory_limit?;
        // Whole MB, as zram-generator compares.
        let ram = ram_mb.floor();
        (ram > limit as f64).then(|| {
            format!("this machine's {ram} MB of memory is more than host-memory-limit = {limit}")
        })
    }
}

/// Where drop-in files are read from, in rising precedence: a file in a
/// later directory replaces the file of the same name in an earlier one
/// (zram-generator's `zram-generator.conf.d`).
pub const DROP_IN_DIRS: [&str; 2] = ["/usr/lib/zblk/zblk.conf.d", "/etc/zblk/zblk.conf.d"];

/// The drop-ins found, and what kept a directory from being read.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct DropIns {
    /// The files, in the order they are read.
    pub files: Vec<PathBuf>,
    /// One line for each directory that could not be read (all of it or
    /// the rest of it), which setup goes on without.
    pub warnings: Vec<String>,
}

/// The drop-ins of `dirs` in the order they are read: the `*.conf` files
/// sorted by name across the directories, a file of a later directory
/// replacing a same-named one of an earlier one. A directory that is not
/// there has none; one that cannot be read (permission denied) is a
/// warning and no drop-ins, as systemd skips its own unreadable
/// drop-in directories: the machine still gets the devices of the files
/// it can read.
pub fn drop_ins(dirs: &[PathBuf]) -> DropIns {
    let mut by_name = BTreeMap::new();
    let mut warnings = Vec::new();
    for dir in dirs {
        if let Err(e) = add_drop_ins(dir, &mut by_name) {
            warnings.push(format!(
                "cannot read {}: {e}: its drop-ins are left out",
                dir.display()
            ));
        }
    }
    DropIns {
        files: by_name.into_values().collect(),
        warnings,
    }
}

/// The drop-ins of [`DROP_IN_DIRS`], each directory that cannot be read
/// logged as a warning.
pub fn default_drop_ins() -> Vec<PathBuf> {
    let found = drop_ins(&DROP_IN_DIRS.map(PathBuf::from));
    for w in &found.warnings {
        log::warn!("{w}");
    }
    found.files
}

/// Adds the `*.conf` files of `dir` to `by_name`, replacing those of the
/// same name; none when `dir` is not there.
fn add_drop_ins(
    dir: &Path,
    by_name: &mut BTreeMap<std::ffi::OsString, PathBuf>,
) -> std::io::Result<()> {
    let list = match std::fs::read_dir(dir) {
        Ok(list) => list,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for f in list {
        let f = f?;
        let path = f.path();
        // Hidden files (an editor's lock or backup file) are not
        // drop-ins, as zram-generator's reader skips them too.
        let hidden = f.file_name().to_string_lossy().starts_with('.');
        if !hidden && path.extension().is_some_and(|x| x == "conf") {
            by_name.insert(f.file_name(), path);
        }
    }
    Ok(())
}

/// A configuration as read: its entries, and the files they came from.
#[derive(Debug)]
pub struct Config {
    /// The devices, by id.
    pub entries: Vec<Entry>,
    /// The files read, in order: the main file (unless missing), then
    /// the drop-ins.
    pub files: Vec<PathBuf>,
}

/// Reads `file` and then each of `drop_ins`, with `ram_mb` the machine's
/// memory for `size`. With no drop-ins to look for (`None`: a file named
/// by `--config`, read alone) `file` must be there. Otherwise it may be
/// missing, as zram-generator's own file may: then the drop-ins alone are
/// the configuration, and with none either there is none (no entries),
/// as when nothing of it exists.
pub fn read(file: &Path, drop_ins: Option<&[PathBuf]>, ram_mb: f64) -> Result<Config, String> {
    let mut texts = Vec::new();
    match std::fs::read_to_string(file) {
        Ok(text) => texts.push((file.to_path_buf(), text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && drop_ins.is_some() => {}
        Err(e) => return Err(format!("cannot read {}: {e}", file.display())),
    }
    for f in drop_ins.unwrap_or_default() {
        let text =
            std::fs::read_to_string(f).map_err(|e| format!("cannot read {}: {e}", f.display()))?;
        texts.push((f.clone(), text));
    }
    let files: Vec<(&Path, &str)> = texts
        .iter()
        .map(|(f, t)| (f.as_path(), t.as_str()))
        .collect();
    Ok(Config {
        entries: parse_files(&files, ram_mb)?,
        files: texts.into_iter().map(|(f, _)| f).collect(),
    })
}

/// Parses the text of `file`; the first error is one line naming the
/// file, the line and the key.
pub fn parse(file: &Path, text: &str, ram_mb: f64) -> Result<Vec<Entry>, String> {
    parse_files(&[(file, text)], ram_mb)
}

/// Parses files in order, each key of a later file's section replacing
/// the same key of an earlier one; a later file may add sections. Each
/// value is checked in the file that writes it, and an error names it.
pub fn parse_files(files: &[(&Path, &str)], ram_mb: f64) -> Result<Vec<Entry>, String> {
    let mut parts: BTreeMap<String, Part> = BTreeMap::new();
    for &(file, text) in files {
        let doc = Doc { file, text };
        let sections: BTreeMap<Spanned<String>, Spanned<Section>> =
            toml::from_str(text).map_err(|e| doc.toml_error(&e))?;
        for (name, s) in sections {
            let part = doc.part(&name, s.into_inner(), ram_mb)?;
            match parts.get_mut(name.get_ref()) {
                Some(earlier) => earlier.keys.extend(part.keys),
                None => {
                    parts.insert(name.into_inner(), part);
                }
            }
        }
    }
    one_device_per_mount_point(&parts)?;
    let mut entries = parts
        .into_iter()
        .map(|(name, part)| part.finish(name))
        .collect::<Result<Vec<_>, _>>()?;
    entries.sort_by_key(|e| e.add.dev.id);
    Ok(entries)
}

/// Two sections may not mount on the same place.
fn one_device_per_mount_point(parts: &BTreeMap<String, Part>) -> Result<(), String> {
    let mut seen: BTreeMap<&Path, &str> = BTreeMap::new();
    for (name, part) in parts {
        let Some(Setting::MountPoint(point)) = part.keys.get("mount-point") else {
            continue;
        };
        if let Some(first) = seen.insert(point, name) {
            return Err(format!(
                "{}: [{}]: mount-point = \"{}\" is [{first}]'s already",
                part.at,
                super::base::escape_controls(name),
                super::base::escape_controls(&point.to_string_lossy())
            ));
        }
    }
    Ok(())
}

/// Evaluates an expression of `ram` in MB into bytes (not yet rounded);
/// an error unless a size: finite, not negative, below 2^64 bytes.
fn eval_bytes(expr: &str, ram_mb: f64) -> Result<f64, String> {
    use evalexpr::{ContextWithMutableVariables, DefaultNumericTypes, HashMapContext, Value};
    let mut ctx = HashMapContext::<DefaultNumericTypes>::new();
    ctx.set_value("ram".into(), Value::Float(ram_mb))
        .map_err(|e| e.to_string())?;
    // evalexpr's message may quote what it read (a backslash and the
    // newline after it): escaped like the expression, so one line.
    let mb = evalexpr::eval_number_with_context(expr, &ctx).map_err(|e| {
        format!(
            "bad size expression '{}': {}",
            super::base::escape_controls(expr),
            super::base::escape_controls(&e.to_string())
        )
    })?;
    let bytes = mb * 1024.0 * 1024.0;
    if !bytes.is_finite() || bytes < 0.0 || bytes >= u64::MAX as f64 {
        return Err(format!(
            "size '{}' is {mb} MB: not a size (ram = {ram_mb} MB)",
            super::base::escape_controls(expr)
        ));
    }
    Ok(bytes)
}

/// Evaluates a `size` expression: MB, with `ram` the machine's memory in
/// MB; the bytes rounded down to 4 KB, at least one page.
pub fn eval_size(expr: &str, ram_mb: f64) -> Result<u64, String> {
    eval_bytes(expr, ram_mb).map(|b| (b as u64 / PAGE * PAGE).max(PAGE))
}

/// Evaluates a `mem-limit` expression as [`eval_size`] does, except that
/// 0 stays 0 (no limit), as zram-generator's `zram-resident-limit`.
pub fn eval_mem_limit(expr: &str, ram_mb: f64) -> Result<u64, String> {
    let bytes = eval_bytes(expr, ram_mb)?;
    // Below one page but above 0 is still a limit: the smallest one.
    Ok(if bytes <= 0.0 {
        0
    } else {
        (bytes as u64 / PAGE * PAGE).max(PAGE)
    })
}

/// Whether a `mem-limit` string is an expression of `ram` in MB rather
/// than a size as `--mem-limit` takes it (`"2G"`, `"4096"`: bytes): it is
/// when it names `ram` or holds an operator or a parenthesis, none of
/// which a size has.
pub fn is_expression(text: &str) -> bool {
    text.contains("ram") || text.contains(['+', '-', '*', '/', '%', '^', '(', ')'])
}

/// The machine's memory in MB, from `/proc/meminfo`.
pub fn ram_mb() -> Result<f64, String> {
    zblk_ublk::params::mem_total()
        .map(|b| b as f64 / (1024.0 * 1024.0))
        .ok_or_else(|| "cannot read MemTotal from /proc/meminfo".to_string())
}

/// The file being read, for errors that name its lines.
struct Doc<'a> {
    file: &'a Path,
    text: &'a str,
}

impl Doc<'_> {
    /// `file:line: key: message` for a byte range of the text.
    fn error_at(&self, span: Range<usize>, key: &str, msg: &str) -> String {
        let line = self.line_of(span.start);
        // A section name is a TOML key: quoted, it can hold any character.
        let (key, msg) = (
            super::base::escape_controls(key),
            super::base::escape_controls(msg),
        );
        format!("{}:{line}: {key}: {msg}", self.file.display())
    }

    /// 1-based line of byte `offset`.
    fn line_of(&self, offset: usize) -> usize {
        let end = offset.min(self.text.len());
        self.text.as_bytes()[..end]
            .iter()
            .filter(|&&b| b == b'\n')
            .count()
            + 1
    }

    /// A TOML or serde error, with the key read back from its line (the
    /// `toml` crate's error carries the span but not the key path).
    fn toml_error(&self, e: &toml::de::Error) -> String {
        let text = super::base::escape_controls(e.message().trim());
        let mut msg = text.as_str();
        if msg.ends_with("expected struct Section") {
            // A key = value before the first section header.
            msg = "every setting belongs to a section: [ublkb0] for /dev/ublkb0";
        }
        let Some(span) = e.span() else {
            return format!("{}: {msg}", self.file.display());
        };
        match self.key_at(span.start) {
            Some(key) => self.error_at(span, &key, msg),
            None => format!(
                "{}:{}: {msg}",
                self.file.display(),
                self.line_of(span.start)
            ),
        }
    }

    /// `section.key` (or `[section]`) of the line holding byte `offset`.
    fn key_at(&self, offset: usize) -> Option<String> {
        let n = self.line_of(offset);
        let lines: Vec<&str> = self.text.lines().collect();
        let here = lines.get(n - 1)?.trim();
        if here.starts_with('[') {
            return printable(here).then(|| here.to_string());
        }
        let key = here.split_once('=')?.0.trim();
        if key.is_empty() || key.starts_with('#') || !printable(key) {
            return None;
        }
        let section = lines[..n - 1]
            .iter()
            .rev()
            .map(|l| l.trim())
            .find(|l| l.starts_with('['))
            .map(|l| l.trim_matches(|c| c == '[' || c == ']').trim())
            .filter(|s| printable(s));
        Some(match section {
            Some(s) => format!("{s}.{key}"),
            None => key.to_string(),
        })
    }

    /// One section of this file, each value checked alone as its
    /// `zblk add --swap` flag, by key (for later files to override).
    fn part(&self, name: &Spanned<String>, mut s: Section, ram_mb: f64) -> Result<Part, String> {
        let sect = name.get_ref();
        let key = |k: &str| format!("{sect}.{k}");
        let id = section_id(sect)
            .ok_or_else(|| self.error_at(name.span(), &format!("[{sect}]"), NAME_HELP))?;
        // The id is added once every file is read; checked here, where
        // the header is.
        self.flag("--id", id.to_string(), name.span(), &format!("[{sect}]"))?;
        let mut keys = BTreeMap::new();
        if let Some(size) = s.size.take() {
            keys.insert("size", self.size(size, ram_mb, &key("size"))?);
        }
        if let Some(v) = s.mem_limit.take() {
            keys.insert("mem-limit", self.mem_limit(v, ram_mb, &key("mem-limit"))?);
        }
        for (k, flag, v) in plain_flags(&mut s) {
            if let Some((v, span)) = v {
                keys.insert(k, self.flag(flag, v, span, &key(k))?);
            }
        }
        keys.extend(self.others(s, &key)?);
        let at = format!(
            "{}:{}",
            self.file.display(),
            self.line_of(name.span().start)
        );
        Ok(Part { at, keys })
    }

    /// The keys that are not `zblk add` flags of their own, checked.
    fn others(
        &self,
        s: Section,
        key: &dyn Fn(&str) -> String,
    ) -> Result<Vec<(&'static str, Setting)>, String> {
        let mut keys = Vec::new();
        if let Some(v) = s.host_memory_limit {
            let limit = host_limit(v.get_ref())
                .map_err(|e| self.error_at(v.span(), &key("host-memory-limit"), e))?;
            keys.push(("host-memory-limit", Setting::HostLimit(limit)));
        }
        if let Some(o) = s.options {
            // Swap or mount options: that depends on mount-point, which
            // a later file may write; checked once every file is read.
            let at = format!("{}:{}", self.file.display(), self.line_of(o.span().start));
            keys.push(("options", Setting::Options(o.into_inner(), at)));
        }
        if let Some(p) = s.mount_point {
            let point = fs::mount_point(p.get_ref())
                .map_err(|e| self.error_at(p.span(), &key("mount-point"), &e))?;
            keys.push(("mount-point", Setting::MountPoint(point)));
        }
        if let Some(t) = s.fs_type {
            let fs = FsType::parse(t.get_ref())
                .map_err(|e| self.error_at(t.span(), &key("fs-type"), &e))?;
            keys.push(("fs-type", Setting::FsType(fs)));
        }
        for (k, v, except) in [
            ("policy-cgroups", s.policy_cgroups, false),
            ("policy-exclude-cgroups", s.policy_exclude_cgroups, true),
        ] {
            let Some(v) = v else { continue };
            let span = v.span();
            let list = v
                .into_inner()
                .iter()
                .map(|p| cgroup_path(p))
                .collect::<Result<Vec<_>, _>>()
                .and_then(|l| match l.is_empty() {
                    true => Err("names no cgroup".to_string()),
                    false => Ok(l),
                })
                .map_err(|e| self.error_at(span, &key(k), &e))?;
            let f = match except {
                true => CgroupFilter::Except(list),
                false => CgroupFilter::Only(list),
            };
            keys.push((k, Setting::Cgroups(f)));
        }
        if let Some(r) = s.recovery {
            // Written either way: true in a drop-in undoes an earlier false.
            let words = if r {
                vec![]
            } else {
                vec!["--no-recovery".into()]
            };
            keys.push(("recovery", Setting::Flag(words, None)));
        }
        Ok(keys)
    }

    /// One flag and its value, checked by `zblk add`'s parser alone.
    fn flag(
        &self,
        flag: &str,
        v: String,
        span: Range<usize>,
        key: &str,
    ) -> Result<Setting, String> {
        add_args(&[flag, &v]).map_err(|e| self.error_at(span, key, &e))?;
        Ok(Setting::Flag(vec![flag.into(), v], None))
    }

    /// `size`, evaluated: `--size` in bytes, with the expression.
    fn size(&self, v: Spanned<toml::Value>, ram_mb: f64, key: &str) -> Result<Setting, String> {
        let span = v.span();
        let expr = match v.get_ref() {
            toml::Value::String(_) | toml::Value::Integer(_) | toml::Value::Float(_) => {
                value_text(v.get_ref())
            }
            _ => return Err(self.error_at(span, key, SIZE_HELP)),
        };
        let bytes = eval_size(&expr, ram_mb)
            .map_err(|e| self.error_at(span.clone(), key, &e))?
            .to_string();
        add_args(&["--size", &bytes]).map_err(|e| self.error_at(span, key, &e))?;
        Ok(Setting::Flag(vec!["--size".into(), bytes], Some(expr)))
    }

    /// `mem-limit` as `--mem-limit` takes it, with its expression when it
    /// is one: evaluated here, since the flag takes bytes.
    fn mem_limit(
        &self,
        v: Spanned<toml::Value>,
        ram_mb: f64,
        key: &str,
    ) -> Result<Setting, String> {
        let span = v.span();
        match v.into_inner() {
            toml::Value::String(e) if is_expression(&e) => {
                let bytes = eval_mem_limit(&e, ram_mb)
                    .map_err(|err| self.error_at(span.clone(), key, &err))?;
                let words = vec!["--mem-limit".into(), bytes.to_string()];
                Ok(Setting::Flag(words, Some(e)))
            }
            other => self.flag("--mem-limit", value_text(&other), span, key),
        }
    }
}

/// A section as one file writes it, each key checked alone.
struct Part {
    /// `file:line` of its header, for errors about the whole section.
    at: String,
    /// Its settings by key: a later file's replace an earlier one's.
    keys: BTreeMap<&'static str, Setting>,
}

/// One key's value, checked alone.
enum Setting {
    /// Words for `zblk add --swap`, and the expression of `ram` written
    /// when the value is one (for `--dry-run`).
    Flag(Vec<String>, Option<String>),
    /// `options` as written, and `file:line` where, for its error.
    Options(String, String),
    /// `mount-point`, checked.
    MountPoint(PathBuf),
    /// `fs-type`.
    FsType(FsType),
    /// `host-memory-limit` in MB (`None`: `"none"`).
    HostLimit(Option<u64>),
    /// `policy-cgroups` or `policy-exclude-cgroups`, checked.
    Cgroups(CgroupFilter),
}

impl Part {
    /// The device section `sect` makes once every file is read: its
    /// words through `zblk add --swap`'s parser together.
    fn finish(self, sect: String) -> Result<Entry, String> {
        let Part { at, keys } = self;
        let size_expr = match keys.get("size") {
            Some(Setting::Flag(_, Some(expr))) => expr.clone(),
            _ => return Err(format!("{at}: [{sect}]: {SIZE_MISSING}")),
        };
        let id = section_id(&sect).unwrap_or(0);
        let mut words = vec!["--id".to_string(), id.to_string()];
        let (mut host_memory_limit, mut mem_limit_expr) = (None, None);
        let (mut options, mut point, mut fs_type) = (None, None, None);
        let swap_priority = keys.contains_key("swap-priority");
        if keys.contains_key("policy-cgroups") && keys.contains_key("policy-exclude-cgroups") {
            return Err(format!("{at}: [{sect}]: {BOTH_FILTERS}"));
        }
        let mut filter = None;
        for (k, setting) in keys {
            match setting {
                Setting::Flag(w, expr) => {
                    words.extend(w);
                    if k == "mem-limit" {
                        mem_limit_expr = expr;
                    }
                }
                Setting::Options(text, line) => options = Some((text, line)),
                Setting::MountPoint(p) => point = Some(p),
                Setting::FsType(t) => fs_type = Some(t),
                Setting::HostLimit(h) => host_memory_limit = h,
                Setting::Cgroups(f) => filter = Some(f),
            }
        }
        let words: Vec<&str> = words.iter().map(String::as_str).collect();
        let mut add = add_args(&words)
            .map_err(|e| format!("{at}: {sect}: {}", super::base::escape_controls(&e)))?;
        let options_error = |line: &str, e: &str| {
            format!(
                "{line}: {sect}.options: {}",
                super::base::escape_controls(e)
            )
        };
        let (mut discard, mut mount) = (Discard::Both, None);
        match (point, fs_type) {
            (Some(point), fs_type) => {
                if swap_priority {
                    return Err(format!("{at}: [{sect}]: {SWAP_AND_MOUNT}"));
                }
                let options = match options {
                    Some((text, line)) => {
                        fs::mount_options(&text).map_err(|e| options_error(&line, &e))?
                    }
                    None => fs::DEFAULT_MOUNT_OPTIONS.to_string(),
                };
                let fs = fs_type.unwrap_or(fs::DEFAULT_FS);
                mount = Some(Mount { point, fs, options });
                add.swap = false;
            }
            (None, Some(_)) => return Err(format!("{at}: [{sect}]: {FS_WITHOUT_MOUNT}")),
            (None, None) => {
                if let Some((text, line)) = options {
                    discard = Discard::from_options(&text).map_err(|e| options_error(&line, &e))?;
                }
            }
        }
        let policy = match filter {
            Some(filter) => {
                Some(cgroup_policy(&mut add, filter).map_err(|e| format!("{at}: [{sect}]: {e}"))?)
            }
            None => None,
        };
        Ok(Entry {
            name: sect,
            size_expr,
            mem_limit_expr,
            add,
            discard,
            mount,
            host_memory_limit,
            policy,
        })
    }
}

/// The idle policy of a section with the cgroup filter `filter`: its
/// ages, taken out of the daemon's settings (`add`), which cannot read
/// page tables.
fn cgroup_policy(add: &mut AddArgs, filter: CgroupFilter) -> Result<CgroupPolicy, &'static str> {
    let p = CgroupPolicy {
        filter,
        recompress_after: std::mem::take(&mut add.dev.recompress_idle_after),
        writeback_after: std::mem::take(&mut add.dev.writeback_idle_after),
    };
    if p.recompress_after == 0 && p.writeback_after == 0 {
        return Err(FILTER_WITHOUT_POLICY);
    }
    Ok(p)
}

/// A section with both cgroup keys.
const BOTH_FILTERS: &str = "policy-cgroups and policy-exclude-cgroups exclude each other";

/// A section with a cgroup key and no policy.
const FILTER_WITHOUT_POLICY: &str = "policy-cgroups and policy-exclude-cgroups need \
    recompress-idle-after or writeback-idle-after: they limit the idle policy";

/// A cgroup of `policy-cgroups` as written: a v2 path from the root
/// (`/` alone is every cgroup), its trailing slash dropped.
fn cgroup_path(p: &str) -> Result<String, String> {
    if !p.starts_with('/') || !printable(p) || p.split('/').any(|c| c == "." || c == "..") {
        return Err(format!(
            "'{}' is not a cgroup: a v2 path from the root, as /proc/PID/cgroup says it \
             (\"/system.slice/batch.service\")",
            super::base::escape_controls(p)
        ));
    }
    Ok(p.trim_end_matches('/').to_string())
}

/// A section with both.
const SWAP_AND_MOUNT: &str = "swap-priority and mount-point exclude each other: \
    with mount-point the device is a filesystem, not swap";

/// A section with fs-type alone.
const FS_WITHOUT_MOUNT: &str = "fs-type needs mount-point: without it the device is swap";

/// The keys that are a `zblk add` flag taking the value as written:
/// key, flag, value (taken out of `s`).
fn plain_flags(s: &mut Section) -> [(&'static str, &'static str, Option<FlagValue>); 13] {
    [
        (
            "compression-algorithm",
            "--algo",
            text(s.compression_algorithm.take()),
        ),
        ("mode", "--mode", text(s.mode.take())),
        ("group-pages", "--group-pages", num(s.group_pages.take())),
        ("swap-priority", "--priority", num(s.swap_priority.take())),
        ("backing-dev", "--backing-dev", text(s.backing_dev.take())),
        (
            "recompress-idle-after",
            "--recompress-idle-after",
            num(s.recompress_idle_after.take()),
        ),
        (
            "recompress-algorithm",
            "--recompress-algos",
            text(s.recompress_algorithm.take()),
        ),
        (
            "writeback-idle-after",
            "--writeback-idle-after",
            num(s.writeback_idle_after.take()),
        ),
        (
            "algorithm-params",
            "--algo-params",
            text(s.algorithm_params.take()),
        ),
        ("io-threads", "--io-threads", num(s.io_threads.take())),
        ("queue-cpus", "--queue-cpus", text(s.queue_cpus.take())),
        ("poll-us", "--poll-us", num(s.poll_us.take())),
        (
            "compress-workers",
            "--compress-workers",
            num(s.compress_workers.take()),
        ),
    ]
}

/// A value as its flag takes it, with the byte range it was written at.
type FlagValue = (String, Range<usize>);

/// Whether text read back from the file can go into a one-line error:
/// a carriage return or other control character would break the line or
/// overwrite the file name on a terminal.
fn printable(text: &str) -> bool {
    !text.chars().any(char::is_control)
}

/// What `size` must be.
const SIZE_HELP: &str = "must be MB: a number, or an expression of ram in quotes";

/// `host-memory-limit`: MB, a number not below 0, or `"none"` (which
/// zram-generator takes to undo a limit set earlier).
fn host_limit(v: &toml::Value) -> Result<Option<u64>, &'static str> {
    const HELP: &str = "must be MB, a whole number of 0 or more, or \"none\"";
    match v {
        toml::Value::String(s) if s == "none" => Ok(None),
        toml::Value::Integer(n) => u64::try_from(*n).map(Some).map_err(|_| HELP),
        _ => Err(HELP),
    }
}

/// What a section without `size` lacks.
const SIZE_MISSING: &str =
    "missing field `size`: every section needs size = MB, in this file or a drop-in";

/// What a section must be called.
const NAME_HELP: &str = "a section is named after the device it makes: [ublkb0] for /dev/ublkb0";

/// N of a section named `ublkbN` (digits only, no sign or leading zero).
fn section_id(name: &str) -> Option<u32> {
    let digits = name.strip_prefix("ublkb")?;
    let ok = !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && (digits == "0" || !digits.starts_with('0'));
    ok.then(|| digits.parse().ok()).flatten()
}

/// A number or a string as the text a flag takes.
fn value_text(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn text(v: Option<Spanned<String>>) -> Option<FlagValue> {
    v.map(|v| (v.get_ref().clone(), v.span()))
}

fn num(v: Option<Spanned<i64>>) -> Option<FlagValue> {
    v.map(|v| (v.get_ref().to_string(), v.span()))
}

/// `zblk add --swap` with these flags, through its own parsers; a
/// refusal is the parser's reason alone (not clap's whole message, which
/// names a flag the file does not have).
fn add_args(flags: &[&str]) -> Result<AddArgs, String> {
    let cmd = AddArgs::augment_args(clap::Command::new("zblk"));
    let mut words = vec!["zblk", "--swap"];
    if !flags.contains(&"--size") {
        // Checking one value alone: any valid size.
        words.extend(["--size", "4096"]);
    }
    words.extend_from_slice(flags);
    let m = cmd.try_get_matches_from(words).map_err(|e| reason(&e))?;
    AddArgs::from_arg_matches(&m).map_err(|e| reason(&e))
}

/// The value parser's own words if it gave any; for a value not among a
/// setting's choices, the value and the choices (clap's line would name
/// the flag, which the file does not have); else clap's line.
fn reason(e: &clap::Error) -> String {
    use clap::error::{ContextKind, ContextValue};
    if let Some(src) = std::error::Error::source(e) {
        return src.to_string();
    }
    match (
        e.get(ContextKind::InvalidValue),
        e.get(ContextKind::ValidValue),
    ) {
        (Some(ContextValue::String(v)), Some(ContextValue::Strings(ok))) => {
            format!("invalid value '{v}' (one of: {})", ok.join(", "))
        }
        _ => super::base::one_line(&e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zblk::{Algo, Mode};
    use zblk_ublk::placement::QueueCpus;

    const FILE: &str = "/etc/zblk/zblk.conf";

    fn parse_ok(text: &str, ram_mb: f64) -> Vec<Entry> {
        parse(Path::new(FILE), text, ram_mb).unwrap()
    }

    fn parse_err(text: &str) -> String {
        parse(Path::new(FILE), text, 16384.0).unwrap_err()
    }

    #[test]
    fn a_sample_file_becomes_add_swap_arguments() {
        let text = "# swap for this machine\n\
                    [ublkb1]\n\
                    size = 512\n\
                    \n\
                    [ublkb0]\n\
                    size = \"min(ram / 2, 4096)\"\n\
                    compression-algorithm = \"zstd:3\"\n\
                    mode = \"packed\"\n\
                    group-pages = 4\n\
                    mem-limit = \"1G\"\n\
                    swap-priority = 50\n\
                    options = \"discard=pages\"\n\
                    recovery = false\n\
                    backing-dev = \"/dev/vdb\"\n\
                    recompress-idle-after = 600\n\
                    recompress-algorithm = \"lz4hc zstd:9\"\n\
                    writeback-idle-after = 3600\n\
                    algorithm-params = \"dict=/etc/zblk/a.dict; priority=2 dict=/etc/zblk/b.dict\"\n\
                    io-threads = 2\n\
                    queue-cpus = \"other\"\n\
                    poll-us = 300\n\
                    compress-workers = 1\n";
        let e = parse_ok(text, 16000.0);
        assert_eq!(e.len(), 2);
        let (a, b) = (&e[0], &e[1]);
        assert_eq!((a.name.as_str(), a.add.dev.id), ("ublkb0", Some(0)));
        assert_eq!(a.size_expr, "min(ram / 2, 4096)");
        assert_eq!(a.add.dev.size, 4096 << 20);
        assert_eq!(a.add.dev.engine.algo, Algo::Zstd(3));
        assert_eq!(a.add.dev.engine.mode, Mode::Packed);
        assert_eq!(a.add.dev.engine.group_pages, 4);
        assert_eq!(a.add.dev.mem_limit, 1 << 30);
        assert!(a.add.swap && a.add.dev.no_recovery);
        assert_eq!((a.add.priority, a.discard), (50, Discard::Pages));
        assert_eq!(
            a.add.dev.backing_dev.as_deref(),
            Some(Path::new("/dev/vdb"))
        );
        assert_eq!(b.add.dev.backing_dev, None);
        let d = &a.add.dev;
        assert_eq!(
            (d.recompress_idle_after, d.writeback_idle_after),
            (600, 3600)
        );
        assert_eq!(
            d.recompress_algo.map(|l| l.to_string()).as_deref(),
            Some("lz4hc zstd:9")
        );
        let params: Vec<String> = d.algo_params.iter().map(|p| p.to_string()).collect();
        assert_eq!(
            params,
            ["dict=/etc/zblk/a.dict", "priority=2 dict=/etc/zblk/b.dict"]
        );
        assert_eq!(
            (b.add.dev.recompress_idle_after, b.add.dev.recompress_algo),
            (0, None)
        );
        assert!(b.add.dev.algo_params.is_empty());
        assert_eq!((d.io_threads, b.add.dev.io_threads), (2, 1));
        assert_eq!(
            (d.queue_cpus, b.add.dev.queue_cpus),
            (QueueCpus::Other, QueueCpus::Queue)
        );
        assert_eq!((d.poll_us, b.add.dev.poll_us), (300, 0));
        assert_eq!(
            (d.engine.compress_workers, b.add.dev.engine.compress_workers),
            (1, 0)
        );
        // What is not written takes zblk add's defaults.
        assert_eq!((b.name.as_str(), b.add.dev.id), ("ublkb1", Some(1)));
        assert_eq!(b.add.dev.size, 512 << 20);
        assert_eq!(b.add.dev.engine.algo, Algo::Lz4);
        assert_eq!(b.add.dev.engine.mode, Mode::PerPage);
        assert_eq!((b.add.dev.engine.group_pages, b.add.dev.mem_limit), (8, 0));
        assert_eq!((b.add.priority, b.discard), (100, Discard::Both));
        assert!(b.add.swap && !b.add.dev.no_recovery && !b.add.foreground);
        // A file of comments only makes no device.
        assert!(parse_ok("# nothing here\n", 1.0).is_empty());
    }

    /// The files the package ships: the example makes two devices, the
    /// conffile (all comments) none.
    #[test]
    fn the_shipped_files_parse() {
        let ex = include_str!("../../../dist/zblk.conf.example");
        let e = parse_ok(ex, 16384.0);
        let names: Vec<&str> = e.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["ublkb0", "ublkb1"]);
        assert_eq!(e[0].add.dev.size, 4096 << 20);
        assert_eq!(e[0].add.dev.engine.algo, Algo::Zstd(3));
        assert_eq!(e[1].add.dev.size, 2048 << 20);
        assert_eq!(e[1].add.dev.mem_limit, 512 << 20);
        assert!(parse_ok(include_str!("../../../dist/zblk.conf"), 16384.0).is_empty());
        // Its commented-out filesystem section parses once uncommented.
        let fs_part = ex.split_once("#[ublkb2]").map_or("", |(_, rest)| rest);
        let fs_text: String = fs_part
            .lines()
            .map(|l| format!("{}\n", l.trim_start_matches('#')))
            .collect();
        let e = parse_ok(&format!("[ublkb2]{fs_text}"), 16384.0);
        let m = e[0].mount.clone().unwrap();
        assert_eq!(
            (m.point.as_path(), m.fs, m.options.as_str()),
            (
                Path::new("/var/tmp/zblk"),
                FsType::Ext4,
                "discard,nodev,nosuid"
            )
        );
    }

    #[test]
    fn size_expressions() {
        assert_eq!(eval_size("ram / 2", 8000.0), Ok(4000 << 20));
        assert_eq!(eval_size("min(ram / 2, 4096)", 16384.0), Ok(4096 << 20));
        assert_eq!(eval_size("min(ram / 2, 4096)", 2048.0), Ok(1024 << 20));
        assert_eq!(eval_size("8192", 1.0), Ok(8192 << 20));
        assert_eq!(eval_size("max(ram * 0.25, 1)", 1000.0), Ok(250 << 20));
        // Rounded down to 4 KB, at least one page.
        assert_eq!(eval_size("ram / 3", 1.0), Ok(349_525 / 4096 * 4096));
        assert_eq!(eval_size("0.0001", 1.0), Ok(4096));
        assert!(eval_size("ram - 2 * ram", 8.0)
            .unwrap_err()
            .contains("not a size"));
        assert!(eval_size("ram / 0", 8.0).is_err());
        // Found by the setup_conf fuzz target: an expression over lines
        // (a TOML multi-line string) made an error over lines.
        let e = eval_size("ram\n/ x", 8.0).unwrap_err();
        assert!(e.starts_with("bad size expression 'ram\\n/ x'"), "{e}");
        let e = parse_err("[ublkb0]\nsize = \"\"\"\nram\r\n/ 0\n\"\"\"\n");
        assert!(!e.contains(['\n', '\r']), "{e:?}");
        assert!(
            e.starts_with("/etc/zblk/zblk.conf:2: ublkb0.size: "),
            "{e:?}"
        );
        let e = eval_size("rom / 2", 8.0).unwrap_err();
        assert!(e.starts_with("bad size expression 'rom / 2'"), "{e}");
        // An input the setup_conf fuzz target found: evalexpr's own
        // message quotes a backslash and the newline after it.
        let e = eval_size("\"a\\\n\"", 8.0).unwrap_err();
        assert!(e.contains("escape"), "{e}");
        assert!(!e.contains(['\n', '\r']), "{e:?}");
    }

    /// `mem-limit`: an expression of `ram` in MB, or a size as
    /// `--mem-limit` takes it (bytes, or with a suffix).
    #[test]
    fn mem_limit_is_a_size_or_an_expression_of_ram() {
        let limit = |v: &str| {
            let text = format!("[ublkb0]\nsize = 64\nmem-limit = {v}\n");
            let e = parse_ok(&text, 8192.0);
            (e[0].add.dev.mem_limit, e[0].mem_limit_expr.clone())
        };
        assert_eq!(limit("\"2G\""), (2 << 30, None));
        assert_eq!(limit("\"4096\""), (4096, None));
        assert_eq!(limit("8192"), (8192, None));
        assert_eq!(limit("0"), (0, None));
        assert_eq!(limit("\"ram / 4\""), (2048 << 20, Some("ram / 4".into())));
        assert_eq!(
            limit("\"min(ram / 2, 1024)\""),
            (1024 << 20, Some("min(ram / 2, 1024)".into()))
        );
        assert_eq!(limit("\"ram * 0\"").0, 0);
        // Above 0 but below one page: the smallest limit, not none.
        assert_eq!(limit("\"ram / 100000000\"").0, PAGE);
        for (v, want) in [
            ("\"ram / 0\"", "ublkb0.mem-limit: "),
            ("\"-ram\"", "ublkb0.mem-limit: size '-ram' is"),
            ("\"(ram\"", "ublkb0.mem-limit: bad size expression '(ram'"),
            ("\"2X\"", "ublkb0.mem-limit: invalid size '2X'"),
        ] {
            let e = parse_err(&format!("[ublkb0]\nsize = 64\nmem-limit = {v}\n"));
            let want = format!("/etc/zblk/zblk.conf:3: {want}");
            assert!(e.starts_with(&want), "{v}: {e}");
        }
        assert!(is_expression("ram") && is_expression("4096 - 1"));
        assert!(!is_expression("2G") && !is_expression("512"));
    }

    #[test]
    fn host_memory_limit_is_mb_or_none() {
        let entry = |v: &str| {
            let text = format!("[ublkb0]\nsize = 64\nhost-memory-limit = {v}\n");
            parse_ok(&text, 8192.0).remove(0)
        };
        assert_eq!(entry("4096").host_memory_limit, Some(4096));
        assert_eq!(entry("\"none\"").host_memory_limit, None);
        let e = entry("4096");
        let why = e.skip_reason(8192.0).unwrap_or_default();
        assert_eq!(
            why,
            "this machine's 8192 MB of memory is more than host-memory-limit = 4096"
        );
        // At or below the limit, and without one, the device is made.
        assert_eq!(e.skip_reason(4096.0), None);
        assert_eq!(entry("\"none\"").skip_reason(1e9), None);
        for bad in ["-1", "\"4G\"", "1.5", "true"] {
            let e = parse_err(&format!("[ublkb0]\nsize = 64\nhost-memory-limit = {bad}\n"));
            assert!(
                e.starts_with("/etc/zblk/zblk.conf:3: ublkb0.host-memory-limit: must be MB"),
                "{bad}: {e}"
            );
        }
    }

    /// A cgroup filter moves the section's idle policy out of the
    /// daemon's settings into `policy`; it needs a policy, and one kind
    /// of list, of absolute paths.
    #[test]
    fn a_cgroup_filter_takes_the_idle_policy_from_the_daemon() {
        let section =
            |keys: &str| format!("[ublkb0]\nsize = 64\nbacking-dev = \"/dev/vdb\"\n{keys}");
        let e = parse_ok(
            &section(
                "recompress-idle-after = 600\nwriteback-idle-after = 3600\n\
                 policy-cgroups = [\"/batch.slice/\", \"/system.slice/a.service\"]\n",
            ),
            4096.0,
        )
        .remove(0);
        assert_eq!(
            e.policy,
            Some(CgroupPolicy {
                filter: CgroupFilter::Only(vec![
                    "/batch.slice".into(),
                    "/system.slice/a.service".into()
                ]),
                recompress_after: 600,
                writeback_after: 3600,
            })
        );
        let d = &e.add.dev;
        assert_eq!((d.recompress_idle_after, d.writeback_idle_after), (0, 0));
        let e = parse_ok(
            &section("writeback-idle-after = 60\npolicy-exclude-cgroups = [\"/user.slice\"]\n"),
            4096.0,
        )
        .remove(0);
        let p = e.policy.unwrap();
        assert_eq!(p.filter, CgroupFilter::Except(vec!["/user.slice".into()]));
        assert_eq!((p.recompress_after, p.writeback_after), (0, 60));
        // Without a filter the daemon keeps its policy.
        let e = parse_ok(&section("recompress-idle-after = 600\n"), 4096.0).remove(0);
        assert_eq!((e.policy, e.add.dev.recompress_idle_after), (None, 600));
        let e = parse_err(&section(
            "writeback-idle-after = 60\npolicy-cgroups = [\"/a\"]\npolicy-exclude-cgroups = [\"/b\"]\n",
        ));
        assert!(e.ends_with(BOTH_FILTERS), "{e}");
        let e = parse_err(&section("policy-cgroups = [\"/a\"]\n"));
        assert!(e.ends_with(FILTER_WITHOUT_POLICY), "{e}");
        for bad in ["\"a.slice\"", "\"/a/../b\"", "\"\""] {
            let e = parse_err(&section(&format!(
                "writeback-idle-after = 60\npolicy-cgroups = [{bad}]\n"
            )));
            assert!(e.contains("ublkb0.policy-cgroups: '"), "{bad}: {e}");
            assert!(e.contains("is not a cgroup"), "{bad}: {e}");
        }
        let e = parse_err(&section("writeback-idle-after = 60\npolicy-cgroups = []\n"));
        assert!(e.contains("ublkb0.policy-cgroups: names no cgroup"), "{e}");
    }

    /// A section with mount-point is a filesystem: not swap, its options
    /// mount options; fs-type ext4 and options "discard" by default.
    #[test]
    fn mount_point_makes_a_filesystem() {
        let text = "[ublkb0]\nsize = 64\noptions = \"discard=once\"\n\
                    [ublkb1]\nsize = 256\nmount-point = \"/var/tmp/zblk/\"\n\
                    [ublkb2]\nsize = 256\nmount-point = \"/srv/x\"\nfs-type = \"xfs\"\n\
                    options = \"noatime,nodev\"\n";
        let e = parse_ok(text, 4096.0);
        assert!(e[0].add.swap && e[0].mount.is_none());
        assert_eq!(e[0].discard, Discard::Once);
        let m = e[1].mount.clone().unwrap();
        assert!(!e[1].add.swap);
        assert_eq!(
            (m.point.as_path(), m.fs, m.options.as_str()),
            (Path::new("/var/tmp/zblk"), FsType::Ext4, "discard")
        );
        let m = e[2].mount.clone().unwrap();
        assert_eq!((m.fs, m.options.as_str()), (FsType::Xfs, "noatime,nodev"));
        // A drop-in may turn a swap section into a filesystem: the
        // options written before are then mount options.
        let files = [
            (
                Path::new(FILE),
                "[ublkb0]\nsize = 64\noptions = \"nodev\"\n",
            ),
            (Path::new(DROP), "[ublkb0]\nmount-point = \"/mnt/z\"\n"),
        ];
        let e = parse_files(&files, 1.0).unwrap();
        assert_eq!(
            e[0].mount.as_ref().map(|m| m.options.as_str()),
            Some("nodev")
        );
    }

    #[test]
    fn a_bad_filesystem_section_says_why_in_one_line() {
        let cases = [
            (
                "mount-point = \"tmp/x\"",
                "3: ublkb0.mount-point: 'tmp/x' is not a plain absolute path",
            ),
            (
                "mount-point = \"/\"",
                "3: ublkb0.mount-point: / cannot be a zblk filesystem",
            ),
            (
                "mount-point = \"/m\"\nfs-type = \"zfs\"",
                "4: ublkb0.fs-type: unknown fs-type 'zfs': one of ext2, ext3, ext4, xfs, btrfs",
            ),
            (
                "mount-point = \"/m\"\noptions = \"a, b\"",
                "4: ublkb0.options: mount options 'a, b' hold a blank",
            ),
            (
                "mount-point = \"/m\"\nswap-priority = 5",
                "1: [ublkb0]: swap-priority and mount-point exclude each other",
            ),
            (
                "fs-type = \"ext4\"",
                "1: [ublkb0]: fs-type needs mount-point",
            ),
        ];
        for (lines, want) in cases {
            let e = parse_err(&format!("[ublkb0]\nsize = 64\n{lines}\n"));
            let want = format!("{FILE}:{want}");
            assert!(e.starts_with(&want), "{lines}: {e}");
            assert!(!e.contains('\n'), "{e:?}");
        }
        let e = parse_err(
            "[ublkb0]\nsize = 64\nmount-point = \"/m\"\n\
             [ublkb1]\nsize = 64\nmount-point = \"/m/\"\n",
        );
        assert_eq!(
            e,
            format!("{FILE}:4: [ublkb1]: mount-point = \"/m\" is [ublkb0]'s already")
        );
    }

    const DROP: &str = "/etc/zblk/zblk.conf.d/50-more.conf";

    /// A drop-in overrides the keys it writes and adds sections.
    #[test]
    fn drop_ins_override_key_by_key() {
        let main = "[ublkb0]\nsize = 1024\ncompression-algorithm = \"zstd\"\n\
                    mode = \"packed\"\nrecovery = false\n";
        let first = "[ublkb0]\ncompression-algorithm = \"lz4\"\nrecovery = true\n\
                     [ublkb2]\nsize = 64\n";
        let second = "[ublkb0]\nsize = \"ram / 4\"\n[ublkb2]\nmem-limit = \"ram / 8\"\n";
        let files = [
            (Path::new(FILE), main),
            (Path::new("/usr/lib/zblk/zblk.conf.d/10-a.conf"), first),
            (Path::new(DROP), second),
        ];
        let e = parse_files(&files, 8192.0).unwrap();
        assert_eq!(e.len(), 2);
        let d = &e[0].add.dev;
        assert_eq!((e[0].size_expr.as_str(), d.size), ("ram / 4", 2048 << 20));
        assert_eq!((d.engine.algo, d.engine.mode), (Algo::Lz4, Mode::Packed));
        assert!(!d.no_recovery, "true in a drop-in undoes false");
        assert_eq!(
            (e[1].name.as_str(), e[1].add.dev.size),
            ("ublkb2", 64 << 20)
        );
        assert_eq!(e[1].add.dev.mem_limit, 1024 << 20);
        // Read the other way round, the earlier values win.
        let e = parse_files(&[files[2], files[1], files[0]], 8192.0).unwrap();
        assert_eq!(
            (e[0].add.dev.size, e[0].add.dev.engine.algo),
            (1024 << 20, Algo::Zstd(1))
        );
    }

    #[test]
    fn an_error_in_a_drop_in_names_it() {
        let files = |drop: &'static str| {
            [
                (Path::new(FILE), "[ublkb0]\nsize = 64\n"),
                (Path::new(DROP), drop),
            ]
        };
        let e = parse_files(&files("\n[ublkb0]\nmode = \"dense\"\n"), 1.0).unwrap_err();
        assert!(
            e.starts_with(&format!("{DROP}:3: ublkb0.mode: unknown mode")),
            "{e}"
        );
        let e = parse_files(&files("[ublkb0]\nzram-size = 1\n"), 1.0).unwrap_err();
        assert!(
            e.starts_with(&format!("{DROP}:2: ublkb0.zram-size: ")),
            "{e}"
        );
        let e = parse_files(&files("[ublkb1]\nmode = \"packed\"\n"), 1.0).unwrap_err();
        assert!(
            e.starts_with(&format!("{DROP}:1: [ublkb1]: missing field `size`")),
            "{e}"
        );
    }

    /// zram-generator's order: by file name across the directories, a
    /// later directory's file replacing a same-named one.
    #[test]
    fn drop_ins_are_sorted_by_name_across_directories() {
        let root = tempfile::tempdir().unwrap();
        let (usr, etc) = (root.path().join("usr"), root.path().join("etc"));
        for (dir, name) in [
            (&usr, "10-a.conf"),
            (&usr, "20-b.conf"),
            (&etc, "20-b.conf"),
            (&etc, "15-c.conf"),
            (&etc, "99-not.txt"),
            // An editor's lock file: hidden, not a drop-in.
            (&etc, ".#15-c.conf"),
        ] {
            std::fs::create_dir_all(dir).unwrap();
            std::fs::write(dir.join(name), "").unwrap();
        }
        let dirs = [usr.clone(), root.path().join("none"), etc.clone()];
        let got = drop_ins(&dirs);
        assert_eq!(
            got.files,
            [
                usr.join("10-a.conf"),
                etc.join("15-c.conf"),
                etc.join("20-b.conf")
            ]
        );
        assert!(got.warnings.is_empty(), "{:?}", got.warnings);
        // The main file may be missing when there are drop-ins.
        std::fs::write(etc.join("15-c.conf"), "[ublkb3]\nsize = 64\n").unwrap();
        let main = root.path().join("zblk.conf");
        let c = read(&main, Some(&got.files), 1.0).unwrap();
        assert_eq!(c.entries[0].name, "ublkb3");
        assert_eq!(c.files, got.files, "the files read: no main file");
        std::fs::write(&main, "[ublkb0]\nsize = 64\n").unwrap();
        let c = read(&main, Some(&got.files), 1.0).unwrap();
        assert_eq!((c.entries.len(), c.files.len(), &c.files[0]), (2, 4, &main));
    }

    /// No main file and no drop-in (none there, or a directory of other
    /// files): no configuration, no devices; but a `--config` file must
    /// be there.
    #[test]
    fn nothing_to_read_is_no_configuration() {
        let root = tempfile::tempdir().unwrap();
        let etc = root.path().join("zblk.conf.d");
        std::fs::create_dir(&etc).unwrap();
        std::fs::write(etc.join("README"), "not a drop-in").unwrap();
        let found = drop_ins(&[etc]);
        assert_eq!(found, DropIns::default());
        let main = root.path().join("zblk.conf");
        let c = read(&main, Some(&found.files), 1.0).unwrap();
        assert!(c.entries.is_empty() && c.files.is_empty(), "{c:?}");
        let err = read(&main, None, 1.0).unwrap_err();
        assert!(
            err.starts_with(&format!("cannot read {}: ", main.display())),
            "{err}"
        );
    }

    /// A drop-in directory that cannot be read is a warning; the others
    /// are read.
    #[test]
    fn an_unreadable_drop_in_directory_is_a_warning() {
        let root = tempfile::tempdir().unwrap();
        let (usr, etc) = (root.path().join("usr"), root.path().join("etc"));
        std::fs::create_dir(&usr).unwrap();
        std::fs::write(usr.join("10-a.conf"), "").unwrap();
        // A file where a directory should be: read_dir fails with
        // ENOTDIR, as it fails with EACCES for a directory root cannot
        // read either (tests may run as root, who reads any directory).
        std::fs::write(&etc, "").unwrap();
        let got = drop_ins(&[usr.clone(), etc.clone()]);
        assert_eq!(got.files, [usr.join("10-a.conf")]);
        assert_eq!(got.warnings.len(), 1);
        let w = &got.warnings[0];
        assert!(
            w.starts_with(&format!("cannot read {}: ", etc.display()))
                && w.ends_with(": its drop-ins are left out")
                && !w.contains('\n'),
            "{w}"
        );
    }

    #[test]
    fn bad_toml_names_the_line() {
        let e = parse_err("[ublkb0]\nsize = 1024\nmode = \"packed\n");
        assert!(e.starts_with("/etc/zblk/zblk.conf:3: ublkb0.mode: "), "{e}");
        let e = parse_err("[ublkb0]\nsize = 1\n[ublkb0]\nsize = 2\n");
        assert!(e.starts_with("/etc/zblk/zblk.conf:3: [ublkb0]: "), "{e}");
    }

    /// Found by the `setup_conf` fuzz target: a TOML error on a comment
    /// line holding `=` and a lone carriage return used the comment as the
    /// key, control characters and all, so the "one line" error carried a
    /// `\r` (on a terminal, it overwrote the file name).
    #[test]
    fn an_error_on_a_comment_line_stays_one_clean_line() {
        let e = parse_err("[ublkb0]\nsize = 64\n# a = b \r\0 c\n");
        assert!(!e.contains(['\r', '\n', '\0']), "{e:?}");
        assert!(e.starts_with("/etc/zblk/zblk.conf:3: "), "{e:?}");
        assert!(!e.contains("ublkb0.#"), "a comment taken for a key: {e:?}");
        let e = parse_err("[ublkb0]\nsize = 64\nmode\r = 1\n");
        assert!(!e.contains(['\r', '\n']), "{e:?}");
        assert!(e.starts_with("/etc/zblk/zblk.conf:3: "), "{e:?}");
    }

    #[test]
    fn an_unknown_key_is_refused_with_its_line() {
        let e = parse_err("[ublkb0]\nsize = 1024\n\nzram-size = 4\n");
        assert!(
            e.starts_with("/etc/zblk/zblk.conf:4: ublkb0.zram-size: unknown field `zram-size`"),
            "{e}"
        );
        let e = parse_err("size = 1024\n[ublkb0]\nsize = 1\n");
        assert!(
            e.starts_with("/etc/zblk/zblk.conf:1: size: every setting belongs to a section"),
            "{e}"
        );
        let e = parse_err("[ublkb0]\ncompression-algorithm = \"lz4\"\n");
        assert!(e.contains("missing field `size`"), "{e}");
        let e = parse_err("[ublkb0]\nsize = 1024\ngroup-pages = \"four\"\n");
        assert!(
            e.starts_with("/etc/zblk/zblk.conf:3: ublkb0.group-pages: "),
            "{e}"
        );
    }

    #[test]
    fn a_bad_size_expression_names_its_key() {
        let e = parse_err("[ublkb0]\n\nsize = \"ram * (2\"\n");
        assert!(
            e.starts_with("/etc/zblk/zblk.conf:3: ublkb0.size: bad size expression 'ram * (2'"),
            "{e}"
        );
        let e = parse_err("[ublkb2]\nsize = \"-ram\"\n");
        assert!(e.starts_with("/etc/zblk/zblk.conf:2: ublkb2.size: "), "{e}");
        assert!(e.contains("not a size"), "{e}");
        let e = parse_err("[ublkb0]\nsize = [1024]\n");
        assert!(
            e.starts_with("/etc/zblk/zblk.conf:2: ublkb0.size: must be MB"),
            "{e}"
        );
    }

    #[test]
    fn a_bad_algorithm_and_other_values_say_why() {
        let cases = [
            (
                "compression-algorithm = \"lzo\"",
                "compression-algorithm: unknown algorithm 'lzo'",
            ),
            (
                "compression-algorithm = \"zstd:99\"",
                "compression-algorithm: invalid level",
            ),
            ("mode = \"dense\"", "mode: unknown mode 'dense'"),
            ("group-pages = 65", "group-pages: 65 is not in 1..=64"),
            ("io-threads = 0", "io-threads: 0 is not in 1..=4096"),
            ("poll-us = 20000", "poll-us: 20000 is not in 0..=10000"),
            (
                "queue-cpus = \"near\"",
                "queue-cpus: invalid value 'near' (one of: queue, other, any)",
            ),
            ("mem-limit = \"1X\"", "mem-limit: invalid size '1X'"),
            (
                "recompress-idle-after = -1",
                "recompress-idle-after: invalid digit",
            ),
            (
                "recompress-algorithm = \"lzo\"",
                "recompress-algorithm: unknown algorithm 'lzo'",
            ),
            (
                "algorithm-params = \"dict\"",
                "algorithm-params: 'dict' is not KEY=VALUE",
            ),
            (
                "swap-priority = 40000",
                "swap-priority: 40000 is not in -1..=32767",
            ),
            (
                "options = \"discard,nofail\"",
                "options: unknown swap option 'nofail'",
            ),
        ];
        for (line, want) in cases {
            let e = parse_err(&format!("[ublkb0]\nsize = 64\n{line}\n"));
            let want = format!("/etc/zblk/zblk.conf:3: ublkb0.{want}");
            assert!(e.starts_with(&want), "{line}: {e}");
        }
        let e = parse_err("[zram0]\nsize = 64\n");
        assert!(
            e.starts_with("/etc/zblk/zblk.conf:1: [zram0]: a section is named"),
            "{e}"
        );
        for bad in ["ublkb", "ublkb01", "ublkb-1", "ublkb 1", "ublkb99999999999"] {
            assert_eq!(section_id(bad), None, "{bad}");
        }
        assert_eq!(section_id("ublkb10"), Some(10));
        // Found by the setup_conf fuzz target: a quoted section name
        // with a newline in it.
        let e = parse_err("[\"ublkb\\n0\"]\nsize = 64\n");
        assert!(
            e.starts_with("/etc/zblk/zblk.conf:1: [ublkb\\n0]: a section is named"),
            "{e:?}"
        );
        let e = parse_err("[ublkb9999999]\nsize = 64\n");
        assert!(
            e.starts_with("/etc/zblk/zblk.conf:1: [ublkb9999999]: "),
            "{e}"
        );
    }
}
