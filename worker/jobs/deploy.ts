import { BatchV1Api, type V1EnvVar, type V1Job } from '@kubernetes/client-node';
import { UnrecoverableError } from 'bullmq';
import { sha256Hex } from '../../src/shared/crypto.js';
import { findProject, type ProjectEntry } from '../../src/shared/inventory.js';
import type { RunDeployPipelineData } from '../../src/shared/jobs.js';
import type { JobContext } from '../context.js';
import { describeRequester, recordEvent, type EventReason } from '../events.js';
import { apiStatus, k8sFailure, resolveKubeConfig, sleep } from '../k8s.js';
import { ChangeFailedError, isFinal } from '../report.js';
import { cancelledBy } from '../../src/changes/deployOrder/cancel.js';

/**
 * run_deploy_pipeline(project, ref): a Kubernetes batch/v1 Job from the project's inventory
 * template (docs/deploys.md). The request only chooses which allowed project and ref run: image,
 * command and ServiceAccount come from the inventory; project, ref and commit reach the container
 * only as environment variables, never interpolated into a command line. The Job's name derives
 * from the queue job id, so a retried attempt finds its own Job (409) instead of deploying twice.
 * With waitForCompletion the job waits for the Job's end; with cancel_in_progress a newer deploy
 * of its group may cancel it (worker/deployCancel.ts), and it deletes its Job.
 */
const RESERVED_ENV = ['OPSGATE_PROJECT', 'OPSGATE_REF', 'OPSGATE_AUDIT_ID', 'OPSGATE_COMMIT_SHA', 'OPSGATE_ROLLBACK'];

/** Deterministic, DNS-1123 Job name (<= 63 chars so the pods' job-name label stays valid). */
export function deployJobName(queueJobId: string, auditId: string, project: string): string {
  const slug = project
    .toLowerCase()
    .replace(/[^a-z0-9]+/g, '-')
    .replace(/^-+|-+$/g, '')
    .slice(0, 24)
    .replace(/-+$/g, '');
  const hash = sha256Hex(`${queueJobId}\n${auditId}`).slice(0, 12);
  return slug ? `opsgate-deploy-${slug}-${hash}` : `opsgate-deploy-${hash}`;
}

/** A Kubernetes label value (<= 63 chars of [A-Za-z0-9._-], alphanumeric at both ends). */
export function labelValue(v: string): string {
  return v
    .replace(/[^A-Za-z0-9._-]+/g, '-')
    .slice(0, 63)
    .replace(/^[^A-Za-z0-9]+|[^A-Za-z0-9]+$/g, '');
}

/**
 * The commit a deploy Job may be given: a letter or digit, then letters, digits, `.`, `_`, `-`.
 * A commit id, tag or build id passes; an option (`--orphan=x`), a revision expression (`HEAD~3`)
 * or spaces and quotes never reach a deploy script, whoever queued it and however it calls git.
 */
const SAFE_COMMIT = /^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$/;

/** Refuses (UnrecoverableError: dead-lettered at once) a commit that is not of SAFE_COMMIT's form. */
export function checkCommit(sha: string): string {
  if (SAFE_COMMIT.test(sha)) return sha;
  const shown = JSON.stringify(sha.length > 80 ? `${sha.slice(0, 80)}…` : sha);
  throw new UnrecoverableError(
    `commit ${shown} is not a safe commit name for the deploy Job: it must start with a letter or digit and hold only letters, digits, ".", "_" and "-" (at most 255 characters)`,
  );
}

export interface DeployJobInput {
  name: string;
  project: string;
  ref: string;
  auditId: string;
  requestedBy: string;
  queueJobId: string;
  eventId?: string;
  /** The pushed commit: the Job deploys exactly it (OPSGATE_COMMIT_SHA), so a replayed event cannot deploy another one. */
  sha?: string;
  /** A rollback (POST /ops/deploys/rollback): the Job is told so (OPSGATE_ROLLBACK=true), beside the commit it goes back to. */
  rollback?: boolean;
  entry: ProjectEntry;
}

/** A queue job's deploy Job, its name and its object: what the deploy creates and its dry run rehearses. */
export function deployJobOf(
  data: Pick<RunDeployPipelineData, 'project' | 'ref' | 'audit_id' | 'requested_by' | 'sha' | 'event_id' | 'rollback'>,
  queueJobId: string,
  entry: ProjectEntry,
): { name: string; body: V1Job } {
  const name = deployJobName(queueJobId, data.audit_id, data.project);
  const { project, ref, audit_id: auditId, requested_by: requestedBy, sha, event_id: eventId } = data;
  const rollback = data.rollback === true;
  return { name, body: buildDeployJob({ name, project, ref, auditId, requestedBy, queueJobId, eventId, sha, rollback, entry }) };
}

