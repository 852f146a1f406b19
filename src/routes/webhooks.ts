import { only } from './request.js';
import { Router, type Request, type RequestHandler, type Response } from 'express';
import type { Redis } from 'ioredis';
import { submitAlerts } from '../domain/alerts.js';
import { decidePush, deliveryIdOf } from '../domain/deploy.js';
import { handChange } from '../changes/hand.js';
import { pushHanded, submitPush } from '../changes/push.js';
import { principalOf } from './principal.js';
import type { DeliveryEntry, DeliveryLog, Verdict } from '../domain/deliveries.js';
import type { Pipeline } from '../changes/deps.js';
import type { Remediation } from '../remediation/engine.js';
import type { Intake } from '../domain/intake.js';
import type { ConfirmChange, ConfirmReplicated } from '../domain/replication.js';
import { verifySender } from '../middleware/auth.js';
import { parseJson, parseWebhookBody, rawBody } from '../middleware/body.js';
import { toAppError } from '../middleware/errors.js';
import type { ApiConfig } from '../api/config.js';
import { deploysFrom } from '../shared/inventory.js';
import { createSenderSecrets, type SenderSecrets } from '../shared/liveSecrets.js';
import type { Logger } from '../shared/logger.js';
import type { Metrics } from '../shared/metrics.js';
import { guardFields } from './deliveries.js';
import { SOURCES, SOURCE_SECRET_ENVS, type AlertsSource, type PushSource, type Source } from '../sources/index.js';

/**
 * POST /webhook/<source> for every sender of the registry (src/sources). The sender is verified
 * before the body is read and parsed; every delivery is counted by outcome. Answers add to the
 * contract's fields `job_id` (a push; a duplicate's is the original job), `job_ids` (alerts) and
 * the matched remediation rules' decisions (`remediations`).
 */
interface WebhookDeps extends Pick<Pipeline, 'inventory'> {
  config: Pick<ApiConfig, 'ALERTS_MAX_PER_REQUEST' | 'BODY_LIMIT'> & Readonly<Record<string, unknown>>;
  redis: Redis;
  intake: Intake;
  logger: Logger;
  metrics: Pick<Metrics, 'authFailures' | 'webhookEvents'>;
  /** REDIS_MIN_REPLICAS_ACK (src/domain/replication.ts); absent = off. */
  replicated?: ConfirmReplicated;
  changed?: ConfirmChange;
  /** The senders to serve; default the registry. */
  sources?: readonly Source[];
  /** Each delivery's verdict, for GET /ops/deliveries (src/domain/deliveries.ts); absent = not kept. */
  deliveries?: DeliveryLog;
  /** TLS_CLIENT_CA_FILE: the alerts sender's client-certificate check, before its token check. */
  alertsClientCertificate?: RequestHandler;
  /** Read at each delivery (reloaded from their files: src/shared/liveSecrets.ts); default fixedSecrets. */
  senderSecrets?: SenderSecrets;
  pipeline: Pipeline;
  /** Alert-driven remediation: given the alerts after the intake; absent: no rules. */
  remediation?: Pick<Remediation, 'notify'>;
}

/** The senders' secrets of a configuration, fixed: loadApiConfig's values, or each variable's value. */
function fixedSecrets(config: WebhookDeps['config']): SenderSecrets {
  const loaded = config.senderSecrets as Readonly<Record<string, readonly string[]>> | undefined;
  if (loaded) return createSenderSecrets(loaded);
  const values: Record<string, readonly string[]> = {};
  for (const env of SOURCE_SECRET_ENVS) {
    const v = config[env];
    if (typeof v === 'string' && v !== '') values[env] = [v];
  }
  return createSenderSecrets(values);
}

type WebhookVerdict = 'accepted' | 'duplicate' | 'ignored' | 'rejected' | 'invalid' | 'failed';

/** The verdict of a delivery that ended in an error, by its answer's status. */
function failureVerdict(status: number): Verdict {
  if (status === 429) return 'rate_limited';
  if (status === 401 || status === 403) return 'bad_signature';
  if (status >= 400 && status < 500) return 'invalid_payload';
  return 'failed';
}

/** The first delivery id header given; 422 when malformed. */
function deliveryIdIn(req: Request, headers: readonly string[] | undefined): string | undefined {
  for (const h of headers ?? []) {
    const id = deliveryIdOf(req.get(h), h);
    if (id) return id;
  }
  return undefined;
}

/** A delivery id header as recorded: only a well-formed one (the answer refuses the others). */
function recordableDeliveryId(req: Request, headers: readonly string[] | undefined): string | undefined {
  try {
    return deliveryIdIn(req, headers);
  } catch {
    return undefined;
  }
}

