/**
 * A scripted stand-in for the Anthropic model API, on loopback (tests/py/support/
 * fake_anthropic.py, the same wire): Claude Code, driven by the Claude Agent SDK, honours
 * `ANTHROPIC_BASE_URL`; every `POST /v1/messages` of the agent loop is answered with the
 * next scripted turn, streamed as the real API streams it. Side requests of the CLI get a
 * minimal valid answer, and nothing reaches the network.
 */
import { randomBytes } from "node:crypto";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";

export const MODEL = "claude-sonnet-4-5";

export type Block =
  | { type: "text"; text: string }
  | { type: "tool_use"; name: string; input: Record<string, unknown> };
export type Turn = Block[];
export type Body = {
  tools?: unknown[];
  stream?: boolean;
  messages?: Array<{ role: string; content: unknown }>;
};

export const text = (words: string): Turn => [{ type: "text", text: words }];

const usage = {
  input_tokens: 120,
  output_tokens: 30,
  cache_creation_input_tokens: 0,
  cache_read_input_tokens: 0,
};
const stopReason = (turn: Turn) =>
  turn.some((b) => b.type === "tool_use") ? "tool_use" : "end_turn";

function content(messageId: string, turn: Turn) {
  return turn.map((block, index) =>
    block.type === "tool_use"
      ? {
          type: "tool_use",
          id: `toolu_${messageId.slice(4)}_${index}`,
          name: block.name,
          input: block.input,
        }
      : { type: "text", text: block.text },
  );
}

function message(messageId: string, turn: Turn) {
  return {
    id: messageId,
    type: "message",
    role: "assistant",
    model: MODEL,
    content: content(messageId, turn),
    stop_reason: stopReason(turn),
    stop_sequence: null,
    usage,
  };
}

function* events(messageId: string, turn: Turn): Generator<string> {
  const sse = (event: string, data: unknown) =>
    `event: ${event}\ndata: ${JSON.stringify(data)}\n\n`;
  const start = {
    ...message(messageId, []),
    stop_reason: null,
    usage: { ...usage, output_tokens: 1 },
  };
  yield sse("message_start", { type: "message_start", message: start });
  for (const [index, block] of content(messageId, turn).entries()) {
    const opening =
      block.type === "tool_use" ? { ...block, input: {} } : { type: "text", text: "" };
    const delta =
      block.type === "tool_use"
        ? { type: "input_json_delta", partial_json: JSON.stringify(block.input) }
        : { type: "text_delta", text: block.text };
    yield sse("content_block_start", {
      type: "content_block_start",
      index,
      content_block: opening,
    });
    yield sse("content_block_delta", { type: "content_block_delta", index, delta });
    yield sse("content_block_stop", { type: "content_block_stop", index });
  }
  yield sse("message_delta", {
    type: "message_delta",
    delta: { stop_reason: stopReason(turn), stop_sequence: null },
    usage: { output_tokens: usage.output_tokens },
  });
  yield sse("message_stop", { type: "message_stop" });
}

/** A request of the agent loop (it offers tools), not a side request of the CLI. */
const isAgentTurn = (body: Body | null): boolean =>
  Array.isArray(body?.tools) && body.tools.length > 0;

export class FakeAnthropic {
  /** Bodies of the agent loop's `/v1/messages` requests, in order. */
  readonly agentRequests: Body[] = [];
  private readonly server: Server;
  private ids = 0;
  private readonly instance = randomBytes(4).toString("hex");

  constructor(private readonly respond: (body: Body, turn: number) => Turn) {
    this.server = createServer((req, res) => void this.handle(req, res));
  }

  async start(): Promise<this> {
    await new Promise<void>((done) => this.server.listen(0, "127.0.0.1", done));
    return this;
  }

  async stop(): Promise<void> {
    this.server.closeAllConnections();
    await new Promise((done) => this.server.close(done));
  }

  get baseUrl(): string {
    const address = this.server.address();
    return typeof address === "object" && address !== null
      ? `http://127.0.0.1:${address.port}`
      : "";
  }

