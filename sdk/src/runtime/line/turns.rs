//! Turns to reconcile, granted first come, first served within three classes, with the
//! Workloads that wait for one kept here rather than in kube. There are two pools: the main
//! turns ([`crate::runtime::config::RuntimeConfig::concurrency`]) and, for a check that starts
//! early, turns kept for early starts
//! ([`crate::runtime::config::RuntimeConfig::early_start_concurrency`]).
//!
//! **Answers first.** A Workload whose entry of ours waits for an answer ([`Class::Answer`]:
//! Kueue has added it, the quota is held, and only the check stands between it and admission)
//! is granted a main turn before any Workload queued for other work (a release, a change of a
//! Workload already answered). Under a burst, first come, first served made each `Ready` write
//! wait behind every early start queued before it: the request was provisioned and the entry
//! there, and the answer came a whole queue later. A Workload queued for other work whose entry
//! then arrives moves up ([`Turns::raise`]). Other work is never starved: after
//! [`ANSWERS_IN_A_ROW`] answers granted a main turn while it waited, the oldest other Workload
//! is next.
//!
//! **Early starts have turns of their own.** With answers first and one pool, the early starts
//! of a burst ([`Class::Start`]) waited behind the answers, so Kueue's entry mostly came before
//! the request had been made, and each Workload went through the line twice: once to make the
//! request at the entry, once to answer when it was provisioned. A start turn serves an early
//! start first, and each pool serves the other's classes when its own has none waiting, so no
//! turn stays free while a Workload waits.
//!
//! kube's own limit hands a free slot to a waiting Workload picked in hash order, so under a
//! steady stream of changes some waited minutes (the soak found Workloads holding quota
//! unanswered for over 90 s): its limit is off and these turns are fair. A reconcile that
//! waited for its turn inside kube stayed in flight there meanwhile, and kube's runner polls
//! every reconcile in flight each time it is woken: at a burst of 5,000 Workloads, a third of
//! our CPU went to polling the thousands that waited. So a reconcile that finds no free turn
//! ends at once, its Workload queued here; when a turn ends, the next queued Workload is granted
//! it and sent to kube as a trigger, and its reconcile takes the granted turn.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use kube::runtime::reflector::ObjectRef;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::warn;

use crate::api::Workload;
use crate::runtime::memory::lock;

/// A turn granted to a queued Workload is taken back if its reconcile has not started by then
/// (kube starts it within milliseconds; a Workload deleted meanwhile gives it back at once, see
/// [`Turns::gone`]). Only a defect would leave one: without this, it would be lost for good.
pub(crate) const GRANT_TIMEOUT: Duration = Duration::from_secs(30);

/// At most this many answers are granted main turns in a row while other work waits: answers
/// go first, yet releases and changes keep a fifth of the main turns under any stream of
/// answers.
pub(crate) const ANSWERS_IN_A_ROW: u32 = 4;

/// A Workload, by namespace and name.
type Key = (String, String);

/// Which line a Workload waits in; a later variant is the higher class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Class {
    /// Any other work: a release, a change of a Workload already answered.
    Other,
    /// An early start is due (see [`crate::lifecycle::early_start_due`]): served first by the
    /// start turns.
    Start,
    /// An entry of ours waits for the check's answer (see
    /// [`crate::lifecycle::awaits_answer`]): served first by the main turns.
    Answer,
}

/// Which turns a turn is one of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pool {
    Main = 0,
    Start = 1,
}

impl Pool {
    const BOTH: [Pool; 2] = [Pool::Main, Pool::Start];

    /// The classes a free turn of this pool serves, in order; `answers_due_to_yield`: the main
    /// turns have granted [`ANSWERS_IN_A_ROW`] answers in a row.
    fn order(self, answers_due_to_yield: bool) -> [Class; 3] {
        match self {
            Pool::Main if answers_due_to_yield => [Class::Other, Class::Answer, Class::Start],
            Pool::Main => [Class::Answer, Class::Other, Class::Start],
            Pool::Start => [Class::Start, Class::Answer, Class::Other],
        }
    }
}

pub(crate) struct Turns {
    state: Mutex<State>,
}

