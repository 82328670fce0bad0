//! `--print-settings` / `--print-config`: the block a user pastes into the agent's
//! settings (Claude Code's and Gemini CLI's settings.json, Codex's config.toml). Each
//! sets the agent's hook timeout well beyond the command's own deadline, so the guard's
//! answer — or the command's deny when the guard is silent — always arrives before the
//! agent gives up on the hook and runs the tool anyway. Each listens to the agent's prompt
//! hook too: a prompt starts the session's next task; and Claude Code's and Codex's to
//! their sub-agents' start and end: each sub-agent is a child run of the session's.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};

use crate::HOOK_BINARY;

/// Claude Code's hook events fusebox listens to, and whether they take a tool matcher
/// (SubagentStart/SubagentStop would match agent types: none, every sub-agent).
const EVENTS: [(&str, bool); 9] = [
    ("SessionStart", false),
    ("UserPromptSubmit", false),
    ("PreToolUse", true),
    ("PostToolUse", true),
    ("PostToolUseFailure", true),
    ("PreCompact", false),
    ("SubagentStart", false),
    ("SubagentStop", false),
    ("SessionEnd", false),
];

/// The HTTP hooks that keep Claude Code's default `onFailure` (go on): a prompt (an
/// endpoint that is down must not block the user; the calls after it are blocked), and
/// a sub-agent's start and end (a blocked SubagentStop would make the sub-agent go on; a
/// start cannot be blocked, and the sub-agent's calls are).
const HTTP_GOES_ON: [&str; 3] = ["UserPromptSubmit", "SubagentStart", "SubagentStop"];

/// The lean hook binary with `args`, as one shell command line (Claude Code runs hook
/// commands through a shell). The absolute path keeps the hook working whatever PATH
/// the agent has.
pub fn command_line(args: &[String]) -> Result<String, String> {
    Ok(command_args(args)?
        .iter()
        .map(|arg| shell_quote(arg))
        .collect::<Vec<_>>()
        .join(" "))
}

/// The hook binary and `args` as an argv, for a caller that runs it without a shell
/// (the OpenCode plugin).
pub fn command_args(args: &[String]) -> Result<Vec<String>, String> {
    let exe = hook_binary()?;
    Ok(std::iter::once(exe.to_string_lossy().into_owned())
        .chain(args.iter().cloned())
        .collect())
}

/// `fusebox-hook`: this binary if it is that one, else the one installed beside it.
/// `fusebox hook … --print-settings` prints the lean binary too: the agent starts a hook
/// process for every tool call, so its start-up is on every call's path.
fn hook_binary() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?;
    if exe.file_name().is_some_and(|name| name == HOOK_BINARY) {
        return Ok(exe);
    }
    let beside = exe.with_file_name(HOOK_BINARY);
    if beside.is_file() {
        Ok(beside)
    } else {
        Err(format!(
            "{} is not installed beside {}: the printed hooks run it (install it with fusebox)",
            beside.display(),
            exe.display()
        ))
    }
}

