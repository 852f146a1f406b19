import { randomBytes } from 'node:crypto';
import { describePool, poolsOf } from '../changes/budget/pools.js';
import { describeReasons } from '../changes/gate.js';
import { queueReport, type RestartPipeline } from '../changes/deps.js';
import { planChange, submitChange } from '../changes/pipeline.js';
import type { ChangeResult } from '../changes/execute.js';
import type { Change, Principal, RestartTarget } from '../changes/types.js';
import { sha256Hex } from '../shared/crypto.js';
import { hostOfDeployment } from '../shared/inventory.js';
import { JOB, type RemediateData } from '../shared/jobs.js';
import type { JobReads } from '../shared/jobReads.js';
import type { Logger } from '../shared/logger.js';
import type { Metrics } from '../shared/metrics.js';
import { formatDuration } from '../shared/policy.js';
import { matchesRule, targetAllowed, type RemediationRule } from '../shared/remediations.js';
import type { AlertmanagerClient } from './alertmanager.js';
import type { PrometheusClient } from './prometheus.js';
import { OUTCOMES, type Active, type RemediationDecision, type RemediationStore } from './store.js';

/**
 * Alert-driven remediation (docs/remediation.md): a firing alert matching a rule of the inventory
 * becomes a restart through the change pipeline (origin `remediation`, requester
 * `remediation:<rule>`), so freezes, windows and approval apply as to a person's restart, on
 * budgets of its own. Only an alert confirmed where it is born acts: a forged notification, or an
 * alert posted to Alertmanager by anyone, does nothing and counts as no firing. A watch job in the
 * worker then cancels, silences and verifies it. The contract of /webhook/alerts is untouched: a
 * failure here is logged and recorded as a decision, never answered as an error of the notification.
 */
export interface RemediationDeps {
  pipeline: RestartPipeline;
  rules: readonly RemediationRule[];
  store: RemediationStore;
  /** PROMETHEUS_URL: where rules with `confirm: prometheus` confirm and time their alerts. */
  prometheus?: PrometheusClient;
  /** ALERTMANAGER_URL: silences, and the confirmation of rules with `confirm: alertmanager` when authenticated. */
  alertmanager?: AlertmanagerClient;
  /** Alertmanager's API is asked with credentials (only then may it confirm an alert). */
  alertmanagerAuthenticated?: boolean;
  jobs: Pick<JobReads, 'get'>;
  logger: Logger;
  metrics?: Pick<Metrics, 'remediations' | 'remediationsSuppressed' | 'remediationEscalations'>;
  now: () => number;
  /** The worker's Kubernetes Event of an outcome on the Deployment (absent in the API). */
  onOutcome?: (a: Active, outcome: RemediationOutcome, reason: string) => Promise<void>;
}

type RemediationOutcome = (typeof OUTCOMES)[number];

/** An alert of a notification, as remediation reads it. */
interface NotifiedAlert {
  status: 'firing' | 'resolved';
  labels: Record<string, string>;
  fingerprint: string;
  startsAt: number;
}

/** What the webhook answer shows of a notification's remediations (additive fields). */
type Summary = Pick<RemediationDecision, 'rule' | 'fingerprint' | 'decision' | 'reason' | 'id'>;
function summary(rule: string, fingerprint: string, decision: Summary['decision'], reason: string, id: string): Summary {
  return { rule, fingerprint, decision, reason, id };
}

export const principalOf = (rule: string): Principal => ({
  principal: `remediation:${rule}`,
  credential: '',
  owner: `remediation:${rule}`,
  ownerKnown: true,
});

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);

/** The alerts of a notification payload remediation can read (a label set, a fingerprint, a status). */
function notifiedAlerts(payload: unknown, now: number): NotifiedAlert[] {
  if (!isObject(payload) || !Array.isArray(payload.alerts)) return [];
  const out: NotifiedAlert[] = [];
  for (const a of payload.alerts) {
    if (!isObject(a) || (a.status !== 'firing' && a.status !== 'resolved')) continue;
    if (typeof a.fingerprint !== 'string' || a.fingerprint === '' || a.fingerprint.length > 256 || !isObject(a.labels)) continue;
    const labels: Record<string, string> = {};
    for (const [k, v] of Object.entries(a.labels)) if (typeof v === 'string') labels[k] = v;
    const starts = typeof a.startsAt === 'string' ? Date.parse(a.startsAt) : NaN;
    out.push({ status: a.status, labels, fingerprint: a.fingerprint, startsAt: Number.isFinite(starts) && starts > 0 ? starts : now });
  }
  return out;
}

