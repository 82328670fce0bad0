//! `fusebox.gate.<tenant>.<run>`: request/reply, any event in, its decision out after
//! the log commit. Subscribed with a queue group so several daemons can share the
//! subject (deploy configs partition runs across them).

use std::time::Instant;

use crate::applier::Input;
use crate::inbound::{parse_on, Inbound};
use crate::reject::Origin;

pub(crate) async fn handle(inbound: &Inbound, message: async_nats::Message) {
    let received = Instant::now();
    let parsed = parse_on(
        message.subject.as_str(),
        "gate",
        &message.payload,
        &inbound.accept,
    );
    let origin = Origin::Gate {
        message: Box::new(message),
        received,
    };
    match parsed {
        Ok(event) => inbound.queue(Input::Event { event, origin }).await,
        Err(err) => inbound.reject(origin, &err),
    }
}
