//! Which checks Kueue gives a Workload by the flavors assigned to it, pinned on the real Kueue
//! of the run (`KUEUE_VERSION`; `tests/kueue-versions.sh` runs this against the oldest and the
//! newest supported): `FlavorRule::of_kueue` must say what Kueue does. The case where the
//! versions differ: a Workload whose podsets request nothing the ClusterQueue covers gets no
//! flavor, and so (from v0.18) no check, while a rule without `onFlavors` covers the queue's
//! flavors (issue 32, item 3). The early start assumes the v0.18 rule on every version, so it
//! never starts work for an entry that does not come.

use anyhow::{Result, ensure};
use e2e::TestEnv;
use kube::api::PostParams;
use kueue_admission_sdk::FlavorRule;
use kueue_admission_sdk::api::{ClusterQueue, Workload, workload_condition as cond};
use serde_json::json;

/// The story: a queue whose one check (empty `onFlavors`) nobody answers, and a Workload that
/// requests nothing; Kueue reserves quota, and the check's entry is there exactly when
/// `FlavorRule::of_kueue` says so.
#[tokio::test]
async fn the_checks_kueue_adds_follow_its_flavor_rule() -> Result<()> {
    let env = TestEnv::new("flavor-rule").await?;
    let (queue, check) = queue_with_an_unanswered_check(&env).await?;
    let wl = requesting_nothing(&env, "nothing").await?;
    let reserved = env
        .wait_workload(&wl, "QuotaReserved", |w| {
            w.condition_is_true(cond::QUOTA_RESERVED)
        })
        .await?;
    ensure!(
        assigned_flavors(&reserved) == 0,
        "a podset requesting nothing got a flavor: {}",
        e2e::dump(&reserved)
    );

    let (minor, patch) = e2e::kueue_version();
    let rule = FlavorRule::of_kueue(minor, patch);
    let gets_the_check = rule.applies(&queue.spec, &check, &reserved);
    match gets_the_check {
        true => held_with_the_entry(&env, &wl, &check).await?,
        false => admitted_without_it(&env, &wl, &check).await?,
    }
    // The early start never assumes more than the version does.
    ensure!(
        !FlavorRule::EARLY_START.applies(&queue.spec, &check, &reserved) || gets_the_check,
        "the early start would start work for an entry Kueue v0.{minor}.{patch} does not add"
    );
    Ok(())
}

/// A flavor, an active AdmissionCheck of a controller that does not run, ClusterQueue `cq`
/// applying it to every flavor (no `onFlavors`), and LocalQueue `lq`.
async fn queue_with_an_unanswered_check(env: &TestEnv) -> Result<(ClusterQueue, String)> {
    let flavor = env.resource_flavor("default").await?;
    let controller = env.own_controller_name("nobody");
    let check = env.admission_check("check", &controller).await?;
    let check = kube::ResourceExt::name_any(&check);
    env.set_admission_check_active(&check, true).await?;
    let flavor = kube::ResourceExt::name_any(&flavor);
    let queue = env.cluster_queue("cq", &flavor, "4", &[&check]).await?;
    env.local_queue("lq", &kube::ResourceExt::name_any(&queue))
        .await?;
    Ok((queue, check))
}

/// A Workload in `lq` whose one pod requests nothing.
async fn requesting_nothing(env: &TestEnv, name: &str) -> Result<String> {
    let template = json!({"spec": {"restartPolicy": "Never", "containers": [{
        "name": "main", "image": "registry.invalid/kwok-runs-it:1",
    }]}});
    let wl = e2e::standalone_workload(&env.ns, name, json!({}), template)?;
    env.workloads().create(&PostParams::default(), &wl).await?;
    Ok(name.to_string())
}

/// How many flavors Kueue assigned over the Workload's podsets.
fn assigned_flavors(wl: &Workload) -> usize {
    wl.status
        .as_ref()
        .and_then(|s| s.admission.as_ref())
        .map_or(0, |a| {
            a.pod_set_assignments.iter().map(|p| p.flavors.len()).sum()
        })
}

/// Kueue gave it the check: it holds quota with the entry `Pending`, and is not admitted.
async fn held_with_the_entry(env: &TestEnv, wl: &str, check: &str) -> Result<()> {
    let held = env.wait_check_pending_with_quota(wl, check).await?;
    ensure!(
        !held.condition_is_true(cond::ADMITTED),
        "admitted without the answer: {}",
        e2e::dump(&held)
    );
    Ok(())
}

/// Kueue did not give it the check: it is admitted with no entry of it.
async fn admitted_without_it(env: &TestEnv, wl: &str, check: &str) -> Result<()> {
    let admitted = env.wait_admitted(wl).await?;
    ensure!(
        admitted.admission_check(check).is_none(),
        "admitted with the check's entry: {}",
        e2e::dump(&admitted)
    );
    Ok(())
}
