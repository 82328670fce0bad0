//! The HTTP side: routes, the access check, and the handlers, each of which asks
//! fuseboxd (through fusebox-client, as the CLI does) and renders what it was told.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::{FormRejection, QueryRejection};
use axum::extract::{Path, Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Form, Router};
use fusebox_client::{
    parse_run_ref, ClientError, FuseboxClient, LedgerItem, LedgerQuery, Resolve, TreeView,
};
use fusebox_core::parse::MAX_ID_LEN;
use fusebox_nats::wire::{HistoryEntry, HistoryQuery, RunHistory, RunStatusReply};
use maud::html;
use serde::Deserialize;
use serde_json::Value;
use tokio::sync::broadcast;

use crate::access::{Access, Caller};
use crate::layout::problem;
use crate::run_view::{run_live, run_page, RunPage};
use crate::runs_view::{runs_live, runs_page, RunsParams};
use crate::watchdog_view::{watchdog_live, watchdog_page, KnownRuns};
use crate::{actions_view, live};

pub struct Ui {
    pub client: FuseboxClient,
    pub access: Access,
    /// `by` for callers without a user name of their own (loopback, bearer token).
    pub default_by: String,
    /// The secret behind the forms' CSRF tokens ([`Ui::form_token`]): a POST without a
    /// valid, recent token is refused (another site's form cannot act with the
    /// operator's browser credentials).
    pub csrf: String,
    /// A notable decision of some run arrived: `(tenant, run)`.
    pub decisions: broadcast::Sender<(String, String)>,
    /// How often a live page asks again when no decision arrived (new runs, steps).
    pub refresh: Duration,
    /// The Content-Security-Policy: no script runs but the page's own.
    pub csp: HeaderValue,
}

pub type Shared = Arc<Ui>;

pub fn router(ui: Shared) -> Router {
    let run = "/runs/{tenant}/{run}";
    Router::new()
        .route("/", get(runs))
        .route("/live/runs", get(live::runs))
        .route("/watchdog", get(watchdog))
        .route("/live/watchdog", get(live::watchdog))
        .route(run, get(one_run))
        .route(&format!("/live{run}"), get(live::run))
        .route(&format!("{run}/cancel"), get(cancel_form).post(cancel))
        .route(&format!("{run}/resume"), get(resume_form).post(resume))
        .route(&format!("{run}/resolve"), get(resolve_form).post(resolve))
        .route(&format!("{run}/history.json"), get(export))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(ui.clone(), admit))
        .with_state(ui)
}

/// The access check and the headers every answer gets.
async fn admit(State(ui): State<Shared>, mut request: Request, next: Next) -> Response {
    let authorization = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let mut response = match ui.access.admit(authorization) {
        Some(caller) => {
            request.extensions_mut().insert(caller);
            next.run(request).await
        }
        None => {
            let mut refused = (
                StatusCode::UNAUTHORIZED,
                Html(
                    problem(
                        "Credentials needed",
                        "This page needs the credentials of the config's [ui] section.",
                    )
                    .into_string(),
                ),
            )
                .into_response();
            if matches!(&ui.access, Access::Required { basic: Some(_), .. }) {
                refused.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Basic realm=\"fusebox\", charset=\"UTF-8\""),
                );
            }
            refused
        }
    };
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_SECURITY_POLICY, ui.csp.clone());
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// How long a form's token is accepted: a confirmation page left open over a shift
/// still works, a token copied out of an old page does not.
const TOKEN_LIFETIME_S: u64 = 12 * 3600;

impl Ui {
    fn by(&self, caller: &Caller) -> String {
        match caller {
            Caller::User(user) => user.clone(),
            Caller::Local | Caller::Token => self.default_by.clone(),
        }
    }

    fn token_mac(&self, issued_s: u64) -> String {
        use base64::Engine as _;
        use sha2::Digest as _;
        let mac = sha2::Sha256::digest(format!("{}.{issued_s}", self.csrf));
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&mac[..18])
    }

    /// A fresh token for a form: when it was issued, and a MAC of that under the
    /// process's secret. Each page gets its own, and each expires.
    pub fn form_token(&self) -> String {
        let now = crate::runs_view::now() / 1000;
        format!("{now}.{}", self.token_mac(now))
    }

    /// A token this process issued less than [`TOKEN_LIFETIME_S`] ago.
    fn token_ok(&self, token: &str) -> bool {
        let Some((issued, mac)) = token.split_once('.') else {
            return false;
        };
        let Ok(issued_s) = issued.parse::<u64>() else {
            return false;
        };
        let now = crate::runs_view::now() / 1000;
        let expected = self.token_mac(issued_s);
        // Compared in full whatever differs first: the time taken says nothing.
        let same = expected.len() == mac.len()
            && expected
                .bytes()
                .zip(mac.bytes())
                .fold(0u8, |d, (a, b)| d | (a ^ b))
                == 0;
        same && issued_s <= now + 60 && now - issued_s.min(now) <= TOKEN_LIFETIME_S
    }
}

