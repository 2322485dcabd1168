//! A bounded queue the collector keeps its records in, readable without copying them.
//! Records are appended to an open chunk; a full chunk is frozen behind an `Arc`, so a
//! snapshot shares the frozen chunks and copies only the open one's few records. The
//! agent builds timelines from snapshots every few seconds: copying every kept record
//! each time (tens of thousands of kernel events with their strings) briefly doubled
//! what the collector holds, and the freed copies left the heap fragmented.

use std::collections::VecDeque;
use std::sync::Arc;

/// Records per frozen chunk: a kernel event chunk is 32 KiB, small enough for the heap
/// and few enough that a snapshot's share of them is cheap.
const CHUNK: usize = 256;

/// Keeps the last `cap` items pushed, oldest dropped first.
#[derive(Debug)]
pub(super) struct Chunks<T> {
    frozen: VecDeque<Arc<Vec<T>>>,
    /// Items of the first frozen chunk that were dropped: its memory goes when all are.
    skip: usize,
    open: Vec<T>,
    len: usize,
    cap: usize,
    /// Items dropped from the front so far: a snapshot's position `i` is at `i - (popped
    /// now - popped then)` later.
    popped: u64,
}

/// The items of a [`Chunks`] at one moment, in order.
#[derive(Debug)]
pub(super) struct Snapshot<T> {
    frozen: Vec<Arc<Vec<T>>>,
    skip: usize,
    open: Vec<T>,
}

impl<T: Clone> Chunks<T> {
    pub fn new(cap: usize) -> Chunks<T> {
        Chunks {
            frozen: VecDeque::new(),
            skip: 0,
            open: Vec::new(),
            len: 0,
            cap,
            popped: 0,
        }
    }

    /// Items dropped from the front since the queue was made (see [`Chunks::retain`]).
    pub fn popped(&self) -> u64 {
        self.popped
    }