fn shell_quote(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./:=@,+".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// How long the agent waits for the hook: the command's deadline and 5 s more.
fn agent_timeout(deadline: Duration) -> Duration {
    deadline + Duration::from_secs(5)
}

/// Claude Code's settings block (timeouts in whole seconds).
pub fn claude_code(command: &str, deadline: Duration) -> String {
    let timeout_s = agent_timeout(deadline).as_secs();
    hooks_block(
        &EVENTS,
        "*",
        |_| json!({"type": "command", "command": command, "timeout": timeout_s}),
    )
}

/// A `{"hooks": {<event>: [{"matcher"?, "hooks": [<hook>]}]}}` settings block (Claude
/// Code's and Gemini CLI's shape): one hook per event, `matcher` on the events that
/// take a tool matcher.
fn hooks_block(events: &[(&str, bool)], matcher: &str, hook: impl Fn(&str) -> Value) -> String {
    let hooks: serde_json::Map<String, Value> = events
        .iter()
        .map(|&(event, matched)| {
            let entry = if matched {
                json!({"matcher": matcher, "hooks": [hook(event)]})
            } else {
                json!({"hooks": [hook(event)]})
            };
            (event.to_owned(), json!([entry]))
        })
        .collect();
    serde_json::to_string_pretty(&json!({ "hooks": hooks })).expect("JSON values serialise")
}

/// Claude Code's settings block for `fusebox hook serve`: HTTP hooks, each with
/// `onFailure: "block"` (the default, `continue`, runs the tool when the request fails,
/// is refused or times out), and the bearer token from `token_env` if given. SessionStart
/// stays the `command` hook: Claude Code (2.1.327) does not send it to an HTTP hook, and
/// it runs once per session (it does send SubagentStart and SubagentStop). The hooks of
/// [`HTTP_GOES_ON`] keep the default.
pub fn claude_code_http(
    url: &str,
    token_env: Option<&str>,
    command: &str,
    deadline: Duration,
) -> Result<String, String> {
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(format!("--http {url}: not an http:// or https:// URL"));
    }
    if let Some(var) = token_env {
        let valid = !var.is_empty()
            && var.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !var.starts_with(|c: char| c.is_ascii_digit());
        if !valid {
            return Err(format!(
                "--token-env {var}: not an environment variable name"
            ));
        }
    }
    let timeout_s = agent_timeout(deadline).as_secs();
    Ok(hooks_block(&EVENTS, "*", |event| {
        if event == "SessionStart" {
            return json!({"type": "command", "command": command, "timeout": timeout_s});
        }
        let mut hook = json!({"type": "http", "url": url, "timeout": timeout_s});
        if !HTTP_GOES_ON.contains(&event) {
            hook["onFailure"] = json!("block");
        }
        if let Some(var) = token_env {
            hook["headers"] = json!({"Authorization": format!("Bearer ${var}")});
            hook["allowedEnvVars"] = json!([var]);
        }
        hook
    }))
}

/// Codex's hook events fusebox listens to. Not Stop (the end of every turn), not
/// PostCompact (PreCompact already counts the compaction).
const CODEX_EVENTS: [&str; 8] = [
    "SessionStart",
    "UserPromptSubmit",
    "PreToolUse",
    "PostToolUse",
    "PreCompact",
    "SubagentStart",
    "SubagentStop",
    "SessionEnd",
];

/// Codex clamps a SessionEnd hook's timeout to this (and says so on every start).
const CODEX_SESSION_END_LIMIT_S: u64 = 3;

/// Codex's config.toml block (timeouts in whole seconds), as TOML.
pub fn codex(command: &str, deadline: Duration) -> String {
    let timeout_s = agent_timeout(deadline).as_secs();
    let mut events = toml::Table::new();
    for event in CODEX_EVENTS {
        let timeout = if event == "SessionEnd" {
            timeout_s.min(CODEX_SESSION_END_LIMIT_S)
        } else {
            timeout_s
        };
        let mut hook = toml::Table::new();
        hook.insert("type".into(), "command".into());
        hook.insert("command".into(), command.into());
        hook.insert("timeout".into(), toml::Value::Integer(timeout as i64));
        let mut entry = toml::Table::new();
        entry.insert("hooks".into(), toml::Value::Array(vec![hook.into()]));
        events.insert(event.into(), toml::Value::Array(vec![entry.into()]));
    }
    let mut doc = toml::Table::new();
    doc.insert("hooks".into(), events.into());
    let body = toml::to_string(&doc).expect("TOML tables serialise");
    format!(
        "# fusebox: the guard before every Codex tool call. Paste into ~/.codex/config.toml\n\
         # (or ship it in a managed layer), then trust the hooks once: Codex skips\n\
         # untrusted hooks without a word.\n{body}"
    )
}

/// Gemini CLI's hook events fusebox listens to, and whether they take a tool matcher.
/// Not PreCompress: Gemini CLI fires it before every model request, compaction or not.
/// BeforeAgent is its prompt hook.
const GEMINI_EVENTS: [(&str, bool); 5] = [
    ("SessionStart", false),
    ("BeforeAgent", false),
    ("BeforeTool", true),
    ("AfterTool", true),
    ("SessionEnd", false),
];

/// Gemini CLI's settings block (timeouts in milliseconds). Lifecycle events take no
/// matcher (with one, 0.61 does not run a SessionStart hook).
pub fn gemini_cli(command: &str, deadline: Duration) -> String {
    let timeout_ms = agent_timeout(deadline).as_millis() as u64;
    hooks_block(&GEMINI_EVENTS, ".*", |_| {
        json!({"name": "fusebox", "type": "command", "command": command,
            "timeout": timeout_ms})
    })
}

