//! Which swap slots a process's pages are in: `/proc/PID/pagemap`
//! decoded, the swap areas of `/proc/swaps` by swap type, and the scan of
//! one process's mappings (`zblk stat --by`): where the kernel has the
//! `PAGEMAP_SCAN` ioctl (6.7+), it names the runs of swapped pages and
//! only their entries are read; otherwise every mapped page's entry is.
//!
//! # A pagemap entry
//!
//! `/proc/PID/pagemap` holds one 64-bit entry per virtual page
//! (Documentation/admin-guide/mm/pagemap.rst):
//!
//! | bits | meaning |
//! | --- | --- |
//! | 0-54 | the page frame number if present (0 without `CAP_SYS_ADMIN`) |
//! | 0-4 | the swap type, if swapped |
//! | 5-54 | the swap offset, if swapped |
//! | 55 | the pte is soft-dirty |
//! | 56 | the page is exclusively mapped |
//! | 57 | the pte is uffd-wp write-protected |
//! | 58-60 | zero |
//! | 61 | a file page or shared anonymous page |
//! | 62 | swapped |
//! | 63 | present |
//!
//! Bit 62 is set for every non-present swap-format pte, migration and
//! hwpoison entries included: those carry the kernel's special swap types
//! (the highest of the 32 a 5-bit type can say), which `/proc/swaps` never
//! lists. Without `CAP_SYS_ADMIN` the kernel zeroes bits 0-54, so every
//! swapped page would say type 0, offset 0: the scan needs root.
//!
//! A transparent huge page is split into 512 ptes when it is swapped out;
//! one swapped as a whole under a PMD (a PMD migration entry) still shows
//! one entry per 4 KB page, each with its own offset (the PMD's first plus
//! the page's index in it): either way, one entry is one device page.
//!
//! # From swap type to swap area
//!
//! The swap type is the index of the area in the kernel's `swap_info`
//! table. `/proc/swaps` walks that table in type order and skips the
//! unused types, so its n-th area is type n as long as no type below it
//! is unused. `swapon` takes the lowest unused type, so a type is unused
//! only after a `swapoff` of an area while an area of a higher type stays
//! on (until the next `swapon` takes it back). In that case the areas
//! listed after the hole have a type above their line; [`SwapAreas`]
//! cannot see it from `/proc/swaps` alone. The scan checks it two ways:
//! an entry whose type has no line is counted apart (never put on an
//! area), and every page put on a zblk device is looked up in that
//! device's slots, so a wrong mapping shows as pages the device does not
//! store (`not_stored`, with a warning). Switching the later areas off
//! and on again removes the hole.

use std::fs::File;
use std::io::ErrorKind;
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use zblk::PAGE_SIZE_U64;

/// Bytes of one pagemap entry.
const ENTRY_BYTES: usize = 8;

/// Entries read from a pagemap file at a time: 512 KB, 256 MB of address
/// space.
pub const CHUNK_ENTRIES: usize = 1 << 16;

/// One 64-bit `/proc/PID/pagemap` entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry(pub u64);

// Every field of an entry is decoded (and tested against hand-made
// entries); the scan itself needs only `swap`.
#[allow(dead_code)]
impl Entry {
    /// Bit 63: the page is in RAM.
    const PRESENT: u64 = 1 << 63;
    /// Bit 62: the page is in a swap area (or a migration entry).
    const SWAPPED: u64 = 1 << 62;
    /// Bit 61: a file page or a shared anonymous page.
    const FILE_SHARED: u64 = 1 << 61;
    /// Bit 57: write-protected through userfaultfd.
    const UFFD_WP: u64 = 1 << 57;
    /// Bit 56: mapped by this process only.
    const EXCLUSIVE: u64 = 1 << 56;
    /// Bit 55: soft-dirty.
    const SOFT_DIRTY: u64 = 1 << 55;
    /// Bits 0-54: the frame number, or the swap type and offset.
    const FRAME_MASK: u64 = (1 << 55) - 1;
    /// Bits of the swap type (the kernel's `MAX_SWAPFILES_SHIFT`).
    const TYPE_BITS: u32 = 5;

    /// Whether the page is in RAM.
    pub fn present(self) -> bool {
        self.0 & Self::PRESENT != 0
    }

    /// Whether the page is swapped out (bit 62 and not present).
    pub fn swapped(self) -> bool {
        self.0 & (Self::SWAPPED | Self::PRESENT) == Self::SWAPPED
    }

