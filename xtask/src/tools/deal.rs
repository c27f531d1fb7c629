//! Work dealt out to GPUs: one worker thread per GPU pulls items from a shared
//! queue in order until it is empty. A worker whose GPU fails its start check
//! never starts; one whose item fails retires, and that item is reported lost,
//! never dropped; items no worker was left to take are lost too. `test`,
//! `tune` and `profile` use it for `--gpus`.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::tools::gpu::ListedGpu;

/// An item no worker finished: its place in the queue, the item, the GPU it was
/// on (none if no worker took it) and why.
pub struct Lost<T> {
    pub index: usize,
    pub item: T,
    pub gpu: Option<String>,
    pub why: String,
}

/// What the workers did: results by queue place (sorted), the lost items, and
/// when each worker was busy with what.
pub struct Dealt<T, R> {
    pub done: Vec<(usize, R)>,
    pub lost: Vec<Lost<T>>,
    pub spans: Vec<Span>,
    /// Each worker whose start failed, and why (as `say` heard it), sorted.
    pub not_started: Vec<String>,
}

/// A stretch of one worker's time, in seconds from the start of the deal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Span {
    /// The worker's GPU (UUID); none where CUDA picks the device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<String>,
    /// The item's place in the queue; none for the worker's start check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub item: Option<usize>,
    pub start_s: f64,
    pub end_s: f64,
}

impl Span {
    /// This span as a report's timeline row: `what` names the item.
    pub fn step(&self, what: impl Into<String>, setup_s: Option<f64>) -> Step {
        Step { gpu: self.gpu.clone(), what: what.into(), start_s: self.start_s, end_s: self.end_s, setup_s }
    }
}

/// A row of a report's timeline: what a worker did when, in seconds from the
/// start of the deal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Step {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<String>,
    /// `start check`, or the item (a case's name, `memcheck 2/4`).
    pub what: String,
    pub start_s: f64,
    pub end_s: f64,
    /// Of which the item's process spent setting up (opening the GPU, loading
    /// kernels), where it said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setup_s: Option<f64>,
}

/// One line per worker: how long it was busy against the whole deal, over how
/// many items, and how much of that was start checks and process set-up.
pub fn busy_lines(steps: &[Step]) -> Vec<String> {
    let wall = steps.iter().map(|s| s.end_s).fold(0.0, f64::max);
    let mut workers: Vec<Option<&str>> = steps.iter().map(|s| s.gpu.as_deref()).collect();
    workers.sort();
    workers.dedup();
    workers
        .into_iter()
        .map(|w| {
            let mine: Vec<&Step> = steps.iter().filter(|s| s.gpu.as_deref() == w).collect();
            // Folded from +0.0: an empty f64 sum is −0.0.
            let sum = |xs: &mut dyn Iterator<Item = f64>| xs.fold(0.0, |a, x| a + x);
            let busy = sum(&mut mine.iter().map(|s| s.end_s - s.start_s));
            let check = sum(&mut mine.iter().filter(|s| s.what == START_CHECK).map(|s| s.end_s - s.start_s));
            let setup = sum(&mut mine.iter().filter_map(|s| s.setup_s));
            let items = mine.iter().filter(|s| s.what != START_CHECK).count();
            format!(
                "{}: busy {busy:.1} of {wall:.1} s, {items} item(s); start check {check:.1} s, set-up {setup:.1} s",
                w.unwrap_or("the default GPU")
            )
        })
        .collect()
}

/// The `what` of a worker's start check in a timeline.
pub const START_CHECK: &str = "start check";

/// How a worker goes on: its state, made by `start`; and why it should take no
/// more items, where it should not (its item's result is kept, the rest left
/// to the others).
pub trait Worker {
    fn retired(&self) -> Option<&str> {
        None
    }
}

impl Worker for () {}

