import { randomUUID } from 'node:crypto';
import { DelayedError, UnrecoverableError } from 'bullmq';
import type { DeployState } from '../../src/changes/deployOrder/history.js';
import { deployStatusKey, deployStatusLockKey } from '../../src/shared/keys.js';
import type { ReportStatusData } from '../../src/shared/jobs.js';
import { outboundCall } from '../../src/shared/outboundAuth.js';
import { githubDeployment, hostHeaders, hostState, STATE_RANK, STATUS_TABLE, statusCall, type StatusCall } from '../commitStatus.js';
import type { JobContext } from '../context.js';

/**
 * report_status: one state of a deploy told to the host of its commit (worker/commitStatus.ts);
 * a host refusing the request (4xx but 408 and 429) is not asked again. Reports of one deploy go one
 * at a time (a lock per deploy) and never backwards: an earlier state than one told (a late retry),
 * or the same host state twice (GitLab refuses that transition), is skipped. What was told is kept
 * beside the deploy's history entry (deployStatusKey) a month after its last report.
 */
const KEPT_MS = 30 * 24 * 3600 * 1000;

class HostRefused extends UnrecoverableError {}

export async function reportStatus(d: ReportStatusData, ctx: JobContext): Promise<unknown> {
  const count = (result: 'sent' | 'failed' | 'skipped' | 'no_token') => ctx.metrics?.commitStatusReports?.inc({ sender: d.sender, result });
  if (!Object.hasOwn(STATUS_TABLE, d.state)) throw new UnrecoverableError(`unknown deploy state ${JSON.stringify(d.state)}`);
  const host = ctx.statusHosts?.[d.sender];
  if (!host) {
    count('no_token');
    ctx.logger.warn('deploy state not reported: this worker holds no token for the sender', { sender: d.sender, deploy: d.deploy_id });
    return { reported: false, why: 'no_token' };
  }
  const timeoutMs = ctx.config.STATUS_TIMEOUT_MS;
  const lock = deployStatusLockKey(d.deploy_id);
  const mine = randomUUID();
  if ((await ctx.redis.set(lock, mine, 'PX', 2 * timeoutMs + 5000, 'NX')) !== 'OK') {
    // Another report of this deploy is being sent: this one comes back in a moment, without spending an attempt.
    if (ctx.job.moveToDelayed && ctx.token) {
      await ctx.job.moveToDelayed(Date.now() + 200 + Math.floor(Math.random() * 300), ctx.token);
      throw new DelayedError();
    }
    throw new Error('another report of this deploy is being sent');
  }
  try {
    const key = deployStatusKey(d.deploy_id);
    const told = await ctx.redis.hgetall(key);
    const state = hostState(d);
    if (told.rank !== undefined && Number(told.rank) > STATE_RANK[d.state as DeployState]) {
      count('skipped');
      return { reported: false, why: `a later state (${told.state}) was reported already` };
    }
    if (told.host_state === state) {
      count('skipped');
      return { reported: false, why: `the host shows ${state} already` };
    }
    const base = ctx.config.OPSGATE_PUBLIC_URL;
    const target = base ? `${base}/ops/deploys/${encodeURIComponent(d.deploy_id)}` : undefined;
    const call = async (c: StatusCall): Promise<unknown> => {
      const res = await outboundCall(
        `status report to ${d.sender}`,
        host.base,
        host.auth,
        timeoutMs,
        c.method,
        c.path,
        JSON.stringify(c.body),
        hostHeaders(d.sender),
      );
      if (res.status >= 200 && res.status < 300) {
        try {
          return JSON.parse(res.text) as unknown;
        } catch {
          return undefined;
        }
      }
      const what = `${d.sender} answered ${res.status} to ${c.method} ${c.path.split('?')[0]}`;
      if (res.status >= 400 && res.status < 500 && res.status !== 408 && res.status !== 429) throw new HostRefused(what);
      throw new Error(what);
    };
    let deployment = told.deployment !== undefined ? Number(told.deployment) : undefined;
    try {
      if (d.sender === 'github' && d.mode === 'deployment' && deployment === undefined) {
        const created = (await call(githubDeployment(d))) as { id?: unknown } | undefined;
        if (typeof created?.id !== 'number') throw new Error('github answered its deployment without an id');
        deployment = created.id;
        await ctx.redis.multi().hset(key, 'deployment', String(deployment)).pexpire(key, KEPT_MS).exec();
      }
      await call(statusCall(d, target, deployment));
    } catch (err) {
      count('failed');
      ctx.logger.warn('could not report the deploy state to its sender', {
        sender: d.sender,
        deploy: d.deploy_id,
        state: d.state,
        attempt: ctx.job.attemptsMade + 1,
        err: err instanceof Error ? err.message : String(err),
      });
      throw err;
    }
    await ctx.redis
      .multi()
      .hset(key, { rank: String(STATE_RANK[d.state as DeployState]), state: d.state, host_state: state })
      .pexpire(key, KEPT_MS)
      .exec();
    count('sent');
    return { reported: true, state, ...(deployment !== undefined ? { deployment } : {}) };
  } finally {
    if ((await ctx.redis.get(lock).catch(() => null)) === mine) await ctx.redis.del(lock).catch(() => 0);
  }
}
