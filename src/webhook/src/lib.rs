//! The admission service the agent deploys into each HCP namespace: AdmissionReview v1 over
//! HTTPS (`server`), the built-in guards with their exemptions and modes (`decision`),
//! `/healthz`, `/readyz`, `/metrics`, certificate hot reload (`tls`), the internal registry's
//! file for the pod image spec mutation (`internal_registry`), graceful drain, the settings
//! each worker thread reads (`settings_cell`). It knows the guards and nothing of the agent:
//! its settings arrive as `hcp_fleet_guards::Settings`.
//! The `webhook` command that runs it is `hcp_fleet_cli::webhook`.

pub mod decision;
pub mod internal_registry;
pub mod own_denials;
pub mod server;
mod settings_cell;
pub mod tls;
