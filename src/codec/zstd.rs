//! Zstandard through the zstd crate's bulk API, with contexts kept per thread.
//!
//! The compression context lives in a workspace of its own, allocated once,
//! when the codec is made (`ZSTD_initStaticCCtx`), faulted in by the queue
//! thread's prefault ([`Codec::prefault`]), sized
//! for the largest input the store gives it; so does the decompression
//! context (`ZSTD_initStaticDCtx`, see [`FixedDCtx`]). A context zstd allocates
//! itself sizes its workspace to each input and reallocates it whenever an
//! input needs more, or far less for 128 calls in a row (at level 1 a
//! page needs 72 KB, a group of 3-4 pages 213 KB, a group of 8 177 KB), so
//! a packed store's mix of group sizes kept reallocating it, on a queue
//! thread, into heap memory never touched before: under memory pressure,
//! a page fault into direct reclaim that waits on the very swap writes the
//! thread is there to complete. A fixed workspace, faulted in before the
//! thread serves, guarantees that compressing never touches a fresh page.
//! An input larger than the workspace was sized for goes to an ordinary
//! context, made on first use.

use super::{Algo, Codec, CodecError};
use crate::page::PAGE_SIZE;
use std::ptr::NonNull;
use std::sync::Arc;
use zstd::zstd_safe;
use zstd::zstd_safe::zstd_sys;

/// An experiment's switch: `ZBLK_ZSTD_CCTX=dynamic` gives every codec made
/// afterwards zstd's own contexts instead of the fixed ones, so that the
/// two can be compared in one boot (BENCHMARKS.md, "The whole machine at
/// 1.5x RAM", has the comparison).
const CCTX_ENV: &str = "ZBLK_ZSTD_CCTX";

/// Zstandard codec holding its own compression and decompression contexts,
/// so that no per-call context allocation happens on the I/O path.
pub struct ZstdCodec {
    level: i32,
    fixed: Option<FixedCCtx>,
    /// For inputs over what `fixed` was sized for (or without it).
    cctx: Option<zstd_safe::CCtx<'static>>,
    fixed_d: Option<FixedDCtx>,
    /// Without `fixed_d`, or for a frame it lacks the memory for.
    dctx: Option<zstd_safe::DCtx<'static>>,
    /// The dictionary every context uses, if the codec has one; last, so
    /// that it outlives the contexts that refer to it.
    dict: Option<Dict>,
}

/// A codec's dictionary: the bytes (which the ordinary contexts load, a
/// copy each) and, prepared once for the codec's level, zstd's `CDict` and
/// `DDict` (which the fixed contexts refer to), or why zstd could not
/// prepare them.
struct Dict {
    bytes: Arc<[u8]>,
    prepared: Result<Prepared, String>,
}

/// A dictionary digested by zstd, for compression and for decompression.
struct Prepared {
    cdict: NonNull<zstd_sys::ZSTD_CDict>,
    ddict: NonNull<zstd_sys::ZSTD_DDict>,
}

// SAFETY: zstd's prepared dictionaries are read-only once made and not
// tied to a thread; the codec owns them.
unsafe impl Send for Prepared {}

impl Prepared {
    /// `bytes` prepared for compression at `level` and for decompression
    /// (zstd copies them); an error if zstd refuses (a trained dictionary's
    /// damaged tables).
    fn new(bytes: &[u8], level: i32) -> Result<Prepared, String> {
        let (at, len) = (bytes.as_ptr().cast(), bytes.len());
        // SAFETY: `bytes` is valid for `len` bytes; zstd copies them.
        let cdict = NonNull::new(unsafe { zstd_sys::ZSTD_createCDict(at, len, level) });
        // SAFETY: as above.
        let ddict = NonNull::new(unsafe { zstd_sys::ZSTD_createDDict(at, len) });
        match (cdict, ddict) {
            (Some(cdict), Some(ddict)) => Ok(Prepared { cdict, ddict }),
            (c, d) => {
                // SAFETY: whichever was made is freed once, here; the free
                // functions take null.
                unsafe {
                    zstd_sys::ZSTD_freeCDict(c.map_or(std::ptr::null_mut(), NonNull::as_ptr));
                    zstd_sys::ZSTD_freeDDict(d.map_or(std::ptr::null_mut(), NonNull::as_ptr));
                }
                Err(format!(
                    "zstd cannot load this {len}-byte dictionary at level {level}"
                ))
            }
        }
    }
}

