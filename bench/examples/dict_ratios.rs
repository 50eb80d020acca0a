//! Compression dictionaries on real memory pages, for BENCHMARKS.md: lz4
//! and zstd:1, every page compressed alone as the store compresses it,
//! without a dictionary and with one, the ratio and MB/s of each against
//! its own codec without a dictionary, every variant timed in every round
//! (the order rotated round by round) in this one process. Usage:
//!
//!     dict_ratios FILE... [--rounds N] [--split stride|head]
//!
//! Same-filled pages are dropped (the store keeps them as a word). Of the
//! rest, the training pages are those whose index in FILE is a multiple
//! of 8 (`stride`, the default) or in its first quarter (`head`); every
//! other page is measured. A page compressing to the huge threshold or
//! more counts as a whole page, stored and read back raw, as the store
//! keeps it. Dictionaries of 16, 32 and 64 KB:
//!
//! - `samples`: training pages evenly spaced over the training set,
//!   concatenated (raw content: lz4 matches into it, zstd takes it as a
//!   raw-content dictionary);
//! - `trained`: zstd's trainer (`zstd::dict::from_samples`) over all
//!   training pages; zstd takes it whole, lz4 its content (what follows
//!   the header and entropy tables, `ZDICT_getDictHeaderSize`).
//!
//! lz4 with a dictionary runs through lz4_flex (`compress_into_with_dict`,
//! which indexes the dictionary again for every page) and through liblz4,
//! which indexes it once (`LZ4_loadDict`, or `LZ4_loadDictSlow` that
//! indexes every position) and attaches it to a working stream per page.
//! Last, lz4_flex's compressor with liblz4's decoder (the store's pair at
//! b2be4ae, where BENCHMARKS.md's figures were taken).
//! zstd prepares its dictionaries once (`EncoderDictionary`,
//! `DecoderDictionary`) and writes frames as the store does (magicless, no
//! content size, checksum or dictionary id). Every measured page is
//! decoded and compared with its input in every round.

use lz4_sys::LZ4StreamEncode;
use std::ffi::{c_char, c_int};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::time::Instant;
use zblk::{DEFAULT_HUGE_THRESHOLD, PAGE_SIZE};
use zblk_bench::engine::{load_input, same_filled};
use zblk_bench::{max, median, min};
use zstd::bulk::{Compressor, Decompressor};
use zstd::dict::{DecoderDictionary, EncoderDictionary};
use zstd::zstd_safe::{zstd_sys, CParameter, DParameter, FrameFormat};

const KB: usize = 1024;
/// The dictionary sizes measured.
const DICT_SIZES: [usize; 3] = [16 * KB, 32 * KB, 64 * KB];
/// zstd's level here: zram's usual zstd level and the store's `zstd:1`.
const ZSTD_LEVEL: i32 = 1;
/// Room for any one compressed page of either codec.
const OBJ_BOUND: usize = 2 * PAGE_SIZE;

// liblz4's dictionary calls, in the static liblz4 that lz4-sys builds
// (lz4 1.10) but not bound by it. `LZ4_resetStream_fast`,
// `LZ4_attach_dictionary` and `LZ4_loadDictSlow` are in lz4.h's static
// linking section: stable for a library linked statically, as this one is.
extern "C" {
    fn LZ4_loadDict(stream: *mut LZ4StreamEncode, dict: *const c_char, size: c_int) -> c_int;
    fn LZ4_loadDictSlow(stream: *mut LZ4StreamEncode, dict: *const c_char, size: c_int) -> c_int;
    fn LZ4_resetStream_fast(stream: *mut LZ4StreamEncode);
    fn LZ4_attach_dictionary(working: *mut LZ4StreamEncode, dict: *const LZ4StreamEncode);
    fn LZ4_compress_fast_continue(
        stream: *mut LZ4StreamEncode,
        src: *const c_char,
        dst: *mut c_char,
        src_size: c_int,
        dst_capacity: c_int,
        acceleration: c_int,
    ) -> c_int;
    fn LZ4_decompress_safe_usingDict(
        src: *const c_char,
        dst: *mut c_char,
        src_size: c_int,
        dst_capacity: c_int,
        dict: *const c_char,
        dict_size: c_int,
    ) -> c_int;
}

