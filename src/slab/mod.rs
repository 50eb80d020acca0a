//! The size-class slab allocator: zblk's zsmalloc.
//!
//! Objects of similar size share a size class ([`class`]); each class packs
//! its objects back to back into zspages of 1 to 8 pages (longer for the
//! classes of objects larger than a page, which packed compression groups
//! need), so objects may
//! straddle page boundaries, and each zspage is one contiguous virtual range
//! carved from per-class mmap'd chunks ([`vm`]), so an object is always one
//! slice. A handle names (class, zspage, object index) and never changes
//! while the object stays put; compaction ([`compact`]) moves objects and
//! gives the owner slot the new handle through [`Relocate`], under that
//! slot's lock, using the back-reference kept for each object.
//!
//! Locking: one mutex per size class, nothing global on the allocation and
//! free paths except one atomic add when a zspage is created or destroyed
//! (memory accounting). A bulk allocation takes each class lock once; a bulk
//! free sorts its handles and takes each class lock once per run. Readers
//! ([`ObjAllocator::bytes`]) take no lock at all. Compaction takes a class
//! lock and then slot locks, so **nobody may call into the allocator while
//! holding a slot lock**: the store detaches handles under the slot lock and
//! frees them after releasing it.
//!
//! # Why object access is sound
//!
//! The slab hands out addresses, never references; the three views of
//! [`ObjAllocator`] turn them into references under rules that make Rust's
//! aliasing model hold without any lock in the allocator:
//!
//! 1. **An object is written once, before it is published.** Between
//!    `alloc_bulk` and the install of its handle into a slot, only the
//!    allocating thread knows the handle, so `write_fresh` (a raw copy, no
//!    `&mut` is ever formed) cannot race with anyone.
//! 2. **A published object is immutable**, except for one word: a packed
//!    object's live mask, which slots under different locks clear, and
//!    which is only ever reached as an `AtomicU64` through `atomic_word`.
//!    Shared views (`bytes`) of a packed object start after that word.
//! 3. **A published object stays put while a slot lock referencing it is
//!    held.** Frees happen only after a slot let go of the handle (detach
//!    under the lock, free after it); compaction moves an object only with
//!    the locks of every slot that references it held (see [`Relocate`])
//!    and copies it with raw pointers while nobody can read it.
//! 4. **Mapped memory outlives every handle into it.** A zspage's range is
//!    given back (`madvise`) only when its last object was freed, and the
//!    chunk mappings themselves live as long as the allocator.
//!
//! Everything else (class state, fullness groups, free lists) is plain
//! Rust data behind each class's mutex.

mod class;
mod compact;
mod recover;
mod reserve;
mod vm;

pub(crate) use recover::Claim;
pub(crate) use reserve::total_ram;
pub(crate) use vm::populate_range;

use crate::alloc::{AllocError, Handle, MemAccount, ObjAllocator, Relocate, ReserveStats};
use crate::shm::SharedMem;
use class::{ClassSpec, ClassTable};
use reserve::{Missed, Reserve};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use vm::ChunkDir;

/// How a slab is built.
#[derive(Debug, Clone, Copy, Default)]
pub struct SlabConfig {
    /// Lock zspages in RAM (`mlock`): for swap devices, whose memory must
    /// never itself be swapped out.
    pub mlock: bool,
    /// Keep a memory reserve (see [`reserve`]): new zspages come only from
    /// spares a provisioner thread backed ahead of need
    /// ([`ObjAllocator::serve_reserve`]), so the allocating thread never
    /// faults in fresh memory. For the daemon, whose queue threads are what
    /// turns the kernel's dirty pages into free memory.
    pub reserve: bool,
    /// Free memory below which the reserve applies (0: 1/16 of RAM, at
    /// least 64 MB and twice the zones' high watermarks; `u64::MAX`:
    /// always); above it an allocating thread
    /// backs new zspages itself, as without a reserve.
    pub reserve_free_below: u64,
}

/// Marks a free object in a zspage's owner table; the low bits then hold
/// the index of the next free object.
const FREE: u64 = 1 << 63;
/// End of a zspage's free list.
const NIL: u32 = u32::MAX;
/// Fullness groups: 0..=9 hold zspages 0-10 %, ..., 90-100 % used; 10 holds
/// full ones.
const FULL: usize = 10;
const NGROUPS: usize = FULL + 1;

const IDX_BITS: u32 = 12;
const CLASS_SHIFT: u32 = 56;
/// Zspage ids must fit between the object index and the class.
const MAX_ID: u64 = 1 << (CLASS_SHIFT - IDX_BITS);

/// Builds a handle: `class + 1` in the top byte (so a handle is never 0),
/// the zspage id, and the object index.
#[inline]
fn handle(class: usize, id: u64, idx: u32) -> Handle {
    ((class as u64 + 1) << CLASS_SHIFT) | (id << IDX_BITS) | idx as u64
}

