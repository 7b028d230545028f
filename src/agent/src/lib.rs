//! The agent's I/O: everything that talks to an API server or serves a port.
//!
//! - `controller`: the HCP controller (reconcile in phases, watches, the report), and its ACM
//!   side (`controller::acm`: the hub's rows, which HCP a managed cluster is, template access);
//! - `hosted`: access to each hosted cluster (clients from its kubeconfig secret, the drift
//!   watch, what its API server serves);
//! - `metrics`, `secure_metrics`, `liveness`: what the agent says about itself;
//! - `human`, `tls`: errors as a person reads them; the TLS the agent speaks;
//! - `grid`: the one grid the agent's late-tolerant timers share, so they wake it together.
//!
//! What it applies is rendered by `hcp-fleet-render`; the admission service it deploys is
//! `hcp-fleet-webhook`; the `agent` process that runs it all (configuration, leader election,
//! the health and metrics servers) is `hcp_fleet_cli::agent`.

pub mod controller;
mod grid;
pub mod hosted;
pub mod human;
pub mod liveness;
pub mod metrics;
pub mod secure_metrics;
pub mod tls;
