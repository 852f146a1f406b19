import { randomUUID } from 'node:crypto';
import { createRequire } from 'node:module';
import type { createBullBoard as CreateBullBoard } from '@bull-board/api';
import type { BullMQAdapter as BullMQAdapterClass } from '@bull-board/api/bullMQAdapter';
import type { ExpressAdapter as ExpressAdapterClass } from '@bull-board/express';
import type { Queue } from 'bullmq';
import { Router, type NextFunction, type Request, type RequestHandler, type Response } from 'express';
import type { ApiKey } from '../shared/config.js';
import { sha256Hex } from '../shared/crypto.js';
import { ConflictError, ForbiddenError, NotFoundError } from '../shared/errors.js';
import { refuseCrossSiteWrites, requireOperatorKeyOrBasic } from '../middleware/auth.js';
import { boundedRaw } from '../middleware/body.js';
import type { Logger } from '../shared/logger.js';
import type { Metrics } from '../shared/metrics.js';
import type { DeadLetters } from '../shared/deadLetters.js';

/**
 * Bull Board at /admin/queues: the operator's view of the "ops" queue. Dead-lettered jobs (the
 * failed set) are listed with their failure reason and can be retried, cleaned, promoted...
 *
 * Writes: only what dead-letter review needs (DESIGN.md, Bull Board): retry of a failed job and
 * removal of a failed job. A retry of a job of the ops queue is not Bull Board's own: it is the
 * API's retry (DeadLetters.retry, as POST /ops/jobs/{id}/retry), so a restart whose Deployment
 * already has another restart waiting or rolling out is refused (409 {detail}) and the same
 * bookkeeping is done; a success answers 204 as Bull Board's retry does. Every other state-changing call Bull Board offers (add a job, edit its
 * data/delay/priority, empty, clean, obliterate, pause/resume, promote, concurrency, rate limit,
 * retry of a completed or waiting job, bulk retry...) is refused with 403 {detail} before it
 * reaches Bull Board (see writeGate).
 *
 * Access: operator role only, through the API's auth module (requireOperatorKeyOrBasic): header
 * X-API-Key (scripts) or HTTP Basic with an operator key as the password (browsers). Every refusal
 * is an error of the catalog answered by the app's error middleware: JSON {detail}, the key never
 * echoed or logged.
 *
 * Audit: every state-changing call (any method but GET/HEAD/OPTIONS), allowed or refused, is one
 * structured log line (msg "audit", from the app's observe middleware) with who (`key:<credential
 * id>`, never the key), method, path, body_sha256, status and request id; an allowed action adds
 * action (retry/remove), queue, job_id and job_name; refused keys appear as presented_credential.
 */
export const ADMIN_BASE_PATH = '/admin/queues';

/**
 * Bull Board is loaded when the UI is mounted, not when this module is: with ADMIN_UI_ENABLED off
 * (the default of the process, the chart and the manifests) the API does not carry it (~3 MB of
 * heap and RSS). Its packages are CommonJS, so a synchronous require keeps createApp synchronous.
 */
function loadBullBoard() {
  const require = createRequire(import.meta.url);
  return {
    createBullBoard: (require('@bull-board/api') as { createBullBoard: typeof CreateBullBoard }).createBullBoard,
    BullMQAdapter: (require('@bull-board/api/bullMQAdapter') as { BullMQAdapter: typeof BullMQAdapterClass }).BullMQAdapter,
    ExpressAdapter: (require('@bull-board/express') as { ExpressAdapter: typeof ExpressAdapterClass }).ExpressAdapter,
  };
}

export interface AdminRouterOptions {
  queues: Queue[];
  apiKeys: readonly ApiKey[];
  logger: Logger;
  metrics: Metrics;
  /** Where the router is mounted; Bull Board builds its links from it. */
  basePath?: string;
  /** The ops queue: a retry of one of its jobs goes through its dead letters' retry (the API's rule). */
  opsQueue?: { bull: Queue; deadLetters: DeadLetters };
  /** REDIS_MIN_REPLICAS_ACK: WAIT before the retry's 204, as for POST /ops/jobs/{id}/retry. */
  retryReplicated?: () => Promise<void>;
}