/// Copilot CLI's hooks file (`.github/hooks/fusebox.json` in a repository, or the
/// `hooks` of ~/.copilot/settings.json): one command per event, told its event (the
/// payloads do not name it); timeouts in whole seconds.
pub fn copilot_cli(command: &str, deadline: Duration) -> String {
    let timeout_s = agent_timeout(deadline).as_secs();
    let hooks: serde_json::Map<String, Value> = fusebox_hook::copilot_cli::HookEvent::NAMES
        .iter()
        .map(|event| {
            let hook = json!({"type": "command", "bash": format!("{command} --event {event}"),
                "timeoutSec": timeout_s});
            ((*event).to_owned(), json!([hook]))
        })
        .collect();
    serde_json::to_string_pretty(&json!({"version": 1, "hooks": hooks}))
        .expect("JSON values serialise")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_that_need_it_are_quoted() {
        assert_eq!(shell_quote("/usr/bin/fusebox"), "/usr/bin/fusebox");
        assert_eq!(shell_quote("nats://u:p@h:4222"), "nats://u:p@h:4222");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }

    #[test]
    fn the_block_installs_every_event_with_a_timeout_beyond_the_deadline() {
        let block: Value = serde_json::from_str(&claude_code(
            "fusebox hook claude-code",
            Duration::from_secs(3),
        ))
        .unwrap();
        for (event, matcher) in EVENTS {
            let entry = &block["hooks"][event][0];
            assert_eq!(entry["hooks"][0]["command"], "fusebox hook claude-code");
            assert_eq!(entry["hooks"][0]["timeout"], 8);
            assert_eq!(entry.get("matcher").is_some(), matcher, "{event}");
        }
    }

    #[test]
    fn the_codex_block_is_toml_with_every_event_and_session_end_within_its_clamp() {
        let block: toml::Table =
            toml::from_str(&codex("fusebox hook codex", Duration::from_secs(3))).unwrap();
        for event in CODEX_EVENTS {
            let hook = &block["hooks"][event][0]["hooks"][0];
            assert_eq!(hook["type"].as_str(), Some("command"));
            assert_eq!(hook["command"].as_str(), Some("fusebox hook codex"));
            let expected = if event == "SessionEnd" { 3 } else { 8 };
            assert_eq!(hook["timeout"].as_integer(), Some(expected), "{event}");
        }
    }

    #[test]
    fn the_gemini_block_counts_milliseconds_and_matches_only_tools() {
        let block: Value = serde_json::from_str(&gemini_cli(
            "fusebox hook gemini-cli",
            Duration::from_secs(3),
        ))
        .unwrap();
        for (event, matcher) in GEMINI_EVENTS {
            let entry = &block["hooks"][event][0];
            assert_eq!(entry["hooks"][0]["timeout"], 8000, "{event}");
            assert_eq!(entry.get("matcher").is_some(), matcher, "{event}");
        }
        assert!(block["hooks"].get("PreCompress").is_none());
    }

    #[test]
    fn the_http_block_blocks_on_failure_and_carries_the_token() {
        let printed = claude_code_http(
            "http://10.0.0.5:7474/claude-code",
            Some("FUSEBOX_HOOK_TOKEN"),
            "fusebox hook claude-code",
            Duration::from_secs(3),
        )
        .unwrap();
        let block: Value = serde_json::from_str(&printed).unwrap();
        let start = &block["hooks"]["SessionStart"][0]["hooks"][0];
        assert_eq!(start["type"], "command");
        assert_eq!(start["command"], "fusebox hook claude-code");
        for (event, _) in EVENTS.iter().filter(|(e, _)| *e != "SessionStart") {
            let hook = &block["hooks"][event][0]["hooks"][0];
            assert_eq!(hook["type"], "http");
            // A prompt and a sub-agent's start and end go on when the endpoint fails;
            // everything else is blocked.
            let on_failure = (!HTTP_GOES_ON.contains(event)).then_some("block");
            assert_eq!(hook["onFailure"].as_str(), on_failure, "{event}");
            assert_eq!(
                hook["headers"]["Authorization"],
                "Bearer $FUSEBOX_HOOK_TOKEN"
            );
            assert_eq!(hook["allowedEnvVars"], json!(["FUSEBOX_HOOK_TOKEN"]));
        }
        let three = Duration::from_secs(3);
        assert!(claude_code_http("ftp://x", None, "c", three).is_err());
        assert!(claude_code_http("http://x", Some("A B"), "c", three).is_err());
    }
}
