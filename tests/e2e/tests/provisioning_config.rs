//! The provisioning controller's ProvisioningRequestConfig features against the real Kueue, with
//! the autoscaler simulator playing cluster-autoscaler: merge policies on multi-podset
//! Workloads, `managedResources`, parameter overrides from Workload annotations, missing or
//! invalid parameters, coexistence with Kueue's built-in check, and names longer than 253.
//!
//! batch/v1 Jobs have a single podset, so the multi-podset cases submit plain Kueue Workloads
//! (Kueue admits a standalone Workload with `spec.queueName` like any other).

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, ensure};
use autoscaler_simulator as simulator;
use e2e::Running;
use e2e::provisioning::Provisioning;
use e2e::{TestEnv, dump, wait_for};
use k8s_openapi::api::core::v1::PodTemplate;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kueue_admission_sdk::api::{
    AdmissionCheck, AdmissionCheckState, AdmissionCheckStrategyRule, AdmissionChecksStrategy,
    CheckState, ClusterQueue, ClusterQueueSpec, FlavorQuotas, ProvisioningRequest,
    ProvisioningRequestConfig, ResourceGroup, ResourceQuota, Workload, find_condition,
    workload_condition as cond,
};
use kueue_provisioning_controller::config::TIMEOUT_ANNOTATION;
use kueue_provisioning_controller::outcome::{CLASS_ANNOTATION, CONSUME_ANNOTATION};
use kueue_provisioning_controller::{identity, names};
use serde_json::{Value, json};

/// Kueue's built-in ProvisioningRequest check.
const KUEUE_CONTROLLER_NAME: &str = "kueue.x-k8s.io/provisioning-request";

// --- helpers ---------------------------------------------------------------------------------

/// A container of a podset template: `image`, `requests` (and the same `limits` for extended
/// resources, which Kubernetes requires to equal their requests), extra fields merged in.
fn container(image: &str, requests: Value, extra: Value) -> Value {
    let mut c = json!({
        "name": "main",
        "image": image,
        "resources": {"requests": requests},
    });
    if let (Some(c), Some(extra)) = (c.as_object_mut(), extra.as_object()) {
        for (k, v) in extra {
            c.insert(k.clone(), v.clone());
        }
    }
    c
}

/// A podset of `count` pods running `container`, the template annotated with `annotations`.
fn pod_set(name: &str, count: i32, container: Value, annotations: Value) -> Value {
    json!({
        "name": name,
        "count": count,
        "template": {
            "metadata": {"annotations": annotations},
            "spec": {"restartPolicy": "Never", "containers": [container]},
        },
    })
}

/// Creates a plain Kueue Workload in `queue` with these podsets and annotations.
async fn plain_workload(
    env: &TestEnv,
    name: &str,
    queue: &str,
    annotations: Value,
    pod_sets: Vec<Value>,
) -> Result<Workload> {
    let wl: Workload = serde_json::from_value(json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": name, "namespace": env.ns, "annotations": annotations},
        "spec": {"queueName": queue, "podSets": pod_sets},
    }))?;
    env.create_workload(&wl).await
}

/// Waits until the named ProvisioningRequest exists.
async fn wait_request(env: &TestEnv, name: &str) -> Result<ProvisioningRequest> {
    wait_for(env.provisioning_requests(), name, "to exist", |_| true).await
}

/// (template name, count) of each podset of a request.
fn request_pod_sets(r: &ProvisioningRequest) -> Vec<(String, i32)> {
    r.spec
        .pod_sets
        .iter()
        .map(|p| (p.pod_template_ref.name.clone(), p.count))
        .collect()
}

/// Checks the podSetUpdates of a Ready entry: exactly `pod_sets` (in any order), each with the
/// two autoscaler annotations naming `request` and `class`, and nothing else.
fn assert_pod_set_updates(
    entry: &AdmissionCheckState,
    pod_sets: &[&str],
    request: &str,
    class: &str,
) -> Result<()> {
    let mut names: Vec<&str> = entry
        .pod_set_updates
        .iter()
        .map(|u| u.name.as_str())
        .collect();
    names.sort_unstable();
    let mut want = pod_sets.to_vec();
    want.sort_unstable();
    ensure!(
        names == want,
        "podSetUpdates are for {names:?}, expected one for each of {want:?}: {entry:?}"
    );
    let annotations = BTreeMap::from([
        (CONSUME_ANNOTATION.to_string(), request.to_string()),
        (CLASS_ANNOTATION.to_string(), class.to_string()),
    ]);
    for u in &entry.pod_set_updates {
        ensure!(
            u.annotations == annotations,
            "podset {}: annotations {:?}, expected {annotations:?}",
            u.name,
            u.annotations
        );
        ensure!(
            u.labels.is_empty() && u.node_selector.is_empty() && u.tolerations.is_empty(),
            "podset {}: unexpected updates {u:?}",
            u.name
        );
    }
    Ok(())
}

/// A ClusterQueue for all namespaces with quotas for several resources in one flavor.
async fn cluster_queue_with(
    env: &TestEnv,
    name: &str,
    flavor: &str,
    quotas: &[(&str, &str)],
    checks: &[&str],
) -> Result<String> {
    let spec = ClusterQueueSpec {
        namespace_selector: Some(Default::default()),
        resource_groups: vec![ResourceGroup {
            covered_resources: quotas.iter().map(|(r, _)| r.to_string()).collect(),
            flavors: vec![FlavorQuotas {
                name: flavor.into(),
                resources: quotas
                    .iter()
                    .map(|(r, q)| ResourceQuota {
                        name: r.to_string(),
                        nominal_quota: k8s_openapi::apimachinery::pkg::api::resource::Quantity(
                            q.to_string(),
                        ),
                    })
                    .collect(),
            }],
        }],
        admission_checks_strategy: Some(AdmissionChecksStrategy {
            admission_checks: checks
                .iter()
                .map(|c| AdmissionCheckStrategyRule {
                    name: c.to_string(),
                    on_flavors: vec![],
                })
                .collect(),
        }),
    };
    let cq = Api::<ClusterQueue>::all(env.client.clone())
        .create(
            &PostParams::default(),
            &ClusterQueue::new(&env.cluster_name(name), spec),
        )
        .await
        .with_context(|| format!("creating ClusterQueue {name}"))?;
    Ok(cq.name_any())
}

/// Requests created by a controller so far (its `kueue_provisioning_requests_created_total`).
async fn created_count(controller: &Running, check: &str) -> Result<f64> {
    let addr = controller
        .http
        .ok_or_else(|| anyhow!("the controller serves no metrics"))?;
    let (status, body) = e2e::http_get(addr, "/metrics").await?;
    ensure!(status == 200, "/metrics answered {status}");
    let series = format!("kueue_provisioning_requests_created_total{{check=\"{check}\"}}");
    Ok(e2e::metric_sample(&body, &series).unwrap_or(0.0))
}

/// (name, uid) of every ProvisioningRequest of the test namespace, sorted.
async fn all_requests(env: &TestEnv) -> Result<Vec<(String, String)>> {
    let mut all: Vec<(String, String)> = env
        .provisioning_requests()
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(|r| (r.name_any(), r.uid().unwrap_or_default()))
        .collect();
    all.sort();
    Ok(all)
}

