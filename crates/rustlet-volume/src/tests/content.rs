//! configMap and secret volumes through the manager (V92-V95): registration before the mount,
//! contents and modes, items, optional objects, secrets only on tmpfs, an object change written
//! at once (not after the remount period), teardown and reconstruction.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapVolumeSource, KeyToPath, Secret, SecretVolumeSource, Volume,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use rustlet_core::PodUid;
use rustlet_mount::fake::FakeMounter;
use tokio_util::sync::CancellationToken;

use crate::manager::{VolumeManager, VolumeManagerConfig, VolumeManagerDeps, WaitCause, WaitError};
use crate::mounter::Mounter;
use crate::plugins::builtin_plugins;
use crate::testing::{FakePods, FakeRecorder, FakeVolumeObjects, pod_with_volumes};

struct Agent {
    manager: Arc<VolumeManager>,
    events: Arc<FakeRecorder>,
    pods: Arc<FakePods>,
    objects: Arc<FakeVolumeObjects>,
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

fn start(root: &Path, mounter: Arc<dyn Mounter>) -> Agent {
    start_with(root, mounter, Setup::default())
}

/// What a test changes in the manager it starts.
#[derive(Default)]
struct Setup {
    /// Plugins beside the built-in and content ones.
    extra_plugin: Option<Arc<dyn crate::plugin::VolumePlugin>>,
    node_status: Option<Arc<dyn crate::node::NodeStatus>>,
    node: crate::claims::NodeIdentity,
    wait_timeout: Option<Duration>,
}

fn start_with(root: &Path, mounter: Arc<dyn Mounter>, setup: Setup) -> Agent {
    let pods = Arc::new(FakePods::default());
    let objects = Arc::new(FakeVolumeObjects::default());
    let events = Arc::new(FakeRecorder::default());
    let mut plugins = builtin_plugins();
    if let Some(plugin) = setup.extra_plugin {
        plugins.register(plugin);
    }
    let deps = VolumeManagerDeps {
        pods: pods.clone(),
        states: pods.clone(),
        mounter,
        plugins,
        events: events.clone(),
        node: setup
            .node_status
            .unwrap_or_else(|| Arc::new(crate::node::NothingAttached)),
        objects: Some(objects.clone()),
    };
    let config = VolumeManagerConfig {
        wait_timeout: setup.wait_timeout.unwrap_or(Duration::from_secs(10)),
        node_allocatable_memory: Some(64 << 20),
        node: setup.node,
        ..VolumeManagerConfig::new(root)
    };
    let manager = Arc::new(VolumeManager::new(deps, config));
    let cancel = CancellationToken::new();
    let task = tokio::spawn(manager.clone().run(cancel.clone()));
    Agent {
        manager,
        events,
        pods,
        objects,
        cancel,
        task,
    }
}

fn config_map(name: &str, data: &[(&str, &str)]) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ns".into()),
            ..Default::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        ),
        ..Default::default()
    }
}

fn secret(name: &str, data: &[(&str, &str)]) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ns".into()),
            ..Default::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| ((*k).to_owned(), ByteString(v.as_bytes().to_vec())))
                .collect(),
        ),
        ..Default::default()
    }
}

fn cm_volume(name: &str, source: ConfigMapVolumeSource) -> Volume {
    Volume {
        name: name.into(),
        config_map: Some(source),
        ..Default::default()
    }
}

fn read(root: &Path, uid: &str, plugin: &str, volume: &str, key: &str) -> (String, u32) {
    let path = root.join(format!("pods/{uid}/volumes/{plugin}/{volume}/{key}"));
    let data = std::fs::read_to_string(&path).unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    (data, mode)
}

