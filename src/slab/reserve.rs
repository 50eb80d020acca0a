//! The slab's memory reserve: empty zspages backed ahead of need by a
//! provisioner thread, so that a queue thread never faults in fresh memory.
//!
//! # Why
//!
//! A swap device's queue threads are what turns the kernel's dirty
//! anonymous pages into free memory: reclaim frees a page once its swap
//! write completed. A queue thread that faults in a fresh page (a new
//! zspage, or a heap block for its owner table) while the machine is out of
//! memory enters direct reclaim itself, and reclaim waits on swap writes,
//! the very writes that thread would complete: with every queue thread
//! there, nothing completes and the machine wedges. Kernel zram does not
//! meet this because
//! zsmalloc allocates in the reclaiming context, which may dip into the
//! page allocator's reserves; a process cannot.
//!
//! # How
//!
//! In reserve mode ([`super::SlabConfig::reserve`]), while free memory is
//! below the reserve's threshold (`Reserve::tight`):
//! - a new zspage comes only from the class's spares (empty zspages still
//!   charged, backed and locked, with an owner table kept for them); a
//!   class with no free object and no spare refuses with
//!   `Refused::ReserveEmpty`; a class whose spares fell below what it
//!   wants asks the provisioner for more (one wake until it starts its
//!   pass, which visits the classes that asked);
//! - a refused object goes to the next larger classes that have room (an
//!   object may live in any class at least its size, within
//!   [`FALLBACK_SLACK`]), else waits for the provisioner up to
//!   [`MISS_WAITS`] times [`MISS_WAIT`], else the allocation fails: the
//!   request gets ENOSPC and the kernel keeps the page, as when zram's
//!   `zs_malloc` fails;
//! - the provisioner ([`SlabAllocator::provision_until`], on its own thread)
//!   keeps [`SlabAllocator::reserve_want`] spares in every class in use, and
//!   room in the class's bookkeeping vectors, faulting all of it in itself:
//!   it may block in reclaim, the queue threads meanwhile run on the
//!   reserve, and their completed writes are what lets reclaim free memory.
//!   It faults its spares in page by page (`FaultIn::Touch`), not with one
//!   `MADV_POPULATE_WRITE`: that call holds `mmap_lock` through its
//!   reclaim, and a queue thread growing its malloc arena (`mprotect`)
//!   waited behind it with every swap write held (6.12, whole machine).
//!
//! With memory to spare, an allocating thread leaves the reserve's share
//! of the spares alone and faults in new zspages itself, as without a
//! reserve: it takes only spares beyond that share (zspages kept when they
//! died), so the provisioner has nothing to refill until memory runs
//! short, and costs no CPU meanwhile.
//!
//! The reserve is charged like any zspage (`mem_used_total`, `mem_spare`),
//! so a `mem_limit` counts it.

