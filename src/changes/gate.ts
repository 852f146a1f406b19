import { z } from 'zod';
import { covers, describeScope, type Freeze, type FreezeTarget } from './freezes/store.js';
import { describeWindow, windowState, type ChangeWindow } from '../shared/windows.js';

/** The gate of a change at an instant: the freezes that cover it and its change windows (the API's and the worker's). */
export const gateReasonSchema = z.discriminatedUnion('guard', [
  z.object({
    guard: z.literal('freeze'),
    freeze_id: z.string(),
    scope: z.string().describe('everything, namespace <ns>, project <path>'),
    reason: z.string(),
    by: z.string(),
    ends_at: z.string(),
  }),
  z.object({ guard: z.literal('window'), opens_at: z.string().describe('when the next window opens'), windows: z.array(z.string()) }),
]);
export type GateReason = z.infer<typeof gateReasonSchema>;

export interface GateVerdict {
  blocked: boolean;
  reasons: GateReason[];
  /** Blocked: the first instant (ms) at which no freeze covers the change and a window is open. */
  until?: number;
  /** Open: when the current window closes (ms), if there are windows. */
  closesAt?: number;
}

const iso = (ms: number) => new Date(ms).toISOString();

function inForce(freezes: readonly Freeze[], target: FreezeTarget, t: number): Freeze[] {
  return freezes.filter((f) => f.starts_at <= t && t < f.ends_at && covers(f, target));
}

export function gate(
  freezes: readonly Freeze[],
  windows: readonly ChangeWindow[] | undefined,
  target: FreezeTarget,
  now: number,
): GateVerdict {
  const frozen = inForce(freezes, target, now);
  const w = windowState(windows, now);
  const reasons: GateReason[] = frozen.map((f) => ({
    guard: 'freeze',
    freeze_id: f.id,
    scope: describeScope(f),
    reason: f.reason,
    by: f.created_by,
    ends_at: iso(f.ends_at),
  }));
  if (!w.open) reasons.push({ guard: 'window', opens_at: iso(w.opensAt!), windows: (windows ?? []).map(describeWindow) });
  if (reasons.length === 0) return { blocked: false, reasons, ...(w.closesAt !== undefined ? { closesAt: w.closesAt } : {}) };
  // When does it open? Past every freeze in force, then into a window, until both hold at once.
  let t = now;
  for (let i = 0; i < 64; i++) {
    const f = inForce(freezes, target, t);
    if (f.length > 0) {
      t = Math.max(...f.map((x) => x.ends_at));
      continue;
    }
    const ws = windowState(windows, t);
    if (!ws.open) {
      t = ws.opensAt!;
      continue;
    }
    break;
  }
  return { blocked: true, reasons, until: t };
}

/** One sentence per reason, for a 409's detail and a notification. */
export function describeReasons(reasons: readonly GateReason[]): string {
  return reasons
    .map((r) =>
      r.guard === 'freeze'
        ? `freeze ${r.freeze_id} of ${r.scope} until ${r.ends_at} (${r.reason})`
        : `outside its change windows (${r.windows.join('; ')}); the next opens at ${r.opens_at}`,
    )
    .join('; ');
}
