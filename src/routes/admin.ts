import { randomUUID } from 'node:crypto';
import { createRequire } from 'node:module';
import type { createBullBoard as CreateBullBoard } from '@bull-board/api';
import type { BullMQAdapter as BullMQAdapterClass } from '@bull-board/api/bullMQAdapter';
import type { AppControllerRoute, AppViewRoute } from '@bull-board/api/typings/app';
import type { ExpressAdapter as ExpressAdapterClass } from '@bull-board/express';
import type { Queue } from 'bullmq';
import { Router, type NextFunction, type Request, type RequestHandler, type Response } from 'express';
import type { ApiKey } from '../api/apiKeys.js';
import { sha256Hex } from '../shared/crypto.js';
import { ERROR_CODES, ForbiddenError, NotFoundError, codesOfStatus, type ErrorCode } from '../shared/errors.js';
import { refuseCrossSiteWrites, requireOperatorKeyOrBasic } from '../middleware/auth.js';
import { boundedRaw } from '../middleware/body.js';
import type { Logger } from '../shared/logger.js';
import type { Metrics } from '../shared/metrics.js';
import { refuseUnretried, type DeadLetters } from '../api/deadLetters.js';
import { principalOf } from './principal.js';

/**
 * Bull Board at /admin/queues, for the operator role only (X-API-Key, or HTTP Basic with an operator
 * key as the password). Writes: only retry and removal of a failed job (DESIGN.md, Bull Board); every
 * other write of Bull Board's route table, including any a later Bull Board adds, is refused with 403.
 * A retry of an ops job is the API's retry (DeadLetters.retry). Every state-changing call gets one
 * audit line (who as `key:<credential id>`, never the key); an allowed one adds action, queue, job_id, job_name.
 */
export const ADMIN_BASE_PATH = '/admin/queues';

/** Loaded only with ADMIN_UI_ENABLED (~3 MB of heap and RSS); CommonJS, so require keeps createApp synchronous. */
function loadBullBoard() {
  const require = createRequire(import.meta.url);
  return {
    createBullBoard: (require('@bull-board/api') as { createBullBoard: typeof CreateBullBoard }).createBullBoard,
    BullMQAdapter: (require('@bull-board/api/bullMQAdapter') as { BullMQAdapter: typeof BullMQAdapterClass }).BullMQAdapter,
    ExpressAdapter: (require('@bull-board/express') as { ExpressAdapter: typeof ExpressAdapterClass }).ExpressAdapter,
  };
}

