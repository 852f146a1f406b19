import type { ApprovalPolicy } from '../shared/policy.js';
import type { Scope } from '../shared/scope.js';
import type { BudgetPool } from './budget/pools.js';
import type { Acceptance } from './deployOrder/store.js';
import type { GateReason, GateVerdict } from './gate.js';

/** The change pipeline's vocabulary: a change, the facts about it, the planner's decision. Plain values. */

export const ORIGINS = ['api', 'webhook', 'replay', 'approval', 'retry', 'wake', 'remediation', 'ci', 'rollback'] as const;
export type Origin = (typeof ORIGINS)[number];

/**
 * Who asks: the principal (`key:<id>`, `bearer:<id>`, `webhook:<sender>`, `oidc:<issuer>:<sub>`),
 * the secret presented (12 hex of its SHA-256; '' for none) and the owner behind it. Four eyes
 * compares owners (and an OIDC token's `person`).
 */
export interface Principal {
  principal: string;
  credential: string;
  owner: string;
  /** false: no known person stands behind the credential (the shared bearer token): one approver more. */
  ownerKnown: boolean;
  person?: string;
  /** Absent: it may not override a closed gate (a gate fails closed). */
  mayOverride?: boolean;
  /** What the credential may act on (a keys-file entry's, an OIDC rule's); absent: everything its role allows. */
  scope?: Scope;
}

/** A change let through a closed gate: who, why, and the reasons it covers (freeze ids, `window`); a later freeze is not covered. */
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
  /** The push event's dedup identity. */
  eventId?: string;
  /** The sender (a key of the source registry) and its delivery id. */
  source?: string;
  deliveryId?: string;
  /** A signed sender's commit before the push (the commit-pair rule, src/domain/intake.ts). */
  before?: string;
  /** A rollback (the Job gets OPSGATE_ROLLBACK=true) from this deploy (null: none had succeeded). */
  rollback?: { from: string | null };
}

/** What every kind's target has (src/changes/kinds/): the namespace is what a namespace's freeze covers. */
interface TargetBase {
  kind: string;
  namespace: string;
}

/** The targets of the kinds src/changes/kinds/ registers; a change may carry another kind's (a test's). */
export type Target = RestartTarget | DeployTarget;

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
  override?: Override;
  origin: Origin;
  auditId: string;
  /** The job id it already has: an approval's, a job waking, a retry's `<id>.retry`, an Idempotency-Key's. */
  jobId?: string;
  /** The id its approval gets (derived from an Idempotency-Key, so a retry finds it). */
  approvalId?: string;
  /** An approval the way in asks for besides the policy's (a remediation rule's): the stricter wins. */
  approval?: ApprovalPolicy;
  /** A resubmission's first acceptance (a retry, a replay, the last approval): its place in its group's order. */
  accepted?: Acceptance;
}

export interface Facts {
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
  /** A resubmission whose group started a deploy accepted after it: that deploy's job. */
  supersededBy?: string;
}

export type Decision =
  | { kind: 'refuse'; reasons: GateReason[] }
  | { kind: 'pending_approval'; required: number; ttl: number }
  | { kind: 'join'; jobId: string }
  | { kind: 'over_budget'; retryMs: number; pool: BudgetPool }
  | { kind: 'hold'; until: number; reasons: GateReason[] }
  | { kind: 'superseded'; by: string }
  | {
      kind: 'queue';
      /** Take a place of each of its restart budgets for this job. */
      takeBudget: boolean;
      /** The gate reasons an override let through (reported). */
      overridden: GateReason[];
    };
