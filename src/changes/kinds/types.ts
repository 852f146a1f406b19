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
 * A kind of change (a restart, a deploy): everything the pipeline knows about one kind lives in its
 * module under src/changes/kinds/, and the planner, executor, approvals, wake, retry, dry run and
 * reports look the kind up in the registry (./index.ts) by its name. Nothing outside these modules
 * compares a change's or a target's kind (test/unit/changes/kinds.test.ts counts them).
 *
 * `T` is the kind's target, `D` its job's data.
 */
export interface ChangeKind<T extends AnyTarget = AnyTarget, D = unknown> {
  /** The target's `kind`, the approval record's `change.kind`, the report's `change`. */
  readonly name: T['kind'];
  /** The job that carries it (one per kind). */
  readonly job: JobName;
  /**
   * What a closed gate does to it: `refuse` (it answers something happening now: running it hours
   * later could do harm) or `hold` (a delayed job, due when the gate is expected to open).
   */
  readonly closedGate: 'refuse' | 'hold';
  /**
   * How the executor adds its job (src/changes/execute.ts, the only adder): `coalesced` (one job per
   * coalescing id at a time, a place of each of its budgets taken first) or `intake` (the event's
   * dedup record and the delivery alias, held as a delayed job when the gate is closed).
   */
  readonly carry: 'coalesced' | 'intake';

  // ---- the target: how it is named, validated and shown ----
  /** "restart of Deployment ns/name", "deploy of group/app refs/heads/main". */
  describe(t: T): string;
  /** The report's fields of the target (a report_change job, an approval's news). */
  reportFields(t: T): Pick<ReportChangeData, 'change' | 'host' | 'service' | 'project' | 'ref' | 'namespace'>;
  /** A report's words for the change, from its fields (worker/jobs/report.ts). */
  reportWhat(d: ReportChangeData): string;
  /** The object a report's decision (rejected, expired) is recorded on as a Kubernetes Event, if any. */
  reportObject?(d: ReportChangeData): { apiVersion: string; kind: string; name: string; namespace: string } | undefined;
  /** What a credential's scope reads of the target. */
  scopeTarget(t: T): ScopeTarget;

  // ---- policy and facts ----
  /** The facts no store but the freezes answers: the gate, the policy's approval (the stricter of it and `asked`), budgets. */
  policyFacts(inventory: Inventory, freezes: readonly Freeze[], change: Change & { target: T }, now: number, asked?: ApprovalPolicy): Facts;
  /** What the stores answer besides, read only when the plan can use it (`peek`: a dry run reads everything). */
  readFacts(g: Pipeline, change: Change & { target: T }, facts: Facts, now: number, peek: boolean): Promise<void>;

  /**
   * Its changes run one at a time per group, in the order opsgate accepted them, and an older one
   * never after a newer one (src/changes/deployOrder/): the target's group. Absent: no order.
   */
  turnGroup?(inventory: Inventory, t: T): string | undefined;

  // ---- job data, and a change rebuilt from a job, an approval record or a held job ----
  jobData(c: Change & { target: T }, approved?: ApprovedBy): D;
  /** The target (and what the job carries of the change) from its job's data; the namespace from the inventory. */
  fromJob(inventory: Inventory, data: D): { target: T; reason?: string; override?: Override };
  /** The identity a second request for the same change joins while its approval is pending. */
  approvalIdentity(t: T): string;
  /** What an approval record keeps of the change. */
  toApproval(c: Change & { target: T }): ApprovalChange;
  fromApproval(a: ApprovalChange): { target: T; override?: Override };
  /** GET /ops/approvals' fields of the target. */
  approvalView(a: ApprovalChange): {
    host: string | null;
    service: string | null;
    project: string | null;
    ref: string | null;
    override: Override | undefined;
  };

  /** The records of a dead-lettered job to delete once its retry is queued (a restart's restartedAt). */
  retryClears?(jobId: string): string[];

  // ---- a kind whose job is not one of the catalog's (src/shared/jobs.ts) ----
  /** Its job's data schema, registered with the catalog by registerKind. */
  readonly jobSchema?: z.ZodType;
  /** Its worker handler (the worker's context as the second argument: worker/context.ts). */
  handle?(data: D, ctx: never): Promise<unknown>;

  // ---- its dry run ----
  readonly dryRun: {
    /** The answer's schema (OpenAPI). */
    readonly schema: z.ZodType;
    /** What the worker rehearses (a dry_run job's data: its server-side dry run of the change), naming the kind as `change`. */
    data(c: Change & { target: T }): DryRunData | DryRunAsk;
    /**
     * A kind whose rehearsal is not one of the catalog's (worker/jobs/dryRun.ts): the schema of what
     * `data` returns, registered with the dry_run job's schema by registerKind, and the worker's
     * rehearsal of it (the worker's context as the second argument).
     */
    readonly rehearsal?: { readonly schema: z.ZodType; rehearse(data: never, ctx: never): Promise<DryRunResult> };
    /** The answer: the plan's verdicts, and the worker's. `override`: the caller asked to override. */
    answer(
      p: { change: Change & { target: T }; facts: Facts; decision: Decision },
      override: boolean,
      kubernetes: KubernetesVerdict,
    ): unknown;
  };

  // ---- how the executor adds it ----
  /** carry `coalesced`: the coalescing id (one job per id waits or runs at a time). */
  coalesceId?(t: T): string;
  /** carry `intake`: what the intake is given of the target, and what a hold record names. */
  intake?(t: T): { source?: string; eventId?: string; deliveryId?: string; before?: string; project: string; ref: string };
}

/** A dry_run job's data for a kind with a rehearsal of its own: its name as `change`, then what it needs. */
export type DryRunAsk = { change: string } & Record<string, unknown>;

/** Any kind, as the registry hands it out (its methods take any target and job data: bivariant). */
export type AnyKind = ChangeKind<AnyTarget, unknown>;
