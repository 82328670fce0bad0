//! How a client reaches NATS: the `[nats]` keys fuseboxd accepts (servers, user/password,
//! token, nkey seed, creds file, TLS incl. mutual TLS), plus the inbox prefix a tenant
//! user of `deploy/nats/accounts.conf` needs. One definition for every client binary —
//! the `fusebox` CLI, agents, the hook command, the MCP gateway — so a deployment that
//! fuseboxd can reach, they can reach with the same words.
//!
//! Sources, later ones winning: a config file's `[nats]` section
//! ([`NatsSettings::from_config_file`]), then flags and environment ([`NatsArgs`], with
//! the `clap` feature).

use std::path::{Path, PathBuf};
use std::time::Duration;

use async_nats::{ConnectOptions, ServerAddr};
use serde::Deserialize;

use crate::error::ClientError;

/// Where NATS is and who we are to it. Field names are the `[nats]` keys of
/// `fusebox.toml`.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NatsSettings {
    /// Servers to try; empty means `nats://127.0.0.1:4222`.
    pub urls: Vec<String>,
    /// The connection name the server shows (`nats server report connections`).
    pub name: Option<String>,
    pub connect_timeout_ms: Option<u64>,
    pub user: Option<String>,
    pub password: Option<String>,
    pub token: Option<String>,
    /// A file holding an nkey seed (`SU…`).
    pub nkey_seed_file: Option<PathBuf>,
    /// A `.creds` file (JWT + seed; operator-mode servers).
    pub creds_file: Option<PathBuf>,
    pub tls_required: bool,
    /// CA certificate(s) that sign the server's certificate (PEM).
    pub tls_ca_file: Option<PathBuf>,
    /// Client certificate and key for mutual TLS (PEM); both or neither.
    pub tls_cert_file: Option<PathBuf>,
    pub tls_key_file: Option<PathBuf>,
    /// Reply subjects start here instead of `_INBOX`. A tenant user of the deploy configs
    /// may only receive on `_INBOX.<tenant>.>`: set `_INBOX.<tenant>`.
    pub inbox_prefix: Option<String>,
    /// fuseboxd's own key (its queue group): accepted, so a client can read the daemon's
    /// file; a client does not use it.
    pub queue_group: Option<String>,
}

pub const DEFAULT_URL: &str = "nats://127.0.0.1:4222";

impl NatsSettings {
    /// Plain settings for one server URL (loopback, tests).
    pub fn url(url: impl Into<String>) -> Self {
        NatsSettings {
            urls: vec![url.into()],
            ..Default::default()
        }
    }

    /// The `[nats]` section of a TOML config file (fuseboxd's `fusebox.toml` or an
    /// operator's own file); a file without one gives the defaults. Other sections are
    /// not looked at; unknown keys in `[nats]` are errors (a typo must not fall back to
    /// "no credentials").
    pub fn from_config_file(path: &Path) -> Result<Self, ClientError> {
        let bad = |detail: String| ClientError::Usage(format!("{}: {detail}", path.display()));
        let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
        let mut doc: toml::Table = toml::from_str(&text).map_err(|e| bad(e.to_string()))?;
        match doc.remove("nats") {
            None => Ok(NatsSettings::default()),
            Some(section) => section
                .try_into()
                .map_err(|e: toml::de::Error| bad(format!("[nats]: {}", e.message()))),
        }
    }

    /// The servers, in order (the default when none is named).
    pub fn server_urls(&self) -> Vec<String> {
        let urls: Vec<String> = self
            .urls
            .iter()
            .flat_map(|u| u.split(','))
            .map(|u| u.trim().to_owned())
            .filter(|u| !u.is_empty())
            .collect();
        if urls.is_empty() {
            vec![DEFAULT_URL.to_owned()]
        } else {
            urls
        }
    }

    /// The combinations the server would refuse or that would silently not apply.
    pub fn check(&self) -> Result<(), ClientError> {
        let credentials = [
            self.user.is_some() || self.password.is_some(),
            self.token.is_some(),
            self.nkey_seed_file.is_some(),
            self.creds_file.is_some(),
        ];
        let usage = |m: &str| Err(ClientError::Usage(format!("NATS settings: {m}")));
        if credentials.iter().filter(|set| **set).count() > 1 {
            return usage("set at most one of user/password, token, nkey seed, creds file");
        }
        if self.user.is_some() != self.password.is_some() {
            return usage("user and password go together");
        }
        if self.tls_cert_file.is_some() != self.tls_key_file.is_some() {
            return usage("the TLS client certificate and key go together");
        }
        Ok(())
    }

