import { z } from 'zod';
import { isTimeZone, WEEKDAYS } from './windows.js';

/**
 * The guards of a change: the inventory's `policy`, replaced field by field by a host's or project's own. A namespace's
 * `budget` is shared by its hosts; `remediation_budget` (default: `budget`) is the rules' own, never taking a place of people's.
 */

/** "90s", "10m", "1h", "1h30m", "2d" or a number of seconds -> seconds. */
export function parseDuration(v: string | number): number | undefined {
  if (typeof v === 'number') return Number.isInteger(v) && v > 0 ? v : undefined;
  const m = /^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$/.exec(v.trim());
  if (!m || v.trim() === '') return /^\d+$/.test(v.trim()) && Number(v) > 0 ? Number(v) : undefined;
  const s = Number(m[1] ?? 0) * 86400 + Number(m[2] ?? 0) * 3600 + Number(m[3] ?? 0) * 60 + Number(m[4] ?? 0);
  return s > 0 ? s : undefined;
}

/** A duration in seconds, as parseDuration reads it; with `zero`, "0s" (or 0) too. */
export const durationSchema = (max: number, what: string, zero = false) =>
  z.union([z.string(), z.number()]).transform((v, ctx) => {
    if (zero && (v === 0 || (typeof v === 'string' && /^\s*0+[smhd]?\s*$/.test(v)))) return 0;
    const s = parseDuration(v);
    if (s === undefined || s > max) {
      ctx.addIssue({ code: 'custom', message: `${what} must be a duration such as 90s, 10m or 1h, at most ${max} s` });
      return z.NEVER;
    }
    return s;
  });

/** "1h", "10m", "90s": the shortest plain form of a number of seconds, for answers and messages. */
export function formatDuration(seconds: number): string {
  const parts: string[] = [];
  let s = Math.round(seconds);
  for (const [unit, size] of Object.entries({ d: 86400, h: 3600, m: 60 })) {
    if (s >= size) {
      parts.push(`${Math.floor(s / size)}${unit}`);
      s %= size;
    }
  }
  if (s > 0 || parts.length === 0) parts.push(`${s}s`);
  return parts.join('');
}

const hhmm = z.string().regex(/^([01]\d|2[0-3]):[0-5]\d$/, 'must be HH:MM (00:00-23:59)');

const windowSchema = z
  .strictObject({
    days: z.array(z.enum(WEEKDAYS)).min(1, 'needs at least one day'),
    start: hhmm,
    end: z.string().regex(/^(([01]\d|2[0-3]):[0-5]\d|24:00)$/, 'must be HH:MM (00:00-24:00)'),
    timeZone: z.string().refine(isTimeZone, 'is not an IANA time zone this runtime knows (e.g. Europe/Paris, UTC)'),
  })
  .refine((w) => w.start !== w.end, 'start and end must differ (a window across midnight ends before it starts)');

/** `required` operators other than the requester approve the change within `ttl` (four-eyes). */
export const approvalPolicySchema = z.strictObject({
  required: z.number().int().min(1).max(5).default(1),
  ttl: durationSchema(7 * 86400, 'ttl').default(3600),
});

export const budgetPolicySchema = z.strictObject({
  restarts: z.number().int().min(1).max(10000),
  /** The sliding window. */
  per: durationSchema(7 * 86400, 'per'),
});

export const projectPolicySchema = z.strictObject({
  approval: approvalPolicySchema.optional(),
  windows: z.array(windowSchema).max(50).optional(),
});

export const hostPolicySchema = projectPolicySchema.extend({
  budget: budgetPolicySchema.optional(),
  remediation_budget: budgetPolicySchema.optional(),
});

export type ApprovalPolicy = z.infer<typeof approvalPolicySchema>;
export type BudgetPolicy = z.infer<typeof budgetPolicySchema>;
export type HostPolicy = z.infer<typeof hostPolicySchema>;
export type ProjectPolicy = z.infer<typeof projectPolicySchema>;

/** The effective policy: the default's fields, each replaced by the entry's own when it gives it. */
export function mergePolicy<P extends ProjectPolicy>(defaults: P | undefined, own: P | undefined): P {
  return { ...(defaults ?? {}), ...(own ?? {}) } as P;
}
