//! Access to the hosted clusters: a client from each HCP's kubeconfig secret, checked before it
//! is used (`kubeconfig`, `clients`); what the hosted API server serves (`features`); and the
//! lean list-then-watch the drift watch reads the guards with (`watch`).

pub mod clients;
pub mod features;
pub mod kubeconfig;
pub mod watch;
