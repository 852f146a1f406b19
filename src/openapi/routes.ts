import { z } from 'zod';
import { approvalViewSchema, decisionAnswerSchema, decisionBodySchema, pendingApprovalSchema } from '../changes/approvals/view.js';
import { deployDryRunSchema, restartDryRunSchema } from '../changes/dryRun.js';
import { freezeBodySchema, freezeViewSchema, liftAnswerSchema, liftBodySchema } from '../changes/freezes/service.js';
import {
  dryRunQuerySchema,
  idempotencyKeySchema,
  restartAckSchema,
  restartOptionsSchema,
  restartQuerySchema,
} from '../routes/restartQuery.js';
import { approvalListSchema, listApprovalsQuerySchema } from '../routes/approvals.js';
import { freezeListSchema, holdListSchema, listFreezesQuerySchema } from '../routes/freezes.js';
import { jobListSchema, jobViewSchema, listJobsQuerySchema, retryAnswerSchema, retryBodySchema } from '../routes/jobs.js';
import { deliveryViewSchema } from '../domain/deliveries.js';
import { deliveryListSchema, listDeliveriesQuerySchema, replayAnswerSchema, replayBodySchema } from '../routes/deliveries.js';
import { keyListSchema, listKeysQuerySchema } from '../routes/keys.js';
import { remediationListSchema, remediationsQuerySchema } from '../routes/remediation.js';
import { DECISIONS } from '../remediation/store.js';
import { deployAnswerSchema, deployBodySchema, rollbackAnswerSchema, rollbackBodySchema } from '../routes/deploys.js';
import { listDeploysQuerySchema } from '../routes/deploys.js';
import { deployListSchema, deployViewSchema, projectViewSchema } from '../changes/deployOrder/history.js';
import type { ErrorCode } from '../shared/errors.js';
import { SOURCES, type Source } from '../sources/index.js';
import type { ResponseDoc, RouteDoc } from './document.js';

/**
 * The registry of the API's routes for GET /openapi.json, one entry per method and path: the
 * openapi test fails for a route the app serves that this list lacks, and for a documented status
 * no request produces. Request schemas are those the code validates with; the webhook routes are
 * derived from the sender registry (src/sources).
 */

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
  status: z
    .enum(['pending_approval', 'held'])
    .optional()
    .describe("guarded by the project's policy: pending_approval (job_id is the approval id) or held (a delayed job until held_until)"),
  approval_id: z.string().optional(),
  expires_at: z.string().optional(),
  held_until: z.string().optional(),
});
const alertResult = z.object({
  received: z.number().int(),
  firing: z.number().int(),
  job_ids: z.array(z.string()).describe('the jobs this payload queued'),
  remediations: z
    .array(
      z.object({
        rule: z.string(),
        fingerprint: z.string(),
        decision: z.enum(DECISIONS),
        reason: z.string(),
        id: z.string().describe('the remediation (GET /ops/remediations)'),
      }),
    )
    .optional()
    .describe("the inventory's remediation rules that matched alerts of this payload, and what each decided; absent when none matched"),
});