struct State {
    /// The configured number of turns per pool (by [`Pool`]); those neither held nor granted
    /// are free.
    size: [usize; 2],
    /// Turns held by reconciles, per pool.
    held: [usize; 2],
    /// Turns granted and not yet taken, per pool.
    granted_from: [usize; 2],
    /// Workloads waiting for a turn, oldest first, per class; one no longer in `waiting` with
    /// that class is skipped (it left, or moved up to a higher class).
    answers: VecDeque<Key>,
    starts: VecDeque<Key>,
    others: VecDeque<Key>,
    waiting: HashMap<Key, Class>,
    /// Answers granted main turns since other work was last granted one (or found none
    /// waiting).
    answers_in_a_row: u32,
    /// Workloads granted a turn whose reconcile has yet to take it: since when, from which pool.
    granted: HashMap<Key, (Instant, Pool)>,
    /// Where a Workload granted a turn is sent to be reconciled; while none (the runtime does
    /// not lead), a turn that ends stays free and a reconcile takes any free turn.
    triggers: Option<mpsc::UnboundedSender<ObjectRef<Workload>>>,
}

/// A turn held by a reconcile; handed on when dropped.
pub(crate) struct Turn<'a> {
    turns: &'a Turns,
    pool: Pool,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let mut s = lock(&self.turns.state);
        s.held[self.pool as usize] -= 1;
        s.grant_free_turns(Instant::now());
    }
}

impl Turns {
    /// `main` turns (at least one), and `starts` kept for early starts (none for a check that
    /// does not start early).
    pub(crate) fn new(main: usize, starts: usize) -> Self {
        Self {
            state: Mutex::new(State {
                size: [main.max(1), starts],
                held: [0, 0],
                granted_from: [0, 0],
                answers: VecDeque::new(),
                starts: VecDeque::new(),
                others: VecDeque::new(),
                waiting: HashMap::new(),
                answers_in_a_row: 0,
                granted: HashMap::new(),
                triggers: None,
            }),
        }
    }

    /// From now on, a Workload granted a turn is sent to `triggers` to be reconciled.
    pub(crate) fn connect(&self, triggers: mpsc::UnboundedSender<ObjectRef<Workload>>) {
        let mut s = lock(&self.state);
        s.triggers = Some(triggers);
        s.grant_free_turns(Instant::now());
    }

