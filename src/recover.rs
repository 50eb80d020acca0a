//! Taking over a store whose process died: the shared memory's header,
//! and the scan that rebuilds everything else from the slot table.
//!
//! # Why a recovered store is consistent
//!
//! A process can die at any instruction; what it left in shared memory is
//! whatever stores it had executed. The engine publishes in an order that
//! makes every such state recoverable:
//!
//! 1. A new object's bytes are written (`write_fresh`) before its handle
//!    is in any slot, so a slot never references a half-written object.
//! 2. A slot changes in one 16-byte store, which also unlocks it
//!    (`crate::slot`): it holds its old entry or its new one, never a mix;
//!    a slot found locked holds its old entry, and the scan unlocks it.
//! 3. An object is freed only after the slot that referenced it let go of
//!    it, and compaction frees an object's old copy only after every slot
//!    points at the new one: so every handle a slot holds names an object
//!    that was live at the crash, and the scan claims exactly those.
//! 4. Everything not claimed is free space: objects in free batches or the
//!    drain queue, spares, half-made groups whose handles never reached a
//!    slot, the old copy of an object compaction was moving. Their pages
//!    are given back, so nothing leaks across a crash.
//! 5. A packed object's live mask may be stale (a slot let go of its page
//!    and the process died before clearing the bit); the scan rewrites it
//!    from the slots that reference the object.
//!
//! 6. A recompressed page's slot names one of the secondary algorithms,
//!    which the header recorded before any slot could name it.
//! 7. A written-back page's slot is switched only after its object was
//!    written to the backing store, and its RAM object released only after
//!    the switch (`crate::writeback`): so a slot names either a RAM object
//!    (claimed as above) or a backing object that is in the file. The
//!    backing store's free map is private memory and rebuilt here from the
//!    written-back slots, per-page objects (kind 5) and pages of packed
//!    groups (kind 6) alike, each counted once in every block its object
//!    touches: a block no slot names is free, blocks written by a
//!    writeback the crash interrupted included. A packed group whose
//!    switch the crash interrupted has some pages on the backing store
//!    and the others still in its RAM object, whose live mask the scan
//!    rebuilds from those (point 5).
//!
//! The gauges (`stored_pages`, `compr_data_size`, same and huge pages,
//! packed dead bytes, idle and recompressed pages) are recounted from the
//! slots (access times and idle marks live in the slots and survive); event counters restart
//! at zero, and the header counts recoveries and says when the last was.

use crate::codec::{Algo, Dictionaries};
use crate::config::{Mode, StoreConfig};
use crate::error::{Error, Result};
use crate::packed;
use crate::page::PAGE_SIZE;
use crate::shm::{Header, SharedMem};
use crate::slab::{Claim, SlabAllocator};
use crate::slot::{Entry, Kind};
use crate::stats::{Counter, StatsShard};
use crate::table::{account, backed_extent, SlotTable};
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// Seconds since the epoch, now.
fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The header a store of `cfg` gets.
fn header_for(cfg: &StoreConfig) -> Header {
    Header {
        layout: crate::shm::LAYOUT_VERSION,
        fingerprint: SlabAllocator::fingerprint(),
        size: cfg.size,
        group_pages: cfg.group_pages as u64,
        mode: u64::from(cfg.mode == Mode::Packed),
        huge_threshold: cfg.huge_threshold as u64,
        algo: cfg.algo.to_string(),
        recoveries: 0,
        created_at: now(),
        recovered_at: 0,
        clock_base: crate::clock::boot_seconds(),
        secondaries: Vec::new(),
        runtime: None,
    }
}

/// A new store's shared memory, its dictionaries and header written.
pub(crate) fn create(cfg: &StoreConfig) -> Result<(SharedMem, Header)> {
    let shm = SharedMem::create(cfg.huge_pages)?;
    let dicts: Vec<(String, &[u8])> = cfg
        .dictionaries
        .iter()
        .map(|(a, d)| (a.to_string(), &d[..]))
        .collect();
    shm.write_dictionaries(&dicts)?;
    let h = header_for(cfg);
    shm.write_header(&h)?;
    Ok((shm, h))
}

