//! The reads of the operator's page (`fusebox ui`) and of `fusebox run`: one page of
//! runs, gathered from every partition in a cluster, one run's history, and one tree of
//! runs laid out from its root down.

use std::collections::{BTreeMap, HashMap};

use fusebox_nats::subjects::{self, ControlVerb};
use fusebox_nats::wire::{
    ErrorReply, Fleet, HistoryQuery, RunHistory, RunRow, RunsPage, RunsQuery, COSTLIEST_LIMIT,
    KNOWN_VALUES_LIMIT, RUNS_PAGE_LIMIT,
};
use futures_util::StreamExt;

use crate::client::FuseboxClient;
use crate::error::ClientError;

/// One page of runs from every daemon that answered, and in a cluster the partitions
/// that did not answer in time (their runs are missing from the page and the counts).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RunsPageView {
    pub page: RunsPage,
    pub unanswered: Vec<u32>,
}

/// One tree of runs (guard contract §6), as `fusebox run` and the run page show it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TreeView {
    /// From the root down, each run right after its parent (depth first), siblings in
    /// the order they started; runs whose parent is not listed come last.
    pub nodes: Vec<TreeNode>,
    /// Runs of the tree not listed: a tree of more than [`RUNS_PAGE_LIMIT`] runs is
    /// shown by its most recently active ones.
    pub unlisted: u64,
    /// In a cluster, partitions that did not answer in time.
    pub unanswered: Vec<u32>,
}

/// One run of a [`TreeView`].
#[derive(Debug, Clone, PartialEq)]
pub struct TreeNode {
    /// The run (`row.depth`: its level below the root).
    pub row: RunRow,
    /// The run's own steps and cost plus every listed run's below it, whole runs.
    pub tree_steps: u64,
    pub tree_cost_usd: f64,
    /// Its parent is not listed, so it is not shown under it.
    pub detached: bool,
}

/// Lays a tree's rows out from `root` down (see [`TreeView::nodes`]), each with what
/// its subtree spent.
fn arrange(mut rows: Vec<RunRow>, root: &str) -> Vec<TreeNode> {
    rows.sort_by(|a, b| (a.first_ts_ms, &a.summary.run).cmp(&(b.first_ts_ms, &b.summary.run)));
    let index: HashMap<&str, usize> = rows
        .iter()
        .enumerate()
        .map(|(i, row)| (row.summary.run.as_str(), i))
        .collect();
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); rows.len()];
    for (i, row) in rows.iter().enumerate() {
        if let Some(&parent) = row.parent.as_deref().and_then(|p| index.get(p)) {
            children[parent].push(i);
        }
    }
    // Depth first from the root, then from each run whose parent is not listed.
    let mut order: Vec<usize> = Vec::with_capacity(rows.len());
    let mut placed = vec![false; rows.len()];
    let detached: Vec<bool> = rows
        .iter()
        .map(|r| r.parent.as_deref().is_some_and(|p| !index.contains_key(p)))
        .collect();
    let unparented = (0..rows.len()).filter(|&i| rows[i].parent.is_none() || detached[i]);
    for start in index.get(root).copied().into_iter().chain(unparented) {
        let mut stack = vec![start];
        while let Some(i) = stack.pop() {
            if std::mem::replace(&mut placed[i], true) {
                continue;
            }
            order.push(i);
            stack.extend(children[i].iter().rev());
        }
    }
    // What each subtree spent: children come after their parent, so summed backwards.
    let mut spent: Vec<(u64, f64)> = rows.iter().map(|r| (r.summary.steps, r.cost_usd)).collect();
    for &i in order.iter().rev() {
        for &c in &children[i] {
            spent[i].0 += spent[c].0;
            spent[i].1 += spent[c].1;
        }
    }
    let mut rows: Vec<Option<RunRow>> = rows.into_iter().map(Some).collect();
    order
        .into_iter()
        .filter_map(|i| {
            Some(TreeNode {
                row: rows[i].take()?,
                tree_steps: spent[i].0,
                tree_cost_usd: spent[i].1,
                detached: detached[i],
            })
        })
        .collect()
}

