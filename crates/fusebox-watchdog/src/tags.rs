//! The ownership tags: the only way the watchdog knows an instance is its own.

use std::collections::BTreeMap;

use chrono::DateTime;

/// `true` puts the instance under the watchdog.
pub const MANAGED: &str = "fusebox:managed";
/// The tenant of the run that launched the instance.
pub const TENANT: &str = "fusebox:tenant";
/// The run that launched the instance.
pub const RUN: &str = "fusebox:run";
/// Optional absolute deadline, RFC 3339.
pub const DEADLINE: &str = "fusebox:deadline";
/// Optional lifetime in seconds from launch.
pub const MAX_LIFETIME: &str = "fusebox:max-lifetime";
/// `true`: report, never terminate.
pub const PROTECT: &str = "fusebox:protect";

/// What the tags of one instance say, parsed once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OwnershipTags {
    pub managed: bool,
    pub tenant: Option<String>,
    pub run: Option<String>,
    pub deadline_ms: Option<u64>,
    pub max_lifetime_s: Option<u64>,
    pub protect: bool,
    /// Tags that were present but unreadable; they are ignored (the config default still
    /// bounds the instance) and reported so a launcher bug is visible.
    pub problems: Vec<String>,
}

impl OwnershipTags {
    pub fn parse(tags: &BTreeMap<String, String>) -> Self {
        let mut out = OwnershipTags {
            managed: tags.get(MANAGED).is_some_and(|v| is_true(v)),
            tenant: non_empty(tags.get(TENANT)),
            run: non_empty(tags.get(RUN)),
            // Fail safe: any value other than an explicit "false" protects, so a typo
            // such as `True ` or `yes` can never expose an instance to termination.
            protect: tags
                .get(PROTECT)
                .is_some_and(|v| !v.trim().eq_ignore_ascii_case("false")),
            ..Default::default()
        };
        if let Some(raw) = tags.get(DEADLINE) {
            match DateTime::parse_from_rfc3339(raw.trim()) {
                Ok(t) => out.deadline_ms = Some(u64::try_from(t.timestamp_millis()).unwrap_or(0)),
                Err(e) => out
                    .problems
                    .push(format!("{DEADLINE}={raw:?} is not RFC 3339: {e}")),
            }
        }
        if let Some(raw) = tags.get(MAX_LIFETIME) {
            match raw.trim().parse::<u64>() {
                Ok(s) => out.max_lifetime_s = Some(s),
                Err(e) => out.problems.push(format!(
                    "{MAX_LIFETIME}={raw:?} is not a number of seconds: {e}"
                )),
            }
        }
        out
    }
}

fn is_true(v: &str) -> bool {
    v.trim().eq_ignore_ascii_case("true")
}

fn non_empty(v: Option<&String>) -> Option<String> {
    v.map(|s| s.trim().to_owned()).filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tags(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn untagged_is_not_managed() {
        let t = OwnershipTags::parse(&tags(&[("Name", "web")]));
        assert!(!t.managed);
        assert!(!t.protect);
    }

    #[test]
    fn managed_needs_true() {
        assert!(OwnershipTags::parse(&tags(&[(MANAGED, "true")])).managed);
        assert!(OwnershipTags::parse(&tags(&[(MANAGED, "TRUE")])).managed);
        assert!(!OwnershipTags::parse(&tags(&[(MANAGED, "yes")])).managed);
    }

    #[test]
    fn parses_deadline_and_lifetime() {
        let t = OwnershipTags::parse(&tags(&[
            (MANAGED, "true"),
            (TENANT, "acme"),
            (RUN, "r1"),
            (DEADLINE, "1970-01-01T00:00:10Z"),
            (MAX_LIFETIME, "600"),
        ]));
        assert_eq!(t.deadline_ms, Some(10_000));
        assert_eq!(t.max_lifetime_s, Some(600));
        assert_eq!(t.tenant.as_deref(), Some("acme"));
        assert_eq!(t.run.as_deref(), Some("r1"));
        assert!(t.problems.is_empty());
    }

    #[test]
    fn bad_values_are_reported_not_used() {
        let t = OwnershipTags::parse(&tags(&[(DEADLINE, "tomorrow"), (MAX_LIFETIME, "-5")]));
        assert_eq!(t.deadline_ms, None);
        assert_eq!(t.max_lifetime_s, None);
        assert_eq!(t.problems.len(), 2);
    }

    #[test]
    fn protect_fails_safe() {
        assert!(OwnershipTags::parse(&tags(&[(PROTECT, "true")])).protect);
        assert!(OwnershipTags::parse(&tags(&[(PROTECT, "yes")])).protect);
        assert!(!OwnershipTags::parse(&tags(&[(PROTECT, "false")])).protect);
    }
}
