//! Compression groups: the write path for one batch of up to G pages.
//!
//! As in zswap's batched store, a multi-page write is cut into groups. For
//! each group: scan every page for a same-filled word, compress the rest
//! with the queue's own codec, make one bulk allocation for all objects,
//! copy them in, then install each page into its slot. Nothing is installed
//! until every allocation succeeded, so a group that cannot be stored leaves
//! every slot's old content in place.

use crate::alloc::Handle;
use crate::codec::CodecError;
use crate::ctx::CtxState;
use crate::error::{Error, Result};
use crate::packed::{self, PackHeader, PACK_HEADER};
use crate::page::{same_filled, PAGE_SIZE};
use crate::slot::{Entry, Kind};
use crate::stats::Counter;
use crate::store::{account, Mode, Store, MAX_GROUP_PAGES};

/// The planned content of each page of a group, and reused buffers.
#[derive(Debug, Default)]
pub struct GroupPlan {
    entries: Vec<Entry>,
    sizes: Vec<u32>,
    owners: Vec<u64>,
    handles: Vec<Handle>,
    results: Vec<Option<usize>>,
}

impl GroupPlan {
    /// Creates a plan with room for `g` pages.
    pub fn with_capacity(g: usize) -> Self {
        GroupPlan {
            entries: Vec::with_capacity(g),
            sizes: Vec::with_capacity(g),
            owners: Vec::with_capacity(g),
            handles: Vec::with_capacity(g),
            results: Vec::with_capacity(g),
        }
    }

    fn clear(&mut self) {
        self.entries.clear();
        self.sizes.clear();
        self.owners.clear();
        self.handles.clear();
        self.results.clear();
    }
}

/// Stores `data` (1..=G pages) at page `first`.
pub(crate) fn write_group(store: &Store, st: &mut CtxState, first: u64, data: &[u8]) -> Result<()> {
    st.plan.clear();
    if store.config().mode == Mode::Packed && write_packed(store, st, first, data)? {
        st.shard.add(Counter::Groups, 1);
        return Ok(());
    }
    st.plan.clear();
    compress_group(store, st, first, data)?;
    allocate_group(store, st)?;
    copy_objects(store, st, data);
    install_group(store, st, first);
    st.shard.add(Counter::Groups, 1);
    Ok(())
}

/// Classifies each page, then compresses those that are not same-filled
/// in one batch call to the queue's codec (an accelerator keeps them all in
/// flight at once), each into its own page-sized area of the scratch buffer.
fn compress_group(store: &Store, st: &mut CtxState, first: u64, data: &[u8]) -> Result<()> {
    let budget = store.config().huge_threshold - 1;
    let mut pages: [&[u8]; MAX_GROUP_PAGES] = [&[]; MAX_GROUP_PAGES];
    let mut k = 0;
    for (i, page) in data.chunks_exact(PAGE_SIZE).enumerate() {
        if let Some(word) = same_filled(page) {
            st.plan.entries.push(Entry::new(Kind::Same, 0, word));
        } else {
            pages[k] = page;
            k += 1;
            st.plan.entries.push(Entry::EMPTY);
            st.plan.owners.push(first + i as u64);
        }
    }
    let accel =
        st.codec
            .compress_batch(&pages[..k], &mut st.scratch, budget, &mut st.plan.results)?;
    let mut results = st.plan.results.iter();
    for e in st.plan.entries.iter_mut().filter(|e| e.kind == Kind::Empty) {
        *e = match results.next() {
            Some(Some(n)) => Entry::new(Kind::Compressed, *n as u32, 0),
            Some(None) => Entry::new(Kind::Huge, PAGE_SIZE as u32, 0),
            None => {
                return Err(Error::Codec(CodecError::Internal(
                    "codec returned too few results".into(),
                )))
            }
        };
        st.plan.sizes.push(e.len);
    }
    st.shard.add(Counter::SwPages, (k - accel) as i64);
    st.shard.add(Counter::AccelPages, accel as i64);
    Ok(())
}

/// One bulk allocation for every object of the group.
fn allocate_group(store: &Store, st: &mut CtxState) -> Result<()> {
    if st.plan.sizes.is_empty() {
        return Ok(());
    }
    store
        .allocator()
        .alloc_bulk(&st.plan.sizes, &st.plan.owners, &mut st.plan.handles)
        .map_err(|e| Error::NoSpace { limit: e.limit })
}

/// Copies compressed (or raw) bytes into the new objects and records each
/// handle in its entry. The j-th page that is not same-filled was
/// compressed into the j-th area of the scratch buffer.
fn copy_objects(store: &Store, st: &mut CtxState, data: &[u8]) {
    let mut handles = st.plan.handles.iter();
    let mut j = 0;
    for (i, e) in st.plan.entries.iter_mut().enumerate() {
        let area = j * PAGE_SIZE;
        let src = match e.kind {
            Kind::Compressed => &st.scratch[area..area + e.len as usize],
            Kind::Huge => &data[i * PAGE_SIZE..(i + 1) * PAGE_SIZE],
            Kind::Empty | Kind::Same | Kind::Packed => continue,
        };
        j += 1;
        let Some(&h) = handles.next() else {
            unreachable!("alloc_bulk returned one handle per size")
        };
        // SAFETY: the object is new and not yet visible to any other thread.
        unsafe { store.allocator().object(h, src.len()) }.copy_from_slice(src);
        e.val = h;
    }
}

