//! A run's timeline from the daemon's log (`fusebox.control.<t>.<r>.history`, the
//! operator's page of one run): the log's dedup index says where each of the run's
//! events sits, and only the frames holding them are read and decoded.

use fusebox_log::log::decode_frame;
use fusebox_log::record::{Frame, Record};
use fusebox_log::{keys, EventLog, Guard, LogError, Tree};
use fusebox_nats::wire::{HistoryEntry, RunHistory};

/// The run's entries after log position `after`, at most `limit`, in applied order.
pub fn run_history<L: EventLog>(
    guard: &Guard<L>,
    tenant: &str,
    run: &str,
    after: u64,
    limit: usize,
) -> Result<RunHistory, LogError> {
    // The index is a map per run inside a map per tenant; `recorded` walks them all,
    // which costs a pass over the ids in memory, never a read of the log.
    let mut positions: Vec<u64> = guard
        .state()
        .applied
        .recorded()
        .filter(|&(t, r, _, at)| t == tenant && r == run && at > after)
        .map(|(_, _, _, at)| at)
        .collect();
    positions.sort_unstable();
    let more = positions.len() > limit;
    positions.truncate(limit);
    let log = guard.log();
    let mut entries = Vec::with_capacity(positions.len());
    let mut held: Option<(u64, Frame)> = None;
    for pos in positions {
        let covers =
            |(first, frame): &(u64, Frame)| pos >= *first && pos < first + frame.len() as u64;
        if !held.as_ref().is_some_and(covers) {
            let Some((key, bytes)) = log.floor(Tree::Events, &keys::position(pos))? else {
                continue;
            };
            let Some(first) = keys::decode_position(key.as_ref()) else {
                continue;
            };
            held = Some((first, decode_frame(log, first, bytes.as_ref())?));
        }
        let Some((first, frame)) = held.as_ref() else {
            continue;
        };
        let Some(entry) = frame.entries().nth((pos - first) as usize) else {
            continue;
        };
        if entry.is_op {
            continue;
        }
        let unreadable = |detail: String| LogError::Corrupt {
            path: log.path().to_owned(),
            what: format!("position {pos}"),
            detail,
        };
        let Record::Event(event) = entry.decode().map_err(unreadable)? else {
            continue;
        };
        let decision = entry.decode_decision().map_err(unreadable)?;
        // The index keys ids by hash: a collision is skipped, never shown as this run's.
        if event.tenant != tenant || event.run != run {
            continue;
        }
        entries.push(HistoryEntry {
            position: pos,
            event: serde_json::to_value(&*event).expect("events serialise"),
            decision,
        });
    }
    Ok(RunHistory { entries, more })
}

#[cfg(test)]
mod tests {
    use fusebox_core::{parse_event, PolicySet};
    use fusebox_log::GuardOptions;

    use super::*;

    fn event(run: &str, seq: u64, body: &str) -> fusebox_core::Event {
        let json = format!(
            r#"{{"v":1,"id":"{run}-{seq}","tenant":"t","run":"{run}","seq":{seq},"ts_ms":{seq},{body}}}"#
        );
        parse_event(json.as_bytes()).unwrap()
    }

    #[test]
    fn a_runs_history_is_its_events_in_order_with_their_decisions_in_pages() {
        let dir = tempfile::tempdir().unwrap();
        let mut guard =
            Guard::open(dir.path(), PolicySet::default(), GuardOptions::default()).unwrap();
        let call = |n: u64| {
            format!(
                r#""type":"tool_call","call_id":"c{n}","tool":"search","args":{{"q":"<b>{n}</b>"}}"#
            )
        };
        // Two runs interleaved, over several batches (so several frames).
        for n in 1..=6u64 {
            let mut batch = Vec::new();
            for run in ["a", "b"] {
                batch.push(if n == 1 {
                    event(run, 1, r#""type":"run_started","agent":"x""#)
                } else {
                    event(run, n, &call(n))
                });
            }
            guard.submit_batch(batch).unwrap();
        }
        let all = run_history(&guard, "t", "a", 0, 100).unwrap();
        assert!(!all.more);
        let ids: Vec<&str> = all
            .entries
            .iter()
            .map(|e| e.event["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, ["a-1", "a-2", "a-3", "a-4", "a-5", "a-6"]);
        assert!(all.entries.iter().all(|e| e.decision.run == "a"));
        assert_eq!(all.entries[1].event["args"]["q"], "<b>2</b>");
        assert_eq!(all.entries[1].decision.event_id, "a-2");

        let first = run_history(&guard, "t", "a", 0, 4).unwrap();
        assert!(first.more);
        let after = first.entries.last().unwrap().position;
        let rest = run_history(&guard, "t", "a", after, 4).unwrap();
        assert!(!rest.more);
        let paged: Vec<u64> = first
            .entries
            .iter()
            .chain(&rest.entries)
            .map(|e| e.position)
            .collect();
        let whole: Vec<u64> = all.entries.iter().map(|e| e.position).collect();
        assert_eq!(paged, whole);
        assert!(run_history(&guard, "t", "nobody", 0, 10)
            .unwrap()
            .entries
            .is_empty());
    }
}