/** The request's id and body digest, for a delivery's record. */
const requestFields = (res: Response): Pick<DeliveryEntry, 'requestId' | 'bodySha256'> => ({
  ...(typeof res.locals.requestId === 'string' ? { requestId: res.locals.requestId } : {}),
  ...(typeof res.locals.bodySha256 === 'string' ? { bodySha256: res.locals.bodySha256 } : {}),
});

/** A failed delivery's outcome label, by the status the error middleware will answer; a 429 is no delivery. */
function failureOutcome(err: unknown): WebhookVerdict | undefined {
  const status = toAppError(err)?.statusCode ?? 500;
  if (status === 429) return undefined;
  if (status === 401 || status === 403) return 'rejected';
  if (status >= 400 && status < 500) return 'invalid';
  return 'failed';
}

export function webhooksRouter(deps: WebhookDeps): Router {
  const r = Router();
  const body = rawBody(deps.config.BODY_LIMIT);
  const count = (source: string, outcome: WebhookVerdict) => deps.metrics.webhookEvents.inc({ source, outcome });
  const record = (res: Response, entry: Omit<DeliveryEntry, 'requestId' | 'bodySha256'>) => {
    if (!deps.deliveries) return;
    res.locals.deliveryRecorded = true;
    deps.deliveries.record({ ...entry, ...requestFields(res) });
  };

  const pushHandler = (source: PushSource) => async (req: Request, res: Response) => {
    const raw = req.body as Buffer;
    const payload = source.formPayload ? parseWebhookBody(raw, req.get('content-type')) : parseJson(raw);
    const decided = decidePush(source, req.get(source.event.header), payload);
    // A project whose deploys come from its CI (deploy_from: ci) is not deployed by a push too.
    const decision: typeof decided =
      decided.kind !== 'ignored' && !deploysFrom(deps.inventory, decided.project, 'push')
        ? {
            kind: 'ignored',
            code: 'ignored',
            reason: `project ${decided.project} deploys from CI (deploy_from: ci): a push does not deploy it`,
          }
        : decided;
    if (decision.kind === 'ignored') {
      count(source.name, 'ignored');
      const deliveryId = recordableDeliveryId(req, source.deliveryHeaders);
      record(res, {
        source: source.name,
        verdict: decision.code,
        status: 202,
        detail: decision.reason,
        ...(deliveryId ? { deliveryId } : {}),
      });
      res.status(202).json({ ignored: true, reason: decision.reason });
      return;
    }
    const deliveryId = deliveryIdIn(req, source.deliveryHeaders);
    const { kind: _kind, ...push } = decision;
    const recordPush = (entry: Omit<DeliveryEntry, 'source' | 'push' | 'deliveryId' | 'requestId' | 'bodySha256'>) =>
      record(res, { source: source.name, ...entry, push, ...(deliveryId ? { deliveryId } : {}) });
    const audit = (outcome: string, jobId: string) => ({
      event_id: decision.eventId,
      job_id: jobId,
      outcome,
      ...(deliveryId ? { delivery_id: deliveryId } : {}),
    });
    let out: Awaited<ReturnType<typeof submitPush>>;
    try {
      // The audit line's fields follow the WAIT here: a push that fails is recorded with its failure.
      out = await handChange(deps, res.locals, {
        submit: () =>
          submitPush(deps.pipeline, {
            source: source.name,
            ...push,
            auditId: res.locals.requestId,
            requester: principalOf(res),
            origin: 'webhook',
            ...(deliveryId ? { deliveryId } : {}),
          }),
        handed: pushHanded,
      });
    } catch (err) {
      // Kept with its event, so an operator can replay it once the cause is gone.
      const app = toAppError(err);
      const status = app?.statusCode ?? 500;
      recordPush({ verdict: failureVerdict(status), status, detail: app?.message, code: app?.code ?? 'internal_error' });
      throw err;
    }
    if (out.ignored) {
      // A signed push whose commit pair was queued before (src/domain/intake.ts): kept with its
      // event and the earlier job, so an operator can replay it.
      count(source.name, 'ignored');
      recordPush({ verdict: 'ignored', status: 202, detail: out.ignored.reason, jobId: out.jobId });
      res.locals.auditFields = audit('ignored', out.jobId);
      res.status(202).json({ ignored: true, reason: out.ignored.reason });
      return;
    }
    count(source.name, out.accepted ? 'accepted' : 'duplicate');
    recordPush({
      verdict: out.accepted ? 'queued' : 'duplicate',
      status: 202,
      jobId: out.jobId,
      ...(out.approval
        ? { detail: `pending approval ${out.approval.id} until ${out.approval.expires_at}` }
        : out.held
          ? { detail: `held until ${out.held.until}: ${out.held.reasons}` }
          : {}),
    });
    // Carried by this request's audit line (one log line per delivery, not two).
    res.locals.auditFields = { ...audit(out.accepted ? 'accepted' : 'duplicate', out.jobId), ...guardFields(out) };
    res.status(202).json({
      accepted: out.accepted,
      duplicate: out.duplicate,
      project: decision.project,
      event_id: decision.eventId,
      job_id: out.jobId,
      ...guardFields(out),
    });
  };

  const alertsHandler = (source: AlertsSource) => async (req: Request, res: Response) => {
    const payload = parseJson(req.body as Buffer);
    const out = await submitAlerts(deps.intake, payload, res.locals.requestId, `webhook:${source.name}`, {
      maxAlerts: deps.config.ALERTS_MAX_PER_REQUEST,
    });
    // Beside the contract's intake, never instead of it: its decisions are extra fields of the answer.
    const remediations = deps.remediation ? await deps.remediation.notify(payload, res.locals.requestId) : [];
    // Its own WAIT, not handChange's: it also covers the restarts remediation hands to the pipeline
    // itself. Not acknowledged: the intake's jobs are taken back; a remediation's restart stays, and
    // the sender's retry finds its cooldown (or, on a promoted replica without it, remediates anew).
    await deps.replicated?.(out.written);
    const outcome = out.queued > 0 ? 'accepted' : out.duplicates > 0 ? 'duplicate' : 'ignored';
    count(source.name, outcome);
    record(res, {
      source: source.name,
      verdict: outcome === 'accepted' ? 'queued' : outcome,
      status: 202,
      jobs: out.queued,
      detail: `${out.received} alerts, ${out.firing} firing, ${out.queued} queued, ${out.duplicates} duplicates`,
    });
    if (remediations.length > 0) {
      res.locals.auditFields = {
        ...(res.locals.auditFields as Record<string, unknown> | undefined),
        remediations: remediations.map((r) => `${r.rule}:${r.decision}`),
      };
    }
    res
      .status(202)
      .json({ received: out.received, firing: out.firing, job_ids: out.jobIds, ...(remediations.length > 0 ? { remediations } : {}) });
  };

  const secrets = deps.senderSecrets ?? fixedSecrets(deps.config);
  for (const source of deps.sources ?? SOURCES) {
    const path = `/webhook/${source.name}`;
    const secret = secrets.of(source);
    const clientCertificate = source.kind === 'alerts' ? deps.alertsClientCertificate : undefined;
    if (source.verification.kind === 'bearer' && secret().length === 0 && !clientCertificate) {
      deps.logger.warn(
        `${source.secret.env} is not set: ${path} accepts unauthenticated calls; restrict it by network policy or set the token`,
      );
    }
    const check = verifySender({ source, secret, metrics: deps.metrics, redis: deps.redis, logger: deps.logger });
    const handler = source.kind === 'push' ? pushHandler(source) : alertsHandler(source);
    only(r, 'post', path, ...(clientCertificate ? [clientCertificate] : []), check.before, ...body, check.after, handler);
    // Counts a failed delivery for this sender, then passes the error on to the error middleware.
    r.use(path, (err: unknown, req: Request, res: Response, next: (e: unknown) => void) => {
      const outcome = failureOutcome(err);
      if (outcome) count(source.name, outcome);
      next(err);
    });
  }
  return r;
}

