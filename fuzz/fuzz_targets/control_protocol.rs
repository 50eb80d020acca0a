//! The control socket's request parser (`zblk_ublk::control`), fed raw
//! bytes over a real socket pair (`read_request`, as the daemon's server
//! reads a client) and structured JSON built from the input. Checks: no
//! panic; `read_request` agrees with parsing the first line by itself; a
//! request that parses round-trips through its wire form; a structured
//! JSON value parses exactly when a plain model of the protocol says it
//! is a request; every refusal becomes a one-line `{"ok":false,...}` reply
//! (what the server writes back) that a client parses as a failure.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Number, Value};
use std::io::Write;
use std::os::unix::net::UnixStream;
use zblk_ublk::control::{read_request, RequestError};
use zblk_ublk::{Request, Response};

const CMDS: [&str; 7] = [
    "info", "stats", "compact", "set_mem_limit", "shutdown", "Info", "format_disk",
];
const KEYS: [&str; 5] = ["cmd", "bytes", "force", "data", "ok"];

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
        J::Arr(v) if depth < 4 => Value::Array(v.iter().take(8).map(|j| value(j, depth + 1)).collect()),
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

/// What the protocol says `v` is: a request, or not.
fn model(v: &Value) -> Option<Request> {
    let o = v.as_object()?;
    match o.get("cmd")?.as_str()? {
        "info" => Some(Request::Info),
        "stats" => Some(Request::Stats),
        "compact" => Some(Request::Compact),
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
    let wire = serde_json::to_string(r).unwrap();
    assert_eq!(&serde_json::from_str::<Request>(&wire).unwrap(), r, "{wire}");
}

#[derive(Arbitrary, Debug)]
enum Input {
    Bytes(Vec<u8>),
    Json { v: J, newline: bool, trailer: Vec<u8> },
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
        Input::Json { v, newline, trailer } => {
            let v = value(v, 0);
            let text = v.to_string();
            let parsed = serde_json::from_str::<Request>(&text).ok();
            // serde also takes an internally tagged enum from an array
            // (`["stats"]`): harmless, so arrays are only checked not to
            // panic and to round-trip.
            if !v.is_array() {
                assert_eq!(parsed, model(&v), "{text}");
            }
            let mut b = text.into_bytes();
            if *newline {
                b.push(b'\n');
                b.extend_from_slice(trailer);
            }
            b
        }
    };
    if bytes.len() > 64 * 1024 {
        return;
    }
    let got = over_socket(&bytes);
    // The server reads up to and including the first newline, as UTF-8.
    let line_end = bytes.iter().position(|&c| c == b'\n').map_or(bytes.len(), |i| i + 1);
    let line = std::str::from_utf8(&bytes[..line_end]);
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
