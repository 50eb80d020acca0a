//! The passes the daemon's control loop and idle policy run on a store,
//! one at a time with its maintenance thread state: idle marking,
//! recompression, writeback, compaction, what each slot holds and
//! sampling; and the limits set at run time (memory, writeback, the
//! owner's note), which a store in shared memory records for the process
//! that recovers it.

use super::Store;
use crate::backing_compact::BackingCompactReport;
use crate::block_state::{AlgoNames, SlotState};
use crate::codec::Algo;
use crate::config::{Mode, AUTO_COMPACT_MIN_PAGES, AUTO_COMPACT_PERCENT};
use crate::ctx::CtxState;
use crate::error::{Error, Result};
use crate::page::{PAGE_SIZE, PAGE_SIZE_U64};
use crate::recompress::{Recompress, RecompressReport};
use crate::shm::{RuntimeSettings, NOTE_BYTES};
use crate::slot::ATIME_MASK;
use crate::writeback::{Writeback, WritebackReport};
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

impl Store {
    /// Runs `f` with the maintenance thread state (made on first use), then
    /// hands what it freed to the drain. One maintenance job at a time.
    fn with_maintenance<R>(&self, f: impl FnOnce(&mut CtxState) -> R) -> R {
        let mut guard = self.compactor.lock().unwrap_or_else(|e| e.into_inner());
        // Untimed: the phase timers measure requests, and maintenance
        // (compaction, recompression) would add its codec and allocation
        // time to theirs with no request total or pages to divide by.
        let st = guard.get_or_insert_with(|| self.new_state().1.untimed());
        let r = f(st);
        st.free.flush(self.table.frees());
        r
    }

    /// Marks idle every stored page not accessed for at least `age_secs`
    /// seconds, or every stored page if `None` (zram's `idle` file: `all`
    /// or an age); a later read or write of a page clears its mark.
    /// Returns the pages newly marked; `stats().counters.idle_pages`
    /// counts all marked ones.
    pub fn mark_idle(&self, age_secs: Option<u64>) -> Result<u64> {
        let age = age_secs.map(Self::idle_age).transpose()?;
        let now = self.now();
        Ok(self.with_maintenance(|st| crate::recompress::mark_idle(&self.table, st, now, age)))
    }

    /// Marks idle exactly the stored pages not accessed for `age_secs`
    /// seconds and clears the mark of every younger page (what an
    /// automatic policy with its own thresholds needs; `mark_idle` only
    /// ever adds marks, as zram's `idle` file). Returns (marked, cleared).
    pub fn remark_idle(&self, age_secs: u64) -> Result<(u64, u64)> {
        let age = Self::idle_age(age_secs)?;
        let now = self.now();
        Ok(self.with_maintenance(|st| crate::recompress::remark_idle(&self.table, st, now, age)))
    }

    /// Checks an idle age against what slots' access times can hold.
    fn idle_age(a: u64) -> Result<u32> {
        u32::try_from(a)
            .ok()
            .filter(|&a| a <= ATIME_MASK)
            .ok_or_else(|| {
                Error::InvalidConfig(format!(
                    "an idle age of {a} s is past what slots keep ({ATIME_MASK} s, 194 days)"
                ))
            })
    }

    /// Recompresses the pages `p` selects with the secondary algorithms
    /// `p.algos` (zram's `recompress` with its priorities): each page (a
    /// packed store: each group) with the first of them whose result is at
    /// least `MIN_SAVING_PERCENT` smaller. The algorithms become the
    /// store's secondaries for good (recorded in shared memory, for a
    /// recovery to read the pages back): up to [`crate::MAX_SECONDARIES`]
    /// in all, an algorithm asked for again keeping its place; one past
    /// that is refused. A packed store recompresses into packed groups.
    pub fn recompress(&self, p: &Recompress) -> Result<RecompressReport> {
        self.check_secondaries(&p.algos)?;
        self.with_maintenance(|st| {
            let ids = self.assign_secondaries(&p.algos)?;
            let mut codecs: Vec<(u8, Box<dyn crate::codec::Codec>)> = ids
                .iter()
                .zip(&p.algos)
                .map(|(&id, &a)| {
                    let codec = self.cfg.dictionaries.codec_for(a, self.cfg.codec_pages());
                    (id, codec)
                })
                .collect();
            let (mode, span) = (self.cfg.mode, self.cfg.object_span());
            crate::recompress::run(&self.table, st, &mut codecs, p, mode, span)
        })
    }

    /// Makes `algos` the store's secondary algorithms (those it lacks are
    /// added after those it has) without recompressing anything, so that
    /// a list set before the first recompression gives slots its order.
    pub fn set_secondaries(&self, algos: &[Algo]) -> Result<()> {
        self.check_secondaries(algos)?;
        self.with_maintenance(|_| self.assign_secondaries(algos).map(drop))
    }

