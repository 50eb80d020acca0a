//! LZ4HC (lz4's high-compression mode) through liblz4's C sources, which
//! the `lz4-sys` crate bundles: the output is the plain LZ4 block format,
//! so pages decode at lz4's speed, with the lz4 codec's decoder.
//!
//! The compression state (`LZ4_streamHC_t`, 256 KB of hash and chain
//! tables) lives in a buffer the codec allocates once: `LZ4_compress_HC`
//! would allocate and free one per call. It is initialised once
//! (`LZ4_compress_HC_extStateHC` on the first call) and then reused with
//! `LZ4_compress_HC_extStateHC_fastReset`, which starts a new, independent
//! block without clearing the tables (liblz4 offsets the old positions
//! out of reach instead): clearing 256 KB per 4 KB page would cost more
//! than compressing it.

use super::{Algo, Codec, CodecError};
use libc::{c_char, c_int, c_void};

/// zram's default lz4hc level (`LZ4HC_CLEVEL_DEFAULT`).
pub const LZ4HC_DEFAULT_LEVEL: i32 = 9;
/// liblz4's highest level (`LZ4HC_CLEVEL_MAX`).
pub const LZ4HC_MAX_LEVEL: i32 = 12;

// liblz4's HC entry points, compiled into `lz4-sys`'s static library; the
// crate declares `LZ4_compress_HC` only, whose per-call allocation these
// avoid.
extern "C" {
    fn LZ4_sizeofStateHC() -> c_int;
    fn LZ4_compress_HC_extStateHC(
        state: *mut c_void,
        src: *const c_char,
        dst: *mut c_char,
        src_size: c_int,
        dst_capacity: c_int,
        level: c_int,
    ) -> c_int;
    fn LZ4_compress_HC_extStateHC_fastReset(
        state: *mut c_void,
        src: *const c_char,
        dst: *mut c_char,
        src_size: c_int,
        dst_capacity: c_int,
        level: c_int,
    ) -> c_int;
}

/// LZ4HC block codec with its own compression state.
pub struct Lz4HcCodec {
    level: i32,
    /// `LZ4_sizeofStateHC()` bytes, 8-byte aligned as liblz4 asks.
    state: Vec<u64>,
    /// Whether `state` has been initialised by a full `extStateHC` call.
    ready: bool,
}

impl std::fmt::Debug for Lz4HcCodec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lz4HcCodec")
            .field("level", &self.level)
            .finish_non_exhaustive()
    }
}

impl Lz4HcCodec {
    /// Creates an LZ4HC codec at `level` (1..=12).
    pub fn new(level: i32) -> Self {
        // SAFETY: only returns a constant size.
        let bytes = unsafe { LZ4_sizeofStateHC() }.max(0) as usize;
        Lz4HcCodec {
            level,
            state: vec![0; bytes.div_ceil(8)],
            ready: false,
        }
    }
}

impl Codec for Lz4HcCodec {
    fn algo(&self) -> Algo {
        Algo::Lz4Hc(self.level)
    }

    fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<Option<usize>, CodecError> {
        let (Ok(n), Ok(cap)) = (c_int::try_from(src.len()), c_int::try_from(dst.len())) else {
            return Err(CodecError::Internal(format!(
                "lz4hc: a {}-byte input is too large",
                src.len()
            )));
        };
        let compress = if self.ready {
            LZ4_compress_HC_extStateHC_fastReset
        } else {
            LZ4_compress_HC_extStateHC
        };
        // SAFETY: `state` is `LZ4_sizeofStateHC()` bytes, 8-byte aligned,
        // owned by this codec and used by no other call meanwhile
        // (`&mut self`); it was initialised by a full `extStateHC` call
        // before any `_fastReset` one. `src` and `dst` are valid for `n`
        // and `cap` bytes; liblz4 writes at most `cap`.
        let out = unsafe {
            compress(
                self.state.as_mut_ptr().cast(),
                src.as_ptr().cast(),
                dst.as_mut_ptr().cast(),
                n,
                cap,
                self.level,
            )
        };
        // A full call initialises the state whether the output fitted or
        // not (a failed one leaves it marked for reinitialisation, which
        // `_fastReset` does).
        self.ready = true;
        match usize::try_from(out) {
            Ok(0) | Err(_) => Ok(None),
            Ok(k) if k > dst.len() => Err(CodecError::overflow(k, dst.len())),
            Ok(k) => Ok(Some(k)),
        }
    }

    fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(), CodecError> {
        super::lz4::decompress_block(src, dst)
    }
}
