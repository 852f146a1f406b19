import { Router, type RequestHandler, type Response } from 'express';
import type { Redis } from 'ioredis';
import { submitAlerts } from '../domain/alerts.js';
import { seenKey } from '../domain/redisOps.js';
import type { ConfirmReplicated } from '../domain/replication.js';
import { decideGithubPush, decideScmPush, submitDeploy, type PushDecision } from '../domain/deploy.js';
import { requireBearer, requireScmToken, requireSignature } from '../middleware/auth.js';
import { parseJson, rawBody } from '../middleware/body.js';
import { methodNotAllowed } from '../middleware/errors.js';
import type { ApiConfig } from '../shared/config.js';
import { AppError } from '../shared/errors.js';
import type { Logger } from '../shared/logger.js';
import type { Metrics } from '../shared/metrics.js';
import type { OpsQueue } from '../shared/queue.js';

/**
 * POST /webhook/scm, /webhook/github, /webhook/alerts. The sender is verified before the body
 * is parsed (the raw body is read only after header checks, and JSON.parse runs after
 * verification), then the domain decides; every delivery is counted by outcome.
 */
export interface WebhookDeps {
  config: Pick<ApiConfig, 'SCM_WEBHOOK_SECRET' | 'GITHUB_WEBHOOK_SECRET' | 'ALERTS_WEBHOOK_TOKEN' | 'BODY_LIMIT'>;
  redis: Redis;
  queue: Pick<OpsQueue, 'enqueue'>;
  logger: Logger;
  metrics: Pick<Metrics, 'authFailures' | 'webhookEvents'>;
  /** REDIS_MIN_REPLICAS_ACK (src/domain/replication.ts); absent = off. */
  replicated?: ConfirmReplicated;
}

type Outcome = 'accepted' | 'duplicate' | 'ignored' | 'rejected' | 'invalid' | 'failed';

/** The outcome label of a delivery that ended in an error. */
function failureOutcome(err: unknown): Outcome {
  const status = err instanceof AppError ? err.statusCode : 500;
  if (status === 401 || status === 403) return 'rejected';
  if (status >= 400 && status < 500) return 'invalid';
  return 'failed';
}

export function webhooksRouter(deps: WebhookDeps): Router {
  const r = Router();
  const body = rawBody(deps.config.BODY_LIMIT);
  const count = (source: string, outcome: Outcome) => deps.metrics.webhookEvents.inc({ source, outcome });
  const domain = { redis: deps.redis, queue: deps.queue, logger: deps.logger };

  /** Counts auth failures (thrown before the handler) for this source, then re-throws to the error middleware. */
  const countFailures =
    (source: string) =>
    (err: unknown, _req: unknown, _res: unknown, next: (e: unknown) => void) => {
      count(source, failureOutcome(err));
      next(err);
    };

  const deployHandler =
    (source: 'scm' | 'github', decide: (event: string | undefined, payload: unknown) => PushDecision, eventHeader: string) =>
    async (req: { body: Buffer; get(name: string): string | undefined }, res: Response) => {
      const payload = parseJson(req.body);
      const decision = decide(req.get(eventHeader), payload);
      if (decision.kind === 'ignored') {
        count(source, 'ignored');
        res.status(202).json({ ignored: true, reason: decision.reason });
        return;
      }
      const out = await submitDeploy(domain, {
        project: decision.project,
        ref: decision.ref,
        eventId: decision.eventId,
        auditId: res.locals.requestId,
        requestedBy: `webhook:${source}`,
      });
      await deps.replicated?.(out.accepted && out.jobId ? [{ jobId: out.jobId, seenKey: seenKey(decision.eventId) }] : []);
      count(source, out.accepted ? 'accepted' : 'duplicate');
      // Carried by this request's audit line (one log line per delivery, not two: at intake rates
      // the second line was ~6% of the API's CPU and half of its log volume).
      res.locals.auditFields = { event_id: decision.eventId, job_id: out.jobId, outcome: out.accepted ? 'accepted' : 'duplicate' };
      res.status(202).json({ accepted: out.accepted, duplicate: out.duplicate, project: decision.project, event_id: decision.eventId });
    };

  r.route('/webhook/scm')
    .post(requireScmToken(deps.config.SCM_WEBHOOK_SECRET, deps.metrics), ...body, deployHandler('scm', decideScmPush, 'x-scm-event'))
    .all(methodNotAllowed(['POST']));
  r.use('/webhook/scm', countFailures('scm'));

  const sig = requireSignature(deps.config.GITHUB_WEBHOOK_SECRET, 'x-hub-signature-256', 'github', deps.metrics);
  r.route('/webhook/github')
    .post(sig.before, ...body, sig.after, deployHandler('github', decideGithubPush, 'x-github-event'))
    .all(methodNotAllowed(['POST']));
  r.use('/webhook/github', countFailures('github'));

  const alertsAuth = deps.config.ALERTS_WEBHOOK_TOKEN
    ? [requireBearer(deps.config.ALERTS_WEBHOOK_TOKEN, deps.metrics, { scheme: 'alerts_bearer', realm: 'opsgate-alerts', principal: 'webhook:alerts' })]
    : [
        ((_req, res, next) => {
          res.locals.principal = 'webhook:alerts';
          next();
        }) as RequestHandler,
      ];
  if (!deps.config.ALERTS_WEBHOOK_TOKEN) {
    deps.logger.warn('ALERTS_WEBHOOK_TOKEN is not set: /webhook/alerts accepts unauthenticated calls; restrict it by network policy or set the token');
  }
  r.route('/webhook/alerts')
    .post(...alertsAuth, ...body, async (req, res) => {
      const payload = parseJson(req.body);
      const out = await submitAlerts(domain, payload, res.locals.requestId, 'webhook:alerts');
      await deps.replicated?.(out.claims);
      count('alerts', out.queued > 0 ? 'accepted' : out.duplicates > 0 ? 'duplicate' : 'ignored');
      res.status(202).json({ received: out.received, firing: out.firing });
    })
    .all(methodNotAllowed(['POST']));
  r.use('/webhook/alerts', countFailures('alerts'));

  return r;
}
