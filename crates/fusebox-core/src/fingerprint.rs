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

use std::collections::BTreeMap;

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::event::{Args, Output, ResultKind};
use crate::run::{Wording, WORDING_MAX};
use crate::volatile::{write_masked, TextMask};

pub type Fingerprint = u128;

fn finish(digest: impl AsRef<[u8]>) -> Fingerprint {
    let digest = digest.as_ref();
    let mut head = [0u8; 16];
    head.copy_from_slice(&digest[..16]);
    u128::from_be_bytes(head)
}

/// Which top-level arguments are left out of a call's identity: those the tool's policy
/// names as describing rather than acting (`ignore_args`: a model-written `description`
/// of a shell command, a nonce) and those equal to the tool's own default (`defaults`:
/// `offset: 1` on a read that starts at line 1 anyway).
#[derive(Clone, Copy)]
pub struct ArgFilter<'a> {
    pub ignore: &'a [String],
    pub defaults: &'a BTreeMap<String, Value>,
}

pub static NO_DEFAULTS: BTreeMap<String, Value> = BTreeMap::new();

impl<'a> ArgFilter<'a> {
    /// Leaves out only the listed keys.
    pub fn ignoring(ignore: &'a [String]) -> Self {
        ArgFilter {
            ignore,
            defaults: &NO_DEFAULTS,
        }
    }

    fn drops(&self, key: &str, value: &Value) -> bool {
        self.ignore.iter().any(|k| k == key)
            || self
                .defaults
                .get(key)
                .is_some_and(|default| same_value(default, value))
    }
}

/// JSON equality, numbers by value (`1` and `1.0` are the same default).
fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x == y || x.as_f64() == y.as_f64(),
        _ => a == b,
    }
}

/// The identity of a call: which tool, with which (canonical) arguments.
pub fn call_fingerprint(tool: &str, args: &Args, ignore_args: &[String]) -> Fingerprint {
    call_fingerprint_in(
        &mut Vec::new(),
        tool,
        args,
        ArgFilter::ignoring(ignore_args),
    )
}

/// [`call_fingerprint`] with a caller-owned scratch buffer (left empty afterwards), and
/// the tool's defaults left out too.
pub fn call_fingerprint_in(
    buf: &mut Vec<u8>,
    tool: &str,
    args: &Args,
    filter: ArgFilter<'_>,
) -> Fingerprint {
    buf.clear();
    buf.extend_from_slice(b"call\0");
    write_str(buf, tool);
    match args {
        Args::Json(value) => {
            buf.push(b'j');
            let drop_key =
                |key: &str, depth: usize, item: &Value| depth == 0 && filter.drops(key, item);
            write_canonical(buf, value, &drop_key, None, None, 0);
        }
        Args::Hash(hash) => {
            buf.push(b'h');
            write_str(buf, hash);
        }
    }
    digest(buf)
}

/// The wording of a call whose arguments hold text (free text, or a plain word): its
/// shape — the tool and the arguments with each text reduced to its identifiers
/// (numbers, versions, names with digits, paths), so the wordings of one question share
/// a shape and a sweep over ids does not — and its content words ([`Wording`]). `None`
/// when the arguments hold no text: two such calls differ in an identifier (an id, a
/// path, a host, a flag, a command), which makes them a sweep, never a rewording.
pub fn wording_in(
    buf: &mut Vec<u8>,
    tool: &str,
    args: &Args,
    filter: ArgFilter<'_>,
) -> Option<Wording> {
    let Args::Json(value) = args else {
        return None;
    };
    let drop_key = |key: &str, depth: usize, item: &Value| depth == 0 && filter.drops(key, item);
    buf.clear();
    write_str(buf, tool);
    // One pass writes the shape and collects the words.
    let mut texts = Texts::default();
    write_canonical(buf, value, &drop_key, None, Some(&mut texts), 0);
    if !texts.found {
        buf.clear();
        return None;
    }
    // Compared only with the shapes of the same run's calls of the same tool: a 64-bit
    // FNV-1a is enough, and a tenth of a SHA-256 on the gate's path.
    let shape = crate::fixed_hash::fnv1a(buf);
    buf.clear();
    let words = texts.words;
    Some(Wording { shape, words })
}

