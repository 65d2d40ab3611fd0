//! The request phases of a loop: expiry and garbage collection (cluster-autoscaler's
//! ProvisioningRequest processor), picking the request(s) to process (its pods injector, with
//! the per-UID backoff), and booking.

use kueue_admission_sdk::api::provisioning_condition::{
    ACCEPTED, BOOKING_EXPIRED, FAILED, PROVISIONED,
};

use super::{Backoff, Handling, RequestKey, Work, older_than};
use crate::conditions::reason;
use crate::fit::PodShape;
use crate::settings::MAX_EXPIRY_UPDATES_PER_LOOP;
use crate::snapshot::Snapshot;

/// Rules 13 and 15: BookingExpired=True/`CapacityReservationTimeExpired` on supported requests
/// whose Provisioned=True is older than the booking window (Provisioned stays True), and
/// Failed=True/`Expired` on those never provisioned within `expire_after` of their creation.
/// At most [`MAX_EXPIRY_UPDATES_PER_LOOP`] writes, booking expiries first in scan order.
pub(super) fn expire(work: &mut Work<'_>) {
    let (now, settings) = (work.now, work.settings);
    let mut expired = Vec::new();
    let mut failed = Vec::new();
    for (i, req) in work.requests.iter().enumerate() {
        if expired.len() >= MAX_EXPIRY_UPDATES_PER_LOOP {
            break;
        }
        if !req.supported() || req.is_true(BOOKING_EXPIRED) || req.is_true(FAILED) {
            continue;
        }
        let provisioned = req.find(PROVISIONED).filter(|p| p.status == "True");
        if let Some(p) = provisioned {
            if older_than(p.last_transition_time.0, settings.booking_duration, now) {
                expired.push(i);
            }
        } else if failed.len() < MAX_EXPIRY_UPDATES_PER_LOOP - expired.len() {
            let created = req.object.metadata.creation_timestamp.as_ref();
            if created.is_some_and(|c| older_than(c.0, settings.expire_after, now)) {
                failed.push(i);
            }
        }
    }
    for i in expired {
        let message = format!(
            "The capacity was booked for {}; the booking is over.",
            human(settings.booking_duration)
        );
        work.requests[i].set(
            BOOKING_EXPIRED,
            true,
            reason::CAPACITY_RESERVATION_TIME_EXPIRED,
            message,
            now,
        );
    }
    for i in failed {
        let message = format!(
            "The request was not provisioned within {} of its creation.",
            human(settings.expire_after)
        );
        work.requests[i].set(FAILED, true, reason::EXPIRED, message, now);
    }
}