    /// Refuses an empty list and the primary algorithm in it.
    fn check_secondaries(&self, algos: &[Algo]) -> Result<()> {
        if algos.is_empty() {
            return Err(Error::InvalidConfig(
                "recompression needs at least one secondary algorithm".into(),
            ));
        }
        if algos.contains(&self.cfg.algo) {
            return Err(Error::InvalidConfig(format!(
                "a secondary algorithm must differ from the primary ({})",
                self.cfg.algo
            )));
        }
        Ok(())
    }

    /// Writes back the pages `p` selects to the backing store (zram's
    /// `writeback`): their compressed objects are packed into 4 KB blocks
    /// of the backing store and their RAM is freed. At most `p.limit`
    /// pages (0: any number), and no more than the device's writeback
    /// limit allows, which it consumes. A packed store writes back whole
    /// groups, each of whose live pages is selected.
    pub fn writeback(&self, p: &Writeback) -> Result<WritebackReport> {
        let backing = self.backing()?;
        self.with_maintenance(|st| {
            let allowed = self.wb_limit.load(Relaxed);
            let asked = if p.limit == 0 { u64::MAX } else { p.limit };
            let budget = asked.min(allowed);
            let mut r = crate::writeback::run(&self.table, backing, st, p, budget)?;
            if allowed != u64::MAX {
                // Only this thread (under the maintenance lock) lowers it; a
                // `set` in between wins.
                let left = allowed.saturating_sub(r.written);
                let _ = self
                    .wb_limit
                    .compare_exchange(allowed, left, Relaxed, Relaxed);
                r.limited = r.selected >= allowed && allowed < asked;
                self.record_runtime(None);
            }
            Ok(r)
        })
    }

    /// Compacts the backing store: the written-back per-page objects of
    /// up to `max_blocks` sparsely used blocks (live bytes under half a
    /// block, [`crate::SPARSE_BYTES`]) are moved, packed, into fresh
    /// blocks, and the sparse blocks are free again. A slot read, written
    /// or discarded meanwhile keeps what that gave it; an object that
    /// fails its CRC stays where it is. Written-back packed groups are not
    /// moved (nor are blocks they touch).
    pub fn compact_backing(&self, max_blocks: u64) -> Result<BackingCompactReport> {
        let backing = self.backing()?;
        self.with_maintenance(|st| {
            crate::backing_compact::run(&self.table, backing, st, max_blocks)
        })
    }

    /// The backing store, or the error an operation that needs one gives.
    fn backing(&self) -> Result<&std::sync::Arc<crate::backing::Backing>> {
        self.table.backing().ok_or_else(|| {
            Error::InvalidConfig(
                "this device has no backing device: create it with --backing-dev PATH".into(),
            )
        })
    }

    /// The state of every stored page in `range` (zram's `block_state`),
    /// in page order, empty slots left out; the part of `range` past the
    /// device's end is ignored. Each slot is locked only to read it,
    /// nothing else is held: call it range by range to walk a device
    /// while it serves.
    pub fn slot_states(&self, range: std::ops::Range<u64>) -> Vec<SlotState> {
        crate::block_state::collect(&self.table, range, &self.algo_names())
    }

    /// The state of each stored page of `pages` (device page indexes, in
    /// any order), in the order given; empty slots and pages past the
    /// device's end are left out. As [`Store::slot_states`], each slot is
    /// locked only to read it: the pages a scan of the processes' page
    /// tables found on this device, asked a batch at a time.
    pub fn slot_states_at(&self, pages: &[u64]) -> Vec<SlotState> {
        crate::block_state::collect_at(&self.table, pages, &self.algo_names())
    }

    /// The names of the primary and secondary algorithms, as slots
    /// number them.
    fn algo_names(&self) -> AlgoNames {
        AlgoNames {
            primary: self.cfg.algo.to_string(),
            secondaries: self.secondary_algos().iter().map(Algo::to_string).collect(),
        }
    }

    /// Up to `bytes` of the device's stored pages (whole pages: empty and
    /// same-filled ones left out), sampled evenly across it and decoded:
    /// the content a dictionary for this device is made of (`zblk dict
    /// train`). Reading them is not an access.
    pub fn sample(&self, bytes: usize) -> Vec<u8> {
        let want = bytes / PAGE_SIZE;
        self.with_maintenance(|st| crate::sample::sample(&self.table, st, want))
    }

    /// Sets the writeback limit (zram's `writeback_limit` with
    /// `writeback_limit_enable`): writeback may write `pages` more pages
    /// from now on; 0 turns the limit off.
    pub fn set_writeback_limit(&self, pages: u64) {
        let v = if pages == 0 { u64::MAX } else { pages };
        self.wb_limit.store(v, Relaxed);
        self.record_runtime(None);
    }

