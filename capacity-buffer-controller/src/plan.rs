//! Pure: the buffers one attempt needs for a Workload that holds quota, and the pod set updates
//! that send its pods to the capacity they bring.
//!
//! One CapacityBuffer (and its PodTemplate) per podset with pods: a buffer has one template
//! and a count. Each template is the podset's, with the assigned flavors' node labels and
//! tolerations (as Kueue will give the pods) and one more node selector,
//! `<nodeLabel>=<Workload uid>`: Karpenter can place the virtual pods only on Nodes with that
//! label, so it launches Nodes for this Workload alone (the NodePool allows the key with
//! `Exists`), and the Workload's pods, given the same selector, land on them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PodSpec, PodTemplateSpec};
use kueue_admission_sdk::api::{PodSetUpdate, ResourceFlavorSpec, Workload};
use kueue_admission_sdk::pod_template::{FlavorAdditions, TemplateError, build_template};

use crate::names;

/// What one attempt asks Karpenter for.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// One buffer per podset with pods, in podset order.
    pub buffers: Vec<BufferPlan>,
    /// The updates of the `Ready` answer: every planned podset's pods select the dedicated
    /// Nodes and carry the Workload's uid (counted by the Node protection).
    pub updates: Vec<PodSetUpdate>,
    /// The Workload's pods in all planned podsets.
    pub pods: u32,
}

/// The buffer (and PodTemplate, of the same name) for one podset.
#[derive(Clone, Debug, PartialEq)]
pub struct BufferPlan {
    /// The podset.
    pub pod_set: String,
    /// The buffer's and its template's name.
    pub name: String,
    /// Pods of the podset Kueue assigned quota to.
    pub replicas: u32,
    /// The pod template Karpenter shapes its virtual pods from.
    pub template: PodTemplateSpec,
}

/// Why no plan can be made; the message is for the Workload's check entry.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// Quota is not reserved: nothing says which flavors and counts the Workload got.
    #[error("the Workload holds no quota reservation (status.admission is empty)")]
    NoQuotaReservation,
    /// A flavor is unknown, or gives a node label two values.
    #[error(transparent)]
    Template(#[from] TemplateError),
    /// The podset (or a flavor) already selects the dedication label with another value.
    #[error(
        "podset {pod_set:?} already selects node label {key}={value}; this check dedicates Nodes with that key (the config's nodeLabel): use another key in the config or the podset"
    )]
    NodeLabelTaken {
        /// The podset.
        pod_set: String,
        /// The label key.
        key: String,
        /// The value the podset selects.
        value: String,
    },
    /// No podset has pods.
    #[error("no podset of the Workload has pods to make room for")]
    NoPods,
}

/// What the plan reads.
#[derive(Clone, Copy, Debug)]
pub struct PlanInput<'a> {
    /// The Workload, holding quota.
    pub workload: &'a Workload,
    /// Its uid.
    pub uid: &'a str,
    /// The AdmissionCheck.
    pub check: &'a str,
    /// The attempt.
    pub attempt: u32,
    /// The assigned flavors' specs, by name.
    pub flavors: &'a BTreeMap<String, ResourceFlavorSpec>,
    /// The dedication label's key.
    pub node_label: &'a str,
}

