import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Redis } from 'ioredis';
import { parseInventory } from '../../../src/shared/inventory.js';
import type { ReportStatusData } from '../../../src/shared/jobs.js';
import { deployStatusKey } from '../../../src/shared/keys.js';
import { createWorkerDeps } from '../../../worker/deps.js';
import { startWorker, type WorkerHandle } from '../../../worker/index.js';
import { startRedis, type RedisServer } from '../../helpers/redis.js';
import { startStatusHosts, statusHostEnv, type Hosts } from '../../helpers/statusHosts.js';
import { waitFor } from '../../helpers/waitFor.js';
import { collectLogs, metricValue, testMetrics, workerConfig, type LogCollector } from '../../helpers/workerSupport.js';

/**
 * report_status jobs (worker/jobs/reportStatus.ts) on real Redis, processed by the real worker,
 * added to the queue as the worker adds them for a deploy's recorded state (createWorkerDeps's
 * reportStatus). The hosts' APIs are one local HTTPS server that checks every request against the
 * host's own description of it (test/helpers/statusHosts.ts). The deploys behind these states run
 * on the real control plane in test/e2e/controlplane/commitStatus.test.ts.
 */
const TOKENS: Record<string, string> = {
  github: 'ghp-status-token-1001',
  gitlab: 'glpat-status-token-1002',
  gitea: 'gitea-status-token-1003',
  bitbucket: 'bb-status-token-1004',
};
const PUBLIC_URL = 'https://opsgate.example.com';
const inventory = parseInventory(
  'projects:\n  octo/app:\n    namespace: deploys\n    serviceAccountName: deployer\n    image: alpine:3.20\n',
);

let redis: RedisServer;
let inspect: Redis;
let hosts: Hosts;
beforeAll(async () => {
  redis = await startRedis();
  inspect = new Redis(redis.url, { maxRetriesPerRequest: 1 });
  hosts = await startStatusHosts(TOKENS);
});
afterAll(async () => {
  inspect?.disconnect();
  await hosts?.close();
  await redis?.destroy();
});

type Rig = WorkerHandle & {
  metrics: ReturnType<typeof testMetrics>;
  logs: LogCollector;
  /** Adds the report of one state through the worker's own add (its queue, options and job id). */
  report(data: Partial<ReportStatusData> & Pick<ReportStatusData, 'deploy_id' | 'sender' | 'state'>): Promise<void>;
};

async function withWorker<T>(fn: (w: Rig) => Promise<T>, env = statusHostEnv(hosts, TOKENS, PUBLIC_URL)): Promise<T> {
  hosts.seen.length = 0;
  const metrics = testMetrics();
  const logs = collectLogs();
  const config = workerConfig({
    REDIS_URL: redis.url,
    JOB_BACKOFF_MS: '300',
    ...env,
  });
  const noKube = () => Promise.reject(new Error('report_status never asks Kubernetes'));
  const w = await startWorker(config, { logger: logs.logger, metrics, inventory, kubeConfig: noKube });
  const deps = createWorkerDeps({ config, inventory, redis: w.redis, logger: collectLogs().logger, kubeConfig: noKube, now: Date.now });
  const report: Rig['report'] = (d) =>
    deps.reportStatus!({
      project: 'octo/app',
      ref: 'refs/heads/main',
      sha: 'c'.repeat(40),
      environment: 'production',
      mode: 'deployment',
      audit_id: `audit-${d.deploy_id}`,
      requested_by: 'github',
      ...d,
    });
  try {
    return await fn(Object.assign(w, { metrics, logs, report }));
  } finally {
    await deps.close();
    await w.close(1000);
  }
}

/** The requests to `host` once they include a status of each of `states` (the host's own states). */
const statuses = (host: string, states: string[]) =>
  waitFor(`${host} told ${states.join(', ')}`, async () => {
    const mine = hosts.seen.filter((s) => s.host === host && s.status < 300 && typeof s.body.state === 'string');
    return states.every((st) => mine.some((s) => s.body.state === st)) ? hosts.seen.filter((s) => s.host === host) : false;
  });

const sent = (w: Rig, sender: string) => metricValue(w.metrics, 'opsgate_commit_status_reports_total', { sender, result: 'sent' });

