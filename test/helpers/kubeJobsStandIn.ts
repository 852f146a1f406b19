import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { KubeConfig } from '@kubernetes/client-node';

/**
 * A local stand-in for the few calls of the Kubernetes API a deploy makes (create a batch/v1 Job,
 * read it, post an Event), for integration tests of the worker's deploy ordering and history
 * without a cluster; a real kube-apiserver and kubelet run them in test/e2e. Each Job completes
 * `runMs` after it was created (seen at the first read past that), and every Job is recorded with
 * its commit and queue job, so a test sees which deploys ran, in what order, and how many at once.
 */
export interface StandInJob {
  name: string;
  sha: string;
  queueJobId: string;
  created: number;
  completed?: number;
}

export interface KubeJobsStandIn {
  kc: KubeConfig;
  /** The Jobs created since the last reset, in order of creation. */
  readonly jobs: StandInJob[];
  /** The most Jobs ever running at once since the last reset. */
  readonly mostAtOnce: number;
  /** The answer to a create of this commit's Job instead of creating it (an error status), if any. */
  refuse?: (sha: string) => { status: number; message: string } | undefined;
  reset(): void;
  close(): Promise<void>;
}

function reply(res: ServerResponse, status: number, body: unknown) {
  res.writeHead(status, { 'Content-Type': 'application/json' });
  res.end(JSON.stringify(body));
}

export async function startKubeJobsStandIn(namespace: string, runMs: number): Promise<KubeJobsStandIn> {
  let jobs: StandInJob[] = [];
  let mostAtOnce = 0;
  const jobsPath = `/apis/batch/v1/namespaces/${namespace}/jobs`;

  async function handle(req: IncomingMessage, res: ServerResponse) {
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    const url = new URL(req.url ?? '/', 'http://x');
    const now = Date.now();
    if (req.method === 'POST' && url.pathname === jobsPath) {
      const body = JSON.parse(Buffer.concat(chunks).toString('utf8')) as {
        metadata: { name: string; annotations?: Record<string, string> };
      };
      const sha = body.metadata.annotations?.['opsgate.io/commit-sha'] ?? '';
      const refused = standIn.refuse?.(sha);
      if (refused) return reply(res, refused.status, { kind: 'Status', code: refused.status, message: refused.message });
      if (jobs.some((j) => j.name === body.metadata.name)) return reply(res, 409, { kind: 'Status', code: 409, reason: 'AlreadyExists' });
      const queueJobId = body.metadata.annotations?.['opsgate.io/queue-job-id'] ?? '';
      jobs.push({ name: body.metadata.name, sha, queueJobId, created: now });
      mostAtOnce = Math.max(mostAtOnce, jobs.filter((j) => j.completed === undefined).length);
      return reply(res, 201, { ...body, metadata: { ...body.metadata, uid: `uid-${body.metadata.name}` } });
    }
    const read = url.pathname.startsWith(`${jobsPath}/`) ? url.pathname.slice(jobsPath.length + 1) : undefined;
    if (req.method === 'GET' && read && !read.includes('/')) {
      const j = jobs.find((x) => x.name === read);
      if (!j) return reply(res, 404, { kind: 'Status', code: 404 });
      if (j.completed === undefined && now - j.created >= runMs) j.completed = now;
      const conditions = j.completed !== undefined ? [{ type: 'Complete', status: 'True' }] : [];
      return reply(res, 200, {
        apiVersion: 'batch/v1',
        kind: 'Job',
        metadata: { name: j.name, uid: `uid-${j.name}` },
        status: { conditions },
      });
    }
    if (req.method === 'POST' && url.pathname.endsWith('/events')) return reply(res, 201, {});
    return reply(res, 404, { kind: 'Status', code: 404 });
  }

  const server = createServer((req, res) => void handle(req, res));
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  const kc = new KubeConfig();
  kc.loadFromOptions({
    clusters: [{ name: 'local', server: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, skipTLSVerify: true }],
    users: [{ name: 'u', token: 'test-token' }],
    contexts: [{ name: 'ctx', cluster: 'local', user: 'u' }],
    currentContext: 'ctx',
  });
  const standIn: KubeJobsStandIn = {
    kc,
    get jobs() {
      return jobs;
    },
    get mostAtOnce() {
      return mostAtOnce;
    },
    reset() {
      jobs = [];
      mostAtOnce = 0;
    },
    close: () => new Promise<void>((r) => server.close(() => r())),
  };
  return standIn;
}
