//! The parts of deploy/ no test here can run (no systemd as PID 1, no container engine,
//! no Kubernetes): checked as far as a tool or a parser can check them, and against the
//! rest of the repo (config keys, NATS users, file references), so they cannot drift.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use fusebox_e2e::{deploy_dir, deploy_nats, read, repo_dir};
use serde_norway::Value;

/// Every `section.key` path of a TOML document (tables recursed, arrays are leaves).
fn toml_keys(prefix: &str, table: &toml::Table, out: &mut BTreeSet<String>) {
    for (key, value) in table {
        let path = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        match value {
            toml::Value::Table(inner) => toml_keys(&path, inner, out),
            _ => {
                out.insert(path);
            }
        }
    }
}

/// The keys config/fusebox.toml documents, including the commented-out credentials of
/// `[nats]` (shown as `# user = …`): fuseboxd rejects unknown keys, so a deploy config
/// may only use these.
fn documented_keys() -> BTreeSet<String> {
    let text = read(&repo_dir().join("config/fusebox.toml"));
    let doc: toml::Table = toml::from_str(&text).expect("config/fusebox.toml parses");
    let mut keys = BTreeSet::new();
    toml_keys("", &doc, &mut keys);
    let mut section = String::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') && line.ends_with(']') {
            section = line.trim_matches(['[', ']']).to_owned();
        } else if let Some(rest) = line.strip_prefix("# ") {
            if let Some((key, _)) = rest.split_once(" = ") {
                if key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                    keys.insert(format!("{section}.{key}"));
                }
            }
        }
    }
    keys
}

/// A fuseboxd config shipped in deploy/: valid TOML, only documented keys, and the
/// fuseboxd NATS user with the password accounts.conf gives it.
fn check_fusebox_toml(what: &str, text: &str) {
    let doc: toml::Table =
        toml::from_str(text).unwrap_or_else(|e| panic!("{what}: not valid TOML: {e}"));
    let mut keys = BTreeSet::new();
    toml_keys("", &doc, &mut keys);
    let documented = documented_keys();
    let unknown: Vec<_> = keys.difference(&documented).collect();
    assert!(
        unknown.is_empty(),
        "{what}: keys config/fusebox.toml does not document (fuseboxd would refuse them): {unknown:?}"
    );
    let nats = doc["nats"].as_table().expect("[nats]");
    assert_eq!(nats["user"].as_str(), Some("fuseboxd"), "{what}");
    assert_eq!(
        nats["password"].as_str(),
        Some(deploy_nats::placeholder_password("fuseboxd").as_str()),
        "{what}: the fuseboxd password of deploy/nats/accounts.conf"
    );
    let listen = doc["metrics"]["listen"].as_str().expect("[metrics].listen");
    assert!(
        listen.starts_with("0.0.0.0:"),
        "{what}: in a container /metrics must listen beyond loopback, got {listen}"
    );
    // Cluster mode, if on, uses the servers' N; a node_id in a file shared by several
    // daemons would make them one node, so it comes from the environment instead.
    if let Some(cluster) = doc.get("cluster") {
        let partitions = cluster.get("partitions").and_then(toml::Value::as_integer);
        if partitions.unwrap_or(0) > 0 {
            assert_eq!(
                partitions,
                Some(i64::from(partitions_n())),
                "{what}: [cluster] partitions must be the N of deploy/nats/partitions.conf"
            );
            assert!(
                cluster.get("node_id").is_none(),
                "{what}: node_id belongs to each daemon (FUSEBOX_NODE_ID), not a shared file"
            );
        }
    }
}

/// [cluster] partitions of a deploy config (0 when absent: cluster mode off).
fn cluster_partitions(text: &str) -> i64 {
    let doc: toml::Table = toml::from_str(text).expect("TOML");
    doc.get("cluster")
        .and_then(|c| c.get("partitions"))
        .and_then(toml::Value::as_integer)
        .unwrap_or(0)
}

/// The N of deploy/nats/partitions.conf (its three mappings agree; nats_single checks).
fn partitions_n() -> u32 {
    let text = read(&deploy_dir().join("nats/partitions.conf"));
    let line = text
        .lines()
        .find(|l| l.starts_with("\"fusebox.gate."))
        .expect("the gate mapping");
    line.split("{{partition(")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .expect("partition(N, …)")
}