/// One way of compressing a page alone and decoding it back.
trait PageCodec {
    /// Compresses `page` into `dst` (at least [`OBJ_BOUND`] long).
    fn compress(&mut self, page: &[u8], dst: &mut [u8]) -> Result<usize, String>;
    /// Decodes `obj` into all of `dst`.
    fn decompress(&mut self, obj: &[u8], dst: &mut [u8]) -> Result<(), String>;
}

/// `len` as a C int (every buffer here is a page or a dictionary).
fn c_len(len: usize) -> Result<c_int, String> {
    c_int::try_from(len).map_err(|_| format!("{len} bytes is too long for liblz4"))
}

/// Checks that a decoder filled all of `dst`.
fn whole(what: &str, n: usize, dst: &[u8]) -> Result<(), String> {
    if n == dst.len() {
        Ok(())
    } else {
        Err(format!("{what} decoded {n} bytes, not {}", dst.len()))
    }
}

/// lz4_flex: `compress_into` without a dictionary,
/// `compress_into_with_dict` with one.
struct Flex<'d> {
    dict: &'d [u8],
}

impl PageCodec for Flex<'_> {
    fn compress(&mut self, page: &[u8], dst: &mut [u8]) -> Result<usize, String> {
        if self.dict.is_empty() {
            lz4_flex::block::compress_into(page, dst)
        } else {
            lz4_flex::block::compress_into_with_dict(page, dst, self.dict)
        }
        .map_err(|e| format!("lz4_flex: {e}"))
    }

    fn decompress(&mut self, obj: &[u8], dst: &mut [u8]) -> Result<(), String> {
        let n = if self.dict.is_empty() {
            lz4_flex::block::decompress_into(obj, dst)
        } else {
            lz4_flex::block::decompress_into_with_dict(obj, dst, self.dict)
        }
        .map_err(|e| format!("lz4_flex: {e}"))?;
        whole("lz4_flex", n, dst)
    }
}

/// A liblz4 compression stream.
struct Stream(NonNull<LZ4StreamEncode>);

impl Stream {
    fn new() -> Result<Stream, String> {
        // SAFETY: allocates and initialises a stream, or returns null.
        let p = unsafe { lz4_sys::LZ4_createStream() };
        NonNull::new(p)
            .map(Stream)
            .ok_or_else(|| "LZ4_createStream failed".into())
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: made by `LZ4_createStream`, freed once, here.
        unsafe { lz4_sys::LZ4_freeStream(self.0.as_ptr()) };
    }
}

/// How liblz4 indexes a dictionary, once.
#[derive(Clone, Copy)]
enum Load {
    /// `LZ4_loadDict`: every third position.
    Fast,
    /// `LZ4_loadDictSlow`: every position.
    Slow,
}

/// liblz4: `LZ4_compress_default` and `LZ4_decompress_safe` without a
/// dictionary; with one, the dictionary indexed once into `indexed` and
/// attached to `work` for every page.
struct LibLz4<'d> {
    dict: &'d [u8],
    indexed: Stream,
    work: Stream,
}

impl<'d> LibLz4<'d> {
    fn new(dict: &'d [u8], load: Load) -> Result<LibLz4<'d>, String> {
        let (indexed, work) = (Stream::new()?, Stream::new()?);
        let size = c_len(dict.len())?;
        let ptr = dict.as_ptr().cast();
        // SAFETY: the stream is live and `dict` is valid for `size` bytes;
        // liblz4 keeps a pointer to `dict`, which `'d` keeps alive and
        // unmoved for as long as the stream is used (both live in `self`).
        let kept = unsafe {
            match load {
                Load::Fast => LZ4_loadDict(indexed.0.as_ptr(), ptr, size),
                Load::Slow => LZ4_loadDictSlow(indexed.0.as_ptr(), ptr, size),
            }
        };
        if kept != size.min(64 * KB as c_int) {
            return Err(format!("LZ4_loadDict kept {kept} of {size} bytes"));
        }
        Ok(LibLz4 {
            dict,
            indexed,
            work,
        })
    }
}

impl PageCodec for LibLz4<'_> {
    fn compress(&mut self, page: &[u8], dst: &mut [u8]) -> Result<usize, String> {
        let (n, cap) = (c_len(page.len())?, c_len(dst.len())?);
        let (src, out) = (page.as_ptr().cast(), dst.as_mut_ptr().cast());
        // SAFETY: `page` and `dst` are valid for `n` and `cap` bytes and
        // liblz4 writes at most `cap`. The working stream is reset and the
        // indexed dictionary (live, its bytes too, see `new`) attached to
        // it for this one call, which detaches it again.
        let got = unsafe {
            if self.dict.is_empty() {
                lz4_sys::LZ4_compress_default(src, out, n, cap)
            } else {
                let work = self.work.0.as_ptr();
                LZ4_resetStream_fast(work);
                LZ4_attach_dictionary(work, self.indexed.0.as_ptr());
                LZ4_compress_fast_continue(work, src, out, n, cap, 1)
            }
        };
        usize::try_from(got)
            .ok()
            .filter(|&k| k > 0)
            .ok_or_else(|| format!("liblz4 failed to compress: {got}"))
    }