const SAFE_METHODS = new Set(['GET', 'HEAD', 'OPTIONS']);

function requestIdOf(res: Response): string {
  const fromLocals = (res.locals as { requestId?: unknown }).requestId;
  if (typeof fromLocals === 'string' && fromLocals) return fromLocals;
  const fromRes = res.getHeader('x-request-id');
  if (typeof fromRes === 'string' && fromRes) return fromRes;
  const id = randomUUID(); // never the caller's X-Request-Id (src/middleware/context.ts)
  if (!res.headersSent) res.setHeader('X-Request-Id', id);
  return id;
}

/**
 * Runs first, for state-changing calls only: pins the request id and counts the action once it is
 * answered (opsgate_admin_actions_total{method,status}). The audit line itself is written by the
 * app-wide observe middleware (src/middleware/observe.ts) for every state-changing call, with
 * who = res.locals.principal (`key:<credential id>`, set by the auth middleware), method, full
 * path, status and request id, so an admin retry yields exactly one audit line.
 */
function adminActions(metrics: Metrics): RequestHandler {
  return (req: Request, res: Response, next: NextFunction) => {
    if (SAFE_METHODS.has(req.method)) return next();
    requestIdOf(res);
    res.once('finish', () => metrics.adminActions.inc({ method: req.method, status: String(res.statusCode) }));
    next();
  };
}

/** Largest body accepted on a state-changing board call (the allowed ones carry none). */
const ADMIN_BODY_LIMIT = '16kb';
/** PUT /api/queues/:queueName/:jobId/(retry|clean): the only writes let through (case-insensitive like Express routing). */
const ALLOWED_WRITE = /^\/api\/queues\/([^/]+)\/([^/]+)\/(retry|clean)\/?$/i;
/**
 * Words Bull Board routes at the :jobId position of a longer path (e.g. PUT
 * /api/queues/ops/clean/retry is "clean every job in state retry"): never taken as a job id.
 */
const RESERVED_SEGMENTS = new Set([
  'add',
  'retry',
  'clean',
  'promote',
  'pause',
  'resume',
  'concurrency',
  'rate-limit',
  'empty',
  'obliterate',
  'job-schedulers',
  'metrics',
  'workers',
]);

function decodeSegment(s: string): string | undefined {
  try {
    return decodeURIComponent(s);
  } catch {
    return undefined;
  }
}

/**
 * Runs after the operator and same-origin checks, for state-changing calls only: reads the body
 * (bounded) to record its SHA-256 for the audit line, then lets through only a retry or removal of
 * a job that is in the failed (dead-letter) set right now; anything else -> 403 {detail}, an
 * unknown queue or job -> 404 {detail}. The allowed call is tagged for the audit line with
 * action, queue, job id and job name.
 */
function writeGate(opts: AdminRouterOptions): [RequestHandler, RequestHandler] {
  const { queues, opsQueue } = opts;
  const reader = boundedRaw(ADMIN_BODY_LIMIT);
  const gate: RequestHandler = (req, res, next) => {
    const buf = Buffer.isBuffer(req.body) ? req.body : Buffer.alloc(0);
    res.locals.bodySha256 = sha256Hex(buf);
    req.body = {}; // the allowed calls take no body; Bull Board's own parser sees the stream as read
    const m = req.method === 'PUT' ? ALLOWED_WRITE.exec(req.path) : null;
    const queueName = m ? decodeSegment(m[1]!) : undefined;
    const jobId = m ? decodeSegment(m[2]!) : undefined;
    if (!m || queueName === undefined || jobId === undefined || RESERVED_SEGMENTS.has(jobId.toLowerCase())) {
      throw new ForbiddenError(
        'refused: Bull Board here only retries or removes failed (dead-lettered) jobs; other changes go through the API',
        'refused',
      );
    }
    const action = m[3]!.toLowerCase() === 'retry' ? 'retry' : 'remove';
    const queue = queues.find((q) => q.name === queueName);
    if (!queue) throw new NotFoundError('queue not found');
    void (async () => {
      const job = await queue.getJob(jobId);
      if (!job) throw new NotFoundError('job not found');
      const state = await job.getState();
      res.locals.auditFields = { action, queue: queueName, job_id: jobId, job_name: job.name, job_state: state };
      if (state !== 'failed') {
        throw new ForbiddenError(
          `refused: only a failed (dead-lettered) job can be ${action === 'retry' ? 'retried' : 'removed'} here; this job is ${state}`,
          'refused',
        );
      }
      if (action === 'retry' && opsQueue && queue === opsQueue.bull) return retryLikeTheApi(opsQueue, opts, jobId, res);
      next();
    })().catch(next);
  };
  return [reader, gate];
}