/// Whether a POST comes from this page. A browser says where a request comes from in
/// `Sec-Fetch-Site` (anything but `same-origin`, or `none` for one a person made, is
/// another site: a same-site neighbour on another port included) and in `Origin` (sent
/// as `null` under this page's `no-referrer` policy, so a named origin must be this
/// host). A request with neither (curl, a script) is judged by its token alone.
fn same_origin(headers: &HeaderMap) -> bool {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if text("sec-fetch-site").is_some_and(|site| site != "same-origin" && site != "none") {
        return false;
    }
    match (text("origin"), text("host")) {
        (None | Some("null"), _) => true,
        (Some(origin), Some(host)) => origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"))
            .is_some_and(|authority| authority.eq_ignore_ascii_case(host)),
        (Some(_), None) => false,
    }
}

/// The checks every action's POST passes before fuseboxd is asked: the form parsed,
/// sent from this page, with a token this process issued.
fn checked<T>(
    ui: &Ui,
    headers: &HeaderMap,
    form: Result<Form<T>, FormRejection>,
) -> Result<T, Box<Response>>
where
    T: HasToken,
{
    if !same_origin(headers) {
        return Err(Box::new(page_response(
            StatusCode::FORBIDDEN,
            problem(
                "Not sent from this page",
                "The request came from another site (its Origin is not this page's): nothing was done.",
            ),
        )));
    }
    let Form(form) = form.map_err(|err| {
        Box::new(bad_input(&format!(
            "The form could not be read ({}): reload the page and try again.",
            err.body_text()
        )))
    })?;
    if !ui.token_ok(form.token()) {
        return Err(Box::new(forged()));
    }
    Ok(form)
}

trait HasToken {
    fn token(&self) -> &str;
}

pub fn page_response(code: StatusCode, markup: maud::Markup) -> Response {
    (code, Html(markup.into_string())).into_response()
}

async fn not_found() -> Response {
    page_response(
        StatusCode::NOT_FOUND,
        problem("Not found", "There is no such page."),
    )
}

/// What went wrong asking fuseboxd, as a page.
pub fn trouble(err: &ClientError) -> Response {
    let code = match err {
        ClientError::Refused(e) if e.reason == "unknown_run" => StatusCode::NOT_FOUND,
        ClientError::PermissionDenied { .. } => StatusCode::FORBIDDEN,
        ClientError::Timeout { .. } => StatusCode::GATEWAY_TIMEOUT,
        _ => StatusCode::BAD_GATEWAY,
    };
    let title = if code == StatusCode::NOT_FOUND {
        "Unknown run"
    } else {
        "fuseboxd did not answer"
    };
    page_response(code, problem(title, &err.to_string()))
}

/// The page of runs for `params`, or the page that says why not.
pub async fn runs_markup(ui: &Ui, params: &RunsParams, whole: bool) -> Result<String, Response> {
    let query = params
        .query(crate::runs_view::now())
        .map_err(|e| page_response(StatusCode::BAD_REQUEST, problem("Bad filter", &e)))?;
    let view = ui.client.runs_page(&query).await.map_err(|e| trouble(&e))?;
    let markup = if whole {
        runs_page(params, &view.page, &view.unanswered)
    } else {
        runs_live(params, &view.page, &view.unanswered)
    };
    Ok(markup.into_string())
}

/// A query string that does not parse, as a page (not the framework's plain text).
pub fn bad_query(err: QueryRejection) -> Response {
    bad_input(&format!(
        "The address's query could not be read: {}",
        err.body_text()
    ))
}

async fn runs(
    State(ui): State<Shared>,
    params: Result<Query<RunsParams>, QueryRejection>,
) -> Response {
    let Query(params) = match params {
        Ok(params) => params,
        Err(err) => return bad_query(err),
    };
    match runs_markup(&ui, &params.normalised(), true).await {
        Ok(html) => Html(html).into_response(),
        Err(response) => response,
    }
}

/// The watchdog page (or its live part), or the page that says why not.
pub async fn watchdog_markup(ui: &Ui, whole: bool) -> Result<String, Response> {
    let status = ui.client.watchdog_first().await.map_err(|e| trouble(&e))?;
    let known = known_runs(ui, &status).await;
    let markup = if whole {
        watchdog_page(&status, &known)
    } else {
        watchdog_live(&status, &known)
    };
    Ok(markup.into_string())
}

