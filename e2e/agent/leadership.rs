//! Replicas and the Lease: one leads, a standby takes over, a dead or partitioned leader steps down.

use super::*;

/// Two agent processes with leader election: exactly one reconciles; kill it and the other
/// takes over within the lease duration and repairs drift.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_one_leader_and_a_takeover() {
    let (fleet, mgmt, _pods) = support::fleet_with_pods(2).await;
    let lease_seconds = 10u64;
    let mut agents = Vec::new();
    for name in ["agent-a", "agent-b"] {
        let (child, addr) = support::spawn_elected_agent(
            name,
            &fleet.management.kubeconfig_path,
            AGENT_NS,
            Some(lease_seconds),
        );
        agents.push((name, child, addr));
    }
    wait_compliant(&mgmt, &["hc-1", "hc-2"]).await;

    // Exactly one holds the lease and reconciles; the other only waits. Three processes cannot
    // be read at one instant, so a snapshot counts only when the Lease is the same (holder and
    // renewal count) before and after the agents' gauges are read.
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(mgmt.clone(), AGENT_NS);
    let lease_state = || async {
        let spec = leases.get("hcp-fleet-agent").await.ok()?.spec?;
        Some((spec.holder_identity?, spec.lease_transitions.unwrap_or(0)))
    };
    let mut snapshot = None;
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = String::new();
    while snapshot.is_none() && Instant::now() < deadline {
        let before = lease_state().await;
        let mut gauges = Vec::new();
        for (name, _, addr) in &agents {
            let (_, body) = support::http_get(*addr, "/metrics").await.expect("metrics");
            let leader = metric(&body, "hcp_fleet_leader").unwrap_or(-1.0);
            let count = metric(&body, "hcp_fleet_reconcile_duration_seconds_count").unwrap_or(0.0);
            gauges.push((*name, leader, count));
        }
        let after = lease_state().await;
        last = format!("lease {before:?} then {after:?}, gauges {gauges:?}");
        match (before, after) {
            (Some(b), Some(a)) if a == b => snapshot = Some((a.0, a.1, gauges)),
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    let Some((holder, transitions, gauges)) = snapshot else {
        panic!("no consistent snapshot of the Lease and the agents: {last}");
    };
    for (name, leader, _) in &gauges {
        assert_eq!(
            *leader == 1.0,
            *name == holder,
            "{name}: leader={leader} holder={holder} ({last})"
        );
    }
    let (standby_name, _, standby_count) = *gauges
        .iter()
        .find(|(name, _, _)| *name != holder)
        .expect("a standby");
    assert!(
        gauges.iter().any(|(n, _, c)| *n == holder && *c > 0.0),
        "the leader reconciled: {gauges:?}"
    );
    if transitions == 0 {
        // The lease never changed hands, so the standby never led.
        assert_eq!(standby_count, 0.0, "the standby wrote nothing: {gauges:?}");
    }
    // And whatever it once did, a standby does nothing while it stands by.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let standby_addr = agents
        .iter()
        .find(|(n, _, _)| *n == standby_name)
        .map(|(_, _, a)| *a)
        .expect("standby");
    let (_, body) = support::http_get(standby_addr, "/metrics")
        .await
        .expect("metrics");
    if lease_state().await.map(|l| l.0).as_deref() == Some(holder.as_str()) {
        assert_eq!(
            metric(&body, "hcp_fleet_reconcile_duration_seconds_count").unwrap_or(0.0),
            standby_count,
            "{standby_name} reconciled while standing by"
        );
    }

    // Kill the leader without letting it release the lease, then drift a hosted cluster.
    let idx = agents
        .iter()
        .position(|(n, _, _)| *n == holder)
        .expect("leader");
    let (_, leader, _) = agents.remove(idx);
    drop(leader);
    let killed = Instant::now();
    let vapi = delete_validating(&fleet, "hc-1").await;
    let bound = Duration::from_secs(lease_seconds + 10);
    eventually(
        "the standby took over and repaired the drift",
        bound,
        || vapi.present(),
    )
    .await;
    let takeover = killed.elapsed();
    let (standby, _child, addr) = agents.remove(0);
    let (_, body) = support::http_get(addr, "/metrics").await.expect("metrics");
    assert_eq!(
        metric(&body, "hcp_fleet_leader"),
        Some(1.0),
        "{standby} leads now"
    );
    let holder = leases
        .get("hcp-fleet-agent")
        .await
        .expect("lease")
        .spec
        .and_then(|s| s.holder_identity);
    assert_eq!(holder.as_deref(), Some(standby));
    eprintln!(
        "leader killed -> drift repaired by the standby in {takeover:?} (lease {lease_seconds}s)"
    );
}

/// A leader whose controller dies (the test-only hook ends it as a panic would) does not sit on
/// the Lease: `/healthz` fails at once, the process hands the Lease back and exits non-zero,
/// and the standby leads within the lease duration plus 5 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_controller_dies_hands_over_and_exits() {
    let (fleet, mgmt, _pods) = support::fleet_with_pods(1).await;
    // In this process first: what /healthz says of an ended controller.
    {
        let agent = start_agent(&mgmt, AgentConfig::default()).await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let _server = agent::serve(listener, agent.context.metrics.clone());
        wait_compliant(&mgmt, &["hc-1"]).await;
        assert_eq!(
            support::http_get(addr, "/healthz").await.map(|r| r.0),
            Ok(200)
        );
        agent.kill_controller();
        eventually("/healthz fails", Duration::from_secs(5), || async {
            match support::http_get(addr, "/healthz").await? {
                (503, body) if body.contains("the controller has ended") => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
    }
    let lease_seconds = 10u64;
    let hook = [("HCP_FLEET_TEST_HOOKS".to_string(), "1".to_string())];
    let mut agents: Vec<_> = ["agent-a", "agent-b"]
        .into_iter()
        .map(|name| {
            let (child, addr) = support::spawn_elected_agent_env(
                name,
                &fleet.management.kubeconfig_path,
                AGENT_NS,
                Some(lease_seconds),
                &hook,
            );
            (name, child, addr)
        })
        .collect();
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(mgmt.clone(), AGENT_NS);
    let holder = || async {
        leases
            .get("hcp-fleet-agent")
            .await
            .ok()
            .and_then(|l| l.spec?.holder_identity)
            .filter(|h| !h.is_empty())
    };
    let leading = |h: Option<String>| {
        let h = h?;
        let addr = agents
            .iter()
            .find(|(n, _, _)| *n == h)
            .map(|(_, _, a)| *a)?;
        Some((h, addr))
    };
    eventually("one agent leads", Duration::from_secs(30), || async {
        match leading(holder().await) {
            Some((_, a)) if leader_gauge(a).await == Some(1.0) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let (leader, _) = leading(holder().await).expect("the leader");
    let idx = agents
        .iter()
        .position(|(n, _, _)| *n == leader)
        .expect("leader");
    let (_, mut child, _) = agents.remove(idx);
    let (standby, _standby_child, standby_addr) = agents.remove(0);
    let killed = Instant::now();
    let status = std::process::Command::new("kill")
        .args(["-USR2", &child.0.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let exited = tokio::task::spawn_blocking(move || child.0.wait())
        .await
        .expect("join")
        .expect("wait");
    assert_eq!(
        exited.code(),
        Some(1),
        "the leader exits non-zero: {exited:?}"
    );
    eventually(
        "the standby leads",
        Duration::from_secs(lease_seconds + 5),
        || async {
            match (holder().await, leader_gauge(standby_addr).await) {
                (Some(h), Some(g)) if h == standby && g == 1.0 => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    eprintln!(
        "controller ended -> leader exited {exited:?}, {standby} leads {:?} after the hook",
        killed.elapsed()
    );
}

pub(crate) async fn leader_gauge(addr: std::net::SocketAddr) -> Option<f64> {
    let (_, body) = support::http_get(addr, "/metrics").await.ok()?;
    metric(&body, "hcp_fleet_leader")
}

/// Replicas that start at the same instant on a free Lease never both lead: the API server
/// refuses the later of two takes (each replica is its own field manager) instead of applying
/// it over the first, which would leave both leading until the loser's next renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_starting_together_never_both_lead() {
    use k8s_openapi::api::coordination::v1::Lease;
    let fleet = LocalFleet::start(FleetOptions::with_hosted(0))
        .await
        .expect("fleet");
    let mgmt = fleet.management.client().await.expect("client");
    let leases: Api<Lease> = Api::namespaced(mgmt.clone(), "default");
    let names = ["replica-a", "replica-b", "replica-c"];
    for round in 0..6 {
        let managers = futures::future::join_all(
            names.map(|n| agent::lease_manager(mgmt.clone(), "default", n, 10)),
        )
        .await;
        let watches = futures::future::join_all(
            managers
                .into_iter()
                .map(|m| m.expect("lease manager").watch()),
        )
        .await;
        // Long enough for every first take and its read-back; well short of the renewal
        // (half the 10 s lease) at which a replica leading by mistake would find out.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let holder = leases
            .get(hcp_fleet_model::names::LEASE_NAME)
            .await
            .expect("lease")
            .spec
            .and_then(|s| s.holder_identity);
        let leading: Vec<&str> = names
            .iter()
            .zip(&watches)
            .filter(|(_, (rx, _))| *rx.borrow())
            .map(|(n, _)| *n)
            .collect();
        assert_eq!(
            leading,
            holder.as_deref().into_iter().collect::<Vec<_>>(),
            "round {round}: who believes it leads, and the Lease's holder"
        );
        // Dropping a receiver releases the lease; then start again from no Lease at all.
        let tasks: Vec<_> = watches.into_iter().map(|(_, task)| task).collect();
        for t in tasks {
            let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
        }
        leases
            .delete(hcp_fleet_model::names::LEASE_NAME, &DeleteParams::default())
            .await
            .expect("delete the lease");
    }
}

/// A leader cut off from the API server (a black hole, not a refusal) hears nothing from
/// its lease manager; it must stop writing on its own before its lease can expire, so the
/// standby that takes over never writes beside it. Healed, it stays a standby.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_leader_stops_before_the_standby_takes_over() {
    let (fleet, mgmt, _pods) = support::fleet_with_pods(1).await;
    let upstream: std::net::SocketAddr = fleet
        .management
        .url()
        .trim_start_matches("https://")
        .parse()
        .expect("management address");
    let relay = support::Relay::start(upstream).await;
    let dir = tempfile::tempdir().expect("tmp");
    let relayed = dir.path().join("relayed.kubeconfig");
    std::fs::write(
        &relayed,
        fleet
            .management
            .kubeconfig_yaml
            .replace(&fleet.management.url(), &format!("https://{}", relay.addr)),
    )
    .expect("kubeconfig");
    let lease_seconds = 10u64;
    let spawn = |name: &str, kubeconfig: &std::path::Path| {
        support::spawn_elected_agent(name, kubeconfig, AGENT_NS, Some(lease_seconds))
    };
    // A leads, through the relay; B waits, directly connected.
    let (_a, a_addr) = spawn("agent-a", &relayed);
    eventually("agent-a leads", Duration::from_secs(30), || async move {
        match leader_gauge(a_addr).await {
            Some(1.0) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let (_b, b_addr) = spawn("agent-b", &fleet.management.kubeconfig_path);
    wait_compliant(&mgmt, &["hc-1"]).await;
    assert_eq!(leader_gauge(b_addr).await, Some(0.0), "agent-b waits");

    let cut = Instant::now();
    relay.cut();
    let (mut a_stopped, mut b_leads) = (None, None);
    while (a_stopped.is_none() || b_leads.is_none())
        && cut.elapsed() < Duration::from_secs(lease_seconds * 3)
    {
        if a_stopped.is_none() && leader_gauge(a_addr).await == Some(0.0) {
            a_stopped = Some(cut.elapsed());
        }
        if b_leads.is_none() && leader_gauge(b_addr).await == Some(1.0) {
            b_leads = Some(cut.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let a_stopped = a_stopped.expect("the partitioned leader stopped writing");
    let b_leads = b_leads.expect("the standby took over");
    eprintln!(
        "partition: leader stopped after {a_stopped:?}, standby led after {b_leads:?} (lease {lease_seconds}s)"
    );
    assert!(
        a_stopped < Duration::from_secs(lease_seconds),
        "stopped within the lease duration: {a_stopped:?}"
    );
    assert!(
        a_stopped < b_leads,
        "the old leader stopped ({a_stopped:?}) before the standby led ({b_leads:?})"
    );
    let (_, body) = support::http_get(a_addr, "/metrics")
        .await
        .expect("metrics");
    assert!(
        !body.contains("hcp_fleet_hosted_cluster_compliance{"),
        "a replica that stopped leading reports no stale verdicts:\n{body}"
    );

    // The new leader repairs drift; the old one, healed, stays a standby.
    let vapi = delete_validating(&fleet, "hc-1").await;
    eventually(
        "agent-b repaired the drift",
        Duration::from_secs(20),
        || vapi.present(),
    )
    .await;
    relay.heal();
    tokio::time::sleep(Duration::from_secs(lease_seconds)).await;
    assert_eq!(
        leader_gauge(a_addr).await,
        Some(0.0),
        "agent-a stays a standby"
    );
    assert_eq!(leader_gauge(b_addr).await, Some(1.0), "agent-b leads");
    let holder =
        Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(mgmt.clone(), AGENT_NS)
            .get("hcp-fleet-agent")
            .await
            .expect("lease")
            .spec
            .and_then(|s| s.holder_identity);
    assert_eq!(holder.as_deref(), Some("agent-b"));
}

/// Two installations of the agent on one management cluster (two Helm releases, each in its
/// namespace): the first owns the HCPs and the second leaves them alone, saying so in its
/// `/readyz`, a metric and an Event; nothing is repaired twice. When the owner dies, its Lease
/// goes stale and the second takes the HCPs over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_installations_one_owner_per_hcp_and_a_takeover() {
    use k8s_openapi::api::core::v1::Namespace;
    let (fleet, mgmt, _pods) = support::fleet_with_pods(2).await;
    const OTHER_NS: &str = "hcp-fleet-agent-2";
    Api::<Namespace>::all(mgmt.clone())
        .create(
            &Default::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": OTHER_NS}}))
                .expect("namespace"),
        )
        .await
        .expect("the second installation's namespace");
    let kubeconfig = &fleet.management.kubeconfig_path;
    let (first, _) = support::spawn_elected_agent("first-0", kubeconfig, AGENT_NS, Some(6));
    wait_compliant(&mgmt, &["hc-1", "hc-2"]).await;
    let record = |cluster: &'static str| {
        let mgmt = mgmt.clone();
        async move { health(&mgmt, &hcp_namespace(cluster)).await }
    };
    for c in ["hc-1", "hc-2"] {
        let r = record(c).await.expect("record");
        assert_eq!(r.spec.owner.as_deref(), Some(AGENT_NS), "{c}");
    }
    let repairs = || async {
        let mut n = Vec::new();
        for c in ["hc-1", "hc-2"] {
            let r = record(c).await.expect("record");
            n.push(r.status.map(|s| s.drift_repairs).unwrap_or_default());
        }
        n
    };
    let before = repairs().await;

    let (_second, addr) = support::spawn_elected_agent("second-0", kubeconfig, OTHER_NS, Some(6));
    eventually(
        "the second installation is not ready and says whose the HCPs are",
        Duration::from_secs(30),
        || async move {
            let (code, body) = support::http_get(addr, "/readyz").await?;
            let (_, metrics) = support::http_get(addr, "/metrics").await?;
            let gauge = format!("hcp_fleet_hcps_owned_elsewhere{{owner=\"{AGENT_NS}\"}} 2");
            if code == 503 && body.contains(AGENT_NS) && metrics.contains(&gauge) {
                Ok(())
            } else {
                Err(format!("{code} {body}"))
            }
        },
    )
    .await;
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(
        mgmt.clone(),
        &hcp_namespace("hc-1"),
    );
    eventually(
        "the OwnedElsewhere Event",
        Duration::from_secs(10),
        || async {
            let list = events
                .list(&Default::default())
                .await
                .map_err(|e| e.to_string())?;
            list.items
                .iter()
                .find(|e| {
                    e.reason.as_deref() == Some("OwnedElsewhere")
                        && e.note.as_deref().is_some_and(|n| n.contains(OTHER_NS))
                })
                .map(|_| ())
                .ok_or_else(|| format!("{} events", list.items.len()))
        },
    )
    .await;
    // Side by side for a while: no fight (no repair, no owner change), still Compliant.
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert_eq!(repairs().await, before, "nothing repaired while both run");
    for c in ["hc-1", "hc-2"] {
        let r = record(c).await.expect("record");
        assert_eq!(r.spec.owner.as_deref(), Some(AGENT_NS), "{c}");
    }
    wait_compliant(&mgmt, &["hc-1", "hc-2"]).await;

    // The owner dies without a word (its Lease left to go stale): the second takes over,
    // becomes ready and repairs drift.
    drop(first);
    eventually(
        "the second installation owns the HCPs",
        Duration::from_secs(90),
        || async move {
            let mut owners = Vec::new();
            for c in ["hc-1", "hc-2"] {
                owners.push(record(c).await?.spec.owner);
            }
            let (code, body) = support::http_get(addr, "/readyz").await?;
            if owners.iter().all(|o| o.as_deref() == Some(OTHER_NS)) && code == 200 {
                Ok(())
            } else {
                Err(format!("{owners:?} {code} {body}"))
            }
        },
    )
    .await;
    let vapi = delete_validating(&fleet, "hc-1").await;
    eventually("the new owner repairs", Duration::from_secs(20), || {
        vapi.present()
    })
    .await;
    let (_, metrics) = support::http_get(addr, "/metrics").await.expect("metrics");
    assert!(
        !metrics.contains("hcp_fleet_hcps_owned_elsewhere{"),
        "no HCP owned elsewhere any more"
    );
}
