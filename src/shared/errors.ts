/**
 * The one error catalog. Every error a route or middleware raises for a client is one of these
 * classes: a machine code (for code and tests to tell them apart; it is not sent), an HTTP status
 * and a human-readable detail that never carries a secret. The error middleware
 * (src/middleware/errors.ts) turns them into `{detail}` bodies with their headers. Answers that
 * never pass through Express's error path write the same `{detail}` shape themselves: the HTTP
 * parser's refusals (src/middleware/clientError.ts) and the metrics port
 * (src/shared/metricsServer.ts).
 */
export class AppError extends Error {
  readonly code: string;
  readonly statusCode: number;
  /** Extra response headers, e.g. Retry-After. */
  readonly headers: Record<string, string>;

  constructor(code: string, statusCode: number, detail: string, headers: Record<string, string> = {}) {
    super(detail);
    this.name = new.target.name;
    this.code = code;
    this.statusCode = statusCode;
    this.headers = headers;
  }

  get detail(): string {
    return this.message;
  }
}

export class BadRequestError extends AppError {
  constructor(detail = 'bad request') {
    super('bad_request', 400, detail);
  }
}

export class InvalidJsonError extends AppError {
  constructor(detail = 'request body is not valid JSON') {
    super('invalid_json', 400, detail);
  }
}

export class UnauthorizedError extends AppError {
  /** reason is a metrics/audit label (missing, invalid, scheme, not_configured); never shown to the caller verbatim beyond detail. */
  readonly reason: string;
  constructor(detail: string, reason = 'invalid', headers: Record<string, string> = {}) {
    super('unauthorized', 401, detail, headers);
    this.reason = reason;
  }
}

/** An API key past its expiry: the caller is told which key and since when, so its owner can rotate it. */
export class ApiKeyExpiredError extends UnauthorizedError {
  constructor(id: string, expiredAt: string) {
    super(`API key ${id} expired at ${expiredAt}`, 'expired');
  }
}

export class ForbiddenError extends AppError {
  readonly reason: string;
  constructor(detail: string, reason = 'forbidden') {
    super('forbidden', 403, detail);
    this.reason = reason;
  }
}

export class NotFoundError extends AppError {
  constructor(detail = 'not found') {
    super('not_found', 404, detail);
  }
}

export class MethodNotAllowedError extends AppError {
  constructor(allowed: string[]) {
    super('method_not_allowed', 405, `method not allowed; allowed: ${allowed.join(', ')}`, { Allow: allowed.join(', ') });
  }
}

/** The resource is not in a state that allows the operation (e.g. retrying a job that is not failed). */
export class ConflictError extends AppError {
  constructor(detail: string) {
    super('conflict', 409, detail);
  }
}

export class PayloadTooLargeError extends AppError {
  constructor(detail = 'request body is too large') {
    super('payload_too_large', 413, detail);
  }
}

export class UnsupportedMediaTypeError extends AppError {
  constructor(detail = 'request body must be application/json') {
    super('unsupported_media_type', 415, detail);
  }
}

export class UnprocessableError extends AppError {
  constructor(detail: string) {
    super('unprocessable', 422, detail);
  }
}

export class TooManyRequestsError extends AppError {
  constructor(retryAfterSeconds: number) {
    super('rate_limited', 429, 'too many requests; slow down', { 'Retry-After': String(retryAfterSeconds) });
  }
}

/**
 * A restart over its namespace's restart budget (the inventory's policy): 429 with Retry-After,
 * the budget in the detail. Nothing was queued.
 */
export class BudgetExhaustedError extends AppError {
  readonly namespace: string;
  constructor(namespace: string, detail: string, retryAfterSeconds: number) {
    super('budget_exhausted', 429, detail, { 'Retry-After': String(Math.max(1, Math.ceil(retryAfterSeconds))) });
    this.namespace = namespace;
  }
}

export class ServiceUnavailableError extends AppError {
  constructor(detail = 'service temporarily unavailable; retry later', retryAfterSeconds = 5) {
    super('unavailable', 503, detail, { 'Retry-After': String(retryAfterSeconds) });
  }
}

/**
 * What a queue operation was doing when the queue failed; the 503's wording says what the caller
 * can conclude: a read changed nothing, a submission or retry whose command got no answer may
 * still take effect when the queue recovers.
 */
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
 * 503 from a queue operation. `mayHaveLanded` (given true: the command got no answer; kept only
 * for writes): a write was sent and no answer came (timeout,
 * connection lost): Redis may still run it when it answers again (a paused or slow Redis), so an
 * add may still create its job. A caller that retries with the same job id (POST /ops/restart with
 * the same Idempotency-Key) cannot create a second job.
 */
export class QueueUnavailableError extends ServiceUnavailableError {
  readonly operation: QueueOperation;
  readonly mayHaveLanded: boolean;
  constructor(operation: QueueOperation, mayHaveLanded = false, detail?: string) {
    super(detail ?? QUEUE_UNAVAILABLE[operation][mayHaveLanded ? 'unknown' : 'nothing'], 5);
    this.operation = operation;
    // A read that got no answer changed nothing, whatever Redis does with it later.
    this.mayHaveLanded = mayHaveLanded && operation !== 'read';
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
    super(detail ?? `not acknowledged by ${minReplicas} Redis replica${minReplicas === 1 ? '' : 's'} in time; retry later`, 2);
  }
}

export class InternalError extends AppError {
  constructor() {
    super('internal', 500, 'internal error');
  }
}

/** One thing wrong with the environment: the variable and what is wrong with it, never its value. */
export interface ConfigProblem {
  variable: string;
  problem: string;
}

/** Raised at start-up for a bad environment: every problem found, each naming its variable, never a value. */
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
