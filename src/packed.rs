//! Packed mode: a compression group's pages compressed together as one
//! object.
//!
//! Compressing 8 pages together finds matches across them (real memory:
//! zstd:1 ratio 5.72 packed vs 5.11 per page) and costs one codec call. The
//! price is paid on reads, which decompress the whole group (a per-thread
//! cache serves the other pages of the group for free), and on discards,
//! which leave dead pages inside a live object until the compactor rewrites
//! groups that fall below half live.
//!
//! The object starts with a 32-byte header:
//! `live` (atomic bit mask of group offsets still referenced by a slot),
//! `orig` (offsets present in the blob), `base` (the group's first page, the
//! object's owner for compaction, in the word's low 36 bits; its high 28
//! bits seal the header, below) and `id` (unique per object, the key of
//! the read cache). A slot clears its bit under its own lock; the slot that
//! clears the last bit frees the object. Only `live` ever changes after the
//! object is published, and only atomically (see the allocator's rules in
//! `crate::slab`); everything else is read through shared views that start
//! after it.
//!
//! The seal is a 28-bit hash of `orig`, `base` and `id`, checked before a
//! read trusts them. Without it a corrupted header (a stray write, a bad
//! DIMM) reads as a *different stored page*, which is worse than an error:
//! an `orig` with a bit moved shifts the positions of the pages between,
//! so a page decodes its group-mate's bytes, and an `id` changed to the one
//! the read cache holds serves a page of another group. A page's own bytes
//! can still be corrupted into anything (zram has no checksums either);
//! what the seal rules out is reading through the wrong place. It costs no
//! space: device pages fit in 36 bits (the shared-memory layout's 2^36
//! slots, `StoreConfig::validate`), so `base` has 28 bits to spare.
//!
//! This module is all that knows the format: the write path asks it to pack
//! a group ([`pack_group`]), the read path to produce a page
//! ([`read_page`], [`read_backed_page`]), the slot table to let go of one
//! ([`clear_live`], [`share`]), the compactor whether a group is sparse
//! ([`is_sparse`]) and writeback for a group's bytes ([`copy_group`],
//! [`seal_group`]).
//!
//! # Packed groups on the backing store
//!
//! Writeback moves a group's object whole: its blob, as it is, behind a
//! 24-byte header of its own ([`GROUP_HEADER`]): the CRC-32 of everything
//! after it (the rest of the header and the blob), the blob's length,
//! `orig` and `base` (little-endian). Groups are packed one after the
//! other, each header 16-byte aligned, across block boundaries, so the
//! backing store wastes at most 15 bytes a group. The slot of each live
//! page (kind 6, `Kind::BackedGroup`, tabled in `crate::slot`) names the
//! group's first block, its header's offset there, 24 bits of its CRC, the
//! blob's length and pages and the page's position in the blob; the
//! page's offset in its group and the mask of live pages are not needed
//! there (a page leaves by its slot alone). A read reads the group's blocks
//! in one `pread`, checks the CRC (against the header's and the slot's 24
//! bits) and that the header's `base` and `orig` put this very page at the
//! slot's position, and decompresses the blob once into the thread's group
//! cache, which serves the group's other pages as it does in RAM (the
//! cache's key is then the slot's place, length and shape; a stale hit
//! would need another group at the very same place with the same length,
//! shape and 24 bits of CRC).

use crate::alloc::{Handle, ObjAllocator};
use crate::codec::CodecError;
use crate::ctx::{CtxState, GroupKey, GroupPlan};
use crate::error::{Error, Result};
use crate::page::{same_filled, MAX_PAGES, PAGE_SIZE};
use crate::slot::{Entry, Kind, SlotGuard};
use crate::stats::{Counter, Phase};
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes of header in front of a packed blob.
pub(crate) const PACK_HEADER: usize = 32;
/// Offset of the atomic live mask in the header.
const LIVE_AT: usize = 0;
/// Offset of the fixed fields (`orig`, `base`, `id`), which follow it.
const FIELDS_AT: usize = 8;

