//! Recompression: the store's half of `zblk recompress` (zram's
//! `recompress`), and idle marking (zram's `idle` file).
//!
//! Recompression stores chosen pages again with one of the store's
//! secondary algorithms (stronger ones: `lz4hc`, `zstd:9`, `deflate:9`),
//! tried in the order asked (zram's priorities), and keeps the first
//! result at least [`MIN_SAVING_PERCENT`] percent smaller than what the
//! page has now: a smaller gain would cost a slower decompression on every
//! later read for almost no memory. The slot then names the secondary
//! that holds it (`Entry::algo` 1-3, its entry in the store's list,
//! `crate::secondary`), which is what reads decode with. A page a
//! secondary holds may be recompressed again by a later one in the list
//! (zram: priority 2 after priority 1), never by its own or an earlier one;
//! in a per-page store only (a packed group would need a secondary after
//! every member's).
//!
//! A page is read under its lock (not as an access: its time and idle mark
//! stay), compressed and allocated unlocked, and installed only if its slot
//! still holds the very same object, as compaction's rewrite does
//! (`crate::compact`): a concurrent write or discard wins.
//!
//! A packed store recompresses into packed groups ([`run_packed`]): the
//! selected pages of a window of G pages (its compression group's span,
//! which is what the slab's relocation looks through for an object's
//! holders) are read, whatever holds them (packed groups of the primary,
//! per-page objects), compressed together by the first secondary that fits into one new
//! group object, and installed slot by slot. The whole group is kept or
//! dropped by the same 5 % rule, measured against the pages' shares of
//! what they were stored in. Ordering: the object is written in full
//! (header with every page live, blob) before the first slot names it; a
//! slot whose page changed meanwhile is not installed and clears its own
//! live bit, and whoever clears the last bit frees the object, so a crash
//! at any point leaves each slot with its old or its new group, and the
//! recovery scan rebuilds the live mask from the slots that name it.

use crate::codec::{Algo, Codec, CodecError};
use crate::config::Mode;
use crate::ctx::CtxState;
use crate::error::{Error, Result};
use crate::packed;
use crate::page::PAGE_SIZE;
use crate::page_range::{spans, PageRange};
use crate::read::read_entry;
use crate::secondary::MAX_SECONDARIES;
use crate::slot::{Entry, Kind, SlotGuard, ATIME_MASK, INCOMPRESSIBLE};
use crate::stats::Counter;
use crate::table::{Held, MovePoints, SlotTable};
use crate::write::{allocate_group, copy_objects};
use serde::Serialize;
use std::ops::Range;

/// A recompressed page is kept only if it is at least this share (percent)
/// smaller than before.
pub const MIN_SAVING_PERCENT: usize = 5;

/// Which pages a recompression considers (zram's `type=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RecompressType {
    /// Every page stored compressed or raw.
    #[default]
    All,
    /// Pages marked idle.
    Idle,
    /// Pages stored raw (huge).
    Huge,
    /// Pages stored raw and marked idle.
    HugeIdle,
}

crate::keyword::keywords!(RecompressType, "recompress type", {
    "all" => RecompressType::All,
    "idle" => RecompressType::Idle,
    "huge" => RecompressType::Huge,
    "huge_idle" => RecompressType::HugeIdle,
});

/// What to recompress, and with what.
#[derive(Debug, Clone)]
pub struct Recompress {
    /// The secondary algorithms, in the order they are tried (1 to
    /// [`MAX_SECONDARIES`]).
    pub algos: Vec<Algo>,
    /// Which pages.
    pub kind: RecompressType,
    /// Only pages whose object is at least this many bytes (0: any).
    pub threshold: usize,
    /// Try at most this many pages (0: no limit).
    pub max_pages: u64,
    /// Only pages in these ranges (none: the whole device), as
    /// `Writeback`'s `WritebackSelect::Pages` names them: the pages of a
    /// cgroup (`zblk recompress --cgroup`).
    pub pages: Vec<PageRange>,
}

