//! What changes on every call without the world changing (guard contract §4.3): volatile
//! keys, matched across spellings, and volatile tokens inside text, masked for the result
//! fingerprint only — never in what is stored or shown.
//!
//! Both run on every key and every string of every tool output, so they are hand-written
//! byte scanners: no allocation on the common path, and a string without an ASCII digit
//! (or a user pattern) costs one pass of `memchr`-like work.

use serde::{Deserialize, Serialize};

/// Longest built-in key after normalisation (`durationms`); longer keys are not built-in.
const KEY_BUF: usize = 16;

fn is_separator(b: u8) -> bool {
    matches!(b, b'_' | b'-' | b'.' | b' ')
}

/// `key` with separators dropped and ASCII letters lower-cased into `buf`: `durationMs`,
/// `DurationMs`, `duration-ms` and `duration_ms` all become `durationms`. `None` when it
/// does not fit (then it is no built-in key).
fn normalize_into<'a>(key: &[u8], buf: &'a mut [u8; KEY_BUF]) -> Option<&'a [u8]> {
    let mut n = 0;
    for &b in key {
        if is_separator(b) {
            continue;
        }
        if n == KEY_BUF {
            return None;
        }
        buf[n] = b.to_ascii_lowercase();
        n += 1;
    }
    Some(&buf[..n])
}

/// The built-in volatile keys (`DEFAULT_VOLATILE_RESULT_KEYS`) in any case and separator
/// style. A `match` on the normalised bytes: the compiler turns it into a length switch.
pub fn is_default_volatile_key(key: &str) -> bool {
    is_default_volatile_bytes(key.as_bytes())
}

fn is_default_volatile_bytes(key: &[u8]) -> bool {
    let mut buf = [0u8; KEY_BUF];
    let Some(norm) = normalize_into(key, &mut buf) else {
        return false;
    };
    matches!(
        norm,
        b"duration"
            | b"durationms"
            | b"elapsed"
            | b"elapsedms"
            | b"took"
            | b"tookms"
            | b"latencyms"
            | b"pid"
            | b"sessionid"
            | b"messageid"
            | b"fileid"
            | b"requestid"
            | b"traceid"
            | b"spanid"
            | b"timestamp"
            | b"ts"
            | b"createdat"
            | b"updatedat"
            | b"sentat"
    )
}

/// The words of a key: split at separators (`_ - . space`) and where a lower-case letter
/// or a digit meets an upper-case one (`totalToolUseCount` → total, tool, use, count;
/// `STARTED_AT` → STARTED, AT). Compared with [`word_is`], ignoring ASCII case.
fn key_words(key: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut start = 0;
    let mut i = 0;
    std::iter::from_fn(move || {
        while i < key.len() {
            let b = key[i];
            if is_separator(b) {
                let word = &key[start..i];
                i += 1;
                start = i;
                if !word.is_empty() {
                    return Some(word);
                }
                continue;
            }
            let camel = i > start
                && b.is_ascii_uppercase()
                && (key[i - 1].is_ascii_lowercase() || key[i - 1].is_ascii_digit());
            if camel {
                let word = &key[start..i];
                start = i;
                i += 1;
                return Some(word);
            }
            i += 1;
        }
        let word = &key[start..];
        start = key.len();
        (!word.is_empty()).then_some(word)
    })
}

fn word_is(word: &[u8], any_of: &[&str]) -> bool {
    any_of
        .iter()
        .any(|w| word.eq_ignore_ascii_case(w.as_bytes()))
}

/// Units a duration's key may end with (`elapsedSeconds`, `wall_time_ms`).
const TIME_UNITS: &[&str] = &[
    "ms", "s", "sec", "secs", "seconds", "us", "ns", "millis", "micros", "nanos", "minutes",
];