/// Every key fuseboxd's own sections accept (the fields of its `deny_unknown_fields`
/// structs in crates/fuseboxd/src/config.rs) is documented in config/fusebox.toml, so
/// an operator can find it there.
#[test]
fn every_daemon_config_key_is_documented() {
    let source = read(&repo_dir().join("crates/fuseboxd/src/config.rs"));
    let documented = documented_keys();
    let sections = [
        ("NatsConfig", "nats"),
        ("StorageConfig", "storage"),
        ("DaemonSection", "daemon"),
        ("MetricsConfig", "metrics"),
        ("ClusterConfig", "cluster"),
    ];
    for (name, section) in sections {
        let start = source
            .find(&format!("pub struct {name} {{"))
            .unwrap_or_else(|| panic!("config.rs: no struct {name}"));
        let body = &source[start..];
        let body = &body[..body.find("\n}").expect("end of struct")];
        let fields: Vec<&str> = body
            .lines()
            .skip(1)
            .filter_map(|l| l.trim().strip_prefix("pub "))
            .filter_map(|l| l.split_once(':').map(|(field, _)| field))
            .collect();
        assert!(!fields.is_empty(), "config.rs: {name} has no fields?");
        for field in fields {
            assert!(
                documented.contains(&format!("{section}.{field}")),
                "config/fusebox.toml does not document [{section}] {field}"
            );
        }
    }
}

// ---- systemd -------------------------------------------------------------------------

fn unit_values(text: &str) -> Vec<(String, String, String)> {
    let mut section = String::new();
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if line.starts_with('[') {
            section = line.trim_matches(['[', ']']).to_owned();
        } else if let Some((key, value)) = line.split_once('=') {
            out.push((section.clone(), key.to_owned(), value.to_owned()));
        }
    }
    out
}

#[test]
fn systemd_unit_is_hardened_and_verifies() {
    let path = deploy_dir().join("systemd/fuseboxd.service");
    let text = read(&path);
    let values = unit_values(&text);
    let get = |section: &str, key: &str| {
        values
            .iter()
            .find(|(s, k, _)| s == section && k == key)
            .map(|(_, _, v)| v.as_str())
            .unwrap_or_else(|| panic!("fuseboxd.service: [{section}] {key}= is missing"))
    };
    let exec = get("Service", "ExecStart");
    assert!(
        exec.contains("fuseboxd") && exec.contains("--config "),
        "ExecStart runs fuseboxd --config FILE: {exec}"
    );
    assert_eq!(get("Service", "DynamicUser"), "yes");
    assert_eq!(get("Service", "StateDirectory"), "fusebox");
    assert_eq!(get("Service", "ProtectSystem"), "strict");
    assert_eq!(get("Service", "Restart"), "on-failure");
    assert_eq!(get("Service", "NoNewPrivileges"), "yes");
    let stop: u32 = get("Service", "TimeoutStopSec")
        .parse()
        .expect("TimeoutStopSec in seconds");
    assert!(stop >= 10, "the drain needs time: TimeoutStopSec={stop}");
    // The data dir the daemon is told is the one systemd creates and allows writing.
    assert!(
        values.iter().any(|(s, k, v)| s == "Service"
            && k == "Environment"
            && v == "FUSEBOX_DATA_DIR=/var/lib/fusebox"),
        "Environment=FUSEBOX_DATA_DIR=/var/lib/fusebox matches StateDirectory=fusebox"
    );
    assert_eq!(get("Install", "WantedBy"), "multi-user.target");

    // systemd's own checker, when the machine has it. It insists the ExecStart binary
    // exists, so a copy points at an executable stub; everything else is the file as is.
    let Ok(out) = Command::new("systemd-analyze").arg("--version").output() else {
        eprintln!("systemd-analyze not installed: the unit was checked by parsing only");
        return;
    };
    assert!(out.status.success());
    let dir = tempfile::tempdir().expect("temp dir");
    let stub = dir.path().join("fuseboxd");
    std::fs::write(&stub, "#!/bin/sh\nexit 0\n").expect("stub");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&stub, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let unit = dir.path().join("fuseboxd.service");
    std::fs::write(
        &unit,
        deploy_nats::replace_required(
            &text,
            "/usr/local/bin/fuseboxd",
            &stub.display().to_string(),
            "fuseboxd.service ExecStart",
        ),
    )
    .expect("unit copy");
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&unit)
        .output()
        .expect("running systemd-analyze verify");
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Only complaints about our unit count (the host's other units are not ours).
    let ours: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("fuseboxd.service"))
        .collect();
    assert!(
        out.status.success() && ours.is_empty(),
        "systemd-analyze verify: {}\n{stderr}",
        out.status
    );
}