/// Installs each page into its slot and releases what the slot held.
fn install_group(store: &Store, st: &mut CtxState, first: u64) {
    let mut pos = 0;
    for i in 0..st.plan.entries.len() {
        let new = st.plan.entries[i];
        let released = store.swap_slot(first + i as u64, new);
        account(&st.shard, &new, pos, 1);
        match new.kind {
            Kind::Huge => st.shard.add(Counter::HugePagesSince, 1),
            Kind::Packed => pos += 1,
            _ => {}
        }
        store.release(st, released);
    }
}

/// Packed mode: compresses the group's non-same-filled pages together into
/// one object. Returns false, having stored nothing, when packing does not
/// apply (fewer than two such pages, or they do not compress below the huge
/// threshold together): the caller then stores the group page by page.
fn write_packed(store: &Store, st: &mut CtxState, first: u64, data: &[u8]) -> Result<bool> {
    let mut orig = 0u64;
    let mut k = 0;
    for (i, page) in data.chunks_exact(PAGE_SIZE).enumerate() {
        if let Some(word) = same_filled(page) {
            st.plan.entries.push(Entry::new(Kind::Same, 0, word));
        } else {
            st.gather[k * PAGE_SIZE..(k + 1) * PAGE_SIZE].copy_from_slice(page);
            st.plan.entries.push(Entry::EMPTY);
            orig |= 1 << i;
            k += 1;
        }
    }
    if k < 2 {
        return Ok(false);
    }
    let budget = (k * store.config().huge_threshold - 1).min(st.scratch.len());
    let Some(clen) = st
        .codec
        .compress(&st.gather[..k * PAGE_SIZE], &mut st.scratch[..budget])?
    else {
        return Ok(false);
    };
    st.shard.add(Counter::SwPages, k as i64);
    let h = allocate_packed(store, st, first, clen)?;
    let Some(h) = h else {
        return Ok(false);
    };
    let hdr = PackHeader {
        orig,
        base: first,
        id: st.next_pack_id,
    };
    st.next_pack_id += 1;
    // SAFETY: the object is new and not yet visible to any other thread.
    let obj = unsafe { store.allocator().object(h, PACK_HEADER + clen) };
    hdr.write(obj);
    obj[PACK_HEADER..].copy_from_slice(&st.scratch[..clen]);
    for (i, e) in st.plan.entries.iter_mut().enumerate() {
        if orig & (1 << i) != 0 {
            *e = Entry {
                kind: Kind::Packed,
                len: clen as u32,
                val: h,
                idx: i as u8,
                n: k as u8,
            };
        }
    }
    install_group(store, st, first);
    Ok(true)
}

/// Allocates a packed object; `None` (object freed again) if the allocator
/// handed out memory not aligned for the header's atomic live mask.
fn allocate_packed(
    store: &Store,
    st: &mut CtxState,
    first: u64,
    clen: usize,
) -> Result<Option<Handle>> {
    let alloc = store.allocator();
    st.plan.handles.clear();
    alloc
        .alloc_bulk(
            &[(PACK_HEADER + clen) as u32],
            &[first],
            &mut st.plan.handles,
        )
        .map_err(|e| Error::NoSpace { limit: e.limit })?;
    let h = st.plan.handles[0];
    if packed::aligned(alloc, h) {
        return Ok(Some(h));
    }
    log::warn!("allocator returned an unaligned object: storing the group per page");
    alloc.free_bulk(&[h]);
    Ok(None)
}

/// The compactor's pass over packed groups: every page of a group with
/// fewer than half its pages live is stored again on its own, so that the
/// dead pages' bytes are freed once the last live page has moved.
pub(crate) fn rewrite_sparse_groups(store: &Store, st: &mut CtxState) {
    let mut page_buf = vec![0u8; PAGE_SIZE];
    for page in 0..store.pages() {
        if let Err(e) = rewrite_if_sparse(store, st, page, &mut page_buf) {
            // The page keeps its packed copy: nothing is lost, only not moved.
            log::warn!("compaction left page {page} packed: {e}");
        }
    }
}

/// Rewrites one page if it lives in a sparse packed group. The page is read
/// under its lock, stored unlocked, and installed only if the slot still
/// holds the very same object (same id): a concurrent write wins.
fn rewrite_if_sparse(store: &Store, st: &mut CtxState, page: u64, buf: &mut [u8]) -> Result<()> {
    let (e, id) = {
        let guard = store.slot(page).lock();
        let e = guard.entry();
        // SAFETY: the slot lock keeps a referenced packed object alive.
        if e.kind != Kind::Packed
            || unsafe { packed::live_count(store.allocator(), e.val) } * 2 >= e.n as u32
        {
            return Ok(());
        }
        store.read_entry(st, page, &e, buf)?;
        (e, packed_id(store, &e))
    };
    st.plan.clear();
    compress_group(store, st, page, buf)?;
    allocate_group(store, st)?;
    copy_objects(store, st, buf);
    let new = st.plan.entries[0];
    let mut guard = store.slot(page).lock();
    let cur = guard.entry();
    if cur != e || packed_id(store, &cur) != id {
        drop(guard);
        store.allocator().free_bulk(&st.plan.handles);
        return Ok(());
    }
    let released = store.take_locked(&mut guard, new);
    drop(guard);
    account(&st.shard, &new, 0, 1);
    store.release(st, released);
    st.shard.add(Counter::PackedPagesRewritten, 1);
    Ok(())
}

/// The id of the packed object `e` references (0 for anything else). The
/// caller holds the slot's lock.
fn packed_id(store: &Store, e: &Entry) -> u64 {
    if e.kind != Kind::Packed {
        return 0;
    }
    // SAFETY: the caller's slot lock keeps the object alive.
    PackHeader::read(unsafe { store.allocator().object(e.val, PACK_HEADER) }).id
}
