import { describe, expect, jest, test } from '@jest/globals';
import { containerEnv, one, render } from '../../helpers/helm.js';

/**
 * statusReports: each host's token comes from a Secret of the operator's, mounted into the worker
 * pods only, its key named by the worker's <HOST>_STATUS_BEARER_TOKEN_FILE (re-read when the
 * kubelet updates it); without a Secret nothing is mounted and no token variable is set.
 */
jest.setTimeout(120_000);

const base = { 'secrets.apiKeyRoles': 'fake-operator-key-0013:operator' };

describe('statusReports', () => {
  test('off by default: no status Secret mounted, no token file named', async () => {
    const objs = await render({ set: base });
    const worker = one(objs, 'Deployment', 'opsgate-worker');
    const volumes = (worker.spec.template.spec.volumes as Array<{ name: string }>).map((v) => v.name);
    expect(volumes.filter((n) => n.startsWith('status-'))).toEqual([]);
    const env = containerEnv(objs, 'opsgate-worker');
    expect(Object.keys(env).filter((k) => /_STATUS_(BEARER_TOKEN|TLS_CA)_FILE$/.test(k))).toEqual([]);
    expect(env.GITHUB_STATUS_API_URL).toBe('https://api.github.com');
    expect(env.GITEA_STATUS_API_URL).toBeUndefined();
  });

  test("a host's existingSecret is mounted into the worker only, and its token and CA keys are the files the worker reads", async () => {
    const objs = await render({
      set: {
        ...base,
        'statusReports.gitlab.existingSecret': 'gitlab-status',
        'statusReports.gitlab.caKey': 'ca.crt',
        'statusReports.gitlab.apiUrl': 'https://gitlab.example.com/api/v4',
      },
    });
    const worker = one(objs, 'Deployment', 'opsgate-worker').spec.template.spec;
    expect(worker.volumes).toContainEqual({ name: 'status-gitlab', secret: { secretName: 'gitlab-status' } });
    expect(worker.containers[0].volumeMounts).toContainEqual({
      name: 'status-gitlab',
      mountPath: '/etc/opsgate-status/gitlab',
      readOnly: true,
    });
    const env = containerEnv(objs, 'opsgate-worker');
    expect(env.GITLAB_STATUS_BEARER_TOKEN_FILE).toBe('/etc/opsgate-status/gitlab/token');
    expect(env.GITLAB_STATUS_TLS_CA_FILE).toBe('/etc/opsgate-status/gitlab/ca.crt');
    expect(env.GITLAB_STATUS_API_URL).toBe('https://gitlab.example.com/api/v4');
    const api = one(objs, 'Deployment', 'opsgate-api').spec.template.spec;
    expect(JSON.stringify(api)).not.toContain('gitlab-status');
    expect(Object.keys(containerEnv(objs, 'opsgate-api')).filter((k) => k.includes('_STATUS_'))).toEqual([]);
  });
});