// ---- Kubernetes ----------------------------------------------------------------------

fn yaml_documents(path: &Path) -> Vec<Value> {
    use serde::Deserialize;
    let text = read(path);
    serde_norway::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .filter(|v| !v.is_null())
        .collect()
}

fn k8s_objects() -> Vec<Value> {
    let dir = deploy_dir().join("k8s");
    let kustomization = yaml_documents(&dir.join("kustomization.yaml"));
    let resources: Vec<String> = kustomization[0]["resources"]
        .as_sequence()
        .expect("kustomization resources")
        .iter()
        .map(|r| r.as_str().expect("resource path").to_owned())
        .collect();
    // Every manifest in the directory is listed, so `kubectl apply -k` applies them all.
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .expect("deploy/k8s")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml") && n != "kustomization.yaml")
        .collect();
    files.sort();
    let mut listed = resources.clone();
    listed.sort();
    assert_eq!(
        listed, files,
        "kustomization.yaml resources vs deploy/k8s/*.yaml"
    );
    resources
        .iter()
        .flat_map(|r| yaml_documents(&dir.join(r)))
        .collect()
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"].as_str() == Some(kind) && o["metadata"]["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("deploy/k8s: no {kind} {name}"))
}

#[test]
fn k8s_manifests_parse_and_fit_together() {
    let objects = k8s_objects();
    for o in &objects {
        assert!(
            o["apiVersion"].as_str().is_some() && o["kind"].as_str().is_some(),
            "every object has apiVersion and kind: {o:?}"
        );
    }

    // NATS: 3 replicas, a JetStream volume per pod, the cluster routes naming the pods.
    let nats = find(&objects, "StatefulSet", "nats");
    assert_eq!(nats["spec"]["replicas"].as_u64(), Some(3));
    assert!(nats["spec"]["volumeClaimTemplates"][0]["metadata"]["name"].as_str() == Some("data"));

    // fuseboxd: three replicas in cluster mode (below), its own volume per replica,
    // scrape annotations, probes, resources, and the non-root user of the Dockerfile.
    let daemon = find(&objects, "StatefulSet", "fuseboxd");
    let spec = &daemon["spec"];
    let replicas = spec["replicas"].as_u64().expect("fuseboxd replicas");
    assert_eq!(replicas, 3, "fuseboxd runs three daemons in cluster mode");
    assert!(
        replicas <= u64::from(partitions_n()),
        "more daemons than partitions would leave some idle"
    );
    assert!(
        spec["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"]
            .as_str()
            .is_some()
    );
    let pod = &spec["template"];
    assert_eq!(
        pod["metadata"]["annotations"]["prometheus.io/scrape"].as_str(),
        Some("true")
    );
    assert_eq!(
        pod["metadata"]["annotations"]["prometheus.io/port"].as_str(),
        Some("9464")
    );
    let container = &pod["spec"]["containers"][0];
    for resource in ["cpu", "memory"] {
        assert!(
            container["resources"]["requests"][resource]
                .as_str()
                .is_some(),
            "fuseboxd requests {resource}"
        );
    }
    assert_eq!(
        container["readinessProbe"]["httpGet"]["path"].as_str(),
        Some("/readyz")
    );
    assert_eq!(
        container["livenessProbe"]["httpGet"]["path"].as_str(),
        Some("/healthz")
    );
    assert_eq!(
        pod["spec"]["securityContext"]["runAsUser"].as_u64(),
        Some(10001)
    );
    let dockerfile = read(&deploy_dir().join("docker/Dockerfile"));
    assert!(
        dockerfile.contains("USER 10001:10001"),
        "same uid as the image"
    );
    let mounts: Vec<&str> = container["volumeMounts"]
        .as_sequence()
        .expect("mounts")
        .iter()
        .map(|m| m["mountPath"].as_str().expect("mountPath"))
        .collect();
    assert!(mounts.contains(&"/var/lib/fusebox") && mounts.contains(&"/etc/fusebox"));
    let args: Vec<&str> = container["args"]
        .as_sequence()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("arg"))
        .collect();
    assert_eq!(args, ["--config", "/etc/fusebox/fusebox.toml"]);
    // node_id = the pod's name (fuseboxd-0, -1, …: unique, stable, key-safe), through
    // the variable fuseboxd reads for --node-id.
    let node_id = container["env"]
        .as_sequence()
        .expect("env")
        .iter()
        .find(|e| e["name"].as_str() == Some("FUSEBOX_NODE_ID"))
        .expect("FUSEBOX_NODE_ID in the fuseboxd container's env");
    assert_eq!(
        node_id["valueFrom"]["fieldRef"]["fieldPath"].as_str(),
        Some("metadata.name")
    );
    let main = read(&repo_dir().join("crates/fuseboxd/src/main.rs"));
    assert!(
        main.contains("env = \"FUSEBOX_NODE_ID\""),
        "fuseboxd reads FUSEBOX_NODE_ID"
    );
    let pod_name = format!(
        "{}-{}",
        daemon["metadata"]["name"].as_str().expect("name"),
        replicas - 1
    );
    assert!(
        pod_name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
        "pod names must be valid node ids: {pod_name}"
    );

    // The metrics Service selects the daemon's pods and targets the named port.
    let service = find(&objects, "Service", "fuseboxd-metrics");
    assert_eq!(
        service["spec"]["selector"], spec["selector"]["matchLabels"],
        "the Service selects the StatefulSet's pods"
    );
    assert_eq!(service["spec"]["ports"][0]["port"].as_u64(), Some(9464));
    assert_eq!(spec["serviceName"].as_str(), Some("fuseboxd-metrics"));

    // The daemon's config: documented keys only, the right NATS user, every NATS pod.
    let config = find(&objects, "ConfigMap", "fuseboxd-config");
    let toml_text = config["data"]["fusebox.toml"]
        .as_str()
        .expect("fusebox.toml");
    check_fusebox_toml("deploy/k8s fusebox.toml", toml_text);
    let doc: toml::Table = toml::from_str(toml_text).expect("toml");
    let urls = doc["nats"]["urls"].as_array().expect("urls");
    assert_eq!(urls.len(), 3, "fuseboxd knows all three NATS pods");
    // Cluster mode on the mapping's N (checked in check_fusebox_toml), with every
    // JetStream object on all three NATS pods.
    assert_eq!(
        cluster_partitions(toml_text),
        i64::from(partitions_n()),
        "the k8s fuseboxd runs in cluster mode"
    );
    assert_eq!(
        doc["cluster"]["replicas"].as_integer(),
        nats["spec"]["replicas"].as_i64(),
        "[cluster] replicas = the NATS pods (R3)"
    );
}

