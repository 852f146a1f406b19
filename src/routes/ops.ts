import { only } from './request.js';
import { Router } from 'express';
import type { Redis } from 'ioredis';
import { dryRunRestart } from '../changes/dryRun.js';
import type { Pipeline } from '../changes/deps.js';
import type { ConfirmChange, ConfirmReplicated } from '../domain/replication.js';
import { clearCache, getHostStatus, type HostStatusProvider } from '../domain/hostStatus.js';
import { handChange } from '../changes/hand.js';
import { idempotencyScope, restartChange, submitRestart } from '../changes/restart.js';
import { idempotencyKeyOf, restartOptions, restartTargetQuery } from './restartQuery.js';
import { principalOf } from './principal.js';
import { idempotencyRecordKey } from '../shared/keys.js';
import { keyChecks, type KeyedDeps, requireBearerOrOperatorKey } from '../middleware/auth.js';
import { rawBody } from '../middleware/body.js';
import type { OidcVerifier } from '../middleware/oidc.js';
import { requireInScope } from '../middleware/scope.js';
import type { ApiConfig } from '../api/config.js';
import { findHost, hostNames, type Inventory } from '../shared/inventory.js';
import type { Logger } from '../shared/logger.js';

/** /ops/hosts, /ops/hosts/:host, /ops/restart, /ops/cache. */
interface OpsDeps extends KeyedDeps {
  config: Pick<ApiConfig, 'apiKeys' | 'OPS_BEARER_TOKEN' | 'OPS_BEARER_TOKEN_OWNER' | 'BODY_LIMIT'>;
  redis: Redis;
  inventory: Inventory;
  hostStatus: HostStatusProvider;
  logger: Logger;
  /** REDIS_MIN_REPLICAS_ACK (src/domain/replication.ts); absent = off. */
  replicated?: ConfirmReplicated;
  changed?: ConfirmChange;
  pipeline: Pipeline;
  /** OIDC ID tokens as bearer credentials on POST /ops/restart; absent: the contract's bearer rules alone. */
  oidc?: OidcVerifier;
}

export function opsRouter(deps: OpsDeps): Router {
  const r = Router();
  const { anyKey, operatorKey } = keyChecks(deps);
  const bearerOrOperator = requireBearerOrOperatorKey(
    deps.config.apiKeys,
    deps.config.OPS_BEARER_TOKEN,
    deps.metrics,
    deps.apiKeyPolicy,
    deps.config.OPS_BEARER_TOKEN_OWNER,
    deps.oidc,
  );
  const body = rawBody(deps.config.BODY_LIMIT);

  only(r, 'get', '/ops/hosts', anyKey, (_req, res) => {
    res.json({ hosts: hostNames(deps.inventory) });
  });

  only(r, 'get', '/ops/hosts/:host', anyKey, async (req, res) => {
    const entry = findHost(deps.inventory, req.params.host);
    if (entry) requireInScope(res, { kind: 'host', host: req.params.host, namespace: entry.namespace });
    const status = await getHostStatus(
      { redis: deps.redis, inventory: deps.inventory, provider: deps.hostStatus, logger: deps.logger },
      req.params.host,
    );
    res.json(status);
  });

  only(r, 'post', '/ops/restart', bearerOrOperator, ...body, async (req, res) => {
    const opts = restartOptions(req.query);
    const { host, service } = restartTargetQuery(req.query);
    // A scoped credential (keys file, OIDC rule) restarts only hosts its scope admits; an unknown host is the pipeline's 404.
    const entry = findHost(deps.inventory, host);
    if (entry) requireInScope(res, { kind: 'host', host, namespace: entry.namespace });
    const requester = principalOf(res);
    const reason = opts.reason ? { reason: opts.reason } : {};
    const request = { host, service, requester, auditId: res.locals.requestId, ...reason };
    if (opts.dry_run) {
      const change = restartChange(deps, request);
      res.locals.auditFields = { dry_run: true, ...reason };
      const answer = await dryRunRestart(deps.pipeline, change, opts.override && opts.reason ? { reason: opts.reason } : undefined);
      res.locals.auditFields = { dry_run: true, would: answer.would, admitted: answer.kubernetes.admitted ?? null };
      res.json(answer);
      return;
    }
    const idempotencyKey = idempotencyKeyOf(req.get('idempotency-key'));
    const ack = await handChange(deps, res.locals, {
      submit: () =>
        submitRestart(deps, { ...request, ...(idempotencyKey !== undefined ? { idempotencyKey } : {}), override: opts.override }),
      audit: (ack) =>
        ack.kind === 'pending_approval'
          ? { approval_id: ack.approval_id, status: ack.status, coalesced: ack.coalesced, reason: opts.reason }
          : { job_id: ack.job_id, coalesced: ack.coalesced, ...reason, ...(opts.override ? { override: true } : {}) },
      // A restart that joined another one (coalesced) wrote no job of its own.
      handed: (ack) =>
        ack.kind === 'pending_approval'
          ? { wrote: 'approval', approvalId: ack.approval_id, event: 'requested' }
          : ack.coalesced
            ? { wrote: 'job' }
            : {
                wrote: 'job',
                written: {
                  jobId: ack.job_id,
                  keys: idempotencyKey === undefined ? [] : [idempotencyRecordKey(idempotencyScope(requester.principal, idempotencyKey))],
                },
              },
    });
    const { kind: _kind, http, ...answer } = ack;
    res.status(http).json(answer);
  });

  only(r, 'delete', '/ops/cache', operatorKey, ...body, async (_req, res) => {
    const removed = await clearCache(deps.redis);
    deps.logger.info('cache cleared', { keys_removed: removed, request_id: res.locals.requestId });
    res.json({ cleared: true });
  });

  return r;
}
