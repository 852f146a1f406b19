import { describe, expect, it } from '@jest/globals';
import { planAlerts } from '../../../src/domain/alerts.js';
import { decidePush, pushEventId } from '../../../src/domain/deploy.js';
import { source as bitbucket } from '../../../src/sources/bitbucket.js';
import { source as generic } from '../../../src/sources/generic.js';
import { source as gitea } from '../../../src/sources/gitea.js';
import { source as github } from '../../../src/sources/github.js';
import { source as gitlab } from '../../../src/sources/gitlab.js';
import { source as scm } from '../../../src/sources/scm.js';

const decideScmPush = (event: string | undefined, payload: unknown) => decidePush(scm, event, payload);
const decideGithubPush = (event: string | undefined, payload: unknown) => decidePush(github, event, payload);
const scmEventId = (project: string, ref: string, sha: string) => pushEventId('scm', project, ref, sha);
import { validateRestart } from '../../../src/changes/restart.js';
import { restartTargetQuery } from '../../../src/routes/restartQuery.js';
import { matchApiKey } from '../../../src/middleware/auth.js';
import { parseApiKeyRoles } from '../../../src/api/apiKeys.js';
import { AppError } from '../../../src/shared/errors.js';
import { parseInventory } from '../../../src/shared/inventory.js';

const status = (fn: () => unknown): number => {
  try {
    fn();
  } catch (err) {
    if (err instanceof AppError) return err.statusCode;
    throw err;
  }
  return 0;
};

describe('event_id', () => {
  it('is scm:<project>:<ref>:<checkout_sha>', () => {
    expect(scmEventId('group/app', 'refs/heads/main', 'abc')).toBe('scm:group/app:refs/heads/main:abc');
  });
  it('project defaults to "unknown"', () => {
    expect(decideScmPush('Push Hook', { ref: 'refs/heads/main', checkout_sha: 'x' })).toEqual({
      kind: 'deploy',
      project: 'unknown',
      ref: 'refs/heads/main',
      sha: 'x',
      eventId: 'scm:unknown:refs/heads/main:x',
    });
  });
  it('keeps colons and slashes of the project as given', () => {
    const d = decideScmPush('Push Hook', { ref: 'refs/heads/main', checkout_sha: 's', project: { path_with_namespace: 'a/b:c' } });
    expect(d).toMatchObject({ eventId: 'scm:a/b:c:refs/heads/main:s' });
  });
});

describe("the contract's push rules on /webhook/scm: event, ref, checkout_sha", () => {
  it('ignores anything but exactly "Push Hook"', () => {
    for (const e of [undefined, '', 'push hook', 'Push Hook\t', 'Tag Push Hook']) {
      expect(decideScmPush(e, { ref: 'refs/heads/main', checkout_sha: 'x' })).toMatchObject({ kind: 'ignored' });
    }
  });
  it('ignores other refs, naming them; absent ref is ""', () => {
    expect(decideScmPush('Push Hook', { ref: 'refs/heads/main2', checkout_sha: 'x' })).toEqual({
      kind: 'ignored',
      code: 'not_deploy_branch',
      reason: 'ref "refs/heads/main2" is not refs/heads/main',
    });
    expect(decideScmPush('Push Hook', {})).toEqual({ kind: 'ignored', code: 'not_deploy_branch', reason: 'ref "" is not refs/heads/main' });
  });
  it('422 for a missing, empty or non-string checkout_sha, and for non-object payloads or fields of the wrong type', () => {
    expect(status(() => decideScmPush('Push Hook', { ref: 'refs/heads/main' }))).toBe(422);
    expect(status(() => decideScmPush('Push Hook', { ref: 'refs/heads/main', checkout_sha: '' }))).toBe(422);
    expect(status(() => decideScmPush('Push Hook', { ref: 'refs/heads/main', checkout_sha: 42 }))).toBe(422);
    expect(status(() => decideScmPush('Push Hook', [1]))).toBe(422);
    expect(status(() => decideScmPush('Push Hook', { ref: 5 }))).toBe(422);
    expect(status(() => decideScmPush('Push Hook', { ref: 'refs/heads/main', checkout_sha: 'x', project: 'p' }))).toBe(422);
    expect(
      status(() =>
        decideScmPush('Push Hook', { ref: 'refs/heads/main', checkout_sha: 'x', project: { path_with_namespace: 'p'.repeat(256) } }),
      ),
    ).toBe(422);
  });
});

