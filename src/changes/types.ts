import type { ApprovalPolicy } from '../shared/policy.js';
import type { Scope } from '../shared/scope.js';
import type { BudgetPool } from './budget/pools.js';
import type { Acceptance } from './deployOrder/store.js';
import type { GateReason, GateVerdict } from './gate.js';

/**
 * The vocabulary of the change pipeline: what a change is, what the stores answered about it
 * (facts), and what the planner decided. Plain values: no HTTP, no Redis, no clock.
 */

/** Where a change came from. Every way into a restart or deploy is one of these. */
export const ORIGINS = ['api', 'webhook', 'replay', 'approval', 'retry', 'wake', 'remediation', 'ci', 'rollback'] as const;
export type Origin = (typeof ORIGINS)[number];

/**
 * Who asks: the credential's principal (`key:<id>`, `bearer:<id>`, `webhook:<sender>`,
 * `oidc:<issuer>:<sub>`), the id of the secret presented (12 hex of its SHA-256; '' for none), and
 * the owner behind it (a person or a service). Four eyes compares owners, and an OIDC token's
 * `person` besides. `ownerKnown` is false when no known person stands behind the credential (the
 * shared bearer token, an OIDC token whose rule names no person): its change needs one approver
 * more. Only a principal with `mayOverride` lets a change through a closed gate.
 */
export interface Principal {
  principal: string;
  credential: string;
  owner: string;
  ownerKnown: boolean;
  person?: string;
  /** Absent: it may not override (a gate fails closed). */
  mayOverride?: boolean;
  /** What the credential may act on (a keys-file entry's, an OIDC rule's); absent: everything its role allows. */
  scope?: Scope;
}

/**
 * An operator's decision to let a change through a closed gate: who, why, and exactly which
 * reasons it covers (freeze ids, and `window` for the change windows). A freeze declared after it
 * has another id, so it is not covered.
 */
export interface Override {
  by: string;
  owner: string;
  reason: string;
  covers: string[];
}

export interface RestartTarget {
  kind: 'restart';
  host: string;
  service: string;
  namespace: string;
}

export interface DeployTarget {
  kind: 'deploy';
  project: string;
  ref: string;
  sha?: string;
  namespace: string;
  /** The dedup identity of the push event (absent for a deploy asked for without one). */
  eventId?: string;
  /** The sender (a key of the source registry) and its delivery id. */
  source?: string;
  deliveryId?: string;
  /**
   * The branch's commit before the push, from a signed sender without a timestamp: a delivery of a
   * (project, before, after) queued in the last 30 days is ignored (src/domain/intake.ts).
   */
  before?: string;
  /**
   * A rollback (POST /ops/deploys/rollback): the deploy Job is told so (OPSGATE_ROLLBACK=true), and
   * `from` is the deploy it goes back from (the ref's current one when accepted; null: none).
   */
  rollback?: { from: string | null };
}

/**
 * What every kind's target has: its kind's name (src/changes/kinds/) and the namespace its change
 * acts in (freezes of a namespace cover it). A kind's module names the rest.
 */
interface TargetBase {
  kind: string;
  namespace: string;
}

/** The targets of the kinds src/changes/kinds/ registers; a change may carry another kind's (a test's). */
export type Target = RestartTarget | DeployTarget;

/** The target a change carries: one of the registered kinds'. */
export type AnyTarget = Target | TargetBase;

/** Approval fields of a job an approval let through. */
export interface ApprovedBy {
  approvalId: string;
  approvers: string[];
}

export interface Change {
  target: AnyTarget;
  requester: Principal;
  reason?: string;
  /** Asked for: let a restart through a closed gate (needs a reason). Resolved into an Override by the pipeline. */
  override?: Override;
  origin: Origin;
  auditId: string;
  /**
   * The job id the change is carried out under, when it has one already: an approval's id, a
   * held job waking, a retry's `<id>.retry`, an Idempotency-Key's derived id.
   */
  jobId?: string;
  /** The id its approval gets when it waits for one (derived from an Idempotency-Key, so a retry finds it). */
  approvalId?: string;
  /**
   * An approval the way in asks for besides the policy's (a remediation rule's `approval`): the
   * change waits for the stricter of the two.
   */
  approval?: ApprovalPolicy;
  /**
   * A resubmission of a change accepted earlier (a dead letter's retry, a delivery's replay, the
   * last approval): when and under which id that one was accepted. Its order among the deploys of
   * its group is that acceptance, not this request's (src/changes/deployOrder/). Absent: a new
   * request, accepted now.
   */
  accepted?: Acceptance;
}

/** What the stores answered about a change, read before the plan. */
export interface Facts {
  /** Freezes and windows at `now`, for this target. */
  gate: GateVerdict;
  approval?: ApprovalPolicy;
  /** The restart budgets a restart draws on (src/changes/budget/pools.ts): a place of each is taken. */
  budgets?: BudgetPool[];
  /** Read for a dry run: each budget's restarts in its window, and ms until a place frees when none is left. */
  budgetUse?: Array<{ used: number; retryMs: number }>;
  /** A restart of the same Deployment still waiting or rolling out (coalescing). */
  holder?: string | null;
  /** A push event's job within its dedup window (undefined: not read, the add will tell). */
  duplicateOf?: string | null;
  /** A resubmission whose group started a deploy accepted after it: that deploy's job (read only for a resubmission). */
  supersededBy?: string;
}

/** What the planner decided. */
export type Decision =
  | { kind: 'refuse'; reasons: GateReason[] }
  | { kind: 'pending_approval'; required: number; ttl: number }
  | { kind: 'join'; jobId: string }
  | { kind: 'over_budget'; retryMs: number; pool: BudgetPool }
  | { kind: 'hold'; until: number; reasons: GateReason[] }
  /** A resubmission of a deploy after a newer one of its group started: it never runs. */
  | { kind: 'superseded'; by: string }
  | {
      kind: 'queue';
      /** Take a place of each of its restart budgets for this job. */
      takeBudget: boolean;
      /** The gate reasons an override let through (reported). */
      overridden: GateReason[];
    };