/// Bits of the `base` word that hold the group's first page (every page
/// number of a store is below [`MAX_PAGES`]); the seal takes the rest.
const BASE_BITS: u32 = MAX_PAGES.trailing_zeros();
/// Offset of the `base` word in the header.
const BASE_AT: usize = FIELDS_AT + 8;

/// The fixed fields of a packed object's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PackHeader {
    /// Offsets (within the group) whose pages are in the blob, in order.
    orig: u64,
    /// The group's first page.
    base: u64,
    /// Unique object id.
    id: u64,
    /// The seal the header carries (the `base` word's high bits).
    seal: u64,
}

impl PackHeader {
    /// The header of a new object, sealed.
    fn new(orig: u64, base: u64, id: u64) -> PackHeader {
        PackHeader {
            orig,
            base,
            id,
            seal: seal(orig, base, id),
        }
    }

    /// The header of a new object: every page live.
    fn to_bytes(self) -> [u8; PACK_HEADER] {
        let mut b = [0u8; PACK_HEADER];
        b[LIVE_AT..LIVE_AT + 8].copy_from_slice(&self.orig.to_ne_bytes());
        let words = [self.orig, self.base_word(), self.id];
        for (i, v) in words.into_iter().enumerate() {
            let at = FIELDS_AT + 8 * i;
            b[at..at + 8].copy_from_slice(&v.to_ne_bytes());
        }
        b
    }

    /// Parses the fixed fields (the 24 bytes from [`FIELDS_AT`]).
    fn parse(fields: &[u8]) -> PackHeader {
        let word = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&fields[8 * i..8 * i + 8]);
            u64::from_ne_bytes(b)
        };
        PackHeader {
            orig: word(0),
            base: word(1) & (MAX_PAGES - 1),
            id: word(2),
            seal: word(1) >> BASE_BITS,
        }
    }

    /// The `base` word as stored: the page, and the seal above it.
    fn base_word(&self) -> u64 {
        self.base | self.seal << BASE_BITS
    }

    /// Whether the fixed fields are as they were written.
    fn intact(&self) -> bool {
        self.seal == seal(self.orig, self.base, self.id)
    }

    /// Reads the fixed fields of the object at `h`.
    ///
    /// # Safety
    /// `h` is a live packed object of `alloc` that stays put while this
    /// runs: the caller holds the lock of a slot that references it.
    unsafe fn read(alloc: &dyn ObjAllocator, h: Handle) -> PackHeader {
        // SAFETY: the caller's contract; the fixed fields are never written
        // after publication and do not include the live mask.
        PackHeader::parse(unsafe { alloc.bytes(h, FIELDS_AT, PACK_HEADER - FIELDS_AT) })
    }

    /// The page's position in the blob, from its group offset.
    fn position(&self, idx: u8) -> usize {
        (self.orig & ((1u64 << idx) - 1)).count_ones() as usize
    }

    /// The position in the blob of the page slot entry `e` names, if the
    /// header is intact and agrees with the entry: the page is in the blob,
    /// and the blob holds as many pages as the slot says.
    fn position_of(&self, e: &Entry) -> Option<usize> {
        self.intact().then(|| self.agreeing(e)).flatten()
    }

    /// [`Self::position_of`] without the seal (a header of layout 3 and
    /// before, which had none).
    fn agreeing(&self, e: &Entry) -> Option<usize> {
        let pos = self.position(e.idx);
        let present = self.orig & (1u64 << e.idx) != 0;
        (present && self.orig.count_ones() == e.n as u32 && pos < e.n as usize).then_some(pos)
    }
}

/// The seal of a header's fixed fields: the top 28 bits of a 64-bit hash
/// over all three. Each field goes in through an odd multiplier (a
/// bijection) and the finish is a bijection too, so changing any one field
/// always changes the 64-bit hash; the 28 bits kept let a corruption pass
/// with odds of about one in 2^28 (every single-bit flip is caught: the
/// unit test `a_changed_field_breaks_the_seal` tries them all).
fn seal(orig: u64, base: u64, id: u64) -> u64 {
    let mut h = orig.wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ base.wrapping_mul(0xc2b2_ae3d_27d4_eb4f).rotate_left(21)
        ^ id.wrapping_mul(0x1656_67b1_9e37_79f9).rotate_left(42);
    h ^= h >> 31;
    h = h.wrapping_mul(0xd6e8_feb8_6659_fd93);
    h ^= h >> 32;
    h >> BASE_BITS
}

