import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { changeOfApproval } from '../../../src/changes/approvals/decide.js';
import type { Approval } from '../../../src/changes/approvals/store.js';
import { approvalView } from '../../../src/changes/approvals/view.js';
import { describeTarget, targetFields } from '../../../src/changes/execute.js';
import { policyFacts } from '../../../src/changes/facts.js';
import type { Freeze } from '../../../src/changes/freezes/store.js';
import { gate } from '../../../src/changes/gate.js';
import { kindOf, kindOfChange, kindOfJob, kinds, registerKind, sameTarget, type ChangeKind } from '../../../src/changes/kinds/index.js';
import { checkScope } from '../../../src/changes/pipeline.js';
import { plan } from '../../../src/changes/plan.js';
import type { AnyTarget, Change, Origin, Target } from '../../../src/changes/types.js';
import { changeJobOf, changeOfJob, planWake } from '../../../src/changes/wake.js';
import { parseInventory } from '../../../src/shared/inventory.js';
import { JOB, jobDataSchemas } from '../../../src/shared/jobs.js';
import type { Scope } from '../../../src/shared/scope.js';
import { processSources as sources } from '../../helpers/sourceFiles.js';

/**
 * Kinds of change are modules (src/changes/kinds/): the planner, executor, approvals, wake, retry,
 * dry run and reports look a change's kind up in the registry. This pins that nothing outside the
 * kind modules compares a change's or a target's kind, that each kind's converters agree with each
 * other, and that a kind registered here (one that records what it was asked) goes through the
 * pipeline's pure parts without a line of src/ naming it.
 */
const KINDS_DIR = 'src/changes/kinds/';

/**
 * A comparison on a kind of change: with a kind's name ('restart', 'deploy') or its job's name
 * (JOB.restartService, JOB.runDeployPipeline), either side, or a `case` on a kind's name.
 */
