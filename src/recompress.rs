//! Recompression: the store's half of `zblk recompress` (zram's
//! `recompress`), and idle marking (zram's `idle` file).
//!
//! Recompression stores chosen pages again with the store's secondary
//! algorithm (a stronger one: `zstd:9`, `deflate:9`) and keeps the result
//! only when it is at least [`MIN_SAVING_PERCENT`] percent smaller than
//! what the page has now: a smaller gain would cost a slower decompression
//! on every later read for almost no memory. The slot then says that the
//! secondary holds it (`Entry::algo` 1), which is what reads decode with.
//!
//! A page is read under its lock (not as an access: its time and idle mark
//! stay), compressed and allocated unlocked, and installed only if its slot
//! still holds the very same object, as compaction's rewrite does
//! (`crate::compact`): a concurrent write or discard wins. Per-page stores
//! only: a packed group would have to be unpacked first (not built yet).

use crate::codec::{Algo, Codec};
use crate::ctx::CtxState;
use crate::error::{Error, Result};
use crate::page::PAGE_SIZE;
use crate::read::read_entry;
use crate::slot::{Entry, Kind, ATIME_MASK, INCOMPRESSIBLE};
use crate::stats::Counter;
use crate::table::SlotTable;
use serde::Serialize;

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

impl std::str::FromStr for RecompressType {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s {
            "all" => Ok(RecompressType::All),
            "idle" => Ok(RecompressType::Idle),
            "huge" => Ok(RecompressType::Huge),
            "huge_idle" => Ok(RecompressType::HugeIdle),
            _ => Err(format!(
                "unknown recompress type '{s}': expected all, idle, huge or huge_idle"
            )),
        }
    }
}

/// What to recompress, and with what.
#[derive(Debug, Clone)]
pub struct Recompress {
    /// The secondary algorithm.
    pub algo: Algo,
    /// Which pages.
    pub kind: RecompressType,
    /// Only pages whose object is at least this many bytes (0: any).
    pub threshold: usize,
    /// Try at most this many pages (0: no limit).
    pub max_pages: u64,
}

/// What a recompression did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RecompressReport {
    /// Pages it tried (selected by type and threshold).
    pub tried: u64,
    /// Pages it stored again with the secondary algorithm.
    pub recompressed: u64,
    /// Compressed bytes saved.
    pub saved_bytes: u64,
}

/// Whether `e` is a page `p` selects: held by the primary algorithm,
/// compressed or raw, of the type and size asked for.
fn selected(e: &Entry, p: &Recompress) -> bool {
    let huge = e.kind == Kind::Huge;
    let kind_ok = match p.kind {
        RecompressType::All => true,
        RecompressType::Idle => e.idle,
        RecompressType::Huge => huge,
        RecompressType::HugeIdle => huge && e.idle,
    };
    // A huge page the secondary could not shrink before is not tried again
    // (zram's `ZRAM_INCOMPRESSIBLE`): it is what writeback's
    // `incompressible` type moves out.
    let tried_in_vain = huge && e.n == INCOMPRESSIBLE;
    matches!(e.kind, Kind::Huge | Kind::Compressed)
        && !tried_in_vain
        && e.algo == 0
        && kind_ok
        && e.len as usize >= p.threshold
}

/// Recompresses the pages `p` selects with `codec` (of `p.algo`), with
/// the maintenance thread state `st` (its codec is the primary).
pub(crate) fn run(
    table: &SlotTable,
    st: &mut CtxState,
    codec: &mut dyn Codec,
    p: &Recompress,
) -> RecompressReport {
    let mut r = RecompressReport::default();
    let mut page_buf = vec![0u8; PAGE_SIZE];
    let mut dst = vec![0u8; PAGE_SIZE];
    for page in 0..table.pages() {
        if p.max_pages != 0 && r.tried >= p.max_pages {
            break;
        }
        match recompress_page(table, st, codec, p, page, &mut page_buf, &mut dst) {
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
    r
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
    codec: &mut dyn Codec,
    p: &Recompress,
    page: u64,
    buf: &mut [u8],
    dst: &mut [u8],
) -> Result<Outcome> {
    let e = {
        let guard = table.lock(page);
        let e = guard.entry();
        if !selected(&e, p) {
            return Ok(Outcome::Skipped);
        }
        read_entry(table, st, page, &e, buf)?;
        e
    };
    let old = e.len as usize;
    let budget = old - old * MIN_SAVING_PERCENT / 100;
    let n = match codec.compress(buf, &mut dst[..budget])? {
        Some(n) => n,
        None => {
            mark_incompressible(table, page, &e);
            return Ok(Outcome::Tried);
        }
    };
    let alloc = table.allocator();
    st.plan.clear();
    st.plan.sizes.push(n as u32);
    st.plan.owners.push(page);
    alloc
        .alloc_bulk(&st.plan.sizes, &st.plan.owners, &mut st.plan.handles)
        .map_err(|e| Error::NoSpace { limit: e.limit })?;
    let Some(&h) = st.plan.handles.first() else {
        unreachable!("alloc_bulk returned one handle per size")
    };
    // SAFETY: the object is fresh, of `n` bytes, and in no slot yet.
    unsafe { alloc.write_fresh(h, 0, &dst[..n]) };
    crate::inject::point("recompress:planned");
    let mut guard = table.lock(page);
    let cur = guard.entry();
    if !cur.same_object(&e) {
        drop(guard);
        alloc.free_bulk(&st.plan.handles);
        return Ok(Outcome::Tried);
    }
    let new = Entry {
        kind: Kind::Compressed,
        len: n as u32,
        val: h,
        algo: 1,
        idle: cur.idle,
        atime: cur.atime,
        ..Entry::EMPTY
    };
    let released = table.take_locked(&mut guard, new);
    crate::inject::point("recompress:locked");
    drop(guard);
    table.entered(st, &new, 0);
    table.release(st, released);
    crate::inject::point("recompress:released");
    let saved = (old - n) as u64;
    st.shard.add(Counter::RecompressSavedBytes, saved as i64);
    Ok(Outcome::Kept(saved))
}

/// Marks the huge page `e` of `page` as one the secondary algorithm
/// could not shrink either, if its slot still holds it.
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
