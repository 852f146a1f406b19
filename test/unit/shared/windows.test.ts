import { describe, expect, it } from '@jest/globals';
import { gate } from '../../../src/changes/gate.js';
import type { Freeze } from '../../../src/changes/freezes/store.js';
import { inventorySchema, hostPolicy, namespaceBudget, parseInventory, projectPolicy } from '../../../src/shared/inventory.js';
import { formatDuration, parseDuration } from '../../../src/shared/policy.js';
import { windowState, zonedInstant, type ChangeWindow } from '../../../src/shared/windows.js';

/**
 * Change windows on the runtime's own time-zone data (Intl), with the clock passed in: weekdays
 * and hours in a zone, across midnight, and the two daylight-saving changes of Europe/Paris in
 * 2026 (29 March 02:00 -> 03:00, 25 October 03:00 -> 02:00).
 */
const at = (iso: string) => Date.parse(iso);
const iso = (ms: number | undefined) => (ms === undefined ? undefined : new Date(ms).toISOString());
const office: ChangeWindow = { days: ['mon', 'tue', 'wed', 'thu', 'fri'], start: '09:00', end: '17:00', timeZone: 'Europe/Paris' };

describe('windowState', () => {
  it('no windows: always open', () => {
    expect(windowState(undefined, at('2026-03-02T03:00:00Z'))).toEqual({ open: true });
    expect(windowState([], at('2026-03-02T03:00:00Z'))).toEqual({ open: true });
  });

  it('Mon-Fri 09:00-17:00 Paris (UTC+1 in winter): open at 09:30 local, closes at 17:00 local', () => {
    const s = windowState([office], at('2026-03-02T08:30:00Z')); // Monday 09:30 CET
    expect(s.open).toBe(true);
    expect(iso(s.closesAt)).toBe('2026-03-02T16:00:00.000Z');
  });

  it('closed at 17:00 sharp (the end is not in the window) and before 09:00; opens the next weekday at 09:00 local', () => {
    expect(windowState([office], at('2026-03-02T16:00:00Z'))).toEqual({ open: false, opensAt: at('2026-03-03T08:00:00Z') });
    expect(windowState([office], at('2026-03-03T07:59:59Z'))).toEqual({ open: false, opensAt: at('2026-03-03T08:00:00Z') });
    expect(windowState([office], at('2026-03-03T08:00:00Z')).open).toBe(true);
  });

  it('Friday evening: the next window is Monday morning', () => {
    expect(windowState([office], at('2026-03-06T18:00:00Z'))).toEqual({ open: false, opensAt: at('2026-03-09T08:00:00Z') });
  });

  it('a window across midnight (Sat 22:00-06:00 UTC) is open on Sunday morning, and its days name the day it opens', () => {
    const night: ChangeWindow = { days: ['sat'], start: '22:00', end: '06:00', timeZone: 'UTC' };
    expect(windowState([night], at('2026-03-08T05:00:00Z'))).toEqual({ open: true, closesAt: at('2026-03-08T06:00:00Z') });
    expect(windowState([night], at('2026-03-08T07:00:00Z'))).toEqual({ open: false, opensAt: at('2026-03-14T22:00:00Z') });
  });

  it('several windows: the earliest next opening; an end of 24:00 is midnight', () => {
    const late: ChangeWindow = { days: ['tue'], start: '20:00', end: '24:00', timeZone: 'America/New_York' };
    const s = windowState([office, late], at('2026-03-03T17:00:00Z')); // Tue 18:00 Paris, 12:00 New York
    expect(s).toEqual({ open: false, opensAt: at('2026-03-04T01:00:00Z') }); // 20:00 EST = 01:00Z
    expect(windowState([late], at('2026-03-04T04:59:00Z'))).toEqual({ open: true, closesAt: at('2026-03-04T05:00:00Z') });
  });

  it('the same wall-clock hours follow daylight saving: 09:00 Paris is 08:00Z in March, 07:00Z in April', () => {
    expect(windowState([office], at('2026-03-27T16:30:00Z')).opensAt).toBe(at('2026-03-30T07:00:00Z'));
  });
});

describe('zonedInstant: daylight-saving changes', () => {
  it('a skipped wall time moves forward by the gap: 02:30 on 29 March 2026 in Paris is 03:30 CEST', () => {
    expect(iso(zonedInstant(2026, 3, 29, 150, 'Europe/Paris'))).toBe('2026-03-29T01:30:00.000Z');
  });
  it('a repeated wall time is its first occurrence: 02:30 on 25 October 2026 in Paris is 02:30 CEST', () => {
    expect(iso(zonedInstant(2026, 10, 25, 150, 'Europe/Paris'))).toBe('2026-10-25T00:30:00.000Z');
  });
  it('ordinary times, and a day or minute count that overflows', () => {
    expect(iso(zonedInstant(2026, 7, 1, 9 * 60, 'Asia/Kolkata'))).toBe('2026-07-01T03:30:00.000Z');
    expect(iso(zonedInstant(2026, 1, 32, 0, 'UTC'))).toBe('2026-02-01T00:00:00.000Z');
    expect(iso(zonedInstant(2026, 1, 1, 1440, 'UTC'))).toBe('2026-01-02T00:00:00.000Z');
  });
});

