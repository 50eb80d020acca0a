//! Corrupted stored objects: every codec's decoder on arbitrary bytes, and
//! a store whose objects (per-page compressed, huge, packed header fields
//! and blobs) get arbitrary bytes overwritten while stored.
//!
//! The store runs over a spy allocator (the public `ObjAllocator` trait
//! around `HeapAllocator`) that knows every live object, its size and its
//! owner slot, so the fuzzer can change any byte of any object but a packed
//! object's live mask (that word is the allocator's bookkeeping, not data a
//! read decodes). Every data page carries a stamp (its page number and a
//! generation), so a page handed out for another is recognised. Checks:
//! - no panic, no out-of-bounds access (the sanitizer);
//! - a page whose object was not touched reads back exactly;
//! - a page whose object was touched reads as an error (EIO, buffer
//!   zeroed), as its old content (a packed group the read cache still
//!   holds), or as exactly what its own object's bytes decode to now: the
//!   harness decodes every object itself, with the store's codec, where
//!   the object said the page was before any byte changed (zram has no
//!   checksums: a flipped literal reads back flipped, even one that makes
//!   the page another page's twin, but a read never goes through another
//!   object, another position of its group, or a cache entry a corrupted
//!   header names);
//! - compaction over corrupt groups does not crash; overwriting every page
//!   afterwards (a touched object's pages with new text, the others with
//!   same-filled words) gives a clean store, and discarding it frees every
//!   byte.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use zblk::alloc::{AllocError, Handle, HeapAllocator, MemAccount, ObjAllocator};
use zblk::codec::Codec;
use zblk::{Algo, Error, Store, PAGE_SIZE};
use zblk_fuzz::{Fill, Setup};

const PAGE: u64 = PAGE_SIZE as u64;

/// Live objects of the spy: handle -> (size, owner slot).
type Objects = Arc<Mutex<BTreeMap<Handle, (u32, u64)>>>;

struct Spy {
    inner: HeapAllocator,
    objects: Objects,
}

impl ObjAllocator for Spy {
    fn alloc_bulk(
        &self,
        sizes: &[u32],
        owners: &[u64],
        out: &mut Vec<Handle>,
    ) -> Result<(), AllocError> {
        let at = out.len();
        self.inner.alloc_bulk(sizes, owners, out)?;
        let mut m = self.objects.lock().unwrap();
        for (i, &h) in out[at..].iter().enumerate() {
            m.insert(h, (sizes[i], owners[i]));
        }
        Ok(())
    }
    fn free_bulk(&self, handles: &[Handle]) {
        {
            let mut m = self.objects.lock().unwrap();
            for h in handles {
                assert!(m.remove(h).is_some(), "free of an unknown handle {h:#x}");
            }
        }
        self.inner.free_bulk(handles);
    }
    unsafe fn object_ptr(&self, h: Handle, len: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.inner.object_ptr(h, len) }
    }
    fn mem(&self) -> &MemAccount {
        self.inner.mem()
    }
}

#[derive(Arbitrary, Debug)]
struct Write {
    page: u8,
    n: u8,
    fills: Vec<Fill>,
}

#[derive(Arbitrary, Debug)]
struct Corruption {
    object: u16,
    at: u16,
    byte: u8,
    xor: bool,
}

#[derive(Arbitrary, Debug)]
struct Decode {
    algo: u8,
    /// Output length: n % 9 pages, or odd sizes.
    out: u16,
    bytes: Vec<u8>,
    /// Or a real compressed page with these flips.
    real: Option<(Fill, Vec<(u16, u8)>)>,
}

#[derive(Arbitrary, Debug)]
struct Input {
    decode: Vec<Decode>,
    setup: Setup,
    writes: Vec<Write>,
    /// Read everything first (fills the packed read cache).
    warm: bool,
    corruptions: Vec<Corruption>,
    compact: bool,
}

fn codec(sel: u8) -> Box<dyn Codec> {
    match sel % 5 {
        0 => Algo::Lz4,
        1 => Algo::Zstd(1),
        2 => Algo::Zstd(3),
        3 => Algo::Deflate(1),
        _ => Algo::DeflateIaa,
    }
    .new_codec()
}