/** The deploy Job's object; throws checkCommit's UnrecoverableError for a commit of another form. */
export function buildDeployJob(i: DeployJobInput): V1Job {
  if (i.sha !== undefined) checkCommit(i.sha);
  const labels = {
    'app.kubernetes.io/name': 'opsgate-deploy',
    'app.kubernetes.io/managed-by': 'opsgate',
    'opsgate.io/audit-id': labelValue(i.auditId) || 'none',
  };
  const env: V1EnvVar[] = [
    ...Object.entries(i.entry.env)
      .filter(([k]) => !RESERVED_ENV.includes(k))
      .map(([name, value]) => ({ name, value })),
    { name: 'OPSGATE_PROJECT', value: i.project },
    { name: 'OPSGATE_REF', value: i.ref },
    { name: 'OPSGATE_AUDIT_ID', value: i.auditId },
    ...(i.sha ? [{ name: 'OPSGATE_COMMIT_SHA', value: i.sha }] : []),
    ...(i.rollback ? [{ name: 'OPSGATE_ROLLBACK', value: 'true' }] : []),
    // Writable scratch space on a read-only root filesystem.
    { name: 'TMPDIR', value: '/tmp' },
  ];
  const hardened = { runAsNonRoot: true, seccompProfile: { type: 'RuntimeDefault' } };
  return {
    apiVersion: 'batch/v1',
    kind: 'Job',
    metadata: {
      name: i.name,
      namespace: i.entry.namespace,
      labels,
      annotations: {
        'opsgate.io/project': i.project,
        'opsgate.io/ref': i.ref,
        'opsgate.io/requested-by': i.requestedBy,
        'opsgate.io/queue-job-id': i.queueJobId,
        ...(i.eventId ? { 'opsgate.io/event-id': i.eventId } : {}),
        ...(i.sha ? { 'opsgate.io/commit-sha': i.sha } : {}),
      },
    },
    spec: {
      activeDeadlineSeconds: Math.min(i.entry.activeDeadlineSeconds, 900),
      backoffLimit: i.entry.backoffLimit,
      ttlSecondsAfterFinished: i.entry.ttlSecondsAfterFinished,
      template: {
        metadata: { labels },
        spec: {
          restartPolicy: 'Never',
          serviceAccountName: i.entry.serviceAccountName,
          automountServiceAccountToken: false,
          enableServiceLinks: false,
          securityContext: hardened,
          containers: [
            {
              name: 'deploy',
              image: i.entry.image,
              ...(i.entry.command ? { command: [...i.entry.command] } : {}),
              ...(i.entry.args ? { args: [...i.entry.args] } : {}),
              env,
              securityContext: {
                ...hardened,
                allowPrivilegeEscalation: false,
                readOnlyRootFilesystem: true,
                privileged: false,
                capabilities: { drop: ['ALL'] },
              },
              volumeMounts: [{ name: 'tmp', mountPath: '/tmp' }],
            },
          ],
          volumes: [{ name: 'tmp', emptyDir: { sizeLimit: '256Mi' } }],
        },
      },
    },
  };
}

/** Deletes a deploy Job with its pods (foreground: the Job stays, being deleted, until they are gone). */
export async function deleteDeployJob(batch: BatchV1Api, namespace: string, name: string): Promise<'deleting' | 'gone'> {
  try {
    await batch.deleteNamespacedJob({ name, namespace, propagationPolicy: 'Foreground' });
    return 'deleting';
  } catch (err) {
    if (apiStatus(err) === 404) return 'gone';
    throw k8sFailure(err, `Job ${namespace}/${name}`, 'delete');
  }
}

/**
 * The Job's end: only Complete and Failed count, set once every pod has terminated.
 * SuccessCriteriaMet and FailureTarget come while pods may still run (past activeDeadlineSeconds,
 * through the grace period), and the group's next deploy Job must never run beside them.
 */
export function jobEnd(j: V1Job): { done: false } | { done: true; succeeded: boolean; message: string } {
  for (const c of j.status?.conditions ?? []) {
    if (c.status !== 'True') continue;
    if (c.type === 'Complete') return { done: true, succeeded: true, message: 'completed' };
    if (c.type === 'Failed') {
      return { done: true, succeeded: false, message: [c.reason, c.message].filter(Boolean).join(': ') || 'failed' };
    }
  }
  return { done: false };
}

