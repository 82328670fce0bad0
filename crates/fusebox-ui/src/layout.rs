//! The page frame and the small pieces every page uses. Everything from the daemon goes
//! through maud's `(…)` splices, which escape it: a tool argument `<script>` is text.

use maud::{html, Markup, PreEscaped, DOCTYPE};

/// Styles: readable on a phone (the tables scroll sideways inside their box), visible
/// keyboard focus, no external resources.
const STYLE: &str = r#"
:root{color-scheme:light dark;--muted:#777;--line:#8884;--ok:#2a7;--bad:#d33;--warn:#c80;--cancel:#86c}
body{font:14px/1.45 system-ui,sans-serif;margin:0 auto;max-width:1400px;padding:0 12px 40px}
header{display:flex;flex-wrap:wrap;gap:12px;align-items:baseline;border-bottom:1px solid var(--line);padding:10px 0}
header a.home{font-weight:700;text-decoration:none}
h1{font-size:20px;margin:14px 0 6px;word-break:break-all}
main{overflow-wrap:anywhere}
h2{font-size:16px;margin:22px 0 6px}
a:focus-visible,button:focus-visible,input:focus-visible,select:focus-visible,textarea:focus-visible,summary:focus-visible{outline:3px solid #39f;outline-offset:2px}
.scroll{overflow-x:auto;border:1px solid var(--line);border-radius:6px}
table{border-collapse:collapse;width:100%}
th,td{text-align:left;padding:5px 8px;border-bottom:1px solid var(--line);vertical-align:top}
th{font-weight:600;white-space:nowrap}
table.rows td{white-space:nowrap}
table.rows td.wrap{white-space:normal;min-width:16em;max-width:40em}
time{white-space:nowrap}
td.n{text-align:right;font-variant-numeric:tabular-nums}
code,pre{font:12px/1.4 ui-monospace,monospace}
pre{white-space:pre-wrap;overflow-wrap:anywhere;margin:4px 0;max-height:60vh;overflow:auto}
p.said{margin:4px 0;overflow-wrap:anywhere}
details summary{cursor:pointer}
.state{font-weight:600;white-space:nowrap}
.s-OPEN{color:var(--ok)}.s-COMPLETED{color:var(--muted)}
.s-STOPPED_LOOP_GUARD,.s-FAILED{color:var(--bad)}.s-NEEDS_HUMAN{color:var(--warn)}.s-CANCELLED{color:var(--cancel)}
.a-block,.a-stop{color:var(--bad);font-weight:600}.a-warn,.a-use_completed_result{color:var(--warn);font-weight:600}
.counts{display:flex;flex-wrap:wrap;gap:6px 14px;margin:8px 0}
form.filters{display:flex;flex-wrap:wrap;gap:8px;align-items:end;margin:10px 0}
form.filters label{display:flex;flex-direction:column;font-size:12px;color:var(--muted)}
input,select,textarea,button{font:inherit;padding:4px 6px}
textarea{width:100%;max-width:700px;min-height:6em}
button{cursor:pointer}
.muted{color:var(--muted)}
dl.facts{display:grid;grid-template-columns:max-content 1fr;gap:2px 14px;margin:6px 0}
dl.facts dt{color:var(--muted)}dl.facts dd{margin:0;word-break:break-all}
.answer{border:1px solid var(--line);border-radius:6px;padding:8px 12px;margin:10px 0}
.refused{border-color:var(--bad)}
.actions{display:flex;flex-wrap:wrap;gap:10px;margin:8px 0}
.actions a{padding:4px 10px;border:1px solid var(--line);border-radius:6px;text-decoration:none}
section.summary{border:1px solid var(--line);border-left:4px solid var(--bad);border-radius:6px;padding:6px 12px;margin:10px 0}
section.summary.ended{border-left-color:var(--muted)}
section.summary p.headline{font-size:15px;font-weight:600;margin:6px 0}
section.summary ul{margin:4px 0;padding-left:20px}
.fleet{display:grid;grid-template-columns:repeat(auto-fit,minmax(260px,1fr));gap:8px 18px;margin:8px 0}
.fleet h2{font-size:14px;margin:4px 0}
.fleet ol,.fleet ul{margin:2px 0;padding-left:20px}
p.position{font-weight:600}
"#;

/// Swaps the `[data-live]` element's contents with what the page's SSE stream sends
/// (HTML the server rendered and escaped), and says whether the stream is up. The
/// reader's place survives a swap: every unfolded `details[data-key]` is unfolded again
/// and the focused link or fold is focused again (found by id, fold key or href), so a
/// live page neither closes what someone is reading nor drops keyboard focus.
const LIVE_SCRIPT: &str = r#"
(function(){
  var box=document.querySelector('[data-live]');var note=document.getElementById('live');
  if(!box||!window.EventSource){if(note)note.textContent='';return;}
  function where(el){
    if(!el||!box.contains(el))return null;
    var sel=null;var fold=el.closest('details[data-key]');
    if(el.id)sel='#'+CSS.escape(el.id);
    else if(fold&&el.tagName==='SUMMARY')sel='details[data-key="'+CSS.escape(fold.getAttribute('data-key'))+'"]>summary';
    else if(el.getAttribute('href'))sel=el.tagName.toLowerCase()+'[href="'+CSS.escape(el.getAttribute('href'))+'"]';
    if(!sel)return null;
    return {sel:sel,i:Array.prototype.indexOf.call(box.querySelectorAll(sel),el)};
  }
  var source=new EventSource(box.getAttribute('data-live'));
  source.addEventListener('update',function(e){
    var open=Array.prototype.map.call(box.querySelectorAll('details[open][data-key]'),function(d){return d.getAttribute('data-key');});
    var focus=where(document.activeElement);
    box.innerHTML=e.data;
    open.forEach(function(k){var d=box.querySelector('details[data-key="'+CSS.escape(k)+'"]');if(d)d.open=true;});
    if(focus){var all=box.querySelectorAll(focus.sel);var t=all[focus.i]||all[0];if(t)t.focus({preventScroll:true});}
  });
  source.onopen=function(){note.textContent='live';};
  source.onerror=function(){note.textContent='reconnecting…';};
})();
"#;

pub fn page(title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · fusebox" }
                style { (PreEscaped(STYLE)) }
            }
            body {
                header {
                    a.home href="/" { "fusebox" }
                    nav aria-label="Pages" { a href="/" { "Runs" } " · " a href="/watchdog" { "Watchdog" } }
                    span { (title) }
                    span #live .muted aria-live="polite" {}
                }
                main { (body) }
                script { (PreEscaped(LIVE_SCRIPT)) }
            }
        }
    }
}

