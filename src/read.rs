//! The read path: one page from what its slot holds.
//!
//! zram's `zram_read_page`: under the slot's lock (so a read sees one whole
//! version of the page), an empty slot reads as zeros, a same-filled one is
//! filled with its word, a huge one is copied, a compressed one is
//! decompressed into the caller's buffer, and a packed one comes from its
//! group (`crate::packed`). A page recompressed with the store's secondary
//! algorithm (`Entry::algo` 1) is decompressed by that algorithm's codec.
//!
//! A read is an access: it stamps the slot with the request's time and
//! clears its idle mark, in the guard, so the unlocking store carries it.

use crate::ctx::CtxState;
use crate::error::{Error, Result};
use crate::page::{fill_word, PAGE_SIZE};
use crate::slot::{Entry, Kind};
use crate::stats::Counter;
use crate::table::SlotTable;

/// Reads page `page` into `out` under its slot's lock.
pub(crate) fn read_page(
    table: &SlotTable,
    st: &mut CtxState,
    page: u64,
    out: &mut [u8],
) -> Result<()> {
    let mut guard = table.lock(page);
    if guard.touch(st.now) {
        st.shard.add(Counter::IdlePages, -1);
    }
    read_entry(table, st, page, &guard.entry(), out)
}

/// Produces the page `e` stores into `out`; on failure `out` is zeroed, so
/// a partly decoded page is never handed out. The caller holds the lock of
/// the slot `e` was read from.
pub(crate) fn read_entry(
    table: &SlotTable,
    st: &mut CtxState,
    page: u64,
    e: &Entry,
    out: &mut [u8],
) -> Result<()> {
    let alloc = table.allocator();
    let r = match e.kind {
        Kind::Empty => {
            out.fill(0);
            Ok(())
        }
        Kind::Same => {
            fill_word(out, e.val);
            Ok(())
        }
        Kind::Huge => {
            // SAFETY: the caller's slot lock keeps the page-sized object
            // alive and in place; published objects are never written.
            out.copy_from_slice(unsafe { alloc.bytes(e.val, 0, PAGE_SIZE) });
            Ok(())
        }
        Kind::Compressed => {
            // SAFETY: as above, for the object's `len` bytes.
            let obj = unsafe { alloc.bytes(e.val, 0, e.len as usize) };
            let codec = match e.algo {
                0 => Some(&mut st.codec),
                1 => st.secondary_codec(),
                _ => None,
            };
            match codec {
                Some(c) => c.decompress(obj, out).map_err(|err| err.to_string()),
                None => Err(format!(
                    "the slot names algorithm {} which this store does not have",
                    e.algo
                )),
            }
        }
        Kind::Packed => crate::packed::read_page(st, alloc, e, out),
    };
    r.map_err(|detail| {
        out.fill(0);
        Error::Corrupt { page, detail }
    })
}