const COMPARISON =
  /([!=]==\s*(['"](restart|deploy)['"]|JOB\.(restartService|runDeployPipeline)\b))|((['"](restart|deploy)['"]|JOB\.(restartService|runDeployPipeline)\b)\s*[!=]==)|(\bcase\s+['"](restart|deploy)['"])/g;

export function comparisonsOnKind(text: string): string[] {
  return text.split('\n').filter((line) => (line.match(COMPARISON) ?? []).length > 0);
}

describe('a kind of change is one module', () => {
  it('nothing outside src/changes/kinds/ compares a change, a target or a job with a kind', () => {
    const found = sources()
      .filter((s) => !s.path.startsWith(KINDS_DIR))
      .flatMap((s) => comparisonsOnKind(s.text).map((line) => `${s.path}: ${line.trim()}`));
    expect(found).toEqual([]);
  });

  it('the check finds what it looks for', () => {
    expect(comparisonsOnKind("if (t.kind === 'restart') {")).toHaveLength(1);
    expect(comparisonsOnKind("  return 'deploy' !== c.name;")).toHaveLength(1);
    expect(comparisonsOnKind('if (job.name === JOB.runDeployPipeline || job.name === JOB.restartService) {')).toHaveLength(1);
    expect(comparisonsOnKind("    case 'restart':")).toHaveLength(1);
    expect(comparisonsOnKind("if (decision.kind === 'refuse') {")).toHaveLength(0);
    expect(comparisonsOnKind("const k = kindOf('restart');")).toHaveLength(0);
  });

  it('restart and deploy are registered, each by its job', () => {
    expect(kinds().map((k) => k.name)).toEqual(['restart', 'deploy']);
    expect(kindOfJob(JOB.restartService)?.name).toBe('restart');
    expect(kindOfJob(JOB.runDeployPipeline)?.name).toBe('deploy');
    expect(kindOfJob(JOB.notifyOncall)).toBeUndefined();
    expect(() => kindOf('scale')).toThrow(/unknown kind of change "scale"/);
  });
});

const inventory = parseInventory(`
hosts:
  web-1:
    namespace: shop
    deployments: [api]
projects:
  g/app:
    namespace: apps
    refs: [refs/heads/main]
    serviceAccountName: deployer
    image: registry.example/deployer:1
`);
const person = { principal: 'key:alice', credential: 'c1', owner: 'alice', ownerKnown: true };
const changeOf = (target: AnyTarget, origin: Origin = 'api', over: Partial<Change> = {}): Change => ({
  target,
  requester: person,
  origin,
  auditId: 'audit-1',
  ...over,
});
const restart: Target = { kind: 'restart', host: 'web-1', service: 'api', namespace: 'shop' };
const deploy: Target = {
  kind: 'deploy',
  project: 'g/app',
  ref: 'refs/heads/main',
  sha: 'abc',
  namespace: 'apps',
  eventId: 'scm:g/app:refs/heads/main:abc',
  source: 'scm',
  deliveryId: 'd-1',
};
const override = { by: 'key:bob', owner: 'bob', reason: 'hotfix', covers: ['window'] };

function approvalOf(change: Change): Approval {
  return {
    id: 'apr-aaaaaaaaaaaaaaaaaaaa',
    status: 'pending',
    change: kindOfChange(change).toApproval(change),
    requester: change.requester.principal,
    requester_credential: change.requester.credential,
    requester_owner: change.requester.owner,
    requester_owner_known: true,
    origin: change.origin,
    reason: change.reason ?? '',
    required: 1,
    approvers: [],
    created_at: 0,
    expires_at: 3_600_000,
    audit_id: change.auditId,
    identity: kindOf(change.target.kind).approvalIdentity(change.target),
  };
}

describe("each kind's converters agree: a change rebuilt from its job or its approval record is the change", () => {
  it.each([
    ['restart', changeOf(restart, 'api', { reason: 'stuck', override })],
    ['deploy', changeOf({ kind: 'deploy', project: 'g/app', ref: 'refs/heads/main', sha: 'abc', namespace: 'apps', eventId: 'e-1' })],
  ])('%s: from its job (the worker waking it, a retry)', (name, change) => {
    const kind = kindOf(name);
    const data = kindOfChange(change).jobData(change);
    expect(jobDataSchemas[kind.job].safeParse(data).success).toBe(true);
    const job = changeJobOf(kind.job, data)!;
    expect(job.name).toBe(name);
    const back = changeOfJob(inventory, job, 'job-1');
    expect(back.target).toEqual(change.target);
    expect(back.reason).toEqual(change.reason);
    expect(back.override).toEqual(change.override);
    expect(back).toMatchObject({ origin: 'wake', jobId: 'job-1', auditId: 'audit-1', requester: { principal: 'key:alice' } });
  });

  it.each([
    ['restart', changeOf(restart, 'api', { override })],
    ['deploy', changeOf(deploy)],
  ])('%s: from its approval record, the same target and override, shown and reported by its kind', (_name, change) => {
    const a = approvalOf(change);
    const back = changeOfApproval(a);
    expect(back.target).toEqual(change.target);
    expect(back.override).toEqual(change.override);
    expect(back).toMatchObject({ origin: 'approval', jobId: a.id });
    expect(sameTarget(a.change, change.target)).toBe(true);
    expect(sameTarget(a.change, change.target === restart ? deploy : restart)).toBe(false);
    expect(approvalView(a, 0)).toMatchObject({ change: change.target.kind, namespace: change.target.namespace });
  });

  it("the pipeline refuses a change outside its requester's scope, the target as its kind names it to a scope", () => {
    const scoped = (scope: Scope) => ({ ...person, scope });
    expect(() => checkScope(changeOf(restart, 'api', { requester: scoped({ hosts: ['web-1'] }) }))).not.toThrow();
    expect(() => checkScope(changeOf(restart, 'api', { requester: scoped({ hosts: ['web-2'] }) }))).toThrow(
      expect.objectContaining({ code: 'out_of_scope', statusCode: 403 }),
    );
    expect(() =>
      checkScope(changeOf(deploy, 'webhook', { requester: scoped({ projects: ['g/app'], namespaces: ['apps'] }) })),
    ).not.toThrow();
    expect(() => checkScope(changeOf(deploy, 'ci', { requester: scoped({ hosts: ['web-1'] }) }))).toThrow(
      /project g\/app \(namespace apps\) is outside the scope/,
    );
    expect(() => checkScope(changeOf(deploy, 'ci'))).not.toThrow();
  });

  it('a restart and a deploy are shown in their own words', () => {
    expect(describeTarget(restart)).toBe('restart of Deployment shop/api');
    expect(describeTarget(deploy)).toBe('deploy of g/app refs/heads/main');
    expect(targetFields(restart)).toEqual({ change: 'restart', host: 'web-1', service: 'api', namespace: 'shop' });
    expect(targetFields(deploy)).toEqual({ change: 'deploy', project: 'g/app', ref: 'refs/heads/main', namespace: 'apps' });
  });
});

/**
 * A third kind, in this test only: a `note` of a namespace, which records what it was asked. Its
 * job is the notification's; what is proven here is that the pipeline's pure parts (facts, plan,
 * approval records and views, wake, reports) ask the kind and name none. Through the real app and
 * worker, with a job of its own: test/integration/api/thirdKind.test.ts.
 */
interface NoteTarget {
  kind: 'note';
  namespace: string;
  text: string;
}
const asked: string[] = [];
const noteKind: ChangeKind<NoteTarget, { text: string; namespace: string; audit_id: string; requested_by: string }> = {
  name: 'note',
  job: JOB.notifyOncall,
  closedGate: 'hold',
  carry: 'intake',
  describe: (t) => (asked.push(`describe ${t.text}`), `note in ${t.namespace}: ${t.text}`),
  reportFields: (t) => (asked.push(`reportFields ${t.text}`), { change: 'restart', namespace: t.namespace }),
  reportWhat: (d) => `note in ${d.namespace}`,
  scopeTarget: (t) => ({ kind: 'namespace', namespace: t.namespace }),
  policyFacts: (_inventory, freezes, change, now) => {
    asked.push(`policyFacts ${change.target.text}`);
    return { gate: gate(freezes, undefined, { namespace: change.target.namespace }, now), approval: { required: 1, ttl: 60 } };
  },
  readFacts: () => Promise.resolve(),
  jobData: (c) => (
    asked.push(`jobData ${c.target.text}`),
    { text: c.target.text, namespace: c.target.namespace, audit_id: c.auditId, requested_by: c.requester.principal }
  ),
  fromJob: (_inventory, d) => (asked.push(`fromJob ${d.text}`), { target: { kind: 'note', namespace: d.namespace, text: d.text } }),
  approvalIdentity: (t) => `note:${t.namespace}:${t.text}`,
  toApproval: (c) => ({ kind: 'note', namespace: c.target.namespace, text: c.target.text }) as never,
  fromApproval: (a) => {
    const c = a as unknown as NoteTarget;
    asked.push(`fromApproval ${c.text}`);
    return { target: { kind: 'note', namespace: c.namespace, text: c.text } };
  },
  approvalView: () => ({ host: null, service: null, project: null, ref: null, override: undefined }),
  dryRun: {
    schema: undefined as never,
    data: () => undefined as never,
    answer: ({ change, decision }) => ({ change: 'note', text: change.target.text, would: decision.kind }),
  },
  intake: (t) => ({ project: `note/${t.namespace}`, ref: t.text }),
};
const freezeOfShop = (id: string, endsAt: number): Freeze => ({
  id,
  scope: 'namespace',
  namespace: 'shop',
  reason: 'sale',
  created_by: 'key:x',
  created_at: 0,
  starts_at: 0,
  ends_at: endsAt,
});
const note: NoteTarget = { kind: 'note', namespace: 'shop', text: 'hello' };

describe('a third kind, registered by a test, goes through the pipeline by the registry', () => {
  let unregister: () => void;
  beforeAll(() => {
    unregister = registerKind(noteKind);
  });
  afterAll(() => unregister());

  it('its facts and its plan: its policy asks for approval; a closed gate holds it (its closedGate), never refuses', () => {
    const change = changeOf(note);
    const facts = policyFacts(inventory, [], change, 0);
    expect(plan(change, facts, 0)).toEqual({ kind: 'pending_approval', required: 1, ttl: 60 });
    const frozen = freezeOfShop('frz-1', 1000);
    const approved = changeOf(note, 'approval');
    expect(plan(approved, policyFacts(inventory, [frozen], approved, 10), 10)).toMatchObject({ kind: 'hold', until: 1000 });
    expect(asked).toContain('policyFacts hello');
    // Its scope target is its own: a namespace.
    expect(() => checkScope(changeOf(note, 'api', { requester: { ...person, scope: { namespaces: ['shop'] } } }))).not.toThrow();
    expect(() => checkScope(changeOf(note, 'api', { requester: { ...person, scope: { namespaces: ['apps'] } } }))).toThrow(
      /namespace shop is outside the scope/,
    );
  });

  it('its approval record, its view and its report fields are its own', () => {
    const change = changeOf(note);
    const a = approvalOf(change);
    expect(a.identity).toBe('note:shop:hello');
    expect(changeOfApproval(a).target).toEqual(note);
    expect(approvalView(a, 0)).toMatchObject({ change: 'note', namespace: 'shop', host: null, project: null });
    expect(describeTarget(note)).toBe('note in shop: hello');
    expect(targetFields(note)).toMatchObject({ namespace: 'shop' });
    expect(asked).toEqual(expect.arrayContaining(['fromApproval hello', 'describe hello', 'reportFields hello']));
  });

  it('its job wakes it: rebuilt by its fromJob, held again by a freeze declared since', () => {
    const data = kindOfChange(changeOf(note)).jobData(changeOf(note));
    const job = changeJobOf(JOB.notifyOncall, data)!;
    expect(job.name).toBe('note');
    const frozen = freezeOfShop('frz-2', 5000);
    const woke = planWake(inventory, [frozen], job, 'job-9', 100);
    expect(woke.change).toMatchObject({ target: note, origin: 'wake', jobId: 'job-9' });
    expect(woke.decision).toMatchObject({ kind: 'hold', until: 5000 });
    expect(planWake(inventory, [], job, 'job-9', 100).decision).toMatchObject({ kind: 'queue' });
    expect(asked).toEqual(expect.arrayContaining(['jobData hello', 'fromJob hello']));
  });
});
