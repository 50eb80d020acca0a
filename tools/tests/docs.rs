//! `zblk gen-docs`: man pages and completions from the clap definitions,
//! checked against what `zblk --help` lists.

use std::path::Path;
use std::process::Command;

fn zblk(args: &[&str]) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_zblk"))
        .args(args)
        .output()
        .expect("run zblk");
    assert!(o.status.success(), "{args:?}: {o:?}");
    String::from_utf8(o.stdout).unwrap()
}

/// The subcommands `zblk --help` lists (clap's own `help` aside).
fn visible_subcommands() -> Vec<String> {
    let help = zblk(&["--help"]);
    let subs: Vec<String> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next().map(String::from))
        .filter(|s| s != "help")
        .collect();
    assert!(subs.len() >= 8, "{help}");
    subs
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn every_visible_subcommand_has_a_page_and_completions() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("docs");
    zblk(&["gen-docs", out.to_str().unwrap()]);
    let subs = visible_subcommands();
    assert!(subs.iter().any(|s| s == "exporter"), "{subs:?}");
    let main = read(&out.join("zblk.1"));
    assert!(
        main.starts_with(".ie") || main.contains(".TH zblk"),
        "{main}"
    );
    let bash = read(&out.join("completions/zblk.bash"));
    let zsh = read(&out.join("completions/_zblk"));
    let fish = read(&out.join("completions/zblk.fish"));
    for s in &subs {
        let page = read(&out.join(format!("zblk-{s}.1")));
        assert!(
            page.contains(&format!(".TH zblk-{s}")),
            "zblk-{s}.1: {page}"
        );
        assert!(main.contains(s.as_str()), "zblk.1 does not name {s}");
        assert!(bash.contains(&format!("zblk,{s})")), "bash misses {s}");
        assert!(zsh.contains(&format!("'{s}:")), "zsh misses {s}");
        assert!(fish.contains(&format!("-a \"{s}\"")), "fish misses {s}");
    }
    // Hidden subcommands get no page.
    for hidden in ["daemon", "keeper", "gen-docs"] {
        assert!(!out.join(format!("zblk-{hidden}.1")).exists(), "{hidden}");
    }
    // The pages say what --help says.
    let list = read(&out.join("zblk-list.1"));
    for flag in ["noheadings", "output", "bytes"] {
        assert!(list.contains(flag), "zblk-list.1 lacks --{flag}");
    }
}
