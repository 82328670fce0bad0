//! The gateway proper: an MCP server to the agent ([`Gateway`]) that is, for each
//! session, an MCP client to one upstream server ([`UpstreamSide`]). Every request,
//! notification and answer crosses as the SDK's typed message, re-sent on the other
//! side; `tools/call` alone goes through the guard first.
//!
//! The upstream is started (or connected to) when the agent's `initialize` arrives, with
//! the agent's own `initialize` parameters (protocol version, capabilities, client info),
//! and its answer is the agent's answer: the agent sees the upstream's server info,
//! capabilities, instructions and negotiated version.

// The gateway forwards what older protocol versions still send (logging levels,
// resources/subscribe), which the SDK marks deprecated for the newest version.
#![allow(deprecated)]

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fusebox_client::FuseboxClient;
use rmcp::model::*;
use rmcp::service::{
    NotificationContext, Peer, PeerRequestOptions, RequestContext, RoleClient, RoleServer,
    RunningService, Service, ServiceError,
};
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ErrorData as McpError, ServerHandler, ServiceExt};
use tokio::sync::OnceCell;

use crate::config::GatewayConfig;
use crate::mapping::{self, Verdict};
use crate::run::{GuardedRun, RunIdentity};

/// Where the one upstream MCP server is.
#[derive(Debug, Clone)]
pub enum Upstream {
    /// A command line started per session; MCP over its stdin/stdout.
    Command(Vec<String>),
    /// A Streamable HTTP endpoint.
    Url(String),
}

impl std::fmt::Display for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Upstream::Command(argv) => write!(f, "`{}`", argv.join(" ")),
            Upstream::Url(url) => write!(f, "{url}"),
        }
    }
}

/// What every session of one gateway process shares.
pub struct Settings {
    pub upstream: Upstream,
    pub config: GatewayConfig,
    pub guard: FuseboxClient,
    pub tenant: String,
    pub run: Option<String>,
    pub agent: Option<String>,
    /// The run that started this gateway, when it said so: sessions are its children.
    pub parent_run: Option<String>,
    /// The root of the parent's tree (`--tree-root`); the parent when absent.
    pub tree_root: Option<String>,
    /// How long one upstream request may stay silent (progress resets it).
    pub upstream_timeout: Duration,
}

/// The least time an upstream gets to start and answer `initialize`.
const UPSTREAM_START_TIMEOUT: Duration = Duration::from_secs(60);

/// Tool name → the tool as the upstream's `tools/list` answers described it.
type ToolTable = Arc<Mutex<Option<HashMap<String, Tool>>>>;
/// The upstream's progress token → the agent's, for requests in flight.
type ProgressMap = Arc<Mutex<HashMap<ProgressToken, ProgressToken>>>;
/// The agent, as the upstream's requests and notifications reach it. A session opened by
/// `server/discover` first knows only a placeholder peer; `initialize` and every later
/// request bring the real one.
type AgentPeer = Arc<std::sync::RwLock<Peer<RoleServer>>>;

/// One agent session.
pub struct Gateway {
    settings: Arc<Settings>,
    session: Arc<OnceCell<Session>>,
}

struct Session {
    upstream: Peer<RoleClient>,
    agent: AgentPeer,
    _service: RunningService<RoleClient, UpstreamSide>,
    info: InitializeResult,
    run: Arc<GuardedRun>,
    tools: ToolTable,
    progress: ProgressMap,
    timeout: Duration,
}

/// What the gateway's process keeps of a session, to close its run when it ends.
#[derive(Clone)]
pub struct SessionHandle(Arc<OnceCell<Session>>);

impl SessionHandle {
    pub async fn close(&self) {
        if let Some(session) = self.0.get() {
            session.run.finish().await;
        }
    }
}

impl Gateway {
    pub fn new(settings: Arc<Settings>) -> Self {
        Gateway {
            settings,
            session: Arc::new(OnceCell::new()),
        }
    }

    pub fn handle(&self) -> SessionHandle {
        SessionHandle(self.session.clone())
    }

    fn session(&self) -> Result<&Session, McpError> {
        self.session.get().ok_or_else(|| {
            McpError::invalid_request("fusebox mcp: initialize the session first", None)
        })
    }

