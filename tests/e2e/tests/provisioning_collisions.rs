//! Request names that collide: ours and Kueue's built-in check, two Workloads of ours, and a
//! user's objects. A name is `<workload>-<check>-<attempt>` for both controllers, so Workload
//! `w-k` with our check `<ns>-prov` and Workload `w` with Kueue's check `k-<ns>-prov` both want
//! `w-k-<ns>-prov-1`. Whatever holds a name first, nothing that is not ours is deleted, changed
//! or named in our podSetUpdates, and every Workload is admitted or told why not.

use anyhow::{Context, Result, ensure};
use autoscaler_simulator as simulator;
use e2e::Running;
use e2e::provisioning::Provisioning;
use e2e::{TestEnv, dump, wait_for};
use k8s_openapi::api::core::v1::PodTemplate;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kueue_admission_sdk::api::{
    AdmissionCheck, AdmissionCheckParametersReference, AdmissionCheckSpec, AdmissionCheckState,
    CheckState, ProvisioningRequest, Workload, find_condition, workload_condition as cond,
};
use kueue_provisioning_controller::identity::{KUEUE_CONTROLLER_NAME, KUEUE_MANAGED_LABEL};
use kueue_provisioning_controller::outcome::CONSUME_ANNOTATION;
use kueue_provisioning_controller::{identity, names};
use serde_json::json;

/// Our check (from the harness), Kueue's check whose name ends with `-<ours>`, and the names
/// of the two Workloads whose requests collide.
struct Collision {
    env: TestEnv,
    p: Provisioning,
    /// Kueue's AdmissionCheck: `k-<our check>`.
    kueue_check: String,
    /// Our Workload: `w-k`, the first name of whose request is `shared`.
    ours: &'static str,
    /// Kueue's Workload: `w`, whose request is `shared`.
    theirs: &'static str,
    /// `w-k-<our check>-1`.
    shared: String,
    controller: Running,
    simulator: Running,
}

impl Collision {
    /// Our check and queue (`lq`), the controller and the simulator; Kueue's check and queue
    /// (`kueue-lq`) now or later ([`Collision::add_kueue_check`]).
    async fn new(test: &str, with_kueue_check: bool) -> Result<Self> {
        let env = TestEnv::new(test).await?;
        let p = env.provisioning(json!({}), "4").await?;
        let kueue_check = format!("k-{}", p.check);
        let shared = names::request_name("w-k", &p.check, 1);
        ensure!(shared == format!("w-{kueue_check}-1"), "{shared}");
        let controller = env.start_provisioning_controller(None)?;
        let simulator = env.start_simulator()?;
        let c = Self {
            env,
            p,
            kueue_check,
            ours: "w-k",
            theirs: "w",
            shared,
            controller,
            simulator,
        };
        if with_kueue_check {
            c.add_kueue_check().await?;
        }
        Ok(c)
    }

    /// Kueue's check (a config of the class our simulator serves), its ClusterQueue and
    /// LocalQueue `kueue-lq`; waits until Kueue marks the check Active.
    async fn add_kueue_check(&self) -> Result<()> {
        let env = &self.env;
        let config = env.provisioning_config("kueue-prc", json!({})).await?;
        let spec = AdmissionCheckSpec {
            controller_name: KUEUE_CONTROLLER_NAME.into(),
            parameters: Some(AdmissionCheckParametersReference {
                api_group: "kueue.x-k8s.io".into(),
                kind: "ProvisioningRequestConfig".into(),
                name: config,
            }),
        };
        let checks = Api::<AdmissionCheck>::all(env.client.clone());
        checks
            .create(
                &PostParams::default(),
                &AdmissionCheck::new(&self.kueue_check, spec),
            )
            .await
            .context("creating Kueue's AdmissionCheck")?;
        let cq = env
            .cluster_queue("kueue-cq", &self.p.flavor, "4", &[&self.kueue_check])
            .await?
            .name_any();
        env.local_queue("kueue-lq", &cq).await?;
        wait_for(checks, &self.kueue_check, "Active=True", |ac| {
            ac.status
                .as_ref()
                .and_then(|s| find_condition(&s.conditions, "Active"))
                .is_some_and(|c| c.status == "True")
        })
        .await?;
        Ok(())
    }

    /// Our Workload in `lq`.
    async fn submit_ours(&self) -> Result<Workload> {
        workload(&self.env, self.ours, "lq").await
    }

