import { describe, expect, it } from '@jest/globals';
import fc from 'fast-check';
import type { GateReason } from '../../../src/changes/gate.js';
import { coverOf, plan } from '../../../src/changes/plan.js';
import { ORIGINS, type Change, type Facts, type Origin, type Target } from '../../../src/changes/types.js';

/**
 * The planner, alone: every guard and every origin, in a table, then properties that hold for
 * any facts (fast-check). No store, no clock: the decision is a function of its inputs.
 */
const NOW = 1_000_000;
const freeze: GateReason = { guard: 'freeze', freeze_id: 'frz-1', scope: 'everything', reason: 'sale', by: 'key:x', ends_at: 'later' };
const laterFreeze: GateReason = { ...freeze, freeze_id: 'frz-2' };
const window: GateReason = { guard: 'window', opens_at: 'monday', windows: ['mon 09:00-17:00'] };
const restart: Target = { kind: 'restart', host: 'web-1', service: 'api', namespace: 'shop' };
const deploy: Target = {
  kind: 'deploy',
  project: 'g/app',
  ref: 'refs/heads/main',
  sha: 'abc',
  namespace: 'apps',
  eventId: 'scm:g/app:main:abc',
};
const person = { principal: 'key:alice', credential: 'c1', owner: 'alice', ownerKnown: true };

const change = (target: Target, origin: Origin, over: Partial<Change> = {}): Change => ({
  target,
  requester: person,
  origin,
  auditId: 'a',
  ...over,
});
const open: Facts['gate'] = { blocked: false, reasons: [] };
const closed = (...reasons: GateReason[]): Facts['gate'] => ({ blocked: true, reasons, until: NOW + 3_600_000 });
const approval = { required: 1, ttl: 3600 };
const budget = [{ kind: 'namespace' as const, name: 'shop', limit: { restarts: 3, per: 600 } }];
const remediationBudgets = [
  { kind: 'remediation_rule' as const, name: 'down', limit: { restarts: 3, per: 3600 } },
  { kind: 'remediation_namespace' as const, name: 'shop', limit: { restarts: 2, per: 600 } },
];

type Row = [string, Change, Facts, ReturnType<typeof plan>['kind'], Record<string, unknown>?];
const ASKING: Origin[] = ['api', 'webhook', 'replay', 'retry', 'remediation', 'ci', 'rollback'];