async fn watchdog(State(ui): State<Shared>) -> Response {
    match watchdog_markup(&ui, true).await {
        Ok(html) => Html(html).into_response(),
        Err(response) => response,
    }
}

/// Owners asked about at most, per watchdog page: beyond them a tag is shown unlinked.
const OWNERS_ASKED: usize = 100;

/// Which of the runs the instances' tags name fuseboxd knows (asked together; a run it
/// does not know, or that could not be asked, is not linked).
async fn known_runs(ui: &Ui, status: &fusebox_nats::wire::WatchdogReply) -> KnownRuns {
    let owners: KnownRuns = status
        .instances
        .iter()
        .map(|i| (&i.tenant, &i.run))
        .chain(status.terminations.iter().map(|t| (&t.tenant, &t.run)))
        .filter_map(|(t, r)| Some((t.clone()?, r.clone()?)))
        .filter(|(t, r)| run_id(t, r).is_ok())
        .take(OWNERS_ASKED)
        .collect();
    let asked = owners.into_iter().map(|(tenant, run)| async move {
        let known = ui.client.run_status(&tenant, &run).await.is_ok();
        known.then_some((tenant, run))
    });
    futures_util::future::join_all(asked)
        .await
        .into_iter()
        .flatten()
        .collect()
}

/// A tenant and run id that can be a run (the subjects' character set): anything else is
/// no run at all, and never reaches a subject.
pub fn run_id(tenant: &str, run: &str) -> Result<(String, String), NotARun> {
    // Longer than any id the daemon accepts: no run, and no question to ask it.
    if tenant.len() > MAX_ID_LEN || run.len() > MAX_ID_LEN {
        return Err(NotARun(format!(
            "an id of {} characters (ids have at most {MAX_ID_LEN})",
            tenant.len().max(run.len())
        )));
    }
    parse_run_ref(&format!("{tenant}/{run}")).map_err(|_| NotARun(format!("{tenant}/{run}")))
}

/// A path that names no possible run: its 404 page.
pub struct NotARun(String);

impl IntoResponse for NotARun {
    fn into_response(self) -> Response {
        page_response(
            StatusCode::NOT_FOUND,
            problem("Unknown run", &format!("{} is not a run id", self.0)),
        )
    }
}

#[derive(Debug, Default, Deserialize)]
pub struct RunParams {
    pub after: Option<u64>,
}

/// What one run's page shows.
pub struct RunData {
    pub status: RunStatusReply,
    pub history: RunHistory,
    pub ledger: Vec<LedgerItem>,
    /// The run's tree of runs, when it is in one (a parent, or runs started below it).
    pub tree: Option<TreeView>,
}

pub async fn fetch_run(
    ui: &Ui,
    tenant: &str,
    run: &str,
    after: Option<u64>,
) -> Result<RunData, Response> {
    let status = ui
        .client
        .run_status(tenant, run)
        .await
        .map_err(|e| trouble(&e))?;
    let history = ui
        .client
        .history(tenant, run, &HistoryQuery { after, limit: None })
        .await
        .map_err(|e| trouble(&e))?;
    let ledger = ui
        .client
        .ledger(&LedgerQuery {
            tenant: Some(tenant.to_owned()),
            run: Some(run.to_owned()),
            ..LedgerQuery::default()
        })
        .await
        .map_err(|e| trouble(&e))?;
    let root = status
        .tree
        .as_ref()
        .filter(|t| t.parent.is_some() || t.spawned > 0)
        .map(|t| t.root.clone());
    let tree = match root {
        Some(root) => Some(
            ui.client
                .run_tree(tenant, &root)
                .await
                .map_err(|e| trouble(&e))?,
        ),
        None => None,
    };
    Ok(RunData {
        status,
        history,
        ledger: ledger.entries.into_iter().map(|(_, item)| item).collect(),
        tree,
    })
}

pub fn render_run(
    tenant: &str,
    run: &str,
    after: Option<u64>,
    data: &RunData,
    whole: bool,
) -> String {
    let view = RunPage {
        tenant,
        run,
        status: &data.status,
        history: &data.history,
        after,
        ledger: &data.ledger,
        tree: data.tree.as_ref(),
    };
    if whole {
        run_page(&view)
    } else {
        run_live(&view)
    }
    .into_string()
}

