/**
 * The one error catalog: every error a client can see has a stable code here (clients and tests
 * tell conditions apart by it, never by the detail's wording), its HTTP status and its meaning.
 * Every error answer is `{detail, code}`, the detail never carrying a secret; the OpenAPI document
 * and the "Errors" table of docs/api.md list these codes. The generic codes (`bad_request`,
 * `conflict`, `unprocessable`) stand for a throw site (or a Bull Board answer) that names no condition.
 */
const CATALOG = {
  400: {
    bad_request: 'generic: the request cannot be served as sent (a throw site, or a Bull Board answer, that names no condition)',
    malformed_request: "the request line, a header or the path cannot be read (Node's HTTP parser or the router refused it)",
    invalid_json: 'the body is not a JSON payload: empty, not JSON, or a form body without its payload field',
    request_aborted: 'the client closed the request before its body arrived',
    content_length_mismatch: "the body's length differs from its Content-Length",
    invalid_idempotency_key: 'Idempotency-Key is not 1-255 printable ASCII characters',
  },
  401: {
    missing_api_key: 'no X-API-Key header',
    invalid_api_key: 'X-API-Key is not a configured key',
    api_key_expired: 'X-API-Key is a configured key past its expiry (the detail names it and when)',
    missing_credentials: 'no Authorization header, or a scheme without its credentials',
    unsupported_auth_scheme: 'the Authorization scheme is not Bearer',
    malformed_credentials: 'the Authorization header is not HTTP Basic with user:password',
    bearer_not_configured: 'no bearer token is configured for this route, so every bearer call is refused',
    invalid_bearer_token: 'the bearer token does not match',
    invalid_credentials: 'the key presented (X-API-Key or HTTP Basic password) is unknown or expired',
    invalid_oidc_token:
      'an OIDC token of a listed issuer that does not verify: signature, algorithm, audience, expiry, nbf/iat, max_token_age, a required claim (exp, iat, sub) missing, or a key its issuer does not hold',
    oidc_token_lifetime_exceeded: "an OIDC token whose lifetime (exp - iat) is longer than its issuer's max_token_lifetime allows",
  },
  403: {
    operator_role_required: 'a valid key whose role is not operator, on an operator-only operation',
    cross_site_request: 'a state-changing call from another site (Sec-Fetch-Site or Origin)',
    admin_action_refused:
      'Bull Board here only retries or removes failed (dead-lettered) jobs: any other write, or one on a job that is not failed',
    webhook_secret_not_configured: "the sender's secret is not configured, so every delivery is refused",
    missing_webhook_token: "the sender's token header is missing or empty",
    invalid_webhook_token: "the sender's token does not match",
    missing_signature: "the sender's signature header is missing or empty",
    malformed_signature: 'the signature is not of the form the sender signs with (e.g. no sha256= prefix)',
    invalid_signature: 'the signature does not match the body',
    stale_signature: "a timestamped signature too far from the server's clock",
    replayed_signature: 'a timestamped signature already used (a replayed delivery)',
    client_certificate_required: 'the route needs a client certificate and the connection presented none',
    untrusted_client_certificate: 'the client certificate is not signed by a trusted CA',
    client_certificate_not_allowed: 'the client certificate names none of the names allowed for the route',
    self_approval:
      'the requester of a change approving it: the same owner, or the person behind its OIDC token (four eyes: another person must)',
    override_not_allowed:
      'override=true from the shared bearer token or an OIDC token whose rule does not say may_override: true (overrides are for people)',
    oidc_no_matching_rule: 'a verified OIDC token whose claims no rule of OPS_OIDC_FILE admits',
    out_of_scope: "the host, namespace or project is outside the credential's scope (keys file or OIDC rule)",
    bearer_token_not_accepted: 'the shared bearer token on a route that takes only OIDC tokens and operator keys',
    deploy_not_bound_to_token: "a deploy whose project, ref or sha differs from what the caller's OIDC token names (the rule binds them)",
  },
  404: {
    not_found: 'no route has this path',
    unknown_host: 'the host is not in the inventory',
    unknown_service: 'the service is not a Deployment of that host',
    unknown_project: 'the project is not in the inventory',
    job_not_found: 'no job (and no approval standing for one) has this id',
    approval_not_found: 'no approval has this id (kept a day after its decision or expiry)',
    delivery_not_found: 'no recorded delivery has this id (or it is no longer kept)',
    freeze_not_found: 'no freeze in force or to come has this id',
    deploy_not_found: 'no kept deploy in the history has this id (or the credential may not see its project)',
    project_not_found: 'the inventory has no project of this name, and the history no deploy of it',
    queue_not_found: 'Bull Board: no queue of this name',
  },
  405: {
    method_not_allowed: 'the path exists, not with this method (Allow lists the methods)',
  },
  408: {
    request_timeout: 'the request did not arrive in time',
  },
  409: {
    conflict: 'generic: the resource is not in a state that allows this (a throw site, or a Bull Board answer, that names no condition)',
    change_refused:
      'a guard refuses the change now: a freeze, or outside the change windows (the detail names them); override=true with a reason lets it through',
    approval_decided: 'the approval is already approved or rejected',
    approval_expired: 'the approval expired before it was decided: ask for the change again',
    duplicate_approval: 'this operator already approved it; it needs approvals from others',
    approval_changed: 'the pending approval this request joined was decided or expired meanwhile: retry',
    job_not_failed: 'only a failed (dead-lettered) job can be retried; the detail names its state',
    restart_in_progress: 'another restart of this Deployment is waiting or rolling out: retry after it finished',
    superseded:
      'a deploy accepted after this one, in its concurrency group, has started: an older deploy never runs after a newer one (the detail names it); deploy the older commit anew to roll back',
    rollback_target_unknown:
      "a rollback's commit never succeeded in the project's ref's deploy history (or no succeeded deploy of another commit is kept): nothing to go back to",
    delivery_not_replayable: 'the delivery reached no push event to replay: have the sender redeliver it',
    deploy_source_refused:
      "the project's deploy_from does not take deploys from this way in (a CI deploy to a project that deploys from pushes)",
    guards_unavailable: 'this process has no change pipeline (no guards) to rehearse or carry out the change with',
  },
  413: {
    payload_too_large: 'the body is larger than BODY_LIMIT',
    too_many_alerts: 'more alerts in one payload than ALERTS_MAX_PER_REQUEST; nothing was queued',
  },
  415: {
    unsupported_encoding: 'a Content-Encoding or charset the API does not read',
  },
  422: {
    unprocessable: 'generic: the request is well-formed but invalid (a throw site that names no condition)',
    invalid_query: 'a query parameter is missing, repeated or invalid (the detail names it)',
    invalid_body: 'a body field is missing or invalid (the detail names it)',
    invalid_cursor: 'cursor is not a next_cursor of this list, or contradicts the filters given with it',
    invalid_payload: "a webhook payload is not of the sender's shape (the detail names the field)",
    missing_commit: "a push without its commit (the sender's commit field, e.g. checkout_sha, missing or empty)",
    invalid_commit: "a vendor sender's commit that is not a commit id of 7 to 64 hex digits",
    invalid_alerts: 'an alert payload that is not an object with an alerts array',
    invalid_delivery_id: "the sender's delivery id header is too long or not printable",
    payload_too_deep: 'the JSON body is nested deeper than the API reads',
    idempotency_key_reused:
      'this Idempotency-Key was already used for another change (a restart of another host or service, a deploy of another commit)',
    ref_not_deployable: "the ref is not one of the project's deployable refs (inventory refs)",
    nothing_to_decide: 'the decision names nothing to decide',
    invalid_job_data: "the job the request would queue does not fit the queue's contract (the detail names the field)",
  },
  429: {
    rate_limited: 'over RATE_LIMIT_RPS for this client address; Retry-After says when to come back',
    budget_exhausted: "the namespace's restart budget is spent; nothing was queued or decided; Retry-After says when it has room",
  },
  431: {
    headers_too_large: "the request's headers are larger than the HTTP parser reads",
  },
  500: {
    internal_error: 'an unexpected error, logged; never a stack trace',
  },
  503: {
    redis_unavailable: 'Redis is unreachable or slow; nothing was changed; retry after Retry-After',
    queue_unavailable: 'the job queue is unreachable; nothing was read, queued or retried; retry after Retry-After',
    queue_unconfirmed:
      'the queue took a submission or retry and did not confirm it in time: it may still take effect (the detail says how to retry safely)',
    not_replicated: 'REDIS_MIN_REPLICAS_ACK: the write was not acknowledged by enough replicas in time (the detail says what was kept)',
    cluster_unavailable: 'the Kubernetes API is unreachable or not configured',
    oidc_issuer_unavailable:
      "the OIDC token's issuer (its discovery or key set) cannot be reached: nothing is accepted until it answers; Retry-After",
    event_loop_blocked: "the worker's /livez: its event loop lagged past WORKER_LIVENESS_MAX_LAG_MS",
  },
} as const satisfies Record<number, Record<string, string>>;

