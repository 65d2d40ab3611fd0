//! The demo behind `make demo`: a batch/v1 Job admitted by the real Kueue through an admission
//! check, with this program playing the check's controller and narrating every step.
//!
//! It creates its own namespace and queues, so it can run any number of times.

use std::time::Instant;

use anyhow::Result;
use e2e::TestEnv;
use kueue_admission_sdk::api::CheckState;

const CONTROLLER: &str = "demo.kueue-admission-checks.dev/approve-all";

#[tokio::main]
async fn main() -> Result<()> {
    let started = Instant::now();
    let say = |msg: &str| println!("[{:>5.1}s] {msg}", started.elapsed().as_secs_f32());

    let env = TestEnv::new("demo").await?;
    say(&format!("namespace {}", env.ns));
    let flavor = env.resource_flavor("default").await?;
    let flavor = flavor.metadata.name.unwrap_or_default();
    let check = env.admission_check("approval", CONTROLLER).await?;
    let check = check.metadata.name.unwrap_or_default();
    let cq = env.cluster_queue("cq", &flavor, "4", &[&check]).await?;
    env.local_queue("lq", cq.metadata.name.as_deref().unwrap_or_default())
        .await?;
    say(&format!(
        "AdmissionCheck {check} (controllerName {CONTROLLER}) guards ClusterQueue {}",
        cq.metadata.name.unwrap_or_default()
    ));

    env.set_admission_check_active(&check, true).await?;
    say("the check's controller marked it Active");

    let job = env.suspended_job("hello", "lq", "1").await?;
    say("submitted Job hello (suspended, 1 cpu) to LocalQueue lq");
    let wl = env.workload_for_job(&job).await?;
    let wl_name = wl.metadata.name.clone().unwrap_or_default();
    say(&format!("Kueue created Workload {wl_name}"));

    env.wait_check_pending_with_quota(&wl_name, &check).await?;
    say("Kueue reserved quota; the check entry is Pending: the Job waits for our answer");

    env.answer_check(&wl_name, &check, CheckState::Ready, "approved by the demo")
        .await?;
    say(
        "the check answered Ready (server-side apply of our entry, with a resourceVersion precondition)",
    );

    env.wait_admitted(&wl_name).await?;
    say("Kueue admitted the Workload");
    env.wait_job_unsuspended("hello").await?;
    say("Kueue unsuspended Job hello: it would start now");
    println!(
        "\ninspect it: KUBECONFIG from `tests/control-plane/control-plane.sh env`, namespace {}",
        env.ns
    );
    Ok(())
}
