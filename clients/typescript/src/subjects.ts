/** Subject names of interfaces.md §2 (mirrors crates/fusebox-nats/src/subjects.rs). */

export const STOPS_STREAM = "FUSEBOX_STOPS";

export const gate = (tenant: string, run: string): string => `fusebox.gate.${tenant}.${run}`;
export const events = (tenant: string, run: string): string => `fusebox.events.${tenant}.${run}`;
export const stop = (tenant: string, run: string): string => `fusebox.stop.${tenant}.${run}`;

/** A run of a tree on the wire: its tree's root before it (the plain form for the root
 * itself), so a cluster serves the whole tree in the root's partition. */
export const treeGate = (tenant: string, root: string, run: string): string =>
  root === run ? gate(tenant, run) : `fusebox.gate.${tenant}.${root}.${run}`;
/** `treeGate`'s form for the events stream. */
export const treeEvents = (tenant: string, root: string, run: string): string =>
  root === run ? events(tenant, run) : `fusebox.events.${tenant}.${root}.${run}`;

const ID = /^[A-Za-z0-9_-]+$/;

/** Tenant and run ids are subject tokens: `[A-Za-z0-9_-]{1,maxLen}`. */
export function checkId(what: string, value: string, maxLen: number): string {
  if (value.length === 0 || value.length > maxLen || !ID.test(value)) {
    throw new RangeError(`${what} ${JSON.stringify(value)} must be 1-${maxLen} of A-Z a-z 0-9 _ -`);
  }
  return value;
}