impl Recompress {
    /// The pages to look at, of a device of `pages` pages: ascending,
    /// disjoint ranges; an error names a range past the device's end.
    fn spans(&self, pages: u64) -> Result<Vec<Range<u64>>> {
        match self.pages.is_empty() {
            true => Ok(std::iter::once(0..pages).collect()),
            false => spans(&self.pages, pages),
        }
    }
}

/// What a recompression did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RecompressReport {
    /// Pages it tried (selected by type and threshold).
    pub tried: u64,
    /// Pages it stored again with a secondary algorithm.
    pub recompressed: u64,
    /// Compressed bytes saved.
    pub saved_bytes: u64,
}

/// Whether `e` is a page `p` selects: compressed or raw, of the type and
/// size asked for, and held by an algorithm before `top` (the slot value of
/// the latest secondary that may take it: zram's priorities, where a page
/// recompressed with priority 1 may be again with priority 2, never with 1
/// or the primary).
fn selected(e: &Entry, p: &Recompress, top: u8) -> bool {
    let huge = e.kind == Kind::Huge;
    let kind_ok = match p.kind {
        RecompressType::All => true,
        RecompressType::Idle => e.idle,
        RecompressType::Huge => huge,
        RecompressType::HugeIdle => huge && e.idle,
    };
    // A huge page no secondary could shrink before is not tried again
    // (zram's `ZRAM_INCOMPRESSIBLE`): it is what writeback's
    // `incompressible` type moves out.
    let tried_in_vain = huge && e.n == INCOMPRESSIBLE;
    matches!(e.kind, Kind::Huge | Kind::Compressed | Kind::Packed)
        && !tried_in_vain
        && e.algo < top
        && kind_ok
        && e.len as usize >= p.threshold
}

/// The codecs of a recompression, in the order they are tried, each with
/// the slot value (`Entry::algo`) that names its algorithm.
pub(crate) type Codecs = [(u8, Box<dyn Codec>)];

/// The latest slot value among `codecs`: a per-page recompression selects
/// the pages held by an algorithm before it.
fn top(codecs: &Codecs) -> u8 {
    codecs.iter().map(|c| c.0).max().unwrap_or(0)
}

/// Recompresses the pages `p` selects with `codecs` (of `p.algos`), with
/// the maintenance thread state `st` (its codec is the primary); a packed
/// store (`mode`) into packed groups of at most `span` pages. An error
/// (a page range past the device's end) comes before any page is looked
/// at.
pub(crate) fn run(
    table: &SlotTable,
    st: &mut CtxState,
    codecs: &mut Codecs,
    p: &Recompress,
    mode: Mode,
    span: u64,
) -> Result<RecompressReport> {
    let pages = p.spans(table.pages())?.into_iter().flatten();
    if mode == Mode::Packed {
        debug_assert!(codecs.len() <= MAX_SECONDARIES);
        return Ok(run_packed(table, st, codecs, p, pages, span));
    }
    let mut r = RecompressReport::default();
    let mut page_buf = vec![0u8; PAGE_SIZE];
    let mut dst = vec![0u8; PAGE_SIZE];
    for page in pages {
        if p.max_pages != 0 && r.tried >= p.max_pages {
            break;
        }
        match recompress_page(table, st, codecs, p, page, &mut page_buf, &mut dst) {
            Ok(Outcome::Skipped) => {}
            Ok(Outcome::Tried) => r.tried += 1,
            Ok(Outcome::Kept(saved)) => {
                r.tried += 1;
                r.recompressed += 1;
                r.saved_bytes += saved;
            }
            // The page keeps its object: nothing is lost, only not smaller.
            Err(e) => log::warn!("recompression left page {page} as it was: {e}"),
        }
    }
    Ok(r)
}

/// What became of one page.
enum Outcome {
    /// Not selected.
    Skipped,
    /// Selected, but kept as it was.
    Tried,
    /// Stored again, this many bytes smaller.
    Kept(u64),
}