/// The buffers and updates of one attempt.
pub fn plan(input: &PlanInput<'_>) -> Result<Plan, PlanError> {
    let wl = input.workload;
    let admission = wl
        .status
        .as_ref()
        .and_then(|s| s.admission.as_ref())
        .ok_or(PlanError::NoQuotaReservation)?;
    let name = wl.metadata.name.as_deref().unwrap_or_default();
    let mut plan = Plan {
        buffers: Vec::new(),
        updates: Vec::new(),
        pods: 0,
    };
    for pod_set in &wl.spec.pod_sets {
        let replicas = wl.pod_count(&pod_set.name);
        if replicas == 0 {
            continue;
        }
        let assigned = admission
            .pod_set_assignments
            .iter()
            .find(|a| a.name == pod_set.name)
            .map(|a| a.flavors.values().collect::<Vec<_>>())
            .unwrap_or_default();
        let additions = FlavorAdditions::of(&pod_set.name, assigned, input.flavors)?;
        let mut template = build_template(pod_set, &additions)?;
        let selector = template
            .spec
            .get_or_insert_with(PodSpec::default)
            .node_selector
            .get_or_insert_with(BTreeMap::new);
        match selector.get(input.node_label) {
            Some(value) if value != input.uid => {
                return Err(PlanError::NodeLabelTaken {
                    pod_set: pod_set.name.clone(),
                    key: input.node_label.to_string(),
                    value: value.clone(),
                });
            }
            _ => {
                selector.insert(input.node_label.to_string(), input.uid.to_string());
            }
        }
        plan.buffers.push(BufferPlan {
            pod_set: pod_set.name.clone(),
            name: names::buffer_name(name, input.uid, input.check, &pod_set.name, input.attempt),
            replicas,
            template,
        });
        plan.updates.push(PodSetUpdate {
            name: pod_set.name.clone(),
            labels: BTreeMap::from([(
                names::WORKLOAD_UID_LABEL.to_string(),
                input.uid.to_string(),
            )]),
            node_selector: BTreeMap::from([(input.node_label.to_string(), input.uid.to_string())]),
            ..Default::default()
        });
        plan.pods = plan.pods.saturating_add(replicas);
    }
    if plan.buffers.is_empty() {
        return Err(PlanError::NoPods);
    }
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kueue_admission_sdk::testing::WorkloadBuilder;

    const LABEL: &str = "example.com/capacity-for";

    fn flavors() -> BTreeMap<String, ResourceFlavorSpec> {
        BTreeMap::from([(
            "spot".to_string(),
            ResourceFlavorSpec {
                node_labels: BTreeMap::from([("pool".to_string(), "spot".to_string())]),
                ..Default::default()
            },
        )])
    }

    fn input<'a>(
        wl: &'a Workload,
        flavors: &'a BTreeMap<String, ResourceFlavorSpec>,
    ) -> PlanInput<'a> {
        PlanInput {
            workload: wl,
            uid: "uid-1",
            check: "capacity",
            attempt: 1,
            flavors,
            node_label: LABEL,
        }
    }

    #[test]
    fn one_buffer_per_podset_with_the_flavor_labels_and_the_dedication_selector() {
        let wl = WorkloadBuilder::new("ns", "train")
            .pod_set("driver", 1, "1")
            .pod_set("workers", 4, "2")
            .quota_reserved("cq", "spot")
            .build();
        let flavors = flavors();
        let plan = plan(&input(&wl, &flavors)).expect("plan");
        assert_eq!(plan.pods, 5);
        let replicas: Vec<_> = plan
            .buffers
            .iter()
            .map(|b| (b.pod_set.as_str(), b.replicas))
            .collect();
        assert_eq!(replicas, [("driver", 1), ("workers", 4)]);
        for b in &plan.buffers {
            let selector = b
                .template
                .spec
                .as_ref()
                .and_then(|s| s.node_selector.clone())
                .expect("selector");
            assert_eq!(selector["pool"], "spot");
            assert_eq!(selector[LABEL], "uid-1");
            assert!(
                b.name.starts_with(&format!("train-{}-", b.pod_set)),
                "{}",
                b.name
            );
        }
        let update = &plan.updates[1];
        assert_eq!(update.name, "workers");
        assert_eq!(update.node_selector[LABEL], "uid-1");
        assert_eq!(update.labels[names::WORKLOAD_UID_LABEL], "uid-1");
        let valid =
            kueue_admission_sdk::api::validation::pod_set_updates(&wl.spec.pod_sets, &plan.updates);
        assert_eq!(valid, Ok(()));
    }

    #[test]
    fn partial_admission_asks_for_the_assigned_count_and_empty_podsets_get_nothing() {
        let wl = WorkloadBuilder::new("ns", "train")
            .pod_set("main", 10, "1")
            .pod_set("idle", 0, "1")
            .quota_reserved("cq", "spot")
            .with(|wl| {
                let a = wl
                    .status
                    .as_mut()
                    .and_then(|s| s.admission.as_mut())
                    .expect("admission");
                a.pod_set_assignments[0].count = Some(6);
            })
            .build();
        let flavors = flavors();
        let plan = plan(&input(&wl, &flavors)).expect("plan");
        assert_eq!(plan.buffers.len(), 1);
        assert_eq!((plan.buffers[0].replicas, plan.pods), (6, 6));
    }

    #[test]
    fn what_cannot_be_planned_says_why() {
        let flavors = flavors();
        let unreserved = WorkloadBuilder::new("ns", "w")
            .pod_set("main", 1, "1")
            .build();
        assert_eq!(
            plan(&input(&unreserved, &flavors)),
            Err(PlanError::NoQuotaReservation)
        );
        let unknown = WorkloadBuilder::new("ns", "w")
            .pod_set("main", 1, "1")
            .quota_reserved("cq", "gone")
            .build();
        let err = plan(&input(&unknown, &flavors)).expect_err("unknown flavor");
        assert!(err.to_string().contains("\"gone\""), "{err}");
        let taken = WorkloadBuilder::new("ns", "w")
            .pod_set("main", 1, "1")
            .quota_reserved("cq", "spot")
            .with(|wl| {
                let spec = wl.spec.pod_sets[0]
                    .template
                    .spec
                    .get_or_insert_with(Default::default);
                spec.node_selector =
                    Some(BTreeMap::from([(LABEL.to_string(), "mine".to_string())]));
            })
            .build();
        let err = plan(&input(&taken, &flavors)).expect_err("taken");
        assert!(
            err.to_string()
                .contains("already selects node label example.com/capacity-for=mine"),
            "{err}"
        );
    }
}
