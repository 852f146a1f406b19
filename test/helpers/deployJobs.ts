import { mkdtempSync, rmSync } from 'node:fs';
import { createServer, type Server } from 'node:https';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll } from '@jest/globals';
import * as k8s from '@kubernetes/client-node';
import { makeCa, makeLeaf } from './certs.js';
import { useCluster } from './cluster.js';
import { adminKubeConfig, createNamespaces, deleteNamespaces } from './controlPlaneFixtures.js';
import { waitFor } from './waitFor.js';

/**
 * The deploy Jobs of one namespace on a real control plane (test/helpers/cluster.ts: no kubelet,
 * so no pod ever runs). The real Job controller creates each Job's pod; this ends the pod by
 * writing its status subresource, `runMs` after the Job appeared: Succeeded, or Failed for a
 * commit `fail` names, and the Job controller then completes or fails the Job.
 *
 * What ran is read from the apiserver's watch of the namespace's Jobs, whose events come in the
 * order the apiserver wrote them: each Job's creation and the first condition that ends it
 * (SuccessCriteriaMet or Complete, FailureTarget or Failed, the conditions the worker waits for).
 * `created` and `ended` are positions in that sequence of events, not clock times, so "this Job
 * ended before that one was created" is the apiserver's own order.
 */
export interface RanJob {
  name: string;
  sha: string;
  queueJobId: string;
  created: number;
  ended?: number;
  succeeded?: boolean;
}

export interface DeployJobs {
  /** The Jobs created since the last reset, in the order the apiserver created them. */
  readonly jobs: RanJob[];
  /** The most Jobs of the namespace not yet ended at any one point of that order, since the last reset. */
  readonly mostAtOnce: number;
  /** Whether the pod of this commit's Job fails (default: none). */
  fail: (sha: string) => boolean;
  reset(): void;
  close(): Promise<void>;
}

const ENDS: Record<string, boolean> = { SuccessCriteriaMet: true, Complete: true, FailureTarget: false, Failed: false };

function endOf(job: k8s.V1Job): boolean | undefined {
  for (const c of job.status?.conditions ?? []) if (c.status === 'True' && Object.hasOwn(ENDS, c.type)) return ENDS[c.type];
  return undefined;
}

