//! The rollout controller: one task beside the HCP Controller, on the leader only. Every two
//! seconds it reads the fleet from the watches' stores (the HCPs, their health records, the
//! overrides, the rollout object itself), takes one `rollout::step`, writes the
//! `AdmissionRollout`'s status when it changed (a replace at the resourceVersion it read, so
//! two leaders can never both advance it), says what happened (Events, metrics, the fleet
//! report), and queues a reconcile of every HCP whose revision moved. The reconciles read the
//! assignment from `RolloutView`; nothing here writes an HCP's objects.
//!
//! Also here: which configuration one HCP runs (`Context::resolve`: its assigned revision and
//! its override) and its override's status.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, ObjectReference};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Resource, ResourceExt};
use tracing::{info, warn};

use super::Fillable;
use super::context::{AbortOnDrop, Context};
use crate::metrics::{RolloutLabels, RolloutStateLabels};
use hcp_fleet_model::crd::admission_rollout::{
    AdmissionRollout, AdmissionRolloutSpec, AdmissionRolloutStatus, HostedAdmissionOverride,
    RESUME_ANNOTATION, ROLLOUT_NAME, RolloutPhase,
};
use hcp_fleet_model::crd::{ComplianceState, HostedControlPlane};
use hcp_fleet_render::overrides;
use hcp_fleet_render::overrides::Resolved;
use hcp_fleet_render::rollout;
use hcp_fleet_render::rollout::{Health, Member, Revision, RolloutView, StepInput, Transition};

/// How often the rollout looks at the fleet. Reads are from stores; a write only on change.
const TICK: Duration = Duration::from_secs(2);

impl Context {
    /// The overrides in `ns`, by name (the first is the one in effect).
    pub(super) fn overrides_in(&self, ns: &str) -> Vec<Arc<HostedAdmissionOverride>> {
        self.overrides_by_namespace(Some(ns))
            .remove(ns)
            .unwrap_or_default()
    }

    /// The overrides of every namespace (or only `only`'s), each namespace's by name: one pass
    /// over the store, whatever the size of the fleet.
    fn overrides_by_namespace(
        &self,
        only: Option<&str>,
    ) -> HashMap<String, Vec<Arc<HostedAdmissionOverride>>> {
        let mut by: HashMap<String, Vec<Arc<HostedAdmissionOverride>>> = HashMap::new();
        for o in self.caches().overrides.iter().flat_map(|s| s.state()) {
            let Some(ns) = o.namespace() else { continue };
            if only.is_none_or(|n| n == ns) {
                by.entry(ns).or_default().push(o);
            }
        }
        by.values_mut()
            .for_each(|v| v.sort_by_key(|o| o.name_any()));
        by
    }

    /// What `ns` runs: its assigned revision (or its pin) with its override (the first of
    /// `ovs`, from `overrides_in`) applied.
    pub(super) fn resolve(&self, ns: &str, ovs: &[Arc<HostedAdmissionOverride>]) -> Resolved {
        let cfg = self.config();
        let view = self.rollout_view();
        let fleet = view.assigned(ns).unwrap_or_else(|| Revision::of(&cfg));
        overrides::resolve(
            &cfg,
            &fleet,
            |id| view.revision(id),
            ovs.first().map(|o| &o.spec),
        )
    }
}