/** The API's retry (src/routes/jobs.ts) answered the way Bull Board's client expects: 204 on success. */
async function retryLikeTheApi(
  opsQueue: { deadLetters: DeadLetters },
  opts: AdminRouterOptions,
  jobId: string,
  res: Response,
): Promise<void> {
  const out = await opsQueue.deadLetters.retry(jobId);
  switch (out.outcome) {
    case 'not_found':
      throw new NotFoundError('job not found');
    case 'not_failed':
      throw new ConflictError(`job is ${out.state}; only a failed (dead-lettered) job can be retried`);
    case 'busy':
      throw new ConflictError(
        `another restart of this Deployment is waiting or rolling out (job ${out.holder}); retry this one after it finished`,
      );
    case 'retried':
      res.locals.auditFields = {
        ...(res.locals.auditFields as object),
        outcome: 'retried',
        ...(out.job.id !== jobId ? { retried_as: out.job.id } : {}),
      };
      await opts.retryReplicated?.();
      opts.logger.info('dead-lettered job retried', {
        job_id: jobId,
        job_name: out.job.name,
        ...(out.job.id !== jobId ? { retried_as: out.job.id } : {}),
        via: 'admin',
        request_id: res.locals.requestId,
      });
      res.status(204).end();
  }
}

export function createAdminRouter(opts: AdminRouterOptions): Router {
  const basePath = opts.basePath ?? ADMIN_BASE_PATH;
  const { createBullBoard, BullMQAdapter, ExpressAdapter } = loadBullBoard();
  const serverAdapter = new ExpressAdapter();
  serverAdapter.setBasePath(basePath);
  createBullBoard({
    queues: opts.queues.map(
      (q) =>
        new BullMQAdapter(q, {
          readOnlyMode: false,
          allowRetries: true,
          description: 'opsgate jobs; failed = dead-lettered (attempts exhausted or unrecoverable)',
        }),
    ),
    serverAdapter,
    options: { uiConfig: { boardTitle: 'opsgate', hideDocsLink: true } },
  });

  const router = Router();
  router.use(adminActions(opts.metrics));
  opts.logger.info('bull board mounted', { path: basePath, queues: opts.queues.map((q) => q.name) });
  router.use(requireOperatorKeyOrBasic(opts.apiKeys, opts.metrics));
  router.use(refuseCrossSiteWrites(opts.metrics));
  router.use((_req, res, next) => {
    // Operator data: never stored by a shared proxy; the browser revalidates. Never framed.
    res.set('Cache-Control', 'private, no-cache');
    res.set('X-Frame-Options', 'DENY');
    res.set('Content-Security-Policy', "frame-ancestors 'none'");
    res.set('X-Content-Type-Options', 'nosniff');
    res.set('Referrer-Policy', 'same-origin');
    next();
  });
  const [readBody, gate] = writeGate(opts);
  router.use((req, res, next) => {
    if (SAFE_METHODS.has(req.method)) return next();
    readBody(req, res, (err?: unknown) => {
      if (err) return next(err);
      // Called back by the body reader, outside Express's own catch: a refusal thrown here is handed on.
      try {
        gate(req, res, next);
      } catch (refusal) {
        next(refusal);
      }
    });
  });
  router.use(serverAdapter.getRouter() as RequestHandler);
  return router;
}
