//! The deploy configs under test: deploy/nats/ copied into a temp dir with its addresses
//! and store dirs rewritten, its users' placeholder passwords, connecting as one of them,
//! and watching the server's permission errors.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::paths::{deploy_dir, read};

/// Rewrites every `<host>:<port>` in `text` whose host is `from_host` and whose port is a
/// key of `ports` to `127.0.0.1:<new port>`. Scans whole port numbers, so a new port that
/// happens to start with an old one (42231 vs 4223) is never rewritten twice.
pub fn remap_addresses(text: &str, from_host: &str, ports: &HashMap<u16, u16>) -> String {
    let needle = format!("{from_host}:");
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(&needle) {
        let after = &rest[at + needle.len()..];
        let digits = after.chars().take_while(|c| c.is_ascii_digit()).count();
        out.push_str(&rest[..at]);
        match after[..digits]
            .parse::<u16>()
            .ok()
            .and_then(|p| ports.get(&p))
        {
            Some(new) => out.push_str(&format!("127.0.0.1:{new}")),
            None => out.push_str(&rest[at..at + needle.len() + digits]),
        }
        rest = &after[digits..];
    }
    out.push_str(rest);
    out
}

/// Whether `text` has `127.0.0.1:<port>` with exactly that port (a free port may start
/// with the same digits, e.g. 42221).
pub fn has_port(text: &str, port: u16) -> bool {
    let needle = format!("127.0.0.1:{port}");
    text.match_indices(&needle).any(|(at, _)| {
        !text[at + needle.len()..]
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_digit())
    })
}

/// `text` with `from` replaced by `to`, failing loudly when `from` is absent: a deploy
/// file that changed shape must fail the test that rewrites it, not silently keep its
/// production value (e.g. a store dir under /var/lib).
pub fn replace_required(text: &str, from: &str, to: &str, what: &str) -> String {
    assert!(
        text.contains(from),
        "{what}: expected to find {from:?} to rewrite for the test; the file changed shape"
    );
    text.replace(from, to)
}

/// A copy of deploy/nats/ in a temp dir, ready to be edited before servers start.
pub struct NatsConfigDir {
    pub dir: tempfile::TempDir,
}

impl NatsConfigDir {
    pub fn copy() -> NatsConfigDir {
        let dir = tempfile::tempdir().expect("temp dir");
        let src = deploy_dir().join("nats");
        for entry in std::fs::read_dir(&src).expect("listing deploy/nats") {
            let entry = entry.expect("dir entry");
            if entry.path().extension().is_some_and(|e| e == "conf") {
                std::fs::copy(entry.path(), dir.path().join(entry.file_name()))
                    .expect("copying a config");
            }
        }
        NatsConfigDir { dir }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn edit(&self, name: &str, f: impl FnOnce(&str) -> String) {
        let path = self.path(name);
        let text = read(&path);
        std::fs::write(&path, f(&text)).expect("writing a config");
    }
}

/// The line of accounts.conf that includes partitions.conf in the FUSEBOX account.
pub const MAPPING_LINE: &str = "mappings { include \"partitions.conf\" }";

/// The partition mapping is ON in the shipped accounts.conf: the include line is there
/// exactly once and not commented out (the servers' behaviour is tested separately).
pub fn assert_mapping_on() {
    let accounts = read(&deploy_dir().join("nats/accounts.conf"));
    let active = accounts
        .lines()
        .filter(|l| l.trim() == MAPPING_LINE)
        .count();
    assert_eq!(
        active, 1,
        "deploy/nats/accounts.conf must switch the partition mapping on (one uncommented \
         `{MAPPING_LINE}` in the FUSEBOX account)"
    );
}

/// Connects as `user` (password from deploy/nats/accounts.conf's placeholders), with an
/// optional inbox prefix and a channel receiving the server's error messages (permission
/// violations arrive there, asynchronously, as `-ERR` lines).
pub async fn connect(
    urls: &[String],
    user: &str,
    inbox_prefix: Option<&str>,
) -> (
    async_nats::Client,
    tokio::sync::mpsc::UnboundedReceiver<String>,
) {
    let (errors_tx, errors) = tokio::sync::mpsc::unbounded_channel();
    let mut options = async_nats::ConnectOptions::new()
        .user_and_password(user.to_owned(), placeholder_password(user))
        .connection_timeout(Duration::from_secs(5))
        .event_callback(move |event| {
            let errors_tx = errors_tx.clone();
            async move {
                if let async_nats::Event::ServerError(err) = event {
                    let _ = errors_tx.send(err.to_string());
                }
            }
        });
    if let Some(prefix) = inbox_prefix {
        options = options.custom_inbox_prefix(prefix);
    }
    let addrs: Vec<async_nats::ServerAddr> = urls
        .iter()
        .map(|u| u.parse().expect("server url"))
        .collect();
    let client = options
        .connect(addrs)
        .await
        .unwrap_or_else(|e| panic!("connecting as {user}: {e}"));
    (client, errors)
}

/// The placeholder password accounts.conf gives `user`, read from the file so the test
/// breaks if the naming scheme changes rather than quietly testing something else.
pub fn placeholder_password(user: &str) -> String {
    let accounts = read(&deploy_dir().join("nats/accounts.conf"));
    let password = format!("PLACEHOLDER-{user}-change-me");
    assert!(
        accounts.contains(&format!("user: {user}\n"))
            || accounts.contains(&format!("user: {user},"))
            || accounts.contains(&format!("user: {user} ")),
        "accounts.conf has no user {user}"
    );
    assert!(
        accounts.contains(&format!("\"{password}\"")),
        "accounts.conf: user {user} should have the placeholder password {password:?}"
    );
    password
}

/// Waits (up to `within`) for a server error mentioning every one of `needles`.
pub async fn expect_error(
    errors: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
    needles: &[&str],
    within: Duration,
) -> String {
    let deadline = tokio::time::Instant::now() + within;
    let mut seen = Vec::new();
    loop {
        match tokio::time::timeout_at(deadline, errors.recv()).await {
            Ok(Some(err)) => {
                if needles.iter().all(|n| err.contains(n)) {
                    return err;
                }
                seen.push(err);
            }
            Ok(None) | Err(_) => panic!("no server error containing {needles:?}; saw {seen:?}"),
        }
    }
}

/// No server error arrives within `within` (a permitted action really was permitted).
pub async fn expect_no_error(
    errors: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
    within: Duration,
) {
    if let Ok(Some(err)) = tokio::time::timeout(within, errors.recv()).await {
        panic!("unexpected server error: {err}");
    }
}

/// FNV-1a, 32 bit: the hash nats-server's `partition(N, …)` mapping applies to the
/// selected tokens (concatenated without separator), mod N.
pub fn fnv1a32(bytes: &[u8]) -> u32 {
    let mut hash: u32 = 0x811c_9dc5;
    for b in bytes {
        hash ^= u32::from(*b);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    hash
}
