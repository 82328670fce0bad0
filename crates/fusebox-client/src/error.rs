use fusebox_nats::wire::WireError;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to NATS at {url}: {detail}")]
    Connect { url: String, detail: String },
    #[error("no answer from fuseboxd on {subject} within {timeout_ms} ms")]
    Timeout { subject: String, timeout_ms: u64 },
    #[error("the NATS server refused {subject} to this user ({detail}); connect as a user permitted to (deploy/nats/accounts.conf)")]
    PermissionDenied { subject: String, detail: String },
    #[error("no fuseboxd is listening on {subject}")]
    NoResponders { subject: String },
    #[error("NATS request on {subject} failed: {detail}")]
    Request { subject: String, detail: String },
    #[error("fuseboxd refused the request: {}", .0.message)]
    Refused(WireError),
    /// `start_run` for a run id the daemon already has events of (a restarted worker
    /// reusing it): refused, so the old process's decisions are not replayed to this one.
    #[error("run {tenant}/{run} already exists: {message}; start the run under a new run id")]
    RunExists {
        tenant: String,
        run: String,
        message: String,
    },
    #[error("unexpected answer on {subject}: {detail}")]
    BadAnswer { subject: String, detail: String },
    #[error("JetStream {what} failed: {detail}")]
    JetStream { what: String, detail: String },
    #[error("{0}")]
    Usage(String),
}