    async fn connect_upstream(
        &self,
        params: &InitializeRequestParams,
        agent: Peer<RoleServer>,
    ) -> Result<Session, McpError> {
        let tools: ToolTable = Arc::default();
        let progress: ProgressMap = Arc::default();
        let agent: AgentPeer = Arc::new(std::sync::RwLock::new(agent));
        let side = UpstreamSide {
            agent: agent.clone(),
            info: params.clone(),
            tools: tools.clone(),
            progress: progress.clone(),
        };
        let upstream = &self.settings.upstream;
        let failed = |what: String| {
            tracing::error!("{what}");
            McpError::internal_error(what, None)
        };
        // Starting a server (npx fetching a package, a cold interpreter) may take longer
        // than one request should.
        let start_timeout = self.settings.upstream_timeout.max(UPSTREAM_START_TIMEOUT);
        let started = match upstream {
            Upstream::Command(argv) => {
                let mut command = tokio::process::Command::new(&argv[0]);
                command.args(&argv[1..]);
                let transport = TokioChildProcess::new(command).map_err(|e| {
                    failed(format!(
                        "fusebox mcp: cannot start the upstream MCP server {upstream}: {e}"
                    ))
                })?;
                tokio::time::timeout(start_timeout, side.serve(transport)).await
            }
            Upstream::Url(url) => {
                let transport = StreamableHttpClientTransport::from_uri(url.as_str());
                tokio::time::timeout(start_timeout, side.serve(transport)).await
            }
        };
        let service = match started {
            Ok(Ok(service)) => service,
            Ok(Err(e)) => {
                return Err(failed(format!(
                    "fusebox mcp: the upstream MCP server {upstream} did not initialize: {e}"
                )))
            }
            Err(_) => {
                return Err(failed(format!(
                    "fusebox mcp: the upstream MCP server {upstream} did not answer initialize within {start_timeout:?}"
                )))
            }
        };
        let peer = service.peer().clone();
        let info = peer
            .peer_info()
            .map(|info| initialize_result(&info))
            .ok_or_else(|| {
                failed("fusebox mcp: the upstream sent no initialize result".to_owned())
            })?;
        let mut id = RunIdentity::for_session(
            &self.settings.tenant,
            self.settings.run.as_deref(),
            self.settings.agent.as_deref(),
        );
        id.parent = self.settings.parent_run.clone();
        id.root = self.settings.tree_root.clone();
        tracing::info!(
            tenant = %id.tenant,
            run = %id.run,
            upstream = %upstream,
            client = %params.client_info.name,
            "session started: `fusebox run {}/{}` shows it",
            id.tenant,
            id.run
        );
        let run = Arc::new(GuardedRun::start(self.settings.guard.clone(), id));
        run.announce().await;
        Ok(Session {
            upstream: peer,
            agent,
            _service: service,
            info,
            run,
            tools,
            progress,
            timeout: self.settings.upstream_timeout,
        })
    }
}

/// The upstream's `initialize` answer, as the agent's `initialize` answer.
fn initialize_result(info: &ServerPeerInfo) -> InitializeResult {
    let mut value = serde_json::to_value(info).expect("server info serialises");
    if let Some(object) = value.as_object_mut() {
        object.entry("serverInfo").or_insert_with(|| {
            serde_json::to_value(Implementation::default()).expect("serialises")
        });
    }
    serde_json::from_value(value).expect("a server peer info is an initialize result")
}

/// How a forwarded request failed.
fn upstream_error(error: ServiceError) -> McpError {
    match error {
        ServiceError::McpError(error) => error,
        other => McpError::internal_error(
            format!("fusebox mcp: the upstream MCP server failed: {other}"),
            None,
        ),
    }
}

fn unexpected(result: ServerResult) -> McpError {
    McpError::internal_error(
        format!("fusebox mcp: the upstream answered with an unexpected result: {result:?}"),
        None,
    )
}

impl Session {
    /// Sends `request` upstream with the agent's `_meta`, maps progress back to the
    /// agent's token, passes the agent's cancellation on, and bounds the silence.
    async fn forward(
        &self,
        request: ClientRequest,
        context: &RequestContext<RoleServer>,
    ) -> Result<ServerResult, ServiceError> {
        *self.agent.write().expect("agent lock") = context.peer.clone();
        let agent_token = context.meta.get_progress_token();
        let mut meta = context.meta.clone();
        meta.0 .0.remove("progressToken");
        let options = PeerRequestOptions::with_timeout(self.timeout)
            .with_meta(meta)
            .reset_timeout_on_progress();
        let handle = self
            .upstream
            .send_cancellable_request(request, options)
            .await?;
        let (id, token) = (handle.id.clone(), handle.progress_token.clone());
        if let Some(agent_token) = agent_token {
            self.progress
                .lock()
                .expect("progress lock")
                .insert(token.clone(), agent_token);
        }
        let result = tokio::select! {
            result = handle.await_response() => result,
            () = context.ct.cancelled() => {
                let cancelled = CancelledNotification::new(CancelledNotificationParam::new(
                    Some(id),
                    Some("cancelled by the agent".to_owned()),
                ));
                let _ = self.upstream.send_notification(cancelled.into()).await;
                Err(ServiceError::Cancelled { reason: Some("cancelled by the agent".to_owned()) })
            }
        };
        self.progress.lock().expect("progress lock").remove(&token);
        result
    }

