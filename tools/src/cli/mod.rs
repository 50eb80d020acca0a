//! The `zblk` command line: rublk's verbs, zramctl's columns.

mod add;
mod args;
mod attrib;
mod base;
mod bench;
mod cgroup_policy;
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
mod pagemap;
mod scrape;
mod setup;
mod show;
mod size;
mod sys;
mod term;
mod tier;
mod top;
mod unit;

pub use args::Cli;
use args::Cmd;
use base::one_line;
pub use base::{CliError, CliResult};
use zblk_ublk::logsink::{self, LogSink};

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
                Cmd::Stat(a) => match a.by {
                    Some(by) => attrib::stat(&a, by),
                    None => show::stat(a),
                },
                Cmd::Del(a) => manage::del(a),
                Cmd::Compact(a) => manage::compact(a),
                Cmd::Set(a) => manage::set(a),
                Cmd::Idle(a) => manage::idle(a),
                Cmd::Recompress(a) => tier::recompress(a),
                Cmd::Writeback(a) => tier::writeback(a),
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
