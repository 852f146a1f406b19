import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import {
  AlertmanagerError,
  createAlertmanagerClient,
  filterMatcher,
  type AlertmanagerClient,
} from '../../../src/remediation/alertmanager.js';
import { freePort } from '../../helpers/redis.js';
import { startAlertmanager, type Alertmanager } from '../../helpers/alertmanager.js';
import { waitFor } from '../../helpers/waitFor.js';

/**
 * The Alertmanager API v2 client of remediation against a real Debian prometheus-alertmanager:
 * whether an alert with exactly a label set fires (silenced alerts included, supersets and
 * resolved alerts not), and a silence of exactly that alert created, extended in place and expired.
 */
let am: Alertmanager;
let client: AlertmanagerClient;
beforeAll(async () => {
  am = await startAlertmanager();
  client = createAlertmanagerClient(am.url);
});
afterAll(async () => {
  await am?.stop();
});

const labels = (extra: Record<string, string> = {}) => ({
  alertname: 'KubeDeploymentReplicasMismatch',
  namespace: 'shop',
  deployment: 'frontend',
  severity: 'critical',
  ...extra,
});

describe('firing', () => {
  it('finds the alert with exactly these labels, not one with more labels nor a resolved one', async () => {
    await am.push([{ labels: labels({ case: 'exact' }) }, { labels: labels({ case: 'superset', pod: 'frontend-1' }) }]);
    const held = await client.firing(labels({ case: 'exact' }));
    expect(held).toMatchObject({ labels: labels({ case: 'exact' }), status: { state: 'active' } });
    expect(held!.fingerprint).toMatch(/^[0-9a-f]{16}$/);
    // The filters of the API match every superset; only the exact label set counts.
    expect(await client.firing(labels({ case: 'superset' }))).toBeUndefined();
    // Never pushed: a forged alert.
    expect(await client.firing(labels({ case: 'forged' }))).toBeUndefined();
    await am.resolve(labels({ case: 'exact' }));
    expect(await client.firing(labels({ case: 'exact' }))).toBeUndefined();
  });

  it('a silenced alert still fires (a silence opsgate keeps must not read as resolved)', async () => {
    const l = labels({ case: 'silenced' });
    await am.push([{ labels: l }]);
    const id = await client.createSilence({ labels: l, endsAt: new Date(Date.now() + 60_000), createdBy: 'opsgate', comment: 'test' });
    expect(id).toMatch(/^[0-9a-f-]{36}$/);
    const muted = await waitFor(
      'the alert silenced',
      async () => {
        const a = await client.firing(l);
        return a?.status.state === 'suppressed' ? a : undefined;
      },
      10_000,
      100,
    );
    expect(muted.labels).toEqual(l);
    await client.expireSilence(id);
  });

  it('label values with quotes and backslashes are filtered exactly', async () => {
    const l = labels({ case: 'quoted', summary_key: 'a "quoted" \\ value' });
    await am.push([{ labels: l }]);
    expect(await client.firing(l)).toMatchObject({ labels: l });
    expect(filterMatcher('x', 'a"b')).toBe('x="a\\"b"');
  });
});

describe('silences', () => {
  it('created with equality matchers on the full label set, a short end and its comment; extended in place; expired', async () => {
    const l = labels({ case: 'silence' });
    const end1 = new Date(Date.now() + 30_000);
    const id = await client.createSilence({
      labels: l,
      endsAt: end1,
      createdBy: 'opsgate',
      comment: 'opsgate remediation rem-1 (job restart-1)',
    });
    // It starts a moment ahead (so that it can be extended in place), then is active.
    const s1 = await waitFor(
      'the silence active',
      async () => {
        const s = await client.getSilence(id);
        return s?.status.state === 'active' ? s : undefined;
      },
      5000,
      50,
    );
    expect(s1).toMatchObject({ id, createdBy: 'opsgate', comment: 'opsgate remediation rem-1 (job restart-1)' });
    expect(s1.matchers.map((m) => [m.name, m.value, m.isRegex, m.isEqual ?? true]).sort()).toEqual(
      Object.entries(l)
        .map(([k, v]) => [k, v, false, true])
        .sort(),
    );
    expect(Math.abs(Date.parse(s1.endsAt) - end1.getTime())).toBeLessThan(1000);

    const end2 = new Date(Date.now() + 90_000);
    const same = await client.extendSilence(id, end2);
    expect(same).toBe(id);
    const s2 = await client.getSilence(id);
    expect(s2!.status.state).toBe('active');
    expect(Math.abs(Date.parse(s2!.endsAt) - end2.getTime())).toBeLessThan(1000);

    await client.expireSilence(id);
    expect((await client.getSilence(id))!.status.state).toBe('expired');
    // Expiring it again is the state wanted, not an error.
    await client.expireSilence(id);
    expect(await client.getSilence('00000000-0000-0000-0000-000000000000')).toBeUndefined();
  });
});

describe('failures', () => {
  it('an unreachable Alertmanager is an AlertmanagerError naming the call, never a hang', async () => {
    const down = createAlertmanagerClient(`http://127.0.0.1:${await freePort()}`, { timeoutMs: 500 });
    await expect(down.firing(labels())).rejects.toThrow(AlertmanagerError);
    await expect(down.firing(labels())).rejects.toThrow(/GET \/api\/v2\/alerts: unreachable/);
  });
});
