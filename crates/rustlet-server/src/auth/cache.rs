//! A bounded map whose entries expire, on tokio's clock (paused in tests): the token and
//! access-review caches. Upstream: `apimachinery/pkg/util/cache.LRUExpireCache` and the token
//! authenticator's striped cache; here one mutex, expired entries dropped on insert, and when
//! full the entry closest to expiry goes first.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// The entries a cache keeps at most (upstream's authorizer cache: 8,192 entries).
pub const DEFAULT_CAPACITY: usize = 8192;

/// See the module documentation.
#[derive(Debug)]
pub struct ExpiringCache<K, V> {
    entries: Mutex<HashMap<K, (V, Instant)>>,
    capacity: usize,
}

impl<K: Hash + Eq + Clone, V: Clone> ExpiringCache<K, V> {
    /// An empty cache of at most `capacity` entries.
    pub fn new(capacity: usize) -> Self {
        Self {
            entries: Mutex::new(HashMap::new()),
            capacity: capacity.max(1),
        }
    }

    /// The value of `key` if it has not expired.
    pub fn get(&self, key: &K) -> Option<V> {
        let now = Instant::now();
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        match entries.get(key) {
            Some((value, expires)) if *expires > now => Some(value.clone()),
            Some(_) => {
                entries.remove(key);
                None
            }
            None => None,
        }
    }

    /// Keeps `value` for `ttl` (a zero TTL keeps nothing, as upstream's disabled caches).
    pub fn insert(&self, key: K, value: V, ttl: Duration) {
        if ttl.is_zero() {
            return;
        }
        let now = Instant::now();
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if entries.len() >= self.capacity && !entries.contains_key(&key) {
            entries.retain(|_, (_, expires)| *expires > now);
            if entries.len() >= self.capacity {
                let soonest = entries
                    .iter()
                    .min_by_key(|(_, (_, expires))| *expires)
                    .map(|(k, _)| k.clone());
                if let Some(soonest) = soonest {
                    entries.remove(&soonest);
                }
            }
        }
        entries.insert(key, (value, now + ttl));
    }

    /// How many entries it holds (expired ones included until they are dropped).
    pub fn len(&self) -> usize {
        self.entries.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn an_entry_expires_after_its_ttl() {
        let cache = ExpiringCache::new(4);
        cache.insert("a", 1, Duration::from_secs(30));
        tokio::time::advance(Duration::from_secs(29)).await;
        assert_eq!(cache.get(&"a"), Some(1));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(cache.get(&"a"), None);
        cache.insert("b", 2, Duration::ZERO);
        assert_eq!(cache.get(&"b"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_cache_drops_the_entry_closest_to_expiry() {
        let cache = ExpiringCache::new(2);
        cache.insert("long", 1, Duration::from_secs(300));
        cache.insert("short", 2, Duration::from_secs(30));
        cache.insert("new", 3, Duration::from_secs(60));
        assert_eq!(cache.len(), 2);
        assert_eq!(cache.get(&"short"), None);
        assert_eq!(cache.get(&"long"), Some(1));
        assert_eq!(cache.get(&"new"), Some(3));
    }
}