    fn decompress(&mut self, obj: &[u8], dst: &mut [u8]) -> Result<(), String> {
        let (n, cap) = (c_len(obj.len())?, c_len(dst.len())?);
        let (src, out) = (obj.as_ptr().cast(), dst.as_mut_ptr().cast());
        let dict_size = c_len(self.dict.len())?;
        // SAFETY: `obj`, `dst` and the dictionary are valid for `n`, `cap`
        // and `dict_size` bytes; the safe decoders read and write within
        // them whatever `obj` holds.
        let got = unsafe {
            if self.dict.is_empty() {
                lz4_sys::LZ4_decompress_safe(src, out, n, cap)
            } else {
                let dict = self.dict.as_ptr().cast();
                LZ4_decompress_safe_usingDict(src, out, n, cap, dict, dict_size)
            }
        };
        let k = usize::try_from(got).map_err(|_| format!("liblz4 error {got}"))?;
        whole("liblz4", k, dst)
    }
}

/// lz4_flex's compressor with liblz4's decoder (the store's pair at
/// b2be4ae) without a dictionary: the blocks are one format.
struct FlexThenLib<'d> {
    flex: Flex<'d>,
    lib: LibLz4<'d>,
}

impl PageCodec for FlexThenLib<'_> {
    fn compress(&mut self, page: &[u8], dst: &mut [u8]) -> Result<usize, String> {
        self.flex.compress(page, dst)
    }

    fn decompress(&mut self, obj: &[u8], dst: &mut [u8]) -> Result<(), String> {
        self.lib.decompress(obj, dst)
    }
}

/// zstd's bulk API with the store's frame settings, its dictionary (if
/// any) prepared once.
struct Zstd<'d> {
    c: Compressor<'d>,
    d: Decompressor<'d>,
}

/// The prepared forms of one zstd dictionary.
struct ZstdDict {
    enc: EncoderDictionary<'static>,
    dec: DecoderDictionary<'static>,
}

impl ZstdDict {
    fn new(dict: &[u8]) -> ZstdDict {
        ZstdDict {
            enc: EncoderDictionary::copy(dict, ZSTD_LEVEL),
            dec: DecoderDictionary::copy(dict),
        }
    }
}

impl<'d> Zstd<'d> {
    fn new(dict: Option<&'d ZstdDict>) -> Result<Zstd<'d>, String> {
        let e = |e: std::io::Error| format!("zstd: {e}");
        let (mut c, mut d) = match dict {
            Some(x) => (
                Compressor::with_prepared_dictionary(&x.enc).map_err(e)?,
                Decompressor::with_prepared_dictionary(&x.dec).map_err(e)?,
            ),
            None => (
                Compressor::new(ZSTD_LEVEL).map_err(e)?,
                Decompressor::new().map_err(e)?,
            ),
        };
        for p in [
            CParameter::ContentSizeFlag(false),
            CParameter::ChecksumFlag(false),
            CParameter::DictIdFlag(false),
            CParameter::Format(FrameFormat::Magicless),
        ] {
            c.set_parameter(p).map_err(e)?;
        }
        d.set_parameter(DParameter::Format(FrameFormat::Magicless))
            .map_err(e)?;
        Ok(Zstd { c, d })
    }
}

impl PageCodec for Zstd<'_> {
    fn compress(&mut self, page: &[u8], dst: &mut [u8]) -> Result<usize, String> {
        self.c
            .compress_to_buffer(page, dst)
            .map_err(|e| format!("zstd: {e}"))
    }