type Catalog = typeof CATALOG;
export type ErrorCode = { [S in keyof Catalog]: keyof Catalog[S] }[keyof Catalog];
/** The codes answered with HTTP status `S`: what a class of that status accepts. */
export type ErrorCodeOf<S extends number> = S extends keyof Catalog ? keyof Catalog[S] : never;

/** Each code with its status and meaning, in catalog order. */
export const ERROR_CODES = Object.fromEntries(
  Object.entries(CATALOG).flatMap(([status, codes]) =>
    Object.entries(codes).map(([code, meaning]) => [code, { status: Number(status), meaning }]),
  ),
) as Record<ErrorCode, { status: number; meaning: string }>;

/** Every code, in catalog order: the `enum` of the OpenAPI error schema. */
export const ERROR_CODE_LIST = Object.keys(ERROR_CODES) as ErrorCode[];

export function codesOfStatus(status: number): ErrorCode[] {
  return ERROR_CODE_LIST.filter((c) => ERROR_CODES[c].status === status);
}

/** The body of an answer written outside Express's error path (the HTTP parser's refusals, the metrics port). */
export function errorBody(code: ErrorCode, detail: string) {
  return { detail, code };
}

export class AppError extends Error {
  /** The code's own status (ERROR_CODES), so a code is never answered with another status. */
  readonly statusCode: number;
  /** `headers`: extra response headers, e.g. Retry-After. */
  constructor(
    readonly code: ErrorCode,
    detail: string,
    readonly headers: Record<string, string> = {},
  ) {
    super(detail);
    this.name = new.target.name;
    this.statusCode = ERROR_CODES[code].status;
  }
  get detail(): string {
    return this.message;
  }
  toBody() {
    return errorBody(this.code, this.detail);
  }
}