use super::{lock, ClassState, FaultIn, SizeClass, SlabAllocator, STACK_ENTRIES};
use crate::alloc::{AllocError, Handle, ObjAllocator, ReserveStats};
use std::sync::atomic::{
    AtomicBool, AtomicU64,
    Ordering::{Relaxed, SeqCst},
};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long an allocation the reserve could not serve waits for the
/// provisioner each time.
const MISS_WAIT: Duration = Duration::from_millis(10);
/// Waits before the allocation fails.
const MISS_WAITS: u32 = 5;
/// How long an allocation trusts its last look at free memory.
const FREE_CHECK: Duration = Duration::from_millis(5);
/// How often the provisioner looks at every class when nobody wakes it.
const PERIOD: Duration = Duration::from_millis(100);
/// A refused object may go to a class at most twice its size plus this.
const FALLBACK_SLACK: u32 = 256;
/// Room kept in each bookkeeping vector: this, plus an eighth of its length.
const HEADROOM: usize = 32;
/// Items a hold of [`SlabAllocator::lock_with_room`] may push onto one
/// vector: a freed object adds at most one to a fullness group and one
/// retired zspage to `dead`, `spare` and `free_ids` each, plus spares
/// trimmed, so holds of this many frees stay within [`HEADROOM`].
pub(super) const HOLD_PUSHES: usize = HEADROOM / 2;
/// Owner tables a class keeps for its next zspages when zspages die (the
/// provisioner tops them up to what [`SlabAllocator::reserve_want`] asks).
pub(super) const BOXES_KEPT: usize = 6;
/// Bytes of objects every class in use keeps room for in spares: sixteen
/// raw pages (a huge page's class holds one object per zspage)...
const RESERVE_BYTES: u32 = 64 << 10;
/// ...but room for at least one object and at most sixteen.
const RESERVE_OBJECTS: u32 = 16;
/// Spares the provisioner makes per class-lock hold (at most half the
/// room [`HEADROOM`] keeps in the vectors they go to).
const SPARES_AT_ONCE: usize = HEADROOM / 2;
/// Missed objects a class remembers (what the provisioner adds room for).
pub(super) const MISSED_MAX: u32 = 256;
/// An experiment's switch: `ZBLK_RESERVE_SCALE=N` (1 to 64, default 1)
/// multiplies what every class keeps in spares ([`RESERVE_BYTES`],
/// [`RESERVE_OBJECTS`] and the extra zspages for busy classes), for an A/B
/// of the reserve's size against the allocations that wait for it.
const SCALE_ENV: &str = "ZBLK_RESERVE_SCALE";
/// An experiment's switch: `ZBLK_RESERVE_EAGER=1` makes allocations take
/// the reserve's spares (and owner tables) first even with memory to
/// spare, as when it is short, for an A/B of what leaving them alone saves
/// (`native_zram`, the VM's `breakdown` scenario with
/// `zblk:lz4@ZBLK_RESERVE_EAGER=1`).
const EAGER_ENV: &str = "ZBLK_RESERVE_EAGER";
/// An experiment's switch: see [`default_free_below`].
const FREE_BELOW_ENV: &str = "ZBLK_RESERVE_FREE_BELOW_MB";

/// The reserve's signals and counters.
#[derive(Debug)]
pub(super) struct Reserve {
    /// Free memory (bytes) below which allocations take zspages only from
    /// the reserve (set once, but for tests' `debug_set_free_below`).
    low: AtomicU64,
    /// When free memory was last looked at (ns since `epoch`), and whether
    /// it was below `low` then.
    checked_ns: AtomicU64,
    tight: AtomicBool,
    epoch: Instant,
    /// Provisioning passes finished, and whether someone asked for one.
    state: Mutex<(u64, bool)>,
    /// Set by the first [`Reserve::wake`] since the provisioner last took
    /// a request, cleared when it takes one: the wakes in between know a
    /// pass is coming and skip the lock and the futex call (an allocation
    /// that took a spare asks for one, and a wake that makes a system call
    /// and switches to the provisioner cost more than the spare saved).
    asked: AtomicBool,
    /// The classes whose spares fell low since the provisioner last
    /// looked, one bit each (class indices fit in a byte): a pass a wake
    /// started visits those alone, not every class under its lock.
    needy: [AtomicU64; 4],
    /// The provisioner sleeps here.
    wake: Condvar,
    /// Allocations waiting for a pass sleep here.
    filled: Condvar,
    /// The provisioner could not charge a zspage: the memory limit is what
    /// empties the reserve.
    limited: AtomicBool,
    misses: AtomicU64,
    fallbacks: AtomicU64,
    refusals: AtomicU64,
    /// [`SCALE_ENV`]'s factor.
    scale: u32,
    /// [`EAGER_ENV`] is set.
    eager: bool,
}

impl Reserve {
    /// A reserve that applies below `free_below` bytes of free memory (0:
    /// [`default_free_below`]).
    pub(super) fn new(free_below: u64) -> Reserve {
        let low = match free_below {
            0 => default_free_below(),
            b => b,
        };
        Reserve {
            low: AtomicU64::new(low),
            checked_ns: AtomicU64::new(u64::MAX),
            tight: AtomicBool::new(true),
            epoch: Instant::now(),
            state: Mutex::default(),
            asked: AtomicBool::new(false),
            needy: Default::default(),
            wake: Condvar::new(),
            filled: Condvar::new(),
            limited: AtomicBool::new(false),
            misses: AtomicU64::new(0),
            fallbacks: AtomicU64::new(0),
            refusals: AtomicU64::new(0),
            scale: std::env::var(SCALE_ENV)
                .ok()
                .and_then(|v| v.parse::<u32>().ok())
                .map_or(1, |n| n.clamp(1, 64)),
            eager: std::env::var(EAGER_ENV).is_ok_and(|v| v == "1"),
        }
    }