    /// The slot values of `algos`, adding those the store lacks to its
    /// secondaries; a store in shared memory records the grown list in its
    /// header first, before any slot can name a new entry. The caller
    /// holds the maintenance lock.
    fn assign_secondaries(&self, algos: &[Algo]) -> Result<Vec<u8>> {
        self.secondaries
            .assign(algos, |list| match self.table.shared() {
                Some(shm) => crate::recover::record_secondaries(shm, list),
                None => Ok(()),
            })
    }

    /// The secondary algorithms recompressed pages are held by, in the
    /// order slots name them (a recovered store knows them from its
    /// header); empty until a recompression chose one.
    pub fn secondary_algos(&self) -> Vec<Algo> {
        self.secondaries.list()
    }

    /// Sets the memory limit in bytes (0: none), at run time. A store in
    /// shared memory keeps it for the process that recovers it.
    pub fn set_mem_limit(&self, bytes: u64) {
        self.table.allocator().set_mem_limit(bytes);
        self.record_runtime(None);
    }

    /// Keeps `note` (at most 2048 bytes, opaque to the engine) with a store
    /// in shared memory, for the process that recovers it to read with
    /// [`Store::owner_note`]: the daemon keeps its idle policy there. A
    /// store in private memory has nowhere to keep it and ignores it.
    pub fn set_owner_note(&self, note: &str) -> Result<()> {
        if note.len() > NOTE_BYTES {
            return Err(Error::InvalidConfig(format!(
                "a note of {} bytes is more than the {NOTE_BYTES} a store keeps",
                note.len()
            )));
        }
        self.record_runtime_result(Some(note))
    }

    /// The note the store's last process kept with it (see
    /// [`Store::set_owner_note`]), if any.
    pub fn owner_note(&self) -> Option<String> {
        let shm = self.table.shared()?;
        let note = shm.read_header().ok()?.runtime?.note;
        (!note.is_empty()).then_some(note)
    }

    /// Records the limits now in force, and `note` if given (else the note
    /// recorded before), in the header of a store in shared memory; a
    /// failure is logged (the limits still hold in this process).
    fn record_runtime(&self, note: Option<&str>) {
        if let Err(e) = self.record_runtime_result(note) {
            log::warn!("the store's header could not keep its limits: {e}");
        }
    }

    fn record_runtime_result(&self, note: Option<&str>) -> Result<()> {
        let Some(shm) = self.table.shared() else {
            return Ok(());
        };
        shm.update_header(|h| {
            // Read under the header lock: two threads recording one after
            // the other write what was in force last, never an older pair.
            let mem_limit = self.table.allocator().mem_limit();
            let writeback_limit = self.wb_limit.load(Relaxed);
            let note = match (note, h.runtime.take()) {
                (Some(n), _) => n.to_string(),
                (None, Some(old)) => old.note,
                (None, None) => String::new(),
            };
            h.runtime = Some(RuntimeSettings {
                mem_limit,
                writeback_limit,
                note,
            });
        })
        .map(drop)
    }

    /// Runs compaction now: rewrites sparse packed groups, lets the drain
    /// free what is queued, then lets the allocator move objects. Returns
    /// the 4 KB pages given back.
    pub fn compact(&self) -> u64 {
        if self.cfg.mode == Mode::Packed {
            self.with_maintenance(|st| {
                crate::compact::rewrite_sparse_groups(&self.table, &self.cfg, st);
            });
        }
        self.settle_frees(Duration::from_secs(5));
        self.compact_now()
    }

    fn compact_now(&self) -> u64 {
        let n = self.table.allocator().compact(&self.table);
        self.pages_compacted.fetch_add(n, Relaxed);
        n
    }

    /// Compacts if fragmentation passed the threshold
    /// ([`AUTO_COMPACT_PERCENT`] of `mem_used_total` and at least
    /// [`AUTO_COMPACT_MIN_PAGES`] could be given back). The drain thread
    /// calls this about once a second while idle; a daemon without deferred
    /// free calls it from its idle timer. Empty zspages kept for reuse that
    /// were not reused since the previous call are given back first.
    /// Returns the pages given back.
    pub fn maybe_compact(&self) -> u64 {
        let alloc = self.table.allocator();
        let trimmed = alloc.trim();
        let pages = alloc.compactable_pages();
        let used = alloc.mem_used_total();
        if pages >= AUTO_COMPACT_MIN_PAGES
            && pages * PAGE_SIZE_U64 * 100 >= used * AUTO_COMPACT_PERCENT
        {
            trimmed + self.compact_now()
        } else {
            trimmed
        }
    }

    /// Waits up to `timeout` until the drain has freed every full batch
    /// handed to it (partial batches live in each `QueueCtx`: see
    /// `QueueCtx::flush_frees`). Returns whether it settled.
    pub fn settle_frees(&self, timeout: Duration) -> bool {
        self.table.frees().settle(timeout)
    }
}
