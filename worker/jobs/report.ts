import { poolsOf } from '../../src/changes/budget/pools.js';
import { DelayedError } from 'bullmq';
import { effectiveStatus, type Approval } from '../../src/changes/approvals/store.js';
import { kindOf } from '../../src/changes/kinds/index.js';
import type { ReportChangeData } from '../../src/shared/jobs.js';
import type { JobContext } from '../context.js';
import { recordEventResolving, type EventReason } from '../events.js';
import { deliver, escapeSlack } from './notify.js';

/**
 * report_change: news of a guarded change for the on-call channel, posted as notify_oncall posts
 * (worker/jobs/notify.ts): Slack-compatible `text` plus the fields a receiver can act on.
 * approval_expiry runs at an approval's expiry (a delayed job): it expires the approval unless
 * someone decided it (the decision script: a decision and the expiry cannot both win), and reports
 * it. A rejected or expired restart gets its Kubernetes Event here (the API writes none).
 */
const ICON: Record<ReportChangeData['event'], string> = {
  approval_requested: ':lock:',
  approval_rejected: ':no_entry:',
  approval_expiry: ':hourglass:',
  override: ':warning:',
  held: ':double_vertical_bar:',
  outcome: ':checkered_flag:',
  remediation: ':robot_face:',
};

/** The change in words, its kind's (src/changes/kinds/). */
const what = (d: ReportChangeData): string => kindOf(d.change).reportWhat(d);

function headline(d: ReportChangeData, base: string): string {
  const s = `${what(d)} requested by ${d.requested_by}`;
  switch (d.event) {
    case 'approval_requested':
      return `Approval needed: ${s}${d.reason ? ` (${d.reason})` : ''}. Another operator approves it with POST ${base}/ops/approvals/${d.approval_id}/approve (X-API-Key, body {"reason": "..."}), or rejects it with /reject`;
    case 'approval_rejected':
      return `Rejected: ${s}. ${d.outcome?.reason ?? ''}`.trim();
    case 'approval_expiry':
      return `Expired: ${s}; nobody approved it in time`;
    case 'override':
      return `Gate overridden: ${s}: ${d.reason ?? ''}`;
    case 'held':
      return `Held: ${s}, until ${d.outcome?.until ?? '?'}: ${d.outcome?.reason ?? ''}`;
    case 'remediation': {
      const r = d.remediation;
      return `Remediation ${r?.decision ?? ''}${r?.outcome && r.outcome !== r.decision ? ` (${r.outcome})` : ''} by rule ${r?.rule ?? '?'}${r?.mode === 'dry-run' ? ' (dry-run)' : ''} for alert ${r?.alertname ?? '?'}: ${what(d)}: ${d.reason ?? ''}${
        r?.history && r.history.length > 0 ? `. History: ${r.history.map((h) => `${h.id} at ${h.at}`).join(', ')}` : ''
      }`;
    }
    case 'outcome': {
      const o = d.outcome;
      const approved = d.approvers.length > 0 ? `, approved by ${d.approvers.join(', ')}` : '';
      const took = o?.duration_s !== undefined ? ` in ${o.duration_s} s` : '';
      if (o?.result === 'rolled_out') return `Rolled out${took}: ${s}${approved}`;
      if (o?.result === 'created') return `Deploy Job created${took}: ${s}${approved}`;
      if (o?.result === 'superseded') return `Superseded, not run: ${s}${approved}: ${o.reason ?? ''}`;
      if (o?.result === 'cancelled') return `Cancelled${took}: ${s}${approved}: ${o.reason ?? ''}`;
      return `${o?.result === 'progress_deadline_exceeded' ? 'Progress deadline exceeded' : o?.result === 'refused' ? 'Refused' : 'Failed'}${took}: ${s}${approved}: ${o?.reason ?? ''}`;
    }
  }
}

