//! The control sockets' request parsers: the daemon's
//! (`zblk_ublk::control::Request`) and the keeper's
//! (`zblk_ublk::keeper::KeeperRequest`), fed raw bytes over a real socket
//! pair (`read_request`, as the daemon's server reads a client),
//! structured JSON built from the input, and every request variant built
//! from typed fields. Checks: no panic; `read_request` agrees with parsing
//! the first line by itself; a request that parses round-trips through its
//! wire form, and that wire form is the one a plain model of the protocol
//! writes; a structured JSON value parses exactly when the model says it is
//! a request (and as that request), for the daemon and the keeper alike;
//! no line is both a daemon and a keeper request; every refusal becomes a
//! one-line `{"ok":false,...}` reply (what the servers write back) that a
//! client parses as a failure.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Number, Value};
use std::io::Write;
use std::os::unix::net::UnixStream;
use zblk_ublk::control::{read_request, RequestError};
use zblk_ublk::keeper::KeeperRequest;
use zblk_ublk::{Request, Response};

/// Every command of both sockets, and a few near misses.
const CMDS: [&str; 22] = [
    "info",
    "stats",
    "compact",
    "compact_backing",
    "idle",
    "recompress",
    "set_mem_limit",
    "shutdown",
    "handover",
    "status",
    "restart",
    "recover",
    "Info",
    "format_disk",
    "set-mem-limit",
    "huge_idle",
    "writeback",
    "dump",
    "slots",
    "sample",
    "set_writeback_limit",
    "set_policy",
];
/// Every field of any request, and keys of replies.
const KEYS: [&str; 20] = [
    "cmd",
    "bytes",
    "force",
    "age",
    "algo",
    "priority",
    "kind",
    "threshold",
    "max_pages",
    "max_blocks",
    "data",
    "ok",
    "error",
    "limit",
    "pages",
    "start",
    "count",
    "recompress_idle_after",
    "writeback_idle_after",
    "recompress_algo",
];

#[derive(Arbitrary, Debug)]
enum J {
    Null,
    Bool(bool),
    U(u64),
    I(i64),
    F(f64),
    Cmd(u8),
    Str(String),
    Arr(Vec<J>),
    Obj(Vec<(K, J)>),
}

#[derive(Arbitrary, Debug)]
enum K {
    Known(u8),
    Other(String),
}

fn value(j: &J, depth: u32) -> Value {
    match j {
        J::Null => Value::Null,
        J::Bool(b) => Value::Bool(*b),
        J::U(u) => Value::Number((*u).into()),
        J::I(i) => Value::Number((*i).into()),
        J::F(f) => Number::from_f64(*f).map_or(Value::Null, Value::Number),
        J::Cmd(i) => Value::String(CMDS[usize::from(*i) % CMDS.len()].into()),
        J::Str(s) => Value::String(s.clone()),
        J::Arr(v) if depth < 4 => {
            Value::Array(v.iter().take(8).map(|j| value(j, depth + 1)).collect())
        }
        J::Obj(kv) if depth < 4 => {
            let mut m = Map::new();
            for (k, v) in kv.iter().take(8) {
                let k = match k {
                    K::Known(i) => KEYS[usize::from(*i) % KEYS.len()].to_string(),
                    K::Other(s) => s.clone(),
                };
                m.insert(k, value(v, depth + 1));
            }
            Value::Object(m)
        }
        _ => Value::Null,
    }
}

/// What the protocol says `v` is for a daemon: a request, or not.
/// A request's list of page ranges as the model reads it: absent, an
/// empty list; otherwise an array of strings (None: anything else).
fn page_ranges(v: Option<&Value>) -> Option<Vec<String>> {
    match v {
        None => Some(Vec::new()),
        Some(p) => p
            .as_array()?
            .iter()
            .map(|r| r.as_str().map(str::to_string))
            .collect(),
    }
}

