"""A scripted stand-in for the Anthropic model API, on loopback.

Claude Code (and the Claude Agent SDK, which drives it) honours ``ANTHROPIC_BASE_URL``;
pointed here, every ``POST /v1/messages`` of the agent loop is answered with the next
scripted turn, streamed as the real API streams it (``message_start``,
``content_block_start`` / ``*_delta`` / ``content_block_stop`` per block,
``message_delta`` with the stop reason and usage, ``message_stop``). Everything else the
CLI asks at start-up gets a minimal valid answer, and nothing reaches the network:
:meth:`FakeAnthropic.env` is the environment that keeps the CLI offline.

A test scripts turns and reads back what the agent sent::

    with FakeAnthropic([tool_use("Bash", {"command": "echo hi"}), text("done")]) as api:
        subprocess.run([claude, "-p", "go", ...], env=api.env(home=tmp_path))
        assert api.tool_results()[0].content == "hi"

A turn is a list of blocks (:func:`text`, :func:`tool_use`); a turn with a tool use ends
with ``stop_reason: tool_use``, otherwise ``end_turn``. ``forever=`` gives the turn
answered once the script is spent (a runaway agent: the same call for ever); without
it a spent script answers ``end_turn`` with the text "done".
"""

from __future__ import annotations

import itertools
import json
import secrets
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self

__all__ = [
    "Block",
    "FakeAnthropic",
    "SeenRequest",
    "ToolResult",
    "Turn",
    "text",
    "tool_use",
    "tool_uses",
]

MODEL = "claude-sonnet-4-5"


@dataclass(frozen=True)
class Block:
    """One content block of a scripted assistant turn."""

    type: str  # "text" | "tool_use"
    text: str = ""
    name: str = ""
    input: Mapping[str, Any] = field(default_factory=dict)


def text(words: str) -> list[Block]:
    """A turn that only speaks (ends the agent's loop: ``end_turn``)."""
    return [Block("text", text=words)]


def tool_use(name: str, input: Mapping[str, Any], *, say: str = "") -> list[Block]:
    """A turn that calls one tool (optionally after a sentence)."""
    blocks = [Block("text", text=say)] if say else []
    return [*blocks, Block("tool_use", name=name, input=dict(input))]


def tool_uses(*calls: tuple[str, Mapping[str, Any]]) -> list[Block]:
    """A turn with several tool calls in parallel."""
    return [Block("tool_use", name=name, input=dict(args)) for name, args in calls]


Turn = Sequence[Block]


@dataclass(frozen=True)
class ToolResult:
    """A ``tool_result`` block the agent sent back: what the model would read."""

    tool_use_id: str
    content: str
    is_error: bool


@dataclass(frozen=True)
class SeenRequest:
    """One request the stand-in received."""

    method: str
    path: str
    body: Any


def _flatten(content: Any) -> str:
    """A tool_result's content (a string or a list of text blocks) as one string."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(part.get("text", "")) for part in content if isinstance(part, dict)
        )
    return ""


def _sse(event: str, data: Mapping[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


class FakeAnthropic:
    """The stand-in server. Use as a context manager; thread-safe to read while it runs."""

    def __init__(
        self,
        script: Sequence[Turn] = (),
        *,
        forever: Turn | None = None,
        respond: Callable[[dict[str, Any]], Turn] | None = None,
    ) -> None:
        """``script``: the turns, in order. ``forever``: the turn once they are spent.
        ``respond``: instead of a script, a function of the request body (the agent's
        whole message history) that returns the next turn."""
        self._script = list(script)
        self._forever = forever
        self._respond = respond
        self._lock = threading.Lock()
        self._next_turn = 0
        self._ids = itertools.count(1)
        # Ids unique across servers too, as the real API's are: a resumed session (a
        # second server) must not repeat the first one's tool-use ids.
        self._instance = secrets.token_hex(4)
        self.requests: list[SeenRequest] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    # -- lifecycle -----------------------------------------------------------------

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def env(self, home: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment for a Claude Code process that talks only to this server.

        ``home`` becomes its HOME and config directory (a fresh one per test keeps the
        user's own settings, hooks and credentials out). ``base`` (default: nothing)
        is extended, e.g. with ``PATH``.
        """
        env = dict(base or {})
        env.update(
            {
                "HOME": str(home),
                "CLAUDE_CONFIG_DIR": str(home / ".claude"),
                "ANTHROPIC_BASE_URL": self.base_url,
                "ANTHROPIC_API_KEY": "sk-ant-fake-key-for-tests",
                "ANTHROPIC_MODEL": MODEL,
                "ANTHROPIC_SMALL_FAST_MODEL": MODEL,
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                "DISABLE_TELEMETRY": "1",
                "DISABLE_AUTOUPDATER": "1",
                "DISABLE_ERROR_REPORTING": "1",
                "DISABLE_BUG_COMMAND": "1",
                "CLAUDE_CODE_ENABLE_TELEMETRY": "0",
                "NO_PROXY": "127.0.0.1,localhost",
            }
        )
        return env

    # -- what the agent sent ---------------------------------------------------------

    def message_requests(self) -> list[Any]:
        """Bodies of the agent loop's ``/v1/messages`` requests, in order."""
        with self._lock:
            return [
                r.body
                for r in self.requests
                if r.path.startswith("/v1/messages") and _is_agent_turn(r.body)
            ]

    def tool_results(self) -> list[ToolResult]:
        """Every tool result the agent sent back, once each, in the order they came."""
        seen: dict[str, ToolResult] = {}
        for body in self.message_requests():
            for block in _tool_result_blocks(body):
                seen.setdefault(
                    str(block.get("tool_use_id")),
                    ToolResult(
                        tool_use_id=str(block.get("tool_use_id")),
                        content=_flatten(block.get("content")),
                        is_error=bool(block.get("is_error", False)),
                    ),
                )
        return list(seen.values())

    def turns_served(self) -> int:
        """How many scripted turns were answered (the forever turn counts each time)."""
        with self._lock:
            return self._next_turn

    # -- answering --------------------------------------------------------------------

    def _take_turn(self, body: dict[str, Any]) -> Turn:
        with self._lock:
            index = self._next_turn
            self._next_turn += 1
        if self._respond is not None:
            return self._respond(body)
        if index < len(self._script):
            return self._script[index]
        if self._forever is not None:
            return self._forever
        return text("done")

    def _record(self, request: SeenRequest) -> None:
        with self._lock:
            self.requests.append(request)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _body(self) -> Any:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    return json.loads(raw) if raw else None
                except ValueError:
                    return raw.decode(errors="replace")

            def _json(self, status: int, payload: Any) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                fake._record(SeenRequest("GET", self.path, None))
                self._json(200, _minimal_answer(self.path))

            def do_HEAD(self) -> None:
                fake._record(SeenRequest("HEAD", self.path, None))
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def do_POST(self) -> None:
                body = self._body()
                fake._record(SeenRequest("POST", self.path, body))
                path = self.path.split("?", 1)[0]
                if path == "/v1/messages/count_tokens":
                    self._json(200, {"input_tokens": 100})
                    return
                if path != "/v1/messages" or not isinstance(body, dict):
                    self._json(200, _minimal_answer(self.path))
                    return
                blocks: Turn = (
                    fake._take_turn(body) if _is_agent_turn(body) else text("ok")
                )
                message_id = f"msg_{fake._instance}_{next(fake._ids):05d}"
                if body.get("stream"):
                    self._stream(message_id, blocks)
                else:
                    self._json(200, _message(message_id, blocks))

            def _stream(self, message_id: str, blocks: Turn) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("cache-control", "no-cache")
                self.send_header("connection", "close")
                self.end_headers()
                for chunk in _events(message_id, blocks):
                    self.wfile.write(chunk)
                self.wfile.flush()
                self.close_connection = True

        return Handler