    /// Tests: moves the threshold to `bytes` from the next look at free
    /// memory on.
    #[cfg(feature = "test-support")]
    pub(super) fn set_low(&self, bytes: u64) {
        self.low.store(bytes, Relaxed);
        self.checked_ns.store(u64::MAX, Relaxed);
    }

    /// Whether free memory is below the reserve's threshold, so that an
    /// allocating thread must not fault in a new zspage: looked up at most
    /// every [`FREE_CHECK`] (one `sysinfo` call), and always true at
    /// `u64::MAX`.
    pub(super) fn tight(&self) -> bool {
        let low = self.low.load(Relaxed);
        if low == u64::MAX {
            return true;
        }
        let now = self.epoch.elapsed().as_nanos() as u64;
        let last = self.checked_ns.load(Relaxed);
        if last != u64::MAX && now.saturating_sub(last) < FREE_CHECK.as_nanos() as u64 {
            return self.tight.load(Relaxed);
        }
        let tight = ram().1 < low;
        self.tight.store(tight, Relaxed);
        self.checked_ns.store(now, Relaxed);
        tight
    }

    /// Marks class `index` as short of spares and asks for a pass.
    pub(super) fn wake_for(&self, index: usize) {
        // SeqCst here, in `wake`, `take_needy` and `sleep`: the mark must be
        // seen by the pass that a skipped wake counts on (no store may pass
        // the later load of `asked`, nor the provisioner's clearing of
        // `asked` its later look at the marks).
        let (word, bit) = ClassSet::place(index);
        self.needy[word].fetch_or(bit, SeqCst);
        self.wake();
    }

    /// Takes the classes marked since the last look; all zero (a timed
    /// pass) or all set (one an allocation waits for) asks for a pass over
    /// every class.
    fn take_needy(&self) -> ClassSet {
        ClassSet(std::array::from_fn(|i| self.needy[i].swap(0, SeqCst)))
    }

    /// Whether allocations take spares first even with memory to spare
    /// ([`EAGER_ENV`]).
    pub(super) fn eager(&self) -> bool {
        self.eager
    }

    /// Asks the provisioner for a pass now, unless it was asked already
    /// and has not started that pass.
    pub(super) fn wake(&self) {
        if self.asked.swap(true, SeqCst) {
            return;
        }
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.1 = true;
        self.wake.notify_one();
    }

    /// Wakes the provisioner and waits (at most `timeout`) until it finished
    /// a pass that started after this call.
    fn wait_pass(&self, timeout: Duration) {
        // A pass over every class: the allocation may wait for one that
        // asked nothing of the provisioner so far.
        for word in &self.needy {
            word.store(u64::MAX, SeqCst);
        }
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        // The pass running now may have looked at our class already.
        let want = s.0 + 2;
        s.1 = true;
        self.wake.notify_one();
        let _ = self
            .filled
            .wait_timeout_while(s, timeout, |s| s.0 < want)
            .unwrap_or_else(|e| e.into_inner());
    }

    /// Sleeps until woken or `PERIOD` passed.
    fn sleep(&self) {
        let s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (mut s, _) = self
            .wake
            .wait_timeout_while(s, PERIOD, |s| !s.1)
            .unwrap_or_else(|e| e.into_inner());
        // Under the lock, with the request taken: a wake from now on asks
        // for the next pass.
        s.1 = false;
        self.asked.store(false, SeqCst);
    }

    /// Counts a finished pass and wakes who waits for one.
    fn passed(&self) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.0 += 1;
        self.filled.notify_all();
    }

    /// The counters, for `stat`.
    pub(super) fn stats(&self) -> ReserveStats {
        ReserveStats {
            misses: self.misses.load(Relaxed),
            fallbacks: self.fallbacks.load(Relaxed),
            refusals: self.refusals.load(Relaxed),
        }
    }
}

/// Indices of the objects of one bulk allocation its classes' reserves
/// could not serve: on the stack for a whole group, else on the heap.
#[derive(Debug)]
pub(super) struct Missed {
    stack: [u32; STACK_ENTRIES],
    len: usize,
    heap: Vec<u32>,
}