describe('report_status jobs, processed by the worker', () => {
  it('GitHub: the first report creates the deployment, kept beside the deploy; the next reports post its statuses', async () => {
    await withWorker(async (w) => {
      const id = 'int-github-1';
      await w.report({ deploy_id: id, sender: 'github', state: 'running' });
      await statuses('github', ['in_progress']);
      await w.report({ deploy_id: id, sender: 'github', state: 'succeeded' });
      const seen = await statuses('github', ['in_progress', 'success']);
      expect(seen.flatMap((s) => s.problems)).toEqual([]);
      const created = seen.filter((s) => s.path.endsWith('/deployments'));
      expect(created.map((s) => s.path)).toEqual(['/github/repos/octo/app/deployments']);
      expect(created[0]!.body).toMatchObject({ ref: 'c'.repeat(40), environment: 'production', auto_merge: false, required_contexts: [] });
      const deployment = await inspect.hget(deployStatusKey(id), 'deployment');
      expect(deployment).toMatch(/^\d+$/);
      const posted = seen.filter((s) => s.path.endsWith('/statuses'));
      expect(new Set(posted.map((s) => s.path))).toEqual(new Set([`/github/repos/octo/app/deployments/${deployment}/statuses`]));
      expect(posted.map((s) => s.body.state)).toEqual(['in_progress', 'success']);
      expect(posted[1]!.body).toMatchObject({ log_url: `${PUBLIC_URL}/ops/deploys/${id}`, environment: 'production' });
      await waitFor('both reports counted as sent', async () => (await sent(w, 'github')) === 2);
      // A late retry of an earlier state is not told after a later one.
      await w.report({ deploy_id: id, sender: 'github', state: 'queued' });
      await waitFor(
        'the late report skipped',
        async () => (await metricValue(w.metrics, 'opsgate_commit_status_reports_total', { sender: 'github', result: 'skipped' })) === 1,
      );
      expect(hosts.seen.filter((s) => s.host === 'github')).toHaveLength(3);
      expect(w.logs.lines.join('\n')).not.toContain(TOKENS.github);
    });
  });

  it('GitLab (its project path encoded), Gitea and Bitbucket: their commit status calls, as each describes them', async () => {
    await withWorker(async (w) => {
      const told = async (sender: string, project: string, id: string, states: string[]) => {
        const report = (state: ReportStatusData['state']) =>
          w.report({ deploy_id: id, sender: sender as ReportStatusData['sender'], project, environment: 'refs/heads/main', state });
        await report('running');
        await statuses(sender, states.slice(0, 1));
        await report('succeeded');
        return statuses(sender, states);
      };
      const lab = await told('gitlab', 'group/lab', 'int-lab-1', ['running', 'success']);
      const tea = await told('gitea', 'team/tea', 'int-tea-1', ['pending', 'success']);
      const bucket = await told('bitbucket', 'work/bucket', 'int-bb-1', ['INPROGRESS', 'SUCCESSFUL']);
      expect([...lab, ...tea, ...bucket].flatMap((s) => s.problems)).toEqual([]);
      const sha = 'c'.repeat(40);
      expect(new Set(lab.map((s) => s.path))).toEqual(new Set([`/gitlab/api/v4/projects/group%2Flab/statuses/${sha}`]));
      expect(lab.map((s) => s.body.state)).toEqual(['running', 'success']);
      expect(lab[0]!.body).toMatchObject({ ref: 'main', name: 'opsgate/refs/heads/main' });
      expect(new Set(tea.map((s) => s.path))).toEqual(new Set([`/gitea/api/v1/repos/team/tea/statuses/${sha}`]));
      expect(tea.map((s) => s.body.state)).toEqual(['pending', 'success']);
      expect(new Set(bucket.map((s) => s.path))).toEqual(new Set([`/bitbucket/2.0/repositories/work/bucket/commit/${sha}/statuses/build`]));
      expect(bucket.at(-1)!.body).toMatchObject({ state: 'SUCCESSFUL', url: `${PUBLIC_URL}/ops/deploys/int-bb-1`, refname: 'main' });
      const out = w.logs.lines.join('\n');
      for (const token of Object.values(TOKENS)) expect(out).not.toContain(token);
    });
  });

  it('a failing host (500, then ok) is asked again with backoff, each failure counted and logged', async () => {
    await withWorker(async (w) => {
      hosts.fail.gitea = [500, 500];
      await w.report({ deploy_id: 'int-tea-2', sender: 'gitea', project: 'team/tea', state: 'succeeded' });
      const seen = await statuses('gitea', ['success']);
      expect(seen.flatMap((s) => s.problems)).toEqual([]);
      expect(seen.map((s) => s.status)).toEqual([500, 500, 201]);
      // The queue's exponential backoff (300 ms, then 600 ms) between the attempts.
      expect(seen[1]!.at - seen[0]!.at).toBeGreaterThanOrEqual(250);
      expect(seen[2]!.at - seen[1]!.at).toBeGreaterThanOrEqual(550);
      expect(await metricValue(w.metrics, 'opsgate_commit_status_reports_total', { sender: 'gitea', result: 'failed' })).toBe(2);
      await waitFor('the report counted as sent', async () => (await sent(w, 'gitea')) === 1);
      const failures = w.logs.find('could not report the deploy state to its sender');
      expect(failures.map((f) => f.attempt)).toEqual([1, 2]);
      expect(failures[0]).toMatchObject({ sender: 'gitea', deploy: 'int-tea-2' });
      expect(w.logs.lines.join('\n')).not.toContain(TOKENS.gitea);
    });
  });

  it('no token for a sender: the worker says so once at start, and a report for it asks nothing', async () => {
    await withWorker(
      async (w) => {
        const off = w.logs.find('deploy states are not reported to this sender');
        expect(off.map((l) => l.sender)).toEqual(['gitea']);
        expect(String(off[0]!.why)).toContain('GITEA_STATUS_BEARER_TOKEN');
        await w.report({ deploy_id: 'int-tea-3', sender: 'gitea', project: 'team/tea', state: 'succeeded' });
        await waitFor(
          'the report counted as not sent',
          async () => (await metricValue(w.metrics, 'opsgate_commit_status_reports_total', { sender: 'gitea', result: 'no_token' })) === 1,
        );
        expect(hosts.seen).toEqual([]);
        expect(w.logs.find('deploy states are not reported to this sender')).toHaveLength(1);
      },
      statusHostEnv(hosts, TOKENS, PUBLIC_URL, ['gitea']),
    );
  });
});
