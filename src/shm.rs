//! Memory that outlives the process: one file per store.
//!
//! A store built with shared memory keeps everything a page needs in one
//! file with no name, mapped `MAP_SHARED`: a file on a tmpfs of the store's
//! own that gives the slab's larger chunks 2 MB pages (`crate::tmpfs`), or
//! a memfd (`memfd_create`) where that cannot be had. The file, held by
//! whoever keeps the descriptor (a keeper process, systemd's fd store),
//! still holds every stored page after the daemon died, and a new daemon
//! maps it again and recovers the store (`crate::recover`). The file is
//! sparse: only pages that were written are backed, and pages given back
//! are punched out of it (`fallocate(PUNCH_HOLE)`), so its size says
//! nothing about its memory.
//!
//! Layout of the file (offsets fixed by [`LAYOUT_VERSION`]):
//!
//! | offset | what |
//! | --- | --- |
//! | 0 | the header (4 KB): magic, layout, the store's shape, recoveries; then the settings changed at run time ([`RuntimeSettings`]) |
//! | [`SLOTS_AT`] | the slot table, 16 bytes per page |
//! | [`class_region`]`(k)` | size class `k`'s zspages, zspage `id` at `id * zspage_bytes` |
//! | `DICTS_AT` | the algorithms' dictionaries, one entry of `DICT_SPAN` each (layout 6) |
//!
//! Everything else (class lists, free lists, statistics) is process memory
//! and is rebuilt from the slot table by a recovery.

use crate::error::{Error, Result};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;

/// Where the slot table starts (after the header page).
pub(crate) const SLOTS_AT: u64 = 4096;
/// Room for the slot table: 16 bytes for each of 2^36 pages (a 256 TiB
/// device, the most a store may have).
const SLOTS_SPAN: u64 = crate::page::MAX_PAGES * 16;
/// Room per size class: 4 TB of zspages.
pub(crate) const CLASS_SPAN: u64 = 1 << 42;
/// Most size classes the layout has room for.
const MAX_CLASSES: u64 = 256;
/// Where the dictionaries start: after every class's region.
const DICTS_AT: u64 = SLOTS_AT + SLOTS_SPAN + MAX_CLASSES * CLASS_SPAN;
/// Room per dictionary entry: its name, length and checksum, then its
/// bytes (a dictionary is at most 64 KB, `codec::MAX_DICT_BYTES`).
const DICT_SPAN: u64 = 1 << 20;
/// Dictionary entries: the primary algorithm and each secondary one.
const DICT_ENTRIES: usize = 1 + SECONDARY_NAMES;
/// Bytes of a dictionary entry before its bytes.
const DICT_HEAD: usize = 8 + ALGO_BYTES + 8;
/// Marks a dictionary entry; zeros: no dictionary.
const DICT_MAGIC: [u8; 8] = *b"ZBLKDICT";
/// The file's size: header, slot table, every class's region and the
/// dictionaries.
const FILE_SIZE: u64 = DICTS_AT + DICT_ENTRIES as u64 * DICT_SPAN;
/// The file's size in layouts 2 to 5, which end after the classes: such a
/// file is grown to [`FILE_SIZE`] when taken over (sparse: the room costs
/// nothing until a dictionary is written there, and none is).
const FILE_SIZE_BEFORE_DICTS: u64 = DICTS_AT;

