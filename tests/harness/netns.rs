//! Network namespaces and veth pairs a test makes for itself, for real network faults:
//! a link cut with `ip link set … down` is a partition (packets vanish, no RST), healed
//! with `up`. Everything lives in the test's own namespaces and addresses; each is
//! removed on drop, also when the test panics. Needs root (CI runs as root).

use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip").args(args).output().map_err(|e| {
        format!("cannot run ip ({e}); the network-fault tests need iproute2 and root")
    })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn must(args: &[&str]) {
    if let Err(err) = ip(args) {
        panic!("{err}");
    }
}

/// A short name unique to this process and call: interface names are at most 15 bytes.
fn unique(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}{}x{n}", std::process::id() % 100_000)
}

/// A network namespace of the test's own, with its loopback up.
pub struct Netns {
    name: String,
}

impl Netns {
    // No Default: making a namespace changes the host, so it is never done implicitly.
    #[allow(clippy::new_without_default)]
    pub fn new() -> Netns {
        let name = unique("fbns");
        must(&["netns", "add", &name]);
        let ns = Netns { name };
        must(&["-n", &ns.name, "link", "set", "lo", "up"]);
        ns
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// `program` run inside the namespace (`ip netns exec` execs it: same pid).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name]).arg(program);
        cmd
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.name]);
    }
}

/// A veth pair: one end in the root namespace (where the test, the daemon and the
/// clients run), the other in `ns`, each with an address of a /30 the test picked.
pub struct Veth {
    host_if: String,
    /// The root namespace's address on the link.
    pub host_ip: Ipv4Addr,
    /// The namespace's address on the link.
    pub ns_ip: Ipv4Addr,
}

impl Veth {
    pub fn new(ns: &Netns) -> Veth {
        let host_if = unique("fbh");
        let ns_if = unique("fbn");
        must(&[
            "link",
            "add",
            &host_if,
            "type",
            "veth",
            "peer",
            "name",
            &ns_if,
            "netns",
            ns.name(),
        ]);
        // A /30 in 10.200.0.0/16 picked from the pid and a counter, skipping one that an
        // interface of this (shared) machine already uses.
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let veth = loop {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            assert!(n < 256, "no free /30 in 10.200.0.0/16");
            let block = std::process::id()
                .wrapping_mul(7919)
                .wrapping_add(n)
                .wrapping_mul(4)
                % 65_536;
            let base = u32::from(Ipv4Addr::new(10, 200, 0, 0)) + block;
            let net = format!("{}/30", Ipv4Addr::from(base));
            let used = Command::new("ip")
                .args(["-o", "-4", "addr", "show", "to", &net])
                .output()
                .map(|o| !o.stdout.is_empty())
                .unwrap_or(true);
            if used {
                continue;
            }
            let host_ip = Ipv4Addr::from(base + 1);
            let ns_ip = Ipv4Addr::from(base + 2);
            must(&["addr", "add", &format!("{host_ip}/30"), "dev", &host_if]);
            break Veth {
                host_if,
                host_ip,
                ns_ip,
            };
        };
        must(&[
            "-n",
            ns.name(),
            "addr",
            "add",
            &format!("{}/30", veth.ns_ip),
            "dev",
            &ns_if,
        ]);
        must(&["-n", ns.name(), "link", "set", &ns_if, "up"]);
        must(&["link", "set", &veth.host_if, "up"]);
        veth
    }

    /// The partition: the link goes down, packets on it are dropped silently.
    pub fn cut(&self) {
        must(&["link", "set", &self.host_if, "down"]);
    }

    pub fn heal(&self) {
        must(&["link", "set", &self.host_if, "up"]);
    }
}

impl Drop for Veth {
    fn drop(&mut self) {
        // Deleting one end deletes the pair.
        let _ = ip(&["link", "del", &self.host_if]);
    }
}
