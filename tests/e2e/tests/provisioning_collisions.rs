//! Request names that collide: ours and Kueue's built-in check, two Workloads of ours, and a
//! user's objects. A name is `<workload>-<check>-<attempt>` for both controllers, so Workload
//! `w-k` with our check `<ns>-prov` and Workload `w` with Kueue's check `k-<ns>-prov` both want
//! `w-k-<ns>-prov-1`. Whatever holds a name first, nothing that is not ours is deleted, changed
//! or named in our podSetUpdates, and every Workload is admitted or told why not.

use anyhow::{Context, Result, ensure};
use autoscaler_simulator as simulator;
use e2e::Running;
use e2e::provisioning::{History, Provisioning};
use e2e::{TestEnv, dump, wait_for};
use k8s_openapi::api::core::v1::PodTemplate;
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};
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
        let flavor = &self.p.flavor;
        env.named_queues("kueue-cq", "kueue-lq", flavor, "4", &[&self.kueue_check])
            .await?;
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
        let template = self
            .env
            .pod_templates()
            .get(&names::pod_template_name(&self.shared, "main"))
            .await?;
        assert_kueues(&request, &template, &theirs)?;
        Ok((entry, request, template))
    }

    /// A second check of ours (same controller and config) whose name ends with `-<first
    /// check>`: it takes Kueue's check's name, `k-<our check>`, with ClusterQueue `cq2` and
    /// LocalQueue `lq2`; returns its name.
    async fn add_second_check_of_ours(&self) -> Result<String> {
        let env = &self.env;
        let spec = AdmissionCheckSpec {
            controller_name: self.p.controller_name.clone(),
            parameters: Some(AdmissionCheckParametersReference {
                api_group: "kueue.x-k8s.io".into(),
                kind: "ProvisioningRequestConfig".into(),
                name: self.p.config.clone(),
            }),
        };
        let second = Api::<AdmissionCheck>::all(env.client.clone())
            .create(
                &PostParams::default(),
                &AdmissionCheck::new(&self.kueue_check, spec),
            )
            .await?
            .name_any();
        env.named_queues("cq2", "lq2", &self.p.flavor, "4", &[&second])
            .await?;
        Ok(second)
    }

    /// The request `name` and its PodTemplate (of podset `main`), as they are now.
    async fn request_and_template(&self, name: &str) -> Result<(ProvisioningRequest, PodTemplate)> {
        let request = self.env.provisioning_requests().get(name).await?;
        let template = self
            .env
            .pod_templates()
            .get(&names::pod_template_name(name, "main"))
            .await?;
        Ok((request, template))
    }

    /// (uid, resourceVersion) of the request `name` and of its PodTemplate, as they are now.
    async fn versions(&self, name: &str) -> Result<(Version, Version)> {
        let (request, template) = self.request_and_template(name).await?;
        Ok((version(&request), version(&template)))
    }

    /// Waits until Kueue's entry on its Workload is `Pending`, reporting the shared name taken.
    async fn kueues_entry_reporting_the_name_taken(&self) -> Result<Workload> {
        self.env
            .wait_workload(self.theirs, "Kueue's entry reporting the name taken", |w| {
                w.admission_check(&self.kueue_check).is_some_and(|e| {
                    e.state == CheckState::Pending
                        && e.message.contains(&self.shared)
                        && e.message.contains("already exists")
                })
            })
            .await
    }

    /// Waits until our entry on `wl` is `Pending` with a message naming the user's request and
    /// PodTemplate and what to do about them.
    async fn pending_naming(&self, wl: &str, user: &UsersObjects) -> Result<Workload> {
        let ns = &self.env.ns;
        let request = format!("ProvisioningRequest {ns}/{}", user.request.name_any());
        let template = format!("PodTemplate {ns}/{}", user.template.name_any());
        self.env
            .wait_workload(wl, "Pending, naming the user's objects", |w| {
                w.admission_check(&self.p.check).is_some_and(|e| {
                    e.state == CheckState::Pending
                        && e.message.contains("cannot create a ProvisioningRequest")
                        && e.message.contains(&request)
                        && e.message.contains(&template)
                        && e.message.contains("delete them if they are stale")
                })
            })
            .await
    }

    /// Whether a message of our entry on our Workload, as `history` saw them, explained why
    /// its request is `alt`: it names that request, the shared name and Kueue's built-in check.
    fn explained_the_name(&self, history: &History<Workload>, alt: &str) -> bool {
        let request = format!("ProvisioningRequest {}/{alt}", self.env.ns);
        history.applied().iter().any(|w| {
            w.name_any() == self.ours
                && w.admission_check(&self.p.check).is_some_and(|e| {
                    e.message.contains(&request)
                        && e.message.contains(&self.shared)
                        && e.message.contains("Kueue's built-in")
                })
        })
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

/// (uid, resourceVersion) of an object: equal while it is neither replaced nor changed.
type Version = (String, String);

/// (uid, resourceVersion) of an object that must not change.
fn version<K: ResourceExt>(k: &K) -> Version {
    (
        k.uid().unwrap_or_default(),
        k.resource_version().unwrap_or_default(),
    )
}

/// (uid, resourceVersion) of the ProvisioningRequest `name` now.
async fn request_version(env: &TestEnv, name: &str) -> Result<Version> {
    Ok(version(&env.provisioning_requests().get(name).await?))
}

/// (uid, resourceVersion) of the PodTemplate `name` now.
async fn template_version(env: &TestEnv, name: &str) -> Result<Version> {
    Ok(version(&env.pod_templates().get(name).await?))
}

/// The first name of attempt 1's request for Workload `wl` on `check` is taken: the other one,
/// made from its uid.
fn alternative(wl: &Workload, check: &str) -> String {
    names::alternative_request_name(&wl.name_any(), &wl.uid().unwrap_or_default(), check, 1)
}

/// A user's ProvisioningRequest and PodTemplate on the names a Workload of ours may use.
struct UsersObjects {
    request: ProvisioningRequest,
    template: PodTemplate,
}

impl UsersObjects {
    /// A user's request on the first name of `wl`'s attempt 1 on `check`, and a user's
    /// PodTemplate on the template name of its second (alternative) name.
    async fn on_the_names_of(env: &TestEnv, wl: &Workload, check: &str) -> Result<Self> {
        let uid = wl.uid().unwrap_or_default();
        let [first_name, second_name] = names::request_names(&wl.name_any(), &uid, check, 1);
        let user_template = names::pod_template_name(&second_name, "main");
        let pt: PodTemplate = serde_json::from_value(json!({
            "metadata": {"name": user_template},
            "template": {"spec": {"containers": [{"name": "c", "image": "registry.invalid/user:1"}]}},
        }))?;
        let template = env
            .pod_templates()
            .create(&PostParams::default(), &pt)
            .await?;
        let pr: ProvisioningRequest = serde_json::from_value(json!({
            "apiVersion": "autoscaling.x-k8s.io/v1",
            "kind": "ProvisioningRequest",
            "metadata": {"name": first_name},
            "spec": {
                "provisioningClassName": "user.example.com",
                "podSets": [{"podTemplateRef": {"name": user_template}, "count": 1}],
            },
        }))?;
        let request = env
            .provisioning_requests()
            .create(&PostParams::default(), &pr)
            .await?;
        Ok(Self { request, template })
    }

    /// The user deletes the request; returns its name.
    async fn remove_request(&self, env: &TestEnv) -> Result<String> {
        let name = self.request.name_any();
        env.provisioning_requests()
            .delete(&name, &Default::default())
            .await?;
        Ok(name)
    }
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
    let kueues = (version(&kr), version(&kt));
    let ours = c.submit_ours().await?;
    let alt = alternative(&ours, &c.p.check);
    wait_ready_on(env, c.ours, &c.p.check, &alt).await?;
    c.assert_ours(&alt, &ours).await?;
    assert_eq!(env.our_requests().await?, std::slice::from_ref(&alt));
    let our_template = names::pod_template_name(&alt, "main");
    assert_eq!(env.our_pod_templates().await?, [our_template]);
    // Our entry said why the usual name was not used: when the request was created, or (made
    // at the reservation, before the entry existed) in each answer about it.
    let said = c.explained_the_name(&history, &alt);
    ensure!(said, "no message of our entry explained the name");

    // Both controllers reconcile both Workloads again (a label change wakes each).
    env.touch_workload(c.ours, "1").await?;
    env.touch_workload(c.theirs, "1").await?;
    wait_ready(env, c.ours, &c.p.check).await?;
    let again = wait_ready(env, c.theirs, &c.kueue_check).await?;
    assert_eq!(again, theirs_entry);
    assert_eq!(c.versions(&c.shared).await?, kueues);
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
    let alt = alternative(&ours, &c.p.check);
    let ours_entry = wait_ready_on(env, c.ours, &c.p.check, &alt).await?;
    assert_eq!(request_names(env).await?, std::slice::from_ref(&alt));
    let ours_before = c.versions(&alt).await?;

    c.admit_theirs().await?;
    // Ours untouched, still admitted on its own request.
    assert_eq!(c.versions(&alt).await?, ours_before);
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
    let ours_before = c.versions(&c.shared).await?;

    c.add_kueue_check().await?;
    c.submit_theirs().await?;
    let blocked = c.kueues_entry_reporting_the_name_taken().await?;
    let admitted = blocked.condition_is_true(cond::ADMITTED);
    ensure!(!admitted, "{}", dump(&blocked));
    // Kueue deleted, replaced and changed nothing of ours; ours stays admitted on it.
    let (or, ot) = c.request_and_template(&c.shared).await?;
    let ours_now = (version(&or), version(&ot));
    assert_eq!(ours_now, ours_before, "{}", dump(&ot));
    assert_eq!(wait_ready(env, c.ours, &c.p.check).await?, ours_entry);

    // Our Workload is done (deactivated): our request and template go.
    env.set_workload_active(c.ours, false).await?;
    env.wait_nothing_left().await?;
    // Kueue retries with a growing backoff; a change of its Workload makes it retry now.
    env.touch_workload(c.theirs, "1").await?;
    wait_ready_on(env, c.theirs, &c.kueue_check, &c.shared).await?;
    let theirs = env.workloads().get(c.theirs).await?;
    let (kr, kt) = c.request_and_template(&c.shared).await?;
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
    // A second check of ours whose name ends with `-<first check>`, on LocalQueue `lq2`.
    let second = c.add_second_check_of_ours().await?;
    c.submit_ours().await?;
    let first = wait_ready_on(env, c.ours, &c.p.check, &c.shared).await?;
    let first_request = request_version(env, &c.shared).await?;
    let alt = alternative(&workload(env, c.theirs, "lq2").await?, &second);
    wait_ready_on(env, c.theirs, &second, &alt).await?;
    assert_eq!(request_version(env, &c.shared).await?, first_request);
    assert_eq!(wait_ready(env, c.ours, &c.p.check).await?, first);
    // A user's request on the first name of Workload `u`, and a user's PodTemplate on the
    // template name of its second. `u` is created inactive (its uid gives the second name) and
    // activated once they exist.
    let u = workload_with(env, "u", "lq", false).await?;
    let user = UsersObjects::on_the_names_of(env, &u, &c.p.check).await?;
    let (ur, ut) = (&user.request, &user.template);
    env.set_workload_active("u", true).await?;
    let stuck = c.pending_naming("u", &user).await?;
    ensure!(!stuck.condition_is_true(cond::ADMITTED), "{}", dump(&stuck));
    assert_eq!(request_version(env, &ur.name_any()).await?, version(ur));
    assert_eq!(template_version(env, &ut.name_any()).await?, version(ut));
    // The user removes the request; the next pass takes the first name.
    let first_name = user.remove_request(env).await?;
    env.touch_workload("u", "1").await?;
    wait_ready_on(env, "u", &c.p.check, &first_name).await?;
    c.assert_ours(&first_name, &u).await?;
    assert_eq!(template_version(env, &ut.name_any()).await?, version(ut));
    c.stop().await
}
