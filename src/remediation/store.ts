import type { Redis } from 'ioredis';
import { z } from 'zod';
import {
  REMEDIATION_DECISIONS_KEY,
  REMEDIATION_SILENCES_KEY,
  remediationActiveKey,
  remediationCooldownKey,
  remediationEpisodesKey,
  remediationEscalatedKey,
  remediationHistoryKey,
  remediationResolvedKey,
} from '../shared/keys.js';
import { defineLua, loadLua } from '../shared/lua.js';
import { storedJson } from '../shared/redis.js';

/**
 * What remediation keeps in Redis, shared by every API replica and worker: the guard of a rule's
 * remediations of a Deployment (cooldown and escalation, one script: remediation-guard.lua), the
 * distinct firings of an alert, the remediation under way, resolved notifications, the silences
 * kept, and the recent decisions (GET /ops/remediations).
 */

/** How many decisions GET /ops/remediations can show. */
const DECISIONS_KEPT = 1000;

export const DECISIONS = [
  'waiting',
  'suppressed',
  'escalated',
  'dry_run',
  'queued',
  'joined',
  'pending_approval',
  'refused',
  'cancelled',
  'outcome',
  'error',
] as const;
/** Why nothing was done: which guard said so. */
const GUARDS = [
  'target',
  'target_not_allowed',
  'for',
  'episodes',
  'not_firing',
  'unconfirmed',
  'prometheus',
  'alertmanager',
  'cooldown',
  'escalated',
  'freeze',
  'window',
  'budget',
  'approval',
] as const;
/** The guards a suppressed remediation is counted by (opsgate_remediations_suppressed_total). */
export const SUPPRESSION_GUARDS = GUARDS.filter((g) => g !== 'for' && g !== 'approval');

/** How a remediation ended (opsgate_remediations_total's outcome). */
export const OUTCOMES = [
  'remediated',
  'rolled_out_still_firing',
  'failed',
  'progress_deadline_exceeded',
  'refused',
  'rejected',
  'expired',
  'cancelled',
  'dry_run',
] as const;

export const decisionSchema = z.object({
  id: z.string().describe('the remediation (one alert firing, one rule)'),
  at: z.string().describe('RFC 3339'),
  rule: z.string(),
  mode: z.enum(['act', 'dry-run']),
  alertname: z.string(),
  fingerprint: z.string(),
  starts_at: z
    .string()
    .nullable()
    .describe('when the alert began firing, as its source tells it (Prometheus, or the authenticated Alertmanager API)'),
  namespace: z.string().nullable(),
  deployment: z.string().nullable(),
  host: z.string().nullable().describe('the inventory host whose Deployment it is; null: none'),
  decision: z.enum(DECISIONS),
  guard: z.enum(GUARDS).nullable().describe('the guard that stopped it, when one did'),
  outcome: z.enum(OUTCOMES).nullable(),
  reason: z.string().describe('why, in a sentence'),
  job_id: z.string().nullable(),
  approval_id: z.string().nullable(),
});
export type RemediationDecision = z.infer<typeof decisionSchema>;

/** The remediation under way for one alert of one rule, until its settle time ends. */
export interface Active {
  id: string;
  rule: string;
  fingerprint: string;
  labels: Record<string, string>;
  starts_at: number;
  host: string;
  namespace: string;
  deployment: string;
  /** The restart job carrying it (a joined one's too); absent while its approval is pending. */
  job_id?: string;
  /** The restart joined someone else's: never cancelled by the remediation. */
  joined?: boolean;
  approval_id?: string;
  /** The silence kept for it, when the rule asks for one. */
  silence_id?: string;
  phase: 'waiting' | 'verifying' | 'settling';
  /** verifying: until when the alert may take to resolve (ms). */
  verify_until?: number;
  /** settling: when the silence lapses and the record goes (ms). */
  settle_until?: number;
  outcome?: (typeof OUTCOMES)[number];
  created_at: number;
  audit_id: string;
}

type GuardVerdict = { verdict: 'claimed' | 'escalate' | 'escalated'; count: number } | { verdict: 'cooldown'; leftMs: number };
type GuardLimits = { cooldownMs: number; windowMs: number; escalateAfter: number };
export type RemediationStore = ReturnType<typeof createRemediationStore>;

const GUARD = 'opsgateRemediationGuard';
const GUARD_LUA = loadLua(new URL('./remediation-guard.lua', import.meta.url));

