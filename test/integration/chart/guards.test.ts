import { describe, expect, jest, test } from '@jest/globals';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { stringify } from 'yaml';
import { hostPolicy, namespaceBudget, parseInventory, projectPolicy } from '../../../src/shared/inventory.js';
import { containerEnv, one, render, renderError } from '../../helpers/helm.js';

/**
 * Guarded changes through the chart, with real helm: the inventory's policies (the default in
 * inventory.policy, each host's and project's own) reach the inventory ConfigMap as the code parses
 * them, a default guard left at zero is off, DRY_RUN_TIMEOUT_MS and OPSGATE_PUBLIC_URL reach the
 * processes, and the schema refuses a bad window or budget at install time.
 */
jest.setTimeout(120_000);

function valuesFile(v: unknown): string {
  const f = join(mkdtempSync(join(tmpdir(), 'opsgate-chart-guards-')), 'values.yaml');
  writeFileSync(f, stringify(v));
  return f;
}

const inventory = {
  policy: { approval: { required: 1, ttl: '30m' }, budget: { restarts: 5, per: '1h' } },
  hosts: {
    'web-1': { namespace: 'shop', deployments: ['frontend'] },
    'pay-1': {
      namespace: 'payments',
      deployments: ['api'],
      policy: {
        approval: { required: 2, ttl: '10m' },
        windows: [{ days: ['mon', 'tue', 'wed', 'thu', 'fri'], start: '09:00', end: '17:00', timeZone: 'Europe/Paris' }],
        budget: { restarts: 3, per: '10m' },
      },
    },
  },
  projects: {
    'acme/shop': {
      namespace: 'deploys',
      serviceAccountName: 'deployer',
      image: 'registry.example.com/deployer:1',
      waitForCompletion: false,
      policy: { windows: [{ days: ['sat'], start: '22:00', end: '06:00', timeZone: 'UTC' }] },
    },
  },
};

describe('policies in the inventory ConfigMap', () => {
  test('the default and the entries reach the ConfigMap as the code parses them', async () => {
    const objs = await render({ files: [valuesFile({ inventory })] });
    const inv = parseInventory(one(objs, 'ConfigMap', 'opsgate-inventory').data['inventory.yaml']);
    expect(hostPolicy(inv, 'web-1')).toEqual({ approval: { required: 1, ttl: 1800 }, budget: { restarts: 5, per: 3600 } });
    expect(hostPolicy(inv, 'pay-1')).toMatchObject({
      approval: { required: 2, ttl: 600 },
      budget: { restarts: 3, per: 600 },
      windows: [{ start: '09:00' }],
    });
    expect(namespaceBudget(inv, 'payments')).toEqual({ restarts: 3, per: 600 });
    expect(projectPolicy(inv, 'acme/shop')).toEqual({
      approval: { required: 1, ttl: 1800 },
      windows: [{ days: ['sat'], start: '22:00', end: '06:00', timeZone: 'UTC' }],
    });
    expect(inv.projects['acme/shop']!.waitForCompletion).toBe(false);
  });

  test('by default no guard is on: zero approvals and restarts mean off, and no policy is written', async () => {
    const objs = await render({ files: [valuesFile({ inventory: { hosts: inventory.hosts, projects: {} } })] });
    const text = one(objs, 'ConfigMap', 'opsgate-inventory').data['inventory.yaml'];
    const inv = parseInventory(text);
    expect(inv.policy).toBeUndefined();
    expect(hostPolicy(inv, 'web-1')).toEqual({});
  });

  test('DRY_RUN_TIMEOUT_MS and OPSGATE_PUBLIC_URL reach the api and the worker', async () => {
    const objs = await render({ set: { 'config.dryRunTimeoutMs': '2500', 'config.publicUrl': 'https://opsgate.example.com' } });
    for (const d of ['opsgate-api', 'opsgate-worker']) {
      expect(containerEnv(objs, d)).toMatchObject({ DRY_RUN_TIMEOUT_MS: '2500', OPSGATE_PUBLIC_URL: 'https://opsgate.example.com' });
    }
    expect(containerEnv(await render(), 'opsgate-worker').OPSGATE_PUBLIC_URL).toBeUndefined();
  });

  test.each([
    ['a window hour that is no time', { 'inventory.policy.windows[0].start': '9am' }, /start/],
    ['a weekday that is none', { 'inventory.policy.windows[0].days[0]': 'someday' }, /days/],
    ['a negative budget', { 'inventory.policy.budget.restarts': '-1' }, /restarts/],
    ['a ttl that is no duration', { 'inventory.policy.approval.ttl': 'soon' }, /ttl/],
    ['an unknown policy field', { 'inventory.policy.freeze': 'true' }, /freeze/],
  ])('the schema refuses %s', async (_what, set, message) => {
    const base = {
      'inventory.policy.windows[0].days[0]': 'mon',
      'inventory.policy.windows[0].start': '09:00',
      'inventory.policy.windows[0].end': '17:00',
      'inventory.policy.windows[0].timeZone': 'UTC',
    };
    const needsWindow = Object.keys(set).some((k) => k.includes('windows'));
    expect(await renderError({ setString: { ...(needsWindow ? base : {}), ...set } })).toMatch(message);
  });
});