describe('decideGithubPush', () => {
  it('push to main -> deploy with github:<full_name>:<ref>:<after>', () => {
    expect(decideGithubPush('push', { ref: 'refs/heads/main', after: 'abc1234', repository: { full_name: 'o/r' } })).toMatchObject({
      kind: 'deploy',
      project: 'o/r',
      eventId: 'github:o/r:refs/heads/main:abc1234',
    });
  });
  it('other events, other refs, deletions -> ignored', () => {
    expect(decideGithubPush('ping', {})).toMatchObject({ kind: 'ignored' });
    expect(decideGithubPush('push', { ref: 'refs/tags/v1', after: 'a' })).toMatchObject({ kind: 'ignored' });
    expect(decideGithubPush('push', { ref: 'refs/heads/main', after: '0'.repeat(40), deleted: true })).toMatchObject({ kind: 'ignored' });
  });
});

describe('the commit before a push (replayGuard senders only)', () => {
  const main = { ref: 'refs/heads/main', after: 'abc1234', repository: { full_name: 'o/r' } };
  it('GitHub and Gitea: `before`; absent, not a string or longer than 255 -> "" (never a 422)', () => {
    for (const source of [github, gitea]) {
      expect(decidePush(source, 'push', { ...main, before: 'f00' })).toMatchObject({ kind: 'deploy', before: 'f00' });
      expect(decidePush(source, 'push', main)).toMatchObject({ kind: 'deploy', before: '' });
      expect(decidePush(source, 'push', { ...main, before: 42 })).toMatchObject({ kind: 'deploy', before: '' });
      expect(decidePush(source, 'push', { ...main, before: 'f'.repeat(256) })).toMatchObject({ kind: 'deploy', before: '' });
      // A push to another branch is still ignored first, whatever its before.
      expect(decidePush(source, 'push', { ...main, ref: 'refs/heads/dev', before: 42 })).toMatchObject({ kind: 'ignored' });
    }
  });
  it('Bitbucket: the chosen change\'s old.target.hash; a created branch (old: null) -> ""', () => {
    const change = (old: unknown) => ({
      repository: { full_name: 'o/r' },
      push: { changes: [{ new: { type: 'branch', name: 'main', target: { hash: 'abc1234' } }, old }] },
    });
    expect(decidePush(bitbucket, 'repo:push', change({ type: 'branch', name: 'main', target: { hash: 'f00' } }))).toMatchObject({
      before: 'f00',
      sha: 'abc1234',
    });
    expect(decidePush(bitbucket, 'repo:push', change(null))).toMatchObject({ kind: 'deploy', before: '' });
  });
  it('the token senders carry none: their pushes keep the contract rule', () => {
    expect(github.replayGuard && gitea.replayGuard && bitbucket.replayGuard).toBe(true);
    expect(scm.replayGuard).toBeUndefined();
    expect(gitlab.replayGuard).toBeUndefined();
    const scmPush = { ref: 'refs/heads/main', before: 'f00', checkout_sha: 'abc1234' };
    expect(decideScmPush('Push Hook', scmPush)).not.toHaveProperty('before');
    expect(decidePush(gitlab, 'Push Hook', scmPush)).not.toHaveProperty('before');
  });
});

