//! ublk I/O descriptors through the daemon's decoding and dispatch
//! (`zblk_ublk::io`): any op code, any flag bits, any start sector, any
//! length, any I/O buffer size, against a small store of any shape and a
//! plain model of its bytes. Checks: no panic; `handle_io` and `dispatch`
//! answer exactly what a model of the ublk contract says (bytes moved for
//! READ/WRITE, 0 for FLUSH/DISCARD/WRITE_ZEROES, -EOPNOTSUPP for unknown
//! ops, -EINVAL for a sector overflow, a request longer than the buffer, a
//! misaligned or out-of-range one); every successful READ returns the
//! model's bytes.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use zblk::{Store, PAGE_SIZE};
use zblk_fuzz::{fill_data, Fill, Setup};
use zblk_ublk::io::{dispatch, handle_io, IoDesc, RateLimit, Served};

#[derive(Arbitrary, Debug)]
enum Sector {
    Page(u8),
    Near(u16),
    Any(u64),
    Top(u8),
}

#[derive(Arbitrary, Debug)]
enum Len {
    Pages(u8),
    Sectors(u16),
    Any(u32),
}

#[derive(Arbitrary, Debug)]
struct Desc {
    /// Op code: n % 10 (0-5 are ublk's, the rest unknown) or any byte.
    op: u8,
    any_op: Option<u8>,
    flags: u32,
    sector: Sector,
    len: Len,
    fill: Fill,
    via_handle: bool,
}

#[derive(Arbitrary, Debug)]
struct Input {
    setup: Setup,
    /// I/O buffer: 1 + n % 32 pages.
    buf_pages: u8,
    descs: Vec<Desc>,
}

fn expected(op: u32, start: u64, nr: u32, size: u64, buf: usize) -> Result<i32, i32> {
    match op {
        2 => return Ok(0),
        0 | 1 | 3 | 5 => {}
        _ => return Err(-libc::EOPNOTSUPP),
    }
    let (off, len) = (u128::from(start) * 512, u128::from(nr) * 512);
    if off > u128::from(u64::MAX) {
        return Err(-libc::EINVAL);
    }
    if op <= 1 && len > buf as u128 {
        return Err(-libc::EINVAL);
    }
    if off % 4096 != 0 || len % 4096 != 0 || off + len > u128::from(size) {
        return Err(-libc::EINVAL);
    }
    Ok(if op <= 1 { len as i32 } else { 0 })
}

fuzz_target!(|input: Input| {
    let cfg = input.setup.config();
    let size = cfg.size;
    let sectors = size / 512;
    let store = Store::new(cfg).expect("valid setup");
    let mut ctx = store.new_ctx();
    let mut model = vec![0u8; size as usize];
    let buf_len = (1 + usize::from(input.buf_pages % 32)) * PAGE_SIZE;
    let mut buf = vec![0u8; buf_len];
    let mut log = RateLimit::new(std::time::Duration::from_secs(1), 2);
    for (i, d) in input.descs.iter().take(48).enumerate() {
        let op = u32::from(d.any_op.unwrap_or(d.op % 10));
        let start_sector = match d.sector {
            Sector::Page(p) => u64::from(p) * 8,
            Sector::Near(s) => u64::from(s) % (sectors + 64),
            Sector::Any(s) => s,
            Sector::Top(b) => u64::MAX - u64::from(b),
        };
        let nr_sectors = match d.len {
            Len::Pages(p) => u32::from(p) * 8,
            Len::Sectors(s) => u32::from(s),
            Len::Any(n) => n,
        };
        let iod = IoDesc {
            op_flags: op | (d.flags & 0xffff_ff00),
            nr_sectors,
            start_sector,
        };
        assert_eq!(iod.op(), op);
        if op == 1 {
            // The data the WRITE carries (at most the buffer), in place: the
            // same bytes as a whole buffer of `make_data` would start with.
            // Building the whole buffer for every write (up to 32 pages,
            // freshly allocated) was 30% of this target's time (perf);
            // the rest stays a sentinel, which the model never holds for
            // a written page, so a write taking more than its length shows.
            let n = (nr_sectors as usize).saturating_mul(512).min(buf_len);
            fill_data(std::slice::from_ref(&d.fill), &mut buf[..n], i as u64 * 64);
            buf[n..].fill(0xA5);
        } else {
            buf.fill(0xA5);
        }
        let want = expected(op, start_sector, nr_sectors, size, buf_len);
        // A store without a backing device never waits for a block.
        let done = |s: Served| match s {
            Served::Done(r) => r,
            Served::Wait(w) => panic!("a read waits for {w:?} with no backing device"),
        };
        let got = if d.via_handle {
            let r = done(handle_io(&mut ctx, &iod, &mut buf, &mut log));
            if r < 0 {
                Err(r)
            } else {
                Ok(r)
            }
        } else {
            dispatch(&mut ctx, &iod, &mut buf)
                .map(done)
                .map_err(|(errno, _)| errno)
        };
        assert_eq!(got, want, "{iod:?}");
        if want.is_err() || op == 2 {
            continue;
        }
        let off = (start_sector * 512) as usize;
        let len = nr_sectors as usize * 512;
        match op {
            0 => assert!(buf[..len] == model[off..off + len], "read {iod:?}"),
            1 => model[off..off + len].copy_from_slice(&buf[..len]),
            _ => model[off..off + len].fill(0),
        }
    }
    let mut all = vec![0u8; size as usize];
    ctx.read(0, &mut all).expect("final read");
    assert!(all == model, "store differs from the model at the end");
    // Dropping a heap-allocator store with pages in it leaks them (see
    // fuzz/README.md, "Found"): empty it first.
    ctx.discard(0, size).expect("discard all");
});
