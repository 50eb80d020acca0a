//! Compaction of packed groups: the store's half of `zblk compact`.
//!
//! The allocator compacts by moving objects (`crate::slab::compact`, through
//! `SlotTable`'s [`crate::alloc::Relocate`]); a packed object, though, can
//! only shrink by being rewritten. Every page of a group with fewer than
//! half its pages live is stored again on its own, so that the dead pages'
//! bytes are freed once the last live page has moved.

use crate::config::StoreConfig;
use crate::ctx::CtxState;
use crate::error::Result;
use crate::packed;
use crate::page::PAGE_SIZE;
use crate::read::read_entry;
use crate::stats::Counter;
use crate::table::{Held, MovePoints, SlotTable};
use crate::write::plan_per_page;

/// Rewrites every page of every sparse packed group, with the compactor's
/// own thread state.
pub(crate) fn rewrite_sparse_groups(table: &SlotTable, cfg: &StoreConfig, st: &mut CtxState) {
    let mut page_buf = vec![0u8; PAGE_SIZE];
    for page in 0..table.pages() {
        if let Err(e) = rewrite_if_sparse(table, cfg, st, page, &mut page_buf) {
            // The page keeps its packed copy: nothing is lost, only not moved.
            log::warn!("compaction left page {page} packed: {e}");
        }
    }
}

/// Rewrites one page if it lives in a sparse packed group. The page is read
/// under its lock, stored unlocked, and installed only if the slot still
/// holds the very same object (same id): a concurrent write wins.
fn rewrite_if_sparse(
    table: &SlotTable,
    cfg: &StoreConfig,
    st: &mut CtxState,
    page: u64,
    buf: &mut [u8],
) -> Result<()> {
    let alloc = table.allocator();
    let (e, id) = {
        let guard = table.lock(page);
        let e = guard.entry();
        if !packed::is_sparse(alloc, &guard) {
            return Ok(());
        }
        read_entry(table, st, page, &e, buf)?;
        (e, packed::object_id(alloc, &guard))
    };
    let held = Held::PackedId(e, id);
    st.with_plan(|st, plan| {
        plan_per_page(cfg, st, plan, alloc, page, buf)?;
        crate::crash_point::point("rewrite:planned");
        let points = MovePoints {
            locked: "rewrite:locked",
            released: Some("rewrite:released"),
        };
        if !table.move_page(st, page, held, plan.entries[0], 0, points) {
            alloc.free_bulk(&plan.handles);
            return Ok(());
        }
        st.shard.add(Counter::PackedPagesRewritten, 1);
        Ok(())
    })
}
