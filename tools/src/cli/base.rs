//! What every subcommand stands on: the error a command fails with
//! ([`CliError`], said in one line), input quoted safely in it, a parse
//! error on one line, and the devices there are.

/// A failure, said in one line.
#[derive(Debug)]
pub struct CliError(pub String);

impl std::fmt::Display for CliError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<String> for CliError {
    fn from(s: String) -> Self {
        CliError(s)
    }
}

impl From<zblk_ublk::Error> for CliError {
    fn from(e: zblk_ublk::Error) -> Self {
        CliError(e.to_string())
    }
}

impl From<zblk_ublk::control::ClientError> for CliError {
    fn from(e: zblk_ublk::control::ClientError) -> Self {
        CliError(e.to_string())
    }
}

/// What a subcommand returns.
pub type CliResult = Result<(), CliError>;

/// `text` with control characters (a newline in a multi-line string, a
/// carriage return) escaped as `\n`, `\r`, `\u{0}`: input quoted in an
/// error must not break it over lines.
pub(crate) fn escape_controls(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// The ids of every zblk device (from their control sockets).
pub(crate) fn device_ids() -> Result<Vec<u32>, CliError> {
    zblk_ublk::paths::device_ids().map_err(|e| match e.kind() {
        std::io::ErrorKind::PermissionDenied => CliError(format!(
            "permission denied reading {}: run as root",
            zblk_ublk::paths::RUN_DIR
        )),
        _ => CliError(format!("cannot read {}: {e}", zblk_ublk::paths::RUN_DIR)),
    })
}

/// Clap's message without its usage and tip paragraphs, on one line.
pub(crate) fn one_line(text: &str) -> String {
    let words: Vec<&str> = text
        .lines()
        .take_while(|l| !l.trim().is_empty() && !l.starts_with("Usage:"))
        .flat_map(str::split_whitespace)
        .collect();
    let s = words.join(" ");
    match s.strip_prefix("error: ") {
        Some(rest) => rest.to_string(),
        None if s.is_empty() => "invalid arguments".to_string(),
        None => s,
    }
}