    /// Whether it is a file page or a shared anonymous page.
    pub fn file_or_shared(self) -> bool {
        self.0 & Self::FILE_SHARED != 0
    }

    /// Whether this process is the only one mapping the page.
    pub fn exclusive(self) -> bool {
        self.0 & Self::EXCLUSIVE != 0
    }

    /// Whether the pte is write-protected through userfaultfd.
    pub fn uffd_wp(self) -> bool {
        self.0 & Self::UFFD_WP != 0
    }

    /// Whether the pte is soft-dirty.
    pub fn soft_dirty(self) -> bool {
        self.0 & Self::SOFT_DIRTY != 0
    }

    /// The page frame number of a page in RAM (0 when the reader lacks
    /// `CAP_SYS_ADMIN`).
    pub fn pfn(self) -> Option<u64> {
        self.present().then_some(self.0 & Self::FRAME_MASK)
    }

    /// The swap entry of a swapped-out page.
    pub fn swap(self) -> Option<SwapEntry> {
        self.swapped()
            .then_some(SwapEntry(self.0 & Self::FRAME_MASK))
    }
}

/// A swap entry: swap type and offset, packed as pagemap packs them
/// (type in bits 0-4, offset above): equal pages have equal values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SwapEntry(pub u64);

impl SwapEntry {
    /// The entry of `offset` in the area of swap type `ty` (below 32).
    #[cfg(test)]
    pub fn new(ty: u8, offset: u64) -> Self {
        SwapEntry((offset << Entry::TYPE_BITS) | u64::from(ty & 31))
    }

    /// The swap type: the area's index in the kernel's table.
    pub fn swap_type(self) -> u8 {
        (self.0 & ((1 << Entry::TYPE_BITS) - 1)) as u8
    }

    /// The page's offset in its area, in pages: the device page index.
    pub fn offset(self) -> u64 {
        self.0 >> Entry::TYPE_BITS
    }
}

/// The swap areas in use, in the kernel's type order (`/proc/swaps`):
/// area n is swap type n unless a lower type is unused (see the module's
/// documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SwapAreas {
    /// Each area's path, as `/proc/swaps` names it.
    pub paths: Vec<String>,
}

impl SwapAreas {
    /// The areas of a `/proc/swaps` text.
    pub fn parse(text: &str) -> Self {
        SwapAreas {
            paths: zblk_ublk::swap::parse_swaps(text),
        }
    }

    /// The areas of this machine.
    pub fn read() -> std::io::Result<Self> {
        std::fs::read_to_string("/proc/swaps").map(|t| Self::parse(&t))
    }

    /// The area of swap type `ty`, by its line: None for a type that has
    /// none (a special entry, or an area above a hole in the table).
    pub fn area(&self, ty: u8) -> Option<usize> {
        (usize::from(ty) < self.paths.len()).then_some(usize::from(ty))
    }
}

/// The address ranges of a `/proc/PID/maps` text, page-aligned, in
/// order; a line that does not parse is skipped (the kernel writes them).
pub fn parse_maps(text: &str) -> Vec<Range<u64>> {
    text.lines()
        .filter_map(|l| {
            let (start, end) = l.split_whitespace().next()?.split_once('-')?;
            let start = u64::from_str_radix(start, 16).ok()?;
            let end = u64::from_str_radix(end, 16).ok()?;
            (start < end).then_some(start..end)
        })
        .collect()
}

/// What the scan of one process read and found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ScanCount {
    /// Pagemap entries read.
    pub entries: u64,
    /// Swapped-out pages found.
    pub swapped: u64,
}

/// Whether `e` says the process exited meanwhile.
fn gone(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::NotFound) || e.raw_os_error() == Some(libc::ESRCH)
}

/// `PAGEMAP_SCAN` (Linux 6.7+, include/uapi/linux/fs.h):
/// `_IOWR('f', 16, struct pm_scan_arg)`, on a pagemap file.
const PAGEMAP_SCAN: libc::Ioctl = 0xc060_6610;

/// `PAGE_IS_SWAPPED`: the category of a swapped-out pte.
const PAGE_IS_SWAPPED: u64 = 1 << 4;

/// Regions one `PAGEMAP_SCAN` call returns at most.
const SCAN_REGIONS: usize = 512;

