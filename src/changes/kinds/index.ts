import { UnprocessableError } from '../../shared/errors.js';
import { registerDryRunSchema, registerJobSchema } from '../../shared/jobs.js';
import type { ApprovalChange } from '../approvals/store.js';
import type { AnyTarget, Change } from '../types.js';
import { deployKind } from './deploy.js';
import { restartKind } from './restart.js';
import type { AnyKind } from './types.js';

export type { AnyKind, ChangeKind, DryRunAsk } from './types.js';

/** The registry of kinds of change, by name and by job (`registerKind` adds one: a test's third kind). */
const byName = new Map<string, AnyKind>();
const byJob = new Map<string, AnyKind>();

export function registerKind(kind: AnyKind): () => void {
  if (byName.has(kind.name)) throw new Error(`a kind of change named ${kind.name} is registered already`);
  const dropSchema = kind.jobSchema ? registerJobSchema(kind.job, kind.jobSchema) : undefined;
  const dropDryRun = kind.dryRun.rehearsal ? registerDryRunSchema(kind.name, kind.dryRun.rehearsal.schema) : undefined;
  byName.set(kind.name, kind);
  byJob.set(kind.job, kind);
  return () => {
    byName.delete(kind.name);
    byJob.delete(kind.job);
    dropSchema?.();
    dropDryRun?.();
  };
}

registerKind(restartKind);
registerKind(deployKind);

/** The kind of that name; an unknown name is a bug (or a record written by a newer version): 422. */
export function kindOf(name: string): AnyKind {
  const k = byName.get(name);
  if (!k) throw new UnprocessableError(`unknown kind of change ${JSON.stringify(name).slice(0, 100)}`, 'invalid_job_data');
  return k;
}

export const kindOfTarget = (t: AnyTarget): AnyKind => kindOf(t.kind);
export const kindOfChange = (c: Pick<Change, 'target'>): AnyKind => kindOf(c.target.kind);

/** The kind whose job this is; undefined for a job that carries no change (a notification, a dry run). */
export const kindOfJob = (name: string): AnyKind | undefined => byJob.get(name);

export const kinds = (): AnyKind[] => [...byName.values()];

export const kindOfApproval = (c: ApprovalChange): AnyKind => kindOf(c.kind);

/** Whether an approval record stands for the same target as a change (an Idempotency-Key reused for another target). */
export function sameTarget(a: ApprovalChange, t: AnyTarget): boolean {
  const k = kindOfApproval(a);
  return JSON.stringify(k.reportFields(k.fromApproval(a).target)) === JSON.stringify(kindOfTarget(t).reportFields(t));
}
