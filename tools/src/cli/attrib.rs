//! `zblk stat --by cgroup|process`: who holds the swapped pages.
//!
//! The pass reads every process's page tables (`/proc/PID/maps` and
//! `/proc/PID/pagemap`, see [`super::pagemap`]): each swapped-out page
//! says its swap type (which area) and offset (the device page). The
//! distinct pages found on a zblk device are then asked of its daemon, a
//! batch of [`SLOTS_BATCH`] offsets a request (`Request::Slots`: the
//! slot's kind, compressed size, idle mark, written back or not), and
//! summed per cgroup (v2) or per process and area.
//!
//! A page several processes map (after a fork) is one page: it counts
//! once in each row that maps it, and in the SHARED column of those rows,
//! so rows may add up to more than the device holds. Pages no process
//! maps (swapped shmem, tmpfs, memfd and `MAP_SHARED` anonymous pages,
//! which leave no swap entry in any page table; pages only the swap cache
//! holds; the swap header) are the device's totals less what the rows
//! found: its `(unattributed)` row. The pass runs here, as root (reading
//! swap offsets needs `CAP_SYS_ADMIN`), never in the daemon, and takes no
//! slot lock longer than a read does.

use super::args::{By, StatArgs, StatFormat};
use super::base::{CliError, CliResult};
use super::metrics::escape_label;
use super::pagemap::{self, Scanner, SwapAreas, SwapEntry};
use super::show::table;
use super::size::format_size;
use super::sys::check_root;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::io::{ErrorKind, Write};
use std::time::{Duration, Instant};
use zblk::{PageRange, SlotKind, SlotState, PAGE_SIZE_U64};
use zblk_ublk::control::{self, Request, SLOTS_BATCH};

/// How long one batch of slots may take (a few thousand slot locks).
const SLOTS_TIMEOUT: Duration = Duration::from_secs(10);

/// The row label of a device's stored pages no process maps.
const UNATTRIBUTED: &str = "(unattributed)";

/// `zblk stat --by WHO [--json] [-n ID] [--watch SECS]`.
pub fn stat(a: &StatArgs, by: By) -> CliResult {
    check_root("zblk stat --by")?;
    let format = a.format();
    for round in 0u64.. {
        if round > 0 {
            let Some(secs) = a.watch else { break };
            std::thread::sleep(Duration::from_secs(secs));
        }
        let report = attribute(by, a.id)?;
        let text = match format {
            StatFormat::Json => format!("{}\n", report.json(by)),
            StatFormat::Prometheus => report.prometheus(by, a.top),
            StatFormat::Text if round > 0 => format!("\n{}\n", report.text(by)),
            StatFormat::Text => format!("{}\n", report.text(by)),
        };
        let mut out = std::io::stdout().lock();
        match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
            Ok(()) => {}
            // The reader went away (`| head`): it wanted no more.
            Err(e) if e.kind() == ErrorKind::BrokenPipe => break,
            Err(e) => return Err(CliError(format!("cannot write to stdout: {e}"))),
        }
    }
    Ok(())
}

/// The series of one pass in Prometheus's text format, the `top` rows of
/// each zblk device with the most compressed bytes on their own
/// (`zblk exporter --by`).
pub fn prometheus(by: By, top: usize) -> Result<String, CliError> {
    check_root("zblk exporter --by")?;
    Ok(attribute(by, None)?.prometheus(by, top))
}

/// One screen of `zblk top --by WHO`: a title line, the rows of one
/// pass and its notes.
pub fn screen(by: By, interval: Duration) -> Result<String, CliError> {
    check_root("zblk top --by")?;
    let report = attribute(by, None)?;
    Ok(format!(
        "zblk top --by {}: every {}s (q or Ctrl-C quits)\n{}\n",
        by_name(by),
        interval.as_secs_f64(),
        report.text(by)
    ))
}

/// `cgroup` or `process`, as the option says it.
fn by_name(by: By) -> &'static str {
    match by {
        By::Cgroup => "cgroup",
        By::Process => "process",
    }
}

/// A process with swapped pages.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Proc {
    /// Its id.
    pid: u32,
    /// Its name (`comm`).
    name: String,
    /// Its cgroup v2 path (`-` without one).
    cgroup: String,
}

/// What the scan of every process found.
#[derive(Debug, Default)]
struct Scan {
    /// The processes with swapped pages.
    procs: Vec<Proc>,
    /// Each swapped page seen, with the index of the process mapping it.
    seen: Vec<(SwapEntry, u32)>,
    /// Processes looked at.
    looked_at: u64,
    /// Processes whose page tables could not be read (other than by
    /// exiting meanwhile).
    unreadable: u64,
    /// Pagemap entries read.
    entries: u64,
    /// Time spent walking `/proc` and reading page tables.
    elapsed: Duration,
}

/// Reads every process's swapped pages.
fn scan_all() -> Result<Scan, CliError> {
    let t0 = Instant::now();
    let dir =
        std::fs::read_dir("/proc").map_err(|e| CliError(format!("cannot read /proc: {e}")))?;
    let mut scan = Scan::default();
    let mut scanner = Scanner::new();
    for ent in dir.flatten() {
        let Some(pid) = ent.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        scan.looked_at += 1;
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
            continue;
        };
        let (swap, name) = pagemap::parse_status(&status);
        let Some(enough) = swap.filter(|&n| n > 0) else {
            continue;
        };
        let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
            .ok()
            .and_then(|t| pagemap::parse_cgroup(&t))
            .unwrap_or_else(|| "-".into());
        let idx = scan.procs.len() as u32;
        let seen = &mut scan.seen;
        match scanner.scan(pid, enough, |s| seen.push((s, idx))) {
            Ok(c) if c.swapped > 0 => {
                scan.entries += c.entries;
                scan.procs.push(Proc { pid, name, cgroup });
            }
            Ok(c) => scan.entries += c.entries,
            Err(_) => scan.unreadable += 1,
        }
    }
    scan.elapsed = t0.elapsed();
    Ok(scan)
}

