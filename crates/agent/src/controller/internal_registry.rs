//! Phase 6's input for the pod image spec mutation (`render::internal_registry`): the hosted
//! cluster's image registry config, and the `openshift` namespace's ImageStreams where the
//! registry is not Managed, read at each reconcile and every few probe rounds; the ConfigMap
//! the admission replicas mount, written where what they would read differs. A hosted cluster
//! that does not answer leaves the ConfigMap as it was: the replicas go on with what they
//! read last.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use serde_json::Value;
use tracing::warn;

use super::admission_service::{Target, put_wrote};
use super::context::lock;
use super::error::Failure;
use super::scope::Scope;
use crate::hosted::clients::HostedClient;
use hcp_fleet_guards::pod_image_spec::{InternalRegistry, ROW};
use hcp_fleet_model::Mode;
use hcp_fleet_render::internal_registry::{
    CONFIG_MAP, CONFIG_PATH, IMAGE_STREAMS_PATH, config_map, observed, wants_image_streams,
};

/// Whether the configuration runs the pod image spec mutation at all.
pub(super) fn wanted(s: &Scope<'_>) -> bool {
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
pub(super) async fn read(
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
pub(super) async fn changed(
    client: &kube::Client,
    timeout: Duration,
    shared: &std::sync::Mutex<super::context::WatchShared>,
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

/// Reads the hosted cluster's registry and writes the ConfigMap where it differs; the probe
/// task compares later reads with what was written (`WatchShared::internal_registry`).
pub(super) async fn ensure(s: &Scope<'_>, hosted: &HostedClient) -> Result<(), Failure> {
    if !wanted(s) {
        return Ok(());
    }
    let timeout = s.cfg.hosted_access.request_timeout();
    let reg = match read(&hosted.client(), timeout).await {
        Ok(r) => r,
        Err(why) => {
            warn!(namespace = %s.ns, error = %why, "could not read the hosted cluster's internal registry; the admission service keeps what it read last");
            return Ok(());
        }
    };
    let cm = config_map(s.ns, &reg).map_err(|e| Failure::ApplyAdmission {
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
    s.ctx.with_hcp(s.ns, |h| {
        if let Some(w) = &h.watch {
            lock(&w.shared).internal_registry = Some(reg);
        }
    });
    Ok(())
}
