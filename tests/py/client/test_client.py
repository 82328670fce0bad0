"""The client itself against a real nats-server and a real fuseboxd: connecting (every
credential kind, TLS, the deploy configs' tenant users), the envelope it owns, the error
kinds, result modes, the kill switch and the sync facade."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import nkeys  # type: ignore[import-untyped]
import pytest
from fusebox_guard import (
    Action,
    ConnectError,
    Fusebox,
    GateOnError,
    GateTimeout,
    NoResponders,
    Refused,
    ResultKind,
    ResultMode,
    RunExists,
    SyncFusebox,
    TLSConfig,
    Usage,
)
from fusebox_guard.client import decode_decision
from nats.aio.msg import Msg
from support.guard import (
    RUNAWAY_EXECUTIONS,
    TENANT,
    bare_nats,
    free_port,
    fresh_run,
    fusebox_cancel,
    run_status,
)
from support.nats_jwt import operator_setup
from support.stack import Stack

ROOT = Path(__file__).resolve().parents[3]


# --- connecting ------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_refused_first_connect_fails_at_once_with_the_reason() -> None:
    url = f"nats://127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(ConnectError) as err:
        await Fusebox.connect(url, tenant=TENANT, connect_timeout_s=2)
    assert time.monotonic() - started < 10  # not nats-py's minutes of reconnects
    assert url in str(err.value)
    assert "refused" in str(err.value).lower() or "connect" in str(err.value).lower()


@pytest.mark.parametrize(
    ("server_flags", "good", "bad"),
    [
        (
            ["--user", "agent", "--pass", "s3cret"],
            {"user": "agent", "password": "s3cret"},
            {"user": "agent", "password": "wrong"},
        ),
        (["--auth", "t0ken"], {"token": "t0ken"}, {"token": "other"}),
    ],
    ids=["user_password", "token"],
)
@pytest.mark.asyncio
async def test_credentials(
    server_flags: list[str], good: dict[str, Any], bad: dict[str, Any]
) -> None:
    with bare_nats(*server_flags) as url:
        fb = await Fusebox.connect(url, tenant=TENANT, **good)
        assert fb.nats.is_connected
        await fb.close()
        started = time.monotonic()
        with pytest.raises(ConnectError) as err:
            await Fusebox.connect(url, tenant=TENANT, **bad)
        assert time.monotonic() - started < 10
        assert "authorization" in str(err.value).lower()


@pytest.mark.asyncio
async def test_nkey_seed_file(tmp_path: Path) -> None:
    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    public = nkeys.from_seed(bytearray(seed)).public_key.decode()
    (tmp_path / "user.nk").write_bytes(seed)
    (tmp_path / "auth.conf").write_text(f'authorization {{ users: [ {{ nkey: "{public}" }} ] }}\n')
    with bare_nats("-c", str(tmp_path / "auth.conf")) as url:
        fb = await Fusebox.connect(url, tenant=TENANT, nkey_seed_file=str(tmp_path / "user.nk"))
        assert fb.nats.is_connected
        await fb.close()
        with pytest.raises(ConnectError):
            await Fusebox.connect(url, tenant=TENANT)


@pytest.mark.asyncio
async def test_creds_file(tmp_path: Path) -> None:
    config, agent, stranger = operator_setup(tmp_path)
    # Operator mode without a system account: no JetStream (not needed to connect).
    with bare_nats("-c", str(config), jetstream=False) as url:
        fb = await Fusebox.connect(url, tenant=TENANT, creds_file=str(agent))
        assert fb.nats.is_connected
        await fb.close()
        with pytest.raises(ConnectError) as err:
            await Fusebox.connect(url, tenant=TENANT, creds_file=str(stranger))
        assert "authorization" in str(err.value).lower()


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@pytest.fixture
def certs(tmp_path: Path) -> Path:
    """A CA, a server certificate for 127.0.0.1 and a client certificate."""
    d = tmp_path
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=fusebox-test-ca",
        "-keyout",
        str(d / "ca.key"),
        "-out",
        str(d / "ca.pem"),
    )
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name in ("server", "client"):
        _openssl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            f"/CN={name}",
            "-keyout",
            str(d / f"{name}.key"),
            "-out",
            str(d / f"{name}.csr"),
        )
        _openssl(
            "x509",
            "-req",
            "-in",
            str(d / f"{name}.csr"),
            "-CA",
            str(d / "ca.pem"),
            "-CAkey",
            str(d / "ca.key"),
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            str(d / "san.ext"),
            "-out",
            str(d / f"{name}.pem"),
        )
    return d


@pytest.mark.asyncio
async def test_mutual_tls(certs: Path) -> None:
    flags = [
        "--tlscert",
        str(certs / "server.pem"),
        "--tlskey",
        str(certs / "server.key"),
        "--tlscacert",
        str(certs / "ca.pem"),
        "--tlsverify",
    ]
    with bare_nats(*flags) as url:
        tls_url = url.replace("nats://", "tls://")
        mutual = TLSConfig(
            ca_file=str(certs / "ca.pem"),
            cert_file=str(certs / "client.pem"),
            key_file=str(certs / "client.key"),
        )
        fb = await Fusebox.connect(tls_url, tenant=TENANT, tls=mutual)
        assert fb.nats.is_connected
        await fb.close()
        # Without a client certificate the server refuses, and the error says so at once.
        with pytest.raises(ConnectError):
            await Fusebox.connect(
                tls_url, tenant=TENANT, tls=TLSConfig(ca_file=str(certs / "ca.pem"))
            )


def test_credential_kinds_are_exclusive() -> None:
    async def both() -> None:
        await Fusebox.connect(
            "nats://127.0.0.1:1", tenant=TENANT, token="t", user="u", password="p"
        )

    with pytest.raises(ValueError, match="at most one"):
        asyncio.run(both())


# --- the deploy configs: a tenant user of deploy/nats/accounts.conf ---------------------


@pytest.fixture(scope="module")
def deploy_stack() -> Iterator[str]:
    """nats-server with deploy/nats/single.conf (accounts, per-tenant permissions) and a
    fuseboxd logged in as its own user."""
    work = Path(tempfile.mkdtemp(prefix="fusebox-deploy-"))
    for name in ("single.conf", "accounts.conf", "partitions.conf"):
        shutil.copy(ROOT / "deploy/nats" / name, work / name)
    single = (work / "single.conf").read_text()
    single = single.replace("http: 0.0.0.0:8222", f"http: 127.0.0.1:{free_port()}")
    # bare_nats gives the server its own store dir (-sd); a second one is an error.
    single = re.sub(r"^\s*store_dir:.*$", "", single, flags=re.M)
    (work / "single.conf").write_text(single)
    config = (
        (ROOT / "config/fusebox.toml")
        .read_text()
        .replace(
            "[nats]\n",
            '[nats]\nuser = "fuseboxd"\npassword = "PLACEHOLDER-fuseboxd-change-me"\n',
            1,
        )
    )
    # No cloud watchdog here: nothing may look for EC2 credentials off loopback.
    config = without_watchdog(config)
    (work / "fusebox.toml").write_text(config)
    with bare_nats("-c", str(work / "single.conf")) as url:
        metrics = free_port()
        daemon = subprocess.Popen(
            [
                str(ROOT / "target/debug/fuseboxd"),
                "--config",
                str(work / "fusebox.toml"),
                "--nats-url",
                url,
                "--data-dir",
                str(work / "data"),
                "--metrics-listen",
                f"127.0.0.1:{metrics}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_ready(f"http://127.0.0.1:{metrics}/readyz", daemon)
            yield url
        finally:
            daemon.terminate()
            daemon.wait(10)
    shutil.rmtree(work, ignore_errors=True)


def without_watchdog(config: str) -> str:
    """The config with `[watchdog] enabled = false` (the shipped file has it on)."""
    lines = config.split("\n")
    start = lines.index("[watchdog]")
    for i in range(start + 1, len(lines)):
        if lines[i].startswith("["):
            break
        if lines[i].replace(" ", "") == "enabled=true":
            lines[i] = "enabled = false"
            return "\n".join(lines)
    raise AssertionError("config/fusebox.toml: no `enabled = true` in [watchdog]")


def wait_ready(url: str, daemon: subprocess.Popen[bytes]) -> None:
    """Until fuseboxd answers /readyz: a gate sent before it subscribes has no responder."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert daemon.poll() is None, f"fuseboxd exited with {daemon.returncode}"
        try:
            with urllib.request.urlopen(url, timeout=1) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"fuseboxd not ready at {url} within 30 s")


