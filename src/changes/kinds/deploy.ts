import { z } from 'zod';
import { findProject, projectPolicy } from '../../shared/inventory.js';
import { formatDuration } from '../../shared/policy.js';
import { isPushSender } from '../../sources/index.js';
import { JOB, type RunDeployPipelineData } from '../../shared/jobs.js';
import type { ApprovalChange } from '../approvals/store.js';
import { approvalVerdict, approvalVerdictSchema, gateView, gateViewSchema, kubernetesVerdictSchema } from '../dryRunView.js';
import { concurrencyGroup } from '../deployOrder/store.js';
import { describeReasons, gate } from '../gate.js';
import type { Decision, DeployTarget } from '../types.js';
import { approvalFieldsOf, overrideField, requesterFieldsOf } from './common.js';
import type { ChangeKind } from './types.js';

/**
 * A deploy of a project's ref: one job per push event within its dedup window, through the intake; a closed gate
 * holds it unless a person's override of a rollback covers it.
 */
type DeployApproval = Extract<ApprovalChange, { kind: 'deploy' }>;

export const deployDryRunSchema = z.object({
  dry_run: z.literal(true),
  change: z.literal('deploy'),
  project: z.string(),
  ref: z.string(),
  namespace: z.string(),
  event_id: z.string(),
  would: z
    .enum(['queue', 'duplicate', 'pending_approval', 'hold', 'superseded'])
    .describe('what the same replay without dry_run would do now'),
  detail: z.string(),
  verdicts: z.object({
    gate: gateViewSchema,
    approval: approvalVerdictSchema,
    duplicate: z.object({ job_id: z.string().nullable().describe('the job that already stands for this event') }),
  }),
  kubernetes: kubernetesVerdictSchema,
});
export type DeployDryRun = z.infer<typeof deployDryRunSchema>;

function dryRunWould(decision: Decision): Pick<DeployDryRun, 'would' | 'detail'> {
  switch (decision.kind) {
    case 'join':
      return { would: 'duplicate', detail: `a duplicate of job ${decision.jobId}: nothing new would be queued` };
    case 'pending_approval':
      return { would: 'pending_approval', detail: `waits for ${decision.required} approval(s) within ${formatDuration(decision.ttl)}` };
    case 'superseded':
      return { would: 'superseded', detail: `superseded: deploy ${decision.by} of its group, accepted after it, has started` };
    case 'hold':
      return {
        would: 'hold',
        detail: `held until ${new Date(decision.until).toISOString()}: ${describeReasons(decision.reasons)}`,
      };
    default:
      return { would: 'queue', detail: 'queued' };
  }
}