/// Splits a handle into (class, zspage id, object index); the class is
/// `usize::MAX` for handle 0.
#[inline]
fn unpack(h: Handle) -> (usize, u64, u32) {
    let class = (h >> CLASS_SHIFT) as usize;
    (
        class.wrapping_sub(1),
        (h >> IDX_BITS) & (MAX_ID - 1),
        (h & ((1 << IDX_BITS) - 1)) as u32,
    )
}

/// One zspage's bookkeeping, kept under its class lock.
#[derive(Debug)]
struct ZsMeta {
    /// Per object: the owner (slot index) of a used object, or
    /// `FREE | next` for a free one. Empty while the zspage id is unused.
    owners: Box<[u64]>,
    free_head: u32,
    inuse: u32,
    group: u8,
    /// Position in `groups[group]`.
    pos: u32,
}

impl ZsMeta {
    /// The bookkeeping of an unused id (an empty box allocates nothing).
    fn dead() -> ZsMeta {
        ZsMeta {
            owners: Box::default(),
            free_head: NIL,
            inuse: 0,
            group: 0,
            pos: 0,
        }
    }

    fn is_live(&self) -> bool {
        !self.owners.is_empty()
    }
}

/// A class's mutable state: its zspages and fullness groups.
#[derive(Debug, Default)]
struct ClassState {
    /// By zspage id; ids of dead zspages are in `free_ids`.
    zs: Vec<ZsMeta>,
    free_ids: Vec<u64>,
    /// Zspages emptied during the current lock hold whose pages are not
    /// yet given back: released together (see `release_dead`).
    dead: Vec<u64>,
    /// Empty zspages kept with their pages (still charged) for the next
    /// `new_zspage`, which then skips asking the OS for fresh pages: on a
    /// swap device objects die and are born all the time, and a fresh page
    /// (a page fault, zeroing, possibly reclaim) costs a sizeable part of
    /// compressing a page, where a spare's pages are already in place
    /// (BENCHMARKS.md has the figures).
    spare: Vec<u64>,
    /// Whether `new_zspage` took a spare since the last [`SlabAllocator::trim`].
    spare_used: bool,
    /// Zspages made from fresh ids during the current lock hold, whose pages
    /// the allocating thread backs (populate or mlock) after it let go of
    /// the lock: a page fault per page is slow, and other threads of the
    /// class should not queue behind it (see [`SlabAllocator::back`]).
    fresh: Vec<u64>,
    /// Fullness groups: ids of live zspages by how full they are.
    groups: [Vec<u64>; NGROUPS],
    /// Owner tables of dead zspages kept for the next ones, so that making
    /// a zspage from a spare allocates nothing (reserve mode only).
    boxes: Vec<Box<[u64]>>,
    /// Objects allocations asked for and found no free object and no spare
    /// for, since the provisioner last filled the class (reserve mode): it
    /// gives the class room for them, even while it holds nothing.
    missed: u32,
    live_zspages: u64,
    objs_used: u64,
}

fn group_of(inuse: u32, objs: u32) -> usize {
    if inuse >= objs {
        FULL
    } else {
        (inuse as usize * 10) / objs as usize
    }
}

impl ClassState {
    /// Moves zspage `id` to the fullness group its use now calls for.
    fn regroup(&mut self, id: u64, objs: u32) {
        let z = &self.zs[id as usize];
        let g = group_of(z.inuse, objs);
        if g == z.group as usize {
            return;
        }
        self.unlink(id);
        self.link(id, g);
    }

    fn link(&mut self, id: u64, g: usize) {
        let pos = self.groups[g].len() as u32;
        reserve::push_touched(&mut self.groups[g], id);
        let z = &mut self.zs[id as usize];
        z.group = g as u8;
        z.pos = pos;
    }

    fn unlink(&mut self, id: u64) {
        let z = &self.zs[id as usize];
        let (g, pos) = (z.group as usize, z.pos as usize);
        self.groups[g].swap_remove(pos);
        if let Some(&moved) = self.groups[g].get(pos) {
            self.zs[moved as usize].pos = pos as u32;
        }
    }

    /// The fullest zspage with a free object, other than `exclude`.
    fn fullest_partial(&self, exclude: Option<u64>) -> Option<u64> {
        self.groups[..FULL].iter().rev().find_map(|g| {
            g.iter()
                .rev()
                .take(2)
                .copied()
                .find(|&id| Some(id) != exclude)
        })
    }

    /// The emptiest live, not full zspage not in `skip`.
    fn emptiest_partial_except(&self, skip: &[u64]) -> Option<u64> {
        self.groups[..FULL]
            .iter()
            .find_map(|g| g.iter().rev().copied().find(|id| !skip.contains(id)))
    }

