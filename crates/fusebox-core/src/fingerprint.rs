//! Call and result fingerprints (guard contract §4.3).
//!
//! `call = sha256(tool, canonical(args))`, `result = sha256(kind, code, canonical(output)
//! minus volatile keys)`. Canonical means: object keys sorted at every depth, string values
//! trimmed, the tool's `ignore_args` dropped from the top level of the arguments, and
//! volatile keys dropped at any depth of the output, and in the output's strings the
//! volatile tokens (ids, timestamps, durations: `volatile.rs`) masked. Arguments are never
//! masked: a call for another session id is another call. The encoding is type-tagged and
//! length-prefixed, so no two different canonical values hash the same bytes.
//!
//! Fingerprints are kept as the first 128 bits of the digest: the state stays small and
//! comparisons cheap, and a collision needs ~2^64 distinct calls in one run. The
//! canonical bytes are written into a reusable buffer and hashed once: feeding SHA-256
//! a few bytes at a time costs more than the hashing itself.

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::event::{Args, Output, ResultKind};
use crate::volatile::{write_masked, TextMask};

pub type Fingerprint = u128;

fn finish(digest: impl AsRef<[u8]>) -> Fingerprint {
    let digest = digest.as_ref();
    let mut head = [0u8; 16];
    head.copy_from_slice(&digest[..16]);
    u128::from_be_bytes(head)
}

/// The identity of a call: which tool, with which (canonical) arguments.
pub fn call_fingerprint(tool: &str, args: &Args, ignore_args: &[String]) -> Fingerprint {
    call_fingerprint_in(&mut Vec::new(), tool, args, ignore_args)
}

/// [`call_fingerprint`] with a caller-owned scratch buffer (left empty afterwards).
pub fn call_fingerprint_in(
    buf: &mut Vec<u8>,
    tool: &str,
    args: &Args,
    ignore_args: &[String],
) -> Fingerprint {
    buf.clear();
    buf.extend_from_slice(b"call\0");
    write_str(buf, tool);
    match args {
        Args::Json(value) => {
            buf.push(b'j');
            let drop_key = |key: &str, depth: usize, _: &Value| {
                depth == 0 && ignore_args.iter().any(|k| k == key)
            };
            write_canonical(buf, value, &drop_key, None, false, 0);
        }
        Args::Hash(hash) => {
            buf.push(b'h');
            write_str(buf, hash);
        }
    }
    digest(buf)
}

/// The question a call asks: its canonical form with every free-text argument reduced
/// to its identifiers ([`is_free_text`]: mostly plain words, "title of song"), so that
/// the wordings of one question ask the same. `None` when the arguments hold no free text: two calls
/// that differ there differ in an identifier (an id, a path, a host, a flag, a command),
/// which makes them a sweep, never a rewording.
pub fn question_fingerprint_in(
    buf: &mut Vec<u8>,
    tool: &str,
    args: &Args,
    ignore_args: &[String],
) -> Option<Fingerprint> {
    let Args::Json(value) = args else {
        return None;
    };
    let drop_key =
        |key: &str, depth: usize, _: &Value| depth == 0 && ignore_args.iter().any(|k| k == key);
    if !holds_free_text(value, &drop_key, 0) {
        return None;
    }
    buf.clear();
    buf.extend_from_slice(b"question\0");
    write_str(buf, tool);
    write_canonical(buf, value, &drop_key, None, true, 0);
    Some(digest(buf))
}

/// A plain word: letters, with an apostrophe or an inner hyphen, and the punctuation of
/// a sentence around it. A digit, a slash, a leading dash, an underscore or a dot inside
/// makes a token an identifier (`svc-0`, `3.12`, `src/`, `-rn`, `parse_event`, `a.rs`).
fn is_plain_word(token: &str) -> bool {
    let word = token.trim_matches(|c: char| {
        matches!(
            c,
            '"' | '\'' | '(' | ')' | '?' | '!' | '.' | ',' | ';' | ':'
        )
    });
    !word.is_empty()
        && !word.starts_with('-')
        && word
            .chars()
            .all(|c| c.is_alphabetic() || c == '\'' || c == '-')
}

/// Free text: two or more plain words, making at least half of the string's words
/// ("title of song", "python 3.12 install error"). A command line or a path is mostly
/// identifiers (`grep -rn handle_event_3 src/`, `curl http://svc-0/healthz`): not free
/// text, and kept as it is.
pub fn is_free_text(s: &str) -> bool {
    // Most arguments are one token (an id, a path): one scan for a space settles them.
    if !s.trim().contains(|c: char| c.is_ascii_whitespace()) {
        return false;
    }
    let (mut tokens, mut plain) = (0usize, 0usize);
    for token in s.split_whitespace() {
        tokens += 1;
        plain += usize::from(is_plain_word(token));
    }
    plain >= 2 && plain * 2 >= tokens
}

/// What a free-text string asks, for the question fingerprint: its identifiers (numbers,
/// versions, names with digits, paths), in order of their bytes; its plain words are the
/// wording. "python 3.12 install error" and "install python 3.12 failed" ask the same.
fn write_question(buf: &mut Vec<u8>, s: &str) {
    let mut identifiers: Vec<&str> = s.split_whitespace().filter(|t| !is_plain_word(t)).collect();
    identifiers.sort_unstable();
    buf.push(b'q');
    buf.extend_from_slice(&(identifiers.len() as u64).to_le_bytes());
    for identifier in identifiers {
        write_str(buf, identifier);
    }
}

