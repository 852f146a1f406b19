import { z } from 'zod';
import { idempotencyKeySchema, restartAckSchema, restartQuerySchema } from '../domain/restart.js';
import { jobListSchema, jobViewSchema, listJobsQuerySchema, retryAnswerSchema, retryBodySchema } from '../routes/jobs.js';
import type { ResponseDoc, RouteDoc } from './document.js';

/**
 * THE registry of the API's routes for GET /openapi.json: one entry per method and path.
 * Adding a route to the Express app means adding its entry here; test/integration/api/openapi.test.ts
 * fails for a route the app serves that this list lacks, and for a documented status that no
 * request in that test produces.
 *
 * Request schemas are the ones the code validates with where the code validates with zod
 * (restart query, Idempotency-Key, jobs query, retry body); the webhook payloads are checked by
 * the domain's hand-written rules (src/domain/deploy.ts, alerts.ts, spec section 4) and are
 * described here by the fields those rules read.
 */

// --- answers -----------------------------------------------------------------------------

const health = z.object({ status: z.literal('ok') });
const ready = z.object({ status: z.literal('ready') });
const version = z.object({ version: z.string(), node: z.string() });
const hostList = z.object({ hosts: z.array(z.string()) });
const deploymentStatus = z.object({
  name: z.string(),
  found: z.boolean(),
  replicas: z.number().int().nullable(),
  ready: z.number().int(),
  updated: z.number().int(),
  available: z.number().int(),
  restarted_at: z.string().nullable(),
});
const hostStatus = z.object({
  host: z.string(),
  namespace: z.string(),
  deployments: z.array(deploymentStatus),
  checked_at: z.string(),
  cached: z.boolean(),
});
const cachePurge = z.object({ cleared: z.literal(true) });
const ignored = z.object({ ignored: z.literal(true), reason: z.string() });
const pushResult = z.object({
  accepted: z.boolean(),
  duplicate: z.boolean().describe('always the negation of accepted'),
  project: z.string(),
  event_id: z.string(),
  job_id: z
    .string()
    .optional()
    .describe('the job standing for the event (a duplicate carries the original job id), for GET /ops/jobs/{id}'),
});
const alertResult = z.object({
  received: z.number().int(),
  firing: z.number().int(),
  job_ids: z.array(z.string()).describe('the jobs this payload queued'),
});

// --- requests ------------------------------------------------------------------------------

const scmPush = z.looseObject({
  ref: z.string().optional().describe('branch reference; only refs/heads/main deploys'),
  project: z.looseObject({ path_with_namespace: z.string().optional() }).optional(),
  checkout_sha: z.string().describe('required for a push to main (422 when missing or empty)'),
});
const githubPush = z.looseObject({
  ref: z.string().optional(),
  after: z.string().describe('the pushed commit; required for a push to main'),
  deleted: z.boolean().optional(),
  repository: z.looseObject({ full_name: z.string().optional() }).optional(),
});
const githubForm = z.object({
  payload: z.string().describe('the push event as JSON text (the fields of the application/json body)'),
});
const alertPayload = z.looseObject({
  alerts: z.array(
    z.looseObject({
      status: z.string().optional().describe('only "firing" is acted on'),
      labels: z.looseObject({ alertname: z.string().optional() }).optional(),
      annotations: z.record(z.string(), z.unknown()).optional(),
      fingerprint: z.string().max(256).optional().describe('alerts without one are counted, not queued'),
    }),
  ),
});

const jobIdParam = z.object({ id: z.string().describe('a job id from an answer (job_id)') });
const hostParam = z.object({ host: z.string().describe('an inventory host') });

// --- shared answers ------------------------------------------------------------------------

const E = {
  400: (d = 'invalid JSON body'): ResponseDoc => ({ description: d }),
  401: (d = 'credentials missing or invalid'): ResponseDoc => ({ description: d }),
  403: (d = 'a readonly key on an operator-only operation'): ResponseDoc => ({ description: d }),
  404: (d: string): ResponseDoc => ({ description: d }),
  413: { description: 'body larger than BODY_LIMIT' } as ResponseDoc,
  422: (d: string): ResponseDoc => ({ description: d }),
  429: { description: 'over RATE_LIMIT_RPS for this client address', headers: { 'Retry-After': 'seconds' } } as ResponseDoc,
  503: (d = 'Redis (queue) unavailable; nothing lost, retry'): ResponseDoc => ({ description: d, headers: { 'Retry-After': 'seconds' } }),
};

/** The answers of a push webhook (/webhook/scm, /github, /gitlab): only the 400/403/422 wording differs. */
const pushResponses = (d: { invalid?: string; forbidden: string; unprocessable: string }): RouteDoc['responses'] => ({
  202: { description: 'accepted, duplicate or ignored', schema: z.union([pushResult, ignored]) },
  400: E[400](d.invalid),
  403: { description: d.forbidden },
  413: E[413],
  422: E[422](d.unprocessable),
  429: E[429],
  503: E[503](),
});

