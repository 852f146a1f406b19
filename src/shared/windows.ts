/**
 * Recurring change windows in an IANA time zone, by the runtime's time-zone database. A window whose end is not after its
 * start spans midnight; "24:00" ends one at midnight. A skipped wall-clock time moves forward by the gap; a repeated one is its first.
 */
export const WEEKDAYS = ['sun', 'mon', 'tue', 'wed', 'thu', 'fri', 'sat'] as const;
type Weekday = (typeof WEEKDAYS)[number];

export interface ChangeWindow {
  days: readonly Weekday[];
  /** "HH:MM", 00:00-23:59. */
  start: string;
  /** "HH:MM", 00:00-24:00. */
  end: string;
  timeZone: string;
}

const NUMERIC = { year: 'numeric', month: 'numeric', day: 'numeric', hour: 'numeric', minute: 'numeric', second: 'numeric' } as const;
const formatters = new Map<string, Intl.DateTimeFormat>();
function formatter(timeZone: string): Intl.DateTimeFormat {
  let f = formatters.get(timeZone);
  if (!f) {
    f = new Intl.DateTimeFormat('en-US', { timeZone, hourCycle: 'h23', weekday: 'short', ...NUMERIC });
    formatters.set(timeZone, f);
  }
  return f;
}

/** Whether the runtime knows the zone (an unknown one makes Intl throw a RangeError). */
export function isTimeZone(tz: string): boolean {
  try {
    formatter(tz);
    return true;
  } catch {
    return false;
  }
}

function minutesOf(hhmm: string): number {
  const [h, m] = hhmm.split(':').map(Number) as [number, number];
  return h * 60 + m;
}

const DAY_MS = 86_400_000;

/** A local date, its weekday (0 = Sunday) and the minutes since its midnight (seconds as a fraction). */
function local(ms: number, timeZone: string) {
  const parts: Record<string, string> = {};
  for (const p of formatter(timeZone).formatToParts(new Date(ms))) parts[p.type] = p.value;
  return {
    year: Number(parts.year),
    month: Number(parts.month),
    day: Number(parts.day),
    weekday: WEEKDAYS.indexOf(parts.weekday!.toLowerCase() as Weekday),
    minutes: Number(parts.hour) * 60 + Number(parts.minute) + Number(parts.second) / 60,
  };
}

/** The zone's offset from UTC at an instant, in ms (local wall clock - UTC). */
function offsetAt(ms: number, timeZone: string): number {
  const l = local(ms, timeZone);
  const wall = Date.UTC(l.year, l.month - 1, l.day, 0, 0, 0) + Math.round(l.minutes * 60) * 1000;
  return wall - Math.floor(ms / 1000) * 1000;
}

/**
 * The instant of a wall-clock time of a local date in a zone (`day` and `minutes` may overflow).
 * The offsets half a day before and after are the only candidates (no zone changes its offset twice
 * within a day); the earliest showing this wall time wins, else (a skipped time) the one from
 * before, as Temporal's "compatible" disambiguation does.
 */
export function zonedInstant(year: number, month: number, day: number, minutes: number, timeZone: string): number {
  const wall = Date.UTC(year, month - 1, day, 0, minutes, 0);
  const before = offsetAt(wall - DAY_MS / 2, timeZone);
  const after = offsetAt(wall + DAY_MS / 2, timeZone);
  const shows = (t: number) => Math.round(local(t, timeZone).minutes) === ((minutes % 1440) + 1440) % 1440;
  const candidates = [...new Set([wall - before, wall - after])].sort((a, b) => a - b);
  return candidates.find(shows) ?? wall - before;
}

/** The [open, close) instants of one window for the local date `offsetDays` from now's local date. */
function occurrence(w: ChangeWindow, base: ReturnType<typeof local>, offsetDays: number): [number, number] | undefined {
  const weekday = (((base.weekday + offsetDays) % 7) + 7) % 7;
  if (!w.days.includes(WEEKDAYS[weekday]!)) return undefined;
  const start = minutesOf(w.start);
  let end = minutesOf(w.end);
  if (end <= start) end += 1440; // spans midnight
  return [start, end].map((m) => zonedInstant(base.year, base.month, base.day + offsetDays, m, w.timeZone)) as [number, number];
}

/** Whether `now` is inside one of the windows (none: always open, no closesAt), and when that changes. */
export function windowState(windows: readonly ChangeWindow[] | undefined, now: number) {
  if (!windows || windows.length === 0) return { open: true };
  let closesAt: number | undefined;
  let opensAt: number | undefined;
  for (const w of windows) {
    const base = local(now, w.timeZone);
    // Yesterday's occurrence may still be open (a window across midnight).
    for (let d = -1; d <= 8; d++) {
      const occ = occurrence(w, base, d);
      if (!occ) continue;
      const [o, c] = occ;
      if (o <= now && now < c) closesAt = closesAt === undefined ? c : Math.max(closesAt, c);
      else if (o > now && (opensAt === undefined || o < opensAt)) opensAt = o;
    }
  }
  if (closesAt !== undefined) return { open: true, closesAt };
  // Every window has at least one day: it opens within 8 days unless the zone's data is broken.
  return { open: false, opensAt: opensAt ?? now + DAY_MS };
}

export function describeWindow(w: ChangeWindow): string {
  return `${w.days.join(',')} ${w.start}-${w.end} ${w.timeZone}`;
}