/// Records `list` as the store's secondary algorithms, before any slot
/// names an entry new in it (a slot naming an entry the header lacks is
/// dropped by a recovery).
pub(crate) fn record_secondaries(shm: &SharedMem, list: &[Algo]) -> Result<()> {
    shm.update_header(|h| h.secondaries = list.iter().map(Algo::to_string).collect())
        .map(drop)
}

/// The secondary algorithms a header names, in order.
pub(crate) fn secondaries(h: &Header) -> Result<Vec<Algo>> {
    h.secondaries
        .iter()
        .map(|name| {
            name.parse().map_err(|e| {
                Error::InvalidConfig(format!(
                    "shared memory names a secondary algorithm this zblk cannot decode: {e}"
                ))
            })
        })
        .collect()
}

/// The dictionaries the store in `shm` was made with (none before layout
/// 6), which its pages decode with.
pub(crate) fn dictionaries(shm: &SharedMem) -> Result<Dictionaries> {
    let mut dicts = Dictionaries::new();
    for (name, bytes) in shm.read_dictionaries()? {
        let algo: Algo = name.parse().map_err(|e| {
            Error::InvalidConfig(format!(
                "shared memory holds a dictionary this zblk cannot use: {e}"
            ))
        })?;
        dicts
            .set(algo, Arc::from(bytes))
            .map_err(|e| Error::InvalidConfig(format!("shared memory: {e}")))?;
    }
    Ok(dicts)
}

/// Opens the shared memory of a dead store of `cfg`: its header must
/// describe that very store, laid out as this build lays stores out (or
/// as an older layout it reads). Returns the layout the file had, too.
pub(crate) fn open(cfg: &StoreConfig, fd: OwnedFd) -> Result<(SharedMem, Header, u64)> {
    let shm = SharedMem::open(fd)?;
    let mut found = shm.read_header()?;
    let want = header_for(cfg);
    let differs = |what: &str, a: &dyn std::fmt::Display, b: &dyn std::fmt::Display| {
        Error::InvalidConfig(format!(
            "shared memory holds a store with {what} {a}, not {b}: recover it with its own settings"
        ))
    };
    if found.fingerprint != SlabAllocator::fingerprint_for(found.layout) {
        return Err(Error::InvalidConfig(
            "shared memory was laid out by a zblk with other size classes: it cannot be recovered by this one".into(),
        ));
    }
    // An older layout is written back as this one, with its fingerprint.
    let layout = found.layout;
    found.layout = want.layout;
    found.fingerprint = want.fingerprint;
    if found.size != want.size {
        return Err(differs("size", &found.size, &want.size));
    }
    if found.algo != want.algo {
        return Err(differs("algorithm", &found.algo, &want.algo));
    }
    if found.group_pages != want.group_pages || found.mode != want.mode {
        return Err(differs(
            "group shape",
            &found.group_pages,
            &want.group_pages,
        ));
    }
    if found.huge_threshold != want.huge_threshold {
        return Err(differs(
            "huge threshold",
            &found.huge_threshold,
            &want.huge_threshold,
        ));
    }
    Ok((shm, found, layout))
}

/// Records one more recovery in the header; returns the new header.
pub(crate) fn record(shm: &SharedMem, mut h: Header) -> Result<Header> {
    h.recoveries += 1;
    h.recovered_at = now();
    shm.write_header(&h)?;
    Ok(h)
}

/// What a scan found.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Scan {
    /// Slots that hold a page.
    pub(crate) stored: u64,
    /// Slots emptied because their entry could not be trusted (a handle
    /// the slab cannot have made, a packed header that disagrees).
    pub(crate) dropped: u64,
    /// Slots whose page is on the backing store.
    pub(crate) backed: u64,
}