interface AdminRouterOptions {
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

/** One route of Bull Board's route table (method upper case), an Express path matched in table order. */
interface BoardRoute {
  method: string;
  path: string;
}

type BoardAction = 'retry' | 'remove';

/**
 * The writes let through, each only while its job is failed. The write gate reads their :queueName
 * and :jobId, so both must be in Bull Board's table exactly as written (checked when it is built).
 */
export const ALLOWED_BOARD_WRITES: Readonly<Record<string, BoardAction>> = {
  'PUT /api/queues/:queueName/:jobId/retry': 'retry',
  'PUT /api/queues/:queueName/:jobId/clean': 'remove',
};

export const boardRouteKey = (r: BoardRoute): string => `${r.method} ${r.path}`;

/** A GET reads; every other method writes, and only ALLOWED_BOARD_WRITES are let through. */
export function classifyBoardRoute(r: BoardRoute): { write: false } | { write: true; allowed?: BoardAction } {
  if (r.method === 'GET') return { write: false };
  const allowed = ALLOWED_BOARD_WRITES[boardRouteKey(r)];
  return allowed ? { write: true, allowed } : { write: true };
}

function tableRows(route: Pick<AppControllerRoute | AppViewRoute, 'method' | 'route'>): BoardRoute[] {
  const methods = Array.isArray(route.method) ? route.method : [route.method];
  const paths = Array.isArray(route.route) ? route.route : [route.route];
  return methods.flatMap((m) => paths.map((path) => ({ method: m.toUpperCase(), path })));
}

/** Express's Bull Board adapter, keeping the route table createBullBoard gives it. */
function tableKeepingAdapter() {
  const { ExpressAdapter } = loadBullBoard();
  return new (class extends ExpressAdapter {
    readonly routes: BoardRoute[] = [];
    override setEntryRoute(route: AppViewRoute) {
      this.routes.push(...tableRows(route));
      return super.setEntryRoute(route);
    }
    override setApiRoutes(routes: AppControllerRoute[]) {
      this.routes.push(...routes.flatMap(tableRows));
      return super.setApiRoutes(routes);
    }
  })();
}

/** Bull Board's route table, in the order its server adapter registers it (a board over no queue). */
export function readBoardRoutes(): BoardRoute[] {
  const adapter = tableKeepingAdapter();
  loadBullBoard().createBullBoard({ queues: [], serverAdapter: adapter });
  return adapter.routes;
}

/** A request id unless one is set; never the caller's X-Request-Id (src/middleware/context.ts). */
function pinRequestId(res: Response): void {
  const set = [(res.locals as { requestId?: unknown }).requestId, res.getHeader('x-request-id')];
  if (!set.some((v) => typeof v === 'string' && v) && !res.headersSent) res.setHeader('X-Request-Id', randomUUID());
}

/** Pins the request id of a state-changing call and counts it; its audit line is the observe middleware's (one per call). */
function adminActions(metrics: Metrics): RequestHandler {
  return (req: Request, res: Response, next: NextFunction) => {
    if (SAFE_METHODS.has(req.method)) return next();
    pinRequestId(res);
    res.once('finish', () => metrics.adminActions.inc({ method: req.method, status: String(res.statusCode) }));
    next();
  };
}

/** Largest body accepted on a state-changing board call (the allowed ones carry none). */
const ADMIN_BODY_LIMIT = '16kb';

const REFUSED = 'refused: Bull Board here only retries or removes failed (dead-lettered) jobs; other changes go through the API';

/**
 * Matches a state-changing call against Bull Board's write routes with Express's matching (its
 * adapter's), so the route found is the one Bull Board would run: an allowed one passes only while
 * its job is failed; any other write is refused with 403. The body's SHA-256 goes to the audit line.
 */
function writeGate(opts: AdminRouterOptions, table: readonly BoardRoute[]): RequestHandler {
  const { queues, opsQueue } = opts;
  const readBody = boundedRaw(ADMIN_BODY_LIMIT);
  const refuse = () => {
    throw new ForbiddenError(REFUSED, 'admin_action_refused');
  };
  const allowed =
    (action: BoardAction): RequestHandler =>
    (req, res, next) => {
      const queueName = String(req.params.queueName);
      const jobId = String(req.params.jobId);
      const queue = queues.find((q) => q.name === queueName);
      if (!queue) throw new NotFoundError('queue not found', 'queue_not_found');
      void (async () => {
        const job = await queue.getJob(jobId);
        if (!job) throw new NotFoundError('job not found', 'job_not_found');
        const state = await job.getState();
        res.locals.auditFields = { action, queue: queueName, job_id: jobId, job_name: job.name, job_state: state };
        if (state !== 'failed') {
          throw new ForbiddenError(
            `refused: only a failed (dead-lettered) job can be ${action === 'retry' ? 'retried' : 'removed'} here; this job is ${state}`,
            'admin_action_refused',
          );
        }
        if (action === 'retry' && opsQueue && queue === opsQueue.bull) return retryLikeTheApi(opsQueue.deadLetters, opts, jobId, res);
        next('router'); // on to Bull Board
      })().catch(next);
    };

  const writes = Router();
  for (const route of table) {
    const c = classifyBoardRoute(route);
    if (!c.write) continue;
    const method = route.method.toLowerCase() as 'put' | 'patch' | 'post';
    writes[method](route.path, c.allowed ? allowed(c.allowed) : refuse);
  }
  writes.use(refuse); // a write Bull Board does not serve

  return (req, res, next) => {
    if (SAFE_METHODS.has(req.method)) return next();
    readBody(req, res, (err?: unknown) => {
      if (err) return next(err);
      const buf = Buffer.isBuffer(req.body) ? req.body : Buffer.alloc(0);
      res.locals.bodySha256 = sha256Hex(buf);
      req.body = {}; // the allowed calls take no body; Bull Board's own parser sees the stream as read
      writes(req, res, next);
    });
  };
}

/** The API's retry (src/routes/jobs.ts) answered the way Bull Board's client expects: 204 on success. */
async function retryLikeTheApi(deadLetters: DeadLetters, opts: AdminRouterOptions, jobId: string, res: Response): Promise<void> {
  const out = await deadLetters.retry(jobId, {
    requester: principalOf(res),
    reason: 'retried from Bull Board',
    auditId: String(res.locals.requestId),
  });
  refuseUnretried(out);
  const fields = res.locals.auditFields as object;
  if (out.outcome === 'pending_approval') {
    res.locals.auditFields = { ...fields, outcome: 'pending_approval', approval_id: out.approval_id };
    res.status(202).json(out);
    return;
  }
  const retriedAs = out.job.id !== jobId ? { retried_as: out.job.id } : {};
  res.locals.auditFields = { ...fields, outcome: 'retried', ...retriedAs };
  // Bull Board's own WAIT, not handChange's: its answer is Bull Board's, not a change's API answer.
  await opts.retryReplicated?.();
  opts.logger.info('dead-lettered job retried', {
    job_id: jobId,
    job_name: out.job.name,
    ...retriedAs,
    via: 'admin',
    request_id: res.locals.requestId,
  });
  res.status(204).end();
}

/** The catalog's code for one of Bull Board's own error answers (its `error.key`, e.g. ERRORS.QUEUE_NOT_FOUND). */
function boardErrorCode(status: number, key: string | undefined): ErrorCode {
  if (key === 'ERRORS.QUEUE_NOT_FOUND') return 'queue_not_found';
  if (key === 'ERRORS.JOB_NOT_FOUND') return 'job_not_found';
  if (status >= 500) return 'internal_error';
  const generic: Partial<Record<number, ErrorCode>> = {
    400: 'bad_request',
    403: 'admin_action_refused',
    404: 'not_found',
    409: 'conflict',
  };
  return generic[status] ?? codesOfStatus(status)[0] ?? 'bad_request';
}

/** Bull Board's error answers (read by its page) gain `code` and a `detail` from the key: its messages may carry an exception's text. */
function boardErrors(): RequestHandler {
  return (_req, res, next) => {
    const json = res.json.bind(res);
    res.json = (body: unknown) => {
      if (res.statusCode >= 400 && typeof body === 'object' && body !== null && !('code' in body)) {
        const key = (body as { error?: { key?: unknown } }).error?.key;
        const code = boardErrorCode(res.statusCode, typeof key === 'string' ? key : undefined);
        if (ERROR_CODES[code].status !== res.statusCode) res.status(ERROR_CODES[code].status);
        const words =
          typeof key === 'string'
            ? key
                .replace(/^ERRORS\./, '')
                .toLowerCase()
                .replaceAll('_', ' ')
            : 'error';
        return json({ ...body, detail: `Bull Board: ${words}`, code });
      }
      return json(body);
    };
    next();
  };
}

export function createAdminRouter(opts: AdminRouterOptions): Router {
  const basePath = opts.basePath ?? ADMIN_BASE_PATH;
  const { createBullBoard, BullMQAdapter } = loadBullBoard();
  const board = tableKeepingAdapter();
  board.setBasePath(basePath);
  createBullBoard({
    queues: opts.queues.map(
      (q) =>
        new BullMQAdapter(q, {
          readOnlyMode: false,
          allowRetries: true,
          description: 'opsgate jobs; failed = dead-lettered (attempts exhausted or unrecoverable)',
        }),
    ),
    serverAdapter: board,
    options: { uiConfig: { boardTitle: 'opsgate', hideDocsLink: true } },
  });
  const served = new Set(board.routes.map(boardRouteKey));
  const missing = Object.keys(ALLOWED_BOARD_WRITES).filter((k) => !served.has(k));
  if (missing.length > 0) {
    throw new Error(`Bull Board does not serve ${missing.join(', ')}: the write gate of src/routes/admin.ts needs review`);
  }

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
  router.use(writeGate(opts, board.routes));
  router.use(boardErrors());
  router.use(board.getRouter() as RequestHandler);
  return router;
}
