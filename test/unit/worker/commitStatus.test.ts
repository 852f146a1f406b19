import { describe, expect, it } from '@jest/globals';
import { readFileSync } from 'node:fs';
import { DEPLOY_STATES } from '../../../src/changes/deployOrder/history.js';
import { loadWorkerConfig } from '../../../src/shared/config.js';
import { parseInventory } from '../../../src/shared/inventory.js';
import { secretsForWorker } from '../../../worker/secrets.js';
import { senderOf, STATE_RANK, STATUS_TABLE, statusCall } from '../../../worker/commitStatus.js';

/**
 * The states each host is told (worker/commitStatus.ts STATUS_TABLE): every opsgate state has a
 * row, every value is one its host accepts (the hosts' own descriptions: @octokit/openapi and
 * test/fixtures/commit-status), and docs/deploys.md shows exactly this table.
 */
const read = (path: string) => readFileSync(new URL(`../../../${path}`, import.meta.url), 'utf8');
type Json = Record<string, any>;
const octokit = JSON.parse(read('node_modules/@octokit/openapi/generated/api.github.com.json')) as Json;
const body = (path: string) => octokit.paths[path].post.requestBody.content['application/json'].schema as Json;
const fixture = (name: string) => JSON.parse(read(`test/fixtures/commit-status/${name}.json`)) as Json;

const accepted = {
  deployment: body('/repos/{owner}/{repo}/deployments/{deployment_id}/statuses').properties.state.enum as string[],
  commit: body('/repos/{owner}/{repo}/statuses/{sha}').properties.state.enum as string[],
  gitlab: fixture('gitlab').body.properties.state.enum as string[],
  gitea: fixture('gitea').definitions.CommitStatusState.enum as string[],
  bitbucket: fixture('bitbucket').components.schemas.commitstatus.properties.state.enum as string[],
};

describe('STATUS_TABLE', () => {
  it('has a row for every state of the history, and a rank', () => {
    expect(Object.keys(STATUS_TABLE).sort()).toEqual([...DEPLOY_STATES].sort());
    expect(Object.keys(STATE_RANK).sort()).toEqual([...DEPLOY_STATES].sort());
  });

  it("tells each host only states its description accepts; GitHub's cancelled is inactive", () => {
    for (const [state, row] of Object.entries(STATUS_TABLE)) {
      for (const host of Object.keys(accepted) as Array<keyof typeof accepted>) {
        expect([state, host, accepted[host].includes(row[host])]).toEqual([state, host, true]);
      }
    }
    expect(STATUS_TABLE.cancelled.deployment).toBe('inactive');
    expect(STATUS_TABLE.cancelled.description).toMatch(/cancelled/);
  });

  it('is the table docs/deploys.md shows', () => {
    const md = read('docs/deploys.md');
    const rows = md.split('\n').filter((l) => /^\| `[a-z_]+` \|/.test(l));
    const shown = Object.fromEntries(
      rows.map((l) => {
        const cells = l
          .split('|')
          .slice(1, -1)
          .map((c) => c.trim());
        return [cells[0]!.replace(/`/g, ''), cells.slice(1).map((c) => /^`([^`]+)`/.exec(c)?.[1])];
      }),
    );
    const want = Object.fromEntries(
      Object.entries(STATUS_TABLE).map(([s, r]) => [s, [r.deployment, r.commit, r.gitlab, r.gitea, r.bitbucket]]),
    );
    expect(shown).toEqual(want);
  });
});

describe('senderOf', () => {
  const inventory = parseInventory(`
projects:
  a/b: {namespace: x, serviceAccountName: y, image: z, sender: gitea}
  c/d: {namespace: x, serviceAccountName: y, image: z}
`);
  it("a push's own sender (GitLab through /webhook/scm too), else the project's `sender`, else nobody", () => {
    expect(senderOf(inventory, { project: 'c/d', event_id: 'github:c/d:refs/heads/main:abc', sha: 'abc' })).toBe('github');
    expect(senderOf(inventory, { project: 'c/d', event_id: 'scm:c/d:refs/heads/main:abc', sha: 'abc' })).toBe('gitlab');
    expect(senderOf(inventory, { project: 'a/b', event_id: 'ci:a/b:refs/heads/main:abc', sha: 'abc' })).toBe('gitea');
    expect(senderOf(inventory, { project: 'a/b', event_id: 'generic:a/b:refs/heads/main:abc', sha: 'abc' })).toBe('gitea');
    expect(senderOf(inventory, { project: 'c/d', event_id: 'ci:c/d:refs/heads/main:abc', sha: 'abc' })).toBeUndefined();
    expect(senderOf(inventory, { project: 'a/b', sha: 'abc' })).toBeUndefined();
    expect(senderOf(inventory, { project: 'a/b', event_id: 'github:a/b:refs/heads/main:abc' })).toBeUndefined();
  });
});

describe('statusCall', () => {
  const report = {
    deploy_id: '42',
    sender: 'gitlab' as const,
    project: 'group/sub/app',
    ref: 'refs/heads/main',
    sha: 'abc123',
    state: 'superseded',
    environment: 'prod',
    mode: 'deployment' as const,
    detail: '57',
    audit_id: 'a',
    requested_by: 'gitlab',
  };
  it("encodes GitLab's project path as its id, and names the superseding deploy", () => {
    const c = statusCall(report, 'https://o.example/ops/deploys/42');
    expect(c.path).toBe('/projects/group%2Fsub%2Fapp/statuses/abc123');
    expect(c.body).toEqual({
      state: 'canceled',
      ref: 'main',
      name: 'opsgate/prod',
      description: 'superseded by a newer deploy (57)',
      target_url: 'https://o.example/ops/deploys/42',
    });
  });
  it('refuses a project that is not owner/repository where the host needs one', () => {
    expect(() => statusCall({ ...report, sender: 'gitea', project: 'lonely' }, undefined)).toThrow(/owner\/repository/);
  });
});

it("the worker's logger redacts the hosts' inline tokens", () => {
  const config = loadWorkerConfig({
    REDIS_URL: 'redis://r:6379',
    GITHUB_STATUS_BEARER_TOKEN: 'ghp-inline-token-0001',
    GITEA_STATUS_BEARER_TOKEN: 'gitea-inline-0002',
  });
  expect(secretsForWorker(config)).toEqual(expect.arrayContaining(['ghp-inline-token-0001', 'gitea-inline-0002']));
});