async fn one_run(
    State(ui): State<Shared>,
    Path((tenant, run)): Path<(String, String)>,
    params: Result<Query<RunParams>, QueryRejection>,
) -> Response {
    let Query(params) = match params {
        Ok(params) => params,
        Err(err) => return bad_query(err),
    };
    let (tenant, run) = match run_id(&tenant, &run) {
        Ok(ids) => ids,
        Err(not_a_run) => return not_a_run.into_response(),
    };
    match fetch_run(&ui, &tenant, &run, params.after).await {
        Ok(data) => Html(render_run(&tenant, &run, params.after, &data, true)).into_response(),
        Err(response) => response,
    }
}

/// Entries an export holds at most: 100 pages of the history.
const EXPORT_LIMIT: usize = 100 * fusebox_nats::wire::HISTORY_LIMIT;

/// `…/history.json`: the run's status and its whole timeline (every event with its
/// decision, in applied order) as one JSON file, to keep or attach to an incident.
async fn export(State(ui): State<Shared>, Path((tenant, run)): Path<(String, String)>) -> Response {
    let (tenant, run) = match run_id(&tenant, &run) {
        Ok(ids) => ids,
        Err(not_a_run) => return not_a_run.into_response(),
    };
    let status = match ui.client.run_status(&tenant, &run).await {
        Ok(status) => status,
        Err(err) => return trouble(&err),
    };
    let mut events: Vec<HistoryEntry> = Vec::new();
    let mut after = None;
    let truncated = loop {
        let page = match ui
            .client
            .history(&tenant, &run, &HistoryQuery { after, limit: None })
            .await
        {
            Ok(page) => page,
            Err(err) => return trouble(&err),
        };
        after = page.entries.last().map(|e| e.position);
        events.extend(page.entries);
        if !page.more || after.is_none() {
            break false;
        }
        if events.len() >= EXPORT_LIMIT {
            break true;
        }
    };
    let body = serde_json::json!({
        "tenant": tenant,
        "run": run,
        "status": status,
        "events": events,
        "truncated": truncated,
    });
    let disposition = format!("attachment; filename=\"{tenant}-{run}.history.json\"");
    (
        StatusCode::OK,
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            ),
            (
                header::CONTENT_DISPOSITION,
                HeaderValue::from_str(&disposition)
                    .unwrap_or(HeaderValue::from_static("attachment")),
            ),
        ],
        serde_json::to_vec_pretty(&body).unwrap_or_default(),
    )
        .into_response()
}

fn forged() -> Response {
    page_response(
        StatusCode::FORBIDDEN,
        problem(
            "Not sent from this page",
            "The form's token does not match: reload the page and try again.",
        ),
    )
}

async fn cancel_form(
    State(ui): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path((tenant, run)): Path<(String, String)>,
) -> Response {
    let (tenant, run) = match run_id(&tenant, &run) {
        Ok(ids) => ids,
        Err(not_a_run) => return not_a_run.into_response(),
    };
    let status = match ui.client.run_status(&tenant, &run).await {
        Ok(status) => status,
        Err(err) => return trouble(&err),
    };
    let open_below = status.tree.map_or(0, |t| t.open_below);
    page_response(
        StatusCode::OK,
        actions_view::confirm_cancel(&tenant, &run, open_below, &ui.form_token(), &ui.by(&caller)),
    )
}

#[derive(Debug, Deserialize)]
struct CancelForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    reason: String,
}

async fn cancel(
    State(ui): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path((tenant, run)): Path<(String, String)>,
    headers: HeaderMap,
    form: Result<Form<CancelForm>, FormRejection>,
) -> Response {
    let (tenant, run) = match run_id(&tenant, &run) {
        Ok(ids) => ids,
        Err(not_a_run) => return not_a_run.into_response(),
    };
    let form = match checked(&ui, &headers, form) {
        Ok(form) => form,
        Err(refused) => return *refused,
    };
    let reason = Some(form.reason.trim()).filter(|r| !r.is_empty());
    let by = ui.by(&caller);
    let outcome = ui
        .client
        .cancel_subtree(&tenant, &run, Some(&by), reason)
        .await;
    let below = outcome.as_ref().ok().and_then(|c| c.open_below);
    let outcome = outcome.map(|c| c.decision);
    let (code, markup) = actions_view::answer(
        "Cancel",
        &tenant,
        &run,
        &outcome,
        &actions_view::stopped_below(below),
    );
    page_response(code, markup)
}