/// Keys of the usage and statistics counters a tool's report carries beside its content
/// (guard contract §4.3): token counts (`input_tokens`, `totalTokens`, `token_count`),
/// tool-use counts (`totalToolUseCount`, `tool_uses`, `num_tool_calls`) and durations
/// (`totalDurationMs`, `duration_api_ms`, `latencySeconds`, `wall_time_ms`). Only for
/// numbers: `tokens: ["a", "b"]` from a tokenizer, or `tool_calls: [...]`, is content.
/// `durations` and `elapsed_total_pages` are not counters (other words).
pub fn is_usage_counter_key(key: &str) -> bool {
    let mut words = [&[][..]; 8];
    let mut n = 0;
    for word in key_words(key.as_bytes()) {
        if n == words.len() {
            return false;
        }
        words[n] = word;
        n += 1;
    }
    let words = &words[..n];
    let Some(last) = words.last() else {
        return false;
    };
    if word_is(last, &["tokens"]) {
        return true;
    }
    let pair = |first: &[&str], second: &[&str]| {
        words
            .windows(2)
            .any(|w| word_is(w[0], first) && word_is(w[1], second))
    };
    if pair(&["token", "tokens"], &["count", "counts", "used", "total"]) {
        return true;
    }
    if pair(&["tool"], &["use", "uses", "call", "calls"])
        && word_is(last, &["count", "counts", "uses", "calls", "total"])
    {
        return true;
    }
    if words.iter().any(|w| word_is(w, &["duration", "latency"])) {
        return true;
    }
    // `elapsedSeconds`, `wall_time_ms`, `cpuTimeMs`: a span of time measured, by its unit.
    n >= 2 && word_is(last, TIME_UNITS) && word_is(words[n - 2], &["elapsed", "time"])
}

/// Keys that name a point in time (guard contract §4.3): `*_at`, `*At`, `*_time`,
/// `*Time`, `time`, in any spelling (`started_at`, `startedAt`, `STARTED-AT`,
/// `endTime`). The value under one is volatile when it looks like a time: a time string
/// is masked wherever it stands, and an epoch-looking number under such a key is too
/// ([`is_epoch_number`]).
pub fn is_time_key(key: &str) -> bool {
    let mut count = 0;
    let mut last: &[u8] = &[];
    for word in key_words(key.as_bytes()) {
        count += 1;
        last = word;
    }
    (count >= 2 && word_is(last, &["at"])) || word_is(last, &["time"])
}

/// A JSON number that reads as epoch seconds, milliseconds, micro- or nanoseconds of this
/// era, the way the `epoch` text mask reads digits (a fraction of seconds allowed).
pub fn is_epoch_number(number: &serde_json::Number) -> bool {
    let whole = match (number.as_u64(), number.as_f64()) {
        (Some(u), _) => u,
        (None, Some(f)) if f.is_finite() && f >= 1.0 => f.trunc() as u64,
        _ => return false,
    };
    let mut digits = [0u8; 20];
    let mut n = 0;
    let mut rest = whole;
    while rest > 0 {
        digits[19 - n] = b'0' + (rest % 10) as u8;
        rest /= 10;
        n += 1;
    }
    let text = &digits[20 - n..];
    epoch(text, 0, text.len()).is_some()
}

/// Whether the epoch text mask is in `set` (a tool that switched it off keeps epoch
/// numbers under time keys too).
pub fn masks_epochs(set: MaskSet) -> bool {
    set.has(Mask::Epoch)
}

/// Whether `key` and `listed` name the same key in another spelling: equal once
/// separators (`_ - . space`) are dropped and ASCII case is ignored. For users' lists.
pub fn same_key(key: &str, listed: &str) -> bool {
    let mut a = key.bytes().filter(|b| !is_separator(*b));
    let mut b = listed.bytes().filter(|b| !is_separator(*b));
    loop {
        match (a.next(), b.next()) {
            (None, None) => return true,
            (Some(x), Some(y)) if x.eq_ignore_ascii_case(&y) => {}
            _ => return false,
        }
    }
}

/// The built-in kinds of volatile token masked inside string values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mask {
    /// `9f3c2b1a-…` in the 8-4-4-4-12 form.
    Uuid,
    /// A run of 8 or more hex digits with both a digit and a letter (`9f3c2b1a`, a SHA).
    Hex,
    /// ISO-8601 date-times (`2026-12-01T09:03:28.5Z`, `2026-12-01 09:03`) and clock
    /// times (`09:03:28`).
    Timestamp,
    /// Epoch seconds, milliseconds, micro- or nanoseconds of this era (`1764500000`).
    Epoch,
    /// A number with a time unit (`3.2s`, `120ms`, `1m30s`).
    Duration,
    /// The value after a volatile key written into text (`pid 4412`, `session=9f3c`,
    /// `request_id: r-17`), when that value holds a digit.
    Keyed,
}