#[test]
fn k8s_nats_config_matches_deploy_nats_and_passes_nats_server_t() {
    let objects = k8s_objects();
    let config = find(&objects, "ConfigMap", "nats-config");
    let data = config["data"].as_mapping().expect("data");
    let mut names: Vec<&str> = data
        .keys()
        .map(|k| k.as_str().expect("file name"))
        .collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "accounts.conf",
            "cluster-common.conf",
            "nats.conf",
            "partitions.conf"
        ],
        "the NATS ConfigMap holds nats.conf and everything it includes"
    );
    let dir = tempfile::tempdir().expect("temp dir");
    for (name, value) in data {
        let name = name.as_str().expect("file name");
        let text = value.as_str().expect("file text");
        if name != "nats.conf" {
            assert_eq!(
                text,
                read(&deploy_dir().join("nats").join(name)),
                "deploy/k8s/nats.yaml's copy of {name} differs from deploy/nats/{name}: \
                 paste the file into the ConfigMap again (indented by 4 spaces)"
            );
        }
        std::fs::write(dir.path().join(name), text).expect("write");
    }
    // `-t`: parse and validate the whole config (includes, accounts, mappings,
    // JetStream, cluster) and exit, without binding ports or resolving the routes.
    let out = Command::new(fusebox_e2e::nats::nats_server_bin())
        .arg("-t")
        .arg("-c")
        .arg(dir.path().join("nats.conf"))
        .env("POD_NAME", "nats-0")
        .output()
        .expect("running nats-server -t");
    assert!(
        out.status.success(),
        "nats-server -t rejects deploy/k8s/nats.yaml's nats.conf:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

// ---- Docker --------------------------------------------------------------------------

#[test]
fn compose_parses_and_its_files_exist() {
    let dir = deploy_dir().join("docker");
    let compose = &yaml_documents(&dir.join("compose.yml"))[0];
    let services = compose["services"].as_mapping().expect("services");
    for name in ["nats", "fuseboxd", "prometheus"] {
        assert!(
            services.contains_key(Value::from(name)),
            "compose.yml has a {name} service"
        );
    }
    // Every bind mount names a file or directory of this repo (relative to compose.yml).
    for (name, service) in services {
        for volume in service["volumes"].as_sequence().into_iter().flatten() {
            let volume = volume.as_str().expect("short volume syntax");
            let source = volume.split(':').next().expect("source");
            if source.starts_with('.') {
                assert!(
                    dir.join(source).exists(),
                    "compose.yml service {name:?} mounts {source}, which does not exist"
                );
            }
        }
    }
    let nats = &compose["services"]["nats"];
    let command: Vec<&str> = nats["command"]
        .as_sequence()
        .expect("nats command")
        .iter()
        .map(|c| c.as_str().expect("arg"))
        .collect();
    assert_eq!(command, ["-c", "/etc/nats/single.conf"]);
    // single.conf's JetStream store is on the nats-data volume.
    let single = read(&deploy_dir().join("nats/single.conf"));
    assert!(single.contains("store_dir: \"/var/lib/nats/jetstream\""));
    assert!(nats["volumes"]
        .as_sequence()
        .expect("volumes")
        .iter()
        .any(|v| v.as_str() == Some("nats-data:/var/lib/nats")));
    let daemon = &compose["services"]["fuseboxd"];
    assert_eq!(
        daemon["build"]["dockerfile"].as_str(),
        Some("deploy/docker/Dockerfile")
    );
    assert!(dir
        .join(daemon["build"]["context"].as_str().expect("context"))
        .join("Cargo.toml")
        .exists());
    let daemon_config = read(&dir.join("fusebox.toml"));
    check_fusebox_toml("deploy/docker/fusebox.toml", &daemon_config);
    // Without cluster mode exactly one daemon may serve the account.
    let daemons = services
        .values()
        .filter(|s| s["image"].as_str() == daemon["image"].as_str())
        .count();
    assert!(
        cluster_partitions(&daemon_config) > 0 || daemons == 1,
        "compose runs {daemons} fuseboxd without [cluster]: they would split runs"
    );

    // Prometheus in compose scrapes the fuseboxd service and loads the shared rules.
    let prometheus = &yaml_documents(&dir.join("prometheus.yml"))[0];
    assert_eq!(
        prometheus["scrape_configs"][0]["static_configs"][0]["targets"][0].as_str(),
        Some("fuseboxd:9464")
    );
}

#[test]
fn dockerfile_is_multi_stage_and_non_root() {
    let text = read(&deploy_dir().join("docker/Dockerfile"));
    let froms: Vec<&str> = text.lines().filter(|l| l.starts_with("FROM ")).collect();
    assert!(froms.len() >= 2, "a build and a runtime stage: {froms:?}");
    assert!(text.contains("cargo build --release --locked -p fuseboxd -p fusebox-cli"));
    let user = text
        .lines()
        .rfind(|l| l.starts_with("USER "))
        .expect("a USER line");
    assert!(!user.contains("root") && !user.contains(" 0"), "{user}");
    // The binaries the image copies are the ones those packages build.
    for (package, bin) in [
        ("fuseboxd", "fuseboxd"),
        ("fusebox-cli", "fusebox"),
        ("fusebox-hook-command", "fusebox-hook"),
    ] {
        let manifest = read(&repo_dir().join(format!("crates/{package}/Cargo.toml")));
        assert!(
            manifest.contains(&format!("name = \"{bin}\"")),
            "crates/{package} builds the binary {bin}"
        );
        assert!(text.contains(&format!("target/release/{bin}")));
    }
    // --config/--data-dir/--metrics-listen come from these variables (clap `env`).
    let main = read(&repo_dir().join("crates/fuseboxd/src/main.rs"));
    for var in [
        "FUSEBOX_CONFIG",
        "FUSEBOX_DATA_DIR",
        "FUSEBOX_METRICS_LISTEN",
    ] {
        assert!(
            main.contains(&format!("env = \"{var}\"")),
            "fuseboxd reads {var}"
        );
        assert!(text.contains(var), "the Dockerfile sets {var}");
    }
}
