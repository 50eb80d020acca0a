//! LZ4 through lz4_flex's block format (no frame: the slot knows the sizes).

use super::{Algo, Codec, CodecError};

/// LZ4 block codec. lz4_flex keeps its hash table on the stack, so the
/// instance holds no state; it exists to fit the per-thread codec model.
#[derive(Debug, Default)]
pub struct Lz4Codec;

impl Lz4Codec {
    /// Creates an LZ4 codec.
    pub fn new() -> Self {
        Lz4Codec
    }
}

impl Codec for Lz4Codec {
    fn algo(&self) -> Algo {
        Algo::Lz4
    }

    fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<Option<usize>, CodecError> {
        // An output buffer smaller than the worst case makes lz4_flex stop
        // with an error once it runs out: that is our "does not fit".
        match lz4_flex::block::compress_into(src, dst) {
            Ok(n) => Ok(Some(n)),
            Err(_) => Ok(None),
        }
    }

    fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(), CodecError> {
        match lz4_flex::block::decompress_into(src, dst) {
            Ok(n) if n == dst.len() => Ok(()),
            Ok(n) => Err(CodecError::Corrupt(format!(
                "lz4 decoded {n} bytes, expected {}",
                dst.len()
            ))),
            Err(e) => Err(CodecError::Corrupt(format!("lz4: {e}"))),
        }
    }
}