    /// The tool as listed (annotations, output schema), listing the upstream's tools
    /// once if the agent called one before listing them itself.
    async fn listed_tool(&self, tool: &str) -> Option<Tool> {
        if let Some(table) = self.tools.lock().expect("tools lock").as_ref() {
            return table.get(tool).cloned();
        }
        match self.upstream.list_all_tools().await {
            Ok(tools) => {
                let found = tools.iter().find(|t| t.name == tool).cloned();
                record_tools(&self.tools, &tools);
                found
            }
            Err(error) => {
                tracing::warn!(%error, "cannot list the upstream's tools for their annotations");
                None
            }
        }
    }

    async fn call_tool(
        &self,
        params: CallToolRequestParams,
        context: RequestContext<RoleServer>,
        settings: &Settings,
    ) -> Result<CallToolResponse, McpError> {
        if let Some(stopped) = self.run.latched() {
            return Ok(stopped.into());
        }
        let tool = params.name.to_string();
        let tool_config = settings.config.tool(&tool);
        let listed = self.listed_tool(&tool).await;
        let annotations = listed.as_ref().and_then(|t| t.annotations.as_ref());
        let effect = mapping::effect_of(tool_config, annotations);
        let op_key = mapping::op_key_of(&tool, tool_config, params.arguments.as_ref());
        // The ledger answers a repeat of a keyed call with its result: send it whole.
        let inline_limit = match op_key {
            Some(_) => settings.config.max_stored_result_bytes,
            None => fusebox_core::event::INLINE_LIMIT,
        };
        let call_id = self.run.call_id();
        let gate = self
            .run
            .gate_call(&call_id, &tool, params.arguments.as_ref(), op_key, effect)
            .await;
        if let Some(decision) = gate.decision() {
            tracing::debug!(tool = %tool, action = decision.action.as_str(), "gate");
        }
        let note = match mapping::verdict(&gate) {
            Verdict::Forward { note } => note,
            Verdict::Answer(result) => return Ok(result.into()),
            Verdict::Stop(result) => {
                self.run.latch(result.clone());
                return Ok(result.into());
            }
        };
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
        match self.forward(request, &context).await {
            Ok(ServerResult::CallToolResult(result)) => {
                // Not waited for: a stop answered to it refuses the next call.
                let (error_kind, upstream) = (settings.config.error_kind, result.clone());
                self.run.report(move || {
                    mapping::tool_result(&call_id, &tool, &upstream, error_kind, inline_limit)
                });
                let output_schema = listed.as_ref().and_then(|t| t.output_schema.as_deref());
                Ok(mapping::with_note(result, note, output_schema).into())
            }
            Ok(ServerResult::InputRequiredResult(result)) => {
                Ok(CallToolResponse::InputRequired(result))
            }
            Ok(ServerResult::CreateTaskResult(result)) => Ok(CallToolResponse::Task(result)),
            Ok(other) => {
                let detail = format!("unexpected answer to tools/call: {other:?}");
                let failed = mapping::failed_result(&call_id, &tool, "bad_answer", &detail);
                self.run.report(move || failed);
                Err(unexpected(other))
            }
            Err(ServiceError::McpError(error)) => {
                let failed = mapping::failed_result(&call_id, &tool, "mcp_error", &error.message);
                self.run.report(move || failed);
                Err(error)
            }
            Err(ServiceError::Cancelled { reason }) => {
                let reason = reason.unwrap_or_default();
                let failed = mapping::failed_result(&call_id, &tool, "cancelled", &reason);
                self.run.report(move || failed);
                Err(McpError::internal_error(
                    format!("cancelled: {reason}"),
                    None,
                ))
            }
            Err(error) => {
                let detail = format!(
                    "fusebox mcp: the upstream MCP server {} failed during this call ({error}); \
                     whether the tool ran is unknown.",
                    settings.upstream
                );
                tracing::error!("{detail}");
                let failed =
                    mapping::failed_result(&call_id, &tool, "upstream_unavailable", &detail);
                self.run.report(move || failed);
                Ok(mapping::error_result(detail).into())
            }
        }
    }
}

fn record_tools(table: &ToolTable, tools: &[Tool]) {
    let mut guard = table.lock().expect("tools lock");
    let map = guard.get_or_insert_with(HashMap::new);
    for tool in tools {
        map.insert(tool.name.to_string(), tool.clone());
    }
}