impl Drop for Prepared {
    fn drop(&mut self) {
        // SAFETY: both were made by `Prepared::new` and are freed once,
        // here, after every context referring to them (`ZstdCodec::dict`
        // is its last field).
        unsafe {
            zstd_sys::ZSTD_freeCDict(self.cdict.as_ptr());
            zstd_sys::ZSTD_freeDDict(self.ddict.as_ptr());
        }
    }
}

/// Whether `bytes` can be a zstd dictionary at `level` (a trained one's
/// tables must be intact): `Err` says why not.
pub(super) fn check_dictionary(bytes: &[u8], level: i32) -> Result<(), String> {
    Prepared::new(bytes, level).map(drop)
}

/// A compression context in a workspace this codec owns (8-byte aligned,
/// as zstd asks), with the largest input it was sized for.
struct FixedCCtx {
    ctx: NonNull<zstd_sys::ZSTD_CCtx>,
    max_src: usize,
    workspace: Workspace,
}

// SAFETY: the context is used only through `&mut ZstdCodec` and points into
// the workspace the struct owns; zstd contexts are not tied to a thread.
unsafe impl Send for FixedCCtx {}

impl FixedCCtx {
    /// A context for level `level` and inputs of up to `pages` pages, with
    /// room for a dictionary of `dict_len` bytes (0: none), or `None` if
    /// zstd refuses.
    fn new(level: i32, pages: usize, dict_len: usize) -> Option<FixedCCtx> {
        // SAFETY: both calls only compute from their arguments.
        let estimate = |src: u64| unsafe {
            zstd_sys::ZSTD_estimateCCtxSize_usingCParams(zstd_sys::ZSTD_getCParams(
                level, src, dict_len,
            ))
        };
        // With a dictionary, a context takes the prepared dictionary's
        // parameters, made for an input of unknown size (0).
        let with_dict = if dict_len > 0 { estimate(0) } else { 0 };
        let bytes = (1..=pages.max(1))
            .map(|k| estimate((k * PAGE_SIZE) as u64))
            .max()?
            .max(with_dict);
        checked(bytes).ok()?;
        let workspace = Workspace::new(bytes);
        let (at, len) = workspace.raw();
        // SAFETY: the workspace is 8-byte aligned, `bytes` long at least,
        // and outlives the context (both live in the returned struct).
        let ctx = unsafe { zstd_sys::ZSTD_initStaticCCtx(at, len) };
        let fixed = FixedCCtx {
            ctx: NonNull::new(ctx)?,
            max_src: pages.max(1) * PAGE_SIZE,
            workspace,
        };
        let ok = fixed.set(zstd_sys::ZSTD_cParameter::ZSTD_c_compressionLevel, level)
            && fixed.set(zstd_sys::ZSTD_cParameter::ZSTD_c_contentSizeFlag, 0)
            && fixed.set(zstd_sys::ZSTD_cParameter::ZSTD_c_checksumFlag, 0)
            && fixed.set(zstd_sys::ZSTD_cParameter::ZSTD_c_dictIDFlag, 0)
            && fixed.set(
                zstd_sys::ZSTD_cParameter::ZSTD_c_experimentalParam2,
                zstd_sys::ZSTD_format_e::ZSTD_f_zstd1_magicless as i32,
            );
        ok.then_some(fixed)
    }