export class BadRequestError extends AppError {
  constructor(detail = 'bad request', code: ErrorCodeOf<400> = 'bad_request') {
    super(code, detail);
  }
}

export class InvalidJsonError extends AppError {
  constructor(detail = 'request body is not valid JSON') {
    super('invalid_json', detail);
  }
}

export class UnauthorizedError extends AppError {
  constructor(detail: string, code: ErrorCodeOf<401>, headers: Record<string, string> = {}) {
    super(code, detail, headers);
  }
}

/** Names the key and when it expired, so its owner can rotate it. */
export class ApiKeyExpiredError extends UnauthorizedError {
  constructor(id: string, expiredAt: string) {
    super(`API key ${id} expired at ${expiredAt}`, 'api_key_expired');
  }
}

export class ForbiddenError extends AppError {
  constructor(detail: string, code: ErrorCodeOf<403>) {
    super(code, detail);
  }
}

export class NotFoundError extends AppError {
  constructor(detail = 'not found', code: ErrorCodeOf<404> = 'not_found') {
    super(code, detail);
  }
}

export class MethodNotAllowedError extends AppError {
  constructor(allowed: string[]) {
    super('method_not_allowed', `method not allowed; allowed: ${allowed.join(', ')}`, { Allow: allowed.join(', ') });
  }
}

export class ConflictError extends AppError {
  constructor(detail: string, code: ErrorCodeOf<409> = 'conflict') {
    super(code, detail);
  }
}

export class PayloadTooLargeError extends AppError {
  constructor(detail = 'request body is too large', code: ErrorCodeOf<413> = 'payload_too_large') {
    super(code, detail);
  }
}

export class UnsupportedMediaTypeError extends AppError {
  constructor(detail = 'unsupported content encoding or charset') {
    super('unsupported_encoding', detail);
  }
}

export class UnprocessableError extends AppError {
  constructor(detail: string, code: ErrorCodeOf<422> = 'unprocessable') {
    super(code, detail);
  }
}

export class TooManyRequestsError extends AppError {
  constructor(retryAfterSeconds: number) {
    super('rate_limited', 'too many requests; slow down', { 'Retry-After': String(retryAfterSeconds) });
  }
}

/**
 * A restart over its namespace's restart budget: nothing was queued. Its own code, so a client
 * tells it from the rate limiter's 429 (a budget takes longer to clear).
 */
