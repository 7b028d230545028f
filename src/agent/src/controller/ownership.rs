//! One owner per HCP. Two installations of the agent on one management cluster (two Helm
//! releases, say) would each put back what the other writes: hundreds of repairs a minute,
//! every record Pending, and nothing saying why. Each HCP's record names its owner (the
//! namespace of the agent that writes it, `spec.owner`); an installation that finds another
//! one's name there leaves the HCP alone while that installation's Lease is renewed, and says
//! so in its log, a Warning Event on the record, `hcp_fleet_hcps_owned_elsewhere` and its
//! `/readyz`. An owner whose Lease is gone or has not been renewed for a while (uninstalled
//! without its hook, its namespace deleted) is taken over by the next installation to look.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::runtime::events::{Event, EventType};
use tracing::warn;

use super::context::Context;
use super::io::cache;
use hcp_fleet_model::crd::AdmissionHealth;

/// How many lease durations (and a margin for clocks) an owner's Lease may go unrenewed
/// before its installation counts as gone.
const STALE_AFTER_DURATIONS: i64 = 2;
const CLOCK_MARGIN_SECONDS: i64 = 10;
/// How long an answer about an owner's Lease is kept: a thousand HCPs owned elsewhere cost
/// one read per owner per this.
const LOOK_AGAIN: Duration = Duration::from_secs(10);
/// How soon an HCP owned elsewhere is looked at again (its owner may go).
pub(super) const RECHECK: Duration = Duration::from_secs(15);

/// Whether the installation whose Lease this is lives at `now`: held by someone and renewed
/// within a few of its durations (the renewal is written by the owner's clock, hence the
/// margin).
pub(crate) fn lease_alive(lease: Option<&Lease>, now: jiff::Timestamp) -> bool {
    let Some(spec) = lease.and_then(|l| l.spec.as_ref()) else {
        return false;
    };
    if spec.holder_identity.as_deref().is_none_or(str::is_empty) {
        return false;
    }
    let Some(renewed) = spec.renew_time.as_ref().or(spec.acquire_time.as_ref()) else {
        return false;
    };
    let duration = i64::from(spec.lease_duration_seconds.unwrap_or(15).max(1));
    let age = now.as_second() - renewed.0.as_second();
    age <= duration * STALE_AFTER_DURATIONS + CLOCK_MARGIN_SECONDS
}

/// Whether the installation in `owner` lives (its answer kept a few seconds in the context);
/// an answer the server would not give (no right to read its Lease, say) is an error, which
/// counts as alive: two installations fighting is worse than one waiting for an SRE.
async fn alive(ctx: &Context, owner: &str) -> Result<bool, String> {
    let lock = || super::context::lock(&ctx.owner_leases);
    if let Some((at, answer)) = lock().get(owner)
        && at.elapsed() < LOOK_AGAIN
    {
        return answer.clone();
    }
    let api: Api<Lease> = Api::namespaced(ctx.client.clone(), owner);
    let answer = api
        .get_opt(hcp_fleet_model::names::LEASE_NAME)
        .await
        .map(|l| lease_alive(l.as_ref(), jiff::Timestamp::now()))
        .map_err(|e| format!("{}", crate::human::KubeError(&e)));
    lock().insert(owner.to_string(), (Instant::now(), answer.clone()));
    answer
}

/// The other installation that owns `ns` and lives, if one does; this installation then
/// drops what it held of the HCP and says so once.
pub(super) async fn owned_elsewhere(ctx: &Context, ns: &str, cluster: &str) -> Option<String> {
    if !ctx.caps.health_crd {
        return None;
    }
    let api: Api<AdmissionHealth> = Api::namespaced(ctx.client.clone(), ns);
    let store = ctx.caches().health;
    // A record that cannot be read is no claim: the reconcile reports that failure itself.
    let name = hcp_fleet_render::reporting::record::health_name(cluster);
    let record = cache::read(ctx, ns, &api, store.as_ref(), name)
        .await
        .ok()
        .flatten();
    let owner = record
        .as_ref()
        .and_then(|r| r.spec.owner.clone())
        .filter(|o| *o != ctx.agent_namespace);
    let Some(owner) = owner else {
        ctx.metrics.set_owned_elsewhere(ns, None);
        return None;
    };
    let why = match alive(ctx, &owner).await {
        Ok(false) => {
            warn!(owner = %owner, "the HCP's owner, another installation of the agent, has no live Lease; taking the HCP over");
            ctx.metrics.set_owned_elsewhere(ns, None);
            return None;
        }
        Ok(true) => format!(
            "HCP owned by the hcp-fleet-agent installation in namespace {owner} (its Lease {owner}/{} is renewed); this installation ({}) leaves it alone. Remove one of the two installations (docs/operations.md, \"One owner per HCP\")",
            hcp_fleet_model::names::LEASE_NAME,
            ctx.agent_namespace
        ),
        Err(e) => format!(
            "HCP owned by the hcp-fleet-agent installation in namespace {owner}, whose Lease this installation ({}) cannot read ({e}); it leaves the HCP alone",
            ctx.agent_namespace
        ),
    };
    // Nothing of the HCP is kept: its drift watch would repair what the owner writes, and
    // its row and series would count it twice in the fleet.
    ctx.drop_state(ns, cluster);
    if ctx.metrics.set_owned_elsewhere(ns, Some(&owner)) {
        warn!(owner = %owner, "{why}");
        if let Some(r) = &record {
            let ev = Event {
                type_: EventType::Warning,
                reason: "OwnedElsewhere".into(),
                note: Some(why.clone()),
                action: "Reconcile".into(),
                secondary: None,
            };
            if let Err(err) = ctx.publish(&ev, &kube::Resource::object_ref(r, &())).await {
                warn!(error = %crate::human::KubeError(&err), "publishing the OwnedElsewhere event failed");
            }
        }
    }
    Some(owner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    fn lease(holder: Option<&str>, renewed_ago: Option<i64>, duration: i32) -> Lease {
        let now = jiff::Timestamp::now().as_second();
        Lease {
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_string),
                lease_duration_seconds: Some(duration),
                renew_time: renewed_ago
                    .map(|a| MicroTime(jiff::Timestamp::from_second(now - a).expect("t"))),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn an_owner_lives_while_its_lease_is_held_and_renewed() {
        let now = jiff::Timestamp::now();
        assert!(lease_alive(Some(&lease(Some("a-1"), Some(5), 15)), now));
        // Two durations and the clock margin: 40 s for a 15 s lease.
        assert!(lease_alive(Some(&lease(Some("a-1"), Some(39), 15)), now));
        assert!(!lease_alive(Some(&lease(Some("a-1"), Some(42), 15)), now));
        // Released (uninstalled cleanly), never renewed, or no Lease at all: gone.
        assert!(!lease_alive(Some(&lease(Some(""), Some(1), 15)), now));
        assert!(!lease_alive(Some(&lease(None, Some(1), 15)), now));
        assert!(!lease_alive(Some(&lease(Some("a-1"), None, 15)), now));
        assert!(!lease_alive(None, now));
        assert!(!lease_alive(Some(&Lease::default()), now));
    }
}