/// Asserts, for `duration`, polling, that the namespace holds exactly `expected` requests
/// (names and uids): nothing deleted, recreated or added.
async fn assert_requests_stay(
    env: &TestEnv,
    expected: &[(String, String)],
    duration: Duration,
) -> Result<()> {
    let deadline = tokio::time::Instant::now() + duration;
    while tokio::time::Instant::now() < deadline {
        let now = all_requests(env).await?;
        ensure!(
            now == expected,
            "the requests changed: {now:?}, expected them to stay {expected:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// Waits until Kueue has judged the Workload and refused it quota because its ClusterQueue `cq`
/// is inactive (`QuotaReserved=False`, `Inadmissible`, "ClusterQueue <cq> is inactive": the
/// cause, not a quiet moment), and that it holds no quota and is not admitted.
async fn assert_not_admitted(env: &TestEnv, workload: &str, cq: &str) -> Result<()> {
    let refused = format!("ClusterQueue {cq} is inactive");
    let wl = env
        .wait_workload(
            workload,
            "QuotaReserved=False: the ClusterQueue is inactive",
            |w| {
                w.status
                    .as_ref()
                    .and_then(|s| find_condition(&s.conditions, cond::QUOTA_RESERVED))
                    .is_some_and(|c| {
                        c.status == "False" && c.reason == "Inadmissible" && c.message == refused
                    })
            },
        )
        .await?;
    ensure!(
        !wl.condition_is_true(cond::ADMITTED),
        "Workload {workload} admitted on an inactive check:\n{}",
        dump(&wl)
    );
    Ok(())
}

/// Starts this test's controller (no default timeout) and the simulator serving its class.
fn controller_and_simulator(env: &TestEnv) -> Result<(Running, Running)> {
    let controller = env.start_provisioning_controller(None)?;
    let simulator = env.start_simulator()?;
    Ok((controller, simulator))
}

/// Waits until the AdmissionCheck `check` is `Active=<status>` with `reason`; returns the
/// condition.
async fn check_active(env: &TestEnv, check: &str, status: &str, reason: &str) -> Result<Condition> {
    env.wait_active::<AdmissionCheck>(check, status, Some(reason))
        .await
}

/// Submits Job `name` of one pod of 1 cpu, without annotations, to `queue`; returns its
/// Workload.
async fn one_pod_job(env: &TestEnv, name: &str, queue: &str) -> Result<Workload> {
    let job = env
        .job_with_pod_annotations(name, queue, "1", 1, &[])
        .await?;
    env.workload_for_job(&job).await
}

/// (template name, count) of each podset of the named request, read now.
async fn requested_pod_sets(env: &TestEnv, request: &str) -> Result<Vec<(String, i32)>> {
    let r = env.provisioning_requests().get(request).await?;
    Ok(request_pod_sets(&r))
}

/// A map of strings from these pairs (a request's parameters, say).
fn string_map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Waits until the Workload's Job is started; returns the request its pods consume (the
/// autoscaler annotation of its pod template).
async fn consumed_request(env: &TestEnv, job: &str) -> Result<Option<String>> {
    let j = env.wait_job_unsuspended(job).await?;
    let annotations = j
        .spec
        .and_then(|s| s.template.metadata)
        .and_then(|m| m.annotations)
        .unwrap_or_default();
    Ok(annotations.get(CONSUME_ANNOTATION).cloned())
}

/// Waits until ClusterQueue `cq` is inactive because of its check, submits Job `job` to
/// `queue`, and checks that Kueue refuses it quota for that ([`assert_not_admitted`]); returns
/// its Workload's name.
async fn refused_while_queue_inactive(
    env: &TestEnv,
    job: &str,
    queue: &str,
    cq: &str,
) -> Result<String> {
    env.wait_active::<ClusterQueue>(cq, "False", Some("AdmissionCheckInactive"))
        .await?;
    let wl = env.submit_job(job, queue, "1").await?;
    assert_not_admitted(env, &wl, cq).await?;
    Ok(wl)
}

// --- 1. merge policies ---------------------------------------------------------------------

/// Four podsets: `a`; `b` with other CPU requests (a scheduling requirement); `c` differing from
/// `a` only in its image and an env var (not scheduling requirements); `d` identical to `a`.
fn four_pod_sets() -> Vec<Value> {
    let one_cpu = || json!({"cpu": "1"});
    vec![
        pod_set(
            "a",
            1,
            container("registry.invalid/app:1", one_cpu(), json!({})),
            json!({}),
        ),
        pod_set(
            "b",
            2,
            container("registry.invalid/app:1", json!({"cpu": "2"}), json!({})),
            json!({}),
        ),
        pod_set(
            "c",
            3,
            container(
                "registry.invalid/other:2",
                one_cpu(),
                json!({"env": [{"name": "MODE", "value": "other"}]}),
            ),
            json!({}),
        ),
        pod_set(
            "d",
            4,
            container("registry.invalid/app:1", one_cpu(), json!({})),
            json!({}),
        ),
    ]
}

/// Runs the four-podset Workload through a config with `policy` and checks the request has
/// exactly `groups` (first member, count) in order, every podset gets its updates, the
/// Workload is admitted, and deleting it leaves nothing behind.
async fn merge_case(test: &str, policy: Option<&str>, groups: &[(&str, i32)]) -> Result<()> {
    let env = TestEnv::new(test).await?;
    let spec = match policy {
        Some(p) => json!({"podSetMergePolicy": p}),
        None => json!({}),
    };
    let p = env.provisioning(spec, "20").await?;
    let controller = env.start_provisioning_controller(None)?;
    let simulator = env.start_simulator()?;
    plain_workload(&env, "multi", "lq", json!({}), four_pod_sets()).await?;
    let (_, entry) = env.wait_admitted_ready("multi", &p.check).await?;

    let request = names::request_name("multi", &p.check, 1);
    assert_eq!(request, format!("multi-{}-1", p.check));
    assert_eq!(env.our_requests().await?, std::slice::from_ref(&request));
    let r = env.provisioning_requests().get(&request).await?;
    let want: Vec<(String, i32)> = groups
        .iter()
        .map(|(first, count)| (format!("ppt-{request}-{first}"), *count))
        .collect();
    assert_eq!(request_pod_sets(&r), want, "policy {policy:?}");
    assert_eq!(r.spec.provisioning_class_name, p.class);

    // One PodTemplate per group: the first member's template plus the flavor's additions.
    let mut templates = env.our_pod_templates().await?;
    templates.sort();
    let mut want_templates: Vec<String> = want.iter().map(|(t, _)| t.clone()).collect();
    want_templates.sort();
    assert_eq!(templates, want_templates);
    let pts: Api<PodTemplate> = Api::namespaced(env.client.clone(), &env.ns);
    let first = pts.get(&format!("ppt-{request}-a")).await?;
    let spec = first
        .template
        .and_then(|t| t.spec)
        .ok_or_else(|| anyhow!("template without spec"))?;
    assert_eq!(
        spec.containers[0].image.as_deref(),
        Some("registry.invalid/app:1")
    );
    assert_eq!(
        spec.node_selector,
        Some(BTreeMap::from([("pool".to_string(), "pool".to_string())]))
    );
    let tolerations = spec.tolerations.unwrap_or_default();
    assert!(
        tolerations
            .iter()
            .any(|t| t.key.as_deref() == Some("dedicated")
                && t.value.as_deref() == Some("pool")
                && t.effect.as_deref() == Some("NoSchedule")),
        "{tolerations:?}"
    );

    // Every podset gets its updates, merged ones included.
    assert_eq!(
        entry.message,
        format!("ProvisioningRequest {}/{request} provisioned", env.ns)
    );
    assert_pod_set_updates(&entry, &["a", "b", "c", "d"], &request, &p.class)?;

    // A deleted Workload leaves nothing behind.
    env.workloads()
        .delete("multi", &DeleteParams::background())
        .await?;
    env.wait_nothing_left().await?;
    e2e::Running::stop_all([controller, simulator]).await
}

/// Each podSetMergePolicy groups the four podsets as documented (the cases run at once, each
/// in its own namespace):
/// - none: nothing is merged, one request podset per Workload podset;
/// - `IdenticalPodTemplates` merges only the identical `a` and `d` (counts 1 + 4);
/// - `IdenticalWorkloadSchedulingRequirements` also merges `c`, which differs from `a` only in
///   its image and env (counts 1 + 3 + 4), but not `b`, whose requests differ.
#[tokio::test]
async fn each_merge_policy_groups_the_podsets_it_should() -> Result<()> {
    futures::future::try_join_all([
        merge_case(
            "prc-merge-none",
            None,
            &[("a", 1), ("b", 2), ("c", 3), ("d", 4)],
        ),
        merge_case(
            "prc-merge-templates",
            Some("IdenticalPodTemplates"),
            &[("a", 5), ("b", 2), ("c", 3)],
        ),
        merge_case(
            "prc-merge-sched",
            Some("IdenticalWorkloadSchedulingRequirements"),
            &[("a", 8), ("b", 2)],
        ),
    ])
    .await?;
    Ok(())
}

// --- 2. managedResources -------------------------------------------------------------------

const GPU: &str = "example.com/gpu";

/// The entry's message when no podset of the Workload needs capacity.
const NO_REQUEST_NEEDED: &str = "no podset needs capacity: the provisioning request is not needed";

/// A config with `managedResources: [example.com/gpu]` and its world with 10 cpu on `lq`, plus
/// ClusterQueue `cq-gpu` on the same flavor, guarded by the same check, with 10 cpu and 4 GPUs,
/// and LocalQueue `lq-gpu` in it.
async fn managed_gpus_and_their_queue(env: &TestEnv) -> Result<Provisioning> {
    let p = env
        .provisioning(json!({"managedResources": [GPU]}), "10")
        .await?;
    let gpu_cq = cluster_queue_with(
        env,
        "cq-gpu",
        &p.flavor,
        &[("cpu", "10"), (GPU, "4")],
        &[&p.check],
    )
    .await?;
    env.local_queue("lq-gpu", &gpu_cq).await?;
    Ok(p)
}

/// Podset `cpu` (one pod of 1 cpu) and podset `gpu` (two pods of 1 cpu and 1 GPU each).
fn cpu_and_gpu_pod_sets() -> Vec<Value> {
    vec![
        pod_set(
            "cpu",
            1,
            container("registry.invalid/app:1", json!({"cpu": "1"}), json!({})),
            json!({}),
        ),
        pod_set(
            "gpu",
            2,
            container(
                "registry.invalid/app:1",
                json!({"cpu": "1", GPU: "1"}),
                json!({"resources": {"requests": {"cpu": "1", GPU: "1"}, "limits": {GPU: "1"}}}),
            ),
            json!({}),
        ),
    ]
}

/// With `managedResources: [example.com/gpu]`: a Job without GPUs needs no request and is
/// admitted at once; a Workload with a GPU podset and a CPU podset gets a request for the GPU
/// podset only.
#[tokio::test]
async fn managed_resources_select_the_podsets_that_need_capacity() -> Result<()> {
    let env = TestEnv::new("prc-managed").await?;
    let p = managed_gpus_and_their_queue(&env).await?;
    let (controller, simulator) = controller_and_simulator(&env)?;

    // No GPU: Ready without a request.
    let cpu_wl = one_pod_job(&env, "cpu-only", "lq").await?.name_any();
    let (_, entry) = env.wait_admitted_ready(&cpu_wl, &p.check).await?;
    assert_eq!(entry.message, NO_REQUEST_NEEDED);
    assert!(entry.pod_set_updates.is_empty(), "{entry:?}");
    env.wait_job_unsuspended("cpu-only").await?;
    assert_eq!(env.our_requests().await?, Vec::<String>::new());
    assert_eq!(all_requests(&env).await?, []);

    // One GPU podset (listed second) and one CPU podset: only the GPU one is requested.
    plain_workload(&env, "mixed", "lq-gpu", json!({}), cpu_and_gpu_pod_sets()).await?;
    let (_, entry) = env.wait_admitted_ready("mixed", &p.check).await?;
    let request = format!("mixed-{}-1", p.check);
    assert_eq!(env.our_requests().await?, std::slice::from_ref(&request));
    let only_gpu = format!("ppt-{request}-gpu");
    assert_eq!(
        requested_pod_sets(&env, &request).await?,
        [(only_gpu.clone(), 2)],
        "only the GPU podset needs capacity"
    );
    assert_eq!(env.our_pod_templates().await?, [only_gpu]);
    assert_pod_set_updates(&entry, &["gpu"], &request, &p.class)?;
    e2e::Running::stop_all([controller, simulator]).await
}

// --- 3. parameter overrides ----------------------------------------------------------------

/// Submits Job `job` annotated `provreq.kueue.x-k8s.io/b: from-workload`, provisioned 3 s after
/// the simulator accepts its request; returns its Workload once Kueue made it.
async fn job_overriding_parameter_b(env: &TestEnv) -> Result<Workload> {
    // The annotation goes on the Job: Kueue copies `provreq.kueue.x-k8s.io/` annotations of the
    // job to its Workload (jobframework.NewWorkload). The simulator provisions after 3 s, so
    // the controller looks at the pending request several times first.
    let job = env
        .create_job(&e2e::SuspendedJob {
            annotations: &[("provreq.kueue.x-k8s.io/b", "from-workload")],
            pod_annotations: &[(simulator::SCRIPT_ANNOTATION, "provision:3")],
            ..e2e::SuspendedJob::new("job", "lq", "1")
        })
        .await?;
    env.workload_for_job(&job).await
}

/// Config parameters `{a, b}` and a Job annotated `provreq.kueue.x-k8s.io/b`: Kueue copies the
/// annotation to the Workload, the request gets `{a: from-config, b: from-workload}`, and the
/// request is never judged out of date and recreated (upstream's loop): one request, one uid,
/// one creation, while it waits to be provisioned and after admission.
#[tokio::test]
async fn workload_annotations_override_parameters_without_a_recreate_loop() -> Result<()> {
    let env = TestEnv::new("prc-overrides").await?;
    let parameters = json!({"parameters": {"a": "from-config", "b": "from-config"}});
    let p = env.provisioning(parameters, "4").await?;
    let (controller, simulator) = controller_and_simulator(&env)?;
    let wl = job_overriding_parameter_b(&env).await?;
    assert_eq!(
        wl.annotations()
            .get("provreq.kueue.x-k8s.io/b")
            .map(String::as_str),
        Some("from-workload"),
        "Kueue copies the Job's provreq annotations to the Workload:\n{}",
        dump(&wl)
    );

    let wl_name = wl.name_any();
    let request = format!("{wl_name}-{}-1", p.check);
    let first = wait_request(&env, &request).await?;
    let want = [("a", "from-config"), ("b", "from-workload")];
    assert_eq!(first.spec.parameters, string_map(&want));
    let (_, entry) = env.wait_admitted_ready(&wl_name, &p.check).await?;
    assert_pod_set_updates(&entry, &["main"], &request, &p.class)?;
    // And it stays: no deletion, no second request.
    let only = [(request.clone(), first.uid().unwrap_or_default())];
    assert_requests_stay(&env, &only, Duration::from_secs(4)).await?;
    assert_eq!(env.our_requests().await?, std::slice::from_ref(&request));
    assert_eq!(created_count(&controller, &p.check).await?, 1.0);
    let wl = env.workloads().get(&wl_name).await?;
    let admitted = wl.condition_is_true(cond::ADMITTED);
    ensure!(admitted, "no longer admitted:\n{}", dump(&wl));
    e2e::Running::stop_all([controller, simulator]).await
}

// --- 4. missing or wrong parameters --------------------------------------------------------

/// Parameters naming a config that does not exist: `Active=False` (`BadParametersRef`) naming
/// it, the ClusterQueue inactive and the Job not admitted; creating the config makes the check
/// active and the Job admitted.
#[tokio::test]
async fn a_missing_config_makes_the_check_inactive_until_it_is_created() -> Result<()> {
    let env = TestEnv::new("prc-missing").await?;
    let controller_name = env.provisioning_controller_name();
    let config = env.cluster_name("prc");
    let check = env
        .provisioning_check("prov", &controller_name, &config)
        .await?;
    let (_, cq) = env.pool_queues("4", &[&check]).await?;
    let (controller, simulator) = controller_and_simulator(&env)?;

    let c = check_active(&env, &check, "False", "BadParametersRef").await?;
    ensure!(
        c.message.contains(&format!("{config:?}")) && c.message.contains("does not exist"),
        "the message should name the missing ProvisioningRequestConfig: {c:?}"
    );
    let wl = refused_while_queue_inactive(&env, "job", "lq", &cq).await?;

    // Creating the config fixes it.
    let created = env.provisioning_config("prc", json!({})).await?;
    assert_eq!(created, config);
    let c = check_active(&env, &check, "True", "Active").await?;
    ensure!(!c.message.is_empty(), "{c:?}");
    env.wait_admitted_ready(&wl, &check).await?;
    assert_eq!(env.our_requests().await?, [format!("{wl}-{check}-1")]);
    e2e::Running::stop_all([controller, simulator]).await
}

/// ClusterRole rules with what the controller needs to resolve its checks and watch, except
/// `get` on ProvisioningRequestConfigs unless `may_get_configs`.
fn limited_rules(may_get_configs: bool) -> Value {
    let config_verbs: &[&str] = if may_get_configs {
        &["get", "list", "watch"]
    } else {
        &["list", "watch"]
    };
    json!([
        {"apiGroups": ["kueue.x-k8s.io"], "resources": ["admissionchecks", "workloads", "resourceflavors"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["kueue.x-k8s.io"], "resources": ["admissionchecks/status"], "verbs": ["patch"]},
        {"apiGroups": ["kueue.x-k8s.io"], "resources": ["provisioningrequestconfigs"], "verbs": config_verbs},
        {"apiGroups": ["autoscaling.x-k8s.io"], "resources": ["provisioningrequests"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["podtemplates"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
    ])
}

/// The grant of `verb` on ProvisioningRequestConfigs, all namespaces.
fn config_grant(verb: &str) -> e2e::chart::Grant {
    e2e::chart::Grant::cluster("kueue.x-k8s.io", "provisioningrequestconfigs", verb)
}

/// Creates ServiceAccount `controller` with [`limited_rules`] (no `get` on configs), waits
/// until the authorizer allows it `list` and `watch` on configs but denies `get`, and returns
/// a client acting as it.
async fn controller_account_without_get(env: &TestEnv) -> Result<kube::Client> {
    env.grant_cluster_rules("controller", limited_rules(false))
        .await?;
    let client = env.service_account("controller").await?;
    let allowed = [config_grant("list"), config_grant("watch")];
    get_denied_to_controller(env, &allowed).await?;
    Ok(client)
}

/// Gives ServiceAccount `controller` [`limited_rules`] without `get` on configs again, and waits
/// until the authorizer allows `list` but denies `get`.
async fn take_config_get_away(env: &TestEnv) -> Result<()> {
    env.grant_cluster_rules("controller", limited_rules(false))
        .await?;
    get_denied_to_controller(env, &[config_grant("list")]).await
}

/// Waits until the authorizer allows ServiceAccount `controller` the `allowed` grants and
/// denies it `get` on configs.
async fn get_denied_to_controller(env: &TestEnv, allowed: &[e2e::chart::Grant]) -> Result<()> {
    e2e::chart::wait_for_authorizer(
        &env.client,
        &env.ns,
        "controller",
        allowed,
        &[config_grant("get")],
    )
    .await
}

/// Config `prc` (no spec of its own) and check `prov` of this test's controller naming it;
/// returns both cluster-scoped names.
async fn config_and_its_check(env: &TestEnv) -> Result<(String, String)> {
    let config = env.provisioning_config("prc", json!({})).await?;
    let check = env
        .provisioning_check("prov", &env.provisioning_controller_name(), &config)
        .await?;
    Ok((config, check))
}

/// Whether an `Active=False` message names the config the controller may not read and the
/// grant its RBAC lacks.
fn names_config_and_missing_grant(message: &str, config: &str) -> bool {
    message.starts_with(&format!(
        "the controller may not read ProvisioningRequestConfig {config:?} ("
    )) && message.ends_with(
        "); its RBAC must allow get, list and watch on provisioningrequestconfigs.kueue.x-k8s.io",
    ) && message.contains("forbidden")
}

/// The controller's metrics of one check: its sync errors counter and its active gauge.
struct CheckMetrics {
    /// Where the controller serves `/metrics`.
    http: std::net::SocketAddr,
    /// `kueue_ac_check_sync_errors_total` of the check.
    sync_errors: String,
    /// `kueue_ac_check_active` of the check.
    active: String,
}

impl CheckMetrics {
    /// The series of `check` served by `controller`.
    fn of(controller: &Running, check: &str) -> Result<Self> {
        Ok(Self {
            http: controller.http.context("no metrics address")?,
            sync_errors: format!("kueue_ac_check_sync_errors_total{{check=\"{check}\"}}"),
            active: format!("kueue_ac_check_active{{check=\"{check}\"}}"),
        })
    }

    /// The metrics now.
    async fn sample(&self) -> Result<MetricsSample> {
        let text = e2e::http_get(self.http, "/metrics").await?.1;
        Ok(MetricsSample {
            active: e2e::metric_sample(&text, &self.active),
            sync_errors: e2e::metric_sample(&text, &self.sync_errors),
            text,
        })
    }

    /// Waits until the sync errors satisfy `cond`; returns the metrics text then.
    async fn wait_sync_errors(&self, what: &str, cond: impl Fn(f64) -> bool) -> Result<String> {
        e2e::wait_metric_where(self.http, &self.sync_errors, what, cond).await
    }
}

/// [`CheckMetrics`] read once.
struct MetricsSample {
    /// The whole `/metrics` text, for failure messages.
    text: String,
    /// The check's active gauge.
    active: Option<f64>,
    /// The check's sync errors.
    sync_errors: Option<f64>,
}

/// Once the controller has tried again (sync errors at least 2), the check's `Active=False`
/// (`ParametersForbidden`) condition and the metrics then.
async fn retried_while_forbidden(
    env: &TestEnv,
    check: &str,
    metrics: &CheckMetrics,
) -> Result<(Condition, MetricsSample)> {
    metrics.wait_sync_errors("at least 2", |n| n >= 2.0).await?;
    let still = check_active(env, check, "False", "ParametersForbidden").await?;
    Ok((still, metrics.sample().await?))
}

/// Changes the config's `retryStrategy.backoffLimitCount` to 2 (a change the controller
/// watches) and waits until one more sync error is counted; returns the metrics text then.
async fn config_change_counted(
    env: &TestEnv,
    config: &str,
    metrics: &CheckMetrics,
) -> Result<String> {
    let before = metrics.sample().await?.sync_errors.unwrap_or_default();
    Api::<ProvisioningRequestConfig>::all(env.client.clone())
        .patch(
            config,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"retryStrategy": {"backoffLimitCount": 2}}})),
        )
        .await?;
    metrics.wait_sync_errors("one more", |n| n > before).await
}

/// Creates config `name` and makes the AdmissionCheck's parameters name it; returns its
/// cluster-scoped name.
async fn point_check_at_new_config(env: &TestEnv, check: &str, name: &str) -> Result<String> {
    let other = env.provisioning_config(name, json!({})).await?;
    Api::<AdmissionCheck>::all(env.client.clone())
        .patch(
            check,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"parameters": {"name": other}}})),
        )
        .await?;
    Ok(other)
}

