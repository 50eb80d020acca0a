//! Request decoding and dispatch: one ublk I/O descriptor in, one result
//! out, or a read waiting for a block of the backing store
//! ([`Served::Wait`]), which the queue reads through its ring and hands to
//! [`resume`].
//!
//! Everything here is pure (no kernel, no io_uring), so that tests can feed
//! synthetic descriptors (every op, bad ranges, the garbage start sector of
//! a FLUSH) and check both the result code and what the store holds.

use libublk::sys::{
    UBLK_IO_OP_DISCARD, UBLK_IO_OP_FLUSH, UBLK_IO_OP_READ, UBLK_IO_OP_WRITE,
    UBLK_IO_OP_WRITE_ZEROES,
};
use std::time::{Duration, Instant};
use zblk::{BackingWait, Error, QueueCtx, ReadStep};

/// Sector size of ublk descriptors (always 512 bytes, whatever the
/// device's logical block size).
const SECTOR_SHIFT: u32 = 9;

/// The fields of a ublk I/O descriptor (`struct ublksrv_io_desc`) that
/// decide what a request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoDesc {
    /// Operation in the low 8 bits, `UBLK_IO_F_*` flags above.
    pub op_flags: u32,
    /// Length in 512-byte sectors.
    pub nr_sectors: u32,
    /// First 512-byte sector.
    pub start_sector: u64,
}

impl IoDesc {
    /// The operation code (`op_flags & 0xff`), a `libublk::sys::UBLK_IO_OP_*`.
    pub fn op(&self) -> u32 {
        self.op_flags & 0xff
    }

    /// The byte range of the request, or `None` when the start sector is so
    /// large that its byte offset does not fit in 64 bits.
    fn byte_range(&self) -> Option<(u64, u64)> {
        let offset = self.start_sector.checked_mul(1 << SECTOR_SHIFT)?;
        let len = u64::from(self.nr_sectors) << SECTOR_SHIFT;
        Some((offset, len))
    }
}

impl From<&libublk::sys::ublksrv_io_desc> for IoDesc {
    fn from(d: &libublk::sys::ublksrv_io_desc) -> Self {
        IoDesc {
            op_flags: d.op_flags,
            nr_sectors: d.nr_sectors,
            start_sector: d.start_sector,
        }
    }
}

/// Why a request failed, for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IoFailure {
    /// The engine refused or failed the operation.
    Engine(Error),
    /// The start sector overflows a 64-bit byte offset.
    SectorOverflow,
    /// The request is longer than the I/O buffer (the kernel never sends
    /// one; refused rather than trusted).
    TooLong {
        /// Bytes the request covers.
        len: u64,
        /// Bytes of I/O buffer.
        buf: usize,
    },
    /// An operation zblk does not advertise.
    Unsupported(u32),
}

impl std::fmt::Display for IoFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IoFailure::Engine(e) => write!(f, "{e}"),
            IoFailure::SectorOverflow => write!(f, "start sector overflows the byte offset"),
            IoFailure::TooLong { len, buf } => {
                write!(
                    f,
                    "request of {len} bytes exceeds the {buf}-byte I/O buffer"
                )
            }
            IoFailure::Unsupported(op) => write!(f, "unsupported operation {op}"),
        }
    }
}

/// What became of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// Its ublk result: bytes transferred for READ and WRITE, 0 for
    /// FLUSH, DISCARD and WRITE_ZEROES, or a negative errno.
    Done(i32),
    /// A read waiting for this block of the backing store: read it, then
    /// [`resume`] the request with it.
    Wait(BackingWait),
}

/// The result of a request or its failure: a negative errno and its cause.
pub type Outcome = Result<Served, (i32, IoFailure)>;