/// Whether the object at `h` is aligned for the header's atomic live mask.
///
/// # Safety
/// `h` is a live object of `alloc`; only its address is looked at.
unsafe fn aligned(alloc: &dyn ObjAllocator, h: Handle) -> bool {
    // SAFETY: the caller's contract.
    let addr = unsafe { alloc.object_ptr(h, PACK_HEADER) } as usize;
    addr % std::mem::align_of::<AtomicU64>() == 0
}

/// Packs the group `data` (pages from `first`): classifies every page,
/// compresses the pages that are not same-filled together, allocates one
/// object and writes header and blob into it, leaving in `plan.entries`
/// (empty before) what each slot of the group is to hold. Returns false, having allocated
/// nothing, when packing does not apply (fewer than two such pages, or they
/// do not compress below the huge threshold together): the caller then
/// stores the group page by page.
pub(crate) fn pack_group(
    st: &mut CtxState,
    plan: &mut GroupPlan,
    alloc: &dyn ObjAllocator,
    huge_threshold: usize,
    first: u64,
    data: &[u8],
) -> Result<bool> {
    let (orig, k) = gather(st, plan, data);
    if k < 2 {
        return Ok(false);
    }
    let budget = (k * huge_threshold - 1).min(st.scratch.len());
    let t = st.clock();
    let compressed = st
        .codec
        .compress(&st.gather[..k * PAGE_SIZE], &mut st.scratch[..budget])?;
    let t = st.lap(Phase::Compress, t);
    let Some(clen) = compressed else {
        return Ok(false);
    };
    if clen > budget {
        return Err(Error::Codec(CodecError::overflow(clen, budget)));
    }
    st.shard.add(Counter::SwPages, k as i64);
    let Some(h) = allocate(&mut plan.handles, alloc, first, clen)? else {
        return Ok(false);
    };
    let t = st.lap(Phase::Alloc, t);
    crate::crash_point::point("pack:allocated");
    let id = st.take_pack_id();
    // SAFETY: the object is fresh, of PACK_HEADER + clen bytes, and its
    // handle is in no slot yet.
    unsafe { write_object(alloc, h, orig, first, id, &st.scratch[..clen]) };
    st.lap(Phase::Copy, t);
    for (i, e) in plan.entries.iter_mut().enumerate() {
        if orig & (1 << i) != 0 {
            *e = Entry {
                kind: Kind::Packed,
                len: clen as u32,
                val: h,
                idx: i as u8,
                n: k as u8,
                ..Entry::EMPTY
            };
        }
    }
    Ok(true)
}

/// Plans same-filled pages as such (into `plan`) and gathers the others
/// contiguously. Returns the mask of gathered group offsets and their
/// count.
fn gather(st: &mut CtxState, plan: &mut GroupPlan, data: &[u8]) -> (u64, usize) {
    let mut orig = 0u64;
    let mut k = 0;
    for (i, page) in data.chunks_exact(PAGE_SIZE).enumerate() {
        if let Some(word) = same_filled(page) {
            plan.entries.push(Entry::new(Kind::Same, 0, word));
        } else {
            st.gather[k * PAGE_SIZE..(k + 1) * PAGE_SIZE].copy_from_slice(page);
            plan.entries.push(Entry::EMPTY);
            orig |= 1 << i;
            k += 1;
        }
    }
    (orig, k)
}

/// Writes the header (every page of `orig` live) and the blob of a fresh
/// packed object for the group from `base`.
///
/// # Safety
/// `h` is a fresh object of `alloc`, of `PACK_HEADER + blob.len()` bytes,
/// from [`allocate`], and in no slot yet: no other thread can reach it.
pub(crate) unsafe fn write_object(
    alloc: &dyn ObjAllocator,
    h: Handle,
    orig: u64,
    base: u64,
    id: u64,
    blob: &[u8],
) {
    let hdr = PackHeader::new(orig, base, id);
    // SAFETY: the caller's contract.
    unsafe {
        alloc.write_fresh(h, 0, &hdr.to_bytes());
        crate::crash_point::point("pack:header");
        alloc.write_fresh(h, PACK_HEADER, blob);
    }
}

