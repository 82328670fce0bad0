/**
 * fusebox-guard: put an agent's tool calls behind fuseboxd. The client asks the daemon
 * before every tool runs and does what it is told; it decides nothing itself.
 */
export { decodeDecision, Fusebox, type FuseboxOptions, newRunId } from "./client.js";
export {
  type ConnectOptions,
  type Credentials,
  connectNats,
  type TlsConfig,
} from "./connection.js";
export {
  BadAnswer,
  ConnectError,
  FuseboxError,
  GateTimeout,
  GuardUnavailable,
  NoResponders,
  PermissionDenied,
  Refused,
  RunExists,
  RunStopped,
  TransportError,
} from "./errors.js";
export { Gate } from "./gate.js";
export { keptStop, parseStop, StopWatch } from "./killswitch.js";
export {
  type ChildRunOptions,
  type ModelCallOptions,
  type ModelTurnOptions,
  Run,
  type RunOptions,
  type ToolCallOptions,
  type ToolResultOptions,
} from "./run.js";
export {
  type Action,
  type Decision,
  type Effect,
  type GateOnError,
  jsonable,
  letsToolRun,
  parseDecision,
  type ResultKind,
  type ResultMode,
  type StopReport,
  summary,
  type TerminalState,
  toText,
  type Usage,
} from "./types.js";
