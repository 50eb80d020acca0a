//! Page codecs behind one trait.
//!
//! Every codec compresses whole buffers (one 4 KB page, or a packed group of
//! pages) and decompresses into a caller-sized buffer. A codec instance owns
//! its context and scratch (zstd's `CCtx`, libdeflate's compressor), so each
//! queue thread keeps its own instances in its [`crate::QueueCtx`]: no
//! codec is ever shared behind a lock.

mod deflate;
mod dict;
mod iaa;
mod lz4;
mod lz4dict;
mod lz4hc;
mod none;
mod zstd;

pub use self::deflate::DeflateCodec;
pub use self::dict::{Dictionaries, MAX_DICT_BYTES};
pub use self::iaa::IaaCodec;
#[cfg(any(test, feature = "test-support"))]
pub use self::iaa::{IaaOptions, IaaStats, IAA_MAX_BATCH};
pub use self::lz4::Lz4Codec;
pub use self::lz4dict::Lz4DictCodec;
pub use self::lz4hc::{Lz4HcCodec, LZ4HC_DEFAULT_LEVEL, LZ4HC_MAX_LEVEL};
pub use self::none::NoneCodec;
pub use self::zstd::ZstdCodec;

use std::fmt;
use std::str::FromStr;

/// Why a codec call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CodecError {
    /// The compressed input is malformed or decodes to the wrong length.
    Corrupt(String),
    /// The codec library reported an internal failure.
    Internal(String),
}

impl fmt::Display for CodecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CodecError::Corrupt(m) => write!(f, "corrupt compressed data: {m}"),
            CodecError::Internal(m) => write!(f, "codec failure: {m}"),
        }
    }
}

impl std::error::Error for CodecError {}

impl CodecError {
    /// A codec reported `n` bytes of output for a buffer of `cap`: the
    /// bytes past the buffer are not its output, so the engine refuses the
    /// result instead of storing (or slicing past) them.
    pub fn overflow(n: usize, cap: usize) -> CodecError {
        CodecError::Internal(format!(
            "codec reported {n} bytes of output for a {cap}-byte buffer"
        ))
    }
}

/// A compressor/decompressor with its own context.
pub trait Codec: Send {
    /// The algorithm this codec implements.
    fn algo(&self) -> Algo;

    /// Compresses `src` into `dst`. Returns `Ok(Some(n))` with the compressed
    /// length, or `Ok(None)` when the result would not fit in `dst` (the
    /// caller then stores the data raw).
    fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<Option<usize>, CodecError>;

    /// Decompresses `src` into `dst`, which must be filled exactly: a stream
    /// that decodes to any other length is corrupt.
    fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(), CodecError>;

    /// Faults in the memory this codec's calls use that it allocated
    /// itself (zstd's fixed workspaces), on the thread that will serve;
    /// nothing for codecs without such memory. See `QueueCtx::prefault`.
    fn prefault(&mut self) {}

    /// Compresses a compression group: `pages[i]` into
    /// `dst[i * PAGE_SIZE..i * PAGE_SIZE + budget]`, pushing one result per
    /// page onto `out` (as [`Codec::compress`]: `None` means "store raw").
    /// Returns how many pages an accelerator compressed (0 for software).
    ///
    /// The default runs the pages one by one through this codec's own
    /// context; accelerator codecs override it to keep several pages in
    /// flight at once.
    fn compress_batch(
        &mut self,
        pages: &[&[u8]],
        dst: &mut [u8],
        budget: usize,
        out: &mut Vec<Option<usize>>,
    ) -> Result<usize, CodecError> {
        for (i, page) in pages.iter().enumerate() {
            let area = &mut dst[i * crate::page::PAGE_SIZE..i * crate::page::PAGE_SIZE + budget];
            out.push(self.compress(page, area)?);
        }
        Ok(0)
    }

