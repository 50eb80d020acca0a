//! `--algo-params` (zram's `algorithm_params`): a dictionary for the
//! primary algorithm or for one of the recompression algorithms.
//!
//! Written as zram's sysfs file takes it, words separated by spaces:
//! `dict=PATH` (the primary algorithm's), `priority=N dict=PATH` (entry N
//! of `--recompress-algos`; 0 is the primary, as in zram) or
//! `algo=NAME [level=L] dict=PATH` (`level=8` is zram's way of writing
//! `zstd:8`). zblk sets levels in the algorithm's name, so `dict` is the
//! one parameter that does anything; a level that disagrees with the
//! algorithm it names is refused rather than ignored.
//!
//! The files are read when a device is made ([`dictionaries`]): the store
//! records the bytes, and a daemon that takes the store over decodes with
//! those, so a file may change or go away afterwards.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::path::PathBuf;
use std::sync::Arc;
use zblk::{Algo, AlgoList, Dictionaries};

/// One `--algo-params` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlgoParams {
    /// Which algorithm the dictionary is for.
    pub target: Target,
    /// The dictionary file, absolute (the daemon's working directory is
    /// not the caller's).
    pub dict: PathBuf,
}

/// The algorithm an [`AlgoParams`] names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `priority=N`: 0 the primary algorithm, 1-3 that entry of
    /// `--recompress-algos`; no `priority` or `algo` is the primary.
    Priority(u8),
    /// `algo=NAME[:LEVEL]` with `level=L` or without a level.
    Algo {
        /// The algorithm's name, without a level.
        name: String,
        /// The level, if one was given.
        level: Option<i32>,
    },
}

impl std::str::FromStr for AlgoParams {
    type Err = String;

    fn from_str(s: &str) -> Result<AlgoParams, String> {
        let (mut algo, mut level, mut priority, mut dict) = (None, None, None, None);
        for word in s.split_whitespace() {
            let Some((key, value)) = word.split_once('=') else {
                return Err(format!("'{word}' is not KEY=VALUE"));
            };
            match key {
                "algo" => algo = Some(value.to_string()),
                "level" => {
                    level = Some(
                        value
                            .parse::<i32>()
                            .map_err(|_| format!("level '{value}' is not a number"))?,
                    )
                }
                "priority" => match value.parse::<u8>() {
                    Ok(n) if usize::from(n) <= zblk::MAX_SECONDARIES => priority = Some(n),
                    _ => {
                        return Err(format!(
                            "priority '{value}' is not 0 (the primary algorithm) to {}",
                            zblk::MAX_SECONDARIES
                        ))
                    }
                },
                "dict" if !value.is_empty() => dict = Some(absolute(value)?),
                _ => {
                    return Err(format!(
                        "unknown parameter '{word}': expected dict=PATH, with algo=NAME [level=N] or priority=N"
                    ))
                }
            }
        }
        let Some(dict) = dict else {
            return Err(
                "no dict=PATH: a dictionary is the one parameter zblk takes \
                        (levels go in the algorithm's name: zstd:8)"
                    .into(),
            );
        };
        let target = match (algo, priority) {
            (Some(_), Some(_)) => return Err("give algo= or priority=, not both".into()),
            (Some(a), None) => algo_target(&a, level)?,
            (None, p) if level.is_some() => {
                return Err(format!(
                    "level= needs algo=: write algo=NAME level={} (priority={} names an algorithm with its level)",
                    level.unwrap_or_default(),
                    p.unwrap_or(0)
                ))
            }
            (None, p) => Target::Priority(p.unwrap_or(0)),
        };
        Ok(AlgoParams { target, dict })
    }
}

/// The target `algo=NAME[:LEVEL]` with `level=L` names (one level at most).
fn algo_target(algo: &str, level: Option<i32>) -> Result<Target, String> {
    let (name, inline) = match algo.split_once(':') {
        Some((n, l)) => (n, Some(l)),
        None => (algo, None),
    };
    let level = match (inline, level) {
        (Some(_), Some(_)) => return Err(format!("algo={algo} has a level: leave out level=")),
        (Some(l), None) => Some(
            l.parse::<i32>()
                .map_err(|_| format!("level '{l}' is not a number"))?,
        ),
        (None, l) => l,
    };
    let target = Target::Algo {
        name: name.to_string(),
        level,
    };
    // Checked now, so that a bad name is an error of this flag.
    target.algo(&[])?;
    Ok(target)
}

/// `path` made absolute against the current directory.
fn absolute(path: &str) -> Result<PathBuf, String> {
    std::path::absolute(path).map_err(|e| format!("dict={path}: {e}"))
}

impl Target {
    /// The algorithm this names, given the device's algorithms (`algos[0]`
    /// the primary, then `--recompress-algos` in priority order): a name
    /// without a level is the device's algorithm of that name if it has
    /// one, else the name's default level.
    fn algo(&self, algos: &[Algo]) -> Result<Algo, String> {
        match self {
            Target::Priority(n) => algos.get(usize::from(*n)).copied().ok_or_else(|| {
                format!(
                    "priority={n}, but --recompress-algos names {} algorithm(s)",
                    algos.len().saturating_sub(1)
                )
            }),
            Target::Algo { name, level: None } => match algos
                .iter()
                .find(|a| a.to_string().split(':').next() == Some(name.as_str()))
            {
                Some(a) => Ok(*a),
                None => name.parse(),
            },
            Target::Algo {
                name,
                level: Some(l),
            } => format!("{name}:{l}").parse(),
        }
    }
}