/// The controller started as ServiceAccount `controller`, which may not `get` configs, beside
/// config `prc` and check `prov`; the check's `Active=False` condition it showed, and its
/// metrics.
struct Forbidden {
    /// The config's cluster-scoped name.
    config: String,
    /// The check's cluster-scoped name.
    check: String,
    /// The controller under test.
    controller: Running,
    /// The check's `Active=False` (`ParametersForbidden`) condition.
    shown: Condition,
    /// The controller's metrics of the check.
    metrics: CheckMetrics,
}

/// Starts the controller as ServiceAccount `controller` without `get` on configs and checks
/// that the check says `Active=False` (`ParametersForbidden`), naming the config and the
/// missing grant.
async fn check_shows_the_config_forbidden(env: &TestEnv) -> Result<Forbidden> {
    let client = controller_account_without_get(env).await?;
    let (config, check) = config_and_its_check(env).await?;
    let controller = env.start_provisioning_controller_as(client, None)?;
    let c = check_active(env, &check, "False", "ParametersForbidden").await?;
    ensure!(
        names_config_and_missing_grant(&c.message, &config),
        "the message should name the config and the missing grant: {c:?}"
    );
    let metrics = CheckMetrics::of(&controller, &check)?;
    Ok(Forbidden {
        config,
        check,
        controller,
        shown: c,
        metrics,
    })
}