fn model(v: &Value) -> Option<Request> {
    let o = v.as_object()?;
    let u64_or_0 = |k: &str| match o.get(k) {
        None => Some(0),
        Some(n) => n.as_u64(),
    };
    match o.get("cmd")?.as_str()? {
        "info" => Some(Request::Info),
        "stats" => Some(Request::Stats),
        "compact" => Some(Request::Compact),
        "compact_backing" => Some(Request::CompactBacking {
            max_blocks: u64_or_0("max_blocks")?,
        }),
        "handover" => Some(Request::Handover),
        "idle" => Some(Request::Idle {
            age: match o.get("age") {
                None | Some(Value::Null) => None,
                Some(a) => Some(a.as_u64()?),
            },
            exact: match o.get("exact") {
                None => false,
                Some(e) => e.as_bool()?,
            },
        }),
        "recompress" => Some(Request::Recompress {
            algo: match o.get("algo") {
                None => String::new(),
                Some(a) => a.as_str()?.to_string(),
            },
            priority: match o.get("priority") {
                None | Some(Value::Null) => None,
                Some(p) => Some(u8::try_from(p.as_u64()?).ok()?),
            },
            kind: match o.get("kind") {
                None => "all".to_string(),
                Some(k) => k.as_str()?.to_string(),
            },
            threshold: u64_or_0("threshold")?,
            max_pages: u64_or_0("max_pages")?,
            pages: page_ranges(o.get("pages"))?,
        }),
        "writeback" => Some(Request::Writeback {
            kind: match o.get("kind") {
                None | Some(Value::Null) => None,
                Some(k) => Some(k.as_str()?.to_string()),
            },
            pages: page_ranges(o.get("pages"))?,
            limit: u64_or_0("limit")?,
        }),
        "dump" => Some(Request::Dump {
            start: u64_or_0("start")?,
            count: u64_or_0("count")?,
        }),
        "slots" => Some(Request::Slots {
            pages: o
                .get("pages")?
                .as_array()?
                .iter()
                .map(Value::as_u64)
                .collect::<Option<_>>()?,
        }),
        "sample" => Some(Request::Sample {
            bytes: o.get("bytes")?.as_u64()?,
        }),
        "set_writeback_limit" => Some(Request::SetWritebackLimit {
            pages: o.get("pages")?.as_u64()?,
        }),
        "set_policy" => {
            let opt_u64 = |k: &str| match o.get(k) {
                None | Some(Value::Null) => Some(None),
                Some(n) => n.as_u64().map(Some),
            };
            Some(Request::SetPolicy {
                recompress_idle_after: opt_u64("recompress_idle_after")?,
                writeback_idle_after: opt_u64("writeback_idle_after")?,
                recompress_algo: match o.get("recompress_algo") {
                    None | Some(Value::Null) => None,
                    Some(a) => Some(a.as_str()?.to_string()),
                },
            })
        }
        "set_mem_limit" => Some(Request::SetMemLimit {
            bytes: o.get("bytes")?.as_u64()?,
        }),
        "shutdown" => Some(Request::Shutdown {
            force: match o.get("force") {
                None => false,
                Some(f) => f.as_bool()?,
            },
        }),
        _ => None,
    }
}

/// What the protocol says `v` is for a keeper.
fn keeper_model(v: &Value) -> Option<KeeperRequest> {
    match v.as_object()?.get("cmd")?.as_str()? {
        "status" => Some(KeeperRequest::Status),
        "restart" => Some(KeeperRequest::Restart),
        "recover" => Some(KeeperRequest::Recover),
        _ => None,
    }
}

/// The wire form the protocol gives a daemon request (what clients of
/// other versions, and scripts with `socat`, rely on).
fn wire(r: &Request) -> Value {
    let mut o = Map::new();
    let mut put = |k: &str, v: Value| {
        o.insert(k.to_string(), v);
    };
    match r {
        Request::Info => put("cmd", "info".into()),
        Request::Stats => put("cmd", "stats".into()),
        Request::Compact => put("cmd", "compact".into()),
        Request::CompactBacking { max_blocks } => {
            put("cmd", "compact_backing".into());
            put("max_blocks", (*max_blocks).into());
        }
        Request::Handover => put("cmd", "handover".into()),
        Request::Idle { age, exact } => {
            put("cmd", "idle".into());
            if let Some(a) = age {
                put("age", (*a).into());
            }
            if *exact {
                put("exact", true.into());
            }
        }
        Request::Recompress {
            algo,
            priority,
            kind,
            threshold,
            max_pages,
            pages,
        } => {
            put("cmd", "recompress".into());
            if !algo.is_empty() {
                put("algo", algo.as_str().into());
            }
            if let Some(p) = priority {
                put("priority", (*p).into());
            }
            put("kind", kind.as_str().into());
            put("threshold", (*threshold).into());
            put("max_pages", (*max_pages).into());
            if !pages.is_empty() {
                put("pages", pages.clone().into());
            }
        }
        Request::Writeback { kind, pages, limit } => {
            put("cmd", "writeback".into());
            if let Some(kind) = kind {
                put("kind", kind.as_str().into());
            }
            if !pages.is_empty() {
                put("pages", pages.clone().into());
            }
            put("limit", (*limit).into());
        }
        Request::Dump { start, count } => {
            put("cmd", "dump".into());
            put("start", (*start).into());
            put("count", (*count).into());
        }
        Request::Slots { pages } => {
            put("cmd", "slots".into());
            put("pages", pages.clone().into());
        }
        Request::Sample { bytes } => {
            put("cmd", "sample".into());
            put("bytes", (*bytes).into());
        }
        Request::SetWritebackLimit { pages } => {
            put("cmd", "set_writeback_limit".into());
            put("pages", (*pages).into());
        }
        Request::SetPolicy {
            recompress_idle_after,
            writeback_idle_after,
            recompress_algo,
        } => {
            put("cmd", "set_policy".into());
            if let Some(r) = recompress_idle_after {
                put("recompress_idle_after", (*r).into());
            }
            if let Some(w) = writeback_idle_after {
                put("writeback_idle_after", (*w).into());
            }
            if let Some(a) = recompress_algo {
                put("recompress_algo", a.as_str().into());
            }
        }
        Request::SetMemLimit { bytes } => {
            put("cmd", "set_mem_limit".into());
            put("bytes", (*bytes).into());
        }
        Request::Shutdown { force } => {
            put("cmd", "shutdown".into());
            put("force", (*force).into());
        }
    }
    Value::Object(o)
}