/// The first 8 bytes of the header.
const MAGIC: [u8; 8] = *b"ZBLKMEM\0";
/// Bumped whenever the file's layout or an object format changes: a
/// recovery refuses a file of another layout rather than misread it.
/// 2: slots carry an access time, an idle mark and an algorithm index;
/// the header the clock's base and the secondary algorithm.
/// 3: an object may live in any size class at least its size (the memory
/// reserve's fallback, `slab::reserve`), not only in the smallest.
/// 4: packed group headers carry a seal in their `base` word
/// (`crate::packed`); a recovery of an older file seals them.
/// 5: the header names up to three secondary algorithms (slots' `algo`
/// 1 to 3), the first where layouts 2-4 name their one.
/// 6: the file ends with the algorithms' dictionaries (`DICTS_AT`).
/// 7: a slot may hold a page of a packed group written back (kind 6,
/// `crate::slot`), which a zblk of layout 6 would read as an empty slot.
pub(crate) const LAYOUT_VERSION: u64 = 7;
/// The first layout whose packed headers are sealed.
pub(crate) const SEALED_PACKS: u64 = 4;
/// The oldest layout this build reads: a layout-2 store is a layout-3 store
/// whose objects all sit in their smallest class, a layout-3 store a
/// layout-4 store whose packed headers are not sealed yet, a layout-4
/// store a layout-5 store with at most one secondary algorithm (its
/// header's bytes for the second and third are zeros), a layout-5 store a
/// layout-6 store without dictionaries (its file is grown to have room
/// for them), a layout-6 store a layout-7 store without written-back
/// packed groups; each is rewritten as the current layout when taken
/// over.
pub(crate) const OLDEST_LAYOUT: u64 = 2;
/// Bytes of the header kept for the algorithm's name.
const ALGO_BYTES: usize = 32;

/// Offset and size of size class `k`'s region.
pub(crate) fn class_region(k: usize) -> (u64, u64) {
    (SLOTS_AT + SLOTS_SPAN + k as u64 * CLASS_SPAN, CLASS_SPAN)
}

/// The header: what a recovery checks before it trusts the rest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Header {
    /// The layout the file was written with (written back as
    /// [`LAYOUT_VERSION`]).
    pub(crate) layout: u64,
    /// The allocator's class table and slot encoding, hashed: a binary
    /// with other classes cannot decode these handles.
    pub(crate) fingerprint: u64,
    /// Device size in bytes.
    pub(crate) size: u64,
    /// Pages per compression group.
    pub(crate) group_pages: u64,
    /// 0 per page, 1 packed.
    pub(crate) mode: u64,
    /// Compressed size at or above which pages are stored raw.
    pub(crate) huge_threshold: u64,
    /// The algorithm's name (`Algo`'s Display).
    pub(crate) algo: String,
    /// Recoveries so far.
    pub(crate) recoveries: u64,
    /// When the store was created, seconds since the epoch.
    pub(crate) created_at: u64,
    /// When it was last recovered, seconds since the epoch (0: never).
    pub(crate) recovered_at: u64,
    /// The store clock's base: `CLOCK_BOOTTIME` seconds at creation
    /// (`crate::clock`), which slots' access times count from.
    pub(crate) clock_base: u64,
    /// The secondary algorithms' names (entry `i` is slots' `algo` `i +
    /// 1`), empty until the first recompression chose one; each written
    /// before any slot uses it.
    pub(crate) secondaries: Vec<String>,
    /// The settings changed at run time, once one was (`None` in a
    /// header written before this field existed: all zeros there).
    pub(crate) runtime: Option<RuntimeSettings>,
}

/// The settings a store was changed to while it ran, kept so that the
/// process recovering it goes on with them rather than with the ones it
/// was created with: a device's limits outlive its daemon, as zram's
/// sysfs settings outlive nothing because zram has no daemon to lose.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct RuntimeSettings {
    /// The memory limit in bytes (0: none).
    pub(crate) mem_limit: u64,
    /// Pages writeback may still write (`u64::MAX`: no limit).
    pub(crate) writeback_limit: u64,
    /// What the serving process keeps with the store, opaque to the engine
    /// (the daemon's idle policy), at most [`NOTE_BYTES`] bytes.
    pub(crate) note: String,
}

