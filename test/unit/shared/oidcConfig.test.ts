import { describe, expect, it } from '@jest/globals';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { loadApiConfig, parseApiKeysFile } from '../../../src/shared/config.js';
import { ConfigError } from '../../../src/shared/errors.js';
import { claimAt, grantFor, normalizeClaims, parseOidcFile } from '../../../src/shared/oidcConfig.js';
import { scopeAdmits } from '../../../src/shared/scope.js';

/**
 * OPS_OIDC_FILE as read at start and on reload: its shape, the deny-by-default rule per kind, the
 * claim rules (equality, glob, regex, JSON Pointer), owner templates, GitLab's ref, and scopes.
 */
const GH = 'https://token.actions.githubusercontent.com';
const file = (rules: string, kind = 'github', extra = '') => `
issuers:
  - issuer: ${GH}
    kind: ${kind}
    audience: opsgate
${extra}    rules:
${rules}`;

const problems = (text: string): string[] => {
  try {
    parseOidcFile(text, () => '-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n');
  } catch (err) {
    expect(err).toBeInstanceOf(ConfigError);
    return (err as ConfigError).problems.map((p) => `${p.variable}: ${p.problem}`);
  }
  return [];
};

describe('parseOidcFile', () => {
  it('reads issuers and rules; the owner is built from claims; github binds project, ref and sha by default', () => {
    const [i] = parseOidcFile(
      file(`      - match: {repository: acme/storefront, ref: refs/heads/main}
        owner: "github:{repository}"
        role: operator
        scope: {projects: [acme/storefront], hosts: [web-01]}
`),
    );
    expect(i).toMatchObject({ issuer: GH, kind: 'github', audience: 'opsgate', cooldownMs: 30_000 });
    const g = grantFor(i!, { repository: 'acme/storefront', ref: 'refs/heads/main', sha: 'abc' });
    expect(g).toMatchObject({
      owner: 'github:acme/storefront',
      role: 'operator',
      scope: { projects: ['acme/storefront'], hosts: ['web-01'] },
      binds: { project: 'acme/storefront', ref: 'refs/heads/main', sha: 'abc' },
    });
    expect(g!.rule.name).toBe('rule-1');
    expect(grantFor(i!, { repository: 'acme/storefront', ref: 'refs/heads/dev' })).toBeUndefined();
    expect(grantFor(i!, { repository: 'acme/storefront-evil', ref: 'refs/heads/main' })).toBeUndefined();
  });

  it('matches by glob (* within a segment, ** across), by anchored regex, and by JSON Pointer', () => {
    const [i] = parseOidcFile(
      file(
        `      - match: {/kubernetes.io/namespace: "glob:team-*", sub: "re:system:serviceaccount:team-[a-z]+:(bot|ci)"}
        owner: "k8s:{/kubernetes.io/namespace}/{/kubernetes.io/serviceaccount/name}"
        role: operator
`,
        'kubernetes',
      ),
    );
    const claims = (ns: string, sa: string) => ({
      sub: `system:serviceaccount:${ns}:${sa}`,
      'kubernetes.io': { namespace: ns, serviceaccount: { name: sa } },
    });
    expect(grantFor(i!, claims('team-a', 'ci'))?.owner).toBe('k8s:team-a/ci');
    expect(grantFor(i!, claims('team-a', 'cix'))).toBeUndefined();
    expect(grantFor(i!, claims('team-a/x', 'ci'))).toBeUndefined();
    expect(claimAt({ 'a/b': { '~c': 1 } }, '/a~1b/~0c')).toBe(1);
    expect(claimAt({ a: 1 }, '/a/b')).toBeUndefined();
    expect(claimAt(Object.create({ inherited: 'x' }) as Record<string, unknown>, 'inherited')).toBeUndefined();
  });

  it("normalizes GitLab's bare ref to refs/heads/<branch> (refs/tags/<tag> for a tag)", () => {
    expect(normalizeClaims('gitlab', { ref: 'main', ref_type: 'branch' }).ref).toBe('refs/heads/main');
    expect(normalizeClaims('gitlab', { ref: 'v1.2', ref_type: 'tag' }).ref).toBe('refs/tags/v1.2');
    expect(normalizeClaims('github', { ref: 'main' }).ref).toBe('main');
  });

  it('a rule whose owner names a claim the token lacks, or builds no valid owner, does not apply', () => {
    const [i] = parseOidcFile(
      file(`      - match: {repository: "glob:acme/*"}
        owner: "github:{environment}"
        role: operator
`),
    );
    expect(grantFor(i!, { repository: 'acme/a' })).toBeUndefined();
    expect(grantFor(i!, { repository: 'acme/a', environment: 'has space' })).toBeUndefined();
    expect(grantFor(i!, { repository: 'acme/a', environment: 'prod' })?.owner).toBe('github:prod');
  });

  it.each([
    [
      'github without a repository constraint',
      file('      - {match: {ref: refs/heads/main}, owner: ci, role: operator}\n'),
      /rule 1 puts no constraint on the repository/,
    ],
    [
      'github with a repository glob that admits anything',
      file('      - {match: {repository: "glob:**"}, owner: ci, role: operator}\n'),
      /no constraint on the repository/,
    ],
    [
      'github with a regex that admits anything',
      file('      - {match: {repository: "re:.*"}, owner: ci, role: operator}\n'),
      /no constraint on the repository/,
    ],
    [
      'gitlab without project_path',
      file('      - {match: {namespace_path: acme}, owner: ci, role: operator}\n', 'gitlab'),
      /no constraint on the project path/,
    ],
    [
      'kubernetes without a namespace',
      file('      - {match: {"/kubernetes.io/serviceaccount/name": bot}, owner: ci, role: operator}\n', 'kubernetes'),
      /no constraint on the namespace/,
    ],
    [
      'kubernetes with a sub glob over every namespace',
      file('      - {match: {sub: "glob:system:serviceaccount:*:bot"}, owner: ci, role: operator}\n', 'kubernetes'),
      /no constraint on the namespace/,
    ],
    [
      'generic without sub',
      file('      - {match: {email: a@b.c}, owner: ci, role: operator}\n', 'generic'),
      /no constraint on the subject/,
    ],
    [
      'a dotted claim name without a pointer',
      file('      - {match: {repository: a/b, kubernetes.io: x}, owner: ci, role: operator}\n'),
      /use a JSON Pointer/,
    ],
    ['an invalid regex', file('      - {match: {repository: "re:("}, owner: ci, role: operator}\n'), /not a valid regular expression/],
    ['an unbalanced template', file('      - {match: {repository: a/b}, owner: "gh:{repository", role: operator}\n'), /unbalanced/],
    ['an invalid literal owner', file('      - {match: {repository: a/b}, owner: "two words", role: operator}\n'), /owner is not 1-128/],
    ['an unknown role', file('      - {match: {repository: a/b}, owner: ci, role: admin}\n'), /role is not readonly or operator/],
    ['no rules', file('      []\n'), /lists no rule/],
    [
      'an unknown field',
      file('      - {match: {repository: a/b}, owner: ci, role: operator, allow_all: true}\n'),
      /does not know \(allow_all\)/,
    ],
    [
      'an empty scope',
      file('      - {match: {repository: a/b}, owner: ci, role: operator, scope: {}}\n'),
      /names none of hosts, namespaces, projects/,
    ],
    [
      'an http issuer',
      file('      - {match: {repository: a/b}, owner: ci, role: operator}\n').replace('https://', 'http://'),
      /issuer is not an https:\/\/ URL/,
    ],
    ['an unknown kind', file('      - {match: {sub: a}, owner: ci, role: operator}\n', 'okta'), /kind is not one of/],
    ['not YAML', 'issuers: [', /is not valid YAML or JSON/],
  ])('refuses %s, naming OPS_OIDC_FILE', (_name, text, message) => {
    const p = problems(text);
    expect(p.length).toBeGreaterThan(0);
    expect(p.every((x) => x.startsWith('OPS_OIDC_FILE: '))).toBe(true);
    expect(p.join('\n')).toMatch(message);
  });

  it('refuses a ca_file it cannot read, or one without a certificate', () => {
    const rules = '      - {match: {repository: a/b}, owner: ci, role: operator}\n';
    expect(() => parseOidcFile(file(rules, 'github', '    ca_file: /nope/ca.pem\n'))).toThrow(/ca_file cannot be read \(ENOENT\)/);
    expect(() => parseOidcFile(file(rules, 'github', '    ca_file: /x\n'), () => 'not a pem')).toThrow(/ca_file holds no PEM certificate/);
  });

  it('start-up: a refused file stops the start with the variable named, never its contents', () => {
    const dir = mkdtempSync(join(tmpdir(), 'opsgate-oidc-unit-'));
    const path = join(dir, 'oidc.yaml');
    writeFileSync(path, file('      - {match: {ref: refs/heads/main}, owner: secret-looking-owner, role: operator}\n'));
    const env = { OPS_API_KEY_ROLES: 'k-0123456789abcdef:operator', REDIS_URL: 'redis://127.0.0.1:6379', OPS_OIDC_FILE: path };
    expect(() => loadApiConfig(env)).toThrow(ConfigError);
    try {
      loadApiConfig(env);
    } catch (err) {
      expect((err as ConfigError).variable).toBe('OPS_OIDC_FILE');
      expect((err as Error).message).not.toContain('secret-looking-owner');
    }
    expect(() => loadApiConfig({ ...env, OPS_OIDC_FILE: join(dir, 'absent.yaml') })).toThrow(/OPS_OIDC_FILE: cannot be read/);
    writeFileSync(path, file('      - {match: {repository: acme/a}, owner: ci, role: operator}\n'));
    const config = loadApiConfig(env);
    expect(config.oidc.configured).toBe(true);
    expect(config.oidc.issuers.map((i) => i.issuer)).toEqual([GH]);
    expect(config.credentialFiles.map((f) => f.variable)).toContain('OPS_OIDC_FILE');
    expect(loadApiConfig({ ...env, OPS_OIDC_FILE: '' }).oidc).toEqual({ issuers: [], configured: false });
  });
});