/// Executes one request against the queue's context.
///
/// READ and WRITE move data through `buf` (the tag's I/O buffer). A READ
/// of a written-back page stops there as [`Served::Wait`].
pub fn dispatch(ctx: &mut QueueCtx, iod: &IoDesc, buf: &mut [u8]) -> Outcome {
    let op = iod.op();
    // FLUSH carries a meaningless start sector: answer before decoding it.
    // Every write is in memory the moment it completes, so there is
    // nothing to flush.
    if op == UBLK_IO_OP_FLUSH {
        return Ok(Served::Done(0));
    }
    if !matches!(
        op,
        UBLK_IO_OP_READ | UBLK_IO_OP_WRITE | UBLK_IO_OP_DISCARD | UBLK_IO_OP_WRITE_ZEROES
    ) {
        return Err((-libc::EOPNOTSUPP, IoFailure::Unsupported(op)));
    }
    let Some((offset, len)) = iod.byte_range() else {
        return Err((-libc::EINVAL, IoFailure::SectorOverflow));
    };
    match op {
        UBLK_IO_OP_READ => {
            let data = data_of(buf, len)?;
            read_step(ctx.read_begin(offset, data), len)
        }
        UBLK_IO_OP_WRITE => {
            let data = data_of(buf, len)?;
            engine(ctx.write(offset, data))?;
            Ok(Served::Done(done_len(len)))
        }
        UBLK_IO_OP_DISCARD => engine(ctx.discard(offset, len)).map(|()| Served::Done(0)),
        _ => engine(ctx.write_zeroes(offset, len)).map(|()| Served::Done(0)),
    }
}

/// The blocks a waiting READ goes on with.
#[derive(Debug)]
pub enum Blocks<'b> {
    /// Read through the ring: their bytes, or why they could not be read.
    Landed(std::io::Result<&'b [u8]>),
    /// Not read: read them here, on this thread (no buffer was free to
    /// read them through the ring).
    ReadHere,
}

/// Goes on with the READ `iod` that waited for the blocks of `w`, with
/// `blocks`.
pub fn resume(
    ctx: &mut QueueCtx,
    iod: &IoDesc,
    buf: &mut [u8],
    w: BackingWait,
    blocks: Blocks<'_>,
) -> Outcome {
    let Some((_, len)) = iod.byte_range() else {
        return Err((-libc::EINVAL, IoFailure::SectorOverflow));
    };
    let data = data_of(buf, len)?;
    let step = match blocks {
        Blocks::Landed(bytes) => ctx.read_resume(w, data, bytes),
        Blocks::ReadHere => ctx.read_here(w, data),
    };
    read_step(step, len)
}

/// The first `len` bytes of `buf`, the request's data.
fn data_of(buf: &mut [u8], len: u64) -> Result<&mut [u8], (i32, IoFailure)> {
    match usize::try_from(len) {
        Ok(n) if n <= buf.len() => Ok(&mut buf[..n]),
        _ => {
            let buf = buf.len();
            Err((-libc::EINVAL, IoFailure::TooLong { len, buf }))
        }
    }
}

/// A READ's [`Served`], from where the engine says it stands.
fn read_step(r: zblk::Result<ReadStep>, len: u64) -> Outcome {
    match engine(r)? {
        ReadStep::Done => Ok(Served::Done(done_len(len))),
        ReadStep::Wait(w) => Ok(Served::Wait(w)),
    }
}

/// The engine's failure as an errno and its cause.
fn engine<T>(r: zblk::Result<T>) -> Result<T, (i32, IoFailure)> {
    r.map_err(|e| (e.errno(), IoFailure::Engine(e)))
}

/// The result of a READ or WRITE of `len` bytes: `len` <= the I/O
/// buffer <= the 32 MB ublk maximum, so it fits an i32.
fn done_len(len: u64) -> i32 {
    i32::try_from(len).unwrap_or(i32::MAX)
}

/// [`dispatch`], with failures logged through `log` (rate-limited):
/// the function a queue calls for every request.
pub fn handle_io(ctx: &mut QueueCtx, iod: &IoDesc, buf: &mut [u8], log: &mut RateLimit) -> Served {
    let r = dispatch(ctx, iod, buf);
    logged(ctx, iod, r, log)
}

