//! What a user pastes runs this lean binary, by its absolute path, with the flags given
//! (and `cargo test --workspace` builds the binary for the suites that run it).

use std::process::Command;

use serde_json::Value;

const HOOK: &str = env!("CARGO_BIN_EXE_fusebox-hook");

fn printed(args: &[&str]) -> String {
    let out = Command::new(HOOK)
        .args(args)
        .output()
        .expect("fusebox-hook runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

/// Every command of a JSON settings block (Claude Code's, Gemini CLI's).
fn commands(block: &str) -> Vec<String> {
    let block: Value = serde_json::from_str(block).expect("the block is JSON");
    let mut found = Vec::new();
    for entries in block["hooks"].as_object().expect("hooks by event").values() {
        for entry in entries.as_array().expect("entries") {
            for hook in entry["hooks"].as_array().expect("hooks") {
                found.push(hook["command"].as_str().expect("a command").to_owned());
            }
        }
    }
    found
}

#[test]
fn the_printed_settings_run_this_binary_with_the_flags_given() {
    for agent in ["claude-code", "gemini-cli"] {
        let block = printed(&[agent, "--print-settings", "--tenant", "acme"]);
        let commands = commands(&block);
        assert!(!commands.is_empty(), "{block}");
        for command in commands {
            assert_eq!(command, format!("{HOOK} {agent} --tenant acme"));
        }
    }
    let config = printed(&["codex", "--print-config", "--timeout", "2s"]);
    let expected = format!("command = \"{HOOK} codex --timeout 2000ms\"");
    assert!(config.contains(&expected), "{config}");
}
