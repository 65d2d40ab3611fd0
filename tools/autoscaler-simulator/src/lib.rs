//! Plays cluster-autoscaler's part on `autoscaling.x-k8s.io/v1` ProvisioningRequests, for the
//! tests and the demo.
//!
//! # Which cluster-autoscaler
//!
//! The default mode follows **cluster-autoscaler 1.36.1** (tag `cluster-autoscaler-1.36.1` of
//! kubernetes/autoscaler) with `--enable-provisioning-requests` and the kwok cloud provider, as
//! `docs/autoscaler-contract.md` (the project's shared notes) describes it; the rule numbers
//! cited in this crate are that document's "What a faithful simulator must do". Reasons,
//! constants and formulas are cluster-autoscaler's; condition messages are the simulator's own
//! words.
//!
//! # Two modes
//!
//! - **Default mode ("cluster-autoscaler")**: every loop ([`loop_decision`]) processes
//!   `check-capacity.autoscaling.x-k8s.io` and `best-effort-atomic-scale-up.autoscaling.x-k8s.io`
//!   requests against a scheduling snapshot of the cluster, creates and deletes Nodes of the
//!   configured node groups ([`node_groups`]), books capacity, expires and deletes requests.
//! - **Scripted mode ("fault injection")** ([`script`]): a request whose first pod template
//!   carries [`SCRIPT_ANNOTATION`], or whose class is one of
//!   [`Settings::scripted_classes`], follows a [`Script`] instead, reacting to watch events at
//!   once. It can write what cluster-autoscaler never does (a `CapacityRevoked`, class details),
//!   and creates no Node.
//!
//! # Simulated
//!
//! - Classes: the two above; any other class gets no status write (rule 2), and neither does a
//!   request carrying `parameters.processorInstance` (cluster-autoscaler without
//!   `--check-capacity-processor-instance` ignores those).
//! - One request per loop (rule 3), in the order the watch cache lists them, which is no order
//!   at all; optional check-capacity batching ([`Settings::check_capacity_batch_size`]).
//! - Missing PodTemplate: Failed=True/`FailedToCreatePods` at once (rule 4). Accepted=True
//!   with or before every outcome (rule 5). check-capacity (rules 6, 7), best-effort atomic
//!   scale-up (rules 8, 9), the per-UID backoff 1 min doubling to 10 min (rule 10), every write
//!   restamping lastTransitionTime (rule 11), booking for 10 min against other requests and
//!   scale-down (rule 12) then BookingExpired (rule 13), never CapacityRevoked,
//!   provisioningClassDetails, Accepted=False or `Unknown` (rule 14), Failed/`Expired` after 7
//!   days (rule 15), deletion 7 days after Provisioned/Failed (rule 16), no scale-up for pods
//!   carrying a consume annotation (rule 17), instant non-atomic Node creation bounded by the
//!   group's max count (rule 18).
//! - Ordinary scale-up for unschedulable pods (loops alternate with requests when both wait),
//!   scale-down of empty Nodes after `--scale-down-unneeded-time`, none within
//!   `--scale-down-delay-after-add` of a scale-up or of a check-capacity request found to fit
//!   (rule 19: cluster-autoscaler records that as a successful scale-up), frequent loops (at
//!   once after a productive loop or when a pod turns unschedulable, else every
//!   `--scan-interval`).
//! - Like 1.36.1 (and unlike 1.37), a booking is not released when the consumer pods run: they
//!   count twice until it expires (kubernetes/autoscaler#9805).
//!
//! # Omitted
//!
//! - Rule 1 (CRD limits, immutability of podSets, class and parameters) is the API server's:
//!   the CRD's validation enforces it, not the simulator.
//! - Scheduling beyond resources, nodeSelector, required node affinity, taints and cordons (no
//!   pod affinity, topology spread, ports, volumes, DRA); first-fit placement in Node-name order
//!   instead of kube-scheduler's scoring; a deterministic expander (most pods helped, then
//!   fewest Nodes, then file order) instead of `random`.
//! - Scale-down only removes Nodes with no pod that matters (no utilization threshold, no
//!   rescheduling of pods elsewhere, no `--scale-down-delay-after-delete` or `-after-failure`,
//!   no bulk limits);
//!   DaemonSets are not modelled on template Nodes (only the kube-proxy pod cluster-autoscaler
//!   puts on a template built without a live Node).
//! - `--max-nodes-total`, resource limits, quotas, balancing similar groups, the 10 s batch
//!   timebox, the events cluster-autoscaler emits, and its status ConfigMap.
//! - With check-capacity batching on, cluster-autoscaler tests the injector's pick for
//!   availability twice in a loop (when injecting and when forming the batch), so that request's
//!   backoff doubles twice (rule 20); the simulator tests it once. Batching is off by default
//!   in both.
//! - cluster-autoscaler 1.37's `BookingExpired`/`CapacityBookingConsumed` (the booking ended
//!   once every pod of the request was scheduled) is not written; the provisioning check treats
//!   it as the non-event it is, before or after admission.
//! - Status writes are one update per request per loop (cluster-autoscaler writes Accepted
//!   first, and best-effort's Provisioned by server-side apply).
//! - Node readiness: a created Node counts as capacity at once (the kwok provider's instances
//!   are always running); the cluster's kwok controller makes it Ready.
//!
//! # Layers
//!
//! Pure: [`quantity`], [`fit`], [`node_groups`], [`snapshot`], [`loop_decision`], [`script`],
//! [`conditions`], [`settings`]. I/O: [`run`] (the watches and the loop) and the scripted
//! controller.

pub mod conditions;
pub mod fit;
pub mod loop_decision;
pub mod node_groups;
pub mod quantity;
pub mod script;
mod scripted;
pub mod settings;
mod shell;
pub mod snapshot;

pub use conditions::merged_conditions;
pub use node_groups::{NodeGroup, parse_node_groups};
pub use script::{
    CLASS_DETAILS_ANNOTATION, Decision, SCRIPT_ANNOTATION, Script, ScriptError, Step,
    attempt_of_name, decide, is_finished, new_condition, parse_class_details,
};
pub use scripted::FIELD_MANAGER;
pub use settings::{Settings, parse_duration};
pub use shell::run;