    /// Kueue's Workload in `kueue-lq`.
    async fn submit_theirs(&self) -> Result<Workload> {
        workload(&self.env, self.theirs, "kueue-lq").await
    }

    /// Submits Kueue's Workload and waits until Kueue's check admitted it on the shared
    /// request; returns its entry, and the request and PodTemplate, checked to be Kueue's.
    async fn admit_theirs(
        &self,
    ) -> Result<(AdmissionCheckState, ProvisioningRequest, PodTemplate)> {
        let theirs = self.submit_theirs().await?;
        let entry = wait_ready_on(&self.env, self.theirs, &self.kueue_check, &self.shared).await?;
        let request = self.env.provisioning_requests().get(&self.shared).await?;
        let template = templates(&self.env)
            .get(&names::pod_template_name(&self.shared, "main"))
            .await?;
        assert_kueues(&request, &template, &theirs)?;
        Ok((entry, request, template))
    }

    /// Asserts the request `name` is ours, made for Workload `wl`.
    async fn assert_ours(&self, name: &str, wl: &Workload) -> Result<()> {
        let request = self.env.provisioning_requests().get(name).await?;
        assert_ours(&request, wl, &self.p.controller_name)
    }

    async fn stop(self) -> Result<()> {
        Running::stop_all([self.controller, self.simulator]).await
    }
}

/// A plain Workload of one pod (1 cpu) in `queue`; the simulator provisions its request.
async fn workload(env: &TestEnv, name: &str, queue: &str) -> Result<Workload> {
    workload_with(env, name, queue, true).await
}

/// [`workload`], inactive (`spec.active: false`, never given quota) unless `active`.
async fn workload_with(env: &TestEnv, name: &str, queue: &str, active: bool) -> Result<Workload> {
    let wl: Workload = serde_json::from_value(json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": name, "namespace": env.ns},
        "spec": {"queueName": queue, "active": active, "podSets": [{
            "name": "main",
            "count": 1,
            "template": {
                "metadata": {"annotations": {simulator::SCRIPT_ANNOTATION: "provision"}},
                "spec": {"restartPolicy": "Never", "containers": [{
                    "name": "main",
                    "image": "registry.invalid/no-pod-runs-here:1",
                    "resources": {"requests": {"cpu": "1"}},
                }]},
            },
        }]},
    }))?;
    env.create_workload(&wl).await
}

/// [`wait_ready`], and asserts the entry tells the pods to consume `request`.
async fn wait_ready_on(
    env: &TestEnv,
    wl: &str,
    check: &str,
    request: &str,
) -> Result<AdmissionCheckState> {
    let entry = wait_ready(env, wl, check).await?;
    assert_consumes(&entry, request)?;
    Ok(entry)
}

/// Waits until the Workload is admitted with `check` Ready; returns the entry.
async fn wait_ready(env: &TestEnv, wl: &str, check: &str) -> Result<AdmissionCheckState> {
    Ok(env.wait_admitted_ready(wl, check).await?.1)
}

/// Asserts a Ready entry's podSetUpdates tell the pods to consume exactly `request`.
fn assert_consumes(entry: &AdmissionCheckState, request: &str) -> Result<()> {
    let consumed: Vec<&str> = entry
        .pod_set_updates
        .iter()
        .filter_map(|u| u.annotations.get(CONSUME_ANNOTATION).map(String::as_str))
        .collect();
    ensure!(
        consumed == [request],
        "consumes {consumed:?}, not {request}: {entry:?}"
    );
    Ok(())
}

fn templates(env: &TestEnv) -> Api<PodTemplate> {
    Api::namespaced(env.client.clone(), &env.ns)
}

/// (uid, resourceVersion) of an object that must not change.
fn version<K: ResourceExt>(k: &K) -> (String, String) {
    (
        k.uid().unwrap_or_default(),
        k.resource_version().unwrap_or_default(),
    )
}

/// Names of every ProvisioningRequest in the namespace, sorted.
async fn request_names(env: &TestEnv) -> Result<Vec<String>> {
    let mut all: Vec<String> = env
        .provisioning_requests()
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(|r| r.name_any())
        .collect();
    all.sort();
    Ok(all)
}