    /// What an accelerator went through since the previous call (software
    /// codecs: nothing). The queue context adds it to its statistics after
    /// each request, so `zblk stat` shows why pages fell back to software.
    fn take_accel_events(&mut self) -> AccelEvents {
        AccelEvents::default()
    }
}

/// Accelerator events of one codec since it was last asked: pages redone in
/// software, and by what cause, and pages the device decompressed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AccelEvents {
    /// Pages redone in software after a page fault.
    pub page_faults: u64,
    /// Pages redone in software after a timeout.
    pub timeouts: u64,
    /// Pages redone in software because verify failed.
    pub verify_failures: u64,
    /// Pages redone in software after another device error.
    pub device_errors: u64,
    /// Pages done in software because no work queue took the descriptor.
    pub submit_failures: u64,
    /// Pages the device decompressed.
    pub decompressed: u64,
}

/// A compression algorithm and its parameters, as named on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algo {
    /// LZ4 (the block format, no frame).
    Lz4,
    /// LZ4HC (liblz4's high-compression mode) at the given level: the LZ4
    /// block format, decoded at lz4's speed.
    Lz4Hc(i32),
    /// Zstandard at the given level.
    Zstd(i32),
    /// Raw deflate (libdeflate) at the given level, each buffer compressed
    /// alone so that no match reaches back more than 4 KB within a page.
    Deflate(i32),
    /// Raw deflate routed to Intel IAA work queues where one is usable, else
    /// to the software deflate path producing the same format.
    DeflateIaa,
    /// No compression: pages are stored raw (same-filled pages still cost
    /// nothing); the baseline of what storing a page costs without a codec.
    None,
}

/// zstd's level when `zstd` is given without one (what zram uses).
pub const ZSTD_DEFAULT_LEVEL: i32 = 1;
/// libdeflate's level for `deflate`: the fast end, like the kernel's.
pub const DEFLATE_DEFAULT_LEVEL: i32 = 1;
/// The largest input, in pages, a codec made without a store's shape is
/// sized for: a default compression group.
pub const DEFAULT_CODEC_PAGES: usize = 8;

impl Algo {
    /// Creates a fresh codec instance (own context and scratch) for `self`,
    /// sized for inputs of up to `DEFAULT_CODEC_PAGES` pages (see
    /// [`Algo::new_codec_for`]).
    pub fn new_codec(&self) -> Box<dyn Codec> {
        self.new_codec_for(DEFAULT_CODEC_PAGES)
    }

    /// A fresh codec whose contexts are sized for inputs of up to `pages`
    /// pages (zstd's; larger inputs still compress, less frugally; 0 for a
    /// codec that only decompresses).
    pub fn new_codec_for(&self, pages: usize) -> Box<dyn Codec> {
        match *self {
            Algo::Lz4 => Box::new(Lz4Codec::new()),
            Algo::Lz4Hc(level) => Box::new(Lz4HcCodec::new(level)),
            Algo::Zstd(level) => Box::new(ZstdCodec::for_pages(level, pages)),
            Algo::Deflate(level) => Box::new(DeflateCodec::new(level, *self)),
            Algo::DeflateIaa => Box::new(IaaCodec::new()),
            Algo::None => Box::new(NoneCodec),
        }
    }

    /// [`Algo::new_codec_for`] priming every page with the dictionary
    /// `dict`, if given, for the algorithms that take one
    /// ([`Algo::takes_dictionary`]; the others ignore it: a store refuses
    /// them a dictionary before it makes codecs, see [`Dictionaries::set`]).
    pub fn new_codec_with(
        &self,
        pages: usize,
        dict: Option<std::sync::Arc<[u8]>>,
    ) -> Box<dyn Codec> {
        match (*self, dict) {
            (Algo::Lz4, Some(d)) => Box::new(Lz4DictCodec::new(None, d)),
            (Algo::Lz4Hc(level), Some(d)) => Box::new(Lz4DictCodec::new(Some(level), d)),
            (Algo::Zstd(level), d @ Some(_)) => Box::new(ZstdCodec::with_dict(level, pages, d)),
            _ => self.new_codec_for(pages),
        }
    }
}