/// Folded texts show this many characters before they are opened.
const SHORT: usize = 80;

/// The start of `text` a fold shows: up to [`SHORT`] characters of its first line, cut
/// at a space when there is one in the second half (no word broken in two).
fn head(text: &str) -> &str {
    let line = text.split('\n').next().unwrap_or("");
    let end = line
        .char_indices()
        .nth(SHORT)
        .map_or(line.len(), |(i, _)| i);
    let cut = &line[..end];
    match cut.rfind(' ') {
        Some(space) if end < line.len() && space > cut.len() / 2 => &cut[..space],
        _ => cut,
    }
}

/// A text shown whole when short, folded (its start shown, all of it one click away)
/// when long: nothing is dropped. `key` names the fold on its page, so a live update
/// keeps it open.
pub fn folded(key: &str, text: &str) -> Markup {
    if text.chars().count() <= SHORT && !text.contains('\n') {
        return html! { code { (text) } };
    }
    html! {
        details data-key=(key) {
            summary { code { (head(text)) "…" } " " span.muted { "(" (text.chars().count()) " chars)" } }
            pre { (text) }
        }
    }
}

/// The end of `text` a folded sentence shows: its last [`SHORT`] characters, from a
/// word's start when there is one.
fn tail(text: &str) -> &str {
    let count = text.chars().count();
    let start = text
        .char_indices()
        .nth(count.saturating_sub(SHORT))
        .map_or(0, |(i, _)| i);
    let end = &text[start..];
    match end.find(' ') {
        Some(space) if space < end.len() / 2 => &end[space + 1..],
        _ => end,
    }
}

/// A sentence for a person (a message the model was told): whole when short, else
/// folded showing its start and its end — a guard's message names the call first
/// (arguments and all) and says what it means last — with all of it wrapped as prose
/// when opened.
pub fn folded_prose(key: &str, text: &str) -> Markup {
    if text.chars().count() <= SHORT * 2 {
        return html! { span.said { (text) } };
    }
    html! {
        details data-key=(key) {
            summary { (head(text)) " … " (tail(text)) }
            p.said { (text) }
        }
    }
}