    /// Whether moving objects could free at least one zspage.
    fn can_compact(&self, spec: &ClassSpec) -> bool {
        self.wasted_zspages(spec) > 0
    }

    /// Zspages' worth of free objects in partly used zspages.
    fn wasted_zspages(&self, spec: &ClassSpec) -> u64 {
        let allocated = self.live_zspages * spec.objs as u64;
        (allocated - self.objs_used) / spec.objs as u64
    }

    /// How many empty zspages the class may keep: one, plus one per
    /// `SPARE_PER` live zspages (so spares stay a small share of what the
    /// class holds), and none once the class holds nothing.
    fn spare_cap(&self) -> usize {
        if self.live_zspages == 0 {
            0
        } else {
            1 + (self.live_zspages / SPARE_PER) as usize
        }
    }
}

/// Live zspages per spare a class may keep (at most 1/8 of its memory,
/// and only while spares keep being reused: see [`SlabAllocator::trim`]).
const SPARE_PER: u64 = 8;

/// One size class: its shape, its address space and its lock.
struct SizeClass {
    index: usize,
    spec: ClassSpec,
    /// What one zspage costs in `mem_used_total`: its pages and metadata.
    cost: u64,
    dir: ChunkDir,
    state: Mutex<ClassState>,
}

impl SizeClass {
    /// Zspage ids the class can use: what handles can encode, and what its
    /// address space (its region of a shared store) has room for.
    fn id_limit(&self) -> u64 {
        MAX_ID.min(self.dir.max_ids())
    }
}

/// The size-class slab allocator.
pub struct SlabAllocator {
    table: &'static ClassTable,
    classes: Box<[SizeClass]>,
    mem: MemAccount,
    mlock: bool,
    mlock_warned: AtomicBool,
    /// Zspages live in a memfd: a page it cannot get is refused up front.
    shared: bool,
    /// The memory reserve, in reserve mode.
    reserve: Option<Reserve>,
}

impl std::fmt::Debug for SlabAllocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlabAllocator")
            .field("classes", &self.classes.len())
            .field("mem_used_total", &self.mem.used())
            .field("mlock", &self.mlock)
            .finish()
    }
}

impl Default for SlabAllocator {
    fn default() -> Self {
        Self::new(SlabConfig::default())
    }
}

impl SlabAllocator {
    /// Creates an empty slab; no memory is mapped until the first object.
    pub fn new(cfg: SlabConfig) -> Self {
        Self::build(cfg, None)
    }

    /// Creates an empty slab whose zspages live in `shm`'s class regions
    /// (or, for [`SlabAllocator::claim`], a slab over the zspages a dead
    /// process left there).
    pub(crate) fn shared(cfg: SlabConfig, shm: Arc<SharedMem>) -> Self {
        Self::build(cfg, Some(shm))
    }

    /// A hash of the class table and of the handle and slot encodings: a
    /// process can use zspages another left in shared memory only if its
    /// fingerprint is the same.
    pub(crate) fn fingerprint() -> u64 {
        Self::fingerprint_for(crate::shm::LAYOUT_VERSION)
    }

