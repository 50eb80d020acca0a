//! LZ4HC (lz4's high-compression mode) through liblz4's C sources, which
//! the `lz4-sys` crate bundles: the output is the plain LZ4 block format,
//! so pages decode at lz4's speed, with the lz4 codec's decoder.
//!
//! The compression state (`LZ4_streamHC_t`, 256 KB of hash and chain
//! tables) lives in a buffer the codec allocates once (lz4's `ExtState`):
//! `LZ4_compress_HC` would allocate and free one per call. It is
//! initialised once (`LZ4_compress_HC_extStateHC` on the first call) and
//! then reused with `LZ4_compress_HC_extStateHC_fastReset`, which starts a
//! new, independent block without clearing the tables: clearing 256 KB per
//! 4 KB page would cost more than compressing it.

use super::lz4::{ExtState, ExtStateKind};
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

/// LZ4HC's compressor (`LZ4_streamHC_t`).
// SAFETY: the three calls of `LZ4_streamHC_t`, as lz4hc.h pairs them.
const LZ4HC: ExtStateKind = unsafe {
    ExtStateKind::new(
        "lz4hc",
        LZ4_sizeofStateHC,
        LZ4_compress_HC_extStateHC,
        LZ4_compress_HC_extStateHC_fastReset,
    )
};

/// LZ4HC block codec with its own compression state.
pub struct Lz4HcCodec {
    level: i32,
    state: ExtState,
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
        Lz4HcCodec {
            level,
            state: ExtState::new(&LZ4HC),
        }
    }
}

impl Codec for Lz4HcCodec {
    fn algo(&self) -> Algo {
        Algo::Lz4Hc(self.level)
    }

    fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<Option<usize>, CodecError> {
        self.state.compress(src, dst, self.level)
    }

    fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(), CodecError> {
        super::lz4::decompress_block(src, dst)
    }
}