export async function runDeployJobs(kc: k8s.KubeConfig, namespace: string, runMs: number): Promise<DeployJobs> {
  const core = kc.makeApiClient(k8s.CoreV1Api);
  let jobs: RanJob[] = [];
  let mostAtOnce = 0;
  let seq = 0;
  let closed = false;
  let abort: AbortController | undefined;
  const timers = new Set<NodeJS.Timeout>();

  const later = (ms: number, fn: () => Promise<void>) => {
    const t = setTimeout(() => {
      timers.delete(t);
      if (!closed) void fn();
    }, ms);
    timers.add(t);
  };

  /** Ends the Job's pod(s) as a kubelet would report a container that exited (0, or 1 for a failing commit). */
  const endPods = async (name: string, sha: string, tries = 0): Promise<void> => {
    const pods = await core.listNamespacedPod({ namespace, labelSelector: `batch.kubernetes.io/job-name=${name}` }).catch(() => undefined);
    const pending = pods?.items.filter((p) => p.status?.phase !== 'Succeeded' && p.status?.phase !== 'Failed') ?? [];
    if (!pending.length) {
      // The Job controller has not created the pod yet.
      if (tries < 100) later(100, () => endPods(name, sha, tries + 1));
      return;
    }
    const failed = runner.fail(sha);
    const now = new Date();
    for (const p of pending) {
      const body = {
        status: {
          phase: failed ? 'Failed' : 'Succeeded',
          containerStatuses: (p.spec?.containers ?? []).map((c) => ({
            name: c.name,
            image: c.image ?? '',
            imageID: '',
            ready: false,
            restartCount: 0,
            state: { terminated: { exitCode: failed ? 1 : 0, reason: failed ? 'Error' : 'Completed', startedAt: now, finishedAt: now } },
          })),
        },
      };
      await core
        .patchNamespacedPodStatus(
          { name: p.metadata!.name!, namespace, body },
          k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.MergePatch),
        )
        .catch(() => later(100, () => endPods(name, sha, tries + 1)));
    }
  };

  const onEvent = (type: string, job: k8s.V1Job) => {
    const name = job.metadata?.name ?? '';
    const at = ++seq;
    const known = jobs.find((j) => j.name === name);
    if (type === 'ADDED' && !known) {
      // A watch (re)started lists what exists: a Job that has already ended is not a new one.
      if (endOf(job) !== undefined) return;
      const annotations = job.metadata?.annotations ?? {};
      const sha = annotations['opsgate.io/commit-sha'] ?? '';
      jobs.push({ name, sha, queueJobId: annotations['opsgate.io/queue-job-id'] ?? '', created: at });
      mostAtOnce = Math.max(mostAtOnce, jobs.filter((j) => j.ended === undefined).length);
      later(runMs, () => endPods(name, sha));
      return;
    }
    const end = endOf(job);
    if (known && known.ended === undefined && end !== undefined) Object.assign(known, { ended: at, succeeded: end });
  };

  let resourceVersion: string | undefined;
  const watch = new k8s.Watch(kc);
  const start = async (): Promise<void> => {
    if (closed) return;
    abort = await watch.watch(
      `/apis/batch/v1/namespaces/${namespace}/jobs`,
      { allowWatchBookmarks: true, ...(resourceVersion ? { resourceVersion } : {}) },
      (type, obj: k8s.V1Job) => {
        // An ERROR (such as 410 Gone, the version too old to go on from): start again from a list,
        // whose ADDED events of Jobs already known only say whether they ended.
        if (type === 'ERROR') resourceVersion = undefined;
        else if (obj?.metadata?.resourceVersion) resourceVersion = obj.metadata.resourceVersion;
        if (type === 'ADDED' || type === 'MODIFIED') onEvent(type, obj);
      },
      // The apiserver ends a watch after a while: go on from the last event seen.
      () => later(100, start),
    );
  };
  // The watch starts from now: Jobs of earlier tests in the namespace are not this run's.
  const list = await kc.makeApiClient(k8s.BatchV1Api).listNamespacedJob({ namespace });
  resourceVersion = list.metadata?.resourceVersion;
  await start();

  const runner: DeployJobs = {
    get jobs() {
      return jobs;
    },
    get mostAtOnce() {
      return mostAtOnce;
    },
    fail: () => false,
    reset() {
      jobs = [];
      mostAtOnce = 0;
    },
    async close() {
      closed = true;
      for (const t of timers) clearTimeout(t);
      abort?.abort();
    },
  };
  return runner;
}

/**
 * A ValidatingWebhookConfiguration on the creation of Jobs in `namespace`, served by a local HTTPS
 * server (a test CA, 127.0.0.1) whose answer `refuse` chooses from the Job's commit: a denial with
 * an HTTP status code, which the apiserver returns to its client as the answer to the create, or
 * admission. Ready once the apiserver calls it (a dry-run create of `probeSha` refused).
 */
export interface RefusingWebhook {
  /** The answers given, in order: commit and the status code of a refusal (undefined when admitted). */
  readonly answers: Array<{ sha: string; dryRun: boolean; code?: number }>;
  close(): Promise<void>;
}

