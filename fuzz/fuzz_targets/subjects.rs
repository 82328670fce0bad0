//! Subject parsing (`fusebox-nats`): any subject either parses or not without a panic,
//! and whatever parses names the subject it came from — building the subject from the
//! parsed parts parses to the same parts.
#![no_main]

use libfuzzer_sys::fuzz_target;

// `fusebox-nats/src/subjects.rs` uses nothing but `std`: included by path, so the fuzz
// build does not compile tokio, async-nats and rustls under the sanitizer for it.
#[path = "../../crates/fusebox-nats/src/subjects.rs"]
#[allow(dead_code)]
mod subjects;
use subjects::{control, parse_control, run_of, tenant_of, Control};

fuzz_target!(|data: &[u8]| {
    let Ok(subject) = std::str::from_utf8(data) else {
        return;
    };
    let _ = tenant_of(subject);
    for kind in ["gate", "events", "decisions", "stop"] {
        if let Some((tenant, run)) = run_of(subject, kind) {
            let rebuilt = format!("fusebox.{kind}.{tenant}.{run}");
            assert_eq!(run_of(&rebuilt, kind), Some((tenant, run)), "{subject:?}");
        }
    }
    if let Some(Control::Run { tenant, run, verb }) = parse_control(subject) {
        let rebuilt = control(tenant, run, verb);
        assert_eq!(
            parse_control(&rebuilt),
            Some(Control::Run { tenant, run, verb }),
            "{subject:?} -> {rebuilt:?}"
        );
    }
});
