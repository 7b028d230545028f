//! The hosted clusters the health records claim, by the cluster's UID: what
//! `hosted_access::claim` asks of the whole fleet's records for every hosted client it builds
//! ("does another HCP namespace's record claim this cluster?"). Asked of the records one by
//! one, each HCP's first reconcile after a restart read every HCP's record: 9 million
//! comparisons at 3,000 HCPs, a thirtieth of the restarted agent's CPU (`make bench`, the scale
//! benchmark, perf), and growing with the square of the fleet.
//!
//! Kept from the same watch events as the records' store, taken before the store takes them:
//! once the store says it has listed, so has this, and it is never behind the store. The
//! records are kept as `cache::Relisted` keeps a watch's objects: a (re)listing swapped in whole
//! when it completes, as the store does, so a record deleted while the watch was down is not
//! kept.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Mutex, PoisonError};

use hcp_fleet_model::crd::AdmissionHealth;
use kube::runtime::watcher::Event;

use super::cache::{Relisted, Took};

/// A record: its namespace and name.
type Key = (String, String);

#[derive(Debug, Default)]
pub(crate) struct Claims(Mutex<Index>);

#[derive(Debug, Default)]
struct Index {
    /// Each record and the cluster it claims (`None`: none), relisted as the store is.
    records: Relisted<Key, Option<String>>,
    /// `records` the other way round: the records that claim each cluster.
    by_uid: HashMap<String, BTreeSet<Key>>,
}

impl Claims {
    /// Takes one event of the records' watch.
    pub(crate) fn take(&self, event: &Event<AdmissionHealth>) {
        let mut index = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let Index { records, by_uid } = &mut *index;
        let took = records.apply(event, |h| {
            let key = (
                h.metadata.namespace.clone().unwrap_or_default(),
                h.metadata.name.clone().unwrap_or_default(),
            );
            (key, h.spec.claimed_uid().map(str::to_string))
        });
        match took {
            Took::Nothing => {}
            Took::Listed(_) => {
                by_uid.clear();
                for (k, uid) in records.held().into_iter().flatten() {
                    if let Some(uid) = uid {
                        by_uid.entry(uid.clone()).or_default().insert(k.clone());
                    }
                }
            }
            Took::Put(k, was) => {
                unclaim(by_uid, &k, was);
                if let Some(Some(uid)) = records.held().and_then(|h| h.get(&k)) {
                    by_uid.entry(uid.clone()).or_default().insert(k);
                }
            }
            Took::Removed(k, was) => unclaim(by_uid, &k, was),
        }
    }

    /// The HCP namespaces other than `ns` whose records claim the hosted cluster `uid`.
    pub(crate) fn others(&self, uid: &str, ns: &str) -> Vec<String> {
        let index = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let namespaces: BTreeSet<&String> = index
            .by_uid
            .get(uid)
            .into_iter()
            .flatten()
            .map(|(n, _)| n)
            .filter(|n| n.as_str() != ns)
            .collect();
        namespaces.into_iter().cloned().collect()
    }
}

/// `key` no longer claims what it claimed (`was`).
fn unclaim(by_uid: &mut HashMap<String, BTreeSet<Key>>, key: &Key, was: Option<Option<String>>) {
    let Some(Some(uid)) = was else {
        return;
    };
    if let Some(keys) = by_uid.get_mut(&uid) {
        keys.remove(key);
        if keys.is_empty() {
            by_uid.remove(&uid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hcp_fleet_model::crd::AdmissionHealthSpec;

    fn record(ns: &str, uid: Option<&str>) -> AdmissionHealth {
        let mut h = AdmissionHealth::new(
            "admission-health",
            AdmissionHealthSpec {
                hosted_cluster_uid: uid.map(str::to_string),
                ..AdmissionHealthSpec::default()
            },
        );
        h.metadata.namespace = Some(ns.to_string());
        h
    }

    fn legacy(ns: &str, uid: &str) -> AdmissionHealth {
        let mut h = record(ns, None);
        h.spec.legacy_hosted_cluster_uid = Some(uid.to_string());
        h
    }

    /// What the store holds, asked of it record by record as `claim` did: the answer `others`
    /// must give.
    fn scanned(records: &[AdmissionHealth], uid: &str, ns: &str) -> Vec<String> {
        let found: BTreeSet<String> = records
            .iter()
            .filter(|h| h.spec.claimed_uid() == Some(uid))
            .filter_map(|h| h.metadata.namespace.clone())
            .filter(|n| n != ns)
            .collect();
        found.into_iter().collect()
    }

    #[test]
    fn the_index_answers_as_a_scan_of_the_records_would() {
        let claims = Claims::default();
        let mut records = vec![
            record("clusters-a", Some("uid-1")),
            record("clusters-b", Some("uid-1")),
            legacy("clusters-c", "uid-2"),
            record("clusters-d", None),
        ];
        claims.take(&Event::Init);
        for r in &records {
            claims.take(&Event::InitApply(r.clone()));
        }
        // Nothing until the listing completes.
        assert!(claims.others("uid-1", "clusters-x").is_empty());
        claims.take(&Event::InitDone);
        let ask = |claims: &Claims, records: &[AdmissionHealth]| {
            for uid in ["uid-1", "uid-2", "uid-3"] {
                for ns in ["clusters-a", "clusters-b", "clusters-c", "clusters-x"] {
                    assert_eq!(
                        claims.others(uid, ns),
                        scanned(records, uid, ns),
                        "{uid} from {ns}"
                    );
                }
            }
        };
        ask(&claims, &records);
        assert_eq!(claims.others("uid-1", "clusters-a"), ["clusters-b"]);
        assert_eq!(claims.others("uid-2", "clusters-x"), ["clusters-c"]);

        // A record that claims another cluster, a record that claims none any more, a new
        // record, a deleted one.
        records[0] = record("clusters-a", Some("uid-3"));
        claims.take(&Event::Apply(records[0].clone()));
        records[1] = record("clusters-b", None);
        claims.take(&Event::Apply(records[1].clone()));
        records.push(record("clusters-e", Some("uid-2")));
        claims.take(&Event::Apply(records[4].clone()));
        let gone = records.remove(2);
        claims.take(&Event::Delete(gone));
        ask(&claims, &records);
        assert!(claims.others("uid-1", "clusters-x").is_empty());

        // A relisting replaces what is held: a record deleted while the watch was down goes.
        let relisted = vec![record("clusters-a", Some("uid-3"))];
        claims.take(&Event::Init);
        for r in &relisted {
            claims.take(&Event::InitApply(r.clone()));
        }
        // The old answers hold until the relisting completes.
        assert_eq!(claims.others("uid-2", "clusters-x"), ["clusters-e"]);
        claims.take(&Event::InitDone);
        ask(&claims, &relisted);
        assert!(claims.others("uid-2", "clusters-x").is_empty());
    }
}
