//! The benchmark's marks of a run, read without a cluster.

use std::time::Duration;

use bench::{Mark, Marks, window};
use tokio::time::Instant;

#[test]
fn a_window_runs_from_the_first_to_the_last_sight_after_the_first_create() {
    let t0 = Instant::now();
    let at = |secs: u64| t0 + Duration::from_secs(secs);
    let workload = |created: u64, reserved: Option<u64>| {
        let mut m = Marks::default();
        m.first(Mark::Created, at(created));
        if let Some(r) = reserved {
            m.first(Mark::Reserved, at(r));
        }
        m
    };
    let marks = [
        workload(1, Some(9)),
        workload(0, Some(4)),
        workload(2, None),
        workload(3, Some(7)),
    ];
    assert_eq!(
        window(&marks, Mark::Reserved),
        Some((Duration::from_secs(4), Duration::from_secs(9)))
    );
    assert_eq!(window(&marks, Mark::Ready), None);
    assert_eq!(window(&[], Mark::Reserved), None);
}