    fn decompress(&mut self, obj: &[u8], dst: &mut [u8]) -> Result<(), String> {
        let n = self
            .d
            .decompress_to_buffer(obj, dst)
            .map_err(|e| format!("zstd: {e}"))?;
        whole("zstd", n, dst)
    }
}

/// One row: a codec with or without a dictionary, and the row it is
/// measured against (its codec without a dictionary).
struct Variant<'d> {
    codec: &'static str,
    dict: String,
    baseline: usize,
    page_codec: Box<dyn PageCodec + 'd>,
}

/// One round of one variant.
struct Round {
    ratio: f64,
    /// The ratio with huge pages counted at their compressed size.
    uncapped: f64,
    compress_mb_s: f64,
    decompress_mb_s: f64,
}

/// Buffers reused by every round, written before any clock starts.
struct Arena {
    objs: Vec<u8>,
    spans: Vec<Option<(usize, usize)>>,
    area: Vec<u8>,
    out: Vec<u8>,
}

impl Arena {
    fn new(pages: usize) -> Arena {
        Arena {
            objs: vec![1; pages * PAGE_SIZE],
            spans: Vec::with_capacity(pages),
            area: vec![1; OBJ_BOUND],
            out: vec![1; pages * PAGE_SIZE],
        }
    }
}

/// Compresses every page alone into the arena (a huge one is kept raw),
/// decodes them all back, and checks every page against its input.
fn measure(codec: &mut dyn PageCodec, pages: &[&[u8]], a: &mut Arena) -> Result<Round, String> {
    a.spans.clear();
    let (mut end, mut huge_bytes) = (0, 0);
    let t0 = Instant::now();
    for page in pages {
        let n = codec.compress(page, &mut a.area)?;
        if n < DEFAULT_HUGE_THRESHOLD {
            a.objs[end..end + n].copy_from_slice(&a.area[..n]);
            a.spans.push(Some((end, n)));
            end += n;
        } else {
            a.spans.push(None);
            huge_bytes += n;
        }
    }
    let compress_s = t0.elapsed().as_secs_f64();
    let t0 = Instant::now();
    for ((span, page), out) in a
        .spans
        .iter()
        .zip(pages)
        .zip(a.out.chunks_exact_mut(PAGE_SIZE))
    {
        match span {
            Some((at, n)) => codec.decompress(&a.objs[*at..at + n], out)?,
            None => out.copy_from_slice(page),
        }
    }
    let decompress_s = t0.elapsed().as_secs_f64();
    for (i, (page, out)) in pages.iter().zip(a.out.chunks_exact(PAGE_SIZE)).enumerate() {
        if *page != out {
            return Err(format!("measured page {i} did not round-trip"));
        }
    }
    let huge = a.spans.iter().filter(|s| s.is_none()).count();
    let bytes = (pages.len() * PAGE_SIZE) as f64;
    let mb = bytes / 1e6;
    Ok(Round {
        ratio: bytes / (end + huge * PAGE_SIZE) as f64,
        uncapped: bytes / (end + huge_bytes) as f64,
        compress_mb_s: mb / compress_s.max(1e-9),
        decompress_mb_s: mb / decompress_s.max(1e-9),
    })
}

/// Which pages train the dictionaries.
#[derive(Clone, Copy)]
enum Split {
    /// Page index a multiple of 8.
    Stride,
    /// The first quarter of the file.
    Head,
}

/// The pages that are not same-filled, as (training, measured).
fn split_pages(data: &[u8], split: Split) -> (Vec<&[u8]>, Vec<&[u8]>) {
    let total = data.len() / PAGE_SIZE;
    let (mut train, mut measured) = (Vec::new(), Vec::new());
    for (i, page) in data.chunks_exact(PAGE_SIZE).enumerate() {
        if same_filled(page) {
            continue;
        }
        let trains = match split {
            Split::Stride => i % 8 == 0,
            Split::Head => i < total / 4,
        };
        if trains {
            train.push(page);
        } else {
            measured.push(page);
        }
    }
    (train, measured)
}

