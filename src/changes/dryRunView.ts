import { z } from 'zod';
import { formatDuration } from '../shared/policy.js';
import { dryRunResultSchema } from '../shared/jobs.js';
import { gateReasonSchema, type GateVerdict } from './gate.js';
import type { Facts } from './types.js';

/** The parts every kind's dry-run answer shares. */
export const kubernetesVerdictSchema = z.object({
  checked: z
    .boolean()
    .describe(
      'false: the API server was not asked (no worker answered within DRY_RUN_TIMEOUT_MS, or the worker has no cluster); reason says why',
    ),
  reason: z.string().nullable(),
  ...dryRunResultSchema.partial().shape,
});
export type KubernetesVerdict = z.infer<typeof kubernetesVerdictSchema>;

export const gateViewSchema = z.object({
  open: z.boolean().describe('no freeze covers the change and a change window is open (or there are none)'),
  reasons: z.array(gateReasonSchema),
  until: z.string().nullable().describe('closed: when it is expected to open'),
  override: z.boolean().describe('override=true was given (a restart goes through a closed gate)'),
});

export const approvalVerdictSchema = z
  .object({ required: z.number().int(), ttl: z.string() })
  .nullable()
  .describe('the approval the policy asks for; null: none');

export function gateView(v: GateVerdict, override = false): z.infer<typeof gateViewSchema> {
  return { open: !v.blocked, reasons: v.reasons, until: v.until !== undefined ? new Date(v.until).toISOString() : null, override };
}

export function approvalVerdict(facts: Facts): z.infer<typeof approvalVerdictSchema> {
  return facts.approval ? { required: facts.approval.required, ttl: formatDuration(facts.approval.ttl) } : null;
}
