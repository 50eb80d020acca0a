//! LZ4's block format (no frame: the slot knows the sizes), compressed and
//! decoded by liblz4 (`lz4-sys`'s bundled C sources). The decoder,
//! `LZ4_decompress_safe`, checks bounds on both buffers, so a corrupt
//! object fails its read and never writes outside the page. liblz4 is the
//! faster of the two lz4 implementations natively, with the same ratio
//! (BENCHMARKS.md, section 2 "The compressor" and section 1, has the
//! figures, and section 3 why emulation orders them the other way): real
//! processors are what the choice is for.
//!
//! The compression state (`LZ4_stream_t`, 16 KB of hash table) lives in a
//! buffer the codec allocates once ([`ExtState`], which lz4hc's codec
//! shares), so no call allocates. liblz4 clears its table before every
//! input of 4 KB or more (a page, a packed group): each is an independent
//! block. It compresses straight into a buffer smaller than the worst
//! case, giving up (0) when the output would not fit, so a page bound for a
//! slab object is never copied.

use super::{Algo, Codec, CodecError};
use libc::{c_char, c_int, c_void};

// liblz4's entry points with a caller-owned state and its one-shot decoder
// with a dictionary, compiled into `lz4-sys`'s static library, which the
// crate does not declare. `_fastReset` is in lz4.h's experimental section,
// for static linking only: its signature is that of the liblz4 1.10.0
// sources `lz4-sys` bundles and builds into every zblk binary.
extern "C" {
    fn LZ4_decompress_safe_usingDict(
        src: *const c_char,
        dst: *mut c_char,
        src_size: c_int,
        dst_capacity: c_int,
        dict: *const c_char,
        dict_size: c_int,
    ) -> c_int;
    fn LZ4_sizeofState() -> c_int;
    fn LZ4_compress_fast_extState(
        state: *mut c_void,
        src: *const c_char,
        dst: *mut c_char,
        src_size: c_int,
        dst_capacity: c_int,
        acceleration: c_int,
    ) -> c_int;
    fn LZ4_compress_fast_extState_fastReset(
        state: *mut c_void,
        src: *const c_char,
        dst: *mut c_char,
        src_size: c_int,
        dst_capacity: c_int,
        acceleration: c_int,
    ) -> c_int;
}

/// A liblz4 compressor with a caller-owned state: (state, src, dst,
/// src_size, dst_capacity, acceleration or level) to the output's length,
/// 0 if it did not fit.
type ExtStateFn =
    unsafe extern "C" fn(*mut c_void, *const c_char, *mut c_char, c_int, c_int, c_int) -> c_int;

/// One of liblz4's compressors that work in a state the caller allocates:
/// the state's size, the call that initialises it while compressing, and
/// the call that reuses an initialised one (`_fastReset`).
pub(super) struct ExtStateKind {
    name: &'static str,
    size: unsafe extern "C" fn() -> c_int,
    full: ExtStateFn,
    fast: ExtStateFn,
}

impl ExtStateKind {
    /// # Safety
    /// `size`, `full` and `fast` are liblz4's size query, initialising
    /// compressor and `_fastReset` compressor of one and the same state
    /// type.
    pub(super) const unsafe fn new(
        name: &'static str,
        size: unsafe extern "C" fn() -> c_int,
        full: ExtStateFn,
        fast: ExtStateFn,
    ) -> ExtStateKind {
        ExtStateKind {
            name,
            size,
            full,
            fast,
        }
    }
}

/// lz4's compressor (`LZ4_stream_t`, 16 KB of hash table).
// SAFETY: the three calls of `LZ4_stream_t`, as lz4.h pairs them.
const LZ4: ExtStateKind = unsafe {
    ExtStateKind::new(
        "lz4",
        LZ4_sizeofState,
        LZ4_compress_fast_extState,
        LZ4_compress_fast_extState_fastReset,
    )
};

/// A liblz4 compression state allocated once per codec, initialised by a
/// full call and reused by later ones (`_fastReset`), which start a new,
/// independent block without first clearing the whole state: lz4hc's 256
/// KB of tables would cost more to clear than a page to compress (liblz4
/// offsets the old positions out of reach instead). After a call that
/// failed (the output did not fit) the next one is a full call again:
/// lz4.h promises a valid state only after a successful one.
pub(super) struct ExtState {
    kind: &'static ExtStateKind,
    /// `kind.size()` bytes, 8-byte aligned as liblz4 asks.
    state: Vec<u64>,
    /// Whether `state` has been initialised by a `full` call.
    ready: bool,
}

impl ExtState {
    /// A state of `kind`, allocated and not yet initialised.
    pub(super) fn new(kind: &'static ExtStateKind) -> ExtState {
        // SAFETY: only returns a constant size.
        let bytes = unsafe { (kind.size)() }.max(0) as usize;
        ExtState {
            kind,
            state: vec![0; bytes.div_ceil(8)],
            ready: false,
        }
    }

    /// Compresses `src` into `dst` as one LZ4 block with `param` (lz4's
    /// acceleration, lz4hc's level): `Ok(None)` when it does not fit.
    pub(super) fn compress(
        &mut self,
        src: &[u8],
        dst: &mut [u8],
        param: c_int,
    ) -> Result<Option<usize>, CodecError> {
        let Ok(n) = c_int::try_from(src.len()) else {
            return Err(CodecError::Internal(format!(
                "{}: a {}-byte input is too large",
                self.kind.name,
                src.len()
            )));
        };
        // liblz4 takes an `int` capacity; it never writes more than that.
        let cap = c_int::try_from(dst.len()).unwrap_or(c_int::MAX);
        let compress = if self.ready {
            self.kind.fast
        } else {
            self.kind.full
        };
        // SAFETY: `state` is the size `kind` asks, 8-byte aligned, owned by
        // this value and used by no other call meanwhile (`&mut self`);
        // a `fast` call comes only after a successful call of `kind`, which
        // left the state initialised (the pair is one state type's:
        // `ExtStateKind::new`). `src` and `dst` are valid for `n` and at
        // least `cap` bytes; liblz4 reads at most `n` and writes at most
        // `cap`.
        let out = unsafe {
            compress(
                self.state.as_mut_ptr().cast(),
                src.as_ptr().cast(),
                dst.as_mut_ptr().cast(),
                n,
                cap,
                param,
            )
        };
        self.ready = out > 0;
        match usize::try_from(out) {
            Ok(0) | Err(_) => Ok(None),
            Ok(k) if k > dst.len() => Err(CodecError::overflow(k, dst.len())),
            Ok(k) => Ok(Some(k)),
        }
    }
}

/// liblz4's acceleration 1: its default, and what zram's lz4 runs.
const ACCELERATION: c_int = 1;

/// LZ4 block codec with its own compression state.
pub struct Lz4Codec {
    state: ExtState,
}

impl std::fmt::Debug for Lz4Codec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lz4Codec").finish_non_exhaustive()
    }
}

impl Default for Lz4Codec {
    fn default() -> Self {
        Lz4Codec::new()
    }
}

impl Lz4Codec {
    /// Creates an LZ4 codec.
    pub fn new() -> Self {
        Lz4Codec {
            state: ExtState::new(&LZ4),
        }
    }
}

impl Codec for Lz4Codec {
    fn algo(&self) -> Algo {
        Algo::Lz4
    }

    fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<Option<usize>, CodecError> {
        self.state.compress(src, dst, ACCELERATION)
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
