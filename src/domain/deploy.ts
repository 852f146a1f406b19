import type { Redis } from 'ioredis';
import { UnprocessableError } from '../shared/errors.js';
import { JOB, runDeployPipelineData } from '../shared/jobs.js';
import type { Logger } from '../shared/logger.js';
import type { OpsQueue } from '../shared/queue.js';
import { claimAndEnqueue } from './claim.js';
import type { DeferredRateHit } from '../shared/rateLimit.js';
import { deliveryKey, seenKey } from '../shared/keys.js';

/**
 * Deploy webhooks (source control "scm" per the spec, and "github" with the same rules):
 * decide from the payload whether a push deploys, then dedup + enqueue `run_deploy_pipeline`.
 * Plain values in, plain values out: no HTTP here.
 */
export const DEPLOY_REF = 'refs/heads/main';
export const SEEN_EVENT_TTL_SECONDS = 86400;
/**
 * How long a sender's delivery id (X-GitHub-Delivery, X-Gitlab-Event-UUID, Idempotency-Key) is
 * remembered: 30 days, well past the 24 h event window and GitHub's 3-day redelivery limit, so a
 * replayed delivery never deploys again.
 */
export const SEEN_DELIVERY_TTL_SECONDS = 30 * 86400;
/** A delivery id longer than this, or with control characters, is refused (422). */
export const MAX_DELIVERY_ID = 128;

/** The delivery id header, checked; undefined when absent or empty. */
export function deliveryIdOf(value: string | undefined, header: string): string | undefined {
  if (value === undefined || value === '') return undefined;
  if (value.length > MAX_DELIVERY_ID || !/^[\x21-\x7e]+$/.test(value)) {
    throw new UnprocessableError(`${header} must be at most ${MAX_DELIVERY_ID} printable characters`);
  }
  return value;
}

export type PushDecision =
  { kind: 'ignored'; reason: string } | { kind: 'deploy'; project: string; ref: string; sha: string; eventId: string };

export function scmEventId(project: string, ref: string, sha: string): string {
  return `scm:${project}:${ref}:${sha}`;
}

export function githubEventId(project: string, ref: string, sha: string): string {
  return `github:${project}:${ref}:${sha}`;
}

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);

/** Quotes a caller-supplied value for a reason text, bounded in length. */
const quote = (s: string): string => JSON.stringify(s.length > 200 ? s.slice(0, 200) + '…' : s);

function field(obj: Record<string, unknown>, name: string, def: string, label: string): string {
  const v = obj[name];
  if (v === undefined || v === null) return def;
  if (typeof v !== 'string') throw new UnprocessableError(`${label} must be a string`);
  return v;
}

function checkProject(project: string, label: string): string {
  if (project.length > 255) throw new UnprocessableError(`${label} is longer than 255 characters`);
  return project === '' ? 'unknown' : project;
}

/**
 * /webhook/scm rules 3-5 on an already verified and parsed payload:
 * event header not exactly "Push Hook" -> ignored; ref not refs/heads/main -> ignored naming the
 * ref; checkout_sha missing/empty -> 422. Then the event_id `scm:<project>:<ref>:<sha>`.
 */
export function decideScmPush(eventHeader: string | undefined, payload: unknown, headerName = 'X-Scm-Event'): PushDecision {
  if (eventHeader !== 'Push Hook') {
    return { kind: 'ignored', reason: `event ${quote(eventHeader ?? '')} is not a push (${headerName} must be "Push Hook")` };
  }
  if (!isObject(payload)) throw new UnprocessableError('payload must be a JSON object');
  const ref = field(payload, 'ref', '', 'ref');
  if (ref !== DEPLOY_REF) return { kind: 'ignored', reason: `ref ${quote(ref)} is not ${DEPLOY_REF}` };
  const sha = payload.checkout_sha;
  if (sha === undefined || sha === null || sha === '') throw new UnprocessableError('checkout_sha is required');
  if (typeof sha !== 'string') throw new UnprocessableError('checkout_sha must be a string');
  const projectObj = payload.project;
  let project = 'unknown';
  if (isObject(projectObj)) project = field(projectObj, 'path_with_namespace', 'unknown', 'project.path_with_namespace');
  else if (projectObj !== undefined && projectObj !== null) throw new UnprocessableError('project must be an object');
  project = checkProject(project, 'project.path_with_namespace');
  return { kind: 'deploy', project, ref, sha, eventId: scmEventId(project, ref, sha) };
}