/// [`resume`], with failures logged as [`handle_io`] logs them.
pub fn handle_resume(
    ctx: &mut QueueCtx,
    iod: &IoDesc,
    buf: &mut [u8],
    (w, blocks): (BackingWait, Blocks<'_>),
    log: &mut RateLimit,
) -> Served {
    let r = resume(ctx, iod, buf, w, blocks);
    logged(ctx, iod, r, log)
}

/// `r`, its failure logged (rate-limited) and answered with its errno.
fn logged(ctx: &QueueCtx, iod: &IoDesc, r: Outcome, log: &mut RateLimit) -> Served {
    match r {
        Ok(s) => s,
        Err((errno, why)) => {
            if log.allow(Instant::now()) {
                log::error!(
                    "queue {}: op {} sectors {}+{} failed with errno {}: {why}",
                    ctx.id(),
                    iod.op(),
                    iod.start_sector,
                    iod.nr_sectors,
                    -errno
                );
            }
            Served::Done(errno)
        }
    }
}

/// A log rate limiter like the kernel's `printk_ratelimit`: at most `burst`
/// messages per `interval`; says how many it swallowed when it opens again.
#[derive(Debug, Clone)]
pub struct RateLimit {
    interval: Duration,
    burst: u32,
    window_start: Option<Instant>,
    used: u32,
    suppressed: u64,
}

impl Default for RateLimit {
    /// Ten messages per five seconds, as the kernel's default.
    fn default() -> Self {
        RateLimit::new(Duration::from_secs(5), 10)
    }
}

impl RateLimit {
    /// At most `burst` messages per `interval`.
    pub fn new(interval: Duration, burst: u32) -> Self {
        RateLimit {
            interval,
            burst,
            window_start: None,
            used: 0,
            suppressed: 0,
        }
    }

    /// Whether a message may be logged at `now`.
    pub fn allow(&mut self, now: Instant) -> bool {
        let expired = match self.window_start {
            None => true,
            Some(t) => now.saturating_duration_since(t) >= self.interval,
        };
        if expired {
            if self.suppressed > 0 {
                log::warn!("{} similar messages suppressed", self.suppressed);
            }
            self.window_start = Some(now);
            self.used = 0;
            self.suppressed = 0;
        }
        if self.used < self.burst {
            self.used += 1;
            true
        } else {
            self.suppressed += 1;
            false
        }
    }

    /// Messages swallowed in the current window.
    pub fn suppressed(&self) -> u64 {
        self.suppressed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use libublk::sys::UBLK_IO_OP_WRITE_SAME;
    use std::sync::Arc;
    use zblk::{Store, StoreConfig, PAGE_SIZE};

    const DEV: u64 = 64 * PAGE_SIZE as u64;
    const SPP: u32 = (PAGE_SIZE >> 9) as u32; // sectors per page

    fn store() -> Arc<Store> {
        Store::new(StoreConfig::new(DEV)).unwrap()
    }

    fn iod(op: u32, start_sector: u64, nr_sectors: u32) -> IoDesc {
        IoDesc {
            op_flags: op,
            nr_sectors,
            start_sector,
        }
    }

    fn page(seed: u8) -> Vec<u8> {
        (0..PAGE_SIZE)
            .map(|i| (i as u8).wrapping_mul(seed) ^ seed)
            .collect()
    }

    fn read_back(ctx: &mut QueueCtx, page_no: u64, pages: usize) -> Vec<u8> {
        let mut out = vec![0xAAu8; pages * PAGE_SIZE];
        ctx.read(page_no * PAGE_SIZE as u64, &mut out).unwrap();
        out
    }

    #[test]
    fn write_then_read_moves_bytes_and_returns_length() {
        let s = store();
        let mut ctx = s.new_ctx();
        let mut log = RateLimit::default();
        let mut buf = vec![0u8; 8 * PAGE_SIZE];
        buf[..PAGE_SIZE].copy_from_slice(&page(3));
        buf[PAGE_SIZE..2 * PAGE_SIZE].copy_from_slice(&page(7));
        let w = iod(UBLK_IO_OP_WRITE, 5 * u64::from(SPP), 2 * SPP);
        assert_eq!(
            handle_io(&mut ctx, &w, &mut buf, &mut log),
            Served::Done(2 * PAGE_SIZE as i32)
        );
        assert_eq!(read_back(&mut ctx, 5, 1), page(3));
        assert_eq!(read_back(&mut ctx, 6, 1), page(7));

        let mut rbuf = vec![0x55u8; 8 * PAGE_SIZE];
        let r = iod(UBLK_IO_OP_READ, 5 * u64::from(SPP), 2 * SPP);
        assert_eq!(
            handle_io(&mut ctx, &r, &mut rbuf, &mut log),
            Served::Done(2 * PAGE_SIZE as i32)
        );
        assert_eq!(&rbuf[..PAGE_SIZE], &page(3)[..]);
        assert_eq!(&rbuf[PAGE_SIZE..2 * PAGE_SIZE], &page(7)[..]);
        // Bytes past the request are not touched.
        assert!(rbuf[2 * PAGE_SIZE..].iter().all(|&b| b == 0x55));
    }

    #[test]
    fn packed_mode_serves_the_same_requests() {
        let mut cfg = StoreConfig::new(DEV);
        cfg.mode = zblk::Mode::Packed;
        let s = Store::new(cfg).unwrap();
        let mut ctx = s.new_ctx();
        let mut buf: Vec<u8> = (0..8u8).flat_map(page).collect();
        let w = iod(UBLK_IO_OP_WRITE, 8 * u64::from(SPP), 8 * SPP);
        assert_eq!(
            dispatch(&mut ctx, &w, &mut buf),
            Ok(Served::Done(8 * PAGE_SIZE as i32))
        );
        let d = iod(UBLK_IO_OP_DISCARD, 10 * u64::from(SPP), SPP);
        assert_eq!(dispatch(&mut ctx, &d, &mut []), Ok(Served::Done(0)));
        let mut rbuf = vec![0x77u8; 8 * PAGE_SIZE];
        let r = iod(UBLK_IO_OP_READ, 8 * u64::from(SPP), 8 * SPP);
        assert_eq!(
            dispatch(&mut ctx, &r, &mut rbuf),
            Ok(Served::Done(8 * PAGE_SIZE as i32))
        );
        for (i, got) in rbuf.chunks(PAGE_SIZE).enumerate() {
            let want = if i == 2 {
                vec![0u8; PAGE_SIZE]
            } else {
                page(i as u8)
            };
            assert_eq!(got, &want[..], "page {i}");
        }
    }

    #[test]
    fn flags_above_the_op_byte_are_ignored() {
        let s = store();
        let mut ctx = s.new_ctx();
        let mut buf = page(9);
        let mut w = iod(UBLK_IO_OP_WRITE, 0, SPP);
        w.op_flags |= libublk::sys::UBLK_IO_F_SWAP | libublk::sys::UBLK_IO_F_FUA;
        assert_eq!(
            dispatch(&mut ctx, &w, &mut buf),
            Ok(Served::Done(PAGE_SIZE as i32))
        );
        assert_eq!(read_back(&mut ctx, 0, 1), page(9));
    }

    #[test]
    fn flush_answers_zero_whatever_its_sector() {
        let s = store();
        let mut ctx = s.new_ctx();
        let mut buf = vec![0u8; PAGE_SIZE];
        for start in [0, u64::MAX, u64::MAX - 7, 1 << 60, DEV] {
            for n in [0, 1, u32::MAX] {
                assert_eq!(
                    dispatch(&mut ctx, &iod(UBLK_IO_OP_FLUSH, start, n), &mut buf),
                    Ok(Served::Done(0))
                );
            }
        }
        assert_eq!(s.stats().counters.invalid_io, 0, "flush is not invalid I/O");
    }

    #[test]
    fn discard_and_write_zeroes_free_pages() {
        let s = store();
        let mut ctx = s.new_ctx();
        let mut buf = vec![0u8; 4 * PAGE_SIZE];
        for (i, c) in buf.chunks_mut(PAGE_SIZE).enumerate() {
            c.copy_from_slice(&page(i as u8 + 11));
        }
        assert_eq!(
            dispatch(&mut ctx, &iod(UBLK_IO_OP_WRITE, 0, 4 * SPP), &mut buf),
            Ok(Served::Done(4 * PAGE_SIZE as i32))
        );
        assert_eq!(s.stats().counters.stored_pages, 4);

        let mut empty: [u8; 0] = [];
        assert_eq!(
            dispatch(&mut ctx, &iod(UBLK_IO_OP_DISCARD, 0, SPP), &mut empty),
            Ok(Served::Done(0))
        );
        let mut wz = iod(UBLK_IO_OP_WRITE_ZEROES, 2 * u64::from(SPP), SPP);
        wz.op_flags |= libublk::sys::UBLK_IO_F_NOUNMAP;
        assert_eq!(dispatch(&mut ctx, &wz, &mut empty), Ok(Served::Done(0)));

        assert_eq!(read_back(&mut ctx, 0, 1), vec![0u8; PAGE_SIZE]);
        assert_eq!(read_back(&mut ctx, 1, 1), page(12));
        assert_eq!(read_back(&mut ctx, 2, 1), vec![0u8; PAGE_SIZE]);
        assert_eq!(read_back(&mut ctx, 3, 1), page(14));
        let st = s.stats();
        assert_eq!(st.counters.stored_pages, 2);
        assert_eq!(st.counters.notify_free, 2);
    }

    #[test]
    fn discard_of_the_whole_device_uses_no_buffer() {
        let s = store();
        let mut ctx = s.new_ctx();
        let mut buf = page(1);
        dispatch(
            &mut ctx,
            &iod(UBLK_IO_OP_WRITE, 63 * u64::from(SPP), SPP),
            &mut buf,
        )
        .unwrap();
        let all = (DEV >> 9) as u32;
        assert_eq!(
            dispatch(&mut ctx, &iod(UBLK_IO_OP_DISCARD, 0, all), &mut []),
            Ok(Served::Done(0))
        );
        assert_eq!(s.stats().counters.stored_pages, 0);
    }

    #[test]
    fn out_of_range_requests_fail_with_einval_and_change_nothing() {
        let s = store();
        let mut ctx = s.new_ctx();
        let mut buf = page(5);
        dispatch(
            &mut ctx,
            &iod(UBLK_IO_OP_WRITE, 63 * u64::from(SPP), SPP),
            &mut buf,
        )
        .unwrap();
        let mut other = page(6);
        let last = 63 * u64::from(SPP);
        let cases = [
            iod(UBLK_IO_OP_WRITE, last, 2 * SPP),        // runs past the end
            iod(UBLK_IO_OP_WRITE, DEV >> 9, SPP),        // starts at the end
            iod(UBLK_IO_OP_READ, u64::MAX >> 9, SPP),    // offset + len overflows
            iod(UBLK_IO_OP_DISCARD, last, 2 * SPP),      // discard past the end
            iod(UBLK_IO_OP_WRITE_ZEROES, DEV >> 9, SPP), // write-zeroes past the end
            iod(UBLK_IO_OP_WRITE, 1, SPP),               // not 4 KB aligned
            iod(UBLK_IO_OP_READ, 0, 1),                  // 512 bytes
        ];
        for c in cases {
            assert_eq!(
                dispatch(&mut ctx, &c, &mut other).map_err(|e| e.0),
                Err(-libc::EINVAL),
                "{c:?}"
            );
        }
        assert_eq!(read_back(&mut ctx, 63, 1), page(5));
        assert_eq!(s.stats().counters.stored_pages, 1);
        assert!(s.stats().counters.invalid_io >= 6);
    }

    #[test]
    fn sector_overflow_is_einval_not_a_panic() {
        let s = store();
        let mut ctx = s.new_ctx();
        let mut buf = page(1);
        for op in [
            UBLK_IO_OP_READ,
            UBLK_IO_OP_WRITE,
            UBLK_IO_OP_DISCARD,
            UBLK_IO_OP_WRITE_ZEROES,
        ] {
            let r = dispatch(&mut ctx, &iod(op, u64::MAX, SPP), &mut buf);
            assert_eq!(
                r,
                Err((-libc::EINVAL, IoFailure::SectorOverflow)),
                "op {op}"
            );
        }
    }

    #[test]
    fn request_longer_than_the_buffer_is_refused() {
        let s = store();
        let mut ctx = s.new_ctx();
        let mut buf = vec![0u8; PAGE_SIZE];
        let r = dispatch(&mut ctx, &iod(UBLK_IO_OP_WRITE, 0, 2 * SPP), &mut buf);
        assert!(matches!(r, Err((e, IoFailure::TooLong { .. })) if e == -libc::EINVAL));
        assert_eq!(s.stats().counters.stored_pages, 0);
    }

    #[test]
    fn unknown_operations_are_eopnotsupp() {
        let s = store();
        let mut ctx = s.new_ctx();
        let mut buf = page(2);
        for op in [UBLK_IO_OP_WRITE_SAME, 6, 10, 13, 15, 18, 0x22, 0xff] {
            let r = dispatch(&mut ctx, &iod(op, 0, SPP), &mut buf);
            assert_eq!(r, Err((-libc::EOPNOTSUPP, IoFailure::Unsupported(op))));
        }
        assert_eq!(s.stats().counters.stored_pages, 0);
    }

    #[test]
    fn mem_limit_turns_into_enospc_and_keeps_old_content() {
        let mut cfg = StoreConfig::new(DEV);
        cfg.mem_limit = 1; // one byte: no compressed object fits
        let s = Store::new(cfg).unwrap();
        let mut ctx = s.new_ctx();
        let mut buf = page(8);
        let r = dispatch(&mut ctx, &iod(UBLK_IO_OP_WRITE, 0, SPP), &mut buf);
        assert_eq!(r.map_err(|e| e.0), Err(-libc::ENOSPC));
        assert_eq!(read_back(&mut ctx, 0, 1), vec![0u8; PAGE_SIZE]);
        // Same-filled pages need no memory and still succeed.
        let mut zeros = vec![0u8; PAGE_SIZE];
        assert_eq!(
            dispatch(&mut ctx, &iod(UBLK_IO_OP_WRITE, 0, SPP), &mut zeros),
            Ok(Served::Done(PAGE_SIZE as i32))
        );
    }

    #[test]
    fn handle_io_returns_the_errno_and_rate_limits_the_log() {
        let s = store();
        let mut ctx = s.new_ctx();
        let mut buf = page(2);
        let mut log = RateLimit::new(Duration::from_secs(3600), 3);
        for _ in 0..10 {
            assert_eq!(
                handle_io(
                    &mut ctx,
                    &iod(UBLK_IO_OP_WRITE, DEV >> 9, SPP),
                    &mut buf,
                    &mut log
                ),
                Served::Done(-libc::EINVAL)
            );
        }
        assert_eq!(log.suppressed(), 7);
    }

    #[test]
    fn a_read_of_written_back_pages_waits_for_each_block_then_resumes() {
        use std::os::unix::fs::FileExt;
        let data: Vec<u8> = (1..3u8).flat_map(page).collect();
        let wb = crate::testing::WrittenBack::new(DEV, zblk::Mode::PerPage, &data);
        assert_eq!(wb.written, 2);
        let (s, mut ctx) = (&wb.store, wb.store.new_ctx());
        let file = std::fs::File::open(&wb.file).unwrap();
        let block = |w: &BackingWait| {
            let mut b = vec![0u8; w.bytes()];
            file.read_exact_at(&mut b, w.offset()).unwrap();
            b
        };
        let r = iod(UBLK_IO_OP_READ, 0, 2 * SPP);
        let mut buf = vec![0u8; 4 * PAGE_SIZE];
        let mut served = dispatch(&mut ctx, &r, &mut buf).unwrap();
        let mut waits = 0;
        while let Served::Wait(w) = served {
            waits += 1;
            served = resume(&mut ctx, &r, &mut buf, w, Blocks::Landed(Ok(&block(&w)))).unwrap();
        }
        assert_eq!((served, waits), (Served::Done(2 * PAGE_SIZE as i32), 2));
        assert_eq!(&buf[..2 * PAGE_SIZE], &data[..]);
        // A block that cannot be read fails that request with EIO.
        let mut log = RateLimit::default();
        let Served::Wait(w) = handle_io(&mut ctx, &r, &mut buf, &mut log) else {
            panic!("the read did not wait for its block");
        };
        let dead = Err(std::io::Error::from_raw_os_error(libc::ENOTCONN));
        let served = handle_resume(&mut ctx, &r, &mut buf, (w, Blocks::Landed(dead)), &mut log);
        assert_eq!(served, Served::Done(-libc::EIO));
        assert_eq!(s.stats().counters.failed_reads, 1);
    }

    #[test]
    fn a_read_of_written_back_groups_waits_once_a_group_or_reads_here() {
        use std::os::unix::fs::FileExt;
        let data = crate::testing::noisy_pages(16);
        let wb = crate::testing::WrittenBack::new(DEV, zblk::Mode::Packed, &data);
        assert_eq!(wb.written, 16);
        let s = &wb.store;
        let file = std::fs::File::open(&wb.file).unwrap();
        let r = iod(UBLK_IO_OP_READ, 0, 16 * SPP);
        // Through the caller's own reads: one wait a group, for its run.
        let (mut ctx, mut buf) = (s.new_ctx(), vec![0u8; 16 * PAGE_SIZE]);
        let mut served = dispatch(&mut ctx, &r, &mut buf).unwrap();
        let mut runs = Vec::new();
        while let Served::Wait(w) = served {
            let mut b = vec![0u8; w.bytes()];
            file.read_exact_at(&mut b, w.offset()).unwrap();
            runs.push(w.bytes());
            served = resume(&mut ctx, &r, &mut buf, w, Blocks::Landed(Ok(&b))).unwrap();
        }
        assert_eq!(served, Served::Done(16 * PAGE_SIZE as i32));
        assert_eq!(runs.len(), 2, "one read a group: {runs:?}");
        assert!(runs
            .iter()
            .all(|&n| n > PAGE_SIZE && n <= s.backing_read_bytes()));
        assert_eq!(buf, data);
        // Read on this thread instead (no buffer free): the same pages.
        let (mut ctx, mut buf) = (s.new_ctx(), vec![0u8; 16 * PAGE_SIZE]);
        let mut served = dispatch(&mut ctx, &r, &mut buf).unwrap();
        let mut here = 0;
        while let Served::Wait(w) = served {
            here += 1;
            served = resume(&mut ctx, &r, &mut buf, w, Blocks::ReadHere).unwrap();
        }
        assert_eq!((served, here), (Served::Done(16 * PAGE_SIZE as i32), 2));
        assert_eq!(buf, data);
        assert_eq!(s.stats().counters.failed_reads, 0);
    }

    #[test]
    fn rate_limit_opens_again_after_the_interval() {
        let mut rl = RateLimit::new(Duration::from_secs(5), 2);
        let t0 = Instant::now();
        assert!(rl.allow(t0));
        assert!(rl.allow(t0));
        assert!(!rl.allow(t0 + Duration::from_secs(1)));
        assert!(rl.allow(t0 + Duration::from_secs(6)));
        assert_eq!(rl.suppressed(), 0);
    }
}