impl Default for Missed {
    fn default() -> Self {
        Missed {
            stack: [0; STACK_ENTRIES],
            len: 0,
            heap: Vec::new(),
        }
    }
}

impl Missed {
    /// Adds object index `i`.
    pub(super) fn push(&mut self, i: u32) {
        if self.len < STACK_ENTRIES {
            self.stack[self.len] = i;
        } else {
            self.heap.push(i);
        }
        self.len += 1;
    }

    /// Whether no index was added.
    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn extend(&mut self, from: &Missed) {
        from.iter().for_each(|i| self.push(i));
    }

    fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.stack[..self.len.min(STACK_ENTRIES)]
            .iter()
            .chain(self.heap.iter())
            .copied()
    }
}

/// Whether an object of `size` bytes may live in a class of objects of
/// `class_size` bytes: the reserve's fallback places it up to twice its
/// size plus [`FALLBACK_SLACK`] (and a recovery accepts it there).
pub(super) fn fallback_fits(class_size: u32, size: u32) -> bool {
    class_size >= size && class_size <= size.saturating_mul(2).saturating_add(FALLBACK_SLACK)
}

/// Total RAM in bytes (0 if `sysinfo` fails).
pub(crate) fn total_ram() -> u64 {
    ram().0
}

/// The free memory below which writing threads take zspages only from the
/// reserve, when the store's configuration leaves it to the reserve: 1/16
/// of RAM, at least 64 MB, and at least twice the zones' high watermarks.
///
/// Above it a writing thread backs a new zspage itself, and that fault
/// must be served from free pages: a queue thread is an I/O flusher, so a
/// fault of its that enters direct reclaim can swap nothing out and is
/// never answered by the OOM killer; it loops in reclaim while kswapd
/// waits on the writes that thread holds, and the machine stops. Free
/// memory as `sysinfo` counts it includes what the kernel keeps for
/// itself: the min watermark and the low zones' protection (the DMA
/// zone's pages are not given to a movable allocation). Where
/// `min_free_kbytes` is large for the machine (transparent huge pages
/// raise it: 45 MB in a 1 GB guest, whose high watermarks then sum to
/// 66 MB), 64 MB of free memory is already below the high watermark, and
/// a fault there may reclaim. Twice the high watermarks keeps the
/// writing threads on the reserve whenever kswapd is awake, and leaves
/// them a margin of the high watermark itself above the min one for the
/// faults of the at most [`FREE_CHECK`] between two looks at free memory.
/// The watermarks are read once, when the reserve is made.
/// `ZBLK_RESERVE_FREE_BELOW_MB=N`, an experiment's switch, sets it to N MB
/// instead (the VM `stall` scenario's A/B of the watermarks' part).
fn default_free_below() -> u64 {
    if let Some(mb) = std::env::var(FREE_BELOW_ENV)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        return mb << 20;
    }
    let zoneinfo = std::fs::read_to_string("/proc/zoneinfo").unwrap_or_default();
    let high = high_watermarks(&zoneinfo) * crate::page::PAGE_SIZE_U64;
    (ram().0 / 16).max(64 << 20).max(2 * high)
}

/// The sum of every zone's high watermark, in pages, in the text of
/// /proc/zoneinfo (a zone's `high` line; the per-CPU lists' `high:`
/// lines are something else).
fn high_watermarks(zoneinfo: &str) -> u64 {
    zoneinfo
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            match (w.next(), w.next(), w.next()) {
                (Some("high"), Some(n), None) => n.parse::<u64>().ok(),
                _ => None,
            }
        })
        .sum()
}

/// Total and free RAM in bytes (`sysinfo`); (0, 0) if it fails, which
/// counts as tight.
fn ram() -> (u64, u64) {
    // SAFETY: sysinfo is a plain C struct, for which all-zero bytes are a
    // valid value.
    let mut si: libc::sysinfo = unsafe { std::mem::zeroed() };
    // SAFETY: the call only writes the struct behind the valid `&mut si`.
    if unsafe { libc::sysinfo(&mut si) } != 0 {
        return (0, 0);
    }
    let unit = u64::from(si.mem_unit.max(1));
    (si.totalram as u64 * unit, si.freeram as u64 * unit)
}

