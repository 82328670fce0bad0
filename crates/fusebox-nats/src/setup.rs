//! The JetStream objects the daemon needs, created when absent and checked when present:
//! a stream someone else configured differently is a start-up error, never silently
//! "fixed" (that could drop their data or ours).

use std::time::Duration;

use async_nats::jetstream::consumer::{pull, AckPolicy, DeliverPolicy};
use async_nats::jetstream::context::{CreateStreamErrorKind, GetStreamErrorKind};
use async_nats::jetstream::stream::{self, DiscardPolicy, RetentionPolicy, StorageType};
use async_nats::jetstream::ErrorCode;
use async_nats::jetstream::{self, Context};

use crate::subjects;

#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("JetStream is not available ({0}); start nats-server with JetStream enabled (-js)")]
    NoJetStream(String),
    #[error("JetStream request for {what} failed: {detail}")]
    Request { what: String, detail: String },
    #[error("stream {stream} exists with a conflicting configuration: {detail}; fix it or remove it (`nats stream rm {stream}`)")]
    StreamConflict { stream: String, detail: String },
    #[error("consumer {consumer} on {stream} exists with a conflicting configuration: {detail}; remove it (`nats consumer rm {stream} {consumer}`)")]
    ConsumerConflict {
        stream: String,
        consumer: String,
        detail: String,
    },
}

/// How long JetStream's server-side dedup remembers a `Nats-Msg-Id`.
pub const DEDUP_WINDOW: Duration = Duration::from_secs(120);

pub fn events_stream_config() -> stream::Config {
    stream::Config {
        name: subjects::EVENTS_STREAM.to_owned(),
        subjects: vec![subjects::EVENTS_FILTER.to_owned()],
        storage: StorageType::File,
        retention: RetentionPolicy::Limits,
        duplicate_window: DEDUP_WINDOW,
        ..Default::default()
    }
}

/// Where the daemon's JetStream objects live and how many copies they keep.
#[derive(Debug, Clone)]
pub struct Placement {
    pub scope: subjects::Scope,
    /// Replicas of streams the daemon creates (3 in a 3-node cluster; 1 on one server).
    pub replicas: usize,
    pub max_ack_pending: i64,
}

/// One message per run subject: the latest stop report is what a late subscriber needs.
/// `allow_direct` lets a worker read it with a direct get of its own subject
/// (`$JS.API.DIRECT.GET.FUSEBOX_STOPS.fusebox.stop.<tenant>.<run>`), the one JetStream
/// request a tenant is permitted: the subject names the run, so a subject allow-list
/// keeps tenants apart, and no consumer is needed.
pub fn stops_stream_config() -> stream::Config {
    stream::Config {
        name: subjects::STOPS_STREAM.to_owned(),
        subjects: vec![subjects::STOPS_FILTER.to_owned()],
        storage: StorageType::File,
        retention: RetentionPolicy::Limits,
        max_messages_per_subject: 1,
        discard: DiscardPolicy::Old,
        allow_direct: true,
        ..Default::default()
    }
}

/// The daemon's durable pull consumer. `ack_wait` is well above the gap timeout: a
/// message held for an earlier `seq` is acked only once applied.
pub fn events_consumer_config(placement: &Placement) -> pull::Config {
    pull::Config {
        durable_name: Some(placement.scope.events_consumer()),
        ack_policy: AckPolicy::Explicit,
        ack_wait: Duration::from_secs(30),
        deliver_policy: DeliverPolicy::All,
        filter_subject: placement.scope.events_filter(),
        max_ack_pending: placement.max_ack_pending,
        num_replicas: placement.replicas,
        ..Default::default()
    }
}

/// Creates or checks both streams and the consumer.
pub async fn ensure(js: &Context, placement: &Placement) -> Result<(), SetupError> {
    let replicated = |mut config: stream::Config| {
        config.num_replicas = placement.replicas;
        config
    };
    ensure_stream(js, replicated(events_stream_config())).await?;
    ensure_stream(js, replicated(stops_stream_config())).await?;
    ensure_consumer(
        js,
        events_consumer_config(placement),
        placement.scope.events_filter_before_trees(),
    )
    .await
}

