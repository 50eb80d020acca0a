//! Compression groups: the write path for one batch of up to G pages.
//!
//! As in zswap's batched store, a multi-page write is cut into groups. For
//! each group: scan every page for a same-filled word, compress the rest
//! with the queue's own codec, make one bulk allocation for all objects,
//! copy them in, then install each page into its slot. Nothing is installed
//! until every allocation succeeded, so a group that cannot be stored leaves
//! every slot's old content in place.

use crate::alloc::Handle;
use crate::ctx::CtxState;
use crate::error::{Error, Result};
use crate::page::{same_filled, PAGE_SIZE};
use crate::slot::{Entry, Kind};
use crate::stats::Counter;
use crate::store::{account, Store};

/// The planned content of each page of a group, and reused buffers.
#[derive(Debug, Default)]
pub struct GroupPlan {
    entries: Vec<Entry>,
    sizes: Vec<u32>,
    owners: Vec<u64>,
    handles: Vec<Handle>,
}

impl GroupPlan {
    /// Creates a plan with room for `g` pages.
    pub fn with_capacity(g: usize) -> Self {
        GroupPlan {
            entries: Vec::with_capacity(g),
            sizes: Vec::with_capacity(g),
            owners: Vec::with_capacity(g),
            handles: Vec::with_capacity(g),
        }
    }

    fn clear(&mut self) {
        self.entries.clear();
        self.sizes.clear();
        self.owners.clear();
        self.handles.clear();
    }
}

/// Stores `data` (1..=G pages) at page `first`.
pub(crate) fn write_group(store: &Store, st: &mut CtxState, first: u64, data: &[u8]) -> Result<()> {
    st.plan.clear();
    compress_group(store, st, first, data)?;
    allocate_group(store, st)?;
    copy_objects(store, st, data);
    install_group(store, st, first);
    st.shard.add(Counter::Groups, 1);
    Ok(())
}

/// Classifies each page and compresses those that are not same-filled into
/// the page's own area of the scratch buffer.
fn compress_group(store: &Store, st: &mut CtxState, first: u64, data: &[u8]) -> Result<()> {
    let budget = store.config().huge_threshold - 1;
    for (i, page) in data.chunks_exact(PAGE_SIZE).enumerate() {
        let entry = if let Some(word) = same_filled(page) {
            Entry {
                kind: Kind::Same,
                len: 0,
                val: word,
            }
        } else {
            let area = &mut st.scratch[i * PAGE_SIZE..i * PAGE_SIZE + budget];
            match st.codec.compress(page, area)? {
                Some(n) => Entry {
                    kind: Kind::Compressed,
                    len: n as u32,
                    val: 0,
                },
                None => Entry {
                    kind: Kind::Huge,
                    len: PAGE_SIZE as u32,
                    val: 0,
                },
            }
        };
        if entry.kind != Kind::Same {
            st.plan.sizes.push(entry.len);
            st.plan.owners.push(first + i as u64);
        }
        st.plan.entries.push(entry);
    }
    st.shard.add(Counter::SwPages, st.plan.sizes.len() as i64);
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
/// handle in its entry.
fn copy_objects(store: &Store, st: &mut CtxState, data: &[u8]) {
    let mut handles = st.plan.handles.iter();
    for (i, e) in st.plan.entries.iter_mut().enumerate() {
        let src = match e.kind {
            Kind::Compressed => &st.scratch[i * PAGE_SIZE..i * PAGE_SIZE + e.len as usize],
            Kind::Huge => &data[i * PAGE_SIZE..(i + 1) * PAGE_SIZE],
            Kind::Empty | Kind::Same => continue,
        };
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
    for i in 0..st.plan.entries.len() {
        let new = st.plan.entries[i];
        let old = store.slot(first + i as u64).lock().replace(new);
        account(&st.shard, &new, 1);
        if new.kind == Kind::Huge {
            st.shard.add(Counter::HugePagesSince, 1);
        }
        store.release(st, old);
    }
}
