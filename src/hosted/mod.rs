//! The hosted clusters: access through each HCP's kubeconfig secret, the webhook
//! configurations installed there, and the watch that keeps them from drifting.

pub mod clients;
pub mod kubeconfig;
pub mod webhooks;
