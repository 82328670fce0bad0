//! Faults that are not a clean kill (issue 17 §3): a hung daemon (SIGSTOP past the
//! clients' timeout), real network partitions (a network namespace and veth pairs the
//! test makes: fuseboxd cut from NATS, an agent cut from NATS), the data dir's disk
//! stalling (fsfreeze), slow (its writes throttled by a blkio cgroup) and full (a small
//! tmpfs the test mounts), and steps of the daemon's own wall clock (libfaketime; the
//! machine's clock is never touched). Each ends on the same checks (`Load::check`): the
//! log passes `fusebox log verify`, nothing an agent was answered is missing from it,
//! every answer equals what a full offline replay of the log decides, and no op_key was
//! let run twice.
//!
//! Needs root (netns, mount, cgroups); CI runs as root.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fusebox_client::{ClientOptions, FuseboxClient, Gate};
use fusebox_core::{parse_event, Action, Event, EventBody};
use fusebox_e2e::netns::{Netns, Veth};
use fusebox_e2e::{bin, event, expected, now_ms, write_config, Daemon, Moto, NatsServer};
use serde_json::json;

/// The agents' gate timeout: the daemon is hung or cut off for several times this.
const TIMEOUT: Duration = Duration::from_millis(1000);
/// What a denied gate may take beyond its timeout on a loaded 2-core CI machine.
const SLACK: Duration = Duration::from_millis(1500);

async fn connect(url: &str) -> FuseboxClient {
    connect_with(url, TIMEOUT).await
}

