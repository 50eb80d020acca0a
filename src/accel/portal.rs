//! Submitting descriptors to a work queue.
//!
//! [`Submitter`] is the one seam between the backend and the hardware: the
//! real implementations write to a mapped WQ portal with MOVDIR64B
//! (dedicated WQ) or ENQCMD (shared WQ), or `write()` the descriptor to the
//! WQ's character device when the portal cannot be mapped (CPUs affected by
//! INTEL-SA-01084 need CAP_SYS_RAWIO for the mapping, and CPUs without the
//! instructions cannot use it). Tests plug in the software model instead.
//!
//! The MOVDIR64B/ENQCMD paths are compiled (x86_64 only) but have never
//! executed here: no machine this was built on has an IAA device.

use super::desc::DESC_SIZE;
use super::sysfs::{WqInfo, WqMode};
use std::fs::{File, OpenOptions};
use std::io;

/// What a work queue said to a submission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Submit {
    /// The descriptor was taken (for MOVDIR64B: was posted).
    Accepted,
    /// A shared WQ was full (ENQCMD set ZF, or `write()` gave EAGAIN):
    /// nothing was queued, try again.
    Retry,
}

/// Puts 64-byte descriptors into one work queue.
pub trait Submitter: Send + Sync {
    /// Submits one descriptor (the bytes of an `iax_hw_desc`).
    fn submit(&self, desc: &[u8; DESC_SIZE]) -> io::Result<Submit>;
    /// How descriptors are submitted, for logs (`movdir64b`, `enqcmd`,
    /// `write`, `model`).
    fn kind(&self) -> &'static str;
}

/// Opens a submitter for a discovered work queue.
pub trait PortalOpener: Send + Sync {
    /// Opens `wq` for submission.
    fn open(&self, wq: &WqInfo) -> io::Result<Box<dyn Submitter>>;
}

/// The real opener: opens `/dev/iax/wqN.M`, maps its portal when the CPU
/// has the instruction the WQ mode needs, else falls back to `write()`.
#[derive(Debug, Default, Clone, Copy)]
pub struct CdevOpener;

impl PortalOpener for CdevOpener {
    fn open(&self, wq: &WqInfo) -> io::Result<Box<dyn Submitter>> {
        let file = OpenOptions::new().read(true).write(true).open(&wq.cdev)?;
        #[cfg(target_arch = "x86_64")]
        {
            if x86::cpu_has(wq.mode) {
                match x86::MappedPortal::map(file.try_clone()?, wq.mode) {
                    Ok(p) => return Ok(Box::new(p)),
                    Err(e) => log::info!(
                        "deflate-iaa: cannot map the portal of {} ({e}); submitting with write()",
                        wq.name
                    ),
                }
            }
        }
        Ok(Box::new(WritePortal { file }))
    }
}

/// Submission by `write()` of the descriptor to the WQ's cdev: the kernel
/// submits it on our behalf (and fills in the PASID).
struct WritePortal {
    file: File,
}

impl Submitter for WritePortal {
    fn submit(&self, desc: &[u8; DESC_SIZE]) -> io::Result<Submit> {
        use std::io::Write;
        match (&self.file).write(desc) {
            Ok(DESC_SIZE) => Ok(Submit::Accepted),
            Ok(n) => Err(io::Error::other(format!(
                "short descriptor write: {n} bytes"
            ))),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(Submit::Retry),
            Err(e) => Err(e),
        }
    }

    fn kind(&self) -> &'static str {
        "write"
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! MOVDIR64B/ENQCMD to a mapped portal. Never executed in this
    //! project's tests (no IAA hardware): verified to build only.

    use super::{Submit, Submitter, WqMode, DESC_SIZE};
    use std::fs::File;
    use std::io;
    use std::os::fd::AsRawFd;
    use std::sync::atomic::{fence, Ordering};

    /// Size of a WQ portal mapping.
    const PORTAL_SIZE: usize = 0x1000;

    /// Whether the CPU has the submission instruction `mode` needs
    /// (CPUID.(EAX=7,ECX=0):ECX bit 28 MOVDIR64B, bit 29 ENQCMD).
    pub fn cpu_has(mode: WqMode) -> bool {
        // The intrinsic is unsafe on older toolchains and safe on newer.
        #[allow(unused_unsafe)]
        // SAFETY: CPUID leaf 7 exists on every x86_64 CPU that can host an
        // IAA device; on older ones it returns zeros (feature absent).
        let ecx = unsafe { core::arch::x86_64::__cpuid_count(7, 0) }.ecx;
        match mode {
            WqMode::Dedicated => ecx & (1 << 28) != 0,
            WqMode::Shared => ecx & (1 << 29) != 0,
        }
    }

