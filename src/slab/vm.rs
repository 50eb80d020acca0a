//! Virtual memory for zspages: per-class chunks of address space, each
//! carved into equal zspage ranges, and the calls that give pages back.
//!
//! A size class numbers its zspages 0, 1, 2, ...; zspage `id` lives at a
//! fixed address inside chunk `c`, and chunk `c` holds `CHUNK0 << c`
//! zspages. So the address of any zspage is two loads away (the chunk
//! base, then arithmetic), needs no lock, and a zspage is one contiguous
//! virtual range whatever its page count: an object that straddles pages is
//! still one slice. Chunks are mapped `MAP_NORESERVE` and stay mapped until
//! the allocator is dropped (the address space is bounded by the peak
//! number of zspages); a freed zspage gives its physical pages back to the
//! OS with `madvise(MADV_DONTNEED)` and its range is reused by the next
//! zspage of the class.
//!
//! A store in shared memory (`crate::shm`) maps each class's chunks from
//! the class's region of the store's memfd instead, zspage `id` at
//! `id * zspage_bytes` into the region (chunks tile the id space, so they
//! tile the region too), and gives pages back by punching them out of the
//! file: a recovering process maps the same chunks and finds every object
//! where its handle says.

use crate::page::PAGE_SIZE;
use crate::shm::{Pages, SharedMem, CLASS_SPAN};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;

/// The smallest chunk of a shared store mapped for 2 MB pages (where the
/// store's file gives them, `crate::tmpfs`): by then its class already
/// holds as many bytes of zspages, so the 2 MB page its newest zspage
/// brings, mostly empty at first, is at most half the class's memory more.
/// Smaller chunks, and so the first megabytes of every class, get 4 KB
/// pages: a class with a few zspages must not hold 2 MB.
pub const HUGE_CHUNK_BYTES: usize = 4 << 20;
/// Zspages in chunk 0; chunk `c` holds `CHUNK0 << c`.
pub const CHUNK0: u64 = 16;
/// Chunks per class: room for `CHUNK0 * (2^MAX_CHUNKS - 1)` zspages (and
/// one bit per chunk in [`ChunkDir`]'s `on_fault` mask).
pub const MAX_CHUNKS: usize = 32;

/// Where zspage `id` lives: its chunk and its position in the chunk.
#[inline]
pub fn chunk_of(id: u64) -> (usize, u64) {
    let j = id / CHUNK0 + 1;
    let c = 63 - j.leading_zeros() as usize;
    (c, id - CHUNK0 * ((1u64 << c) - 1))
}

/// Zspages in chunk `c`.
#[inline]
pub fn chunk_len(c: usize) -> u64 {
    CHUNK0 << c
}

/// The first zspage id of chunk `c`.
#[inline]
fn chunk_first(c: usize) -> u64 {
    CHUNK0 * ((1u64 << c) - 1)
}

/// A class's chunk directory: chunk base addresses, 0 while unmapped.
/// Written under the class lock, read without it.
pub struct ChunkDir {
    bases: [AtomicUsize; MAX_CHUNKS],
    /// Lock chunks in RAM on fault when mapping them (a slab that mlocks,
    /// in a process that may lock without limit: [`may_lock_unbounded`]).
    lock: bool,
    /// Bit `c`: chunk `c` is locked on fault, so populating a zspage of it
    /// also locks the zspage ([`Self::locked_on_fault`]).
    on_fault: AtomicU32,
    zspage_bytes: usize,
    /// Shared memory: the store's file and the offset of the class's region.
    shared: Option<(Arc<SharedMem>, u64)>,
}

impl ChunkDir {
    /// An empty directory for zspages of `zspage_bytes`, in private memory;
    /// `lock`: lock its chunks on fault.
    pub fn new(zspage_bytes: usize, lock: bool) -> Self {
        ChunkDir {
            bases: std::array::from_fn(|_| AtomicUsize::new(0)),
            lock,
            on_fault: AtomicU32::new(0),
            zspage_bytes,
            shared: None,
        }
    }

