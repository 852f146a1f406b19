import { UnrecoverableError } from 'bullmq';
import type { DeployState } from '../src/changes/deployOrder/history.js';
import type { WorkerConfig } from '../src/shared/config.js';
import { findProject, type Inventory } from '../src/shared/inventory.js';
import { STATUS_SENDERS, type ReportStatusData, type RunDeployPipelineData, type StatusSender } from '../src/shared/jobs.js';
import type { Logger } from '../src/shared/logger.js';
import { authenticates, loadOutboundAuth, type OutboundAuth } from '../src/shared/outboundAuth.js';

// A deploy's states told to the host of its commit, where developers look (the calls: worker/jobs/reportStatus.ts).

/** Each host the worker may call: its API's base URL and its credentials (read again when their files change). */
export type StatusHosts = Partial<Record<StatusSender, { base: string; auth: OutboundAuth }>>;

/**
 * The hosts this worker may tell; one without a token, a URL or (Bitbucket, whose statuses need a link)
 * OPSGATE_PUBLIC_URL is told nothing, said once at start. Credential problems are a ConfigError.
 */
export function statusHosts(config: WorkerConfig, logger: Pick<Logger, 'addSecrets' | 'error' | 'info'>): StatusHosts {
  const env = config as unknown as Readonly<Record<string, string | undefined>>;
  const opts = {
    onSecret: (v: string) => logger.addSecrets([v]),
    onRefused: (p: { variable: string; problem: string }) =>
      logger.error('credentials reload refused: keeping the ones in use', { variable: p.variable, problems: [p] }),
  };
  const out: StatusHosts = {};
  for (const sender of STATUS_SENDERS) {
    const prefix = `${sender.toUpperCase()}_STATUS`;
    const base = env[`${prefix}_API_URL`];
    const auth = loadOutboundAuth(env, prefix, opts);
    const off = !authenticates(auth)
      ? `no ${prefix}_BEARER_TOKEN (or its _FILE)`
      : base === undefined
        ? `no ${prefix}_API_URL`
        : sender === 'bitbucket' && !config.OPSGATE_PUBLIC_URL
          ? 'no OPSGATE_PUBLIC_URL (a Bitbucket build status needs its link)'
          : undefined;
    if (off === undefined && base !== undefined) out[sender] = { base, auth };
    else logger.info('deploy states are not reported to this sender', { sender, why: off });
  }
  return out;
}

/** The event id's first part (src/sources/: each sender's eventPrefix) -> the host of the pushed commit. */
const SENDER_OF_PREFIX: Readonly<Record<string, StatusSender>> = {
  github: 'github',
  scm: 'gitlab',
  gitea: 'gitea',
  bitbucket: 'bitbucket',
};

/**
 * The host told a deploy's states: a push's own sender, else the project's `sender` in the inventory.
 * A deploy without an event (an operator's own) or without a commit tells nobody.
 */
export function senderOf(inventory: Inventory, d: Pick<RunDeployPipelineData, 'project' | 'event_id' | 'sha'>): StatusSender | undefined {
  if (!d.event_id || !d.sha) return undefined;
  const prefix = d.event_id.slice(0, d.event_id.indexOf(':'));
  return SENDER_OF_PREFIX[prefix] ?? findProject(inventory, d.project)?.sender;
}

/** The report of one state of a deploy, or undefined when nobody is told. */
export function statusReport(
  inventory: Inventory,
  hosts: StatusHosts | undefined,
  d: RunDeployPipelineData,
  deployId: string,
  state: DeployState,
  detail?: string,
): ReportStatusData | undefined {
  const sender = senderOf(inventory, d);
  if (!sender || !hosts?.[sender] || !d.sha) return undefined;
  const project = findProject(inventory, d.project);
  return {
    deploy_id: deployId,
    sender,
    project: d.project,
    ref: d.ref,
    sha: d.sha,
    state,
    environment: project?.environment ?? d.ref,
    mode: project?.status ?? 'deployment',
    ...(detail ? { detail: detail.slice(0, 200) } : {}),
    audit_id: d.audit_id,
    requested_by: d.requested_by,
  };
}

/**
 * opsgate's states -> each host's (docs/deploys.md shows this table). No host has a state for a
 * deploy cancelled or never run: the nearest one, the description saying why.
 */
const row = (rank: number, deployment: string, commit: string, gitlab: string, gitea: string, bitbucket: string, description: string) => ({
  rank,
  deployment,
  commit,
  gitlab,
  gitea,
  bitbucket,
  description,
});