fn recompress_page(
    table: &SlotTable,
    st: &mut CtxState,
    codecs: &mut Codecs,
    p: &Recompress,
    page: u64,
    buf: &mut [u8],
    dst: &mut [u8],
) -> Result<Outcome> {
    // The object as it was, to tell at the switch whether the slot still
    // holds it (`Held::Bytes`).
    let mut was = [0u8; PAGE_SIZE];
    let (e, was_len) = {
        let guard = table.lock(page);
        let e = guard.entry();
        if !selected(&e, p, top(codecs)) {
            return Ok(Outcome::Skipped);
        }
        read_entry(table, st, page, &e, buf)?;
        (e, copy_object(table, &guard, &mut was))
    };
    let old = e.len as usize;
    let budget = old - old * MIN_SAVING_PERCENT / 100;
    let Some((algo, n)) = first_fitting(codecs, e.algo, buf, &mut dst[..budget])? else {
        mark_incompressible(table, page, &e);
        return Ok(Outcome::Tried);
    };
    let held = Held::Bytes(e, &was[..was_len]);
    if !install_compressed(table, st, page, held, algo, &dst[..n], buf)? {
        return Ok(Outcome::Tried);
    }
    let saved = (old - n) as u64;
    st.shard.add(Counter::RecompressSavedBytes, saved as i64);
    Ok(Outcome::Kept(saved))
}

/// Compresses `src` into `dst` with each of `codecs` after slot value
/// `after` (the algorithm holding the page) in turn until one fits (zram's
/// priorities): that one's slot value and the compressed length, or `None`
/// if none did.
fn first_fitting(
    codecs: &mut Codecs,
    after: u8,
    src: &[u8],
    dst: &mut [u8],
) -> Result<Option<(u8, usize)>> {
    for (algo, codec) in codecs.iter_mut().filter(|c| c.0 > after) {
        match codec.compress(src, dst)? {
            Some(n) if n > dst.len() || n == 0 => {
                return Err(Error::Codec(CodecError::overflow(n, dst.len())))
            }
            Some(n) => return Ok(Some((*algo, n))),
            None => {}
        }
    }
    Ok(None)
}

/// Stores page `page` (`data`) again as `compressed`, the output of the
/// secondary `algo` names, and puts it into the slot if the slot still
/// holds what `held` says was read; otherwise frees the new object.
/// Returns whether it was installed.
fn install_compressed(
    table: &SlotTable,
    st: &mut CtxState,
    page: u64,
    held: Held<'_>,
    algo: u8,
    compressed: &[u8],
    data: &[u8],
) -> Result<bool> {
    let alloc = table.allocator();
    st.with_plan(|st, plan| {
        let len = compressed.len() as u32;
        plan.entries.push(Entry::new(Kind::Compressed, len, 0));
        plan.sizes.push(len);
        plan.owners.push(page);
        allocate_group(plan, alloc)?;
        copy_objects(plan, alloc, compressed, data);
        crate::crash_point::point("recompress:planned");
        let new = Entry {
            algo,
            ..plan.entries[0]
        };
        let points = MovePoints {
            locked: "recompress:locked",
            released: Some("recompress:released"),
        };
        if !table.move_page(st, page, held, new, 0, points) {
            alloc.free_bulk(&plan.handles);
            return Ok(false);
        }
        Ok(true)
    })
}

/// A page read for a recompressed group: what its slot held, and the
/// bytes it took there.
struct Member {
    page: u64,
    /// Where a window that starts with this page starts: the first page
    /// of its packed group (so that recompressing whole groups rewrites
    /// them as they were, not shifted across two old groups each), or the
    /// page itself.
    window: u64,
    e: Entry,
    /// The id of the packed object it was in (0: a per-page object).
    id: u64,
    /// Its share of the compressed bytes it was stored in.
    old: u64,
    /// Pages live in its packed object when it was read (1 per page).
    live: u32,
}