const FIELDS: usize = 10;
/// Marks the [`RuntimeSettings`] settings after the names; zeros: none recorded.
const RUNTIME_MAGIC: [u8; 8] = *b"ZBLKLIVE";
/// Most bytes of [`RuntimeSettings::note`].
pub(crate) const NOTE_BYTES: usize = 2048;
/// Where the run-time settings start.
const RUNTIME_AT: usize = 8 + 8 * FIELDS + 2 * ALGO_BYTES;
/// Where the names of the second and third secondary algorithms start,
/// after the run-time settings (the first sits where layouts up to 4 keep
/// their one).
const MORE_SECONDARIES_AT: usize = RUNTIME_AT + 28 + NOTE_BYTES;
/// Secondary algorithms the header has room for (`secondary::MAX_SECONDARIES`).
const SECONDARY_NAMES: usize = 3;
/// Bytes of the header that hold anything.
const HEADER_BYTES: usize = MORE_SECONDARIES_AT + (SECONDARY_NAMES - 1) * ALGO_BYTES;

impl Header {
    fn to_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(4096);
        b.extend_from_slice(&MAGIC);
        let words = [
            LAYOUT_VERSION,
            self.fingerprint,
            self.size,
            self.group_pages,
            self.mode,
            self.huge_threshold,
            self.recoveries,
            self.created_at,
            self.recovered_at,
            self.clock_base,
        ];
        for w in words {
            b.extend_from_slice(&w.to_le_bytes());
        }
        let secondary = |i: usize| self.secondaries.get(i).map_or("", String::as_str);
        for name in [self.algo.as_str(), secondary(0)] {
            put_name(&mut b, name);
        }
        if let Some(l) = &self.runtime {
            b.extend_from_slice(&RUNTIME_MAGIC);
            b.extend_from_slice(&l.mem_limit.to_le_bytes());
            b.extend_from_slice(&l.writeback_limit.to_le_bytes());
            // `Store::set_owner_note` refuses longer notes; cut at a
            // character boundary all the same.
            let mut n = l.note.len().min(NOTE_BYTES);
            while !l.note.is_char_boundary(n) {
                n -= 1;
            }
            let note = &l.note.as_bytes()[..n];
            b.extend_from_slice(&(note.len() as u32).to_le_bytes());
            b.extend_from_slice(note);
        }
        // Always the same length: a header without run-time settings clears
        // whatever an earlier write left there.
        b.resize(MORE_SECONDARIES_AT, 0);
        for i in 1..SECONDARY_NAMES {
            put_name(&mut b, secondary(i));
        }
        debug_assert_eq!(b.len(), HEADER_BYTES);
        b
    }

    /// The run-time settings at [`RUNTIME_AT`] of header page `b`, if recorded.
    fn parse_runtime(b: &[u8]) -> Result<Option<RuntimeSettings>> {
        let bad = |why: &str| Error::InvalidConfig(format!("shared memory: {why}"));
        if b.len() < RUNTIME_AT + 28 || b[RUNTIME_AT..RUNTIME_AT + 8] != RUNTIME_MAGIC {
            return Ok(None);
        }
        let word = |at: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[at..at + 8]);
            u64::from_le_bytes(x)
        };
        let mut n = [0u8; 4];
        n.copy_from_slice(&b[RUNTIME_AT + 24..RUNTIME_AT + 28]);
        let n = u32::from_le_bytes(n) as usize;
        let start = RUNTIME_AT + 28;
        if n > NOTE_BYTES || start + n > b.len() {
            return Err(bad("the live settings' note overruns the header"));
        }
        let note = std::str::from_utf8(&b[start..start + n])
            .map_err(|_| bad("the live settings' note is not UTF-8"))?;
        Ok(Some(RuntimeSettings {
            mem_limit: word(RUNTIME_AT + 8),
            writeback_limit: word(RUNTIME_AT + 16),
            note: note.to_string(),
        }))
    }

    fn parse(b: &[u8]) -> Result<Header> {
        let bad = |why: &str| Error::InvalidConfig(format!("shared memory: {why}"));
        if b.len() < 8 + 8 * FIELDS + 2 * ALGO_BYTES || b[..8] != MAGIC {
            return Err(bad("no zblk store in this file (bad magic)"));
        }
        let w = |i: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[8 + 8 * i..16 + 8 * i]);
            u64::from_le_bytes(x)
        };
        if !(OLDEST_LAYOUT..=LAYOUT_VERSION).contains(&w(0)) {
            return Err(bad(&format!(
                "layout {} but this zblk reads layouts {OLDEST_LAYOUT} to {LAYOUT_VERSION}",
                w(0)
            )));
        }
        let name = |at: usize| {
            let Some(algo) = b.get(at..at + ALGO_BYTES) else {
                return Ok(String::new());
            };
            let end = algo.iter().position(|&c| c == 0).unwrap_or(ALGO_BYTES);
            std::str::from_utf8(&algo[..end])
                .map(str::to_string)
                .map_err(|_| bad("an algorithm name is not UTF-8"))
        };
        let names = 8 + 8 * FIELDS;
        let algo = name(names)?;
        let mut secondaries = Vec::new();
        for at in [
            names + ALGO_BYTES,
            MORE_SECONDARIES_AT,
            MORE_SECONDARIES_AT + ALGO_BYTES,
        ] {
            let n = name(at)?;
            if n.is_empty() {
                break;
            }
            secondaries.push(n);
        }
        Ok(Header {
            layout: w(0),
            fingerprint: w(1),
            size: w(2),
            group_pages: w(3),
            mode: w(4),
            huge_threshold: w(5),
            recoveries: w(6),
            created_at: w(7),
            recovered_at: w(8),
            clock_base: w(9),
            algo,
            secondaries,
            // The run-time settings are advice: unreadable ones must not keep
            // a store's pages from being recovered.
            runtime: Self::parse_runtime(b).unwrap_or_else(|e| {
                log::warn!("{e}: going on with the settings the store was made with");
                None
            }),
        })
    }
}

