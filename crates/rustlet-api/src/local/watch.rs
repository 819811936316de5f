//! The local store's list and watch as a kube-runtime `watcher::Event` stream, so the caches
//! and sources that consume a cluster watch consume the store unchanged.

use std::collections::VecDeque;
use std::sync::Arc;

use futures::Stream;
use kube::runtime::watcher::Event;
use serde::de::DeserializeOwned;

use super::store::{EventType, Selection, Store, StoredObject, Watch};
use crate::backend::{WatchError, WatchItem};

struct State<K> {
    store: Arc<Store>,
    selection: Selection,
    watch: Option<Watch>,
    queue: VecDeque<WatchItem<K>>,
}

impl<K: DeserializeOwned> State<K> {
    fn decode(&self, object: &StoredObject) -> Result<K, WatchError> {
        object.decode().map_err(|e| WatchError::Decode {
            kind: self.selection.kind,
            message: e.to_string(),
        })
    }

    /// List, queue `Init`, one `InitApply` per object and `InitDone`, and watch from the
    /// list's resourceVersion.
    fn relist(&mut self) -> Result<(), WatchError> {
        let (items, resource_version) = self.store.list_shared(&self.selection);
        self.watch = Some(self.store.watch(self.selection.clone(), resource_version)?);
        self.queue.push_back(Ok(Event::Init));
        for item in &items {
            let decoded = self.decode(item).map(Event::InitApply);
            self.queue.push_back(decoded);
        }
        self.queue.push_back(Ok(Event::InitDone));
        Ok(())
    }
}

/// Every object `selection` matches, then every change, forever; a watch that falls behind
/// (the store's history moved past it) yields the error and lists again.
pub fn events<K: DeserializeOwned + Send + 'static>(
    store: Arc<Store>,
    selection: Selection,
) -> impl Stream<Item = WatchItem<K>> + Send {
    let state = State {
        store,
        selection,
        watch: None,
        queue: VecDeque::new(),
    };
    futures::stream::unfold(state, |mut state| async move {
        loop {
            if let Some(item) = state.queue.pop_front() {
                return Some((item, state));
            }
            let Some(watch) = state.watch.as_mut() else {
                if let Err(err) = state.relist() {
                    return Some((Err(err), state));
                }
                continue;
            };
            let item = match watch.next().await {
                Ok(event) => state.decode(&event.object).map(|object| match event.type_ {
                    EventType::Added | EventType::Modified => Event::Apply(object),
                    EventType::Deleted => Event::Delete(object),
                }),
                Err(err) => {
                    state.watch = None;
                    Err(err.into())
                }
            };
            return Some((item, state));
        }
    })
}

#[cfg(test)]
mod tests;