describe("the pushed commit: a commit id from the vendors, any non-empty value on the contract's senders", () => {
  /** A push to main of `sha`, as each sender shapes it. */
  const pushOf = (name: string, sha: unknown): unknown => {
    if (name === 'bitbucket') {
      return { repository: { full_name: 'o/r' }, push: { changes: [{ new: { type: 'branch', name: 'main', target: { hash: sha } } }] } };
    }
    if (name === 'gitlab' || name === 'scm') return { ref: 'refs/heads/main', checkout_sha: sha, project: { path_with_namespace: 'o/r' } };
    return { ref: 'refs/heads/main', after: sha, repository: { full_name: 'o/r' } };
  };
  const detail = (fn: () => unknown): string => {
    try {
      fn();
    } catch (err) {
      if (err instanceof AppError) return `${err.statusCode} ${err.message}`;
      throw err;
    }
    return 'no error';
  };

  it('GitHub, GitLab, Gitea, Bitbucket declare hex commit ids; scm and generic any value', () => {
    expect([github, gitlab, gitea, bitbucket].map((s) => s.commitForm)).toEqual(['hex', 'hex', 'hex', 'hex']);
    expect([scm, generic].map((s) => s.commitForm)).toEqual(['any', 'any']);
  });

  it("a vendor's commit that is not 7 to 64 hex digits is 422 naming the field; abbreviated and SHA-256 ids pass", () => {
    for (const source of [github, gitlab, gitea, bitbucket]) {
      const push = (sha: unknown) => pushOf(source.name, sha);
      for (const bad of ['HEAD~3', '--orphan=x', 'abc12', 'main', 'g'.repeat(40), 'a'.repeat(65), ' abc1234', 'abc1234\n']) {
        expect(detail(() => decidePush(source, source.event.push, push(bad)))).toBe(
          `422 ${source.commitField} must be a commit id of 7 to 64 hex digits, not ${JSON.stringify(bad)}`,
        );
      }
      for (const good of ['abc1234', 'ABCDEF0', '6113728f27ae82c7b1a177c8d03f9e96e0adf246', 'f'.repeat(64)]) {
        expect(decidePush(source, source.event.push, push(good))).toMatchObject({ kind: 'deploy', sha: good });
      }
      // The contract's order: another event, then another branch, are ignored before the commit is read.
      expect(decidePush(source, 'not-a-push', push('HEAD~3'))).toMatchObject({ kind: 'ignored', code: 'not_a_push' });
      const other = JSON.parse(JSON.stringify(push('HEAD~3')).replace('refs/heads/main', 'refs/heads/dev').replace('"main"', '"dev"'));
      expect(decidePush(source, source.event.push, other)).toMatchObject({ kind: 'ignored', code: 'not_deploy_branch' });
    }
  });

  it("/webhook/scm keeps the contract's rule: any non-empty checkout_sha", () => {
    for (const sha of ['--orphan=x', 'HEAD~3', 'x']) {
      expect(decideScmPush('Push Hook', pushOf('scm', sha))).toMatchObject({ kind: 'deploy', sha });
    }
  });
});

describe('planAlerts: payload shape, firing alerts', () => {
  it('422 unless an object with an alerts array', () => {
    for (const p of [null, [], 'x', 1, {}, { alerts: {} }, { alerts: null }]) expect(status(() => planAlerts(p, 'a', 'w'))).toBe(422);
  });
  it('counts every alert, firing ones, and plans only firing alerts with a fingerprint', () => {
    const plan = planAlerts(
      {
        alerts: [
          { status: 'firing', fingerprint: 'f' },
          { status: 'resolved', fingerprint: 'g' },
          { status: 'firing' },
          null,
          { status: 'FIRING', fingerprint: 'h' },
        ],
      },
      'audit',
      'webhook:alerts',
    );
    expect(plan.received).toBe(5);
    expect(plan.firing).toBe(2);
    expect(plan.planned.map((p) => p.data)).toEqual([
      { alertname: 'unknown', annotations: {}, fingerprint: 'f', audit_id: 'audit', requested_by: 'webhook:alerts' },
    ]);
  });
});

describe('validateRestart', () => {
  const inv = parseInventory('hosts:\n  web-1:\n    namespace: shop\n    deployments: [frontend]\n');
  it('422 for missing or repeated parameters, 404 outside the inventory', () => {
    expect(status(() => restartTargetQuery({ service: 'frontend' }))).toBe(422);
    expect(status(() => restartTargetQuery({ host: 'web-1' }))).toBe(422);
    expect(status(() => restartTargetQuery({ host: ['web-1', 'web-1'], service: 'frontend' }))).toBe(422);
    expect(status(() => validateRestart(inv, 'web-2', 'frontend'))).toBe(404);
    expect(status(() => validateRestart(inv, 'web-1', 'backend'))).toBe(404);
    expect(status(() => validateRestart(inv, 'toString', 'frontend'))).toBe(404);
    expect(validateRestart(inv, 'web-1', 'frontend')).toEqual({ kind: 'restart', host: 'web-1', service: 'frontend', namespace: 'shop' });
  });
});

describe('matchApiKey', () => {
  // A key listed twice is refused at start (test/unit/shared/config.test.ts), so each key has one entry.
  const keys = parseApiKeyRoles('one:readonly,two:operator');
  it('finds the configured entry for a key, or nothing', () => {
    expect(matchApiKey(keys, 'two')?.role).toBe('operator');
    expect(matchApiKey(keys, 'one')?.role).toBe('readonly');
    expect(matchApiKey(keys, 'three')).toBeUndefined();
    expect(matchApiKey(keys, '')).toBeUndefined();
  });
});
