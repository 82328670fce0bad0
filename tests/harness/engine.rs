//! What the engine decides offline, with the daemon's policies: the expected side of
//! every end-to-end comparison; and the events the suites send.

use std::path::Path;

use fusebox_core::{parse_event, Decision, Engine, Event, PolicySet};

use crate::paths::repo_dir;

/// The policies the daemon runs with, for computing expected decisions offline.
pub fn offline_engine(config: &Path) -> Engine {
    let doc: toml::Table = toml::from_str(&std::fs::read_to_string(config).unwrap()).unwrap();
    let json = serde_json::to_value(doc).unwrap();
    let (policies, _) = PolicySet::from_config_document(&json, None).unwrap();
    Engine::new(policies)
}

pub fn fixture(name: &str) -> Vec<Event> {
    let path = repo_dir()
        .join("crates/fusebox-core/tests/fixtures")
        .join(name);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|err| panic!("{}: {err}", path.display()))
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| parse_event(line.as_bytes()).unwrap())
        .collect()
}

pub const FIXTURES: [&str; 6] = [
    "exact-repeat.jsonl",
    "ping-pong.jsonl",
    "no-progress.jsonl",
    "duplicate-side-effect.jsonl",
    "permission-denied.jsonl",
    "pagination-ok.jsonl",
];

/// What the engine decides for `events`, in this order, with the daemon's policies.
pub fn expected(config: &Path, events: &[Event]) -> Vec<Decision> {
    let mut engine = offline_engine(config);
    events.iter().map(|e| engine.apply(e)).collect()
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Parses a JSON literal into an event.
pub fn event(json: serde_json::Value) -> Event {
    parse_event(json.to_string().as_bytes()).unwrap()
}
