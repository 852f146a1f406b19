import { NotFoundError, UnprocessableError } from '../shared/errors.js';
import { findHost, type Inventory } from '../shared/inventory.js';
import { JOB } from '../shared/jobs.js';
import type { OpsQueue } from '../shared/queue.js';

/**
 * POST /ops/restart: `host` must be an inventory host and `service` one of its Deployments
 * (else 404); then one restart_service job. The worker checks the inventory again.
 */
export interface RestartRequest {
  host: unknown;
  service: unknown;
  auditId: string;
  requestedBy: string;
}

export interface RestartAck {
  host: string;
  service: string;
  status: 'submitted';
  job_id: string;
}

/** A query parameter must be given exactly once and be non-empty. */
function requiredParam(value: unknown, name: string): string {
  if (value === undefined || value === '') throw new UnprocessableError(`query parameter "${name}" is required`);
  if (typeof value !== 'string') throw new UnprocessableError(`query parameter "${name}" must be given once, as a string`);
  return value;
}

export function validateRestart(inventory: Inventory, hostRaw: unknown, serviceRaw: unknown): { host: string; service: string } {
  const host = requiredParam(hostRaw, 'host');
  const service = requiredParam(serviceRaw, 'service');
  const entry = findHost(inventory, host);
  if (!entry) throw new NotFoundError('unknown host');
  if (!entry.deployments.includes(service)) throw new NotFoundError('unknown service for this host');
  return { host, service };
}

export async function submitRestart(deps: { inventory: Inventory; queue: Pick<OpsQueue, 'enqueue'> }, req: RestartRequest): Promise<RestartAck> {
  const { host, service } = validateRestart(deps.inventory, req.host, req.service);
  const jobId = await deps.queue.enqueue(JOB.restartService, {
    host,
    service,
    audit_id: req.auditId,
    requested_by: req.requestedBy,
  });
  return { host, service, status: 'submitted', job_id: jobId };
}