fn decode_checks(d: &Decode) {
    let mut c = codec(d.algo);
    let out_len = if d.out & 0x8000 != 0 {
        usize::from(d.out & 0x7fff)
    } else {
        usize::from(d.out % 9) * PAGE_SIZE
    };
    let mut out = vec![0u8; out_len];
    let _ = c.decompress(&d.bytes, &mut out);
    if let Some((fill, flips)) = &d.real {
        let mut page = vec![0u8; PAGE_SIZE];
        fill.fill(&mut page, 7);
        let mut z = vec![0u8; 2 * PAGE_SIZE];
        if let Ok(Some(n)) = c.compress(&page, &mut z) {
            let mut back = vec![0u8; PAGE_SIZE];
            c.decompress(&z[..n], &mut back)
                .expect("an intact page decodes");
            assert!(back == page, "round trip");
            for &(at, x) in flips.iter().take(8) {
                z[usize::from(at) % n] ^= x;
            }
            let _ = c.decompress(&z[..n], &mut back);
            // Shorter and longer inputs, and a wrong output size.
            let _ = c.decompress(&z[..n / 2], &mut back);
            let _ = c.decompress(&z[..n + 1], &mut back);
            let _ = c.decompress(&z[..n], &mut back[..PAGE_SIZE / 2]);
        }
    }
}

/// A data page: the fill with its page number and generation stamped in
/// front (zeros and same-filled words stay as they are: no object).
fn page_content(fill: &Fill, page: u64, generation: u64) -> Vec<u8> {
    let mut p = vec![0u8; PAGE_SIZE];
    fill.fill(&mut p, page ^ (generation << 20));
    if !matches!(fill, Fill::Zeros | Fill::Word(_)) {
        p[..8].copy_from_slice(&(page | 0x5a00_0000_0000_0000).to_le_bytes());
        p[8..16].copy_from_slice(&(generation | 0xa500_0000_0000_0000).to_le_bytes());
    }
    p
}

/// How a live object holds its pages, learnt before any byte changes.
#[derive(Clone, Copy)]
enum Holds {
    /// One page, raw (huge).
    Raw,
    /// One page, compressed.
    Compressed,
    /// A packed group: offsets `orig` from page `base` in the blob, in
    /// order.
    Packed { orig: u64, base: u64 },
}

/// What `bytes` (an object holding `holds`) decodes to, as the store would
/// decode it: its page, or a packed group's pages in blob order; `None` if
/// it does not decode. Decoded once per object, not once per page of a
/// group (a group of 64 pages was decoded 64 times).
fn decode_object(holds: Holds, bytes: &[u8], codec: &mut dyn Codec) -> Option<Vec<u8>> {
    match holds {
        Holds::Raw => Some(bytes.to_vec()),
        Holds::Compressed => {
            let mut out = vec![0u8; PAGE_SIZE];
            codec.decompress(bytes, &mut out).ok().map(|_| out)
        }
        Holds::Packed { orig, .. } => {
            let mut out = vec![0u8; orig.count_ones() as usize * PAGE_SIZE];
            let blob = bytes.get(zblk::testing::PACK_HEADER..)?;
            codec.decompress(blob, &mut out).ok().map(|_| out)
        }
    }
}

/// Page `page`'s bytes in `decoded`, what [`decode_object`] gave for an
/// object holding `holds`.
fn page_in(holds: Holds, decoded: &[u8], page: u64) -> &[u8] {
    match holds {
        Holds::Raw | Holds::Compressed => decoded,
        Holds::Packed { orig, base } => {
            let idx = page - base;
            let pos = (orig & ((1u64 << idx) - 1)).count_ones() as usize;
            &decoded[pos * PAGE_SIZE..(pos + 1) * PAGE_SIZE]
        }
    }
}