export async function runDeployPipeline(
  data: RunDeployPipelineData,
  ctx: JobContext,
): Promise<{
  namespace: string;
  job: string;
  created: boolean;
  outcome: { result: 'rolled_out' | 'created' | 'cancelled'; reason?: string };
  cancelled_by?: string;
}> {
  const entry = findProject(ctx.inventory, data.project);
  if (!entry) throw new UnrecoverableError(`project ${JSON.stringify(data.project)} is not in the inventory`);
  if (!entry.refs.includes(data.ref)) {
    throw new UnrecoverableError(`ref ${JSON.stringify(data.ref)} is not allowed for project ${JSON.stringify(data.project)}`);
  }
  const queueJobId = String(ctx.job.id);
  const { name, body } = deployJobOf(data, queueJobId, entry);
  const { namespace } = entry;
  const what = `Job ${namespace}/${name}`;
  const kc = await resolveKubeConfig(ctx.kubeConfig);
  const batch = kc.makeApiClient(BatchV1Api);
  // cancel_in_progress: whether a newer deploy of the group cancelled this one (read only for such a project).
  const cancelBy = async () => (entry.cancel_in_progress && entry.waitForCompletion ? cancelledBy(ctx.redis, queueJobId) : undefined);
  const cancelledBefore = await cancelBy();
  let created = cancelledBefore === undefined;
  let uid: string | undefined;
  if (created) {
    try {
      uid = (await batch.createNamespacedJob({ namespace, body, fieldManager: 'opsgate' })).metadata?.uid;
    } catch (err) {
      if (apiStatus(err) !== 409) throw k8sFailure(err, what, 'create');
      created = false; // an earlier attempt of this same queue job created it
    }
  }
  const logged = created
    ? 'deploy job created'
    : cancelledBefore
      ? 'deploy cancelled before its job was created'
      : 'deploy job already exists (created by an earlier attempt)';
  ctx.logger.info(logged, { project: data.project, ref: data.ref, namespace, k8s_job: name, service_account: entry.serviceAccountName });
  const event = (reason: EventReason, detail: string) =>
    recordEvent(
      kc,
      {
        namespace,
        regarding: { apiVersion: 'batch/v1', kind: 'Job', name, namespace, ...(uid ? { uid } : {}) },
        reason,
        action: reason === 'OpsgateDeploy' ? 'Create' : reason === 'OpsgateDeployed' ? 'Complete' : 'Fail',
        type: reason === 'OpsgateDeployFailed' ? 'Warning' : 'Normal',
        queueJobId,
        auditId: data.audit_id,
        requestedBy: describeRequester(data),
        ...(data.approvers ? { approvers: data.approvers } : {}),
        detail,
      },
      ctx.logger,
    );
  if (!cancelledBefore) {
    await event('OpsgateDeploy', `${data.project} ${data.ref}`);
    await ctx.job.updateProgress({ phase: 'created', namespace, k8s_job: name });
  }
  if (!entry.waitForCompletion) return { namespace, job: name, created, outcome: { result: 'created' } };

  const started = Date.now();
  const deadline = started + (entry.activeDeadlineSeconds + 60) * 1000;
  const cancelled = async (by: string, gone: boolean) => {
    const reason = `cancelled by deploy ${by}, accepted after it (cancel_in_progress): ${what} deleted${gone ? '' : ', still being deleted'}`;
    await ctx.job.updateProgress({ phase: 'done', namespace, k8s_job: name, message: reason });
    return { namespace, job: name, created, outcome: { result: 'cancelled' as const, reason }, cancelled_by: by };
  };
  try {
    for (;;) {
      let j: V1Job;
      try {
        j = await batch.readNamespacedJob({ name, namespace });
      } catch (err) {
        const by = apiStatus(err) === 404 ? await cancelBy() : undefined;
        if (by !== undefined) return await cancelled(by, true);
        if (apiStatus(err) === 403) {
          const reason = `the worker may not read Jobs in ${namespace} (RBAC): created, not waited for`;
          ctx.logger.warn(reason, { k8s_job: name });
          return { namespace, job: name, created, outcome: { result: 'created', reason } };
        }
        throw k8sFailure(err, what, 'read');
      }
      uid ??= j.metadata?.uid;
      const end = jobEnd(j);
      if (end.done) {
        const seconds = Math.round((Date.now() - started) / 100) / 10;
        if (!end.succeeded) throw new ChangeFailedError(`${what} failed: ${end.message}`, 'failed');
        await ctx.job.updateProgress({ phase: 'done', namespace, k8s_job: name, message: 'deploy Job completed' });
        await event('OpsgateDeployed', `completed in ${seconds} s`);
        return { namespace, job: name, created, outcome: { result: 'rolled_out' } };
      }
      // Cancelled: its Job goes (again, should the newer deploy have found none), and it ends once the Job is gone.
      const by = await cancelBy();
      if (by !== undefined && !j.metadata?.deletionTimestamp && (await deleteDeployJob(batch, namespace, name)) === 'gone') {
        return await cancelled(by, true);
      }
      if (Date.now() + ctx.config.ROLLOUT_POLL_INTERVAL_MS > deadline) {
        if (by !== undefined) return await cancelled(by, false);
        throw new ChangeFailedError(
          `${what} did not finish within its activeDeadlineSeconds (${entry.activeDeadlineSeconds}) and a minute`,
          'failed',
        );
      }
      await sleep(ctx.config.ROLLOUT_POLL_INTERVAL_MS, ctx.signal);
    }
  } catch (err) {
    if (isFinal(err, ctx)) await event('OpsgateDeployFailed', (err as Error).message);
    throw err;
  }
}
