//! LZ4's block format (no frame: the slot knows the sizes): compressed by
//! zblk-lz4 (lz4_flex's compressor), decoded by liblz4's
//! `LZ4_decompress_safe` (through `lz4-sys`, bounds-checked on both
//! buffers), which decodes these pages faster than lz4_flex's decoder
//! (BENCHMARKS.md, "lz4hc": the `lz4_decoders` example).

use super::{Algo, Codec, CodecError};
use libc::c_int;

/// LZ4 block codec. lz4_flex keeps its hash table on the stack; the
/// instance holds a worst-case output buffer, because lz4_flex refuses to
/// start compressing into anything smaller than the worst case.
#[derive(Debug, Default)]
pub struct Lz4Codec {
    out: Vec<u8>,
}

impl Lz4Codec {
    /// Creates an LZ4 codec.
    pub fn new() -> Self {
        Lz4Codec {
            out: vec![0; lz4_flex::block::get_maximum_output_size(crate::page::PAGE_SIZE)],
        }
    }
}

impl Codec for Lz4Codec {
    fn algo(&self) -> Algo {
        Algo::Lz4
    }

    fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<Option<usize>, CodecError> {
        let bound = lz4_flex::block::get_maximum_output_size(src.len());
        if dst.len() >= bound {
            return compress_fitting(src, dst);
        }
        if self.out.len() < bound {
            self.out.resize(bound, 0);
        }
        match compress_fitting(src, &mut self.out)? {
            Some(n) if n <= dst.len() => {
                dst[..n].copy_from_slice(&self.out[..n]);
                Ok(Some(n))
            }
            _ => Ok(None),
        }
    }

    fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(), CodecError> {
        decompress_block(src, dst)
    }
}

/// Decodes one LZ4 block `src` into all of `dst` (lz4 and lz4hc objects
/// alike): an error unless it decodes to exactly `dst.len()` bytes.
pub(super) fn decompress_block(src: &[u8], dst: &mut [u8]) -> Result<(), CodecError> {
    decompress_block_with(src, dst, &[])
}

/// [`decompress_block`] of a block compressed with the dictionary `dict`
/// (empty: none).
pub(super) fn decompress_block_with(
    src: &[u8],
    dst: &mut [u8],
    dict: &[u8],
) -> Result<(), CodecError> {
    let (Ok(n), Ok(cap), Ok(d)) = (
        c_int::try_from(src.len()),
        c_int::try_from(dst.len()),
        c_int::try_from(dict.len()),
    ) else {
        return Err(CodecError::Corrupt(format!(
            "lz4: a {}-byte object is too large",
            src.len()
        )));
    };
    let (s, o) = (src.as_ptr().cast(), dst.as_mut_ptr().cast());
    // SAFETY: `src`, `dst` and `dict` are valid for `n`, `cap` and `d`
    // bytes; liblz4 reads at most `n` of `src` and `d` of `dict` and writes
    // at most `cap` whatever the input holds (a match reaching before the
    // dictionary is an error).
    let out = unsafe {
        if dict.is_empty() {
            lz4_sys::LZ4_decompress_safe(s, o, n, cap)
        } else {
            LZ4_decompress_safe_usingDict(s, o, n, cap, dict.as_ptr().cast(), d)
        }
    };
    match usize::try_from(out) {
        Ok(k) if k == dst.len() => Ok(()),
        Ok(k) => Err(CodecError::Corrupt(format!(
            "lz4 decoded {k} bytes, expected {}",
            dst.len()
        ))),
        Err(_) => Err(CodecError::Corrupt(format!("lz4: liblz4 error {out}"))),
    }
}

// liblz4's one-shot decoder with a dictionary (stable API, compiled into
// `lz4-sys`'s static library), which the crate does not declare.
extern "C" {
    fn LZ4_decompress_safe_usingDict(
        src: *const libc::c_char,
        dst: *mut libc::c_char,
        src_size: c_int,
        dst_capacity: c_int,
        dict: *const libc::c_char,
        dict_size: c_int,
    ) -> c_int;
}

/// Compresses into a buffer of at least the worst-case size, through
/// zblk-lz4 (the compressor generated in a crate of its own, for the fuzz
/// build; see there).
fn compress_fitting(src: &[u8], dst: &mut [u8]) -> Result<Option<usize>, CodecError> {
    zblk_lz4::compress_into(src, dst)
        .map(Some)
        .map_err(|e| CodecError::Internal(format!("lz4: {e}")))
}