/// Allocates a packed object of `PACK_HEADER + clen` bytes owned by page
/// `first`, its handle left in `handles` (emptied first, a reused buffer);
/// `None` (object freed again) if the allocator handed out memory not
/// aligned for the header's atomic live mask.
pub(crate) fn allocate(
    handles: &mut Vec<Handle>,
    alloc: &dyn ObjAllocator,
    first: u64,
    clen: usize,
) -> Result<Option<Handle>> {
    handles.clear();
    alloc
        .alloc_bulk(&[(PACK_HEADER + clen) as u32], &[first], handles)
        .map_err(|e| Error::NoSpace { limit: e.limit })?;
    let h = handles[0];
    // SAFETY: the object is fresh and this thread's alone.
    if unsafe { aligned(alloc, h) } {
        return Ok(Some(h));
    }
    log::warn!("allocator returned an unaligned object: storing the group per page");
    alloc.free_bulk(&[h]);
    Ok(None)
}

/// Produces the packed page `e` into `out`, from the thread's cache of the
/// last group it decompressed or by decompressing the group into that
/// cache. The caller holds the slot's lock.
pub(crate) fn read_page(
    st: &mut CtxState,
    alloc: &dyn ObjAllocator,
    e: &Entry,
    out: &mut [u8],
) -> std::result::Result<(), String> {
    // SAFETY: the caller holds the lock of a slot referencing the object,
    // so it is live and stays put.
    let hdr = unsafe { PackHeader::read(alloc, e.val) };
    if !hdr.intact() {
        return Err("packed group header fails its seal (corrupt memory)".into());
    }
    let Some(pos) = hdr.agreeing(e) else {
        return Err("packed group header does not match its slot".into());
    };
    let key = GroupKey::Ram(hdr.id);
    if let Some(p) = st.pack_cache.get(key, pos) {
        out.copy_from_slice(p);
        return Ok(());
    }
    // SAFETY: as above; the blob after the header is never written again.
    let blob = unsafe { alloc.bytes(e.val, PACK_HEADER, e.len as usize) };
    decode_to_cache(st, e, blob, key, pos, out)
}

/// Decompresses the group blob `blob` of slot entry `e` into the thread's
/// group cache (then naming it `key`) and copies its page at `pos` to
/// `out`.
fn decode_to_cache(
    st: &mut CtxState,
    e: &Entry,
    blob: &[u8],
    key: GroupKey,
    pos: usize,
    out: &mut [u8],
) -> std::result::Result<(), String> {
    // The cache is taken out while the codec (a borrow of `st` of its own)
    // decodes into it; taking and putting back moves a Vec, no copy.
    let mut cache = std::mem::take(&mut st.pack_cache);
    let t = st.clock();
    let r = decode_group(st, e, blob, cache.buffer(e.n as usize));
    st.lap(Phase::Decode, t);
    if r.is_ok() {
        out.copy_from_slice(&cache.buffer_ref()[pos * PAGE_SIZE..(pos + 1) * PAGE_SIZE]);
        cache.set(key);
    }
    st.pack_cache = cache;
    r
}

/// Bytes of header in front of a written-back group's blob.
pub(crate) const GROUP_HEADER: usize = 24;

/// The fields of a written-back group's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DiskHeader {
    /// CRC-32 of the header's other fields and the blob.
    crc: u32,
    /// The blob's length.
    len: u32,
    /// Offsets (within the group) whose pages are in the blob.
    orig: u64,
    /// The group's first page.
    base: u64,
}

impl DiskHeader {
    fn to_bytes(self) -> [u8; GROUP_HEADER] {
        let mut b = [0u8; GROUP_HEADER];
        b[0..4].copy_from_slice(&self.crc.to_le_bytes());
        b[4..8].copy_from_slice(&self.len.to_le_bytes());
        b[8..16].copy_from_slice(&self.orig.to_le_bytes());
        b[16..24].copy_from_slice(&self.base.to_le_bytes());
        b
    }

