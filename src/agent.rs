//! `hcp-fleet-agent agent`: load and validate the configuration, discover what the management
//! cluster offers, and run the HCP controller until SIGTERM. `start` is the same agent in
//! process, for `dev` and the e2e tests.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, RwLock};

use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::api::{Patch, PatchParams};
use tokio::task::JoinHandle;

use crate::config::AgentConfig;
use crate::controller::{self, Context, RunOptions, UrlBase};
use crate::hosted::webhooks::default_url_base;
use crate::metrics::Metrics;

#[derive(Debug, clap::Args)]
pub struct AgentArgs {
    /// Configuration file (YAML); built-in defaults when absent.
    #[arg(long, env = "HCP_FLEET_CONFIG")]
    pub config: Option<PathBuf>,
    /// Namespace of the agent (where the roll-up Policy lives).
    #[arg(long, env = "POD_NAMESPACE", default_value = "hcp-fleet-agent")]
    pub namespace: String,
    /// Overrides `concurrency` from the file.
    #[arg(long, env = "HCP_FLEET_CONCURRENCY")]
    pub concurrency: Option<u16>,
    /// Overrides `admission.image` from the file.
    #[arg(long, env = "HCP_FLEET_ADMISSION_IMAGE")]
    pub admission_image: Option<String>,
}

/// Loads the file and applies the overrides; every problem is reported at once.
pub fn load_config(args: &AgentArgs) -> Result<AgentConfig, crate::config::ConfigError> {
    let mut cfg = match &args.config {
        Some(p) => AgentConfig::load(p)?,
        None => AgentConfig::default(),
    };
    if let Some(c) = args.concurrency {
        cfg.concurrency = c;
    }
    if let Some(i) = &args.admission_image {
        cfg.admission.image = i.clone();
    }
    let origin = args
        .config
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "built-in defaults with overrides".into());
    cfg.validated(&origin)
}

/// A running in-process agent; dropping it stops the controller.
pub struct AgentHandle {
    pub context: Arc<Context>,
    task: JoinHandle<()>,
}

impl Drop for AgentHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub struct StartOptions {
    pub agent_namespace: String,
    pub local_sans: bool,
    pub url_base: Option<UrlBase>,
}

pub async fn start(
    client: Client,
    cfg: AgentConfig,
    opts: StartOptions,
) -> Result<AgentHandle, kube::Error> {
    // The roll-up Policy needs its namespace.
    let ns: Namespace = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": opts.agent_namespace}
    }))
    .map_err(kube::Error::SerdeError)?;
    kube::Api::<Namespace>::all(client.clone())
        .patch(
            &opts.agent_namespace,
            &PatchParams::apply(crate::management::FIELD_MANAGER),
            &Patch::Apply(&ns),
        )
        .await?;
    let caps = controller::discover(&client).await;
    let metrics = Arc::new(Metrics::new());
    let url_base = opts
        .url_base
        .unwrap_or_else(|| Arc::new(|cfg: &AgentConfig, ns: &str| default_url_base(cfg, ns)));
    let (ctx, rx) = Context::new(
        client,
        Arc::new(RwLock::new(Arc::new(cfg))),
        metrics,
        caps,
        RunOptions {
            agent_namespace: opts.agent_namespace,
            local_sans: opts.local_sans,
            url_base,
        },
    );
    let c2 = ctx.clone();
    let task = tokio::spawn(async move {
        controller::run(c2, rx, futures::future::pending::<()>()).await;
    });
    Ok(AgentHandle { context: ctx, task })
}

pub async fn run(args: AgentArgs) -> ExitCode {
    let cfg = match load_config(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let client = match Client::try_default().await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: no usable kubeconfig or in-cluster configuration: {e}");
            return ExitCode::FAILURE;
        }
    };
    let handle = match start(
        client,
        cfg,
        StartOptions {
            agent_namespace: args.namespace,
            local_sans: false,
            url_base: None,
        },
    )
    .await
    {
        Ok(h) => h,
        Err(e) => {
            eprintln!("error: starting the agent: {e}");
            return ExitCode::FAILURE;
        }
    };
    let _ = tokio::signal::ctrl_c().await;
    drop(handle);
    ExitCode::SUCCESS
}
