//! EC2 through `aws-sdk-ec2`. The SDK's own retries are off: the engine retries, so retries
//! are bounded, counted and the same for every provider.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use aws_config::{BehaviorVersion, SdkConfig};
use aws_sdk_ec2::config::http::HttpResponse;
use aws_sdk_ec2::config::retry::RetryConfig;
use aws_sdk_ec2::config::timeout::TimeoutConfig;
use aws_sdk_ec2::config::Region;
use aws_sdk_ec2::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_ec2::types::Filter;
use aws_sdk_ec2::Client;

use crate::config::WatchdogConfig;
use crate::provider::{
    ErrorKind, Instance, InstanceState, Op, Page, Provider, ProviderError, Selector, Terminated,
};
use crate::tags;

/// Largest page EC2 serves.
const PAGE_SIZE: i32 = 1000;

/// EC2 in any number of regions, one SDK client per region, made on first use.
pub struct Ec2Provider {
    sdk: SdkConfig,
    endpoint_url: Option<String>,
    clients: Mutex<HashMap<String, Client>>,
}

impl Ec2Provider {
    /// Credentials and defaults from the standard AWS chain (environment, profile, SSO,
    /// container or instance role); endpoint from the watchdog config when set.
    pub async fn from_env(cfg: &WatchdogConfig) -> Self {
        // Regions come from the watchdog config; naming one spares the loader its region
        // lookup (which may query the instance metadata service).
        let region = cfg
            .regions
            .first()
            .cloned()
            .unwrap_or_else(|| "us-east-1".to_owned());
        let sdk = aws_config::defaults(BehaviorVersion::latest())
            .region(Region::new(region))
            .load()
            .await;
        Self::new(sdk, cfg)
    }

    /// With an explicit SDK config (tests pass static dummy credentials here).
    pub fn new(sdk: SdkConfig, cfg: &WatchdogConfig) -> Self {
        Ec2Provider {
            sdk,
            endpoint_url: cfg.endpoint_url.clone(),
            clients: Mutex::new(HashMap::new()),
        }
    }

    /// The client for `region`.
    pub fn client(&self, region: &str) -> Client {
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        clients
            .entry(region.to_owned())
            .or_insert_with(|| {
                let mut b = aws_sdk_ec2::config::Builder::from(&self.sdk)
                    .region(Region::new(region.to_owned()))
                    .retry_config(RetryConfig::disabled())
                    .timeout_config(
                        TimeoutConfig::builder()
                            .connect_timeout(Duration::from_secs(5))
                            .operation_attempt_timeout(Duration::from_secs(30))
                            .build(),
                    );
                if let Some(url) = &self.endpoint_url {
                    b = b.endpoint_url(url);
                }
                Client::from_conf(b.build())
            })
            .clone()
    }
}

impl Provider for Ec2Provider {
    fn name(&self) -> &str {
        "ec2"
    }

    async fn describe_page(
        &self,
        region: &str,
        selector: &Selector,
        next_token: Option<String>,
    ) -> Result<Page, ProviderError> {
        let out = self
            .client(region)
            .describe_instances()
            .set_filters(Some(filters(selector)))
            .max_results(PAGE_SIZE)
            .set_next_token(next_token)
            .send()
            .await
            .map_err(to_provider_error)?;
        let instances = out
            .reservations()
            .iter()
            .flat_map(|r| r.instances())
            .filter_map(|i| convert(region, i))
            .collect();
        Ok(Page {
            instances,
            next_token: out.next_token().map(str::to_owned),
        })
    }

    async fn terminate(&self, region: &str, ids: &[String]) -> Result<Terminated, ProviderError> {
        let out = self
            .client(region)
            .terminate_instances()
            .set_instance_ids(Some(ids.to_vec()))
            .send()
            .await
            .map_err(to_provider_error)?;
        Ok(out
            .terminating_instances()
            .iter()
            .filter_map(|c| {
                let state = c.current_state()?.name()?.as_str();
                Some((c.instance_id()?.to_owned(), InstanceState::parse(state)))
            })
            .collect())
    }

