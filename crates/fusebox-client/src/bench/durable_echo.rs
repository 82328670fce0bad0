//! The floor of a durable gate with requests in flight: a responder that does only what
//! no durable guard can skip. On a connection and a thread of its own (the daemon is a
//! process of its own), it takes every request already delivered, writes their payloads
//! into a file allocated up front and makes them durable with one `fdatasync` on a
//! blocking thread (as the daemon's applier commits off its NATS tasks), then answers
//! each: group commit, with no guard in it. The raw echo beside it pays no disk at all.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures_util::{FutureExt, StreamExt};
use tokio::sync::oneshot;

use crate::client::{ClientOptions, FuseboxClient};
use crate::error::ClientError;
use crate::settings::NatsSettings;

pub(super) const SUBJECT: &str = "fusebox.bench.durable_echo";

/// The file's size, zeroed up front like the daemon's commit file (a write into a hole
/// would make each `fdatasync` write the block map too); writes wrap around at its end.
const FILE_BYTES: u64 = 8 << 20;

/// Most requests made durable by one `fdatasync` (the daemon's `max_batch` default).
const MAX_BATCH: usize = 1024;

pub(super) struct DurableEcho {
    stop: oneshot::Sender<()>,
    thread: std::thread::JoinHandle<Result<(), String>>,
}

impl DurableEcho {
    /// Starts the responder; returns once its subscription is registered and its file
    /// allocated in `dir`.
    pub(super) async fn start(
        settings: NatsSettings,
        options: ClientOptions,
        dir: PathBuf,
    ) -> Result<DurableEcho, ClientError> {
        let (ready_tx, ready_rx) = oneshot::channel();
        let (stop, stop_rx) = oneshot::channel();
        let thread = std::thread::Builder::new()
            .name("bench-durable-echo".to_owned())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|err| err.to_string())?;
                runtime.block_on(serve(settings, options, dir, ready_tx, stop_rx))
            })
            .map_err(|err| usage(format!("starting the durable echo: {err}")))?;
        match ready_rx.await {
            Ok(Ok(())) => Ok(DurableEcho { stop, thread }),
            Ok(Err(err)) => Err(err),
            Err(_) => Err(usage(match thread.join() {
                Ok(Err(err)) => format!("the durable echo failed to start: {err}"),
                _ => "the durable echo stopped before it was ready".to_owned(),
            })),
        }
    }

    /// Stops the responder and removes its file.
    pub(super) fn stop(self) -> Result<(), ClientError> {
        let _ = self.stop.send(());
        match self.thread.join() {
            Ok(result) => result.map_err(|err| usage(format!("the durable echo: {err}"))),
            Err(_) => Err(usage("the durable echo panicked".to_owned())),
        }
    }
}

fn usage(message: String) -> ClientError {
    ClientError::Usage(message)
}

async fn serve(
    settings: NatsSettings,
    options: ClientOptions,
    dir: PathBuf,
    ready: oneshot::Sender<Result<(), ClientError>>,
    mut stop: oneshot::Receiver<()>,
) -> Result<(), String> {
    let setup = async {
        let client = FuseboxClient::connect_with(&settings, options).await?;
        let requests = client.subscribe_confirmed(SUBJECT).await?;
        let disk = Disk::create(&dir).map_err(|err| {
            usage(format!(
                "the durable echo's file in {}: {err}",
                dir.display()
            ))
        })?;
        Ok::<_, ClientError>((client, requests, disk))
    };
    let (client, mut requests, mut disk) = match setup.await {
        Ok(ready_to_serve) => {
            let _ = ready.send(Ok(()));
            ready_to_serve
        }
        Err(err) => {
            let _ = ready.send(Err(err));
            return Ok(());
        }
    };
    let served = async {
        loop {
            let first = tokio::select! {
                biased;
                _ = &mut stop => return Ok(()),
                next = requests.next() => match next {
                    Some(message) => message,
                    None => return Ok(()),
                },
            };
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH {
                match requests.next().now_or_never() {
                    Some(Some(message)) => batch.push(message),
                    _ => break,
                }
            }
            let bytes: Vec<u8> = batch
                .iter()
                .flat_map(|message| message.payload.iter().copied())
                .collect();
            disk.commit(bytes).await.map_err(|err| err.to_string())?;
            for message in batch {
                if let Some(reply) = message.reply {
                    let _ = client.nats.publish(reply, message.payload).await;
                }
            }
        }
    };
    let result: Result<(), String> = served.await;
    let removed = std::fs::remove_file(&disk.path).map_err(|err| err.to_string());
    result.and(removed)
}

struct Disk {
    file: Arc<File>,
    path: PathBuf,
    end: u64,
}

impl Disk {
    fn create(dir: &Path) -> std::io::Result<Disk> {
        let path = dir.join(format!("fusebox-bench-durable-echo-{}", super::nonce()));
        let file = File::create_new(&path)?;
        let zeroes = vec![0u8; 1 << 20];
        let mut at = 0;
        while at < FILE_BYTES {
            file.write_all_at(&zeroes, at)?;
            at += zeroes.len() as u64;
        }
        file.sync_all()?;
        Ok(Disk {
            file: Arc::new(file),
            path,
            end: 0,
        })
    }

    /// Writes `bytes` at the file's end (wrapping around) and waits for the
    /// `fdatasync` that makes them durable.
    async fn commit(&mut self, bytes: Vec<u8>) -> std::io::Result<()> {
        let len = bytes.len() as u64;
        if self.end + len > FILE_BYTES {
            self.end = 0;
        }
        let (file, at) = (self.file.clone(), self.end);
        self.end += len;
        tokio::task::spawn_blocking(move || {
            file.write_all_at(&bytes[..(len.min(FILE_BYTES) as usize)], at)?;
            file.sync_data()
        })
        .await
        .map_err(std::io::Error::other)?
    }
}