    /// [`Self::fingerprint`] as a build of shared-memory layout `layout`
    /// computed it (the class table and encodings are the same since
    /// layout 2).
    pub(crate) fn fingerprint_for(layout: u64) -> u64 {
        // FNV-1a over every class's shape and the encoding constants.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut mix = |x: u64| {
            for b in x.to_le_bytes() {
                h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
            }
        };
        mix(layout);
        mix(u64::from(IDX_BITS));
        mix(u64::from(CLASS_SHIFT));
        mix(vm::CHUNK0);
        for spec in class::classes().specs.iter() {
            mix(u64::from(spec.size));
            mix(u64::from(spec.pages));
            mix(u64::from(spec.objs));
        }
        h
    }

    fn build(cfg: SlabConfig, shm: Option<Arc<SharedMem>>) -> Self {
        let table = class::classes();
        let shared = shm.is_some();
        // Chunks locked on fault where locking costs no limit (one look at
        // the process's limits and capabilities, not one per chunk).
        let chunk_lock = cfg.mlock && vm::may_lock_unbounded();
        let classes = table
            .specs
            .iter()
            .enumerate()
            .map(|(index, &spec)| {
                let bytes = spec.zspage_bytes();
                SizeClass {
                    index,
                    spec,
                    cost: bytes as u64
                        + std::mem::size_of::<ZsMeta>() as u64
                        + 8 * spec.objs as u64,
                    dir: match &shm {
                        Some(shm) => {
                            let region = crate::shm::class_region(index).0;
                            ChunkDir::shared(bytes, chunk_lock, shm.clone(), region)
                        }
                        None => ChunkDir::new(bytes, chunk_lock),
                    },
                    state: Mutex::new(ClassState::default()),
                }
            })
            .collect();
        SlabAllocator {
            table,
            classes,
            mem: MemAccount::default(),
            mlock: cfg.mlock,
            mlock_warned: AtomicBool::new(false),
            shared,
            reserve: cfg.reserve.then(|| Reserve::new(cfg.reserve_free_below)),
        }
    }

    /// The size classes, smallest first.
    #[cfg(test)]
    fn class_specs(&self) -> &[ClassSpec] {
        &self.table.specs
    }

    /// The class index serving objects of `size` bytes.
    #[cfg(test)]
    fn class_of(&self, size: usize) -> Option<usize> {
        self.table.class_of(size)
    }

    /// The class index a handle belongs to.
    #[cfg(test)]
    fn class_of_handle(h: Handle) -> usize {
        unpack(h).0
    }

    /// Live zspages over all classes.
    #[cfg(any(test, feature = "test-support"))]
    pub fn zspages(&self) -> u64 {
        self.classes.iter().map(|c| lock(c).live_zspages).sum()
    }

    /// Objects allocated and not freed, over all classes.
    #[cfg(any(test, feature = "test-support"))]
    pub fn objects(&self) -> u64 {
        self.classes.iter().map(|c| lock(c).objs_used).sum()
    }

    /// Pages compaction could give back now (whole zspages' worth of free
    /// objects scattered over partly used zspages).
    pub fn compactable_pages(&self) -> u64 {
        self.classes
            .iter()
            .map(|c| lock(c).wasted_zspages(&c.spec) * c.spec.pages as u64)
            .sum()
    }

    fn charge(&self, bytes: u64) -> Result<(), AllocError> {
        self.mem.try_charge(bytes)
    }

    fn uncharge(&self, bytes: u64) {
        self.mem.uncharge(bytes);
    }

    /// Creates an empty zspage in `class` and links it into group 0. With a
    /// reserve and memory short, only from a spare: fresh pages are then
    /// the provisioner's job.
    fn new_zspage(&self, class: &SizeClass, state: &mut ClassState) -> Result<u64, Refused> {
        let tight = self.reserve.as_ref().is_some_and(Reserve::tight);
        // Short of memory, an owner table comes only from those the
        // provisioner made: one from the heap would be a fresh page for
        // this (queue) thread, faulted in under the class lock, in reclaim,
        // with every swap write behind that lock. Boxes made by queue
        // threads while memory was plentiful outlive them in the thread's
        // own malloc arena, so
        // its prefaulted room (`CtxState::prefault`) does not last.
        if state.boxes.is_empty() && tight {
            return Err(self.refuse(class));
        }
        // With memory to spare, the reserve's share of the spares stays for
        // when it is short, and this thread faults in a fresh zspage
        // itself: taking a spare would make the provisioner fault one in
        // again at once, the same page fault plus a wake and a pass over
        // the class locks, provisioner CPU spent on every stored page.
        // Spares beyond that share, zspages kept when
        // they died, are reused first: memory already faulted in costs a
        // tenth of a fresh page. Likewise the owner tables the provisioner
        // made, one per spare and one more.
        let eager = self.reserve.as_ref().is_some_and(Reserve::eager);
        let (keep, keep_boxes) = if tight || eager {
            (0, 0)
        } else {
            let want = self.reserve_want(class, state);
            (want, want + 1)
        };
        if state.spare.len() > keep {
            if let Some(id) = self.take_spare(class, state, keep_boxes) {
                return Ok(id);
            }
        }
        if tight {
            return Err(self.refuse(class));
        }
        if let Err(e) = self.charge(class.cost) {
            // At the memory limit the reserve's spares, charged already, are
            // what is left.
            return self.take_spare(class, state, keep_boxes).ok_or(e.into());
        }
        if crate::fail_point::fail("slab:zspage") {
            self.uncharge(class.cost);
            return Err(AllocError { limit: 0 }.into());
        }
        let Some(id) = Self::take_id(class, state) else {
            self.uncharge(class.cost);
            return Err(AllocError { limit: 0 }.into());
        };
        reserve::push_touched(&mut state.fresh, id);
        self.init_zspage(class, state, id, keep_boxes);
        Ok(id)
    }

    /// Refuses a new zspage of `class` for want of spares, asking the
    /// provisioner for the class's own (a pass visits the classes that
    /// asked).
    fn refuse(&self, class: &SizeClass) -> Refused {
        if let Some(r) = &self.reserve {
            r.wake_for(class.index);
        }
        Refused::ReserveEmpty
    }

    /// Makes the class's last spare, if it has one, a live empty zspage
    /// (its owner table one of the class's boxes beyond `keep_boxes`).
    fn take_spare(
        &self,
        class: &SizeClass,
        state: &mut ClassState,
        keep_boxes: usize,
    ) -> Option<u64> {
        let id = state.spare.pop()?;
        // Still charged, backed and (if configured) locked.
        state.spare_used = true;
        self.init_zspage(class, state, id, keep_boxes);
        self.wake_if_short(class, state);
        Some(id)
    }

    /// Asks the provisioner to refill the class once its spares fell below
    /// what the reserve wants there ([`Reserve::wake_for`]: the wakes after
    /// the first and before its pass cost one atomic operation, not a
    /// system call and a switch to a real-time thread each).
    fn wake_if_short(&self, class: &SizeClass, state: &ClassState) {
        if let Some(r) = &self.reserve {
            if state.spare.len() < self.reserve_want(class, state) {
                r.wake_for(class.index);
            }
        }
    }

    /// An unused zspage id of `class` whose chunk is mapped: a free one, or
    /// the next new one; `None` when the class's address space is full.
    fn take_id(class: &SizeClass, state: &mut ClassState) -> Option<u64> {
        match state.free_ids.pop() {
            // A recovered slab's free ids may lie in chunks nobody mapped.
            Some(id) if class.dir.ensure(id) => Some(id),
            Some(id) => {
                reserve::push_touched(&mut state.free_ids, id);
                None
            }
            None => {
                let id = state.zs.len() as u64;
                if id >= class.id_limit() || !class.dir.ensure(id) {
                    return None;
                }
                reserve::push_touched(&mut state.zs, ZsMeta::dead());
                Some(id)
            }
        }
    }

    /// Backs the pages of new zspage `id` (after the class lock was let go:
    /// the zspage cannot die meanwhile, the caller holds objects in it; a
    /// thread that writes to it first just takes the page faults).
    ///
    /// Returns false when a shared store could not back it: the memfd did
    /// not grow, and the first write into the zspage would fault where no
    /// error can be returned, so the allocation is refused now. Private
    /// memory that cannot be backed now faults in on first use.
    fn back(&self, class: &SizeClass, id: u64) -> bool {
        self.back_run(class, id, 1)
    }

    /// [`Self::back`] for the `n` neighbouring zspages from `first` (one
    /// chunk), in one call: under emulation a system call costs more than
    /// faulting in a page.
    fn back_run(&self, class: &SizeClass, first: u64, n: usize) -> bool {
        self.back_run_by(class, first, n, FaultIn::Populate)
    }

    /// [`Self::back_run`], backing the pages as `how` says.
    fn back_run_by(&self, class: &SizeClass, first: u64, n: usize, how: FaultIn) -> bool {
        let addr = class.dir.zspage_addr(first);
        let len = class.spec.zspage_bytes() * n;
        // A chunk locked on fault is locked by populating it.
        if self.mlock && !class.dir.locked_on_fault(first) {
            if vm::lock_range(addr, len) {
                return true;
            }
            if !self.mlock_warned.swap(true, Relaxed) {
                log::warn!(
                    "slab: mlock failed ({}); stored pages may be swapped out",
                    std::io::Error::last_os_error()
                );
            }
            if !self.shared {
                return true;
            }
        }
        let backed = match how {
            FaultIn::Populate => vm::populate_range(addr, len),
            FaultIn::Touch => vm::touch_range(addr, len),
        };
        !self.shared || (backed && !crate::fail_point::fail("shm:grow"))
    }

    /// Backs every zspage made fresh during the lock hold `state`, after
    /// letting go of the lock ([`Self::back`]); returns whether all were.
    fn back_fresh(&self, class: &SizeClass, mut state: MutexGuard<'_, ClassState>) -> bool {
        let mut fresh = std::mem::take(&mut state.fresh);
        drop(state);
        fresh.sort_unstable();
        // Every one is backed, even after a failure, as alloc_bulk always
        // did.
        let mut ok = true;
        for_id_runs(&fresh, |first, n| ok &= self.back_run(class, first, n));
        ok
    }

    /// Makes zspage `id` an empty live zspage in fullness group 0; its
    /// owner table is one of the class's boxes if it has more than
    /// `keep_boxes`, else a new one.
    fn init_zspage(&self, class: &SizeClass, state: &mut ClassState, id: u64, keep_boxes: usize) {
        let objs = class.spec.objs;
        let kept = (state.boxes.len() > keep_boxes)
            .then(|| state.boxes.pop())
            .flatten();
        let mut owners = match kept {
            Some(b) if b.len() == objs as usize => b,
            _ => vec![0; objs as usize].into_boxed_slice(),
        };
        for (i, o) in owners.iter_mut().enumerate() {
            *o = FREE
                | if i as u32 + 1 < objs {
                    i as u64 + 1
                } else {
                    NIL as u64
                };
        }
        state.zs[id as usize] = ZsMeta {
            owners,
            free_head: 0,
            inuse: 0,
            group: 0,
            pos: 0,
        };
        state.link(id, 0);
        state.live_zspages += 1;
    }

    /// Takes a free object of zspage `id` (which must have one) for `owner`.
    fn take_obj(class: &SizeClass, state: &mut ClassState, id: u64, owner: u64) -> Handle {
        let z = &mut state.zs[id as usize];
        let idx = z.free_head;
        z.free_head = (z.owners[idx as usize] & !FREE) as u32;
        z.owners[idx as usize] = owner & !FREE;
        z.inuse += 1;
        state.objs_used += 1;
        state.regroup(id, class.spec.objs);
        handle(class.index, id, idx)
    }

    /// Allocates one object in `class` for `owner`, in the fullest zspage
    /// that has room, so that partly used zspages fill up before new ones
    /// are made.
    fn alloc_obj(
        &self,
        class: &SizeClass,
        state: &mut ClassState,
        owner: u64,
    ) -> Result<Handle, Refused> {
        if crate::fail_point::fail("slab:obj") {
            return Err(AllocError { limit: 0 }.into());
        }
        let id = match state.fullest_partial(None) {
            Some(id) => id,
            None => self.new_zspage(class, state)?,
        };
        Ok(Self::take_obj(class, state, id, owner))
    }

    /// Frees object `idx` of zspage `id`; destroys the zspage if that
    /// empties it. Returns the pages given back. A handle that does not name
    /// a used object (a double free) is logged and ignored.
    fn free_obj(&self, class: &SizeClass, state: &mut ClassState, id: u64, idx: u32) -> u64 {
        let Some(z) = state.zs.get_mut(id as usize) else {
            log::error!("slab: free of unknown zspage {id} in class {}", class.index);
            return 0;
        };
        match z.owners.get(idx as usize) {
            Some(&o) if o & FREE == 0 => {}
            _ => {
                log::error!(
                    "slab: double free or bad handle {:#x}",
                    handle(class.index, id, idx)
                );
                return 0;
            }
        }
        z.owners[idx as usize] = FREE | z.free_head as u64;
        z.free_head = idx;
        z.inuse -= 1;
        state.objs_used -= 1;
        if z.inuse == 0 {
            self.destroy_zspage(state, id);
            class.spec.pages as u64
        } else {
            state.regroup(id, class.spec.objs);
            0
        }
    }

    /// Retires an empty zspage; its pages go back to the OS at the end of
    /// the lock hold ([`Self::release_dead`]).
    fn destroy_zspage(&self, state: &mut ClassState, id: u64) {
        state.unlink(id);
        let owners = std::mem::replace(&mut state.zs[id as usize], ZsMeta::dead()).owners;
        // Kept within the capacity the provisioner gave (no allocation).
        if self.reserve.is_some()
            && state.boxes.len() < reserve::BOXES_KEPT.min(state.boxes.capacity())
        {
            reserve::push_touched(&mut state.boxes, owners);
        }
        state.live_zspages -= 1;
        reserve::push_touched(&mut state.dead, id);
    }

    /// Gives the pages of the zspages retired in this lock hold back to the
    /// OS, one `madvise` per run of neighbouring zspages (each call costs a
    /// TLB flush, so a drained batch that empties many neighbours pays
    /// once), and makes their ids reusable. Called before the class lock is
    /// released, so no id is reused before its pages are gone.
    fn release_dead(&self, class: &SizeClass, state: &mut ClassState) {
        let keep = self.spares_kept(class, state);
        self.release_dead_keeping(class, state, keep);
    }

    /// Spares a class keeps when zspages die: what reuse calls for, and at
    /// least the reserve's share.
    fn spares_kept(&self, class: &SizeClass, state: &ClassState) -> usize {
        state.spare_cap().max(self.reserve_want(class, state))
    }

    /// Gives the spares of the class the reserve does not need back to the
    /// OS, [`reserve::HOLD_PUSHES`] a lock hold; returns the 4 KB pages
    /// given back.
    fn trim_spares(&self, class: &SizeClass) -> u64 {
        let mut pages = 0;
        loop {
            let mut state = self.lock_with_room(class);
            let before = spare_pages(class, &state);
            let keep = self.reserve_want(class, &state);
            self.release_dead_keeping(class, &mut state, keep);
            let given = before.saturating_sub(spare_pages(class, &state));
            if given == 0 {
                return pages;
            }
            pages += given;
        }
    }

    /// [`Self::release_dead`], keeping up to `cap` empty zspages as spares
    /// (and giving back spares beyond `cap`, at most
    /// [`reserve::HOLD_PUSHES`] of them a call).
    fn release_dead_keeping(&self, class: &SizeClass, state: &mut ClassState, cap: usize) {
        // At most HOLD_PUSHES spares a hold, within the room the hold was
        // given ([`Self::lock_with_room`]); the rest go in later holds.
        let excess = state.spare.len().saturating_sub(cap);
        for _ in 0..excess.min(reserve::HOLD_PUSHES) {
            if let Some(id) = state.spare.pop() {
                reserve::push_touched(&mut state.dead, id);
            }
        }
        while state.spare.len() < cap {
            match state.dead.pop() {
                Some(id) => reserve::push_touched(&mut state.spare, id),
                None => break,
            }
        }
        if state.dead.is_empty() {
            return;
        }
        state.dead.sort_unstable();
        self.release_runs(class, &state.dead);
        self.uncharge(class.cost * state.dead.len() as u64);
        let ClassState { dead, free_ids, .. } = state;
        reserve::append_touched(free_ids, dead);
    }

    /// Gives the pages of the zspages `ids` (sorted) back to the OS, one
    /// call per run of neighbouring zspages within a chunk.
    fn release_runs(&self, class: &SizeClass, ids: &[u64]) {
        for_id_runs(ids, |first, n| {
            class.dir.release(first, n as u64, self.mlock)
        });
    }

    /// Frees handles that `alloc_bulk` made before it failed (the entries
    /// of `out` it filled; the others are 0).
    fn rollback(&self, out: &[Handle]) {
        let hs: Vec<Handle> = out.iter().copied().filter(|&h| h != 0).collect();
        self.free_bulk(&hs);
    }
}