    /// async-nats options carrying every setting (credential files are read here).
    /// `default_timeout` applies when `connect_timeout_ms` is not set.
    pub async fn connect_options(
        &self,
        default_timeout: Duration,
    ) -> Result<ConnectOptions, ClientError> {
        self.check()?;
        let timeout = self
            .connect_timeout_ms
            .map_or(default_timeout, Duration::from_millis);
        let mut options = ConnectOptions::new()
            .connection_timeout(timeout)
            .require_tls(self.tls_required);
        if let Some(name) = &self.name {
            options = options.name(name);
        }
        if let (Some(user), Some(password)) = (&self.user, &self.password) {
            options = options.user_and_password(user.clone(), password.clone());
        }
        if let Some(token) = &self.token {
            options = options.token(token.clone());
        }
        if let Some(path) = &self.nkey_seed_file {
            let seed = std::fs::read_to_string(path).map_err(|e| {
                ClientError::Usage(format!("nkey seed file {}: {e}", path.display()))
            })?;
            options = options.nkey(seed.trim().to_owned());
        }
        if let Some(path) = &self.creds_file {
            options = options
                .credentials_file(path)
                .await
                .map_err(|e| ClientError::Usage(format!("creds file {}: {e}", path.display())))?;
        }
        if let Some(ca) = &self.tls_ca_file {
            options = options.add_root_certificates(ca.clone());
        }
        if let (Some(cert), Some(key)) = (&self.tls_cert_file, &self.tls_key_file) {
            options = options.add_client_certificate(cert.clone(), key.clone());
        }
        if let Some(prefix) = &self.inbox_prefix {
            options = options.custom_inbox_prefix(prefix);
        }
        Ok(options)
    }

    /// [`NatsSettings::server_urls`] parsed.
    pub fn servers(&self) -> Result<Vec<ServerAddr>, ClientError> {
        self.server_urls()
            .iter()
            .map(|url| {
                url.parse::<ServerAddr>().map_err(|e| ClientError::Connect {
                    url: url.clone(),
                    detail: e.to_string(),
                })
            })
            .collect()
    }
}

/// The connection flags of a client binary, each with its environment variable; they
/// win over `--config`'s `[nats]`. Flatten it into a clap command
/// (`#[command(flatten)] nats: NatsArgs`) and call [`NatsArgs::settings`].
#[cfg(feature = "clap")]
#[derive(Debug, Clone, Default, clap::Args)]
pub struct NatsArgs {
    /// A TOML file whose [nats] section (fuseboxd's keys: urls, user, password, token,
    /// nkey_seed_file, creds_file, tls_*; plus inbox_prefix) says how to connect.
    #[arg(long = "config", env = "FUSEBOX_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// NATS server URL(s), comma-separated (default nats://127.0.0.1:4222).
    #[arg(long, alias = "nats", env = "FUSEBOX_NATS_URL", value_name = "URLS")]
    pub nats_url: Option<String>,
    #[arg(long, env = "FUSEBOX_NATS_USER", value_name = "USER")]
    pub nats_user: Option<String>,
    /// Prefer the environment variable: a flag's value shows in `ps`.
    #[arg(
        long,
        env = "FUSEBOX_NATS_PASSWORD",
        value_name = "PASSWORD",
        hide_env_values = true
    )]
    pub nats_password: Option<String>,
    #[arg(
        long,
        env = "FUSEBOX_NATS_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    pub nats_token: Option<String>,
    #[arg(long, env = "FUSEBOX_NATS_NKEY_SEED_FILE", value_name = "FILE")]
    pub nats_nkey_seed_file: Option<PathBuf>,
    #[arg(long, env = "FUSEBOX_NATS_CREDS_FILE", value_name = "FILE")]
    pub nats_creds_file: Option<PathBuf>,
    /// Refuse a connection that is not TLS.
    #[arg(long, env = "FUSEBOX_NATS_TLS_REQUIRED")]
    pub nats_tls_required: bool,
    #[arg(long, env = "FUSEBOX_NATS_TLS_CA_FILE", value_name = "FILE")]
    pub nats_tls_ca_file: Option<PathBuf>,
    /// Client certificate for mutual TLS (with --nats-tls-key-file).
    #[arg(long, env = "FUSEBOX_NATS_TLS_CERT_FILE", value_name = "FILE")]
    pub nats_tls_cert_file: Option<PathBuf>,
    #[arg(long, env = "FUSEBOX_NATS_TLS_KEY_FILE", value_name = "FILE")]
    pub nats_tls_key_file: Option<PathBuf>,
    /// Reply-subject prefix; a tenant user of deploy/nats needs `_INBOX.<tenant>`.
    #[arg(long, env = "FUSEBOX_NATS_INBOX_PREFIX", value_name = "PREFIX")]
    pub nats_inbox_prefix: Option<String>,
}