  /** The environment for a Claude Code process that talks only to this server; `home`
   * becomes its HOME and config directory (the user's own settings stay out). */
  env(home: string): Record<string, string> {
    return {
      PATH: process.env.PATH ?? "/usr/bin:/bin",
      HOME: home,
      CLAUDE_CONFIG_DIR: `${home}/.claude`,
      ANTHROPIC_BASE_URL: this.baseUrl,
      ANTHROPIC_API_KEY: "sk-ant-fake-key-for-tests",
      ANTHROPIC_MODEL: MODEL,
      ANTHROPIC_SMALL_FAST_MODEL: MODEL,
      CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: "1",
      DISABLE_TELEMETRY: "1",
      DISABLE_AUTOUPDATER: "1",
      DISABLE_ERROR_REPORTING: "1",
      DISABLE_BUG_COMMAND: "1",
      CLAUDE_CODE_ENABLE_TELEMETRY: "0",
      NO_PROXY: "127.0.0.1,localhost",
    };
  }

  /** Every tool result the agent sent back, by tool-use id (the model's view). */
  toolResults(): Map<string, { content: string; isError: boolean }> {
    const out = new Map<string, { content: string; isError: boolean }>();
    for (const body of this.agentRequests) {
      for (const m of body.messages ?? []) {
        if (m.role !== "user" || !Array.isArray(m.content)) continue;
        for (const block of m.content as Array<Record<string, unknown>>) {
          if (block.type !== "tool_result" || out.has(String(block.tool_use_id))) continue;
          const raw = block.content;
          const flat = Array.isArray(raw)
            ? raw.map((c: { text?: string }) => c.text ?? JSON.stringify(c)).join("")
            : String(raw ?? "");
          out.set(String(block.tool_use_id), { content: flat, isError: Boolean(block.is_error) });
        }
      }
    }
    return out;
  }

  /** Tool-use ids the model asked for, in every request it got (to check none dangles). */
  toolUses(): Array<{ asked: string[]; answered: Set<string> }> {
    return this.agentRequests.map((body) => {
      const asked: string[] = [];
      const answered = new Set<string>();
      for (const m of body.messages ?? []) {
        if (!Array.isArray(m.content)) continue;
        for (const block of m.content as Array<Record<string, unknown>>) {
          if (block.type === "tool_use") asked.push(String(block.id));
          if (block.type === "tool_result") answered.add(String(block.tool_use_id));
        }
      }
      return { asked, answered };
    });
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const chunks: Buffer[] = [];
    for await (const chunk of req) chunks.push(chunk as Buffer);
    let body: Body | null = null;
    try {
      body = chunks.length > 0 ? (JSON.parse(Buffer.concat(chunks).toString()) as Body) : null;
    } catch {
      body = null;
    }
    const path = (req.url ?? "").split("?")[0] ?? "";
    const json = (payload: unknown) => {
      const data = JSON.stringify(payload);
      res.writeHead(200, {
        "content-type": "application/json",
        "content-length": Buffer.byteLength(data),
      });
      res.end(data);
    };
    if (req.method !== "POST") {
      if (path.startsWith("/v1/models")) {
        json({
          data: [{ type: "model", id: MODEL, display_name: MODEL }],
          has_more: false,
          first_id: MODEL,
          last_id: MODEL,
        });
      } else json({});
      return;
    }
    if (path === "/v1/messages/count_tokens") return json({ input_tokens: 100 });
    if (path !== "/v1/messages" || body === null) return json({});
    let turn: Turn = text("ok");
    if (isAgentTurn(body)) {
      this.agentRequests.push(body);
      turn = this.respond(body, this.agentRequests.length - 1);
    }
    this.ids += 1;
    const messageId = `msg_${this.instance}_${String(this.ids).padStart(5, "0")}`;
    if (!body.stream) return json(message(messageId, turn));
    res.writeHead(200, {
      "content-type": "text/event-stream",
      "cache-control": "no-cache",
      connection: "close",
    });
    for (const chunk of events(messageId, turn)) res.write(chunk);
    res.end();
  }
}