/// Asserts a request and template are Kueue's: owned by Workload `wl`, labelled by Kueue, none
/// of our labels.
fn assert_kueues(r: &ProvisioningRequest, t: &PodTemplate, wl: &Workload) -> Result<()> {
    ensure!(
        r.owner_references()
            .iter()
            .any(|o| o.kind == "Workload" && Some(&o.uid) == wl.uid().as_ref()),
        "not owned by Workload {}: {}",
        wl.name_any(),
        dump(r)
    );
    for labels in [r.labels(), t.labels()] {
        ensure!(
            labels.get(KUEUE_MANAGED_LABEL).map(String::as_str) == Some("true")
                && !labels.contains_key(identity::INSTANCE_LABEL),
            "not Kueue's: {labels:?}"
        );
    }
    ensure!(
        t.owner_references()
            .iter()
            .any(|o| o.kind == "ProvisioningRequest" && Some(&o.uid) == r.uid().as_ref()),
        "Kueue's template is not its request's: {}",
        dump(t)
    );
    Ok(())
}

/// Asserts a request is ours, made for Workload `wl`.
fn assert_ours(r: &ProvisioningRequest, wl: &Workload, controller_name: &str) -> Result<()> {
    ensure!(
        r.labels().get(identity::INSTANCE_LABEL)
            == Some(&identity::instance_label(controller_name))
            && r.labels().get(identity::WORKLOAD_UID_LABEL) == wl.uid().as_ref()
            && e2e::provisioning::owned_by_its_templates(r),
        "not ours for {}: {}",
        wl.name_any(),
        dump(r)
    );
    Ok(())
}