    /// An empty directory whose chunks are the region at `region` of `shm`.
    pub fn shared(zspage_bytes: usize, lock: bool, shm: Arc<SharedMem>, region: u64) -> Self {
        ChunkDir {
            bases: std::array::from_fn(|_| AtomicUsize::new(0)),
            lock,
            on_fault: AtomicU32::new(0),
            zspage_bytes,
            shared: Some((shm, region)),
        }
    }

    /// Whether zspage `id`'s chunk is locked on fault: backing the zspage
    /// (populating it) locks it too, with no `mlock` call of its own.
    pub fn locked_on_fault(&self, id: u64) -> bool {
        self.on_fault.load(Ordering::Relaxed) & (1 << chunk_of(id).0) != 0
    }

    /// Zspage ids the class's address space (its region, when shared) has
    /// room for.
    pub fn max_ids(&self) -> u64 {
        match self.shared {
            Some(_) => CLASS_SPAN / self.zspage_bytes as u64,
            None => chunk_first(MAX_CHUNKS),
        }
    }

    /// Maps chunk `c` of `len` bytes: anonymous memory, or its part of the
    /// class's region of the shared file.
    fn map_chunk(&self, c: usize, len: usize) -> Option<usize> {
        let Some((shm, region)) = &self.shared else {
            return map_anon(len);
        };
        let at = chunk_first(c).checked_mul(self.zspage_bytes as u64)?;
        if at.checked_add(len as u64)? > CLASS_SPAN {
            return None;
        }
        let pages = if len >= HUGE_CHUNK_BYTES {
            Pages::Huge
        } else {
            Pages::Small
        };
        shm.map(region + at, len, pages)
    }

    /// Gives the pages of `n` dead zspages from `first` back to the OS;
    /// `locked` says whether the slab locked them.
    pub fn release(&self, first: u64, n: u64, locked: bool) {
        let bytes = n as usize * self.zspage_bytes;
        match &self.shared {
            Some((shm, region)) => {
                shm.punch(region + first * self.zspage_bytes as u64, bytes as u64);
            }
            None => release_range(self.zspage_addr(first), bytes, locked),
        }
    }

    /// Shared memory only: gives back every page of the class's region from
    /// zspage `first` on, mapped or not (a recovery frees what no slot uses).
    pub fn release_from(&self, first: u64) {
        if let Some((shm, region)) = &self.shared {
            let at = first.saturating_mul(self.zspage_bytes as u64);
            if at < CLASS_SPAN {
                shm.punch(region + at, CLASS_SPAN - at);
            }
        }
    }

    /// The address of zspage `id`; 0 if its chunk is not mapped.
    #[inline]
    pub fn zspage_addr(&self, id: u64) -> usize {
        let (c, off) = chunk_of(id);
        match self.bases.get(c) {
            // Acquire pairs with the Release in `ensure`; in practice the
            // slot lock already orders this, but it costs nothing on x86.
            Some(b) => match b.load(Ordering::Acquire) {
                0 => 0,
                base => base + off as usize * self.zspage_bytes,
            },
            None => 0,
        }
    }

    /// Maps the chunk holding zspage `id` if needed (under the class lock).
    /// Returns false if the id is beyond the directory or mmap failed.
    pub fn ensure(&self, id: u64) -> bool {
        let (c, _) = chunk_of(id);
        let Some(slot) = self.bases.get(c) else {
            return false;
        };
        if slot.load(Ordering::Relaxed) != 0 {
            return true;
        }
        let Some(len) = (chunk_len(c) as usize).checked_mul(self.zspage_bytes) else {
            return false;
        };
        if crate::fail_point::fail("slab:chunk") {
            return false;
        }
        match self.map_chunk(c, len) {
            Some(p) => {
                if self.lock && lock_on_fault(p, len) {
                    self.on_fault.fetch_or(1 << c, Ordering::Relaxed);
                }
                slot.store(p, Ordering::Release);
                true
            }
            None => false,
        }
    }
}

impl Drop for ChunkDir {
    fn drop(&mut self) {
        for (c, b) in self.bases.iter().enumerate() {
            let base = b.load(Ordering::Relaxed);
            if base != 0 {
                // SAFETY: the chunk was mapped by `ensure` with this length
                // and nothing can reference it once the allocator is gone.
                unsafe {
                    libc::munmap(
                        base as *mut libc::c_void,
                        chunk_len(c) as usize * self.zspage_bytes,
                    );
                }
            }
        }
    }
}

