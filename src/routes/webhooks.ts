import { Router, type RequestHandler, type Response } from 'express';
import type { Redis } from 'ioredis';
import { submitAlerts } from '../domain/alerts.js';
import { decideGithubPush, decideGitlabPush, decideScmPush, deliveryIdOf, submitDeploy, type PushDecision } from '../domain/deploy.js';
import type { ConfirmReplicated } from '../domain/replication.js';
import { requireBearer, requireScmToken, requireSignature } from '../middleware/auth.js';
import { parseJson, parseWebhookBody, rawBody } from '../middleware/body.js';
import { methodNotAllowed, toAppError } from '../middleware/errors.js';
import { pendingRateHit } from '../middleware/rateLimit.js';
import type { ApiConfig } from '../shared/config.js';
import type { Logger } from '../shared/logger.js';
import type { Metrics } from '../shared/metrics.js';
import type { OpsQueue } from '../shared/queue.js';

/**
 * POST /webhook/scm, /webhook/github, /webhook/gitlab, /webhook/alerts. The sender is verified
 * before the body is parsed (the raw body is read only after header checks, and JSON.parse runs
 * after verification), then the domain decides; every delivery is counted by outcome.
 *
 * Answers: the spec's fields, plus `job_id` on an accepted or duplicate push (a duplicate carries
 * the original job's id) and `job_ids` (the jobs it queued) on an alert payload, for
 * GET /ops/jobs/{id}.
 *
 * Rate limit: the request's hit is deferred to the intake's first Redis round trip
 * (src/middleware/rateLimit.ts); a delivery that ends without one (ignored, refused) sends it
 * on its own before answering, so every delivery still counts against the budget.
 */
export interface WebhookDeps {
  config: Pick<
    ApiConfig,
    | 'SCM_WEBHOOK_SECRET'
    | 'GITHUB_WEBHOOK_SECRET'
    | 'GITLAB_WEBHOOK_SECRET'
    | 'ALERTS_WEBHOOK_TOKEN'
    | 'ALERTS_MAX_PER_REQUEST'
    | 'BODY_LIMIT'
  >;
  redis: Redis;
  queue: Pick<OpsQueue, 'intake'>;
  logger: Logger;
  metrics: Pick<Metrics, 'authFailures' | 'webhookEvents'>;
  /** REDIS_MIN_REPLICAS_ACK (src/domain/replication.ts); absent = off. */
  replicated?: ConfirmReplicated;
  /** TLS_CLIENT_CA_FILE: the client-certificate check of /webhook/alerts, before its token check (src/middleware/clientCert.ts). */
  alertsClientCertificate?: RequestHandler;
}

type Outcome = 'accepted' | 'duplicate' | 'ignored' | 'rejected' | 'invalid' | 'failed';

/**
 * The outcome label of a delivery that ended in an error, seen as the error middleware will
 * answer it (a body reader's 413 is "invalid", not "failed"); a 429 is not a delivery (undefined).
 */
function failureOutcome(err: unknown): Outcome | undefined {
  const status = toAppError(err)?.statusCode ?? 500;
  if (status === 429) return undefined;
  if (status === 401 || status === 403) return 'rejected';
  if (status >= 400 && status < 500) return 'invalid';
  return 'failed';
}