export const deployKind: ChangeKind<DeployTarget, RunDeployPipelineData> = {
  name: 'deploy',
  job: JOB.runDeployPipeline,
  closedGate: 'hold',
  carry: 'intake',
  describe: (t) => `deploy of ${t.project} ${t.ref}`,
  reportFields: (t) => ({ change: 'deploy', project: t.project, ref: t.ref, namespace: t.namespace }),
  reportWhat: (d) => `deploy of ${d.project ?? '?'} ${d.ref ?? ''}`.trim(),
  scopeTarget: (t) => ({ kind: 'project', project: t.project, namespace: t.namespace }),
  policyFacts(inventory, freezes, change, now) {
    const t = change.target;
    const policy = projectPolicy(inventory, t.project);
    return {
      gate: gate(freezes, policy.windows, { namespace: t.namespace, project: t.project }, now),
      ...(policy.approval ? { approval: policy.approval } : {}),
    };
  },
  async readFacts(g, change, facts, _now, peek) {
    const t = change.target;
    // An event already let through (approved before, or queued before the policy) is a duplicate of
    // that job, not a second approval; without a policy the add's deduplication answers it.
    if (t.eventId && change.origin !== 'wake' && change.origin !== 'retry' && (facts.approval || peek)) {
      facts.duplicateOf = await g.producer.deduplicationHolder(t.eventId);
    }
    // A resubmission of an earlier deploy never runs once a newer one of its group has started. A
    // new request is the newest when accepted: nothing to read (a push costs no round trip more).
    if (change.accepted) {
      const by = await g.deployTurns.supersededBy(concurrencyGroup(g.inventory, t.project, t.ref), change.accepted);
      if (by !== undefined) facts.supersededBy = by;
    }
  },
  // A project the inventory lacks has nothing to order: its handler fails it at once.
  turnGroup: (inventory, t) => (findProject(inventory, t.project) ? concurrencyGroup(inventory, t.project, t.ref) : undefined),
  jobData(c, approved) {
    const t = c.target;
    return {
      project: t.project,
      ref: t.ref,
      ...(t.sha ? { sha: t.sha } : {}),
      ...(t.eventId ? { event_id: t.eventId } : {}),
      ...(t.deliveryId ? { delivery_id: t.deliveryId } : {}),
      ...(t.source && isPushSender(t.source) ? { source: t.source } : {}),
      ...(c.accepted ? { accepted_at: c.accepted.at, accepted_id: c.accepted.id } : {}),
      ...(t.rollback ? { rollback: true as const, ...(t.rollback.from ? { rolled_back_from: t.rollback.from } : {}) } : {}),
      ...(c.override ? { override: c.override } : {}),
      ...approvalFieldsOf(c, approved),
      ...requesterFieldsOf(c),
    };
  },
  fromJob: (inventory, d) => ({
    ...overrideField(d.override),
    target: {
      kind: 'deploy',
      project: d.project,
      ref: d.ref,
      namespace: findProject(inventory, d.project)?.namespace ?? '',
      ...(d.sha ? { sha: d.sha } : {}),
      ...(d.event_id ? { eventId: d.event_id } : {}),
      ...(d.rollback ? { rollback: { from: d.rolled_back_from ?? null } } : {}),
    },
    ...(d.reason ? { reason: d.reason } : {}),
  }),
  approvalIdentity: (t) => `deploy:${t.eventId ?? `${t.project}:${t.ref}:${t.sha ?? ''}`}`,
  toApproval(c) {
    const t = c.target;
    return {
      kind: 'deploy',
      project: t.project,
      ref: t.ref,
      namespace: t.namespace,
      ...(t.sha ? { sha: t.sha } : {}),
      ...(t.eventId ? { event_id: t.eventId } : {}),
      ...(t.deliveryId ? { delivery_id: t.deliveryId } : {}),
      ...(t.source ? { source: t.source } : {}),
      ...(t.rollback ? { rollback: t.rollback } : {}),
      ...(c.override ? { override: c.override } : {}),
    };
  },
  fromApproval(a) {
    const c = a as DeployApproval;
    return {
      ...overrideField(c.override),
      target: {
        kind: 'deploy',
        project: c.project,
        ref: c.ref,
        namespace: c.namespace,
        ...(c.sha ? { sha: c.sha } : {}),
        ...(c.event_id ? { eventId: c.event_id } : {}),
        ...(c.delivery_id ? { deliveryId: c.delivery_id } : {}),
        ...(c.source ? { source: c.source } : {}),
        ...(c.rollback ? { rollback: c.rollback } : {}),
      },
    };
  },
  approvalView(a) {
    const c = a as DeployApproval;
    return { host: null, service: null, project: c.project, ref: c.ref, override: c.override };
  },
  dryRun: {
    schema: deployDryRunSchema,
    data: (c) => ({
      change: 'deploy',
      project: c.target.project,
      ref: c.target.ref,
      ...(c.target.sha ? { sha: c.target.sha } : {}),
      audit_id: c.auditId,
      requested_by: c.requester.principal,
    }),
    // No dry run asks to override a deploy (only a rollback may be let through, by a person): its gate holds it.
    answer: ({ change, facts, decision }, _override, kubernetes): DeployDryRun => ({
      dry_run: true,
      change: 'deploy',
      project: change.target.project,
      ref: change.target.ref,
      namespace: change.target.namespace,
      event_id: change.target.eventId ?? '',
      ...dryRunWould(decision),
      verdicts: {
        gate: gateView(facts.gate),
        approval: approvalVerdict(facts),
        duplicate: { job_id: facts.duplicateOf ?? null },
      },
      kubernetes,
    }),
  },
  intake: (t) => ({
    ...(t.source !== undefined ? { source: t.source } : {}),
    ...(t.eventId !== undefined ? { eventId: t.eventId } : {}),
    ...(t.deliveryId !== undefined ? { deliveryId: t.deliveryId } : {}),
    ...(t.before !== undefined ? { before: t.before } : {}),
    project: t.project,
    ref: t.ref,
  }),
};