/// Checks that, once the controller has tried again, the check's condition is the one it
/// first showed, and the metrics say inactive with the first try and at least one retry
/// counted.
async fn still_forbidden_after_a_retry(env: &TestEnv, f: &Forbidden) -> Result<()> {
    let (still, now) = retried_while_forbidden(env, &f.check, &f.metrics).await?;
    ensure!(still == f.shown, "{still:?}");
    ensure!(
        now.active == Some(0.0) && now.sync_errors.is_some_and(|n| n >= 2.0),
        "inactive, and the first try and at least one retry counted:\n{}",
        now.text
    );
    Ok(())
}

/// Gives ServiceAccount `controller` `get` on configs and checks that the check becomes
/// `Active=True` ("The admission check is active"); returns that condition.
async fn active_once_get_is_granted(env: &TestEnv, check: &str) -> Result<Condition> {
    env.grant_cluster_rules("controller", limited_rules(true))
        .await?;
    let c = check_active(env, check, "True", "Active").await?;
    ensure!(c.message == "The admission check is active", "{c:?}");
    Ok(c)
}

/// Takes `get` on configs away again and changes the config; checks that the failure is
/// counted while the check stays active (gauge 1) with its condition `active` untouched.
async fn still_active_through_a_forbidden_config_change(
    env: &TestEnv,
    f: &Forbidden,
    active: &Condition,
) -> Result<()> {
    take_config_get_away(env).await?;
    let text = config_change_counted(env, &f.config, &f.metrics).await?;
    let gauge = e2e::metric_sample(&text, &f.metrics.active);
    ensure!(gauge == Some(1.0), "{text}");
    let kept = check_active(env, &f.check, "True", "Active").await?;
    ensure!(kept == *active, "the condition is untouched: {kept:?}");
    Ok(())
}