const rows: Row[] = [
  // restarts: the gate
  ...ORIGINS.map((o): Row => [`restart ${o}: a freeze refuses`, change(restart, o), { gate: closed(freeze) }, 'refuse']),
  ...ORIGINS.map((o): Row => [`restart ${o}: outside the windows refuses`, change(restart, o), { gate: closed(window) }, 'refuse']),
  [
    'restart: an override of that freeze lets it through',
    change(restart, 'api', { override: { by: 'key:alice', owner: 'alice', reason: 'r', covers: ['freeze:frz-1'] } }),
    { gate: closed(freeze) },
    'queue',
    { overridden: [freeze] },
  ],
  [
    'restart: an override does not cover a later freeze',
    change(restart, 'approval', { override: { by: 'key:alice', owner: 'alice', reason: 'r', covers: ['freeze:frz-1'] } }),
    { gate: closed(freeze, laterFreeze) },
    'refuse',
    { reasons: [laterFreeze] },
  ],
  [
    'restart wake: an override without covers covers nothing',
    change(restart, 'wake', { override: { by: 'key:alice', owner: 'alice', reason: 'r', covers: [] } }),
    { gate: closed(freeze) },
    'refuse',
  ],
  [
    'restart wake: a window override lets it through outside its windows',
    change(restart, 'wake', { override: { by: 'k', owner: 'o', reason: 'r', covers: ['window'] } }),
    { gate: closed(window) },
    'queue',
  ],
  // restarts: approval
  ...ASKING.map((o): Row => [
    `restart ${o}: an approval policy waits for approval`,
    change(restart, o),
    { gate: open, approval },
    'pending_approval',
    { required: 1 },
  ]),
  ['restart approval: the approval itself does not ask again', change(restart, 'approval'), { gate: open, approval }, 'queue'],
  ['restart wake: a job waking does not ask again', change(restart, 'wake'), { gate: open, approval }, 'queue', { takeBudget: false }],
  [
    'restart api: a requester nobody is named for needs one approver more',
    change(restart, 'api', { requester: { ...person, ownerKnown: false } }),
    { gate: open, approval },
    'pending_approval',
    { required: 2 },
  ],
  // restarts: coalescing and budget
  [
    'restart api: joins a restart in progress',
    change(restart, 'api'),
    { gate: open, budgets: budget, holder: 'job-1' },
    'join',
    { jobId: 'job-1' },
  ],
  [
    'restart api: its own job holding the record is not a join',
    change(restart, 'api', { jobId: 'job-1' }),
    { gate: open, budgets: budget, holder: 'job-1' },
    'queue',
  ],
  [
    'restart retry: a spent budget',
    change(restart, 'retry'),
    { gate: open, budgets: budget, budgetUse: [{ used: 3, retryMs: 5000 }] },
    'over_budget',
    { retryMs: 5000 },
  ],
  [
    'restart remediation: room in the budget: queued, taking a place',
    change(restart, 'remediation'),
    {
      gate: open,
      budgets: remediationBudgets,
      budgetUse: [
        { used: 2, retryMs: 0 },
        { used: 1, retryMs: 0 },
      ],
    },
    'queue',
    { takeBudget: true },
  ],
  [
    "restart remediation: its namespace's remediation budget spent, its rule's not",
    change(restart, 'remediation'),
    {
      gate: open,
      budgets: remediationBudgets,
      budgetUse: [
        { used: 1, retryMs: 0 },
        { used: 2, retryMs: 7000 },
      ],
    },
    'over_budget',
    { retryMs: 7000, pool: remediationBudgets[1] },
  ],
  [
    'restart approval: takes its place',
    change(restart, 'approval'),
    { gate: open, budgets: budget, approval },
    'queue',
    { takeBudget: true },
  ],
  [
    'restart wake: no budget taken again',
    change(restart, 'wake'),
    { gate: open, budgets: budget, budgetUse: [{ used: 3, retryMs: 1 }] },
    'queue',
    { takeBudget: false },
  ],
  ['restart api: no policy: queued', change(restart, 'api'), { gate: open }, 'queue', { takeBudget: false }],
  // deploys
  ...ORIGINS.map((o): Row => [
    `deploy ${o}: a closed gate holds`,
    change(deploy, o),
    { gate: closed(freeze) },
    'hold',
    { until: NOW + 3_600_000 },
  ]),
  ...ASKING.map((o): Row => [
    `deploy ${o}: an approval policy waits for approval`,
    change(deploy, o),
    { gate: closed(freeze), approval },
    'pending_approval',
  ]),
  [
    'deploy approval: an approved deploy meets a freeze declared since: held',
    change(deploy, 'approval'),
    { gate: closed(laterFreeze), approval },
    'hold',
  ],
  [
    'deploy webhook: the event already has its job: join it',
    change(deploy, 'webhook'),
    { gate: open, approval, duplicateOf: 'job-9' },
    'join',
    { jobId: 'job-9' },
  ],
  ['deploy wake: its own event record is no duplicate', change(deploy, 'wake'), { gate: open, duplicateOf: 'job-9' }, 'queue'],
  ['deploy ci: open gate, no policy: queued', change(deploy, 'ci'), { gate: open }, 'queue'],
  // deploys in order: a resubmission after a newer deploy of its group started never runs, before any other guard
  ...(['retry', 'replay', 'approval'] as const).map((o): Row => [
    `deploy ${o}: a newer deploy of its group started: superseded, whatever the gate or policy`,
    change(deploy, o, { accepted: { at: NOW - 5000, id: 'old' } }),
    { gate: closed(freeze), approval, duplicateOf: 'job-9', supersededBy: 'job-new' },
    'superseded',
    { by: 'job-new' },
  ]),
];