impl Mask {
    pub const ALL: [Mask; 6] = [
        Mask::Uuid,
        Mask::Hex,
        Mask::Timestamp,
        Mask::Epoch,
        Mask::Duration,
        Mask::Keyed,
    ];

    fn bit(self) -> u8 {
        1 << (self as u8)
    }

    /// The byte that stands for a masked token of this kind in the canonical form.
    fn marker(self) -> u8 {
        b"uhtedk"[self as usize]
    }
}

/// Which masks are on, as bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MaskSet(u8);

impl MaskSet {
    pub fn of(masks: &[Mask]) -> Self {
        MaskSet(masks.iter().fold(0, |bits, m| bits | m.bit()))
    }

    fn has(self, mask: Mask) -> bool {
        self.0 & mask.bit() != 0
    }
}

/// Masking for one tool's results: the built-in masks that are on and the user's
/// patterns (see [`pattern_match`] for their syntax).
#[derive(Clone, Copy)]
pub struct TextMask<'a> {
    pub masks: MaskSet,
    pub patterns: &'a [String],
    pub extra_patterns: &'a [String],
}

impl TextMask<'_> {
    pub const NONE: TextMask<'static> = TextMask {
        masks: MaskSet(0),
        patterns: &[],
        extra_patterns: &[],
    };

    fn is_off(&self) -> bool {
        self.masks.0 == 0 && self.patterns.is_empty() && self.extra_patterns.is_empty()
    }
}

/// The byte that starts a masked span in the canonical form: 0xFF never occurs in UTF-8,
/// so a masked string can never hash like any real text.
const MASKED: u8 = 0xFF;
/// The marker of a user pattern's match.
const PATTERN_MARKER: u8 = b'p';

/// Writes `s` into `buf`, masked: each volatile token becomes two bytes (`0xFF` and its
/// kind). Returns whether anything was masked; when nothing was, the bytes are `s`.
pub fn write_masked(buf: &mut Vec<u8>, s: &str, mask: &TextMask<'_>) -> bool {
    let bytes = s.as_bytes();
    let no_patterns = mask.patterns.is_empty() && mask.extra_patterns.is_empty();
    // Every built-in mask needs a digit: text without one is copied as is.
    if mask.is_off() || (no_patterns && !bytes.iter().any(u8::is_ascii_digit)) {
        buf.extend_from_slice(bytes);
        return false;
    }
    let mut masked = false;
    let mut copied = 0;
    let mut i = 0;
    // The previous word was a volatile key written in text (`pid`, `session`).
    let mut after_key = false;
    while i < bytes.len() {
        let boundary = i == 0 || !bytes[i - 1].is_ascii_alphanumeric();
        let b = bytes[i];
        let found = if boundary && (b.is_ascii_alphanumeric() || !no_patterns) {
            let pattern = mask
                .patterns
                .iter()
                .chain(mask.extra_patterns)
                .find_map(|p| pattern_match(p.as_bytes(), bytes, i))
                .map(|end| (PATTERN_MARKER, end));
            pattern.or_else(|| {
                builtin_at(bytes, i, mask.masks, after_key).map(|(kind, end)| (kind.marker(), end))
            })
        } else {
            None
        };
        if let Some((marker, end)) = found {
            buf.extend_from_slice(&bytes[copied..i]);
            buf.extend_from_slice(&[MASKED, marker]);
            masked = true;
            after_key = false;
            i = end;
            copied = end;
            continue;
        }
        if !b.is_ascii_alphanumeric() {
            after_key &= is_key_gap(b);
            i += 1;
            continue;
        }
        let token_end = run_end(bytes, i, |c| c.is_ascii_alphanumeric());
        after_key = false;
        // Keys are words that start with a letter (`pid`, `request_id`, `session`).
        if mask.masks.has(Mask::Keyed) && boundary && b.is_ascii_alphabetic() {
            let word_end = run_end(bytes, token_end, |c| {
                c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-')
            });
            if word_end > token_end && is_text_key(&bytes[i..word_end]) {
                after_key = true;
                i = word_end;
                continue;
            }
            after_key = is_text_key(&bytes[i..token_end]);
        }
        i = token_end;
    }
    buf.extend_from_slice(&bytes[copied..]);
    masked
}

