//! `zblk dict train`: a dictionary from a device's own stored pages, asked
//! of its daemon (`Request::Sample`) and written for `zblk add
//! --algo-params dict=FILE`.

use super::args::DictTrainArgs;
use super::base::{CliError, CliResult};
use std::io::{IsTerminal, Write};
use std::time::Duration;
use zblk_ublk::control::{self, Request};

/// How long the sample may take (a slot lock per page looked at).
const SAMPLE_TIMEOUT: Duration = Duration::from_secs(60);

/// `zblk dict train -n ID [-o FILE] [--size BYTES]`.
pub fn train(a: DictTrainArgs) -> CliResult {
    if a.output.is_none() && std::io::stdout().is_terminal() {
        return Err(CliError(
            "a dictionary is binary: give -o FILE or redirect standard output".into(),
        ));
    }
    let req = Request::Sample { bytes: a.size };
    let r = control::request(a.id, &req, SAMPLE_TIMEOUT).map_err(CliError::from)?;
    let dict: Vec<u8> = serde_json::from_value(r["sample"].clone()).map_err(|e| {
        CliError(format!(
            "device {}: a reply that is not a sample: {e}",
            a.id
        ))
    })?;
    if dict.is_empty() {
        return Err(CliError(format!(
            "device {} stores no pages to make a dictionary of",
            a.id
        )));
    }
    match &a.output {
        Some(path) => std::fs::write(path, &dict)
            .map_err(|e| CliError(format!("cannot write {}: {e}", path.display()))),
        None => std::io::stdout()
            .lock()
            .write_all(&dict)
            .map_err(|e| CliError(format!("writing the dictionary: {e}"))),
    }
}