describe('plan(change, facts, now): every guard and origin', () => {
  it.each(rows.map(([n, c, f, k, fields]) => [n, c, f, k, fields ?? {}] as const))('%s', (_name, c, facts, kind, fields) => {
    const d = plan(c, facts, NOW);
    expect(d.kind).toBe(kind);
    expect(d).toMatchObject(fields);
  });

  it('covers every origin for both kinds', () => {
    for (const o of ORIGINS) {
      expect(rows.some(([, c]) => c.origin === o && c.target.kind === 'restart')).toBe(true);
      expect(rows.some(([, c]) => c.origin === o && c.target.kind === 'deploy')).toBe(true);
    }
  });
});

describe('properties', () => {
  const reason = fc.oneof(
    fc.string({ minLength: 1, maxLength: 8 }).map((id): GateReason => ({ ...freeze, freeze_id: id })),
    fc.constant(window),
  );
  const facts = fc.record({
    reasons: fc.array(reason, { maxLength: 4 }),
    approval: fc.option(fc.constant(approval), { nil: undefined }),
    budgetUsed: fc.option(fc.integer({ min: 0, max: 5 }), { nil: undefined }),
    holder: fc.option(fc.string({ minLength: 1, maxLength: 4 }), { nil: undefined }),
  });
  const arb = fc.record({
    origin: fc.constantFrom(...ORIGINS),
    kind: fc.constantFrom<'restart' | 'deploy'>('restart', 'deploy'),
    covers: fc.array(
      fc.oneof(
        fc.constant('window'),
        fc.string({ maxLength: 10 }).map((s) => `freeze:${s}`),
      ),
      { maxLength: 4 },
    ),
    f: facts,
  });
  interface Drawn {
    origin: Origin;
    kind: 'restart' | 'deploy';
    covers: string[];
    f: { reasons: GateReason[]; approval?: typeof approval | undefined; budgetUsed?: number | undefined; holder?: string | undefined };
  }
  const build = (x: Drawn) => {
    const c = change(x.kind === 'restart' ? restart : deploy, x.origin, {
      override: { by: 'k', owner: 'o', reason: 'r', covers: x.covers },
    });
    const f: Facts = {
      gate: x.f.reasons.length ? closed(...x.f.reasons) : open,
      ...(x.f.approval ? { approval: x.f.approval } : {}),
      ...(x.f.budgetUsed !== undefined ? { budgets: budget, budgetUse: [{ used: x.f.budgetUsed, retryMs: 10 }] } : {}),
      ...(x.f.holder ? { holder: x.f.holder, duplicateOf: x.f.holder } : {}),
    };
    return { c, f, uncovered: x.f.reasons.filter((r) => !x.covers.includes(coverOf(r))) };
  };

  it('a gate reason no override covers never lets a restart through, nor queues a deploy', () => {
    fc.assert(
      fc.property(arb, (x) => {
        const { c, f, uncovered } = build(x);
        const d = plan(c, f, NOW);
        if (uncovered.length > 0 && c.target.kind === 'restart') expect(d.kind).toBe('refuse');
        if (uncovered.length > 0)
          expect(['queue', 'join', 'over_budget'].includes(d.kind) && c.target.kind === 'deploy' && d.kind === 'queue').toBe(false);
      }),
    );
  });

  it('with an approval policy, only the approval itself and a job waking are carried out without one', () => {
    fc.assert(
      fc.property(arb, (x) => {
        const { c, f } = build(x);
        const d = plan(c, f, NOW);
        if (f.approval && (d.kind === 'queue' || d.kind === 'hold')) expect(['approval', 'wake']).toContain(c.origin);
      }),
    );
  });

  it('a queued restart of a namespace with a budget takes a place unless it is a job waking', () => {
    fc.assert(
      fc.property(arb, (x) => {
        const { c, f } = build(x);
        const d = plan(c, f, NOW);
        if (d.kind === 'queue' && c.target.kind === 'restart' && f.budgets) expect(d.takeBudget).toBe(c.origin !== 'wake');
      }),
    );
  });
});