/// `size` bytes of training pages evenly spaced over `train`, concatenated.
fn sampled(train: &[&[u8]], size: usize) -> Vec<u8> {
    let k = (size / PAGE_SIZE).min(train.len());
    (0..k)
        .flat_map(|j| train[j * train.len() / k])
        .copied()
        .collect()
}

/// zstd's trained dictionary of at most `size` bytes, and its content
/// (what follows the header and entropy tables).
fn trained(train: &[&[u8]], size: usize) -> Result<(Vec<u8>, Vec<u8>), String> {
    let dict = zstd::dict::from_samples(train, size).map_err(|e| format!("zstd trainer: {e}"))?;
    // SAFETY: `dict` is valid for its length; zstd only reads it.
    let header = unsafe { zstd_sys::ZDICT_getDictHeaderSize(dict.as_ptr().cast(), dict.len()) };
    // SAFETY: only inspects the code.
    if unsafe { zstd_sys::ZDICT_isError(header) } != 0 || header > dict.len() {
        return Err("zstd's trained dictionary has no readable header".into());
    }
    let content = dict[header..].to_vec();
    Ok((dict, content))
}

/// The dictionaries of one size: samples, zstd's trained one and its
/// content.
struct Dicts {
    size: usize,
    samples: Vec<u8>,
    trained: Vec<u8>,
    content: Vec<u8>,
    zstd_samples: ZstdDict,
    zstd_trained: ZstdDict,
}

fn dicts(train: &[&[u8]]) -> Result<Vec<Dicts>, String> {
    DICT_SIZES
        .iter()
        .map(|&size| {
            let samples = sampled(train, size);
            let (trained, content) = trained(train, size)?;
            Ok(Dicts {
                size,
                zstd_samples: ZstdDict::new(&samples),
                zstd_trained: ZstdDict::new(&trained),
                samples,
                trained,
                content,
            })
        })
        .collect()
}

/// [`FlexThenLib`] with `dict` (none if empty).
fn mixed(dict: &[u8]) -> Result<Box<dyn PageCodec + '_>, String> {
    Ok(Box::new(FlexThenLib {
        flex: Flex { dict },
        lib: LibLz4::new(dict, Load::Fast)?,
    }))
}

/// Every row, each baseline first in its codec.
fn variants(ds: &[Dicts]) -> Result<Vec<Variant<'_>>, String> {
    fn row<'d>(
        codec: &'static str,
        dict: String,
        baseline: usize,
        page_codec: Box<dyn PageCodec + 'd>,
    ) -> Variant<'d> {
        Variant {
            codec,
            dict,
            baseline,
            page_codec,
        }
    }
    let none = || "none".to_string();
    let mut v = vec![
        row("lz4_flex", none(), 0, Box::new(Flex { dict: &[] })),
        row("liblz4", none(), 1, Box::new(LibLz4::new(&[], Load::Fast)?)),
        row("zstd:1", none(), 2, Box::new(Zstd::new(None)?)),
        row("lz4_flex, liblz4 decoding", none(), 3, mixed(&[])?),
    ];
    for d in ds {
        let kb = d.size / KB;
        for (name, content) in [("samples", &d.samples), ("trained content", &d.content)] {
            let label = format!("{kb} KB {name} ({} B)", content.len());
            v.push(row(
                "lz4_flex",
                label.clone(),
                0,
                Box::new(Flex { dict: content }),
            ));
            let attach = LibLz4::new(content, Load::Fast)?;
            v.push(row("liblz4 attach", label.clone(), 1, Box::new(attach)));
            let slow = LibLz4::new(content, Load::Slow)?;
            v.push(row(
                "liblz4 attach, loadDictSlow",
                label.clone(),
                1,
                Box::new(slow),
            ));
            v.push(row("lz4_flex, liblz4 decoding", label, 3, mixed(content)?));
        }
        let samples = format!("{kb} KB samples (raw content)");
        v.push(row(
            "zstd:1",
            samples,
            2,
            Box::new(Zstd::new(Some(&d.zstd_samples))?),
        ));
        let trained = format!("{kb} KB trained ({} B)", d.trained.len());
        v.push(row(
            "zstd:1",
            trained,
            2,
            Box::new(Zstd::new(Some(&d.zstd_trained))?),
        ));
    }
    Ok(v)
}