/// Why an object could not be allocated in its class.
#[derive(Debug, Clone, Copy)]
enum Refused {
    /// The allocation failed (memory limit, the OS, the id space).
    Failed(AllocError),
    /// Reserve mode: the class has no free object and no spare zspage.
    ReserveEmpty,
}

impl From<AllocError> for Refused {
    fn from(e: AllocError) -> Self {
        Refused::Failed(e)
    }
}

/// 4 KB pages held by the class's spare zspages.
fn spare_pages(class: &SizeClass, state: &ClassState) -> u64 {
    (state.spare.len() * class.spec.pages as usize) as u64
}

fn lock(class: &SizeClass) -> MutexGuard<'_, ClassState> {
    // A panic under a class lock cannot leave the state half-updated in a
    // way later calls trip over more than the panic itself did; keep going.
    class.state.lock().unwrap_or_else(|e| e.into_inner())
}

/// Calls `f(first, n)` on each maximal run of neighbouring zspage ids
/// within one chunk in `ids` (sorted): what one system call can cover.
fn for_id_runs(ids: &[u64], mut f: impl FnMut(u64, usize)) {
    let mut run: Option<(u64, usize)> = None; // (first id, count)
    for &id in ids {
        run = match run {
            Some((first, n))
                if first + n as u64 == id && vm::chunk_of(first).0 == vm::chunk_of(id).0 =>
            {
                Some((first, n + 1))
            }
            Some((first, n)) => {
                f(first, n);
                Some((id, 1))
            }
            None => Some((id, 1)),
        };
    }
    if let Some((first, n)) = run {
        f(first, n);
    }
}

