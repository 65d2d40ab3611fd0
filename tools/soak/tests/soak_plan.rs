//! The soak's plan keeps its promises, for many seeds and without a cluster: what `make soak`
//! and the short soak of the suite claim to exercise is in every plan they run.

use std::time::Duration;

use anyhow::{Result, ensure};
use soak::plan::{CONTROLLERS, End, FaultKind, Plan, Queue, Shape};

#[test]
fn the_same_seed_gives_the_same_plan_and_another_seed_another() {
    assert_eq!(Plan::generate(7, 300), Plan::generate(7, 300));
    assert_ne!(Plan::generate(7, 300), Plan::generate(8, 300));
}

/// What the issue asks of the load and the faults, at the full size and the short one.
fn check(seed: u64, workloads: usize) -> Result<()> {
    let plan = Plan::generate(seed, workloads);
    ensure!(plan.workloads.len() == workloads);
    ensure!(
        plan.workloads
            .windows(2)
            .all(|w| w[0].submit_at <= w[1].submit_at)
    );
    // Bursts (several at one instant) and trickles.
    let burst = plan
        .workloads
        .windows(5)
        .any(|w| w.iter().all(|x| x.submit_at == w[0].submit_at));
    ensure!(burst, "seed {seed}: no burst");
    for q in Queue::ALL {
        ensure!(
            plan.workloads.iter().any(|w| w.queue == q),
            "seed {seed}: no {q:?}"
        );
    }
    ensure!(
        plan.workloads
            .iter()
            .any(|w| matches!(w.shape, Shape::Job { .. }))
    );
    ensure!(
        plan.workloads
            .iter()
            .any(|w| matches!(&w.shape, Shape::Plain { counts } if counts.len() > 1))
    );
    for w in &plan.workloads {
        match w.end {
            // Only a script that fails every attempt, on the queue whose check stays, or pods
            // that Karpenter cannot place.
            End::Rejected => ensure!(
                (w.queue == Queue::Provisioning && w.script == "fail")
                    || (w.queue == Queue::Buffered && w.unplaceable)
            ),
            // Deleted while it surely waits: its requests never provisioned, or its pods
            // unplaceable.
            End::Deleted => ensure!(
                w.delete_after.is_some()
                    && ((w.script == "accept"
                        && matches!(w.queue, Queue::Provisioning | Queue::Licensed))
                        || (w.queue == Queue::Buffered && w.unplaceable))
            ),
            End::Admitted => {
                ensure!(w.delete_after.is_none() && !w.unplaceable);
                // The attempt that counts provisions.
                ensure!(
                    !w.queue.provisions()
                        || w.script
                            .split(',')
                            .next_back()
                            .is_some_and(|s| s.starts_with("provision"))
                );
            }
            End::Revoked => {
                ensure!(w.script.starts_with("revoke") && w.queue == Queue::Provisioning)
            }
        }
        ensure!(!w.unplaceable || w.queue == Queue::Buffered);
        if w.queue == Queue::Licensed {
            ensure!((1..=2).contains(&w.licenses));
            ensure!(w.shape.pods() >= 1);
        } else {
            ensure!(w.licenses == 0);
        }
    }
    if workloads >= 100 {
        for end in [End::Admitted, End::Rejected, End::Deleted, End::Revoked] {
            ensure!(
                plan.workloads
                    .iter()
                    .any(|w| w.queue == Queue::Provisioning && w.end == end),
                "seed {seed}: no {end} through the provisioning check"
            );
        }
        // Through the capacity-buffer check: a Job whose pods land on Karpenter's Nodes, and
        // one that Karpenter cannot place.
        ensure!(
            plan.workloads.iter().any(|w| w.queue == Queue::Buffered
                && w.end == End::Admitted
                && matches!(w.shape, Shape::Job { .. })),
            "seed {seed}: no admitted Job through the capacity-buffer check"
        );
        ensure!(
            plan.workloads
                .iter()
                .any(|w| w.queue == Queue::Buffered && w.end == End::Rejected),
            "seed {seed}: no unplaceable Workload rejected through the capacity-buffer check"
        );
    }
    // Faults: each controller's leader killed about every 21 s (never more than 27 s apart),
    // the apiserver restarted (twice at full size), Kueue and Karpenter once, and the rest once each.
    for c in CONTROLLERS {
        let kills: Vec<Duration> = plan
            .faults
            .iter()
            .filter(|f| f.kind == FaultKind::KillLeader(c))
            .map(|f| f.at)
            .collect();
        ensure!(
            kills.len() >= 3,
            "seed {seed}: {c} killed {} times",
            kills.len()
        );
        ensure!(
            kills
                .windows(2)
                .all(|k| k[1] - k[0] <= Duration::from_secs(27))
        );
    }
    let count =
        |pred: &dyn Fn(&FaultKind) -> bool| plan.faults.iter().filter(|f| pred(&f.kind)).count();
    let apiserver = count(&|k| *k == FaultKind::RestartApiserver);
    ensure!(apiserver >= if workloads >= 1000 { 2 } else { 1 });
    ensure!(count(&|k| *k == FaultKind::RestartKueue) == 1);
    ensure!(count(&|k| *k == FaultKind::RestartKarpenter) == 1);
    ensure!(count(&|k| matches!(k, FaultKind::PauseSimulator(_))) == 1);
    ensure!(count(&|k| matches!(k, FaultKind::RemoveCheck(_))) == 1);
    ensure!(count(&|k| matches!(k, FaultKind::ChangeConfig(_))) == 1);
    ensure!(count(&|k| matches!(k, FaultKind::ConflictBurst(_))) == 1);
    ensure!(plan.faults.iter().all(|f| f.at < plan.load_duration));
    ensure!(
        plan.workloads
            .iter()
            .all(|w| w.submit_at < plan.load_duration)
    );
    Ok(())
}

#[test]
fn every_plan_has_the_load_and_the_faults_the_soak_promises() -> Result<()> {
    for seed in 0..200 {
        check(seed, 100)?;
    }
    for seed in 0..20 {
        check(seed, 1000)?;
    }
    Ok(())
}
