//! The completed-operations ledger (guard contract §4.4): per tenant, per `op_key`, an
//! operation is in flight or completed. A SUCCESS is kept for good, so the same business
//! operation never runs twice, whichever run asks for it again. An entry in flight
//! carries when it was last heard of: after the policy's lease the operation's outcome
//! is unknown (the gate decides what the next attempt gets), and only an operator's
//! `ledger_resolve` says what became of it.

use std::collections::BTreeMap;

/// The key of a stored result that is not the result: the operation completed, but its
/// result came only as `output_hash` (larger than the producer sends inline), so the
/// ledger keeps where it is instead — `{"fusebox_result_not_stored": {"output_hash",
/// "run", "call_id", "completed_at_ms"}}` — and a later call with the key is told so.
pub const RESULT_NOT_STORED: &str = "fusebox_result_not_stored";

use serde::{Deserialize, Serialize};

use crate::sharded::ShardedMap;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum LedgerEntry {
    /// A call with this key executed and has no result yet. `since_ms`: event time of
    /// the last word of it (the call, or a PENDING answer), where its lease starts.
    InFlight {
        run: String,
        call_id: String,
        #[serde(default)]
        since_ms: u64,
    },
    /// A call with this key succeeded; `result` (JSON text) is what later calls get
    /// instead. Kept as text so the ledger stays readable by any serde format, not only
    /// self-describing ones, and costs nothing until someone asks for it again.
    Completed {
        run: String,
        call_id: String,
        result: String,
    },
}

/// Each tenant's keys in a [`ShardedMap`], so a clone of the ledger (the log's snapshot
/// view) is cheap, and a key changed while it lives copies a few hundred entries, not the
/// tenant's ledger. It serialises like a `BTreeMap`: the form is unchanged.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Ledger {
    tenants: BTreeMap<String, ShardedMap<LedgerEntry>>,
}

impl Ledger {
    pub fn get(&self, tenant: &str, op_key: &str) -> Option<&LedgerEntry> {
        self.tenants.get(tenant)?.get(op_key)
    }

    /// A tenant's keys, for a change.
    fn keys_mut(&mut self, tenant: &str) -> &mut ShardedMap<LedgerEntry> {
        if !self.tenants.contains_key(tenant) {
            self.tenants
                .insert(tenant.to_owned(), ShardedMap::default());
        }
        self.tenants.get_mut(tenant).expect("inserted above")
    }

    pub(crate) fn start(
        &mut self,
        tenant: &str,
        op_key: &str,
        run: &str,
        call_id: &str,
        since_ms: u64,
    ) {
        self.keys_mut(tenant).insert(
            op_key.to_owned(),
            LedgerEntry::InFlight {
                run: run.to_owned(),
                call_id: call_id.to_owned(),
                since_ms,
            },
        );
    }

    /// A PENDING answer: the call is still running, its lease starts again.
    pub(crate) fn renew(&mut self, tenant: &str, op_key: &str, call_id: &str, at_ms: u64) {
        let entry = self
            .tenants
            .get_mut(tenant)
            .and_then(|keys| keys.get_mut(op_key));
        if let Some(LedgerEntry::InFlight {
            call_id: c,
            since_ms,
            ..
        }) = entry
        {
            if c == call_id && *since_ms < at_ms {
                *since_ms = at_ms;
            }
        }
    }

    pub(crate) fn complete(
        &mut self,
        tenant: &str,
        op_key: &str,
        run: &str,
        call_id: &str,
        result: String,
    ) {
        self.keys_mut(tenant).insert(
            op_key.to_owned(),
            LedgerEntry::Completed {
                run: run.to_owned(),
                call_id: call_id.to_owned(),
                result,
            },
        );
    }

    /// A non-SUCCESS answer frees the key for a retry, unless the key has meanwhile
    /// completed through another call (a SUCCESS is never undone).
    pub(crate) fn release(&mut self, tenant: &str, op_key: &str, call_id: &str) {
        if let Some(keys) = self.tenants.get_mut(tenant) {
            if matches!(keys.get(op_key), Some(LedgerEntry::InFlight { call_id: c, .. }) if c == call_id)
            {
                keys.remove(op_key);
            }
        }
    }

