import { z } from 'zod';
import type { OutboundAuth } from '../shared/outboundAuth.js';
import { jsonApi, sameLabels, type Labels } from './api.js';

/**
 * A client of Alertmanager's API v2 (ALERTMANAGER_URL), for what remediation asks of it:
 * - whether an alert fires: silenced, inhibited and unprocessed alerts included (a silence opsgate
 *   keeps must not read as resolved), and only one with exactly that label set (the equality
 *   filters match every superset too);
 * - a silence of exactly that alert (equality matchers on its full label set, a short end),
 *   extended by posting it again with its id (Alertmanager updates an active silence in place when
 *   only its end moves), expired with DELETE.
 */
export interface AlertmanagerClient {
  /** The alert with exactly these labels, if Alertmanager holds it as firing (active, suppressed or unprocessed). */
  firing(labels: Labels): Promise<HeldAlert | undefined>;
  createSilence(s: SilenceRequest): Promise<string>;
  /** Moves an active silence's end; answers its id (Alertmanager may answer a new one when it cannot update in place). */
  extendSilence(id: string, endsAt: Date): Promise<string>;
  expireSilence(id: string): Promise<void>;
  getSilence(id: string): Promise<Silence | undefined>;
}

interface SilenceRequest {
  labels: Labels;
  endsAt: Date;
  createdBy: string;
  comment: string;
}

const heldAlertSchema = z.object({
  labels: z.record(z.string(), z.string()),
  fingerprint: z.string(),
  startsAt: z.string(),
  endsAt: z.string(),
  status: z.object({ state: z.string() }),
});
type HeldAlert = z.infer<typeof heldAlertSchema>;

const matcherSchema = z.object({ name: z.string(), value: z.string(), isRegex: z.boolean(), isEqual: z.boolean().optional() });
const silenceSchema = z.object({
  id: z.string(),
  status: z.object({ state: z.enum(['expired', 'active', 'pending']) }),
  matchers: z.array(matcherSchema),
  startsAt: z.string(),
  endsAt: z.string(),
  createdBy: z.string(),
  comment: z.string(),
});
type Silence = z.infer<typeof silenceSchema>;

/** How far ahead of now a silence starts (see createSilence). */
const START_AHEAD_MS = 200;

export class AlertmanagerError extends Error {
  override name = 'AlertmanagerError';
}

/** A filter matcher as Alertmanager parses one: `name="value"`, the value quoted with Go's escapes. */
export function filterMatcher(name: string, value: string): string {
  return `${name}=${JSON.stringify(value)}`;
}

export function createAlertmanagerClient(url: string, opts: { timeoutMs?: number; auth?: OutboundAuth } = {}): AlertmanagerClient {
  const { call, parse } = jsonApi('Alertmanager', url, opts, AlertmanagerError, true);
  return {
    async firing(labels) {
      const q = new URLSearchParams({ active: 'true', silenced: 'true', inhibited: 'true', unprocessed: 'true' });
      for (const [k, v] of Object.entries(labels)) q.append('filter', filterMatcher(k, v));
      const alerts = parse(z.array(heldAlertSchema), await call('GET', `/api/v2/alerts?${q.toString()}`), 'list of alerts');
      const now = Date.now();
      return alerts.find((a) => {
        const ends = Date.parse(a.endsAt);
        return sameLabels(a.labels, labels) && (Number.isNaN(ends) || ends > now);
      });
    },
    async createSilence(s) {
      const out = await call('POST', '/api/v2/silences', {
        matchers: Object.entries(s.labels).map(([name, value]) => ({ name, value, isRegex: false, isEqual: true })),
        // A start a moment ahead is kept as given. A start in the past becomes Alertmanager's own
        // now, at a precision its answers round to milliseconds, and an update must repeat the start
        // exactly: that silence could then only be replaced (a new id), never extended in place.
        startsAt: new Date(Date.now() + START_AHEAD_MS).toISOString(),
        endsAt: s.endsAt.toISOString(),
        createdBy: s.createdBy,
        comment: s.comment,
      });
      return parse(z.object({ silenceID: z.string() }), out, 'answer to a new silence').silenceID;
    },
    async extendSilence(id, endsAt) {
      const s = await this.getSilence(id);
      if (!s) throw new AlertmanagerError(`Alertmanager holds no silence ${id}`);
      const out = await call('POST', '/api/v2/silences', {
        id: s.id,
        matchers: s.matchers,
        startsAt: s.startsAt,
        endsAt: endsAt.toISOString(),
        createdBy: s.createdBy,
        comment: s.comment,
      });
      return parse(z.object({ silenceID: z.string() }), out, 'answer to a silence update').silenceID;
    },
    async expireSilence(id) {
      try {
        await call('DELETE', `/api/v2/silence/${encodeURIComponent(id)}`);
      } catch (err) {
        // An already expired silence cannot be expired again: that is the state wanted.
        const s = await this.getSilence(id).catch(() => undefined);
        if (s?.status.state === 'expired') return;
        throw err;
      }
    },
    async getSilence(id) {
      const out = await call('GET', `/api/v2/silence/${encodeURIComponent(id)}`);
      return out === undefined ? undefined : parse(silenceSchema, out, 'silence');
    },
  };
}
