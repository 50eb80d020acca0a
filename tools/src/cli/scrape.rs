//! One round of statistics from every device, for the metrics: asked of
//! all daemons at once, within one deadline, so that a stuck daemon costs
//! a scrape at most its timeout and never hangs it.

use super::base::CliError;
use super::metrics::Scrape;
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};
use zblk_ublk::control::{self, client::request_at};
use zblk_ublk::paths;

/// How long the exporter waits for a scrape by default, in seconds (and
/// the longest a `zblk top` refresh waits).
pub const DEFAULT_TIMEOUT_SECS: u64 = 5;

/// Asks every device in `run_dir` for its statistics, all at once, and
/// waits at most `timeout` for them all: a device that has not answered by
/// then (or cannot) is [`Scrape::Down`]. The requests themselves time out
/// too; the overall deadline also covers a connect that blocks on a
/// daemon that no longer accepts.
pub fn scrape(run_dir: &Path, timeout: Duration) -> Result<Vec<Scrape>, CliError> {
    let ids = paths::device_ids_in(run_dir)
        .map_err(|e| CliError(format!("cannot read {}: {e}", run_dir.display())))?;
    let (tx, rx) = mpsc::channel();
    for &id in &ids {
        let (tx, sock) = (tx.clone(), paths::socket_path_in(run_dir, id));
        let asked = std::thread::Builder::new().spawn(move || {
            let r = request_at(&sock, id, &control::Request::Stats, timeout);
            // The receiver is gone when the deadline passed: fine.
            let _ = tx.send((id, r));
        });
        // Without a thread the device just does not answer this round.
        if let Err(e) = asked {
            log::warn!("device {id}: cannot start a thread to ask it: {e}");
        }
    }
    drop(tx);
    let deadline = Instant::now() + timeout;
    let mut got = Vec::new();
    while got.len() < ids.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok((id, r)) = rx.recv_timeout(left) else {
            break;
        };
        got.push((id, r));
    }
    Ok(ids
        .iter()
        .map(|id| outcome(*id, &mut got, timeout))
        .collect())
}

/// What device `id` gave, taken out of `got`.
fn outcome(
    id: u32,
    got: &mut Vec<(u32, Result<serde_json::Value, control::ClientError>)>,
    timeout: Duration,
) -> Scrape {
    match got
        .iter()
        .position(|(i, _)| *i == id)
        .map(|p| got.swap_remove(p))
    {
        Some((_, Ok(reply))) => Scrape::Up(reply),
        Some((_, Err(e))) => {
            log::warn!("device {id}: {e}");
            Scrape::Down(id)
        }
        None => {
            log::warn!("device {id}: no answer within {timeout:?}");
            Scrape::Down(id)
        }
    }
}
