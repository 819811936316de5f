//! A bounded log of which pods changed, so that a periodic pass can visit only those (issue 15:
//! O(changed) batches) instead of every pod. A reader keeps a cursor; when it fell behind the
//! log's window, it is told to look at everything once.
//!
//! Invariant: [`ChangeLog::since`] never answers with fewer pods than changed after the cursor;
//! when it cannot know, it answers [`PodChanges::All`].

use std::collections::VecDeque;

use crate::PodUid;

/// What changed since a cursor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodChanges {
    /// These pods (possibly repeated) changed; `cursor` is where the next read starts.
    Since {
        /// The next read's cursor.
        cursor: u64,
        /// The pods that changed, oldest first.
        uids: Vec<PodUid>,
    },
    /// Unknown (the cursor is older than the log, or the source keeps no log): every pod may
    /// have changed. `cursor` is where the next read starts.
    All {
        /// The next read's cursor.
        cursor: u64,
    },
}

impl PodChanges {
    /// Where the next read starts.
    pub fn cursor(&self) -> u64 {
        match self {
            Self::Since { cursor, .. } | Self::All { cursor } => *cursor,
        }
    }
}

/// The log: the last `capacity` changes, numbered from 1.
#[derive(Clone, Debug)]
pub struct ChangeLog {
    /// Sequence number of `entries[0]`.
    first: u64,
    entries: VecDeque<PodUid>,
    capacity: usize,
}

impl Default for ChangeLog {
    fn default() -> Self {
        Self::new(Self::DEFAULT_CAPACITY)
    }
}

impl ChangeLog {
    /// Enough for a rollout of thousands of pods between two 10 s batches; ~40 bytes each.
    pub const DEFAULT_CAPACITY: usize = 16_384;

    /// An empty log keeping the last `capacity` changes (at least one).
    pub fn new(capacity: usize) -> Self {
        Self {
            first: 1,
            entries: VecDeque::new(),
            capacity: capacity.max(1),
        }
    }

    /// Records that `uid` changed.
    pub fn record(&mut self, uid: PodUid) {
        if self.entries.len() == self.capacity {
            self.entries.pop_front();
            self.first += 1;
        }
        self.entries.push_back(uid);
    }

    /// Anything may have changed (a relist replaced every pod): every reader is told
    /// [`PodChanges::All`] once.
    pub fn reset(&mut self) {
        self.first = self.cursor() + 1;
        self.entries.clear();
    }

    /// The cursor after the last change (a reader starting now passes this).
    pub fn cursor(&self) -> u64 {
        self.first + self.entries.len() as u64
    }

    /// The changes after `cursor` (a cursor from [`Self::cursor`] or a previous answer; 0 for
    /// a reader that has seen nothing).
    pub fn since(&self, cursor: u64) -> PodChanges {
        let end = self.cursor();
        if cursor < self.first || cursor > end {
            return PodChanges::All { cursor: end };
        }
        let skip = usize::try_from(cursor - self.first).unwrap_or(usize::MAX);
        PodChanges::Since {
            cursor: end,
            uids: self.entries.iter().skip(skip).cloned().collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uid(s: &str) -> PodUid {
        PodUid::new(s)
    }

    #[test]
    fn a_reader_sees_each_change_after_its_cursor_once() {
        let mut log = ChangeLog::new(8);
        let start = log.cursor();
        log.record(uid("a"));
        log.record(uid("b"));
        let PodChanges::Since { cursor, uids } = log.since(start) else {
            panic!("within the window");
        };
        assert_eq!(uids, vec![uid("a"), uid("b")]);
        log.record(uid("c"));
        assert_eq!(
            log.since(cursor),
            PodChanges::Since {
                cursor: cursor + 1,
                uids: vec![uid("c")]
            }
        );
        assert_eq!(
            log.since(log.cursor()),
            PodChanges::Since {
                cursor: log.cursor(),
                uids: vec![]
            }
        );
    }

    #[test]
    fn a_reader_behind_the_window_is_told_everything_changed() {
        let mut log = ChangeLog::new(2);
        let start = log.cursor();
        for s in ["a", "b", "c"] {
            log.record(uid(s));
        }
        assert_eq!(
            log.since(start),
            PodChanges::All {
                cursor: log.cursor()
            }
        );
        // A reader that has seen nothing (cursor 0) and a cursor from the future: everything.
        assert!(matches!(log.since(0), PodChanges::All { .. }));
        assert!(matches!(log.since(99), PodChanges::All { .. }));
        // After a reset, every reader is told everything once, then changes again.
        let mut log = ChangeLog::new(4);
        log.record(uid("a"));
        let before = log.cursor();
        log.reset();
        let PodChanges::All { cursor } = log.since(before) else {
            panic!("a reset tells everything");
        };
        log.record(uid("b"));
        assert_eq!(
            log.since(cursor),
            PodChanges::Since {
                cursor: cursor + 1,
                uids: vec![uid("b")]
            }
        );
        let mut log = ChangeLog::new(2);
        for s in ["a", "b", "c"] {
            log.record(uid(s));
        }
        // The last two are still there.
        assert_eq!(
            log.since(log.cursor() - 2),
            PodChanges::Since {
                cursor: log.cursor(),
                uids: vec![uid("b"), uid("c")]
            }
        );
    }
}