@pytest.mark.asyncio
async def test_a_tenant_user_gates_through_its_own_inbox_prefix(
    deploy_stack: str,
) -> None:
    creds: dict[str, Any] = {"user": "tenant-acme", "password": "PLACEHOLDER-tenant-acme-change-me"}
    fb = await Fusebox.connect(deploy_stack, tenant="acme", timeout_s=5, **creds)
    run = await fb.start_run(fresh_run("deploy"), agent="researcher")
    gate = await run.tool_call("search", {"query": "x"})
    assert gate.decision is not None and gate.may_run, gate
    passive = await fb.start_run(fresh_run("deploy-passive"), results=ResultMode.PASSIVE)
    gate = await passive.tool_call("search", {"query": "x"})
    assert gate.may_run
    assert await passive.tool_result(gate.call_id, "search", output={"hits": 1}) is None
    await run.close()
    await passive.close()
    await fb.close()
    # The shared default inbox is not the tenant's: its replies never arrive.
    wrong = await Fusebox.connect(
        deploy_stack, tenant="acme", inbox_prefix="_INBOX", timeout_s=1, **creds
    )
    gate = await wrong.run(fresh_run("deploy-wrong")).tool_call("search", {"query": "x"})
    assert not gate.may_run and gate.error is not None
    await wrong.close()


