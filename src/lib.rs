//! hcp-fleet-agent: admission webhooks across a HyperShift fleet.
//!
//! One module per concern; see docs/architecture.md for how they fit together.

pub mod admission;
pub mod agent;
pub mod catalogue;
pub mod certificates;
pub mod cli;
pub mod compare;
pub mod config;
pub mod controller;
pub mod crd;
pub mod dev;
pub mod guards;
pub mod hosted;
pub mod human;
pub mod liveness;
pub mod localcp;
pub mod managed_clusters;
pub mod management;
pub mod metrics;
pub mod names;
pub mod overrides;
pub mod packaging;
pub mod render;
pub mod reporting;
pub mod rollout;
pub mod secure_metrics;
pub mod status;
pub mod telemetry;
pub mod tls;
pub mod uninstall;
