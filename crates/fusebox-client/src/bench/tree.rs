//! The tree's bookkeeping on the gate's path (issue 45): the same calls, 64 in flight,
//! once spread over 64 children of one root and once over 64 unrelated runs. Every call
//! of a child reads its root's budgets before it is decided and carries its step up
//! after; an unrelated run does neither. The two figures are taken alternately, twice
//! each, in the same run.

use crate::bench::{check, measure, Figure};
use crate::client::FuseboxClient;
use crate::error::ClientError;

/// Runs the calls are spread over, as many as calls in flight by default.
pub(crate) const RUNS: usize = 64;

/// What every run of the measurement may do: enough that no budget or cap decides.
const POLICY: &str = r#"{"max_steps":100000000,"max_model_turns":100000000,"max_children":100000,"max_open_children":100000,"max_depth":3}"#;

fn envelope(tenant: &str, run: &str, id: &str, body: &str) -> Vec<u8> {
    format!(
        r#"{{"v":1,"id":"{id}","tenant":"{tenant}","run":"{run}","ts_ms":1700000000000,{body}}}"#
    )
    .into_bytes()
}

/// Starts `RUNS` runs named `<prefix>-<n>`, children of `<prefix>-root` when `tree`.
async fn start(
    client: &FuseboxClient,
    tenant: &str,
    prefix: &str,
    tree: bool,
) -> Result<(), ClientError> {
    let root = format!("{prefix}-root");
    if tree {
        let body = format!(r#""type":"run_started","policy":{POLICY}"#);
        check(
            client
                .gate_bytes(tenant, &root, envelope(tenant, &root, "s", &body))
                .await,
        )?;
    }
    for n in 0..RUNS {
        let run = format!("{prefix}-{n}");
        let parent = if tree {
            format!(r#","parent":"{root}""#)
        } else {
            String::new()
        };
        let body = format!(r#""type":"run_started","policy":{POLICY}{parent}"#);
        check(
            client
                .gate_bytes(tenant, &run, envelope(tenant, &run, "s", &body))
                .await,
        )?;
    }
    Ok(())
}

/// `total` calls, `in_flight` at a time, call `i` in run `i % RUNS`.
async fn calls(
    client: &FuseboxClient,
    tenant: &str,
    prefix: String,
    total: usize,
    in_flight: usize,
) -> Result<Figure, ClientError> {
    let (client, tenant) = (client.clone(), tenant.to_owned());
    measure(total, in_flight, move |i| {
        let (client, tenant, prefix) = (client.clone(), tenant.clone(), prefix.clone());
        async move {
            let run = format!("{prefix}-{}", i % RUNS);
            let body = format!(
                r#""type":"tool_call","call_id":"c{i}","tool":"search","args":{{"q":"query {i}"}}"#
            );
            let payload = envelope(&tenant, &run, &format!("c{i}"), &body);
            check(client.gate_bytes(&tenant, &run, payload).await)
        }
    })
    .await
}

/// (children of one root, unrelated runs), each over `2 × total` calls.
pub(crate) async fn measure_both(
    client: &FuseboxClient,
    tenant: &str,
    id: &str,
    total: usize,
    in_flight: usize,
) -> Result<(Figure, Figure), ClientError> {
    let mut tree = Vec::new();
    let mut flat = Vec::new();
    for round in 0..2 {
        for (is_tree, into) in [(false, &mut flat), (true, &mut tree)] {
            let prefix = format!("{}{round}{id}", if is_tree { "t" } else { "f" });
            start(client, tenant, &prefix, is_tree).await?;
            into.push(calls(client, tenant, prefix, total, in_flight).await?);
        }
    }
    Ok((Figure::sum(&tree), Figure::sum(&flat)))
}
