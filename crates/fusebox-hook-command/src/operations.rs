//! `--op-key TOOL=ARG` and `--max-stored-result-bytes`: which of the agent's tool calls
//! name a business operation, and how much of such a call's result goes to fuseboxd for
//! its ledger — the MCP gateway's `op_key_arg` and `max_stored_result_bytes`, as flags
//! (and environment variables) like the hook's other settings.

use fusebox_core::event::DEFAULT_MAX_STORED_RESULT_BYTES;
use fusebox_hook::Operations;

#[derive(clap::Args, Clone, Debug)]
pub struct OperationArgs {
    /// A tool whose calls are business operations, and the argument naming each one:
    /// op_key `<TOOL>:<value>`, so a second call with that value (in any session of the
    /// tenant) gets the first one's result instead of running
    /// (e.g. `--op-key mcp__shop__place_order=order_id`). Repeat it, or comma-separate.
    #[arg(long = "op-key", env = "FUSEBOX_OP_KEYS", value_name = "TOOL=ARG",
          value_delimiter = ',', value_parser = parse_op_key_arg)]
    pub op_keys: Vec<(String, String)>,
    /// Up to this many bytes of JSON, the result of an --op-key call goes to fuseboxd
    /// whole, and a repeat gets it; past it only its hash, and a repeat is told the
    /// operation completed and where. Keep it below fuseboxd's max_event_bytes and the
    /// NATS server's max_payload (1 MiB by default) minus the event's envelope.
    #[arg(long, env = "FUSEBOX_MAX_STORED_RESULT_BYTES", value_name = "BYTES",
          default_value_t = DEFAULT_MAX_STORED_RESULT_BYTES)]
    pub max_stored_result_bytes: usize,
}

fn parse_op_key_arg(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((tool, arg)) if !tool.is_empty() && !arg.is_empty() => {
            Ok((tool.to_owned(), arg.to_owned()))
        }
        _ => Err(format!(
            "{text:?}: expected TOOL=ARG, the tool and the argument naming its operation"
        )),
    }
}

impl OperationArgs {
    pub fn operations(&self) -> Operations {
        Operations {
            op_key_args: self.op_keys.iter().cloned().collect(),
            max_stored_result_bytes: self.max_stored_result_bytes,
        }
    }

    /// The flags that reproduce these settings where they differ from the defaults.
    pub fn flags(&self) -> Vec<String> {
        let mut flags = Vec::new();
        for (tool, arg) in &self.op_keys {
            flags.extend(["--op-key".to_owned(), format!("{tool}={arg}")]);
        }
        if self.max_stored_result_bytes != DEFAULT_MAX_STORED_RESULT_BYTES {
            flags.extend([
                "--max-stored-result-bytes".to_owned(),
                self.max_stored_result_bytes.to_string(),
            ]);
        }
        flags
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        operations: OperationArgs,
    }

    fn parsed(args: &[&str]) -> Result<OperationArgs, String> {
        Cli::try_parse_from(std::iter::once("hook").chain(args.iter().copied()))
            .map(|cli| cli.operations)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn op_keys_and_the_bound_parse_and_print_back() {
        let args = parsed(&[
            "--op-key",
            "mcp__shop__place_order=order_id",
            "--op-key",
            "Write=file_path,Edit=file_path",
            "--max-stored-result-bytes",
            "65536",
        ])
        .unwrap();
        let operations = args.operations();
        assert_eq!(operations.max_stored_result_bytes, 65536);
        assert_eq!(
            operations.op_key_args.get("Edit").map(String::as_str),
            Some("file_path")
        );
        assert_eq!(operations.op_key_args.len(), 3);
        let again = parsed(&args.flags().iter().map(String::as_str).collect::<Vec<_>>()).unwrap();
        assert_eq!(again.operations(), operations);
    }

    #[test]
    fn the_defaults_print_nothing_and_a_bad_pair_is_refused() {
        let args = parsed(&[]).unwrap();
        assert_eq!(args.operations(), Operations::default());
        assert!(args.flags().is_empty());
        for bad in ["Write", "=file_path", "Write="] {
            let err = parsed(&["--op-key", bad]).unwrap_err();
            assert!(err.contains("expected TOOL=ARG"), "{bad}: {err}");
        }
    }
}
