//! The `zblk` command line: rublk's verbs, zramctl's columns.

mod add;
mod args;
mod bench;
pub mod columns;
pub mod conf;
mod dict;
mod docs;
mod dump;
mod exporter;
mod fs;
mod generator;
mod manage;
mod metrics;
mod scrape;
mod setup;
mod show;
mod size;
mod sys;
mod term;
mod top;
mod unit;

pub use args::Cli;
use args::Cmd;
use zblk_ublk::logsink::{self, LogSink};

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

/// Prints help and version as clap does; any other parse error becomes one
/// line (`zblk: ...`) and exit status 2.
pub fn exit_on_parse_error(e: clap::Error) -> ! {
    use clap::error::ErrorKind;
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion)
        || matches!(
            e.kind(),
            ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
        )
    {
        e.exit();
    }
    eprintln!("zblk: {}", one_line(&e.to_string()));
    std::process::exit(2);
}

/// Clap's message without its usage and tip paragraphs, on one line.
fn one_line(text: &str) -> String {
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

/// Runs a parsed command line.
pub fn run(cli: Cli) -> CliResult {
    match cli.cmd {
        Cmd::Daemon(a) => {
            init_server_log("info");
            flushed(add::daemon(a))
        }
        Cmd::Keeper(a) => {
            init_server_log("info");
            flushed(add::keeper(a))
        }
        Cmd::Recover(a) if a.memfd.is_some() => {
            init_server_log("info");
            flushed(add::recover_daemon(a))
        }
        Cmd::Add(a) if a.foreground => {
            init_server_log("info");
            flushed(add::add(a))
        }
        Cmd::Add(a) => {
            init_log("warn");
            add::add(a)
        }
        Cmd::Setup(a) if a.foreground => {
            init_server_log("info");
            flushed(setup::setup(a))
        }
        Cmd::Setup(a) => {
            init_log("warn");
            setup::setup(a)
        }
        Cmd::Top(a) => {
            // A device that does not answer says so in its row; a warning
            // on stderr would only scribble over the screen.
            init_log("error");
            top::top(a)
        }
        cmd => {
            init_log("warn");
            match cmd {
                Cmd::List(a) => show::list(a),
                Cmd::Stat(a) => show::stat(a),
                Cmd::Del(a) => manage::del(a),
                Cmd::Compact(a) => manage::compact(a),
                Cmd::Set(a) => manage::set(a),
                Cmd::Idle(a) => manage::idle(a),
                Cmd::Recompress(a) => manage::recompress(a),
                Cmd::Writeback(a) => manage::writeback(a),
                Cmd::Dump(a) => dump::dump(a),
                Cmd::Dict(args::DictCmd::Train(a)) => dict::train(a),
                Cmd::Bench(a) => bench::bench(a),
                Cmd::Recover(a) => manage::recover(a),
                Cmd::Restart(a) => manage::restart(a),
                Cmd::Exporter(a) => exporter::exporter(a),
                Cmd::GenDocs(a) => docs::gen_docs(&a.out_dir),
                Cmd::Generator(a) => generator::generator(&a.dirs[0]),
                Cmd::Add(_) | Cmd::Setup(_) | Cmd::Top(_) | Cmd::Daemon(_) | Cmd::Keeper(_) => {
                    Ok(())
                }
            }
        }
    }
}

/// The ids of every zblk device (from their control sockets).
fn device_ids() -> Result<Vec<u32>, CliError> {
    zblk_ublk::paths::device_ids().map_err(|e| match e.kind() {
        std::io::ErrorKind::PermissionDenied => CliError(format!(
            "permission denied reading {}: run as root",
            zblk_ublk::paths::RUN_DIR
        )),
        _ => CliError(format!("cannot read {}: {e}", zblk_ublk::paths::RUN_DIR)),
    })
}

/// Logs to stderr at `default` level unless `RUST_LOG` says otherwise.
fn init_log(default: &str) {
    let env = env_logger::Env::default().default_filter_or(default);
    let _ = env_logger::Builder::from_env(env).try_init();
}

/// How long a server's exit waits for its last log records.
const LOG_FLUSH: std::time::Duration = std::time::Duration::from_secs(2);

/// [`init_log`] for the processes that serve a device (daemon, keeper):
/// through the non-blocking sink (`zblk_ublk::logsink`: their stderr may be
/// a swappable file, swapped to the device they serve), whose writer thread
/// they start once they dropped their privileges.
fn init_server_log(default: &str) {
    let env = env_logger::Env::default().default_filter_or(default);
    let sink = LogSink::new(Box::new(std::io::stderr()));
    let _ = env_logger::Builder::from_env(env)
        .target(env_logger::Target::Pipe(Box::new(sink)))
        .try_init();
}

/// `result`, once the server's log records are written.
fn flushed(result: CliResult) -> CliResult {
    logsink::flush(LOG_FLUSH);
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn parse_errors_become_one_line() {
        let e = Cli::try_parse_from(["zblk", "del"]).unwrap_err();
        let line = one_line(&e.to_string());
        assert!(
            line.starts_with("the following required arguments were not provided:"),
            "{line}"
        );
        assert!(line.contains("--id") && line.contains("--all"), "{line}");
        assert!(!line.contains('\n') && !line.contains("Usage"), "{line}");
        let e = Cli::try_parse_from(["zblk", "add", "--size", "0"]).unwrap_err();
        assert_eq!(
            one_line(&e.to_string()),
            "invalid value '0' for '--size <SIZE>': size must not be zero"
        );
    }
}
