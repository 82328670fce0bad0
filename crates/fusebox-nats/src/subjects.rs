//! The subject and stream names of interfaces.md §2, in one place, with their parsers.
//!
//! `<tenant>` and `<run>` are single subject tokens: the id character sets of the event
//! contract (`[A-Za-z0-9_-]`) contain no `.`, `*`, `>` or white space.

/// Stream of passively reported events (`fusebox.events.>`).
pub const EVENTS_STREAM: &str = "FUSEBOX_EVENTS";
pub const EVENTS_FILTER: &str = "fusebox.events.>";
/// Stream keeping the last stop report per run, so a late subscriber still sees it.
pub const STOPS_STREAM: &str = "FUSEBOX_STOPS";
pub const STOPS_FILTER: &str = "fusebox.stop.>";
/// The durable pull consumer the daemon reads `FUSEBOX_EVENTS` with.
pub const EVENTS_CONSUMER: &str = "fuseboxd";
/// What the gate service subscribes to (with a queue group): every form of a run's gate
/// subject ([`run_of`]).
pub const GATE_FILTER: &str = "fusebox.gate.*.>";
/// What the control service subscribes to (with a queue group).
pub const CONTROL_FILTER: &str = "fusebox.control.>";
/// Request/reply: every run the daemon knows, as a JSON list of summaries.
pub const CONTROL_RUNS: &str = "fusebox.control.runs";
/// Request/reply: the op_key ledger's entries (body: a `LedgerQuery`).
pub const CONTROL_LEDGER: &str = "fusebox.control.ledger";
/// Request/reply: the cloud watchdog's state (halted or running), its instances with
/// their deadlines and its recent terminations, and an operator's resume of a halted
/// watchdog (a `WatchdogRequest`, answered with a `WatchdogReply` by each daemon's
/// watchdog itself: not partition-mapped, three tokens; the guard service leaves it alone).
pub const CONTROL_WATCHDOG: &str = "fusebox.control.watchdog";
/// Every notable decision of every run, for `fusebox tail`.
pub const DECISIONS_FILTER: &str = "fusebox.decisions.>";

pub fn gate(tenant: &str, run: &str) -> String {
    format!("fusebox.gate.{tenant}.{run}")
}

pub fn events(tenant: &str, run: &str) -> String {
    format!("fusebox.events.{tenant}.{run}")
}

/// Where a run of a tree is published: `fusebox.gate.<tenant>.<root>.<run>`, its tree's
/// root before it (the plain form for the root itself). The servers' partition mapping
/// hashes the token after the tenant, so every run of one tree lands in its root's
/// partition and one engine keeps the tree's budgets exact (guard contract §6;
/// deploy/nats/partitions.conf).
pub fn tree_gate(tenant: &str, root: &str, run: &str) -> String {
    in_tree("gate", tenant, root, run)
}

/// [`tree_gate`]'s form for the events stream.
pub fn tree_events(tenant: &str, root: &str, run: &str) -> String {
    in_tree("events", tenant, root, run)
}

/// [`tree_gate`]'s form for an operator command on a run of a tree.
pub fn tree_control(tenant: &str, root: &str, run: &str, verb: ControlVerb) -> String {
    format!(
        "{}.{}",
        in_tree("control", tenant, root, run),
        verb.as_str()
    )
}

fn in_tree(kind: &str, tenant: &str, root: &str, run: &str) -> String {
    if root == run {
        format!("fusebox.{kind}.{tenant}.{run}")
    } else {
        format!("fusebox.{kind}.{tenant}.{root}.{run}")
    }
}

pub fn decisions(tenant: &str, run: &str) -> String {
    format!("fusebox.decisions.{tenant}.{run}")
}

pub fn stop(tenant: &str, run: &str) -> String {
    format!("fusebox.stop.{tenant}.{run}")
}