/// A duration as people write it, to the second.
fn human(duration: std::time::Duration) -> String {
    let secs = duration.as_secs();
    match secs {
        s if s % 86_400 == 0 && s > 0 => format!("{}d", s / 86_400),
        s if s % 3600 == 0 && s > 0 => format!("{}h", s / 3600),
        s if s % 60 == 0 && s > 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// Rule 16: the requests whose Provisioned or Failed condition (any status) is older than
/// `request_ttl`, whatever their class (scripted requests aside), marked deleted.
pub(super) fn collect_garbage(work: &mut Work<'_>) -> Vec<RequestKey> {
    let (now, ttl) = (work.now, work.settings.request_ttl);
    let mut deleted = Vec::new();
    for req in work.requests.iter_mut() {
        if req.handling == Handling::Scripted {
            continue;
        }
        let old = [PROVISIONED, FAILED].iter().any(|t| {
            req.find(t)
                .is_some_and(|c| older_than(c.last_transition_time.0, ttl, now))
        });
        if old {
            req.deleted = true;
            deleted.push(req.key.clone());
        }
    }
    deleted
}

/// Rule 10: whether the request may be processed now: it has no Provisioned condition, or a
/// Provisioned=False older than its backoff (which then doubles, up to the max). Requests with
/// Provisioned or Failed True are never processed again, and their backoff is forgotten.
fn available(req: &super::Req<'_>, backoff: &mut Backoff, work: &Work<'_>) -> bool {
    let uid = &req.key.uid;
    if req.is_true(FAILED) || req.is_true(PROVISIONED) {
        backoff.forget(uid);
        return false;
    }
    let Some(provisioned) = req.find(PROVISIONED) else {
        return true;
    };
    if provisioned.status != "False" {
        return false;
    }
    let settings = work.settings;
    let delay = backoff.get(uid).unwrap_or(settings.initial_backoff);
    if older_than(provisioned.last_transition_time.0, delay, work.now) {
        backoff.set(uid, (delay * 2).min(settings.max_backoff));
        true
    } else {
        false
    }
}

/// The request(s) a loop processes.
#[derive(Clone, Debug, Default)]
pub(super) struct Picked {
    /// Indices into the loop's requests, with their pods.
    pub(super) requests: Vec<(usize, Vec<PodShape>)>,
    /// Whether any request was processed (picked or failed): the next loop then runs at once.
    pub(super) processed: bool,
}

/// Rules 3, 4 and 5: scans the requests in the order given and picks the first available
/// supported one (with batching, when it is a check-capacity one, up to the batch size of
/// available check-capacity requests). A request with a missing PodTemplate fails at once,
/// Failed=True/`FailedToCreatePods`, and the scan goes on. The pick is written Accepted=True,
/// except check-capacity requests when batching (they get it with their outcome).
pub(super) fn pick(work: &mut Work<'_>, backoff: &mut Backoff) -> Picked {
    let mut picked = Picked::default();
    let batch = work.settings.check_capacity_batch_size.max(1);
    let now = work.now;
    for i in 0..work.requests.len() {
        let (object, handling, supported) = {
            let req = &work.requests[i];
            (req.object, req.handling, req.supported())
        };
        let first = picked
            .requests
            .first()
            .map(|(j, _)| work.requests[*j].handling);
        let wanted = match first {
            None => supported,
            Some(Handling::CheckCapacity) if batch > 1 => {
                picked.requests.len() < batch && handling == Handling::CheckCapacity && supported
            }
            Some(_) => false,
        };
        if !wanted || !available(&work.requests[i], backoff, work) {
            continue;
        }
        picked.processed = true;
        match work.view.request_pods(object) {
            Err(missing) => {
                let message = format!(
                    "The pods cannot be built: PodTemplate(s) {} referenced by the podsets do not exist.",
                    missing.join(", ")
                );
                work.requests[i].set(FAILED, true, reason::FAILED_TO_CREATE_PODS, message, now);
            }
            Ok(pods) => {
                if batch <= 1 || handling != Handling::CheckCapacity {
                    accept(&mut work.requests[i], now);
                }
                picked.requests.push((i, pods));
            }
        }
    }
    picked
}

/// Accepted=True/`Accepted`, restamped.
pub(crate) fn accept(req: &mut super::Req<'_>, now: k8s_openapi::jiff::Timestamp) {
    let message = "The simulated cluster-autoscaler took up the request.".to_string();
    req.set(ACCEPTED, true, reason::ACCEPTED, message, now);
}

/// Rule 12: places the pods of every booked request (supported, Provisioned=True, neither
/// Failed nor BookingExpired True) in the snapshot, each where it fits (pods that fit nowhere
/// are skipped). A booked request whose PodTemplate is gone fails
/// Failed=True/`FailedToBookCapacity`. Bookings are not released when the consumer pods run
/// (cluster-autoscaler 1.36.1; see kubernetes/autoscaler#9805): those pods count twice.
pub(super) fn book(work: &mut Work<'_>, snapshot: &mut Snapshot) {
    let now = work.now;
    for i in 0..work.requests.len() {
        let req = &work.requests[i];
        let booked = req.supported()
            && req.is_true(PROVISIONED)
            && !req.is_true(FAILED)
            && !req.is_true(BOOKING_EXPIRED);
        if !booked {
            continue;
        }
        match work.view.request_pods(req.object) {
            Ok(pods) => {
                snapshot.place_each(&pods);
            }
            Err(missing) => {
                let message = format!(
                    "The booked pods cannot be built any more: PodTemplate(s) {} are gone.",
                    missing.join(", ")
                );
                work.requests[i].set(FAILED, true, reason::FAILED_TO_BOOK_CAPACITY, message, now);
            }
        }
    }
}