fn run_end(bytes: &[u8], start: usize, class: impl Fn(&u8) -> bool) -> usize {
    start + bytes[start..].iter().take_while(|c| class(c)).count()
}

/// Between a key and its value in text: `pid 4412`, `pid=4412`, `session: 9f`, `id #4`.
fn is_key_gap(b: u8) -> bool {
    matches!(b, b' ' | b'=' | b':' | b'#' | b'_' | b'-')
}

/// A word in text that names a volatile value: a built-in volatile key (`pid`,
/// `request_id` written as one token), `session`, or `pgid` (Gemini CLI's shell tool
/// ends every output with `Process Group PGID: 48213`).
fn is_text_key(word: &[u8]) -> bool {
    word.eq_ignore_ascii_case(b"session")
        || word.eq_ignore_ascii_case(b"pgid")
        || is_default_volatile_bytes(word)
}

/// The built-in token starting at `start` (a token boundary), if one is on and matches,
/// with where it ends.
fn builtin_at(
    bytes: &[u8],
    start: usize,
    masks: MaskSet,
    after_key: bool,
) -> Option<(Mask, usize)> {
    if !bytes[start].is_ascii_alphanumeric() {
        return None;
    }
    let token_end = run_end(bytes, start, |c| c.is_ascii_alphanumeric());
    let digit_first = bytes[start].is_ascii_digit();
    let ends_token = |end: usize| end == bytes.len() || !bytes[end].is_ascii_alphanumeric();
    if masks.has(Mask::Uuid) {
        if let Some(end) = uuid(bytes, start).filter(|e| ends_token(*e)) {
            return Some((Mask::Uuid, end));
        }
    }
    if digit_first && masks.has(Mask::Timestamp) {
        if let Some(end) = iso_datetime(bytes, start).or_else(|| clock(bytes, start)) {
            return Some((Mask::Timestamp, end));
        }
    }
    if digit_first && masks.has(Mask::Duration) {
        if let Some(end) = duration(bytes, start).filter(|e| ends_token(*e)) {
            return Some((Mask::Duration, end));
        }
    }
    if digit_first && masks.has(Mask::Epoch) {
        if let Some(end) = epoch(bytes, start, token_end) {
            return Some((Mask::Epoch, end));
        }
    }
    let token = &bytes[start..token_end];
    if masks.has(Mask::Hex) && token.len() >= 8 && token.iter().all(u8::is_ascii_hexdigit) {
        let digits = token.iter().any(u8::is_ascii_digit);
        let letters = token.iter().any(u8::is_ascii_alphabetic);
        if digits && letters {
            return Some((Mask::Hex, token_end));
        }
    }
    if after_key && masks.has(Mask::Keyed) {
        // The value may run on with `-`, `_` or `.` (`r-17`, `4.2.1`).
        let end = run_end(bytes, start, |c| {
            c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.')
        });
        // Not the full stop after it.
        let end = end
            - bytes[start..end]
                .iter()
                .rev()
                .take_while(|c| !c.is_ascii_alphanumeric())
                .count();
        if bytes[start..end].iter().any(u8::is_ascii_digit) {
            return Some((Mask::Keyed, end));
        }
    }
    None
}

fn digits(bytes: &[u8], at: usize) -> usize {
    bytes.get(at..).map_or(0, |rest| {
        rest.iter().take_while(|b| b.is_ascii_digit()).count()
    })
}

fn exactly_digits(bytes: &[u8], at: usize, n: usize) -> Option<usize> {
    (digits(bytes, at) == n).then_some(at + n)
}

fn byte_is(bytes: &[u8], at: usize, want: &[u8]) -> bool {
    bytes.get(at).is_some_and(|b| want.contains(b))
}

fn uuid(bytes: &[u8], start: usize) -> Option<usize> {
    let mut at = start;
    for (i, len) in [8, 4, 4, 4, 12].into_iter().enumerate() {
        if i > 0 {
            if !byte_is(bytes, at, b"-") {
                return None;
            }
            at += 1;
        }
        let run = bytes
            .get(at..at + len)
            .filter(|r| r.iter().all(u8::is_ascii_hexdigit))?;
        at += run.len();
    }
    Some(at)
}

