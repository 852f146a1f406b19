import { describe, expect, jest, test } from '@jest/globals';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { stringify } from 'yaml';
import { findProject, parseInventory } from '../../../src/shared/inventory.js';
import { find, one, render, renderError, type K8sObject } from '../../helpers/helm.js';

/**
 * cancel_in_progress through the chart, with real helm: the worker's Role gains `delete` on batch
 * jobs only in the namespace of a project that asks for it (and waits for its Jobs: without
 * waitForCompletion there is nothing to cancel), the flag reaches the inventory ConfigMap as the
 * code parses it, and the schema refuses a value that is not a boolean.
 */
jest.setTimeout(120_000);

function valuesFile(v: unknown): string {
  const f = join(mkdtempSync(join(tmpdir(), 'opsgate-chart-cancel-')), 'values.yaml');
  writeFileSync(f, stringify(v));
  return f;
}

const project = (namespace: string, extra: Record<string, unknown> = {}) => ({
  namespace,
  serviceAccountName: 'deployer',
  image: 'registry.example.com/deployer:1',
  ...extra,
});

/** The verbs of the worker Role's rule on batch jobs in a namespace (undefined: no such rule). */
function jobVerbs(objs: K8sObject[], namespace: string): string[] | undefined {
  const role = find(objs, 'Role', 'opsgate-worker').find((r) => r.metadata.namespace === namespace);
  if (!role) throw new Error(`no worker Role in ${namespace}`);
  return (role.rules as Array<{ apiGroups: string[]; resources: string[]; verbs: string[] }>).find(
    (r) => r.apiGroups.includes('batch') && r.resources.includes('jobs'),
  )?.verbs;
}

describe('cancel_in_progress in the chart', () => {
  test('off (the default): no Role may delete Jobs', async () => {
    const objs = await render({
      files: [valuesFile({ inventory: { projects: { 'acme/web': project('web-deploys'), 'acme/api': project('api-deploys') } } })],
    });
    expect(jobVerbs(objs, 'web-deploys')).toEqual(['create', 'get']);
    expect(jobVerbs(objs, 'api-deploys')).toEqual(['create', 'get']);
    for (const r of find(objs, 'Role'))
      for (const rule of r.rules as Array<{ verbs: string[] }>) expect(rule.verbs).not.toContain('delete');
  });

  test('on for one project: delete on jobs in its namespace only; not where a project does not wait for its Jobs', async () => {
    const objs = await render({
      files: [
        valuesFile({
          inventory: {
            hosts: { 'web-1': { namespace: 'shop', deployments: ['frontend'] } },
            projects: {
              'acme/web': project('web-deploys', { cancel_in_progress: true }),
              'acme/api': project('api-deploys'),
              'acme/fire': project('fire-deploys', { cancel_in_progress: true, waitForCompletion: false }),
            },
          },
        }),
      ],
    });
    expect(jobVerbs(objs, 'web-deploys')).toEqual(['create', 'get', 'delete']);
    expect(jobVerbs(objs, 'api-deploys')).toEqual(['create', 'get']);
    expect(jobVerbs(objs, 'fire-deploys')).toEqual(['create', 'get']);
    expect(jobVerbs(objs, 'shop')).toBeUndefined();
    const inv = parseInventory(one(objs, 'ConfigMap', 'opsgate-inventory').data['inventory.yaml']);
    expect(findProject(inv, 'acme/web')?.cancel_in_progress).toBe(true);
    expect(findProject(inv, 'acme/api')?.cancel_in_progress).toBeUndefined();
  });

  test("the worker's admission policy lets it delete only deploy Jobs opsgate made, rendered only with the flag", async () => {
    const VAP = 'admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy';
    const off = await render({
      files: [valuesFile({ inventory: { projects: { 'acme/web': project('web-deploys') } } })],
      apiVersions: [VAP],
    });
    expect(find(off, 'ValidatingAdmissionPolicy').map((p) => p.metadata.name)).not.toContain('opsgate-opsgate-worker-job-deletes');
    const on = await render({
      files: [valuesFile({ inventory: { projects: { 'acme/web': project('web-deploys', { cancel_in_progress: true }) } } })],
      apiVersions: [VAP],
    });
    const policy = one(on, 'ValidatingAdmissionPolicy', 'opsgate-opsgate-worker-job-deletes');
    expect(policy.spec.matchConstraints.resourceRules).toEqual([
      { apiGroups: ['batch'], apiVersions: ['v1'], operations: ['DELETE'], resources: ['jobs'] },
    ]);
    expect(policy.spec.matchConditions[0].expression).toBe('request.userInfo.username == "system:serviceaccount:opsgate:opsgate-worker"');
    expect(policy.spec.validations[0].expression).toContain("oldObject.metadata.labels['app.kubernetes.io/managed-by'] == 'opsgate'");
    expect(one(on, 'ValidatingAdmissionPolicyBinding', 'opsgate-opsgate-worker-job-deletes').spec).toEqual({
      policyName: 'opsgate-opsgate-worker-job-deletes',
      validationActions: ['Deny'],
    });
  });

  test('the schema refuses a cancel_in_progress that is not a boolean', async () => {
    const err = await renderError({
      files: [valuesFile({ inventory: { projects: { 'acme/web': project('web-deploys', { cancel_in_progress: 'always' }) } } })],
    });
    expect(err).toMatch(/cancel_in_progress/);
  });
});