/// A plain word: letters, with an apostrophe or an inner hyphen, and the punctuation of
/// a sentence around it. A digit, a slash, a leading dash, an underscore or a dot inside
/// makes a token an identifier (`svc-0`, `3.12`, `src/`, `-rn`, `parse_event`, `a.rs`).
fn is_plain_word(token: &str) -> bool {
    let word = strip_punctuation(token);
    !word.is_empty()
        && !word.starts_with('-')
        && word
            .chars()
            .all(|c| c.is_alphabetic() || c == '\'' || c == '-')
}

fn strip_punctuation(token: &str) -> &str {
    token.trim_matches(|c: char| {
        matches!(
            c,
            '"' | '\'' | '(' | ')' | '?' | '!' | '.' | ',' | ';' | ':'
        )
    })
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

/// Text, for wordings: free text, or one plain word of two letters or more (a one-word
/// search: `"songs"`).
fn is_text(s: &str) -> bool {
    let t = s.trim();
    if t.contains(|c: char| c.is_ascii_whitespace()) {
        return is_free_text(t);
    }
    is_plain_word(t) && strip_punctuation(t).chars().count() >= 2
}

/// What a text asks, for the shape: its identifiers, in order of their bytes; its plain
/// words are the wording.
fn write_question(buf: &mut Vec<u8>, s: &str) {
    let mut identifiers: Vec<&str> = s.split_whitespace().filter(|t| !is_plain_word(t)).collect();
    identifiers.sort_unstable();
    buf.push(b'q');
    buf.extend_from_slice(&(identifiers.len() as u64).to_le_bytes());
    for identifier in identifiers {
        write_str(buf, identifier);
    }
}

/// Arguments whose text is a command or a pattern, never a question, even when every
/// word of it is a plain word (`git status`, `npm test`, a grep for `TODO`).
fn is_command_key(key: &str) -> bool {
    matches!(
        key,
        "command"
            | "commands"
            | "cmd"
            | "script"
            | "code"
            | "shell"
            | "sql"
            | "pattern"
            | "regex"
            | "expression"
    )
}

/// The texts met while a call's shape is written: whether there was any, and their
/// content words in key order (at most [`WORDING_MAX`]).
#[derive(Default)]
struct Texts {
    found: bool,
    words: Vec<u32>,
}

impl Texts {
    fn take(&mut self, text: &str) {
        self.found = true;
        for token in text.split_whitespace() {
            if self.words.len() == WORDING_MAX {
                return;
            }
            if is_plain_word(token) {
                if let Some(word) = content_word(strip_punctuation(token)) {
                    self.words.push(word);
                }
            }
        }
    }
}

/// Words that carry no question of their own (English function words, and the verbs
/// of asking).
fn is_common_word(word: &str) -> bool {
    matches!(
        word,
        "a" | "about"
            | "all"
            | "an"
            | "and"
            | "any"
            | "are"
            | "as"
            | "at"
            | "be"
            | "by"
            | "can"
            | "could"
            | "do"
            | "does"
            | "did"
            | "for"
            | "from"
            | "get"
            | "give"
            | "had"
            | "has"
            | "have"
            | "how"
            | "i"
            | "if"
            | "in"
            | "into"
            | "is"
            | "it"
            | "its"
            | "let"
            | "me"
            | "my"
            | "no"
            | "not"
            | "of"
            | "on"
            | "or"
            | "our"
            | "please"
            | "show"
            | "so"
            | "some"
            | "that"
            | "the"
            | "their"
            | "there"
            | "these"
            | "this"
            | "to"
            | "up"
            | "us"
            | "was"
            | "we"
            | "were"
            | "what"
            | "when"
            | "where"
            | "which"
            | "who"
            | "why"
            | "will"
            | "with"
            | "would"
            | "you"
            | "your"
            | "find"
            | "search"
            | "look"
            | "list"
            | "tell"
    )
}

/// A word as the wording keeps it: lower case, common words left out, the endings of
/// plurals and tenses cut (`alerts` and `alert`, `failed` and `fail`), as a 32-bit hash.
fn content_word(word: &str) -> Option<u32> {
    let mut ascii = [0u8; 32];
    let lower: std::borrow::Cow<'_, str> = if word.len() <= ascii.len() && word.is_ascii() {
        // Most words are short and ASCII: lower-cased on the stack, no allocation.
        let bytes = &mut ascii[..word.len()];
        bytes.copy_from_slice(word.as_bytes());
        bytes.make_ascii_lowercase();
        std::borrow::Cow::Borrowed(std::str::from_utf8(bytes).expect("ASCII"))
    } else {
        std::borrow::Cow::Owned(word.to_lowercase())
    };
    let mut w = lower.trim_end_matches("'s").trim_matches('\'');
    if w.len() < 2 || is_common_word(w) {
        return None;
    }
    for (suffix, keep) in [("ing", 4), ("ed", 3), ("es", 4), ("s", 3)] {
        if w.len() >= suffix.len() + keep && w.ends_with(suffix) && !w.ends_with("ss") {
            w = &w[..w.len() - suffix.len()];
            break;
        }
    }
    Some(crate::fixed_hash::fnv1a(w.as_bytes()) as u32)
}