describe('scopes', () => {
  it.each([
    [undefined, { kind: 'host', host: 'web-1', namespace: 'shop' }, true],
    [{ hosts: ['web-1'] }, { kind: 'host', host: 'web-1', namespace: 'shop' }, true],
    [{ hosts: ['web-1'] }, { kind: 'host', host: 'web-2', namespace: 'shop' }, false],
    [{ projects: ['a/b'] }, { kind: 'host', host: 'web-1', namespace: 'shop' }, false],
    [{ projects: ['a/b'] }, { kind: 'project', project: 'a/b', namespace: 'deploys' }, true],
    [{ namespaces: ['shop'] }, { kind: 'host', host: 'web-9', namespace: 'shop' }, true],
    [{ hosts: ['web-1'], namespaces: ['shop'] }, { kind: 'host', host: 'web-1', namespace: 'data' }, false],
    [{ namespaces: ['shop'] }, { kind: 'namespace', namespace: 'shop' }, true],
    [{ hosts: ['web-1'] }, { kind: 'namespace', namespace: 'shop' }, false],
  ] as const)('%j admits %j: %s', (scope, target, admits) => {
    expect(scopeAdmits(scope, target)).toBe(admits);
  });

  it('a keys-file entry may carry one; a malformed one is refused by position, never echoing the key', () => {
    const [k] = parseApiKeysFile('- {id: ci, role: operator, key: key-0123456789abcdef, scope: {hosts: [web-1]}}\n');
    expect(k!.scope).toEqual({ hosts: ['web-1'] });
    expect(() => parseApiKeysFile('- {id: ci, role: operator, key: key-0123456789abcdef, scope: {hosts: web-1}}\n')).toThrow(
      /entry 1 \(id "ci"\) has a scope that is not a mapping of hosts, namespaces, projects/,
    );
    expect(() => parseApiKeysFile('- {id: ci, role: operator, key: key-0123456789abcdef, scope: {}}\n')).toThrow(
      /has a scope that names none/,
    );
  });
});