/// Points the check at new config `prc-other`, which the controller may not read either, and
/// checks that the check says `Active=False` (`ParametersForbidden`) naming it.
async fn forbidden_again_for_a_new_config(env: &TestEnv, check: &str) -> Result<()> {
    let other = point_check_at_new_config(env, check, "prc-other").await?;
    let c = check_active(env, check, "False", "ParametersForbidden").await?;
    ensure!(c.message.contains(&format!("{other:?}")), "{c:?}");
    Ok(())
}

/// A controller whose RBAC does not let it read its config says so on the check
/// (`ParametersForbidden`, naming the config and the grant it lacks), and becomes active once
/// the grant is added, with no change to the check or the config to wake it: it tries again by
/// itself (an RBAC change is no event it watches).
#[tokio::test]
async fn a_config_the_controller_may_not_read_is_shown_on_the_check_until_allowed() -> Result<()> {
    let env = TestEnv::new("prc-forbidden").await?;
    let f = check_shows_the_config_forbidden(&env).await?;

    // It stays so (by then the controller's watch of configs has listed them: a change to the
    // config would wake it, an RBAC fix does not), each failed try counted: the controller has
    // tried again at least once (the cause) and the check still says why.
    still_forbidden_after_a_retry(&env, &f).await?;

    // The operator fixes the RBAC; nothing the controller watches changes.
    let active = active_once_get_is_granted(&env, &f.check).await?;

    // Once active, a 403 (the grant taken away again, then the config changed) does not stop
    // the check: it keeps its last config, counts the failure and tries again.
    still_active_through_a_forbidden_config_change(&env, &f, &active).await?;

    // A new spec is another matter: the check names another config, which it may not read
    // either; it is not active for that spec, so it says so.
    forbidden_again_for_a_new_config(&env, &f.check).await?;
    f.controller.stop().await
}