/// Merges partitions' pages: each holds its own first `limit` rows after the cursor
/// (its last `limit` before it, `backwards`), so the first (last) `limit` of their
/// union is the merged page's.
fn merge(parts: Vec<RunsPage>, limit: usize, backwards: bool) -> RunsPage {
    let mut merged = RunsPage::default();
    let mut fleets = Vec::new();
    for part in parts {
        merged.matched += part.matched;
        merged.ahead += part.ahead;
        for (state, count) in part.states {
            *merged.states.entry(state).or_insert(0) += count;
        }
        merged.runs.extend(part.runs);
        fleets.extend(part.fleet);
    }
    merged.runs.sort_by(|a, b| {
        (
            std::cmp::Reverse(a.summary.last_ts_ms),
            &a.summary.tenant,
            &a.summary.run,
        )
            .cmp(&(
                std::cmp::Reverse(b.summary.last_ts_ms),
                &b.summary.tenant,
                &b.summary.run,
            ))
    });
    if backwards {
        // The rows left out are ahead of the merged page's first.
        let skipped = merged.runs.len().saturating_sub(limit);
        merged.runs.drain(..skipped);
        merged.ahead += skipped as u64;
    } else {
        merged.runs.truncate(limit);
    }
    merged.fleet = (!fleets.is_empty()).then(|| merge_fleets(fleets));
    merged
}

/// The partitions' fleet figures as one fleet's: counts summed, known values joined,
/// the costliest open runs of all.
fn merge_fleets(fleets: Vec<Fleet>) -> Fleet {
    let mut merged = Fleet::default();
    let known = |into: &mut Vec<String>, from: Vec<String>| {
        into.extend(from);
        into.sort();
        into.dedup();
    };
    for fleet in fleets {
        for (state, n) in fleet.states {
            *merged.states.entry(state).or_insert(0) += n;
        }
        for (reason, n) in fleet.stop_reasons {
            *merged.stop_reasons.entry(reason).or_insert(0) += n;
        }
        merged.costliest.extend(fleet.costliest);
        known(&mut merged.tenants, fleet.tenants);
        known(&mut merged.agents, fleet.agents);
        known(&mut merged.reasons, fleet.reasons);
        merged.known_truncated |= fleet.known_truncated;
    }
    for list in [&mut merged.tenants, &mut merged.agents, &mut merged.reasons] {
        if list.len() > KNOWN_VALUES_LIMIT {
            list.truncate(KNOWN_VALUES_LIMIT);
            merged.known_truncated = true;
        }
    }
    merged
        .costliest
        .sort_by(|a, b| b.cost_usd.total_cmp(&a.cost_usd));
    merged.costliest.truncate(COSTLIEST_LIMIT);
    merged
}