    /// A turn for the reconcile of `namespace/name` (of `class`): the one granted to it, or a
    /// free one when nobody waits. `None` queues the Workload (once, in the higher of the
    /// classes it was asked with): its turn comes as a trigger.
    pub(crate) fn ask(
        &self,
        namespace: &str,
        name: &str,
        class: Class,
        now: Instant,
    ) -> Option<Turn<'_>> {
        let key = (namespace.to_string(), name.to_string());
        let mut s = lock(&self.state);
        // Also grants free turns: one never stays free while others wait (they may be this
        // very Workload, queued before the triggers were connected).
        s.take_back_stale_grants(now);
        if let Some((_, pool)) = s.granted.remove(&key) {
            s.granted_from[pool as usize] -= 1;
            s.held[pool as usize] += 1;
            return Some(Turn { turns: self, pool });
        }
        // Without a trigger to come back by, nothing may be left queued.
        if s.waiting.is_empty() || s.triggers.is_none() {
            let own = match class {
                Class::Start => [Pool::Start, Pool::Main],
                _ => Pool::BOTH,
            };
            if let Some(pool) = own.into_iter().find(|p| s.free(*p) > 0) {
                s.held[pool as usize] += 1;
                s.waiting.remove(&key);
                return Some(Turn { turns: self, pool });
            }
        }
        s.enqueue(key, class);
        None
    }

    /// A change made `namespace/name` one of `class`: if it waits in line, it moves up when
    /// that is higher (keeping its place among those of that class by the time it moved).
    /// Returns whether it waits, as [`Turns::waits`] says, under the same lock.
    pub(crate) fn raise(&self, namespace: &str, name: &str, class: Class) -> bool {
        let key = (namespace.to_string(), name.to_string());
        let mut s = lock(&self.state);
        if s.waiting.contains_key(&key) {
            s.enqueue(key, class);
            return true;
        }
        s.granted.contains_key(&key)
    }

    /// Whether `namespace/name` waits for its turn or has been granted one that its reconcile
    /// has yet to take: that reconcile reads the cache when it runs, so a change or a wake of
    /// the Workload needs no reconcile of its own. kube would hold one until the coming
    /// reconcile ends and then run it for nothing; worse, it keeps every such held trigger in
    /// a set it searches on every poll, which made each reconcile's cost grow with the number
    /// of Workloads waiting (at a 5,000 burst, 2.7 times the CPU per Workload of a 1,000 burst).
    pub(crate) fn waits(&self, namespace: &str, name: &str) -> bool {
        let key = (namespace.to_string(), name.to_string());
        let s = lock(&self.state);
        s.waiting.contains_key(&key) || s.granted.contains_key(&key)
    }

    /// `namespace/name` is gone (kube found no such Workload to reconcile): it waits no more,
    /// and a turn granted to it goes to the next.
    pub(crate) fn gone(&self, namespace: &str, name: &str, now: Instant) {
        let key = (namespace.to_string(), name.to_string());
        let mut s = lock(&self.state);
        s.waiting.remove(&key);
        if let Some((_, pool)) = s.granted.remove(&key) {
            s.granted_from[pool as usize] -= 1;
            s.grant_free_turns(now);
        }
    }

    /// Takes back turns granted too long ago (see [`GRANT_TIMEOUT`]).
    pub(crate) fn take_back_stale_grants(&self, now: Instant) {
        lock(&self.state).take_back_stale_grants(now);
    }

    /// The runtime stops leading: nothing waits, every turn not held is free, no trigger is
    /// sent.
    pub(crate) fn clear(&self) {
        let mut s = lock(&self.state);
        s.answers.clear();
        s.starts.clear();
        s.others.clear();
        s.waiting.clear();
        s.granted.clear();
        s.granted_from = [0, 0];
        s.triggers = None;
    }

    /// Workloads waiting for a turn, and turns granted and not yet taken (for tests).
    #[cfg(test)]
    pub(crate) fn counts(&self) -> (usize, usize, usize) {
        let s = lock(&self.state);
        let free = Pool::BOTH.into_iter().map(|p| s.free(p)).sum();
        (s.waiting.len(), s.granted.len(), free)
    }
}

impl State {
    /// Turns of `pool` neither held nor granted.
    fn free(&self, pool: Pool) -> usize {
        let i = pool as usize;
        self.size[i] - self.held[i] - self.granted_from[i]
    }

    /// Grants each free turn to the Workload its pool serves next, as long as both last (a turn
    /// that ended goes to the next waiting, or stays free).
    fn grant_free_turns(&mut self, now: Instant) {
        for pool in Pool::BOTH {
            while self.free(pool) > 0 && self.grant_to_next(pool, now) {}
        }
    }

    /// Queues `key` in `class`, or moves it up to `class` if it waits in a lower one; a key
    /// already waiting in `class` or higher keeps its place.
    fn enqueue(&mut self, key: Key, class: Class) {
        match self.waiting.get(&key) {
            Some(queued) if *queued >= class => return,
            _ => {}
        }
        self.waiting.insert(key.clone(), class);
        self.queue(class).push_back(key);
    }

    fn queue(&mut self, class: Class) -> &mut VecDeque<Key> {
        match class {
            Class::Answer => &mut self.answers,
            Class::Start => &mut self.starts,
            Class::Other => &mut self.others,
        }
    }

    /// The Workload a free turn of `pool` goes to, taken out of line: the oldest of the first
    /// class in the pool's order that has one waiting (for the main turns, answers first, but
    /// see [`ANSWERS_IN_A_ROW`]).
    fn next_waiting(&mut self, pool: Pool) -> Option<Key> {
        let order = pool.order(self.answers_in_a_row >= ANSWERS_IN_A_ROW);
        let next = self.take_oldest(order);
        if pool == Pool::Main {
            self.answers_in_a_row = match next {
                Some((_, Class::Answer)) => self.answers_in_a_row + 1,
                _ => 0,
            };
        }
        next.map(|(key, _)| key)
    }