/// Parameters of another kind: `Active=False` (`BadParametersRef`) naming both kinds, and the
/// Job is not admitted.
#[tokio::test]
async fn parameters_of_a_wrong_kind_make_the_check_inactive() -> Result<()> {
    let env = TestEnv::new("prc-wrong-kind").await?;
    let check = env
        .admission_check_with_parameters(
            "prov",
            &env.provisioning_controller_name(),
            "ConfigMap",
            "settings",
        )
        .await?;
    let (_, cq) = env.pool_queues("4", &[&check]).await?;
    let controller = env.start_provisioning_controller(None)?;

    let c = check_active(&env, &check, "False", "BadParametersRef").await?;
    ensure!(
        c.message.contains("ConfigMap") && c.message.contains("ProvisioningRequestConfig"),
        "the message should name the wrong kind and the expected one: {c:?}"
    );
    refused_while_queue_inactive(&env, "job", "lq", &cq).await?;
    assert_eq!(all_requests(&env).await?, []);
    controller.stop().await
}

/// Checks that the API server refuses the configs the CRD itself rejects: an empty
/// provisioningClassName and an unknown podSetMergePolicy.
async fn crd_refuses_empty_class_and_unknown_policy(env: &TestEnv) -> Result<()> {
    for (name, spec, what) in [
        (
            "empty-class",
            json!({"provisioningClassName": ""}),
            "an empty provisioningClassName",
        ),
        (
            "bad-policy",
            json!({"podSetMergePolicy": "Sometimes"}),
            "an unknown podSetMergePolicy",
        ),
    ] {
        let created = env.provisioning_config(name, spec).await;
        ensure!(created.is_err(), "the API server accepted {what}");
    }
    Ok(())
}

/// One invalid config's check, with its own ClusterQueue `cq-<name>` and LocalQueue
/// `lq-<name>` on the pool flavor.
struct InvalidCase {
    /// `soon` or `negative`.
    name: &'static str,
    /// The config (cluster-scoped name).
    config: String,
    /// The check naming it (cluster-scoped name).
    check: String,
    /// Its ClusterQueue (cluster-scoped name).
    cq: String,
}

impl InvalidCase {
    /// Submits Job `job-<name>` to the case's LocalQueue once its ClusterQueue is inactive,
    /// and checks Kueue refuses it quota for that; returns its Workload's name.
    async fn refused_job(&self, env: &TestEnv) -> Result<String> {
        let (job, queue) = (format!("job-{}", self.name), format!("lq-{}", self.name));
        refused_while_queue_inactive(env, &job, &queue, &self.cq).await
    }
}

/// The two invalid configs the API server accepts, each with its check and queues: `soon`,
/// whose timeout annotation is not a number, and `negative`, with a negative
/// backoffLimitCount.
async fn timeout_soon_and_negative_backoff_cases(
    env: &TestEnv,
) -> Result<(InvalidCase, InvalidCase)> {
    let controller_name = env.provisioning_controller_name();
    let flavor = env.provisioning_flavor("pool").await?;
    let soon = env
        .provisioning_config_with_annotations(
            "prc-soon",
            json!({}),
            &[(TIMEOUT_ANNOTATION, "soon")],
        )
        .await?;
    let negative = env
        .provisioning_config(
            "prc-negative",
            json!({"retryStrategy": {"backoffLimitCount": -1}}),
        )
        .await?;
    let mut cases = Vec::new();
    for (name, config) in [("soon", soon), ("negative", negative)] {
        let check = env
            .provisioning_check(&format!("prov-{name}"), &controller_name, &config)
            .await?;
        let cq = env
            .cluster_queue(&format!("cq-{name}"), &flavor, "4", &[&check])
            .await?
            .name_any();
        env.local_queue(&format!("lq-{name}"), &cq).await?;
        cases.push(InvalidCase {
            name,
            config,
            check,
            cq,
        });
    }
    let negative = cases.pop().context("the negative case")?;
    let soon = cases.pop().context("the soon case")?;
    Ok((soon, negative))
}