/// The reply the server sends for a bad request, checked as a client
/// reads it.
fn check_refusal(e: &RequestError) {
    let resp = Response::err(e.to_string());
    let line = serde_json::to_string(&resp).expect("a reply always serialises");
    assert!(!line.contains('\n'), "reply is not one line: {line}");
    let back: Response = serde_json::from_str(&line).expect("client parses the reply");
    assert!(!back.ok && back.error.as_deref().is_some_and(|m| !m.is_empty()));
}

fn check_request(r: &Request) {
    let wire_text = serde_json::to_string(r).unwrap();
    assert_eq!(
        &serde_json::from_str::<Request>(&wire_text).unwrap(),
        r,
        "{wire_text}"
    );
    let v: Value = serde_json::from_str(&wire_text).unwrap();
    assert_eq!(v, wire(r), "wire form of {r:?}");
    assert!(
        serde_json::from_str::<KeeperRequest>(&wire_text).is_err(),
        "{wire_text}"
    );
}

fn check_keeper_request(r: &KeeperRequest) {
    let wire_text = serde_json::to_string(r).unwrap();
    assert_eq!(
        &serde_json::from_str::<KeeperRequest>(&wire_text).unwrap(),
        r,
        "{wire_text}"
    );
    let v: Value = serde_json::from_str(&wire_text).unwrap();
    assert_eq!(keeper_model(&v).as_ref(), Some(r), "{wire_text}");
    assert!(
        serde_json::from_str::<Request>(&wire_text).is_err(),
        "{wire_text}"
    );
}

/// A request of either socket built from typed fields: every variant.
#[derive(Arbitrary, Debug)]
enum Typed {
    Info,
    Stats,
    Compact,
    CompactBacking(u64),
    Idle(Option<u64>, bool),
    Recompress {
        algo: String,
        priority: Option<u8>,
        kind: String,
        threshold: u64,
        max_pages: u64,
        pages: Vec<String>,
    },
    Writeback {
        kind: Option<String>,
        pages: Vec<String>,
        limit: u64,
    },
    Dump {
        start: u64,
        count: u64,
    },
    Sample(u64),
    SetWritebackLimit(u64),
    SetPolicy {
        recompress: Option<u64>,
        writeback: Option<u64>,
        algo: Option<String>,
    },
    SetMemLimit(u64),
    Shutdown(bool),
    Handover,
    KeeperStatus,
    KeeperRestart,
    KeeperRecover,
}

impl Typed {
    fn build(&self) -> Result<Request, KeeperRequest> {
        Ok(match self {
            Typed::Info => Request::Info,
            Typed::Stats => Request::Stats,
            Typed::Compact => Request::Compact,
            Typed::CompactBacking(max_blocks) => Request::CompactBacking {
                max_blocks: *max_blocks,
            },
            Typed::Idle(age, exact) => Request::Idle {
                age: *age,
                exact: *exact,
            },
            Typed::Recompress {
                algo,
                priority,
                kind,
                threshold,
                max_pages,
                pages,
            } => Request::Recompress {
                algo: algo.clone(),
                priority: *priority,
                kind: kind.clone(),
                threshold: *threshold,
                max_pages: *max_pages,
                pages: pages.clone(),
            },
            Typed::Writeback { kind, pages, limit } => Request::Writeback {
                kind: kind.clone(),
                pages: pages.clone(),
                limit: *limit,
            },
            Typed::Dump { start, count } => Request::Dump {
                start: *start,
                count: *count,
            },
            Typed::Sample(bytes) => Request::Sample { bytes: *bytes },
            Typed::SetWritebackLimit(pages) => Request::SetWritebackLimit { pages: *pages },
            Typed::SetPolicy {
                recompress,
                writeback,
                algo,
            } => Request::SetPolicy {
                recompress_idle_after: *recompress,
                writeback_idle_after: *writeback,
                recompress_algo: algo.clone(),
            },
            Typed::SetMemLimit(bytes) => Request::SetMemLimit { bytes: *bytes },
            Typed::Shutdown(force) => Request::Shutdown { force: *force },
            Typed::Handover => Request::Handover,
            Typed::KeeperStatus => return Err(KeeperRequest::Status),
            Typed::KeeperRestart => return Err(KeeperRequest::Restart),
            Typed::KeeperRecover => return Err(KeeperRequest::Recover),
        })
    }
}

