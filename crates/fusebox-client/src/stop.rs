//! The kill switch, seen from a worker: `fusebox.stop.<tenant>.<run>` through the
//! `FUSEBOX_STOPS` stream, starting from the stop kept there, so a worker that
//! subscribes after its run was stopped still learns it at once.

use async_nats::jetstream::consumer::pull::{Ordered, OrderedConfig};
use async_nats::jetstream::consumer::DeliverPolicy;
use fusebox_core::Decision;
use fusebox_nats::{setup, subjects};
use futures_util::StreamExt;

use crate::client::FuseboxClient;
use crate::error::ClientError;

/// Stop decisions (each carrying its `report`) of one run, the kept one first.
pub struct StopWatch {
    messages: Ordered,
}

impl StopWatch {
    /// The next stop; `None` when the watch ended (the connection closed).
    pub async fn next(&mut self) -> Option<Result<Decision, ClientError>> {
        let message = match self.messages.next().await? {
            Ok(message) => message,
            Err(err) => {
                return Some(Err(ClientError::JetStream {
                    what: "stop watch".to_owned(),
                    detail: err.to_string(),
                }))
            }
        };
        Some(
            serde_json::from_slice(&message.payload).map_err(|err| ClientError::BadAnswer {
                subject: message.subject.to_string(),
                detail: err.to_string(),
            }),
        )
    }
}

impl FuseboxClient {
    /// Watches the run's kill switch.
    pub async fn watch_stop(&self, tenant: &str, run: &str) -> Result<StopWatch, ClientError> {
        let jetstream_error = |what: &str, err: &dyn std::fmt::Display| ClientError::JetStream {
            what: what.to_owned(),
            detail: err.to_string(),
        };
        // Same config as the daemon's, so creating it here is a no-op when it exists and
        // lets a worker start watching before the daemon ever ran.
        let stream = self
            .js
            .get_or_create_stream(setup::stops_stream_config())
            .await
            .map_err(|e| jetstream_error("stop stream", &e))?;
        let consumer = stream
            .create_consumer(OrderedConfig {
                filter_subject: subjects::stop(tenant, run),
                deliver_policy: DeliverPolicy::LastPerSubject,
                ..OrderedConfig::default()
            })
            .await
            .map_err(|e| jetstream_error("stop consumer", &e))?;
        let messages = consumer
            .messages()
            .await
            .map_err(|e| jetstream_error("stop consumer", &e))?;
        Ok(StopWatch { messages })
    }
}