/// Kueue's Workload and request come first; ours then finds the shared name taken and uses its
/// alternative name. Kueue's request and template keep their uid and resourceVersion while
/// both controllers reconcile both Workloads, and both Workloads are admitted on their own
/// requests.
#[tokio::test]
async fn kueue_first_ours_takes_another_name_and_leaves_kueues_alone() -> Result<()> {
    let c = Collision::new("collide-kueue-first", true).await?;
    let env = &c.env;
    let history = env.workload_history();
    let (theirs_entry, kr, kt) = c.admit_theirs().await?;
    let (kr_v, kt_v) = (version(&kr), version(&kt));

    let ours = c.submit_ours().await?;
    let alt =
        names::alternative_request_name(c.ours, &ours.uid().unwrap_or_default(), &c.p.check, 1);
    wait_ready_on(env, c.ours, &c.p.check, &alt).await?;
    c.assert_ours(&alt, &ours).await?;
    assert_eq!(env.our_requests().await?, std::slice::from_ref(&alt));
    assert_eq!(
        env.our_pod_templates().await?,
        [names::pod_template_name(&alt, "main")]
    );
    // Our entry said why the usual name was not used: when the request was created, or (made
    // at the reservation, before the entry existed) in each answer about it.
    let said = history.applied().iter().any(|w| {
        w.name_any() == c.ours
            && w.admission_check(&c.p.check).is_some_and(|e| {
                e.message
                    .contains(&format!("ProvisioningRequest {}/{alt}", env.ns))
                    && e.message.contains(&c.shared)
                    && e.message.contains("Kueue's built-in")
            })
    });
    ensure!(said, "no message of our entry explained the name");

    // Both controllers reconcile both Workloads again (a label change wakes each).
    for wl in [c.ours, c.theirs] {
        let patch = json!({"metadata": {"labels": {"e2e.kueue-admission-checks.dev/poke": "1"}}});
        env.workloads()
            .patch(wl, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    wait_ready(env, c.ours, &c.p.check).await?;
    let again = wait_ready(env, c.theirs, &c.kueue_check).await?;
    assert_eq!(again, theirs_entry);
    let kr = env.provisioning_requests().get(&c.shared).await?;
    let kt = templates(env).get(&kt.name_any()).await?;
    assert_eq!((version(&kr), version(&kt)), (kr_v, kt_v));
    let mut want = vec![alt, c.shared.clone()];
    want.sort();
    assert_eq!(request_names(env).await?, want);
    c.stop().await
}

/// Kueue's check exists when our Workload comes first: ours leaves the shared name to Kueue
/// (Kueue would never take another) and uses its alternative name; Kueue's Workload then gets
/// the shared name, and Kueue leaves our request and template alone.
#[tokio::test]
async fn ours_first_leaves_the_shared_name_to_kueues_check() -> Result<()> {
    let c = Collision::new("collide-ours-first", true).await?;
    let env = &c.env;
    let ours = c.submit_ours().await?;
    let alt =
        names::alternative_request_name(c.ours, &ours.uid().unwrap_or_default(), &c.p.check, 1);
    let ours_entry = wait_ready_on(env, c.ours, &c.p.check, &alt).await?;
    assert_eq!(request_names(env).await?, std::slice::from_ref(&alt));
    let or = env.provisioning_requests().get(&alt).await?;
    let ot = templates(env)
        .get(&names::pod_template_name(&alt, "main"))
        .await?;
    let (or_v, ot_v) = (version(&or), version(&ot));

    c.admit_theirs().await?;
    // Ours untouched, still admitted on its own request.
    let or = env.provisioning_requests().get(&alt).await?;
    let ot = templates(env).get(&ot.name_any()).await?;
    assert_eq!((version(&or), version(&ot)), (or_v, ot_v));
    assert_eq!(wait_ready(env, c.ours, &c.p.check).await?, ours_entry);
    c.stop().await
}

/// Our request holds the shared name before Kueue's check exists. Kueue's built-in check then
/// cannot create its request: we record what it does (it says so on its entry, and changes
/// nothing of ours). Once our Workload is done and our objects are gone, Kueue's Workload gets
/// its own request and template and is admitted.
#[tokio::test]
async fn a_request_made_before_kueues_check_existed_blocks_it_until_released() -> Result<()> {
    let c = Collision::new("collide-before-kueue", false).await?;
    let env = &c.env;
    c.submit_ours().await?;
    let ours_entry = wait_ready_on(env, c.ours, &c.p.check, &c.shared).await?;
    let or = env.provisioning_requests().get(&c.shared).await?;
    let template = names::pod_template_name(&c.shared, "main");
    let ot = templates(env).get(&template).await?;
    let (or_v, ot_v) = (version(&or), version(&ot));

    c.add_kueue_check().await?;
    c.submit_theirs().await?;
    let blocked = env
        .wait_workload(c.theirs, "Kueue's entry reporting the name taken", |w| {
            w.admission_check(&c.kueue_check).is_some_and(|e| {
                e.state == CheckState::Pending
                    && e.message.contains(&c.shared)
                    && e.message.contains("already exists")
            })
        })
        .await?;
    ensure!(
        !blocked.condition_is_true(cond::ADMITTED),
        "{}",
        dump(&blocked)
    );
    // Kueue deleted, replaced and changed nothing of ours; ours stays admitted on it.
    let or = env.provisioning_requests().get(&c.shared).await?;
    let ot = templates(env).get(&template).await?;
    assert_eq!((version(&or), version(&ot)), (or_v, ot_v), "{}", dump(&ot));
    assert_eq!(wait_ready(env, c.ours, &c.p.check).await?, ours_entry);

    // Our Workload is done (deactivated): our request and template go.
    let off = json!({"spec": {"active": false}});
    env.workloads()
        .patch(c.ours, &PatchParams::default(), &Patch::Merge(&off))
        .await?;
    env.wait_nothing_left().await?;
    // Kueue retries with a growing backoff; a change of its Workload makes it retry now.
    let poke = json!({"metadata": {"labels": {"e2e.kueue-admission-checks.dev/poke": "1"}}});
    env.workloads()
        .patch(c.theirs, &PatchParams::default(), &Patch::Merge(&poke))
        .await?;
    wait_ready_on(env, c.theirs, &c.kueue_check, &c.shared).await?;
    let theirs = env.workloads().get(c.theirs).await?;
    let kr = env.provisioning_requests().get(&c.shared).await?;
    let kt = templates(env).get(&template).await?;
    assert_kueues(&kr, &kt, &theirs)?;
    ensure!(kt.uid() != ot.uid(), "Kueue reused our template");
    c.stop().await
}

/// Two Workloads of ours on two of our checks whose request names collide (`w-k` on
/// `<ns>-prov`, `w` on `k-<ns>-prov`): the second takes its alternative name and the first's
/// request stays. Then a user's request and PodTemplate hold both names a third Workload may
/// use: it stays Pending with a message naming them, nothing of the user's is touched, and
/// once the user removes the request it is admitted.
#[tokio::test]
async fn names_held_by_another_workload_or_a_user_are_never_touched() -> Result<()> {
    let c = Collision::new("collide-ours-and-user", false).await?;
    let env = &c.env;
    // A second check of ours whose name ends with `-<first check>`.
    let second = Api::<AdmissionCheck>::all(env.client.clone())
        .create(
            &PostParams::default(),
            &AdmissionCheck::new(
                &c.kueue_check,
                AdmissionCheckSpec {
                    controller_name: c.p.controller_name.clone(),
                    parameters: Some(AdmissionCheckParametersReference {
                        api_group: "kueue.x-k8s.io".into(),
                        kind: "ProvisioningRequestConfig".into(),
                        name: c.p.config.clone(),
                    }),
                },
            ),
        )
        .await?
        .name_any();
    let cq = env
        .cluster_queue("cq2", &c.p.flavor, "4", &[&second])
        .await?
        .name_any();
    env.local_queue("lq2", &cq).await?;

    c.submit_ours().await?;
    let first = wait_ready_on(env, c.ours, &c.p.check, &c.shared).await?;
    let fr = version(&env.provisioning_requests().get(&c.shared).await?);
    let other = workload(env, c.theirs, "lq2").await?;
    let alt =
        names::alternative_request_name(c.theirs, &other.uid().unwrap_or_default(), &second, 1);
    wait_ready_on(env, c.theirs, &second, &alt).await?;
    assert_eq!(
        version(&env.provisioning_requests().get(&c.shared).await?),
        fr
    );
    assert_eq!(wait_ready(env, c.ours, &c.p.check).await?, first);

    // A user's request on the first name of Workload `u`, and a user's PodTemplate on the
    // template name of its second. `u` is created inactive (its uid gives the second name) and
    // activated once they exist.
    let u = workload_with(env, "u", "lq", false).await?;
    let [first_name, second_name] =
        names::request_names("u", &u.uid().unwrap_or_default(), &c.p.check, 1);
    let user_template = names::pod_template_name(&second_name, "main");
    let pt: PodTemplate = serde_json::from_value(json!({
        "metadata": {"name": user_template},
        "template": {"spec": {"containers": [{"name": "c", "image": "registry.invalid/user:1"}]}},
    }))?;
    let ut = templates(env).create(&PostParams::default(), &pt).await?;
    let pr: ProvisioningRequest = serde_json::from_value(json!({
        "apiVersion": "autoscaling.x-k8s.io/v1",
        "kind": "ProvisioningRequest",
        "metadata": {"name": first_name},
        "spec": {
            "provisioningClassName": "user.example.com",
            "podSets": [{"podTemplateRef": {"name": user_template}, "count": 1}],
        },
    }))?;
    let ur = env
        .provisioning_requests()
        .create(&PostParams::default(), &pr)
        .await?;
    let on = json!({"spec": {"active": true}});
    env.workloads()
        .patch("u", &PatchParams::default(), &Patch::Merge(&on))
        .await?;
    let stuck = env
        .wait_workload("u", "Pending, naming the user's objects", |w| {
            w.admission_check(&c.p.check).is_some_and(|e| {
                e.state == CheckState::Pending
                    && e.message.contains("cannot create a ProvisioningRequest")
                    && e.message
                        .contains(&format!("ProvisioningRequest {}/{first_name}", env.ns))
                    && e.message
                        .contains(&format!("PodTemplate {}/{user_template}", env.ns))
                    && e.message.contains("delete them if they are stale")
            })
        })
        .await?;
    ensure!(!stuck.condition_is_true(cond::ADMITTED), "{}", dump(&stuck));
    assert_eq!(
        version(&env.provisioning_requests().get(&first_name).await?),
        version(&ur)
    );
    assert_eq!(
        version(&templates(env).get(&user_template).await?),
        version(&ut)
    );

    // The user removes the request; the next pass takes the first name.
    env.provisioning_requests()
        .delete(&first_name, &Default::default())
        .await?;
    let poke = json!({"metadata": {"labels": {"e2e.kueue-admission-checks.dev/poke": "1"}}});
    env.workloads()
        .patch("u", &PatchParams::default(), &Patch::Merge(&poke))
        .await?;
    wait_ready_on(env, "u", &c.p.check, &first_name).await?;
    c.assert_ours(&first_name, &u).await?;
    assert_eq!(
        version(&templates(env).get(&user_template).await?),
        version(&ut)
    );
    c.stop().await
}
