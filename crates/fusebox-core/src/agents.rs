//! What fusebox knows of the coding agents it guards through their hooks: which
//! arguments of their tools describe rather than act (a model-written `description` of
//! a shell command, new words on every call), which values are a tool's own defaults
//! (equal to leaving them out), and which answers of a check on a background task mean
//! "still running". Each profile is a policy layer for the agent name the hooks send in
//! `run_started.agent`, under the config's own `[agents.<name>.policy]`;
//! `config/agents/<name>.toml` shows each one (a test keeps the two equal).
//!
//! Read from the real binaries the test suites run — Claude Code 2.1.327, Codex CLI
//! 0.171.0, Gemini CLI 0.61.0, OpenCode 1.18.33, Copilot CLI 1.0.102 — as their hooks see
//! the calls (the tool names and `tool_input` of PreToolUse / BeforeTool, the `args` of
//! OpenCode's `tool.execute.before`, the `toolArgs` of Copilot CLI's preToolUse, and the
//! tool schemas they send the model), not from their documentation alone.

use std::collections::BTreeMap;

use serde_json::{json, Value};

/// The built-in profiles, by agent name.
pub fn profiles() -> BTreeMap<String, Value> {
    BTreeMap::from([
        ("claude-code".to_owned(), claude_code()),
        ("codex".to_owned(), codex()),
        ("gemini-cli".to_owned(), gemini_cli()),
        ("opencode".to_owned(), opencode()),
        ("copilot-cli".to_owned(), copilot_cli()),
    ])
}

fn claude_code() -> Value {
    json!({"tools": {
        // `description` is the model's prose for the user; `timeout` bounds the wait.
        "Bash": {"ignore_args": ["description", "timeout"]},
        // `Task` is the alias the hooks report as `Agent`.
        "Agent": {
            "ignore_args": ["description"],
            "defaults": {"run_in_background": true, "subagent_type": "general-purpose"}
        },
        "Monitor": {"ignore_args": ["description"], "defaults": {"timeout_ms": 300000}},
        // A background task's output is checked by reading its `.output` file: without
        // the `[exited with code N]` trailer the task is still running.
        "Read": {
            "defaults": {"offset": 1, "limit": 2000},
            "running_when": [
                {"field": "file.filePath", "contains": ["/tasks/"], "ends_with": [".output"]},
                {"field": "file.content", "lacks": ["[exited with code"]}
            ]
        },
        "Grep": {"defaults": {
            "output_mode": "files_with_matches", "head_limit": 250, "offset": 0,
            "-n": true, "-o": false, "multiline": false
        }},
        "Edit": {"defaults": {"replace_all": false}},
        "NotebookEdit": {"defaults": {"edit_mode": "replace"}},
        "ToolSearch": {"defaults": {"max_results": 5}},
        "ScheduleWakeup": {"ignore_args": ["reason"]},
        "SendMessage": {"ignore_args": ["summary"]},
        "TaskCreate": {"ignore_args": ["activeForm"]},
        "TaskUpdate": {"ignore_args": ["activeForm"]},
        "Workflow": {"ignore_args": ["description", "title"]},
        // Checks of a background shell in the versions before 2.1 (2.1.327 lists both
        // names among its retired tools; sessions recorded with them still replay).
        "BashOutput": {"running_when": [{"field": "status", "equals": ["running"]}]},
        "TaskOutput": {"running_when": [{"field": "task.status", "equals": ["running"]}]}
    }})
}

fn codex() -> Value {
    // The shell reaches the hooks as `Bash` with `{"command"}` only: nothing to leave
    // out. A sub-agent is checked with `wait_agent`, which says `"timed_out":true` while
    // it runs.
    json!({"tools": {
        "multi_agent_v1wait_agent": {
            "defaults": {"timeout_ms": 30000},
            "running_when": [{"contains": ["\"timed_out\":true"]}]
        },
        "wait_agent": {
            "defaults": {"timeout_ms": 30000},
            "running_when": [{"contains": ["\"timed_out\":true"]}]
        }
    }})
}

fn gemini_cli() -> Value {
    json!({"tools": {
        // `delay_ms` only waits before the first look at a background command.
        "run_shell_command": {"ignore_args": ["description", "delay_ms"]},
        "replace": {"ignore_args": ["instruction"], "defaults": {"allow_multiple": false}},
        "read_file": {"defaults": {"start_line": 1, "end_line": 2000}},
        "grep_search": {"defaults": {"total_max_matches": 100}},
        "glob": {"defaults": {
            "case_sensitive": false, "respect_git_ignore": true, "respect_gemini_ignore": true
        }},
        "read_background_output": {
            "ignore_args": ["delay_ms", "wait_for_previous"],
            "defaults": {"lines": 100}
        },
        "list_background_processes": {
            "ignore_args": ["wait_for_previous"],
            "running_when": [{"field": "llmContent", "contains": ["] RUNNING: "]}]
        },
        "invoke_agent": {"ignore_args": ["wait_for_previous"]},
        "update_topic": {"ignore_args": ["title", "summary", "wait_for_previous"]},
        "enter_plan_mode": {"ignore_args": ["reason"]}
    }})
}

fn opencode() -> Value {
    json!({"tools": {
        // `bash` takes `command`, `timeout` (ms, optional) and `workdir`: the timeout
        // bounds the wait and does not change what runs.
        "bash": {"ignore_args": ["timeout"]}
    }})
}

fn copilot_cli() -> Value {
    json!({"tools": {
        // `description` (required) is the model's prose for the user; `initial_wait`
        // only bounds how long a sync command is waited for; `mode` is `sync` unless
        // said.
        "bash": {"ignore_args": ["description", "initial_wait"], "defaults": {"mode": "sync"}}
    }})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Policy, Preset};

    #[test]
    fn every_profile_layers_over_every_preset_without_raising_anything() {
        for preset in Preset::ALL {
            for (agent, profile) in profiles() {
                let (_, raised) = preset
                    .policy()
                    .layered(&profile, &agent)
                    .unwrap_or_else(|e| panic!("{agent} over {}: {e}", preset.name()));
                assert!(raised.is_empty(), "{agent}: {raised:?}");
            }
        }
    }

    #[test]
    fn the_hooks_agent_names_select_their_profile() {
        let set = crate::PolicySet::default();
        let bash = set
            .for_agent(Some("claude-code"))
            .tool("Bash")
            .expect("Claude Code's Bash is known");
        assert!(bash.ignore_args.contains(&"description".to_owned()));
        assert_eq!(**set.for_agent(Some("some-framework")), Policy::default());
    }
}