impl std::fmt::Display for AlgoParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.target {
            Target::Priority(0) => {}
            Target::Priority(n) => write!(f, "priority={n} ")?,
            Target::Algo { name, level: None } => write!(f, "algo={name} ")?,
            Target::Algo {
                name,
                level: Some(l),
            } => write!(f, "algo={name} level={l} ")?,
        }
        write!(f, "dict={}", self.dict.display())
    }
}

impl Serialize for AlgoParams {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for AlgoParams {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<AlgoParams, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// `--algo-params`' value parser.
pub fn parse_algo_params(s: &str) -> Result<AlgoParams, String> {
    s.parse()
}

/// The dictionaries `params` give a device of primary algorithm `primary`
/// and recompression algorithms `recompress`, read from their files: an
/// unreadable, empty or too-large file, or a dictionary for an algorithm
/// that takes none, is a one-line error naming the file.
pub fn dictionaries(
    params: &[AlgoParams],
    primary: Algo,
    recompress: Option<&AlgoList>,
) -> Result<Dictionaries, String> {
    let mut algos = vec![primary];
    algos.extend(recompress.map_or(&[][..], AlgoList::as_slice));
    let mut dicts = Dictionaries::new();
    for p in params {
        let algo = p
            .target
            .algo(&algos)
            .map_err(|e| format!("--algo-params: {e}"))?;
        let path = p.dict.display();
        let bytes = read_limited(&p.dict).map_err(|e| format!("dictionary {path}: {e}"))?;
        dicts
            .set(algo, Arc::from(bytes))
            .map_err(|e| format!("dictionary {path}: {e}"))?;
    }
    Ok(dicts)
}

/// The file at `path`, reading no more than one byte past the largest
/// dictionary (so that a wrong path to a huge file costs nothing).
fn read_limited(path: &std::path::Path) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| format!("cannot read it: {e}"))?;
    let mut bytes = Vec::new();
    file.take(zblk::MAX_DICT_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read it: {e}"))?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str, bytes: &[u8]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("zblk-algo-params-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }

    fn dicts(params: &[&str], primary: &str, recompress: &str) -> Result<Dictionaries, String> {
        let params: Vec<AlgoParams> = params.iter().map(|s| s.parse()).collect::<Result<_, _>>()?;
        let list = (!recompress.is_empty()).then(|| recompress.parse::<AlgoList>().unwrap());
        dictionaries(&params, primary.parse()?, list.as_ref())
    }

    #[test]
    fn params_parse_print_and_name_their_algorithm() {
        let d = file("d", b"some dictionary bytes");
        let p = d.display();
        for (text, want) in [
            (format!("dict={p}"), format!("dict={p}")),
            (format!("priority=0 dict={p}"), format!("dict={p}")),
            (
                format!("priority=2  dict={p}"),
                format!("priority=2 dict={p}"),
            ),
            (
                format!("algo=zstd level=8 dict={p}"),
                format!("algo=zstd level=8 dict={p}"),
            ),
            (
                format!("algo=zstd:8 dict={p}"),
                format!("algo=zstd level=8 dict={p}"),
            ),
        ] {
            let a: AlgoParams = text.parse().unwrap();
            assert_eq!(a.to_string(), want);
            assert_eq!(a.to_string().parse::<AlgoParams>().unwrap(), a);
        }
        let got = dicts(
            &[
                &format!("dict={p}"),
                &format!("priority=1 dict={p}"),
                &format!("algo=zstd dict={p}"),
                &format!("algo=zstd level=19 dict={p}"),
            ],
            "lz4",
            "lz4hc zstd:3",
        )
        .unwrap();
        let algos: Vec<String> = got.iter().map(|(a, _)| a.to_string()).collect();
        assert_eq!(algos, ["lz4", "lz4hc", "zstd:3", "zstd:19"]);
        assert_eq!(
            got.get(Algo::Lz4).map(|d| &d[..]),
            Some(&b"some dictionary bytes"[..])
        );
    }

    #[test]
    fn bad_params_and_files_are_one_line_errors() {
        let d = file("ok", b"bytes");
        let p = d.display();
        let empty = file("empty", b"");
        let big = file("big", &vec![7u8; zblk::MAX_DICT_BYTES + 1]);
        let missing = d.with_file_name("missing");
        let cases: [(String, &str, &str, &str); 12] = [
            (
                format!("dict={}", missing.display()),
                "lz4",
                "",
                "cannot read it",
            ),
            (format!("dict={}", empty.display()), "lz4", "", "is empty"),
            (
                format!("dict={}", big.display()),
                "lz4",
                "",
                "at most 65536",
            ),
            (format!("dict={p}"), "deflate", "", "takes no dictionary"),
            (format!("dict={p}"), "none", "", "takes no dictionary"),
            (
                format!("dict={p}"),
                "deflate-iaa",
                "",
                "takes no dictionary",
            ),
            (
                format!("priority=2 dict={p}"),
                "lz4",
                "zstd",
                "names 1 algorithm",
            ),
            (format!("priority=4 dict={p}"), "lz4", "", "is not 0"),
            (format!("algo=lzo dict={p}"), "lz4", "", "unknown algorithm"),
            (
                format!("level=3 dict={p}"),
                "zstd",
                "",
                "level= needs algo=",
            ),
            ("algo=zstd level=8".to_string(), "zstd", "", "no dict=PATH"),
            (
                format!("dict={p} color=red"),
                "lz4",
                "",
                "unknown parameter",
            ),
        ];
        for (params, primary, recompress, want) in cases {
            let e = dicts(&[&params], primary, recompress).unwrap_err();
            assert!(e.contains(want), "{params}: {e}");
            assert!(!e.contains('\n'), "{e}");
        }
        let e = dicts(
            &[&format!("dict={p}"), &format!("priority=0 dict={p}")],
            "lz4",
            "",
        )
        .unwrap_err();
        assert!(e.contains("twice"), "{e}");
    }
}