def _is_agent_turn(body: Any) -> bool:
    """A request of the agent loop (it offers tools), not a side request of the CLI
    (titles, quota probes, summaries), which must not consume the script."""
    return isinstance(body, dict) and bool(body.get("tools"))


def _tool_result_blocks(body: Any) -> Iterator[dict[str, Any]]:
    for message in body.get("messages", []) if isinstance(body, dict) else []:
        content = message.get("content") if isinstance(message, dict) else None
        if message.get("role") == "user" and isinstance(content, list):
            for block in content:
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    yield block


def _usage() -> dict[str, int]:
    return {
        "input_tokens": 120,
        "output_tokens": 30,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def _stop_reason(blocks: Turn) -> str:
    return "tool_use" if any(b.type == "tool_use" for b in blocks) else "end_turn"


def _tool_id(message_id: str, index: int) -> str:
    return f"toolu_{message_id.removeprefix('msg_')}_{index}"


def _content(message_id: str, blocks: Turn) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for index, block in enumerate(blocks):
        if block.type == "tool_use":
            out.append(
                {
                    "type": "tool_use",
                    "id": _tool_id(message_id, index),
                    "name": block.name,
                    "input": dict(block.input),
                }
            )
        else:
            out.append({"type": "text", "text": block.text})
    return out


def _message(message_id: str, blocks: Turn) -> dict[str, Any]:
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": MODEL,
        "content": _content(message_id, blocks),
        "stop_reason": _stop_reason(blocks),
        "stop_sequence": None,
        "usage": _usage(),
    }


def _events(message_id: str, blocks: Turn) -> Iterator[bytes]:
    start = _message(message_id, [])
    start["stop_reason"] = None
    start["usage"] = {**_usage(), "output_tokens": 1}
    yield _sse("message_start", {"type": "message_start", "message": start})
    yield _sse("ping", {"type": "ping"})
    for index, block in enumerate(_content(message_id, blocks)):
        if block["type"] == "tool_use":
            opening = {**block, "input": {}}
            delta = {
                "type": "input_json_delta",
                "partial_json": json.dumps(block["input"]),
            }
        else:
            opening = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": block["text"]}
        yield _sse(
            "content_block_start",
            {"type": "content_block_start", "index": index, "content_block": opening},
        )
        yield _sse(
            "content_block_delta",
            {"type": "content_block_delta", "index": index, "delta": delta},
        )
        yield _sse("content_block_stop", {"type": "content_block_stop", "index": index})
    yield _sse(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": _stop_reason(blocks), "stop_sequence": None},
            "usage": {"output_tokens": _usage()["output_tokens"]},
        },
    )
    yield _sse("message_stop", {"type": "message_stop"})


def _minimal_answer(path: str) -> Any:
    """Answers for the CLI's side endpoints: valid and empty."""
    if path.startswith("/v1/models"):
        return {
            "data": [{"type": "model", "id": MODEL, "display_name": MODEL}],
            "has_more": False,
            "first_id": MODEL,
            "last_id": MODEL,
        }
    return {}
