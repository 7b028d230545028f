//! Phase 5's input for the pod image spec mutation (`render::internal_registry`): the hosted
//! cluster's image registry config, and the `openshift` namespace's ImageStreams where the
//! registry is not Managed, read at each reconcile and every few probe rounds. The mutation's
//! policy carries what was read in its CEL; the ConfigMap the admission replicas mount is
//! written where what they would read differs. A hosted cluster that does not answer leaves
//! both as they were: the policy and the replicas go on with what was read last.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use serde_json::Value;
use tracing::warn;

use super::admission_service::{Target, put_wrote};
use crate::controller::context::lock;
use crate::controller::error::Failure;
use crate::controller::scope::Scope;
use crate::hosted::clients::HostedClient;
use hcp_fleet_guards::pod_image_spec::{InternalRegistry, ROW};
use hcp_fleet_model::Mode;
use hcp_fleet_render::internal_registry::{
    CONFIG_MAP, CONFIG_PATH, IMAGE_STREAMS_PATH, config_map, observed, wants_image_streams,
};

/// Whether the configuration runs the pod image spec mutation at all.
pub(in crate::controller) fn wanted(s: &Scope<'_>) -> bool {
    s.cfg
        .webhooks
        .iter()
        .any(|w| w.path == ROW.path && w.mode != Mode::Off)
}

/// One object or list at `path`; `None` where the server has no such thing (404: the kind not
/// served, or the object absent).
async fn get(client: &kube::Client, path: &str) -> Result<Option<Value>, kube::Error> {
    let req = http::Request::get(path)
        .body(Vec::new())
        .map_err(kube::Error::HttpError)?;
    match client.request::<Value>(req).await {
        Ok(v) => Ok(Some(v)),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(None),
        Err(e) => Err(e),
    }
}

/// The registry as the hosted cluster has it now.
pub(in crate::controller) async fn read(
    client: &kube::Client,
    timeout: Duration,
) -> Result<InternalRegistry, String> {
    let within =
        |what: &'static str| move |_| format!("{what}: no answer within {}s", timeout.as_secs());
    let config = tokio::time::timeout(timeout, get(client, CONFIG_PATH))
        .await
        .map_err(within("the image registry config"))?
        .map_err(|e| format!("the image registry config: {e}"))?;
    let streams = if wants_image_streams(config.as_ref()) {
        tokio::time::timeout(timeout, get(client, IMAGE_STREAMS_PATH))
            .await
            .map_err(within("the openshift namespace's ImageStreams"))?
            .map_err(|e| format!("the openshift namespace's ImageStreams: {e}"))?
            .and_then(|l| l.get("items").and_then(Value::as_array).cloned())
            .unwrap_or_default()
    } else {
        Vec::new()
    };
    Ok(observed(config.as_ref(), &streams))
}

/// Whether the hosted cluster's registry differs from what the last reconcile wrote (a read
/// that fails says nothing changed: the replicas keep what they have).
pub(in crate::controller) async fn changed(
    client: &kube::Client,
    timeout: Duration,
    shared: &std::sync::Mutex<crate::controller::context::WatchShared>,
) -> bool {
    let Ok(now) = read(client, timeout).await else {
        return false;
    };
    let differs = lock(shared).internal_registry.as_ref() != Some(&now);
    if differs {
        tracing::info!("the hosted cluster's internal registry changed");
    }
    differs
}

/// The registry this pass renders and writes: read from the hosted cluster now, else (it did
/// not answer) what was read last, which the replicas and the policy keep; `None` where the
/// mutation is off or nothing was ever read.
pub(in crate::controller) struct Current {
    pub(in crate::controller) registry: Option<InternalRegistry>,
    /// Read now: what the ConfigMap and the probe task's comparison are brought up to.
    fresh: bool,
}

/// Phase 5's input: the registry, read before the hosted objects are rendered, since the pod
/// image spec mutation's policy carries its tags.
pub(in crate::controller) async fn current(s: &Scope<'_>, hosted: &HostedClient) -> Current {
    if !wanted(s) {
        return Current {
            registry: None,
            fresh: false,
        };
    }
    match read(&hosted.client(), s.cfg.hosted_access.request_timeout()).await {
        Ok(r) => Current {
            registry: Some(r),
            fresh: true,
        },
        Err(why) => {
            warn!(namespace = %s.ns, error = %why, "could not read the hosted cluster's internal registry; the pod image spec mutation keeps what it read last");
            Current {
                registry: last(s),
                fresh: false,
            }
        }
    }
}

impl Current {
    /// What was read last, for a hosted cluster not reached now.
    pub(in crate::controller) fn last_read(s: &Scope<'_>) -> Self {
        Current {
            registry: if wanted(s) { last(s) } else { None },
            fresh: false,
        }
    }
}

/// The registry last written for the replicas and rendered into the policy.
pub(in crate::controller) fn last(s: &Scope<'_>) -> Option<InternalRegistry> {
    s.ctx.with_hcp(s.ns, |h| {
        h.watch
            .as_ref()
            .and_then(|w| lock(&w.shared).internal_registry.clone())
    })
}

/// Writes the registry read now to the ConfigMap the replicas mount (where `service` runs
/// them), where it differs, and keeps it for the probe task, which compares later reads with
/// it (`WatchShared::internal_registry`), and the canary, which names what it resolves.
pub(in crate::controller) async fn ensure(
    s: &Scope<'_>,
    current: &Current,
    service: bool,
) -> Result<(), Failure> {
    let (true, Some(reg)) = (current.fresh, &current.registry) else {
        return Ok(());
    };
    if !service {
        keep(s, reg);
        return Ok(());
    }
    let cm = config_map(s.ns, reg).map_err(|e| Failure::ApplyAdmission {
        kind: "ConfigMap",
        name: CONFIG_MAP.into(),
        source: kube::Error::SerdeError(e),
    })?;
    put_wrote(
        s.ctx,
        s.ns,
        Target {
            api: Api::<ConfigMap>::namespaced(s.ctx.client.clone(), s.ns),
            kind: "ConfigMap",
            name: CONFIG_MAP,
            store: None,
        },
        &cm,
    )
    .await?;
    keep(s, reg);
    Ok(())
}

fn keep(s: &Scope<'_>, reg: &InternalRegistry) {
    s.ctx.with_hcp(s.ns, |h| {
        if let Some(w) = &h.watch {
            lock(&w.shared).internal_registry = Some(reg.clone());
        }
    });
}
