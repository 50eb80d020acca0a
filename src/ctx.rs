//! `CtxState`: everything one queue thread owns.
//!
//! One per ublk queue (per CPU): its codec instance with context and scratch,
//! its statistics shard, its batch of handles to free, the plan of the group
//! it is writing, and in packed mode its gather buffer and read cache.
//! Nothing in it is shared on the I/O path, which is what keeps the hot path
//! free of locks. The operations below the store take it by `&mut`; the
//! public face of it is [`crate::QueueCtx`].

use crate::alloc::Handle;
use crate::backing::AlignedBuf;
use crate::codec::{AccelEvents, Codec, Dictionaries};
use crate::config::{Mode, StoreConfig};
use crate::free::FreeBatch;
use crate::page::PAGE_SIZE;
use crate::secondary::{Secondaries, MAX_SECONDARIES};
use crate::slot::Entry;
use crate::stats::{Counter, Phase, StatsShard};
use std::sync::Arc;
use std::time::Instant;

/// Bytes a queue thread's malloc arena is grown by before it serves
/// (`CtxState::prefault`).
const ARENA_ROOM: usize = 2 << 20;
/// Bytes of heap a thread keeps while memory is plentiful, for its
/// allocations once memory runs short ([`CtxState::keep_heap_room`]).
const HEAP_ROOM: usize = 1 << 20;

/// The mutable state of one queue thread, passed to the store's operations.
pub(crate) struct CtxState {
    pub(crate) codec: Box<dyn Codec>,
    /// Compression output for one group: one page-sized area per page.
    pub(crate) scratch: Vec<u8>,
    pub(crate) shard: Arc<StatsShard>,
    pub(crate) free: FreeBatch,
    /// Reused per-group vectors, so a write allocates nothing on the heap
    /// (lent out by [`CtxState::with_plan`]).
    plan: GroupPlan,
    /// Packed mode: the input pages of a group gathered contiguously.
    pub(crate) gather: Vec<u8>,
    /// Packed mode: the last group decompressed by a read.
    pub(crate) pack_cache: PackCache,
    /// Packed mode: the id the next packed object gets (queue in the top bits).
    pub(crate) next_pack_id: u64,
    /// The request's time on the store's clock, modulo 2^24 (set once per
    /// request): what writes and reads stamp slots with.
    pub(crate) now: u32,
    /// The store's secondary algorithms, as recompressions chose them
    /// (shared by every context of the store).
    secondary_algos: Arc<Secondaries>,
    /// The store's dictionaries, which the secondary codecs are made with.
    dictionaries: Dictionaries,
    /// This thread's codecs of the secondary algorithms (entry `i` for
    /// slots' `algo` `i + 1`), each made on first use.
    secondary: [Option<Box<dyn Codec>>; MAX_SECONDARIES],
    /// With a backing store: the blocks a read of a written-back page
    /// reads into (one block; a packed store's, as many as a group's
    /// header and blob can touch), made with the context so that a swap-in
    /// never allocates (`O_DIRECT` wants it aligned).
    pub(crate) bd_buf: Option<AlignedBuf>,
    /// Whether phases are timed (`StoreConfig::phase_timers`).
    timers: bool,
    /// Heap held while memory is plentiful and freed when it runs short
    /// ([`CtxState::keep_heap_room`]); `None` before `prefault`.
    heap_room: Option<Box<[u8]>>,
}

impl CtxState {
    /// Fresh state for thread `id` of `cfg`'s store, writing into `shard`;
    /// `epoch` is the store's recovery count, `secondaries` its secondary
    /// algorithms.
    pub(crate) fn new(
        cfg: &StoreConfig,
        id: usize,
        epoch: u64,
        shard: Arc<StatsShard>,
        secondaries: Arc<Secondaries>,
    ) -> Self {
        let g = cfg.group_pages;
        let packed = cfg.mode == Mode::Packed;
        CtxState {
            codec: cfg.new_codec(),
            scratch: vec![0u8; g * PAGE_SIZE],
            shard,
            free: FreeBatch::new(),
            plan: GroupPlan::with_capacity(g),
            gather: vec![0u8; if packed { g * PAGE_SIZE } else { 0 }],
            pack_cache: PackCache::with_capacity(if packed { g } else { 0 }),
            next_pack_id: first_pack_id(id, epoch),
            timers: cfg.phase_timers,
            heap_room: None,
            now: 0,
            secondary_algos: secondaries,
            dictionaries: cfg.dictionaries.clone(),
            secondary: Default::default(),
            bd_buf: cfg.backing.as_ref().and_then(|_| {
                match AlignedBuf::new(backed_read_blocks(cfg), cfg.mlock) {
                    Ok(b) => Some(b),
                    Err(e) => {
                        // Reads of written-back pages then fail (EIO) on this
                        // queue alone, and say why.
                        log::error!("queue {id}: no backing read buffer: {e}");
                        None
                    }
                }
            }),
        }
    }

