//! The protocols of coding-agent hooks (programs the agent runs around each tool call),
//! as pure functions: no I/O, no clock. `fusebox hook <agent>` (fusebox-cli) is the
//! process around them: it reads the payload, asks the daemon, and prints the answer;
//! this crate only translates, so the fuzz targets and fixtures exercise exactly what
//! the hook sends and answers. The decision is never made here.

pub mod claude_code;
pub mod codex;
mod common;
pub use common::{with_result_hashed, Operations};
pub mod gemini_cli;
#[cfg(test)]
mod operations_tests;
#[cfg(test)]
mod prompt_tests;