/// Maps `len` bytes of anonymous, lazily backed memory.
fn map_anon(len: usize) -> Option<usize> {
    // SAFETY: a fresh anonymous mapping aliases nothing.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        log::error!(
            "slab: mmap of {len} bytes failed: {}",
            std::io::Error::last_os_error()
        );
        None
    } else {
        Some(p as usize)
    }
}

/// Locks a whole new chunk in RAM on fault (`mlock2(MLOCK_ONFAULT)`, swap
/// use: a swap device must never need to be swapped in itself), so that a
/// zspage is locked by backing it: one populate call per zspage (or run of
/// zspages) and no change to any mapping. Locking each zspage with `mlock`
/// instead costs the same one call but splits the chunk's mapping and
/// merges the locked part with its neighbour every time: 5.7 against 3.0
/// us a 4 KB zspage natively. Returns false if the OS refused (an
/// unprivileged process past `RLIMIT_MEMLOCK`, which counts the whole
/// chunk): its zspages are then locked one by one ([`lock_range`]).
fn lock_on_fault(addr: usize, len: usize) -> bool {
    // SAFETY: the range is a chunk this directory just mapped; locking
    // changes no contents.
    unsafe { libc::mlock2(addr as *const libc::c_void, len, libc::MLOCK_ONFAULT) == 0 }
}

/// Whether this process may lock any amount of memory (`RLIMIT_MEMLOCK`
/// unlimited, or `CAP_IPC_LOCK`, as the daemon has): locking a chunk on
/// fault counts its whole size against the limit, which a limited process
/// would spend on address space it never backs. Asked once per slab.
pub(super) fn may_lock_unbounded() -> bool {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes only the struct behind the valid pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } == 0
        && lim.rlim_cur == libc::RLIM_INFINITY
    {
        return true;
    }
    const CAP_IPC_LOCK: u32 = 14;
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|state| {
            let hex = state.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
            u64::from_str_radix(hex.trim(), 16).ok()
        })
        .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK) != 0)
}

/// Locks a new zspage's pages in RAM where its chunk is not locked on
/// fault; `mlock` also backs them. Returns false if the OS refused.
/// Released zspages keep their lock ([`release_range`]), so the mappings
/// split once per class chunk, not per zspage.
pub fn lock_range(addr: usize, len: usize) -> bool {
    // SAFETY: the range lies inside a chunk this allocator mapped.
    unsafe { libc::mlock(addr as *const libc::c_void, len) == 0 }
}

/// Backs a new zspage with physical pages in one call, as zsmalloc
/// allocates a zspage's pages when it creates it: one `madvise` instead of
/// a page fault per page on the first copy into each page: the pages are
/// in place before any object is copied in, and the whole zspage is
/// refused up front if the OS has no memory. Returns false if the OS
/// refused the memory; a kernel
/// older than 5.14 (no `MADV_POPULATE_WRITE`) counts as success, its pages
/// fault in on first use as private pages that cannot be backed now do.
pub fn populate_range(addr: usize, len: usize) -> bool {
    // SAFETY: the range lies inside memory this process mapped (a chunk of
    // the slab, or the pages of the slot table); populating writes nothing
    // visible (fresh pages read as zeros, present ones are left as they are).
    let r = unsafe { libc::madvise(addr as *mut libc::c_void, len, libc::MADV_POPULATE_WRITE) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL)
}

/// Backs a range by writing to each of its pages: one write fault per page,
/// taken under the VMA's lock rather than the process's `mmap_lock` (see
/// `FaultIn::Touch`). Each page's first byte is written back as it was
/// read. The caller owns the range: no other thread reads or writes it
/// meanwhile (the provisioner's new spares are in no list yet). Returns
/// true: a page the OS cannot give waits in the fault (or the OOM killer
/// acts) rather than failing, so a store whose backing must be able to
/// fail uses [`populate_range`].
pub fn touch_range(addr: usize, len: usize) -> bool {
    for off in (0..len).step_by(PAGE_SIZE) {
        let p = (addr + off) as *mut u8;
        // SAFETY: the range lies inside memory this process mapped
        // read-write (a chunk of the slab) and the caller owns it, so the
        // byte is valid and nobody races with the access. Volatile, so that
        // the write (which takes the write fault) is not folded away: an
        // atomic add of zero would be, into a load, which maps the shared
        // zero page and leaves the writer the fault.
        unsafe { std::ptr::write_volatile(p, std::ptr::read_volatile(p)) };
    }
    true
}