export async function startRefusingWebhook(
  kc: k8s.KubeConfig,
  namespace: string,
  refuse: (sha: string) => { code: number; message: string } | undefined,
): Promise<RefusingWebhook> {
  const dir = mkdtempSync(join(tmpdir(), 'opsgate-webhook-'));
  const ca = makeCa(dir, 'webhook-ca');
  const leaf = makeLeaf(dir, ca, 'webhook');
  const answers: RefusingWebhook['answers'] = [];
  const probeSha = 'webhook-probe';
  const server: Server = createServer({ cert: leaf.cert, key: leaf.key }, (req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const review = JSON.parse(Buffer.concat(chunks).toString('utf8')) as {
        request: { uid: string; dryRun?: boolean; object?: k8s.V1Job };
      };
      const sha = review.request.object?.metadata?.annotations?.['opsgate.io/commit-sha'] ?? '';
      const refused = sha === probeSha ? { code: 503, message: 'probe' } : refuse(sha);
      answers.push({ sha, dryRun: review.request.dryRun === true, ...(refused ? { code: refused.code } : {}) });
      res.writeHead(200, { 'Content-Type': 'application/json' });
      res.end(
        JSON.stringify({
          apiVersion: 'admission.k8s.io/v1',
          kind: 'AdmissionReview',
          response: {
            uid: review.request.uid,
            allowed: !refused,
            ...(refused ? { status: { code: refused.code, message: refused.message } } : {}),
          },
        }),
      );
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  const port = (server.address() as AddressInfo).port;
  const name = `${namespace}-refuse-jobs`;
  const admission = kc.makeApiClient(k8s.AdmissionregistrationV1Api);
  await admission.createValidatingWebhookConfiguration({
    body: {
      metadata: { name },
      webhooks: [
        {
          name: 'refuse-jobs.opsgate.test',
          admissionReviewVersions: ['v1'],
          sideEffects: 'None',
          failurePolicy: 'Fail',
          timeoutSeconds: 10,
          clientConfig: { url: `https://127.0.0.1:${port}/validate`, caBundle: Buffer.from(ca.cert).toString('base64') },
          rules: [{ apiGroups: ['batch'], apiVersions: ['v1'], operations: ['CREATE'], resources: ['jobs'] }],
          namespaceSelector: { matchLabels: { 'kubernetes.io/metadata.name': namespace } },
        },
      ],
    },
  });
  // The apiserver picks a new configuration up asynchronously.
  const batch = kc.makeApiClient(k8s.BatchV1Api);
  await waitFor(
    'the webhook called by the apiserver',
    async () => {
      try {
        await batch.createNamespacedJob({
          namespace,
          dryRun: 'All',
          body: {
            metadata: { name: 'webhook-probe', annotations: { 'opsgate.io/commit-sha': probeSha } },
            spec: { template: { spec: { restartPolicy: 'Never', containers: [{ name: 'c', image: 'probe' }] } } },
          },
        });
        return false;
      } catch (err) {
        return (err as { code?: number }).code === 503;
      }
    },
    30_000,
    200,
  );
  answers.splice(0);
  return {
    answers,
    async close() {
      await admission.deleteValidatingWebhookConfiguration({ name }).catch(() => undefined);
      await new Promise<void>((r) => server.close(() => r()));
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** A namespace of the shared control plane for deploy Jobs: its cluster, admin client and Jobs. */
export interface DeployNamespace {
  readonly cluster: Awaited<ReturnType<typeof useCluster>>;
  readonly admin: k8s.KubeConfig;
  readonly kube: DeployJobs;
}

/**
 * A test file's deploy namespace, made before its tests (with the `deployer` ServiceAccount the
 * inventory's deploy Jobs run as, and runDeployJobs ending their pods after `runMs`) and deleted
 * after them. Call it at the top of the file, before hooks that use it.
 */
export function useDeployNamespace(namespace: string, runMs: number): DeployNamespace {
  const made: Partial<{ -readonly [K in keyof DeployNamespace]: DeployNamespace[K] }> = {};
  beforeAll(async () => {
    const cluster = (made.cluster = await useCluster());
    const admin = (made.admin = adminKubeConfig(cluster));
    await createNamespaces(cluster, [namespace]);
    await admin.makeApiClient(k8s.CoreV1Api).createNamespacedServiceAccount({ namespace, body: { metadata: { name: 'deployer' } } });
    made.kube = await runDeployJobs(admin, namespace, runMs);
  }, 240_000); // starts a cluster when run outside make test-k8s
  afterAll(async () => {
    await made.kube?.close();
    if (made.cluster) {
      await deleteNamespaces(made.cluster, [namespace]);
      await made.cluster.release();
    }
  }, 120_000);
  return made as DeployNamespace;
}
