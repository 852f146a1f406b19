import { randomUUID } from 'node:crypto';
import { createRequire } from 'node:module';
import type { createBullBoard as CreateBullBoard } from '@bull-board/api';
import type { BullMQAdapter as BullMQAdapterClass } from '@bull-board/api/bullMQAdapter';
import type { AppControllerRoute, AppViewRoute, ControllerHandlerReturnType, IServerAdapter } from '@bull-board/api/typings/app';
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
 * Bull Board at /admin/queues: the operator's view of the "ops" queue. Dead-lettered jobs (the
 * failed set) are listed with their failure reason and can be retried or removed.
 *
 * Writes: only what dead-letter review needs (DESIGN.md, Bull Board): retry of a failed job and
 * removal of a failed job. Which Bull Board route a call reaches is read from the route table
 * bull-board hands its server adapter (see BoardRoute): every route that is not a GET is a write,
 * and every write but those two is refused with 403 {detail, code} before it reaches Bull Board (add a
 * job, edit its data, delay or priority, empty, clean, obliterate, pause, resume, promote,
 * concurrency, rate limit, bulk retry, and whatever write a later Bull Board adds). A retry of a
 * job of the ops queue is the API's retry (DeadLetters.retry, as POST /ops/jobs/{id}/retry), so a
 * restart whose Deployment already has another restart waiting or rolling out is refused (409
 * {detail, code}) and the same bookkeeping is done; a success answers 204 as Bull Board's retry does.
 * Bull Board's own error answers (an unknown queue or job in its API, its 500) keep the fields its
 * page reads and gain the API's `detail` and `code` (boardErrors).
 *
 * Access: operator role only, through the API's auth module (requireOperatorKeyOrBasic): header
 * X-API-Key (scripts) or HTTP Basic with an operator key as the password (browsers). Every refusal
 * is an error of the catalog answered by the app's error middleware: JSON {detail, code}, the key never
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

/**
 * One method and path of Bull Board's route table, as bull-board hands it to every server adapter
 * (IServerAdapter.setEntryRoute and setApiRoutes) and as the adapter routes it: an Express path
 * pattern, matched in table order.
 */
interface BoardRoute {
  /** Upper case: GET, PUT, PATCH, POST. */
  method: string;
  path: string;
}

type BoardAction = 'retry' | 'remove';

/**
 * The writes opsgate lets through, by Bull Board route: retry of one job and removal ("clean") of
 * one job, each only while the job is failed (dead-lettered). Their :queueName and :jobId are read
 * by the write gate, so both routes must be in the table exactly as written here (checked when
 * the board is built).
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

/**
 * A server adapter that keeps the route table createBullBoard gives it and hands every call on
 * to `inner` (Express's adapter, or nothing when only the table is wanted).
 */
class TableKeepingAdapter implements IServerAdapter {
  readonly routes: BoardRoute[] = [];
  constructor(private readonly inner?: IServerAdapter) {}
  setQueues(...a: Parameters<IServerAdapter['setQueues']>) {
    this.inner?.setQueues(...a);
    return this;
  }
  setViewsPath(viewPath: string) {
    this.inner?.setViewsPath(viewPath);
    return this;
  }
  setStaticPath(staticsRoute: string, staticsPath: string) {
    this.inner?.setStaticPath(staticsRoute, staticsPath);
    return this;
  }
  setEntryRoute(route: AppViewRoute) {
    this.routes.push(...tableRows(route));
    this.inner?.setEntryRoute(route);
    return this;
  }
  setErrorHandler(handler: (error: Error) => ControllerHandlerReturnType) {
    this.inner?.setErrorHandler(handler);
    return this;
  }
  setApiRoutes(routes: AppControllerRoute[]) {
    for (const r of routes) this.routes.push(...tableRows(r));
    this.inner?.setApiRoutes(routes);
    return this;
  }
  setUIConfig(...a: Parameters<IServerAdapter['setUIConfig']>) {
    this.inner?.setUIConfig(...a);
    return this;
  }
}

/** Bull Board's route table, in the order its server adapter registers it (a board over no queue). */
export function readBoardRoutes(): BoardRoute[] {
  const { createBullBoard } = loadBullBoard();
  const adapter = new TableKeepingAdapter();
  createBullBoard({ queues: [], serverAdapter: adapter });
  return adapter.routes;
}

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

const REFUSED = 'refused: Bull Board here only retries or removes failed (dead-lettered) jobs; other changes go through the API';

/**
 * Runs after the operator and same-origin checks, for state-changing calls only. The body is read
 * (bounded) for its SHA-256 in the audit line. Then the call is matched against Bull Board's own
 * write routes, in its order, with Express's matching (the matching of Bull Board's adapter), so
 * the route found is the route Bull Board would run: an allowed route goes on to Bull Board only
 * when its job is in the failed (dead-letter) set right now (unknown queue or job: 404 {detail, code});
 * any other write, and a write Bull Board does not serve, is refused with 403 {detail, code}. The
 * allowed call is tagged for the audit line with action, queue, job id and job name.
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
        if (action === 'retry' && opsQueue && queue === opsQueue.bull) return retryLikeTheApi(opsQueue, opts, jobId, res);
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
async function retryLikeTheApi(
  opsQueue: { deadLetters: DeadLetters },
  opts: AdminRouterOptions,
  jobId: string,
  res: Response,
): Promise<void> {
  const out = await opsQueue.deadLetters.retry(jobId, {
    requester: principalOf(res),
    reason: 'retried from Bull Board',
    auditId: String(res.locals.requestId),
  });
  refuseUnretried(out);
  switch (out.outcome) {
    case 'pending_approval':
      res.locals.auditFields = { ...(res.locals.auditFields as object), outcome: 'pending_approval', approval_id: out.approval_id };
      res.status(202).json(out);
      return;
    case 'retried':
      res.locals.auditFields = {
        ...(res.locals.auditFields as object),
        outcome: 'retried',
        ...(out.job.id !== jobId ? { retried_as: out.job.id } : {}),
      };
      // Bull Board's own WAIT, not handChange's: its answer is Bull Board's, not a change's API answer.
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

/**
 * Bull Board's API answers its errors itself (`{error: {key}, message?}`, read by its page): each
 * gains the API's `detail` (from the key: Bull Board's messages may carry an exception's text)
 * and `code`, so a script sees the one shape of src/shared/errors.ts there too. Its status is
 * kept unless the code's differs (a generic code of another status is never sent).
 */
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
  const { createBullBoard, BullMQAdapter, ExpressAdapter } = loadBullBoard();
  const serverAdapter = new ExpressAdapter();
  serverAdapter.setBasePath(basePath);
  const board = new TableKeepingAdapter(serverAdapter);
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
  router.use(serverAdapter.getRouter() as RequestHandler);
  return router;
}
