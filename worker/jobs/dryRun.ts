import {
  AppsV1Api,
  AuthenticationV1Api,
  BatchV1Api,
  PatchStrategy,
  setHeaderOptions,
  type KubeConfig,
  type V1Deployment,
} from '@kubernetes/client-node';
import { UnrecoverableError } from 'bullmq';
import { kindOf, type DryRunAsk } from '../../src/changes/kinds/index.js';
import { findHost, findProject } from '../../src/shared/inventory.js';
import type { DryRunData, DryRunResult } from '../../src/shared/jobs.js';
import type { JobContext } from '../context.js';
import { apiStatus, k8sFailure, resolveKubeConfig, rfc3339 } from '../k8s.js';
import { deployJobOf } from './deploy.js';
import { RESTARTED_AT_ANNOTATION, rolloutState } from './restart.js';

/**
 * dry_run: the change sent exactly as its real job sends it, with dryRun=All, from the worker's own
 * identity: the API server authenticates, authorises (RBAC) and admits it and persists nothing. A
 * refusal is an answer (admitted: false, refused_by, the API server's message) and the job
 * completes with it; only what leaves no answer (no cluster configuration, no API server) fails.
 */
type Verdict = Pick<DryRunResult, 'admitted' | 'refused_by' | 'status' | 'message'>;

function refusal(err: unknown): Verdict {
  const status = apiStatus(err);
  if (status === undefined) throw err;
  const message = messageOf(err);
  let by: DryRunResult['refused_by'] = 'api';
  // A policy's refusal is 403 or 422 (its validation's reason: Forbidden, Invalid...), a webhook's
  // whatever it answers: the API server's message names it.
  if (status < 500 && /ValidatingAdmissionPolicy|admission webhook|denied (the )?request/i.test(message)) by = 'admission';
  else if (status === 403) by = 'rbac';
  else if (status === 404) by = 'not_found';
  else if (status === 422 || status === 400) by = 'invalid';
  else if (status >= 500 || status === 429) throw err;
  return { admitted: false, refused_by: by, status, message };
}

function messageOf(err: unknown): string {
  const body = (err as { body?: unknown }).body;
  let parsed: unknown = body;
  if (typeof body === 'string') {
    try {
      parsed = JSON.parse(body);
    } catch {
      return body.slice(0, 500);
    }
  }
  const m = (parsed as { message?: unknown } | undefined)?.message;
  return typeof m === 'string' ? m.slice(0, 1000) : '';
}

/** The API server's verdict on a request sent with dryRun=All; no answer is a k8sFailure. */
async function verdictOf(send: () => Promise<unknown>, status: number, what: string, verb: string): Promise<Verdict> {
  try {
    await send();
    return { admitted: true, refused_by: null, status, message: null };
  } catch (err) {
    try {
      return refusal(err);
    } catch {
      throw k8sFailure(err, what, verb);
    }
  }
}

/** The worker's user name as the API server sees it; null when it may not ask (older clusters, RBAC). */
async function whoAmI(kc: KubeConfig): Promise<string | null> {
  try {
    const review = await kc.makeApiClient(AuthenticationV1Api).createSelfSubjectReview({
      body: { apiVersion: 'authentication.k8s.io/v1', kind: 'SelfSubjectReview' },
    });
    return review.status?.userInfo?.username ?? null;
  } catch {
    return null;
  }
}

function deploymentView(d: V1Deployment | undefined, namespace: string, name: string, found: boolean | null): DryRunResult['object'] {
  const rollout = d ? rolloutState(d) : undefined;
  return {
    kind: 'Deployment',
    namespace,
    name,
    found,
    resource_version: d?.metadata?.resourceVersion ?? null,
    replicas: d ? (d.spec?.replicas ?? 1) : null,
    ready_replicas: d ? (d.status?.readyReplicas ?? 0) : null,
    updated_replicas: d ? (d.status?.updatedReplicas ?? 0) : null,
    paused: d ? Boolean(d.spec?.paused) : null,
    progress_deadline_seconds: d ? (d.spec?.progressDeadlineSeconds ?? 600) : null,
    rollout: rollout ? { done: rollout.done, failed: Boolean(rollout.failed), message: rollout.message } : null,
    service_account: null,
    image: null,
  };
}