/// `YYYY-MM-DD[T ]HH:MM[:SS[.f]][Z|±HH[:]MM]`. A date alone is not volatile: it names a
/// day, which is often what was asked for.
fn iso_datetime(bytes: &[u8], start: usize) -> Option<usize> {
    let mut at = exactly_digits(bytes, start, 4)?;
    for _ in 0..2 {
        if !byte_is(bytes, at, b"-") {
            return None;
        }
        at = exactly_digits(bytes, at + 1, 2)?;
    }
    if !byte_is(bytes, at, b"T ") {
        return None;
    }
    at = clock_from(bytes, at + 1, true)?;
    if byte_is(bytes, at, b"Z") {
        at += 1;
    } else if byte_is(bytes, at, b"+-") {
        if let Some(mut end) = exactly_digits(bytes, at + 1, 2) {
            if byte_is(bytes, end, b":") {
                end += 1;
            }
            at = exactly_digits(bytes, end, 2).unwrap_or(end);
        } else if let Some(end) = exactly_digits(bytes, at + 1, 4) {
            at = end;
        }
    }
    Some(at)
}

/// `HH:MM:SS[.f]` on its own (a log line's time of day).
fn clock(bytes: &[u8], start: usize) -> Option<usize> {
    clock_from(bytes, start, false)
}

fn clock_from(bytes: &[u8], start: usize, seconds_optional: bool) -> Option<usize> {
    let hours = digits(bytes, start);
    if !(1..=2).contains(&hours) || !byte_is(bytes, start + hours, b":") {
        return None;
    }
    let mut at = exactly_digits(bytes, start + hours + 1, 2)?;
    if byte_is(bytes, at, b":") {
        at = exactly_digits(bytes, at + 1, 2)?;
        if byte_is(bytes, at, b".,") && digits(bytes, at + 1) > 0 {
            at += 1 + digits(bytes, at + 1);
        }
    } else if !seconds_optional {
        return None;
    }
    Some(at)
}

/// Longest first where one unit starts another (`ms` before `m`, `secs` before `s`).
const UNITS: [&[u8]; 14] = [
    b"ns",
    b"us",
    "µs".as_bytes(),
    b"ms",
    b"seconds",
    b"secs",
    b"sec",
    b"s",
    b"mins",
    b"min",
    b"m",
    b"hrs",
    b"hr",
    b"h",
];

/// `\d+(\.\d+)?unit`, repeated (`1m30s`, `2h5m`).
fn duration(bytes: &[u8], start: usize) -> Option<usize> {
    let mut at = start;
    let mut parts = 0;
    loop {
        let whole = digits(bytes, at);
        if whole == 0 {
            break;
        }
        let mut end = at + whole;
        if byte_is(bytes, end, b".") && digits(bytes, end + 1) > 0 {
            end += 1 + digits(bytes, end + 1);
        }
        let rest = &bytes[end..];
        let Some(unit) = UNITS.iter().find(|u| rest.starts_with(u)) else {
            break;
        };
        at = end + unit.len();
        parts += 1;
    }
    (parts > 0).then_some(at)
}

/// Epoch seconds (10 digits), ms (13), µs (16) or ns (19) between 2001 and 2033, with an
/// optional fraction.
fn epoch(bytes: &[u8], start: usize, token_end: usize) -> Option<usize> {
    let len = token_end - start;
    if !matches!(len, 10 | 13 | 16 | 19) || bytes[start] != b'1' || digits(bytes, start) != len {
        return None;
    }
    let mut end = token_end;
    if byte_is(bytes, end, b".") && digits(bytes, end + 1) > 0 {
        end += 1 + digits(bytes, end + 1);
    }
    Some(end)
}