#[derive(Arbitrary, Debug)]
enum Input {
    Bytes(Vec<u8>),
    Json {
        v: J,
        newline: bool,
        trailer: Vec<u8>,
    },
    Typed {
        t: Typed,
        newline: bool,
        trailer: Vec<u8>,
    },
}

/// `text`, and with `newline` a newline and whatever follows it.
fn line_with(text: String, newline: bool, trailer: &[u8]) -> Vec<u8> {
    let mut b = text.into_bytes();
    if newline {
        b.push(b'\n');
        b.extend_from_slice(trailer);
    }
    b
}

fn over_socket(bytes: &[u8]) -> Result<Request, RequestError> {
    let (mut a, mut b) = UnixStream::pair().expect("socketpair");
    // Inputs stay far below the socket buffer, so this never blocks.
    a.write_all(bytes).expect("write to the pair");
    drop(a);
    read_request(&mut b)
}

fuzz_target!(|input: Input| {
    let bytes = match &input {
        Input::Bytes(b) => b.clone(),
        Input::Json {
            v,
            newline,
            trailer,
        } => {
            let v = value(v, 0);
            let text = v.to_string();
            let parsed = serde_json::from_str::<Request>(&text).ok();
            // serde also takes an internally tagged enum from an array
            // (`["stats"]`): harmless, so arrays are only checked not to
            // panic and to round-trip.
            let keeper = serde_json::from_str::<KeeperRequest>(&text).ok();
            if !v.is_array() {
                assert_eq!(parsed, model(&v), "{text}");
                assert_eq!(keeper, keeper_model(&v), "{text}");
            }
            // The two sockets take disjoint commands: a request sent to
            // the wrong one is refused, never taken for another.
            assert!(parsed.is_none() || keeper.is_none(), "{text}");
            line_with(text, *newline, trailer)
        }
        Input::Typed {
            t,
            newline,
            trailer,
        } => match t.build() {
            Ok(r) => {
                check_request(&r);
                line_with(serde_json::to_string(&r).unwrap(), *newline, trailer)
            }
            Err(k) => {
                check_keeper_request(&k);
                line_with(serde_json::to_string(&k).unwrap(), *newline, trailer)
            }
        },
    };
    if bytes.len() > 64 * 1024 {
        return;
    }
    let got = over_socket(&bytes);
    // The server reads up to and including the first newline, as UTF-8.
    let line_end = bytes
        .iter()
        .position(|&c| c == b'\n')
        .map_or(bytes.len(), |i| i + 1);
    let line = std::str::from_utf8(&bytes[..line_end]);
    // The keeper reads the same way (a line, then serde), without a
    // public reader of its own: its request from the same line.
    if let Ok(l) = line {
        match serde_json::from_str::<KeeperRequest>(l) {
            Ok(k) => {
                check_keeper_request(&k);
                assert!(got.is_err(), "{l:?} is {k:?} and {got:?}");
            }
            Err(e) => check_refusal(&RequestError::Parse(e)),
        }
    }
    match (&got, line) {
        (Ok(r), Ok(l)) => {
            assert_eq!(serde_json::from_str::<Request>(l).ok().as_ref(), Some(r));
            check_request(r);
        }
        (Ok(r), Err(_)) => panic!("{r:?} from a line that is not UTF-8"),
        (Err(e @ RequestError::Parse(_)), Ok(l)) => {
            assert!(serde_json::from_str::<Request>(l).is_err());
            check_refusal(e);
        }
        (Err(e @ RequestError::Read(_)), Err(_)) => check_refusal(e),
        (Err(e), Ok(l)) => panic!("read error {e} on a UTF-8 line {l:?}"),
        (Err(e), Err(_)) => panic!("{e} on a line that is not UTF-8"),
    }
});