impl FuseboxClient {
    /// One page of runs matching `query`, newest activity first. A single daemon
    /// answers once; in a cluster every owned partition answers with its own page,
    /// gathered until all did or the client's timeout passed.
    pub async fn runs_page(&self, query: &RunsQuery) -> Result<RunsPageView, ClientError> {
        let subject = subjects::CONTROL_RUNS.to_owned();
        let limit = query
            .limit
            .unwrap_or(fusebox_nats::wire::RUNS_PAGE_LIMIT)
            .min(fusebox_nats::wire::RUNS_PAGE_LIMIT);
        let body = serde_json::to_vec(query).expect("queries serialise");
        let mut answers = self.ask_every_answerer(&subject, body).await?;
        let deadline = tokio::time::Instant::now() + self.options().timeout;
        let mut parts: BTreeMap<u32, RunsPage> = BTreeMap::new();
        let mut expected = None;
        loop {
            let Ok(Some(message)) = tokio::time::timeout_at(deadline, answers.next()).await else {
                break;
            };
            if message.status.is_some_and(|s| s.is_server_error()) {
                return Err(ClientError::NoResponders { subject });
            }
            if let Ok(refused) = serde_json::from_slice::<ErrorReply>(&message.payload) {
                return Err(ClientError::Refused(refused.error));
            }
            let page: RunsPage =
                serde_json::from_slice(&message.payload).map_err(|e| ClientError::BadAnswer {
                    subject: subject.clone(),
                    detail: e.to_string(),
                })?;
            let (Some(partition), Some(partitions)) = (page.partition, page.partitions) else {
                return Ok(RunsPageView {
                    page,
                    unanswered: Vec::new(),
                });
            };
            expected = Some(partitions);
            // Two owners may both answer for a partition while it moves: the first counts.
            parts.entry(partition).or_insert(page);
            if parts.len() as u32 >= partitions {
                break;
            }
        }
        let Some(expected) = expected else {
            return Err(ClientError::Timeout {
                subject,
                timeout_ms: self.options().timeout.as_millis() as u64,
            });
        };
        let unanswered = (0..expected).filter(|p| !parts.contains_key(p)).collect();
        Ok(RunsPageView {
            page: merge(
                parts.into_values().collect(),
                limit,
                query.after.is_none() && query.before.is_some(),
            ),
            unanswered,
        })
    }

    /// The tree of runs whose root is `root` (a run status's `tree.root`), laid out from
    /// the root down: one runs page filtered to the tree.
    pub async fn run_tree(&self, tenant: &str, root: &str) -> Result<TreeView, ClientError> {
        let query = RunsQuery {
            tenant: Some(tenant.to_owned()),
            root: Some(root.to_owned()),
            limit: Some(RUNS_PAGE_LIMIT),
            ..RunsQuery::default()
        };
        let view = self.runs_page(&query).await?;
        let listed = view.page.runs.len() as u64;
        Ok(TreeView {
            nodes: arrange(view.page.runs, root),
            unlisted: view.page.matched.saturating_sub(listed),
            unanswered: view.unanswered,
        })
    }

    /// A run's applied events with their decisions, from the log of the daemon that
    /// serves it (`query.after`: continue after the last position of a previous page).
    pub async fn history(
        &self,
        tenant: &str,
        run: &str,
        query: &HistoryQuery,
    ) -> Result<RunHistory, ClientError> {
        let body = serde_json::to_vec(query).expect("queries serialise");
        self.ask_run(tenant, run, ControlVerb::History, body).await
    }
}

#[cfg(test)]
mod tests {
    use fusebox_nats::wire::{RunRow, RunSummary};

    use super::*;

    fn row(run: &str, last_ts_ms: u64) -> RunRow {
        RunRow {
            summary: RunSummary {
                tenant: "t".to_owned(),
                run: run.to_owned(),
                agent: None,
                open: true,
                terminal_state: None,
                reason: None,
                events: 1,
                steps: 0,
                last_seq: None,
                last_ts_ms,
            },
            first_ts_ms: 0,
            calls_refused: 0,
            tokens: 0,
            cost_usd: 0.0,
            parent: None,
            root: None,
            depth: 0,
            stopped_by: None,
        }
    }

    /// `run parent depth first_ts steps` → a row.
    fn tree_row(spec: &str) -> RunRow {
        let f: Vec<&str> = spec.split(' ').collect();
        let mut row = row(f[0], 0);
        row.parent = Some(f[1]).filter(|p| *p != "-").map(str::to_owned);
        row.depth = f[2].parse().unwrap();
        row.first_ts_ms = f[3].parse().unwrap();
        row.summary.steps = f[4].parse().unwrap();
        row.cost_usd = row.summary.steps as f64 / 100.0;
        row
    }