/// Rebuilds the slab's bookkeeping and the gauges (into `gauges`) from the
/// slot table; `secondaries` is how many secondary algorithms the header
/// names, `unsealed` whether the file's layout predates sealed packed
/// headers (they are sealed as they are found). Nothing else may use the
/// store meanwhile.
pub(crate) fn scan(
    table: &SlotTable,
    slab: &SlabAllocator,
    gauges: &StatsShard,
    secondaries: usize,
    unsealed: bool,
) -> Scan {
    let alloc = table.allocator();
    let mut found = Scan::default();
    table.scan(|page, e| {
        let algo_ok = match e.algo {
            0 => true,
            // Only recompression sets it, on compressed pages (which
            // writeback may then move to the backing store) and on packed
            // groups (a packed store's recompression).
            a => {
                usize::from(a) <= secondaries
                    && matches!(
                        e.kind,
                        Kind::Compressed | Kind::Backed | Kind::Packed | Kind::BackedGroup
                    )
            }
        };
        let backed = matches!(e.kind, Kind::Backed | Kind::BackedGroup);
        let claimed = if algo_ok && backed {
            claim_backed(table, e)
        } else if algo_ok {
            claim(slab, alloc, page, e, unsealed)
        } else {
            None
        };
        let (pos, first) = match claimed {
            Some(found) => found,
            None => {
                log::error!("recovery: page {page} had an entry it cannot trust ({e:?}): it now reads as zeros");
                found.dropped += 1;
                return false;
            }
        };
        if e.kind != Kind::Empty {
            found.stored += 1;
        }
        if backed {
            found.backed += 1;
        }
        account(gauges, e, pos, 1);
        if e.kind == Kind::Packed {
            // Dead bytes: each blob's bytes less its live pages' shares.
            let blob = if first { e.len as i64 } else { 0 };
            gauges.add(Counter::PackedDeadBytes, blob - packed::share(e.len, e.n, pos));
        }
        true
    });
    slab.finish_recovery();
    found
}

/// Counts the written-back page `e`'s object in the backing store's free
/// map, once in each block it touches; `None` if the store has no backing
/// store or the entry names a place that cannot be (blocks past its end,
/// a per-page object crossing a block, a raw page with an algorithm).
fn claim_backed(table: &SlotTable, e: &Entry) -> Option<(usize, bool)> {
    let backing = table.backing()?;
    let place = backed_extent(e)?;
    let raw_ok = !(e.kind == Kind::Backed && place.len == PAGE_SIZE && e.algo != 0);
    let blocks = place.blocks();
    let fits = raw_ok && blocks.end > blocks.start && backing.has_block(blocks.end - 1);
    if !fits {
        return None;
    }
    for (i, b) in blocks.clone().enumerate() {
        if !backing.claim(b) {
            // Give back what this entry claimed: it is dropped whole.
            backing.release_blocks(blocks.start..blocks.start + i as u32);
            return None;
        }
    }
    Some((0, false))
}

/// Claims the object `e` references for slot `page`; returns the page's
/// position in its packed blob (0 otherwise) and whether this was the
/// object's first claim, or `None` if the entry cannot be trusted.
fn claim(
    slab: &SlabAllocator,
    alloc: &dyn crate::alloc::ObjAllocator,
    page: u64,
    e: &Entry,
    unsealed: bool,
) -> Option<(usize, bool)> {
    let len = match e.kind {
        Kind::Empty | Kind::Same => return Some((0, false)),
        Kind::Huge if e.len as usize == PAGE_SIZE => PAGE_SIZE,
        Kind::Compressed if (1..PAGE_SIZE as u32).contains(&e.len) => e.len as usize,
        Kind::Packed if e.n >= 1 && e.idx < 64 => packed::PACK_HEADER + e.len as usize,
        // Claimed in the backing store's map (`claim_backed`), not here.
        _ => return None,
    };
    let claim = slab.claim(e.val, len, page);
    let first = claim == Claim::First;
    match (e.kind, claim) {
        (_, Claim::Invalid) => None,
        (Kind::Packed, _) => {
            // A header that disagrees empties this slot; if this was the
            // object's first claim it stays claimed (the slab cannot
            // unclaim) until the next recovery reclaims it: corrupt memory
            // only, logged by the caller.
            // SAFETY: the object was just claimed live, nothing else runs in
            // the store, and its size covers the header.
            let pos = unsafe { packed::recover_page(alloc, e, first, unsealed) }?;
            Some((pos, first))
        }
        (_, Claim::First) => Some((0, true)),
        // Two slots cannot own one per-page object.
        (_, Claim::Again) => None,
    }
}