/**
 * GitLab's native push hook (POST /webhook/gitlab): the same rules and the same event id as
 * /webhook/scm (a push delivered through both paths during a migration deploys once); only the
 * event header is GitLab's own X-Gitlab-Event.
 */
export function decideGitlabPush(eventHeader: string | undefined, payload: unknown): PushDecision {
  return decideScmPush(eventHeader, payload, 'X-Gitlab-Event');
}

const ZERO_SHA = /^0+$/;

/**
 * The same rules for GitHub: X-GitHub-Event must be "push", ref refs/heads/main, sha from `after`
 * (a branch deletion, `deleted: true` or an all-zero `after`, is ignored: there is nothing to
 * deploy), project from repository.full_name (default "unknown").
 */
export function decideGithubPush(eventHeader: string | undefined, payload: unknown): PushDecision {
  if (eventHeader !== 'push') {
    return { kind: 'ignored', reason: `event ${quote(eventHeader ?? '')} is not a push (X-GitHub-Event must be "push")` };
  }
  if (!isObject(payload)) throw new UnprocessableError('payload must be a JSON object');
  const ref = field(payload, 'ref', '', 'ref');
  if (ref !== DEPLOY_REF) return { kind: 'ignored', reason: `ref ${quote(ref)} is not ${DEPLOY_REF}` };
  const sha = payload.after;
  if (sha === undefined || sha === null || sha === '') throw new UnprocessableError('after (the pushed commit) is required');
  if (typeof sha !== 'string') throw new UnprocessableError('after must be a string');
  if (payload.deleted === true || ZERO_SHA.test(sha)) return { kind: 'ignored', reason: `ref ${quote(ref)} was deleted` };
  const repo = payload.repository;
  let project = 'unknown';
  if (isObject(repo)) project = field(repo, 'full_name', 'unknown', 'repository.full_name');
  else if (repo !== undefined && repo !== null) throw new UnprocessableError('repository must be an object');
  project = checkProject(project, 'repository.full_name');
  return { kind: 'deploy', project, ref, sha, eventId: githubEventId(project, ref, sha) };
}

export interface DeployDeps {
  redis: Redis;
  queue: Pick<OpsQueue, 'intake'>;
  logger: Logger;
}

export interface DeployRequest {
  project: string;
  ref: string;
  sha: string;
  eventId: string;
  auditId: string;
  requestedBy: string;
  /** The sender's own delivery id: recorded too (SEEN_DELIVERY_TTL_SECONDS), so its replay is a duplicate after the event window. */
  delivery?: { source: string; id: string };
  rateHit?: DeferredRateHit;
}

export interface DeployOutcome {
  accepted: boolean;
  duplicate: boolean;
  jobId?: string;
  /** Accepted: the seen keys the claim wrote (REDIS_MIN_REPLICAS_ACK takes them back). */
  keys?: string[];
}

/**
 * Rules 6-9: record the event as seen (SET NX EX 86400); when recorded, enqueue one
 * run_deploy_pipeline job; when already recorded, nothing. If enqueueing fails, the seen record
 * is removed so the sender's retry is delivered again, and the failure propagates (503).
 */
export async function submitDeploy(deps: DeployDeps, req: DeployRequest): Promise<DeployOutcome> {
  const data = {
    project: req.project,
    ref: req.ref,
    sha: req.sha,
    ...(req.delivery ? { delivery_id: req.delivery.id } : {}),
    event_id: req.eventId,
    audit_id: req.auditId,
    requested_by: req.requestedBy,
  };
  // Validate before recording anything, so a payload we would refuse never marks the event seen.
  const parsed = runDeployPipelineData.safeParse(data);
  if (!parsed.success) throw new UnprocessableError(`invalid ${parsed.error.issues[0]!.path.join('.')}`);

  // SET NX + enqueue without a crash window (src/domain/claim.ts); rule 9 is kept there.
  const out = await claimAndEnqueue(
    deps,
    {
      key: seenKey(req.eventId),
      ttlSeconds: SEEN_EVENT_TTL_SECONDS,
      ...(req.delivery
        ? { alsoKeys: [{ key: deliveryKey(req.delivery.source, req.delivery.id), ttlSeconds: SEEN_DELIVERY_TTL_SECONDS }] }
        : {}),
      name: JOB.runDeployPipeline,
      data: parsed.data,
      what: req.eventId,
    },
    { rateHit: req.rateHit },
  );
  return {
    accepted: out.accepted,
    duplicate: out.duplicate,
    ...(out.jobId ? { jobId: out.jobId } : {}),
    ...(out.keys ? { keys: out.keys } : {}),
  };
}
