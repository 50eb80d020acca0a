//! `none`: no compression. Every page that is not same-filled is stored
//! raw, as a huge page is; same-filled detection and discard still work.
//! A legitimate choice for incompressible data, and the baseline that
//! separates the engine's and the transport's cost from the codec's.

use super::{Algo, Codec, CodecError};

/// The codec that never compresses.
#[derive(Debug, Default)]
pub struct NoneCodec;

impl Codec for NoneCodec {
    fn algo(&self) -> Algo {
        Algo::None
    }

    /// Never fits: the store keeps the page raw.
    fn compress(&mut self, _src: &[u8], _dst: &mut [u8]) -> Result<Option<usize>, CodecError> {
        Ok(None)
    }

    /// Nothing is ever stored compressed by this codec: a compressed object
    /// under `none` is corrupt.
    fn decompress(&mut self, _src: &[u8], _dst: &mut [u8]) -> Result<(), CodecError> {
        Err(CodecError::Corrupt(
            "no compressed object is stored under 'none'".into(),
        ))
    }
}
