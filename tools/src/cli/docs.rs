//! The hidden `zblk gen-docs DIR`: man pages and shell completions written
//! from the clap definitions themselves, so they cannot drift from
//! `--help`. A subcommand of the binary rather than a separate program:
//! the command line's definitions live in this binary only (there is no
//! library to share them from), and the pages then describe exactly the
//! binary that is shipped.

use super::args::Cli;
use super::base::{CliError, CliResult};
use clap::CommandFactory;
use clap_complete::Shell;
use std::path::Path;

/// The shells whose completions are written.
const SHELLS: [Shell; 3] = [Shell::Bash, Shell::Zsh, Shell::Fish];

/// Writes `zblk.1` and `zblk-SUB.1` for each visible subcommand into
/// `out`, and `zblk.bash`, `_zblk` and `zblk.fish` into `out/completions`.
pub fn gen_docs(out: &Path) -> CliResult {
    let io = |what: &str, e: std::io::Error| CliError(format!("cannot write {what}: {e}"));
    let completions = out.join("completions");
    std::fs::create_dir_all(&completions).map_err(|e| io(&completions.display().to_string(), e))?;
    clap_mangen::generate_to(Cli::command(), out).map_err(|e| io("the man pages", e))?;
    for shell in SHELLS {
        let mut cmd = Cli::command();
        clap_complete::generate_to(shell, &mut cmd, "zblk", &completions)
            .map_err(|e| io(&format!("the {shell} completion"), e))?;
    }
    println!("{}", out.display());
    Ok(())
}