    /// Makes every frame refer to the prepared dictionary `p` (which must
    /// outlive the context); whether zstd took it.
    fn refer(&self, p: &Prepared) -> bool {
        // SAFETY: `ctx` is a live context this struct owns; `p.cdict` is a
        // live dictionary, kept by the codec past the context.
        checked(unsafe { zstd_sys::ZSTD_CCtx_refCDict(self.ctx.as_ptr(), p.cdict.as_ptr()) })
            .is_ok()
    }

    /// Sets one parameter; whether zstd took it.
    fn set(&self, p: zstd_sys::ZSTD_cParameter, v: i32) -> bool {
        // SAFETY: `ctx` is a live context this struct owns.
        checked(unsafe { zstd_sys::ZSTD_CCtx_setParameter(self.ctx.as_ptr(), p, v) }).is_ok()
    }

    /// `ZSTD_compress2`: the compressed size or zstd's error code.
    fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<usize, usize> {
        // SAFETY: `ctx` is a live compression context this struct owns.
        unsafe { bulk(zstd_sys::ZSTD_compress2, self.ctx, src, dst) }
    }
}

/// Memory a static zstd context lives in: 8-byte aligned (as zstd asks),
/// zeroed when made and not touched (so a store that never serves, a test,
/// pays nothing for it), faulted in by [`Workspace::touch`] on the thread
/// that will serve. Held as a raw pointer, not a `Box`, because zstd keeps
/// pointers into it.
struct Workspace {
    ptr: NonNull<u64>,
    words: usize,
}

impl Workspace {
    /// A workspace of at least `bytes`.
    fn new(bytes: usize) -> Workspace {
        let b = vec![0u64; bytes.div_ceil(8).max(1)].into_boxed_slice();
        let words = b.len();
        let raw = Box::into_raw(b) as *mut u64;
        Workspace {
            // SAFETY: Box::into_raw never returns null.
            ptr: unsafe { NonNull::new_unchecked(raw) },
            words,
        }
    }

    /// The start, for `ZSTD_initStatic*`, and the length in bytes.
    fn raw(&self) -> (*mut libc::c_void, usize) {
        (self.ptr.as_ptr().cast(), self.words * 8)
    }

    /// Faults every page in by rewriting one word of it with its own
    /// value: no byte changes under the context living there.
    fn touch(&mut self) {
        for i in (0..self.words).step_by(PAGE_SIZE / 8) {
            // SAFETY: `i` is within the allocation; `&mut self` means no
            // zstd call runs meanwhile, and the word is written back
            // unchanged.
            unsafe {
                let w = self.ptr.as_ptr().add(i);
                std::ptr::write_volatile(w, std::ptr::read_volatile(w));
            }
        }
    }
}

impl Drop for Workspace {
    fn drop(&mut self) {
        // SAFETY: `ptr` and `words` came from the boxed slice made in
        // `new`, freed only here; the context in it goes with the struct.
        unsafe {
            drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                self.ptr.as_ptr(),
                self.words,
            )));
        }
    }
}

/// A decompression context in a workspace this codec owns. zstd's own
/// decompression context is one heap block of about 94 KB that is touched
/// only as it is used: a group whose literals went to its 64 KB literal
/// buffer would write into pages no earlier call had touched, a page
/// fault into reclaim on a queue thread. In a workspace of its own,
/// faulted in by the prefault, no decompression touches a fresh page.
struct FixedDCtx {
    ctx: NonNull<zstd_sys::ZSTD_DCtx>,
    workspace: Workspace,
}

// SAFETY: as for `FixedCCtx`.
unsafe impl Send for FixedDCtx {}

impl FixedDCtx {
    /// A magicless-frame decompression context, or `None` if zstd refuses.
    fn new() -> Option<FixedDCtx> {
        // SAFETY: only computes a size.
        let bytes = unsafe { zstd_sys::ZSTD_estimateDCtxSize() };
        let workspace = Workspace::new(bytes);
        let (at, len) = workspace.raw();
        // SAFETY: the workspace is 8-byte aligned, `bytes` long at least,
        // and outlives the context (both live in the returned struct).
        let ctx = unsafe { zstd_sys::ZSTD_initStaticDCtx(at, len) };
        let fixed = FixedDCtx {
            ctx: NonNull::new(ctx)?,
            workspace,
        };
        // SAFETY: `ctx` is a live context the struct owns.
        let r = unsafe {
            zstd_sys::ZSTD_DCtx_setParameter(
                fixed.ctx.as_ptr(),
                zstd_sys::ZSTD_dParameter::ZSTD_d_experimentalParam1,
                zstd_sys::ZSTD_format_e::ZSTD_f_zstd1_magicless as i32,
            )
        };
        checked(r).is_ok().then_some(fixed)
    }

