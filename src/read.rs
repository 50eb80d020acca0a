//! The read path: one page from what its slot holds.
//!
//! zram's `zram_read_page`: under the slot's lock (so a read sees one whole
//! version of the page), an empty slot reads as zeros, a same-filled one is
//! filled with its word, a huge one is copied, a compressed one is
//! decompressed into the caller's buffer, and a packed one comes from its
//! group (`crate::packed`). A page recompressed with the store's secondary
//! algorithm (`Entry::algo` 1) is decompressed by that algorithm's codec.
//!
//! A written-back page (`Kind::Backed`) is read from its block of the
//! backing store, checked against the slot's CRC and decoded; a page of
//! a written-back packed group (`Kind::BackedGroup`) the same way from its
//! group's blocks, unless the thread's group cache holds that group. Which
//! blocks to read ([`backed_blocks`]) and decoding the page from them
//! ([`decode_backed`]) are apart, for a caller that issues the read
//! itself. It stays on the backing store, as in zram: a swapped-in page is usually
//! discarded from swap soon after, so copying it back to RAM would be an
//! allocation on the read path (which must not call the allocator under a
//! slot lock, nor allocate while the system is short of memory) for a page
//! about to die; a page that is written again comes back to RAM anyway.
//!
//! A read is an access: it stamps the slot with the request's time and
//! clears its idle mark, in the guard, so the unlocking store carries it.
//!
//! Maintenance (recompression, compaction) reads the blocks here, under
//! the slot's lock (so that they cannot be freed and reused meanwhile).
//! A request does not wait for a written-back page's blocks under a lock:
//! [`read_page_or_backed`] hands the page back as a [`BackedRead`] (its
//! slot's entry, taken under the lock, and its blocks: one for a per-page
//! object, a packed group's run of up to its pages and two) unless the
//! thread's group cache holds its group, and the caller reads the blocks
//! however it likes (the daemon through its queue's io_uring, so a slow
//! or dead link holds up that one request, not the queue). [`finish_backed`] then locks the slot again and decodes the
//! block only if the slot still holds that very entry: a page written,
//! discarded or moved meanwhile is read again from what its slot holds
//! now, and a block freed and reused meanwhile is never decoded as the
//! page (the entry changed, and the CRC names the page).

use crate::backing::{object_crc, Extent};
use crate::ctx::CtxState;
use crate::error::{Error, Result};
use crate::page::{fill_word, PAGE_SIZE};
use crate::slot::{Entry, Kind};
use crate::stats::{Counter, Phase};
use crate::table::{backed_extent, SlotTable};

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
            decompress(st, e.algo, obj, out)
        }
        Kind::Packed => crate::packed::read_page(st, alloc, e, out),
        Kind::Backed | Kind::BackedGroup => read_backed(table, st, page, e, out),
    };
    r.map_err(|detail| {
        out.fill(0);
        Error::Corrupt { page, detail }
    })
}

/// Decompresses `obj` with the codec of `algo` (0 the primary, 1 the
/// secondary) into `out`, timed as [`Phase::Decode`].
fn decompress(
    st: &mut CtxState,
    algo: u8,
    obj: &[u8],
    out: &mut [u8],
) -> std::result::Result<(), String> {
    let t = st.clock();
    let r = decode_with(st, algo, obj, out);
    st.lap(Phase::Decode, t);
    r
}

/// [`decompress`]'s codec call.
fn decode_with(
    st: &mut CtxState,
    algo: u8,
    obj: &[u8],
    out: &mut [u8],
) -> std::result::Result<(), String> {
    let codec = match algo {
        0 => Some(&mut st.codec),
        a => st.secondary_codec(a),
    };
    match codec {
        Some(c) => c.decompress(obj, out).map_err(|err| err.to_string()),
        None => Err(format!(
            "the slot names algorithm {algo} which this store does not have"
        )),
    }
}

/// A written-back page whose blocks its reader reads itself: the slot's
/// entry when it was looked at (under its lock), and where its object is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BackedRead {
    /// The page.
    pub(crate) page: u64,
    /// Its slot's entry then (`Kind::Backed` or `Kind::BackedGroup`).
    pub(crate) entry: Entry,
    /// The blocks its object lies in ([`backed_blocks`] of `entry`).
    place: Extent,
}

impl BackedRead {
    /// The blocks to read: the first one's byte offset in the backing
    /// store.
    pub(crate) fn block_offset(&self) -> u64 {
        u64::from(self.place.block) * crate::page::PAGE_SIZE_U64
    }

    /// Those blocks (one for a per-page object, which never crosses a
    /// block; up to the group's pages and two for a packed group).
    pub(crate) fn blocks(&self) -> std::ops::Range<u32> {
        self.place.blocks()
    }

    /// How many bytes they are.
    pub(crate) fn bytes(&self) -> usize {
        self.blocks().len() * PAGE_SIZE
    }
}