#[tokio::test(start_paused = true)]
async fn config_map_and_secret_contents_modes_and_items() {
    let root = tempfile::tempdir().unwrap();
    let fake = FakeMounter::new();
    let agent = start(root.path(), Arc::new(fake.clone()));
    agent.objects.put_config_map(config_map(
        "app",
        &[("a.conf", "alpha"), ("b.conf", "beta")],
    ));
    agent
        .objects
        .put_secret(secret("creds", &[("user", "admin"), ("token", "t0k")]));
    let pod = pod_with_volumes(
        "p1",
        vec![
            cm_volume(
                "config",
                ConfigMapVolumeSource {
                    name: "app".into(),
                    default_mode: Some(0o640),
                    ..Default::default()
                },
            ),
            cm_volume(
                "picked",
                ConfigMapVolumeSource {
                    name: "app".into(),
                    default_mode: Some(0o644),
                    items: Some(vec![KeyToPath {
                        key: "b.conf".into(),
                        path: "dir/b".into(),
                        mode: Some(0o400),
                        ..Default::default()
                    }]),
                    ..Default::default()
                },
            ),
            Volume {
                name: "creds".into(),
                secret: Some(SecretVolumeSource {
                    secret_name: Some("creds".into()),
                    default_mode: Some(0o600),
                    ..Default::default()
                }),
                ..Default::default()
            },
        ],
    );
    let mut with_namespace = (*pod).clone();
    with_namespace.metadata.namespace = Some("ns".into());
    let pod = Arc::new(with_namespace);
    agent.pods.add(pod.clone());
    agent.manager.pod_updated();
    agent.manager.wait_for_attach_and_mount(&pod).await.unwrap();
    assert!(
        agent.objects.is_registered(&PodUid::new("p1")),
        "registered first"
    );
    let r = root.path();
    assert_eq!(
        read(r, "p1", "kubernetes.io~configmap", "config", "a.conf"),
        ("alpha".into(), 0o640)
    );
    assert_eq!(
        read(r, "p1", "kubernetes.io~configmap", "picked", "dir/b"),
        ("beta".into(), 0o400)
    );
    assert!(
        !r.join("pods/p1/volumes/kubernetes.io~configmap/picked/a.conf")
            .exists()
    );
    assert_eq!(
        read(r, "p1", "kubernetes.io~secret", "creds", "token"),
        ("t0k".into(), 0o600)
    );
    let secret_dir = r.join("pods/p1/volumes/kubernetes.io~secret/creds");
    assert!(
        fake.is_tmpfs_mount_point(&secret_dir).unwrap(),
        "secrets on tmpfs"
    );
    let config_dir = r.join("pods/p1/volumes/kubernetes.io~configmap/config");
    assert!(
        !fake.is_tmpfs_mount_point(&config_dir).unwrap_or(false),
        "configMaps on disk"
    );
    // Containers mount content volumes read-only whatever their volumeMounts say.
    let container = &pod.spec.as_ref().unwrap().containers[0];
    let mounts = agent
        .manager
        .container_mounts(&pod, container, false)
        .await
        .unwrap();
    assert_eq!(mounts.len(), 3);
    assert!(mounts.iter().all(|m| m.read_only), "{mounts:?}");
    assert_eq!(mounts[0].host_path, config_dir);

    // A change reaches the volume at once, long before the remount period.
    agent.objects.put_config_map(config_map(
        "app",
        &[("a.conf", "alpha v2"), ("b.conf", "beta")],
    ));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        read(r, "p1", "kubernetes.io~configmap", "config", "a.conf").0,
        "alpha v2"
    );

    // The pod goes: volumes torn down, the tmpfs unmounted, the registration released.
    agent.pods.remove("p1");
    agent.pods.set_runtime_removed("p1");
    agent.manager.pod_updated();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(fake.mounts().is_empty());
    assert!(!r.join("pods/p1").exists());
    assert!(!agent.objects.is_registered(&PodUid::new("p1")));
    agent.cancel.cancel();
    agent.task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_missing_object_fails_the_wait_unless_optional_and_a_missing_key_is_named() {
    let root = tempfile::tempdir().unwrap();
    let agent = start(root.path(), Arc::new(FakeMounter::new()));
    let pod = |uid: &str, source: ConfigMapVolumeSource| {
        let mut pod = (*pod_with_volumes(uid, vec![cm_volume("v", source)])).clone();
        pod.metadata.namespace = Some("ns".into());
        Arc::new(pod)
    };
    let missing = pod(
        "p-missing",
        ConfigMapVolumeSource {
            name: "absent".into(),
            ..Default::default()
        },
    );
    let optional = pod(
        "p-optional",
        ConfigMapVolumeSource {
            name: "absent".into(),
            optional: Some(true),
            ..Default::default()
        },
    );
    agent
        .objects
        .put_config_map(config_map("app", &[("a", "1")]));
    let bad_key = pod(
        "p-key",
        ConfigMapVolumeSource {
            name: "app".into(),
            items: Some(vec![KeyToPath {
                key: "nope".into(),
                path: "x".into(),
                mode: None,
                ..Default::default()
            }]),
            ..Default::default()
        },
    );
    let optional_key = pod(
        "p-optional-key",
        ConfigMapVolumeSource {
            name: "app".into(),
            optional: Some(true),
            items: Some(vec![
                KeyToPath {
                    key: "nope".into(),
                    path: "x".into(),
                    ..Default::default()
                },
                KeyToPath {
                    key: "a".into(),
                    path: "y".into(),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        },
    );
    for p in [&missing, &optional, &bad_key, &optional_key] {
        agent.pods.add(p.clone());
    }
    agent.manager.pod_updated();
    agent
        .manager
        .wait_for_attach_and_mount(&optional)
        .await
        .unwrap();
    let listing = std::fs::read_dir(
        root.path()
            .join("pods/p-optional/volumes/kubernetes.io~configmap/v"),
    )
    .unwrap()
    .count();
    assert_eq!(listing, 2, "an empty version: ..data and its directory");
    agent
        .manager
        .wait_for_attach_and_mount(&optional_key)
        .await
        .unwrap();
    let v = root
        .path()
        .join("pods/p-optional-key/volumes/kubernetes.io~configmap/v");
    assert!(!v.join("x").exists(), "an optional missing key is skipped");
    assert_eq!(std::fs::read_to_string(v.join("y")).unwrap(), "1");
    for (p, expected) in [
        (&missing, "get configmap ns/absent: not found"),
        (
            &bad_key,
            "configmap references non-existent config key: nope",
        ),
    ] {
        let err = agent
            .manager
            .wait_for_attach_and_mount(p)
            .await
            .unwrap_err();
        assert!(
            matches!(&err, WaitError::NotMounted { cause: WaitCause::DeadlineExceeded, unmounted, .. } if unmounted == &vec!["v".to_owned()]),
            "{err}"
        );
        let events = agent.events.events();
        assert!(
            events
                .iter()
                .any(|(_, reason, message)| reason == "FailedMount" && message.contains(expected)),
            "{expected}: {events:?}"
        );
    }
    agent.cancel.cancel();
    agent.task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn downward_api_and_projected_volumes_and_a_label_change() {
    use k8s_openapi::api::core::v1::{
        ConfigMapProjection, DownwardAPIProjection, DownwardAPIVolumeFile, DownwardAPIVolumeSource,
        ObjectFieldSelector, ProjectedVolumeSource, ServiceAccountTokenProjection,
        VolumeProjection,
    };
    let root = tempfile::tempdir().unwrap();
    let fake = FakeMounter::new();
    let agent = start(root.path(), Arc::new(fake.clone()));
    agent
        .objects
        .put_config_map(config_map("app", &[("a.conf", "alpha")]));
    let field = |path: &str, field_path: &str| DownwardAPIVolumeFile {
        path: path.into(),
        field_ref: Some(ObjectFieldSelector {
            field_path: field_path.into(),
            api_version: Some("v1".into()),
        }),
        ..Default::default()
    };
    let volumes = vec![
        Volume {
            name: "podinfo".into(),
            downward_api: Some(DownwardAPIVolumeSource {
                items: Some(vec![
                    field("labels", "metadata.labels"),
                    field("name", "metadata.name"),
                ]),
                default_mode: Some(0o644),
                ..Default::default()
            }),
            ..Default::default()
        },
        Volume {
            name: "all".into(),
            projected: Some(ProjectedVolumeSource {
                default_mode: Some(0o440),
                sources: Some(vec![
                    VolumeProjection {
                        config_map: Some(ConfigMapProjection {
                            name: "app".into(),
                            items: Some(vec![KeyToPath {
                                key: "a.conf".into(),
                                path: "config/a.conf".into(),
                                ..Default::default()
                            }]),
                            optional: None,
                        }),
                        ..Default::default()
                    },
                    VolumeProjection {
                        downward_api: Some(DownwardAPIProjection {
                            items: Some(vec![field("ns", "metadata.namespace")]),
                        }),
                        ..Default::default()
                    },
                    VolumeProjection {
                        service_account_token: Some(ServiceAccountTokenProjection {
                            path: "token".into(),
                            expiration_seconds: Some(3600),
                            audience: None,
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                ]),
                ..Default::default()
            }),
            ..Default::default()
        },
    ];
    let mut pod = (*pod_with_volumes("p1", volumes)).clone();
    pod.metadata.namespace = Some("ns".into());
    pod.metadata.labels = Some(BTreeMap::from([("app".into(), "web".into())]));
    let pod = Arc::new(pod);
    agent.pods.add(pod.clone());
    agent.manager.pod_updated();
    agent.manager.wait_for_attach_and_mount(&pod).await.unwrap();
    let r = root.path();
    let downward = "kubernetes.io~downward-api";
    let projected = "kubernetes.io~projected";
    assert_eq!(
        read(r, "p1", downward, "podinfo", "labels").0,
        "app=\"web\""
    );
    assert_eq!(read(r, "p1", downward, "podinfo", "name").0, "pod-p1");
    assert_eq!(
        read(r, "p1", projected, "all", "config/a.conf"),
        ("alpha".into(), 0o440)
    );
    assert_eq!(read(r, "p1", projected, "all", "ns").0, "ns");
    assert_eq!(
        read(r, "p1", projected, "all", "token").0,
        "token-default-1"
    );
    for (plugin, name) in [(downward, "podinfo"), (projected, "all")] {
        let dir = r.join(format!("pods/p1/volumes/{plugin}/{name}"));
        assert!(fake.is_tmpfs_mount_point(&dir).unwrap(), "{name} on tmpfs");
    }

    // The pod's labels change (no spec change): the file follows on the pod's next sync.
    let mut relabelled = (*pod).clone();
    relabelled.metadata.labels = Some(BTreeMap::from([
        ("app".into(), "web".into()),
        ("tier".into(), "front".into()),
    ]));
    let relabelled = Arc::new(relabelled);
    agent.pods.add(relabelled.clone());
    agent
        .manager
        .wait_for_attach_and_mount(&relabelled)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        read(r, "p1", downward, "podinfo", "labels").0,
        "app=\"web\"\ntier=\"front\""
    );
    agent.cancel.cancel();
    agent.task.await.unwrap();
}

/// Keys the API server refuses can still reach a node (an old object, a hostile server): each
/// is refused by the writer with a clear error, and nothing is written, inside or outside.
#[tokio::test(start_paused = true)]
async fn hostile_keys_fail_the_mount_and_write_nothing() {
    let root = tempfile::tempdir().unwrap();
    let agent = start(root.path(), Arc::new(FakeMounter::new()));
    let long = "k".repeat(300);
    let cases: Vec<(&str, String)> = vec![
        ("dotdot", "../escape".into()),
        ("data", "..data".into()),
        ("parent", "..".into()),
        ("absolute", "/etc/passwd".into()),
        ("long", long),
        ("nested", "a/../../escape".into()),
    ];
    for (i, (name, key)) in cases.iter().enumerate() {
        let object = format!("hostile-{name}");
        let mut cm = config_map(&object, &[("fine", "ok")]);
        cm.data.as_mut().unwrap().insert(key.clone(), "evil".into());
        agent.objects.put_config_map(cm);
        let mut pod = (*pod_with_volumes(
            &format!("h{i}"),
            vec![cm_volume(
                "v",
                ConfigMapVolumeSource {
                    name: object.clone(),
                    ..Default::default()
                },
            )],
        ))
        .clone();
        pod.metadata.namespace = Some("ns".into());
        let pod = Arc::new(pod);
        agent.pods.add(pod.clone());
        agent.manager.pod_updated();
        assert!(
            agent.manager.wait_for_attach_and_mount(&pod).await.is_err(),
            "{name}: mounted"
        );
        let dir = root
            .path()
            .join(format!("pods/h{i}/volumes/kubernetes.io~configmap/v"));
        assert!(
            !dir.join("..data").exists(),
            "{name}: a version was written"
        );
        assert!(!dir.join("fine").exists(), "{name}: a file was written");
        let events = agent.events.events();
        assert!(
            events
                .iter()
                .any(|(_, reason, message)| reason == "FailedMount"
                    && message.contains("invalid path")),
            "{name}: {events:?}"
        );
    }
    for escaped in ["escape", "pods/escape", "pods/h0/escape"] {
        assert!(!root.path().join(escaped).exists(), "{escaped}");
    }
    agent.cancel.cancel();
    agent.task.await.unwrap();
}

mod claims {
    use k8s_openapi::api::core::v1::{
        LocalVolumeSource, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
        ObjectReference, PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec,
        PersistentVolumeClaimStatus, PersistentVolumeClaimVolumeSource, PersistentVolumeSpec,
        VolumeNodeAffinity,
    };

    use super::*;
    use crate::claims::NodeIdentity;

    fn claim(name: &str, phase: &str, volume: &str) -> PersistentVolumeClaim {
        PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                uid: Some(format!("uid-{name}")),
                ..Default::default()
            },
            spec: Some(PersistentVolumeClaimSpec {
                volume_name: Some(volume.into()),
                ..Default::default()
            }),
            status: Some(PersistentVolumeClaimStatus {
                phase: Some(phase.into()),
                ..Default::default()
            }),
        }
    }

    fn volume(name: &str, path: &Path, claim_uid: &str, host: &str) -> PersistentVolume {
        PersistentVolume {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(PersistentVolumeSpec {
                local: Some(LocalVolumeSource {
                    path: path.to_string_lossy().into_owned(),
                    fs_type: None,
                }),
                claim_ref: Some(ObjectReference {
                    uid: Some(claim_uid.into()),
                    ..Default::default()
                }),
                node_affinity: Some(VolumeNodeAffinity {
                    required: Some(NodeSelector {
                        node_selector_terms: vec![NodeSelectorTerm {
                            match_expressions: Some(vec![NodeSelectorRequirement {
                                key: "kubernetes.io/hostname".into(),
                                operator: "In".into(),
                                values: Some(vec![host.into()]),
                            }]),
                            match_fields: None,
                        }],
                    }),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn pod(uid: &str, claim: &str) -> Arc<k8s_openapi::api::core::v1::Pod> {
        let mut pod = (*pod_with_volumes(
            uid,
            vec![Volume {
                name: "data".into(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: claim.into(),
                    read_only: None,
                }),
                ..Default::default()
            }],
        ))
        .clone();
        pod.metadata.namespace = Some("ns".into());
        Arc::new(pod)
    }

    fn start_on_node(root: &Path, mounter: Arc<dyn Mounter>) -> Agent {
        start_with(
            root,
            mounter,
            Setup {
                node: NodeIdentity::new("node-a"),
                ..Setup::default()
            },
        )
    }

    #[tokio::test(start_paused = true)]
    async fn a_bound_claim_mounts_its_local_volume_and_every_broken_claim_says_why() {
        let root = tempfile::tempdir().unwrap();
        let disk = tempfile::tempdir().unwrap();
        let fake = FakeMounter::new();
        let agent = start_on_node(root.path(), Arc::new(fake.clone()));
        let o = &agent.objects;
        o.put_claim(claim("good", "Bound", "pv-good"));
        o.put_volume(volume("pv-good", disk.path(), "uid-good", "node-a"));
        o.put_claim(claim("pending", "Pending", ""));
        o.put_claim(claim("lost", "Lost", "pv-gone"));
        o.put_claim(claim("stolen", "Bound", "pv-stolen"));
        o.put_volume(volume("pv-stolen", disk.path(), "uid-other", "node-a"));
        o.put_claim(claim("elsewhere", "Bound", "pv-elsewhere"));
        o.put_volume(volume(
            "pv-elsewhere",
            disk.path(),
            "uid-elsewhere",
            "node-b",
        ));
        let cases = [
            ("good", None),
            ("pending", Some("has non-bound phase (\"Pending\")")),
            ("stolen", Some("does not point to claim.UID (uid-stolen)")),
            ("elsewhere", Some("volume node affinity conflict")),
            ("missing", Some("failed to fetch PVC from API server")),
            ("lost", Some("has non-bound phase (\"Lost\")")),
        ];
        for (i, (name, _)) in cases.iter().enumerate() {
            agent.pods.add(pod(&format!("p{i}"), name));
        }
        agent.manager.pod_updated();
        for (i, (name, expected)) in cases.iter().enumerate() {
            let result = agent
                .manager
                .wait_for_attach_and_mount(&pod(&format!("p{i}"), name))
                .await;
            match expected {
                None => result.unwrap(),
                Some(expected) => {
                    let err = result.unwrap_err();
                    assert!(
                        matches!(&err, WaitError::NotMounted { cause: WaitCause::PodErrors(e), .. } if e.contains(expected)),
                        "{name}: {err}"
                    );
                }
            }
        }
        let dir = root
            .path()
            .join("pods/p0/volumes/kubernetes.io~local-volume/pv-good");
        let mounts = fake.mounts();
        assert!(
            mounts
                .iter()
                .any(|m| m.target == dir && m.source == disk.path().to_string_lossy()),
            "{mounts:?}"
        );
        // The pod goes: unmounted, the directory removed, the disk's data untouched.
        std::fs::write(disk.path().join("keep"), "data").unwrap();
        agent.pods.remove("p0");
        agent.pods.set_runtime_removed("p0");
        agent.manager.pod_updated();
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(!fake.mounts().iter().any(|m| m.target == dir));
        assert_eq!(
            std::fs::read_to_string(disk.path().join("keep")).unwrap(),
            "data"
        );
        agent.cancel.cancel();
        agent.task.await.unwrap();
    }

    /// An attachable PV (the fake attachable plugin serves PVs without a `local` source).
    fn attachable_volume(name: &str, claim_uid: &str, mode: Option<&str>) -> PersistentVolume {
        PersistentVolume {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(PersistentVolumeSpec {
                claim_ref: Some(ObjectReference {
                    uid: Some(claim_uid.into()),
                    ..Default::default()
                }),
                volume_mode: mode.map(str::to_owned),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    struct Attaching {
        agent: Agent,
        reporter: tokio::task::JoinHandle<()>,
    }

    /// A manager with the fake attachable plugin, a node that lists `attached`, and the
    /// kubelet's node-status loop simulated (upstream `simulateVolumeInUseUpdate`).
    fn start_attaching(root: &Path, attached: &[&str]) -> Attaching {
        use crate::node::AttachedToNode;
        use crate::testing::{FakeAttachablePlugin, FakeNodeStatus};
        let node = Arc::new(FakeNodeStatus::default());
        node.set(
            attached
                .iter()
                .map(|name| AttachedToNode {
                    name: rustlet_core::UniqueVolumeName::new(*name),
                    device_path: "/dev/fake".into(),
                })
                .collect(),
        );
        let agent = start_with(
            root,
            Arc::new(FakeMounter::new()),
            Setup {
                extra_plugin: Some(Arc::new(FakeAttachablePlugin::default())),
                node_status: Some(node),
                node: NodeIdentity::new("node-a"),
                wait_timeout: Some(Duration::from_secs(5)),
            },
        );
        let reporter = {
            let (manager, cancel) = (agent.manager.clone(), agent.cancel.clone());
            tokio::spawn(async move {
                while !cancel.is_cancelled() {
                    if manager.reconciler_states_has_been_synced() {
                        manager.mark_volumes_as_reported_in_use(&manager.get_volumes_in_use());
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            })
        };
        Attaching { agent, reporter }
    }

    fn claim_pod(uid: &str) -> Arc<k8s_openapi::api::core::v1::Pod> {
        let mut p = (*pod_with_volumes(
            uid,
            vec![Volume {
                name: "vol1".into(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: "claim".into(),
                    read_only: None,
                }),
                ..Default::default()
            }],
        ))
        .clone();
        p.metadata.namespace = Some("ns".into());
        Arc::new(p)
    }

    #[tokio::test(start_paused = true)]
    async fn test_get_mounted_volumes_for_pod_and_get_volumes_in_use() {
        let root = tempfile::tempdir().unwrap();
        let unique = "kubernetes.io/fake-attachable/pv-1";
        let a = start_attaching(root.path(), &[unique]);
        assert!(
            a.agent.manager.get_volumes_in_use().is_empty(),
            "nothing mounted yet"
        );
        a.agent.objects.put_claim(claim("claim", "Bound", "pv-1"));
        a.agent
            .objects
            .put_volume(attachable_volume("pv-1", "uid-claim", Some("Filesystem")));
        let pod = claim_pod("p1");
        a.agent.pods.add(pod.clone());
        a.agent.manager.pod_updated();
        a.agent
            .manager
            .wait_for_attach_and_mount(&pod)
            .await
            .unwrap();
        let mounted = a
            .agent
            .manager
            .get_mounted_volumes_for_pod(&rustlet_core::UniquePodName::new("p1"));
        assert_eq!(
            mounted.keys().collect::<Vec<_>>(),
            ["vol1"],
            "the outer name"
        );
        assert_eq!(mounted["vol1"].inner_volume_spec_name, "pv-1");
        assert_eq!(
            a.agent.manager.get_volumes_in_use(),
            [rustlet_core::UniqueVolumeName::new(unique)]
        );

        // A Block PV used through volumeMounts fails the wait.
        a.agent
            .objects
            .put_claim(claim("block", "Bound", "pv-block"));
        a.agent
            .objects
            .put_volume(attachable_volume("pv-block", "uid-block", Some("Block")));
        let mut block = (*claim_pod("p2")).clone();
        block.spec.as_mut().unwrap().volumes.as_mut().unwrap()[0]
            .persistent_volume_claim
            .as_mut()
            .unwrap()
            .claim_name = "block".into();
        let block = Arc::new(block);
        a.agent.pods.add(block.clone());
        a.agent.manager.pod_updated();
        let err = a
            .agent
            .manager
            .wait_for_attach_and_mount(&block)
            .await
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("has volumeMode Block, but is specified in volumeMounts"),
            "{err}"
        );
        a.agent.cancel.cancel();
        a.agent.task.await.unwrap();
        a.reporter.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn test_initial_pending_volumes_for_pod_and_get_volumes_in_use() {
        let root = tempfile::tempdir().unwrap();
        let unique = "kubernetes.io/fake-attachable/pv-1";
        let a = start_attaching(root.path(), &[unique]);
        a.agent.objects.put_claim(claim("claim", "Pending", ""));
        a.agent
            .objects
            .put_volume(attachable_volume("pv-1", "uid-claim", None));
        let pod = claim_pod("p1");
        a.agent.pods.add(pod.clone());
        a.agent.manager.pod_updated();
        let binder = {
            let objects = a.agent.objects.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(500)).await;
                objects.put_claim(claim("claim", "Bound", "pv-1"));
            })
        };
        // The caller retries every 100 ms for up to a second, as upstream's test does.
        let started = tokio::time::Instant::now();
        let mut result = a.agent.manager.wait_for_attach_and_mount(&pod).await;
        while result.is_err() && started.elapsed() < Duration::from_secs(1) {
            tokio::time::sleep(Duration::from_millis(100)).await;
            result = a.agent.manager.wait_for_attach_and_mount(&pod).await;
        }
        result.unwrap();
        binder.await.unwrap();
        assert_eq!(
            a.agent.manager.get_volumes_in_use(),
            [rustlet_core::UniqueVolumeName::new(unique)]
        );
        a.agent.cancel.cancel();
        a.agent.task.await.unwrap();
        a.reporter.await.unwrap();
    }
}

/// V93 step 4: another mount of the same container below a content volume's mount path gets
/// its directory inside the volume, so the runtime can mount over it.
#[tokio::test(start_paused = true)]
async fn nested_mount_points_are_made_inside_a_content_volume() {
    use k8s_openapi::api::core::v1::{Container, EmptyDirVolumeSource, PodSpec, VolumeMount};
    let root = tempfile::tempdir().unwrap();
    let agent = start(root.path(), Arc::new(FakeMounter::new()));
    agent
        .objects
        .put_config_map(config_map("app", &[("a.conf", "alpha")]));
    let mut pod = (*crate::testing::pod("nested")).clone();
    pod.metadata.namespace = Some("ns".into());
    pod.spec = Some(PodSpec {
        containers: vec![Container {
            name: "c".into(),
            volume_mounts: Some(vec![
                VolumeMount {
                    name: "config".into(),
                    mount_path: "/etc/app".into(),
                    ..Default::default()
                },
                VolumeMount {
                    name: "cache".into(),
                    mount_path: "/etc/app/cache/".into(),
                    ..Default::default()
                },
                VolumeMount {
                    name: "elsewhere".into(),
                    mount_path: "/etc/application".into(),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        }],
        volumes: Some(vec![
            cm_volume(
                "config",
                ConfigMapVolumeSource {
                    name: "app".into(),
                    ..Default::default()
                },
            ),
            Volume {
                name: "cache".into(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Default::default()
            },
            Volume {
                name: "elsewhere".into(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Default::default()
            },
        ]),
        ..Default::default()
    });
    let pod = Arc::new(pod);
    agent.pods.add(pod.clone());
    agent.manager.pod_updated();
    agent.manager.wait_for_attach_and_mount(&pod).await.unwrap();
    let volume = root
        .path()
        .join("pods/nested/volumes/kubernetes.io~configmap/config");
    assert!(volume.join("cache").is_dir(), "made for the nested mount");
    assert!(
        !volume.join("ication").exists(),
        "a mere prefix is not nested"
    );
    assert_eq!(
        std::fs::read_to_string(volume.join("a.conf")).unwrap(),
        "alpha"
    );
    agent.cancel.cancel();
    agent.task.await.unwrap();
}

/// V94: a projected token is 0600 and owned by the pod's user when every container runs as the
/// same one; with an fsGroup too, the ownership walk makes it 0640 and the group's.
#[tokio::test(start_paused = true)]
async fn a_projected_token_belongs_to_the_pods_user() {
    use std::os::unix::fs::MetadataExt;

    use k8s_openapi::api::core::v1::{
        PodSecurityContext, ProjectedVolumeSource, SecurityContext, ServiceAccountTokenProjection,
        VolumeProjection,
    };
    let root = tempfile::tempdir().unwrap();
    let agent = start(root.path(), Arc::new(FakeMounter::new()));
    let token_volume = Volume {
        name: "token".into(),
        projected: Some(ProjectedVolumeSource {
            default_mode: Some(0o644),
            sources: Some(vec![VolumeProjection {
                service_account_token: Some(ServiceAccountTokenProjection {
                    path: "token".into(),
                    expiration_seconds: Some(3600),
                    ..Default::default()
                }),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    };
    let pod = |uid: &str, fs_group: Option<i64>, other_user: Option<i64>| {
        let mut pod = (*pod_with_volumes(uid, vec![token_volume.clone()])).clone();
        pod.metadata.namespace = Some("ns".into());
        let spec = pod.spec.as_mut().unwrap();
        spec.security_context = Some(PodSecurityContext {
            run_as_user: Some(1234),
            fs_group,
            ..Default::default()
        });
        if let Some(user) = other_user {
            let mut second = spec.containers[0].clone();
            second.name = "second".into();
            second.security_context = Some(SecurityContext {
                run_as_user: Some(user),
                ..Default::default()
            });
            spec.containers.push(second);
        }
        Arc::new(pod)
    };
    let cases = [
        ("t-user", None, None, (1234, 0o600)),
        ("t-group", Some(4321), None, (1234, 0o640)),
        ("t-mixed", None, Some(99), (0, 0o644)),
    ];
    for (uid, fs_group, other, _) in &cases {
        agent.pods.add(pod(uid, *fs_group, *other));
    }
    agent.manager.pod_updated();
    for (uid, fs_group, other, (owner, mode)) in cases {
        agent
            .manager
            .wait_for_attach_and_mount(&pod(uid, fs_group, other))
            .await
            .unwrap();
        let token = root.path().join(format!(
            "pods/{uid}/volumes/kubernetes.io~projected/token/token"
        ));
        let meta = std::fs::metadata(&token).unwrap();
        assert_eq!((meta.uid(), meta.mode() & 0o777), (owner, mode), "{uid}");
    }
    agent.cancel.cancel();
    agent.task.await.unwrap();
}

/// Issue 24 item 14: a subPath preparation that hangs (a gated mount seam parks it on its
/// thread) does not hold the async runtime: on this `current_thread` runtime, another pod's
/// container mounts are made while the first pod's subPath bind is still parked.
#[tokio::test(start_paused = true)]
async fn item14_a_hung_subpath_preparation_does_not_delay_another_pod() {
    use crate::testing::{GateOutcome, GatedMounter, ThreadGate, empty_dir, volume};
    let root = tempfile::tempdir().unwrap();
    let gate = Arc::new(ThreadGate::new());
    let mounter = Arc::new(GatedMounter {
        inner: Arc::new(FakeMounter::new()),
        gate: gate.clone(),
    });
    let agent = start(root.path(), mounter);
    let slow = {
        let mut pod = (*pod_with_volumes("slow", vec![volume(empty_dir("data"))])).clone();
        let spec = pod.spec.as_mut().unwrap();
        spec.containers[0].volume_mounts.as_mut().unwrap()[0].sub_path = Some("sub".into());
        Arc::new(pod)
    };
    let other = pod_with_volumes("other", vec![volume(empty_dir("data"))]);
    for pod in [&slow, &other] {
        agent.pods.add(pod.clone());
    }
    agent.manager.pod_updated();
    for pod in [&slow, &other] {
        agent.manager.wait_for_attach_and_mount(pod).await.unwrap();
    }

    gate.arm();
    let hung = {
        let (manager, pod) = (agent.manager.clone(), slow.clone());
        tokio::spawn(async move {
            let container = &pod.spec.as_ref().unwrap().containers[0];
            manager.container_mounts(&pod, container, false).await
        })
    };
    assert_eq!(
        gate.parked().await,
        GateOutcome::Parked,
        "the subPath preparation ran on the async runtime's thread"
    );
    // Parked: the other pod's container gets its mounts meanwhile.
    let container = &other.spec.as_ref().unwrap().containers[0];
    let mounts = agent
        .manager
        .container_mounts(&other, container, false)
        .await
        .unwrap();
    assert_eq!(mounts.len(), 1);
    assert!(!hung.is_finished(), "still parked");
    gate.release();
    let mounts = hung.await.unwrap().unwrap();
    assert!(
        mounts[0].host_path.ends_with("volume-subpaths/data/c/0"),
        "{mounts:?}"
    );
    agent.cancel.cancel();
}
