import { spawnSync } from 'node:child_process';
import { describe, expect, jest, test } from '@jest/globals';
import { parseRedisUrl } from '../../../src/shared/redis.js';
import { find, one, render, renderError, renderText, type K8sObject } from '../../helpers/helm.js';

/**
 * The chart's three Redis topologies, as rendered by the real helm:
 * - redis.architecture=standalone (default): one Redis pod, REDIS_URL redis://;
 * - redis.architecture=replication: 3 pods (Redis + Sentinel each; 1 primary, 2 replicas,
 *   3 sentinels), pod anti-affinity, a PodDisruptionBudget, REDIS_URL redis+sentinel://;
 * - redis.enabled=false: an external Redis, Sentinel or Cluster by URL from the Secret.
 * And REDIS_MIN_REPLICAS_ACK / REDIS_ACK_TIMEOUT_MS from config.
 */
jest.setTimeout(120_000);

const envOf = (objs: K8sObject[], deployment: string) =>
  one(objs, 'Deployment', deployment).spec.template.spec.containers[0].env as Array<{ name: string; value?: string; valueFrom?: any }>;

describe('redis.architecture=replication', () => {
  let objs: K8sObject[];
  test('renders 3 Redis+Sentinel pods, a headless Service for both ports, a PDB, and no standalone Redis', async () => {
    objs = await render({ files: ['replication-redis-values.yaml'] });
    const sts = find(objs, 'StatefulSet');
    expect(sts.map((s) => s.metadata.name)).toEqual(['opsgate-redis']);
    const spec = sts[0]!.spec;
    expect(spec.replicas).toBe(3);
    expect(spec.template.spec.containers.map((c: any) => c.name)).toEqual(['redis', 'sentinel']);
    expect(spec.template.spec.containers.map((c: any) => c.ports[0].containerPort)).toEqual([6379, 26379]);
    expect(spec.volumeClaimTemplates[0].metadata.name).toBe('data');
    const svc = one(objs, 'Service', 'opsgate-redis-headless');
    expect(svc.spec.clusterIP).toBe('None');
    expect(svc.spec.publishNotReadyAddresses).toBe(true);
    expect(svc.spec.ports.map((p: any) => p.port)).toEqual([6379, 26379]);
    // No ClusterIP Service pointing at "a" Redis: with Sentinel the clients ask for the primary.
    expect(find(objs, 'Service', 'opsgate-redis')).toEqual([]);
    const pdb = one(objs, 'PodDisruptionBudget', 'opsgate-redis');
    expect(pdb.spec.maxUnavailable).toBe(1);
    expect(pdb.spec.selector.matchLabels).toEqual(spec.selector.matchLabels);
  });

  test('anti-affinity: hard = required one per node; soft (default) = preferred', async () => {
    const hard = one(objs, 'StatefulSet', 'opsgate-redis').spec.template.spec.affinity.podAntiAffinity;
    expect(hard.requiredDuringSchedulingIgnoredDuringExecution[0].topologyKey).toBe('kubernetes.io/hostname');
    expect(hard.requiredDuringSchedulingIgnoredDuringExecution[0].labelSelector.matchLabels['app.kubernetes.io/component']).toBe('redis');
    const soft = one(
      await render({
        files: ['replication-redis-values.yaml'],
        set: { 'redis.replication.antiAffinity': 'soft', 'redis.replication.antiAffinityTopologyKey': 'topology.kubernetes.io/zone' },
      }),
      'StatefulSet',
      'opsgate-redis',
    ).spec.template.spec.affinity.podAntiAffinity;
    expect(soft.preferredDuringSchedulingIgnoredDuringExecution[0].podAffinityTerm.topologyKey).toBe('topology.kubernetes.io/zone');
    expect(soft.requiredDuringSchedulingIgnoredDuringExecution).toBeUndefined();
  });

  test('the api and the worker get the Sentinel URL form, composed from the Secret, that opsgate parses', async () => {
    for (const d of ['opsgate-api', 'opsgate-worker']) {
      const env = envOf(objs, d);
      const names = env.map((e) => e.name);
      expect(names.indexOf('REDIS_PASSWORD')).toBeLessThan(names.indexOf('REDIS_URL'));
      expect(env.find((e) => e.name === 'REDIS_PASSWORD')!.valueFrom.secretKeyRef).toEqual({ name: 'opsgate', key: 'REDIS_PASSWORD' });
      const url = env.find((e) => e.name === 'REDIS_URL')!.value!;
      const p = parseRedisUrl(url.replaceAll('$(REDIS_PASSWORD)', 'pw'));
      expect(p).toEqual({
        topology: 'sentinel',
        sentinels: [0, 1, 2].map((i) => ({ host: `opsgate-redis-${i}.opsgate-redis-headless.opsgate.svc`, port: 26379 })),
        masterName: 'opsgate',
        db: 0,
        password: 'pw',
        sentinelPassword: 'pw',
      });
    }
    const cm = one(objs, 'ConfigMap', 'opsgate-config').data;
    expect(cm.REDIS_MIN_REPLICAS_ACK).toBe('1');
    expect(cm.REDIS_ACK_TIMEOUT_MS).toBe('1000');
  });

  test('the scripts are valid sh, name the master and its quorum, and keep the password out of the ConfigMap', async () => {
    const cm = one(objs, 'ConfigMap', 'opsgate-redis').data as Record<string, string>;
    for (const f of ['find-primary.sh', 'start-redis.sh', 'start-sentinel.sh']) {
      const r = spawnSync('sh', ['-n'], { input: cm[f], encoding: 'utf8' });
      expect([f, r.status, r.stderr]).toEqual([f, 0, '']);
    }
    expect(cm['start-sentinel.sh']).toMatch(/^sentinel monitor opsgate \$PRIMARY 6379 2$/m);
    expect(cm['start-sentinel.sh']).toMatch(/^sentinel down-after-milliseconds opsgate 3000$/m);
    expect(cm['start-redis.sh']).toContain('replicaof %s 6379');
    // Sentinel runs as redis-server --sentinel: Debian's redis-server package (the test node's
    // image) has no redis-sentinel link; the official image has both.
    expect(cm['start-sentinel.sh']).toMatch(/^exec redis-server \/sentinel\/sentinel.conf --sentinel$/m);
    expect(cm['start-sentinel.sh']).not.toMatch(/^\s*exec redis-sentinel/m);
    // A primary pod that is back before the sentinels noticed it was gone waits for the failover
    // instead of starting as an empty primary its replicas would copy (found on the real node).
    expect(cm['start-redis.sh']).toMatch(/while \[ "\$PRIMARY" = "\$SELF" \] && \[ "\$\(known_replicas\)" -gt 0 \]/);
    expect(cm['find-primary.sh']).toMatch(/sentinel master opsgate .*num-slaves/);
    expect(cm['redis.conf']).toMatch(/^maxmemory-policy noeviction$/m);
    expect(cm['redis.conf']).toMatch(/^appendonly yes$/m);
    expect(JSON.stringify(cm)).not.toContain('fake-redis-password-0006');
  });

  test('NetworkPolicy: sentinels reachable from the api and worker; Redis and Sentinel between the Redis pods', async () => {
    const np = await render({ files: ['replication-redis-values.yaml'], set: { 'networkPolicy.enabled': 'true' } });
    const pol = one(np, 'NetworkPolicy', 'opsgate-redis');
    const rules = pol.spec.ingress as Array<{
      ports: Array<{ port: string }>;
      from: Array<{ podSelector: { matchLabels: Record<string, string> } }>;
    }>;
    const allows = (port: string, component: string) =>
      rules.some(
        (r) =>
          r.ports.some((p) => p.port === port) &&
          r.from.some((f) => f.podSelector.matchLabels['app.kubernetes.io/component'] === component),
      );
    expect(allows('sentinel', 'api')).toBe(true);
    expect(allows('sentinel', 'worker')).toBe(true);
    expect(allows('redis', 'redis')).toBe(true);
    expect(allows('sentinel', 'redis')).toBe(true);
  });
});