/// What [`read_page_or_backed`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PageRead {
    /// The page is in the caller's buffer.
    Done,
    /// The page is written back: its block is the caller's to read.
    Backed(BackedRead),
}

/// [`read_page`], except that a written-back page (unless the thread's
/// group cache holds its group) is handed back with its slot's entry
/// instead of being read here.
pub(crate) fn read_page_or_backed(
    table: &SlotTable,
    st: &mut CtxState,
    page: u64,
    out: &mut [u8],
) -> Result<PageRead> {
    let mut guard = table.lock(page);
    if guard.touch(st.now) {
        st.shard.add(Counter::IdlePages, -1);
    }
    let e = guard.entry();
    match e.kind {
        Kind::BackedGroup if crate::packed::cached_backed_page(st, &e, out) => Ok(PageRead::Done),
        Kind::Backed | Kind::BackedGroup => match backed_blocks(&e) {
            Ok(place) => Ok(PageRead::Backed(BackedRead {
                page,
                entry: e,
                place,
            })),
            Err(detail) => {
                out.fill(0);
                Err(Error::Corrupt { page, detail })
            }
        },
        _ => read_entry(table, st, page, &e, out).map(|()| PageRead::Done),
    }
}

/// Decodes `r`'s page out of `block` (the bytes of its block, read since
/// [`read_page_or_backed`] gave `r`) into `out`: `Ok(false)` if its slot
/// no longer holds `r.entry` (read the page again); on failure `out` is
/// zeroed.
pub(crate) fn finish_backed(
    table: &SlotTable,
    st: &mut CtxState,
    r: &BackedRead,
    block: &[u8],
    out: &mut [u8],
) -> Result<bool> {
    let guard = table.lock(r.page);
    if guard.entry() != r.entry {
        return Ok(false);
    }
    st.shard.add(Counter::BdReads, 1);
    object_of(&r.entry, block)
        .and_then(|obj| decode_backed(st, r.page, &r.entry, obj, out))
        .map_err(|detail| {
            out.fill(0);
            Error::Corrupt {
                page: r.page,
                detail,
            }
        })?;
    Ok(true)
}

/// Reads the written-back page `e` of slot `page` from the backing store,
/// here and under the caller's lock: its block (a packed group's blocks,
/// unless the thread's group cache holds the group), its object checked
/// against its CRC (a corrupt or truncated backing store fails the read,
/// never gives a wrong page).
fn read_backed(
    table: &SlotTable,
    st: &mut CtxState,
    page: u64,
    e: &Entry,
    out: &mut [u8],
) -> std::result::Result<(), String> {
    if e.kind == Kind::BackedGroup && crate::packed::cached_backed_page(st, e, out) {
        return Ok(());
    }
    let Some(backing) = table.backing() else {
        return Err("the page is written back but the store has no backing device".into());
    };
    let place = backed_blocks(e)?;
    let Some(mut buf) = st.bd_buf.take() else {
        return Err("this queue has no backing read buffer".into());
    };
    let r = backing
        .read_blocks(place.blocks(), &mut buf)
        .and_then(|()| {
            st.shard.add(Counter::BdReads, 1);
            let bytes = &buf.as_slice()[place.off..place.off + place.len];
            decode_backed(st, page, e, bytes, out)
        });
    st.bd_buf = Some(buf);
    r
}

/// Which blocks of the backing store a read of the written-back page `e`
/// needs, and where its object lies in them; an error for a slot that
/// names no place a writeback makes.
pub(crate) fn backed_blocks(e: &Entry) -> std::result::Result<Extent, String> {
    backed_extent(e).ok_or_else(|| {
        format!(
            "the slot names {} bytes at an impossible place of the backing store",
            e.len
        )
    })
}

/// Produces page `page`, whose slot holds the written-back entry `e`,
/// from `bytes`, its object as read from the blocks [`backed_blocks`]
/// named (from the object's first byte): checks its CRC and decodes.
pub(crate) fn decode_backed(
    st: &mut CtxState,
    page: u64,
    e: &Entry,
    bytes: &[u8],
    out: &mut [u8],
) -> std::result::Result<(), String> {
    if e.kind == Kind::BackedGroup {
        return crate::packed::read_backed_page(st, page, e, bytes, out);
    }
    let at = e.backed_at();
    if object_crc(page, bytes) != at.crc {
        return Err(format!("backing block {} fails its checksum", at.block));
    }
    if bytes.len() == PAGE_SIZE {
        out.copy_from_slice(bytes);
        return Ok(());
    }
    decompress(st, e.algo, bytes, out)
}

/// The object of the written-back entry `e` in `block`, the bytes read
/// from the first of the blocks [`backed_blocks`] names.
fn object_of<'b>(e: &Entry, block: &'b [u8]) -> std::result::Result<&'b [u8], String> {
    let place = backed_blocks(e)?;
    block.get(place.off..place.off + place.len).ok_or_else(|| {
        format!(
            "backing block {} read short: {} bytes",
            place.block,
            block.len()
        )
    })
}