/** How often a remediation under way is looked at, and how far ahead its silence ends (4 steps). */
function watchStepMs(rule: Pick<RemediationRule, 'verify' | 'settle'>): number {
  return Math.min(15_000, Math.max(1000, Math.round((Math.min(rule.verify, rule.settle) * 1000) / 5)));
}
const silenceLeaseMs = (rule: Pick<RemediationRule, 'verify' | 'settle'>): number => 4 * watchStepMs(rule);

/** (rule, alert) pairs of one notification decided at once. */
const NOTIFY_CONCURRENCY = 8;
/** The decisions that stopped a remediation (counted by the guard that did). */
const SUPPRESSING: ReadonlySet<RemediationDecision['decision']> = new Set(['suppressed', 'refused', 'error']);
/** What every decision about one firing alert says of it. */
type Base = Omit<RemediationDecision, 'at' | 'decision' | 'reason' | 'guard' | 'outcome' | 'job_id' | 'approval_id'>;

/** Where an alert is confirmed: its name in reasons, the guard of its errors, and whether (since when, ms) it fires. */
interface Source {
  name: string;
  guard: 'prometheus' | 'alertmanager';
  firing(labels: Readonly<Record<string, string>>): Promise<number | undefined>;
}

/** The waits before each try of writing a carried-out remediation's record and watch (~3 s in all). */
const PERSIST_RETRIES_MS = [0, 100, 200, 400, 800, 1600];

const newId = (): string => `rem-${randomBytes(10).toString('hex')}`;
const iso = (ms: number) => new Date(ms).toISOString();

export type Remediation = ReturnType<typeof createRemediation>;

