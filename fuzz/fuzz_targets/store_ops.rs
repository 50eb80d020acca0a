//! Store operation sequences against a plain model (a Vec of pages).
//!
//! Any store shape (lz4/zstd/deflate, per-page/packed, any group size,
//! slab/heap, deferred or synchronous free, any huge threshold), then any
//! sequence of write / read / discard / write-zeroes / compact / mem-limit
//! changes / idle marking / recompression (per page, or into packed groups
//! in a packed store) over any range (page-aligned, sector-aligned, raw, out of
//! range) with any data. Checks:
//! - no panic;
//! - a request fails exactly when the model says its range is invalid
//!   (Misaligned before OutOfRange), or, for a write, with NoSpace while a
//!   mem_limit is set; every page of a failed write holds its old or its
//!   new content, never anything else;
//! - every successful read returns exactly the model's bytes;
//! - gauges: stored_pages == slots the model says hold something, <= pages
//!   (plus, at most, the empty slots a failed write gave a zero page to,
//!   which read the same stored or not);
//!   after discarding everything, once frees settle, stored_pages,
//!   same/huge pages, compr_data_size and mem_used_total are all 0.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use std::time::Duration;
use zblk::{Algo, Error, Recompress, RecompressType, Store, PAGE_SIZE};
use zblk_fuzz::{make_data, Fill, Setup};

const PAGE: u64 = PAGE_SIZE as u64;
/// Longest write or read the target builds a buffer for.
const MAX_BYTES: u64 = 80 * PAGE;

#[derive(Arbitrary, Debug)]
enum Range {
    /// Whole pages (may reach past the end).
    Pages { page: u8, n: u8 },
    /// 512-byte sectors (misaligned unless multiples of 8).
    Sectors { sector: u16, n: u16 },
    /// Any byte range at all.
    Raw { offset: u64, len: u32 },
    /// Near the end of the device, and around u64::MAX.
    End { back: u8, len: u8, wrap: bool },
}

impl Range {
    fn resolve(&self, size: u64) -> (u64, u64) {
        match *self {
            Range::Pages { page, n } => (u64::from(page) * PAGE, u64::from(n) * PAGE),
            Range::Sectors { sector, n } => (u64::from(sector) * 512, u64::from(n) * 512),
            Range::Raw { offset, len } => (offset, u64::from(len)),
            Range::End { back, len, wrap } => {
                let base = if wrap { u64::MAX - 4095 } else { size };
                (
                    base.wrapping_sub(u64::from(back) * PAGE),
                    u64::from(len) * PAGE,
                )
            }
        }
    }
}

#[derive(Arbitrary, Debug)]
enum Op {
    Write {
        at: Range,
        fills: Vec<Fill>,
    },
    Read {
        at: Range,
    },
    Discard {
        at: Range,
    },
    WriteZeroes {
        at: Range,
    },
    Compact,
    MaybeCompact,
    /// In KB; 0: no limit.
    SetMemLimit(u16),
    FlushFrees,
    CheckGauges,
    /// Marks every stored page idle.
    MarkIdle,
    /// Recompresses with the store's two secondaries (type by `kind` % 4, at most
    /// `max_pages` pages, 0: all; only objects of at least `threshold` * 16
    /// bytes).
    Recompress {
        kind: u8,
        max_pages: u8,
        threshold: u8,
    },
}

#[derive(Arbitrary, Debug)]
struct Input {
    setup: Setup,
    ops: Vec<Op>,
}

/// What the model says a request on (offset, len) must get.
fn validity(offset: u64, len: u64, size: u64) -> Result<(), &'static str> {
    if offset % PAGE != 0 || len % PAGE != 0 {
        return Err("misaligned");
    }
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err("out-of-range"),
    }
}

fn kind(e: &Error) -> &'static str {
    match e {
        Error::Misaligned { .. } => "misaligned",
        Error::OutOfRange { .. } => "out-of-range",
        Error::NoSpace { .. } => "no-space",
        Error::Corrupt { .. } => "corrupt",
        Error::InvalidConfig(_) => "invalid-config",
        Error::Codec(_) => "codec",
        Error::Backing(_) => "backing",
    }
}