    fn parse(b: &[u8; GROUP_HEADER]) -> DiskHeader {
        let word = |at: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[at..at + 8]);
            u64::from_le_bytes(w)
        };
        let half = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        DiskHeader {
            crc: half(0),
            len: half(4),
            orig: word(8),
            base: word(16),
        }
    }
}

/// What [`copy_group`] copied: the group's shape and which of its pages
/// were live.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GroupCopy {
    /// The group's first page.
    pub(crate) base: u64,
    /// Offsets (within the group) whose pages are in the blob.
    pub(crate) orig: u64,
    /// The object's id.
    pub(crate) id: u64,
    /// Offsets whose pages were live.
    pub(crate) live: u64,
}

/// Copies the packed group the slot `guard` holds into `dst` as the
/// backing store keeps it (header, CRC still zero, then the blob: [`GROUP_HEADER`]
/// plus the entry's `len` bytes, which `dst` must hold), or `None` for any
/// other entry, a header that fails its seal or a `dst` too short. The
/// guard (the caller's slot lock) keeps the object alive and in place.
pub(crate) fn copy_group(
    alloc: &dyn ObjAllocator,
    guard: &SlotGuard<'_>,
    dst: &mut [u8],
) -> Option<GroupCopy> {
    let e = packed_entry(guard)?;
    let len = e.len as usize;
    let dst = dst.get_mut(..GROUP_HEADER + len)?;
    // SAFETY: the guard keeps the slot locked, and the slot references the
    // packed object `e` names: it is live and stays put.
    let hdr = unsafe { PackHeader::read(alloc, e.val) };
    hdr.agreeing(&e).filter(|_| hdr.intact())?;
    // SAFETY: as above, and checked aligned when it was stored.
    let live = unsafe { live_mask(alloc, e.val) }.load(Ordering::Acquire);
    let disk = DiskHeader {
        crc: 0,
        len: e.len,
        orig: hdr.orig,
        base: hdr.base,
    };
    dst[..GROUP_HEADER].copy_from_slice(&disk.to_bytes());
    // SAFETY: as above; the blob is never written after publication.
    dst[GROUP_HEADER..].copy_from_slice(unsafe { alloc.bytes(e.val, PACK_HEADER, len) });
    Some(GroupCopy {
        base: hdr.base,
        orig: hdr.orig,
        id: hdr.id,
        live,
    })
}

/// Computes the CRC of a group [`copy_group`] copied to `group` (its
/// header and blob) and writes it into the header; returns it.
pub(crate) fn seal_group(group: &mut [u8]) -> u32 {
    let crc = group_crc(group);
    group[..4].copy_from_slice(&crc.to_le_bytes());
    crc
}

/// The CRC-32 of a written-back group: of everything after the CRC.
fn group_crc(group: &[u8]) -> u32 {
    let mut c = libdeflater::Crc::new();
    c.update(&group[4..]);
    c.sum()
}

/// The group offset of the `pos`-th page (from 0) of `orig`.
fn offset_of(orig: u64, pos: u8) -> Option<u64> {
    let mut m = orig;
    for _ in 0..pos {
        m &= m.checked_sub(1)?;
    }
    (m != 0).then(|| u64::from(m.trailing_zeros()))
}

/// The key of the written-back group `e` names in the thread's group
/// cache.
fn backed_key(e: &Entry) -> GroupKey {
    GroupKey::Backed {
        val: e.val,
        len: e.len,
        n: e.n,
        algo: e.algo,
    }
}

/// Produces the page of a written-back group `e` names into `out` from
/// the thread's group cache, if it holds that group; false otherwise (the
/// caller then reads the group's blocks).
pub(crate) fn cached_backed_page(st: &CtxState, e: &Entry, out: &mut [u8]) -> bool {
    match st.pack_cache.get(backed_key(e), usize::from(e.idx)) {
        Some(p) => {
            out.copy_from_slice(p);
            true
        }
        None => false,
    }
}

