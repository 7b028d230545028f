//! Who may sync the agent's ACM template kind: the subjects of the chart's template-sync
//! ClusterRoleBinding, kept in step with every service account of ACM's framework addon on
//! this cluster.
//!
//! The template CRD carries ACM's `policy-type: template` label, so every framework-addon
//! instance lists the kind in its own namespace on each Policy reconcile
//! (governance-policy-framework-addon, `controllers/templatesync/template_sync.go`,
//! `cleanUpExcessTemplates`). Where ACM runs the addons in hosted mode there is one instance
//! per hosted cluster, in `klusterlet-<name>`, each with its own account; one of them without
//! the right ends every reconcile of that cluster's Policies, the SRE's others included, in
//! "forbidden". So the binding names every account of the addon's name, in whatever namespace
//! (a default-mode install, `klusterlet-*`, an AddOnDeploymentConfig's `agentInstallNamespace`),
//! as soon as it appears. The agent may update that one binding only, and bind that one role
//! only (chart RBAC).

use std::collections::BTreeSet;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, Subject};
use kube::api::{Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tracing::{info, warn};

/// The subjects the binding should have: one per account, sorted, without duplicates.
pub(crate) fn subjects(accounts: impl IntoIterator<Item = (String, String)>) -> Vec<Subject> {
    let set: BTreeSet<(String, String)> = accounts.into_iter().collect();
    set.into_iter()
        .map(|(namespace, name)| Subject {
            kind: "ServiceAccount".into(),
            name,
            namespace: Some(namespace),
            api_group: None,
        })
        .collect()
}

/// The running `keep` task; dropping it stops the task.
pub struct Keeper(tokio::task::JoinHandle<()>);

impl Drop for Keeper {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Starts `keep`.
pub fn spawn(client: Client, binding: String, account: String, always: Option<String>) -> Keeper {
    Keeper(tokio::spawn(keep(client, binding, account, always)))
}

/// Keeps `binding`'s subjects equal to the service accounts named `account` (in any
/// namespace), and the one in `always` whether it exists or not (the chart's own subject, which
/// the chart and ACM's ConfigurationPolicy, `musthave`, require), for as long as it runs. It
/// watches the binding too: whoever changes its subjects (an `oc apply` of the chart's
/// manifest, a Policy enforced as `mustonlyhave` by an older release of the generated
/// Policies), they are put back at once, one write per change. A write that fails (the binding
/// missing, RBAC) is logged and tried again at the next change of either.
pub(crate) async fn keep(client: Client, binding: String, account: String, always: Option<String>) {
    let accounts: Api<ServiceAccount> = Api::all(client.clone());
    let bindings: Api<ClusterRoleBinding> = Api::all(client);
    let (store, writer) = kube::runtime::reflector::store();
    let (bound, bound_writer) = kube::runtime::reflector::store();
    let by_name = |name: &str| watcher::Config::default().fields(&format!("metadata.name={name}"));
    let account_events = watcher(accounts, by_name(&account))
        .default_backoff()
        .reflect(writer)
        .map(|ev| seen(0, ev));
    let binding_events = watcher(bindings.clone(), by_name(&binding))
        .default_backoff()
        .reflect(bound_writer)
        .map(|ev| seen(1, ev));
    let mut events = futures::stream::select(account_events, binding_events).boxed();
    // Each watch's first listing done: only then do its store's contents say what is there.
    let mut listed = [false, false];
    while let Some(ev) = events.next().await {
        match ev {
            Ok(None) => continue,
            Ok(Some((from, done))) => {
                listed[from] |= done;
            }
            Err(e) => {
                warn!(error = %crate::human::WatchError(&e), "watching ACM's framework addon service accounts and the template-sync binding");
                continue;
            }
        }
        if !listed.iter().all(|l| *l) {
            continue;
        }
        let want = subjects(
            store
                .state()
                .iter()
                .map(|sa| (sa.namespace().unwrap_or_default(), sa.name_any()))
                .chain(always.iter().map(|ns| (ns.clone(), account.clone()))),
        );
        let Some(live) = bound.state().into_iter().next() else {
            // Not there (yet): the chart or the Policy makes it, and its watch event brings
            // the agent back here.
            continue;
        };
        if !differs(live.subjects.as_deref().unwrap_or_default(), &want) {
            continue;
        }
        let patch = serde_json::json!({"subjects": want});
        match bindings
            .patch(&binding, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                info!(binding = %binding, accounts = want.len(), "ACM template-sync access follows the framework addon's service accounts");
            }
            Err(e) => {
                warn!(error = %crate::human::KubeError(&e), binding = %binding, "updating the template-sync ClusterRoleBinding failed")
            }
        }
    }
}

/// Which of the keeper's watches (`from`) an event came from, and whether it ends a listing;
/// `None` for an event that changes nothing to look at (a listing's start or its items).
fn seen<K>(
    from: usize,
    ev: Result<watcher::Event<K>, watcher::Error>,
) -> Result<Option<(usize, bool)>, watcher::Error> {
    match ev {
        Ok(watcher::Event::InitDone) => Ok(Some((from, true))),
        Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_)) => Ok(Some((from, false))),
        Ok(_) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Do the live subjects differ from those wanted, order aside? (`subjects` sorts; someone
/// else may write them in any order, and that alone is no reason to write.)
pub(crate) fn differs(live: &[Subject], want: &[Subject]) -> bool {
    let key = |s: &Subject| {
        (
            s.kind.clone(),
            s.namespace.clone().unwrap_or_default(),
            s.name.clone(),
            s.api_group.clone().unwrap_or_default(),
        )
    };
    let live: BTreeSet<_> = live.iter().map(key).collect();
    let want: BTreeSet<_> = want.iter().map(key).collect();
    live != want
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_subject_per_account_sorted() {
        let s = subjects([
            (
                "klusterlet-b".to_string(),
                "governance-policy-framework-sa".to_string(),
            ),
            (
                "klusterlet-a".to_string(),
                "governance-policy-framework-sa".to_string(),
            ),
            (
                "klusterlet-a".to_string(),
                "governance-policy-framework-sa".to_string(),
            ),
        ]);
        let ns: Vec<_> = s.iter().filter_map(|s| s.namespace.clone()).collect();
        assert_eq!(ns, ["klusterlet-a", "klusterlet-b"]);
        assert!(
            s.iter()
                .all(|s| s.kind == "ServiceAccount" && s.api_group.is_none())
        );
    }

    #[test]
    fn subjects_differ_by_content_not_order() {
        let sa = |ns: &str| {
            (
                "klusterlet-".to_string() + ns,
                "governance-policy-framework-sa".to_string(),
            )
        };
        let want = subjects([sa("a"), sa("b")]);
        let mut reversed = want.clone();
        reversed.reverse();
        assert!(!differs(&reversed, &want));
        // What `mustonlyhave` left: the chart's one subject.
        assert!(differs(&want[..1], &want));
        // Someone else's subject added.
        let mut more = want.clone();
        more.extend(subjects([("default".into(), "intruder".into())]));
        assert!(differs(&more, &want));
    }
}
