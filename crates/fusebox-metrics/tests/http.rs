//! The three endpoints over real HTTP on loopback.

use std::net::SocketAddr;
use std::sync::Arc;

use fusebox_metrics::{Metrics, MetricsOptions, MetricsServer, Readiness};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;

/// A plain HTTP/1.1 GET; returns the status code and the whole response text.
async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut response = String::new();
    stream.read_to_string(&mut response).await.expect("read");
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {response:?}"));
    (status, response)
}

#[tokio::test]
async fn serves_metrics_healthz_and_readyz_until_shutdown() {
    let metrics = Arc::new(Metrics::new("9.9.9", MetricsOptions::default()).unwrap());
    let readiness = Arc::new(Readiness::new());
    let server = MetricsServer::bind(
        "127.0.0.1:0".parse().unwrap(),
        metrics.clone(),
        readiness.clone(),
    )
    .await
    .unwrap();
    let addr = server.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(server.run(async {
        let _ = stopped.await;
    }));

    metrics.event("acme", "tool_call");
    let (status, body) = get(addr, "/metrics").await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("content-type: text/plain; version=0.0.4"),
        "{body}"
    );
    assert!(
        body.contains("fusebox_events_total{type=\"tool_call\"} 1"),
        "{body}"
    );
    assert!(
        body.contains("fusebox_build_info{version=\"9.9.9\"} 1"),
        "{body}"
    );

    assert_eq!(get(addr, "/healthz").await.0, 200);

    readiness.set_log_open(true);
    let (status, body) = get(addr, "/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("nats_connected, consumer_bound"), "{body}");

    readiness.set_nats_connected(true);
    readiness.set_consumer_bound(true);
    assert_eq!(get(addr, "/readyz").await.0, 200);

    readiness.set_consumer_bound(false);
    let (status, body) = get(addr, "/readyz").await;
    assert_eq!(status, 503);
    assert!(body.contains("consumer_bound"), "{body}");

    assert_eq!(get(addr, "/nope").await.0, 404);

    stop.send(()).unwrap();
    task.await.unwrap().unwrap();
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "still listening after shutdown"
    );
}

#[tokio::test]
async fn binding_a_taken_port_is_a_clear_error() {
    let metrics = Arc::new(Metrics::new("t", MetricsOptions::default()).unwrap());
    let readiness = Arc::new(Readiness::new());
    let first = MetricsServer::bind(
        "127.0.0.1:0".parse().unwrap(),
        metrics.clone(),
        readiness.clone(),
    )
    .await
    .unwrap();
    let taken = first.local_addr().unwrap();
    let err = fusebox_metrics::serve(taken, metrics, readiness, async {})
        .await
        .unwrap_err();
    assert!(err.to_string().contains(&taken.to_string()), "{err}");
}