/// `struct pm_scan_arg` (include/uapi/linux/fs.h).
#[repr(C)]
#[derive(Debug, Default)]
struct PmScanArg {
    /// The struct's size.
    size: u64,
    /// `PM_SCAN_*` flags (none here).
    flags: u64,
    /// First address of the walk.
    start: u64,
    /// Its end.
    end: u64,
    /// Where the walk stopped (the kernel's answer).
    walk_end: u64,
    /// Address of the array of [`PageRegion`]s.
    vec: u64,
    /// Its length.
    vec_len: u64,
    /// Most pages to report (0: no limit).
    max_pages: u64,
    /// Categories to invert before matching.
    category_inverted: u64,
    /// Categories every page must have.
    category_mask: u64,
    /// Categories of which a page needs one.
    category_anyof_mask: u64,
    /// Categories to report.
    return_mask: u64,
}

/// `struct page_region`: a run of pages of the same categories.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct PageRegion {
    /// First address.
    start: u64,
    /// End address.
    end: u64,
    /// Its categories (of the return mask).
    categories: u64,
}

/// Reads processes' pagemaps through one reused buffer, reading only the
/// runs of swapped pages `PAGEMAP_SCAN` finds where the kernel has it
/// (6.7+), else every mapped page.
pub struct Scanner {
    /// The bytes of [`CHUNK_ENTRIES`] entries.
    buf: Vec<u8>,
    /// `PAGEMAP_SCAN`'s answers.
    regions: Vec<PageRegion>,
    /// Whether to ask `PAGEMAP_SCAN` (until the kernel says it has none).
    use_scan: bool,
}

impl Default for Scanner {
    fn default() -> Self {
        Self::new()
    }
}

impl Scanner {
    /// A scanner with its buffer.
    pub fn new() -> Self {
        Scanner {
            buf: vec![0; CHUNK_ENTRIES * ENTRY_BYTES],
            regions: vec![PageRegion::default(); SCAN_REGIONS],
            use_scan: true,
        }
    }

    /// The same, never asking `PAGEMAP_SCAN`: every mapped page is read
    /// (what a kernel before 6.7 gets).
    #[cfg(test)]
    pub fn reading_all() -> Self {
        Scanner {
            use_scan: false,
            ..Self::new()
        }
    }

    /// Calls `found` with every swapped-out page of process `pid`, range
    /// by range of its `/proc/PID/maps`, reading its pagemap
    /// [`CHUNK_ENTRIES`] at a time; stops once `enough` pages are found
    /// (the process's `VmSwap`: the rest of its mappings can hold no more,
    /// unless it swaps out more meanwhile, which a snapshot misses
    /// anyway). A process that exits meanwhile has nothing (not an
    /// error).
    pub fn scan(
        &mut self,
        pid: u32,
        enough: u64,
        mut found: impl FnMut(SwapEntry),
    ) -> std::io::Result<ScanCount> {
        let maps = match std::fs::read_to_string(format!("/proc/{pid}/maps")) {
            Ok(t) => t,
            Err(e) if gone(&e) => return Ok(ScanCount::default()),
            Err(e) => return Err(e),
        };
        let file = match File::open(format!("/proc/{pid}/pagemap")) {
            Ok(f) => f,
            Err(e) if gone(&e) => return Ok(ScanCount::default()),
            Err(e) => return Err(e),
        };
        let mut count = ScanCount::default();
        let ranges = parse_maps(&maps);
        self.scan_ranges(&file, &ranges, enough, &mut count, &mut found)?;
        if self.use_scan && count.swapped < enough {
            // PAGEMAP_SCAN named fewer swapped pages than the process's
            // VmSwap (seen on 6.12 with swapped runs interleaved with
            // resident and swap-cached pages): read every entry again.
            // A page found twice is one page to the caller, which
            // deduplicates by process and entry.
            self.use_scan = false;
            let mut again = ScanCount::default();
            let read = self.scan_ranges(&file, &ranges, enough, &mut again, &mut found);
            self.use_scan = true;
            read?;
            count.entries += again.entries;
            count.swapped = count.swapped.max(again.swapped);
        }
        Ok(count)
    }