/// What a device says of one distinct swapped page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fact {
    /// Not a zblk device's page (another swap area), or not asked.
    Unknown,
    /// On a zblk device that does not store it.
    NotStored,
    /// Stored: its RAM bytes (0 written back or same-filled), idle,
    /// written back.
    Stored {
        /// Bytes it takes in RAM.
        ram: u64,
        /// Marked idle.
        idle: bool,
        /// On the backing device.
        back: bool,
    },
}

impl Fact {
    /// What slot state `s` says.
    fn of(s: &SlotState) -> Fact {
        let back = s.kind == SlotKind::WrittenBack;
        Fact::Stored {
            ram: if back { 0 } else { u64::from(s.size) },
            idle: s.idle,
            back,
        }
    }
}

/// The sums of one row (or of a whole area).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Tally {
    /// Distinct pages seen (on a zblk device: stored ones only).
    pages: u64,
    /// Of those, mapped by more than one process.
    shared: u64,
    /// Compressed bytes in RAM.
    compr: u64,
    /// Idle pages.
    idle: u64,
    /// Written-back pages.
    back: u64,
    /// Pages seen on a zblk device that it does not store.
    not_stored: u64,
}

impl Tally {
    /// Counts one page.
    fn add(&mut self, fact: Fact, shared: bool) {
        if fact == Fact::NotStored {
            self.not_stored += 1;
            return;
        }
        self.pages += 1;
        self.shared += u64::from(shared);
        if let Fact::Stored { ram, idle, back } = fact {
            self.compr += ram;
            self.idle += u64::from(idle);
            self.back += u64::from(back);
        }
    }
}

/// One swap area: its path, and its zblk device id if it is one.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Area {
    /// As `/proc/swaps` names it.
    path: String,
    /// N of `/dev/ublkbN`.
    zblk: Option<u32>,
}

/// The zblk device id of a swap area's path (`/dev/ublkbN`, or a link to
/// it).
fn zblk_id(path: &str) -> Option<u32> {
    let real = std::fs::canonicalize(path).unwrap_or_else(|_| path.into());
    let name = real.file_name()?.to_str()?;
    name.strip_prefix("ublkb")?.parse().ok()
}

/// Who a row is.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Who {
    /// A cgroup's path.
    Cgroup(String),
    /// A process (index into the scan's processes).
    Process(u32),
    /// No process: a device's unattributed pages.
    Nobody,
}

/// What the pass found: a tally per row and area.
#[derive(Debug, Default)]
struct Report {
    /// The swap areas, by type.
    areas: Vec<Area>,
    /// The processes.
    procs: Vec<Proc>,
    /// The rows, sorted by compressed bytes, then pages.
    rows: Vec<(Who, usize, Tally)>,
    /// Distinct swapped pages per area (all rows together).
    totals: Vec<Tally>,
    /// Entries of a swap type `/proc/swaps` does not list.
    unknown_type: u64,
    /// Distinct swapped pages found.
    distinct: u64,
    /// The scan's counts and time.
    scan: Scan,
    /// The whole pass's time (the daemons' answers included).
    elapsed: Duration,
}

/// One pass: scan, ask the devices, sum.
fn attribute(by: By, only: Option<u32>) -> Result<Report, CliError> {
    let t0 = Instant::now();
    let areas = read_areas()?;
    // Every area stays: a swap type is an index into all of them.
    let wanted = |a: &Area| only.is_none() || a.zblk == only;
    if let Some(id) = only {
        if !areas.iter().any(wanted) {
            return Err(CliError(format!(
                "zblk {id} is not active swap (not in /proc/swaps)"
            )));
        }
    }
    let mut scan = scan_all()?;
    let (pages, owners) = group(&mut scan.seen);
    let types = SwapAreas {
        paths: areas.iter().map(|a| a.path.clone()).collect(),
    };
    let facts = ask_devices(&areas, wanted, &types, &pages)?;
    let mut r = sum(by, &areas, &types, &scan, &pages, &owners, &facts);
    r.rows.retain(|row| wanted(&areas[row.1]));
    for (i, area) in areas.iter().enumerate().filter(|(_, a)| wanted(a)) {
        if let Some(id) = area.zblk {
            let t = unattributed(id, &r.totals[i])?;
            r.rows.push((Who::Nobody, i, t));
        }
    }
    sort_rows(&mut r.rows);
    r.areas = areas;
    r.procs = std::mem::take(&mut scan.procs);
    r.scan = scan;
    r.elapsed = t0.elapsed();
    Ok(r)
}

/// The swap areas, in type order, each with its zblk id if it has one.
fn read_areas() -> Result<Vec<Area>, CliError> {
    let areas = SwapAreas::read().map_err(|e| CliError(format!("cannot read /proc/swaps: {e}")))?;
    Ok(areas
        .paths
        .into_iter()
        .map(|path| Area {
            zblk: zblk_id(&path),
            path,
        })
        .collect())
}