/** Records a failed webhook delivery, also one refused before its route (429). Mounted before the error middleware. */
export function webhookFailures(deps: Pick<WebhookDeps, 'deliveries' | 'sources'>) {
  const byPath = new Map((deps.sources ?? SOURCES).map((s) => [`/webhook/${s.name}`, s]));
  return (err: unknown, req: Request, res: Response, next: (e: unknown) => void): void => {
    const source = req.method === 'POST' ? byPath.get(req.path) : undefined;
    if (source && deps.deliveries && !res.locals.deliveryRecorded) {
      res.locals.deliveryRecorded = true;
      const app = toAppError(err);
      const status = app?.statusCode ?? 500;
      const deliveryId = source.kind === 'push' ? recordableDeliveryId(req, source.deliveryHeaders) : undefined;
      // Verified: the sender's proof passed (verifySender names the principal then) and the answer is
      // not a refusal of it (a timestamped signature used twice is refused after its check).
      const verified = res.locals.principal === `webhook:${source.name}` && status !== 401 && status !== 403;
      deps.deliveries.record({
        source: source.name,
        verdict: failureVerdict(status),
        status,
        ...(verified ? {} : { unverified: true }),
        ...(app ? { detail: app.message } : {}),
        code: app?.code ?? 'internal_error',
        ...(deliveryId ? { deliveryId } : {}),
        ...requestFields(res),
      });
    }
    next(err);
  };
}
