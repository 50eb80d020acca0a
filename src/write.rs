//! The write path: one compression group of up to G pages into its slots.
//!
//! As in zswap's batched store, a multi-page write is cut into groups
//! (`QueueCtx::write`). For each group ([`write_group`]): in packed mode, try
//! to pack it into one object (`crate::packed`); otherwise scan every page
//! for a same-filled word, compress the rest with the queue's own codec in
//! one batch call ([`compress_group`]), make one bulk allocation for all
//! objects ([`allocate_group`]), copy them in ([`copy_objects`]), then
//! install each page into its slot (`SlotTable::install_group`). Nothing is
//! installed until every allocation succeeded, so a group that cannot be
//! stored leaves every slot's old content in place.

use crate::alloc::ObjAllocator;
use crate::codec::CodecError;
use crate::config::{Mode, StoreConfig, MAX_GROUP_PAGES};
use crate::ctx::{CtxState, GroupPlan};
use crate::error::{Error, Result};
use crate::packed;
use crate::page::{same_filled, PAGE_SIZE};
use crate::slot::{Entry, Kind};
use crate::stats::{Counter, Phase};
use crate::table::SlotTable;

/// Stores `data` (1..=G pages) at page `first`.
pub(crate) fn write_group(
    table: &SlotTable,
    cfg: &StoreConfig,
    st: &mut CtxState,
    first: u64,
    data: &[u8],
) -> Result<()> {
    st.with_plan(|st, plan| {
        let alloc = table.allocator();
        let packed = cfg.mode == Mode::Packed
            && packed::pack_group(st, plan, alloc, cfg.huge_threshold, first, data)?;
        if !packed {
            plan.clear();
            plan_per_page(cfg, st, plan, alloc, first, data)?;
        }
        crate::crash_point::point("write:planned");
        let t = st.clock();
        table.install_group(st, &plan.entries, first);
        st.lap(Phase::Install, t);
        st.shard.add(Counter::Groups, 1);
        Ok(())
    })
}

/// Plans `data` (pages from `first`) into the empty `plan` as one object
/// per page, allocated and filled but not yet installed: `plan.entries`
/// says what each slot is to hold, `plan.handles` lists the new objects.
pub(crate) fn plan_per_page(
    cfg: &StoreConfig,
    st: &mut CtxState,
    plan: &mut GroupPlan,
    alloc: &dyn ObjAllocator,
    first: u64,
    data: &[u8],
) -> Result<()> {
    compress_group(cfg, st, plan, first, data)?;
    let t = st.clock();
    allocate_group(plan, alloc)?;
    let t = st.lap(Phase::Alloc, t);
    copy_objects(plan, alloc, &st.scratch, data);
    st.lap(Phase::Copy, t);
    Ok(())
}

/// Classifies each page, then compresses those that are not same-filled
/// in one batch call to the queue's codec (an accelerator keeps them all in
/// flight at once), each into its own page-sized area of the scratch buffer.
fn compress_group(
    cfg: &StoreConfig,
    st: &mut CtxState,
    plan: &mut GroupPlan,
    first: u64,
    data: &[u8],
) -> Result<()> {
    let budget = cfg.huge_threshold - 1;
    let mut pages: [&[u8]; MAX_GROUP_PAGES] = [&[]; MAX_GROUP_PAGES];
    let mut k = 0;
    for (i, page) in data.chunks_exact(PAGE_SIZE).enumerate() {
        if let Some(word) = same_filled(page) {
            plan.entries.push(Entry::new(Kind::Same, 0, word));
        } else {
            pages[k] = page;
            k += 1;
            plan.entries.push(Entry::EMPTY);
            plan.owners.push(first + i as u64);
        }
    }
    let t = st.clock();
    let accel = st
        .codec
        .compress_batch(&pages[..k], &mut st.scratch, budget, &mut plan.results)?;
    st.lap(Phase::Compress, t);
    let mut results = plan.results.iter();
    for e in plan.entries.iter_mut().filter(|e| e.kind == Kind::Empty) {
        *e = match results.next() {
            Some(Some(n)) if *n <= budget => Entry::new(Kind::Compressed, *n as u32, 0),
            Some(Some(n)) => return Err(Error::Codec(CodecError::overflow(*n, budget))),
            Some(None) => Entry::new(Kind::Huge, PAGE_SIZE as u32, 0),
            None => {
                return Err(Error::Codec(CodecError::Internal(
                    "codec returned too few results".into(),
                )))
            }
        };
        plan.sizes.push(e.len);
    }
    st.shard.add(Counter::SwPages, (k - accel) as i64);
    st.shard.add(Counter::AccelPages, accel as i64);
    Ok(())
}

/// One bulk allocation for every object `plan.sizes` lists, into
/// `plan.handles`.
pub(crate) fn allocate_group(plan: &mut GroupPlan, alloc: &dyn ObjAllocator) -> Result<()> {
    if plan.sizes.is_empty() {
        return Ok(());
    }
    alloc
        .alloc_bulk(&plan.sizes, &plan.owners, &mut plan.handles)
        .map_err(|e| Error::NoSpace { limit: e.limit })
}

/// Copies compressed (or raw) bytes into the new objects and records each
/// handle in its entry. The j-th page of `data` that is not same-filled
/// was compressed (if it is not huge) into the j-th page-sized area of
/// `compressed`.
pub(crate) fn copy_objects(
    plan: &mut GroupPlan,
    alloc: &dyn ObjAllocator,
    compressed: &[u8],
    data: &[u8],
) {
    let mut handles = plan.handles.iter();
    let mut j = 0;
    for (i, e) in plan.entries.iter_mut().enumerate() {
        let area = j * PAGE_SIZE;
        let src = match e.kind {
            Kind::Compressed => &compressed[area..area + e.len as usize],
            Kind::Huge => &data[i * PAGE_SIZE..(i + 1) * PAGE_SIZE],
            Kind::Empty | Kind::Same | Kind::Packed | Kind::Backed | Kind::BackedGroup => continue,
        };
        j += 1;
        let Some(&h) = handles.next() else {
            unreachable!("alloc_bulk returned one handle per size")
        };
        // SAFETY: the object is fresh, of `src.len()` bytes, and its handle
        // is in no slot yet: no other thread can reach it.
        unsafe { alloc.write_fresh(h, 0, src) };
        e.val = h;
    }
}
