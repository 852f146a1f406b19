import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { mkdtempSync, renameSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import request from 'supertest';
import { parseInventory } from '../../../src/shared/inventory.js';
import { JOB } from '../../../src/shared/jobs.js';
import { SOURCES, type PushSource } from '../../../src/sources/index.js';
import { startWorker, type WorkerHandle } from '../../../worker/index.js';
import { OP_KEY, RO_KEY, useHarness } from '../../helpers/apiHarness.js';
import { useDeployNamespace } from '../../helpers/deployJobs.js';
import { startWorkerProcess } from '../../helpers/processes.js';
import { freePort } from '../../helpers/redis.js';
import { harnessSecretOf, pushHeaders } from '../../helpers/senders.js';
import { startStatusHosts, statusHostEnv, type Hosts } from '../../helpers/statusHosts.js';
import { waitFor } from '../../helpers/waitFor.js';
import { collectLogs, metricValue, testMetrics, workerConfig, type LogCollector } from '../../helpers/workerSupport.js';

jest.setTimeout(120_000);

/**
 * Each deploy's state on its commit (worker/commitStatus.ts, worker/jobs/reportStatus.ts), on real
 * Redis, through the real app and the real worker, whose deploys run as Jobs on the real
 * kube-apiserver and Job controller of the shared control plane (test/helpers/deployJobs.ts ends
 * each Job's pod: no kubelet runs here); the hosts' APIs are one local HTTPS server that checks
 * every request against the host's own description of it (test/helpers/statusHosts.ts).
 */
const TOKENS: Record<string, string> = {
  github: 'ghp-status-token-0001',
  gitlab: 'glpat-status-token-0002',
  gitea: 'gitea-status-token-0003',
  bitbucket: 'bb-status-token-0004',
};
const PUBLIC_URL = 'https://opsgate.example.com';
const NS = 'cstat-deploy';
/** How long a Job's pod runs before it is ended (a deploy's own pace, not a wait of the test). */
const RUN_MS = 200;

const INVENTORY_YAML = `
projects:
${['octo/app', 'octo/commits', 'group/lab', 'team/tea', 'work/bucket', 'group/ci-app']
  .map(
    (p) => `  ${p}:
    namespace: ${NS}
    serviceAccountName: deployer
    image: alpine:3.20
${p === 'octo/app' ? '    environment: production\n' : ''}${p === 'octo/commits' ? '    status: commit\n' : ''}${
      p === 'group/ci-app' ? '    deploy_from: ci\n    sender: gitea\n' : ''
    }`,
  )
  .join('')}`;
const inventory = parseInventory(INVENTORY_YAML);
const ctx = useHarness({ inventoryYaml: INVENTORY_YAML });

// --- the rig -----------------------------------------------------------------------------

const deployNs = useDeployNamespace(NS, RUN_MS);
let hosts: Hosts;
beforeAll(async () => {
  hosts = await startStatusHosts(TOKENS);
});
afterAll(async () => {
  await hosts?.close();
});

const hostEnv = (without: string[] = []) => statusHostEnv(hosts, TOKENS, PUBLIC_URL, without);

type Rig = WorkerHandle & { metrics: ReturnType<typeof testMetrics>; logs: LogCollector };

async function withWorker<T>(fn: (w: Rig) => Promise<T>, env: Record<string, string> = hostEnv()): Promise<T> {
  deployNs.kube.reset();
  hosts.seen.length = 0;
  const metrics = testMetrics();
  const logs = collectLogs();
  const w = await startWorker(workerConfig({ REDIS_URL: ctx.srv.url, ROLLOUT_POLL_INTERVAL_MS: '50', JOB_BACKOFF_MS: '300', ...env }), {
    logger: logs.logger,
    metrics,
    inventory,
    kubeConfig: () => deployNs.admin,
  });
  try {
    return await fn(Object.assign(w, { metrics, logs }));
  } finally {
    await w.close(1000);
  }
}

const sourceOf = (name: string) => SOURCES.find((s) => s.name === name) as PushSource;

/** A push of `sha` to `project`'s main from a sender, made from its documented example payload. */
async function push(sender: string, project: string, sha: string): Promise<string> {
  const source = sourceOf(sender);
  const example = source.map(source.example, 'refs/heads/main') as { fields: { project: string; sha: string } };
  const body = JSON.stringify(source.example).replaceAll(example.fields.sha, sha).replaceAll(example.fields.project, project);
  const res = await request(ctx.h.app)
    .post(`/webhook/${sender}`)
    .set(pushHeaders(source, harnessSecretOf(source, ctx.h.config), body))
    .send(body);
  expect(res.status).toBe(202);
  return res.body.job_id as string;
}

const deployState = async (id: string) =>
  (
    await request(ctx.h.app)
      .get(`/ops/deploys/${encodeURIComponent(id)}`)
      .set('X-API-Key', RO_KEY)
  ).body as { state: string; finished_at: string | null };

/** The requests to `host` once they include a status of each of `states` (the host's own states). */
const statuses = (host: string, states: string[]) =>
  waitFor(`${host} told ${states.join(', ')}`, async () => {
    const mine = hosts.seen.filter((s) => s.host === host && s.status < 300 && typeof s.body.state === 'string');
    return states.every((st) => mine.some((s) => s.body.state === st)) ? hosts.seen.filter((s) => s.host === host) : false;
  });

const sha = (n: number) => n.toString(16).padStart(40, 'a');

describe('each state of a deploy on its commit', () => {
  it('GitHub: one deployment (the commit, the environment, no auto-merge, no required contexts), then its statuses', async () => {
    await withWorker(async (w) => {
      const id = await push('github', 'octo/app', sha(1));
      const seen = await statuses('github', ['in_progress', 'success']);
      expect(seen.flatMap((s) => s.problems)).toEqual([]);
      const created = seen.filter((s) => s.path.endsWith('/deployments'));
      expect(created).toHaveLength(1);
      expect(created[0]!.path).toBe('/github/repos/octo/app/deployments');
      expect(created[0]!.body).toMatchObject({ ref: sha(1), environment: 'production', auto_merge: false, required_contexts: [] });
      const posted = seen.filter((s) => s.path.endsWith('/statuses'));
      const deployment = await ctx.h.inspect.hget(`{opsgate}:guard:deploys:status:${id}`, 'deployment');
      expect(deployment).toMatch(/^\d+$/);
      expect(new Set(posted.map((s) => s.path))).toEqual(new Set([`/github/repos/octo/app/deployments/${deployment}/statuses`]));
      expect(posted.map((s) => s.body.state)).toEqual(['in_progress', 'success']);
      for (const s of posted)
        expect(s.body).toMatchObject({
          log_url: `${PUBLIC_URL}/ops/deploys/${id}`,
          target_url: `${PUBLIC_URL}/ops/deploys/${id}`,
          environment: 'production',
        });
      expect((await deployState(id)).state).toBe('succeeded');
      await waitFor(
        'both reports counted as sent',
        async () => (await metricValue(w.metrics, 'opsgate_commit_status_reports_total', { sender: 'github', result: 'sent' })) === 2,
      );
      expect(w.logs.lines.join('\n')).not.toContain(TOKENS.github);
    });
  });

  it('GitHub with `status: commit`: commit statuses with the environment as context; no deployment', async () => {
    await withWorker(async () => {
      const id = await push('github', 'octo/commits', sha(2));
      const seen = await statuses('github', ['pending', 'success']);
      expect(seen.flatMap((s) => s.problems)).toEqual([]);
      expect(seen.every((s) => s.path === `/github/repos/octo/commits/statuses/${sha(2)}`)).toBe(true);
      expect(seen.map((s) => s.body)).toEqual([
        { state: 'pending', description: 'deploying', context: 'opsgate/refs/heads/main', target_url: `${PUBLIC_URL}/ops/deploys/${id}` },
        { state: 'success', description: 'deployed', context: 'opsgate/refs/heads/main', target_url: `${PUBLIC_URL}/ops/deploys/${id}` },
      ]);
    });
  });

  it('GitLab (its project path encoded), Gitea and Bitbucket: their commit status calls, as each describes them', async () => {
    await withWorker(async () => {
      await push('gitlab', 'group/lab', sha(3));
      await push('gitea', 'team/tea', sha(4));
      const bb = await push('bitbucket', 'work/bucket', sha(5));
      const lab = await statuses('gitlab', ['running', 'success']);
      const tea = await statuses('gitea', ['pending', 'success']);
      const bucket = await statuses('bitbucket', ['INPROGRESS', 'SUCCESSFUL']);
      expect([...lab, ...tea, ...bucket].flatMap((s) => s.problems)).toEqual([]);
      expect(new Set(lab.map((s) => s.path))).toEqual(new Set([`/gitlab/api/v4/projects/group%2Flab/statuses/${sha(3)}`]));
      expect(lab.map((s) => s.body.state)).toEqual(['running', 'success']);
      expect(lab[0]!.body).toMatchObject({ ref: 'main', name: 'opsgate/refs/heads/main' });
      expect(new Set(tea.map((s) => s.path))).toEqual(new Set([`/gitea/api/v1/repos/team/tea/statuses/${sha(4)}`]));
      expect(new Set(bucket.map((s) => s.path))).toEqual(
        new Set([`/bitbucket/2.0/repositories/work/bucket/commit/${sha(5)}/statuses/build`]),
      );
      expect(bucket.at(-1)!.body).toMatchObject({ state: 'SUCCESSFUL', url: `${PUBLIC_URL}/ops/deploys/${bb}`, refname: 'main' });
    });
  });

  it("a CI deploy is told to the project's `sender`", async () => {
    await withWorker(async () => {
      const res = await request(ctx.h.app)
        .post('/ops/deploys')
        .set('X-API-Key', OP_KEY)
        .send({ project: 'group/ci-app', ref: 'refs/heads/main', sha: sha(6) });
      expect(res.status).toBe(202);
      const seen = await statuses('gitea', ['success']);
      expect(seen.flatMap((s) => s.problems)).toEqual([]);
      expect(seen.every((s) => s.path === `/gitea/api/v1/repos/group/ci-app/statuses/${sha(6)}`)).toBe(true);
    });
  });

  it('a failing host (500, then ok) is asked again with backoff, and the deploy does not wait for it', async () => {
    await withWorker(
      async (w) => {
        hosts.fail.gitea = [500, 500];
        const id = await push('gitea', 'team/tea', sha(7));
        const seen = await statuses('gitea', ['success']);
        const ok = seen.filter((s) => s.status < 300);
        expect(seen.flatMap((s) => s.problems)).toEqual([]);
        expect(seen.filter((s) => s.status === 500)).toHaveLength(2);
        expect(ok.at(-1)!.body.state).toBe('success');
        expect(await metricValue(w.metrics, 'opsgate_commit_status_reports_total', { sender: 'gitea', result: 'failed' })).toBe(2);
        // Counted once the worker has the answer (a moment after the host saw the request).
        await waitFor(
          'every report sent counted',
          async () =>
            (await metricValue(w.metrics, 'opsgate_commit_status_reports_total', { sender: 'gitea', result: 'sent' })) === ok.length,
        );
        // The deploy ended while its host still failed: it never waited for its reports.
        const entry = await deployState(id);
        expect(entry.state).toBe('succeeded');
        expect(Date.parse(entry.finished_at!)).toBeLessThan(ok[0]!.at);
        const failures = w.logs.find('could not report the deploy state to its sender');
        expect(failures.length).toBe(2);
        expect(failures[0]).toMatchObject({ sender: 'gitea', deploy: id });
        expect(w.logs.lines.join('\n')).not.toContain(TOKENS.gitea);
      },
      { ...hostEnv(), JOB_BACKOFF_MS: '1500' },
    );
  });

  it('no token for a sender: no request, no job, and the worker says so once at start', async () => {
    await withWorker(
      async (w) => {
        const id = await push('gitea', 'team/tea', sha(8));
        await waitFor('the deploy ended', async () => (await deployState(id)).state === 'succeeded');
        await push('github', 'octo/app', sha(9));
        await statuses('github', ['success']);
        expect(hosts.seen.filter((s) => s.host === 'gitea')).toEqual([]);
        const jobs = await ctx.h.queue.bull.getJobs(['completed', 'failed', 'waiting', 'delayed', 'active']);
        expect(jobs.filter((j) => j.name === JOB.reportStatus && (j.data as { sender: string }).sender === 'gitea')).toEqual([]);
        const off = w.logs.find('deploy states are not reported to this sender');
        expect(off.map((l) => l.sender)).toEqual(['gitea']);
        expect(String(off[0]!.why)).toContain('GITEA_STATUS_BEARER_TOKEN');
      },
      hostEnv(['gitea']),
    );
  });
});

describe('the worker process (node dist/worker/index.js)', () => {
  it('reads its token from a file, uses a rotated one without a restart, says once at start which hosts are told nothing, and never logs a token', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'opsgate-status-proc-'));
    const tokenFile = join(dir, 'github-token');
    writeFileSync(tokenFile, `${TOKENS.github}\n`);
    writeFileSync(join(dir, 'inventory.yaml'), INVENTORY_YAML);
    deployNs.kube.reset();
    hosts.seen.length = 0;
    const first = TOKENS.github!;
    const p = await startWorkerProcess({
      env: {
        REDIS_URL: ctx.srv.url,
        METRICS_PORT: String(await freePort()),
        HOME: dir,
        LOG_LEVEL: 'info',
        OPS_INVENTORY_FILE: join(dir, 'inventory.yaml'),
        KUBECONFIG: deployNs.cluster.kubeconfigPath,
        ROLLOUT_POLL_INTERVAL_MS: '50',
        OPSGATE_PUBLIC_URL: PUBLIC_URL,
        GITHUB_STATUS_API_URL: hosts.url('github'),
        GITHUB_STATUS_BEARER_TOKEN_FILE: tokenFile,
        GITHUB_STATUS_TLS_CA_FILE: hosts.caFile,
      },
    });
    try {
      const off = p.logs().filter((l) => l.msg === 'deploy states are not reported to this sender');
      expect(off.map((l) => l.sender).sort()).toEqual(['bitbucket', 'gitea', 'gitlab']);
      await push('github', 'octo/app', sha(20));
      const seen = await statuses('github', ['success']);
      expect(seen.flatMap((s) => s.problems)).toEqual([]);

      // The Secret rotated as the kubelet does it: a new file in place of the old one.
      const rotated = 'ghp-status-token-rotated-0005';
      writeFileSync(`${tokenFile}.new`, `${rotated}\n${first}\n`);
      renameSync(`${tokenFile}.new`, tokenFile);
      TOKENS.github = rotated;
      hosts.seen.length = 0;
      await push('github', 'octo/app', sha(21));
      const after = await statuses('github', ['success']);
      expect(after.flatMap((s) => s.problems)).toEqual([]);
      expect(p.exited).toBe(false);
      const out = [...p.lines, ...p.stderr].join('\n');
      expect(out).not.toContain(first);
      expect(out).not.toContain(rotated);
      expect(p.logs().filter((l) => l.msg === 'deploy states are not reported to this sender')).toHaveLength(3);
    } finally {
      TOKENS.github = first;
      await p.stop();
    }
  });
});