/// Calls `f` on each maximal run of `items` sharing a key.
fn for_runs<T, K: PartialEq>(items: &[T], key: impl Fn(&T) -> K, mut f: impl FnMut(&[T])) {
    let mut start = 0;
    while start < items.len() {
        let k = key(&items[start]);
        let mut end = start + 1;
        while end < items.len() && key(&items[end]) == k {
            end += 1;
        }
        f(&items[start..end]);
        start = end;
    }
}

/// How new zspages get their pages: how their memory is faulted in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FaultIn {
    /// One `MADV_POPULATE_WRITE` per run of zspages: one system call, but
    /// it holds the process's `mmap_lock` (for reading) for as long as its
    /// page allocations wait in reclaim.
    Populate,
    /// A write fault per page ([`vm::touch_range`]): under the VMA's own
    /// lock, so a thread that needs `mmap_lock` for writing meanwhile
    /// (`mprotect` growing a malloc arena, `mmap`, `mlock`) does not wait
    /// for this one's reclaim. The provisioner's way: its faults wait in
    /// reclaim by design, and a queue thread stuck behind them on
    /// `mmap_lock` completes no write, so reclaim never ends.
    Touch,
}

/// Entries handled on the stack before falling back to the heap: a whole
/// compression group or free batch.
const STACK_ENTRIES: usize = 64;