/** A push sender's body as one field `payload` holding the event as JSON text (GitHub's form setting). */
const formPayload = z.object({
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

const deliveryIdParam = z.object({
  id: z.string().describe('a delivery id from GET /ops/deliveries (<sender>.<stream id>, or <sender>.unverified.<stream id>)'),
});
const jobIdParam = z.object({ id: z.string().describe('a job id from an answer (job_id)') });
const hostParam = z.object({ host: z.string().describe('an inventory host') });
const approvalIdParam = z.object({ id: z.string().describe('an approval id (apr-...), also the id of the job it lets through') });
const freezeIdParam = z.object({ id: z.string().describe('a freeze id (frz-...)') });
const restartPending = pendingApprovalSchema.extend({ host: z.string(), service: z.string() });

/** The answers of an approval's decision. */
function decisionResponses(action: 'approve' | 'reject'): RouteDoc['responses'] {
  const shared = {
    400: E[400](),
    401: E[401](),
    // not_found: the generic code of a throw site of src/domain/approvals.ts that names no condition
    404: E[404]('unknown approval', ['approval_not_found', 'not_found']),
    413: E[413],
    422: E[422]('reason missing, blank or too long; override on reject', [...BODY_422, 'nothing_to_decide', 'unprocessable']),
    503: CHANGE_503,
  };
  if (action === 'reject') {
    return {
      ...shared,
      200: {
        description: 'rejected (or withdrawn by its requester): nothing is queued; the on-call channel is told',
        schema: decisionAnswerSchema,
      },
      403: E[403]("a readonly key, or a change outside the key's scope", ['operator_role_required', 'out_of_scope']),
      409: E[409]('already decided or expired', ['approval_decided', 'approval_expired', 'conflict']),
      429: E[429],
    };
  }
  return {
    ...shared,
    200: { description: 'approved (the change is queued: job_id)', schema: decisionAnswerSchema },
    202: {
      description: 'recorded (status pending): the change still waits for approvals of other operators',
      schema: decisionAnswerSchema,
    },
    403: E[403]("a readonly key, the requester approving their own change (four eyes), or a change outside the key's scope", [
      'operator_role_required',
      'self_approval',
      'out_of_scope',
    ]),
    409: E[409](
      'already decided, expired, already approved by this operator, or (the last approval of a restart) a freeze or the change windows refuse it now: approve with override; superseded: the last approval of a deploy after a newer one of its group started (the approval ends superseded)',
      ['approval_decided', 'approval_expired', 'duplicate_approval', 'change_refused', 'superseded', 'conflict'],
    ),
    429: {
      description:
        'over RATE_LIMIT_RPS, or (the last approval of a restart) its namespace restart budget is spent: nothing decided, approve again after Retry-After',
      headers: retryAfter,
      codes: ['rate_limited', 'budget_exhausted'],
    },
  };
}

/** Refusals shared by many answers: a body (or path) that cannot be read, */
const BODY_400: readonly ErrorCode[] = ['invalid_json', 'malformed_request', 'request_aborted', 'content_length_mismatch'];
/** an X-API-Key refused, */
const API_KEY_401: readonly ErrorCode[] = ['missing_api_key', 'invalid_api_key', 'api_key_expired'];
/** a bearer token refused, */
const BEARER_401: readonly ErrorCode[] = [
  'missing_credentials',
  'unsupported_auth_scheme',
  'bearer_not_configured',
  'invalid_bearer_token',
  'invalid_oidc_token',
  'oidc_token_lifetime_exceeded',
];
/** a JSON body read and refused, */
const BODY_422: readonly ErrorCode[] = ['invalid_body', 'payload_too_deep'];
/** a list's query refused, */
const LIST_422: readonly ErrorCode[] = ['invalid_query', 'invalid_cursor'];
/** Redis or the queue unavailable, or a write not replicated in time. */
const UNAVAILABLE_503: readonly ErrorCode[] = ['redis_unavailable', 'queue_unavailable', 'queue_unconfirmed', 'not_replicated'];

const answer = (description: string, codes: readonly ErrorCode[]): ResponseDoc => ({ description, codes });
const retryAfter = { 'Retry-After': 'seconds' };

/** The error answers by status, with the description and codes most routes share. */
const E = {
  400: (d = 'invalid JSON body', codes = BODY_400) => answer(d, codes),
  401: (d = 'credentials missing or invalid', codes = API_KEY_401) => answer(d, codes),
  403: (d = 'a readonly key on an operator-only operation', codes: readonly ErrorCode[] = ['operator_role_required']) => answer(d, codes),
  404: answer,
  409: answer,
  413: answer('body larger than BODY_LIMIT', ['payload_too_large']),
  422: answer,
  429: { ...answer('over RATE_LIMIT_RPS for this client address', ['rate_limited']), headers: retryAfter },
  503: (d = 'Redis (queue) unavailable; nothing lost, retry', codes = UNAVAILABLE_503): ResponseDoc => ({
    ...answer(d, codes),
    headers: retryAfter,
  }),
};

const HMAC_403: readonly ErrorCode[] = ['webhook_secret_not_configured', 'missing_signature', 'malformed_signature', 'invalid_signature'];

/** The codes a sender's failed proof answers with (403; a bearer token's 401). */
function proofCodes(s: Source): readonly ErrorCode[] {
  switch (s.verification.kind) {
    case 'token':
      return ['webhook_secret_not_configured', 'missing_webhook_token', 'invalid_webhook_token'];
    case 'hmac':
      return HMAC_403;
    case 'timestamped-hmac':
      return [...HMAC_403, 'stale_signature', 'replayed_signature'];
    case 'bearer':
      return ['missing_credentials', 'unsupported_auth_scheme', 'invalid_bearer_token'];
  }
}

/** An operator's write refused: a readonly key, or a target outside the key's scope. */
const SCOPED_403 = E[403]("a readonly key; a target outside the key's scope", ['operator_role_required', 'out_of_scope']);

/** A write of a guarded change's records: Redis down, or not replicated in time. */
const CHANGE_503 = E[503](
  'Redis unavailable, or (REDIS_MIN_REPLICAS_ACK) the change not acknowledged by the replicas in time: it may still take effect, read it back before repeating it',
);

const schemeName = (s: Source): string => `${s.name}Webhook`;

function verificationScheme(s: Source): Record<string, unknown> {
  const v = s.verification;
  const secret = s.secret.fallbackEnv ? `${s.secret.env} (or ${s.secret.fallbackEnv} when unset)` : s.secret.env;
  if (v.kind === 'bearer') return { type: 'http', scheme: 'bearer', description: `${secret}, required only when it is set.` };
  const proof =
    v.kind === 'token'
      ? `Must equal ${secret}.`
      : v.kind === 'hmac'
        ? `\`${v.prefix}<${v.encoding} HMAC-SHA256 of the raw body keyed by ${secret}>\`.`
        : `\`t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<raw body>" keyed by ${secret}>\`; a timestamp more than ${v.toleranceSeconds} s off, or a signature already used, is refused.`;
  return { type: 'apiKey', in: 'header', name: v.header, description: `${proof} Unset secret: every call 403.` };
}

/** The security schemes of the webhook senders, one per sender. */
export const WEBHOOK_SECURITY_SCHEMES: Record<string, Record<string, unknown>> = Object.fromEntries(
  SOURCES.map((s) => [schemeName(s), verificationScheme(s)]),
);

function webhookRoute(s: Source): RouteDoc {
  const path = `/webhook/${s.name}`;
  if (s.kind === 'alerts') {
    return write({
      method: 'post',
      path,
      summary: `${s.title} notification -> notify jobs`,
      tags: ['webhooks'],
      security: [schemeName(s)],
      securityOptional: true,
      description: `Authenticated only when ${s.secret.env} is set (then 401 without it). With TLS_CLIENT_CA_FILE the connection must also present a client certificate signed by that CA, and with TLS_CLIENT_ALLOWED_NAMES one whose subject or subjectAltName is on that list (else 403 {detail, code}); when a token and a CA are both set, both are required.`,
      body: { contentTypes: ['application/json'], schema: alertPayload, required: true },
      responses: {
        202: { description: 'counted; firing alerts with a new fingerprint queued', schema: alertResult },
        401: E[401](`${s.secret.env} set and the bearer token missing or wrong`, proofCodes(s)),
        413: {
          description: 'body over BODY_LIMIT, or more alerts than ALERTS_MAX_PER_REQUEST (nothing queued)',
          codes: ['payload_too_large', 'too_many_alerts'],
        },
        422: E[422]('alerts missing or not an array', ['invalid_alerts', 'invalid_payload', 'payload_too_deep', 'invalid_job_data']),
        503: E[503](),
      },
    });
  }
  const headers: Record<string, z.ZodType> = {
    [s.event.header]: z
      .string()
      .optional()
      .describe(`must be ${JSON.stringify(s.event.push)}; anything else is ignored`),
  };
  for (const h of s.deliveryHeaders ?? []) {
    headers[h] = z.string().max(128).optional().describe('the delivery id, remembered 30 days: a replayed delivery is a duplicate');
  }
  const v = s.verification;
  const signed = v.kind !== 'token';
  const proof = v.kind === 'bearer' ? 'Authorization' : v.header;
  return {
    method: 'post',
    path,
    summary: `${s.title} push -> deploy job`,
    tags: ['webhooks'],
    security: [schemeName(s)],
    headers: z.object(headers),
    body: {
      contentTypes: s.formPayload ? ['application/json', 'application/x-www-form-urlencoded'] : ['application/json'],
      schema: s.payload,
      required: true,
      ...(s.formPayload
        ? {
            description: 'JSON: the push event. Form-encoded: one field `payload` holding the same event as JSON text.',
            schemaByType: { 'application/x-www-form-urlencoded': formPayload },
          }
        : {}),
    },
    responses: {
      202: { description: 'accepted, duplicate or ignored', schema: z.union([pushResult, ignored]) },
      400: E[400](signed ? 'invalid JSON (after the signature is verified)' : undefined),
      403: {
        description: signed
          ? `${proof} missing, malformed, mismatching${v.kind === 'timestamped-hmac' ? ', stale or already used' : ''}, or secret not configured`
          : `${proof} missing, secret not configured, or mismatch`,
        codes: proofCodes(s),
      },
      413: E[413],
      422: E[422](
        `${s.commitField} missing or empty${s.kind === 'push' && s.commitForm === 'hex' ? ' or not a commit id of 7 to 64 hex digits' : ''}; payload not an object; delivery id too long`,
        [
          'missing_commit',
          ...(s.kind === 'push' && s.commitForm === 'hex' ? (['invalid_commit'] as const) : []),
          'invalid_payload',
          'invalid_delivery_id',
          'payload_too_deep',
          'invalid_job_data',
        ],
      ),
      429: E[429],
      503: E[503](),
    },
  };
}

type Read = Omit<RouteDoc, 'method' | 'security'> & { unavailable?: ResponseDoc };

/** A GET any valid key may call, with the answers every one has: 401, 429, and 503 `unavailable`. */
function read({ unavailable = E[503]('Redis unavailable'), ...r }: Read): RouteDoc {
  return { method: 'get', security: ['apiKey'], ...r, responses: { 401: E[401](), 429: E[429], 503: unavailable, ...r.responses } };
}

/** A write with a JSON body (an operator's, unless `security` says otherwise): a `read`'s 401 and 429, with 400 and 413 for the body. */
function write(r: Omit<RouteDoc, 'security'> & Partial<Pick<RouteDoc, 'security'>>): RouteDoc {
  return { security: ['apiKey'], ...r, responses: { 400: E[400](), 401: E[401](), 413: E[413], 429: E[429], ...r.responses } };
}

/** A page of a list: a `read` that also answers 422 for the query it refuses (`refused`). */
function list({ refused, ...r }: Read & { refused: string }): RouteDoc {
  return read({ ...r, responses: { 422: E[422](refused, LIST_422), ...r.responses } });
}

/** The answers POST /ops/deploys and its rollback share beside a `write`'s: an OIDC token's refusals. */
const DEPLOY_ANSWERS: RouteDoc['responses'] = {
  401: E[401]('credentials missing or invalid (an X-API-Key, or a bearer token that is no valid OIDC token)', [
    ...BEARER_401,
    ...API_KEY_401,
  ]),
  404: E[404]('the project is not in the inventory', ['unknown_project']),
  503: E[503]("Redis or the queue unavailable, or the OIDC token's issuer cannot be reached", [
    ...UNAVAILABLE_503,
    'oidc_issuer_unavailable',
  ]),
};

/** A GET anyone may call. */
function open(path: string, summary: string, tag: string, responses: RouteDoc['responses']): RouteDoc {
  return { method: 'get', path, summary, tags: [tag], security: [], responses };
}

export const API_ROUTES: readonly RouteDoc[] = [
  open('/health', 'Liveness probe', 'probes', { 200: { description: 'alive', schema: health } }),
  open('/ready', 'Readiness probe: Redis reachable', 'probes', {
    200: { description: 'ready', schema: ready },
    503: E[503]('Redis unreachable', ['redis_unavailable']),
  }),
  open('/version', 'Build version', 'probes', { 200: { description: 'version', schema: version }, 429: E[429] }),
  open('/openapi.json', 'This document (OpenAPI 3.1)', 'meta', { 200: { description: 'the OpenAPI document' }, 429: E[429] }),
  {
    method: 'get',
    path: '/ops/hosts',
    summary: 'Host names of the inventory',
    tags: ['ops'],
    security: ['apiKey'],
    responses: { 200: { description: 'host list', schema: hostList }, 401: E[401](), 429: E[429] },
  },
  read({
    path: '/ops/hosts/{host}',
    summary: "Status of a host's Deployments (cached 30 s in Redis)",
    tags: ['ops'],
    pathParams: hostParam,
    responses: {
      200: { description: 'host status', schema: hostStatus },
      403: E[403]("a host outside the key's scope", ['out_of_scope']),
      404: E[404]('unknown host', ['unknown_host']),
    },
    unavailable: E[503]('Kubernetes API unavailable or not configured', ['cluster_unavailable']),
  }),
  write({
    method: 'post',
    path: '/ops/restart',
    summary: 'Submit a rollout restart of one Deployment of a host (guarded by its policy; dry_run rehearses it)',
    description:
      'Queues restart_service. With Idempotency-Key, a retried call answers the original job and never queues a second one. ' +
      'A restart of a Deployment whose restart is still waiting or rolling out joins it (coalesced: true). ' +
      'A 503 saying the restart "may still be queued" means Redis took the submission but did not confirm it: retry with the same Idempotency-Key. ' +
      "The host's policy (inventory) guards it: a freeze or its change windows refuse it (409, unless override=true with a reason); an approval policy makes it wait for other operators (202); its namespace's restart budget answers 429 when spent. " +
      "dry_run=true changes nothing and answers what would happen, with the Kubernetes API server's verdict on the worker's own identity (a server-side dry run). " +
      'Authenticated by the bearer token, an OIDC token of an issuer of OPS_OIDC_FILE whose rule gives the operator role, or an operator key; a scoped credential restarts only hosts its scope admits.',
    tags: ['ops'],
    security: ['bearer', 'apiKey'],
    query: restartQuerySchema.extend(restartOptionsSchema.shape),
    headers: z.object({ 'Idempotency-Key': idempotencyKeySchema.optional() }),
    responses: {
      200: {
        description: 'submitted (or joined / repeated); with dry_run, the rehearsal',
        schema: z.union([restartAckSchema, restartDryRunSchema]),
      },
      202: {
        description: 'waits for approval by other operators (POST /ops/approvals/{id}/approve); nothing is queued yet',
        schema: restartPending,
      },
      // bad_request, not_found, conflict, unprocessable: the generic codes of throw sites of
      // src/domain/restart.ts that name no condition
      400: E[400]('malformed Idempotency-Key', [
        'invalid_idempotency_key',
        'bad_request',
        'malformed_request',
        'request_aborted',
        'content_length_mismatch',
      ]),
      401: E[401]('bearer credentials missing, wrong scheme, not configured or mismatch; or an unknown key', [
        ...BEARER_401,
        ...API_KEY_401,
      ]),
      403: E[403](
        "a readonly key or OIDC rule; a host outside the credential's scope; an OIDC token no rule admits; override=true from the shared bearer token or an OIDC rule without may_override",
        ['operator_role_required', 'out_of_scope', 'oidc_no_matching_rule', 'override_not_allowed'],
      ),
      404: E[404]('unknown host, or service not a Deployment of that host', ['unknown_host', 'unknown_service', 'not_found']),
      409: E[409](
        'refused by a freeze or outside the change windows (the detail names them); override=true with a reason lets it through',
        ['change_refused', 'approval_changed', 'conflict'],
      ),
      422: E[422](
        'host or service missing or repeated; Idempotency-Key reused for another target; a bad dry_run/override; override without reason',
        ['invalid_query', 'idempotency_key_reused', 'unprocessable'],
      ),
      429: {
        description:
          "over RATE_LIMIT_RPS for this client address (rate_limited), or the namespace's restart budget is spent (budget_exhausted, the detail names it)",
        headers: retryAfter,
        codes: ['rate_limited', 'budget_exhausted'],
      },
      503: E[503](
        "queue unavailable; the detail says whether the restart may still be queued; or the OIDC token's issuer cannot be reached",
        [...UNAVAILABLE_503, 'oidc_issuer_unavailable'],
      ),
    },
  }),
  write({
    method: 'post',
    path: '/ops/deploys',
    summary: 'Deploy one commit of a project from CI (an OIDC identity or an operator key; guarded by its policy)',
    description:
      'Queues run_deploy_pipeline for exactly {project, ref, sha}, through the change pipeline (origin ci): approvals, freezes and windows; ' +
      'one deploy per project, ref and sha within 24 h (a repeat answers the first job, duplicate: true). ' +
      "The project's deploy_from (inventory) must be ci or both. " +
      "Callers: an OIDC token of an issuer of OPS_OIDC_FILE (the body may leave out what its rule binds from the token's claims; a body that differs is refused) " +
      'or an operator key; never the shared bearer token. With Idempotency-Key, a retried call answers as the first one did.',
    tags: ['ops'],
    security: ['bearer', 'apiKey'],
    headers: z.object({ 'Idempotency-Key': idempotencyKeySchema.optional() }),
    body: { contentTypes: ['application/json'], schema: deployBodySchema, required: false },
    responses: {
      ...DEPLOY_ANSWERS,
      202: {
        description: 'queued, held by a freeze or window, or waiting for approval; or a duplicate of the same commit',
        schema: deployAnswerSchema,
      },
      400: E[400]('invalid JSON body, or a malformed Idempotency-Key', [...BODY_400, 'invalid_idempotency_key']),
      403: E[403](
        "a readonly key or rule; the shared bearer token; an OIDC token no rule admits; a body disagreeing with the token's claims; a project outside the scope",
        ['operator_role_required', 'bearer_token_not_accepted', 'oidc_no_matching_rule', 'deploy_not_bound_to_token', 'out_of_scope'],
      ),
      409: E[409]("the project's deploy_from does not take CI deploys", ['deploy_source_refused', 'approval_changed']),
      422: E[422]('a body field missing or invalid; a ref the project does not deploy; Idempotency-Key reused for another commit', [
        ...BODY_422,
        'ref_not_deployable',
        'idempotency_key_reused',
        'invalid_job_data',
      ]),
    },
  }),
  write({
    method: 'post',
    path: '/ops/deploys/rollback',
    summary: "Roll a project's ref back to the commit of an earlier succeeded deploy (operator; guarded as its deploys)",
    description:
      'Queues run_deploy_pipeline for the commit of an earlier succeeded deploy in the history: by default the newest succeeded one whose commit ' +
      'differs from the current (last succeeded) deploy; `to` names the commit. Through the change pipeline (origin rollback): approvals, ' +
      "freezes and windows as for a deploy of the project; in the project's concurrency group, the newest when accepted. Its own identity " +
      '(rollback:<uuid>): never a duplicate of a deploy of that commit. The deploy Job gets OPSGATE_ROLLBACK=true beside OPSGATE_COMMIT_SHA, ' +
      'and GET /ops/deploys lists it with origin rollback and rolled_back_from. Callers: an operator key, or an OIDC token whose rule gives the operator role.',
    tags: ['ops'],
    security: ['bearer', 'apiKey'],
    body: { contentTypes: ['application/json'], schema: rollbackBodySchema, required: true },
    responses: {
      ...DEPLOY_ANSWERS,
      202: { description: 'queued, held by a freeze or window, or waiting for approval', schema: rollbackAnswerSchema },
      403: E[403](
        "a readonly key or rule; the shared bearer token; an OIDC token no rule admits; a project or ref other than the token's rule binds; an override by a caller who is not a person; a project outside the scope",
        [
          'operator_role_required',
          'bearer_token_not_accepted',
          'oidc_no_matching_rule',
          'deploy_not_bound_to_token',
          'override_not_allowed',
          'out_of_scope',
        ],
      ),
      409: E[409]('the commit never succeeded on this ref in the history, or no succeeded deploy of another commit is kept', [
        'rollback_target_unknown',
      ]),
      422: E[422]('a body field missing or invalid; a ref the project does not deploy', [
        ...BODY_422,
        'ref_not_deployable',
        'invalid_job_data',
      ]),
    },
  }),
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
      503: E[503]('Redis unavailable', ['redis_unavailable']),
    },
  },
  list({
    path: '/ops/keys',
    summary: 'The configured API keys: id, owner, role, source, expiry and last use (operator)',
    description:
      "Never a key or a hash. The owner is who holds the key (a keys-file entry's owner, else its id; env:<id> for OPS_API_KEY_ROLES). " +
      'Last use is shared by every replica through Redis. ' +
      'A key within API_KEY_EXPIRY_WARNING_DAYS of its expiry works, and every answer to it carries Deprecation and Sunset headers; past its expiry it is refused (401).',
    tags: ['ops'],
    query: listKeysQuerySchema,
    responses: {
      200: { description: 'one page of the keys, in the order of the configuration', schema: keyListSchema },
      401: E[401]('key missing, unknown or expired'),
      403: E[403](),
    },
    refused: 'limit out of range, a parameter repeated, or a cursor not of this list',
    unavailable: E[503]('Redis unavailable: last use cannot be read', ['redis_unavailable']),
  }),
  list({
    path: '/ops/jobs',
    summary: 'List jobs by state; state=failed lists the dead letters',
    description:
      'Newest first, paged with limit and cursor (next_cursor; offset/next_offset still work). Never returns job data or return values.',
    tags: ['jobs'],
    query: listJobsQuerySchema,
    responses: { 200: { description: 'one page', schema: jobListSchema } },
    refused: 'unknown state, limit/offset out of range, a parameter repeated, cursor with offset, or a cursor not of this query',
    unavailable: E[503](),
  }),
  read({
    path: '/ops/jobs/{id}',
    summary: 'State and bookkeeping of one job (never its data)',
    tags: ['jobs'],
    pathParams: jobIdParam,
    responses: {
      200: { description: 'the job', schema: jobViewSchema },
      404: E[404]('unknown job', ['job_not_found']),
    },
    unavailable: E[503](),
  }),
  write({
    method: 'post',
    path: '/ops/jobs/{id}/retry',
    summary: 'Re-queue a dead-lettered job (operator, audited with the reason)',
    tags: ['jobs'],
    pathParams: jobIdParam,
    body: { contentTypes: ['application/json'], schema: retryBodySchema, required: true },
    responses: {
      200: { description: 're-queued with a fresh attempt budget', schema: retryAnswerSchema },
      403: SCOPED_403,
      404: E[404]('unknown job', ['job_not_found']),
      409: E[409](
        'the job is not failed, another restart of its Deployment is in progress, or (superseded) a newer deploy of its group has started',
        ['job_not_failed', 'restart_in_progress', 'superseded'],
      ),
      422: E[422]('reason missing, blank or too long', BODY_422),
      503: E[503](
        'Redis (queue) unavailable, or (REDIS_MIN_REPLICAS_ACK) the retry not acknowledged by enough replicas in time: it may still take effect, repeating it is safe',
      ),
    },
  }),
  list({
    path: '/ops/deliveries',
    summary: "The senders' last deliveries with their verdicts, newest first: why a push did or did not deploy",
    description: 'Paged with limit and cursor (next_cursor; before/next still work).',
    tags: ['deliveries'],
    query: listDeliveriesQuerySchema,
    responses: { 200: { description: 'one page', schema: deliveryListSchema } },
    refused: 'unknown source or verdict, bad limit or cursor, cursor with before, or a cursor not of this query',
  }),
  read({
    path: '/ops/deliveries/{id}',
    summary: 'One recorded delivery',
    tags: ['deliveries'],
    pathParams: deliveryIdParam,
    responses: {
      200: { description: 'the delivery', schema: deliveryViewSchema },
      404: E[404]('unknown delivery (or no longer kept)', ['delivery_not_found']),
    },
  }),
  write({
    method: 'post',
    path: '/ops/deliveries/{id}/replay',
    summary: 'Replay a recorded push through the same intake and deduplication (operator, audited with the reason)',
    tags: ['deliveries'],
    pathParams: deliveryIdParam,
    query: dryRunQuerySchema,
    body: { contentTypes: ['application/json'], schema: replayBodySchema, required: true },
    responses: {
      200: {
        description:
          "submitted: queued (or held, by the project's policy), or a duplicate of the job that stands for the event; with dry_run, the rehearsal",
        schema: z.union([replayAnswerSchema, deployDryRunSchema]),
      },
      202: {
        description: "waits for approval by the project's policy (status pending_approval, job_id the approval id); nothing is queued yet",
        schema: replayAnswerSchema,
      },
      403: SCOPED_403,
      404: E[404]('unknown delivery (or no longer kept)', ['delivery_not_found']),
      409: E[409](
        'the delivery reached no push event (refused, invalid, ignored, rate-limited): have the sender redeliver it; superseded: a newer deploy of its group has started',
        ['delivery_not_replayable', 'superseded', 'guards_unavailable', 'approval_changed', 'conflict'],
      ),
      // unprocessable: the generic code of a throw site of src/domain/deploy.ts that names no condition
      422: E[422]('reason missing, blank or too long', [...BODY_422, 'invalid_job_data', 'unprocessable']),
      503: E[503](),
    },
  }),
  list({
    path: '/ops/deploys',
    summary: 'The history of deploys, newest accepted first (the last DEPLOY_HISTORY_KEPT of each project)',
    description:
      'Each deploy with its state (pending_approval, held, queued, running, succeeded, failed, superseded, cancelled, rejected), its times, ' +
      'its queue job and Kubernetes Job. Paged with limit and cursor (next_cursor). A scoped credential sees only the projects its scope admits.',
    tags: ['ops'],
    query: listDeploysQuerySchema,
    responses: { 200: { description: 'one page of deploys', schema: deployListSchema } },
    refused: 'a filter or limit out of range, a parameter repeated, or a cursor not of this list',
  }),
  read({
    path: '/ops/deploys/{id}',
    summary: 'One deploy of the history',
    tags: ['ops'],
    pathParams: z.object({ id: z.string().describe('a deploy id: its job id (or the approval id it waited under)') }),
    responses: {
      200: { description: 'the deploy', schema: deployViewSchema },
      404: E[404]('no kept deploy of this id, or one of a project outside the scope', ['deploy_not_found']),
    },
  }),
  read({
    path: '/ops/projects/{project}',
    summary: "A project's refs: each one's current (last succeeded) deploy and the one running",
    description: 'The project name is one path segment: its slashes encoded (group%2Fapp).',
    tags: ['ops'],
    pathParams: z.object({ project: z.string().describe('an inventory project, URL-encoded') }),
    responses: {
      200: { description: "the project's refs", schema: projectViewSchema },
      403: E[403]('a project outside the scope of the credential', ['out_of_scope']),
      404: E[404]('neither the inventory nor the history knows the project', ['project_not_found']),
    },
  }),
  list({
    path: '/ops/approvals',
    summary: 'The pending approvals of guarded changes, soonest expiry first',
    tags: ['guards'],
    query: listApprovalsQuerySchema,
    responses: { 200: { description: 'one page of the pending approvals', schema: approvalListSchema } },
    refused: 'limit out of range, a parameter repeated, or a cursor not of this list',
  }),
  read({
    path: '/ops/approvals/{id}',
    summary: 'One approval, whatever became of it (kept a day after its decision or expiry)',
    tags: ['guards'],
    pathParams: approvalIdParam,
    responses: {
      200: { description: 'the approval', schema: approvalViewSchema },
      404: E[404]('unknown approval', ['approval_not_found']),
    },
  }),
  {
    method: 'post',
    path: '/ops/approvals/{id}/approve',
    summary: 'Approve a guarded change (operator other than its requester; audited with the reason)',
    description:
      'Of operators approving at once, exactly one gives the last approval and queues the change, under the job id that is the approval id. ' +
      'The last approval of a restart meets its gate now (override) and takes a place of its namespace restart budget.',
    tags: ['guards'],
    security: ['apiKey'],
    pathParams: approvalIdParam,
    body: { contentTypes: ['application/json'], schema: decisionBodySchema, required: true },
    responses: decisionResponses('approve'),
  },
  {
    method: 'post',
    path: '/ops/approvals/{id}/reject',
    summary: 'Reject a guarded change (any operator; its requester withdraws it); audited with the reason',
    tags: ['guards'],
    security: ['apiKey'],
    pathParams: approvalIdParam,
    body: { contentTypes: ['application/json'], schema: decisionBodySchema.omit({ override: true }), required: true },
    responses: decisionResponses('reject'),
  },
  list({
    path: '/ops/freezes',
    summary: 'The freezes not yet ended',
    tags: ['guards'],
    query: listFreezesQuerySchema,
    responses: { 200: { description: 'one page of the freezes, soonest end first', schema: freezeListSchema } },
    refused: 'limit out of range, a parameter repeated, or a cursor not of this list',
  }),
  write({
    method: 'post',
    path: '/ops/freezes',
    summary: 'Declare a freeze of everything, a namespace or a project until an end time (operator, audited)',
    description: 'While in force, a restart it covers is refused (409 unless overridden) and a deploy it covers is held until it ends.',
    tags: ['guards'],
    body: { contentTypes: ['application/json'], schema: freezeBodySchema, required: true },
    responses: {
      201: { description: 'declared', schema: freezeViewSchema },
      403: SCOPED_403,
      422: E[422]('unknown scope, namespace or project; no or two ends; an end in the past or more than 30 days away; no reason', BODY_422),
      503: CHANGE_503,
    },
  }),
  read({
    path: '/ops/freezes/{id}',
    summary: 'One freeze',
    tags: ['guards'],
    pathParams: freezeIdParam,
    responses: {
      200: { description: 'the freeze', schema: freezeViewSchema },
      404: E[404]('unknown or ended freeze', ['freeze_not_found']),
    },
  }),
  write({
    method: 'delete',
    path: '/ops/freezes/{id}',
    summary: 'Lift a freeze early, releasing the deploys it held (operator, audited with the reason)',
    tags: ['guards'],
    pathParams: freezeIdParam,
    body: { contentTypes: ['application/json'], schema: liftBodySchema, required: true },
    responses: {
      200: { description: 'lifted; released: the held jobs promoted', schema: liftAnswerSchema },
      403: SCOPED_403,
      404: E[404]('unknown or ended freeze', ['freeze_not_found']),
      422: E[422]('reason missing, blank or too long', BODY_422),
      503: CHANGE_503,
    },
  }),
  list({
    path: '/ops/holds',
    summary: 'The deploys held now by a freeze or outside their change windows, with why and until when',
    tags: ['guards'],
    query: listFreezesQuerySchema,
    responses: { 200: { description: 'one page of the held deploys, soonest due first', schema: holdListSchema } },
    refused: 'limit out of range, a parameter repeated, or a cursor not of this list',
  }),
  list({
    path: '/ops/remediations',
    summary: 'Recent decisions of alert-driven remediation, with their reasons, newest first',
    description:
      "Why did (or didn't) opsgate restart a Deployment for an alert: each decision names its rule, alert, target, the guard that stopped it and its outcome.",
    tags: ['guards'],
    query: remediationsQuerySchema,
    responses: { 200: { description: 'one page of the decisions, newest first', schema: remediationListSchema } },
    refused: 'limit out of range, a parameter repeated, or a cursor not of this list',
  }),
  ...SOURCES.map(webhookRoute),
  {
    method: 'get',
    path: '/admin/queues',
    summary: 'Bull Board (browser UI for the queue; operator)',
    description: 'Listed only when ADMIN_UI_ENABLED=true (off by default); its own views and API live under this path.',
    tags: ['admin'],
    security: ['apiKey', 'basic'],
    responses: {
      200: { description: 'the Bull Board page (HTML)', schema: z.string(), contentType: 'text/html' },
      401: {
        description: 'no or bad credentials',
        headers: { 'WWW-Authenticate': 'Basic challenge' },
        codes: ['missing_credentials', 'malformed_credentials', 'invalid_credentials'],
      },
      403: E[403]('a readonly key, or a scoped one', ['operator_role_required', 'out_of_scope']),
      429: E[429],
    },
  },
];

export const API_DESCRIPTION =
  'Operations gateway: restarts, deploys and notifications through a durable job queue. ' +
  'Every error is JSON {detail, code}: code names the condition, one of components.schemas.Error (each operation lists those it can answer). ' +
  'An unknown path answers 404, a known path with another method 405 with an Allow header. ' +
  'Every list pages with limit and cursor and answers next_cursor (null on the last page).';
