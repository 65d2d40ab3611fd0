//! Build external [Kueue](https://kueue.sigs.k8s.io) admission checks in Rust.
//!
//! Kueue admits a Workload in two stages: it reserves quota, then waits until every
//! AdmissionCheck of the ClusterQueue reports `Ready` in the Workload's
//! `status.admissionChecks`. This crate holds what a controller answering such a check needs;
//! for now, the Kueue API types in [`api`].

pub mod api;
pub mod retry;