    /// Runs `f` with this thread's group plan, emptied, taken out of the
    /// state so that both can be borrowed at once: planning fills the plan
    /// while it uses the codec, scratch and shard, installing reads it
    /// while it accounts. Taking it out and putting it back moves its
    /// vectors: no allocation, no copy.
    pub(crate) fn with_plan<R>(&mut self, f: impl FnOnce(&mut CtxState, &mut GroupPlan) -> R) -> R {
        let mut plan = std::mem::take(&mut self.plan);
        plan.clear();
        let r = f(self, &mut plan);
        self.plan = plan;
        r
    }

    /// Keeps room in this thread's malloc arena for when memory runs
    /// short (`short`: the allocator's reserve says so).
    ///
    /// While memory is plentiful a queue thread allocates for itself (a new
    /// zspage's owner table, room in a class's vectors), and those blocks
    /// live as long as their zspages, in this thread's arena: the room
    /// `prefault` made there is used up after a few thousand zspages and
    /// the arena then grows a page at a time, each a first touch. Any
    /// allocation of this thread once memory is short (an error's message,
    /// a vector grown by a free) would then fault a fresh page and, as an
    /// I/O flusher, loop in direct reclaim with every swap write behind it:
    /// the machine stalls (seen in the guest as a queue thread in
    /// `do_anonymous_page` -> `try_to_free_pages`, from malloc's
    /// `sysmalloc`). So the thread holds [`HEAP_ROOM`] bytes, touched,
    /// while memory is plentiful, and frees them when it runs short: the
    /// allocations made then reuse those pages. Back above the threshold,
    /// the room is taken again (a fault then is served from free memory).
    pub(crate) fn keep_heap_room(&mut self, short: bool) {
        match (&self.heap_room, short) {
            (Some(_), true) => self.heap_room = None,
            (None, false) => {
                let mut room = vec![0u8; HEAP_ROOM].into_boxed_slice();
                crate::page::touch_pages(&mut room, 1);
                self.heap_room = Some(room);
            }
            _ => {}
        }
    }

    /// Faults in the memory this state's requests use, on the thread that
    /// will serve them: every page of the scratch, gather and packed read
    /// buffers (zero-allocated, so never touched yet), the thread's stack
    /// and malloc arena, the codec's own memory ([`Codec::prefault`]: zstd's
    /// fixed workspaces), and what its calls touch as they go, by
    /// compressing and decompressing sample pages of every kind
    /// ([`sample_page`]) and, in packed mode, a whole group. In a swap
    /// device the first request comes when memory has run out: a queue
    /// thread that takes a fresh page then, with `PR_SET_IO_FLUSHER` (no I/O
    /// from its reclaim) and nothing reclaimable without I/O, loops in
    /// reclaim while the writes it should complete hold everyone else.
    /// Prefaulted, a request touches no fresh page; the daemon's
    /// `mlockall` then keeps these pages.
    pub(crate) fn prefault(&mut self) {
        for buf in [
            &mut self.scratch,
            &mut self.gather,
            &mut self.pack_cache.pages,
        ] {
            crate::page::touch_pages(buf, 0);
        }
        crate::page::prefault_thread(ARENA_ROOM);
        self.codec.prefault();
        let mut page = [0u8; PAGE_SIZE];
        let mut out = vec![0u8; 2 * PAGE_SIZE];
        for kind in 0..SAMPLE_KINDS {
            sample_page(&mut page, kind);
            // Errors do not matter here: only the memory the calls touch does.
            if let Ok(Some(n)) = self.codec.compress(&page, &mut out) {
                let _ = self.codec.decompress(&out[..n], &mut page);
            }
        }
        if !self.gather.is_empty() {
            self.prefault_group();
        }
        self.keep_heap_room(false);
    }

