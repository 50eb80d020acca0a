//! Work queues the process can submit to, shared by every codec instance.
//!
//! A dedicated WQ admits one opener per process and silently loses posted
//! descriptors beyond its size, so the open WQs live in one process-wide
//! [`Router`] and each carries a credit count that bounds in-flight
//! descriptors across all queue threads.

use super::portal::{CdevOpener, PortalOpener, Submit, Submitter};
use super::sysfs::{self, WqInfo, WqMode};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

/// Environment variable overriding the sysfs root for discovery.
pub const SYSFS_ROOT_ENV: &str = "ZBLK_IAA_SYSFS_ROOT";
/// Environment variable overriding the cdev directory (`/dev/iax`).
pub const DEV_ROOT_ENV: &str = "ZBLK_IAA_DEV_ROOT";

/// An open work queue.
pub struct WorkQueue {
    /// What sysfs said about it.
    pub info: WqInfo,
    submitter: Box<dyn Submitter>,
    /// Free descriptor entries (dedicated WQs); unused for shared WQs,
    /// where ENQCMD itself reports a full queue.
    credits: AtomicU32,
    /// Descriptors accepted.
    pub submitted: AtomicU64,
    /// ENQCMD/`write()` "retry" answers seen.
    pub retries: AtomicU64,
}

impl WorkQueue {
    /// Wraps an opened submitter.
    pub fn new(info: WqInfo, submitter: Box<dyn Submitter>) -> Self {
        let credits = AtomicU32::new(info.size);
        WorkQueue {
            info,
            submitter,
            credits,
            submitted: AtomicU64::new(0),
            retries: AtomicU64::new(0),
        }
    }

    /// How descriptors are submitted to this queue.
    pub fn kind(&self) -> &'static str {
        self.submitter.kind()
    }

    /// Takes one in-flight credit on a dedicated WQ; false when it is full.
    pub(crate) fn acquire(&self) -> bool {
        if self.info.mode == WqMode::Shared {
            return true;
        }
        self.credits
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| c.checked_sub(1))
            .is_ok()
    }

    /// Returns a credit taken by [`WorkQueue::acquire`] once the descriptor
    /// has completed (its completion record was written).
    pub(crate) fn release(&self) {
        if self.info.mode == WqMode::Dedicated {
            self.credits.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Submits `desc`, retrying a shared WQ's "full" answer up to
    /// `retries` times.
    pub(crate) fn submit(&self, desc: &[u8; 64], retries: u32) -> io::Result<Submit> {
        for _ in 0..=retries {
            match self.submitter.submit(desc)? {
                Submit::Accepted => {
                    self.submitted.fetch_add(1, Ordering::Relaxed);
                    return Ok(Submit::Accepted);
                }
                Submit::Retry => {
                    self.retries.fetch_add(1, Ordering::Relaxed);
                    std::hint::spin_loop();
                }
            }
        }
        Ok(Submit::Retry)
    }
}

/// The set of usable work queues, or why there is none.
pub struct Router {
    queues: Vec<Arc<WorkQueue>>,
    why_none: Option<String>,
}

impl Router {
    /// Discovers work queues under `sysfs_root` and opens each with
    /// `opener`; queues that fail to open are skipped with a reason.
    pub fn open(sysfs_root: &Path, dev_root: &Path, opener: &dyn PortalOpener) -> Router {
        let mut found = sysfs::discover(sysfs_root, dev_root);
        let mut queues = Vec::new();
        for info in std::mem::take(&mut found.queues) {
            match opener.open(&info) {
                Ok(s) => queues.push(Arc::new(WorkQueue::new(info, s))),
                Err(e) => {
                    found
                        .skipped
                        .push(format!("{}: open {}: {e}", info.name, info.cdev.display()))
                }
            }
        }
        let why_none = queues.is_empty().then(|| found.why_none());
        Router { queues, why_none }
    }

    /// A router over already-open queues (tests, embedding).
    #[cfg(any(test, feature = "test-support"))]
    pub fn from_queues(queues: Vec<Arc<WorkQueue>>) -> Router {
        let why_none = queues.is_empty().then(|| "no work queue given".to_string());
        Router { queues, why_none }
    }

    /// The process-wide router: discovery under `/sys/bus/dsa/devices`
    /// (or `$ZBLK_IAA_SYSFS_ROOT`), cdevs under `/dev/iax` (or
    /// `$ZBLK_IAA_DEV_ROOT`), done once. Logs once which queues are used,
    /// or why hardware is not.
    pub fn global() -> &'static Router {
        static GLOBAL: OnceLock<Router> = OnceLock::new();
        GLOBAL.get_or_init(|| {
            let root = env_path(SYSFS_ROOT_ENV, sysfs::DEFAULT_SYSFS_ROOT);
            let dev = env_path(DEV_ROOT_ENV, sysfs::DEFAULT_DEV_ROOT);
            let r = Router::open(&root, &dev, &CdevOpener);
            r.log_choice();
            r
        })
    }

    /// Logs the routing decision (once per router).
    pub fn log_choice(&self) {
        match &self.why_none {
            Some(why) => log::warn!(
                "deflate-iaa: IAA hardware not used ({why}); compressing with software raw deflate"
            ),
            None => {
                let names: Vec<String> = self
                    .queues
                    .iter()
                    .map(|q| format!("{}({})", q.info.name, q.kind()))
                    .collect();
                log::info!("deflate-iaa: using IAA work queues {}", names.join(", "));
            }
        }
    }

    /// The usable queues (empty: software only).
    pub fn queues(&self) -> &[Arc<WorkQueue>] {
        &self.queues
    }

    /// Why no queue is usable, when none is.
    #[cfg(any(test, feature = "test-support"))]
    pub fn why_none(&self) -> Option<&str> {
        self.why_none.as_deref()
    }
}

fn env_path(var: &str, default: &str) -> PathBuf {
    std::env::var_os(var)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(default))
}