# --- the envelope ---------------------------------------------------------------------


@pytest.mark.asyncio
async def test_every_event_type_of_the_contract_is_accepted(
    stack: Stack,
) -> None:
    fb = await Fusebox.connect(stack.nats_url, tenant=TENANT)
    run = await fb.start_run(
        fresh_run("types"),
        agent="researcher",
        tools=["search"],
        policy={"max_steps": 50},
    )
    gate = await run.tool_call("search", {"query": "x"}, op_key=f"{run.id}:op", effect="write")
    assert gate.may_run
    results = [
        await run.tool_result(gate.call_id, "search", output={"hits": 1}, progress=1),
        await run.model_turn(
            "tool_use",
            usage=Usage(
                input_tokens=10,
                output_tokens=2,
                cache_read_input_tokens=5,
                cache_creation_input_tokens=1,
            ),
            cost_usd=0.01,
            valid=True,
        ),
        await run.progress(2, "cursor moved"),
        await run.compaction("context full"),
    ]
    # The stack's daemon runs no cloud watchdog: an instance it cannot watch is refused,
    # never silently accepted, and the refused event leaves no gap in the run's seq.
    with pytest.raises(Refused) as refused:
        await run.instance_launched("i-0123456789abcdef0", region="us-east-1", max_lifetime_s=60)
    assert refused.value.reason == "unwatched_provider"
    gate = await run.tool_call("search", args_hash="sha256:abc")
    assert gate.may_run
    results.append(
        await run.tool_result(
            gate.call_id,
            "search",
            ResultKind.RETRYABLE,
            code="rate_limited",
            retry_after_ms=10,
            output_hash="sha256:def",
        )
    )
    results.append(await run.finish("done"))
    assert all(d is not None for d in results)
    assert run.seq == 9
    # After run_finished the latch answers every call with stop, reason run_closed.
    late = await run.tool_call("search", {"query": "y"})
    assert late.stopped and late.decision is not None and late.decision.reason == "run_closed"
    await fb.close()


