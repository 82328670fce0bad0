//! Config loading with policy layering and normalisation, the path `fuseboxd` and the
//! CLI take: TOML text → document → preset < `[policy]` < `[agents.*.policy]`. Every
//! policy that comes out is normalised (normalising again changes nothing), layering
//! an empty patch or its own serialised form over it is the identity, and a run's
//! overrides layered on it are normalised too.
#![no_main]

use fusebox_core::policy::Policy;
use fusebox_core::PolicySet;
use libfuzzer_sys::fuzz_target;
use serde_json::{json, Value};

fn check(policy: &Policy) {
    let mut again = policy.clone();
    assert_eq!(
        again.normalize(),
        Vec::<String>::new(),
        "not normalised: {policy:?}"
    );
    assert_eq!(&again, policy);
    let (same, warnings) = policy.layered(&json!({}), "fuzz").expect("empty patch");
    assert!(warnings.is_empty());
    assert_eq!(&same, policy);
    let own = serde_json::to_value(policy).expect("a policy serialises");
    let (same, warnings) = Policy::default().layered(&own, "fuzz").expect("own form");
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(&same, policy);
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(doc) = toml::from_str::<Value>(text) else {
        return;
    };
    let Ok((set, _)) = PolicySet::from_config_document(&doc, None) else {
        return;
    };
    check(set.base());
    let mut agents = vec![None];
    if let Some(Value::Object(table)) = doc.get("agents") {
        agents.extend(table.keys().map(|name| Some(name.as_str())));
    }
    for agent in agents {
        let policy = set.for_agent(agent);
        check(policy);
        // The [run] table, if any, stands for a run's own overrides.
        if let Some(patch) = doc.get("run") {
            if let Ok((layered, _)) = policy.layered(patch, "run") {
                check(&layered);
            }
        }
    }
});