/// Runs `work(state, index, item, gpu)` for every item on the workers of `gpus`
/// (`None`: the device CUDA picks). `start(gpu)` runs first on each worker (a
/// preflight, or a long-lived process the worker feeds) and makes its state;
/// `say` hears about workers that stop, an item being a `noun`.
pub fn deal<T: Send, R: Send, S: Worker>(
    noun: &str,
    gpus: &[Option<ListedGpu>],
    items: Vec<T>,
    start: impl Fn(Option<&ListedGpu>) -> Result<S, String> + Sync,
    work: impl Fn(&mut S, usize, &T, Option<&ListedGpu>) -> Result<R, String> + Sync,
    say: impl Fn(&str) + Sync,
) -> Dealt<T, R> {
    let queue = Mutex::new(items.into_iter().enumerate().collect::<VecDeque<_>>());
    let done = Mutex::new(Vec::new());
    let lost = Mutex::new(Vec::new());
    let spans = Mutex::new(Vec::new());
    let not_started = Mutex::new(Vec::new());
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for gpu in gpus {
            let (queue, done, lost, spans, not_started) = (&queue, &done, &lost, &spans, &not_started);
            let (start, work, say) = (&start, &work, &say);
            s.spawn(move || {
                let uuid = gpu.as_ref().map(|g| g.uuid.clone());
                let timed = |item: Option<usize>, from: f64| {
                    let span = Span { gpu: uuid.clone(), item, start_s: from, end_s: t0.elapsed().as_secs_f64() };
                    spans.lock().unwrap_or_else(|e| e.into_inner()).push(span);
                };
                let from = t0.elapsed().as_secs_f64();
                let started = start(gpu.as_ref());
                timed(None, from);
                let mut state = match started {
                    Ok(state) => state,
                    Err(why) => {
                        let which =
                            gpu.as_ref().map_or("the default GPU".into(), |g| format!("GPU {} ({})", g.uuid, g.name));
                        let what = format!("{which}: {why}; its worker does not start");
                        say(&what);
                        not_started.lock().unwrap_or_else(|e| e.into_inner()).push(what);
                        return;
                    }
                };
                loop {
                    if let Some(why) = state.retired() {
                        say(&format!("{why}; its worker stops"));
                        break;
                    }
                    let Some((index, item)) = queue.lock().unwrap_or_else(|e| e.into_inner()).pop_front() else {
                        break;
                    };
                    let from = t0.elapsed().as_secs_f64();
                    let result = work(&mut state, index, &item, gpu.as_ref());
                    timed(Some(index), from);
                    match result {
                        Ok(r) => done.lock().unwrap_or_else(|e| e.into_inner()).push((index, r)),
                        Err(why) => {
                            say(&format!("{noun} {index} lost ({why}); its worker stops"));
                            let gpu = gpu.as_ref().map(|g| g.uuid.clone());
                            lost.lock().unwrap_or_else(|e| e.into_inner()).push(Lost { index, item, gpu, why });
                            break;
                        }
                    }
                }
            });
        }
    });
    let mut lost = lost.into_inner().unwrap_or_else(|e| e.into_inner());
    for (index, item) in queue.into_inner().unwrap_or_else(|e| e.into_inner()) {
        lost.push(Lost { index, item, gpu: None, why: "no worker was left to run it".into() });
    }
    lost.sort_by_key(|l| l.index);
    let mut done = done.into_inner().unwrap_or_else(|e| e.into_inner());
    done.sort_by_key(|(index, _)| *index);
    let mut spans = spans.into_inner().unwrap_or_else(|e| e.into_inner());
    spans.sort_by(|a, b| a.start_s.total_cmp(&b.start_s));
    let mut not_started = not_started.into_inner().unwrap_or_else(|e| e.into_inner());
    not_started.sort();
    Dealt { done, lost, spans, not_started }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpus(n: usize) -> Vec<Option<ListedGpu>> {
        (0..n).map(|i| Some(ListedGpu { name: "G".into(), uuid: format!("GPU-{i}") })).collect()
    }

    #[test]
    fn every_item_once_in_queue_order() {
        let d = deal("item", &gpus(3), (0..50).collect(), |_| Ok(()), |_, i, x: &i32, _| Ok((i, *x * 2)), |_| {});
        assert!(d.lost.is_empty());
        assert_eq!(d.done.len(), 50);
        // A start check per worker and a span per item, each within the deal.
        assert_eq!(d.spans.iter().filter(|s| s.item.is_none()).count(), 3);
        let mut items: Vec<usize> = d.spans.iter().filter_map(|s| s.item).collect();
        items.sort();
        assert_eq!(items, (0..50).collect::<Vec<_>>());
        assert!(d.spans.iter().all(|s| 0.0 <= s.start_s && s.start_s <= s.end_s));
        for (k, (i, (j, y))) in d.done.iter().enumerate() {
            assert_eq!((k, k, 2 * k as i32), (*i, *j, *y));
        }
    }

    #[test]
    fn a_failing_worker_retires_and_nothing_is_dropped() {
        // GPU-1 fails every item it takes; the others finish the queue.
        let d = deal(
            "item",
            &gpus(3),
            (0..20).collect(),
            |_| Ok(()),
            |_, _, x: &i32, g| if g.is_some_and(|g| g.uuid == "GPU-1") { Err("died".into()) } else { Ok(*x) },
            |_| {},
        );
        assert!(d.lost.len() <= 1 && d.lost.iter().all(|l| l.gpu.as_deref() == Some("GPU-1") && l.why == "died"));
        assert_eq!(d.done.len() + d.lost.len(), 20);
    }

    #[test]
    fn with_no_worker_left_every_item_is_lost() {
        let d = deal(
            "item",
            &gpus(2),
            vec!['a', 'b', 'c'],
            |_| Err::<(), _>("no driver".into()),
            |_, _, c: &char, _| Ok(*c),
            |_| {},
        );
        assert!(d.done.is_empty());
        let why = |g: &str| format!("GPU {g} (G): no driver; its worker does not start");
        assert_eq!(d.not_started, [why("GPU-0"), why("GPU-1")]);
        assert_eq!(d.lost.iter().map(|l| l.item).collect::<String>(), "abc");
        assert!(d.lost.iter().all(|l| l.gpu.is_none() && l.why.contains("no worker")));
    }

    #[test]
    fn busy_lines_add_up_each_workers_time() {
        let step = |gpu: &str, what: &str, start_s, end_s, setup_s| Step {
            gpu: Some(gpu.into()),
            what: what.into(),
            start_s,
            end_s,
            setup_s,
        };
        let steps = [
            step("a", START_CHECK, 0.0, 1.0, None),
            step("b", "batch 0", 0.0, 2.0, Some(0.5)),
            step("a", "batch 1", 1.0, 4.0, Some(0.5)),
            step("b", "batch 2", 2.0, 2.5, Some(0.25)),
        ];
        assert_eq!(
            busy_lines(&steps),
            [
                "a: busy 4.0 of 4.0 s, 1 item(s); start check 1.0 s, set-up 0.5 s",
                "b: busy 2.5 of 4.0 s, 2 item(s); start check 0.0 s, set-up 0.8 s",
            ]
        );
    }

    #[test]
    fn without_named_gpus_one_worker_runs_everything() {
        // Its state, made once by its start, is each item's to use.
        let d = deal(
            "item",
            &[None],
            vec![1, 2],
            |g| Ok(Count(if g.is_none() { 0 } else { 100 })),
            |state, _, x: &i32, g| {
                state.0 += 1;
                Ok((*x + state.0, g.is_none()))
            },
            |_| {},
        );
        assert_eq!(d.done.iter().map(|(_, r)| *r).collect::<Vec<_>>(), vec![(2, true), (4, true)]);
    }

    /// A worker state that retires after its third item.
    struct Count(i32);
    impl Worker for Count {
        fn retired(&self) -> Option<&str> {
            (self.0 >= 3).then_some("three is enough")
        }
    }

    #[test]
    fn a_retired_worker_keeps_its_last_result_and_leaves_the_rest_to_others() {
        let count = |state: &mut Count, _: usize, x: &i32, _: Option<&ListedGpu>| {
            state.0 += 1;
            Ok(*x)
        };
        // Alone, it keeps its three results and the rest are reported lost.
        let said = Mutex::new(Vec::new());
        let d = deal(
            "item",
            &gpus(1),
            (0..20).collect(),
            |_| Ok(Count(0)),
            count,
            |w| said.lock().unwrap().push(w.to_string()),
        );
        assert_eq!(d.done.iter().map(|(_, x)| *x).collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(d.lost.len(), 17);
        assert_eq!(said.into_inner().unwrap(), ["three is enough; its worker stops"]);
        // Beside a worker that does not retire, every item is done.
        let d = deal(
            "item",
            &gpus(2),
            (0..20).collect(),
            |g| Ok(Count(if g.is_some_and(|g| g.uuid == "GPU-0") { 0 } else { -1000 })),
            count,
            |_| {},
        );
        assert!(d.lost.is_empty());
        assert_eq!(d.done.iter().map(|(_, x)| *x).collect::<Vec<_>>(), (0..20).collect::<Vec<_>>());
    }
}
