//! `fusebox-stack`: the harness as a process, for suites and scripts that are not Rust
//! (pytest under `tests/py/`): starts nats-server and fuseboxd (and, with `--moto`, a
//! moto_server the daemon's watchdog watches) on free loopback ports, prints one JSON
//! line of endpoints on stdout, and stops everything when its stdin closes or it gets
//! SIGTERM/SIGINT — so a test runner that dies takes the servers with it.
//!
//! ```text
//! fusebox-stack [--moto] [--config FILE]
//! {"nats_url":"nats://127.0.0.1:…","metrics_url":"http://127.0.0.1:…","data_dir":"…",
//!  "config":"…","bin_dir":"…","moto_url":null}
//! ```

use std::io::Read;
use std::path::PathBuf;

use fusebox_e2e::{bin, write_config, Daemon, Moto, NatsServer};

struct Args {
    moto: bool,
    config: Option<PathBuf>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        moto: false,
        config: None,
    };
    let mut argv = std::env::args().skip(1);
    while let Some(arg) = argv.next() {
        match arg.as_str() {
            "--moto" => args.moto = true,
            "--config" => {
                args.config = Some(argv.next().ok_or("--config needs a file")?.into());
            }
            other => {
                return Err(format!(
                    "unknown argument {other:?}; usage: fusebox-stack [--moto] [--config FILE]"
                ))
            }
        }
    }
    Ok(args)
}

/// The test config with the watchdog pointed at `moto` (sweeps every 2 s, 1 s grace).
fn watch_moto(config: &std::path::Path, moto: &str) {
    let mut doc: toml::Table =
        toml::from_str(&std::fs::read_to_string(config).expect("config")).expect("toml");
    let watchdog: toml::Table = toml::from_str(&format!(
        "enabled = true\nregions = [\"us-east-1\"]\nendpoint_url = \"{moto}\"\n\
         grace_s = 1\nsweep_cron = \"*/2 * * * * *\"\nrecheck_after_s = 1\n"
    ))
    .expect("watchdog table");
    doc.insert("watchdog".into(), toml::Value::Table(watchdog));
    std::fs::write(config, toml::to_string(&doc).expect("toml")).expect("writing config");
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(err) => {
            eprintln!("fusebox-stack: {err}");
            return std::process::ExitCode::from(2);
        }
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let nats = NatsServer::start();
    let config = match &args.config {
        Some(path) => path.clone(),
        None => write_config(dir.path()),
    };
    let moto = args.moto.then(Moto::start);
    if let Some(moto) = &moto {
        watch_moto(&config, &moto.url());
    }
    let data_dir = dir.path().join("data");
    let daemon = Daemon::start_with(&nats.url(), &config, &data_dir, |cmd| {
        if moto.is_some() {
            // moto accepts any credentials; no instance-metadata lookups.
            cmd.env("AWS_ACCESS_KEY_ID", "testing")
                .env("AWS_SECRET_ACCESS_KEY", "testing")
                .env("AWS_EC2_METADATA_DISABLED", "true");
        }
    })
    .await;
    let endpoints = serde_json::json!({
        "nats_url": nats.url(),
        "metrics_url": format!("http://127.0.0.1:{}", daemon.metrics_port),
        "data_dir": data_dir,
        "config": config,
        "bin_dir": bin("fuseboxd").parent().expect("bin dir"),
        "moto_url": moto.as_ref().map(Moto::url),
        "daemon_log": daemon.proc.log_path(),
        "daemon_pid": daemon.proc.pid(),
        "nats_pid": nats.pid(),
    });
    println!("{endpoints}");

    let stdin_closed = tokio::task::spawn_blocking(|| {
        let mut sink = Vec::new();
        let _ = std::io::stdin().read_to_end(&mut sink);
    });
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = stdin_closed => {}
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    // Dropping stops the daemon, moto and nats-server (SIGKILL; a suite that wants a
    // graceful daemon stop sends its own SIGTERM to the daemon first).
    drop(daemon);
    drop(moto);
    drop(nats);
    std::process::ExitCode::SUCCESS
}
