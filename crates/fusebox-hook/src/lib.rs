//! The protocols of coding-agent hooks (programs the agent runs around each tool call),
//! as pure functions: no I/O, no clock. `fusebox hook <agent>` (fusebox-cli) is the
//! process around them: it reads the payload, asks the daemon, and prints the answer;
//! this crate only translates, so the fuzz targets and fixtures exercise exactly what
//! the hook sends and answers. The decision is never made here.
//!
//! A sub-agent of Claude Code or Codex is a run of its own, a child of its session's run
//! (its hooks carry its `agent_id`): [`sub_agent_run`] names it, [`sub_agent_started`] and
//! [`sub_agent_finished`] open and close it. Which run a sub-agent is in now is state
//! the caller keeps (a sub-agent continued after it ended goes on in a run of its own).

pub mod claude_code;
pub mod codex;
mod common;
pub mod copilot_cli;
pub use common::{
    message_of, run_id, sub_agent_finished, sub_agent_run, sub_agent_started, with_result_hashed,
    Operations,
};
pub mod gemini_cli;
pub mod opencode;
#[cfg(test)]
mod operations_tests;
#[cfg(test)]
mod prompt_tests;
pub mod protocol;
#[cfg(test)]
mod sub_agent_tests;