@pytest.mark.asyncio
async def test_a_retried_request_is_answered_from_the_daemons_dedup(
    stack: Stack,
) -> None:
    fb = await Fusebox.connect(stack.nats_url, tenant=TENANT)
    run_id = fresh_run("dedup")
    event = {
        "v": 1,
        "id": f"{run_id}-1",
        "tenant": TENANT,
        "run": run_id,
        "seq": 1,
        "ts_ms": 1,
        "type": "tool_call",
        "call_id": "c1",
        "tool": "search",
        "args": {"q": "x"},
        "op_key": f"{run_id}:once",
    }
    payload = json.dumps(event).encode()
    first = await fb.ask(run_id, payload, 2)
    again = await fb.ask(run_id, payload, 2)
    assert first.action is Action.EXECUTE
    # The same id is the same event: the original decision, not a second execution
    # (which an op_key in flight would have blocked).
    assert again.raw == first.raw
    await fb.close()


@pytest.mark.asyncio
@pytest.mark.parametrize("mode", [ResultMode.INLINE, ResultMode.PASSIVE])
async def test_a_restarted_worker_reusing_a_run_id_is_told_the_run_exists(
    stack: Stack, mode: ResultMode
) -> None:
    """Run-id reuse (issue 25 §3): a second process starting a run id the daemon already
    has gets `RunExists` naming the run from `start`, not the old process's decisions."""
    run_id = fresh_run(f"reused-{mode.value}")
    old = await Fusebox.connect(stack.nats_url, tenant=TENANT)
    first = await old.start_run(run_id)
    assert (await first.tool_call("search", {"q": "x"})).may_run
    await old.close()
    restarted = await Fusebox.connect(stack.nats_url, tenant=TENANT, results=mode)
    with pytest.raises(RunExists) as refused:
        await restarted.start_run(run_id)
    assert refused.value.reason == "run_exists"
    assert (refused.value.tenant, refused.value.run) == (TENANT, run_id)
    assert f"{TENANT}/{run_id} already exists" in str(refused.value)
    await restarted.close()


# --- error kinds ----------------------------------------------------------------------


@pytest.mark.asyncio
async def test_no_responders_timeout_and_refusal_are_told_apart(
    stack: Stack,
) -> None:
    with bare_nats() as url:
        fb = await Fusebox.connect(url, tenant=TENANT, timeout_s=0.3)
        run = fb.run(fresh_run("kinds"))
        gate = await run.tool_call("search", {"q": "x"})
        assert isinstance(gate.error, NoResponders) and not gate.may_run
        assert "did not run" in (gate.model_text or "")
        # A daemon that takes the request and never answers.
        silent = await nats.connect(url)

        async def swallow(msg: Msg) -> None:
            return None

        await silent.subscribe("fusebox.gate.>", cb=swallow)
        await silent.flush()
        gate = await fb.run(fresh_run("kinds"), gate_on_error=GateOnError.ALLOW).tool_call("s")
        assert isinstance(gate.error, GateTimeout) and gate.may_run  # allow, by choice
        await silent.close()
        await fb.close()
    fb = await Fusebox.connect(stack.nats_url, tenant=TENANT)
    run_id = fresh_run("kinds")
    wrong_tenant = {
        "v": 1,
        "id": "x1",
        "tenant": "someone-else",
        "run": run_id,
        "ts_ms": 1,
        "type": "tool_call",
        "call_id": "c",
        "tool": "t",
        "args": {},
    }
    with pytest.raises(Refused) as refused:
        await fb.ask(run_id, json.dumps(wrong_tenant).encode(), 2)
    assert refused.value.reason == "tenant_mismatch", refused.value
    await fb.close()


def test_decode_decision_rejects_what_is_not_a_decision() -> None:
    with pytest.raises(Exception, match="not JSON"):
        decode_decision("s", b"nope")
    with pytest.raises(Refused):
        decode_decision("s", b'{"error":{"reason":"malformed_json","message":"bad"}}')


