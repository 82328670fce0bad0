//! Call and result fingerprints (guard contract §4.3).
//!
//! `call = sha256(tool, canonical(args))`, `result = sha256(kind, code, canonical(output)
//! minus volatile keys)`. Canonical means: object keys sorted at every depth, string values
//! trimmed, the tool's `ignore_args` dropped from the top level of the arguments, and
//! volatile keys dropped at any depth of the output. The encoding is type-tagged and
//! length-prefixed, so no two different canonical values hash the same bytes.
//!
//! Fingerprints are kept as the first 128 bits of the digest: the state stays small and
//! comparisons cheap, and a collision needs ~2^64 distinct calls in one run.

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::event::{Args, Output, ResultKind};

pub type Fingerprint = u128;

fn finish(hasher: Sha256) -> Fingerprint {
    let digest = hasher.finalize();
    let mut head = [0u8; 16];
    head.copy_from_slice(&digest[..16]);
    u128::from_be_bytes(head)
}

/// The identity of a call: which tool, with which (canonical) arguments.
pub fn call_fingerprint(tool: &str, args: &Args, ignore_args: &[String]) -> Fingerprint {
    let mut hasher = Sha256::new();
    hasher.update(b"call\0");
    write_str(&mut hasher, tool);
    match args {
        Args::Json(value) => {
            hasher.update(b"j");
            write_canonical(
                &mut hasher,
                value,
                &|key, depth| depth == 0 && ignore_args.iter().any(|k| k == key),
                0,
            );
        }
        Args::Hash(hash) => {
            hasher.update(b"h");
            write_str(&mut hasher, hash);
        }
    }
    finish(hasher)
}

/// The identity of an answer: its kind, its code, and its output minus volatile keys.
pub fn result_fingerprint(
    kind: ResultKind,
    code: Option<&str>,
    output: Option<&Output>,
    is_volatile: &dyn Fn(&str) -> bool,
) -> Fingerprint {
    let mut hasher = Sha256::new();
    hasher.update(b"result\0");
    write_str(&mut hasher, kind.as_str());
    write_str(&mut hasher, code.unwrap_or(""));
    match output {
        Some(Output::Json(value)) => {
            hasher.update(b"j");
            write_canonical(&mut hasher, value, &|key, _depth| is_volatile(key), 0);
        }
        Some(Output::Hash(hash)) => {
            hasher.update(b"h");
            write_str(&mut hasher, hash);
        }
        None => hasher.update(b"-"),
    }
    finish(hasher)
}

/// A short fingerprint of a tool name, for grouping a window's calls by tool.
pub fn tool_fingerprint(tool: &str) -> u64 {
    let digest = Sha256::digest(tool.as_bytes());
    let mut head = [0u8; 8];
    head.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(head)
}

fn write_str(hasher: &mut Sha256, s: &str) {
    hasher.update((s.len() as u64).to_le_bytes());
    hasher.update(s.as_bytes());
}

fn write_canonical(
    hasher: &mut Sha256,
    value: &Value,
    drop_key: &dyn Fn(&str, usize) -> bool,
    depth: usize,
) {
    match value {
        Value::Null => hasher.update(b"n"),
        Value::Bool(true) => hasher.update(b"t"),
        Value::Bool(false) => hasher.update(b"f"),
        Value::Number(n) => {
            hasher.update(b"#");
            write_str(hasher, &n.to_string());
        }
        Value::String(s) => {
            hasher.update(b"s");
            write_str(hasher, s.trim());
        }
        Value::Array(items) => {
            hasher.update(b"[");
            for item in items {
                write_canonical(hasher, item, drop_key, depth + 1);
            }
            hasher.update(b"]");
        }
        Value::Object(map) => {
            hasher.update(b"{");
            // serde_json's default map is ordered; if another crate in the build turns on
            // `preserve_order`, it is not, and we sort here instead of trusting it.
            let sorted = map
                .keys()
                .zip(map.keys().skip(1))
                .all(|(a, b)| a.as_bytes() < b.as_bytes());
            let mut write_entry = |key: &str, item: &Value| {
                if !drop_key(key, depth) {
                    write_str(hasher, key);
                    write_canonical(hasher, item, drop_key, depth + 1);
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
            hasher.update(b"}");
        }
    }
}