/// Median and spread of a sample, as "median (min-max)".
fn spread(v: &[f64], digits: usize) -> String {
    format!(
        "{:.*} ({:.*}-{:.*})",
        digits,
        median(v.to_vec()),
        digits,
        min(v),
        digits,
        max(v)
    )
}

/// Runs every variant `rounds` times over one file and prints its table.
fn corpus(path: &Path, rounds: usize, split: Split) -> Result<(), String> {
    let data = load_input(path).map_err(|e| e.to_string())?;
    let (train, measured) = split_pages(&data, split);
    if train.is_empty() || measured.is_empty() {
        return Err(format!("{}: too few pages to split", path.display()));
    }
    let ds = dicts(&train)?;
    let mut vs = variants(&ds)?;
    let mut arena = Arena::new(measured.len());
    let mut results: Vec<Vec<Round>> = vs.iter().map(|_| Vec::new()).collect();
    for r in 0..rounds {
        // Each variant starts the round in turn.
        for k in 0..vs.len() {
            let i = (k + r) % vs.len();
            let got = measure(vs[i].page_codec.as_mut(), &measured, &mut arena)
                .map_err(|e| format!("{} {}: {e}", vs[i].codec, vs[i].dict))?;
            results[i].push(got);
        }
    }
    println!(
        "\n{}: {} pages, {} same-filled dropped, {} train, {} measured\n",
        path.display(),
        data.len() / PAGE_SIZE,
        data.len() / PAGE_SIZE - train.len() - measured.len(),
        train.len(),
        measured.len()
    );
    println!("| codec | dictionary | ratio | vs none | huge uncapped, vs none | compress MB/s | vs none | decompress MB/s | vs none |");
    println!("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for (v, rs) in vs.iter().zip(&results) {
        let base = &results[v.baseline];
        let per = |f: fn(&Round) -> f64| -> (Vec<f64>, Vec<f64>) {
            let own: Vec<f64> = rs.iter().map(f).collect();
            let rel = rs.iter().zip(base).map(|(a, b)| f(a) / f(b)).collect();
            (own, rel)
        };
        let (c, c_rel) = per(|r| r.compress_mb_s);
        let (d, d_rel) = per(|r| r.decompress_mb_s);
        let ratio = rs.first().map_or(0.0, |r| r.ratio);
        let base_ratio = base.first().map_or(1.0, |r| r.ratio);
        let uncapped = rs.first().map_or(0.0, |r| r.uncapped);
        let base_uncapped = base.first().map_or(1.0, |r| r.uncapped);
        println!(
            "| {} | {} | {ratio:.3} | {:+.1} % | {:+.1} % | {} | {} | {} | {} |",
            v.codec,
            v.dict,
            (ratio / base_ratio - 1.0) * 100.0,
            (uncapped / base_uncapped - 1.0) * 100.0,
            spread(&c, 0),
            spread(&c_rel, 2),
            spread(&d, 0),
            spread(&d_rel, 2)
        );
    }
    Ok(())
}

fn main() -> Result<(), String> {
    let usage = "usage: dict_ratios FILE... [--rounds N] [--split stride|head]";
    let mut args = std::env::args().skip(1);
    let (mut files, mut rounds, mut split) = (Vec::new(), 5, Split::Stride);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--rounds" => {
                rounds = args
                    .next()
                    .and_then(|n| n.parse().ok())
                    .filter(|&n| n > 0)
                    .ok_or("--rounds needs a number above 0")?;
            }
            "--split" => {
                split = match args.next().as_deref() {
                    Some("stride") => Split::Stride,
                    Some("head") => Split::Head,
                    _ => return Err("--split needs stride or head".into()),
                };
            }
            _ if a.starts_with("--") => return Err(format!("unknown option {a}; {usage}")),
            _ => files.push(PathBuf::from(a)),
        }
    }
    if files.is_empty() {
        return Err(usage.into());
    }
    for f in &files {
        corpus(f, rounds, split)?;
    }
    Ok(())
}