@pytest.mark.asyncio
async def test_an_event_that_failed_is_resent_before_the_next_one() -> None:
    """A lost event would hold every later one (fuseboxd applies a run's events in `seq`
    order): the first request goes unanswered, and the next call re-sends it first."""
    with bare_nats() as url:
        seen: list[tuple[int, str]] = []
        daemon = await nats.connect(url)

        async def answer(msg: Msg) -> None:
            event = json.loads(msg.data)
            seen.append((event["seq"], event["id"]))
            if len(seen) == 1:
                return  # the first request is lost
            decision = {
                "v": 1,
                "tenant": event["tenant"],
                "run": event["run"],
                "event_id": event["id"],
                "action": "execute" if event["type"] == "tool_call" else "continue",
            }
            await msg.respond(json.dumps(decision).encode())

        await daemon.subscribe("fusebox.gate.>", cb=answer)
        await daemon.flush()
        fb = await Fusebox.connect(url, tenant=TENANT, timeout_s=0.3)
        run = fb.run(fresh_run("resend"))
        await run.start(watch_stop=False)  # run_started (seq 1) is the lost one
        assert isinstance(run.start_error, GateTimeout)
        first = await run.tool_call("search", {"q": 1})
        assert first.may_run
        assert [s for s, _ in seen] == [1, 1, 2]
        assert seen[0][1] == seen[1][1]  # the same id: the daemon dedups it
        await fb.close()
        await daemon.close()


@pytest.mark.asyncio
async def test_a_queued_run_started_refused_as_run_exists_sends_nothing_more() -> None:
    """The daemon unreachable at start: run_started waits in the queue. When the resent
    one is refused `run_exists`, the call behind it is not sent (its id would be the
    other process's, answered from the dedup) and is refused with `RunExists`."""
    with bare_nats() as url:
        daemon = await nats.connect(url)
        seen: list[str] = []

        async def answer(msg: Msg) -> None:
            event = json.loads(msg.data)
            seen.append(event["type"])
            if len(seen) == 1:
                return  # the first request is lost
            error = {"reason": "run_exists", "message": "run exists", "event_id": event["id"]}
            await msg.respond(json.dumps({"error": error}).encode())

        await daemon.subscribe("fusebox.gate.>", cb=answer)
        await daemon.flush()
        fb = await Fusebox.connect(url, tenant=TENANT, timeout_s=0.3)
        run = fb.run(fresh_run("exists"))
        await run.start(watch_stop=False)
        assert isinstance(run.start_error, GateTimeout)
        for q in (1, 2):
            gate = await run.tool_call("search", {"q": q})
            assert not gate.may_run and isinstance(gate.error, RunExists), gate
        assert seen == ["run_started", "run_started"]
        await fb.close()
        await daemon.close()


# --- result modes, kill switch, sync facade ---------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("mode", [ResultMode.INLINE, ResultMode.PASSIVE])
async def test_runaway_stops_in_either_result_mode(stack: Stack, mode: ResultMode) -> None:
    fb = await Fusebox.connect(stack.nats_url, tenant=TENANT, results=mode)
    run = await fb.start_run(fresh_run(f"mode-{mode.value}"), agent="researcher")
    executed = 0
    for _ in range(30):
        gate = await run.tool_call("search", {"query": "weather tokyo"})
        if gate.stopped:
            break
        if gate.may_run:
            executed += 1
            await run.tool_result(gate.call_id, "search", output={"hits": ["jma.go.jp"]})
    assert executed == RUNAWAY_EXECUTIONS
    assert run.stopped is not None and run.stopped.state_name == "STOPPED_LOOP_GUARD"
    # The kill switch carried the same stop.
    assert await run.wait_stopped(5) is not None
    await run.close()
    await fb.close()


