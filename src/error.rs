//! The engine's error type: every failure a request can meet, as a value.

use crate::codec::CodecError;
use std::fmt;

/// Why an engine operation failed. The store never panics on bad input:
/// each of these becomes an errno for the one request that caused it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// The byte range reaches past the end of the device.
    OutOfRange {
        /// First byte of the request.
        offset: u64,
        /// Length of the request in bytes.
        len: u64,
        /// Size of the device in bytes.
        size: u64,
    },
    /// The range is not 4 KB-aligned (zblk stores whole pages only).
    Misaligned {
        /// First byte of the request.
        offset: u64,
        /// Length of the request in bytes.
        len: u64,
    },
    /// A stored object failed to decompress: the page is not returned.
    Corrupt {
        /// Page index of the slot whose object is corrupt.
        page: u64,
        /// What the codec said.
        detail: String,
    },
    /// Storing the write would exceed `mem_limit` (or memory ran out); the
    /// old content of every slot in the write is kept.
    NoSpace {
        /// The limit in force, in bytes (0: no limit, the OS refused memory).
        limit: u64,
    },
    /// A configuration value is impossible (size zero, not a page multiple).
    InvalidConfig(String),
    /// A codec failed while compressing.
    Codec(CodecError),
    /// The backing store failed (a write of writeback, or its file).
    Backing(String),
}

impl Error {
    /// The negative errno a block device answers this error with.
    pub fn errno(&self) -> i32 {
        match self {
            Error::OutOfRange { .. } | Error::Misaligned { .. } | Error::InvalidConfig(_) => {
                -libc::EINVAL
            }
            Error::NoSpace { .. } => -libc::ENOSPC,
            Error::Corrupt { .. } | Error::Codec(_) | Error::Backing(_) => -libc::EIO,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::OutOfRange { offset, len, size } => write!(
                f,
                "range {offset}+{len} is beyond the end of the {size}-byte device"
            ),
            Error::Misaligned { offset, len } => write!(
                f,
                "range {offset}+{len} is not 4096-byte aligned (zblk stores whole pages)"
            ),
            Error::Corrupt { page, detail } => {
                write!(f, "stored page {page} is corrupt: {detail}")
            }
            Error::NoSpace { limit: 0 } => write!(f, "out of memory storing the write"),
            Error::NoSpace { limit } => {
                write!(f, "the write would exceed mem_limit ({limit} bytes)")
            }
            Error::InvalidConfig(m) => write!(f, "{m}"),
            Error::Codec(e) => write!(f, "{e}"),
            Error::Backing(m) => write!(f, "backing device: {m}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<CodecError> for Error {
    fn from(e: CodecError) -> Self {
        Error::Codec(e)
    }
}

/// Result with the engine's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
