//! Zstandard through the zstd crate's bulk API, with contexts kept per thread.

use super::{Algo, Codec, CodecError};
use zstd::zstd_safe;

/// Zstandard codec holding its own compression and decompression contexts,
/// so that no per-call context allocation happens on the I/O path.
pub struct ZstdCodec {
    level: i32,
    cctx: zstd_safe::CCtx<'static>,
    dctx: zstd_safe::DCtx<'static>,
}

impl ZstdCodec {
    /// Creates a zstd codec at `level`.
    pub fn new(level: i32) -> Self {
        let mut cctx = zstd_safe::CCtx::create();
        // Frame metadata costs bytes per page; the slot already knows sizes.
        let _ = cctx.set_parameter(zstd_safe::CParameter::CompressionLevel(level));
        let _ = cctx.set_parameter(zstd_safe::CParameter::ContentSizeFlag(false));
        let _ = cctx.set_parameter(zstd_safe::CParameter::ChecksumFlag(false));
        let _ = cctx.set_parameter(zstd_safe::CParameter::DictIdFlag(false));
        let _ = cctx.set_parameter(zstd_safe::CParameter::Format(
            zstd_safe::FrameFormat::Magicless,
        ));
        let mut dctx = zstd_safe::DCtx::create();
        let _ = dctx.set_parameter(zstd_safe::DParameter::Format(
            zstd_safe::FrameFormat::Magicless,
        ));
        ZstdCodec { level, cctx, dctx }
    }
}

impl Codec for ZstdCodec {
    fn algo(&self) -> Algo {
        Algo::Zstd(self.level)
    }

    fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<Option<usize>, CodecError> {
        match self.cctx.compress2(dst, src) {
            Ok(n) => Ok(Some(n)),
            // dstSize_tooSmall: the page does not compress into the budget.
            Err(code) if zstd_safe::get_error_name(code).contains("too small") => Ok(None),
            Err(code) => Err(CodecError::Internal(format!(
                "zstd: {}",
                zstd_safe::get_error_name(code)
            ))),
        }
    }

    fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(), CodecError> {
        let want = dst.len();
        match self.dctx.decompress(dst, src) {
            Ok(n) if n == want => Ok(()),
            Ok(n) => Err(CodecError::Corrupt(format!(
                "zstd decoded {n} bytes, expected {want}"
            ))),
            Err(code) => Err(CodecError::Corrupt(format!(
                "zstd: {}",
                zstd_safe::get_error_name(code)
            ))),
        }
    }
}
