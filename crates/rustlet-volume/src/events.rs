//! The event seam (upstream `record.EventRecorder`): what the volume manager tells users about
//! their pods. `rustlet-api` implements it over kube-runtime's recorder.

use k8s_openapi::api::core::v1::Pod;

/// `Normal` or `Warning`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// Informational.
    Normal,
    /// Something went wrong.
    Warning,
}

/// Reason of a failed mount (upstream `events.FailedMountVolume`).
pub const FAILED_MOUNT: &str = "FailedMount";
/// Reason of a failed unmount (upstream `events.FailedUnMountVolume`).
pub const FAILED_UNMOUNT: &str = "FailedUnMount";

/// Records events about pods.
pub trait EventRecorder: Send + Sync {
    /// One event.
    fn event(&self, pod: &Pod, kind: EventKind, reason: &str, message: &str);
}

/// Drops every event (for agents without an API server).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoEvents;

impl EventRecorder for NoEvents {
    fn event(&self, _pod: &Pod, _kind: EventKind, _reason: &str, _message: &str) {}
}

/// Logs every event at debug level and sends none: upstream's kubelet without an API server
/// does the same (its broadcaster logs each event at verbosity 3, "Event occurred", and says
/// "No api server defined - no events will be sent to API server"). Local mode uses it: no one
/// could read the events it would store.
#[derive(Clone, Copy, Debug, Default)]
pub struct LoggedEvents;

impl EventRecorder for LoggedEvents {
    fn event(&self, pod: &Pod, kind: EventKind, reason: &str, message: &str) {
        let meta = &pod.metadata;
        tracing::debug!(
            object = format_args!(
                "{}/{}",
                meta.namespace.as_deref().unwrap_or_default(),
                meta.name.as_deref().unwrap_or_default()
            ),
            uid = meta.uid.as_deref().unwrap_or_default(),
            r#type = match kind {
                EventKind::Normal => "Normal",
                EventKind::Warning => "Warning",
            },
            reason,
            note = message,
            "Event occurred"
        );
    }
}

/// Upstream `GenerateError(prefix, err)`'s event text: `<prefix> for volume "<name>" : <err>`.
pub fn volume_error_message(prefix: &str, volume: &str, err: &dyn std::fmt::Display) -> String {
    format!("{prefix} for volume {volume:?} : {err}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// The log lines written while `f` runs, at `level` and above.
    fn logged(level: tracing::Level, f: impl FnOnce()) -> String {
        #[derive(Clone, Default)]
        struct Lines(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Lines {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let lines = Lines::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(level)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, f);
        String::from_utf8(lines.0.lock().unwrap().clone()).unwrap()
    }

    /// Upstream's kubelet without an API server: each event is logged ("Event occurred", the
    /// object, its type, reason and note), at upstream's verbosity 3 (debug here).
    #[test]
    fn an_event_without_an_api_server_is_logged_at_debug() {
        let mut pod = Pod::default();
        pod.metadata.name = Some("web".into());
        pod.metadata.namespace = Some("ns".into());
        pod.metadata.uid = Some("u-1".into());
        let log = logged(tracing::Level::DEBUG, || {
            LoggedEvents.event(&pod, EventKind::Warning, FAILED_MOUNT, "no such volume");
            LoggedEvents.event(&pod, EventKind::Normal, "Started", "Started container app");
        });
        let lines: Vec<&str> = log.lines().collect();
        assert_eq!(lines.len(), 2, "{log}");
        for (line, kind, reason, message) in [
            (lines[0], "Warning", "FailedMount", "no such volume"),
            (lines[1], "Normal", "Started", "Started container app"),
        ] {
            assert!(line.contains("DEBUG"), "{line}");
            assert!(line.contains("Event occurred"), "{line}");
            assert!(line.contains("object=ns/web uid=\"u-1\""), "{line}");
            assert!(
                line.contains(&format!("type=\"{kind}\" reason=\"{reason}\"")),
                "{line}"
            );
            assert!(line.ends_with(&format!("note=\"{message}\"")), "{line}");
        }
        let at_info = logged(tracing::Level::INFO, || {
            LoggedEvents.event(&pod, EventKind::Warning, FAILED_MOUNT, "no such volume");
        });
        assert_eq!(
            at_info, "",
            "upstream's verbosity 3 is not shown by default"
        );
    }
}