    /// Decodes every frame with the prepared dictionary `p` (which must
    /// outlive the context); whether zstd took it.
    fn refer(&self, p: &Prepared) -> bool {
        // SAFETY: `ctx` is a live context this struct owns; `p.ddict` is a
        // live dictionary, kept by the codec past the context.
        checked(unsafe { zstd_sys::ZSTD_DCtx_refDDict(self.ctx.as_ptr(), p.ddict.as_ptr()) })
            .is_ok()
    }

    /// `ZSTD_decompressDCtx`: the decompressed size or zstd's error code.
    fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<usize, usize> {
        // SAFETY: `ctx` is a live decompression context this struct owns.
        unsafe { bulk(zstd_sys::ZSTD_decompressDCtx, self.ctx, src, dst) }
    }
}

/// A decompression context zstd allocates itself, for magicless frames,
/// with a copy of `dict` if given.
fn dynamic_dctx(dict: Option<&Dict>) -> zstd_safe::DCtx<'static> {
    let mut dctx = zstd_safe::DCtx::create();
    let _ = dctx.set_parameter(zstd_safe::DParameter::Format(
        zstd_safe::FrameFormat::Magicless,
    ));
    if let Some(d) = dict {
        // Refused only if zstd cannot load it: then `Prepared::new` failed
        // too, and the codec refuses every call before it gets here.
        let _ = dctx.load_dictionary(&d.bytes);
    }
    dctx
}

/// A context zstd allocates itself, with this codec's parameters and a
/// copy of `dict` if given.
fn dynamic_cctx(level: i32, dict: Option<&Dict>) -> zstd_safe::CCtx<'static> {
    let mut cctx = zstd_safe::CCtx::create();
    // Frame metadata costs bytes per page; the slot already knows sizes.
    let _ = cctx.set_parameter(zstd_safe::CParameter::CompressionLevel(level));
    let _ = cctx.set_parameter(zstd_safe::CParameter::ContentSizeFlag(false));
    let _ = cctx.set_parameter(zstd_safe::CParameter::ChecksumFlag(false));
    let _ = cctx.set_parameter(zstd_safe::CParameter::DictIdFlag(false));
    let _ = cctx.set_parameter(zstd_safe::CParameter::Format(
        zstd_safe::FrameFormat::Magicless,
    ));
    if let Some(d) = dict {
        // As in `dynamic_dctx`.
        let _ = cctx.load_dictionary(&d.bytes);
    }
    cctx
}

impl ZstdCodec {
    /// Creates a zstd codec at `level` for inputs of up to
    /// `DEFAULT_CODEC_PAGES` pages (larger ones are compressed too, by a
    /// context made on first use).
    #[cfg(any(test, feature = "test-support"))]
    pub fn new(level: i32) -> Self {
        Self::for_pages(level, super::DEFAULT_CODEC_PAGES)
    }

    /// Creates a zstd codec at `level` whose compression context is sized,
    /// and faulted in, for inputs of up to `pages` pages; 0 for a codec that
    /// only decompresses (a compression, should one come, gets an ordinary
    /// context on first use).
    pub fn for_pages(level: i32, pages: usize) -> Self {
        Self::with_dict(level, pages, None)
    }

