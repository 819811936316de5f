//! Property: whatever the store goes through, and however far a watcher falls behind, the view
//! built from the `watcher::Event` stream equals the store's list once the stream is drained.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::Event;
use proptest::prelude::*;
use serde_json::json;

use super::super::store::{DeleteOptions, FieldSelector, Kind, ObjectRef, Selection, Store};
use super::events;

#[derive(Clone, Debug)]
enum Op {
    /// Create or replace pod `name` on `node` with label `value`.
    Put { name: u8, node: bool, value: u8 },
    /// Delete pod `name` at once.
    Delete { name: u8 },
    /// Write `n` unrelated objects (pushes history past a slow watcher).
    Noise { n: u16 },
    /// Let the watcher read everything so far.
    Drain,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..5, any::<bool>(), 0u8..4).prop_map(|(name, node, value)| Op::Put { name, node, value }),
        2 => (0u8..5).prop_map(|name| Op::Delete { name }),
        1 => (1u16..1500).prop_map(|n| Op::Noise { n }),
        2 => Just(Op::Drain),
    ]
}

type View = BTreeMap<String, String>;

fn key(pod: &Pod) -> (String, String) {
    let label = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("v").cloned())
        .unwrap_or_default();
    (pod.metadata.name.clone().unwrap_or_default(), label)
}

/// Read every event that is ready, applying it to `view` as a reflector does.
fn drain(
    stream: &mut (impl futures::Stream<Item = super::WatchItem<Pod>> + Unpin),
    view: &mut View,
    relist: &mut Option<View>,
) {
    while let Some(Some(item)) = stream.next().now_or_never() {
        match item {
            Ok(Event::Init) => *relist = Some(View::new()),
            Ok(Event::InitApply(pod)) => {
                let (name, label) = key(&pod);
                relist
                    .as_mut()
                    .expect("InitApply inside a list")
                    .insert(name, label);
            }
            Ok(Event::InitDone) => *view = relist.take().expect("InitDone after Init"),
            Ok(Event::Apply(pod)) => {
                let (name, label) = key(&pod);
                view.insert(name, label);
            }
            Ok(Event::Delete(pod)) => {
                view.remove(&key(&pod).0);
            }
            // Fell behind: the stream lists again next.
            Err(_) => {}
        }
    }
}

fn listed(store: &Store, selection: &Selection) -> View {
    store
        .list(selection)
        .0
        .into_iter()
        .map(|o| serde_json::from_value::<Pod>(o).unwrap())
        .map(|p| key(&p))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn a_drained_watch_equals_the_list(ops in proptest::collection::vec(op(), 1..40)) {
        let store = Arc::new(Store::default());
        let selection = Selection {
            kind: Kind::Pod,
            namespace: None,
            fields: FieldSelector::parse("spec.nodeName=node-a").unwrap(),
        };
        let mut stream = Box::pin(events::<Pod>(store.clone(), selection.clone()));
        let (mut view, mut relist) = (View::new(), None);
        let mut noise = 0u32;
        for op in ops {
            match op {
                Op::Put { name, node, value } => {
                    let pod = json!({"apiVersion":"v1","kind":"Pod",
                        "metadata":{"name":format!("p{name}"),"namespace":"ns",
                            "labels":{"v":value.to_string()}},
                        "spec":{"nodeName": if node { "node-a" } else { "node-b" },
                            "containers":[{"name":"c","image":"busybox"}]}});
                    if store.update(pod.clone()).is_err() {
                        store.create(pod).unwrap();
                    }
                }
                Op::Delete { name } => {
                    let zero = DeleteOptions { grace_period_seconds: Some(0), ..Default::default() };
                    let _ = store.delete(&ObjectRef::new(Kind::Pod, "ns", &format!("p{name}")), &zero);
                }
                Op::Noise { n } => {
                    for _ in 0..n {
                        noise += 1;
                        store.create(json!({"apiVersion":"v1","kind":"ConfigMap",
                            "metadata":{"name":format!("n{noise}"),"namespace":"ns"}})).unwrap();
                    }
                }
                Op::Drain => drain(&mut stream, &mut view, &mut relist),
            }
        }
        drain(&mut stream, &mut view, &mut relist);
        prop_assert_eq!(view, listed(&store, &selection));
    }
}