    /// The oldest Workload waiting in the first of `order` that has one, and its class.
    fn take_oldest(&mut self, order: [Class; 3]) -> Option<(Key, Class)> {
        for class in order {
            while let Some(key) = self.queue(class).pop_front() {
                // Skipped: gone, granted, or moved up (it waits in another queue).
                if self.waiting.get(&key) == Some(&class) {
                    self.waiting.remove(&key);
                    return Some((key, class));
                }
            }
        }
        None
    }

    /// Grants a turn of `pool` to the Workload it serves next and sends it to be reconciled;
    /// `false` when none waits, or none can be sent (not leading, or kube's controller gone).
    fn grant_to_next(&mut self, pool: Pool, now: Instant) -> bool {
        if self.triggers.is_none() {
            return false;
        }
        let Some(key) = self.next_waiting(pool) else {
            return false;
        };
        let sent = self
            .triggers
            .as_ref()
            .is_some_and(|t| t.send(ObjectRef::new(&key.1).within(&key.0)).is_ok());
        if sent {
            self.granted.insert(key, (now, pool));
            self.granted_from[pool as usize] += 1;
        }
        sent
    }

    /// Takes back the turns granted too long ago and puts their Workloads back in line (at its
    /// end), so that a lost trigger delays a Workload but never drops it.
    fn take_back_stale_grants(&mut self, now: Instant) {
        let stale: Vec<(Key, Pool)> = self
            .granted
            .iter()
            .filter(|(_, (since, _))| now.saturating_duration_since(*since) >= GRANT_TIMEOUT)
            .map(|(key, (_, pool))| (key.clone(), *pool))
            .collect();
        for (key, pool) in stale {
            warn!(namespace = %key.0, workload = %key.1, timeout = ?GRANT_TIMEOUT,
                "the reconcile granted a turn never took it; the Workload goes back in line");
            self.granted.remove(&key);
            self.granted_from[pool as usize] -= 1;
            self.enqueue(key, Class::Other);
        }
        self.grant_free_turns(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn connected(all: usize) -> (Turns, mpsc::UnboundedReceiver<ObjectRef<Workload>>) {
        connected_with(all, 0)
    }

    fn connected_with(
        main: usize,
        starts: usize,
    ) -> (Turns, mpsc::UnboundedReceiver<ObjectRef<Workload>>) {
        let turns = Turns::new(main, starts);
        let (tx, rx) = mpsc::unbounded_channel();
        turns.connect(tx);
        (turns, rx)
    }

    fn sent(rx: &mut mpsc::UnboundedReceiver<ObjectRef<Workload>>) -> Vec<String> {
        let mut names = Vec::new();
        while let Ok(r) = rx.try_recv() {
            names.push(format!("{}/{}", r.namespace.unwrap_or_default(), r.name));
        }
        names
    }

    /// With one turn: `n` times, the Workload granted the turn takes it and ends; their names
    /// in the order granted. Exactly one grant at a time.
    fn take_each_grant(
        turns: &Turns,
        rx: &mut mpsc::UnboundedReceiver<ObjectRef<Workload>>,
        n: usize,
        now: Instant,
    ) -> Vec<String> {
        let mut order = Vec::new();
        for _ in 0..n {
            let granted = sent(rx);
            assert_eq!(
                granted.len(),
                1,
                "one turn, one grant at a time: {granted:?}"
            );
            let name = granted[0].trim_start_matches("ns/").to_string();
            drop(
                turns
                    .ask("ns", &name, Class::Other, now)
                    .expect("its granted turn"),
            );
            order.push(name);
        }
        order
    }

    #[test]
    fn turns_go_first_come_first_served_through_triggers() {
        let (turns, mut rx) = connected(1);
        let now = Instant::now();
        let a = turns
            .ask("ns", "a", Class::Other, now)
            .expect("a free turn");
        assert!(!turns.waits("ns", "a"), "has its turn");
        assert!(turns.ask("ns", "b", Class::Other, now).is_none(), "queued");
        assert!(turns.ask("ns", "c", Class::Other, now).is_none(), "queued");
        // Asked again while queued (a timer of kube's): still queued once, in its place.
        assert!(turns.ask("ns", "b", Class::Other, now).is_none());
        assert!(turns.waits("ns", "b") && turns.waits("ns", "c"));
        assert_eq!(turns.counts(), (2, 0, 0));
        assert!(
            sent(&mut rx).is_empty(),
            "nothing granted while a holds the turn"
        );

        drop(a);
        assert_eq!(
            sent(&mut rx),
            ["ns/b"],
            "the oldest waiting is granted the turn"
        );
        assert!(
            turns.waits("ns", "b"),
            "granted, its reconcile yet to read the cache"
        );
        // A newcomer does not overtake the grant, nor c.
        assert!(turns.ask("ns", "d", Class::Other, now).is_none());
        let b = turns
            .ask("ns", "b", Class::Other, now)
            .expect("b takes its granted turn");
        assert!(!turns.waits("ns", "b"));
        drop(b);
        assert_eq!(sent(&mut rx), ["ns/c"]);
        let c = turns.ask("ns", "c", Class::Other, now).expect("c's turn");
        drop(c);
        assert_eq!(sent(&mut rx), ["ns/d"]);
        drop(turns.ask("ns", "d", Class::Other, now).expect("d's turn"));
        assert!(sent(&mut rx).is_empty());
        assert_eq!(turns.counts(), (0, 0, 1), "the turn is free again");
    }

    #[test]
    fn a_workload_gone_before_its_turn_gives_the_grant_on() {
        let (turns, mut rx) = connected(1);
        let now = Instant::now();
        let a = turns
            .ask("ns", "a", Class::Other, now)
            .expect("a free turn");
        assert!(turns.ask("ns", "b", Class::Other, now).is_none());
        assert!(turns.ask("ns", "c", Class::Other, now).is_none());
        assert!(turns.ask("ns", "d", Class::Other, now).is_none());
        // d is deleted while it waits: skipped when the turn comes.
        turns.gone("ns", "d", now);
        assert!(!turns.waits("ns", "d"));
        drop(a);
        assert_eq!(sent(&mut rx), ["ns/b"]);
        // b is deleted before its reconcile ran: kube finds nothing, the grant goes to c.
        turns.gone("ns", "b", now);
        assert_eq!(sent(&mut rx), ["ns/c"]);
        turns.gone("ns", "c", now);
        assert!(sent(&mut rx).is_empty(), "d no longer waits");
        assert_eq!(turns.counts(), (0, 0, 1));
    }

    #[test]
    fn a_grant_never_taken_is_taken_back_and_its_workload_put_back_in_line() {
        let (turns, mut rx) = connected(1);
        let now = Instant::now();
        let a = turns
            .ask("ns", "a", Class::Other, now)
            .expect("a free turn");
        assert!(turns.ask("ns", "b", Class::Other, now).is_none());
        assert!(turns.ask("ns", "c", Class::Other, now).is_none());
        drop(a);
        assert_eq!(sent(&mut rx), ["ns/b"]);
        turns.take_back_stale_grants(now + GRANT_TIMEOUT / 2);
        assert!(sent(&mut rx).is_empty(), "not yet");
        // Granted when `a` ended, a moment after `now`.
        let later = now + GRANT_TIMEOUT + Duration::from_secs(1);
        turns.take_back_stale_grants(later);
        assert_eq!(sent(&mut rx), ["ns/c"], "b's turn goes to c");
        // b is not dropped: back in line, and granted again when c's turn ends.
        assert!(turns.waits("ns", "b"));
        let c = turns
            .ask("ns", "c", Class::Other, later)
            .expect("c's granted turn");
        drop(c);
        assert_eq!(sent(&mut rx), ["ns/b"]);
        assert!(
            turns.ask("ns", "b", Class::Other, later).is_some(),
            "b takes it"
        );
    }

    #[test]
    fn a_free_turn_never_stays_free_while_others_wait() {
        let turns = Turns::new(1, 0);
        let now = Instant::now();
        let a = turns.ask("ns", "a", Class::Other, now).expect("a turn");
        assert!(
            turns.ask("ns", "b", Class::Other, now).is_none(),
            "queued before any trigger"
        );
        drop(a);
        assert_eq!(turns.counts(), (1, 0, 1), "free, b still waiting");
        // Connected (the runtime leads): b is granted the free turn at once.
        let (tx, mut rx) = mpsc::unbounded_channel();
        turns.connect(tx);
        assert_eq!(sent(&mut rx), ["ns/b"]);
        assert!(
            turns.ask("ns", "c", Class::Other, now).is_none(),
            "b's turn is granted, not free"
        );
        assert!(turns.ask("ns", "b", Class::Other, now).is_some());
    }

    #[test]
    fn without_triggers_nothing_is_left_waiting() {
        let turns = Turns::new(2, 0);
        let now = Instant::now();
        let a = turns.ask("ns", "a", Class::Other, now).expect("a turn");
        let b = turns.ask("ns", "b", Class::Other, now).expect("a turn");
        assert!(
            turns.ask("ns", "c", Class::Other, now).is_none(),
            "every turn is held"
        );
        // Not leading: a turn that ends is free, and c's reconcile (asked again) takes it.
        drop(a);
        assert!(turns.ask("ns", "c", Class::Other, now).is_some());
        drop(b);
        // Stopping to lead forgets the waiting and frees everything.
        let (turns, mut rx) = connected(1);
        let held = turns.ask("ns", "x", Class::Other, now).expect("a turn");
        assert!(turns.ask("ns", "y", Class::Other, now).is_none());
        turns.clear();
        drop(held);
        assert!(sent(&mut rx).is_empty());
        assert!(!turns.waits("ns", "y"));
        assert_eq!(turns.counts(), (0, 0, 1), "the one turn, free");
    }

    #[test]
    fn answers_are_granted_turns_before_other_work_and_a_waiting_workload_moves_up() {
        let (turns, mut rx) = connected(1);
        let now = Instant::now();
        let held = turns
            .ask("ns", "a", Class::Other, now)
            .expect("a free turn");
        // Queued in this order: two early starts, an answer, another early start.
        assert!(turns.ask("ns", "early-1", Class::Other, now).is_none());
        assert!(turns.ask("ns", "early-2", Class::Other, now).is_none());
        assert!(turns.ask("ns", "answer-1", Class::Answer, now).is_none());
        assert!(turns.ask("ns", "early-3", Class::Other, now).is_none());
        // early-2's entry arrives while it waits: it moves up, behind answer-1.
        assert!(turns.raise("ns", "early-2", Class::Answer), "it waits");
        // Raising one that does not wait queues nothing; lowering never happens.
        assert!(!turns.raise("ns", "elsewhere", Class::Answer));
        assert!(!turns.waits("ns", "elsewhere"));
        assert!(turns.ask("ns", "answer-1", Class::Other, now).is_none());
        assert_eq!(turns.counts(), (4, 0, 0));

        drop(held);
        let order = take_each_grant(&turns, &mut rx, 4, now);
        assert_eq!(order, ["answer-1", "early-2", "early-1", "early-3"]);
        assert!(sent(&mut rx).is_empty(), "each granted once");
        assert_eq!(turns.counts(), (0, 0, 1));
    }

    #[test]
    fn other_work_gets_a_turn_after_a_run_of_answers() {
        let (turns, mut rx) = connected(1);
        let now = Instant::now();
        let held = turns
            .ask("ns", "held", Class::Other, now)
            .expect("a free turn");
        assert!(turns.ask("ns", "release", Class::Other, now).is_none());
        let answers = ANSWERS_IN_A_ROW as usize + 2;
        for i in 0..answers {
            let name = format!("answer-{i}");
            assert!(turns.ask("ns", &name, Class::Answer, now).is_none());
        }
        drop(held);
        let order = take_each_grant(&turns, &mut rx, answers + 1, now);
        let release = order.iter().position(|n| n == "release");
        assert_eq!(release, Some(ANSWERS_IN_A_ROW as usize), "{order:?}");
    }

    #[test]
    fn early_starts_have_turns_of_their_own_beside_the_answers() {
        let (turns, mut rx) = connected_with(1, 1);
        let now = Instant::now();
        let answer = turns
            .ask("ns", "answer-0", Class::Answer, now)
            .expect("a main turn");
        let start = turns
            .ask("ns", "start-0", Class::Start, now)
            .expect("a start turn, though the main one is held");
        for (name, class) in [
            ("answer-1", Class::Answer),
            ("start-1", Class::Start),
            ("other", Class::Other),
            ("start-2", Class::Start),
        ] {
            assert!(turns.ask("ns", name, class, now).is_none(), "{name} waits");
        }
        // The start turn ends: the oldest early start is next, not the older answer.
        drop(start);
        assert_eq!(sent(&mut rx), ["ns/start-1"]);
        let start = turns
            .ask("ns", "start-1", Class::Start, now)
            .expect("granted");
        // The main turn ends: answers first there.
        drop(answer);
        assert_eq!(sent(&mut rx), ["ns/answer-1"]);
        let answer = turns
            .ask("ns", "answer-1", Class::Answer, now)
            .expect("granted");
        drop(start);
        assert_eq!(sent(&mut rx), ["ns/start-2"]);
        drop(answer);
        assert_eq!(sent(&mut rx), ["ns/other"], "no answer waits: other work");
        assert_eq!(turns.counts(), (0, 2, 0));
    }

    #[test]
    fn a_pool_serves_the_others_classes_when_its_own_has_none_waiting() {
        let (turns, mut rx) = connected_with(1, 1);
        let now = Instant::now();
        let main = turns.ask("ns", "held", Class::Other, now).expect("main");
        // The main turn is held and no early start waits: an answer takes the start turn.
        let lent = turns
            .ask("ns", "answer-0", Class::Answer, now)
            .expect("the free start turn");
        assert!(turns.ask("ns", "answer-1", Class::Answer, now).is_none());
        assert!(turns.ask("ns", "start-0", Class::Start, now).is_none());
        // The lent turn ends: it goes back to an early start first.
        drop(lent);
        assert_eq!(sent(&mut rx), ["ns/start-0"]);
        let start = turns
            .ask("ns", "start-0", Class::Start, now)
            .expect("granted");
        drop(start);
        assert_eq!(sent(&mut rx), ["ns/answer-1"], "then to the answer waiting");
        drop(
            turns
                .ask("ns", "answer-1", Class::Answer, now)
                .expect("granted"),
        );
        // Early starts take a free main turn too when theirs are held.
        let start = turns
            .ask("ns", "start-1", Class::Start, now)
            .expect("start");
        assert!(turns.ask("ns", "start-2", Class::Start, now).is_none());
        drop(main);
        assert_eq!(
            sent(&mut rx),
            ["ns/start-2"],
            "the main turn, nothing else waiting"
        );
        drop(start);
        assert!(sent(&mut rx).is_empty());
        assert_eq!(turns.counts(), (0, 1, 1));
    }

    #[test]
    fn an_early_start_whose_entry_comes_while_it_waits_moves_up_to_the_answers() {
        let (turns, mut rx) = connected_with(1, 0);
        let now = Instant::now();
        let held = turns.ask("ns", "held", Class::Other, now).expect("a turn");
        assert!(turns.ask("ns", "other", Class::Other, now).is_none());
        assert!(turns.ask("ns", "start", Class::Start, now).is_none());
        assert!(turns.raise("ns", "start", Class::Answer), "it waits");
        drop(held);
        assert_eq!(take_each_grant(&turns, &mut rx, 2, now), ["start", "other"]);
        // Without start turns (a check that does not start early), an early start follows
        // other work on the main turns.
        let held = turns.ask("ns", "held", Class::Other, now).expect("a turn");
        assert!(turns.ask("ns", "start", Class::Start, now).is_none());
        assert!(turns.ask("ns", "other", Class::Other, now).is_none());
        drop(held);
        assert_eq!(take_each_grant(&turns, &mut rx, 2, now), ["other", "start"]);
    }
}