struct Model {
    pages: Vec<Option<Vec<u8>>>,
    /// Empty slots a failed write may or may not have filled with a zero
    /// page: both read as zeros, only `stored_pages` tells them apart.
    unsure: Vec<bool>,
}

impl Model {
    /// Page `p` now holds `v` for certain.
    fn set(&mut self, p: usize, v: Option<Vec<u8>>) {
        self.pages[p] = v;
        self.unsure[p] = false;
    }
    fn content(&self, p: usize) -> Vec<u8> {
        self.pages[p].clone().unwrap_or_else(|| vec![0; PAGE_SIZE])
    }
    fn stored(&self) -> u64 {
        self.pages.iter().filter(|p| p.is_some()).count() as u64
    }
}

fn check_gauges(store: &Store, model: &Model) {
    let s = store.stats();
    let c = &s.counters;
    assert!(c.stored_pages <= model.pages.len() as u64, "{c:?}");
    let (sure, unsure) = (
        model.stored(),
        model.unsure.iter().filter(|u| **u).count() as u64,
    );
    assert!(
        (sure..=sure + unsure).contains(&c.stored_pages),
        "stored_pages {} vs model {sure} (+{unsure} unsure)",
        c.stored_pages
    );
    assert!(c.same_pages + c.huge_pages <= c.stored_pages, "{c:?}");
    assert!(
        c.recompressed_pages + c.same_pages <= c.stored_pages,
        "{c:?}"
    );
}

/// The two secondary algorithms, in priority order, a store of `primary`
/// recompresses with (the same two every time: a store has room for 3).
fn secondaries(primary: Algo) -> Vec<Algo> {
    [Algo::Lz4Hc(12), Algo::Zstd(3), Algo::Deflate(6)]
        .into_iter()
        .filter(|&a| a != primary)
        .take(2)
        .collect()
}