/// Where a worker looks up the stop kept for its run: a JetStream direct get of the last
/// message on its own stop subject (empty request body; `404` = no stop kept). The run is
/// in the subject, so a tenant's allow-list
/// `$JS.API.DIRECT.GET.FUSEBOX_STOPS.fusebox.stop.<tenant>.>` admits only its own runs.
pub fn stop_lookup(tenant: &str, run: &str) -> String {
    format!("$JS.API.DIRECT.GET.{STOPS_STREAM}.{}", stop(tenant, run))
}

pub fn dlq(tenant: &str) -> String {
    format!("fusebox.dlq.{tenant}")
}

pub fn control(tenant: &str, run: &str, verb: ControlVerb) -> String {
    format!("fusebox.control.{tenant}.{run}.{}", verb.as_str())
}

/// Which subjects one guard service takes: all runs, or one partition of them (a
/// cluster, where the servers map `fusebox.<kind>.<tenant>.<run>` to
/// `fusebox.<kind>.<tenant>.<partition>.<run>`; see deploy/nats/partitions.conf).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    All,
    /// Partition `index` of the `of` that the servers' mapping splits runs into.
    Partition {
        index: u32,
        of: u32,
    },
}

impl Scope {
    /// The gate subjects to subscribe to: all runs take every form (plain, in a tree,
    /// partitioned or not: the mapping can stay on while a deployment runs a single
    /// daemon), a partition its own, with or without a tree's root before the run.
    pub fn gate_filters(self) -> Vec<String> {
        match self {
            Scope::All => vec![GATE_FILTER.to_owned()],
            Scope::Partition { index: p, .. } => vec![format!("fusebox.gate.*.{p}.>")],
        }
    }

    pub fn control_filter(self) -> String {
        match self {
            Scope::All => CONTROL_FILTER.to_owned(),
            Scope::Partition { index: p, .. } => format!("fusebox.control.*.{p}.>"),
        }
    }

    pub fn events_filter(self) -> String {
        match self {
            Scope::All => EVENTS_FILTER.to_owned(),
            Scope::Partition { index: p, .. } => format!("fusebox.events.*.{p}.>"),
        }
    }

    /// The consumer filter a partition had before runs of a tree were published with
    /// their root (`fusebox.events.*.<p>.*`): a durable made with it is widened in place.
    pub fn events_filter_before_trees(self) -> Option<String> {
        match self {
            Scope::All => None,
            Scope::Partition { index: p, .. } => Some(format!("fusebox.events.*.{p}.*")),
        }
    }

    /// The subjects one run's events are stored on in `FUSEBOX_EVENTS`: all runs may
    /// see both forms (the servers' mapping on or off), a partition only its own.
    pub fn run_events_subjects(self, tenant: &str, run: &str) -> Vec<String> {
        match self {
            Scope::All => vec![
                events(tenant, run),
                format!("fusebox.events.{tenant}.*.{run}"),
                format!("fusebox.events.{tenant}.*.*.{run}"),
            ],
            Scope::Partition { index: p, .. } => vec![
                format!("fusebox.events.{tenant}.{p}.{run}"),
                format!("fusebox.events.{tenant}.{p}.*.{run}"),
            ],
        }
    }

    /// The durable consumer of `FUSEBOX_EVENTS`: one per partition, outliving the
    /// daemon that owns it, so a takeover continues from its ack floor.
    pub fn events_consumer(self) -> String {
        match self {
            Scope::All => EVENTS_CONSUMER.to_owned(),
            Scope::Partition { index: p, .. } => format!("{EVENTS_CONSUMER}-p{p}"),
        }
    }
}

/// `fusebox.<kind>.<tenant>.<run>` → `(tenant, run)`, whatever stands between the two:
/// a partition number (the servers' mapping), a tree's root ([`tree_gate`]), or both
/// (`….<tenant>.<partition>.<root>.<run>`). The run is always the last token, so a run
/// id of digits alone is never mistaken for a partition.
pub fn run_of<'a>(subject: &'a str, kind: &str) -> Option<(&'a str, &'a str)> {
    let mut tokens = subject.split('.');
    if tokens.next()? != "fusebox" || tokens.next()? != kind {
        return None;
    }
    let tenant = tokens.next().filter(|t| !t.is_empty())?;
    Some((tenant, run_after_tenant(tokens)?))
}

