//! `--print-settings`: the block a user pastes into Claude Code's settings.json.

use std::time::Duration;

use serde_json::{json, Value};

/// The hook events fusebox listens to, and whether they take a tool matcher.
const EVENTS: [(&str, bool); 6] = [
    ("SessionStart", false),
    ("PreToolUse", true),
    ("PostToolUse", true),
    ("PostToolUseFailure", true),
    ("PreCompact", false),
    ("SessionEnd", false),
];

/// This very binary with `args`, as one shell command line (Claude Code runs hook
/// commands through a shell). The absolute path keeps the hook working whatever PATH
/// the agent has.
pub fn command_line(args: &[String]) -> Result<String, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?;
    let exe = exe.to_string_lossy().into_owned();
    Ok(std::iter::once(exe.as_str())
        .chain(args.iter().map(String::as_str))
        .map(shell_quote)
        .collect::<Vec<_>>()
        .join(" "))
}

fn shell_quote(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./:=@,+".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// The settings block. The hook's timeout (whole seconds, Claude Code's unit) leaves
/// room after our own deadline, so the guard's answer — or our deny when it is silent —
/// always arrives before Claude Code gives up on the hook and runs the tool anyway.
pub fn claude_code(command: &str, deadline: Duration) -> String {
    let timeout_s = deadline.as_secs() + 5;
    let entry = |matcher: bool| {
        let hook = json!({"type": "command", "command": command, "timeout": timeout_s});
        if matcher {
            json!({"matcher": "*", "hooks": [hook]})
        } else {
            json!({"hooks": [hook]})
        }
    };
    let hooks: serde_json::Map<String, Value> = EVENTS
        .iter()
        .map(|(event, matcher)| ((*event).to_owned(), json!([entry(*matcher)])))
        .collect();
    serde_json::to_string_pretty(&json!({ "hooks": hooks })).expect("JSON values serialise")
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
}