async fn connect_with(url: &str, timeout: Duration) -> FuseboxClient {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let options = ClientOptions {
            timeout,
            ..ClientOptions::default()
        };
        match FuseboxClient::connect(url, options).await {
            Ok(client) => return client,
            Err(err) => assert!(Instant::now() < deadline, "connect {url}: {err}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One answer an agent got.
#[derive(Debug, Clone)]
struct Answer {
    run: String,
    event_id: String,
    action: Action,
    op_key: Option<String>,
}

#[derive(Default)]
struct Observed {
    answers: Vec<Answer>,
    /// How long each answer took, in the order they came.
    latencies: Vec<Duration>,
    /// Gates that went unanswered (the client denied), with how long each took.
    denied: Vec<Duration>,
}

/// What a check found, for the test's figures (printed through `Debug`).
#[derive(Debug)]
#[allow(dead_code)]
struct Summary {
    answered: usize,
    denied: usize,
    longest_denial: Duration,
    slowest_answer: Duration,
    median_answer: Duration,
    logged: usize,
    executed_op_keys: usize,
}

/// Agents calling a side-effecting tool with an op_key per step and reporting its
/// result, everything through the gate. Every fifth step's op_key is shared by all runs
/// of the tenant, so the ledger decides between them. An unanswered gate is denied and
/// the same event asked again, as the client's contract says (same id, same decision).
struct Load {
    tenant: String,
    runs: usize,
    steps: u64,
    /// The agents' gate timeout.
    timeout: Duration,
    observed: Arc<Mutex<Observed>>,
}

impl Load {
    fn new(tenant: &str, runs: usize, steps: u64) -> Load {
        Load {
            tenant: tenant.to_owned(),
            runs,
            steps,
            timeout: TIMEOUT,
            observed: Arc::default(),
        }
    }

    fn events(&self, r: usize, t0: u64) -> Vec<Event> {
        let tenant = self.tenant.as_str();
        let run = format!("r{r}");
        let mut events = vec![event(json!({"v":1,"id":"start","tenant":tenant,"run":run,
            "seq":1,"ts_ms":t0,"type":"run_started","agent":"mailer"}))];
        for s in 1..=self.steps {
            let seq = 2 * s;
            let op_key = if s % 5 == 0 {
                format!("{tenant}:digest-{s}")
            } else {
                format!("{tenant}:{run}:mail-{s}")
            };
            events.push(event(
                json!({"v":1,"id":format!("c{s}"),"tenant":tenant,"run":run,
                "seq":seq,"ts_ms":t0 + seq,"type":"tool_call","call_id":format!("c{s}"),
                "tool":"send_email","args":{"to":"ops@example.com","n":s},
                "op_key":op_key,"effect":"write"}),
            ));
            events.push(event(json!({"v":1,"id":format!("res{s}"),"tenant":tenant,
                "run":run,"seq":seq + 1,"ts_ms":t0 + seq + 1,"type":"tool_result",
                "call_id":format!("c{s}"),"tool":"send_email","kind":"SUCCESS",
                "output":{"sent":true,"n":s}})));
        }
        events
    }

    /// Starts one agent per run on `url`, each pausing `pause` between events.
    fn start(&self, url: &str, pause: Duration) -> tokio::task::JoinSet<()> {
        let mut set = tokio::task::JoinSet::new();
        let t0 = now_ms();
        for r in 0..self.runs {
            let events = self.events(r, t0);
            let observed = self.observed.clone();
            let url = url.to_owned();
            let timeout = self.timeout;
            set.spawn(async move {
                let client = connect_with(&url, timeout).await;
                for e in events {
                    let op_key = match &e.body {
                        EventBody::ToolCall(c) => c.op_key.clone(),
                        _ => None,
                    };
                    loop {
                        let asked = Instant::now();
                        match client.gate(&e).await {
                            Gate::Decided(d) => {
                                let mut observed = observed.lock().unwrap();
                                observed.latencies.push(asked.elapsed());
                                observed.answers.push(Answer {
                                    run: d.run.clone(),
                                    event_id: d.event_id.clone(),
                                    action: d.action,
                                    op_key: op_key.clone(),
                                });
                                break;
                            }
                            Gate::Unanswered { allowed, .. } => {
                                assert!(!allowed, "an unanswered gate must deny");
                                observed.lock().unwrap().denied.push(asked.elapsed());
                                tokio::time::sleep(Duration::from_millis(100)).await;
                            }
                            Gate::Refused(err) => panic!("{} refused: {err:?}", e.id),
                        }
                    }
                    tokio::time::sleep(pause).await;
                }
            });
        }
        set
    }

    fn answered(&self) -> usize {
        self.observed.lock().unwrap().answers.len()
    }

    fn denied(&self) -> usize {
        self.observed.lock().unwrap().denied.len()
    }

    /// The checks, against the stopped daemon's data dir.
    fn check(&self, config: &Path, data_dir: &Path) -> Summary {
        let fusebox = |args: &[&str]| {
            let out = Command::new(bin("fusebox"))
                .arg("log")
                .arg("--data-dir")
                .arg(data_dir)
                .args(args)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "fusebox log {args:?}:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        };
        fusebox(&["verify"]);
        let export = data_dir.with_extension("export.jsonl");
        fusebox(&["export", "--out", export.to_str().unwrap()]);
        let events: Vec<Event> = std::fs::read_to_string(&export)
            .unwrap()
            .lines()
            .map(|l| parse_event(l.as_bytes()).unwrap())
            .collect();
        // The whole log is replayed (tenants share nothing, but it is the log); this
        // load's answers are looked up among its own tenant's events.
        let replayed: BTreeMap<(String, String), Action> = events
            .iter()
            .zip(expected(config, &events))
            .filter(|(e, _)| e.tenant == self.tenant)
            .map(|(e, d)| ((e.run.clone(), e.id.clone()), d.action))
            .collect();
        let observed = self.observed.lock().unwrap();
        let mut lost = Vec::new();
        let mut differ = Vec::new();
        let mut ran: BTreeMap<&str, BTreeSet<(&str, &str)>> = BTreeMap::new();
        for a in &observed.answers {
            match replayed.get(&(a.run.clone(), a.event_id.clone())) {
                None => lost.push(format!("{}/{}", a.run, a.event_id)),
                Some(action) if *action != a.action => differ.push(format!(
                    "{}/{}: answered {:?}, replay {action:?}",
                    a.run, a.event_id, a.action
                )),
                Some(_) => {}
            }
            if let (Some(k), true) = (&a.op_key, a.action.lets_tool_run()) {
                ran.entry(k).or_default().insert((&a.run, &a.event_id));
            }
        }
        assert!(lost.is_empty(), "answered but not in the log: {lost:?}");
        assert!(
            differ.is_empty(),
            "answers unlike a full replay: {differ:?}"
        );
        let twice: Vec<_> = ran.iter().filter(|(_, calls)| calls.len() > 1).collect();
        assert!(twice.is_empty(), "op_keys let run twice: {twice:?}");
        Summary {
            answered: observed.answers.len(),
            denied: observed.denied.len(),
            longest_denial: observed.denied.iter().max().copied().unwrap_or_default(),
            slowest_answer: observed.latencies.iter().max().copied().unwrap_or_default(),
            median_answer: median(&observed.latencies),
            logged: events.len(),
            executed_op_keys: ran.len(),
        }
    }

    fn expected_answers(&self) -> usize {
        self.runs * (1 + 2 * self.steps as usize)
    }
}

async fn join(mut agents: tokio::task::JoinSet<()>, within: Duration) {
    tokio::time::timeout(within, async {
        while let Some(done) = agents.join_next().await {
            done.unwrap();
        }
    })
    .await
    .expect("the agents finished in time");
}

fn median(samples: &[Duration]) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort();
    sorted.get(sorted.len() / 2).copied().unwrap_or_default()
}

fn assert_denials_bounded(summary: &Summary) {
    assert!(
        summary.longest_denial <= TIMEOUT + SLACK,
        "a denied gate took {:?} (timeout {TIMEOUT:?})",
        summary.longest_denial
    );
}

/// A small ext4 on a loop device for the data dir, which the test can freeze
/// (`fsfreeze`: every write and fsync on it blocks until thawed) — a disk that stalls.
struct FreezableDisk {
    mount: std::path::PathBuf,
    image: std::path::PathBuf,
}

impl FreezableDisk {
    fn mount(dir: &Path) -> FreezableDisk {
        let image = dir.join("disk.img");
        let mount = dir.join("slow");
        std::fs::create_dir_all(&mount).unwrap();
        let run = |cmd: &mut Command| {
            let out = cmd.output().unwrap();
            assert!(
                out.status.success(),
                "{cmd:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        run(Command::new("truncate").args(["-s", "128M"]).arg(&image));
        run(Command::new("mkfs.ext4").arg("-q").arg(&image));
        run(Command::new("mount")
            .args(["-o", "loop"])
            .arg(&image)
            .arg(&mount));
        FreezableDisk { mount, image }
    }

    fn freeze(&self) {
        let status = Command::new("fsfreeze")
            .arg("-f")
            .arg(&self.mount)
            .status()
            .unwrap();
        assert!(status.success(), "fsfreeze -f");
    }

    /// Thaws it; thawing a disk that is not frozen is a no-op.
    fn thaw(&self) {
        let _ = Command::new("fsfreeze")
            .arg("-u")
            .arg(&self.mount)
            .stderr(std::process::Stdio::null())
            .status();
    }
}

impl Drop for FreezableDisk {
    fn drop(&mut self) {
        self.thaw();
        // The loop device is detached with the unmount (mount -o loop sets autoclear).
        let _ = Command::new("umount").arg(&self.mount).status();
        let _ = std::fs::remove_file(&self.image);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalling_disk_bounds_gate_latency_by_the_stall_limit_and_loses_nothing() {
    const STALL_LIMIT: Duration = Duration::from_millis(2_000);
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    set_daemon_option(
        &config,
        "stall_limit_ms",
        toml::Value::Integer(STALL_LIMIT.as_millis() as i64),
    );
    // The mount point is the data dir, so the daemon's log (beside it) is not frozen.
    let disk = FreezableDisk::mount(dir.path());
    let data = disk.mount.clone();
    let mut daemon = Daemon::start(&nats.url(), &config, &data).await;
    let mut load = Load::new("stall", 4, 40);
    // Longer than the stall limit, so an answer that waited on the disk would be seen.
    load.timeout = STALL_LIMIT * 3;
    let agents = load.start(&nats.url(), Duration::from_millis(20));
    tokio::time::sleep(Duration::from_millis(700)).await;
    disk.freeze();
    let frozen = Instant::now();
    // The stuck batch is noticed at the stall limit, and the service fails: the process
    // can only finish exiting once its blocked write returns, so thaw after that.
    let said = loop {
        if daemon.logs().contains("made no progress") {
            break frozen.elapsed();
        }
        assert!(
            frozen.elapsed() < STALL_LIMIT + Duration::from_secs(20),
            "no stall reported:\n{}",
            daemon.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    disk.thaw();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = daemon.proc.exit_status() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "fuseboxd did not exit:\n{}",
            daemon.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(!status.success(), "a stuck log is an error exit");
    let mut daemon = Daemon::start(&nats.url(), &config, &data).await;
    join(agents, Duration::from_secs(120)).await;
    assert!(daemon.terminate().success(), "{}", daemon.logs());
    let summary = load.check(&config, &data);
    assert_eq!(summary.answered, load.expected_answers());
    assert!(
        summary.slowest_answer <= STALL_LIMIT + SLACK,
        "an answer took {:?} with stall_limit_ms = {}",
        summary.slowest_answer,
        STALL_LIMIT.as_millis()
    );
    eprintln!(
        "frozen disk: stall reported {said:?} after the freeze (stall_limit_ms = {}), \
         exit {status} after the thaw; {summary:?}",
        STALL_LIMIT.as_millis()
    );
}

/// A disk made slow for the processes the test puts under it: a blkio cgroup of the
/// test's own throttles their writes to the loop device behind a [`FreezableDisk`]
/// (`blkio.throttle.write_iops_device` under cgroup v1, `io.max` under v2). A real block
/// device that is slow, not a stall: every fsync still returns, later.
struct SlowDisk {
    cgroup: std::path::PathBuf,
    /// Where the throttled processes go back to.
    parent: std::path::PathBuf,
    /// The loop device, `major:minor`.
    device: String,
}

impl SlowDisk {
    fn throttle(disk: &FreezableDisk, write_iops: u32) -> SlowDisk {
        let out = Command::new("mountpoint")
            .arg("-d")
            .arg(&disk.mount)
            .output()
            .unwrap();
        assert!(out.status.success(), "mountpoint -d {:?}", disk.mount);
        let device = String::from_utf8(out.stdout).unwrap().trim().to_owned();
        let name = format!("fusebox-slow-{}", std::process::id());
        let v1 = Path::new("/sys/fs/cgroup/blkio");
        let v2 = Path::new("/sys/fs/cgroup");
        let (parent, setting, line) = if v1.join("blkio.throttle.write_iops_device").exists() {
            (
                v1.to_owned(),
                "blkio.throttle.write_iops_device",
                format!("{device} {write_iops}"),
            )
        } else if std::fs::read_to_string(v2.join("cgroup.controllers"))
            .is_ok_and(|c| c.split_whitespace().any(|c| c == "io"))
        {
            // The io controller must be on for the children of the root.
            let _ = std::fs::write(v2.join("cgroup.subtree_control"), "+io");
            (
                v2.to_owned(),
                "io.max",
                format!("{device} wiops={write_iops}"),
            )
        } else {
            panic!("no blkio (cgroup v1) or io (cgroup v2) controller: cannot make a slow disk");
        };
        let cgroup = parent.join(name);
        std::fs::create_dir_all(&cgroup).unwrap();
        std::fs::write(cgroup.join(setting), &line)
            .unwrap_or_else(|e| panic!("write {line:?} to {setting}: {e}"));
        SlowDisk {
            cgroup,
            parent,
            device,
        }
    }

    /// Writes the throttle let through to the device so far: proof that the daemon's
    /// writes went through it (v1 `blkio.throttle.io_serviced`, v2 `io.stat`'s `wios`).
    fn writes(&self) -> u64 {
        let v1 = std::fs::read_to_string(self.cgroup.join("blkio.throttle.io_serviced"));
        if let Ok(stats) = v1 {
            let prefix = format!("{} Write ", self.device);
            return stats
                .lines()
                .find_map(|l| l.strip_prefix(&prefix)?.trim().parse().ok())
                .unwrap_or(0);
        }
        let stats = std::fs::read_to_string(self.cgroup.join("io.stat")).unwrap_or_default();
        stats
            .lines()
            .filter(|l| l.starts_with(&format!("{} ", self.device)))
            .flat_map(|l| l.split_whitespace())
            .find_map(|field| field.strip_prefix("wios=")?.parse().ok())
            .unwrap_or(0)
    }

    /// Puts a process (all its threads) under the throttle.
    fn add(&self, pid: u32) {
        std::fs::write(self.cgroup.join("cgroup.procs"), pid.to_string()).unwrap();
    }
}

impl Drop for SlowDisk {
    fn drop(&mut self) {
        let procs = std::fs::read_to_string(self.cgroup.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.lines() {
            let _ = std::fs::write(self.parent.join("cgroup.procs"), pid);
        }
        let _ = std::fs::remove_dir(&self.cgroup);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_disk_slows_answers_within_the_stall_limit_and_loses_nothing() {
    const STALL_LIMIT: Duration = Duration::from_millis(2_000);
    const WRITE_IOPS: u32 = 10;
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    set_daemon_option(
        &config,
        "stall_limit_ms",
        toml::Value::Integer(STALL_LIMIT.as_millis() as i64),
    );
    let disk = FreezableDisk::mount(dir.path());
    let data = disk.mount.clone();
    let mut daemon = Daemon::start(&nats.url(), &config, &data).await;
    // The same load twice, on the same daemon and disk: first as the disk is, then with
    // its writes throttled to WRITE_IOPS per second for the daemon.
    let mut baseline = Load::new("fast", 4, 20);
    baseline.timeout = STALL_LIMIT * 3;
    join(
        baseline.start(&nats.url(), Duration::from_millis(20)),
        Duration::from_secs(120),
    )
    .await;
    let slow = SlowDisk::throttle(&disk, WRITE_IOPS);
    slow.add(daemon.proc.pid());
    let mut throttled = Load::new("slow", 4, 20);
    throttled.timeout = STALL_LIMIT * 3;
    join(
        throttled.start(&nats.url(), Duration::from_millis(20)),
        Duration::from_secs(240),
    )
    .await;
    assert!(
        daemon.proc.is_running(),
        "a slow disk is not a stall: fuseboxd must keep serving\n{}",
        daemon.logs()
    );
    let throttled_writes = slow.writes();
    assert!(
        throttled_writes > 0,
        "the daemon's writes did not go through the throttle"
    );
    drop(slow);
    assert!(daemon.terminate().success(), "{}", daemon.logs());
    let fast = baseline.check(&config, &data);
    let summary = throttled.check(&config, &data);
    for (load, summary) in [(&baseline, &fast), (&throttled, &summary)] {
        assert_eq!(summary.answered, load.expected_answers());
        assert_eq!(summary.denied, 0, "{summary:?}");
    }
    assert!(
        summary.slowest_answer <= STALL_LIMIT + SLACK,
        "an answer took {:?} with stall_limit_ms = {}",
        summary.slowest_answer,
        STALL_LIMIT.as_millis()
    );
    eprintln!(
        "slow disk ({WRITE_IOPS} write IOPS, {throttled_writes} writes throttled): median \
         answer {:?} (as the disk is: {:?}), slowest {:?} ({:?}); {summary:?}",
        summary.median_answer, fast.median_answer, summary.slowest_answer, fast.slowest_answer
    );
}

/// A nats-server in its own network namespace, reached over two veth links: one the
/// daemon uses, one the agents use, so either can be cut alone.
struct PartitionedNats {
    _server: NatsServer,
    daemon_link: Veth,
    agent_link: Veth,
    port: u16,
    _ns: Netns,
}

impl PartitionedNats {
    fn start() -> PartitionedNats {
        let ns = Netns::new();
        let daemon_link = Veth::new(&ns);
        let agent_link = Veth::new(&ns);
        let port = 4222;
        let server = NatsServer::start_in_netns(&ns, port, daemon_link.ns_ip.into());
        PartitionedNats {
            _server: server,
            daemon_link,
            agent_link,
            port,
            _ns: ns,
        }
    }

    fn daemon_url(&self) -> String {
        format!("nats://{}:{}", self.daemon_link.ns_ip, self.port)
    }

    fn agent_url(&self) -> String {
        format!("nats://{}:{}", self.agent_link.ns_ip, self.port)
    }
}

/// A fault held in the middle of a load: when it starts, how long it holds, what makes
/// and mends it, and what it is called in the messages.
struct Fault<'a> {
    name: &'a str,
    after: Duration,
    held: Duration,
    /// Given the daemon under test (the one fault that acts on it signals it).
    make: Box<dyn FnOnce(&Daemon) + 'a>,
    mend: Box<dyn FnOnce(&Daemon) + 'a>,
}

/// Runs `load` on `url` through `fault`, then stops the daemon and checks: every agent
/// was denied while the fault held and (beyond a request in flight as it began) none was
/// answered, nothing is lost, and every denial came within the clients' timeout.
async fn ride_out(
    load: &Load,
    url: &str,
    daemon: &mut Daemon,
    config: &Path,
    data: &Path,
    pause: Duration,
    fault: Fault<'_>,
) {
    let agents = load.start(url, pause);
    tokio::time::sleep(fault.after).await;
    (fault.make)(daemon);
    let before = load.answered();
    tokio::time::sleep(fault.held).await;
    let during = load.answered() - before;
    let denied = load.denied();
    (fault.mend)(daemon);
    join(agents, Duration::from_secs(120)).await;
    assert!(daemon.terminate().success(), "{}", daemon.logs());
    let summary = load.check(config, data);
    assert_eq!(summary.answered, load.expected_answers());
    let name = fault.name;
    assert!(
        denied >= load.runs,
        "every agent was denied while {name}: {denied}"
    );
    assert!(during <= load.runs, "{during} answers while {name}");
    assert_denials_bounded(&summary);
    eprintln!("{name} for {:?}: {summary:?}", fault.held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_daemon_is_denied_meanwhile_then_resumes_losing_nothing() {
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    let data = dir.path().join("data");
    let mut daemon = Daemon::start(&nats.url(), &config, &data).await;
    let fault = Fault {
        name: "the daemon was stopped (SIGSTOP)",
        after: Duration::from_millis(700),
        held: TIMEOUT * 4,
        make: Box::new(|daemon| daemon.proc.signal("STOP")),
        mend: Box::new(|daemon| daemon.proc.signal("CONT")),
    };
    let load = Load::new("hung", 6, 40);
    let url = nats.url();
    ride_out(
        &load,
        &url,
        &mut daemon,
        &config,
        &data,
        Duration::from_millis(15),
        fault,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fuseboxd_cut_from_nats_mid_load_then_healed_loses_nothing() {
    let nats = PartitionedNats::start();
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    let data = dir.path().join("data");
    let mut daemon = Daemon::start(&nats.daemon_url(), &config, &data).await;
    let fault = Fault {
        name: "the daemon was cut off",
        after: Duration::from_millis(700),
        held: TIMEOUT * 5,
        make: Box::new(|_| nats.daemon_link.cut()),
        mend: Box::new(|_| nats.daemon_link.heal()),
    };
    let load = Load::new("cut", 6, 40);
    let url = nats.agent_url();
    ride_out(
        &load,
        &url,
        &mut daemon,
        &config,
        &data,
        Duration::from_millis(15),
        fault,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_cut_from_nats_is_denied_within_its_timeout() {
    let nats = PartitionedNats::start();
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    let data = dir.path().join("data");
    let mut daemon = Daemon::start(&nats.daemon_url(), &config, &data).await;
    let fault = Fault {
        name: "the agents were cut off",
        after: Duration::from_millis(500),
        held: TIMEOUT * 4,
        make: Box::new(|_| nats.agent_link.cut()),
        mend: Box::new(|_| nats.agent_link.heal()),
    };
    let load = Load::new("agentcut", 3, 30);
    let url = nats.agent_url();
    ride_out(
        &load,
        &url,
        &mut daemon,
        &config,
        &data,
        Duration::from_millis(20),
        fault,
    )
    .await;
}

/// A tmpfs of `size` mounted for the test (its data dir's disk), unmounted on drop.
struct SmallDisk {
    mount: std::path::PathBuf,
}

impl SmallDisk {
    fn mount(at: &Path, size: &str) -> SmallDisk {
        std::fs::create_dir_all(at).unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "fusebox-test"])
            .arg(at)
            .status()
            .expect("run mount");
        assert!(
            status.success(),
            "mount a tmpfs at {} (needs root)",
            at.display()
        );
        SmallDisk {
            mount: at.to_owned(),
        }
    }

    /// Writes a file until the disk is full.
    fn fill(&self) -> std::path::PathBuf {
        let filler = self.mount.join("filler");
        let _ = Command::new("dd")
            .args(["if=/dev/zero", "bs=64k"])
            .arg(format!("of={}", filler.display()))
            .stderr(std::process::Stdio::null())
            .status();
        filler
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
    }
}

fn set_daemon_option(config: &Path, key: &str, value: toml::Value) {
    let mut doc: toml::Table = toml::from_str(&std::fs::read_to_string(config).unwrap()).unwrap();
    doc.get_mut("daemon")
        .and_then(toml::Value::as_table_mut)
        .expect("[daemon]")
        .insert(key.to_owned(), value);
    std::fs::write(config, toml::to_string(&doc).unwrap()).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_stops_the_daemon_naming_it_and_a_restart_loses_nothing() {
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    // A disk that stops taking writes may also hang sled: bounded by the stall limit.
    set_daemon_option(&config, "stall_limit_ms", toml::Value::Integer(3_000));
    // The data dir is the mount point itself, so the daemon's log (beside it, in the
    // harness) is not on the full disk.
    let disk = SmallDisk::mount(&dir.path().join("disk"), "64m");
    let data = disk.mount.clone();
    let mut daemon = Daemon::start(&nats.url(), &config, &data).await;
    let load = Load::new("disk", 4, 60);
    let agents = load.start(&nats.url(), Duration::from_millis(20));
    tokio::time::sleep(Duration::from_millis(700)).await;
    let filler = disk.fill();
    let full_at = Instant::now();
    let status = loop {
        if let Some(status) = daemon.proc.exit_status() {
            break status;
        }
        assert!(
            full_at.elapsed() < Duration::from_secs(60),
            "fuseboxd kept running on a full disk:\n{}",
            daemon.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let exited_after = full_at.elapsed();
    assert!(!status.success(), "a full disk is an error exit");
    let logs = daemon.logs();
    assert!(
        logs.contains("is full") && logs.contains(&data.display().to_string()),
        "the exit names the full disk and the data dir:\n{logs}"
    );
    let answered_while_full = load.answered();
    std::fs::remove_file(filler).unwrap();
    let mut daemon = Daemon::start(&nats.url(), &config, &data).await;
    join(agents, Duration::from_secs(120)).await;
    assert!(daemon.terminate().success(), "{}", daemon.logs());
    let summary = load.check(&config, &data);
    assert_eq!(summary.answered, load.expected_answers());
    assert_denials_bounded(&summary);
    eprintln!(
        "disk full: exited {exited_after:?} after the disk filled ({status}), \
         {answered_while_full} answers before; {summary:?}"
    );
}

/// libfaketime, from the Debian package `libfaketime` (scripts/setup.sh installs it).
fn libfaketime() -> std::path::PathBuf {
    let candidates = [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/faketime/libfaketime.so.1",
    ];
    candidates
        .iter()
        .map(std::path::PathBuf::from)
        .find(|p| p.exists())
        .expect("libfaketime is missing: run `bash scripts/setup.sh`")
}

/// The daemon's wall clock, set through libfaketime's timestamp file: only the daemon
/// process sees it, and its monotonic clock is left alone.
struct FakeWallClock {
    file: std::path::PathBuf,
}

impl FakeWallClock {
    fn new(dir: &Path) -> FakeWallClock {
        let clock = FakeWallClock {
            file: dir.join("faketime"),
        };
        clock.set("+0");
        clock
    }

    /// An offset from the real time in libfaketime's relative form, e.g. `+5h`, `-3h`.
    fn set(&self, offset: &str) {
        std::fs::write(&self.file, format!("{offset}\n")).unwrap();
    }

    fn apply(&self, cmd: &mut Command) {
        cmd.env("LD_PRELOAD", libfaketime())
            .env("FAKETIME_TIMESTAMP_FILE", &self.file)
            .env("FAKETIME_NO_CACHE", "1")
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
    }
}

fn ec2(endpoint: &str) -> aws_sdk_ec2::Client {
    use aws_sdk_ec2::config::{BehaviorVersion, Credentials, Region};
    let conf = aws_sdk_ec2::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .credentials_provider(Credentials::new("testing", "testing", None, None, "test"))
        .region(Region::new("us-east-1"))
        .endpoint_url(endpoint)
        .build();
    aws_sdk_ec2::Client::from_conf(conf)
}

/// RFC 3339 for a Unix time in ms (the `fusebox:deadline` tag's form).
fn rfc3339(ms: u64) -> String {
    let out = Command::new("date")
        .args([
            "-u",
            "-d",
            &format!("@{}", ms / 1000),
            "+%Y-%m-%dT%H:%M:%SZ",
        ])
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// A managed instance whose `fusebox:deadline` is `deadline_ms` (real time).
async fn launch_with_deadline(ec2: &aws_sdk_ec2::Client, run: &str, deadline_ms: u64) -> String {
    use aws_sdk_ec2::types::{InstanceType, ResourceType, Tag, TagSpecification};
    let tag = |k: &str, v: &str| Tag::builder().key(k).value(v).build();
    let out = ec2
        .run_instances()
        .image_id("ami-12c6146b")
        .instance_type(InstanceType::T3Micro)
        .min_count(1)
        .max_count(1)
        .tag_specifications(
            TagSpecification::builder()
                .resource_type(ResourceType::Instance)
                .tags(tag("fusebox:managed", "true"))
                .tags(tag("fusebox:tenant", "clock"))
                .tags(tag("fusebox:run", run))
                .tags(tag("fusebox:deadline", &rfc3339(deadline_ms)))
                .build(),
        )
        .send()
        .await
        .expect("RunInstances on moto");
    out.instances()[0].instance_id().unwrap().to_owned()
}

async fn alive(ec2: &aws_sdk_ec2::Client, id: &str) -> bool {
    let out = ec2
        .describe_instances()
        .instance_ids(id)
        .send()
        .await
        .expect("DescribeInstances on moto");
    let state = out.reservations()[0].instances()[0]
        .state()
        .and_then(|s| s.name())
        .map(|n| n.as_str().to_owned())
        .unwrap_or_default();
    matches!(
        state.as_str(),
        "pending" | "running" | "stopping" | "stopped"
    )
}

/// Waits until the instance is terminated (or shutting down); false after `within`.
async fn terminated_within(ec2: &aws_sdk_ec2::Client, id: &str, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if !alive(ec2, id).await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wall_clock_steps_on_the_daemons_host_fire_no_timer_early_and_delay_none() {
    let nats = NatsServer::start();
    let moto = Moto::start();
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    {
        let mut doc: toml::Table =
            toml::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
        let watchdog: toml::Table = toml::from_str(&format!(
            "enabled = true\nregions = [\"us-east-1\"]\nendpoint_url = \"{}\"\n\
             grace_s = 1\nsweep_cron = \"* * * * * *\"\nrecheck_after_s = 1\n",
            moto.url()
        ))
        .unwrap();
        doc.insert("watchdog".into(), toml::Value::Table(watchdog));
        std::fs::write(&config, toml::to_string(&doc).unwrap()).unwrap();
    }
    let clock = FakeWallClock::new(dir.path());
    let data = dir.path().join("data");
    let mut daemon = Daemon::start_with(&nats.url(), &config, &data, |cmd| {
        clock.apply(cmd);
        cmd.env("AWS_ACCESS_KEY_ID", "testing")
            .env("AWS_SECRET_ACCESS_KEY", "testing")
            .env("AWS_EC2_METADATA_DISABLED", "true");
    })
    .await;
    let ec2 = ec2(&moto.url());
    let t0 = now_ms();
    let soon = launch_with_deadline(&ec2, "soon", t0 + 10_000).await;
    let later = launch_with_deadline(&ec2, "later", t0 + 3_600_000).await;
    // A run with a two-minute time budget that keeps working, and one with a 4 s budget
    // that goes idle: a tick must stop the idle one after 4 s of elapsed time, whatever
    // the daemon's wall clock says, and nothing may stop the busy one.
    let client = connect(&nats.url()).await;
    for (run, budget) in [("busy", 120), ("idle", 4)] {
        let started = event(
            json!({"v":1,"id":"start","tenant":"clock","run":run,"seq":1,
            "ts_ms":now_ms(),"type":"run_started","policy":{"max_duration_s":budget}}),
        );
        assert!(matches!(client.gate(&started).await, Gate::Decided(_)));
    }
    let load = Load::new("clockload", 3, 30);
    let agents = load.start(&nats.url(), Duration::from_millis(40));
    tokio::time::sleep(Duration::from_millis(500)).await;
    clock.set("+5h");
    let mut seq = 1;
    let mut busy_step = |client: FuseboxClient| {
        seq += 1;
        let call = event(
            json!({"v":1,"id":format!("b{seq}"),"tenant":"clock","run":"busy",
            "seq":seq,"ts_ms":now_ms(),"type":"tool_call","call_id":format!("b{seq}"),
            "tool":"read_page","args":{"page":seq}}),
        );
        async move {
            match client.gate(&call).await {
                Gate::Decided(d) => d.action,
                other => panic!("busy run unanswered: {other:?}"),
            }
        }
    };
    // Five hours ahead: the soon instance dies at its deadline by elapsed time, not at
    // once; the later one lives; the busy run keeps executing.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        alive(&ec2, &soon).await,
        "terminated early: the watchdog followed a +5h step"
    );
    assert!(alive(&ec2, &later).await, "terminated after a +5h step");
    assert_eq!(busy_step(client.clone()).await, Action::Execute);
    let soon_due = Duration::from_millis((t0 + 10_000).saturating_sub(now_ms()));
    assert!(
        terminated_within(&ec2, &soon, soon_due + Duration::from_secs(8)).await,
        "the soon instance outlived its deadline:\n{}",
        daemon.logs()
    );
    let soon_late_ms = now_ms() as i64 - (t0 + 10_000) as i64;
    assert!(alive(&ec2, &later).await);
    // Now three hours behind: a deadline 4 s away is still met in about 4 s.
    clock.set("-3h");
    let t1 = now_ms();
    let next = launch_with_deadline(&ec2, "next", t1 + 4_000).await;
    assert!(
        terminated_within(&ec2, &next, Duration::from_secs(14)).await,
        "a -3h step postponed a deadline:\n{}",
        daemon.logs()
    );
    let next_late_ms = now_ms() as i64 - (t1 + 4_000) as i64;
    assert!(alive(&ec2, &later).await, "terminated after a -3h step");
    assert_eq!(busy_step(client.clone()).await, Action::Execute);
    // The idle run's 4 s budget ran out by elapsed time long ago: a tick closed it.
    let idle = event(
        json!({"v":1,"id":"late","tenant":"clock","run":"idle","seq":2,
        "ts_ms":now_ms(),"type":"tool_call","call_id":"late","tool":"read_page","args":{}}),
    );
    let Gate::Decided(answer) = client.gate(&idle).await else {
        panic!("idle run unanswered")
    };
    assert_eq!(answer.action, Action::Stop, "{answer:?}");
    join(agents, Duration::from_secs(120)).await;
    let logs = daemon.logs();
    assert!(
        logs.contains("wall clock stepped"),
        "the step is reported:\n{logs}"
    );
    assert!(daemon.terminate().success(), "{}", daemon.logs());
    let summary = load.check(&config, &data);
    assert_eq!(summary.answered, load.expected_answers());
    eprintln!(
        "clock +5h then -3h: deadline instances terminated {soon_late_ms} ms and \
         {next_late_ms} ms after their deadlines, the 1 h one alive; {summary:?}"
    );
}