export function webhooksRouter(deps: WebhookDeps): Router {
  const r = Router();
  const body = rawBody(deps.config.BODY_LIMIT);
  const count = (source: string, outcome: Outcome) => deps.metrics.webhookEvents.inc({ source, outcome });
  const domain = { redis: deps.redis, queue: deps.queue, logger: deps.logger };

  /**
   * Counts a failed delivery for this source, then passes the error on to the error middleware;
   * a delivery refused before its rate-limit hit was sent sends it now (over the limit: 429).
   */
  const countFailures = (source: string) => (err: unknown, _req: unknown, res: Response, next: (e: unknown) => void) => {
    const hit = pendingRateHit(res);
    const finish = (e: unknown) => {
      const outcome = failureOutcome(e);
      if (outcome) count(source, outcome);
      next(e);
    };
    if (!hit) return finish(err);
    hit.run().then(
      () => finish(err),
      (limited: unknown) => finish(limited),
    );
  };

  interface DeployRoute {
    source: 'scm' | 'github' | 'gitlab';
    decide: (event: string | undefined, payload: unknown) => PushDecision;
    eventHeader: string;
    /** The sender's delivery id headers, first present wins (recorded for SEEN_DELIVERY_TTL_SECONDS). */
    deliveryHeaders?: readonly string[];
    parse?: (req: { body: Buffer; get(name: string): string | undefined }) => unknown;
  }

  const deployHandler = (route: DeployRoute) => async (req: { body: Buffer; get(name: string): string | undefined }, res: Response) => {
    const payload = route.parse ? route.parse(req) : parseJson(req.body);
    const decision = route.decide(req.get(route.eventHeader), payload);
    if (decision.kind === 'ignored') {
      await pendingRateHit(res)?.run();
      count(route.source, 'ignored');
      res.status(202).json({ ignored: true, reason: decision.reason });
      return;
    }
    let delivery: { source: string; id: string } | undefined;
    for (const h of route.deliveryHeaders ?? []) {
      const id = deliveryIdOf(req.get(h), h);
      if (id) {
        delivery = { source: route.source, id };
        break;
      }
    }
    const out = await submitDeploy(domain, {
      project: decision.project,
      ref: decision.ref,
      sha: decision.sha,
      eventId: decision.eventId,
      auditId: res.locals.requestId,
      requestedBy: `webhook:${route.source}`,
      delivery,
      rateHit: pendingRateHit(res),
    });
    await deps.replicated?.(out.accepted && out.jobId ? [{ jobId: out.jobId, keys: out.keys }] : []);
    count(route.source, out.accepted ? 'accepted' : 'duplicate');
    // Carried by this request's audit line (one log line per delivery, not two: at intake rates
    // a second line would cost a noticeable share of the API's CPU and double its log volume).
    res.locals.auditFields = {
      event_id: decision.eventId,
      job_id: out.jobId,
      outcome: out.accepted ? 'accepted' : 'duplicate',
      ...(delivery ? { delivery_id: delivery.id } : {}),
    };
    res.status(202).json({
      accepted: out.accepted,
      duplicate: out.duplicate,
      project: decision.project,
      event_id: decision.eventId,
      ...(out.jobId ? { job_id: out.jobId } : {}),
    });
  };

  r.route('/webhook/scm')
    .post(
      requireScmToken(deps.config.SCM_WEBHOOK_SECRET, deps.metrics),
      ...body,
      deployHandler({ source: 'scm', decide: decideScmPush, eventHeader: 'x-scm-event' }),
    )
    .all(methodNotAllowed(['POST']));
  r.use('/webhook/scm', countFailures('scm'));

  const sig = requireSignature(deps.config.GITHUB_WEBHOOK_SECRET, 'x-hub-signature-256', 'github', deps.metrics);
  r.route('/webhook/github')
    .post(
      sig.before,
      ...body,
      sig.after,
      deployHandler({
        source: 'github',
        decide: decideGithubPush,
        eventHeader: 'x-github-event',
        deliveryHeaders: ['x-github-delivery'],
        // JSON or GitHub's form encoding (payload=<json>); the signature was checked over the raw body.
        parse: (req) => parseWebhookBody(req.body, req.get('content-type')),
      }),
    )
    .all(methodNotAllowed(['POST']));
  r.use('/webhook/github', countFailures('github'));

  // GitLab's native headers; same rules and event id as /webhook/scm. Idempotency-Key (GitLab
  // 17.4+) stays the same across GitLab's retries of one delivery; X-Gitlab-Event-UUID otherwise.
  const gitlabSecret = deps.config.GITLAB_WEBHOOK_SECRET ?? deps.config.SCM_WEBHOOK_SECRET;
  r.route('/webhook/gitlab')
    .post(
      requireScmToken(gitlabSecret, deps.metrics, { header: 'X-Gitlab-Token', scheme: 'gitlab_token', source: 'gitlab', what: 'GitLab' }),
      ...body,
      deployHandler({
        source: 'gitlab',
        decide: decideGitlabPush,
        eventHeader: 'x-gitlab-event',
        deliveryHeaders: ['idempotency-key', 'x-gitlab-event-uuid'],
      }),
    )
    .all(methodNotAllowed(['POST']));
  r.use('/webhook/gitlab', countFailures('gitlab'));

  const alertsAuth = deps.config.ALERTS_WEBHOOK_TOKEN
    ? [
        requireBearer(deps.config.ALERTS_WEBHOOK_TOKEN, deps.metrics, {
          scheme: 'alerts_bearer',
          realm: 'opsgate-alerts',
          principal: 'webhook:alerts',
        }),
      ]
    : [
        ((_req, res, next) => {
          res.locals.principal = 'webhook:alerts';
          next();
        }) as RequestHandler,
      ];
  if (!deps.config.ALERTS_WEBHOOK_TOKEN && !deps.alertsClientCertificate) {
    deps.logger.warn(
      'ALERTS_WEBHOOK_TOKEN is not set: /webhook/alerts accepts unauthenticated calls; restrict it by network policy or set the token',
    );
  }
  r.route('/webhook/alerts')
    .post(...(deps.alertsClientCertificate ? [deps.alertsClientCertificate] : []), ...alertsAuth, ...body, async (req, res) => {
      const payload = parseJson(req.body as Buffer);
      const out = await submitAlerts(domain, payload, res.locals.requestId, 'webhook:alerts', {
        maxAlerts: deps.config.ALERTS_MAX_PER_REQUEST,
        rateHit: pendingRateHit(res),
      });
      await pendingRateHit(res)?.run();
      await deps.replicated?.(out.claims);
      count('alerts', out.queued > 0 ? 'accepted' : out.duplicates > 0 ? 'duplicate' : 'ignored');
      res.status(202).json({ received: out.received, firing: out.firing, job_ids: out.jobIds });
    })
    .all(methodNotAllowed(['POST']));
  r.use('/webhook/alerts', countFailures('alerts'));

  return r;
}