export function createRemediation(deps: RemediationDeps) {
  const { store, logger } = deps;
  const g = deps.pipeline;
  const byName = new Map(deps.rules.map((r) => [r.name, r]));

  async function recordDecision(
    d: Omit<RemediationDecision, 'at' | 'job_id' | 'approval_id' | 'outcome' | 'guard'> & Partial<RemediationDecision>,
  ): Promise<RemediationDecision> {
    const full: RemediationDecision = { job_id: null, approval_id: null, outcome: null, guard: null, ...d, at: iso(deps.now()) };
    if (full.guard && SUPPRESSING.has(full.decision)) deps.metrics?.remediationsSuppressed.inc({ rule: full.rule, guard: full.guard });
    if (full.outcome) deps.metrics?.remediations.inc({ rule: full.rule, outcome: full.outcome });
    const { id: remediation, rule, decision, guard, outcome, fingerprint, reason } = full;
    logger.info('remediation decision', { remediation, rule, decision, guard, outcome, fingerprint, reason });
    await store.record(full).catch((err: unknown) => logger.warn('could not record a remediation decision', { err }));
    return full;
  }

  /** A firing that restarts nothing, recorded with the guard that stopped it and why. */
  const suppress = (base: Base, guard: NonNullable<RemediationDecision['guard']>, reason: string) =>
    recordDecision({ ...base, decision: 'suppressed', guard, reason });

  /** The decision's news to the notification endpoints (report_change, event `remediation`). */
  async function report(rule: RemediationRule, d: RemediationDecision, auditId: string, history?: Array<{ id: string; at: number }>) {
    await queueReport(g, `report.${d.id}.${d.decision}${d.outcome ? `.${d.outcome}` : ''}`, {
      event: 'remediation',
      change: 'restart',
      ...(d.host ? { host: d.host } : {}),
      ...(d.deployment ? { service: d.deployment } : {}),
      namespace: (d.namespace ?? '').slice(0, 63),
      ...(d.job_id ? { job_id: d.job_id } : {}),
      ...(d.approval_id ? { approval_id: d.approval_id } : {}),
      approvers: [],
      reason: d.reason.slice(0, 1000),
      remediation: {
        rule: rule.name,
        mode: rule.mode,
        alertname: d.alertname.slice(0, 1024),
        fingerprint: d.fingerprint,
        decision: d.decision,
        ...(d.outcome ? { outcome: d.outcome } : {}),
        ...(history ? { history: history.slice(-100).map((h) => ({ id: h.id, at: iso(h.at) })) } : {}),
      },
      audit_id: auditId,
      requested_by: principalOf(rule.name).principal,
    });
    return d;
  }

  /** Where a rule's alerts are confirmed, when this process can ask there. */
  function sourceOf(rule: RemediationRule): Source | undefined {
    if (rule.confirm === 'prometheus') {
      const p = deps.prometheus;
      return p ? { name: 'Prometheus at PROMETHEUS_URL', guard: 'prometheus', firing: (l) => p.firing(l) } : undefined;
    }
    const am = deps.alertmanager;
    if (!am || !deps.alertmanagerAuthenticated) return undefined;
    return {
      name: 'Alertmanager at ALERTMANAGER_URL',
      guard: 'alertmanager',
      firing: async (l) => {
        const held = await am.firing(l);
        if (!held) return undefined;
        const at = Date.parse(held.startsAt);
        return Number.isFinite(at) ? at : deps.now();
      },
    };
  }

  /** A check of this firing, `delayMs` from now, in the worker (one per firing: a repeated add adds nothing). */
  async function scheduleCheck(
    rule: RemediationRule,
    alert: NotifiedAlert,
    auditId: string,
    key: number,
    delayMs: number,
    notifiedAt: number,
  ) {
    const data: RemediateData = {
      step: 'check',
      rule: rule.name,
      alert: { labels: alert.labels, fingerprint: alert.fingerprint, starts_at: alert.startsAt },
      notified_at: notifiedAt,
      audit_id: auditId,
      requested_by: principalOf(rule.name).principal,
    };
    const jobId = `remediate-check.${rule.name}.${sha256Hex(`${alert.fingerprint}\n${key}`).slice(0, 32)}`;
    await g.producer.add({ name: JOB.remediate, data, jobId, delay: Math.max(1, delayMs) });
  }

  /**
   * A firing alert matching `rule`, from a notification or from a check. Answers the decision and,
   * for a check, when to look again (a `for` not yet passed, a source that did not answer).
   */
  async function fire(
    rule: RemediationRule,
    alert: NotifiedAlert,
    auditId: string,
    via: 'notification' | 'check',
    notifiedAt: number,
  ): Promise<{ d: RemediationDecision; againMs?: number }> {
    const now = deps.now();
    const namespace = alert.labels[rule.target.namespace] ?? null;
    const deployment = alert.labels[rule.target.deployment] ?? null;
    const base: Base = {
      id: newId(),
      rule: rule.name,
      mode: rule.mode,
      alertname: alert.labels.alertname ?? '',
      fingerprint: alert.fingerprint,
      starts_at: iso(alert.startsAt),
      namespace,
      deployment,
      host: null,
    };
    const stop = async (guard: NonNullable<RemediationDecision['guard']>, reason: string) => ({ d: await suppress(base, guard, reason) });
    const host = namespace && deployment ? hostOfDeployment(g.inventory, namespace, deployment) : undefined;
    if (!host || !namespace || !deployment)
      return stop(
        'target',
        `labels ${rule.target.namespace}=${JSON.stringify(namespace ?? '')} and ${rule.target.deployment}=${JSON.stringify(deployment ?? '')} name no Deployment of an inventory host; nothing restarted`,
      );
    base.host = host;
    if (!targetAllowed(rule, host, namespace, deployment))
      return stop(
        'target_not_allowed',
        `Deployment ${namespace}/${deployment} (host ${host}) is not among the targets of rule ${rule.name}; nothing restarted`,
      );

    // Only real alerts act, and only they count as a firing: confirmed, and timed, where they are born.
    const source = sourceOf(rule);
    let since = alert.startsAt;
    if (!source && rule.mode === 'act')
      return stop(
        'unconfirmed',
        `rule ${rule.name} confirms its alerts with ${rule.confirm}, which this process cannot ask; nothing restarted`,
      );
    if (source) {
      let fired: number | undefined;
      try {
        fired = await source.firing(alert.labels);
      } catch (err) {
        const deadline = notifiedAt + rule.trigger.within * 1000;
        const againMs = Math.min(60_000, Math.max(1000, Math.round((now - notifiedAt) / 2)));
        let next = '';
        if (now + againMs < deadline) {
          if (via === 'notification') await scheduleCheck(rule, alert, auditId, alert.startsAt, againMs, notifiedAt);
          next = `; asked again at ${iso(now + againMs)}`;
        }
        const d = await recordDecision({
          ...base,
          decision: 'error',
          guard: source.guard,
          reason: `${(err as Error).message}; nothing restarted${next}`,
        });
        return { d, ...(via === 'check' && next ? { againMs } : {}) };
      }
      if (fired === undefined) return stop('not_firing', `${source.name} fires no alert with these labels; nothing restarted`);
      since = fired;
      base.starts_at = iso(since);
    }

    const episodes = await store.episode(rule.name, alert.fingerprint, since, now, rule.trigger.within * 1000);
    if (episodes < rule.trigger.episodes)
      return stop(
        'episodes',
        `${episodes} of the ${rule.trigger.episodes} firings within ${formatDuration(rule.trigger.within)} the rule waits for`,
      );
    const due = since + rule.trigger.for * 1000;
    if (now < due) {
      if (source && via === 'notification') await scheduleCheck(rule, alert, auditId, since, due - now, notifiedAt);
      const d = await recordDecision({
        ...base,
        decision: 'waiting',
        guard: 'for',
        reason: `firing for ${formatDuration(Math.max(0, Math.floor((now - since) / 1000)))} of the ${formatDuration(rule.trigger.for)} the rule waits for; ${source ? `checked with ${source.name} at ${iso(due)}` : 'acts on a notification after ' + iso(due)}`,
      });
      return { d, ...(source && via === 'check' ? { againMs: due - now } : {}) };
    }
    return { d: await act(rule, alert, base, since, auditId, now) };
  }

  /** The rule's guard, then the change: planned (dry-run) or carried out (act). */
  async function act(rule: RemediationRule, alert: NotifiedAlert, base: Base, since: number, auditId: string, now: number) {
    const { id, host, namespace, deployment, alertname } = base as Base & { host: string; namespace: string; deployment: string };
    const claim = await store.claim(rule.name, namespace, deployment, id, now, {
      cooldownMs: rule.cooldown * 1000,
      windowMs: rule.escalation_window * 1000,
      escalateAfter: rule.escalate_after,
    });
    if (claim.verdict === 'cooldown')
      return suppress(
        base,
        'cooldown',
        `restarted by this rule less than ${formatDuration(rule.cooldown)} ago; the cooldown ends in ${Math.ceil(claim.leftMs / 1000)} s`,
      );
    if (claim.verdict === 'escalated')
      return suppress(
        base,
        'escalated',
        `escalated: ${claim.count} remediations within ${formatDuration(rule.escalation_window)} did not keep the alert away; on-call was paged, nothing more is done until the window passes`,
      );
    if (claim.verdict === 'escalate') return escalate(rule, alert, base, claim.count, auditId, now);
    /** A decision recorded and reported. */
    const recorded = async (d: Parameters<typeof recordDecision>[0]) => report(rule, await recordDecision(d), auditId);

    const change: Change & { target: RestartTarget } = {
      target: { kind: 'restart', host, service: deployment, namespace },
      requester: principalOf(rule.name),
      reason: `alert ${alertname} firing since ${iso(since)} (rule ${rule.name})`.slice(0, 500),
      origin: 'remediation',
      auditId,
      ...(rule.approval ? { approval: rule.approval } : {}),
    };

    if (rule.mode === 'dry-run') {
      const k = (await planChange(g, change, undefined, true)).decision;
      const would =
        k.kind === 'refuse' || k.kind === 'hold'
          ? `refuse it: ${describeReasons(k.reasons)}`
          : k.kind === 'pending_approval'
            ? `wait for ${k.required} approval(s)`
            : k.kind === 'join'
              ? `join restart ${k.jobId}, already waiting or rolling out`
              : k.kind === 'over_budget'
                ? `refuse it: the ${describePool(k.pool)} is spent for ${Math.ceil(k.retryMs / 1000)} s`
                : 'queue the restart';
      const reason = `dry-run: would restart Deployment ${namespace}/${deployment}; the pipeline would ${would}`;
      return recorded({ ...base, decision: 'dry_run', outcome: 'dry_run', reason });
    }

    let result: ChangeResult;
    try {
      result = await submitChange(g, change);
    } catch (err) {
      // Its job not added (or not known to be): nothing was restarted, the claim goes back.
      await store.release(rule.name, namespace, deployment, id).catch(() => undefined);
      logger.warn('remediation could not submit its restart', { err, rule: rule.name });
      return recorded({ ...base, decision: 'error', reason: `not restarted: ${(err as Error).message}` });
    }
    const { carried, refusal } = result;
    if (refusal) {
      // Refused by the gate or a budget: nothing was restarted, the claim goes back.
      await store.release(rule.name, namespace, deployment, id).catch(() => undefined);
      return recorded({
        ...base,
        decision: 'refused',
        guard: refusal.guard === 'gate' ? (refusal.reasons[0]?.guard ?? 'freeze') : 'budget',
        outcome: 'refused',
        reason: `not restarted: ${refusal.guard === 'gate' ? describeReasons(refusal.reasons) : refusal.detail}`,
      });
    }
    // Carried out: the claim stays whatever follows. The record and the watch are retried, since
    // without them nothing would verify the restart or manage its silence.
    const active: Active = {
      id,
      rule: rule.name,
      fingerprint: alert.fingerprint,
      labels: alert.labels,
      starts_at: since,
      host,
      namespace,
      deployment,
      phase: 'waiting',
      created_at: now,
      audit_id: auditId,
      ...(carried.approval ? { approval_id: carried.approval.approval.id } : { job_id: carried.jobId }),
      ...(carried.coalesced && !carried.approval ? { joined: true } : {}),
    };
    let unsaved: Error | undefined;
    for (const wait of PERSIST_RETRIES_MS) {
      if (wait > 0) await new Promise((r) => setTimeout(r, wait));
      try {
        await store.putActive(active, activeTtlMs(rule));
        await g.producer.add({
          name: JOB.remediate,
          data: {
            step: 'watch',
            rule: rule.name,
            fingerprint: alert.fingerprint,
            id,
            audit_id: auditId,
            requested_by: principalOf(rule.name).principal,
          },
          jobId: `remediate-watch.${id}`,
        });
        unsaved = undefined;
        break;
      } catch (err) {
        unsaved = err as Error;
      }
    }
    if (unsaved)
      logger.error('remediation restart carried out, but its record or watch could not be saved', {
        err: unsaved,
        rule: rule.name,
        remediation: id,
      });
    const note = unsaved ? `; its record or watch could not be saved (${unsaved.message}): nothing verifies it` : '';
    const what = `Deployment ${namespace}/${deployment}`;
    if (carried.approval) {
      const { approval } = carried.approval;
      const reason = `restart of ${what} waits for ${approval.required} approval(s) until ${iso(approval.expires_at)}${note}`;
      return recordDecision({ ...base, decision: 'pending_approval', guard: 'approval', approval_id: approval.id, reason });
    }
    const reason = carried.coalesced
      ? `joined restart ${carried.jobId} of ${what}, already waiting or rolling out${note}`
      : `restart of ${what} queued${note}`;
    return recordDecision({ ...base, decision: carried.coalesced ? 'joined' : 'queued', job_id: carried.jobId, reason });
  }

  async function escalate(rule: RemediationRule, alert: NotifiedAlert, base: Base, count: number, auditId: string, now: number) {
    const history = await store.history(rule.name, base.namespace!, base.deployment!, now, rule.escalation_window * 1000).catch(() => []);
    deps.metrics?.remediationEscalations.inc({ rule: rule.name });
    const reason = `${count} remediations of Deployment ${base.namespace}/${base.deployment} within ${formatDuration(rule.escalation_window)} did not keep alert ${base.alertname} away: no more restarts by rule ${rule.name} until the window passes; paging on-call`;
    const d = await recordDecision({ ...base, decision: 'escalated', guard: 'escalated', reason });
    try {
      await g.producer.add({
        name: JOB.notifyOncall,
        data: {
          alertname: 'OpsgateRemediationEscalated',
          annotations: {
            summary: reason,
            rule: rule.name,
            alertname: base.alertname,
            namespace: base.namespace,
            deployment: base.deployment,
            fingerprint: alert.fingerprint,
            history: history.map((h) => `${h.id} at ${iso(h.at)}`),
          },
          audit_id: auditId,
          requested_by: principalOf(rule.name).principal,
        },
        jobId: `remediation-escalation.${d.id}`,
      });
    } catch (err) {
      logger.warn('could not queue the page of an escalated remediation', { err, rule: rule.name });
    }
    return report(rule, d, auditId, history);
  }

  /** Whether the alert of a remediation under way has resolved: its rule's source says so, else a resolved notification. */
  async function isResolved(rule: RemediationRule, a: Active): Promise<boolean> {
    const source = sourceOf(rule);
    if (source) return (await source.firing(a.labels)) === undefined;
    return store.resolved(a.rule, a.fingerprint, a.starts_at);
  }

  /** Ends a remediation with its outcome: recorded, counted, reported; then it settles (its silence lapses after `settle`). */
  async function finish(rule: RemediationRule, a: Active, outcome: RemediationOutcome, reason: string): Promise<Active> {
    const now = deps.now();
    const d = await recordDecision({
      id: a.id,
      rule: rule.name,
      mode: rule.mode,
      alertname: a.labels.alertname ?? '',
      fingerprint: a.fingerprint,
      starts_at: iso(a.starts_at),
      namespace: a.namespace,
      deployment: a.deployment,
      host: a.host,
      decision: outcome === 'cancelled' ? 'cancelled' : 'outcome',
      outcome,
      job_id: a.job_id ?? null,
      approval_id: a.approval_id ?? null,
      reason,
    });
    await report(rule, d, a.audit_id);
    if (deps.onOutcome && outcome !== 'cancelled') await deps.onOutcome(a, outcome, reason).catch(() => undefined);
    const settled: Active = { ...a, phase: 'settling', outcome, settle_until: now + rule.settle * 1000 };
    await store.putActive(settled, activeTtlMs(rule));
    return settled;
  }

  /**
   * The alert resolved while the remediation waited: an approval it asked for is withdrawn, a job
   * it added that no worker took yet is taken back (with its budget place). A restart it joined, or
   * one already rolling out, goes on. Answers the remediation as it is afterwards.
   */
  async function cancel(rule: RemediationRule, a: Active): Promise<Active> {
    const me = principalOf(rule.name);
    if (a.approval_id && !a.job_id) {
      const approval = await g.approvals.get(a.approval_id);
      if (approval && approval.requester === me.principal) {
        const out = await g.approvals.decide(a.approval_id, {
          action: 'reject',
          by: me.principal,
          owner: me.owner,
          credential: '',
          reason: 'the alert resolved before the restart was approved',
          now: deps.now(),
        });
        if (out.verdict === 'rejected')
          return finish(
            rule,
            a,
            'cancelled',
            `the alert resolved while approval ${a.approval_id} was pending: withdrawn, nothing restarted`,
          );
        if (out.approval?.job_id) a = { ...a, job_id: out.approval.job_id };
      }
    }
    if (a.job_id && !a.joined) {
      // A job waiting for its retry is delayed like one never started, but a worker already ran
      // it and may have restarted the Deployment: only a job no worker ever took is taken back.
      const job = await deps.jobs.get(a.job_id);
      if (job && job.processed_at === null && (await g.producer.remove(a.job_id))) {
        if ((await deps.jobs.get(a.job_id)) === undefined) {
          await g.budgets.giveBack(poolsOf(a.namespace, me.principal), a.job_id).catch(() => undefined);
          return finish(rule, a, 'cancelled', `the alert resolved before restart ${a.job_id} started: taken back, nothing restarted`);
        }
      }
    }
    return a;
  }

  /** A resolved notification for an alert matching `rule`. */
  async function resolved(rule: RemediationRule, alert: NotifiedAlert): Promise<Summary | undefined> {
    const ttl = activeTtlMs(rule);
    const source = sourceOf(rule);
    // Resolution is the source's to say when it can be asked.
    if (source && (await source.firing(alert.labels).catch(() => 'unknown' as const)) !== undefined) return undefined;
    await store.markResolved(rule.name, alert.fingerprint, alert.startsAt, ttl);
    const a = await store.getActive(rule.name, alert.fingerprint);
    if (!a || a.phase !== 'waiting') return undefined;
    if ((await cancel(rule, a)).outcome !== 'cancelled') return undefined;
    return summary(rule.name, alert.fingerprint, 'cancelled', 'the alert resolved before the restart started', a.id);
  }

  /** One look at a remediation under way (the worker's watch job). */
  async function watch(rule: RemediationRule, id: string, fingerprint: string): Promise<number | undefined> {
    const found = await store.getActive(rule.name, fingerprint);
    if (!found || found.id !== id) return undefined;
    let a = found;
    const now = deps.now();
    const step = watchStepMs(rule);
    const ended = async (outcome: RemediationOutcome, reason: string) => {
      await finish(rule, a, outcome, reason);
      return step;
    };
    if (a.phase === 'settling') {
      if (now >= (a.settle_until ?? 0)) {
        await endSilence(a);
        await store.endActive(rule.name, fingerprint);
        return undefined;
      }
      if (a.silence_id) await keepSilence(rule, a);
      return Math.min(step, Math.max(1, (a.settle_until ?? now) - now));
    }
    a = await keepSilence(rule, a);
    if (a.phase === 'waiting') {
      if (await isResolved(rule, a)) {
        a = await cancel(rule, a);
        if (a.phase === 'settling') return step;
      }
      if (a.approval_id && !a.job_id) {
        const approval = await g.approvals.get(a.approval_id);
        if (approval?.status === 'approved' && approval.job_id) {
          a = { ...a, job_id: approval.job_id, ...(approval.coalesced ? { joined: true } : {}) };
          await store.putActive(a, activeTtlMs(rule));
        } else if (approval && (approval.status === 'rejected' || approval.status === 'expired' || deps.now() >= approval.expires_at)) {
          const outcome = approval.status === 'rejected' ? 'rejected' : 'expired';
          return ended(outcome, `approval ${a.approval_id} ${outcome}: nothing restarted`);
        }
      }
      if (a.job_id) {
        const job = await deps.jobs.get(a.job_id);
        if (!job) return ended('failed', `restart ${a.job_id} is no longer on the queue; its outcome is unknown`);
        if (job.state === 'completed') {
          a = { ...a, phase: 'verifying', verify_until: deps.now() + rule.verify * 1000 };
          await store.putActive(a, activeTtlMs(rule));
        } else if (job.state === 'failed') {
          const result = job.outcome?.result;
          const outcome: RemediationOutcome = result === 'progress_deadline_exceeded' || result === 'refused' ? result : 'failed';
          return ended(
            outcome,
            `restart ${a.job_id} ${outcome === 'failed' ? 'failed' : outcome.replaceAll('_', ' ')}: ${job.outcome?.reason ?? job.failed_reason ?? ''}`.trim(),
          );
        }
      }
    }
    if (a.phase === 'verifying') {
      if (await isResolved(rule, a))
        return ended('remediated', `restart ${a.job_id} rolled out and alert ${a.labels.alertname ?? ''} resolved`);
      if (deps.now() >= (a.verify_until ?? 0))
        return ended(
          'rolled_out_still_firing',
          `restart ${a.job_id} rolled out, but alert ${a.labels.alertname ?? ''} still fires ${formatDuration(rule.verify)} later`,
        );
    }
    return step;
  }

  /**
   * The silence of a remediation: created once its restart is queued (never while an approval is
   * pending: the alert stays visible to the people who decide), on the notification's full label
   * set, with a short end, moved on at each look (it lapses by itself if opsgate stops).
   */
  async function keepSilence(rule: RemediationRule, a: Active): Promise<Active> {
    const am = deps.alertmanager;
    if (!rule.silence || !am || !a.job_id) return a;
    const endsAt = new Date(deps.now() + silenceLeaseMs(rule));
    try {
      const sid = a.silence_id
        ? await am.extendSilence(a.silence_id, endsAt)
        : await am.createSilence({
            labels: a.labels,
            endsAt,
            createdBy: 'opsgate',
            comment: `opsgate remediation ${a.id} by rule ${rule.name}: restart of Deployment ${a.namespace}/${a.deployment}${a.job_id ? ` (job ${a.job_id})` : ''}`,
          });
      if (sid === a.silence_id) return a;
      if (a.silence_id) await store.removeSilence(a.silence_id);
      await store.addSilence(sid);
      const next = { ...a, silence_id: sid };
      await store.putActive(next, activeTtlMs(rule));
      if (!a.silence_id) logger.info('remediation silence created', { remediation: a.id, silence: sid, ends_at: endsAt.toISOString() });
      return next;
    } catch (err) {
      logger.warn('could not keep the remediation silence', { remediation: a.id, err: (err as Error).message });
    }
    return a;
  }

  async function endSilence(a: Active): Promise<void> {
    if (!a.silence_id || !deps.alertmanager) return;
    try {
      await deps.alertmanager.expireSilence(a.silence_id);
      logger.info('remediation silence expired', { remediation: a.id, silence: a.silence_id });
    } catch (err) {
      logger.warn('could not expire the remediation silence; it lapses at its end', { remediation: a.id, err: (err as Error).message });
    }
    await store.removeSilence(a.silence_id).catch(() => undefined);
  }

  return {
    rules: deps.rules,

    /** A notification's alerts: each firing or resolved alert that matches a rule. Never throws. */
    async notify(payload: unknown, auditId: string): Promise<Summary[]> {
      if (deps.rules.length === 0) return [];
      const pairs: Array<[RemediationRule, NotifiedAlert]> = [];
      for (const alert of notifiedAlerts(payload, deps.now())) {
        for (const rule of deps.rules) if (matchesRule(rule, alert.labels)) pairs.push([rule, alert]);
      }
      const one = async ([rule, alert]: [RemediationRule, NotifiedAlert]): Promise<Summary | undefined> => {
        try {
          if (alert.status === 'resolved') return await resolved(rule, alert);
          const { d } = await fire(rule, alert, auditId, 'notification', deps.now());
          return summary(rule.name, alert.fingerprint, d.decision, d.reason, d.id);
        } catch (err) {
          logger.warn('remediation failed on a notification', { rule: rule.name, fingerprint: alert.fingerprint, err });
          return summary(rule.name, alert.fingerprint, 'error', 'remediation failed; see the API log', '');
        }
      };
      // Several pairs at once, so a notification of many alerts waits for the slowest few, not their sum
      // (pairs never share a guard's keys); bounded, so it never opens hundreds of requests to Alertmanager.
      const out = new Array<Summary | undefined>(pairs.length);
      let next = 0;
      const lane = async () => {
        for (let i = next++; i < pairs.length; i = next++) out[i] = await one(pairs[i]!);
      };
      await Promise.all(Array.from({ length: Math.min(NOTIFY_CONCURRENCY, pairs.length) }, lane));
      return out.filter((s): s is Summary => s !== undefined);
    },

    /** A worker step: a check once `for` passed, or a watch. Answers the delay of its next run, or undefined when done. */
    async step(data: RemediateData): Promise<number | undefined> {
      const rule = byName.get(data.rule);
      if (!rule) {
        logger.warn('remediation step of a rule the inventory no longer has', { rule: data.rule });
        return undefined;
      }
      if (data.step === 'watch') return watch(rule, data.id, data.fingerprint);
      const { labels, fingerprint, starts_at: startsAt } = data.alert;
      const alert: NotifiedAlert = { status: 'firing', labels, fingerprint, startsAt };
      return (await fire(rule, alert, data.audit_id, 'check', data.notified_at ?? startsAt)).againMs;
    },
  };
}

/** How long a remediation's record may live: the longest it can wait, verify and settle, with margin. */
function activeTtlMs(rule: Pick<RemediationRule, 'verify' | 'settle' | 'approval'>): number {
  return ((rule.approval?.ttl ?? 86400) + 3600 + rule.verify + rule.settle) * 1000;
}