export function createRemediationStore(redis: Redis) {
  defineLua(redis, GUARD, GUARD_LUA, 3);
  const scripts = redis as unknown as Record<string, (...a: Array<string | number>) => Promise<[string, number]>>;
  const keys = (rule: string, ns: string, dep: string) =>
    [remediationCooldownKey(rule, ns, dep), remediationHistoryKey(rule, ns, dep), remediationEscalatedKey(rule, ns, dep)] as const;
  return {
    async claim(rule: string, ns: string, dep: string, id: string, now: number, l: GuardLimits): Promise<GuardVerdict> {
      const [verdict, n] = await scripts[GUARD]!(...keys(rule, ns, dep), 'claim', id, now, l.cooldownMs, l.windowMs, l.escalateAfter);
      if (verdict === 'cooldown') return { verdict, leftMs: Number(n) };
      return { verdict: verdict as 'claimed' | 'escalate' | 'escalated', count: Number(n) };
    },
    async release(rule: string, ns: string, dep: string, id: string) {
      await scripts[GUARD]!(...keys(rule, ns, dep), 'release', id, 0, 0, 0, 0);
    },
    /** The rule's remediations of a Deployment in the escalation window, oldest first. */
    async history(rule: string, ns: string, dep: string, now: number, windowMs: number) {
      const flat = await redis.zrangebyscore(remediationHistoryKey(rule, ns, dep), now - windowMs, '+inf', 'WITHSCORES');
      const out: Array<{ id: string; at: number }> = [];
      for (let i = 0; i + 1 < flat.length; i += 2) out.push({ id: flat[i]!, at: Number(flat[i + 1]) });
      return out;
    },
    /** Records a firing seen now (by its start); answers the distinct firings within `withinMs` (a longer one is one episode). */
    async episode(rule: string, fingerprint: string, startsAt: number, now: number, withinMs: number) {
      const key = remediationEpisodesKey(rule, fingerprint);
      const replies = await redis
        .multi()
        .zadd(key, now, String(startsAt))
        .zremrangebyscore(key, '-inf', now - withinMs)
        .zcard(key)
        .pexpire(key, withinMs)
        .exec();
      if (!replies) throw new Error('MULTI aborted');
      const [err, count] = replies[2]!;
      if (err) throw err;
      return Number(count);
    },
    async getActive(rule: string, fingerprint: string) {
      return storedJson<Active>(await redis.get(remediationActiveKey(rule, fingerprint)));
    },
    /** Records it (NX: false when another remediation of this alert is under way). */
    async startActive(a: Active, ttlMs: number) {
      return (await redis.set(remediationActiveKey(a.rule, a.fingerprint), JSON.stringify(a), 'PX', Math.max(1, ttlMs), 'NX')) !== null;
    },
    async putActive(a: Active, ttlMs: number) {
      await redis.set(remediationActiveKey(a.rule, a.fingerprint), JSON.stringify(a), 'PX', Math.max(1, ttlMs));
    },
    async endActive(rule: string, fingerprint: string) {
      await redis.del(remediationActiveKey(rule, fingerprint));
    },
    async markResolved(rule: string, fingerprint: string, startsAt: number, ttlMs: number) {
      await redis.set(remediationResolvedKey(rule, fingerprint), String(startsAt), 'PX', Math.max(1, ttlMs));
    },
    /** Whether a resolved notification came for this firing (startsAt) of the alert. */
    async resolved(rule: string, fingerprint: string, startsAt: number) {
      const v = await redis.get(remediationResolvedKey(rule, fingerprint));
      return v !== null && Number(v) >= startsAt;
    },
    async record(d: RemediationDecision) {
      await redis
        .multi()
        .lpush(REMEDIATION_DECISIONS_KEY, JSON.stringify(d))
        .ltrim(REMEDIATION_DECISIONS_KEY, 0, DECISIONS_KEPT - 1)
        .exec();
    },
    async decisions() {
      const raws = await redis.lrange(REMEDIATION_DECISIONS_KEY, 0, DECISIONS_KEPT - 1);
      return raws.flatMap((r) => {
        const p = decisionSchema.safeParse(storedJson(r));
        return p.success ? [p.data] : [];
      });
    },
    async addSilence(id: string) {
      await redis.sadd(REMEDIATION_SILENCES_KEY, id);
    },
    async removeSilence(id: string) {
      await redis.srem(REMEDIATION_SILENCES_KEY, id);
    },
    async silences() {
      return redis.scard(REMEDIATION_SILENCES_KEY);
    },
  };
}
