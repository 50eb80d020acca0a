//! `zblk`: create, inspect and remove zblk devices (compressed RAM block
//! devices served through ublk), and run the engine benchmark.
//!
//! Everything lives in the library's `cli` module; this only parses, runs
//! and turns a failure into one line on stderr and a non-zero exit.

use clap::Parser;
use zblk_tools::cli;

fn main() {
    let args = match cli::Cli::try_parse() {
        Ok(a) => a,
        Err(e) => cli::exit_on_parse_error(e),
    };
    if let Err(e) = cli::run(args) {
        eprintln!("zblk: {e}");
        std::process::exit(1);
    }
}
