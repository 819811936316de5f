//! `SmallMap`: an ordered map over a sorted `Vec`, for the caches' per-volume pod maps and
//! per-pod volume indexes. Nearly all of them hold one or two entries (a pod's own emptyDir,
//! a pod's few volumes), where a `BTreeMap` allocates a whole node of eleven slots: at 1,000
//! pods of two volumes the desired and actual states' one-entry maps held ~5 MB (heaptrack,
//! issue 29). The same order and the same answers as a `BTreeMap`; an insert or a removal
//! moves the entries after it, which for a volume shared by thousands of pods (a ConfigMap)
//! costs a `memmove` of a few hundred KB, not a lookup's worth.

use std::borrow::Borrow;

/// An ordered map in a sorted `Vec` (see the module doc).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct SmallMap<K, V> {
    entries: Vec<(K, V)>,
}

impl<K, V> Default for SmallMap<K, V> {
    fn default() -> Self {
        Self {
            entries: Vec::new(),
        }
    }
}

impl<K: Ord, V> SmallMap<K, V> {
    /// An empty map (no allocation).
    pub(crate) fn new() -> Self {
        Self::default()
    }

    fn find<Q: Ord + ?Sized>(&self, key: &Q) -> Result<usize, usize>
    where
        K: Borrow<Q>,
    {
        self.entries.binary_search_by(|(k, _)| k.borrow().cmp(key))
    }

    pub(crate) fn get<Q: Ord + ?Sized>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
    {
        self.find(key).ok().map(|i| &self.entries[i].1)
    }

    pub(crate) fn get_mut<Q: Ord + ?Sized>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
    {
        self.find(key).ok().map(|i| &mut self.entries[i].1)
    }

    pub(crate) fn contains_key<Q: Ord + ?Sized>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
    {
        self.find(key).is_ok()
    }

    /// Inserts or replaces; the old value, if any.
    pub(crate) fn insert(&mut self, key: K, value: V) -> Option<V> {
        match self.find(&key) {
            Ok(i) => Some(std::mem::replace(&mut self.entries[i].1, value)),
            Err(i) => {
                // Room for exactly one more while small (a `Vec` would make room for four),
                // doubling past that.
                if self.entries.len() < 4 {
                    self.entries.reserve_exact(1);
                }
                self.entries.insert(i, (key, value));
                None
            }
        }
    }

    pub(crate) fn remove<Q: Ord + ?Sized>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
    {
        let i = self.find(key).ok()?;
        let (_, value) = self.entries.remove(i);
        if self.entries.is_empty() {
            self.entries = Vec::new();
        }
        Some(value)
    }

    /// Keeps the entries `keep` says to keep.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&K, &mut V) -> bool) {
        self.entries.retain_mut(|(k, v)| keep(k, v));
        if self.entries.is_empty() {
            self.entries = Vec::new();
        }
    }
}

impl<K, V> SmallMap<K, V> {
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entries in key order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.entries.iter().map(|(k, v)| (k, v))
    }

    pub(crate) fn values(&self) -> impl Iterator<Item = &V> {
        self.entries.iter().map(|(_, v)| v)
    }
}

impl<'a, K, V> IntoIterator for &'a SmallMap<K, V> {
    type Item = (&'a K, &'a V);
    type IntoIter = std::iter::Map<std::slice::Iter<'a, (K, V)>, fn(&'a (K, V)) -> (&'a K, &'a V)>;

    fn into_iter(self) -> Self::IntoIter {
        self.entries.iter().map(|(k, v)| (k, v))
    }
}

#[cfg(test)]
mod tests {
    use super::SmallMap;
    use std::collections::BTreeMap;

    /// The same answers as a `BTreeMap` over a sequence of inserts, replacements and removals.
    #[test]
    fn small_map_answers_as_a_btree_map() {
        let mut small = SmallMap::new();
        let mut btree = BTreeMap::new();
        let ops: [(u8, u32); 12] = [
            (0, 5),
            (0, 1),
            (0, 9),
            (0, 5),
            (1, 1),
            (0, 3),
            (1, 7),
            (0, 7),
            (1, 5),
            (0, 2),
            (1, 9),
            (1, 3),
        ];
        for (n, (op, key)) in ops.into_iter().enumerate() {
            if op == 0 {
                assert_eq!(small.insert(key, n), btree.insert(key, n));
            } else {
                assert_eq!(small.remove(&key), btree.remove(&key));
            }
            assert_eq!(
                small.iter().collect::<Vec<_>>(),
                btree.iter().collect::<Vec<_>>()
            );
            assert_eq!(small.len(), btree.len());
            for k in 0..10 {
                assert_eq!(small.get(&k), btree.get(&k));
                assert_eq!(small.contains_key(&k), btree.contains_key(&k));
            }
        }
        small.retain(|k, _| *k != 2);
        btree.retain(|k, _| *k != 2);
        assert_eq!(
            small.iter().collect::<Vec<_>>(),
            btree.iter().collect::<Vec<_>>()
        );
        *small.get_mut(&7).unwrap() += 1;
        *btree.get_mut(&7).unwrap() += 1;
        assert_eq!(
            small.values().collect::<Vec<_>>(),
            btree.values().collect::<Vec<_>>()
        );
    }

    /// One entry costs one entry's room, not a B-tree node's eleven.
    #[test]
    fn one_entry_holds_room_for_one() {
        let mut small = SmallMap::new();
        small.insert(String::from("pod"), [0u8; 100]);
        assert_eq!(small.entries.capacity(), 1);
        small.remove("pod");
        assert_eq!(small.entries.capacity(), 0);
    }
}
