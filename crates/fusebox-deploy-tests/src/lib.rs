//! Nothing here: this crate exists for its `tests/`, which start nats-server with the
//! configs in `deploy/nats/` and check the rest of `deploy/` (see deploy/README.md).