/// A vector with room for `cap` items whose memory is already faulted in.
fn prefaulted<T>(cap: usize) -> Vec<T> {
    let mut v: Vec<T> = Vec::with_capacity(cap);
    let bytes = v.capacity() * std::mem::size_of::<T>();
    // SAFETY: `v` owns `bytes` of allocated memory, and nobody else sees
    // it yet; bytes are written only to fault its pages in. No `T` is
    // formed (the length stays 0), so any bit pattern is fine.
    unsafe { crate::page::touch_raw(v.as_mut_ptr().cast::<u8>(), bytes, 0) };
    v
}

/// Pushes `x` onto `v`; a full `v` first moves to a buffer of twice its
/// length (at least [`HEADROOM`]) whose every page is faulted in now.
///
/// Every push onto a class's vectors goes through here, never through
/// `Vec`'s own growth, which leaves the new capacity untouched: queue
/// threads push onto these vectors while memory is short (a zspage
/// changing fullness group, a spare taken), and the provisioner, which
/// keeps room in them, counts capacity as room whether or not its pages
/// were ever touched. A push onto a page never touched is a fault in
/// reclaim by an I/O flusher, the machine's stall (seen in the guest:
/// `ClassState::link` after a queue thread had grown a group's vector
/// while memory was plentiful).
pub(super) fn push_touched<T>(v: &mut Vec<T>, x: T) {
    if v.len() == v.capacity() {
        grow_touched(v, 1);
    }
    v.push(x);
}

/// Moves every item of `from` onto the end of `to`, growing `to` as
/// [`push_touched`] does when it lacks the room.
pub(super) fn append_touched<T>(to: &mut Vec<T>, from: &mut Vec<T>) {
    if to.capacity() - to.len() < from.len() {
        grow_touched(to, from.len());
    }
    to.append(from);
}

/// Moves `v` to a buffer faulted in now with room for `more` items beyond
/// its length and at least twice that length (at least [`HEADROOM`]):
/// the growth every holder of a class lock avoids
/// ([`SlabAllocator::lock_with_room`]), counted in tests.
fn grow_touched<T>(v: &mut Vec<T>, more: usize) {
    #[cfg(test)]
    GROWN_UNDER_LOCK.with(|n| n.set(n.get() + 1));
    let mut bigger = prefaulted::<T>((2 * v.len()).max(v.len() + more).max(HEADROOM));
    bigger.append(v);
    *v = bigger;
}