/// Packed stores: gathers the selected pages window by window and stores
/// each window's pages again as one packed group of a secondary. A
/// window starts at its first page's group base (or the page, for a
/// per-page object) and spans `span` pages; a packed page of another
/// group (another base) closes it, so that each old group lands in one
/// window whole. An old group is recompressed only if every page still
/// live in it was selected: moving part of it would free none of its
/// bytes and add a new object (the rest is left for compaction, which
/// rewrites it only once it is less than half live).
fn run_packed(
    table: &SlotTable,
    st: &mut CtxState,
    codecs: &mut Codecs,
    p: &Recompress,
    selected_pages: impl Iterator<Item = u64>,
    span: u64,
) -> RecompressReport {
    let mut r = RecompressReport::default();
    let span = span.clamp(1, 64);
    let mut group: Vec<Member> = Vec::with_capacity(span as usize + 1);
    // One page more than a window holds: a page is read before it is
    // known whether it joins the window.
    let mut pages = vec![0u8; (span as usize + 1) * PAGE_SIZE];
    let mut dst = vec![0u8; span as usize * PAGE_SIZE];
    for page in selected_pages {
        if p.max_pages != 0 && r.tried + group.len() as u64 >= p.max_pages {
            break;
        }
        let k = group.len();
        let m = match gather(
            table,
            st,
            p,
            page,
            span,
            &mut pages[k * PAGE_SIZE..(k + 1) * PAGE_SIZE],
        ) {
            Ok(Some(m)) => m,
            Ok(None) => continue,
            // The page keeps its object: nothing is lost, only not smaller.
            Err(e) => {
                log::warn!("recompression left page {page} as it was: {e}");
                continue;
            }
        };
        if group.first().is_some_and(|f| !joins(f.window, &m, span)) {
            store_group(table, st, codecs, &mut group, &mut pages, &mut dst, &mut r);
            pages.copy_within(k * PAGE_SIZE..(k + 1) * PAGE_SIZE, 0);
        }
        group.push(m);
    }
    store_group(table, st, codecs, &mut group, &mut pages, &mut dst, &mut r);
    r
}

/// Whether member `m` joins the window that starts at `window`: a packed
/// page only if its group starts there too, a per-page object if it lies
/// within the window's span.
fn joins(window: u64, m: &Member, span: u64) -> bool {
    if m.id != 0 {
        m.window == window
    } else {
        m.page >= window && m.page - window < span
    }
}

/// Reads page `page` into `buf` if `p` selects it, under its lock (not as
/// an access).
fn gather(
    table: &SlotTable,
    st: &mut CtxState,
    p: &Recompress,
    page: u64,
    span: u64,
    buf: &mut [u8],
) -> Result<Option<Member>> {
    let guard = table.lock(page);
    let e = guard.entry();
    // Only the primary's pages: a group is stored by one secondary, which
    // would have to come after every member's.
    if !selected(&e, p, 1) {
        return Ok(None);
    }
    read_entry(table, st, page, &e, buf)?;
    let alloc = table.allocator();
    let (window, id, old, live) = match packed::place(alloc, &guard) {
        Some(at) => {
            let old = packed::share(e.len, e.n, at.pos) as u64;
            // A base that cannot be this page's (a corrupt header) makes
            // the window start at the page itself.
            let window = if at.base <= page && page - at.base < span {
                at.base
            } else {
                page
            };
            (window, at.id, old, at.live)
        }
        None => (page, 0, u64::from(e.len), 1),
    };
    Ok(Some(Member {
        page,
        window,
        e,
        id,
        old,
        live,
    }))
}