export class BudgetExhaustedError extends AppError {
  readonly namespace: string;
  constructor(namespace: string, detail: string, retryAfterSeconds: number) {
    super('budget_exhausted', detail, { 'Retry-After': String(Math.max(1, Math.ceil(retryAfterSeconds))) });
    this.namespace = namespace;
  }
}

export class ServiceUnavailableError extends AppError {
  constructor(detail: string, code: ErrorCodeOf<503>, retryAfterSeconds = 5) {
    super(code, detail, { 'Retry-After': String(retryAfterSeconds) });
  }
}

/** Redis unreachable or slow for a request that needs it: nothing was changed. */
export class RedisUnavailableError extends ServiceUnavailableError {
  constructor(detail = 'redis unavailable; retry later') {
    super(detail, 'redis_unavailable', 5);
  }
}

/** What a queue operation was doing when the queue failed: the 503's wording says what the caller can conclude. */
export type QueueOperation = 'read' | 'submit' | 'retry';

const QUEUE_UNAVAILABLE: Record<QueueOperation, { nothing: string; unknown: string }> = {
  read: {
    nothing: 'job queue unavailable; nothing was read or changed; retry later',
    unknown: 'job queue did not answer in time; nothing was changed; retry later',
  },
  submit: {
    nothing: 'job queue unavailable; nothing was queued; retry later',
    unknown: 'job queue did not confirm the submission in time; it may still be queued when the queue recovers; retry later',
  },
  retry: {
    nothing: 'job queue unavailable; nothing was retried; retry later',
    unknown: 'job queue did not confirm the retry in time; it may still take effect when the queue recovers; repeating it is safe',
  },
};

/**
 * 503 from a queue operation. `mayHaveLanded`: a write was sent and no answer came (timeout,
 * connection lost), so Redis may still run it when it answers again and an add may still create
 * its job; a retry with the same job id (the same Idempotency-Key) cannot create a second one.
 */
export class QueueUnavailableError extends ServiceUnavailableError {
  readonly operation: QueueOperation;
  readonly mayHaveLanded: boolean;
  constructor(operation: QueueOperation, mayHaveLanded = false, detail?: string) {
    // A read that got no answer changed nothing, whatever Redis does with it later.
    const landed = mayHaveLanded && operation !== 'read';
    super(
      detail ?? QUEUE_UNAVAILABLE[operation][mayHaveLanded ? 'unknown' : 'nothing'],
      landed ? 'queue_unconfirmed' : 'queue_unavailable',
      5,
    );
    this.operation = operation;
    this.mayHaveLanded = landed;
  }
}

/** POST /ops/restart: the add was sent and not confirmed; what a retry does depends on the Idempotency-Key. */
export class RestartNotConfirmedError extends QueueUnavailableError {
  constructor(withIdempotencyKey: boolean) {
    super(
      'submit',
      true,
      'job queue did not confirm the restart in time; it may still be queued when the queue recovers. ' +
        (withIdempotencyKey
          ? 'Retry with the same Idempotency-Key: it returns that job and never queues a second one'
          : 'Check GET /ops/hosts/{host} before retrying, or send an Idempotency-Key so a retry cannot restart twice'),
    );
  }
}

/** REDIS_MIN_REPLICAS_ACK: the writes behind a success answer did not reach enough replicas in time. */
export class NotReplicatedError extends ServiceUnavailableError {
  constructor(minReplicas: number, detail?: string) {
    super(
      detail ?? `not acknowledged by ${minReplicas} Redis replica${minReplicas === 1 ? '' : 's'} in time; retry later`,
      'not_replicated',
      2,
    );
  }
}

export class InternalError extends AppError {
  constructor() {
    super('internal_error', 'internal error');
  }
}

/** One thing wrong with the environment: the variable and what is wrong with it, never its value. */
export interface ConfigProblem {
  variable: string;
  problem: string;
}

/** A bad environment at start-up: every problem found, each naming its variable, never a value. */
export class ConfigError extends Error {
  /** The first problem's variable. */
  readonly variable: string;
  readonly problems: readonly ConfigProblem[];
  constructor(variable: string, problem: string);
  constructor(problems: readonly ConfigProblem[]);
  constructor(first: string | readonly ConfigProblem[], problem?: string) {
    const problems = typeof first === 'string' ? [{ variable: first, problem: problem ?? 'is invalid' }] : first;
    super(problems.map((p) => `${p.variable}: ${p.problem}`).join('; '));
    this.name = 'ConfigError';
    this.problems = problems;
    this.variable = problems[0]?.variable ?? 'environment';
  }
}