/// The run among the tokens that follow the tenant: `[run]`, `[partition or root, run]`
/// or `[partition, root, run]`. On the gate's path: no allocation.
fn run_after_tenant<'a>(tokens: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    let mut kept = [""; 3];
    let mut count = 0;
    for token in tokens {
        if count == kept.len() || token.is_empty() {
            return None;
        }
        kept[count] = token;
        count += 1;
    }
    match &kept[..count] {
        [run] | [_, run] => Some(run),
        [partition, _root, run] if is_partition(partition) => Some(run),
        _ => None,
    }
}

fn is_partition(token: &str) -> bool {
    !token.is_empty() && token.len() <= 9 && token.bytes().all(|b| b.is_ascii_digit())
}

/// The tenant token of any `fusebox.<kind>.<tenant>…` subject (where its dead letters go).
pub fn tenant_of(subject: &str) -> Option<&str> {
    subject.split('.').nth(2).filter(|t| !t.is_empty())
}

/// Operator commands on one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlVerb {
    Cancel,
    Resume,
    Status,
    /// An operator's word on an op_key (a `ledger_resolve` event of the run).
    Resolve,
    /// The run's applied events with their decisions (a query, like `status`).
    History,
}

impl ControlVerb {
    pub const ALL: [ControlVerb; 5] = [
        ControlVerb::Cancel,
        ControlVerb::Resume,
        ControlVerb::Status,
        ControlVerb::Resolve,
        ControlVerb::History,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ControlVerb::Cancel => "cancel",
            ControlVerb::Resume => "resume",
            ControlVerb::Status => "status",
            ControlVerb::Resolve => "resolve",
            ControlVerb::History => "history",
        }
    }

    pub fn parse(token: &str) -> Option<ControlVerb> {
        ControlVerb::ALL.into_iter().find(|v| v.as_str() == token)
    }
}

/// A parsed control subject.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Control<'a> {
    Runs,
    Ledger,
    Watchdog,
    Run {
        tenant: &'a str,
        run: &'a str,
        verb: ControlVerb,
    },
}