/// Whose pages an action takes: a process of one of these cgroups maps
/// them, or none of these cgroups' processes does (v2 paths without a
/// trailing slash, each with the cgroups below it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CgroupFilter {
    /// Pages a process of one of these maps (shared or not).
    Only(Vec<String>),
    /// Pages processes map, none of them a process of one of these.
    Except(Vec<String>),
}

impl CgroupFilter {
    /// Whether a page mapped by processes of these cgroups is taken.
    fn takes<'a>(&self, mut cgroups: impl Iterator<Item = &'a str>) -> bool {
        let listed = |list: &[String], cg: &str| list.iter().any(|p| in_cgroup(cg, p));
        match self {
            CgroupFilter::Only(list) => cgroups.any(|cg| listed(list, cg)),
            CgroupFilter::Except(list) => cgroups.all(|cg| !listed(list, cg)),
        }
    }
}

/// The pages of device `id` that a process of cgroup `path` (or of a
/// cgroup below it) maps, as merged index ranges (`zblk writeback
/// --cgroup`, `zblk recompress --cgroup`; `cmd` names it in a refusal): a
/// page it shares with another cgroup is among them.
pub fn cgroup_pages(id: u32, path: &str, cmd: &str) -> Result<Vec<PageRange>, CliError> {
    let only = CgroupFilter::Only(vec![path.trim_end_matches('/').to_string()]);
    Ok(ranges(&cgroup_offsets(id, &only, cmd)?))
}

/// The pages of device `id` that `filter` takes, sorted and distinct:
/// the offsets every process's page tables say (a scan, as root; `cmd`
/// names the command in a refusal).
pub fn cgroup_offsets(id: u32, filter: &CgroupFilter, cmd: &str) -> Result<Vec<u64>, CliError> {
    check_root(cmd)?;
    let areas = read_areas()?;
    let Some(ty) = areas.iter().position(|a| a.zblk == Some(id)) else {
        return Err(CliError(format!(
            "zblk {id} is not active swap (not in /proc/swaps)"
        )));
    };
    let mut scan = scan_all()?;
    Ok(taken(&mut scan, ty, filter))
}

/// The offsets of swap type `ty` in `scan` that `filter` takes, sorted
/// and distinct.
fn taken(scan: &mut Scan, ty: usize, filter: &CgroupFilter) -> Vec<u64> {
    let (pages, owners) = group(&mut scan.seen);
    pages
        .iter()
        .zip(&owners)
        .filter(|(p, _)| usize::from(p.swap_type()) == ty)
        .filter(|(_, o)| {
            let cgroups = scan.seen[(*o).clone()]
                .iter()
                .map(|&(_, p)| scan.procs[p as usize].cgroup.as_str());
            filter.takes(cgroups)
        })
        .map(|(p, _)| p.offset())
        .collect()
}

/// Those of `offsets` (sorted, distinct) that device `id` stores in RAM
/// with an idle mark, as its slots say now, asked a batch at a time.
pub fn idle_offsets(id: u32, offsets: &[u64]) -> Result<Vec<u64>, CliError> {
    let mut idle = Vec::new();
    for batch in offsets.chunks(SLOTS_BATCH) {
        let slots = ask_slots(id, batch.to_vec())?;
        let mut facts = vec![Fact::Unknown; batch.len()];
        fill(batch, &slots, &mut facts)
            .map_err(|why| CliError(format!("device {id}: bad slots reply: {why}")))?;
        idle.extend(batch.iter().zip(&facts).filter_map(|(&off, f)| {
            matches!(
                f,
                Fact::Stored {
                    idle: true,
                    back: false,
                    ..
                }
            )
            .then_some(off)
        }));
    }
    Ok(idle)
}

