//! The page frame and the small pieces every page uses. Everything from the daemon goes
//! through maud's `(…)` splices, which escape it: a tool argument `<script>` is text.

use maud::{html, Markup, PreEscaped, DOCTYPE};

/// Styles: readable on a phone (the tables scroll sideways inside their box), visible
/// keyboard focus, no external resources.
const STYLE: &str = r#"
:root{color-scheme:light dark;--muted:#777;--line:#8884;--ok:#2a7;--bad:#d33;--warn:#c80}
body{font:14px/1.45 system-ui,sans-serif;margin:0 auto;max-width:1400px;padding:0 12px 40px}
header{display:flex;flex-wrap:wrap;gap:12px;align-items:baseline;border-bottom:1px solid var(--line);padding:10px 0}
header a.home{font-weight:700;text-decoration:none}
h1{font-size:20px;margin:14px 0 6px;word-break:break-all}
h2{font-size:16px;margin:22px 0 6px}
a:focus-visible,button:focus-visible,input:focus-visible,select:focus-visible,textarea:focus-visible,summary:focus-visible{outline:3px solid #39f;outline-offset:2px}
.scroll{overflow-x:auto;border:1px solid var(--line);border-radius:6px}
table{border-collapse:collapse;width:100%}
th,td{text-align:left;padding:5px 8px;border-bottom:1px solid var(--line);vertical-align:top}
th{font-weight:600;white-space:nowrap}
td.n{text-align:right;font-variant-numeric:tabular-nums}
code,pre{font:12px/1.4 ui-monospace,monospace}
pre{white-space:pre-wrap;word-break:break-all;margin:4px 0;max-height:60vh;overflow:auto}
details summary{cursor:pointer}
.state{font-weight:600;white-space:nowrap}
.s-OPEN{color:var(--ok)}.s-COMPLETED{color:var(--muted)}
.s-STOPPED_LOOP_GUARD,.s-FAILED,.s-NEEDS_HUMAN,.s-CANCELLED{color:var(--bad)}
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
"#;

/// Swaps the `[data-live]` element's contents with what the page's SSE stream sends
/// (HTML the server rendered and escaped), and says whether the stream is up.
const LIVE_SCRIPT: &str = r#"
(function(){
  var box=document.querySelector('[data-live]');var note=document.getElementById('live');
  if(!box||!window.EventSource){if(note)note.textContent='';return;}
  var source=new EventSource(box.getAttribute('data-live'));
  source.addEventListener('update',function(e){box.innerHTML=e.data;});
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

/// A text shown whole when short, folded (first line shown, all of it one click away)
/// when long: nothing is dropped.
pub fn folded(text: &str) -> Markup {
    const SHORT: usize = 80;
    if text.chars().count() <= SHORT && !text.contains('\n') {
        return html! { code { (text) } };
    }
    let head: String = text
        .chars()
        .take(SHORT)
        .take_while(|c| *c != '\n')
        .collect();
    html! {
        details {
            summary { code { (head) "…" } " " span.muted { "(" (text.chars().count()) " chars)" } }
            pre { (text) }
        }
    }
}

/// A JSON value folded as [`folded`] does, pretty-printed when unfolded.
pub fn folded_json(value: &serde_json::Value) -> Markup {
    let compact = value.to_string();
    if compact.chars().count() <= 80 {
        return html! { code { (compact) } };
    }
    let pretty = serde_json::to_string_pretty(value).unwrap_or(compact.clone());
    let head: String = compact.chars().take(80).collect();
    html! {
        details {
            summary { code { (head) "…" } " " span.muted { "(" (compact.chars().count()) " chars)" } }
            pre { (pretty) }
        }
    }
}

/// An event time (`ts_ms`, the producer's clock) in UTC.
pub fn time(ts_ms: u64) -> Markup {
    let text = i64::try_from(ts_ms)
        .ok()
        .and_then(chrono::DateTime::from_timestamp_millis)
        .map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string())
        .unwrap_or_else(|| ts_ms.to_string());
    html! { time title=(ts_ms) { (text) } }
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
