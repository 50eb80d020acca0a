//! The `zblk` command line as a library: the `zblk` binary (`main.rs`) is
//! a thin wrapper around [`cli`], and the fuzz crate (`fuzz/`) reaches the
//! parsers of untrusted input through it ([`cli::conf`], the config file of
//! `zblk setup`, and [`cli::columns`], `zblk list --output`).

pub mod cli;