#[cfg(test)]
thread_local! {
    /// Tests: how often this thread grew a class's vector under its lock.
    pub(super) static GROWN_UNDER_LOCK: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Whether `v` lacks the room the provisioner keeps in it.
fn short<T>(v: &Vec<T>) -> Option<usize> {
    let head = HEADROOM + v.len() / 8;
    (v.capacity() - v.len() < head).then_some(v.len() + 2 * head)
}

impl SlabAllocator {
    /// Spares the reserve keeps in a class: none for a class that holds
    /// nothing and was not asked for; else room for [`RESERVE_BYTES`] of
    /// objects (1 to [`RESERVE_OBJECTS`] of them), or for the objects asked
    /// for and not served since the last fill if more, plus one zspage per
    /// 64 live ones, up to three (each times [`SCALE_ENV`]'s factor).
    pub(super) fn reserve_want(&self, class: &SizeClass, state: &ClassState) -> usize {
        let Some(r) = &self.reserve else {
            return 0;
        };
        if state.live_zspages == 0 && state.missed == 0 {
            return 0;
        }
        let per = class.spec.objs.max(1);
        let objs =
            (r.scale * RESERVE_BYTES / class.spec.size.max(1)).clamp(1, r.scale * RESERVE_OBJECTS);
        let base = objs.max(state.missed).div_ceil(per) as usize;
        base + (state.live_zspages / 64).min(3 * u64::from(r.scale)) as usize
    }

    /// Places the objects `missed` of a bulk allocation whose classes had
    /// no room: in larger classes, else after waiting for the provisioner.
    /// Fills their entries of `dst`; on error some may be filled (the
    /// caller rolls back every non-zero entry).
    pub(super) fn place_missed(
        &self,
        missed: &Missed,
        sizes: &[u32],
        owners: &[u64],
        dst: &mut [Handle],
    ) -> Result<(), AllocError> {
        let Some(r) = &self.reserve else {
            return Err(AllocError { limit: 0 });
        };
        r.misses.fetch_add(missed.len as u64, Relaxed);
        r.wake();
        let mut left = Missed::default();
        left.extend(missed);
        for wait in 0..=MISS_WAITS {
            if wait > 0 {
                r.wait_pass(MISS_WAIT);
            }
            let mut still = Missed::default();
            for i in left.iter() {
                match self.alloc_from_classes(sizes[i as usize], owners[i as usize], wait > 0) {
                    Some(h) => dst[i as usize] = h,
                    None => still.push(i),
                }
            }
            if still.is_empty() {
                return Ok(());
            }
            left = still;
        }
        r.refusals.fetch_add(left.len as u64, Relaxed);
        let limit = self.mem.limit();
        let limited = limit != 0 && r.limited.load(Relaxed);
        Err(AllocError {
            limit: if limited { limit } else { 0 },
        })
    }

    /// Allocates an object of `size` bytes in the first class from its own
    /// (`own`) or the next one up that has a free object or a spare, within
    /// the fallback slack.
    fn alloc_from_classes(&self, size: u32, owner: u64, own: bool) -> Option<Handle> {
        let first = self.table.class_of(size as usize)?;
        let start = if own { first } else { first + 1 };
        for class in self.classes.get(start..)? {
            if !fallback_fits(class.spec.size, size) {
                break;
            }
            let mut state = lock(class);
            let Ok(h) = self.alloc_obj(class, &mut state, owner) else {
                continue;
            };
            // Free memory may have come back meanwhile, and with it a zspage
            // made here rather than taken from spares: backed as alloc_bulk
            // backs its own.
            if !self.back_fresh(class, state) {
                self.free_bulk(&[h]);
                return None;
            }
            if class.index != first {
                if let Some(r) = &self.reserve {
                    r.fallbacks.fetch_add(1, Relaxed);
                }
            }
            return Some(h);
        }
        None
    }

    /// The provisioner: passes over every class until `stop`, sleeping
    /// between passes unless woken. Returns at once without a reserve.
    pub(super) fn provision_until(&self, stop: &AtomicBool) {
        let Some(r) = &self.reserve else {
            return;
        };
        // Classes that did something in the last pass: looked at again
        // before sleeping, without a pass over every class's lock.
        let mut again = ClassSet::default();
        while !stop.load(Relaxed) {
            let needy = r.take_needy().union(again);
            again = ClassSet::default();
            for class in self.classes.iter() {
                let asked = needy.is_empty() || needy.contains(class.index);
                if asked && self.provision(class) {
                    again.insert(class.index);
                }
            }
            r.passed();
            if again.is_empty() {
                r.sleep();
            }
        }
        // Nobody waits for a pass that will not come.
        r.passed();
    }

    /// Tops class `class` up to the spares it wants, with an owner table
    /// for each and room in its vectors. Returns whether it did anything.
    pub(super) fn provision(&self, class: &SizeClass) -> bool {
        // One lock hold tells whether the class lacks anything: a pass
        // that took a dozen locks of every class found the queue threads
        // holding them (perf of `engine_ratios --reserve-cost`: lock
        // contention and `grow` checks were the thread's user time).
        // The same hold says whether any vector needs room (each `grow`
        // takes the lock again, a dozen times per class) and how many
        // spares the class lacks: at most that many are made now, so that
        // a class whose spares are taken as fast as they are made does not
        // keep the others waiting.
        let (needs_room, mut budget) = {
            let mut state = lock(class);
            if !self.lacks_anything(class, &state) {
                // Served, as below: what was asked for is in spares.
                state.missed = 0;
                return false;
            }
            let want = self.reserve_want(class, &state);
            (lacks_room(&state), want.saturating_sub(state.spare.len()))
        };
        let mut did = needs_room && self.make_room(class);
        // Allocated here, off the class lock.
        let mut ids: Vec<u64> = Vec::with_capacity(SPARES_AT_ONCE);
        loop {
            let mut state = lock(class);
            let want = self.reserve_want(class, &state);
            if state.boxes.len() < want + 1 && state.boxes.len() < state.boxes.capacity() {
                drop(state);
                let mut b = vec![0u64; class.spec.objs as usize].into_boxed_slice();
                // A zeroed allocation may leave fresh pages untouched, and
                // the queue thread that takes this table writes it.
                // SAFETY: `b` is ours and this many bytes long.
                unsafe { crate::page::touch_raw(b.as_mut_ptr().cast::<u8>(), b.len() * 8, 0) };
                let state = &mut lock(class);
                if state.boxes.len() >= state.boxes.capacity() {
                    return true;
                }
                push_touched(&mut state.boxes, b);
                did = true;
                continue;
            }
            if state.spare.len() >= want {
                // Served: what was asked for is in spares now.
                state.missed = 0;
                return did;
            }
            // At most SPARES_AT_ONCE: the pushes under the lock stay within
            // the room make_room keeps (HEADROOM).
            let n = budget.min(want - state.spare.len()).min(SPARES_AT_ONCE);
            if n == 0 {
                return did;
            }
            let added = self.add_spares(class, state, n, &mut ids);
            if added == 0 {
                return did;
            }
            budget -= added;
            did = true;
        }
    }

    /// Whether `class` (its locked `state`) lacks spares, owner-table boxes or
    /// room in a bookkeeping vector ([`lacks_room`]): what
    /// [`Self::provision`] would add.
    fn lacks_anything(&self, class: &SizeClass, state: &ClassState) -> bool {
        let want = self.reserve_want(class, state);
        state.spare.len() < want
            || (state.boxes.len() < want + 1 && state.boxes.len() < state.boxes.capacity())
            || lacks_room(state)
    }

    /// Makes up to `n` spare zspages in `class`: ids and charges under the
    /// lock `state`, their pages backed after letting go of it, neighbours in
    /// one call. Returns how many it made: fewer when it could not (limit,
    /// address space, memory).
    /// `ids` is scratch room for `n` ids, allocated by the caller before it
    /// took the lock.
    fn add_spares(
        &self,
        class: &SizeClass,
        mut state: std::sync::MutexGuard<'_, ClassState>,
        n: usize,
        ids: &mut Vec<u64>,
    ) -> usize {
        ids.clear();
        for _ in 0..n {
            if !self.charge_spare(class) {
                break;
            }
            let Some(id) = Self::take_id(class, &mut state) else {
                self.uncharge(class.cost);
                break;
            };
            ids.push(id);
        }
        drop(state);
        crate::fail_point::provisioner_stall_point();
        ids.sort_unstable();
        // Nobody else knows these ids meanwhile: they are in no list.
        let mut failed = Vec::new();
        super::for_id_runs(ids, |first, k| {
            if !self.back_run_by(class, first, k, FaultIn::Touch) {
                failed.extend(first..first + k as u64);
            }
        });
        let mut state = lock(class);
        for &id in ids.iter() {
            if failed.binary_search(&id).is_err() {
                push_touched(&mut state.spare, id);
            }
        }
        if !failed.is_empty() {
            self.release_runs(class, &failed);
            self.uncharge(class.cost * failed.len() as u64);
            for &id in &failed {
                push_touched(&mut state.free_ids, id);
            }
        }
        ids.len() - failed.len()
    }

    /// Charges one spare zspage of `class`; a refusal tells allocations
    /// that the memory limit is what empties the reserve.
    fn charge_spare(&self, class: &SizeClass) -> bool {
        let charged = self.charge(class.cost).is_ok();
        if let Some(r) = &self.reserve {
            r.limited.store(!charged, Relaxed);
        }
        charged
    }

    /// Locks `class` for a hold that pushes at most [`HOLD_PUSHES`] items
    /// onto its bookkeeping vectors (frees, a compaction step's moves),
    /// having given them the room the provisioner keeps first, off the
    /// lock, when they lack it.
    ///
    /// Those pushes never allocate under the lock then. An allocation
    /// there (`push_touched` growing a vector, malloc growing the thread's
    /// arena) is a fault that can enter direct reclaim while queue threads
    /// wait for this very lock to complete the swap writes reclaim waits
    /// for: the machine's stall (seen in the guest: the free drain in
    /// `sysmalloc`, in direct reclaim, holding a class lock a queue thread
    /// and the provisioner waited on, kswapd and the workload throttled
    /// on the device's writes). Without a reserve (a private store) the
    /// class is simply locked.
    pub(super) fn lock_with_room<'a>(&self, class: &'a SizeClass) -> MutexGuard<'a, ClassState> {
        let state = lock(class);
        if self.reserve.is_none() || !lacks_room(&state) {
            return state;
        }
        drop(state);
        self.make_room(class);
        lock(class)
    }

    /// Gives every bookkeeping vector of `class` the room the provisioner
    /// keeps, allocated and faulted in off the lock. Returns whether any
    /// grew.
    fn make_room(&self, class: &SizeClass) -> bool {
        let mut grew = grow(class, |state| &mut state.zs);
        grew |= grow(class, |state| &mut state.free_ids);
        grew |= grow(class, |state| &mut state.dead);
        grew |= grow(class, |state| &mut state.spare);
        grew |= grow(class, |state| &mut state.boxes);
        for g in 0..super::NGROUPS {
            grew |= grow(class, |state| &mut state.groups[g]);
        }
        grew
    }
}