/// Sets the config's timeout annotation to `value`.
async fn set_timeout_annotation(env: &TestEnv, config: &str, value: &str) -> Result<()> {
    let patch = json!({"metadata": {"annotations": {TIMEOUT_ANNOTATION: value}}});
    Api::<ProvisioningRequestConfig>::all(env.client.clone())
        .patch(config, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// Configs the API server accepts but that cannot work (the CRD itself rejects an empty
/// provisioningClassName and an unknown podSetMergePolicy): a timeout annotation that is not a
/// number, and a negative backoffLimitCount. Each check is `Active=False`
/// (`InvalidParameters`) naming the problem and its Job is not admitted; fixing the annotation
/// makes that check active and its Job admitted.
#[tokio::test]
async fn an_invalid_config_makes_the_check_inactive_until_fixed() -> Result<()> {
    let env = TestEnv::new("prc-invalid").await?;
    // The CRD's own validation, which is why the cases below are what reaches the controller.
    crd_refuses_empty_class_and_unknown_policy(&env).await?;
    let (soon, negative) = timeout_soon_and_negative_backoff_cases(&env).await?;
    let (controller, simulator) = controller_and_simulator(&env)?;

    let c = check_active(&env, &soon.check, "False", "InvalidParameters").await?;
    ensure!(
        c.message.contains(TIMEOUT_ANNOTATION) && c.message.contains("\"soon\""),
        "the message should name the annotation and its value: {c:?}"
    );
    let c = check_active(&env, &negative.check, "False", "InvalidParameters").await?;
    ensure!(
        c.message.contains("backoffLimitCount") && c.message.contains("-1"),
        "the message should name the field and its value: {c:?}"
    );
    let mut workloads = Vec::new();
    for case in [&soon, &negative] {
        workloads.push(case.refused_job(&env).await?);
    }
    assert_eq!(all_requests(&env).await?, []);

    // Fixing the annotation makes that check active; the other stays inactive.
    set_timeout_annotation(&env, &soon.config, "30").await?;
    check_active(&env, &soon.check, "True", "Active").await?;
    env.wait_admitted_ready(&workloads[0], &soon.check).await?;
    assert_not_admitted(&env, &workloads[1], &negative.cq).await?;
    e2e::Running::stop_all([controller, simulator]).await
}

// --- 5. coexistence with Kueue's built-in check --------------------------------------------

/// Kueue's built-in check beside ours: a config of the class our simulator serves, check
/// `kueue-prov` of Kueue's controller naming it, ClusterQueue `kueue-cq` on our flavor guarded
/// by it, and LocalQueue `kueue-lq`; returns the check's cluster-scoped name.
async fn kueues_check_beside_ours(env: &TestEnv, p: &Provisioning) -> Result<String> {
    let kueue_config = env.provisioning_config("kueue-prc", json!({})).await?;
    let kueue_check = env
        .provisioning_check("kueue-prov", KUEUE_CONTROLLER_NAME, &kueue_config)
        .await?;
    let kueue_cq = env
        .cluster_queue("kueue-cq", &p.flavor, "4", &[&kueue_check])
        .await?
        .name_any();
    env.local_queue("kueue-lq", &kueue_cq).await?;
    Ok(kueue_check)
}

/// A one-pod Job admitted through one check: its Workload and that check's `Ready` entry.
struct Admitted {
    /// The Job's name.
    job: &'static str,
    /// Its Workload as first seen.
    workload: Workload,
    /// The Workload's name.
    name: String,
    /// The check.
    check: String,
    /// The check's entry once admitted.
    entry: AdmissionCheckState,
    /// The name of the check's first request for it.
    request: String,
}

impl Admitted {
    /// Submits Job `job` of one pod to `queue` and waits until it is admitted with `check`
    /// `Ready`.
    async fn through(env: &TestEnv, job: &'static str, queue: &str, check: &str) -> Result<Self> {
        let workload = one_pod_job(env, job, queue).await?;
        let name = workload.name_any();
        let (_, entry) = env.wait_admitted_ready(&name, check).await?;
        Ok(Self {
            job,
            request: format!("{name}-{check}-1"),
            workload,
            name,
            check: check.to_string(),
            entry,
        })
    }

    /// Reads the Workload again and checks it is still admitted with its check `Ready`.
    async fn ensure_still_admitted_ready(&self, env: &TestEnv) -> Result<()> {
        let (wl, check) = (&self.name, &self.check);
        let w = env.workloads().get(wl).await?;
        ensure!(
            w.condition_is_true(cond::ADMITTED)
                && w.admission_check(check)
                    .is_some_and(|e| e.state == CheckState::Ready),
            "{wl} no longer admitted with {check} Ready:\n{}",
            dump(&w)
        );
        Ok(())
    }

    /// Reads our request for this Workload and checks it is as we make it: our labels, the
    /// Workload's uid and name, and owned by its templates only (a Workload among its owners
    /// would make Kueue's check delete it).
    async fn our_request(&self, env: &TestEnv, controller: &str) -> Result<ProvisioningRequest> {
        let r = env.provisioning_requests().get(&self.request).await?;
        assert_marked_and_owned_as_ours(&r, self, controller);
        Ok(r)
    }

    /// Reads Kueue's request for this Workload and checks it is as Kueue makes it.
    async fn kueues_request(&self, env: &TestEnv) -> Result<ProvisioningRequest> {
        let k = env.provisioning_requests().get(&self.request).await?;
        assert_marked_and_owned_as_kueues(&k, self);
        Ok(k)
    }
}

/// Changes a label of each Workload (which wakes each controller for each) and checks that the
/// namespace's requests stay exactly `want` for 4 s.
async fn stay_while_both_are_reconciled(
    env: &TestEnv,
    sides: [&Admitted; 2],
    want: &[(String, String)],
) -> Result<()> {
    for side in sides {
        env.touch_workload(&side.name, "1").await?;
    }
    assert_requests_stay(env, want, Duration::from_secs(4)).await
}

/// Our request as we make it: our labels, the Workload's uid and name, and owned by its
/// templates only (a Workload among its owners would make Kueue's check delete it).
fn assert_marked_and_owned_as_ours(r: &ProvisioningRequest, ours: &Admitted, controller: &str) {
    let labels = r.labels();
    assert_eq!(
        labels.get(identity::INSTANCE_LABEL),
        Some(&identity::instance_label(controller))
    );
    assert_eq!(
        labels.get(identity::WORKLOAD_UID_LABEL),
        ours.workload.uid().as_ref(),
        "{}",
        dump(r)
    );
    assert_eq!(
        labels.get(identity::MANAGED_BY_LABEL).map(String::as_str),
        Some(identity::MANAGED_BY)
    );
    assert!(e2e::provisioning::owned_by_its_templates(r), "{}", dump(r));
    assert_eq!(
        r.annotations().get(identity::WORKLOAD_ANNOTATION),
        Some(&ours.name)
    );
}

/// Kueue's request as Kueue makes it: owned by its Workload, labelled by Kueue, none of our
/// labels.
fn assert_marked_and_owned_as_kueues(k: &ProvisioningRequest, theirs: &Admitted) {
    assert!(
        k.owner_references().iter().any(|o| o.kind == "Workload"
            && o.name == theirs.name
            && Some(&o.uid) == theirs.workload.uid().as_ref()),
        "{}",
        dump(k)
    );
    assert_eq!(
        k.labels().get("kueue.x-k8s.io/managed").map(String::as_str),
        Some("true")
    );
    assert!(!k.labels().contains_key(identity::INSTANCE_LABEL));
    assert!(!k.labels().contains_key(identity::WORKLOAD_UID_LABEL));
}

/// (name, uid) of the two requests, sorted as [`all_requests`] lists them.
fn both_requests(a: &ProvisioningRequest, b: &ProvisioningRequest) -> Vec<(String, String)> {
    let mut both: Vec<(String, String)> = [a, b]
        .iter()
        .map(|r| (r.name_any(), r.uid().unwrap_or_default()))
        .collect();
    both.sort();
    both
}

/// Completes both Jobs and waits until their Workloads are `Finished`.
async fn complete_both(env: &TestEnv, sides: [&Admitted; 2]) -> Result<()> {
    for side in sides {
        env.complete_job(side.job, &side.name).await?;
    }
    Ok(())
}

/// Waits until the request and its PodTemplate `ppt-<request>-main` are gone.
async fn request_and_template_gone(env: &TestEnv, request: &str) -> Result<()> {
    e2e::wait_gone(env.provisioning_requests(), request).await?;
    let templates = Api::<PodTemplate>::namespaced(env.client.clone(), &env.ns);
    e2e::wait_gone(templates, &format!("ppt-{request}-main")).await
}

/// Checks that each entry's podSetUpdates point at its own request, that only ours is listed
/// as ours, and that each request is marked and owned as its maker makes it; returns the two
/// requests' (name, uid), checked to be all the namespace's requests.
async fn each_request_as_its_maker_makes_it(
    env: &TestEnv,
    p: &Provisioning,
    ours: &Admitted,
    theirs: &Admitted,
) -> Result<Vec<(String, String)>> {
    for side in [ours, theirs] {
        assert_pod_set_updates(&side.entry, &["main"], &side.request, &p.class)?;
    }
    let only_ours = std::slice::from_ref(&ours.request);
    assert_eq!(env.our_requests().await?, only_ours);
    // Ours: our labels, the Workload's uid, no ownerReference (Kueue would delete it).
    let r = ours.our_request(env, &p.controller_name).await?;
    // Kueue's: owned by its Workload, labelled by Kueue, none of our labels.
    let k = theirs.kueues_request(env).await?;
    let want = both_requests(&r, &k);
    assert_eq!(all_requests(env).await?, want);
    Ok(want)
}

/// Checks that each Workload is still admitted with its check `Ready` and each Job runs on
/// its own request.
async fn each_still_admitted_and_running_on_its_own_request(
    env: &TestEnv,
    sides: [&Admitted; 2],
) -> Result<()> {
    for side in sides {
        side.ensure_still_admitted_ready(env).await?;
        // Each Job runs on its own request.
        let consumed = consumed_request(env, side.job).await?;
        assert_eq!(consumed.as_ref(), Some(&side.request), "job {}", side.job);
    }
    Ok(())
}

/// Our check and Kueue's built-in one on two ClusterQueues, one Job each, in one namespace:
/// both admitted, each request only for its own Workload (ours labelled and without owner,
/// Kueue's owned by its Workload), and neither controller deletes the other's request while
/// both reconcile both Workloads. Deleting the Jobs leaves nothing of ours.
#[tokio::test]
async fn coexists_with_kueues_built_in_check() -> Result<()> {
    let env = TestEnv::new("prc-coexist").await?;
    let p = env.provisioning(json!({}), "4").await?;
    let kueue_check = kueues_check_beside_ours(&env, &p).await?;
    let (controller, simulator) = controller_and_simulator(&env)?;
    check_active(&env, &kueue_check, "True", "Active").await?;

    let ours = Admitted::through(&env, "ours", "lq", &p.check).await?;
    let theirs = Admitted::through(&env, "theirs", "kueue-lq", &kueue_check).await?;
    // Exactly two requests, each only for its own Workload: ours labelled and without owner,
    // Kueue's owned by its Workload.
    let want = each_request_as_its_maker_makes_it(&env, &p, &ours, &theirs).await?;

    // They survive while both controllers reconcile both Workloads (a label change wakes each
    // controller for each Workload).
    stay_while_both_are_reconciled(&env, [&ours, &theirs], &want).await?;
    each_still_admitted_and_running_on_its_own_request(&env, [&ours, &theirs]).await?;

    // Both Jobs complete and their Workloads finish; nothing of ours remains. Kueue's check
    // deletes its request, and the garbage collector its template (the request owns it).
    complete_both(&env, [&ours, &theirs]).await?;
    env.wait_nothing_left().await?;
    request_and_template_gone(&env, &theirs.request).await?;
    e2e::Running::stop_all([controller, simulator]).await
}

// --- 6. long names -------------------------------------------------------------------------

/// Config `prc` and a check of this test's controller with a long name naming it, guarding
/// ClusterQueue `cq` (4 cpu of the pool flavor) and LocalQueue `lq`; returns the check's name.
async fn long_named_check(env: &TestEnv) -> Result<String> {
    let controller_name = env.provisioning_controller_name();
    let config = env.provisioning_config("prc", json!({})).await?;
    let check = env
        .provisioning_check(
            "provisioning-check-with-a-name-long-enough-to-matter",
            &controller_name,
            &config,
        )
        .await?;
    env.pool_queues("4", &[&check]).await?;
    Ok(check)
}

/// Creates plain Workload `name` in `lq`: one podset `main` of one pod of 1 cpu, whose request
/// the simulator answers with `script`.
async fn one_pod_workload(env: &TestEnv, name: &str, script: &str) -> Result<Workload> {
    let main = pod_set(
        "main",
        1,
        container("registry.invalid/app:1", json!({"cpu": "1"}), json!({})),
        json!({simulator::SCRIPT_ANNOTATION: script}),
    );
    plain_workload(env, name, "lq", json!({}), vec![main]).await
}

/// Waits until the request exists, and checks it is our only one, naming `template` (our only
/// PodTemplate) for one pod; returns its (name, uid).
async fn request_made_with_its_template(
    env: &TestEnv,
    request: &str,
    template: &str,
) -> Result<(String, String)> {
    let created = wait_request(env, request).await?;
    assert_eq!(env.our_requests().await?, [request]);
    assert_eq!(env.our_pod_templates().await?, [template]);
    assert_eq!(
        request_pod_sets(&created),
        [(template.to_string(), 1)],
        "{}",
        dump(&created)
    );
    Ok((request.to_string(), created.uid().unwrap_or_default()))
}

/// Reads the Workload again and checks it is still admitted with the same `entry` of `check`.
async fn ensure_still_admitted_with(
    env: &TestEnv,
    workload: &str,
    check: &str,
    entry: &AdmissionCheckState,
) -> Result<()> {
    let wl = env.workloads().get(workload).await?;
    ensure!(
        wl.condition_is_true(cond::ADMITTED) && wl.admission_check(check) == Some(entry),
        "the answer changed after the restart:\n{}",
        dump(&wl)
    );
    Ok(())
}

/// Stops the controller and starts another in its place.
async fn restarted(env: &TestEnv, controller: Running) -> Result<Running> {
    controller.stop().await?;
    env.start_provisioning_controller(None)
}

/// A 240-character Workload and a long check name: `<workload>-<check>-<attempt>` would exceed
/// 253, so the request gets a shortened name that still ends with `-1`; the Workload is
/// admitted, and controllers restarted while the request is pending and after admission find
/// that request again instead of making another.
#[tokio::test]
async fn long_names_are_shortened_and_found_again_after_a_restart() -> Result<()> {
    let env = TestEnv::new("prc-long").await?;
    let check = long_named_check(&env).await?;
    let workload = format!("long-{}", "w".repeat(235));
    assert_eq!(workload.len(), 240);
    let full = format!("{workload}-{check}-1");
    assert!(full.len() > 253, "{} characters only", full.len());
    let request = names::request_name(&workload, &check, 1);
    assert!(request.len() <= 253 && request.ends_with("-1"), "{request}");
    assert!(request.starts_with(&workload[..200]), "{request}");
    let template = names::pod_template_name(&request, "main");
    assert!(template.len() <= 253, "{template}");

    let (mut controller, simulator) = controller_and_simulator(&env)?;
    // Provisioned 4 s after acceptance: the first restart happens while the request is pending.
    one_pod_workload(&env, &workload, "provision:4").await?;
    let only = [request_made_with_its_template(&env, &request, &template).await?];

    // Restart while pending.
    controller = restarted(&env, controller).await?;
    let (_, entry) = env.wait_admitted_ready(&workload, &check).await?;
    assert_pod_set_updates(&entry, &["main"], &request, &env.provisioning_class())?;
    assert_eq!(created_count(&controller, &check).await?, 0.0);
    assert_eq!(all_requests(&env).await?, only);

    // Restart after admission: still the one request, still admitted with the same answer.
    let controller = restarted(&env, controller).await?;
    assert_requests_stay(&env, &only, Duration::from_secs(3)).await?;
    assert_eq!(created_count(&controller, &check).await?, 0.0);
    assert_eq!(env.our_pod_templates().await?, [template]);
    ensure_still_admitted_with(&env, &workload, &check, &entry).await?;
    e2e::Running::stop_all([controller, simulator]).await
}