/// Learns how the intact object `bytes` of `owner` holds its pages, and
/// which pages it serves: a packed group (its live pages), checked by
/// decoding every one of them to what the model says, or one page. Panics
/// if it decodes to nothing the store was given.
fn learn(
    bytes: &[u8],
    owner: u64,
    packed_store: bool,
    model: &[Vec<u8>],
    codec: &mut dyn Codec,
) -> (Holds, Vec<u64>) {
    if looks_packed(bytes, owner, packed_store) {
        let word = |i: usize| u64::from_ne_bytes(bytes[i..i + 8].try_into().unwrap());
        let (live, orig) = (word(0), word(8));
        let holds = Holds::Packed { orig, base: owner };
        let pages: Vec<u64> = (0..64)
            .filter(|i| live & (1 << i) != 0)
            .map(|i| owner + i)
            .collect();
        if !pages.is_empty() && live & !orig == 0 {
            if let Some(decoded) = decode_object(holds, bytes, codec) {
                let decodes = |p: &u64| {
                    model
                        .get(*p as usize)
                        .is_some_and(|m| page_in(holds, &decoded, *p) == &m[..])
                };
                if pages.iter().all(decodes) {
                    return (holds, pages);
                }
            }
        }
    }
    let want = &model[owner as usize];
    for holds in [Holds::Raw, Holds::Compressed] {
        if (bytes.len() == PAGE_SIZE || !matches!(holds, Holds::Raw))
            && decode_object(holds, bytes, codec).as_ref() == Some(want)
        {
            return (holds, vec![owner]);
        }
    }
    panic!(
        "the object of page {owner} ({} bytes) decodes to nothing stored",
        bytes.len()
    );
}

/// Whether the object of a packed store looks like a packed group: its
/// `base` header field is its owner and its `orig` mask names a page. A
/// group may hold a single page (the others of its group zeros, or written
/// apart), so one bit is enough: requiring two let the fuzzer overwrite
/// such a group's live mask, which leaks it (a mask the allocator never
/// sees reach zero), and the harness then blamed the store. A per-page
/// object taken for a group only widens what may read wrong.
fn looks_packed(bytes: &[u8], owner: u64, packed_store: bool) -> bool {
    if !packed_store || bytes.len() < 32 {
        return false;
    }
    let word = |i: usize| u64::from_ne_bytes(bytes[i..i + 8].try_into().unwrap());
    // The `base` word's low 36 bits (the rest is the header's seal).
    word(16) & ((1 << 36) - 1) == owner && word(8) != 0
}