pub fn parse_control(subject: &str) -> Option<Control<'_>> {
    if subject == CONTROL_RUNS {
        return Some(Control::Runs);
    }
    if subject == CONTROL_LEDGER {
        return Some(Control::Ledger);
    }
    if subject == CONTROL_WATCHDOG {
        return Some(Control::Watchdog);
    }
    let rest = subject.strip_prefix("fusebox.control.")?;
    let (tenant, rest) = rest.split_once('.')?;
    let (before, verb) = rest.rsplit_once('.')?;
    let verb = ControlVerb::parse(verb)?;
    let run = run_after_tenant(before.split('.'))?;
    if tenant.is_empty() {
        return None;
    }
    Some(Control::Run { tenant, run, verb })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_subjects_round_trip() {
        assert_eq!(run_of(&gate("acme", "r-1"), "gate"), Some(("acme", "r-1")));
        assert_eq!(
            run_of(&events("acme", "r1"), "events"),
            Some(("acme", "r1"))
        );
        assert_eq!(run_of("fusebox.events.acme", "events"), None);
        assert_eq!(run_of("fusebox.events.acme.1.r1.x.y", "events"), None);
        assert_eq!(run_of("fusebox.gate.acme.r1", "events"), None);
        assert_eq!(tenant_of("fusebox.events.acme.r1.x"), Some("acme"));
        assert_eq!(
            stop_lookup("acme", "r1"),
            "$JS.API.DIRECT.GET.FUSEBOX_STOPS.fusebox.stop.acme.r1"
        );
    }

    #[test]
    fn partitioned_subjects_name_the_same_run() {
        assert_eq!(
            run_of("fusebox.gate.acme.3.r1", "gate"),
            Some(("acme", "r1"))
        );
        assert_eq!(
            run_of("fusebox.events.acme.0.42", "events"),
            Some(("acme", "42"))
        );
        // A run id of digits alone is still a run when nothing follows it.
        assert_eq!(run_of("fusebox.gate.acme.42", "gate"), Some(("acme", "42")));
        // Before the run, a token that is no partition is a tree's root.
        assert_eq!(
            run_of("fusebox.gate.acme.x.r1", "gate"),
            Some(("acme", "r1"))
        );
        assert_eq!(
            parse_control("fusebox.control.acme.5.r1.cancel"),
            Some(Control::Run {
                tenant: "acme",
                run: "r1",
                verb: ControlVerb::Cancel
            })
        );
        assert_eq!(
            parse_control("fusebox.control.acme.7.status"),
            Some(Control::Run {
                tenant: "acme",
                run: "7",
                verb: ControlVerb::Status
            })
        );
        assert_eq!(parse_control(CONTROL_WATCHDOG), Some(Control::Watchdog));
        let p = Scope::Partition { index: 5, of: 8 };
        assert_eq!(p.gate_filters(), ["fusebox.gate.*.5.>"]);
        assert_eq!(p.events_filter(), "fusebox.events.*.5.>");
        assert_eq!(p.control_filter(), "fusebox.control.*.5.>");
        assert_eq!(p.events_consumer(), "fuseboxd-p5");
    }

    /// Every form a run's subject takes on the wire, and the run it names.
    #[test]
    fn every_form_of_a_run_subject_names_its_run() {
        let cases: &[(&str, Option<(&str, &str)>)] = &[
            ("fusebox.gate.acme.r1", Some(("acme", "r1"))),
            ("fusebox.gate.acme.3.r1", Some(("acme", "r1"))),
            ("fusebox.gate.acme.root-1.r1", Some(("acme", "r1"))),
            ("fusebox.gate.acme.3.root-1.r1", Some(("acme", "r1"))),
            ("fusebox.gate.acme.3.42.7", Some(("acme", "7"))),
            ("fusebox.gate.acme.x.root.r1", None),
            ("fusebox.gate.acme.3.root.r1.more", None),
            ("fusebox.gate.acme..r1", None),
            ("fusebox.gate.acme.r1.", None),
            ("fusebox.gate..r1", None),
        ];
        for (subject, expected) in cases {
            assert_eq!(run_of(subject, "gate"), *expected, "{subject}");
        }
        assert_eq!(tree_gate("acme", "r1", "r1"), gate("acme", "r1"));
        assert_eq!(tree_gate("acme", "root", "c1"), "fusebox.gate.acme.root.c1");
        assert_eq!(
            tree_events("acme", "root", "c1"),
            "fusebox.events.acme.root.c1"
        );
        let cancel = tree_control("acme", "root", "c1", ControlVerb::Cancel);
        assert_eq!(cancel, "fusebox.control.acme.root.c1.cancel");
        let run = |subject: &str| match parse_control(subject) {
            Some(Control::Run { run, verb, .. }) => Some((run.to_owned(), verb)),
            _ => None,
        };
        assert_eq!(run(&cancel), Some(("c1".to_owned(), ControlVerb::Cancel)));
        assert_eq!(
            run("fusebox.control.acme.5.root.c1.history"),
            Some(("c1".to_owned(), ControlVerb::History))
        );
        assert_eq!(run("fusebox.control.acme.x.root.c1.status"), None);
        let p = Scope::Partition { index: 5, of: 8 };
        assert_eq!(
            p.run_events_subjects("acme", "c1"),
            ["fusebox.events.acme.5.c1", "fusebox.events.acme.5.*.c1"]
        );
    }

    #[test]
    fn control_subjects_parse() {
        assert_eq!(parse_control(CONTROL_RUNS), Some(Control::Runs));
        let cancel = control("acme", "r1", ControlVerb::Cancel);
        assert_eq!(
            parse_control(&cancel),
            Some(Control::Run {
                tenant: "acme",
                run: "r1",
                verb: ControlVerb::Cancel
            })
        );
        assert_eq!(parse_control("fusebox.control.acme.r1.explode"), None);
        assert_eq!(parse_control("fusebox.control.acme.r1"), None);
    }
}