macro_rules! forward {
    ($self:ident, $context:ident, $request:expr, $variant:ident) => {{
        let session = $self.session()?;
        match session.forward($request, &$context).await {
            Ok(ServerResult::$variant(result)) => Ok(result),
            Ok(other) => Err(unexpected(other)),
            Err(error) => Err(upstream_error(error)),
        }
    }};
}

macro_rules! forward_empty {
    ($self:ident, $context:ident, $request:expr) => {{
        let session = $self.session()?;
        match session.forward($request, &$context).await {
            Ok(ServerResult::EmptyResult(_)) => Ok(()),
            Ok(other) => Err(unexpected(other)),
            Err(error) => Err(upstream_error(error)),
        }
    }};
}

impl ServerHandler for Gateway {
    fn get_info(&self) -> ServerConfig {
        match self.session.get() {
            Some(session) => session.info.clone(),
            None => InitializeResult::new(ServerCapabilities::default()),
        }
    }

    /// After `initialize`, exactly the version the upstream agreed to, so the agent is
    /// never told a version the upstream does not speak.
    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        match self.session.get() {
            Some(session) => Cow::Owned(vec![session.info.protocol_version.clone()]),
            None => Cow::Borrowed(ProtocolVersion::KNOWN_VERSIONS),
        }
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, McpError> {
        context.peer.set_peer_info(request.clone());
        let session = self
            .session
            .get_or_try_init(|| self.connect_upstream(&request, context.peer.clone()))
            .await?;
        *session.agent.write().expect("agent lock") = context.peer.clone();
        Ok(session.info.clone())
    }

    /// `server/discover` (the 2026-07-28 lifecycle) opens the session too, with the
    /// client identity the request's `_meta` carries, and advertises only the version
    /// the upstream agreed to: an agent that speaks newer versions then falls back to
    /// the `initialize` handshake, as it would with that server directly.
    async fn discover(
        &self,
        context: RequestContext<RoleServer>,
    ) -> Result<DiscoverResult, McpError> {
        let client = InitializeRequestParams::new(
            context.meta.client_capabilities().unwrap_or_default(),
            context
                .meta
                .client_info()
                .unwrap_or_else(|| Implementation::new("fusebox-mcp", env!("CARGO_PKG_VERSION"))),
        )
        .with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE);
        let session = self
            .session
            .get_or_try_init(|| self.connect_upstream(&client, context.peer.clone()))
            .await?;
        Ok(DiscoverResult::from_server_info(
            vec![session.info.protocol_version.clone()],
            session.info.clone(),
        ))
    }

    async fn ping(&self, context: RequestContext<RoleServer>) -> Result<(), McpError> {
        forward_empty!(
            self,
            context,
            ClientRequest::PingRequest(PingRequest::default())
        )
    }

    async fn complete(
        &self,
        request: CompleteRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, McpError> {
        forward!(
            self,
            context,
            ClientRequest::CompleteRequest(CompleteRequest::new(request)),
            CompleteResult
        )
    }

    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        forward_empty!(
            self,
            context,
            ClientRequest::SetLevelRequest(SetLevelRequest::new(request))
        )
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, McpError> {
        let session = self.session()?;
        let request = ClientRequest::GetPromptRequest(GetPromptRequest::new(request));
        match session.forward(request, &context).await {
            Ok(ServerResult::GetPromptResult(result)) => Ok(GetPromptResponse::Complete(result)),
            Ok(ServerResult::InputRequiredResult(result)) => {
                Ok(GetPromptResponse::InputRequired(result))
            }
            Ok(other) => Err(unexpected(other)),
            Err(error) => Err(upstream_error(error)),
        }
    }

    async fn list_prompts(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, McpError> {
        let list = ListPromptsRequest {
            params: request,
            ..Default::default()
        };
        forward!(
            self,
            context,
            ClientRequest::ListPromptsRequest(list),
            ListPromptsResult
        )
    }

    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        let list = ListResourcesRequest {
            params: request,
            ..Default::default()
        };
        forward!(
            self,
            context,
            ClientRequest::ListResourcesRequest(list),
            ListResourcesResult
        )
    }

    async fn list_resource_templates(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        let list = ListResourceTemplatesRequest {
            params: request,
            ..Default::default()
        };
        forward!(
            self,
            context,
            ClientRequest::ListResourceTemplatesRequest(list),
            ListResourceTemplatesResult
        )
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let session = self.session()?;
        let request = ClientRequest::ReadResourceRequest(ReadResourceRequest::new(request));
        match session.forward(request, &context).await {
            Ok(ServerResult::ReadResourceResult(result)) => {
                Ok(ReadResourceResponse::Complete(result))
            }
            Ok(ServerResult::InputRequiredResult(result)) => {
                Ok(ReadResourceResponse::InputRequired(result))
            }
            Ok(other) => Err(unexpected(other)),
            Err(error) => Err(upstream_error(error)),
        }
    }

    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        forward_empty!(
            self,
            context,
            ClientRequest::SubscribeRequest(SubscribeRequest::new(request))
        )
    }

    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        forward_empty!(
            self,
            context,
            ClientRequest::UnsubscribeRequest(UnsubscribeRequest::new(request))
        )
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        self.session()?
            .call_tool(request, context, &self.settings)
            .await
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let list = ListToolsRequest {
            params: request,
            ..Default::default()
        };
        let result: Result<ListToolsResult, McpError> = forward!(
            self,
            context,
            ClientRequest::ListToolsRequest(list),
            ListToolsResult
        );
        if let Ok(listed) = &result {
            record_tools(&self.session()?.tools, &listed.tools);
        }
        result
    }

    async fn on_custom_request(
        &self,
        request: CustomRequest,
        context: RequestContext<RoleServer>,
    ) -> Result<CustomResult, McpError> {
        forward!(
            self,
            context,
            ClientRequest::CustomRequest(request),
            CustomResult
        )
    }

    async fn on_progress(
        &self,
        notification: ProgressNotificationParam,
        _context: NotificationContext<RoleServer>,
    ) {
        self.notify(ClientNotification::ProgressNotification(
            ProgressNotification::new(notification),
        ))
        .await;
    }

    async fn on_roots_list_changed(&self, _context: NotificationContext<RoleServer>) {
        self.notify(ClientNotification::RootsListChangedNotification(
            RootsListChangedNotification::default(),
        ))
        .await;
    }

    async fn on_custom_notification(
        &self,
        notification: CustomNotification,
        _context: NotificationContext<RoleServer>,
    ) {
        self.notify(ClientNotification::CustomNotification(notification))
            .await;
    }
}