/// Produces page `page`, which the written-back group slot `e` names, from
/// `group`, the group's header and blob as read from the backing store:
/// checks the CRC and that the header puts this page at the slot's
/// position, then decompresses the blob into the thread's group cache.
pub(crate) fn read_backed_page(
    st: &mut CtxState,
    page: u64,
    e: &Entry,
    group: &[u8],
    out: &mut [u8],
) -> std::result::Result<(), String> {
    check_backed_group(page, e, group)?;
    let blob = &group[GROUP_HEADER..];
    decode_to_cache(st, e, blob, backed_key(e), usize::from(e.idx), out)
}

/// The pages a written-back group was written with, as its header says.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BackedShape {
    /// The group's CRC-32 (of its header's other fields and its blob).
    pub(crate) crc: u32,
    /// Offsets (within the group) whose pages are in the blob.
    orig: u64,
    /// The group's first page.
    base: u64,
}

impl BackedShape {
    /// Each page of the blob, with its position there, in page order.
    pub(crate) fn pages(self) -> impl Iterator<Item = (u64, u8)> {
        let mut m = self.orig;
        let mut pos = 0u8;
        std::iter::from_fn(move || {
            let off = (m != 0).then(|| u64::from(m.trailing_zeros()))?;
            m &= m - 1;
            pos += 1;
            Some((self.base + off, pos - 1))
        })
    }
}

/// Checks `group`, a written-back group's header and blob as read from
/// the backing store, against the slot `e` of page `page` that names it:
/// its CRC against the header's and the slot's 24 bits, its length and
/// pages against the slot's, and that the header puts this very page at
/// the slot's position. Returns the group's shape.
pub(crate) fn check_backed_group(
    page: u64,
    e: &Entry,
    group: &[u8],
) -> std::result::Result<BackedShape, String> {
    let at = e.group_at();
    let head = group
        .first_chunk::<GROUP_HEADER>()
        .ok_or("a written-back group shorter than its header")?;
    let hdr = DiskHeader::parse(head);
    let crc = group_crc(group);
    if hdr.crc != crc || crc & crate::slot::TAG_MASK != at.tag {
        return Err(format!(
            "the group at backing block {} fails its checksum",
            at.block
        ));
    }
    let here = offset_of(hdr.orig, e.idx).map(|o| hdr.base + o);
    if hdr.len != e.len || hdr.orig.count_ones() != u32::from(e.n) || here != Some(page) {
        return Err(format!(
            "the group at backing block {} does not hold this page",
            at.block
        ));
    }
    Ok(BackedShape {
        crc,
        orig: hdr.orig,
        base: hdr.base,
    })
}

/// Decompresses a group's blob with the codec of the algorithm its slot
/// names (0 the primary; 1-3 a secondary, for a recompressed group).
fn decode_group(
    st: &mut CtxState,
    e: &Entry,
    blob: &[u8],
    buf: &mut [u8],
) -> std::result::Result<(), String> {
    let codec = match e.algo {
        0 => &mut st.codec,
        a => st.secondary_codec(a).ok_or_else(|| {
            format!("the group names secondary algorithm {a}, which this store does not have")
        })?,
    };
    codec.decompress(blob, buf).map_err(|err| err.to_string())
}

/// Where the packed page a locked slot holds lies in its object.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Place {
    /// The first page of the group the page was stored with.
    pub(crate) base: u64,
    /// The page's position in the blob.
    pub(crate) pos: usize,
    /// The object's id.
    pub(crate) id: u64,
    /// How many of the object's pages are live.
    pub(crate) live: u32,
}

/// Where the packed page the slot `guard` holds lies, or None for any
/// other entry. The guard (the caller's slot lock) keeps the object alive
/// and in place while its header is read.
pub(crate) fn place(alloc: &dyn ObjAllocator, guard: &SlotGuard<'_>) -> Option<Place> {
    let e = packed_entry(guard)?;
    // SAFETY: the guard keeps the slot locked, and the slot references the
    // packed object `e` names: it is live and stays put.
    let hdr = unsafe { PackHeader::read(alloc, e.val) };
    Some(Place {
        base: hdr.base,
        pos: hdr.position(e.idx),
        id: hdr.id,
        live: live_count(alloc, guard)?,
    })
}

/// The entry the slot `guard` holds, if it is a packed page.
fn packed_entry(guard: &SlotGuard<'_>) -> Option<Entry> {
    let e = guard.entry();
    (e.kind == Kind::Packed).then_some(e)
}