impl ObjAllocator for SlabAllocator {
    fn alloc_bulk(
        &self,
        sizes: &[u32],
        owners: &[u64],
        out: &mut Vec<Handle>,
    ) -> Result<(), AllocError> {
        let n = sizes.len();
        if owners.len() != n {
            return Err(AllocError { limit: 0 });
        }
        let mut stack = [(0u8, 0u32); STACK_ENTRIES];
        let mut heap = Vec::new();
        let order: &mut [(u8, u32)] = if n <= STACK_ENTRIES {
            &mut stack[..n]
        } else {
            heap.resize(n, (0, 0));
            &mut heap
        };
        for (i, (o, &size)) in order.iter_mut().zip(sizes).enumerate() {
            let Some(c) = self.table.class_of(size as usize) else {
                return Err(AllocError { limit: 0 });
            };
            *o = (c as u8, i as u32);
        }
        // Group by class: one lock acquisition per class for the whole group.
        order.sort_unstable();
        let base = out.len();
        out.resize(base + n, 0);
        let dst = &mut out[base..];
        let mut missed = Missed::default();
        let mut failed = None;
        for_runs(
            order,
            |e| e.0,
            |run| {
                if failed.is_some() {
                    return;
                }
                let class = &self.classes[run[0].0 as usize];
                let mut state = lock(class);
                for &(_, i) in run {
                    match self.alloc_obj(class, &mut state, owners[i as usize]) {
                        Ok(h) => dst[i as usize] = h,
                        Err(Refused::ReserveEmpty) => {
                            state.missed = (state.missed + 1).min(reserve::MISSED_MAX);
                            missed.push(i);
                        }
                        Err(Refused::Failed(e)) => {
                            failed = Some(e);
                            break;
                        }
                    }
                }
                if !self.back_fresh(class, state) && failed.is_none() {
                    // The objects of this run of one class are in `dst`: rolled back below.
                    failed = Some(AllocError { limit: 0 });
                }
            },
        );
        if failed.is_none() && !missed.is_empty() {
            failed = self.place_missed(&missed, sizes, owners, dst).err();
        }
        if let Some(e) = failed {
            self.rollback(&out[base..]);
            out.truncate(base);
            return Err(e);
        }
        Ok(())
    }