/// A user pattern at `at`: literal bytes, `#` for one or more ASCII digits, `*` for one
/// or more of `[A-Za-z0-9_-]`, `\` to take the next byte literally (`\#`). Returns where
/// the match ends. `job-#` matches `job-42`; `sess_*` matches `sess_Ab12`.
pub fn pattern_match(pattern: &[u8], text: &[u8], at: usize) -> Option<usize> {
    let mut p = 0;
    let mut t = at;
    while p < pattern.len() {
        match pattern[p] {
            b'#' => {
                let n = digits(text, t);
                if n == 0 {
                    return None;
                }
                t += n;
                p += 1;
            }
            b'*' => {
                let n = text[t..]
                    .iter()
                    .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-'))
                    .count();
                if n == 0 {
                    return None;
                }
                t += n;
                p += 1;
            }
            b'\\' if p + 1 < pattern.len() => {
                if text.get(t) != Some(&pattern[p + 1]) {
                    return None;
                }
                t += 1;
                p += 2;
            }
            literal => {
                if text.get(t) != Some(&literal) {
                    return None;
                }
                t += 1;
                p += 1;
            }
        }
    }
    (t > at).then_some(t)
}

/// A pattern that can match: not empty, not ending in a lone `\`.
pub fn pattern_is_valid(pattern: &str) -> bool {
    let bytes = pattern.as_bytes();
    let trailing = bytes.iter().rev().take_while(|b| **b == b'\\').count();
    !bytes.is_empty() && trailing % 2 == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn masked(s: &str) -> String {
        masked_with(s, &[])
    }

    fn masked_with(s: &str, patterns: &[String]) -> String {
        let mut buf = Vec::new();
        let mask = TextMask {
            masks: MaskSet::of(&Mask::ALL),
            patterns,
            extra_patterns: &[],
        };
        write_masked(&mut buf, s, &mask);
        buf.iter()
            .map(|&b| if b == MASKED { '§' } else { b as char })
            .collect()
    }

    #[test]
    fn keys_match_across_case_and_separators() {
        for key in [
            "duration_ms",
            "durationMs",
            "DurationMs",
            "duration-ms",
            "DURATION_MS",
            "requestId",
            "x-request-id".trim_start_matches("x-"),
            "createdAt",
            "Timestamp",
            "traceID",
        ] {
            assert!(is_default_volatile_key(key), "{key}");
        }
        for key in [
            "hits",
            "durations",
            "page",
            "id",
            "cursor",
            "status",
            "t_s_x",
        ] {
            assert!(!is_default_volatile_key(key), "{key}");
        }
        assert!(same_key("cacheAge", "cache_age"));
        assert!(same_key("Cache-Age", "cache_age"));
        assert!(!same_key("cache_ages", "cache_age"));
    }

    #[test]
    fn volatile_tokens_are_masked_and_the_rest_kept() {
        let cases = [
            (
                "still running (pid 4412, session 9f3c, 3.2s)",
                "still running (pid §k, session §k, §d)",
            ),
            ("id 123e4567-e89b-12d3-a456-426614174000 ok", "id §u ok"),
            ("at 2026-12-01T09:03:28.123Z done", "at §t done"),
            ("at 2026-12-01 09:03:28+01:00.", "at §t."),
            ("[09:03:28] tick", "[§t] tick"),
            ("since 1764500000 / 1764500000123", "since §e / §e"),
            ("took 120ms, then 1m30s", "took §d, then §d"),
            ("commit 3f2a9c1e7b", "commit §h"),
            ("request_id=r-17 pid:88", "request_id=§k pid:§k"),
        ];
        for (input, want) in cases {
            assert_eq!(masked(input), want, "{input}");
        }
    }

    #[test]
    fn meaningful_numbers_are_not_masked() {
        for text in [
            "page 2 of 10",
            "3 files changed, 12 insertions",
            "version 1.2.3",
            "on 2026-12-01",
            "deadbeef",
            "12345678",
            "job 42 is running",
            "pct 50%",
            "x2s",
            "h264 video",
            "status 200",
        ] {
            assert_eq!(masked(text), text, "{text}");
        }
    }

    #[test]
    fn user_patterns_mask_their_matches() {
        let patterns = vec!["job-#".to_owned(), "sess_*".to_owned(), r"\#*".to_owned()];
        assert_eq!(
            masked_with("job-42 in sess_Ab1 #x9", &patterns),
            "§p in §p §p"
        );
        assert!(pattern_is_valid("a\\\\"));
        assert!(!pattern_is_valid("a\\"));
        assert!(!pattern_is_valid(""));
    }
}