describe('standalone (default) and external topologies', () => {
  test('default: one Redis pod, redis:// URL, REDIS_MIN_REPLICAS_ACK 0', async () => {
    const objs = await render({ files: ['in-chart-redis-values.yaml'] });
    const sts = one(objs, 'StatefulSet', 'opsgate-redis');
    expect(sts.spec.replicas).toBe(1);
    expect(sts.spec.template.spec.containers.map((c: any) => c.name)).toEqual(['redis']);
    expect(find(objs, 'PodDisruptionBudget', 'opsgate-redis')).toEqual([]);
    expect(envOf(objs, 'opsgate-api').find((e) => e.name === 'REDIS_URL')!.value).toMatch(/^redis:\/\//);
    expect(one(objs, 'ConfigMap', 'opsgate-config').data.REDIS_MIN_REPLICAS_ACK).toBe('0');
  });

  test('external Sentinel or Cluster: the URL only in the Secret, no Redis workload', async () => {
    const objs = await render({ files: ['external-sentinel-values.yaml'] });
    expect(find(objs, 'StatefulSet')).toEqual([]);
    const secret = one(objs, 'Secret', 'opsgate');
    expect(Buffer.from(secret.data.REDIS_URL, 'base64').toString()).toMatch(/^redis\+sentinel:\/\//);
    expect(envOf(objs, 'opsgate-worker').find((e) => e.name === 'REDIS_URL')!.valueFrom.secretKeyRef).toEqual({
      name: 'opsgate',
      key: 'REDIS_URL',
    });
    const cluster = await renderText({
      files: ['external-sentinel-values.yaml'],
      set: { 'secrets.redisUrl': 'redis+cluster://:pw@n1:6379\\,n2:6379' },
    });
    expect(cluster).toContain(Buffer.from('redis+cluster://:pw@n1:6379,n2:6379').toString('base64'));
  });

  test('values.schema.json refuses an unknown architecture, an ack timeout over 1500 ms and a non-Redis URL', async () => {
    expect(await renderError({ files: ['in-chart-redis-values.yaml'], set: { 'redis.architecture': 'cluster' } })).toMatch(/architecture/);
    expect(await renderError({ files: ['in-chart-redis-values.yaml'], set: { 'config.redisAckTimeoutMs': '5000' } })).toMatch(
      /redisAckTimeoutMs/,
    );
    expect(await renderError({ files: ['external-sentinel-values.yaml'], set: { 'secrets.redisUrl': 'http://x' } })).toMatch(/redisUrl/);
  });
});
