/**
 * Where a server's CPU goes, by feature, from a V8 CPU profile (`node --cpu-prof`): used by
 * `make bench-profile` (bench/profile.ts) to show where the time goes.
 *
 * Each sample is charged to the innermost frame on its stack that names a feature: a module of
 * ours (src/middleware/observe.js -> "audit line + metrics", ...), or Express's router dispatch
 * (the calls between middleware). Library code is charged to the feature of ours that called it:
 * pino's work under observe is the audit line's, BullMQ's and ioredis's under the producer are the
 * producer's.
 * A stack with no such frame (socket reads, HTTP parsing, ioredis reply parsing, timers, promise
 * jobs) is "node core"; GC, idle and V8's own (program) samples have their own rows.
 */

export interface CpuProfileNode {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number };
  children?: number[];
}

export interface CpuProfile {
  nodes: CpuProfileNode[];
  samples: number[];
  timeDeltas: number[];
  /** Microseconds on the monotonic clock (CLOCK_MONOTONIC, as process.hrtime) of the first sample's reference. */
  startTime: number;
}

export const NODE_CORE = 'HTTP server, sockets, replies, promise jobs (node core)';
export const IDLE = 'idle';

/** Files of ours (under dist/src or dist/bench) and the feature they implement. */
const OURS: ReadonlyArray<[RegExp, string]> = [
  [/^src\/middleware\/context$/, 'request id, security headers'],
  [/^src\/(middleware\/observe|shared\/logger|shared\/metrics)$/, 'audit line + metrics'],
  [/^src\/(middleware|shared)\/rateLimit$/, 'rate limit'],
  [/^src\/middleware\/(auth|clientCert)$/, 'sender auth (token)'],
  [/^src\/middleware\/body$/, 'body read, SHA-256, JSON.parse'],
  [/^src\/routes\//, 'route handler + JSON answer'],
  [/^src\/(domain\/(deploy|alerts)|shared\/jobs)$/, 'decide + validate (zod)'],
  [/^src\/domain\/intake$/, 'intake: delivery-id alias, version 0.1 records'],
  [/^src\/shared\/producer$/, 'Queue#add / addBulk with deduplication (producer, its zod check)'],
  [/^src\/domain\/deliveries$/, 'delivery record (XADD)'],
  [/^src\/domain\/replication$/, 'replication check (REDIS_MIN_REPLICAS_ACK)'],
  // Helpers of several features: charged to their caller (a sender's signature check is the auth's,
  // its payload mapping the decision's, the body's SHA-256 the body reader's, the queue's time bound the producer's).
  [/^src\/sources\//, ''],
  [/^src\/shared\/(crypto|keys|lua|timeout|redis|redisConnection|queue|queueGuard|errors)$/, ''],
  [/^src\/domain\/redisOps$/, ''],
  [/^bench\/specMinimum$/, 'control handler (SET NX, Queue.add, answer)'],
  [/^bench\/publicFloor$/, 'floor handler (Queue#add with deduplication, answer)'],
  [/^bench\/bareExpress$/, 'bare handler (answer)'],
];

/** Express 5's router: the functions that run between two middleware. */
const ROUTER_DISPATCH = /^(handle|next|processParams|trimPrefix|handleRequest|dispatch|router|matchLayer|match)$/;

/** The feature a frame names, or undefined when the frame is charged to its caller. */
export function featureOf(frame: CpuProfileNode['callFrame']): string | undefined {
  const { url, functionName } = frame;
  if (!url) {
    if (functionName === '(garbage collector)') return 'GC';
    if (functionName === '(idle)') return IDLE;
    if (functionName === '(program)') return 'V8 (program)';
    return undefined;
  }
  const ours = /\/dist\/(?:bench\/)?((?:src|bench|worker)\/.*)\.js$/.exec(url);
  if (ours) {
    const file = ours[1]!;
    for (const [re, name] of OURS) if (re.test(file)) return name || undefined;
    return `other of ours (${file})`;
  }
  if (/\/node_modules\/router\//.test(url) && ROUTER_DISPATCH.test(functionName)) return 'Express routing/dispatch';
  return undefined;
}

/**
 * Busy (non-idle) main-thread time per feature, in microseconds, from a CPU profile; with
 * `window` ([from, to] in monotonic microseconds, as process.hrtime.bigint() / 1000n), only the
 * samples taken inside it (the measured load, not start-up or warm-up).
 */
export function attribute(profile: CpuProfile, window?: readonly [number, number]): Map<string, number> {
  const byId = new Map(profile.nodes.map((n) => [n.id, n]));
  const parent = new Map<number, number>();
  for (const n of profile.nodes) for (const c of n.children ?? []) parent.set(c, n.id);
  const perNode = new Map<number, number>();
  let t = profile.startTime;
  profile.samples.forEach((id, i) => {
    const dt = profile.timeDeltas[i] ?? 0;
    t += dt;
    if (window && (t < window[0] || t > window[1])) return;
    perNode.set(id, (perNode.get(id) ?? 0) + dt);
  });
  const out = new Map<string, number>();
  for (const [id, us] of perNode) {
    let feature: string | undefined;
    for (let cur: number | undefined = id; cur !== undefined && !feature; cur = parent.get(cur))
      feature = featureOf(byId.get(cur)!.callFrame);
    feature ??= NODE_CORE;
    if (feature === IDLE) continue;
    out.set(feature, (out.get(feature) ?? 0) + us);
  }
  return out;
}
