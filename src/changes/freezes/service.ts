import { z } from 'zod';
import { NotFoundError, UnprocessableError } from '../../shared/errors.js';
import { FREEZE_SCOPES, newFreezeId, type Freeze } from './store.js';
import { gateReasonSchema } from '../gate.js';
import type { Hold } from '../holds.js';
import { findProject } from '../../shared/inventory.js';
import { dnsLabel } from '../../shared/jobs.js';
import { parseDuration } from '../../shared/policy.js';
import type { Pipeline } from '../deps.js';
import { redisCall } from '../../domain/redisOps.js';

/**
 * Freezes (/ops/freezes): a restart one covers is refused, a deploy held. Lifting one promotes the delayed jobs it
 * held; the worker checks the gate again, so a deploy another freeze or its windows still cover is held again.
 */
const MAX_FREEZE_SECONDS = 30 * 86400;

const rfc3339 = z.iso.datetime({ offset: true, error: 'must be an RFC 3339 date-time such as 2026-12-24T18:00:00Z' });

export const freezeBodySchema = z.object({
  scope: z
    .enum(FREEZE_SCOPES)
    .describe('all: every change; namespace: restarts and deploys in one namespace; project: deploys of one project'),
  namespace: dnsLabel.optional().describe('scope namespace: a namespace of the inventory'),
  project: z.string().min(1).max(255).optional().describe('scope project: a project of the inventory'),
  reason: z.string().trim().min(1).max(500).describe('why; shown to whoever the freeze stops, audited'),
  ends_at: rfc3339.optional().describe('when it ends (RFC 3339); give this or duration'),
  duration: z.string().max(32).optional().describe('how long from starts_at, e.g. 2h, 90m, 3d; give this or ends_at'),
  starts_at: rfc3339.optional().describe('when it starts (RFC 3339); default now'),
});
type FreezeBody = z.infer<typeof freezeBodySchema>;

export const freezeViewSchema = z.object({
  id: z.string(),
  scope: z.enum(FREEZE_SCOPES),
  namespace: z.string().nullable(),
  project: z.string().nullable(),
  reason: z.string(),
  created_by: z.string(),
  created_at: z.string(),
  starts_at: z.string(),
  ends_at: z.string(),
  in_force: z.boolean().describe('started and not ended'),
});
type FreezeView = z.infer<typeof freezeViewSchema>;

export const liftBodySchema = z.object({ reason: z.string().trim().min(1).max(500).describe('why it is lifted early; audited') });

export const liftAnswerSchema = z.object({
  lifted: z.literal(true),
  freeze: freezeViewSchema,
  released: z
    .array(z.string())
    .describe('the held jobs promoted: each runs as soon as a worker is free (and is held again if another guard still applies)'),
});

export const holdViewSchema = z.object({
  job_id: z.string(),
  project: z.string(),
  ref: z.string(),
  namespace: z.string(),
  reasons: z.array(gateReasonSchema),
  until: z.string().describe('when it is expected to run'),
  held_at: z.string(),
  held_by: z.enum(['api', 'worker']).describe('api: held when queued; worker: held again when it woke to a closed gate'),
  requested_by: z.string(),
});
type HoldView = z.infer<typeof holdViewSchema>;

const iso = (ms: number) => new Date(ms).toISOString();

function freezeView(f: Freeze, now: number): FreezeView {
  return {
    id: f.id,
    scope: f.scope,
    namespace: f.namespace ?? null,
    project: f.project ?? null,
    reason: f.reason,
    created_by: f.created_by,
    created_at: iso(f.created_at),
    starts_at: iso(f.starts_at),
    ends_at: iso(f.ends_at),
    in_force: f.starts_at <= now && now < f.ends_at,
  };
}

export function holdView(h: Hold): HoldView {
  return {
    job_id: h.job_id,
    project: h.project,
    ref: h.ref,
    namespace: h.namespace,
    reasons: h.reasons,
    until: iso(h.until),
    held_at: iso(h.held_at),
    held_by: h.by,
    requested_by: h.requested_by,
  };
}