    /// A mapped WQ portal.
    pub struct MappedPortal {
        _file: File,
        portal: *mut u8,
        mode: WqMode,
    }

    // SAFETY: the portal is an MMIO page written only with 64-byte atomic
    // stores (MOVDIR64B/ENQCMD); concurrent submitters are what a WQ is for.
    unsafe impl Send for MappedPortal {}
    // SAFETY: as above; `submit` takes `&self` and never reads the page.
    unsafe impl Sync for MappedPortal {}

    impl MappedPortal {
        /// Maps the portal page of the open cdev `file`.
        pub fn map(file: File, mode: WqMode) -> io::Result<Self> {
            // SAFETY: a fresh shared mapping of the device; the result is
            // checked against MAP_FAILED before use.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    PORTAL_SIZE,
                    libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_POPULATE,
                    file.as_raw_fd(),
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                return Err(io::Error::last_os_error());
            }
            Ok(MappedPortal {
                _file: file,
                portal: p.cast(),
                mode,
            })
        }
    }

    impl Drop for MappedPortal {
        fn drop(&mut self) {
            // SAFETY: unmapping exactly what `map` mapped.
            unsafe { libc::munmap(self.portal.cast(), PORTAL_SIZE) };
        }
    }

    impl Submitter for MappedPortal {
        fn submit(&self, desc: &[u8; DESC_SIZE]) -> io::Result<Submit> {
            // The zeroed completion record must be visible before the
            // device can write it (the kernel's wmb() before submission).
            fence(Ordering::SeqCst);
            // SAFETY: `portal` is a live portal mapping; `desc` is 64 bytes.
            // The instruction was checked present by `cpu_has`.
            let retry = unsafe {
                match self.mode {
                    WqMode::Dedicated => {
                        movdir64b(self.portal, desc.as_ptr());
                        false
                    }
                    WqMode::Shared => enqcmd(self.portal, desc.as_ptr()),
                }
            };
            Ok(if retry {
                Submit::Retry
            } else {
                Submit::Accepted
            })
        }

        fn kind(&self) -> &'static str {
            match self.mode {
                WqMode::Dedicated => "movdir64b",
                WqMode::Shared => "enqcmd",
            }
        }
    }

    /// MOVDIR64B: a posted 64-byte direct store of `src` to `portal`.
    /// Encoded as bytes (66 0F 38 F8 /r; rax = destination, [rdx] = source)
    /// so no assembler feature flag is needed.
    ///
    /// # Safety
    /// The CPU has MOVDIR64B (`cpu_has(WqMode::Dedicated)`); `portal` is a
    /// live, writable WQ portal mapping, 64-byte aligned as the destination
    /// must be (a page start is); `src` points to 64 readable bytes.
    unsafe fn movdir64b(portal: *mut u8, src: *const u8) {
        // SAFETY: the caller's contract; the instruction writes only the 64
        // bytes at `portal` and reads only the 64 at `src`, touches no
        // stack and no flags.
        unsafe {
            core::arch::asm!(
            ".byte 0x66, 0x0f, 0x38, 0xf8, 0x02",
                in("rax") portal,
                in("rdx") src,
                options(nostack, preserves_flags),
            );
        }
    }

    /// ENQCMD: a non-posted 64-byte enqueue; returns true when the shared
    /// WQ refused it (ZF=1, "retry"). Encoded as bytes (F2 0F 38 F8 /r).
    ///
    /// # Safety
    /// The CPU has ENQCMD (`cpu_has(WqMode::Shared)`) and the process has a
    /// PASID bound (the kernel binds one when a shared WQ is opened);
    /// `portal` is a live WQ portal mapping, 64-byte aligned (a page
    /// start); `src` points to 64 readable bytes.
    unsafe fn enqcmd(portal: *mut u8, src: *const u8) -> bool {
        let zf: u8;
        // SAFETY: the caller's contract; the instruction writes only the 64
        // bytes at `portal`, reads only the 64 at `src` and sets ZF, which
        // `setz` reads into a register; no stack is touched.
        unsafe {
            core::arch::asm!(
                ".byte 0xf2, 0x0f, 0x38, 0xf8, 0x02",
                "setz {zf}",
                zf = out(reg_byte) zf,
                in("rax") portal,
                in("rdx") src,
                options(nostack),
            );
        }
        zf != 0
    }
}
