/**
 * The Claude Agent SDK pieces its suites share: the scenario tools as in-process SDK MCP
 * tools that log what they really executed, scripted calls as Claude tool uses of them,
 * and a fresh HOME and working directory for the Claude Code binary.
 */
import { mkdirSync, mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createSdkMcpServer, tool } from "@anthropic-ai/claude-agent-sdk";
import { z } from "zod";
import type { Turn } from "./fake-anthropic.js";
import {
  listIssuesOutput,
  openPageOutput,
  searchOutput,
  sendEmailOutput,
  type ToolLog,
} from "./guard.js";
import type { Call } from "./scenarios.js";

export const SERVER = "tools";
/** What Claude Code calls a tool of the `SERVER` MCP server. */
export const PREFIX = `mcp__${SERVER}__`;
export const TOOLS = ["search", "open_page", "list_issues", "send_email"];

/** The `SERVER` MCP server with the scenario tools of `names`; `onTool` runs inside each
 * execution. */
export function makeServer(
  log: ToolLog,
  onTool?: (executions: number) => Promise<void>,
  names: readonly string[] = TOOLS,
) {
  const ran = async (name: string, args: unknown, output: unknown) => {
    log.calls.push([name, args]);
    await onTool?.(log.calls.length);
    return { content: [{ type: "text" as const, text: JSON.stringify(output) }] };
  };
  return createSdkMcpServer({
    name: SERVER,
    tools: [
      tool("search", "Search the web", { query: z.string() }, (a) =>
        ran("search", a, searchOutput(a.query)),
      ),
      tool("open_page", "Open a web page", { url: z.string() }, (a) =>
        ran("open_page", a, openPageOutput(a.url)),
      ),
      tool("list_issues", "List issues, one page at a time", { page: z.number() }, (a) =>
        ran("list_issues", a, listIssuesOutput(a.page)),
      ),
      tool("send_email", "Send an email", { to: z.string(), incident: z.string() }, (a) =>
        ran("send_email", a, sendEmailOutput(a.to)),
      ),
    ].filter((t) => names.includes(t.name)),
  });
}

/** The calls as one model turn of Claude tool uses of the `SERVER` tools. */
export const toolUses = (calls: Call[]): Turn =>
  calls.map(([name, input]) => ({ type: "tool_use" as const, name: PREFIX + name, input }));

/** A fresh HOME (no user settings) and working directory, under a new temporary
 * directory named from `prefix`. */
export function workspace(prefix: string): { home: string; work: string } {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  const home = join(dir, "home");
  const work = join(dir, "work");
  mkdirSync(home);
  mkdirSync(work);
  return { home, work };
}