/// Drops from `group` (and `pages`, gathered in its order) the pages of
/// old packed groups that are not whole in it: counted against the live
/// pages their group had when they were read (a later discard only lowers
/// that, so a group found whole is whole).
fn keep_whole_groups(group: &mut Vec<Member>, pages: &mut [u8]) {
    let whole: Vec<bool> = group
        .iter()
        .map(|m| m.id == 0 || group.iter().filter(|o| o.id == m.id).count() as u32 >= m.live)
        .collect();
    let mut j = 0;
    for (i, &keep) in whole.iter().enumerate() {
        if keep {
            pages.copy_within(i * PAGE_SIZE..(i + 1) * PAGE_SIZE, j * PAGE_SIZE);
            group.swap(i, j);
            j += 1;
        }
    }
    group.truncate(j);
}

/// Compresses the gathered pages (`pages`, in the order of `group`)
/// together with the first secondary whose result saves at least
/// [`MIN_SAVING_PERCENT`], and installs the new group in every slot that
/// still holds what was read. Pages of old groups not whole in the window
/// are left as they are (not tried). Empties `group`.
fn store_group(
    table: &SlotTable,
    st: &mut CtxState,
    codecs: &mut Codecs,
    group: &mut Vec<Member>,
    pages: &mut [u8],
    dst: &mut [u8],
    r: &mut RecompressReport,
) {
    keep_whole_groups(group, pages);
    let k = group.len();
    if k == 0 {
        return;
    }
    r.tried += k as u64;
    match pack_and_install(table, st, codecs, group, &pages[..k * PAGE_SIZE], dst) {
        Ok((kept, saved)) => {
            r.recompressed += kept;
            r.saved_bytes += saved;
        }
        Err(e) => log::warn!(
            "recompression left pages {}..={} as they were: {e}",
            group[0].page,
            group[k - 1].page
        ),
    }
    group.clear();
}

/// The body of [`store_group`]: returns the pages installed and the
/// bytes they saved.
fn pack_and_install(
    table: &SlotTable,
    st: &mut CtxState,
    codecs: &mut Codecs,
    group: &[Member],
    pages: &[u8],
    dst: &mut [u8],
) -> Result<(u64, u64)> {
    let old: u64 = group.iter().map(|m| m.old).sum();
    let budget = ((old - old * MIN_SAVING_PERCENT as u64 / 100) as usize).min(dst.len());
    let Some((algo, clen)) = first_fitting(codecs, 0, pages, &mut dst[..budget])? else {
        return Ok((0, 0));
    };
    let alloc = table.allocator();
    let base = group[0].window;
    let allocated = st.with_plan(|_, plan| packed::allocate(&mut plan.handles, alloc, base, clen));
    let Some(h) = allocated? else {
        return Ok((0, 0));
    };
    let orig = group.iter().fold(0u64, |o, m| o | 1 << (m.page - base));
    let id = st.take_pack_id();
    // SAFETY: `h` is fresh from `allocate`, PACK_HEADER + clen bytes, and
    // in no slot yet.
    unsafe { packed::write_object(alloc, h, orig, base, id, &dst[..clen]) };
    crate::crash_point::point("recompress:group-written");
    let (mut kept, mut saved) = (0u64, 0i64);
    for (pos, m) in group.iter().enumerate() {
        let new = Entry {
            kind: Kind::Packed,
            len: clen as u32,
            val: h,
            idx: (m.page - base) as u8,
            n: group.len() as u8,
            algo,
            ..Entry::EMPTY
        };
        if install_member(table, st, m, new, pos) {
            kept += 1;
            saved += m.old as i64 - packed::share(new.len, new.n, pos);
        }
    }
    st.shard.add(Counter::RecompressSavedBytes, saved);
    Ok((kept, saved.max(0) as u64))
}

/// Puts `new` (at position `pos` of its group) into the slot of member
/// `m` if the slot still holds what `m` read; otherwise lets go of the
/// page's place in the new object. Returns whether it was installed.
fn install_member(
    table: &SlotTable,
    st: &mut CtxState,
    m: &Member,
    new: Entry,
    pos: usize,
) -> bool {
    let points = MovePoints {
        locked: "recompress:group-locked",
        released: None,
    };
    if !table.move_page(st, m.page, Held::PackedId(m.e, m.id), new, pos, points) {
        abandon(table, st, &new, pos);
        return false;
    }
    true
}

