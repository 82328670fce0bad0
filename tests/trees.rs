//! Run trees from the operator's side (issue 45 §2), against a secured deployment
//! (deploy/nats/accounts.conf as shipped): the agents run as a tenant user, the CLI as
//! the `operator` user. A root with five sub-agents, two of which started one each;
//! `fusebox run` prints the tree, and `fusebox cancel` of the root ends every descendant
//! — each with a stop of its own on its own kill switch, naming the ancestor, and its
//! next call refused by the daemon — and says how many were open; the daemon's metrics
//! count the open sub-agents by depth.

use std::process::Command;
use std::time::Duration;

use fusebox_client::{Gate, RunOptions};
use fusebox_core::decision::Reason;
use fusebox_core::{Action, TerminalState};
use fusebox_e2e::deploy_nats::placeholder_password;
use fusebox_e2e::{bin, event, now_ms, SecuredStack};
use serde_json::{json, Value};

/// The tree: (run, parent, calls it makes).
const TREE: [(&str, Option<&str>, u32); 8] = [
    ("root", None, 1),
    ("k1", Some("root"), 2),
    ("k2", Some("root"), 1),
    ("k3", Some("root"), 1),
    ("k4", Some("root"), 1),
    ("k5", Some("root"), 1),
    ("g1", Some("k1"), 3),
    ("g2", Some("k2"), 1),
];