export const STATUS_TABLE: Readonly<Record<DeployState, ReturnType<typeof row>>> = {
  pending_approval: row(0, 'pending', 'pending', 'pending', 'pending', 'INPROGRESS', 'waiting for approval'),
  held: row(1, 'queued', 'pending', 'pending', 'pending', 'INPROGRESS', 'held by a freeze or outside a change window'),
  queued: row(1, 'queued', 'pending', 'pending', 'pending', 'INPROGRESS', 'queued'),
  running: row(2, 'in_progress', 'pending', 'running', 'pending', 'INPROGRESS', 'deploying'),
  succeeded: row(3, 'success', 'success', 'success', 'success', 'SUCCESSFUL', 'deployed'),
  failed: row(3, 'failure', 'failure', 'failed', 'failure', 'FAILED', 'the deploy failed'),
  superseded: row(3, 'inactive', 'error', 'canceled', 'warning', 'STOPPED', 'superseded by a newer deploy'),
  cancelled: row(3, 'inactive', 'error', 'canceled', 'warning', 'STOPPED', 'cancelled: a newer deploy replaced it'),
  rejected: row(3, 'error', 'failure', 'failed', 'failure', 'FAILED', 'rejected by an approver'),
};

/** The order of the states (the table's rank): a report is never sent after one of a later state (the history's order). */
export const STATE_RANK = Object.fromEntries(Object.entries(STATUS_TABLE).map(([state, r]) => [state, r.rank])) as Readonly<
  Record<DeployState, number>
>;

export interface StatusCall {
  method: 'POST';
  path: string;
  body: Record<string, unknown>;
}

const post = (path: string, body: Record<string, unknown>): StatusCall => ({ method: 'POST', path, body });
const seg = encodeURIComponent;

function ownerRepo(project: string): string {
  const cut = project.indexOf('/');
  // Asking again cannot fix the name: the report ends at once.
  if (cut <= 0 || cut === project.length - 1) throw new UnrecoverableError(`project ${JSON.stringify(project)} is not owner/repository`);
  return `${seg(project.slice(0, cut))}/${seg(project.slice(cut + 1))}`;
}

/** The host's state of a report (what is compared to skip a repeat). */
export function hostState(d: Pick<ReportStatusData, 'sender' | 'mode' | 'state'>): string {
  const row = STATUS_TABLE[d.state as DeployState];
  if (d.sender === 'github') return d.mode === 'commit' ? row.commit : row.deployment;
  return row[d.sender];
}

const branch = (ref: string) => ref.replace(/^refs\/heads\//, '');

/** GitHub's deployment of a deploy: created once, before its first status. */
export function githubDeployment(d: ReportStatusData): StatusCall {
  return post(`/repos/${ownerRepo(d.project)}/deployments`, {
    ref: d.sha,
    task: 'deploy',
    environment: d.environment,
    auto_merge: false,
    required_contexts: [],
    description: `opsgate deploy ${d.deploy_id}`.slice(0, 140),
  });
}

/** The status call of a report (GitHub in deployment mode: of the deployment `deployment`). */
export function statusCall(d: ReportStatusData, targetUrl: string | undefined, deployment?: number): StatusCall {
  const row = STATUS_TABLE[d.state as DeployState];
  const state = hostState(d);
  const description = (d.detail ? `${row.description} (${d.detail})` : row.description).slice(0, 140);
  const context = `opsgate/${d.environment}`;
  const link = targetUrl !== undefined ? { target_url: targetUrl } : {};
  switch (d.sender) {
    case 'github':
    case 'gitea':
      if (d.sender === 'github' && d.mode === 'deployment') {
        const path = `/repos/${ownerRepo(d.project)}/deployments/${deployment}/statuses`;
        return post(path, { state, description, environment: d.environment, ...link, ...(targetUrl ? { log_url: targetUrl } : {}) });
      }
      return post(`/repos/${ownerRepo(d.project)}/statuses/${seg(d.sha)}`, { state, description, context, ...link });
    case 'gitlab':
      return post(`/projects/${seg(d.project)}/statuses/${seg(d.sha)}`, { state, ref: branch(d.ref), name: context, description, ...link });
    case 'bitbucket':
      return post(`/2.0/repositories/${ownerRepo(d.project)}/commit/${seg(d.sha)}/statuses/build`, {
        key: `opsgate-${d.environment}`.replace(/[^A-Za-z0-9._-]/g, '-').slice(0, 40),
        state,
        name: context,
        description,
        url: targetUrl,
        refname: branch(d.ref),
      });
  }
}

/** The headers each host asks for besides the token (GitHub: a User-Agent, its media type and API version). */
export function hostHeaders(sender: StatusSender): Record<string, string> {
  return sender === 'github'
    ? { accept: 'application/vnd.github+json', 'x-github-api-version': '2022-11-28', 'user-agent': 'opsgate' }
    : { 'user-agent': 'opsgate' };
}
