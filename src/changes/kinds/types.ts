import type { Inventory } from '../../shared/inventory.js';
import type { z } from 'zod';
import type { DryRunData, DryRunResult, JobName, ReportChangeData } from '../../shared/jobs.js';
import type { ApprovalPolicy } from '../../shared/policy.js';
import type { ScopeTarget } from '../../shared/scope.js';
import type { ApprovalChange } from '../approvals/store.js';
import type { Freeze } from '../freezes/store.js';
import type { Pipeline } from '../deps.js';
import type { KubernetesVerdict } from '../dryRunView.js';
import type { AnyTarget, ApprovedBy, Change, Decision, Facts, Override } from '../types.js';

/**
 * A kind of change (restart, deploy): all that differs between kinds, looked up by name in ./index.ts; nothing
 * outside these modules compares kinds (kinds.test.ts counts them). `T`: its target, `D`: its job's data.
 */
type ChangeOf<T extends AnyTarget> = Change & { target: T };

export interface ChangeKind<T extends AnyTarget = AnyTarget, D = unknown> {
  /** The target's `kind`, the approval record's `change.kind`, the report's `change`. */
  readonly name: T['kind'];
  readonly job: JobName;
  /** A closed gate: `refuse` (it answers something happening now; hours later could do harm) or `hold` (a delayed job). */
  readonly closedGate: 'refuse' | 'hold';
  /** How execute.ts adds its job: `coalesced` (one per coalescing id, budgets taken first) or through the `intake`. */
  readonly carry: 'coalesced' | 'intake';
  /** "restart of Deployment ns/name", "deploy of group/app refs/heads/main". */
  describe(t: T): string;
  /** The report's fields of the target. */
  reportFields(t: T): Pick<ReportChangeData, 'change' | 'host' | 'service' | 'project' | 'ref' | 'namespace'>;
  reportWhat(d: ReportChangeData): string;
  /** The object a report's decision (rejected, expired) is recorded on as a Kubernetes Event, if any. */
  reportObject?(d: ReportChangeData): { apiVersion: string; kind: string; name: string; namespace: string } | undefined;
  scopeTarget(t: T): ScopeTarget;
  /** The facts no store but the freezes answers: the gate, the policy's approval (the stricter of it and `asked`), budgets. */
  policyFacts(inventory: Inventory, freezes: readonly Freeze[], change: ChangeOf<T>, now: number, asked?: ApprovalPolicy): Facts;
  /** What the stores answer besides, read only when the plan can use it (`peek`: a dry run reads everything). */
  readFacts(g: Pipeline, change: ChangeOf<T>, facts: Facts, now: number, peek: boolean): Promise<void>;
  /** The target's group, whose changes run one at a time in acceptance order (src/changes/deployOrder/); absent: no order. */
  turnGroup?(inventory: Inventory, t: T): string | undefined;
  jobData(c: ChangeOf<T>, approved?: ApprovedBy): D;
  /** The target (and what the job carries of the change) from its job's data; the namespace from the inventory. */
  fromJob(inventory: Inventory, data: D): { target: T; reason?: string; override?: Override };
  /** The identity a second request for the same change joins while its approval is pending. */
  approvalIdentity(t: T): string;
  toApproval(c: ChangeOf<T>): ApprovalChange;
  fromApproval(a: ApprovalChange): { target: T; override?: Override };
  /** GET /ops/approvals' fields of the target. */
  approvalView(a: ApprovalChange): Record<'host' | 'service' | 'project' | 'ref', string | null> & { override: Override | undefined };
  /** The records of a dead-lettered job to delete once its retry is queued (a restart's restartedAt). */
  retryClears?(jobId: string): string[];
  /** A job outside the catalog (src/shared/jobs.ts): its data schema, registered by registerKind. */
  readonly jobSchema?: z.ZodType;
  /** Its worker handler (the worker's context as the second argument: worker/context.ts). */
  handle?(data: D, ctx: never): Promise<unknown>;
  readonly dryRun: {
    /** The answer's schema (OpenAPI). */
    readonly schema: z.ZodType;
    /** The dry_run job's data (what the worker rehearses), naming the kind as `change`. */
    data(c: ChangeOf<T>): DryRunData | DryRunAsk;
    /** A rehearsal outside worker/jobs/dryRun.ts: the schema of `data`, registered by registerKind, and the worker's rehearsal. */
    readonly rehearsal?: { readonly schema: z.ZodType; rehearse(data: never, ctx: never): Promise<DryRunResult> };
    /** The answer: the plan's verdicts, and the worker's. `override`: the caller asked to override. */
    answer(p: { change: ChangeOf<T>; facts: Facts; decision: Decision }, override: boolean, kubernetes: KubernetesVerdict): unknown;
  };
  /** carry `coalesced`: the coalescing id (one job per id waits or runs at a time). */
  coalesceId?(t: T): string;
  /** carry `intake`: what the intake is given of the target, and what a hold record names. */
  intake?(t: T): { source?: string; eventId?: string; deliveryId?: string; before?: string; project: string; ref: string };
}

/** A dry_run job's data for a kind with a rehearsal of its own: its name as `change`, then what it needs. */
export type DryRunAsk = { change: string } & Record<string, unknown>;

/** Any kind, as the registry hands it out (its methods take any target and job data: bivariant). */
export type AnyKind = ChangeKind<AnyTarget, unknown>;
