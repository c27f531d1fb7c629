//! Work dealt out to GPUs: one worker thread per GPU pulls items from a shared
//! queue in order until it is empty. A worker whose GPU fails its start check
//! never starts; one whose item fails retires, and that item is reported lost,
//! never dropped; items no worker was left to take are lost too. `test`,
//! `tune` and `profile` use it for `--gpus`.

use std::collections::VecDeque;
use std::sync::Mutex;

use crate::tools::gpu::ListedGpu;

/// An item no worker finished: its place in the queue, the item, the GPU it was
/// on (none if no worker took it) and why.
pub struct Lost<T> {
    pub index: usize,
    pub item: T,
    pub gpu: Option<String>,
    pub why: String,
}

/// What the workers did: results by queue place (sorted), and the lost items.
pub struct Dealt<T, R> {
    pub done: Vec<(usize, R)>,
    pub lost: Vec<Lost<T>>,
}

/// Runs `work(index, item, gpu)` for every item on the workers of `gpus` (`None`:
/// the device CUDA picks). `start(gpu)` runs first on each named GPU (its
/// preflight); `say` hears about workers that stop, an item being a `noun`.
pub fn deal<T: Send, R: Send>(
    noun: &str,
    gpus: &[Option<ListedGpu>],
    items: Vec<T>,
    start: impl Fn(&ListedGpu) -> Result<(), String> + Sync,
    work: impl Fn(usize, &T, Option<&ListedGpu>) -> Result<R, String> + Sync,
    say: impl Fn(&str) + Sync,
) -> Dealt<T, R> {
    let queue = Mutex::new(items.into_iter().enumerate().collect::<VecDeque<_>>());
    let done = Mutex::new(Vec::new());
    let lost = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for gpu in gpus {
            let (queue, done, lost, start, work, say) = (&queue, &done, &lost, &start, &work, &say);
            s.spawn(move || {
                if let Some(g) = gpu
                    && let Err(why) = start(g)
                {
                    say(&format!("GPU {} ({}): {why}; its worker does not start", g.uuid, g.name));
                    return;
                }
                loop {
                    let Some((index, item)) = queue.lock().unwrap_or_else(|e| e.into_inner()).pop_front() else {
                        break;
                    };
                    match work(index, &item, gpu.as_ref()) {
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
    Dealt { done, lost }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpus(n: usize) -> Vec<Option<ListedGpu>> {
        (0..n).map(|i| Some(ListedGpu { name: "G".into(), uuid: format!("GPU-{i}") })).collect()
    }

    #[test]
    fn every_item_once_in_queue_order() {
        let d = deal("item", &gpus(3), (0..50).collect(), |_| Ok(()), |i, x: &i32, _| Ok((i, *x * 2)), |_| {});
        assert!(d.lost.is_empty());
        assert_eq!(d.done.len(), 50);
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
            |_, x: &i32, g| if g.is_some_and(|g| g.uuid == "GPU-1") { Err("died".into()) } else { Ok(*x) },
            |_| {},
        );
        assert!(d.lost.len() <= 1 && d.lost.iter().all(|l| l.gpu.as_deref() == Some("GPU-1") && l.why == "died"));
        assert_eq!(d.done.len() + d.lost.len(), 20);
    }

    #[test]
    fn with_no_worker_left_every_item_is_lost() {
        let d =
            deal("item", &gpus(2), vec!['a', 'b', 'c'], |_| Err("no driver".into()), |_, c: &char, _| Ok(*c), |_| {});
        assert!(d.done.is_empty());
        assert_eq!(d.lost.iter().map(|l| l.item).collect::<String>(), "abc");
        assert!(d.lost.iter().all(|l| l.gpu.is_none() && l.why.contains("no worker")));
    }

    #[test]
    fn without_named_gpus_one_worker_runs_everything() {
        let d = deal(
            "item",
            &[None],
            vec![1, 2],
            |_| Err("not called".into()),
            |_, x: &i32, g| Ok((*x, g.is_none())),
            |_| {},
        );
        assert_eq!(d.done.iter().map(|(_, r)| *r).collect::<Vec<_>>(), vec![(1, true), (2, true)]);
    }
}