fuzz_target!(|input: Input| {
    let cfg = input.setup.config();
    let size = cfg.size;
    let npages = input.setup.page_count() as usize;
    let store = Store::new(cfg).expect("every Setup is a valid configuration");
    let mut ctx = store.new_ctx();
    let mut model = Model {
        pages: vec![None; npages],
        unsure: vec![false; npages],
    };
    let mut limit = 0u64;
    let mut salt = 0u64;
    for op in input.ops.iter().take(64) {
        match op {
            Op::Write { at, fills } => {
                let (offset, len) = at.resolve(size);
                let len = len.min(MAX_BYTES);
                salt += 1000;
                let data = make_data(fills, len as usize, salt);
                let want = validity(offset, len, size);
                match (ctx.write(offset, &data), want) {
                    (Ok(()), Ok(())) => {
                        let first = (offset / PAGE) as usize;
                        for (i, pg) in data.chunks(PAGE_SIZE).enumerate() {
                            model.set(first + i, Some(pg.to_vec()));
                        }
                    }
                    (Err(e @ Error::NoSpace { .. }), Ok(())) => {
                        assert!(limit != 0, "NoSpace with no mem_limit: {e}");
                        // Each page holds its old or its new content; the
                        // model takes what the store has.
                        let first = (offset / PAGE) as usize;
                        for (i, new) in data.chunks(PAGE_SIZE).enumerate() {
                            let p = first + i;
                            let mut buf = vec![0xA5u8; PAGE_SIZE];
                            ctx.read(p as u64 * PAGE, &mut buf)
                                .expect("read after a failed write");
                            let old = model.content(p);
                            if buf == new && buf == old && model.pages[p].is_none() {
                                // A zero page onto an empty slot: stored
                                // (same-filled) or not, it reads the same
                                // (a fuzzer input found the model counting
                                // it stored when its group had failed).
                                model.unsure[p] = true;
                            } else if buf == new {
                                model.set(p, Some(buf));
                            } else {
                                assert!(buf == old, "page {p}: neither old nor new after {e}");
                            }
                        }
                    }
                    (Err(e), Err(w)) => assert_eq!(kind(&e), w, "{e}"),
                    (got, want) => panic!("write {offset}+{len}: got {got:?}, model {want:?}"),
                }
            }
            Op::Read { at } => {
                let (offset, len) = at.resolve(size);
                let len = len.min(MAX_BYTES);
                let mut buf = vec![0xA5u8; len as usize];
                match (ctx.read(offset, &mut buf), validity(offset, len, size)) {
                    (Ok(()), Ok(())) => {
                        let first = (offset / PAGE) as usize;
                        for (i, got) in buf.chunks(PAGE_SIZE).enumerate() {
                            assert!(
                                got == model.content(first + i).as_slice(),
                                "page {} differs from the model",
                                first + i
                            );
                        }
                    }
                    (Err(e), Err(w)) => assert_eq!(kind(&e), w, "{e}"),
                    (got, want) => panic!("read {offset}+{len}: got {got:?}, model {want:?}"),
                }
            }
            Op::Discard { at } | Op::WriteZeroes { at } => {
                let (offset, len) = at.resolve(size);
                let r = if matches!(op, Op::Discard { .. }) {
                    ctx.discard(offset, len)
                } else {
                    ctx.write_zeroes(offset, len)
                };
                match (r, validity(offset, len, size)) {
                    (Ok(()), Ok(())) => {
                        let first = (offset / PAGE) as usize;
                        for p in first..first + (len / PAGE) as usize {
                            model.set(p, None);
                        }
                    }
                    (Err(e), Err(w)) => assert_eq!(kind(&e), w, "{e}"),
                    (got, want) => panic!("discard {offset}+{len}: got {got:?}, model {want:?}"),
                }
            }
            Op::Compact => {
                ctx.flush_frees();
                store.compact();
            }
            Op::MaybeCompact => {
                store.maybe_compact();
            }
            Op::SetMemLimit(kb) => {
                limit = u64::from(*kb) * 1024;
                store.set_mem_limit(limit);
            }
            Op::FlushFrees => ctx.flush_frees(),
            Op::CheckGauges => check_gauges(&store, &model),
            Op::MarkIdle => {
                store.mark_idle(None).expect("mark every page idle");
            }
            Op::Recompress {
                kind,
                max_pages,
                threshold,
            } => {
                let kind = [
                    RecompressType::All,
                    RecompressType::Idle,
                    RecompressType::Huge,
                    RecompressType::HugeIdle,
                ][usize::from(kind % 4)];
                let p = Recompress {
                    algos: secondaries(store.config().algo),
                    kind,
                    threshold: usize::from(*threshold) * 16,
                    max_pages: u64::from(*max_pages),
                    pages: Vec::new(),
                };
                // Pages that cannot be stored again (a mem_limit) keep what
                // they had: the reads after it check that.
                let r = store
                    .recompress(&p)
                    .expect("recompress with the two secondaries");
                assert!(r.recompressed <= r.tried, "{r:?}");
                assert!(p.max_pages == 0 || r.tried <= p.max_pages, "{r:?}");
            }
        }
    }
    // Every page, as the model has it.
    for p in 0..npages {
        let mut buf = vec![0xA5u8; PAGE_SIZE];
        ctx.read(p as u64 * PAGE, &mut buf).expect("final read");
        assert!(buf == model.content(p), "page {p} differs at the end");
    }
    check_gauges(&store, &model);
    // Discard everything: nothing may stay stored or charged.
    ctx.discard(0, size).expect("discard all");
    ctx.flush_frees();
    assert!(
        store.settle_frees(Duration::from_secs(10)),
        "frees never settled"
    );
    let s = store.stats();
    let c = &s.counters;
    assert_eq!(c.stored_pages, 0, "{c:?}");
    assert_eq!(c.same_pages, 0, "{c:?}");
    assert_eq!(c.huge_pages, 0, "{c:?}");
    assert_eq!(c.compr_data_size, 0, "{c:?}");
    assert_eq!(
        s.mem_used_total, 0,
        "memory left after discarding everything"
    );
});