/// A set of size classes, one bit each (class indices fit in a byte).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct ClassSet([u64; 4]);

impl ClassSet {
    /// The word and bit of class `index`.
    fn place(index: usize) -> (usize, u64) {
        (index / 64 % 4, 1 << (index % 64))
    }

    fn insert(&mut self, index: usize) {
        let (word, bit) = Self::place(index);
        self.0[word] |= bit;
    }

    fn contains(&self, index: usize) -> bool {
        let (word, bit) = Self::place(index);
        self.0[word] & bit != 0
    }

    fn is_empty(&self) -> bool {
        self.0 == [0; 4]
    }

    fn union(self, other: ClassSet) -> ClassSet {
        ClassSet(std::array::from_fn(|i| self.0[i] | other.0[i]))
    }
}

/// Whether a bookkeeping vector of the class (its `state`) lacks the room
/// the provisioner keeps ([`SlabAllocator::make_room`] grows them: a vector
/// added there must be added here).
fn lacks_room(state: &ClassState) -> bool {
    short(&state.zs).is_some()
        || short(&state.free_ids).is_some()
        || short(&state.dead).is_some()
        || short(&state.spare).is_some()
        || short(&state.boxes).is_some()
        || state.groups.iter().any(|g| short(g).is_some())
}

/// Gives the vector `pick` chooses in `class`'s state room to grow without
/// allocating: a larger one is allocated and faulted in off the lock, and
/// the items moved into it under the lock. Returns whether it grew.
fn grow<T>(class: &SizeClass, pick: impl Fn(&mut ClassState) -> &mut Vec<T>) -> bool {
    let Some(cap) = short(pick(&mut lock(class))) else {
        return false;
    };
    let mut bigger = prefaulted::<T>(cap);
    let mut state = lock(class);
    let v = pick(&mut state);
    if short(v).is_none() || bigger.capacity() < v.len() + HEADROOM {
        return false;
    }
    bigger.append(v);
    std::mem::swap(v, &mut bigger);
    drop(state);
    // `bigger` now holds the old, empty buffer: freed off the lock.
    true
}