fn holds_free_text(
    value: &Value,
    drop_key: &dyn Fn(&str, usize, &Value) -> bool,
    depth: usize,
) -> bool {
    match value {
        Value::String(s) => is_free_text(s),
        Value::Array(items) => items
            .iter()
            .any(|v| holds_free_text(v, drop_key, depth + 1)),
        Value::Object(map) => map
            .iter()
            .any(|(k, v)| !drop_key(k, depth, v) && holds_free_text(v, drop_key, depth + 1)),
        _ => false,
    }
}

/// The identity of an answer: its kind, its code, and its output minus volatile keys,
/// with the volatile tokens inside its strings masked (`text`). `is_volatile` sees each
/// key with its value: some keys are volatile only for some values (a usage counter is
/// a number; an epoch under `startedAt`).
pub fn result_fingerprint(
    kind: ResultKind,
    code: Option<&str>,
    output: Option<&Output>,
    is_volatile: &dyn Fn(&str, &Value) -> bool,
    text: &TextMask<'_>,
) -> Fingerprint {
    result_fingerprint_in(&mut Vec::new(), kind, code, output, is_volatile, text)
}

/// [`result_fingerprint`] with a caller-owned scratch buffer.
pub fn result_fingerprint_in(
    buf: &mut Vec<u8>,
    kind: ResultKind,
    code: Option<&str>,
    output: Option<&Output>,
    is_volatile: &dyn Fn(&str, &Value) -> bool,
    text: &TextMask<'_>,
) -> Fingerprint {
    buf.clear();
    buf.extend_from_slice(b"result\0");
    write_str(buf, kind.as_str());
    write_str(buf, code.unwrap_or(""));
    match output {
        Some(Output::Json(value)) => {
            buf.push(b'j');
            write_canonical(
                buf,
                value,
                &|key, _depth, item| is_volatile(key, item),
                Some(text),
                false,
                0,
            );
        }
        Some(Output::Hash(hash)) => {
            buf.push(b'h');
            write_str(buf, hash);
        }
        None => buf.push(b'-'),
    }
    digest(buf)
}

fn digest(buf: &mut Vec<u8>) -> Fingerprint {
    let fp = finish(Sha256::digest(buf.as_slice()));
    buf.clear();
    fp
}

/// A short hash of a tool name (FNV-1a), for grouping a window's calls by tool; it never
/// leaves the process, so it need not be SHA-256.
pub fn tool_fingerprint(tool: &str) -> u64 {
    crate::fixed_hash::fnv1a(tool.as_bytes())
}

fn write_str(buf: &mut Vec<u8>, s: &str) {
    buf.extend_from_slice(&(s.len() as u64).to_le_bytes());
    buf.extend_from_slice(s.as_bytes());
}

/// A string with its volatile tokens masked, length-prefixed like [`write_str`]: a
/// string with nothing to mask writes the same bytes `write_str` would.
fn write_masked_str(buf: &mut Vec<u8>, s: &str, text: &TextMask<'_>) {
    let at = buf.len();
    buf.extend_from_slice(&0u64.to_le_bytes());
    write_masked(buf, s, text);
    let len = (buf.len() - at - 8) as u64;
    buf[at..at + 8].copy_from_slice(&len.to_le_bytes());
}

fn write_canonical(
    buf: &mut Vec<u8>,
    value: &Value,
    drop_key: &dyn Fn(&str, usize, &Value) -> bool,
    text: Option<&TextMask<'_>>,
    mask_free_text: bool,
    depth: usize,
) {
    match value {
        Value::Null => buf.push(b'n'),
        Value::Bool(true) => buf.push(b't'),
        Value::Bool(false) => buf.push(b'f'),
        Value::Number(n) => {
            // Integers and floats are tagged apart, so 1 and 1.0 stay different calls.
            if let Some(u) = n.as_u64() {
                buf.push(b'u');
                buf.extend_from_slice(&u.to_le_bytes());
            } else if let Some(i) = n.as_i64() {
                buf.push(b'i');
                buf.extend_from_slice(&i.to_le_bytes());
            } else {
                buf.push(b'd');
                buf.extend_from_slice(&n.as_f64().unwrap_or(f64::NAN).to_bits().to_le_bytes());
            }
        }
        Value::String(s) if mask_free_text && is_free_text(s) => write_question(buf, s),
        Value::String(s) => {
            buf.push(b's');
            match text {
                Some(text) => write_masked_str(buf, s.trim(), text),
                None => write_str(buf, s.trim()),
            }
        }
        Value::Array(items) => {
            buf.push(b'[');
            for item in items {
                write_canonical(buf, item, drop_key, text, mask_free_text, depth + 1);
            }
            buf.push(b']');
        }
        Value::Object(map) => {
            buf.push(b'{');
            // serde_json's default map is ordered; if another crate in the build turns on
            // `preserve_order`, it is not, and we sort here instead of trusting it.
            let sorted = map
                .keys()
                .zip(map.keys().skip(1))
                .all(|(a, b)| a.as_bytes() < b.as_bytes());
            let mut write_entry = |key: &str, item: &Value| {
                if !drop_key(key, depth, item) {
                    write_str(buf, key);
                    write_canonical(buf, item, drop_key, text, mask_free_text, depth + 1);
                }
            };
            if sorted {
                for (key, item) in map {
                    write_entry(key, item);
                }
            } else {
                let mut entries: Vec<(&String, &Value)> = map.iter().collect();
                entries.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
                for (key, item) in entries {
                    write_entry(key, item);
                }
            }
            buf.push(b'}');
        }
    }
}