fuzz_target!(|input: Input| {
    for d in input.decode.iter().take(4) {
        decode_checks(d);
    }
    let cfg = input.setup.config();
    let npages = input.setup.page_count();
    let objects: Objects = Arc::default();
    let spy = Spy {
        inner: HeapAllocator::new(),
        objects: objects.clone(),
    };
    let store = Store::with_allocator(cfg, Box::new(spy)).expect("valid setup");
    let mut ctx = store.new_ctx();
    let mut model = vec![vec![0u8; PAGE_SIZE]; npages as usize];
    let mut generation = 0;
    for w in input.writes.iter().take(16) {
        let first = u64::from(w.page) % npages;
        let n = (1 + u64::from(w.n) % 24).min(npages - first);
        generation += 1;
        let mut data = Vec::new();
        for p in first..first + n {
            let fill = w
                .fills
                .get((p - first) as usize % w.fills.len().max(1))
                .unwrap_or(&Fill::Zeros);
            data.extend(page_content(fill, p, generation));
        }
        ctx.write(first * PAGE, &data)
            .expect("no limit: writes succeed");
        for (i, pg) in data.chunks(PAGE_SIZE).enumerate() {
            model[first as usize + i] = pg.to_vec();
        }
    }
    if input.warm {
        for p in 0..npages {
            let mut buf = vec![0u8; PAGE_SIZE];
            ctx.read(p * PAGE, &mut buf).unwrap();
            assert!(buf == model[p as usize]);
        }
    }
    // No frees in flight while bytes change.
    ctx.flush_frees();
    assert!(store.settle_frees(Duration::from_secs(10)));
    let mut hit = vec![false; npages as usize];
    let mut codec = store.config().algo.new_codec();
    // What each page may read as once its object was touched: what the
    // object's bytes decode to after the corruption.
    let mut may_read: Vec<Option<Vec<u8>>> = vec![None; npages as usize];
    {
        // How each object holds its pages is learnt before any byte
        // changes: a corrupted `base` must not make a group's live mask
        // fair game, nor a corrupted `orig` move a page in the oracle.
        let mut objs: Vec<(Handle, u32, Holds, Vec<u64>)> = objects
            .lock()
            .unwrap()
            .iter()
            .map(|(&h, &(s, o))| {
                // SAFETY: `h` is live (frees settled), of `s` bytes; no
                // request runs, so no byte of it changes (its live mask
                // included) while this view lives.
                let b = unsafe { store.allocator().bytes(h, 0, s as usize) };
                let (holds, pages) = learn(b, o, input.setup.packed, &model, &mut *codec);
                (h, s, holds, pages)
            })
            .collect();
        // In page order, not handle order: handles are heap addresses, so
        // which object an input picks would change from run to run.
        objs.sort_by_key(|o| (o.3[0], o.1));
        let mut touched = vec![false; objs.len()];
        for c in input.corruptions.iter().take(8) {
            if objs.is_empty() {
                break;
            }
            let which = usize::from(c.object) % objs.len();
            touched[which] = true;
            let (h, size, holds, ref pages) = objs[which];
            let packed = matches!(holds, Holds::Packed { .. });
            // SAFETY: `h` is live (frees settled, nothing runs meanwhile),
            // of `size` bytes; no reference to its bytes is held.
            let bytes = unsafe {
                std::slice::from_raw_parts_mut(
                    store.allocator().object_ptr(h, size as usize),
                    size as usize,
                )
            };
            let at = usize::from(c.at) % size as usize;
            if packed && at < 8 {
                continue;
            }
            if c.xor {
                bytes[at] ^= c.byte.max(1);
            } else {
                bytes[at] = c.byte;
            }
            for &p in pages {
                hit[p as usize] = true;
            }
        }
        for (i, (h, size, holds, pages)) in objs.iter().enumerate() {
            if !touched[i] {
                continue;
            }
            // SAFETY: as above, and no mutable view is held any more.
            let b = unsafe { store.allocator().bytes(*h, 0, *size as usize) };
            let decoded = decode_object(*holds, b, &mut *codec);
            for &p in pages {
                may_read[p as usize] = decoded.as_deref().map(|d| page_in(*holds, d, p).to_vec());
            }
        }
    }
    let check = |ctx: &mut zblk::QueueCtx, phase: &str| {
        for p in 0..npages {
            let want = &model[p as usize];
            let mut buf = vec![0xA5u8; PAGE_SIZE];
            match ctx.read(p * PAGE, &mut buf) {
                Ok(()) if buf == *want => {}
                Ok(()) => {
                    assert!(
                        hit[p as usize],
                        "{phase}: page {p} was not corrupted but reads wrong"
                    );
                    assert!(
                        may_read[p as usize].as_ref() == Some(&buf),
                        "{phase}: corrupt page {p} reads as something other than its own object decodes to"
                    );
                }
                Err(e) => {
                    assert!(hit[p as usize], "{phase}: page {p} fails untouched: {e}");
                    assert!(matches!(e, Error::Corrupt { page, .. } if page == p), "{e}");
                    assert_eq!(e.errno(), -libc::EIO);
                    assert!(
                        buf.iter().all(|&b| b == 0),
                        "{phase}: failed read left bytes"
                    );
                }
            }
        }
    };
    check(&mut ctx, "after corruption");
    if input.compact {
        ctx.flush_frees();
        store.compact();
        check(&mut ctx, "after compaction");
    }
    // Everything overwritten: a clean store again. Every old object goes
    // through the overwrite path; the pages of a touched object get new
    // text (new objects, compressed, read back through the packed read
    // cache), the others a same-filled word of their own, which stores no
    // object: compressing and decoding every page of the device again was
    // half of this target's time, for nothing the rest of it does not test.
    generation += 1;
    let mut data = Vec::new();
    for p in 0..npages {
        let fill = if hit[p as usize] {
            Fill::Text(p as u16)
        } else {
            Fill::Word(0x5a5a_0000_0000_0000 | generation << 32 | p)
        };
        data.extend(page_content(&fill, p, generation));
    }
    ctx.write(0, &data).expect("overwrite");
    let mut back = vec![0u8; data.len()];
    ctx.read(0, &mut back).expect("read back after overwrite");
    assert!(back == data, "overwritten store reads wrong");
    ctx.discard(0, npages * PAGE).unwrap();
    ctx.flush_frees();
    assert!(store.settle_frees(Duration::from_secs(10)));
    let s = store.stats();
    assert_eq!(s.counters.stored_pages, 0);
    assert_eq!(
        s.mem_used_total, 0,
        "memory left after discarding a corrupted store"
    );
    assert!(objects.lock().unwrap().is_empty(), "objects leaked");
});
