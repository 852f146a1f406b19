import type { Inventory } from '../shared/inventory.js';
import { policyFacts } from './facts.js';
import type { Freeze } from './freezes/store.js';
import { kindOf, kindOfJob } from './kinds/index.js';
import { plan } from './plan.js';
import type { Change } from './types.js';

/**
 * A change's job starting an attempt (origin `wake`) is planned again on the gate as it stands, with
 * the override it carries, so a freeze declared since refuses or holds it again (worker/report.ts).
 */
/** A change's job: its kind's name and its data, parsed by the job's schema. */
export interface ChangeJob {
  name: string;
  data: ChangeJobData;
}

/** What every change's job carries besides its target (src/changes/kinds/common.ts). */
export interface ChangeJobData {
  audit_id: string;
  requested_by: string;
  requested_owner?: string;
  requested_credential?: string;
  approval_id?: string;
  approvers?: string[];
  reason?: string;
  /** A resubmission's acceptance (src/changes/deployOrder/). */
  accepted_at?: number;
  accepted_id?: string;
}

/** The change job of a job, by its name; undefined for a job that carries no change. */
export function changeJobOf(jobName: string, data: unknown): ChangeJob | undefined {
  const kind = kindOfJob(jobName);
  return kind ? { name: kind.name, data: data as ChangeJobData } : undefined;
}

/** The change a job stands for (the one converter of each kind: its module's `fromJob`). */
export function changeOfJob(inventory: Inventory, c: ChangeJob, jobId: string): Change {
  const { target, reason, override } = kindOf(c.name).fromJob(inventory, c.data);
  return {
    target,
    requester: {
      principal: c.data.requested_by,
      credential: c.data.requested_credential ?? '',
      owner: c.data.requested_owner ?? c.data.requested_by,
      ownerKnown: true,
    },
    ...(reason ? { reason } : {}),
    ...(override ? { override } : {}),
    origin: 'wake',
    auditId: c.data.audit_id,
    jobId,
  };
}

export function planWake(inventory: Inventory, freezes: readonly Freeze[], c: ChangeJob, jobId: string, now: number) {
  const change = changeOfJob(inventory, c, jobId);
  const facts = policyFacts(inventory, freezes, change, now);
  return { change, facts, decision: plan(change, facts, now) };
}