export const API_ROUTES: readonly RouteDoc[] = [
  {
    method: 'get',
    path: '/health',
    summary: 'Liveness probe',
    tags: ['probes'],
    security: [],
    responses: { 200: { description: 'alive', schema: health } },
  },
  {
    method: 'get',
    path: '/ready',
    summary: 'Readiness probe: Redis reachable',
    tags: ['probes'],
    security: [],
    responses: { 200: { description: 'ready', schema: ready }, 503: E[503]('Redis unreachable') },
  },
  {
    method: 'get',
    path: '/version',
    summary: 'Build version',
    tags: ['probes'],
    security: [],
    responses: { 200: { description: 'version', schema: version }, 429: E[429] },
  },
  {
    method: 'get',
    path: '/openapi.json',
    summary: 'This document (OpenAPI 3.1)',
    tags: ['meta'],
    security: [],
    responses: { 200: { description: 'the OpenAPI document' }, 429: E[429] },
  },
  {
    method: 'get',
    path: '/ops/hosts',
    summary: 'Host names of the inventory',
    tags: ['ops'],
    security: ['apiKey'],
    responses: { 200: { description: 'host list', schema: hostList }, 401: E[401](), 429: E[429] },
  },
  {
    method: 'get',
    path: '/ops/hosts/{host}',
    summary: "Status of a host's Deployments (cached 30 s in Redis)",
    tags: ['ops'],
    security: ['apiKey'],
    pathParams: hostParam,
    responses: {
      200: { description: 'host status', schema: hostStatus },
      401: E[401](),
      404: E[404]('unknown host'),
      429: E[429],
      503: E[503]('Kubernetes API unavailable or not configured'),
    },
  },
  {
    method: 'post',
    path: '/ops/restart',
    summary: 'Submit a rollout restart of one Deployment of a host',
    description:
      'Queues restart_service. With Idempotency-Key, a retried call answers the original job and never queues a second one. ' +
      'A restart of a Deployment whose restart is still waiting or rolling out joins it (coalesced: true). ' +
      'A 503 saying the restart "may still be queued" means Redis took the submission but did not confirm it: retry with the same Idempotency-Key.',
    tags: ['ops'],
    security: ['bearer'],
    query: restartQuerySchema,
    headers: z.object({ 'Idempotency-Key': idempotencyKeySchema.optional() }),
    responses: {
      200: { description: 'submitted (or joined / repeated)', schema: restartAckSchema },
      400: E[400]('malformed Idempotency-Key'),
      401: E[401]('bearer credentials missing, wrong scheme, not configured or mismatch'),
      404: E[404]('unknown host, or service not a Deployment of that host'),
      413: E[413],
      422: E[422]('host or service missing or repeated; Idempotency-Key reused for another target'),
      429: E[429],
      503: E[503]('queue unavailable; the detail says whether the restart may still be queued'),
    },
  },
  {
    method: 'delete',
    path: '/ops/cache',
    summary: 'Purge the host-status cache (operator)',
    tags: ['ops'],
    security: ['apiKey'],
    responses: {
      200: { description: 'cleared', schema: cachePurge },
      401: E[401](),
      403: E[403](),
      413: E[413],
      429: E[429],
      503: E[503]('Redis unavailable'),
    },
  },
  {
    method: 'get',
    path: '/ops/jobs',
    summary: 'List jobs by state; state=failed lists the dead letters',
    description: 'Newest first, paginated with offset/limit. Never returns job data or return values.',
    tags: ['jobs'],
    security: ['apiKey'],
    query: listJobsQuerySchema,
    responses: {
      200: { description: 'one page', schema: jobListSchema },
      401: E[401](),
      422: E[422]('unknown state, limit/offset out of range, or a parameter repeated'),
      429: E[429],
      503: E[503](),
    },
  },
  {
    method: 'get',
    path: '/ops/jobs/{id}',
    summary: 'State and bookkeeping of one job (never its data)',
    tags: ['jobs'],
    security: ['apiKey'],
    pathParams: jobIdParam,
    responses: {
      200: { description: 'the job', schema: jobViewSchema },
      401: E[401](),
      404: E[404]('unknown job'),
      429: E[429],
      503: E[503](),
    },
  },
  {
    method: 'post',
    path: '/ops/jobs/{id}/retry',
    summary: 'Re-queue a dead-lettered job (operator, audited with the reason)',
    tags: ['jobs'],
    security: ['apiKey'],
    pathParams: jobIdParam,
    body: { contentTypes: ['application/json'], schema: retryBodySchema, required: true },
    responses: {
      200: { description: 're-queued with a fresh attempt budget', schema: retryAnswerSchema },
      400: E[400](),
      401: E[401](),
      403: E[403](),
      404: E[404]('unknown job'),
      409: { description: 'the job is not failed, or another restart of its Deployment is in progress' },
      413: E[413],
      422: E[422]('reason missing, blank or too long'),
      429: E[429],
      503: E[503](
        'Redis (queue) unavailable, or (REDIS_MIN_REPLICAS_ACK) the retry not acknowledged by enough replicas in time: it may still take effect, repeating it is safe',
      ),
    },
  },
  {
    method: 'post',
    path: '/webhook/scm',
    summary: 'Source-control push (GitLab-style) -> deploy job',
    tags: ['webhooks'],
    security: ['scmToken'],
    headers: z.object({ 'X-Scm-Event': z.string().optional().describe('must be "Push Hook"; anything else is ignored') }),
    body: { contentTypes: ['application/json'], schema: scmPush, required: true },
    responses: pushResponses({
      forbidden: 'X-Scm-Token missing, secret not configured, or mismatch',
      unprocessable: 'checkout_sha missing or empty; payload not an object',
    }),
  },
  {
    method: 'post',
    path: '/webhook/github',
    summary: 'GitHub push (signed) -> deploy job',
    tags: ['webhooks'],
    security: ['githubSignature'],
    headers: z.object({
      'X-GitHub-Event': z.string().optional().describe('must be "push"; anything else is ignored'),
      'X-GitHub-Delivery': z.string().max(128).optional().describe('recorded 30 days: a replayed delivery is a duplicate'),
    }),
    body: {
      contentTypes: ['application/json', 'application/x-www-form-urlencoded'],
      schema: githubPush,
      required: true,
      description:
        'JSON: the push event. Form-encoded (GitHub\'s "application/x-www-form-urlencoded"): one field `payload` holding the same event as JSON text.',
      schemaByType: { 'application/x-www-form-urlencoded': githubForm },
    },
    responses: pushResponses({
      invalid: 'invalid JSON (after the signature is verified)',
      forbidden: 'signature missing, malformed, mismatching, or secret not configured',
      unprocessable: 'after (the pushed commit) missing; payload not an object',
    }),
  },
  {
    method: 'post',
    path: '/webhook/gitlab',
    summary: "GitLab push with GitLab's native headers -> deploy job (same rules and event id as /webhook/scm)",
    tags: ['webhooks'],
    security: ['gitlabToken'],
    headers: z.object({
      'X-Gitlab-Event': z.string().optional().describe('must be "Push Hook"; anything else is ignored'),
      'Idempotency-Key': z.string().max(128).optional().describe("GitLab 17.4+, the same on GitLab's retries; recorded 30 days"),
      'X-Gitlab-Event-UUID': z.string().max(128).optional().describe('recorded 30 days when there is no Idempotency-Key'),
    }),
    body: { contentTypes: ['application/json'], schema: scmPush, required: true },
    responses: pushResponses({
      forbidden: 'X-Gitlab-Token missing, secret not configured, or mismatch',
      unprocessable: 'checkout_sha missing or empty; payload not an object; delivery id too long',
    }),
  },
  {
    method: 'post',
    path: '/webhook/alerts',
    summary: 'Alertmanager notification -> notify jobs',
    tags: ['webhooks'],
    security: ['alertsBearer'],
    securityOptional: true,
    description:
      'Authenticated only when ALERTS_WEBHOOK_TOKEN is set (then 401 without it). With TLS_CLIENT_CA_FILE the connection must also present a client certificate signed by that CA (else 403 {detail}); when both are set, both are required.',
    body: { contentTypes: ['application/json'], schema: alertPayload, required: true },
    responses: {
      202: { description: 'counted; firing alerts with a new fingerprint queued', schema: alertResult },
      400: E[400](),
      401: E[401]('ALERTS_WEBHOOK_TOKEN set and the bearer token missing or wrong'),
      413: { description: 'body over BODY_LIMIT, or more alerts than ALERTS_MAX_PER_REQUEST (nothing queued)' },
      422: E[422]('alerts missing or not an array'),
      429: E[429],
      503: E[503](),
    },
  },
  {
    method: 'get',
    path: '/admin/queues',
    summary: 'Bull Board (browser UI for the queue; operator)',
    description: 'Listed only when ADMIN_UI_ENABLED=true (off by default); its own views and API live under this path.',
    tags: ['admin'],
    security: ['apiKey', 'basic'],
    responses: {
      200: { description: 'the Bull Board page (HTML)', schema: z.string(), contentType: 'text/html' },
      401: { description: 'no or bad credentials', headers: { 'WWW-Authenticate': 'Basic challenge' } },
      403: E[403](),
      429: E[429],
    },
  },
];

export const API_DESCRIPTION =
  'Operations gateway: restarts, deploys and notifications through a durable job queue. ' +
  'Every error is JSON {detail}. An unknown path answers 404, a known path with another method 405 with an Allow header.';
