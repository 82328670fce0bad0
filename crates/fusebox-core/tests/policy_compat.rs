//! Policies written before the issue-20 settings existed (the log's policy records, old
//! snapshots' policy tables) still read, with the built-in defaults for what they lack.

use fusebox_core::{Policy, PolicySet};
use serde_json::Value;

fn without_issue_20_keys(mut policy: Value) -> Value {
    let map = policy.as_object_mut().unwrap();
    for key in ["max_compactions", "volatile_text", "compaction_thrash"] {
        assert!(map.remove(key).is_some(), "{key} is a policy key");
    }
    map["post_compaction"]
        .as_object_mut()
        .unwrap()
        .remove("repeat_limit")
        .expect("post_compaction.repeat_limit is a key");
    policy
}

#[test]
fn an_older_policy_record_reads_with_the_defaults() {
    let old = without_issue_20_keys(serde_json::to_value(Policy::default()).unwrap());
    let policy: Policy = serde_json::from_value(old).expect("an older policy reads");
    assert_eq!(policy, Policy::default());

    let set = serde_json::to_value(PolicySet::default()).unwrap();
    let mut old_set = set.clone();
    old_set["base"] = without_issue_20_keys(set["base"].clone());
    let read: PolicySet = serde_json::from_value(old_set).expect("an older policy set reads");
    assert_eq!(read, PolicySet::default());
}