impl Gateway {
    /// An agent notification, on to the upstream. (`initialized` is the SDK's to send
    /// and `cancelled` travels with the request it cancels.)
    async fn notify(&self, notification: ClientNotification) {
        let Some(session) = self.session.get() else {
            return;
        };
        if let Err(error) = session.upstream.send_notification(notification).await {
            tracing::warn!(%error, "notification not forwarded upstream");
        }
    }
}

/// The client side of a session: what the upstream asks of the agent (sampling, roots,
/// elicitation) and tells it (progress, logs, list changes) goes on to the agent.
pub struct UpstreamSide {
    agent: AgentPeer,
    info: InitializeRequestParams,
    tools: ToolTable,
    progress: ProgressMap,
}

impl Service<RoleClient> for UpstreamSide {
    async fn handle_request(
        &self,
        mut request: ServerRequest,
        context: RequestContext<RoleClient>,
    ) -> Result<ClientResult, McpError> {
        if matches!(request, ServerRequest::PingRequest(_)) {
            return Ok(ClientResult::empty(()));
        }
        let mut meta = context.meta;
        meta.0 .0.remove("progressToken");
        request.get_meta_mut().extend(meta);
        let agent = self.agent.read().expect("agent lock").clone();
        agent.send_request(request).await.map_err(upstream_error)
    }

    async fn handle_notification(
        &self,
        mut notification: ServerNotification,
        context: NotificationContext<RoleClient>,
    ) -> Result<(), McpError> {
        match &mut notification {
            ServerNotification::ProgressNotification(progress) => {
                let mapped = self
                    .progress
                    .lock()
                    .expect("progress lock")
                    .get(&progress.params.progress_token)
                    .cloned();
                match mapped {
                    Some(token) => progress.params.progress_token = token,
                    // The agent asked for no progress on this request (or it is over).
                    None => return Ok(()),
                }
            }
            // Cancellations of requests the upstream sent the agent carry the upstream's
            // request ids, which the agent never saw.
            ServerNotification::CancelledNotification(_) => return Ok(()),
            ServerNotification::ToolListChangedNotification(_) => {
                *self.tools.lock().expect("tools lock") = None;
            }
            _ => {}
        }
        notification.get_meta_mut().extend(context.meta);
        let agent = self.agent.read().expect("agent lock").clone();
        if let Err(error) = agent.send_notification(notification).await {
            tracing::warn!(%error, "notification not forwarded to the agent");
        }
        Ok(())
    }

    fn get_info(&self) -> ClientConfig {
        self.info.clone()
    }
}
