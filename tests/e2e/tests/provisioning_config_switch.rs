//! Issue 26, item 1: a ProvisioningRequestConfig whose class switches again and again under
//! Workloads waiting for capacity. Each switch makes every waiting Workload's request out of
//! date: the controller deletes it (with its templates) and makes it again under the same name,
//! while its watch delivers the old request's deletion whenever it comes. A late deletion once
//! took the successor's template (same name, same identity): the successor then waited on a
//! missing PodTemplate, and cluster-autoscaler would fail it at once.

use std::collections::BTreeMap;

use anyhow::Result;
use autoscaler_simulator::{self as simulator, Script};
use e2e::TestEnv;
use e2e::provisioning::World;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kueue_admission_sdk::api::{ProvisioningRequest, ProvisioningRequestConfig};
use serde_json::json;

const WORKLOADS: usize = 20;
const SWITCHES: usize = 50;

/// This test's requests and templates, read now: for each request, its class, and whether every
/// template it names exists and is one that owns it (by uid).
async fn requests_with_their_templates(env: &TestEnv) -> Result<BTreeMap<String, (String, bool)>> {
    let requests = env
        .provisioning_requests()
        .list(&ListParams::default())
        .await?
        .items;
    let templates: BTreeMap<String, String> = env
        .pod_templates()
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(|t| (t.name_any(), t.uid().unwrap_or_default()))
        .collect();
    Ok(requests
        .iter()
        .map(|r: &ProvisioningRequest| {
            let owners: Vec<&str> = r
                .owner_references()
                .iter()
                .map(|o| o.uid.as_str())
                .collect();
            let complete = r.spec.pod_sets.iter().all(|p| {
                templates
                    .get(&p.pod_template_ref.name)
                    .is_some_and(|uid| owners.contains(&uid.as_str()))
            });
            (
                r.name_any(),
                (r.spec.provisioning_class_name.clone(), complete),
            )
        })
        .collect())
}

/// A world whose config starts with class `a`, its ClusterQueue with one cpu per Workload, and
/// a simulator answering both `a` and `b` with `accept`: never provisioned, so the Workloads
/// keep waiting with their requests live. Returns the world and the classes `a` and `b`.
async fn world_of_two_classes(test: &str) -> Result<(World, String, String)> {
    let env = TestEnv::new(test).await?;
    let (a, b) = (
        env.provisioning_class(),
        format!("b.{}", env.provisioning_class()),
    );
    let p = env
        .provisioning(json!({"provisioningClassName": a}), &WORKLOADS.to_string())
        .await?;
    let controller = env.start_provisioning_controller(None)?;
    let settings = simulator::Settings {
        scripted_classes: vec![a.clone(), b.clone()],
        default_script: "accept"
            .parse::<Script>()
            .map_err(|e| anyhow::anyhow!("{e}"))?,
        namespace: Some(env.ns.clone()),
        ..simulator::Settings::default()
    };
    let simulator = env.start_simulator_with(settings);
    let t = World {
        env: env.clone(),
        p,
        controller: Some(controller),
        simulator,
    };
    Ok((t, a, b))
}

/// Submits the [`WORKLOADS`] standalone Workloads the simulator only accepts; returns their
/// first requests' names (sorted) and the Workloads' names.
async fn waiting_workloads(t: &World) -> Result<(Vec<String>, Vec<String>)> {
    let (mut expected, mut workloads) = (Vec::new(), Vec::new());
    for i in 0..WORKLOADS {
        let wl = t
            .env
            .standalone_workload(&format!("wl-{i:02}"), "accept")
            .await?;
        expected.push(t.request(&wl.name_any(), 1));
        workloads.push(wl.name_any());
    }
    expected.sort();
    Ok((expected, workloads))
}

/// Switches the config to `class`, then changes every Workload right after: decisions that do
/// not wait for the request watch, as Kueue's own writes bring under load.
async fn switch_class(t: &World, switch: usize, class: &str, workloads: &[String]) -> Result<()> {
    let env = &t.env;
    let change = json!({"spec": {"provisioningClassName": class}});
    Api::<ProvisioningRequestConfig>::all(env.client.clone())
        .patch(&t.p.config, &PatchParams::default(), &Patch::Merge(&change))
        .await?;
    for name in workloads {
        let touch = json!({"metadata": {"annotations": {"e2e.kueue-admission-checks.dev/switch": switch.to_string()}}});
        env.workloads()
            .patch(name, &PatchParams::default(), &Patch::Merge(&touch))
            .await?;
    }
    Ok(())
}

/// Polls until every Workload's request is of `class`, failing at once if a request of
/// `class` is seen without its templates, and on the timeout.
async fn wait_all_made_again_complete(env: &TestEnv, switch: usize, class: &str) -> Result<()> {
    let deadline = tokio::time::Instant::now() + e2e::DEFAULT_TIMEOUT;
    loop {
        let now = requests_with_their_templates(env).await?;
        let broken: Vec<&String> = now
            .iter()
            .filter(|(_, (c, complete))| c == class && !complete)
            .map(|(n, _)| n)
            .collect();
        anyhow::ensure!(
            broken.is_empty(),
            "switch {switch}: requests of class {class} without their templates: {broken:?}"
        );
        if now.len() == WORKLOADS && now.values().all(|(c, _)| c == class) {
            return Ok(());
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "switch {switch}: not every request made again for class {class}: {now:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn every_live_request_keeps_its_templates_through_50_class_switches_under_20_workloads()
-> Result<()> {
    let (t, a, b) = world_of_two_classes("prov-switch-class").await?;
    let env = &t.env;
    let (expected, workloads) = waiting_workloads(&t).await?;

    for switch in 0..=SWITCHES {
        let class = if switch % 2 == 0 { &a } else { &b };
        if switch > 0 {
            switch_class(&t, switch, class, &workloads).await?;
        }
        // Every Workload's request made again for the new class, each with its templates. A
        // request of the old class may lack them for a moment (its templates go first when
        // it is deleted); one of the new class never may: its templates are made before it,
        // and only a late deletion of its predecessor could take them.
        wait_all_made_again_complete(env, switch, class).await?;
    }
    // Once every deletion has been handled: exactly the live requests and their templates.
    env.wait_only_left(&expected).await?;
    let now = requests_with_their_templates(env).await?;
    assert!(now.values().all(|(_, complete)| *complete), "{now:?}");
    t.stop().await
}
