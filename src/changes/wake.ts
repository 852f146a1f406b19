import type { RestartServiceData, RunDeployPipelineData } from '../shared/jobs.js';
import { findHost, findProject, type Inventory } from '../shared/inventory.js';
import { policyFacts } from './facts.js';
import type { Freeze } from './freezes/store.js';
import { plan } from './plan.js';
import type { Change, Decision, Facts, Principal } from './types.js';

/**
 * A restart or deploy job starting an attempt in the worker (origin `wake`): planned again on the
 * gate as it stands, with the override the job carries, so a freeze declared since it was queued
 * refuses the restart or holds the deploy again. The worker carries out the answer (worker/report.ts):
 * queue runs the job, hold moves it back to the delayed set, refuse fails it for good.
 */
export type ChangeJob = { name: 'restart'; data: RestartServiceData } | { name: 'deploy'; data: RunDeployPipelineData };

function requesterOf(d: RestartServiceData | RunDeployPipelineData): Principal {
  return {
    principal: d.requested_by,
    credential: d.requested_credential ?? '',
    owner: d.requested_owner ?? d.requested_by,
    ownerKnown: true,
  };
}

/** The change a job stands for. */
export function changeOfJob(inventory: Inventory, c: ChangeJob, jobId: string): Change {
  const base = { requester: requesterOf(c.data), dryRun: false, origin: 'wake' as const, auditId: c.data.audit_id, jobId };
  if (c.name === 'restart') {
    const d = c.data;
    // An override without the reasons it covers covers nothing: the gate fails closed.
    const override = d.override
      ? { by: d.override.by, owner: d.override.owner ?? d.override.by, reason: d.override.reason, covers: d.override.covers ?? [] }
      : undefined;
    return {
      ...base,
      target: { kind: 'restart', host: d.host, service: d.service, namespace: findHost(inventory, d.host)?.namespace ?? '' },
      ...(d.reason ? { reason: d.reason } : {}),
      ...(override ? { override } : {}),
    };
  }
  const d = c.data;
  return {
    ...base,
    target: {
      kind: 'deploy',
      project: d.project,
      ref: d.ref,
      namespace: findProject(inventory, d.project)?.namespace ?? '',
      ...(d.sha ? { sha: d.sha } : {}),
      ...(d.event_id ? { eventId: d.event_id } : {}),
    },
    ...(d.reason ? { reason: d.reason } : {}),
  };
}

export function planWake(
  inventory: Inventory,
  freezes: readonly Freeze[],
  c: ChangeJob,
  jobId: string,
  now: number,
): { change: Change; facts: Facts; decision: Decision } {
  const change = changeOfJob(inventory, c, jobId);
  const facts = policyFacts(inventory, freezes, change, now);
  return { change, facts, decision: plan(change, facts, now) };
}