    /// An operator's `ledger_resolve`: the key completed with `result`, or freed. Returns
    /// what the key held before. A completed entry keeps the run and call it names: the
    /// operation's own, when it was in flight, else the resolving event's.
    pub(crate) fn resolve(
        &mut self,
        tenant: &str,
        op_key: &str,
        result: Option<String>,
        run: &str,
        event_id: &str,
    ) -> Option<LedgerEntry> {
        let before = self.get(tenant, op_key).cloned();
        match result {
            Some(result) => {
                let (run, call_id) = match &before {
                    Some(
                        LedgerEntry::InFlight { run, call_id, .. }
                        | LedgerEntry::Completed { run, call_id, .. },
                    ) => (run.clone(), call_id.clone()),
                    None => (run.to_owned(), event_id.to_owned()),
                };
                self.keys_mut(tenant).insert(
                    op_key.to_owned(),
                    LedgerEntry::Completed {
                        run,
                        call_id,
                        result,
                    },
                );
            }
            None => {
                self.forget(tenant, op_key);
            }
        }
        before
    }

    /// Takes what the shared ledger of a cluster (another daemon's runs) says about a
    /// key: an entry, or `None` when the key is free there. A completed operation is
    /// never replaced or freed (a SUCCESS is never undone); anything else is.
    pub(crate) fn adopt(&mut self, tenant: &str, op_key: &str, entry: Option<LedgerEntry>) {
        if matches!(
            self.get(tenant, op_key),
            Some(LedgerEntry::Completed { .. })
        ) {
            return;
        }
        match entry {
            Some(entry) => {
                self.keys_mut(tenant).insert(op_key.to_owned(), entry);
            }
            None => {
                self.forget(tenant, op_key);
            }
        }
    }

    /// Forgets one key (retention of very old operations). After this, the operation
    /// may run again: only the log's retention policy should call it.
    pub fn forget(&mut self, tenant: &str, op_key: &str) -> Option<LedgerEntry> {
        let keys = self.tenants.get_mut(tenant)?;
        let removed = keys.remove(op_key);
        if keys.is_empty() {
            self.tenants.remove(tenant);
        }
        removed
    }

    /// Every entry, for the log's ledger tree and operator inspection.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str, &LedgerEntry)> {
        self.tenants.iter().flat_map(|(tenant, keys)| {
            keys.iter()
                .map(move |(key, entry)| (tenant.as_str(), key, entry))
        })
    }

    pub fn len(&self) -> usize {
        self.tenants.values().map(|keys| keys.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn in_flight(run: &str) -> LedgerEntry {
        LedgerEntry::InFlight {
            run: run.to_owned(),
            call_id: "c".to_owned(),
            since_ms: 7,
        }
    }

    #[test]
    fn a_pending_answer_renews_only_its_own_call_and_only_forward() {
        let mut ledger = Ledger::default();
        ledger.start("t", "k", "r", "c", 100);
        ledger.renew("t", "k", "other-call", 500);
        ledger.renew("t", "k", "c", 50);
        assert!(matches!(
            ledger.get("t", "k"),
            Some(LedgerEntry::InFlight { since_ms: 100, .. })
        ));
        ledger.renew("t", "k", "c", 400);
        assert!(matches!(
            ledger.get("t", "k"),
            Some(LedgerEntry::InFlight { since_ms: 400, .. })
        ));
        ledger.complete("t", "k", "r", "c", "1".to_owned());
        ledger.renew("t", "k", "c", 900);
        assert!(matches!(
            ledger.get("t", "k"),
            Some(LedgerEntry::Completed { .. })
        ));
    }

    #[test]
    fn adopting_replaces_or_frees_anything_but_a_completed_operation() {
        let mut ledger = Ledger::default();
        ledger.adopt("t", "k", Some(in_flight("elsewhere")));
        assert_eq!(ledger.get("t", "k"), Some(&in_flight("elsewhere")));
        ledger.adopt("t", "k", None);
        assert!(ledger.is_empty());

        ledger.complete("t", "k", "r", "c", "{}".to_owned());
        let completed = ledger.get("t", "k").cloned();
        ledger.adopt("t", "k", Some(in_flight("elsewhere")));
        ledger.adopt("t", "k", None);
        assert_eq!(ledger.get("t", "k").cloned(), completed);
    }
}