    /// Packed mode: one group's compression and decompression through the
    /// buffers a packed write and read use. The read cache's buffer is
    /// written, so the cache is invalidated first.
    fn prefault_group(&mut self) {
        for (i, page) in self.gather.chunks_exact_mut(PAGE_SIZE).enumerate() {
            sample_page(page, i % SAMPLE_KINDS);
        }
        let n = self.gather.len() / PAGE_SIZE;
        let Ok(Some(clen)) = self.codec.compress(&self.gather, &mut self.scratch) else {
            return;
        };
        let buf = self.pack_cache.buffer(n);
        let _ = self.codec.decompress(&self.scratch[..clen], buf);
    }

    /// This state with its phase timers off (the maintenance thread's).
    pub(crate) fn untimed(mut self) -> Self {
        self.timers = false;
        self
    }

    /// Whether the store times phases.
    #[inline]
    pub(crate) fn timing(&self) -> bool {
        self.timers
    }

    /// The start of a timed phase: now, when the store times phases.
    #[inline]
    pub(crate) fn clock(&self) -> Option<Instant> {
        self.timers.then(Instant::now)
    }

    /// Ends phase `p` begun at `since` (from [`CtxState::clock`] or an
    /// earlier lap) and returns its end, the start of the next phase: one
    /// clock read per boundary.
    #[inline]
    pub(crate) fn lap(&self, p: Phase, since: Option<Instant>) -> Option<Instant> {
        let t0 = since?;
        let now = Instant::now();
        self.shard
            .charge(p, now.saturating_duration_since(t0).as_nanos() as u64);
        Some(now)
    }

    /// Adds what the codec's accelerator went through to this thread's
    /// statistics (software codecs report nothing).
    pub(crate) fn count_accel_events(&mut self) {
        let ev = self.codec.take_accel_events();
        if ev == AccelEvents::default() {
            return;
        }
        let sh = &self.shard;
        sh.add(Counter::AccelPageFaults, ev.page_faults as i64);
        sh.add(Counter::AccelTimeouts, ev.timeouts as i64);
        sh.add(Counter::AccelVerifyFailures, ev.verify_failures as i64);
        sh.add(Counter::AccelDeviceErrors, ev.device_errors as i64);
        sh.add(Counter::AccelSubmitFailures, ev.submit_failures as i64);
        sh.add(Counter::AccelDecompressed, ev.decompressed as i64);
    }

    /// The id for the next packed object this thread makes.
    pub(crate) fn take_pack_id(&mut self) -> u64 {
        let id = self.next_pack_id;
        self.next_pack_id += 1;
        id
    }

    /// The codec of the secondary algorithm slots' `algo` value `algo`
    /// (1..=3) names, or `None` if the store has no such one (a slot that
    /// says otherwise is corrupt).
    pub(crate) fn secondary_codec(&mut self, algo: u8) -> Option<&mut Box<dyn Codec>> {
        let slot = self.secondary.get_mut(usize::from(algo).checked_sub(1)?)?;
        if slot.is_none() {
            let a = self.secondary_algos.get(algo)?;
            // Queue threads only decode with it: no compression context.
            // Made on first use (a read of a recompressed page), so its
            // memory is faulted in then, all at once, not page by page.
            let mut codec = self.dictionaries.codec_for(a, 0);
            codec.prefault();
            *slot = Some(codec);
        }
        slot.as_mut()
    }
}

/// Blocks a read of a written-back page of a store of `cfg` reads at
/// most: one, or in a packed store a whole group's header and blob
/// (below a group of pages) starting anywhere in its first block.
pub(crate) fn backed_read_blocks(cfg: &StoreConfig) -> usize {
    match cfg.mode {
        Mode::Packed => cfg.group_pages + 2,
        Mode::PerPage => 1,
    }
}

/// Kinds of [`sample_page`].
const SAMPLE_KINDS: usize = 3;

/// Fills `page` with sample data of `kind` for [`CtxState::prefault`]'s
/// codec calls, so that they reach the parts of a codec's context real
/// pages reach (zstd's contexts are heap memory touched as their tables are
/// used): 0, a short repeated pattern (long matches, few literals); 1,
/// text-like words (many short matches and literals skewed enough for
/// Huffman coding, which zstd decodes in four streams); 2, noise
/// (incompressible, raw literals).
fn sample_page(page: &mut [u8], kind: usize) {
    let mut x: u32 = 0x9e37_79b9 ^ kind as u32;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        x
    };
    match kind {
        0 => {
            for (i, b) in page.iter_mut().enumerate() {
                *b = (i % 251) as u8 ^ (i / 97) as u8;
            }
        }
        1 => {
            const WORDS: [&[u8]; 8] = [
                b"page ", b"swap ", b"the ", b"zram ", b"of ", b"memory ", b"and ", b"block ",
            ];
            let mut i = 0;
            while i < page.len() {
                let r = next();
                let word: &[u8] = if r % 3 == 0 {
                    &[b'a' + (r >> 8) as u8 % 26]
                } else {
                    WORDS[(r >> 4) as usize % WORDS.len()]
                };
                let n = word.len().min(page.len() - i);
                page[i..i + n].copy_from_slice(&word[..n]);
                i += n;
            }
        }
        _ => page.iter_mut().for_each(|b| *b = next() as u8),
    }
}