/// Appends `name` to `b` in a field of [`ALGO_BYTES`], zero-padded.
fn put_name(b: &mut Vec<u8>, name: &str) {
    let mut field = [0u8; ALGO_BYTES];
    let n = name.len().min(ALGO_BYTES);
    field[..n].copy_from_slice(&name.as_bytes()[..n]);
    b.extend_from_slice(&field);
}

/// The CRC-32 a recorded dictionary is checked with.
fn dict_crc(bytes: &[u8]) -> u32 {
    let mut c = libdeflater::Crc::new();
    c.update(bytes);
    c.sum()
}

/// A new, empty memfd.
fn memfd() -> Result<std::fs::File> {
    // SAFETY: a NUL-terminated name and valid flags; the result is
    // checked before use.
    let fd = unsafe { libc::memfd_create(c"zblk".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(os_error("memfd_create", io::Error::last_os_error()));
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    Ok(std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// One store's file: a memfd, or a nameless file on a tmpfs of its own.
#[derive(Debug)]
pub(crate) struct SharedMem {
    file: std::fs::File,
    /// Held across a read-modify-write of the header, so that two threads
    /// changing different fields (the maintenance thread's secondary, the
    /// control thread's limits) do not undo each other.
    header_lock: std::sync::Mutex<()>,
}

fn os_error(what: &str, e: io::Error) -> Error {
    Error::InvalidConfig(format!("shared memory: {what}: {e}"))
}

/// The pages a mapping of the store's file is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pages {
    /// 2 MB pages where the file allows them (a file made by
    /// [`crate::tmpfs::huge_file`]) and the kernel has one to give; 4 KB
    /// pages otherwise.
    Huge,
    /// 4 KB pages only (`MADV_NOHUGEPAGE`): a mapping whose memory grows
    /// a page at a time, where a 2 MB page would hold mostly zeros.
    Small,
}

impl SharedMem {
    /// Creates an empty file of the layout's size (nothing backed yet): on
    /// a tmpfs of its own that gives 2 MB pages when `huge` asks and the
    /// system allows it ([`crate::tmpfs`]), else a memfd.
    pub(crate) fn create(huge: bool) -> Result<SharedMem> {
        let file = match huge.then(crate::tmpfs::huge_file) {
            Some(Ok(file)) => file,
            Some(Err(why)) => {
                log::info!("shared memory: 4 KB pages only ({why})");
                memfd()?
            }
            None => memfd()?,
        };
        file.set_len(FILE_SIZE)
            .map_err(|e| os_error("sizing the store's file", e))?;
        Ok(SharedMem {
            file,
            header_lock: std::sync::Mutex::new(()),
        })
    }

    /// Takes over the memfd of a store whose process died.
    pub(crate) fn open(fd: OwnedFd) -> Result<SharedMem> {
        let file = std::fs::File::from(fd);
        let len = file.metadata().map_err(|e| os_error("fstat", e))?.len();
        if len == FILE_SIZE_BEFORE_DICTS {
            file.set_len(FILE_SIZE)
                .map_err(|e| os_error("growing the memfd to the current layout", e))?;
        } else if len != FILE_SIZE {
            return Err(Error::InvalidConfig(format!(
                "shared memory: the file is {len} bytes, a zblk store's is {FILE_SIZE}"
            )));
        }
        Ok(SharedMem {
            file,
            header_lock: std::sync::Mutex::new(()),
        })
    }

    /// The descriptor, for whoever keeps the memory while no daemon runs.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    /// Reads the header.
    pub(crate) fn read_header(&self) -> Result<Header> {
        let mut b = vec![0u8; 4096];
        self.file
            .read_exact_at(&mut b, 0)
            .map_err(|e| os_error("reading the header", e))?;
        Header::parse(&b)
    }

    /// Changes the header with `f`, under the header lock. A process killed
    /// meanwhile leaves the old header or the new one: the write is one
    /// `pwrite` of under a page into the memfd's page cache, which a signal
    /// cannot cut in two.
    pub(crate) fn update_header(&self, f: impl FnOnce(&mut Header)) -> Result<Header> {
        let _held = self.header_lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut h = self.read_header()?;
        f(&mut h);
        self.write_header(&h)?;
        Ok(h)
    }

    /// Rewrites the header as a build of layout `layout` (with its
    /// fingerprint) would have written it: how a test makes an older
    /// zblk's file.
    #[cfg(feature = "test-support")]
    pub(crate) fn debug_write_layout(&self, layout: u64, fingerprint: u64) -> Result<()> {
        let _held = self.header_lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut words = [0u8; 16];
        words[..8].copy_from_slice(&layout.to_le_bytes());
        words[8..].copy_from_slice(&fingerprint.to_le_bytes());
        self.file
            .write_all_at(&words, 8)
            .map_err(|e| os_error("writing the header", e))
    }

    /// Shrinks the file to what layouts up to 5 made (no room for
    /// dictionaries): how a test makes such a file.
    #[cfg(feature = "test-support")]
    pub(crate) fn debug_drop_dictionary_room(&self) -> Result<()> {
        self.file
            .set_len(FILE_SIZE_BEFORE_DICTS)
            .map_err(|e| os_error("shrinking the memfd", e))
    }

    /// Writes the header.
    pub(crate) fn write_header(&self, h: &Header) -> Result<()> {
        self.file
            .write_all_at(&h.to_bytes(), 0)
            .map_err(|e| os_error("writing the header", e))
    }

    /// Records the dictionaries `dicts` (an algorithm's name and its
    /// bytes; at most one per algorithm of the store), before the header
    /// makes the file a store.
    pub(crate) fn write_dictionaries(&self, dicts: &[(String, &[u8])]) -> Result<()> {
        if dicts.len() > DICT_ENTRIES {
            return Err(Error::InvalidConfig(format!(
                "shared memory: room for {DICT_ENTRIES} dictionaries, not {}",
                dicts.len()
            )));
        }
        for (i, (name, bytes)) in dicts.iter().enumerate() {
            if DICT_HEAD + bytes.len() > DICT_SPAN as usize {
                return Err(Error::InvalidConfig(format!(
                    "shared memory: the dictionary of {name} is too large to record"
                )));
            }
            let mut b = Vec::with_capacity(DICT_HEAD + bytes.len());
            b.extend_from_slice(&DICT_MAGIC);
            put_name(&mut b, name);
            b.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
            b.extend_from_slice(&dict_crc(bytes).to_le_bytes());
            b.extend_from_slice(bytes);
            self.file
                .write_all_at(&b, DICTS_AT + i as u64 * DICT_SPAN)
                .map_err(|e| os_error("writing a dictionary", e))?;
        }
        Ok(())
    }

    /// The dictionaries [`SharedMem::write_dictionaries`] recorded, each
    /// checked against its checksum: a damaged one is an error, since
    /// decoding with it would give wrong pages.
    pub(crate) fn read_dictionaries(&self) -> Result<Vec<(String, Vec<u8>)>> {
        let bad = |why: String| Error::InvalidConfig(format!("shared memory: {why}"));
        let mut found = Vec::new();
        for i in 0..DICT_ENTRIES {
            let at = DICTS_AT + i as u64 * DICT_SPAN;
            let mut head = [0u8; DICT_HEAD];
            self.file
                .read_exact_at(&mut head, at)
                .map_err(|e| os_error("reading a dictionary", e))?;
            if head[..8] != DICT_MAGIC {
                continue;
            }
            let name = &head[8..8 + ALGO_BYTES];
            let end = name.iter().position(|&c| c == 0).unwrap_or(ALGO_BYTES);
            let name = String::from_utf8_lossy(&name[..end]).into_owned();
            let word = |k: usize| {
                let mut x = [0u8; 4];
                x.copy_from_slice(&head[8 + ALGO_BYTES + 4 * k..12 + ALGO_BYTES + 4 * k]);
                u32::from_le_bytes(x)
            };
            let len = word(0) as usize;
            if DICT_HEAD + len > DICT_SPAN as usize {
                return Err(bad(format!("the dictionary of {name} overruns its room")));
            }
            let mut bytes = vec![0u8; len];
            self.file
                .read_exact_at(&mut bytes, at + DICT_HEAD as u64)
                .map_err(|e| os_error("reading a dictionary", e))?;
            if dict_crc(&bytes) != word(1) {
                return Err(bad(format!(
                    "the dictionary of {name} is damaged (checksum mismatch): its pages cannot be decoded"
                )));
            }
            found.push((name, bytes));
        }
        Ok(found)
    }

    /// Maps `len` bytes at `offset` shared, read-write, lazily backed, with
    /// `pages` of that size. Returns the address, or `None` (logged) if the
    /// OS refused.
    pub(crate) fn map(&self, offset: u64, len: usize, pages: Pages) -> Option<usize> {
        let off = libc::off_t::try_from(offset).ok()?;
        if crate::fail_point::fail("shm:map") {
            return None;
        }
        // SAFETY: a fresh shared mapping of our own file; the result is
        // checked against MAP_FAILED before use.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_NORESERVE,
                self.file.as_raw_fd(),
                off,
            )
        };
        if p == libc::MAP_FAILED {
            log::error!(
                "shared memory: mmap of {len} bytes at {offset} failed: {}",
                io::Error::last_os_error()
            );
            return None;
        }
        if pages == Pages::Small {
            // SAFETY: the mapping just made; the advice changes no
            // contents. It fails only on a kernel without transparent huge
            // pages, whose pages are all small anyway.
            unsafe { libc::madvise(p, len, libc::MADV_NOHUGEPAGE) };
        }
        Some(p as usize)
    }

    /// Gives `len` bytes at `offset` back to the OS: they read as zeros
    /// afterwards, wherever they are mapped (locked mappings included).
    pub(crate) fn punch(&self, offset: u64, len: u64) {
        let (Ok(off), Ok(n)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
            return;
        };
        let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        // SAFETY: fallocate on our own descriptor; it changes only file
        // contents that no live object uses (the caller's contract).
        if unsafe { libc::fallocate(self.file.as_raw_fd(), mode, off, n) } != 0 {
            log::warn!(
                "shared memory: cannot give {len} bytes back: {}",
                io::Error::last_os_error()
            );
        }
    }

    /// Bytes of the file that are backed by memory.
    #[cfg(test)]
    fn resident_bytes(&self) -> u64 {
        use std::os::unix::fs::MetadataExt;
        self.file.metadata().map(|m| m.blocks() * 512).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_bad_files_are_refused() {
        let h = Header {
            layout: LAYOUT_VERSION,
            fingerprint: 0xfeed,
            size: 1 << 30,
            group_pages: 8,
            mode: 1,
            huge_threshold: 3072,
            algo: "zstd:3".into(),
            recoveries: 2,
            created_at: 1_700_000_000,
            recovered_at: 1_700_000_100,
            clock_base: 12_345,
            secondaries: vec!["deflate:9".into(), "lz4hc".into(), "zstd:19".into()],
            runtime: None,
        };
        let shm = SharedMem::create(false).unwrap();
        shm.write_header(&h).unwrap();
        assert_eq!(shm.read_header().unwrap(), h);
        let live = RuntimeSettings {
            mem_limit: 64 << 20,
            writeback_limit: 1000,
            note: "{\"policy\":1}".into(),
        };
        let got = shm
            .update_header(|h| h.runtime = Some(live.clone()))
            .unwrap();
        assert_eq!(got.runtime.as_ref(), Some(&live));
        assert_eq!(shm.read_header().unwrap().runtime, Some(live));
        let cleared = shm.update_header(|h| h.runtime = None).unwrap();
        assert_eq!(shm.read_header().unwrap(), cleared);
        assert_eq!(cleared.runtime, None, "nothing left behind");
        let mut b = h.to_bytes();
        b[RUNTIME_AT..RUNTIME_AT + 8].copy_from_slice(&RUNTIME_MAGIC);
        b[RUNTIME_AT + 24..RUNTIME_AT + 28].copy_from_slice(&(NOTE_BYTES as u32 + 1).to_le_bytes());
        assert_eq!(
            Header::parse(&b).unwrap().runtime,
            None,
            "a note past its room is ignored, the store still opens"
        );
        let empty = SharedMem::create(false).unwrap();
        assert!(empty.read_header().is_err(), "no magic, no store");
        let mut b = h.to_bytes();
        b[8] = 99;
        assert!(Header::parse(&b).is_err(), "another layout is refused");
        b[8] = OLDEST_LAYOUT as u8 - 1;
        assert!(Header::parse(&b).is_err(), "an older layout is refused");
        b[8] = OLDEST_LAYOUT as u8;
        let old = Header::parse(&b).expect("the oldest layout read is read");
        assert_eq!(old.layout, OLDEST_LAYOUT);
        assert_eq!(
            Header::parse(&old.to_bytes()).unwrap().layout,
            LAYOUT_VERSION,
            "written back as this one"
        );
    }

    #[test]
    fn punched_pages_read_as_zeros_and_are_not_resident() {
        let shm = SharedMem::create(false).unwrap();
        let (off, _) = class_region(3);
        let a = shm.map(off, 8192, Pages::Small).unwrap();
        // SAFETY: a fresh 8 KB mapping only this test uses.
        let s = unsafe { std::slice::from_raw_parts_mut(a as *mut u8, 8192) };
        s.fill(7);
        assert!(shm.resident_bytes() >= 8192);
        shm.punch(off, 4096);
        assert!(s[..4096].iter().all(|&b| b == 0));
        assert!(s[4096..].iter().all(|&b| b == 7));
        let b = shm.map(off, 8192, Pages::Small).unwrap();
        // SAFETY: a second mapping of the same bytes, read only.
        let t = unsafe { std::slice::from_raw_parts(b as *const u8, 8192) };
        assert_eq!(t[5000], 7, "a second mapping sees the same memory");
    }
}