/** A restart's rehearsal: the Deployment's patch, sent with dryRun=All from the worker's identity. */
async function dryRunRestart(data: Extract<DryRunData, { change: 'restart' }>, ctx: JobContext): Promise<DryRunResult> {
  const entry = findHost(ctx.inventory, data.host);
  if (!entry || !entry.deployments.includes(data.service)) {
    throw new UnrecoverableError(`${data.host}/${data.service} is not a Deployment of the worker's inventory`);
  }
  const { namespace } = entry;
  const name = data.service;
  const kc = await resolveKubeConfig(ctx.kubeConfig);
  const apps = kc.makeApiClient(AppsV1Api);
  const identity = await whoAmI(kc);
  let current: V1Deployment | undefined;
  let found: boolean | null = null;
  try {
    current = await apps.readNamespacedDeployment({ name, namespace });
    found = true;
  } catch (err) {
    const status = apiStatus(err);
    if (status === 404) found = false;
    else if (status !== 403) throw k8sFailure(err, `Deployment ${namespace}/${name}`, 'read');
  }
  const patch = { spec: { template: { metadata: { annotations: { [RESTARTED_AT_ANNOTATION]: rfc3339(new Date()) } } } } };
  const verdict = await verdictOf(
    () =>
      apps.patchNamespacedDeployment(
        { name, namespace, dryRun: 'All', fieldManager: 'opsgate', body: patch },
        setHeaderOptions('Content-Type', PatchStrategy.StrategicMergePatch),
      ),
    200,
    `Deployment ${namespace}/${name}`,
    'dry-run patch',
  );
  ctx.logger.info('dry run', {
    change: 'restart',
    namespace,
    deployment: name,
    admitted: verdict.admitted,
    refused_by: verdict.refused_by,
  });
  return { identity, object: deploymentView(current, namespace, name, found), ...verdict };
}

/** A deploy's rehearsal: the deploy Job's create, sent with dryRun=All from the worker's identity. */
async function dryRunDeploy(data: Extract<DryRunData, { change: 'deploy' }>, ctx: JobContext): Promise<DryRunResult> {
  const entry = findProject(ctx.inventory, data.project);
  if (!entry) throw new UnrecoverableError(`project ${JSON.stringify(data.project)} is not in the worker's inventory`);
  const kc = await resolveKubeConfig(ctx.kubeConfig);
  const identity = await whoAmI(kc);
  const { name, body } = deployJobOf(data, String(ctx.job.id), entry);
  const verdict: Verdict = entry.refs.includes(data.ref)
    ? await verdictOf(
        () =>
          kc.makeApiClient(BatchV1Api).createNamespacedJob({ namespace: entry.namespace, body, dryRun: 'All', fieldManager: 'opsgate' }),
        201,
        `Job ${entry.namespace}/${name}`,
        'dry-run create',
      )
    : {
        admitted: false,
        refused_by: 'invalid',
        status: null,
        message: `ref ${data.ref} is not allowed for project ${data.project} (inventory)`,
      };
  ctx.logger.info('dry run', { change: 'deploy', namespace: entry.namespace, admitted: verdict.admitted, refused_by: verdict.refused_by });
  return {
    identity,
    object: {
      kind: 'Job',
      namespace: entry.namespace,
      name,
      found: null,
      resource_version: null,
      replicas: null,
      ready_replicas: null,
      updated_replicas: null,
      paused: null,
      progress_deadline_seconds: null,
      rollout: null,
      service_account: entry.serviceAccountName,
      image: entry.image,
    },
    ...verdict,
  };
}

/**
 * Each kind of change's rehearsal (src/changes/kinds/: its dry run names the `change` it asks for),
 * by the kind's name: the catalog's here, a registered kind's its own (its `dryRun.rehearsal`).
 */
const REHEARSALS: { [K in DryRunData['change']]: (data: Extract<DryRunData, { change: K }>, ctx: JobContext) => Promise<DryRunResult> } = {
  restart: dryRunRestart,
  deploy: dryRunDeploy,
};

export async function dryRun(data: DryRunData | DryRunAsk, ctx: JobContext): Promise<DryRunResult> {
  if (Object.hasOwn(REHEARSALS, data.change)) {
    const rehearse = REHEARSALS[data.change as DryRunData['change']] as (
      data: DryRunData | DryRunAsk,
      ctx: JobContext,
    ) => Promise<DryRunResult>;
    return rehearse(data, ctx);
  }
  const own = kindOf(data.change).dryRun.rehearsal;
  if (!own) throw new UnrecoverableError(`a dry run of ${data.change} has no rehearsal`);
  return own.rehearse(data as never, ctx as never);
}