/// The first packed object id of thread `id` in recovery epoch `epoch`:
/// ids are never 0 (the empty read cache) and never repeat, across queues
/// (12 bits) nor across recoveries (16 bits), whose objects live on; each
/// thread has 2^36 ids per epoch.
fn first_pack_id(id: usize, epoch: u64) -> u64 {
    ((epoch & 0xffff) << 48) | (((id as u64 + 1) & 0xfff) << 36) | 1
}

/// The planned content of each page of the group being written, and the
/// reused buffers of its pipeline (see `crate::write`).
#[derive(Debug, Default)]
pub(crate) struct GroupPlan {
    /// Per page of the group: what its slot will hold.
    pub(crate) entries: Vec<Entry>,
    /// Per object to allocate: its size...
    pub(crate) sizes: Vec<u32>,
    /// ...and its owner (slot index).
    pub(crate) owners: Vec<u64>,
    /// The objects allocated, in the order of `sizes`.
    pub(crate) handles: Vec<Handle>,
    /// Per page compressed: its compressed length, `None` if huge.
    pub(crate) results: Vec<Option<usize>>,
}

impl GroupPlan {
    /// Creates a plan with room for `g` pages.
    fn with_capacity(g: usize) -> Self {
        GroupPlan {
            entries: Vec::with_capacity(g),
            sizes: Vec::with_capacity(g),
            owners: Vec::with_capacity(g),
            handles: Vec::with_capacity(g),
            results: Vec::with_capacity(g),
        }
    }

    /// Empties the plan for the next group, keeping its capacity.
    pub(crate) fn clear(&mut self) {
        self.entries.clear();
        self.sizes.clear();
        self.owners.clear();
        self.handles.clear();
        self.results.clear();
    }
}

/// What a thread's group cache holds: a packed object in RAM (its id,
/// never reused), or a written-back group (its slots' place, length,
/// shape and algorithm).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GroupKey {
    /// The packed object of this id.
    Ram(u64),
    /// The written-back group these slot fields name.
    Backed {
        /// The slot's `val` (block, offset, CRC bits).
        val: u64,
        /// The blob's length.
        len: u32,
        /// Pages in the blob.
        n: u8,
        /// Its algorithm.
        algo: u8,
    },
}

/// A per-thread cache of the last packed group decompressed, so that a read
/// of several pages of one group decompresses it once.
#[derive(Debug, Default)]
pub(crate) struct PackCache {
    key: Option<GroupKey>,
    pages: Vec<u8>,
}

impl PackCache {
    /// Creates a cache with room for `g` pages.
    fn with_capacity(g: usize) -> Self {
        PackCache {
            key: None,
            pages: vec![0; g * PAGE_SIZE],
        }
    }

    /// The cached page at `pos` if the cache holds the group `key` names.
    pub(crate) fn get(&self, key: GroupKey, pos: usize) -> Option<&[u8]> {
        if self.key == Some(key) {
            self.pages.get(pos * PAGE_SIZE..(pos + 1) * PAGE_SIZE)
        } else {
            None
        }
    }

    /// The buffer to decompress `n` pages into; invalidates the cache until
    /// [`PackCache::set`] names what it now holds.
    pub(crate) fn buffer(&mut self, n: usize) -> &mut [u8] {
        self.key = None;
        if self.pages.len() < n * PAGE_SIZE {
            self.pages.resize(n * PAGE_SIZE, 0);
        }
        &mut self.pages[..n * PAGE_SIZE]
    }

    /// The buffer as the last [`PackCache::buffer`] left it.
    pub(crate) fn buffer_ref(&self) -> &[u8] {
        &self.pages
    }

    /// Records that the buffer now holds the group `key` names.
    pub(crate) fn set(&mut self, key: GroupKey) {
        self.key = Some(key);
    }
}