describe('gate: freezes and windows together', () => {
  const freeze = (over: Partial<Freeze>): Freeze => ({
    id: 'frz-0000000000000001',
    scope: 'namespace',
    namespace: 'shop',
    reason: 'black friday',
    created_by: 'key:ops',
    created_at: at('2026-03-02T00:00:00Z'),
    starts_at: at('2026-03-02T00:00:00Z'),
    ends_at: at('2026-03-03T12:00:00Z'),
    ...over,
  });

  it('a freeze of the namespace holds until it ends, then until the next window opens', () => {
    const v = gate([freeze({})], [office], { namespace: 'shop', project: 'acme/shop' }, at('2026-03-02T10:00:00Z'));
    expect(v.blocked).toBe(true);
    expect(v.reasons.map((r) => r.guard)).toEqual(['freeze']);
    expect(iso(v.until)).toBe('2026-03-03T12:00:00.000Z'); // inside Tuesday's window
    const late = gate([freeze({ ends_at: at('2026-03-03T18:00:00Z') })], [office], { namespace: 'shop' }, at('2026-03-02T10:00:00Z'));
    expect(iso(late.until)).toBe('2026-03-04T08:00:00.000Z'); // the freeze ends after 17:00: Wednesday 09:00 Paris
  });

  it('scopes: another namespace or project is not covered; all covers everything; a freeze that has not started yet holds nothing', () => {
    const now = at('2026-03-02T10:00:00Z');
    expect(gate([freeze({})], undefined, { namespace: 'data' }, now).blocked).toBe(false);
    expect(
      gate(
        [freeze({ scope: 'project', project: 'acme/shop', namespace: undefined })],
        undefined,
        { namespace: 'x', project: 'acme/shop' },
        now,
      ).blocked,
    ).toBe(true);
    expect(
      gate([freeze({ scope: 'project', project: 'acme/shop', namespace: undefined })], undefined, { namespace: 'shop' }, now).blocked,
    ).toBe(false);
    expect(gate([freeze({ scope: 'all', namespace: undefined })], undefined, { namespace: 'anything' }, now).blocked).toBe(true);
    expect(gate([freeze({ starts_at: now + 1000 })], undefined, { namespace: 'shop' }, now).blocked).toBe(false);
  });

  it('outside the windows only: the reason names the windows and the next opening', () => {
    const v = gate([], [office], { namespace: 'shop' }, at('2026-03-07T12:00:00Z'));
    expect(v).toMatchObject({ blocked: true, until: at('2026-03-09T08:00:00Z') });
    expect(v.reasons).toEqual([
      { guard: 'window', opens_at: '2026-03-09T08:00:00.000Z', windows: ['mon,tue,wed,thu,fri 09:00-17:00 Europe/Paris'] },
    ]);
  });
});

describe('policies in the inventory', () => {
  const yaml = `
policy:
  approval: {required: 1, ttl: 30m}
hosts:
  web-1:
    namespace: shop
    deployments: [frontend]
    policy:
      budget: {restarts: 3, per: 10m}
  web-2:
    namespace: shop
    deployments: [api]
    policy:
      approval: {required: 2, ttl: 2h}
      budget: {restarts: 3, per: 600}
  db-1:
    namespace: data
    deployments: [pg]
projects:
  acme/shop:
    namespace: deploys
    serviceAccountName: deployer
    image: alpine:3.20
    policy:
      windows: [{days: [mon, tue], start: "09:00", end: "17:00", timeZone: Europe/Paris}]
`;
  it('the default is replaced field by field; a budget counts per namespace', () => {
    const inv = parseInventory(yaml);
    expect(hostPolicy(inv, 'web-1')).toEqual({ approval: { required: 1, ttl: 1800 }, budget: { restarts: 3, per: 600 } });
    expect(hostPolicy(inv, 'web-2').approval).toEqual({ required: 2, ttl: 7200 });
    expect(hostPolicy(inv, 'db-1')).toEqual({ approval: { required: 1, ttl: 1800 } });
    expect(projectPolicy(inv, 'acme/shop')).toMatchObject({ approval: { required: 1 }, windows: [{ start: '09:00' }] });
    expect(namespaceBudget(inv, 'shop')).toEqual({ restarts: 3, per: 600 });
    expect(namespaceBudget(inv, 'data')).toBeUndefined();
    expect(inv.projects['acme/shop']!.waitForCompletion).toBe(true);
  });

  it.each([
    [
      'hosts sharing a namespace with different budgets',
      yaml.replace('per: 600', 'per: 5m'),
      /hosts\.web-2\.policy\.budget: differs from the budget of host "web-1"/,
    ],
    ['an unknown time zone', yaml.replace('Europe/Paris', 'Mars/Olympus'), /is not an IANA time zone/],
    ['a bad hour', yaml.replace('"17:00"', '"25:00"'), /must be HH:MM/],
    ['an unknown weekday', yaml.replace('[mon, tue]', '[mon, someday]'), /windows\.0\.days\.1/],
    ['a ttl that is no duration', yaml.replace('ttl: 30m', 'ttl: soon'), /ttl must be a duration/],
    ['a budget on a project', yaml.replace('      windows:', '      budget: {restarts: 1, per: 1m}\n      windows:'), /Unrecognized key/],
    ['an unknown policy field', yaml.replace('approval: {required: 1, ttl: 30m}', 'aproval: {required: 1}'), /Unrecognized key/],
  ])('refused at start: %s', (_what, text, message) => {
    expect(() => parseInventory(text)).toThrow(message);
  });

  it('durations', () => {
    expect([
      parseDuration('90s'),
      parseDuration('10m'),
      parseDuration('1h30m'),
      parseDuration('2d'),
      parseDuration('45'),
      parseDuration(60),
    ]).toEqual([90, 600, 5400, 172800, 45, 60]);
    expect([parseDuration(''), parseDuration('0'), parseDuration('1x'), parseDuration(-1)]).toEqual([
      undefined,
      undefined,
      undefined,
      undefined,
    ]);
    expect([formatDuration(600), formatDuration(5400), formatDuration(59), formatDuration(0)]).toEqual(['10m', '1h30m', '59s', '0s']);
    expect(inventorySchema.safeParse({ policy: { budget: { restarts: 0, per: '1m' } } }).success).toBe(false);
  });
});