/// A JSON value folded as [`folded`] does, pretty-printed when unfolded.
pub fn folded_json(key: &str, value: &serde_json::Value) -> Markup {
    let compact = value.to_string();
    if compact.chars().count() <= SHORT {
        return html! { code { (compact) } };
    }
    let pretty = serde_json::to_string_pretty(value).unwrap_or(compact.clone());
    let head: String = compact.chars().take(SHORT).collect();
    html! {
        details data-key=(key) {
            summary { code { (head) "…" } " " span.muted { "(" (compact.chars().count()) " chars)" } }
            pre { (pretty) }
        }
    }
}

fn utc(ts_ms: u64) -> Option<chrono::DateTime<chrono::Utc>> {
    i64::try_from(ts_ms)
        .ok()
        .and_then(chrono::DateTime::from_timestamp_millis)
}

/// An event time (`ts_ms`, the producer's clock) in UTC, to the second, zone named; the
/// tooltip has it to the millisecond.
pub fn time(ts_ms: u64) -> Markup {
    match utc(ts_ms) {
        Some(t) => {
            html! { time datetime=(iso(t)) title=(iso(t)) { (t.format("%Y-%m-%d %H:%M:%S UTC")) } }
        }
        None => html! { (ts_ms) },
    }
}

/// A time on a run's timeline: to the millisecond, in UTC (the column says so), with
/// the date in the tooltip.
pub fn clock(ts_ms: u64) -> Markup {
    match utc(ts_ms) {
        Some(t) => html! { time datetime=(iso(t)) title=(iso(t)) { (t.format("%H:%M:%S%.3f")) } },
        None => html! { (ts_ms) },
    }
}

fn iso(t: chrono::DateTime<chrono::Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
}

/// A duration a person reads: `850 ms`, `1.204 s`, `2 min 03 s`, `1 h 02 min`.
pub fn duration(ms: u64) -> String {
    match ms {
        0..1000 => format!("{ms} ms"),
        1000..60_000 => format!("{}.{:03} s", ms / 1000, ms % 1000),
        60_000..3_600_000 => format!("{} min {:02} s", ms / 60_000, ms / 1000 % 60),
        _ => format!("{} h {:02} min", ms / 3_600_000, ms / 60_000 % 60),
    }
}

/// A count with thousands separated: `2,005`.
pub fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

pub fn state(state: &str) -> Markup {
    html! { span class={"state s-" (state)} { (state) } }
}

/// The error page for a status (404 unknown run, 400 bad input, 502 daemon trouble).
pub fn problem(title: &str, message: &str) -> Markup {
    page(
        title,
        html! {
            h1 { (title) }
            p.answer.refused role="alert" { (message) }
            p { a href="/" { "All runs" } }
        },
    )
}

/// No script runs but the page's own (by its hash), no resource loads from elsewhere,
/// forms post only here: even markup that escaped escaping could do nothing.
pub fn content_security_policy() -> axum::http::HeaderValue {
    use base64::Engine as _;
    use sha2::Digest as _;
    let hash = base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(LIVE_SCRIPT));
    let policy = format!(
        "default-src 'none'; style-src 'unsafe-inline'; script-src 'sha256-{hash}'; connect-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    );
    axum::http::HeaderValue::from_str(&policy).expect("the policy is ASCII")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fold_shows_whole_words() {
        let sentence = "run stopped (STOPPED_LOOP_GUARD): refused calls kept being retried; do not call more tools; report what you have to the user.";
        assert_eq!(
            head(sentence),
            "run stopped (STOPPED_LOOP_GUARD): refused calls kept being retried; do not call"
        );
        let word = "x".repeat(300);
        assert_eq!(head(&word).len(), SHORT, "no space: cut where it must be");
        assert_eq!(head("short\nsecond line"), "short");
        let told = format!("search({{\"notes\":\"{}\"}}) already ran 3 times with the same result and no progress; one more identical call will be blocked", "x".repeat(300));
        assert_eq!(
            tail(&told),
            "with the same result and no progress; one more identical call will be blocked"
        );
    }

    #[test]
    fn durations_and_counts_read_as_a_person_says_them() {
        for (ms, text) in [
            (0, "0 ms"),
            (850, "850 ms"),
            (1_204, "1.204 s"),
            (123_000, "2 min 03 s"),
            (3_720_000, "1 h 02 min"),
        ] {
            assert_eq!(duration(ms), text);
        }
        for (n, text) in [
            (0, "0"),
            (999, "999"),
            (2_005, "2,005"),
            (1_000_000, "1,000,000"),
        ] {
            assert_eq!(count(n), text);
        }
    }
}