/// Whether cgroup `cg` is `path` or below it (`path` without a trailing
/// slash; empty: the root).
fn in_cgroup(cg: &str, path: &str) -> bool {
    cg.strip_prefix(path)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// Sorted, distinct page indexes as the fewest inclusive ranges.
pub fn ranges(sorted: &[u64]) -> Vec<PageRange> {
    let mut out: Vec<PageRange> = Vec::new();
    for &p in sorted {
        match out.last_mut() {
            Some(r) if r.last.checked_add(1) == Some(p) => r.last = p,
            _ => out.push(PageRange { first: p, last: p }),
        }
    }
    out
}

/// The distinct pages of `seen`, in (type, offset) order, and for each
/// the processes mapping it (sorted, each once): `owners[i]` is the
/// range of `seen` (sorted and deduplicated in place) holding page `i`'s.
fn group(seen: &mut Vec<(SwapEntry, u32)>) -> (Vec<SwapEntry>, Vec<std::ops::Range<usize>>) {
    seen.sort_unstable_by_key(|&(s, p)| (s.swap_type(), s.offset(), p));
    seen.dedup();
    let mut pages = Vec::new();
    let mut owners = Vec::new();
    let mut start = 0;
    for i in 1..=seen.len() {
        if i == seen.len() || seen[i].0 != seen[start].0 {
            pages.push(seen[start].0);
            owners.push(start..i);
            start = i;
        }
    }
    (pages, owners)
}

/// What each page of `pages` is, asking the daemon of each zblk area
/// `wanted` keeps for its pages a batch at a time.
fn ask_devices(
    areas: &[Area],
    wanted: impl Fn(&Area) -> bool,
    types: &SwapAreas,
    pages: &[SwapEntry],
) -> Result<Vec<Fact>, CliError> {
    let mut facts = vec![Fact::Unknown; pages.len()];
    let mut start = 0;
    while start < pages.len() {
        let ty = pages[start].swap_type();
        let end = start + pages[start..].partition_point(|p| p.swap_type() == ty);
        let zblk = types
            .area(ty)
            .filter(|&a| wanted(&areas[a]))
            .and_then(|a| areas[a].zblk);
        if let Some(id) = zblk {
            let mut at = start;
            for batch in pages[start..end].chunks(SLOTS_BATCH) {
                let offsets: Vec<u64> = batch.iter().map(|p| p.offset()).collect();
                let slots = ask_slots(id, offsets.clone())?;
                fill(&offsets, &slots, &mut facts[at..at + batch.len()])
                    .map_err(|why| CliError(format!("device {id}: bad slots reply: {why}")))?;
                at += batch.len();
            }
        }
        start = end;
    }
    Ok(facts)
}

/// The slot states of the stored pages of `offsets` on device `id`.
fn ask_slots(id: u32, offsets: Vec<u64>) -> Result<Vec<SlotState>, CliError> {
    let r = control::request(id, &Request::Slots { pages: offsets }, SLOTS_TIMEOUT)?;
    serde_json::from_value(r["slots"].clone())
        .map_err(|e| CliError(format!("device {id}: bad slots reply: {e}")))
}

/// Puts the states of a reply (the stored pages of `offsets`, in their
/// order) on `facts` (one per offset): every offset the reply leaves
/// out is not stored.
fn fill(offsets: &[u64], slots: &[SlotState], facts: &mut [Fact]) -> Result<(), String> {
    let mut next = slots.iter().peekable();
    for (off, fact) in offsets.iter().zip(facts.iter_mut()) {
        *fact = match next.next_if(|s| s.index == *off) {
            Some(s) => Fact::of(s),
            None => Fact::NotStored,
        };
    }
    match next.next() {
        Some(s) => Err(format!("page {} was not asked for", s.index)),
        None => Ok(()),
    }
}

/// The tallies per row and area, and per area.
fn sum(
    by: By,
    areas: &[Area],
    types: &SwapAreas,
    scan: &Scan,
    pages: &[SwapEntry],
    owners: &[std::ops::Range<usize>],
    facts: &[Fact],
) -> Report {
    // Who each row is, and each process's row: dense indexes, so that a
    // page costs no hashing.
    let (who, row_of): (Vec<Who>, Vec<usize>) = match by {
        By::Process => (
            (0..scan.procs.len() as u32).map(Who::Process).collect(),
            (0..scan.procs.len()).collect(),
        ),
        By::Cgroup => {
            let mut index: HashMap<&str, usize> = HashMap::new();
            let mut who = Vec::new();
            let row_of = scan
                .procs
                .iter()
                .map(|p| {
                    *index.entry(&p.cgroup).or_insert_with(|| {
                        who.push(Who::Cgroup(p.cgroup.clone()));
                        who.len() - 1
                    })
                })
                .collect();
            (who, row_of)
        }
    };
    let n = areas.len();
    let mut tallies = vec![Tally::default(); who.len() * n];
    let mut totals = vec![Tally::default(); n];
    let mut unknown_type = 0;
    let mut rows_of_page = Vec::new();
    for ((page, range), &fact) in pages.iter().zip(owners).zip(facts) {
        let Some(area) = types.area(page.swap_type()) else {
            unknown_type += range.len() as u64;
            continue;
        };
        let shared = range.len() > 1;
        totals[area].add(fact, shared);
        rows_of_page.clear();
        rows_of_page.extend(
            scan.seen[range.clone()]
                .iter()
                .map(|&(_, p)| row_of[p as usize]),
        );
        if rows_of_page.len() > 1 {
            rows_of_page.sort_unstable();
            rows_of_page.dedup();
        }
        for &row in &rows_of_page {
            tallies[row * n + area].add(fact, shared);
        }
    }
    let rows = tallies
        .into_iter()
        .enumerate()
        .filter(|(_, t)| *t != Tally::default())
        .map(|(i, t)| (who[i / n].clone(), i % n, t))
        .collect();
    Report {
        rows,
        totals,
        unknown_type,
        distinct: pages.len() as u64,
        ..Report::default()
    }
}

/// Device `id`'s stored pages no row found: its totals (`zblk stat`)
/// less `found`, the distinct pages the scan found on it.
fn unattributed(id: u32, found: &Tally) -> Result<Tally, CliError> {
    let r = control::request(id, &Request::Stats, SLOTS_TIMEOUT)?;
    let s = &r["stats"];
    let u = |k: &str| s[k].as_u64().unwrap_or(0);
    let back = u("bd_count");
    Ok(Tally {
        pages: u("stored_pages").saturating_sub(found.pages),
        shared: 0,
        compr: u("compr_data_size").saturating_sub(found.compr),
        idle: u("idle_pages").saturating_sub(found.idle),
        back: back.saturating_sub(found.back),
        not_stored: 0,
    })
}

/// Rows by compressed bytes, then pages, largest first; then by who.
fn sort_rows(rows: &mut [(Who, usize, Tally)]) {
    rows.sort_by(|a, b| {
        (b.2.compr, b.2.pages)
            .cmp(&(a.2.compr, a.2.pages))
            .then_with(|| (&a.0, a.1).cmp(&(&b.0, b.1)))
    });
}

/// Original bytes over compressed bytes of the pages in RAM ("-" when
/// nothing is compressed).
fn ratio(t: &Tally) -> Option<f64> {
    let in_ram = t.pages.saturating_sub(t.back);
    (t.compr > 0).then(|| (in_ram * PAGE_SIZE_U64) as f64 / t.compr as f64)
}

impl Report {
    /// Who a row is, as its first columns say it.
    fn who_cells(&self, w: &Who, by: By) -> Vec<String> {
        let dash = || "-".to_string();
        match (w, by) {
            (Who::Cgroup(c), _) => vec![c.clone()],
            (Who::Nobody, By::Cgroup) => vec![UNATTRIBUTED.into()],
            (Who::Nobody, By::Process) => vec![dash(), UNATTRIBUTED.into(), dash()],
            (Who::Process(p), _) => {
                let p = &self.procs[*p as usize];
                vec![p.pid.to_string(), p.name.clone(), p.cgroup.clone()]
            }
        }
    }

    /// The report as a table and its notes.
    fn text(&self, by: By) -> String {
        let mut headers = match by {
            By::Cgroup => vec!["CGROUP"],
            By::Process => vec!["PID", "NAME", "CGROUP"],
        };
        headers.extend([
            "DEVICE", "PAGES", "ORIG", "COMPR", "RATIO", "IDLE", "BACK", "SHARED",
        ]);
        let rows: Vec<Vec<String>> = self
            .rows
            .iter()
            .map(|(w, a, t)| {
                let area = &self.areas[*a];
                let known = area.zblk.is_some();
                let or_dash = |v: String| if known { v } else { "-".into() };
                let mut cells = self.who_cells(w, by);
                cells.extend([
                    area.path.clone(),
                    t.pages.to_string(),
                    format_size(t.pages * PAGE_SIZE_U64),
                    or_dash(format_size(t.compr)),
                    or_dash(ratio(t).map_or("-".into(), |r| format!("{r:.2}"))),
                    or_dash(t.idle.to_string()),
                    or_dash(t.back.to_string()),
                    t.shared.to_string(),
                ]);
                cells
            })
            .collect();
        let mut out = table(&headers, &rows);
        out.push_str(
            "\nSHARED: pages mapped by more than one process (fork); \
             each row that maps one counts it once, so rows can add up to more than a device holds.",
        );
        out.push_str(&format!(
            "\n{UNATTRIBUTED}: stored pages no process maps \
             (shmem, tmpfs, memfd, MAP_SHARED anonymous, swap cache, the swap header).\n{}",
            self.scan_line()
        ));
        for w in self.warnings() {
            out.push_str(&format!("\nwarning: {w}"));
        }
        out
    }

    /// The scan's figures, in one line.
    fn scan_line(&self) -> String {
        let s = &self.scan;
        let mapped = s.seen.len() as f64;
        let rate = |d: Duration| match d.as_secs_f64() {
            secs if secs > 0.0 => mapped / secs / 1e6,
            _ => 0.0,
        };
        format!(
            "scanned {} processes ({} with swapped pages): {} swapped pages mapped, {} distinct; \
             page tables {:.3} s ({:.2} M pages/s), whole pass {:.3} s ({:.2} M pages/s)",
            s.looked_at,
            self.procs.len(),
            s.seen.len(),
            self.distinct,
            s.elapsed.as_secs_f64(),
            rate(s.elapsed),
            self.elapsed.as_secs_f64(),
            rate(self.elapsed),
        )
    }

    /// What may make the rows wrong.
    fn warnings(&self) -> Vec<String> {
        let mut w = Vec::new();
        if self.unknown_type > 0 {
            w.push(format!(
                "{} swapped pages of a swap type /proc/swaps does not list \
                 (migration entries, or an area switched off below one still on): left out",
                self.unknown_type
            ));
        }
        for (a, t) in self.areas.iter().zip(&self.totals) {
            if t.not_stored > 0 {
                w.push(format!(
                    "{}: {} swapped pages the device does not store (freed meanwhile; \
                     many: swap types do not follow /proc/swaps, switch the later areas off and on)",
                    a.path, t.not_stored
                ));
            }
        }
        if self.scan.unreadable > 0 {
            w.push(format!(
                "{} processes' page tables could not be read",
                self.scan.unreadable
            ));
        }
        w
    }

    /// The rows of the zblk devices in Prometheus's text format: per
    /// device, its `top` rows with the most compressed bytes (the
    /// unattributed one among them if it is large enough) labelled by
    /// cgroup (or `pid`), the rest summed as `other`, so that the series
    /// stay few however many cgroups there are.
    fn prometheus(&self, by: By, top: usize) -> String {
        const FAMILIES: [(&str, &str); 6] = [
            ("pages", "Distinct swapped pages the device stores"),
            ("compr_bytes", "Compressed bytes in RAM"),
            ("idle_pages", "Pages marked idle"),
            ("written_back_pages", "Pages written back"),
            ("shared_pages", "Pages more than one process maps"),
            (
                "not_stored_pages",
                "Swapped pages found that the device does not store",
            ),
        ];
        let value =
            |t: &Tally, i: usize| [t.pages, t.compr, t.idle, t.back, t.shared, t.not_stored][i];
        let prefix = match by {
            By::Cgroup => "zblk_cgroup",
            By::Process => "zblk_process",
        };
        // Per device: its rows in order (already largest first), the first
        // `top` by name, the others summed.
        let mut series: Vec<(String, Tally)> = Vec::new();
        for (a, area) in self.areas.iter().enumerate() {
            let Some(id) = area.zblk else { continue };
            let mut other = Tally::default();
            let mut shown = 0;
            for (w, _, t) in self.rows.iter().filter(|r| r.1 == a) {
                if shown < top {
                    let who = match w {
                        Who::Cgroup(c) => format!("cgroup=\"{}\"", escape_label(c)),
                        Who::Process(p) => {
                            let p = &self.procs[*p as usize];
                            format!("pid=\"{}\",name=\"{}\"", p.pid, escape_label(&p.name))
                        }
                        Who::Nobody => format!("{}=\"{UNATTRIBUTED}\"", by_name(by)),
                    };
                    series.push((format!("{who},device=\"ublkb{id}\",id=\"{id}\""), *t));
                    shown += 1;
                } else {
                    other.pages += t.pages;
                    other.compr += t.compr;
                    other.idle += t.idle;
                    other.back += t.back;
                    other.shared += t.shared;
                    other.not_stored += t.not_stored;
                }
            }
            if other != Tally::default() {
                let who = format!("{}=\"other\"", by_name(by));
                series.push((format!("{who},device=\"ublkb{id}\",id=\"{id}\""), other));
            }
        }
        let mut out = String::new();
        for (i, (name, help)) in FAMILIES.iter().enumerate() {
            out.push_str(&format!(
                "# HELP {prefix}_{name} {help}, per {}.\n# TYPE {prefix}_{name} gauge\n",
                by_name(by)
            ));
            for (labels, t) in &series {
                out.push_str(&format!("{prefix}_{name}{{{labels}}} {}\n", value(t, i)));
            }
        }
        out
    }

    /// The report as one JSON document.
    fn json(&self, by: By) -> Value {
        let rows: Vec<Value> = self
            .rows
            .iter()
            .map(|(w, a, t)| {
                let area = &self.areas[*a];
                let mut row = json!({
                    "device": area.path,
                    "id": area.zblk,
                    "pages": t.pages,
                    "orig_bytes": t.pages * PAGE_SIZE_U64,
                    "shared_pages": t.shared,
                });
                if area.zblk.is_some() {
                    row["compr_bytes"] = t.compr.into();
                    row["ratio"] = ratio(t).map_or(Value::Null, Value::from);
                    row["idle_pages"] = t.idle.into();
                    row["written_back_pages"] = t.back.into();
                    row["not_stored_pages"] = t.not_stored.into();
                }
                match w {
                    Who::Cgroup(c) => row["cgroup"] = c.as_str().into(),
                    Who::Process(p) => {
                        let p = &self.procs[*p as usize];
                        row["pid"] = p.pid.into();
                        row["name"] = p.name.as_str().into();
                        row["cgroup"] = p.cgroup.as_str().into();
                    }
                    Who::Nobody => row["unattributed"] = true.into(),
                }
                row
            })
            .collect();
        let s = &self.scan;
        json!({
            "by": by_name(by),
            "rows": rows,
            "scan": {
                "processes": s.looked_at,
                "processes_with_swap": self.procs.len(),
                "unreadable_processes": s.unreadable,
                "pagemap_entries": s.entries,
                "swapped_pages": s.seen.len(),
                "distinct_pages": self.distinct,
                "unknown_type_pages": self.unknown_type,
                "scan_seconds": s.elapsed.as_secs_f64(),
                "seconds": self.elapsed.as_secs_f64(),
            },
            "warnings": self.warnings(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proc(pid: u32, cgroup: &str) -> Proc {
        Proc {
            pid,
            name: format!("p{pid}"),
            cgroup: cgroup.into(),
        }
    }

    fn slot(index: u64, kind: SlotKind, size: u32, idle: bool) -> SlotState {
        SlotState {
            index,
            kind,
            size,
            algo: None,
            idle,
            incompressible: false,
            atime: 0,
        }
    }

    #[test]
    fn a_reply_fills_the_pages_it_names() {
        let offsets = [3, 5, 9, 12];
        let slots = [
            slot(5, SlotKind::Compressed, 1000, true),
            slot(12, SlotKind::WrittenBack, 700, false),
        ];
        let mut facts = [Fact::Unknown; 4];
        fill(&offsets, &slots, &mut facts).unwrap();
        assert_eq!(
            facts,
            [
                Fact::NotStored,
                Fact::Stored {
                    ram: 1000,
                    idle: true,
                    back: false
                },
                Fact::NotStored,
                Fact::Stored {
                    ram: 0,
                    idle: false,
                    back: true
                },
            ]
        );
        // A page the reply should not have: an error, not a wrong row.
        let e = fill(&offsets, &[slot(4, SlotKind::Same, 0, false)], &mut facts).unwrap_err();
        assert!(e.contains("page 4"), "{e}");
    }

    /// Processes 0 and 1 in cgroup /a (1 forked from 0: page 7 shared),
    /// 2 in /b sharing page 9 with 0; type 1 is an area of zblk device 0,
    /// type 0 another area, type 5 none.
    fn example() -> (Scan, Vec<Area>, SwapAreas) {
        let e = SwapEntry::new;
        let seen = vec![
            (e(1, 7), 0),
            (e(1, 8), 0),
            (e(1, 9), 0),
            (e(1, 7), 1),
            (e(1, 7), 1), // mapped twice by one process: once
            (e(1, 9), 2),
            (e(1, 10), 2),
            (e(0, 7), 2),
            (e(5, 1), 2),
        ];
        let scan = Scan {
            procs: vec![proc(100, "/a"), proc(101, "/a"), proc(200, "/b")],
            seen,
            ..Scan::default()
        };
        let areas = vec![
            Area {
                path: "/dev/zram0".into(),
                zblk: None,
            },
            Area {
                path: "/dev/ublkb0".into(),
                zblk: Some(0),
            },
        ];
        let types = SwapAreas {
            paths: areas.iter().map(|a| a.path.clone()).collect(),
        };
        (scan, areas, types)
    }

    /// The facts of [`example`]'s distinct pages: on device 0, page 7 of
    /// 1000 bytes idle, 8 written back, 9 of 500, 10 not stored.
    fn example_facts(pages: &[SwapEntry]) -> Vec<Fact> {
        pages
            .iter()
            .map(|p| match (p.swap_type(), p.offset()) {
                (1, 7) => Fact::Stored {
                    ram: 1000,
                    idle: true,
                    back: false,
                },
                (1, 8) => Fact::Stored {
                    ram: 0,
                    idle: false,
                    back: true,
                },
                (1, 9) => Fact::Stored {
                    ram: 500,
                    idle: false,
                    back: false,
                },
                (1, 10) => Fact::NotStored,
                _ => Fact::Unknown,
            })
            .collect()
    }

    #[test]
    fn pages_are_grouped_with_the_processes_mapping_them() {
        let (mut scan, _, _) = example();
        let (pages, owners) = group(&mut scan.seen);
        let e = SwapEntry::new;
        assert_eq!(
            pages,
            [e(0, 7), e(1, 7), e(1, 8), e(1, 9), e(1, 10), e(5, 1)]
        );
        let procs: Vec<Vec<u32>> = owners
            .iter()
            .map(|r| scan.seen[r.clone()].iter().map(|s| s.1).collect())
            .collect();
        assert_eq!(
            procs,
            [vec![2], vec![0, 1], vec![0], vec![0, 2], vec![2], vec![2]]
        );
    }

    #[test]
    fn a_cgroup_counts_a_shared_page_once() {
        let (mut scan, areas, types) = example();
        let (pages, owners) = group(&mut scan.seen);
        let facts = example_facts(&pages);
        let r = sum(By::Cgroup, &areas, &types, &scan, &pages, &owners, &facts);
        let row = |c: &str, a: usize| {
            r.rows
                .iter()
                .find(|(w, area, _)| *w == Who::Cgroup(c.into()) && *area == a)
                .map(|x| x.2)
        };
        // /a: pages 7 (shared by its two processes and counted once), 8,
        // 9 (shared with /b).
        let a = row("/a", 1).unwrap();
        assert_eq!(
            a,
            Tally {
                pages: 3,
                shared: 2,
                compr: 1500,
                idle: 1,
                back: 1,
                not_stored: 0
            }
        );
        // /b: page 9 (shared) and 10, which the device does not store.
        let b = row("/b", 1).unwrap();
        assert_eq!((b.pages, b.shared, b.compr, b.not_stored), (1, 1, 500, 1));
        // /b's page on the other area: counted, nothing known of it.
        assert_eq!(row("/b", 0).unwrap().pages, 1);
        assert_eq!(row("/a", 0), None);
        // The device's distinct pages: 7, 8, 9 once each.
        assert_eq!(
            (r.totals[1].pages, r.totals[1].compr, r.totals[1].not_stored),
            (3, 1500, 1)
        );
        // Type 5 has no area: apart.
        assert_eq!(r.unknown_type, 1);
    }

    #[test]
    fn a_process_row_counts_every_page_it_maps() {
        let (mut scan, areas, types) = example();
        let (pages, owners) = group(&mut scan.seen);
        let facts = example_facts(&pages);
        let mut r = sum(By::Process, &areas, &types, &scan, &pages, &owners, &facts);
        sort_rows(&mut r.rows);
        let on_dev: Vec<(Who, u64, u64, u64)> = r
            .rows
            .iter()
            .filter(|x| x.1 == 1)
            .map(|(w, _, t)| (w.clone(), t.pages, t.shared, t.compr))
            .collect();
        assert_eq!(
            on_dev,
            [
                (Who::Process(0), 3, 2, 1500),
                (Who::Process(1), 1, 1, 1000),
                (Who::Process(2), 1, 1, 500),
            ]
        );
    }

    #[test]
    fn the_text_says_who_where_and_how_much() {
        let (mut scan, areas, types) = example();
        let (pages, owners) = group(&mut scan.seen);
        let facts = example_facts(&pages);
        let mut r = sum(By::Cgroup, &areas, &types, &scan, &pages, &owners, &facts);
        r.rows.push((
            Who::Nobody,
            1,
            Tally {
                pages: 4,
                compr: 4096,
                ..Tally::default()
            },
        ));
        sort_rows(&mut r.rows);
        r.areas = areas;
        r.procs = std::mem::take(&mut scan.procs);
        r.scan = scan;
        let text = r.text(By::Cgroup);
        let lines: Vec<&str> = text.lines().collect();
        let words = |i: usize| lines[i].split_whitespace().collect::<Vec<_>>();
        assert_eq!(
            words(0),
            ["CGROUP", "DEVICE", "PAGES", "ORIG", "COMPR", "RATIO", "IDLE", "BACK", "SHARED"]
        );
        assert_eq!(
            words(1),
            [
                "(unattributed)",
                "/dev/ublkb0",
                "4",
                "16K",
                "4K",
                "4.00",
                "0",
                "0",
                "0"
            ]
        );
        // 3 pages, one written back: 2 in RAM in 1500 bytes.
        assert_eq!(
            words(2),
            [
                "/a",
                "/dev/ublkb0",
                "3",
                "12K",
                "1.5K",
                "5.46",
                "1",
                "1",
                "2"
            ]
        );
        assert_eq!(
            words(4),
            ["/b", "/dev/zram0", "1", "4K", "-", "-", "-", "-", "0"]
        );
        assert!(text.contains("1 swapped pages of a swap type"), "{text}");
        assert!(text.contains("/dev/ublkb0: 1 swapped pages the device does not store"));
        let j = r.json(By::Cgroup);
        assert_eq!(j["rows"][0]["unattributed"], true);
        assert_eq!(j["rows"][1]["cgroup"], "/a");
        assert_eq!(j["rows"][1]["compr_bytes"], 1500);
        assert_eq!(j["rows"][3]["device"], "/dev/zram0");
        assert!(j["rows"][3].get("compr_bytes").is_none());
        assert_eq!(j["scan"]["swapped_pages"], 9 - 1);
    }

    #[test]
    fn prometheus_series_keep_the_top_rows_and_sum_the_rest() {
        let (mut scan, areas, types) = example();
        let (pages, owners) = group(&mut scan.seen);
        let facts = example_facts(&pages);
        let mut r = sum(By::Cgroup, &areas, &types, &scan, &pages, &owners, &facts);
        sort_rows(&mut r.rows);
        r.areas = areas;
        r.procs = std::mem::take(&mut scan.procs);
        let text = r.prometheus(By::Cgroup, 1);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "# HELP zblk_cgroup_pages Distinct swapped pages the device stores, per cgroup."
        );
        assert_eq!(lines[1], "# TYPE zblk_cgroup_pages gauge");
        // /a (1500 bytes) has a series; /b (500) is "other"; zram has none.
        assert_eq!(
            lines[2],
            r#"zblk_cgroup_pages{cgroup="/a",device="ublkb0",id="0"} 3"#
        );
        assert_eq!(
            lines[3],
            r#"zblk_cgroup_pages{cgroup="other",device="ublkb0",id="0"} 1"#
        );
        assert!(
            text.contains(r#"zblk_cgroup_compr_bytes{cgroup="other",device="ublkb0",id="0"} 500"#)
        );
        assert!(text
            .contains(r#"zblk_cgroup_not_stored_pages{cgroup="other",device="ublkb0",id="0"} 1"#));
        assert!(!text.contains("zram"), "{text}");
        assert_eq!(text.lines().filter(|l| !l.starts_with('#')).count(), 6 * 2);
        // Enough room: every row its own series, no "other".
        assert!(!r.prometheus(By::Cgroup, 10).contains("other"));
    }

    #[test]
    fn a_filter_takes_the_pages_of_its_cgroups_or_of_all_others() {
        // /a's two processes share page 7; /a and /b share page 9; type 0
        // is another area.
        let only = |l: &[&str]| CgroupFilter::Only(l.iter().map(|s| s.to_string()).collect());
        let except = |l: &[&str]| CgroupFilter::Except(l.iter().map(|s| s.to_string()).collect());
        let taken_of = |f: &CgroupFilter| taken(&mut example().0, 1, f);
        assert_eq!(taken_of(&only(&["/a"])), [7, 8, 9]);
        assert_eq!(taken_of(&only(&["/b"])), [9, 10]);
        assert_eq!(taken_of(&only(&["/a", "/b"])), [7, 8, 9, 10]);
        assert_eq!(taken_of(&only(&[""])), [7, 8, 9, 10], "the root holds all");
        assert!(taken_of(&only(&["/c"])).is_empty());
        // A page an excluded cgroup maps is left, shared or not.
        assert_eq!(taken_of(&except(&["/a"])), [10]);
        assert_eq!(taken_of(&except(&["/b"])), [7, 8]);
        assert_eq!(taken_of(&except(&["/c"])), [7, 8, 9, 10]);
        assert_eq!(taken(&mut example().0, 0, &only(&["/b"])), [7]);
    }

    #[test]
    fn a_cgroup_holds_its_descendants() {
        assert!(in_cgroup("/a", "/a"));
        assert!(in_cgroup("/a/b", "/a"));
        assert!(!in_cgroup("/ab", "/a"));
        assert!(!in_cgroup("/b", "/a"));
        assert!(in_cgroup("/b", ""), "the root holds every cgroup");
    }

    #[test]
    fn offsets_merge_into_ranges() {
        let r: Vec<String> = ranges(&[1, 2, 3, 7, 9, 10, u64::MAX])
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(r, ["1-3", "7", "9-10", &u64::MAX.to_string()]);
        assert!(ranges(&[]).is_empty());
    }

    #[test]
    fn ublk_paths_name_their_device() {
        assert_eq!(zblk_id("/dev/ublkb12"), Some(12));
        assert_eq!(zblk_id("/dev/zram0"), None);
        assert_eq!(zblk_id("/swapfile"), None);
        assert_eq!(zblk_id("/dev/ublkbx"), None);
    }
}
