//! The numeric thresholds of a [`Policy`], found generically from its serialised form so
//! a key added to the policy is tuned without a change here, and how to set one (through
//! the policy's own layering, so its normalisation and ordering rules —
//! `warning_threshold < critical_threshold < global_circuit_breaker_threshold`, the
//! floors of pattern limits — apply to every value tried).
//!
//! Every tuned key is one where a lower value is stricter. A numeric key where that is
//! not so goes in [`NOT_THRESHOLDS`], with the reason.

use std::collections::BTreeMap;

use fusebox_core::{Policy, PolicySet, Preset};
use serde_json::{json, Map, Value};

/// Numeric policy keys that are not "lower is stricter" thresholds.
pub const NOT_THRESHOLDS: [&str; 3] = [
    // A window: a longer one sees more, so higher is stricter; normalisation raises it
    // to fit every window-based limit anyway.
    "history_size",
    // The calls after a compaction that are watched: higher is stricter.
    "post_compaction.window_size",
    // The gap that counts as waiting for the user: a longer one counts more of a run's
    // time as active, so higher is stricter.
    "idle_after_s",
];

/// Tables whose numbers are not the run's thresholds (per-tool settings are keyed by
/// tool name, and their defaults are the run's).
const SKIPPED_TABLES: [&str; 1] = ["tools"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// A whole number (steps, tokens, seconds, counts).
    Count,
    /// US dollars, tuned to the cent.
    Usd,
}

/// One tunable key: its dotted path in `[policy]` and its unit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Key {
    pub path: String,
    pub unit: Unit,
}

impl Key {
    /// The key's value in whole units (cents for dollars), rounded up.
    pub fn get(&self, policy: &Policy) -> u64 {
        let value = serde_json::to_value(policy).expect("a policy serialises");
        let number = self
            .path
            .split('.')
            .try_fold(&value, |v, part| v.get(part))
            .and_then(Value::as_f64)
            .unwrap_or(0.0);
        match self.unit {
            Unit::Count => number as u64,
            Unit::Usd => (number * 100.0).ceil() as u64,
        }
    }

    pub fn json(&self, units: u64) -> Value {
        match self.unit {
            Unit::Count => json!(units),
            Unit::Usd => json!(units as f64 / 100.0),
        }
    }

    /// The text of a value in a TOML file.
    pub fn toml(&self, units: u64) -> String {
        match self.unit {
            Unit::Count => units.to_string(),
            Unit::Usd => format!("{}.{:02}", units / 100, units % 100),
        }
    }

    /// A patch setting this key: `{"a": {"b": v}}` for `a.b`.
    pub fn patch(&self, units: u64) -> Value {
        self.path.rsplit('.').fold(self.json(units), |inner, part| {
            let mut map = Map::new();
            map.insert(part.to_owned(), inner);
            Value::Object(map)
        })
    }

    /// `policy` with this key set to `units`, normalised (a value under a floor is
    /// raised to it: read it back with [`Key::get`]).
    pub fn set(&self, policy: &Policy, units: u64) -> Policy {
        policy
            .layered(&self.patch(units), "tune")
            .map(|(policy, _)| policy)
            .expect("a number where the policy has one always layers")
    }
}

/// The tunable keys of `policy`, in the order of its JSON form (by name).
pub fn keys(policy: &Policy) -> Vec<Key> {
    let value = serde_json::to_value(policy).expect("a policy serialises");
    let mut found = Vec::new();
    collect(&value, "", &mut found);
    found.retain(|k| !NOT_THRESHOLDS.contains(&k.path.as_str()));
    found
}

fn collect(value: &Value, prefix: &str, found: &mut Vec<Key>) {
    let Value::Object(map) = value else { return };
    for (name, value) in map {
        let path = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}.{name}")
        };
        match value {
            Value::Number(n) => found.push(Key {
                path,
                unit: if n.is_u64() { Unit::Count } else { Unit::Usd },
            }),
            Value::Object(_) if !SKIPPED_TABLES.contains(&name.as_str()) && prefix.is_empty() => {
                collect(value, &path, found)
            }
            _ => {}
        }
    }
}

/// The policies a guard would load from a config whose `[policy]` is `base` in full and
/// whose `[agents.<name>.policy]` are `agents`: what deploying a proposal gives.
pub fn policy_set(base: &Policy, agents: &BTreeMap<String, Value>) -> PolicySet {
    let base_patch = serde_json::to_value(base).expect("a policy serialises");
    PolicySet::from_layers(Preset::Balanced, Some(&base_patch), agents)
        .map(|(set, _)| set)
        .expect("resolved policies layer over any preset")
}

/// A set's base and, per agent with a policy of its own, the keys where it differs
/// from the base (the patch that layered over the base gives it back).
pub fn split(set: &PolicySet) -> (Policy, BTreeMap<String, Value>) {
    let base = (**set.base()).clone();
    let base_value = serde_json::to_value(&base).expect("a policy serialises");
    let set_value = serde_json::to_value(set).expect("a policy set serialises");
    let mut agents = BTreeMap::new();
    if let Some(Value::Object(by_agent)) = set_value.get("agents") {
        for (name, policy) in by_agent {
            let Value::Object(fields) = policy else {
                continue;
            };
            let patch: Map<String, Value> = fields
                .iter()
                .filter(|(k, v)| base_value.get(k.as_str()) != Some(*v))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            agents.insert(name.clone(), Value::Object(patch));
        }
    }
    (base, agents)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_number_of_the_policy_is_a_key_but_the_windows() {
        let keys = keys(&Policy::default());
        let paths: Vec<&str> = keys.iter().map(|k| k.path.as_str()).collect();
        assert!(paths.contains(&"max_steps"));
        assert!(paths.contains(&"critical_threshold"));
        assert!(!paths.contains(&"history_size"));
        assert!(!paths.contains(&"post_compaction.window_size"));
        let cost = keys.iter().find(|k| k.path == "max_cost_usd").unwrap();
        assert_eq!(cost.unit, Unit::Usd);
    }

    #[test]
    fn setting_a_key_keeps_the_ordering_rules() {
        let policy = Policy::default();
        let critical = Key {
            path: "critical_threshold".to_owned(),
            unit: Unit::Count,
        };
        let set = critical.set(&policy, 1);
        assert_eq!(critical.get(&set), u64::from(policy.warning_threshold) + 1);
        let cost = Key {
            path: "max_cost_usd".to_owned(),
            unit: Unit::Usd,
        };
        assert_eq!(cost.get(&cost.set(&policy, 1234)), 1234);
        assert_eq!(cost.toml(1234), "12.34");
    }

    #[test]
    fn a_split_set_layers_back_to_itself() {
        let doc = json!({"policy": {"max_steps": 40}, "agents": {"coder": {"policy": {"max_steps": 90, "same_call_limit": 4}}}});
        let (set, _) = PolicySet::from_config_document(&doc, None).unwrap();
        let (base, agents) = split(&set);
        assert_eq!(policy_set(&base, &agents), set);
    }
}