function reportBody(d: ReportChangeData, jobId: string, publicUrl: string | undefined): Record<string, unknown> {
  const text = `${ICON[d.event]} ${escapeSlack(headline(d, publicUrl ?? ''))}`;
  return {
    text,
    event: d.event,
    change: d.change,
    namespace: d.namespace,
    ...(d.host ? { host: d.host, service: d.service } : {}),
    ...(d.project ? { project: d.project, ref: d.ref } : {}),
    job_id: d.job_id ?? null,
    approval_id: d.approval_id ?? null,
    ...(d.event === 'approval_requested' && d.approval_id
      ? {
          approve_url: `${publicUrl ?? ''}/ops/approvals/${d.approval_id}/approve`,
          reject_url: `${publicUrl ?? ''}/ops/approvals/${d.approval_id}/reject`,
        }
      : {}),
    requester: d.requested_by,
    approvers: d.approvers,
    outcome: d.outcome ?? null,
    duration_s: d.outcome?.duration_s ?? null,
    reason: d.reason ?? null,
    ...(d.remediation ? { remediation: d.remediation } : {}),
    audit_id: d.audit_id,
    report_id: jobId,
  };
}

/** A rejected or expired restart's Event on its Deployment (the Event is a record: failing to write it is logged). */
async function restartEvent(d: ReportChangeData, ctx: JobContext, reason: EventReason, detail: string): Promise<void> {
  const regarding = kindOf(d.change).reportObject?.(d);
  if (!regarding) return;
  await recordEventResolving(
    ctx.kubeConfig,
    {
      namespace: regarding.namespace,
      regarding,
      reason,
      action: 'Decide',
      type: 'Warning',
      queueJobId: d.job_id ?? String(ctx.job.id),
      auditId: d.audit_id,
      requestedBy: d.requested_by,
      detail,
    },
    ctx.logger,
  );
}

export async function reportChange(d: ReportChangeData, ctx: JobContext): Promise<{ delivered: number; endpoints: number; event: string }> {
  let data = d;
  if (d.event === 'approval_expiry') {
    if (!d.approval_id) return { delivered: 0, endpoints: 0, event: 'skipped' };
    const now = ctx.now();
    const decide = (action: 'expire' | 'finish' | 'abandon', reason: string) =>
      ctx.approvals.decide(d.approval_id!, { action, by: 'opsgate', owner: 'opsgate', credential: '', reason, now });
    let out = await decide('expire', 'expired');
    if (out.verdict === 'approving' && out.approval) {
      // Approved, its change not confirmed carried out: the job under the approval's id says whether it was.
      const id = out.approval.id;
      if (await ctx.jobExists(id)) {
        await decide('finish', id);
        return { delivered: 0, endpoints: 0, event: 'decided in time' };
      }
      out = await decide('abandon', `expired before its change could be carried out: ${out.approval.last_error ?? 'no job was added'}`);
      const asked = out.approval;
      if (asked) await ctx.budgets.giveBack(poolsOf(asked.change.namespace, asked.requester), id).catch(() => undefined);
    }
    const a: Approval | undefined = out.approval;
    if (out.verdict === 'pending' && a && ctx.job.moveToDelayed && ctx.token) {
      // Woken before the expiry (clocks differ by a little): wait for it.
      await ctx.job.moveToDelayed(Date.now() + Math.max(1, a.expires_at + 1 - now), ctx.token);
      throw new DelayedError();
    }
    if (!a || effectiveStatus(a, now) !== 'expired') return { delivered: 0, endpoints: 0, event: 'decided in time' };
    ctx.metrics?.changeOutcomes.inc({ change: d.change, result: 'expired' });
    data = { ...d, outcome: { result: 'expired', reason: `nobody approved it before ${new Date(a.expires_at).toISOString()}` } };
    await restartEvent(data, ctx, 'OpsgateRestartExpired', `approval ${d.approval_id} expired`);
  } else if (d.event === 'approval_rejected') {
    ctx.metrics?.changeOutcomes.inc({ change: d.change, result: 'rejected' });
    await restartEvent(d, ctx, 'OpsgateRestartRejected', `approval ${d.approval_id} rejected: ${d.outcome?.reason ?? ''}`);
  }
  const body = reportBody(data, String(ctx.job.id), ctx.config.OPSGATE_PUBLIC_URL);
  ctx.logger.info('change report', { event: d.event, change: d.change, job: d.job_id, text: body.text });
  const sent = await deliver(body, ctx);
  return { ...sent, event: d.event };
}
