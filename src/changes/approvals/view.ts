import { z } from 'zod';
import { kindOfApproval, kinds } from '../kinds/index.js';
import { APPROVAL_VIEW_STATES, effectiveStatus, type Approval } from './store.js';

/** An approval as the API shows it: never a secret (a credential id only); one being carried out reads as pending. */
const iso = (ms: number | undefined) => (ms === undefined ? null : new Date(ms).toISOString());

const person = { by: z.string(), owner: z.string().nullable(), credential: z.string().nullable(), reason: z.string(), at: z.string() };

export const approvalViewSchema = z.object({
  id: z.string().describe('also the id of the job it lets through (GET /ops/jobs/{id})'),
  status: z.enum(APPROVAL_VIEW_STATES),
  // The registry's kinds (src/changes/kinds/): this schema documents the answer, nothing parses it.
  change: z.enum(kinds().map((k) => k.name) as [string, ...string[]]),
  host: z.string().nullable(),
  service: z.string().nullable(),
  project: z.string().nullable(),
  ref: z.string().nullable(),
  namespace: z.string(),
  requested_by: z.string(),
  requested_owner: z.string().describe("the person or service behind the requester's credential; nobody of that owner can approve"),
  requested_credential: z.string().nullable().describe('the credential id (12 hex of its SHA-256), never the secret'),
  reason: z.string().nullable(),
  required: z.number().int().describe("approvals needed: the policy's, one more when nobody is named for the requester's credential"),
  approvals: z.array(z.object(person)),
  rejected: z.object(person).nullable(),
  override: z
    .object({ by: z.string(), owner: z.string().nullable(), reason: z.string(), covers: z.array(z.string()) })
    .nullable()
    .describe('the gate reasons the requester overrode (freeze:<id>, window); a freeze declared later is not covered'),
  created_at: z.string(),
  expires_at: z.string(),
  decided_at: z.string().nullable(),
  job_id: z.string().describe('the job that carries the change once approved (a restart that joined another: that one)'),
  last_error: z
    .string()
    .nullable()
    .describe('approved but not yet carried out: why the last try failed (the next approval call or the expiry finishes it)'),
  superseded_by: z
    .string()
    .nullable()
    .describe('superseded: the newer deploy of its concurrency group that started before the last approval; this one never runs'),
});
type ApprovalView = z.infer<typeof approvalViewSchema>;

const personView = (x: { by: string; owner?: string; credential?: string; reason: string; at: number }) => ({
  by: x.by,
  owner: x.owner || null,
  credential: x.credential || null,
  reason: x.reason,
  at: iso(x.at)!,
});

export function approvalView(a: Approval, now: number): ApprovalView {
  const c = a.change;
  const { override: o, ...target } = kindOfApproval(c).approvalView(c);
  return {
    id: a.id,
    status: effectiveStatus(a, now),
    change: c.kind,
    ...target,
    namespace: c.namespace,
    requested_by: a.requester,
    requested_owner: a.requester_owner || a.requester,
    requested_credential: a.requester_credential || null,
    reason: a.reason === '' ? null : a.reason,
    required: a.required,
    approvals: a.approvers.map(personView),
    rejected: a.rejected ? personView(a.rejected) : null,
    override: o ? { by: o.by, owner: o.owner || null, reason: o.reason, covers: o.covers ?? [] } : null,
    created_at: iso(a.created_at)!,
    expires_at: iso(a.expires_at)!,
    decided_at: iso(a.decided_at),
    job_id: a.job_id ?? a.id,
    last_error: a.status === 'approving' ? (a.last_error ?? null) : null,
    superseded_by: a.superseded_by ?? null,
  };
}

/** 202 of a change that waits for approval. */
export const pendingApprovalSchema = z.object({
  status: z.literal('pending_approval'),
  approval_id: z.string().describe('approve with POST /ops/approvals/{id}/approve (another operator); the job id it lets through'),
  expires_at: z.string(),
  required: z.number().int().describe('approvals needed from operators other than the requester'),
  coalesced: z.boolean().describe('true when a pending approval of the same change already existed and this request joined it'),
});
export type PendingApproval = z.infer<typeof pendingApprovalSchema>;

export const decisionBodySchema = z.object({
  reason: z.string().trim().min(1).max(500).describe('why; written to the audit line, the approval and the job'),
  override: z
    .boolean()
    .optional()
    .describe('approve a restart although a freeze or its change windows refuse it now (the reason is the override reason; reported)'),
});

export const decisionAnswerSchema = z.object({
  status: z.enum(APPROVAL_VIEW_STATES),
  approval: approvalViewSchema,
  job_id: z.string().nullable().describe('approved: the job that carries the change (a restart that joined one in progress: that one)'),
  coalesced: z.boolean().describe('approved: the restart joined one of the same Deployment that was still waiting or rolling out'),
  held_until: z.string().nullable().describe('approved deploy held by a freeze or outside its windows: when it is expected to run'),
  approvals_needed: z.number().int().describe('approvals still needed (0 once decided)'),
});
export type DecisionAnswer = z.infer<typeof decisionAnswerSchema>;
