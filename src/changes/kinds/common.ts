import type { ApprovalPolicy } from '../../shared/policy.js';
import type { ApprovedBy, Change, Override } from '../types.js';

/** Who asked, as the job carries it (the Event and the report name the owner and the credential id). */
export function requesterFieldsOf(c: Change) {
  return {
    audit_id: c.auditId,
    requested_by: c.requester.principal,
    requested_owner: c.requester.owner,
    ...(c.requester.credential ? { requested_credential: c.requester.credential } : {}),
  };
}

/** The approval that let it through (its id is the job's), and the requester's reason. */
export function approvalFieldsOf(c: Change, approved?: ApprovedBy) {
  return {
    ...(approved ? { approval_id: approved.approvalId, approvers: approved.approvers } : {}),
    ...(c.reason ? { reason: c.reason } : {}),
  };
}

/** Of two approvals asked for, the one needing more approvers (the policy's on a tie). */
export function stricter(policy: ApprovalPolicy | undefined, asked: ApprovalPolicy | undefined): ApprovalPolicy | undefined {
  if (!policy || !asked) return policy ?? asked;
  return asked.required > policy.required ? asked : policy;
}

/** A job's or an approval record's override, as a field. One without the reasons it covers covers nothing: the gate fails closed. */
export const overrideField = (o: { by: string; owner?: string; reason: string; covers?: string[] } | undefined): { override?: Override } =>
  o ? { override: { by: o.by, owner: o.owner ?? o.by, reason: o.reason, covers: o.covers ?? [] } } : {};