async fn resume_form(
    State(ui): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path((tenant, run)): Path<(String, String)>,
) -> Response {
    let (tenant, run) = match run_id(&tenant, &run) {
        Ok(ids) => ids,
        Err(not_a_run) => return not_a_run.into_response(),
    };
    let status = match ui.client.run_status(&tenant, &run).await {
        Ok(status) => status,
        Err(err) => return trouble(&err),
    };
    match &status.report {
        Some(report) => page_response(
            StatusCode::OK,
            actions_view::confirm_resume(&tenant, &run, report, &ui.form_token(), &ui.by(&caller)),
        ),
        None => page_response(
            StatusCode::CONFLICT,
            problem(
                "Nothing to resume",
                &format!("{tenant}/{run} is open: it was not stopped"),
            ),
        ),
    }
}

#[derive(Debug, Deserialize)]
struct ResumeForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    evidence: String,
}

fn bad_input(message: &str) -> Response {
    page_response(StatusCode::BAD_REQUEST, problem("Bad input", message))
}

async fn resume(
    State(ui): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path((tenant, run)): Path<(String, String)>,
    headers: HeaderMap,
    form: Result<Form<ResumeForm>, FormRejection>,
) -> Response {
    let (tenant, run) = match run_id(&tenant, &run) {
        Ok(ids) => ids,
        Err(not_a_run) => return not_a_run.into_response(),
    };
    let form = match checked(&ui, &headers, form) {
        Ok(form) => form,
        Err(refused) => return *refused,
    };
    let evidence: Value = match serde_json::from_str(&form.evidence) {
        Ok(value @ Value::Object(_)) => value,
        Ok(_) => {
            return bad_input("The evidence must be a JSON object, e.g. {\"progress_version\": 7}.")
        }
        Err(err) => return bad_input(&format!("The evidence is not JSON: {err}")),
    };
    let by = ui.by(&caller);
    let outcome = ui.client.resume(&tenant, &run, Some(&by), evidence).await;
    let (code, markup) = actions_view::answer("Resume", &tenant, &run, &outcome, &html! {});
    page_response(code, markup)
}

#[derive(Debug, Deserialize)]
struct OpKeyParams {
    #[serde(default)]
    op_key: String,
}

async fn resolve_form(
    State(ui): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path((tenant, run)): Path<(String, String)>,
    params: Result<Query<OpKeyParams>, QueryRejection>,
) -> Response {
    let (tenant, run) = match run_id(&tenant, &run) {
        Ok(ids) => ids,
        Err(not_a_run) => return not_a_run.into_response(),
    };
    let params = match params {
        Ok(Query(params)) if !params.op_key.trim().is_empty() => params,
        Ok(_) => return bad_input("Which op_key? The address names none (?op_key=…)."),
        Err(err) => return bad_query(err),
    };
    page_response(
        StatusCode::OK,
        actions_view::confirm_resolve(
            &tenant,
            &run,
            &params.op_key,
            &ui.form_token(),
            &ui.by(&caller),
        ),
    )
}

#[derive(Debug, Deserialize)]
struct ResolveForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    op_key: String,
    #[serde(default)]
    resolution: String,
    #[serde(default)]
    output: String,
    #[serde(default)]
    reason: String,
}

async fn resolve(
    State(ui): State<Shared>,
    Extension(caller): Extension<Caller>,
    Path((tenant, run)): Path<(String, String)>,
    headers: HeaderMap,
    form: Result<Form<ResolveForm>, FormRejection>,
) -> Response {
    let (tenant, run) = match run_id(&tenant, &run) {
        Ok(ids) => ids,
        Err(not_a_run) => return not_a_run.into_response(),
    };
    let form = match checked(&ui, &headers, form) {
        Ok(form) => form,
        Err(refused) => return *refused,
    };
    let resolution = match form.resolution.as_str() {
        "completed" => match serde_json::from_str(&form.output) {
            Ok(output) => Resolve::Completed { output },
            Err(err) => return bad_input(&format!("The result is not JSON: {err}")),
        },
        "released" => Resolve::Released,
        other => return bad_input(&format!("{other:?}: choose completed or released")),
    };
    let reason = Some(form.reason.trim()).filter(|r| !r.is_empty());
    let by = ui.by(&caller);
    let outcome = ui
        .client
        .resolve(&tenant, &run, &form.op_key, resolution, Some(&by), reason)
        .await;
    let (code, markup) = actions_view::answer("Resolve", &tenant, &run, &outcome, &html! {});
    page_response(code, markup)
}

impl HasToken for CancelForm {
    fn token(&self) -> &str {
        &self.csrf
    }
}

impl HasToken for ResumeForm {
    fn token(&self) -> &str {
        &self.csrf
    }
}

impl HasToken for ResolveForm {
    fn token(&self) -> &str {
        &self.csrf
    }
}