export async function declareFreeze(g: Pipeline, body: FreezeBody, by: string): Promise<FreezeView> {
  const now = g.now();
  // Every refusal here is a body field that does not fit the others or the inventory.
  const invalid = (detail: string) => new UnprocessableError(detail, 'invalid_body');
  if (body.scope === 'namespace') {
    if (!body.namespace) throw invalid('scope namespace needs namespace');
    const entries = [...Object.values(g.inventory.hosts), ...Object.values(g.inventory.projects)];
    if (!entries.some((e) => e.namespace === body.namespace))
      throw invalid(`namespace ${body.namespace} is not a namespace of the inventory`);
  } else if (body.namespace !== undefined) throw invalid(`namespace is only for scope namespace`);
  if (body.scope === 'project') {
    if (!body.project) throw invalid('scope project needs project');
    if (!findProject(g.inventory, body.project)) throw invalid(`project ${JSON.stringify(body.project)} is not in the inventory`);
  } else if (body.project !== undefined) throw invalid(`project is only for scope project`);

  const startsAt = body.starts_at !== undefined ? Date.parse(body.starts_at) : now;
  if (startsAt < now - 60_000) throw invalid('starts_at is in the past');
  if ((body.ends_at === undefined) === (body.duration === undefined)) throw invalid('give exactly one of ends_at or duration');
  let endsAt = Date.parse(body.ends_at ?? '');
  if (body.duration !== undefined) {
    const s = parseDuration(body.duration);
    if (s === undefined) throw invalid('duration must be a duration such as 90m, 2h or 3d');
    endsAt = startsAt + s * 1000;
  }
  if (endsAt <= Math.max(now, startsAt)) throw invalid('the freeze must end after it starts and after now');
  if (endsAt - now > MAX_FREEZE_SECONDS * 1000) throw invalid(`a freeze may last at most ${MAX_FREEZE_SECONDS / 86400} days from now`);

  const freeze: Freeze = {
    id: newFreezeId(),
    scope: body.scope,
    ...(body.scope === 'namespace' ? { namespace: body.namespace! } : {}),
    ...(body.scope === 'project' ? { project: body.project! } : {}),
    reason: body.reason,
    created_by: by,
    created_at: now,
    starts_at: Math.max(startsAt, now),
    ends_at: endsAt,
  };
  await redisCall(() => g.freezes.create(freeze), g.redis);
  await g.freezeWatch?.changed();
  g.metrics?.freezes.inc({ action: 'declared' });
  return freezeView(freeze, now);
}

export async function listFreezes(g: Pipeline): Promise<FreezeView[]> {
  const now = g.now();
  return (await redisCall(() => g.freezes.list(now), g.redis)).map((f) => freezeView(f, now));
}

export async function getFreeze(g: Pipeline, id: string): Promise<FreezeView> {
  const now = g.now();
  const f = await redisCall(() => g.freezes.get(id, now), g.redis);
  if (!f) throw new NotFoundError('freeze not found (or already ended)', 'freeze_not_found');
  return freezeView(f, now);
}

/** Lifts a freeze and promotes what it held. */
export async function liftFreeze(g: Pipeline, id: string): Promise<z.infer<typeof liftAnswerSchema>> {
  const now = g.now();
  const f = await redisCall(() => g.freezes.remove(id, now), g.redis);
  if (!f) throw new NotFoundError('freeze not found (or already ended)', 'freeze_not_found');
  await g.freezeWatch?.changed();
  g.metrics?.freezes.inc({ action: 'lifted' });
  const released: string[] = [];
  const holds = await redisCall(() => g.holds.all(), g.redis);
  for (const h of holds) {
    if (!h.reasons.some((r) => r.guard === 'freeze' && r.freeze_id === id)) continue;
    if (await g.producer.promote(h.job_id)) released.push(h.job_id);
    // Not delayed any more (run, removed): the record has nothing left to explain.
    else await g.holds.remove(h.job_id).catch(() => undefined);
  }
  return { lifted: true, freeze: freezeView(f, now), released };
}

/** The holds whose job still waits (`delayed`). */
export async function listHolds(g: Pipeline, stateOf: (jobId: string) => Promise<string | undefined>): Promise<HoldView[]> {
  const out: HoldView[] = [];
  for (const h of await redisCall(() => g.holds.all(), g.redis)) {
    if ((await stateOf(h.job_id)) === 'delayed') out.push(holdView(h));
  }
  return out;
}
