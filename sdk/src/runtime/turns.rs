//! Turns to reconcile: at most `concurrency` reconciles hold one at once. A reconcile that can
//! answer an entry Kueue waits for goes before one that cannot yet (an early start, a change
//! that needs nothing), so that under a burst the Workloads whose capacity is there are admitted
//! first instead of queueing behind the next reservations. Within a class, first come, first
//! served; when both wait, every [`STARTS_EVERY`]th free turn goes to the other class, so that
//! neither waits forever.

use std::collections::VecDeque;
use std::sync::Mutex;

use tokio::sync::oneshot;

/// When reconciles of both classes wait, one turn in this many goes to [`Class::Other`].
const STARTS_EVERY: u32 = 4;

/// What a reconcile may do with its turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Class {
    /// The Workload has an entry of ours that Kueue waits for.
    Answer,
    /// Anything else: work started before the entry, a release, a change that needs nothing.
    Other,
}

impl Class {
    /// Its label in the metrics.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Answer => "answer",
            Self::Other => "other",
        }
    }
}

pub(crate) struct Turns {
    state: Mutex<State>,
}

struct State {
    free: usize,
    answer: VecDeque<oneshot::Sender<()>>,
    other: VecDeque<oneshot::Sender<()>>,
    /// Turns handed to [`Class::Answer`] while [`Class::Other`] waited, since the last one the
    /// other class got.
    answers_in_a_row: u32,
}

/// A turn, given back when dropped.
pub(crate) struct Turn<'a>(&'a Turns);

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.0.give_back();
    }
}

impl Turns {
    pub(crate) fn new(concurrency: usize) -> Self {
        Self {
            state: Mutex::new(State {
                free: concurrency.max(1),
                answer: VecDeque::new(),
                other: VecDeque::new(),
                answers_in_a_row: 0,
            }),
        }
    }

    /// Waits for a turn of `class`. Cancel-safe: a waiter dropped after it was handed a turn
    /// hands it on.
    pub(crate) async fn take(&self, class: Class) -> Turn<'_> {
        let handed = {
            let mut state = self.lock();
            // A turn is free only while nobody waits (`give_back` hands it on first).
            if state.free > 0 {
                state.free -= 1;
                return Turn(self);
            }
            let (tx, rx) = oneshot::channel();
            match class {
                Class::Answer => state.answer.push_back(tx),
                Class::Other => state.other.push_back(tx),
            }
            rx
        };
        let mut waiting = Waiting {
            turns: self,
            handed: Some(handed),
        };
        let handed = waiting.handed.as_mut().expect("set above");
        // The sender is dropped only when handing a turn failed, which cannot happen to a
        // receiver still waiting; either way the turn is ours.
        let _ = handed.await;
        waiting.handed = None;
        Turn(self)
    }

    fn give_back(&self) {
        let mut state = self.lock();
        loop {
            let other_due = state.answers_in_a_row + 1 >= STARTS_EVERY;
            let next = match (state.answer.is_empty(), state.other.is_empty()) {
                (true, true) => None,
                (false, true) => state.answer.pop_front(),
                (true, false) => {
                    state.answers_in_a_row = 0;
                    state.other.pop_front()
                }
                (false, false) if other_due => {
                    state.answers_in_a_row = 0;
                    state.other.pop_front()
                }
                (false, false) => {
                    state.answers_in_a_row += 1;
                    state.answer.pop_front()
                }
            };
            match next {
                None => {
                    state.free += 1;
                    return;
                }
                // A waiter gone meanwhile: the turn goes to the next one.
                Some(waiter) => {
                    if waiter.send(()).is_ok() {
                        return;
                    }
                }
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A waiter; dropped before its turn came, it leaves nothing behind.
struct Waiting<'a> {
    turns: &'a Turns,
    handed: Option<oneshot::Receiver<()>>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if let Some(mut handed) = self.handed.take() {
            handed.close();
            // Handed a turn between its last poll and now: pass it on.
            if handed.try_recv().is_ok() {
                self.turns.give_back();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Lets every spawned task run until it waits.
    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    /// Spawns a waiter per class in `classes` (in order, each queued before the next), which
    /// records its index once it has a turn and keeps it until told.
    async fn waiters(
        turns: &Arc<Turns>,
        classes: &[Class],
    ) -> (
        Arc<Mutex<Vec<usize>>>,
        Vec<oneshot::Sender<()>>,
        Vec<tokio::task::JoinHandle<()>>,
    ) {
        let order = Arc::new(Mutex::new(Vec::new()));
        let (mut done, mut tasks) = (Vec::new(), Vec::new());
        for (i, class) in classes.iter().copied().enumerate() {
            let (tx, rx) = oneshot::channel::<()>();
            done.push(tx);
            let (turns, order) = (turns.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let _turn = turns.take(class).await;
                order.lock().expect("not poisoned").push(i);
                let _ = rx.await;
            }));
            settle().await;
        }
        (order, done, tasks)
    }

    #[tokio::test(flavor = "current_thread")]
    async fn answers_go_first_but_the_others_get_every_fourth_turn() {
        use Class::*;
        let turns = Arc::new(Turns::new(1));
        let held = turns.take(Other).await;
        let classes = [Other, Other, Answer, Answer, Answer, Answer, Answer, Other];
        let (order, mut done, _tasks) = waiters(&turns, &classes).await;
        drop(held);
        for _ in 0..classes.len() {
            settle().await;
            let last = *order
                .lock()
                .expect("not poisoned")
                .last()
                .expect("someone has the turn");
            let _ = std::mem::replace(&mut done[last], oneshot::channel().0).send(());
        }
        settle().await;
        // Answers 2, 3, 4, then an Other (0), answers 5, 6, then the Others in order.
        assert_eq!(
            *order.lock().expect("not poisoned"),
            [2, 3, 4, 0, 5, 6, 1, 7]
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn no_more_than_the_concurrency_at_once_and_free_turns_come_back() {
        let turns = Turns::new(2);
        let a = turns.take(Class::Other).await;
        let _b = turns.take(Class::Answer).await;
        let third = turns.take(Class::Answer);
        let mut third = std::pin::pin!(third);
        assert!(futures::poll!(third.as_mut()).is_pending(), "two at once");
        drop(a);
        assert!(futures::poll!(third.as_mut()).is_ready());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_waiter_dropped_after_it_was_handed_a_turn_hands_it_on() {
        let turns = Turns::new(1);
        let held = turns.take(Class::Other).await;
        let mut first = Box::pin(turns.take(Class::Answer));
        assert!(futures::poll!(first.as_mut()).is_pending());
        let mut second = Box::pin(turns.take(Class::Other));
        assert!(futures::poll!(second.as_mut()).is_pending());
        // The turn goes to `first`, which is dropped before it looks.
        drop(held);
        drop(first);
        let std::task::Poll::Ready(second_turn) = futures::poll!(second.as_mut()) else {
            panic!("the turn was not passed on");
        };
        // And a waiter dropped before any turn came leaves the count as it was.
        let mut gone = Box::pin(turns.take(Class::Other));
        assert!(futures::poll!(gone.as_mut()).is_pending());
        drop(gone);
        drop(second_turn);
        let _again = turns.take(Class::Other).await;
    }
}