    fn free_bulk(&self, handles: &[Handle]) {
        // The class is the top byte: sorted handles come grouped by class
        // (one lock per class) and, within a class, by zspage. The drain
        // hands over sorted chunks; batches from queues are sorted here.
        let n = handles.len();
        let mut stack = [0u64; STACK_ENTRIES];
        let mut heap = Vec::new();
        let sorted: &[Handle] = if handles.windows(2).all(|w| w[0] <= w[1]) {
            handles
        } else if n <= STACK_ENTRIES {
            stack[..n].copy_from_slice(handles);
            stack[..n].sort_unstable();
            &stack[..n]
        } else {
            heap.extend_from_slice(handles);
            heap.sort_unstable();
            &heap
        };
        for_runs(
            sorted,
            |&h| unpack(h).0,
            |run| {
                let Some(class) = self.classes.get(unpack(run[0]).0) else {
                    log::error!("slab: free of bad handle {:#x}", run[0]);
                    return;
                };
                for part in run.chunks(reserve::HOLD_PUSHES) {
                    let mut state = self.lock_with_room(class);
                    for &h in part {
                        let (_, id, idx) = unpack(h);
                        self.free_obj(class, &mut state, id, idx);
                    }
                    self.release_dead(class, &mut state);
                }
            },
        );
    }

    unsafe fn object_ptr(&self, h: Handle, len: usize) -> *mut u8 {
        let (c, id, idx) = unpack(h);
        let class = &self.classes[c];
        debug_assert!(len <= class.spec.size as usize);
        let addr = class.dir.zspage_addr(id) + idx as usize * class.spec.size as usize;
        debug_assert!(addr >= class.spec.size as usize);
        // Only an address is computed here; the views that dereference it
        // rely on the caller's guarantee that `h` is live, which puts these
        // bytes inside its zspage's mapped range.
        addr as *mut u8
    }

    fn mem(&self) -> &MemAccount {
        &self.mem
    }

    fn compact(&self, relocate: &dyn Relocate) -> u64 {
        (0..self.classes.len())
            .map(|c| self.compact_class(c, relocate, usize::MAX))
            .sum()
    }

    fn compactable_pages(&self) -> u64 {
        SlabAllocator::compactable_pages(self)
    }

    fn spare_pages(&self) -> u64 {
        self.classes.iter().map(|c| spare_pages(c, &lock(c))).sum()
    }

    fn trim(&self) -> u64 {
        let mut pages = 0;
        for class in self.classes.iter() {
            let used = std::mem::take(&mut lock(class).spare_used);
            if !used {
                pages += self.trim_spares(class);
            }
        }
        pages
    }

    fn serve_reserve(&self, stop: &AtomicBool) {
        self.provision_until(stop);
    }

    fn wake_reserve(&self) {
        if let Some(r) = &self.reserve {
            r.wake();
        }
    }

    fn reserve_stats(&self) -> ReserveStats {
        self.reserve
            .as_ref()
            .map(Reserve::stats)
            .unwrap_or_default()
    }

    fn memory_short(&self) -> bool {
        self.reserve.as_ref().is_some_and(Reserve::tight)
    }

    #[cfg(feature = "test-support")]
    fn debug_set_free_below(&self, bytes: u64) {
        if let Some(r) = &self.reserve {
            r.set_low(bytes);
        }
    }
}

#[cfg(test)]
mod tests;
