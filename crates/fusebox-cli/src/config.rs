//! The guard part of a `fusebox.toml`: preset, `[policy]`, `[agents.*.policy]`, and the
//! event size bound. The daemon reads the same tables from the same file.

use std::path::Path;

use fusebox_core::parse::DEFAULT_MAX_EVENT_BYTES;
use fusebox_core::{PolicySet, Preset};
use serde_json::Value;

pub struct GuardConfig {
    pub policies: PolicySet,
    pub input: InputRules,
}

/// What a daemon of this config admits besides a valid event, applied by the offline
/// readers (`replay`, `whatif`, `tune`) as fuseboxd applies it on the wire.
#[derive(Debug, Clone)]
pub struct InputRules {
    pub max_event_bytes: usize,
    /// The clouds whose `instance_launched` is accepted: the watchdog's drivers, none
    /// when `[watchdog] enabled = false`.
    pub instance_providers: Vec<String>,
}

/// Reads the config file (if any) and layers it over the preset. Raised settings are
/// reported on stderr, once, as the contract asks.
pub fn load(path: Option<&Path>, preset: Option<Preset>) -> Result<GuardConfig, String> {
    let doc = match path {
        Some(path) => {
            let text =
                std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
            toml::from_str::<Value>(&text).map_err(|e| format!("{}: {e}", path.display()))?
        }
        None => Value::Object(Default::default()),
    };
    let (policies, warnings) =
        PolicySet::from_config_document(&doc, preset).map_err(|e| match path {
            Some(path) => format!("{}: {e}", path.display()),
            None => e.to_string(),
        })?;
    for warning in warnings {
        eprintln!("warning: {warning}");
    }
    let max_event_bytes = match doc.pointer("/guard/max_event_bytes") {
        None => DEFAULT_MAX_EVENT_BYTES,
        Some(v) => v
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .filter(|n| *n > 0)
            .ok_or("[guard] max_event_bytes must be a positive integer")?,
    };
    let watchdog_on = match doc.pointer("/watchdog/enabled") {
        None => true,
        Some(v) => v
            .as_bool()
            .ok_or("[watchdog] enabled must be true or false")?,
    };
    let instance_providers = if watchdog_on {
        fusebox_nats::WATCHDOG_DRIVERS
            .iter()
            .map(|d| (*d).to_owned())
            .collect()
    } else {
        Vec::new()
    };
    Ok(GuardConfig {
        policies,
        input: InputRules {
            max_event_bytes,
            instance_providers,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo(rel: &str) -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .join(rel)
    }

    /// Each file that documents built-in values, layered over a preset whose values all
    /// differ, must give exactly the built-in policy: a default changed in the code but
    /// not in its documentation (or the other way round) fails here.
    #[test]
    fn the_shipped_files_document_the_built_in_values() {
        let cases = [
            ("config/fusebox.toml", Preset::Strict, Preset::Balanced),
            (
                "config/presets/strict.toml",
                Preset::Balanced,
                Preset::Strict,
            ),
            (
                "config/presets/lenient.toml",
                Preset::Balanced,
                Preset::Lenient,
            ),
        ];
        for (file, over, want) in cases {
            let config = load(Some(&repo(file)), Some(over)).unwrap();
            assert_eq!(
                **config.policies.base(),
                want.policy(),
                "{file} layered over {} is not {}",
                over.name(),
                want.name()
            );
        }
    }

    /// `config/agents/<agent>.toml` shows exactly the profile fusebox-core builds in.
    #[test]
    fn the_agent_files_show_the_built_in_profiles() {
        let profiles = fusebox_core::agents::profiles();
        for (agent, profile) in &profiles {
            let file = repo(&format!("config/agents/{agent}.toml"));
            let text = std::fs::read_to_string(&file).unwrap();
            let doc: Value = toml::from_str(&text).unwrap();
            let shown = doc
                .pointer(&format!("/agents/{agent}/policy"))
                .unwrap_or_else(|| panic!("{} has no [agents.{agent}.policy]", file.display()));
            assert_eq!(
                shown,
                profile,
                "{} is not the built-in profile",
                file.display()
            );
        }
        let files = std::fs::read_dir(repo("config/agents")).unwrap().count();
        assert_eq!(
            files,
            profiles.len(),
            "a file in config/agents/ for each profile, no more"
        );
    }
}