/// Whether two wordings of one shape ask one question. Short ones (a search, a lookup:
/// up to [`SHORT_QUESTION`] words) do when they share a topic word — a third of the
/// shorter one's words — since a flailing search keeps its topic and trades the rest for
/// synonyms (`quarterly revenue report`, `Q3 revenue summary`, `income report
/// quarterly`); longer ones when they share half of all their words, and texts longer
/// than a question (a comment, a thought) only when four fifths. Except a template with
/// another value in it: the same words in the same order around one to three words that
/// are new on each side, no more than the words around them (`alerts for Chicago`,
/// `alerts for Denver`; `John Smith`, `Jane Smith`) — a sweep over a list.
pub fn same_question(a: &[u32], b: &[u32]) -> bool {
    if a.is_empty() || b.is_empty() {
        return a == b;
    }
    let prefix = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let max_suffix = a.len().min(b.len()) - prefix;
    let suffix = a
        .iter()
        .rev()
        .zip(b.iter().rev())
        .take(max_suffix)
        .take_while(|(x, y)| x == y)
        .count();
    let (slot_a, slot_b) = (&a[prefix..a.len() - suffix], &b[prefix..b.len() - suffix]);
    let substituted = prefix + suffix >= slot_a.len().max(slot_b.len())
        && (1..=3).contains(&slot_a.len())
        && (1..=3).contains(&slot_b.len())
        && slot_a.iter().all(|w| !b.contains(w))
        && slot_b.iter().all(|w| !a.contains(w));
    if substituted {
        return false;
    }
    let distinct = |words: &[u32]| {
        let mut set = words.to_vec();
        set.sort_unstable();
        set.dedup();
        set
    };
    let (set_a, set_b) = (distinct(a), distinct(b));
    let shared = set_a
        .iter()
        .filter(|w| set_b.binary_search(w).is_ok())
        .count();
    let all = set_a.len() + set_b.len() - shared;
    let longest = set_a.len().max(set_b.len());
    let shortest = set_a.len().min(set_b.len());
    if longest > QUESTION_WORDS {
        shared * 5 >= all * 4
    } else if longest > SHORT_QUESTION {
        shared * 2 >= all
    } else {
        shared >= 1 && shared * 3 >= shortest
    }
}

/// Content words of a short question (a search query, a name).
pub const SHORT_QUESTION: usize = 6;

/// Content words of a question; a longer text is content (a comment, a thought), and
/// two of them are one only when nearly the same.
pub const QUESTION_WORDS: usize = 12;

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
                None,
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

/// `texts`: where the arguments' texts go, when a call's shape is written — each is
/// written as its identifiers only, and its words are collected (not under a command
/// or pattern key, whose text is no question).
fn write_canonical(
    buf: &mut Vec<u8>,
    value: &Value,
    drop_key: &dyn Fn(&str, usize, &Value) -> bool,
    text: Option<&TextMask<'_>>,
    mut texts: Option<&mut Texts>,
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
        Value::String(s) if texts.is_some() && is_text(s) => {
            if let Some(texts) = texts {
                texts.take(s);
            }
            write_question(buf, s)
        }
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
                write_canonical(buf, item, drop_key, text, texts.as_deref_mut(), depth + 1);
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
                    let texts = texts.as_deref_mut().filter(|_| !is_command_key(key));
                    write_canonical(buf, item, drop_key, text, texts, depth + 1);
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