/// The live mask of the packed object at `h`.
///
/// # Safety
/// `h` must be a live packed object of `alloc` (the caller holds the lock of
/// a slot that references it), 8-byte aligned (checked when it was stored).
unsafe fn live_mask(alloc: &dyn ObjAllocator, h: Handle) -> &AtomicU64 {
    // SAFETY: the caller's contract; the live mask is only ever accessed
    // through this atomic.
    unsafe { alloc.atomic_word(h, LIVE_AT) }
}

/// Clears the live bit of the packed page `e` is leaving; returns the
/// page's position in its blob and whether it was the last live page (the
/// caller then frees the object).
///
/// # Safety
/// `e` was until now the content of a slot whose lock the caller holds, so
/// its object is live and stays put.
pub(crate) unsafe fn clear_live(alloc: &dyn ObjAllocator, e: &Entry) -> (usize, bool) {
    // SAFETY: the caller's contract.
    let pos = unsafe { PackHeader::read(alloc, e.val) }.position(e.idx);
    let bit = 1u64 << e.idx;
    // SAFETY: as above; the object was checked aligned when it was stored.
    let prev = unsafe { live_mask(alloc, e.val) }.fetch_and(!bit, Ordering::AcqRel);
    (pos, prev & !bit == 0)
}

/// During a recovery scan: checks the packed page `e` against its object's
/// header and marks it live in the object's live mask (which the dead
/// process may have left stale): the first page of an object found sets
/// the mask to its own bit, later ones add theirs. Returns the page's
/// position in the blob, or `None` if header and slot disagree.
///
/// `unsealed`: the store was written by a layout before the seal (3 and
/// older); the first page found of each object then checks its header
/// without the seal and seals it, so that from then on every header of the
/// store carries one and is checked.
///
/// # Safety
/// `e`'s object is live (just claimed in the slab), at least
/// `PACK_HEADER + e.len` bytes long, and nothing else uses the store.
pub(crate) unsafe fn recover_page(
    alloc: &dyn ObjAllocator,
    e: &Entry,
    first: bool,
    unsealed: bool,
) -> Option<usize> {
    // SAFETY: the caller's contract.
    if !unsafe { aligned(alloc, e.val) } {
        return None;
    }
    // SAFETY: the caller's contract.
    let hdr = unsafe { PackHeader::read(alloc, e.val) };
    let pos = if unsealed && first && hdr.seal == 0 {
        let pos = hdr.agreeing(e)?;
        // SAFETY: the caller's contract (nothing else uses the store, so
        // no view of these bytes is held); the word lies in the header.
        unsafe { seal_in_place(alloc, e.val, hdr) };
        pos
    } else {
        hdr.position_of(e)?
    };
    let bit = 1u64 << e.idx;
    // SAFETY: the caller's contract; aligned, checked above.
    let live = unsafe { live_mask(alloc, e.val) };
    if first {
        live.store(bit, Ordering::Release);
    } else {
        live.fetch_or(bit, Ordering::AcqRel);
    }
    Some(pos)
}

/// Writes the seal of `hdr` into the `base` word of the object at `h`.
///
/// # Safety
/// `h` is a live packed object of `alloc` and nothing else uses the store
/// (a recovery scan): no other thread reads the word, and no reference to
/// its bytes is held.
unsafe fn seal_in_place(alloc: &dyn ObjAllocator, h: Handle, hdr: PackHeader) {
    let sealed = PackHeader::new(hdr.orig, hdr.base, hdr.id);
    // SAFETY: the caller's contract.
    unsafe { write_base_word(alloc, h, sealed.base_word()) }
}

/// Clears the seal of the packed object `e` references, as a layout-3
/// zblk wrote headers (a test's way to make one).
///
/// # Safety
/// The caller holds the lock of the slot `e` was read from, and no other
/// thread uses the store.
#[cfg(feature = "test-support")]
pub(crate) unsafe fn debug_unseal(alloc: &dyn ObjAllocator, e: &Entry) {
    // SAFETY: the caller's contract.
    let hdr = unsafe { PackHeader::read(alloc, e.val) };
    // SAFETY: the caller's contract.
    unsafe { write_base_word(alloc, e.val, hdr.base) }
}