#[cfg(feature = "clap")]
impl NatsArgs {
    /// The file's `[nats]` (if `--config`), overridden by every flag given. A
    /// credential given as a flag replaces the file's credential of any kind, so the
    /// two never combine into a refused mix.
    pub fn settings(&self) -> Result<NatsSettings, ClientError> {
        let mut settings = match &self.config {
            Some(path) => NatsSettings::from_config_file(path)?,
            None => NatsSettings::default(),
        };
        if let Some(urls) = &self.nats_url {
            settings.urls = vec![urls.clone()];
        }
        let flag_credential = self.nats_user.is_some()
            || self.nats_password.is_some()
            || self.nats_token.is_some()
            || self.nats_nkey_seed_file.is_some()
            || self.nats_creds_file.is_some();
        if flag_credential {
            settings.user = self.nats_user.clone();
            settings.password = self.nats_password.clone();
            settings.token = self.nats_token.clone();
            settings.nkey_seed_file = self.nats_nkey_seed_file.clone();
            settings.creds_file = self.nats_creds_file.clone();
        }
        settings.tls_required |= self.nats_tls_required;
        let replace = |flag: &Option<PathBuf>, file: &mut Option<PathBuf>| {
            if flag.is_some() {
                file.clone_from(flag);
            }
        };
        replace(&self.nats_tls_ca_file, &mut settings.tls_ca_file);
        replace(&self.nats_tls_cert_file, &mut settings.tls_cert_file);
        replace(&self.nats_tls_key_file, &mut settings.tls_key_file);
        if self.nats_inbox_prefix.is_some() {
            settings.inbox_prefix.clone_from(&self.nats_inbox_prefix);
        }
        settings.check()?;
        Ok(settings)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(text: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        std::io::Write::write_all(&mut f, text.as_bytes()).unwrap();
        f
    }

    #[test]
    fn the_daemons_nats_section_reads_as_client_settings() {
        let f = file(
            "[guard]\npreset = \"strict\"\n[nats]\nurls = [\"nats://a:1\", \"nats://b:2\"]\n\
             user = \"operator\"\npassword = \"pw\"\nqueue_group = \"fuseboxd\"\n\
             tls_ca_file = \"/ca.pem\"\n",
        );
        let s = NatsSettings::from_config_file(f.path()).unwrap();
        assert_eq!(s.server_urls(), ["nats://a:1", "nats://b:2"]);
        assert_eq!(s.user.as_deref(), Some("operator"));
        assert_eq!(s.tls_ca_file.as_deref(), Some(Path::new("/ca.pem")));
        assert!(s.check().is_ok());
    }

    #[test]
    fn a_typo_or_a_mix_of_credentials_is_an_error() {
        let typo = file("[nats]\npasword = \"pw\"\n");
        let err = NatsSettings::from_config_file(typo.path()).unwrap_err();
        assert!(err.to_string().contains("pasword"), "{err}");
        let mixed = NatsSettings {
            token: Some("t".into()),
            user: Some("u".into()),
            password: Some("p".into()),
            ..Default::default()
        };
        assert!(mixed.check().is_err());
        let half = NatsSettings {
            user: Some("u".into()),
            ..Default::default()
        };
        assert!(half.check().is_err());
    }

    #[test]
    fn no_file_and_no_url_is_the_local_default() {
        assert_eq!(NatsSettings::default().server_urls(), [DEFAULT_URL]);
        assert_eq!(
            NatsSettings::url("nats://x:1, nats://y:2").server_urls(),
            ["nats://x:1", "nats://y:2"]
        );
    }

    #[cfg(feature = "clap")]
    #[test]
    fn flags_win_over_the_file_and_replace_its_credential() {
        let f = file("[nats]\nurls = [\"nats://a:1\"]\ntoken = \"file-token\"\n");
        let args = NatsArgs {
            config: Some(f.path().to_owned()),
            nats_user: Some("operator".into()),
            nats_password: Some("pw".into()),
            nats_inbox_prefix: Some("_INBOX.acme".into()),
            ..Default::default()
        };
        let s = args.settings().unwrap();
        assert_eq!(s.server_urls(), ["nats://a:1"]);
        assert_eq!(s.token, None);
        assert_eq!(s.user.as_deref(), Some("operator"));
        assert_eq!(s.inbox_prefix.as_deref(), Some("_INBOX.acme"));
    }
}