    /// [`ZstdCodec::for_pages`] priming every page with the dictionary
    /// `dict` (raw content, or a dictionary zstd's trainer made), prepared
    /// once here. If zstd cannot prepare it every call fails, saying why
    /// (`check_dictionary` refuses such a dictionary before a store has
    /// it).
    pub fn with_dict(level: i32, pages: usize, dict: Option<Arc<[u8]>>) -> Self {
        let dict = dict.map(|bytes| Dict {
            prepared: Prepared::new(&bytes, level),
            bytes,
        });
        let prepared = dict.as_ref().and_then(|d| d.prepared.as_ref().ok());
        let dict_len = dict.as_ref().map_or(0, |d| d.bytes.len());
        let dynamic = std::env::var(CCTX_ENV).is_ok_and(|v| v == "dynamic");
        let (fixed, fixed_d) = match dynamic {
            true => (None, None),
            false => (
                (pages > 0)
                    .then(|| FixedCCtx::new(level, pages, dict_len))
                    .flatten()
                    .filter(|f| prepared.map_or(true, |p| f.refer(p))),
                FixedDCtx::new().filter(|f| prepared.map_or(true, |p| f.refer(p))),
            ),
        };
        if !dynamic && ((pages > 0 && fixed.is_none()) || fixed_d.is_none()) {
            log::warn!("zstd: no fixed context; zstd allocates its own");
        }
        ZstdCodec {
            level,
            fixed,
            cctx: None,
            dctx: fixed_d.is_none().then(|| dynamic_dctx(dict.as_ref())),
            fixed_d,
            dict,
        }
    }

    /// Whether no call so far needed an ordinary context.
    #[cfg(test)]
    pub(super) fn uses_fixed_contexts(&self) -> bool {
        self.cctx.is_none() && self.dctx.is_none()
    }

    /// Why this codec cannot run: its dictionary could not be prepared.
    fn unusable(&self) -> Result<(), CodecError> {
        match self.dict.as_ref().map(|d| &d.prepared) {
            Some(Err(why)) => Err(CodecError::Internal(why.clone())),
            _ => Ok(()),
        }
    }
}

/// A zstd function's result: `Ok` with its value, or `Err` with the error
/// code.
fn checked(r: usize) -> Result<usize, usize> {
    // SAFETY: ZSTD_isError only reads the code.
    if unsafe { zstd_sys::ZSTD_isError(r) } == 0 {
        Ok(r)
    } else {
        Err(r)
    }
}

/// One of zstd's bulk calls (`ZSTD_compress2`, `ZSTD_decompressDCtx`) of
/// `ctx` from `src` into `dst`, checked.
///
/// # Safety
/// `ctx` must be a live context of the kind `f` takes, used by no one else
/// during the call.
unsafe fn bulk<T>(
    f: unsafe extern "C" fn(*mut T, *mut libc::c_void, usize, *const libc::c_void, usize) -> usize,
    ctx: NonNull<T>,
    src: &[u8],
    dst: &mut [u8],
) -> Result<usize, usize> {
    // SAFETY: `ctx` as the caller promises; `dst` and `src` are valid for
    // the lengths passed.
    checked(unsafe {
        f(
            ctx.as_ptr(),
            dst.as_mut_ptr().cast(),
            dst.len(),
            src.as_ptr().cast(),
            src.len(),
        )
    })
}

/// Whether zstd's result `code` is the error `e` (by code, not by name).
fn is_error(code: usize, e: zstd_sys::ZSTD_ErrorCode) -> bool {
    // SAFETY: ZSTD_getErrorCode only reads the code.
    unsafe { zstd_sys::ZSTD_getErrorCode(code) == e }
}

/// Whether a static context lacked the memory for a call (it never
/// allocates: it fails instead).
fn out_of_room(code: usize) -> bool {
    is_error(code, zstd_sys::ZSTD_ErrorCode::ZSTD_error_memory_allocation)
}

/// What a zstd error code means for a page: `Ok(None)` when the output did
/// not fit the budget (the page does not compress enough), else a failure.
fn refusal(code: usize) -> Result<Option<usize>, CodecError> {
    if is_error(code, zstd_sys::ZSTD_ErrorCode::ZSTD_error_dstSize_tooSmall) {
        Ok(None)
    } else {
        Err(CodecError::Internal(format!(
            "zstd: {}",
            zstd_safe::get_error_name(code)
        )))
    }
}