/// Overwrites the `base` word (page and seal) of the published packed
/// object at `h`: the one fixed field ever rewritten, and only while
/// nothing else uses the store.
///
/// # Safety
/// `h` is a live packed object of `alloc`, nothing else reads or writes
/// the store meanwhile, and no reference to its bytes is held.
unsafe fn write_base_word(alloc: &dyn ObjAllocator, h: Handle, word: u64) {
    let bytes = word.to_ne_bytes();
    // SAFETY: the caller's contract; the object is at least PACK_HEADER
    // bytes, and a raw write forms no reference to published bytes.
    unsafe {
        let p = alloc.object_ptr(h, PACK_HEADER).add(BASE_AT);
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), p, 8);
    }
}

/// Pages still live in the packed object the slot `guard` holds, or None
/// for any other entry.
pub(crate) fn live_count(alloc: &dyn ObjAllocator, guard: &SlotGuard<'_>) -> Option<u32> {
    let e = packed_entry(guard)?;
    // SAFETY: the guard keeps the slot locked, and the slot references the
    // packed object: it is live, stays put, and was checked aligned when
    // it was stored.
    let live = unsafe { live_mask(alloc, e.val) }.load(Ordering::Acquire);
    Some(live.count_ones())
}

/// Whether the slot `guard` holds a page of a packed group with fewer than
/// half its pages live, which the compactor stores again on its own.
pub(crate) fn is_sparse(alloc: &dyn ObjAllocator, guard: &SlotGuard<'_>) -> bool {
    let n = u32::from(guard.entry().n);
    live_count(alloc, guard).is_some_and(|live| live * 2 < n)
}

/// The id of the packed object the slot `guard` holds (0 for anything
/// else).
pub(crate) fn object_id(alloc: &dyn ObjAllocator, guard: &SlotGuard<'_>) -> u64 {
    let Some(e) = packed_entry(guard) else {
        return 0;
    };
    // SAFETY: the guard keeps the slot locked, and the slot references the
    // packed object: it is live and stays put.
    unsafe { PackHeader::read(alloc, e.val) }.id
}

/// Page `pos`'s share of a blob of `len` bytes holding `n` pages: the shares
/// of all pages add up to `len` exactly.
pub(crate) fn share(len: u32, n: u8, pos: usize) -> i64 {
    let n = n.max(1) as u32;
    (len / n + u32::from((pos as u32) < len % n)) as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_add_up() {
        for len in [0u32, 1, 7, 8, 9, 1000, 32767] {
            for n in 1u8..=64 {
                let sum: i64 = (0..n as usize).map(|p| share(len, n, p)).sum();
                assert_eq!(sum, len as i64, "len {len} n {n}");
            }
        }
    }

    #[test]
    fn header_round_trips_and_positions() {
        let h = PackHeader::new(0b1011_0110, 99, 7);
        let b = h.to_bytes();
        assert_eq!(b[..8], h.orig.to_ne_bytes(), "every page starts live");
        assert_eq!(PackHeader::parse(&b[FIELDS_AT..]), h);
        assert_eq!(h.position(1), 0);
        assert_eq!(h.position(2), 1);
        assert_eq!(h.position(4), 2);
        assert_eq!(h.position(7), 4);
        assert!(h.intact());
    }

    #[test]
    fn a_changed_field_breaks_the_seal() {
        let h = PackHeader::new(0b1011_0110, 99, 7);
        let b = h.to_bytes();
        for at in FIELDS_AT..PACK_HEADER {
            for bit in 0..8 {
                let mut c = b;
                c[at] ^= 1 << bit;
                let p = PackHeader::parse(&c[FIELDS_AT..]);
                assert!(!p.intact(), "byte {at} bit {bit} flipped: {p:?}");
            }
        }
        // A bit moved within `orig` (same count: the slot's check alone
        // would take it) shifts positions; the seal refuses it.
        let moved = PackHeader {
            orig: 0b1011_1010,
            ..h
        };
        assert!(!moved.intact());
    }
}