impl fmt::Display for Algo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Algo::Lz4 => write!(f, "lz4"),
            Algo::Lz4Hc(l) if *l == LZ4HC_DEFAULT_LEVEL => write!(f, "lz4hc"),
            Algo::Lz4Hc(l) => write!(f, "lz4hc:{l}"),
            Algo::Zstd(l) => write!(f, "zstd:{l}"),
            Algo::Deflate(l) if *l == DEFLATE_DEFAULT_LEVEL => write!(f, "deflate"),
            Algo::Deflate(l) => write!(f, "deflate:{l}"),
            Algo::DeflateIaa => write!(f, "deflate-iaa"),
            Algo::None => write!(f, "none"),
        }
    }
}

impl FromStr for Algo {
    type Err = String;

    /// Parses `lz4`, `lz4hc`, `lz4hc:LEVEL` (1..=12), `zstd`, `zstd:LEVEL` (1..=22), `deflate`,
    /// `deflate:LEVEL` (1..=12), `deflate-iaa` or `none`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (name, level) = match s.split_once(':') {
            Some((n, l)) => (n, Some(l)),
            None => (s, None),
        };
        let parse_level = |lo: i32, hi: i32, default: i32| -> Result<i32, String> {
            match level {
                None => Ok(default),
                Some(l) => match l.parse::<i32>() {
                    Ok(v) if (lo..=hi).contains(&v) => Ok(v),
                    _ => Err(format!(
                        "invalid level '{l}' for {name}: expected {lo}..={hi}"
                    )),
                },
            }
        };
        match name {
            "lz4" if level.is_none() => Ok(Algo::Lz4),
            "lz4hc" => Ok(Algo::Lz4Hc(parse_level(
                1,
                LZ4HC_MAX_LEVEL,
                LZ4HC_DEFAULT_LEVEL,
            )?)),
            "zstd" => Ok(Algo::Zstd(parse_level(1, 22, ZSTD_DEFAULT_LEVEL)?)),
            "deflate" => Ok(Algo::Deflate(parse_level(1, 12, DEFLATE_DEFAULT_LEVEL)?)),
            "deflate-iaa" if level.is_none() => Ok(Algo::DeflateIaa),
            "none" if level.is_none() => Ok(Algo::None),
            _ => Err(format!(
                "unknown algorithm '{s}': expected lz4, lz4hc[:LEVEL], zstd[:LEVEL], deflate[:LEVEL], deflate-iaa or none"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_pages() -> Vec<Vec<u8>> {
        let text: Vec<u8> = b"the quick brown fox jumps over the lazy dog; "
            .iter()
            .cycle()
            .take(4096)
            .copied()
            .collect();
        let mut x = 0x9e3779b97f4a7c15u64;
        let random: Vec<u8> = (0..4096)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        vec![vec![0u8; 4096], text, random, vec![7u8; 8192]]
    }

    #[test]
    fn every_codec_round_trips() {
        for algo in [
            Algo::Lz4,
            Algo::Lz4Hc(9),
            Algo::Lz4Hc(1),
            Algo::Lz4Hc(12),
            Algo::Zstd(1),
            Algo::Zstd(3),
            Algo::Deflate(1),
            Algo::DeflateIaa,
        ] {
            let mut c = algo.new_codec();
            for page in sample_pages() {
                let mut dst = vec![0u8; page.len() * 2];
                let n = c.compress(&page, &mut dst).unwrap().expect("fits in 2x");
                let mut back = vec![0u8; page.len()];
                c.decompress(&dst[..n], &mut back).unwrap();
                assert_eq!(back, page, "{algo}");
            }
        }
    }

    #[test]
    fn incompressible_into_small_buffer_reports_none() {
        for algo in [Algo::Lz4, Algo::Lz4Hc(9), Algo::Zstd(1), Algo::Deflate(1)] {
            let mut c = algo.new_codec();
            let page = &sample_pages()[2];
            let mut dst = vec![0u8; 3072];
            assert_eq!(c.compress(page, &mut dst).unwrap(), None, "{algo}");
        }
    }

    #[test]
    fn a_codec_goes_on_after_a_page_that_did_not_fit() {
        // lz4 and lz4hc keep their state from call to call (liblz4 keeps
        // lz4's table too for inputs under 4 KB), a refused call between.
        for algo in [Algo::Lz4, Algo::Lz4Hc(9), Algo::Zstd(1), Algo::Deflate(1)] {
            let mut c = algo.new_codec();
            let mut pages = sample_pages();
            pages.push(pages[1][..1000].to_vec());
            let mut small = vec![0u8; 3072];
            assert_eq!(c.compress(&pages[2], &mut small).unwrap(), None, "{algo}");
            for page in pages.iter().chain(pages.iter()) {
                let mut dst = vec![0u8; page.len() * 2];
                let n = c.compress(page, &mut dst).unwrap().expect("fits in 2x");
                let mut back = vec![0u8; page.len()];
                c.decompress(&dst[..n], &mut back).unwrap();
                assert_eq!(&back, page, "{algo}");
            }
        }
    }

    #[test]
    fn compressible_page_fits_the_huge_budget() {
        for algo in [
            Algo::Lz4,
            Algo::Lz4Hc(9),
            Algo::Zstd(1),
            Algo::Deflate(1),
            Algo::DeflateIaa,
        ] {
            let mut c = algo.new_codec();
            let page = &sample_pages()[1];
            let mut dst = vec![0u8; 3071];
            let n = c
                .compress(page, &mut dst)
                .unwrap()
                .expect("text compresses");
            assert!(n < 1024, "{algo}: {n}");
            let mut back = vec![0u8; 4096];
            c.decompress(&dst[..n], &mut back).unwrap();
            assert_eq!(&back, page);
        }
    }

    #[test]
    fn corrupt_input_is_an_error_not_a_panic() {
        for algo in [Algo::Lz4, Algo::Lz4Hc(9), Algo::Zstd(1), Algo::Deflate(1)] {
            let mut c = algo.new_codec();
            let page = &sample_pages()[1];
            let mut dst = vec![0u8; 8192];
            let n = c.compress(page, &mut dst).unwrap().unwrap();
            let mut back = vec![0u8; 4096];
            // Truncated, bit-flipped, garbage and wrong-length outputs.
            assert!(
                c.decompress(&dst[..n / 2], &mut back).is_err(),
                "{algo} truncated"
            );
            assert!(
                c.decompress(&[0xff; 64], &mut back).is_err(),
                "{algo} garbage"
            );
            let mut short = vec![0u8; 4095];
            assert!(
                c.decompress(&dst[..n], &mut short).is_err(),
                "{algo} wrong length"
            );
        }
    }

    #[test]
    fn algo_names_parse_and_print() {
        assert_eq!("lz4".parse::<Algo>(), Ok(Algo::Lz4));
        assert_eq!("lz4hc".parse::<Algo>(), Ok(Algo::Lz4Hc(9)));
        assert_eq!("lz4hc:12".parse::<Algo>(), Ok(Algo::Lz4Hc(12)));
        assert_eq!("lz4hc:1".parse::<Algo>(), Ok(Algo::Lz4Hc(1)));
        assert_eq!("zstd".parse::<Algo>(), Ok(Algo::Zstd(1)));
        assert_eq!("zstd:3".parse::<Algo>(), Ok(Algo::Zstd(3)));
        assert_eq!("deflate".parse::<Algo>(), Ok(Algo::Deflate(1)));
        assert_eq!("deflate-iaa".parse::<Algo>(), Ok(Algo::DeflateIaa));
        for bad in [
            "",
            "lzo",
            "zstd:0",
            "zstd:23",
            "zstd:x",
            "lz4:1",
            "deflate:13",
            "lz4hc:0",
            "lz4hc:13",
            "lz4hc:x",
            "lz4hc:",
        ] {
            assert!(bad.parse::<Algo>().is_err(), "{bad}");
        }
        for a in [
            Algo::Lz4,
            Algo::Lz4Hc(9),
            Algo::Lz4Hc(4),
            Algo::Zstd(3),
            Algo::Deflate(1),
            Algo::Deflate(6),
            Algo::DeflateIaa,
            Algo::None,
        ] {
            assert_eq!(a.to_string().parse::<Algo>(), Ok(a));
        }
        assert!("none:1".parse::<Algo>().is_err());
    }

    #[test]
    fn lz4hc_level_errors_name_the_range() {
        let e = "lz4hc:13".parse::<Algo>().unwrap_err();
        assert!(e.contains("1..=12"), "{e}");
    }

    #[test]
    fn lz4hc_state_is_reused_across_pages_and_failures() {
        // An output that did not fit leaves liblz4's state to be reset;
        // the next page must still compress as it would alone.
        let mut c = Algo::Lz4Hc(9).new_codec();
        let pages = sample_pages();
        let mut alone = vec![0u8; 8192];
        let n = Algo::Lz4Hc(9)
            .new_codec()
            .compress(&pages[1], &mut alone)
            .unwrap()
            .unwrap();
        for _ in 0..3 {
            let mut small = vec![0u8; 100];
            assert_eq!(c.compress(&pages[2], &mut small).unwrap(), None);
            let mut dst = vec![0u8; 8192];
            assert_eq!(c.compress(&pages[1], &mut dst).unwrap(), Some(n));
            assert_eq!(dst[..n], alone[..n]);
            let mut back = vec![0u8; 4096];
            c.decompress(&dst[..n], &mut back).unwrap();
            assert_eq!(back, pages[1]);
        }
    }

    #[test]
    fn lz4hc_output_decodes_with_lz4() {
        let page = &sample_pages()[1];
        let mut dst = vec![0u8; 8192];
        let n = Algo::Lz4Hc(12)
            .new_codec()
            .compress(page, &mut dst)
            .unwrap()
            .unwrap();
        let mut back = vec![0u8; 4096];
        Algo::Lz4
            .new_codec()
            .decompress(&dst[..n], &mut back)
            .unwrap();
        assert_eq!(&back, page);
    }

    #[test]
    fn none_never_compresses_and_refuses_to_decompress() {
        let mut c = Algo::None.new_codec();
        for page in sample_pages() {
            let mut dst = vec![0u8; page.len() * 2];
            assert_eq!(c.compress(&page, &mut dst).unwrap(), None);
            let mut back = vec![0u8; page.len()];
            assert!(c.decompress(&dst, &mut back).is_err());
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

        /// Any bytes handed to a decoder as a stored object: an error or a
        /// page of exactly the right length, never a panic.
        #[test]
        fn decoders_survive_random_objects(obj in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600)) {
            for algo in [Algo::Lz4, Algo::Lz4Hc(9), Algo::Zstd(1), Algo::Deflate(1)] {
                let mut c = algo.new_codec();
                let mut out = vec![0u8; 4096];
                let _ = c.decompress(&obj, &mut out);
            }
        }

        /// Any string as an algorithm name: parsed or refused, and what
        /// parses prints back to itself.
        #[test]
        fn algo_parser_survives_random_names(name in "\\PC{0,12}|(lz4|lz4hc|zstd|deflate|deflate-iaa)(:[0-9-]{0,4})?") {
            if let Ok(a) = name.parse::<Algo>() {
                proptest::prop_assert_eq!(a.to_string().parse::<Algo>(), Ok(a));
            }
        }
    }
}
