//! The gateway's own configuration (`--config FILE`, TOML): per tool, where its op_key
//! comes from and, when the tool's annotations are wrong or missing, its effect.
//!
//! ```toml
//! # what a failing tool (isError) is reported as: RETRYABLE (default) or PRECONDITION
//! error_kind = "RETRYABLE"
//! # the result of a call with an op_key goes to fuseboxd whole up to this many bytes of
//! # JSON, so the ledger can answer a repeat with it; past it only its hash (and the
//! # repeat is told the operation completed and where). Keep it below fuseboxd's
//! # [guard] max_event_bytes (1 MiB) and the NATS server's max_payload (1 MiB by default,
//! # 2 MB in deploy/nats) minus the event's envelope; other results go as their hash
//! # above 32 KiB, as ever.
//! max_stored_result_bytes = 524288
//!
//! [tools.write_file]
//! op_key_arg = "path"   # op_key = "write_file:<path>": one write per path, ever
//! effect = "write"      # overrides the tool's annotations
//! ```

use std::collections::BTreeMap;
use std::path::Path;

use fusebox_core::event::{Effect, ResultKind};
use serde::Deserialize;

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolConfig {
    /// The argument whose value names the call's business operation.
    pub op_key_arg: Option<String>,
    /// `read` or `write`, whatever the tool's annotations say.
    pub effect: Option<Effect>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewayConfig {
    #[serde(default = "default_error_kind", deserialize_with = "error_kind")]
    pub error_kind: ResultKind,
    #[serde(default)]
    pub tools: BTreeMap<String, ToolConfig>,
    /// Up to this many bytes of JSON, the result of a call with an op_key is sent whole
    /// (and stored in the ledger for a repeat); see the module docs.
    #[serde(default = "default_max_stored_result_bytes")]
    pub max_stored_result_bytes: usize,
}

use fusebox_core::event::DEFAULT_MAX_STORED_RESULT_BYTES;

fn default_max_stored_result_bytes() -> usize {
    DEFAULT_MAX_STORED_RESULT_BYTES
}

impl Default for GatewayConfig {
    fn default() -> Self {
        GatewayConfig {
            error_kind: default_error_kind(),
            tools: BTreeMap::new(),
            max_stored_result_bytes: DEFAULT_MAX_STORED_RESULT_BYTES,
        }
    }
}

fn default_error_kind() -> ResultKind {
    ResultKind::Retryable
}

fn error_kind<'de, D: serde::Deserializer<'de>>(d: D) -> Result<ResultKind, D::Error> {
    let text = String::deserialize(d)?;
    match ResultKind::parse(&text) {
        Some(kind @ (ResultKind::Retryable | ResultKind::Precondition | ResultKind::Fatal)) => {
            Ok(kind)
        }
        _ => Err(serde::de::Error::custom(format!(
            "error_kind must be RETRYABLE, PRECONDITION or FATAL, got {text:?}"
        ))),
    }
}

impl GatewayConfig {
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// `--op-key TOOL=ARG` flags, over the file's settings.
    pub fn add_op_key_flag(&mut self, flag: &str) -> Result<(), String> {
        let (tool, arg) = flag
            .split_once('=')
            .filter(|(t, a)| !t.is_empty() && !a.is_empty())
            .ok_or_else(|| format!("--op-key {flag:?}: expected TOOL=ARGUMENT"))?;
        self.tools.entry(tool.to_owned()).or_default().op_key_arg = Some(arg.to_owned());
        Ok(())
    }

    pub fn tool(&self, name: &str) -> Option<&ToolConfig> {
        self.tools.get(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_example() {
        let config: GatewayConfig = toml::from_str(
            "error_kind = \"PRECONDITION\"\n[tools.write_file]\nop_key_arg = \"path\"\neffect = \"write\"\n",
        )
        .unwrap();
        assert_eq!(config.error_kind, ResultKind::Precondition);
        let tool = config.tool("write_file").unwrap();
        assert_eq!(tool.op_key_arg.as_deref(), Some("path"));
        assert_eq!(tool.effect, Some(Effect::Write));
    }

    #[test]
    fn rejects_what_it_does_not_know() {
        assert!(toml::from_str::<GatewayConfig>("error_kind = \"SUCCESS\"").is_err());
        assert!(toml::from_str::<GatewayConfig>("[tools.x]\nop_key = \"p\"").is_err());
        assert!(toml::from_str::<GatewayConfig>("[tools.x]\neffect = \"delete\"").is_err());
    }

    #[test]
    fn op_key_flags_add_to_the_file() {
        let mut config = GatewayConfig::default();
        config.add_op_key_flag("send_email=message_id").unwrap();
        assert_eq!(
            config.tool("send_email").unwrap().op_key_arg.as_deref(),
            Some("message_id")
        );
        assert!(config.add_op_key_flag("nothing").is_err());
        assert!(config.add_op_key_flag("=x").is_err());
    }
}