/// Clears the live bit of a page of the new group `new` that was not
/// installed, freeing the object if it was the last (every other page
/// was not installed either, or was overwritten since): its share is then
/// dead bytes like a discarded page's.
fn abandon(table: &SlotTable, st: &mut CtxState, new: &Entry, pos: usize) {
    let alloc = table.allocator();
    // SAFETY: the object is alive and stays put: this page's live bit is
    // still set (only this thread clears the bits of pages it has not
    // installed), so no holder frees it, and the slab's relocation leaves
    // it where it is while its live count exceeds its holders. It was
    // checked aligned by `allocate`.
    let (_, last) = unsafe { packed::clear_live(alloc, new) };
    let mine = packed::share(new.len, new.n, pos);
    if last {
        st.shard
            .add(Counter::PackedDeadBytes, -(new.len as i64 - mine));
        if let Some(h) = new.handle() {
            alloc.free_bulk(&[h]);
        }
    } else {
        st.shard.add(Counter::PackedDeadBytes, mine);
    }
}

/// Copies the per-page object the slot `guard` holds (locked by the
/// caller) to the front of `to`; returns its length (0 for any other
/// entry: per-page stores hold no packed ones).
fn copy_object(table: &SlotTable, guard: &SlotGuard<'_>, to: &mut [u8; PAGE_SIZE]) -> usize {
    let obj = table.object_bytes(guard).unwrap_or_default();
    to[..obj.len()].copy_from_slice(obj);
    obj.len()
}

/// Marks the huge page `e` of `page` as one no secondary algorithm
/// could shrink either, if its slot still holds it.
fn mark_incompressible(table: &SlotTable, page: u64, e: &Entry) {
    if e.kind != Kind::Huge {
        return;
    }
    let mut guard = table.lock(page);
    let cur = guard.entry();
    if cur.same_object(e) {
        guard.replace(Entry {
            n: INCOMPRESSIBLE,
            ..cur
        });
    }
}

/// Marks idle every stored page not accessed for at least `age` seconds
/// before `now` (every stored page if `age` is `None`), with the
/// maintenance thread state's shard for the gauge. Returns the pages newly
/// marked. Times are compared modulo 2^24 seconds, as slots keep them.
pub(crate) fn mark_idle(table: &SlotTable, st: &CtxState, now: u32, age: Option<u32>) -> u64 {
    let mut marked = 0;
    for page in 0..table.pages() {
        let mut guard = table.lock(page);
        let e = guard.entry();
        let old_enough = match age {
            None => true,
            Some(a) => now.wrapping_sub(e.atime) & ATIME_MASK >= a,
        };
        if old_enough && guard.set_idle() {
            marked += 1;
        }
    }
    st.shard.add(Counter::IdlePages, marked as i64);
    marked
}

/// Makes the idle marks say exactly "not accessed for `age` seconds":
/// marks the slots that old, clears the mark of the younger ones (their
/// access times stay). Returns (marked, cleared). The daemon's policy
/// uses it because one idle bit serves two thresholds (recompress after
/// R seconds, write back after W): a mark left from the smaller one
/// would otherwise select pages for the larger.
pub(crate) fn remark_idle(table: &SlotTable, st: &CtxState, now: u32, age: u32) -> (u64, u64) {
    let (mut marked, mut cleared) = (0u64, 0u64);
    for page in 0..table.pages() {
        let mut guard = table.lock(page);
        let old_enough = now.wrapping_sub(guard.entry().atime) & ATIME_MASK >= age;
        if old_enough {
            marked += u64::from(guard.set_idle());
        } else {
            cleared += u64::from(guard.clear_idle());
        }
    }
    st.shard
        .add(Counter::IdlePages, marked as i64 - cleared as i64);
    (marked, cleared)
}