@pytest.mark.asyncio
async def test_fusebox_cancel_reaches_the_watcher(stack: Stack) -> None:
    fb = await Fusebox.connect(stack.nats_url, tenant=TENANT)
    run = await fb.start_run(fresh_run("cancel"), agent="researcher")
    assert run.stopped is None
    await asyncio.to_thread(fusebox_cancel, stack, run.id, "budget review")
    report = await run.wait_stopped(10)
    assert report is not None and report.state_name == "CANCELLED"
    gate = await run.tool_call("search", {"query": "x"})
    assert gate.stopped and not gate.may_run  # refused before any round trip
    await run.close()
    await fb.close()


def test_sync_facade_runs_on_its_own_loop_thread(stack: Stack) -> None:
    with SyncFusebox.connect(stack.nats_url, tenant=TENANT) as fb:
        run = fb.start_run(fresh_run("sync"), agent="researcher")
        gate = run.tool_call("search", {"query": "x"})
        assert gate.may_run
        decision = run.tool_result(gate.call_id, "search", output={"hits": 1})
        assert decision is not None and decision.action is Action.CONTINUE
        assert run.finish("ok") is not None
        run.close()


@pytest.mark.asyncio
async def test_a_blocking_call_on_the_owning_loop_is_refused_not_deadlocked(
    stack: Stack,
) -> None:
    from fusebox_guard.sync import SyncRun

    fb = await Fusebox.connect(stack.nats_url, tenant=TENANT)
    blocking = SyncRun(fb.run(fresh_run("deadlock")))
    with pytest.raises(RuntimeError, match="deadlock"):
        blocking.tool_call("search", {})
    await fb.close()


async def _direct_get_on(url: str) -> None:
    """FUSEBOX_STOPS with `allow_direct` (killswitch-wire.md §5: fuseboxd turns it on; a
    daemon built before that change does not, so the test makes sure)."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    info = await js.stream_info("FUSEBOX_STOPS")
    if not info.config.allow_direct:
        info.config.allow_direct = True
        await js.update_stream(info.config)
    await nc.close()


@pytest.mark.asyncio
async def test_a_watcher_learns_a_stop_kept_from_before_it_subscribed(
    stack: Stack,
) -> None:
    await _direct_get_on(stack.nats_url)
    fb = await Fusebox.connect(stack.nats_url, tenant=TENANT)
    run_id = fresh_run("kept")
    first = await fb.start_run(run_id, agent="researcher")
    await asyncio.to_thread(fusebox_cancel, stack, run_id, "stopped before the worker came")
    assert await first.wait_stopped(10) is not None
    await first.close()
    # A second worker of the same run, started after the stop: it knows before any call.
    watch = await fb.watch_stop(run_id)
    assert watch.lookup_error is None
    assert watch.stop is not None and watch.stop.report is not None
    assert watch.stop.report.state_name == "CANCELLED"
    await watch.close()
    # And a run never stopped has nothing kept.
    fresh = await fb.watch_stop(fresh_run("kept-none"))
    assert fresh.lookup_error is None and fresh.stop is None
    await fresh.close()
    await fb.close()


async def test_an_event_the_daemon_refuses_leaves_no_gap_in_seq(stack: Stack) -> None:
    """The test stack's daemon takes events of at most 8 KiB (tests/harness write_config):
    a larger one is refused — never run, even under `allow` — and its `seq` goes to the
    next event, so the run is not held waiting for it."""
    fb = await Fusebox.connect(stack.nats_url, tenant=TENANT, gate_on_error=GateOnError.ALLOW)
    run = await fb.start_run(fresh_run("refused"), agent="researcher")
    big = await run.tool_call("write_file", {"content": "x" * 20_000})
    assert isinstance(big.error, Refused) and not big.may_run
    assert "did not run" in (big.model_text or "")
    after = await run.tool_call("search", {"query": "x"})
    assert after.may_run and after.decision is not None, after
    assert after.decision.seq == 2  # run_started = 1, the refused event gave its seq back
    status = await asyncio.to_thread(run_status, stack, run.id)
    assert status["summary"]["last_seq"] == 2
    await run.close()
    await fb.close()