impl Codec for ZstdCodec {
    fn algo(&self) -> Algo {
        Algo::Zstd(self.level)
    }

    fn prefault(&mut self) {
        if let Some(f) = self.fixed.as_mut() {
            f.workspace.touch();
        }
        if let Some(f) = self.fixed_d.as_mut() {
            f.workspace.touch();
        }
    }

    fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<Option<usize>, CodecError> {
        self.unusable()?;
        if let Some(f) = self.fixed.as_mut().filter(|f| src.len() <= f.max_src) {
            match f.compress(src, dst) {
                Ok(n) => return Ok(Some(n)),
                // Sized too small after all: the ordinary context below.
                Err(code) if out_of_room(code) => {}
                // dstSize_tooSmall: the page does not compress into the budget.
                Err(code) => return refusal(code),
            }
        }
        let (level, dict) = (self.level, self.dict.as_ref());
        let cctx = self.cctx.get_or_insert_with(|| dynamic_cctx(level, dict));
        match cctx.compress2(dst, src) {
            Ok(n) => Ok(Some(n)),
            Err(code) => refusal(code),
        }
    }

    fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(), CodecError> {
        self.unusable()?;
        let want = dst.len();
        let r = match self.fixed_d.as_mut().map(|f| f.decompress(src, dst)) {
            // Out of memory in a static context: the ordinary one below.
            Some(Err(code)) if out_of_room(code) => None,
            r => r,
        };
        let dict = self.dict.as_ref();
        let r = r.unwrap_or_else(|| {
            self.dctx
                .get_or_insert_with(|| dynamic_dctx(dict))
                .decompress(dst, src)
        });
        match r {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn text(pages: usize) -> Vec<u8> {
        let words: [&[u8]; 4] = [b"swap ", b"page ", b"memory ", b"zblk "];
        let mut x = 7u32;
        let mut v = Vec::new();
        while v.len() < pages * PAGE_SIZE {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            v.extend_from_slice(words[(x >> 16) as usize % 4]);
            v.push(b'a' + (x >> 8) as u8 % 26);
        }
        v.truncate(pages * PAGE_SIZE);
        v
    }

    #[test]
    fn a_fixed_context_without_room_falls_back_and_frames_interchange() {
        let data = text(8);
        let mut out = vec![0u8; 2 * data.len()];
        // A context sized for one page that claims to take eight: zstd
        // runs out of room in it, and the ordinary context takes over.
        let mut c = ZstdCodec::for_pages(1, 1);
        if let Some(f) = c.fixed.as_mut() {
            f.max_src = 8 * PAGE_SIZE;
        }
        let n = c
            .compress(&data, &mut out)
            .expect("compress")
            .expect("fits");
        assert!(c.cctx.is_some(), "the fallback context was not used");
        // Frames of either context decode with the other's.
        let mut back = vec![0u8; data.len()];
        let mut dynamic = ZstdCodec {
            fixed: None,
            fixed_d: None,
            dctx: Some(dynamic_dctx(None)),
            ..ZstdCodec::for_pages(1, 8)
        };
        dynamic
            .decompress(&out[..n], &mut back)
            .expect("dynamic decode");
        assert!(back == data);
        let mut fixed = ZstdCodec::for_pages(1, 8);
        let m = fixed
            .compress(&data, &mut out)
            .expect("compress")
            .expect("fits");
        assert!(fixed.cctx.is_none(), "a fitting input used the fallback");
        assert_eq!(m, n, "the two contexts' frames differ");
        back.fill(0);
        dynamic.decompress(&out[..m], &mut back).expect("decode");
        assert!(back == data);
        // A budget the output does not fit is a refusal, not an error.
        assert_eq!(fixed.compress(&data, &mut out[..64]), Ok(None));
    }
}