    #[test]
    fn a_tree_is_laid_out_from_its_root_down_with_what_each_subtree_spent() {
        let full = [
            "g2 k1 2 9 1",
            "k2 root 1 3 2",
            "root - 0 1 1",
            "k1 root 1 2 3",
            "g1 k1 2 5 4",
        ];
        let cases: [(&[&str], &[&str]); 3] = [
            // Siblings in the order they started (g1 before g2), each subtree summed.
            (
                &full,
                &["root 11", "  k1 8", "    g1 4", "    g2 1", "  k2 2"],
            ),
            // k1 not listed (a tree past the page limit): its children come last.
            (
                &[
                    "g2 k1 2 9 1",
                    "k2 root 1 3 2",
                    "root - 0 1 1",
                    "g1 k1 2 5 4",
                ],
                &["root 3", "  k2 2", "    g1 4 detached", "    g2 1 detached"],
            ),
            (&[], &[]),
        ];
        for (rows, want) in cases {
            let nodes = arrange(rows.iter().map(|r| tree_row(r)).collect(), "root");
            let got: Vec<String> = nodes
                .iter()
                .map(|n| {
                    let indent = "  ".repeat(n.row.depth as usize);
                    assert!((n.tree_cost_usd * 100.0 - n.tree_steps as f64).abs() < 1e-9);
                    let detached = if n.detached { " detached" } else { "" };
                    format!("{indent}{} {}{detached}", n.row.summary.run, n.tree_steps)
                })
                .collect();
            assert_eq!(got, want, "{rows:?}");
        }
    }

    fn page(rows: Vec<RunRow>, open: u64) -> RunsPage {
        RunsPage {
            matched: rows.len() as u64,
            states: [("OPEN".to_owned(), open)].into(),
            runs: rows,
            ..RunsPage::default()
        }
    }

    #[test]
    fn partitions_merge_newest_first_and_sum_their_counts() {
        let a = page(vec![row("a1", 50), row("a2", 10)], 2);
        let b = page(vec![row("b1", 40), row("b2", 30)], 5);
        let merged = merge(vec![a.clone(), b.clone()], 3, false);
        let runs: Vec<&str> = merged.runs.iter().map(|r| r.summary.run.as_str()).collect();
        assert_eq!(runs, ["a1", "b1", "b2"]);
        assert_eq!(merged.matched, 4);
        assert_eq!(merged.states["OPEN"], 7);
        assert_eq!(merged.ahead, 0);
        // Backwards (the page before a cursor): the last rows, the others ahead of them.
        let merged = merge(vec![a, b], 3, true);
        let runs: Vec<&str> = merged.runs.iter().map(|r| r.summary.run.as_str()).collect();
        assert_eq!(runs, ["b1", "b2", "a2"]);
        assert_eq!(merged.ahead, 1);
    }

    #[test]
    fn partitions_fleet_figures_merge_into_one_fleets() {
        let fleet = |tenants: &[&str], cost: f64, run: &str| Fleet {
            states: [("OPEN".to_owned(), 2)].into(),
            stop_reasons: [("no_progress".to_owned(), 1)].into(),
            costliest: vec![RunRow {
                cost_usd: cost,
                ..row(run, 1)
            }],
            tenants: tenants.iter().map(|t| t.to_string()).collect(),
            ..Fleet::default()
        };
        let parts = vec![
            RunsPage {
                fleet: Some(fleet(&["acme", "beta"], 0.5, "cheap")),
                ..page(vec![], 0)
            },
            RunsPage {
                fleet: Some(fleet(&["acme", "zeta"], 2.0, "dear")),
                ..page(vec![], 0)
            },
        ];
        let fleet = merge(parts, 3, false).fleet.unwrap();
        assert_eq!(fleet.states["OPEN"], 4);
        assert_eq!(fleet.stop_reasons["no_progress"], 2);
        assert_eq!(fleet.tenants, ["acme", "beta", "zeta"]);
        let costliest: Vec<&str> = fleet
            .costliest
            .iter()
            .map(|r| r.summary.run.as_str())
            .collect();
        assert_eq!(costliest, ["dear", "cheap"]);
    }
}
