import { afterAll, describe, expect, jest, test } from '@jest/globals';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { parse } from 'yaml';
import { REPO, run } from '../../helpers/cluster.js';
import { LOCAL_IMAGES, NODE_DIR, helm, kubectl, list, ok, podReady, waitFor, type Obj } from '../../helpers/nodeSupport.js';

/**
 * The release path as an SRE takes it: `make push` puts both images and the packaged chart into an
 * OCI registry (the node's docker-registry, CNCF distribution), `helm install oci://...` installs
 * from it, and the kubelet pulls both images from that registry: containerd holds no copy of those
 * references before the install (nothing side-loaded), and the kubelet's Pulled events name them.
 */
jest.setTimeout(600_000);

const NS = 'e2e-registry';
const RELEASE = 'fromreg';
const env = Object.fromEntries(
  readFileSync(join(NODE_DIR, 'env'), 'utf8')
    .split('\n')
    .filter((l) => l.includes('='))
    .map((l) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1)]),
) as Record<string, string>;
const REGISTRY = `${env.REGISTRY_ADDR}/opsgate`;
const pkg = JSON.parse(readFileSync(join(REPO, 'package.json'), 'utf8')) as { version: string };
const chart = parse(readFileSync(join(REPO, 'charts', 'opsgate', 'Chart.yaml'), 'utf8')) as { version: string };
const API_REF = `${REGISTRY}/opsgate-api:${pkg.version}`;
const WORKER_REF = `${REGISTRY}/opsgate-worker:${pkg.version}`;

async function containerdRefs(): Promise<string[]> {
  const r = ok(await run('ctr', ['--address', env.CONTAINERD_ADDRESS!, '-n', 'k8s.io', 'images', 'ls', '-q']), 'ctr images ls');
  return r.stdout.split('\n').filter(Boolean);
}

afterAll(async () => {
  await helm(['uninstall', RELEASE, '-n', NS, '--wait', '--timeout', '2m']);
  await kubectl(['delete', 'namespace', NS, '--wait=false']);
});

describe('make push, then helm install oci:// from the node registry', () => {
  test('both images are pulled from the registry and helm test passes', async () => {
    expect(env.REGISTRY_ADDR).toMatch(/^127\.0\.0\.1:\d+$/);
    const before = await containerdRefs();
    expect(before).not.toContain(API_REF);
    expect(before).not.toContain(WORKER_REF);

    const push = await run('make', ['--no-print-directory', 'push', `REGISTRY=${REGISTRY}`, 'REGISTRY_INSECURE=1'], { timeoutMs: 300_000 });
    ok(push, 'make push');

    // The registry serves what was pushed, under the names the chart derives from image.registry.
    const tags = (await (await fetch(`http://${env.REGISTRY_ADDR}/v2/opsgate/opsgate-api/tags/list`)).json()) as { tags: string[] };
    expect(tags.tags).toContain(pkg.version);
    const shown = ok(
      await helm(['show', 'chart', `oci://${REGISTRY}/opsgate`, '--version', chart.version, '--plain-http']),
      'helm show chart',
    );
    expect((parse(shown.stdout) as Obj).appVersion).toBe(pkg.version);

    ok(
      await helm([
        'install',
        RELEASE,
        `oci://${REGISTRY}/opsgate`,
        '--version',
        chart.version,
        '--plain-http',
        '-n',
        NS,
        '--create-namespace',
        '-f',
        LOCAL_IMAGES,
        '--set',
        `image.registry=${REGISTRY}`,
        '--set',
        'image.pullPolicy=Always',
        '--wait',
        '--timeout',
        '6m',
      ]),
      'helm install oci://',
    );
    const pods = (await list('pods', NS)).filter((p) => podReady(p));
    const images = pods.flatMap((p) => (p.spec.containers as Obj[]).map((c) => c.image as string));
    expect(images).toContain(API_REF);
    expect(images).toContain(WORKER_REF);

    const pulled = await waitFor(
      'Pulled events for both images',
      async () => {
        const ev = (await list('events', NS)).filter((e) => e.reason === 'Pulled').map((e) => String(e.message));
        return ev.some((m) => m.includes(`Successfully pulled image "${API_REF}"`)) &&
          ev.some((m) => m.includes(`Successfully pulled image "${WORKER_REF}"`))
          ? ev
          : false;
      },
      60_000,
    );
    expect(pulled.length).toBeGreaterThanOrEqual(2);
    const after = await containerdRefs();
    expect(after).toContain(API_REF);
    expect(after).toContain(WORKER_REF);

    const t = await helm(['test', RELEASE, '-n', NS, '--timeout', '4m']);
    ok(t, 'helm test');
    expect(t.stdout).toMatch(/Phase:\s+Succeeded/);
  });
});