/// Reads the rollout object (creating it if absent) before any HCP is reconciled, so a
/// restarted agent never hands out the configuration's revision ahead of the rollout. A new
/// object adopts the configuration's revision as stable here, before any HCP runs it: an HCP
/// never runs a revision the rollout does not hold, so a pin to it holds even when the
/// configuration moves on before the rollout's first step (it used to be adopted at that
/// step, and a change made before it lost the revision the HCPs had run). Without its CRD the
/// view stays empty: every HCP runs the configuration's revision.
pub(super) async fn init(ctx: &Context) {
    if !ctx.caps.rollout_crd {
        warn!(
            "the AdmissionRollout CRD ({}) is not installed; a new revision reaches every HCP at once",
            super::discovery::ROLLOUT_CRD
        );
        return;
    }
    let api: Api<AdmissionRollout> = Api::namespaced(ctx.client.clone(), &ctx.agent_namespace);
    let mut delay = Duration::from_millis(500);
    loop {
        match read_or_create(&api).await.map(|o| (o, ctx.config())) {
            Ok((obj, cfg)) => match adopt_if_new(&api, obj, &Revision::of(&cfg)).await {
                Ok(obj) => {
                    ctx.set_rollout_view(RolloutView::new(obj.status));
                    return;
                }
                Err(e) => {
                    warn!(error = %crate::human::KubeError(&e), namespace = %ctx.agent_namespace, "adopting the configuration's revision in the AdmissionRollout; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(30));
                }
            },
            Err(e) => {
                warn!(error = %crate::human::KubeError(&e), namespace = %ctx.agent_namespace, "reading the AdmissionRollout; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(30));
            }
        }
    }
}

/// `obj` with the configuration's revision adopted as stable, if it holds none yet (written at
/// the resourceVersion read: another replica that adopted first wins, and its object is read).
async fn adopt_if_new(
    api: &Api<AdmissionRollout>,
    obj: AdmissionRollout,
    desired: &Revision,
) -> Result<AdmissionRollout, kube::Error> {
    if obj.status.as_ref().is_some_and(|s| s.stable.is_some()) {
        return Ok(obj);
    }
    let now = jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let mut o = obj;
    o.status = Some(rollout::with_conditions(
        None,
        rollout::adopted(desired, &now),
        o.metadata.generation,
        &now,
        None,
    ));
    o.metadata.managed_fields = None;
    match api
        .replace_status(ROLLOUT_NAME, &PostParams::default(), &o)
        .await
    {
        Ok(written) => {
            info!(revision = %desired.id, "the configuration's revision adopted as the stable one");
            Ok(written)
        }
        Err(kube::Error::Api(s)) if s.code == 409 => api.get(ROLLOUT_NAME).await,
        Err(e) => Err(e),
    }
}

async fn read_or_create(api: &Api<AdmissionRollout>) -> Result<AdmissionRollout, kube::Error> {
    if let Some(o) = api.get_opt(ROLLOUT_NAME).await? {
        return Ok(o);
    }
    let fresh = AdmissionRollout::new(ROLLOUT_NAME, AdmissionRolloutSpec {});
    match api.create(&PostParams::default(), &fresh).await {
        Ok(o) => Ok(o),
        // Another replica (an old leader) made it first.
        Err(kube::Error::Api(s)) if s.code == 409 => api.get(ROLLOUT_NAME).await,
        Err(e) => Err(e),
    }
}

/// Runs the rollout until the controller stops.
pub(super) async fn run(ctx: Arc<Context>, hcps: Store<HostedControlPlane>) {
    let api: Api<AdmissionRollout> = Api::namespaced(ctx.client.clone(), &ctx.agent_namespace);
    let (store, fill) = Store::<AdmissionRollout>::with_filler();
    let _watch = AbortOnDrop(tokio::spawn(
        super::reflected(
            api.clone(),
            watcher::Config::default().fields(&format!("metadata.name={ROLLOUT_NAME}")),
            fill,
            &[],
            |_| {},
            |_| {},
        )
        .for_each(|ev| {
            if let Err(e) = ev {
                warn!(error = %crate::human::WatchError(&e), "watching the AdmissionRollout");
            }
            futures::future::ready(())
        }),
    ));
    let key = ObjectRef::new(ROLLOUT_NAME).within(&ctx.agent_namespace);
    // What this loop last wrote, and the resourceVersion it replaced: a store still showing
    // that one is one event behind, and the write stands for it.
    let mut last: Option<(Option<String>, AdmissionRollout)> = None;
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        // Until the HCPs are listed the fleet looks empty: no step on that. Asked afresh each
        // tick: a waiter parked on the Controller's store was seen never to be woken.
        match futures::FutureExt::now_or_never(hcps.wait_until_ready()) {
            Some(Ok(())) => {}
            Some(Err(_)) => return,
            None => continue,
        }
        let stored = store.get(&key).map(|o| (*o).clone());
        let obj = match (stored, &last) {
            (Some(s), Some((replaced, written))) if s.metadata.resource_version == *replaced => {
                written.clone()
            }
            (Some(s), _) => s,
            // Not watched yet (or deleted by hand: made again, adopting the configuration).
            (None, _) => match read_or_create(&api).await {
                Ok(o) => o,
                Err(e) => {
                    warn!(error = %crate::human::KubeError(&e), "reading the AdmissionRollout; trying again");
                    continue;
                }
            },
        };
        match once(&ctx, &api, &obj, &hcps).await {
            Ok(Some(written)) => last = Some((obj.metadata.resource_version.clone(), written)),
            Ok(None) => {}
            Err(e) => {
                last = None;
                warn!(error = %e, "rollout step; trying again");
            }
        }
    }
}

/// One look at the fleet, and one step.
async fn once(
    ctx: &Context,
    api: &Api<AdmissionRollout>,
    obj: &AdmissionRollout,
    hcps: &Store<HostedControlPlane>,
) -> Result<Option<AdmissionRollout>, kube::Error> {
    let cfg = ctx.config();
    let desired = Revision::of(&cfg);
    let prev = obj.status.as_ref();
    let starting = prev.is_some_and(|p| {
        p.stable.as_ref().map(|s| &s.revision) != Some(&desired.id)
            && p.target.as_ref().map(|t| &t.revision) != Some(&desired.id)
    });
    // The namespaces' labels matter only when a rollout starts (the canaries are fixed then).
    let canary_namespaces = if starting {
        canary_namespaces(ctx, &cfg.rollout.canary_selector).await?
    } else {
        BTreeSet::new()
    };
    let now = jiff::Timestamp::now();
    let overrides = ctx.overrides_by_namespace(None);
    let members = members(
        ctx,
        hcps,
        &overrides,
        &cfg.rollout.canary_selector,
        &canary_namespaces,
        now,
    );
    let pinned: BTreeSet<String> = overrides
        .values()
        .flatten()
        .filter_map(|o| o.spec.revision.clone())
        .collect();
    let resume = obj.annotations().get(RESUME_ANNOTATION).cloned();
    let now_text = now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    let (next, transitions) = rollout::step(
        prev,
        &StepInput {
            desired: &desired,
            cfg: &cfg.rollout,
            members: &members,
            resume: resume.as_deref(),
            pinned: &pinned,
            now: &now_text,
            now_secs: now.as_second(),
        },
    );
    let refused = ctx.config_refused();
    let next = rollout::with_conditions(
        prev,
        next,
        obj.metadata.generation,
        &now_text,
        refused.as_deref(),
    );
    let mut written = obj.clone();
    let changed = prev != Some(&next);
    if changed {
        let mut o = obj.clone();
        o.status = Some(next.clone());
        o.metadata.managed_fields = None;
        // At the resourceVersion read: a second leader's step is refused (409), not merged.
        written = api
            .replace_status(ROLLOUT_NAME, &PostParams::default(), &o)
            .await?;
    }
    if resume.is_some() && next.phase != RolloutPhase::Halted {
        // Acted on (or nothing to resume): a later halt must not find it still set.
        let patch = serde_json::json!({"metadata": {"annotations": {RESUME_ANNOTATION: null}}});
        api.patch(ROLLOUT_NAME, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    let before = ctx.rollout_view();
    // The view parses every revision it holds: rebuilt only when the state moved.
    if before.status != written.status {
        ctx.set_rollout_view(RolloutView::new(written.status.clone()));
        let after = ctx.rollout_view();
        // Every HCP whose revision moved reconciles now, not at its next event. Adopting the
        // configuration's revision as the first stable one moves none: a reconcile for nothing
        // would sit in the HCP's queue ahead of the next real event (an outage's, say).
        // An override is checked against the revisions the rollout holds: when that set
        // moves, every HCP with an override is looked at again, or a pin refused a moment ago
        // would stay refused until something else touched its HCP.
        let config = Revision::of(&ctx.config()).id;
        let held_moved = !before.holds_the_same(&after);
        for h in hcps.state() {
            let ns = h.namespace().unwrap_or_default();
            let id = |v: &RolloutView| v.assigned(&ns).map_or_else(|| config.clone(), |r| r.id);
            if id(&before) != id(&after) || (held_moved && overrides.contains_key(&ns)) {
                let _ = ctx.requeue.send(ObjectRef::from_obj(h.as_ref()));
            }
        }
    }
    tell(ctx, &written, &transitions, hcps).await;
    gauges(ctx, &next, &members);
    Ok(changed.then_some(written))
}

/// Namespaces whose labels the canary selector matches (one list, only when a rollout starts).
async fn canary_namespaces(
    ctx: &Context,
    sel: &hcp_fleet_guards::catalogue::LabelSelector,
) -> Result<BTreeSet<String>, kube::Error> {
    if sel.match_labels.is_empty() && sel.match_expressions.is_empty() {
        return Ok(BTreeSet::new());
    }
    let lp = ListParams::default().labels(&selector_query(sel));
    let list = Api::<Namespace>::all(ctx.client.clone())
        .list_metadata(&lp)
        .await?;
    Ok(list.items.iter().map(|n| n.name_any()).collect())
}

/// A selector in the API's query form.
fn selector_query(sel: &hcp_fleet_guards::catalogue::LabelSelector) -> String {
    let mut parts: Vec<String> = sel
        .match_labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    for e in &sel.match_expressions {
        parts.push(match e.operator.as_str() {
            "In" => format!("{} in ({})", e.key, e.values.join(",")),
            "NotIn" => format!("{} notin ({})", e.key, e.values.join(",")),
            "DoesNotExist" => format!("!{}", e.key),
            _ => e.key.clone(),
        });
    }
    parts.join(",")
}

/// Every HCP as the rollout sees it.
fn members(
    ctx: &Context,
    hcps: &Store<HostedControlPlane>,
    overrides: &HashMap<String, Vec<Arc<HostedAdmissionOverride>>>,
    canary: &hcp_fleet_guards::catalogue::LabelSelector,
    canary_namespaces: &BTreeSet<String>,
    now: jiff::Timestamp,
) -> BTreeMap<String, Member> {
    let records: HashMap<String, Arc<hcp_fleet_model::crd::AdmissionHealth>> = ctx
        .caches()
        .health
        .iter()
        .flat_map(|s| s.state())
        .filter_map(|h| Some((h.namespace()?, h)))
        .collect();
    hcps.state()
        .iter()
        .filter_map(|h| {
            let ns = h.namespace()?;
            // As the HCP's reconcile reads its override: a refused pin holds nothing back.
            let held = overrides.get(&ns).is_some_and(|ovs| {
                let r = ctx.resolve(&ns, ovs);
                r.paused || r.pinned
            });
            let paused = h.pause(now).holds();
            let health = records
                .get(&ns)
                .and_then(|r| r.status.as_ref())
                .map(|s| Health {
                    revision: s.revision.clone(),
                    verdict: s.compliant,
                    ready_for: s
                        .revision_ready_since
                        .as_deref()
                        .and_then(|t| t.parse::<jiff::Timestamp>().ok())
                        .map(|t| now.as_second() - t.as_second()),
                    reason: s
                        .concerns
                        .iter()
                        .find(|c| c.compliant != Some(ComplianceState::Compliant))
                        .map(|c| {
                            let m = c.history.first().map(|e| e.message.as_str()).unwrap_or("");
                            format!("{}: {m}", c.name)
                        })
                        .unwrap_or_default(),
                    attributable: s
                        .concerns
                        .iter()
                        .filter(|c| c.compliant == Some(ComplianceState::NonCompliant))
                        .any(|c| {
                            let m = c.history.first().map(|e| e.message.as_str()).unwrap_or("");
                            rollout::attributable(&c.name, m)
                        }),
                })
                .unwrap_or_default();
            Some((
                ns.clone(),
                Member {
                    eligible: h.is_ready() && !paused && !held && !ctx.is_deleted(h),
                    canary: rollout::selects(canary, h.labels()) || canary_namespaces.contains(&ns),
                    health,
                },
            ))
        })
        .collect()
}

/// Events and logs for what the step did: on the rollout object, and on the HCPs it names.
async fn tell(
    ctx: &Context,
    obj: &AdmissionRollout,
    transitions: &[Transition],
    hcps: &Store<HostedControlPlane>,
) {
    let reference = obj.object_ref(&());
    for t in transitions {
        let (warning, reason, note, hcp) = match t {
            Transition::Adopted { revision } => (
                false,
                "Adopted",
                format!("revision {revision} adopted as the stable revision"),
                None,
            ),
            Transition::Started { revision, canaries } => (
                false,
                "Started",
                format!("rolling out revision {revision}: {canaries} canary HCP(s) first"),
                None,
            ),
            Transition::Cancelled { revision } => (
                false,
                "Cancelled",
                format!(
                    "revision {revision} cancelled: the configuration is back on the stable revision"
                ),
                None,
            ),
            Transition::Batch { wave, hcps } => {
                (false, "Batch", format!("{wave}: {}", hcps.join(", ")), None)
            }
            Transition::Done { .. } => continue,
            Transition::Excused { namespace, reason } => (
                true,
                "NotHeldAgainst",
                format!("{namespace}: {reason}; it keeps the new revision and the rollout goes on"),
                Some(namespace.clone()),
            ),
            Transition::Failed { namespace, reason } => (
                true,
                "RevisionFailed",
                format!("{namespace}: {reason}; back on the stable revision"),
                Some(namespace.clone()),
            ),
            Transition::Halted { revision, reason } => {
                ctx.metrics.rollout_halts.inc();
                (
                    true,
                    "Halted",
                    format!("revision {revision} halted: {reason}"),
                    None,
                )
            }
            Transition::Resumed { revision } => (
                false,
                "Resumed",
                format!("revision {revision} resumed by an operator"),
                None,
            ),
            Transition::Completed { revision } => (
                false,
                "Completed",
                format!("revision {revision} reached every HCP"),
                None,
            ),
        };
        if warning {
            warn!(reason, note = %note, "rollout");
        } else {
            info!(reason, note = %note, "rollout");
        }
        let target = hcp
            .as_deref()
            .and_then(|ns| hcps.find(|h| h.metadata.namespace.as_deref() == Some(ns)))
            .map(|h| h.object_ref(&()));
        for r in std::iter::once(&reference).chain(target.as_ref()) {
            publish(ctx, r, warning, reason, &note).await;
        }
    }
    // The fleet report on the hub says it too (`acm::hub::template_reporter`).
    let halt = (obj.status.as_ref().map(|s| s.phase) == Some(RolloutPhase::Halted)).then(|| {
        obj.status
            .as_ref()
            .map(|s| s.message.clone())
            .unwrap_or_default()
    });
    if ctx.set_rollout_halt(halt) {
        ctx.rollup_changed.notify_one();
    }
}

async fn publish(ctx: &Context, r: &ObjectReference, warning: bool, reason: &str, note: &str) {
    let ev = Event {
        type_: if warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: format!("Rollout{reason}"),
        note: Some(hcp_fleet_render::reporting::event_note(note)),
        action: "Rollout".into(),
        secondary: None,
    };
    if let Err(e) = ctx.publish(&ev, r).await {
        warn!(error = %crate::human::KubeError(&e), "publishing a rollout Event");
    }
}

fn gauges(ctx: &Context, st: &AdmissionRolloutStatus, members: &BTreeMap<String, Member>) {
    let m = &ctx.metrics;
    m.rollout.clear();
    m.rollout
        .get_or_create(&RolloutLabels {
            stable: st
                .stable
                .as_ref()
                .map(|s| s.revision.clone())
                .unwrap_or_default(),
            target: st
                .target
                .as_ref()
                .map(|s| s.revision.clone())
                .unwrap_or_default(),
            phase: st.phase.as_str().into(),
        })
        .set(1);
    m.rollout_halted
        .set(i64::from(st.phase == RolloutPhase::Halted));
    let eligible = members.values().filter(|m| m.eligible).count();
    let waiting = if st.target.is_some() {
        eligible.saturating_sub(st.in_flight.len() + st.done.len() + st.failed.len())
    } else {
        0
    };
    for (state, n) in [
        ("in_flight", st.in_flight.len()),
        ("done", st.done.len()),
        ("failed", st.failed.len()),
        ("waiting", waiting),
    ] {
        m.rollout_hcps
            .get_or_create(&RolloutStateLabels {
                state: state.into(),
            })
            .set(n as i64);
    }
}

/// Writes what `ns`'s overrides' statuses should say, where they say something else: the first
/// by name is the one in effect, any other is refused.
pub(super) async fn report_overrides(
    ctx: &Context,
    ns: &str,
    cluster: &str,
    ovs: &[Arc<HostedAdmissionOverride>],
    resolved: &Resolved,
) {
    ctx.metrics
        .set_override(ns, cluster, resolved.verdict.as_ref().map(|v| v.accepted));
    let now = jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    for (i, o) in ovs.iter().enumerate() {
        let (verdict, reason) = match (&resolved.verdict, i) {
            (Some(v), 0) => (v.clone(), if v.accepted { "Accepted" } else { "Refused" }),
            _ => (
                overrides::Verdict {
                    accepted: false,
                    message: format!(
                        "refused: one HostedAdmissionOverride per HCP namespace; {} is in \
                         effect: merge this one into it and delete this one",
                        ovs[0].name_any()
                    ),
                },
                overrides::DUPLICATE,
            ),
        };
        let want = overrides::status(
            o.status.as_ref(),
            &verdict,
            reason,
            &resolved.revision,
            o.metadata.generation,
            &now,
        );
        if o.status.as_ref() == Some(&want) {
            continue;
        }
        let api: Api<HostedAdmissionOverride> = Api::namespaced(ctx.client.clone(), ns);
        let patch = serde_json::json!({ "status": want });
        if let Err(e) = api
            .patch_status(
                &o.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            warn!(error = %crate::human::KubeError(&e), name = o.name_any(), "writing a HostedAdmissionOverride's status");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hcp_fleet_guards::catalogue::{LabelSelector, LabelSelectorRequirement};

    #[test]
    fn a_selector_reads_as_the_api_query_form() {
        let sel = LabelSelector {
            match_labels: BTreeMap::from([("wave".into(), "canary".into())]),
            match_expressions: vec![
                LabelSelectorRequirement {
                    key: "tier".into(),
                    operator: "In".into(),
                    values: vec!["a".into(), "b".into()],
                },
                LabelSelectorRequirement {
                    key: "skip".into(),
                    operator: "DoesNotExist".into(),
                    values: vec![],
                },
            ],
        };
        assert_eq!(selector_query(&sel), "wave=canary,tier in (a,b),!skip");
    }
}
