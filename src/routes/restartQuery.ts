import { z } from 'zod';
import { BadRequestError, UnprocessableError } from '../shared/errors.js';
import { IDEMPOTENCY_TTL_SECONDS } from '../shared/jobs.js';
import { singleValued } from './request.js';

/**
 * The query of POST /ops/restart, parsed here so the change pipeline receives values; what they
 * mean (an inventory host, its Deployment) is the pipeline's to check (src/changes/restart.ts).
 */
/** A query parameter must be given exactly once and be non-empty. */
const queryParam = (name: string) =>
  z
    .string({
      error: (iss) =>
        iss.input === undefined ? `query parameter "${name}" is required` : `query parameter "${name}" must be given once, as a string`,
    })
    .min(1, `query parameter "${name}" is required`);

/** Query of POST /ops/restart: what validates it, and the OpenAPI parameters. */
export const restartQuerySchema = z.object({
  host: queryParam('host').describe('an inventory host (GET /ops/hosts)'),
  service: queryParam('service').describe("one of the host's Deployments in the inventory"),
});

/** IETF draft "The Idempotency-Key HTTP Header Field": an opaque string; we accept 1-255 printable ASCII characters. */
export const idempotencyKeySchema = z
  .string()
  .regex(/^[\x21-\x7e](?:[\x20-\x7e]{0,253}[\x21-\x7e])?$/, 'must be 1-255 printable ASCII characters')
  .describe(
    `makes a retried call return the original job instead of queuing a second one (remembered ${IDEMPOTENCY_TTL_SECONDS / 3600} h)`,
  );

/** The Idempotency-Key header of a change's request (restart, deploy), or undefined; 400 when malformed. */
export function idempotencyKeyOf(header: string | undefined): string | undefined {
  if (header === undefined) return undefined;
  const key = idempotencyKeySchema.safeParse(header);
  if (!key.success) throw new BadRequestError('Idempotency-Key header must be 1-255 printable ASCII characters', 'invalid_idempotency_key');
  return key.data;
}

export const restartAckSchema = z.object({
  host: z.string(),
  service: z.string(),
  status: z.literal('submitted'),
  job_id: z.string().describe('follow it with GET /ops/jobs/{id}'),
  coalesced: z.boolean().describe('true when an identical restart was still waiting or rolling out and this request joined it'),
});

const flag = (name: string) =>
  z
    .enum(['true', 'false', '1', '0'], { error: `query parameter "${name}" must be true or false` })
    .optional()
    .transform((v) => v === 'true' || v === '1');

/** The guard options of POST /ops/restart (query parameters). */
export const restartOptionsSchema = z.object({
  dry_run: flag('dry_run').describe(
    "change nothing: answer what would happen (the guards' verdicts) and what the Kubernetes API server says to the worker's own identity (a server-side dry run)",
  ),
  override: flag('override').describe('restart although a freeze or the change windows refuse it (needs reason; audited and notified)'),
  reason: z
    .string()
    .trim()
    .min(1, 'query parameter "reason" must not be blank')
    .max(500)
    .optional()
    .describe('why: audited, carried by the job, the approval and the notification'),
});

/** `?dry_run=true` of a change's route (a restart, a delivery's replay). */
export const dryRunQuerySchema = restartOptionsSchema.pick({ dry_run: true });

/** The parameters of `schema` in a request's query, each given once (422 otherwise). */
function optionsOf<S extends z.ZodObject>(schema: S, query: Record<string, unknown>): z.output<S> {
  const given = Object.keys(schema.shape).filter((k) => query[k] !== undefined);
  const raw = Object.fromEntries(given.map((k) => [k, query[k]]));
  singleValued(raw);
  const parsed = schema.safeParse(raw);
  if (!parsed.success) throw new UnprocessableError(parsed.error.issues[0]!.message, 'invalid_query');
  return parsed.data;
}

export function restartOptions(query: Record<string, unknown>): z.infer<typeof restartOptionsSchema> {
  const options = optionsOf(restartOptionsSchema, query);
  if (options.override && !options.reason)
    throw new UnprocessableError('override=true needs a reason (query parameter "reason")', 'invalid_query');
  return options;
}

export const dryRunQuery = (query: Record<string, unknown>): boolean => optionsOf(dryRunQuerySchema, query).dry_run;

/** The target's query parameters, each given once and non-empty (422 otherwise). */
export function restartTargetQuery(query: Record<string, unknown>): { host: string; service: string } {
  const q = restartQuerySchema.safeParse({ host: query.host, service: query.service });
  if (!q.success) throw new UnprocessableError(q.error.issues[0]!.message, 'invalid_query');
  return q.data;
}