    /// Keeps only the items `keep` accepts, given each item's position, chunk by chunk:
    /// a chunk no snapshot shares is filtered in place and freed before the next is
    /// looked at, so forgetting never holds two copies of what is kept. Chunks left
    /// small are merged into the one before. `popped` is unchanged.
    pub fn retain(&mut self, mut keep: impl FnMut(usize, &T) -> bool) {
        let mut pos = 0;
        let mut test = |item: &T| {
            let k = keep(pos, item);
            pos += 1;
            k
        };
        let skip = std::mem::take(&mut self.skip);
        let mut rebuilt: VecDeque<Arc<Vec<T>>> = VecDeque::new();
        for (n, chunk) in std::mem::take(&mut self.frozen).into_iter().enumerate() {
            let from = if n == 0 { skip } else { 0 };
            let kept: Vec<T> = match Arc::try_unwrap(chunk) {
                Ok(mut items) => {
                    items.drain(..from);
                    items.retain(&mut test);
                    items
                }
                Err(shared) => shared[from..].iter().filter(|i| test(i)).cloned().collect(),
            };
            if kept.is_empty() {
                continue;
            }
            match rebuilt.back_mut().and_then(Arc::get_mut) {
                Some(last) if last.len() + kept.len() <= CHUNK => last.extend(kept),
                _ => rebuilt.push_back(Arc::new(kept)),
            }
        }
        for chunk in rebuilt.iter_mut() {
            if let Some(items) = Arc::get_mut(chunk) {
                items.shrink_to_fit();
            }
        }
        self.open.retain(&mut test);
        self.len = rebuilt.iter().map(|c| c.len()).sum::<usize>() + self.open.len();
        self.frozen = rebuilt;
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn push(&mut self, item: T) {
        if self.len >= self.cap {
            self.pop_front();
        }
        // Doubling from empty reaches CHUNK exactly: a full chunk has no spare capacity.
        self.open.push(item);
        self.len += 1;
        if self.open.len() == CHUNK {
            self.frozen
                .push_back(Arc::new(std::mem::take(&mut self.open)));
        }
    }

    fn pop_front(&mut self) {
        self.popped += 1;
        let Some(first) = self.frozen.front() else {
            if !self.open.is_empty() {
                self.open.remove(0);
                self.len -= 1;
            } else {
                self.popped -= 1;
            }
            return;
        };
        self.skip += 1;
        self.len -= 1;
        if self.skip == first.len() {
            self.frozen.pop_front();
            self.skip = 0;
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = &T> {
        chain(&self.frozen, self.skip, &self.open)
    }

    pub fn snapshot(&self) -> Snapshot<T> {
        Snapshot {
            frozen: self.frozen.iter().cloned().collect(),
            skip: self.skip,
            open: self.open.clone(),
        }
    }
}

impl<T> Snapshot<T> {
    pub fn len(&self) -> usize {
        self.frozen.iter().map(|c| c.len()).sum::<usize>() - self.skip + self.open.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = &T> {
        chain(&self.frozen, self.skip, &self.open)
    }
}

fn chain<'a, T>(
    frozen: impl IntoIterator<Item = &'a Arc<Vec<T>>>,
    skip: usize,
    open: &'a [T],
) -> impl Iterator<Item = &'a T> {
    frozen
        .into_iter()
        .flat_map(|c| c.iter())
        .skip(skip)
        .chain(open)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn items(c: &Chunks<usize>) -> Vec<usize> {
        c.iter().copied().collect()
    }

    #[test]
    fn keeps_the_last_cap_items_in_order() {
        let mut c = Chunks::new(CHUNK * 2 + 10);
        for i in 0..CHUNK * 5 + 3 {
            c.push(i);
        }
        let want: Vec<usize> = (CHUNK * 3 - 7..CHUNK * 5 + 3).collect();
        assert_eq!(items(&c), want);
        assert_eq!(c.len(), want.len());
        let snap = c.snapshot();
        c.push(usize::MAX);
        assert_eq!(snap.iter().copied().collect::<Vec<_>>(), want);
        // A frozen chunk goes once every item in it was dropped.
        assert!(c.frozen.len() <= 3);
    }

    #[test]
    fn a_cap_below_one_chunk_drops_from_the_open_chunk() {
        let mut c = Chunks::new(3);
        for i in 0..10 {
            c.push(i);
        }
        assert_eq!(items(&c), [7, 8, 9]);
    }

    #[test]
    fn retain_keeps_the_order_and_counts_what_was_dropped_at_the_front() {
        let mut c = Chunks::new(CHUNK * 2);
        for i in 0..CHUNK * 3 {
            c.push(i);
        }
        assert_eq!(c.popped(), CHUNK as u64);
        let snap = c.snapshot();
        c.retain(|pos, item| {
            assert_eq!(*item, pos + CHUNK);
            item % 3 == 0
        });
        let want: Vec<usize> = (CHUNK..CHUNK * 3).filter(|i| i % 3 == 0).collect();
        assert_eq!(items(&c), want);
        assert_eq!(c.len(), want.len());
        assert_eq!(c.popped(), CHUNK as u64);
        // A snapshot taken before still reads what it read.
        assert_eq!(snap.iter().count(), CHUNK * 2);
        c.push(usize::MAX);
        assert_eq!(items(&c).last(), Some(&usize::MAX));
    }

    #[test]
    fn retain_filters_unshared_chunks_in_place_and_merges_what_is_left() {
        let mut c = Chunks::new(usize::MAX);
        for i in 0..CHUNK * 8 + 5 {
            c.push(i);
        }
        c.retain(|_, item| item % 16 == 0 || *item >= CHUNK * 8);
        let want: Vec<usize> = (0..CHUNK * 8 + 5)
            .filter(|i| i % 16 == 0 || *i >= CHUNK * 8)
            .collect();
        assert_eq!(items(&c), want);
        assert_eq!(c.len(), want.len());
        // Eight chunks of 16 left each fit in one.
        assert_eq!(c.frozen.len(), 1);
        assert_eq!(c.frozen[0].capacity(), c.frozen[0].len());
    }

    #[test]
    fn frozen_chunks_are_shared_not_copied() {
        let mut c = Chunks::new(usize::MAX);
        for i in 0..CHUNK + 1 {
            c.push(i);
        }
        let snap = c.snapshot();
        assert!(Arc::ptr_eq(&snap.frozen[0], &c.frozen[0]));
        assert_eq!(snap.open, [CHUNK]);
    }
}