/// Gives a dead zspage's pages back to the OS. The range stays mapped and
/// reads as zeros until reused.
///
/// `MADV_DONTNEED` refuses locked ranges, whether this slab locked them
/// (`locked`) or the whole process did (`mlockall`, as the daemon does for
/// swap). `MADV_DONTNEED_LOCKED` (Linux 5.18) drops their pages and keeps
/// the range locked, so giving a zspage back and reusing it change no
/// mapping flags; only on older kernels is the range unlocked first.
pub fn release_range(addr: usize, len: usize, locked: bool) {
    let p = addr as *mut libc::c_void;
    // SAFETY: the range lies inside a chunk this allocator mapped and no
    // live object remains in it (the caller holds the class lock and the
    // zspages are empty).
    let advise = |advice| unsafe { libc::madvise(p, len, advice) == 0 };
    // Try first what most likely works: one failed call less.
    let (first, second) = if locked {
        (libc::MADV_DONTNEED_LOCKED, libc::MADV_DONTNEED)
    } else {
        (libc::MADV_DONTNEED, libc::MADV_DONTNEED_LOCKED)
    };
    if advise(first) || advise(second) {
        return;
    }
    // SAFETY: as above.
    unsafe { libc::munlock(p, len) };
    if !advise(libc::MADV_DONTNEED) {
        log::warn!(
            "slab: cannot give {len} bytes back to the OS: {}",
            std::io::Error::last_os_error()
        );
    }
    // The range of a chunk locked on fault must stay so: a zspage made
    // there later is only populated. Locking on fault backs nothing.
    if locked {
        lock_on_fault(addr, len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_tile_the_id_space() {
        let mut expect = (0usize, 0u64);
        for id in 0..100_000u64 {
            let (c, off) = chunk_of(id);
            assert_eq!((c, off), expect, "id {id}");
            expect.1 += 1;
            if expect.1 == chunk_len(expect.0) {
                expect = (expect.0 + 1, 0);
            }
        }
    }

    #[test]
    fn zspages_are_contiguous_and_distinct() {
        let d = ChunkDir::new(3 * 4096, false);
        assert_eq!(d.zspage_addr(5), 0);
        for id in 0..40 {
            assert!(d.ensure(id));
        }
        for id in 0..40u64 {
            let a = d.zspage_addr(id);
            assert_ne!(a, 0);
            // Touch the whole zspage: it must be mapped and writable.
            // SAFETY: `ensure` mapped this zspage's range read-write, and
            // nothing else in this test refers to it.
            let s = unsafe { std::slice::from_raw_parts_mut(a as *mut u8, 3 * 4096) };
            s.fill(id as u8);
        }
        for id in 0..40u64 {
            let a = d.zspage_addr(id);
            // SAFETY: as above, read only.
            let s = unsafe { std::slice::from_raw_parts(a as *const u8, 3 * 4096) };
            assert!(s.iter().all(|&b| b == id as u8), "id {id}");
        }
        let a = d.zspage_addr(7);
        release_range(a, 3 * 4096, false);
        // SAFETY: released pages stay mapped (they read as zeros).
        let s = unsafe { std::slice::from_raw_parts(a as *const u8, 3 * 4096) };
        assert!(s.iter().all(|&b| b == 0), "released pages read as zeros");
        // Pages locked behind the slab's back (mlockall in the daemon) are
        // given back too, if this process may lock a page at all.
        let b = d.zspage_addr(8);
        if lock_range(b, 4096) {
            release_range(b, 3 * 4096, false);
            // SAFETY: as above.
            let s = unsafe { std::slice::from_raw_parts(b as *const u8, 3 * 4096) };
            assert!(s.iter().all(|&b| b == 0), "locked pages released");
        }
    }
}