/// `fusebox ARGS` as the operator; its stdout.
fn operator(stack: &SecuredStack, args: &[&str]) -> String {
    let out = Command::new(bin("fusebox"))
        .args(args)
        .env("FUSEBOX_NATS_URL", stack.url())
        .env("FUSEBOX_NATS_USER", "operator")
        .env("FUSEBOX_NATS_PASSWORD", placeholder_password("operator"))
        .env_remove("FUSEBOX_CONFIG")
        .output()
        .expect("running fusebox");
    assert!(
        out.status.success(),
        "fusebox {args:?} failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `fusebox_subagents_active` by depth bucket, once it reads `want` (the gauge is set
/// on the daemon's timer).
async fn wait_subagents(stack: &SecuredStack, want: [u64; 4]) {
    let port = stack.daemon.as_ref().expect("the daemon runs").metrics_port;
    let mut got = Vec::new();
    for _ in 0..100 {
        let (_, text) = fusebox_e2e::http::http_get(port, "/metrics").expect("/metrics");
        got = ["1", "2", "3", "4+"]
            .map(|depth| {
                let series = format!("fusebox_subagents_active{{depth=\"{depth}\"}} ");
                text.lines()
                    .find_map(|line| line.strip_prefix(&series)?.parse::<u64>().ok())
                    .unwrap_or(u64::MAX)
            })
            .to_vec();
        if got == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("fusebox_subagents_active: {got:?}, want {want:?}");
}

/// The tree table of `fusebox run`'s output: each row's name column (indented) and the
/// rest of its words.
fn tree_rows(out: &str) -> Vec<(String, Vec<String>)> {
    out.lines()
        .skip_while(|line| !line.starts_with("TREE"))
        .skip(1)
        .take_while(|line| !line.is_empty() && !line.starts_with("..."))
        .map(|line| {
            let indent = line.len() - line.trim_start().len();
            let mut words = line.split_whitespace().map(str::to_owned);
            let name = format!("{}{}", " ".repeat(indent), words.next().unwrap());
            (name, words.collect())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_the_root_from_the_cli_ends_every_descendant() {
    let stack = SecuredStack::start().await;
    let acme = stack.client("tenant-acme", Duration::from_secs(5)).await;
    let mut runs = Vec::new();
    for (run, parent, calls) in TREE {
        let options = RunOptions {
            agent: Some(
                if parent.is_some() {
                    "worker"
                } else {
                    "planner"
                }
                .to_owned(),
            ),
            parent: parent.map(str::to_owned),
            ..RunOptions::default()
        };
        let handle = acme.start_run("acme", run, options).await.expect(run);
        for i in 0..calls {
            let (_, gate) = handle.call("search", json!({"q": run, "i": i})).await;
            assert!(gate.may_run(), "{run}: {gate:?}");
        }
        runs.push((run, parent, handle));
    }

    // Sub-agents by depth, without a label per run.
    wait_subagents(&stack, [5, 2, 0, 0]).await;

    // The tree, from any of its runs: the root, each run under its parent in the order
    // they started, with its own steps and its subtree's.
    let out = operator(&stack, &["run", "acme/k1"]);
    let want = [
        ("root", "1", "11"),
        ("  k1", "2", "5"),
        ("    g1", "3", "3"),
        ("  k2", "1", "2"),
        ("    g2", "1", "1"),
        ("  k3", "1", "1"),
        ("  k4", "1", "1"),
        ("  k5", "1", "1"),
    ];
    let rows = tree_rows(&out);
    let got: Vec<(&str, &str, &str)> = rows
        .iter()
        .map(|(name, rest)| (name.as_str(), rest[1].as_str(), rest[2].as_str()))
        .collect();
    assert_eq!(got, want, "{out}");
    assert!(rows.iter().all(|(_, rest)| rest[0] == "OPEN"), "{out}");
    assert!(out.contains("<- this run"), "{out}");
    assert!(
        out.contains("in the tree of acme/root: depth 1, 1 runs started below it, 1 open"),
        "{out}"
    );

    // A model call of g1 in flight holds its reservation in every run above it, as the
    // operator sees: the root's budgets count it before any other model call is made.
    let g1 = &runs.iter().find(|(run, _, _)| *run == "g1").expect("g1").2;
    let answer = g1.model_call(Some(1000), Some(0.05)).await.expect("asked");
    assert_eq!(answer.map(|d| d.action), Some(Action::Continue));
    let out = operator(&stack, &["run", "acme/root"]);
    assert!(
        out.contains("held by model calls in flight (its own and below): 1 call,"),
        "{out}"
    );
    let status: Value =
        serde_json::from_str(operator(&stack, &["run", "acme/k1", "--json"]).trim()).unwrap();
    assert_eq!(status["reserved"]["model_turns"], 1, "{status}");
    assert!(
        status["reserved"]["tokens"].as_u64() >= Some(1000),
        "{status}"
    );

    // Cancel the root: the CLI says how many runs below it were open.
    let out = operator(&stack, &["cancel", "acme/root", "--reason", "runaway tree"]);
    assert!(out.contains("acme/root stop cancelled"), "{out}");
    assert!(
        out.contains("7 runs below acme/root were open: each is stopped with it"),
        "{out}"
    );

    for (run, parent, handle) in &runs {
        // Its own stop, on its own kill switch.
        let stop = tokio::time::timeout(Duration::from_secs(10), handle.wait_stopped())
            .await
            .unwrap_or_else(|_| panic!("{run}: no stop on its kill switch"));
        assert_eq!(stop.run, *run);
        let report = stop.report.as_ref().expect("a stop carries its report");
        assert_eq!(report.terminal_state, TerminalState::Cancelled, "{run}");
        let kept = acme
            .kept_stop("acme", run)
            .await
            .expect("the kill switch answers the tenant")
            .unwrap_or_else(|| panic!("{run}: no stop kept"));
        assert_eq!(kept.reason, stop.reason, "{run}");
        let Some(parent) = parent else {
            assert_eq!(stop.reason, Some(Reason::Cancelled));
            continue;
        };
        assert_eq!(stop.reason, Some(Reason::AncestorStopped), "{run}");
        // The report names the ancestor whose stop reached it (its parent, or the root).
        let detail = report.detail.as_deref().unwrap_or("");
        assert!(
            detail.contains(&format!("run {parent} ")) || detail.contains("run root "),
            "{run}: {detail}"
        );
        // Its next call, sent to the daemon (not answered by the handle's latch): refused.
        let call = event(
            json!({"v":1,"id":format!("{run}-late"),"tenant":"acme","run":run,
            "ts_ms":now_ms(),"type":"tool_call","call_id":"late","tool":"search","args":{"q":"again"}}),
        );
        match acme.gate(&call).await {
            Gate::Decided(decision) => assert_eq!(decision.action, Action::Stop, "{run}"),
            other => panic!("{run}: {other:?}"),
        }
    }

    wait_subagents(&stack, [0, 0, 0, 0]).await;

    // Each run's place, and whose stop closed it: the root's, also for a grandchild told
    // of it through its parent's.
    let status: Value =
        serde_json::from_str(operator(&stack, &["run", "acme/g1", "--json"]).trim()).unwrap();
    let tree = &status["tree"];
    assert_eq!(
        (
            &tree["parent"],
            &tree["depth"],
            &tree["root"],
            &tree["stopped_by"]
        ),
        (&json!("k1"), &json!(2), &json!("root"), &json!("root")),
        "{status}"
    );
    let status: Value =
        serde_json::from_str(operator(&stack, &["run", "acme/root", "--json"]).trim()).unwrap();
    let tree = &status["tree"];
    assert_eq!(
        (&tree["spawned"], &tree["open_below"]),
        (&json!(7), &json!(0))
    );
    assert_eq!(tree["below"]["steps"], 10, "{status}");
    let children: Vec<(&str, &str)> = tree["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["run"].as_str().unwrap(), c["reason"].as_str().unwrap()))
        .collect();
    assert_eq!(
        children,
        ["k1", "k2", "k3", "k4", "k5"].map(|k| (k, "ancestor_stopped"))
    );

    let out = operator(&stack, &["run", "acme/g1"]);
    let rows = tree_rows(&out);
    assert_eq!(rows[0].1[..2], ["CANCELLED", "cancelled"], "{out}");
    for (name, rest) in &rows[1..] {
        assert_eq!(
            rest[..4],
            ["CANCELLED", "ancestor_stopped", "(from", "root)"],
            "{name}: {out}"
        );
    }
}
