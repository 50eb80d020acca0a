//! zblk's benchmark drivers: the engine run over a file of pages, without a
//! kernel, for `zblk bench`, the examples and the criterion benches beside
//! the engine library.
//!
//! [`engine`] writes and reads back every page of an input and reports
//! ratios, throughput and latency, and gives the bare codec's throughput as
//! the ceiling the store path is measured against. [`discard`] measures
//! deferred against immediate free on the discarding threads, and
//! fragmentation before and after compaction. Both take the pages as a byte
//! slice (see [`engine::load_input`]) and use only the engine's root API.

#![warn(missing_docs)]

pub mod discard;
pub mod engine;

use std::fmt;
use std::path::PathBuf;

/// Why a driver did not run to the end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// The options or the input cannot be run (no pages, zero threads, an
    /// unreadable file).
    Input(String),
    /// A driver's thread panicked.
    Panicked(&'static str),
    /// The engine failed.
    Engine(zblk::Error),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Input(m) => write!(f, "{m}"),
            Error::Panicked(what) => write!(f, "{what} thread panicked"),
            Error::Engine(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Engine(e) => Some(e),
            _ => None,
        }
    }
}

impl From<zblk::Error> for Error {
    fn from(e: zblk::Error) -> Self {
        Error::Engine(e)
    }
}

/// What the drivers return.
pub type Result<T> = std::result::Result<T, Error>;

/// The median of a sample of rounds (the upper one of an even count; 0 for
/// none).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// The smallest of a sample (infinity for none).
pub fn min(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::INFINITY, f64::min)
}

/// The largest of a sample of non-negative figures (0 for none).
pub fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(0.0, f64::max)
}

/// The repository's fixture of 96 real memory pages
/// (`tests/fixtures/realmem-96.bin.zst`), for the bench crate's tests and
/// criterion benches; it exists only in a source checkout.
pub fn fixture_path() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/realmem-96.bin.zst"
    ))
}