#[cfg(test)]
mod tests {
    use super::high_watermarks;

    fn thread_faults() -> u64 {
        // SAFETY: getrusage fills the zeroed plain C struct it is given.
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: as above; RUSAGE_THREAD asks about the calling thread.
        assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) }, 0);
        u.ru_minflt as u64
    }

    #[test]
    fn a_prefaulted_vector_fills_without_a_fault() {
        // 8 MB: past malloc's mmap threshold, so fresh pages from the OS,
        // which a zeroing allocation would leave untouched.
        let mut v = super::prefaulted::<u64>(1 << 20);
        let before = thread_faults();
        v.extend(0..(1u64 << 20));
        let faults = thread_faults() - before;
        assert!(faults < 4, "{faults} faults filling a prefaulted vector");
    }

    #[test]
    fn high_watermarks_sum_the_zones_lines_not_the_per_cpu_ones() {
        let zoneinfo = "Node 0, zone      DMA
  per-node stats
pages free     3840
        boost    0
        min      22
        low      27
        high     32
        spanned  4095
  pagesets
    cpu: 0
              count: 0
              high:  0
              batch: 1
Node 0, zone    DMA32
pages free     13000
        boost    0
        min      11241
        low      14051
        high     16861
    cpu: 1
              high:  378
";
        assert_eq!(high_watermarks(zoneinfo), 32 + 16861);
        assert_eq!(high_watermarks(""), 0);
    }
}