    async fn dry_run(
        &self,
        region: &str,
        op: Op,
        instance_id: Option<&str>,
    ) -> Result<(), ProviderError> {
        let client = self.client(region);
        let result = match op {
            Op::DescribeInstances => client
                .describe_instances()
                .dry_run(true)
                .max_results(5)
                .send()
                .await
                .map(drop)
                .map_err(to_provider_error),
            Op::TerminateInstances => client
                .terminate_instances()
                .set_instance_ids(Some(instance_id.map(str::to_owned).into_iter().collect()))
                .dry_run(true)
                .send()
                .await
                .map(drop)
                .map_err(to_provider_error),
        };
        match result {
            // EC2 answers a permitted dry run with this error; success would mean it ran.
            Err(e) if e.code == "DryRunOperation" => Ok(()),
            Err(e) => Err(e),
            Ok(()) => Err(ProviderError::new(
                ErrorKind::Client,
                "DryRunIgnored",
                "the endpoint executed a DryRun request instead of answering DryRunOperation",
            )),
        }
    }
}

/// The managed filter always; the selector narrows it further.
fn filters(selector: &Selector) -> Vec<Filter> {
    let f = |name: String, values: &[String]| {
        Filter::builder()
            .name(name)
            .set_values(Some(values.to_vec()))
            .build()
    };
    let mut out = vec![f(format!("tag:{}", tags::MANAGED), &["true".to_owned()])];
    match selector {
        Selector::AllManaged => {}
        Selector::Ids(ids) => out.push(f("instance-id".to_owned(), ids)),
        Selector::Runs(runs) => out.push(f(format!("tag:{}", tags::RUN), runs)),
    }
    out
}

fn convert(region: &str, i: &aws_sdk_ec2::types::Instance) -> Option<Instance> {
    let tags: BTreeMap<String, String> = i
        .tags()
        .iter()
        .filter_map(|t| {
            Some((
                t.key()?.to_owned(),
                t.value().unwrap_or_default().to_owned(),
            ))
        })
        .collect();
    Some(Instance {
        region: region.to_owned(),
        instance_id: i.instance_id()?.to_owned(),
        state: i
            .state()
            .and_then(|s| s.name())
            .map_or(InstanceState::Other("unknown".to_owned()), |n| {
                InstanceState::parse(n.as_str())
            }),
        launch_ms: i
            .launch_time()
            .and_then(|t| t.to_millis().ok())
            .and_then(|ms| u64::try_from(ms).ok()),
        tags,
    })
}

fn to_provider_error<E>(err: SdkError<E, HttpResponse>) -> ProviderError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    let message = err
        .message()
        .map(str::to_owned)
        .unwrap_or_else(|| error_chain(&err));
    let status = match &err {
        SdkError::ServiceError(se) => se.raw().status().as_u16(),
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            return ProviderError::new(ErrorKind::Transport, "Transport", message);
        }
        _ => return ProviderError::new(ErrorKind::Client, "Request", message),
    };
    let code = err.code().unwrap_or("Unknown").to_owned();
    let kind = match classify(&code) {
        ErrorKind::Client if status >= 500 => ErrorKind::Server,
        kind => kind,
    };
    ProviderError::new(kind, code, message)
}

fn classify(code: &str) -> ErrorKind {
    match code {
        "RequestLimitExceeded"
        | "Throttling"
        | "ThrottlingException"
        | "RequestThrottled"
        | "SlowDown"
        | "TooManyRequestsException" => ErrorKind::Throttled,
        "InternalError" | "InternalFailure" | "ServiceUnavailable" | "Unavailable" => {
            ErrorKind::Server
        }
        "InvalidInstanceID.NotFound" => ErrorKind::NotFound,
        "OperationNotPermitted" => ErrorKind::NotPermitted,
        "UnauthorizedOperation" | "AuthFailure" | "AccessDenied" | "Blocked" => {
            ErrorKind::Unauthorized
        }
        _ => ErrorKind::Client,
    }
}

/// The error and its sources on one line (SDK errors hide the useful part in the chain).
fn error_chain(err: &dyn std::error::Error) -> String {
    let mut s = err.to_string();
    let mut src = err.source();
    while let Some(e) = src {
        s.push_str(": ");
        s.push_str(&e.to_string());
        src = e.source();
    }
    s
}
