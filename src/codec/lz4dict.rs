//! LZ4 and LZ4HC with a dictionary, through liblz4 (`lz4-sys`'s bundled C
//! sources): the output is the plain LZ4 block format whose matches may
//! reach back into the dictionary, decoded by `LZ4_decompress_safe_usingDict`.
//!
//! The dictionary is hashed once per codec, into a stream of its own
//! (`LZ4_loadDict`, `LZ4_loadDictHC`); each page then starts a new block
//! in a working stream that refers to it (`LZ4_attach_dictionary`,
//! `LZ4_attach_HC_dictionary`) rather than copying or re-hashing its
//! tables, so a page costs what it costs without a dictionary. liblz4
//! keeps pointers into the dictionary's bytes, which the codec holds.

use super::{Algo, Codec, CodecError};
use libc::{c_char, c_int, c_void};
use std::ptr::NonNull;
use std::sync::Arc;

// liblz4's streaming entry points (stable since 1.10.0, compiled into
// `lz4-sys`'s static library), which the crate does not declare. The
// streams are opaque: only liblz4 reads them.
extern "C" {
    fn LZ4_createStream() -> *mut c_void;
    fn LZ4_freeStream(stream: *mut c_void) -> c_int;
    fn LZ4_loadDict(stream: *mut c_void, dict: *const c_char, size: c_int) -> c_int;
    fn LZ4_resetStream_fast(stream: *mut c_void);
    fn LZ4_attach_dictionary(working: *mut c_void, dict: *const c_void);
    fn LZ4_compress_fast_continue(
        stream: *mut c_void,
        src: *const c_char,
        dst: *mut c_char,
        src_size: c_int,
        dst_capacity: c_int,
        acceleration: c_int,
    ) -> c_int;
    fn LZ4_createStreamHC() -> *mut c_void;
    fn LZ4_freeStreamHC(stream: *mut c_void) -> c_int;
    fn LZ4_setCompressionLevel(stream: *mut c_void, level: c_int);
    fn LZ4_loadDictHC(stream: *mut c_void, dict: *const c_char, size: c_int) -> c_int;
    fn LZ4_resetStreamHC_fast(stream: *mut c_void, level: c_int);
    fn LZ4_attach_HC_dictionary(working: *mut c_void, dict: *const c_void);
    fn LZ4_compress_HC_continue(
        stream: *mut c_void,
        src: *const c_char,
        dst: *mut c_char,
        src_size: c_int,
        dst_capacity: c_int,
    ) -> c_int;
}

/// One liblz4 stream (`LZ4_stream_t` or `LZ4_streamHC_t`), freed with it.
struct Stream {
    ptr: NonNull<c_void>,
    hc: bool,
}

impl Stream {
    /// A fresh, initialised stream of either kind.
    fn new(hc: bool) -> Stream {
        // SAFETY: both allocate and initialise a stream, or return null.
        let p = unsafe {
            if hc {
                LZ4_createStreamHC()
            } else {
                LZ4_createStream()
            }
        };
        match NonNull::new(p) {
            Some(ptr) => Stream { ptr, hc },
            // liblz4's malloc failed: what a failed Rust allocation does
            // (the layout only names a size for the message).
            None => std::alloc::handle_alloc_error(std::alloc::Layout::new::<[u64; 2048]>()),
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: the stream came from the matching create call and is
        // freed once, here.
        unsafe {
            if self.hc {
                LZ4_freeStreamHC(self.ptr.as_ptr());
            } else {
                LZ4_freeStream(self.ptr.as_ptr());
            }
        }
    }
}

/// LZ4 (`level` `None`) or LZ4HC at `level` with a dictionary.
pub struct Lz4DictCodec {
    level: Option<i32>,
    dict: Arc<[u8]>,
    /// The dictionary, hashed; refers to `dict`'s bytes.
    loaded: Stream,
    /// Each page's block.
    working: Stream,
}

// SAFETY: the streams are used only through `&mut self`; liblz4 streams are
// not tied to a thread; `dict` is immutable shared bytes.
unsafe impl Send for Lz4DictCodec {}

impl std::fmt::Debug for Lz4DictCodec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lz4DictCodec")
            .field("level", &self.level)
            .field("dict", &self.dict.len())
            .finish_non_exhaustive()
    }
}

impl Lz4DictCodec {
    /// An LZ4 (`level` `None`) or LZ4HC codec priming every page with
    /// `dict` (at most [`super::MAX_DICT_BYTES`]: liblz4 keeps the last
    /// 64 KB of a longer one).
    pub fn new(level: Option<i32>, dict: Arc<[u8]>) -> Lz4DictCodec {
        let hc = level.is_some();
        let loaded = Stream::new(hc);
        let size = c_int::try_from(dict.len()).unwrap_or(c_int::MAX);
        // SAFETY: `loaded` is a fresh stream of the kind each call takes;
        // `dict` is valid for `size` bytes and lives as long as the codec,
        // which owns both.
        unsafe {
            match level {
                Some(l) => {
                    LZ4_setCompressionLevel(loaded.ptr.as_ptr(), l);
                    LZ4_loadDictHC(loaded.ptr.as_ptr(), dict.as_ptr().cast(), size);
                }
                None => {
                    LZ4_loadDict(loaded.ptr.as_ptr(), dict.as_ptr().cast(), size);
                }
            }
        }
        Lz4DictCodec {
            level,
            working: Stream::new(hc),
            loaded,
            dict,
        }
    }
}

impl Codec for Lz4DictCodec {
    fn algo(&self) -> Algo {
        self.level.map_or(Algo::Lz4, Algo::Lz4Hc)
    }

    fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<Option<usize>, CodecError> {
        let (Ok(n), Ok(cap)) = (c_int::try_from(src.len()), c_int::try_from(dst.len())) else {
            return Err(CodecError::Internal(format!(
                "lz4: a {}-byte input is too large",
                src.len()
            )));
        };
        let (w, d) = (self.working.ptr.as_ptr(), self.loaded.ptr.as_ptr());
        let (s, o) = (src.as_ptr().cast(), dst.as_mut_ptr().cast());
        // SAFETY: `w` and `d` are this codec's streams of the kind each call
        // takes (`&mut self`: no other call uses them); `d` holds the loaded
        // dictionary, whose bytes the codec owns; each page starts a new
        // block (the reset) before it attaches the dictionary. `src` and
        // `dst` are valid for `n` and `cap` bytes; liblz4 writes at most
        // `cap` (0: the output did not fit).
        let out = unsafe {
            match self.level {
                Some(level) => {
                    LZ4_resetStreamHC_fast(w, level);
                    LZ4_attach_HC_dictionary(w, d);
                    LZ4_compress_HC_continue(w, s, o, n, cap)
                }
                None => {
                    LZ4_resetStream_fast(w);
                    LZ4_attach_dictionary(w, d);
                    LZ4_compress_fast_continue(w, s, o, n, cap, 1)
                }
            }
        };
        match usize::try_from(out) {
            Ok(0) | Err(_) => Ok(None),
            Ok(k) if k > dst.len() => Err(CodecError::overflow(k, dst.len())),
            Ok(k) => Ok(Some(k)),
        }
    }

    fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(), CodecError> {
        super::lz4::decompress_block_with(src, dst, &self.dict)
    }
}
