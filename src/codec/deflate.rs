//! Raw deflate through libdeflate: the format Intel IAA produces and decodes.
//!
//! Each buffer is compressed on its own, so back-references never reach
//! outside it; for single pages that keeps every distance within 4 KB, the
//! history window IAA hardware decodes.

use super::{Algo, Codec, CodecError};
use libdeflater::{CompressionLvl, Compressor, DecompressionError, Decompressor};

/// Raw-deflate codec with its own libdeflate compressor and decompressor.
pub struct DeflateCodec {
    algo: Algo,
    compressor: Compressor,
    decompressor: Decompressor,
}

impl DeflateCodec {
    /// Creates a deflate codec at `level` (1..=12), reporting itself as `algo`
    /// (`deflate` or `deflate-iaa`, which share this software path).
    pub fn new(level: i32, algo: Algo) -> Self {
        let lvl = CompressionLvl::new(level).unwrap_or_default();
        DeflateCodec {
            algo,
            compressor: Compressor::new(lvl),
            decompressor: Decompressor::new(),
        }
    }
}

impl Codec for DeflateCodec {
    fn algo(&self) -> Algo {
        self.algo
    }

    fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<Option<usize>, CodecError> {
        // libdeflate returns an error when the output does not fit.
        match self.compressor.deflate_compress(src, dst) {
            Ok(n) => Ok(Some(n)),
            Err(_) => Ok(None),
        }
    }

    fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(), CodecError> {
        let want = dst.len();
        match self.decompressor.deflate_decompress(src, dst) {
            Ok(n) if n == want => Ok(()),
            Ok(n) => Err(CodecError::Corrupt(format!(
                "deflate decoded {n} bytes, expected {want}"
            ))),
            Err(DecompressionError::BadData) => {
                Err(CodecError::Corrupt("deflate: bad data".into()))
            }
            Err(DecompressionError::InsufficientSpace) => Err(CodecError::Corrupt(
                "deflate: decodes to more than a page".into(),
            )),
        }
    }
}
