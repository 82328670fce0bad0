//! Live updates over server-sent events. A page's stream wakes on a notable decision
//! (`fusebox.decisions.>`, the same feed as `fusebox tail`) or, failing one, every
//! `refresh` (new runs and plain steps publish nothing), asks fuseboxd again, renders
//! the page's live part and sends it only when it changed. The page's script swaps it
//! in; nothing is rendered in the browser.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::Stream;
use tokio::sync::broadcast;

use crate::app::{
    bad_query, fetch_run, render_run, run_id, runs_markup, watchdog_markup, RunParams, Shared,
};
use crate::runs_view::RunsParams;

/// Which decisions wake a stream.
#[derive(Clone)]
enum Watch {
    Any,
    Run(String, String),
    /// None: the stream wakes on its period alone.
    Nothing,
}

/// The watchdog page asks the cloud (DescribeInstances per region) each time: its
/// period is at least this, whatever `--refresh-ms` says.
const WATCHDOG_REFRESH_MIN: Duration = Duration::from_secs(2);

/// Decisions that arrive together are answered with one render.
const SETTLE: Duration = Duration::from_millis(100);

async fn wake(
    decisions: &mut broadcast::Receiver<(String, String)>,
    watch: &Watch,
    refresh: Duration,
) {
    let deadline = tokio::time::Instant::now() + refresh;
    loop {
        match tokio::time::timeout_at(deadline, decisions.recv()).await {
            Err(_) => return,
            Ok(Ok((tenant, run))) => {
                let ours = match watch {
                    Watch::Any => true,
                    Watch::Run(t, r) => *t == tenant && *r == run,
                    Watch::Nothing => false,
                };
                if ours {
                    tokio::time::sleep(SETTLE).await;
                    while decisions.try_recv().is_ok() {}
                    return;
                }
            }
            // Missed some: render now rather than guess which.
            Ok(Err(broadcast::error::RecvError::Lagged(_))) => return,
            Ok(Err(broadcast::error::RecvError::Closed)) => {
                tokio::time::sleep_until(deadline).await;
                return;
            }
        }
    }
}

fn stream<F, Fut>(
    ui: Shared,
    watch: Watch,
    refresh: Duration,
    first: String,
    render: F,
) -> impl Stream<Item = Result<Event, Infallible>>
where
    F: Fn(Shared) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Option<String>> + Send,
{
    let decisions = ui.decisions.subscribe();
    futures_util::stream::unfold(
        (ui, decisions, first, render),
        move |(ui, mut decisions, mut last, render)| {
            let watch = watch.clone();
            async move {
                loop {
                    wake(&mut decisions, &watch, refresh).await;
                    // fuseboxd unreachable for a moment: keep what is shown, try again.
                    let Some(html) = render(ui.clone()).await else {
                        continue;
                    };
                    if html != last {
                        last = html.clone();
                        let event = Event::default().event("update").data(html);
                        return Some((Ok(event), (ui, decisions, last, render)));
                    }
                }
            }
        },
    )
}

/// `/live/runs?…`: the runs page's counts, table and pager.
pub async fn runs(
    State(ui): State<Shared>,
    params: Result<Query<RunsParams>, QueryRejection>,
) -> Response {
    let params = match params {
        Ok(Query(params)) => params.normalised(),
        Err(err) => return bad_query(err),
    };
    let first = match runs_markup(&ui, &params, false).await {
        Ok(html) => html,
        Err(response) => return response,
    };
    let render = move |ui: Shared| {
        let params = params.clone();
        async move { runs_markup(&ui, &params, false).await.ok() }
    };
    Sse::new(stream(ui.clone(), Watch::Any, ui.refresh, first, render))
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// `/live/runs/<tenant>/<run>`: everything of one run's page.
pub async fn run(
    State(ui): State<Shared>,
    Path((tenant, run)): Path<(String, String)>,
    params: Result<Query<RunParams>, QueryRejection>,
) -> Response {
    let params = match params {
        Ok(Query(params)) => params,
        Err(err) => return bad_query(err),
    };
    let (tenant, run) = match run_id(&tenant, &run) {
        Ok(ids) => ids,
        Err(not_a_run) => return not_a_run.into_response(),
    };
    let after = params.after;
    let first = match fetch_run(&ui, &tenant, &run, after).await {
        Ok(data) => render_run(&tenant, &run, after, &data, false),
        Err(response) => return response,
    };
    let watch = Watch::Run(tenant.clone(), run.clone());
    let render = move |ui: Shared| {
        let (tenant, run) = (tenant.clone(), run.clone());
        async move {
            let data = fetch_run(&ui, &tenant, &run, after).await.ok()?;
            Some(render_run(&tenant, &run, after, &data, false))
        }
    };
    Sse::new(stream(ui.clone(), watch, ui.refresh, first, render))
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// `/live/watchdog`: the held instances and the recent terminations.
pub async fn watchdog(State(ui): State<Shared>) -> Response {
    let first = match watchdog_markup(&ui, false).await {
        Ok(html) => html,
        Err(response) => return response,
    };
    let render = |ui: Shared| async move { watchdog_markup(&ui, false).await.ok() };
    let refresh = ui.refresh.max(WATCHDOG_REFRESH_MIN);
    Sse::new(stream(ui.clone(), Watch::Nothing, refresh, first, render))
        .keep_alive(KeepAlive::default())
        .into_response()
}
