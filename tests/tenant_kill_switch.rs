//! The kill switch under the deploy's permissions (issue 17 part 4): a tenant's worker,
//! connected as its tenant user of deploy/nats/accounts.conf, learns a stop kept from
//! before it started — through fusebox-client's own paths (`kept_stop`, `watch_stop`,
//! the run handle's check before its first call) — and can neither read nor forge
//! another tenant's stops, decisions or ledger entries.

use std::time::Duration;

use async_nats::jetstream;
use fusebox_client::{ClientError, Gate, RunOptions};
use fusebox_core::Action;
use fusebox_e2e::deploy_nats::{connect, expect_error, expect_no_error};
use fusebox_e2e::SecuredStack;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(10);
const SHORT: Duration = Duration::from_millis(300);
const ERROR_WAIT: Duration = Duration::from_secs(3);

/// What a worker sees of its run's kill switch, polled until `want` (the stop publisher
/// updates FUSEBOX_STOPS right after the commit, so it lags the operator's answer).
async fn kept_until(
    client: &fusebox_client::FuseboxClient,
    tenant: &str,
    run: &str,
    want: bool,
) -> Option<fusebox_core::Decision> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let kept = client
            .kept_stop(tenant, run)
            .await
            .unwrap_or_else(|e| panic!("{tenant}/{run}: kept stop lookup failed: {e}"));
        if kept.is_some() == want || tokio::time::Instant::now() > deadline {
            return kept;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_worker_learns_a_kept_stop_and_cannot_touch_another_tenants() {
    let stack = SecuredStack::start().await;
    let operator = stack.client("operator", Duration::from_secs(5)).await;
    let acme = stack.client("tenant-acme", Duration::from_secs(5)).await;

    // A run of acme's, started through the run handle: its check finds no stop.
    assert_eq!(acme.kept_stop("acme", "r1").await.unwrap(), None);
    let run = acme
        .start_run("acme", "r1", RunOptions::default())
        .await
        .expect("tenant-acme starts a run");
    let (_, gate) = run.call("search", json!({"q": "x"})).await;
    assert!(gate.may_run(), "{gate:?}");

    // The operator cancels it; the worker that is running sees it live.
    let cancelled = operator
        .cancel("acme", "r1", Some("ops"), Some("runaway"))
        .await
        .expect("operator cancels");
    assert_eq!(cancelled.action, Action::Stop);
    let live = tokio::time::timeout(WAIT, run.wait_stopped())
        .await
        .expect("the running worker learns the stop");
    assert_eq!(live.event_id, cancelled.event_id);
    drop(run);

    // A worker that starts only now, as the same tenant user: the stop kept on
    // FUSEBOX_STOPS reaches it through each client path.
    let late = stack.client("tenant-acme", Duration::from_secs(5)).await;
    let kept = kept_until(&late, "acme", "r1", true)
        .await
        .expect("the kept stop is readable by its tenant");
    assert_eq!(kept, cancelled);
    let mut watch = late
        .watch_stop("acme", "r1")
        .await
        .expect("watch as tenant");
    let first = tokio::time::timeout(SHORT, watch.next())
        .await
        .expect("the kept stop comes first, at once")
        .expect("open")
        .expect("a decision");
    assert_eq!(first.event_id, cancelled.event_id);
    let restarted = late
        .start_run("acme", "r1", RunOptions::default())
        .await
        .expect("the handle starts even for a stopped run");
    let stop = restarted
        .stopped()
        .expect("known stopped before its first call");
    assert_eq!(
        stop.report.as_ref().unwrap().terminal_state.as_str(),
        "CANCELLED"
    );
    let (call_id, refused) = restarted.call("search", json!({"q": "x"})).await;
    match &refused {
        Gate::Decided(d) => {
            assert_eq!(d.action, Action::Stop);
            assert_eq!(d.call_id.as_deref(), Some(call_id.as_str()));
        }
        other => panic!("refused with the run's stop, got {other:?}"),
    }

    // Resumed with evidence: the kept stop is cleared, the lookup says "no stop".
    let resumed = operator
        .resume("acme", "r1", Some("ops"), json!({"approval_id": "CHG-1"}))
        .await
        .expect("operator resumes");
    assert_eq!(resumed.action, Action::Continue, "{resumed:?}");
    assert_eq!(kept_until(&late, "acme", "r1", false).await, None);

    // Another tenant, through the same client paths: refused by the server, told so.
    let globex = stack.client("tenant-globex", Duration::from_secs(1)).await;
    operator
        .cancel("acme", "r2", Some("ops"), None)
        .await
        .expect("operator cancels acme/r2");
    assert!(kept_until(&acme, "acme", "r2", true).await.is_some());
    match globex.kept_stop("acme", "r2").await {
        Err(ClientError::PermissionDenied { .. }) => {}
        other => panic!("globex must not read acme's kept stop: {other:?}"),
    }
    match globex.watch_stop("acme", "r2").await {
        Err(ClientError::PermissionDenied { .. }) => {}
        Err(other) => panic!("refused, not {other}"),
        Ok(_) => panic!("globex must not watch acme's stops"),
    }

    // Raw NATS as globex: every other way at acme's stops, decisions and the op_key
    // ledger is refused by the server (and never answered).
    let url = vec![stack.url()];
    let (raw, mut errors) = connect(&url, "tenant-globex", Some("_INBOX.globex")).await;
    let forbidden_requests = [
        // acme's kept stop, directly, by wildcard, and by the forms that name the
        // subject in the body instead of the subject.
        "$JS.API.DIRECT.GET.FUSEBOX_STOPS.fusebox.stop.acme.r2",
        "$JS.API.DIRECT.GET.FUSEBOX_STOPS.fusebox.stop.*.r2",
        "$JS.API.DIRECT.GET.FUSEBOX_STOPS",
        "$JS.API.STREAM.MSG.GET.FUSEBOX_STOPS",
        "$JS.API.CONSUMER.CREATE.FUSEBOX_STOPS",
        "$JS.API.STREAM.INFO.FUSEBOX_STOPS",
        // acme's events as stored
        "$JS.API.DIRECT.GET.FUSEBOX_EVENTS.fusebox.events.acme.r1",
        "$JS.API.STREAM.MSG.GET.FUSEBOX_EVENTS",
        // the op_key ledger (KV bucket FUSEBOX_LEDGER in cluster mode) and its stream
        "$KV.FUSEBOX_LEDGER.acme.r1.op",
        "$JS.API.DIRECT.GET.KV_FUSEBOX_LEDGER.$KV.FUSEBOX_LEDGER.acme.r1.op",
        "$JS.API.STREAM.MSG.GET.KV_FUSEBOX_LEDGER",
        // the daemon's own view of acme's run (status includes its stop report)
        "fusebox.control.acme.r1.status",
    ];
    for subject in forbidden_requests {
        let body = if subject.ends_with("GET.FUSEBOX_STOPS") || subject.contains("MSG.GET") {
            r#"{"last_by_subj":"fusebox.stop.acme.r2"}"#
        } else {
            ""
        };
        let answer = tokio::time::timeout(SHORT, raw.request(subject, body.into())).await;
        assert!(
            !matches!(answer, Ok(Ok(_))),
            "{subject}: globex got an answer: {answer:?}"
        );
        expect_error(
            &mut errors,
            &["Permissions Violation", "Publish"],
            ERROR_WAIT,
        )
        .await;
    }
    for subject in [
        "fusebox.stop.acme.>",
        "fusebox.decisions.acme.>",
        "fusebox.stop.>",
        "$KV.FUSEBOX_LEDGER.>",
    ] {
        let _sub = raw.subscribe(subject).await.expect("queued");
        expect_error(
            &mut errors,
            &["Permissions Violation", "Subscription", subject],
            ERROR_WAIT,
        )
        .await;
    }
    // Forging: a stop or a decision for acme's run, by core publish or into the stream.
    for subject in [
        "fusebox.stop.acme.r1",
        "fusebox.decisions.acme.r1",
        "fusebox.stop.globex.r1",
    ] {
        raw.publish(subject, r#"{"action":"stop"}"#.into())
            .await
            .expect("queued");
        raw.flush().await.expect("flush");
        expect_error(&mut errors, &["Permissions Violation", subject], ERROR_WAIT).await;
    }
    // ... so acme's run still has no kept stop (resumed above), and its own tenant
    // reads that.
    assert_eq!(acme.kept_stop("acme", "r1").await.unwrap(), None);

    // The tenant's own permitted paths raised no error at all.
    let (own, mut own_errors) = connect(&url, "tenant-acme", Some("_INBOX.acme")).await;
    let reply = own
        .request(
            "$JS.API.DIRECT.GET.FUSEBOX_STOPS.fusebox.stop.acme.r2",
            "".into(),
        )
        .await
        .expect("acme's own kept stop is answered");
    let stop: fusebox_core::Decision = serde_json::from_slice(&reply.payload).expect("a stop");
    assert_eq!((stop.tenant.as_str(), stop.run.as_str()), ("acme", "r2"));
    expect_no_error(&mut own_errors, SHORT).await;
}

/// A FUSEBOX_STOPS made before workers read it by direct get (no `allow_direct`): until
/// a current fuseboxd starts, the lookup is an error — never "no stop" — and the daemon
/// turns direct get on in place, keeping the stop already stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_stops_stream_is_given_direct_get_by_the_daemon_keeping_its_stops() {
    let mut stack = SecuredStack::server_only();
    let (admin, _errors) = connect(&[stack.url()], "fuseboxd", None).await;
    let js = jetstream::new(admin);
    let mut old = fusebox_nats::setup::stops_stream_config();
    old.allow_direct = false;
    js.create_stream(old).await.expect("an old FUSEBOX_STOPS");
    let stop = json!({"v":1,"tenant":"acme","run":"old","event_id":"e9","action":"stop",
        "reason":"cancelled","message":"stopped before the upgrade"});
    js.publish("fusebox.stop.acme.old", stop.to_string().into())
        .await
        .expect("publish")
        .await
        .expect("stored");

    let acme = stack.client("tenant-acme", Duration::from_secs(2)).await;
    match acme.kept_stop("acme", "old").await {
        Err(ClientError::NoResponders { .. }) => {}
        other => panic!("no direct get yet: an error, not an answer: {other:?}"),
    }
    // The run handle under the default gate_on_error (deny) refuses to start blind.
    assert!(acme
        .start_run("acme", "old", RunOptions::default())
        .await
        .is_err());

    stack.start_daemon().await;
    let info = js
        .get_stream(fusebox_nats::subjects::STOPS_STREAM)
        .await
        .expect("stream")
        .info()
        .await
        .expect("info")
        .clone();
    assert!(
        info.config.allow_direct,
        "the daemon turned allow_direct on"
    );
    assert_eq!(info.state.messages, 1, "nothing lost");
    let kept = acme
        .kept_stop("acme", "old")
        .await
        .expect("lookup works now")
        .expect("the stop from before the upgrade");
    assert_eq!(kept.event_id, "e9");
}