/// Gets `want.name`, creating it when absent; an existing stream must carry exactly our
/// subjects and per-subject limit. The one setting changed in place is `allow_direct`,
/// switched on when we want it and it is off (a stream made before workers read stops
/// by direct get): it only adds a way to read, and loses nothing.
pub async fn ensure_stream(
    js: &Context,
    want: stream::Config,
) -> Result<stream::Stream, SetupError> {
    let request = |detail: String| SetupError::Request {
        what: format!("stream {}", want.name),
        detail,
    };
    match js.get_stream(&want.name).await {
        Ok(mut stream) => {
            let have = stream
                .info()
                .await
                .map_err(|e| request(e.to_string()))?
                .config
                .clone();
            if have.subjects != want.subjects {
                return Err(SetupError::StreamConflict {
                    stream: want.name.clone(),
                    detail: format!(
                        "subjects are {:?}, fuseboxd needs {:?}",
                        have.subjects, want.subjects
                    ),
                });
            }
            // The server reports "unlimited" as -1 whatever was sent (0 or -1).
            let limit = |n: i64| if n <= 0 { -1 } else { n };
            if limit(have.max_messages_per_subject) != limit(want.max_messages_per_subject) {
                return Err(SetupError::StreamConflict {
                    stream: want.name.clone(),
                    detail: format!(
                        "max_msgs_per_subject is {}, fuseboxd needs {}",
                        have.max_messages_per_subject, want.max_messages_per_subject
                    ),
                });
            }
            if want.allow_direct && !have.allow_direct {
                tracing::info!(stream = %want.name, "turning on allow_direct");
                let name = want.name.clone();
                js.update_stream(stream::Config {
                    allow_direct: true,
                    ..have
                })
                .await
                .map_err(|e| request(format!("turning on allow_direct failed: {e}")))?;
                return js
                    .get_stream(&name)
                    .await
                    .map_err(|e| request(e.to_string()));
            }
            Ok(stream)
        }
        Err(err) => match err.kind() {
            GetStreamErrorKind::JetStream(js_err)
                if js_err.error_code() == ErrorCode::STREAM_NOT_FOUND =>
            {
                let name = want.name.clone();
                let retry = |detail: String| SetupError::Request {
                    what: format!("stream {name}"),
                    detail,
                };
                js.create_stream(want).await.map_err(|e| match e.kind() {
                    // A cluster still forming (or electing) has no peers to place the
                    // stream on yet: a request to make again, not a conflict.
                    CreateStreamErrorKind::JetStream(js_err)
                        if js_err.error_code() == ErrorCode::CLUSTER_NO_PEERS =>
                    {
                        retry(format!("creating it failed: {e}"))
                    }
                    CreateStreamErrorKind::TimedOut
                    | CreateStreamErrorKind::JetStreamUnavailable => {
                        retry(format!("creating it failed: {e}"))
                    }
                    _ => SetupError::StreamConflict {
                        stream: name.clone(),
                        detail: format!("creating it failed: {e}"),
                    },
                })
            }
            GetStreamErrorKind::JetStream(js_err)
                if js_err.error_code() == ErrorCode::JETSTREAM_NOT_ENABLED
                    || js_err.error_code() == ErrorCode::JETSTREAM_NOT_ENABLED_FOR_ACCOUNT =>
            {
                Err(SetupError::NoJetStream(js_err.to_string()))
            }
            GetStreamErrorKind::Request => Err(SetupError::NoJetStream(err.to_string())),
            _ => Err(request(err.to_string())),
        },
    }
}

async fn ensure_consumer(
    js: &Context,
    want: pull::Config,
    widens: Option<String>,
) -> Result<(), SetupError> {
    let name = want.durable_name.clone().unwrap_or_default();
    let stream = js
        .get_stream(subjects::EVENTS_STREAM)
        .await
        .map_err(|e| SetupError::Request {
            what: format!("stream {}", subjects::EVENTS_STREAM),
            detail: e.to_string(),
        })?;
    let conflict = |detail: String| SetupError::ConsumerConflict {
        stream: subjects::EVENTS_STREAM.to_owned(),
        consumer: name.clone(),
        detail,
    };
    match stream.get_consumer::<pull::Config>(&name).await {
        Ok(mut consumer) => {
            let info = consumer.info().await.map_err(|e| conflict(e.to_string()))?;
            let have = &info.config;
            // A partition's durable made before runs of a tree carried their root reads
            // one form of subject only; widening its filter keeps its ack floor and
            // drops nothing it delivered.
            if widens.as_ref() == Some(&have.filter_subject) && have.ack_policy == want.ack_policy {
                tracing::info!(consumer = %name, from = %have.filter_subject, to = %want.filter_subject, "widening the consumer's filter to runs of a tree");
                let widened = pull::Config {
                    filter_subject: want.filter_subject.clone(),
                    ..want.clone()
                };
                return stream
                    .update_consumer(widened)
                    .await
                    .map(drop)
                    .map_err(|e| conflict(format!("widening its filter failed: {e}")));
            }
            if have.filter_subject != want.filter_subject || have.ack_policy != want.ack_policy {
                return Err(conflict(format!(
                    "filter {:?} / ack policy {:?}, fuseboxd needs {:?} / {:?}",
                    have.filter_subject, have.ack_policy, want.filter_subject, want.ack_policy
                )));
            }
            // Messages delivered to a previous owner that it never acked come back
            // after their ack wait; a gap that times out before then is filled from the
            // stream itself (`gap_probe.rs`). The consumer is not deleted and made anew
            // at its ack floor to hurry them: consumers made that way right after a
            // network split healed were seen to deliver nothing and report nothing
            // pending while the stream held their partition's new events.
            Ok(())
        }
        Err(_) => stream
            .create_consumer(want.clone())
            .await
            .map(drop)
            .map_err(|e| conflict(format!("creating it failed: {e}"))),
    }
}

/// Binds the daemon's consumer (created by [`ensure`]).
pub(crate) async fn events_consumer(
    js: &jetstream::Context,
    scope: subjects::Scope,
) -> Result<jetstream::consumer::Consumer<pull::Config>, async_nats::Error> {
    let stream = js.get_stream(subjects::EVENTS_STREAM).await?;
    stream.get_consumer(&scope.events_consumer()).await
}
