"""Scripted stand-ins for the OpenAI Responses API (Codex CLI) and the Gemini API
(Gemini CLI), on loopback.

Each answers every model request of the agent loop with the next scripted turn,
streamed as the CLI reads it (the shapes seen with Codex CLI 0.171 and Gemini CLI 0.61,
/work/shared/notes/coding-agents-and-typescript.md), and records what the agent sent, so
a test reads back what the model was told (tool outputs, hook context). A turn is a
shell command (:func:`shell`) or a closing text (:func:`say`); ``respond`` gives the
turn as a function of the turn's number instead of a script::

    with FakeResponses(respond=lambda n: shell("echo hi") if n < 3 else say("done")) as api:
        ...  # codex exec with base_url = api.base_url + "/v1"
        api.tool_outputs()  # what each call's output said, in order
"""

from __future__ import annotations

import itertools
import json
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

__all__ = ["FakeGemini", "FakeResponses", "Turn", "say", "shell"]


@dataclass(frozen=True)
class Turn:
    """What the model answers: a shell command to run, or words that end the loop."""

    command: str | None = None
    text: str = ""


def shell(command: str) -> Turn:
    return Turn(command=command)


def say(words: str) -> Turn:
    return Turn(text=words)


class _FakeModel(ABC):
    """The server and the script; subclasses speak one API."""

    def __init__(
        self,
        script: Sequence[Turn] = (),
        *,
        respond: Callable[[int], Turn] | None = None,
    ) -> None:
        self._script = list(script)
        self._respond = respond
        self._lock = threading.Lock()
        self._turns = 0
        self.bodies: list[Any] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

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

    def turns_served(self) -> int:
        with self._lock:
            return self._turns

    def _next_turn(self) -> Turn:
        with self._lock:
            index = self._turns
            self._turns += 1
        if self._respond is not None:
            return self._respond(index)
        return self._script[index] if index < len(self._script) else say("done")

    def _turn_for(self, body: Any) -> Turn:
        """The turn answering the request `body` (the script's next, by default)."""
        return self._next_turn()

    def _record(self, body: Any) -> None:
        with self._lock:
            self.bodies.append(body)

    # -- the API --------------------------------------------------------------------------

    @abstractmethod
    def _is_turn(self, path: str, body: Any) -> bool:
        """Whether this request asks the model for its next turn."""

    @abstractmethod
    def _stream(self, turn: Turn) -> list[bytes]:
        """The turn in the API's own streamed wire format."""

    def _other(self, path: str) -> Any:
        return {}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _json(self, payload: Any) -> None:
                data = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._json(fake._other(self.path))

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = None
                if not fake._is_turn(self.path, body):
                    self._json(fake._other(self.path))
                    return
                fake._record(body)
                chunks = fake._stream(fake._turn_for(body))
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("cache-control", "no-cache")
                self.send_header("connection", "close")
                self.end_headers()
                for chunk in chunks:
                    self.wfile.write(chunk)
                self.wfile.flush()
                self.close_connection = True

        return Handler


class FakeResponses(_FakeModel):
    """The OpenAI Responses API as Codex CLI streams it (``POST /v1/responses``)."""

    _ids = itertools.count(1)

    def _is_turn(self, path: str, body: Any) -> bool:
        return path.split("?")[0].endswith("/responses") and isinstance(body, dict)

    def _stream(self, turn: Turn) -> list[bytes]:
        n = next(self._ids)
        if turn.command is not None:
            item: dict[str, Any] = {
                "type": "function_call",
                "id": f"fc_{n}",
                "call_id": f"call_{n}",
                "name": "exec_command",
                "arguments": json.dumps({"cmd": turn.command}),
                "status": "completed",
            }
        else:
            item = {
                "type": "message",
                "id": f"msg_{n}",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": turn.text, "annotations": []}],
            }
        response: dict[str, Any] = {
            "id": f"resp_{n}",
            "object": "response",
            "status": "in_progress",
            "output": [],
        }
        usage = {
            "input_tokens": 100,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 10,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 110,
        }
        done = {**response, "status": "completed", "output": [item], "usage": usage}
        events: list[tuple[str, dict[str, Any]]] = [
            ("response.created", {"response": response}),
            ("response.output_item.done", {"output_index": 0, "item": item}),
            ("response.completed", {"response": done}),
        ]
        return [
            f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode()
            for kind, data in events
        ]

    def tool_outputs(self) -> list[str]:
        """Each call's output as the model read it, once each, in order."""
        seen: dict[str, str] = {}
        for body in self.bodies:
            for item in body.get("input", []):
                if isinstance(item, dict) and item.get("type") == "function_call_output":
                    output = item.get("output")
                    seen.setdefault(str(item.get("call_id")), _text(output))
        return list(seen.values())

    def context_seen(self) -> list[str]:
        """Developer messages that came from hooks (`fusebox: …`)."""
        found: list[str] = []
        for item in self.bodies[-1].get("input", []) if self.bodies else []:
            if isinstance(item, dict) and item.get("role") == "developer":
                words = _text(item.get("content"))
                if "fusebox:" in words:
                    found.append(words)
        return found


class FakeGemini(_FakeModel):
    """The Gemini API as Gemini CLI streams it (``:streamGenerateContent?alt=sse``)."""

    def _is_turn(self, path: str, body: Any) -> bool:
        return ":streamGenerateContent" in path and isinstance(body, dict)

    def _other(self, path: str) -> Any:
        if ":countTokens" in path:
            return {"totalTokens": 100}
        # Side requests (e.g. a next-speaker check) get an empty JSON answer.
        return {"candidates": [{"content": {"role": "model", "parts": [{"text": "{}"}]}}]}

    def _stream(self, turn: Turn) -> list[bytes]:
        if turn.command is not None:
            part: dict[str, Any] = {
                "functionCall": {"name": "run_shell_command", "args": {"command": turn.command}}
            }
        else:
            part = {"text": turn.text}
        chunk = {
            "candidates": [
                {"content": {"role": "model", "parts": [part]}, "finishReason": "STOP", "index": 0}
            ],
            "usageMetadata": {
                "promptTokenCount": 100,
                "candidatesTokenCount": 10,
                "totalTokenCount": 110,
            },
            "modelVersion": "gemini-2.5-flash",
        }
        return [f"data: {json.dumps(chunk)}\n\n".encode()]

    def tool_outputs(self) -> list[str]:
        """Each call's result as the model read it, in order (the last request holds the
        whole history)."""
        outputs: list[str] = []
        for message in self.bodies[-1].get("contents", []) if self.bodies else []:
            for part in message.get("parts", []):
                response = part.get("functionResponse") if isinstance(part, dict) else None
                if response:
                    outputs.append(json.dumps(response.get("response")))
        return outputs


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return json.dumps(content)