    /// Scans `ranges` of an open pagemap until `enough` swapped pages
    /// are found; a process gone meanwhile ends it, not as an error.
    fn scan_ranges(
        &mut self,
        file: &File,
        ranges: &[Range<u64>],
        enough: u64,
        count: &mut ScanCount,
        found: &mut impl FnMut(SwapEntry),
    ) -> std::io::Result<()> {
        for range in ranges {
            if count.swapped >= enough {
                break;
            }
            match self.scan_range(file, range.clone(), count, found) {
                Ok(()) => {}
                Err(e) if gone(&e) => break,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// The swapped pages of one address range of an open pagemap: those
    /// of the runs `PAGEMAP_SCAN` finds, or of the whole range.
    fn scan_range(
        &mut self,
        file: &File,
        range: Range<u64>,
        count: &mut ScanCount,
        found: &mut impl FnMut(SwapEntry),
    ) -> std::io::Result<()> {
        if self.use_scan {
            match self.scan_swapped(file, range.clone(), count, found) {
                Ok(()) => return Ok(()),
                // A kernel before 6.7: read everything from now on.
                Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTTY | libc::EINVAL)) => {
                    self.use_scan = false
                }
                // A range it does not walk (the vsyscall page): read it.
                Err(e) if e.raw_os_error() == Some(libc::EFAULT) => {}
                Err(e) => return Err(e),
            }
        }
        self.read_range(file, range, count, found)
    }

    /// Asks `PAGEMAP_SCAN` for the runs of swapped pages of `range`, a
    /// batch of [`SCAN_REGIONS`] at a time, and reads each run's entries.
    fn scan_swapped(
        &mut self,
        file: &File,
        range: Range<u64>,
        count: &mut ScanCount,
        found: &mut impl FnMut(SwapEntry),
    ) -> std::io::Result<()> {
        let mut start = range.start;
        while start < range.end {
            let mut arg = PmScanArg {
                size: std::mem::size_of::<PmScanArg>() as u64,
                start,
                end: range.end,
                vec: self.regions.as_mut_ptr() as u64,
                vec_len: self.regions.len() as u64,
                category_mask: PAGE_IS_SWAPPED,
                return_mask: PAGE_IS_SWAPPED,
                ..PmScanArg::default()
            };
            // SAFETY: `arg` is a live pm_scan_arg of the size it says; its
            // `vec` points to `self.regions`, `vec_len` entries the kernel
            // may write, alive and not otherwise borrowed until the call
            // returns; the fd is the open pagemap file.
            let n = unsafe { libc::ioctl(file.as_raw_fd(), PAGEMAP_SCAN, &mut arg) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == ErrorKind::Interrupted {
                    continue;
                }
                // The caller reads the whole range if the first call fails;
                // after that, the rest is read here, nothing found twice.
                if start == range.start {
                    return Err(e);
                }
                return self.read_range(file, start..range.end, count, found);
            }
            let n = (n as usize).min(self.regions.len());
            for i in 0..n {
                let r = self.regions[i];
                self.read_range(file, r.start..r.end, count, found)?;
            }
            // The walk stops early only when the regions are full; an
            // answer that does not move on ends it rather than loop.
            if arg.walk_end <= start {
                break;
            }
            start = arg.walk_end;
        }
        Ok(())
    }

    /// Reads the entries of `range` and passes on the swapped ones.
    fn read_range(
        &mut self,
        file: &File,
        range: Range<u64>,
        count: &mut ScanCount,
        found: &mut impl FnMut(SwapEntry),
    ) -> std::io::Result<()> {
        let (first, end) = (range.start / PAGE_SIZE_U64, range.end / PAGE_SIZE_U64);
        let mut page = first;
        while page < end {
            let want = (end - page).min(CHUNK_ENTRIES as u64) as usize * ENTRY_BYTES;
            let pos = page.saturating_mul(ENTRY_BYTES as u64);
            let n = match file.read_at(&mut self.buf[..want], pos) {
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            // The kernel answers whole entries; none: past the address
            // space (the vsyscall page).
            let entries = n / ENTRY_BYTES;
            if entries == 0 {
                break;
            }
            decode(&self.buf[..entries * ENTRY_BYTES], count, found);
            page += entries as u64;
        }
        Ok(())
    }
}

/// Counts the entries of `bytes` (whole entries, native order) and calls
/// `found` with each swapped one.
fn decode(bytes: &[u8], count: &mut ScanCount, found: &mut impl FnMut(SwapEntry)) {
    count.entries += (bytes.len() / ENTRY_BYTES) as u64;
    for chunk in bytes.chunks_exact(ENTRY_BYTES) {
        let mut word = [0u8; ENTRY_BYTES];
        word.copy_from_slice(chunk);
        if let Some(s) = Entry(u64::from_ne_bytes(word)).swap() {
            count.swapped += 1;
            found(s);
        }
    }
}

/// The `VmSwap` of a `/proc/PID/status` text, in pages (None: no such
/// line, a kernel thread), and the process's name.
pub fn parse_status(text: &str) -> (Option<u64>, String) {
    let mut swap = None;
    let mut name = String::new();
    for line in text.lines() {
        if let Some(n) = line.strip_prefix("Name:") {
            name = n.trim().to_string();
        } else if let Some(kb) = line.strip_prefix("VmSwap:") {
            swap = kb
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
                .map(|kb| kb * 1024 / PAGE_SIZE_U64);
        }
    }
    (swap, name)
}

/// The cgroup v2 path of a `/proc/PID/cgroup` text (its `0::` line).
pub fn parse_cgroup(text: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| p.trim_end().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A swapped entry as the kernel writes it (`swp_type |
    /// swp_offset << 5`, bit 62), with `flags` added.
    fn swapped(ty: u64, offset: u64, flags: u64) -> u64 {
        (1 << 62) | ty | (offset << 5) | flags
    }

    #[test]
    fn a_swap_entry_says_its_type_and_offset() {
        let e = Entry(swapped(3, 0x1234_5678, 0));
        assert!(e.swapped() && !e.present());
        let s = e.swap().unwrap();
        assert_eq!((s.swap_type(), s.offset()), (3, 0x1234_5678));
        assert_eq!(e.pfn(), None);
        // The highest offset 50 bits say, and type 31 (a migration
        // entry's kind of type).
        let max = (1u64 << 50) - 1;
        let s = Entry(swapped(31, max, 0)).swap().unwrap();
        assert_eq!((s.swap_type(), s.offset()), (31, max));
        assert_eq!(SwapEntry::new(31, max), s);
        assert_eq!(SwapEntry::new(3, 7), SwapEntry(3 | 7 << 5));
    }

    #[test]
    fn flag_bits_do_not_leak_into_the_offset() {
        let all = (1 << 55) | (1 << 56) | (1 << 57) | (1 << 61);
        let e = Entry(swapped(1, 42, all));
        assert!(e.soft_dirty() && e.exclusive() && e.uffd_wp() && e.file_or_shared());
        assert_eq!(e.swap(), Some(SwapEntry::new(1, 42)));
        let plain = Entry(swapped(1, 42, 0));
        assert!(!plain.soft_dirty() && !plain.exclusive() && !plain.uffd_wp());
        assert!(!plain.file_or_shared());
    }

    #[test]
    fn entries_that_are_not_swap_entries() {
        // Not mapped, or never touched.
        assert_eq!(Entry(0).swap(), None);
        assert!(!Entry(0).present() && !Entry(0).swapped());
        // In RAM: a frame number, no swap entry.
        let ram = Entry((1 << 63) | (1 << 56) | 0xabcde);
        assert_eq!((ram.pfn(), ram.swap()), (Some(0xabcde), None));
        // A file page in RAM (bit 61) and one not in RAM (no bits but 61:
        // a page cache page not mapped here).
        assert_eq!(Entry((1 << 63) | (1 << 61) | 5).swap(), None);
        assert_eq!(Entry(1 << 61).swap(), None);
        // Read without CAP_SYS_ADMIN: swapped, but type 0 offset 0.
        assert_eq!(Entry(1 << 62).swap(), Some(SwapEntry::new(0, 0)));
        // Bits 62 and 63 together are not a swap entry.
        assert_eq!(Entry((1 << 63) | (1 << 62) | 77).swap(), None);
    }

    #[test]
    fn a_huge_page_is_one_entry_a_page() {
        // A 2 MB page's 512 entries, offsets following one another.
        let mut bytes = Vec::new();
        for i in 0..512u64 {
            bytes.extend_from_slice(&swapped(2, 1024 + i, 1 << 56).to_ne_bytes());
        }
        let (mut count, mut seen) = (ScanCount::default(), Vec::new());
        decode(&bytes, &mut count, &mut |s| seen.push(s));
        assert_eq!(
            count,
            ScanCount {
                entries: 512,
                swapped: 512
            }
        );
        let want: Vec<_> = (0..512).map(|i| SwapEntry::new(2, 1024 + i)).collect();
        assert_eq!(seen, want);
    }

    #[test]
    fn decoding_a_buffer_skips_what_is_not_swapped() {
        let words = [0, swapped(0, 9, 0), 1 << 63 | 7, swapped(1, 9, 0), 1 << 61];
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
        let (mut count, mut seen) = (ScanCount::default(), Vec::new());
        decode(&bytes, &mut count, &mut |s| seen.push(s));
        assert_eq!(
            count,
            ScanCount {
                entries: 5,
                swapped: 2
            }
        );
        assert_eq!(seen, [SwapEntry::new(0, 9), SwapEntry::new(1, 9)]);
    }

    #[test]
    fn swap_types_are_the_lines_of_proc_swaps() {
        let text = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n\
                    /dev/zram0                              partition\t1048572\t\t0\t\t100\n\
                    /dev/ublkb0                             partition\t8388604\t\t512\t\t50\n\
                    /swap\\040file                           file\t\t1024\t\t0\t\t-2\n";
        let a = SwapAreas::parse(text);
        assert_eq!(a.paths, ["/dev/zram0", "/dev/ublkb0", "/swap file"]);
        assert_eq!(a.area(0), Some(0));
        assert_eq!(a.area(1), Some(1));
        assert_eq!(a.area(2), Some(2));
        // A special type, or one above a hole: no area.
        assert_eq!(a.area(3), None);
        assert_eq!(a.area(30), None);
        assert_eq!(
            SwapAreas::parse("Filename Type Size Used Priority\n").area(0),
            None
        );
    }

    #[test]
    fn maps_give_page_ranges() {
        let text = "55d0c8a00000-55d0c8a21000 r--p 00000000 fd:01 1234 /usr/bin/cat\n\
                    7ffc1b6e9000-7ffc1b70a000 rw-p 00000000 00:00 0 [stack]\n\
                    ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0 [vsyscall]\n\
                    garbage\n\
                    1000-1000 rw-p 0 0 0\n";
        assert_eq!(
            parse_maps(text),
            [
                0x55d0c8a00000..0x55d0c8a21000,
                0x7ffc1b6e9000..0x7ffc1b70a000,
                0xffffffffff600000..0xffffffffff601000
            ]
        );
    }

    #[test]
    fn status_and_cgroup_lines() {
        let status = "Name:\tpostgres\nUmask:\t0077\nVmSwap:\t    8192 kB\nThreads:\t1\n";
        assert_eq!(parse_status(status), (Some(2048), "postgres".into()));
        assert_eq!(parse_status("Name:\tkthreadd\n"), (None, "kthreadd".into()));
        let cg = "12:memory:/old\n0::/system.slice/db.service\n";
        assert_eq!(
            parse_cgroup(cg).as_deref(),
            Some("/system.slice/db.service")
        );
        assert_eq!(parse_cgroup("0::/\n").as_deref(), Some("/"));
        assert_eq!(parse_cgroup("4:cpu:/x\n"), None);
    }

    #[test]
    fn the_kernels_scan_finds_what_reading_everything_finds() {
        // 256 pages of this process pushed out (MADV_PAGEOUT, 5.4+): with
        // swap on, both ways find them (offsets are 0 without root); with
        // none, both find nothing.
        const PAGES: usize = 256;
        let len = PAGES * 4096;
        // SAFETY: a fresh private anonymous mapping, no address asked for.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        // SAFETY: `p` is the mapping of `len` bytes just made, ours alone.
        let bytes = unsafe { std::slice::from_raw_parts_mut(p.cast::<u8>(), len) };
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        // SAFETY: the same mapping; MADV_PAGEOUT only reclaims it.
        unsafe { libc::madvise(p, len, 21) };
        let pid = std::process::id();
        let mut a = Vec::new();
        let ca = Scanner::new().scan(pid, u64::MAX, |s| a.push(s)).unwrap();
        let mut b = Vec::new();
        let cb = Scanner::reading_all()
            .scan(pid, u64::MAX, |s| b.push(s))
            .unwrap();
        // SAFETY: unmapped once, nothing refers to it any more.
        unsafe { libc::munmap(p, len) };
        assert_eq!(a.len(), b.len(), "{ca:?} {cb:?}");
        assert_eq!(ca.swapped, cb.swapped);
        let on = std::fs::read_to_string("/proc/swaps").map_or(0, |t| t.lines().count());
        if on > 1 {
            assert!(ca.swapped >= PAGES as u64 / 2, "swap is on: {ca:?}");
            assert!(
                ca.entries < cb.entries,
                "the scan reads fewer: {ca:?} {cb:?}"
            );
        }
    }

    #[test]
    fn this_process_scans_without_root_and_sees_no_offsets() {
        // Reading every mapping reads entries.
        let mut s = Scanner::reading_all();
        let count = s.scan(std::process::id(), u64::MAX, |_| {}).unwrap();
        assert!(count.entries > 0, "{count:?}");
        // A process that does not exist has nothing.
        let none = s.scan(u32::MAX, u64::MAX, |_| {}).unwrap();
        assert_eq!(none, ScanCount::default());
    }
}
