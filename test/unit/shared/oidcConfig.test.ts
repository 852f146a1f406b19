import { describe, expect, it } from '@jest/globals';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parse } from 'yaml';
import { loadApiConfig } from '../../../src/api/config.js';
import { parseApiKeysFile } from '../../../src/api/apiKeys.js';
import { ConfigError } from '../../../src/shared/errors.js';
import { claimAt, grantFor, normalizeClaims, parseOidcFile } from '../../../src/api/oidcConfig.js';
import { scopeAdmits } from '../../../src/shared/scope.js';
import { docBlocks } from '../../helpers/docBlocks.js';

/**
 * OPS_OIDC_FILE as read at start and on reload: its shape, the literal owner every rule must bind
 * by kind, the claim rules (equality, glob, regex, JSON Pointer), owner and person templates,
 * GitLab's ref, token lifetimes, and scopes.
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
    const [k] = parseOidcFile(
      file(
        `      - match: {sub: "glob:system:serviceaccount:team-a:*", /kubernetes.io/serviceaccount/name: "re:bot|ci"}
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
    expect(grantFor(k!, claims('team-a', 'ci'))?.owner).toBe('k8s:team-a/ci');
    expect(grantFor(k!, claims('team-a', 'cix'))).toBeUndefined();
    expect(grantFor(k!, claims('team-b', 'ci'))).toBeUndefined();
    const [g] = parseOidcFile(file('      - {match: {repository: "glob:acme/**", ref: "glob:refs/heads/*"}, owner: ci, role: operator}\n'));
    expect(grantFor(g!, { repository: 'acme/a/b', ref: 'refs/heads/main' })?.owner).toBe('ci');
    expect(grantFor(g!, { repository: 'acme/a', ref: 'refs/heads/release/1' })).toBeUndefined();
    expect(grantFor(g!, { repository: 'acme-evil/a', ref: 'refs/heads/main' })).toBeUndefined();
    expect(claimAt({ 'a/b': { '~c': 1 } }, '/a~1b/~0c')).toBe(1);
    expect(claimAt({ a: 1 }, '/a/b')).toBeUndefined();
    expect(claimAt(Object.create({ inherited: 'x' }) as Record<string, unknown>, 'inherited')).toBeUndefined();
  });

  it("normalizes GitLab's bare ref to refs/heads/<branch> (refs/tags/<tag> for a tag), by ref_type alone", () => {
    expect(normalizeClaims('gitlab', { ref: 'main', ref_type: 'branch' }).ref).toBe('refs/heads/main');
    expect(normalizeClaims('gitlab', { ref: 'v1.2', ref_type: 'tag' }).ref).toBe('refs/tags/v1.2');
    // A tag named like a branch's full ref stays a tag.
    expect(normalizeClaims('gitlab', { ref: 'refs/heads/main', ref_type: 'tag' }).ref).toBe('refs/tags/refs/heads/main');
    // Without a ref_type it knows, the token names no ref: no rule matching ref applies.
    expect(normalizeClaims('gitlab', { ref: 'refs/heads/main' })).not.toHaveProperty('ref');
    expect(normalizeClaims('gitlab', { ref: 'main', ref_type: 'merge_request' })).not.toHaveProperty('ref');
    expect(normalizeClaims('github', { ref: 'main' }).ref).toBe('main');
  });

  it('person: the rule names the person behind a token from its claims; an empty or invalid render is no person', () => {
    const [i] = parseOidcFile(
      file('      - {match: {repository_owner: acme}, owner: "github:{repository}", person: "{triggering_actor}", role: operator}\n'),
    );
    const base = { repository: 'acme/web', repository_owner: 'acme' };
    expect(grantFor(i!, { ...base, actor: 'alice', triggering_actor: 'bob' })).toMatchObject({ owner: 'github:acme/web', person: 'bob' });
    expect(grantFor(i!, { ...base, triggering_actor: '' })).not.toHaveProperty('person');
    expect(grantFor(i!, base)).not.toHaveProperty('person');
    expect(grantFor(i!, { ...base, triggering_actor: 'dependabot[bot]' })).not.toHaveProperty('person');
    const [none] = parseOidcFile(file('      - {match: {repository_owner: acme}, owner: ci, role: operator}\n'));
    expect(grantFor(none!, { ...base, actor: 'alice' })).not.toHaveProperty('person');
    expect(none!.rules[0]!.mayOverride).toBe(false);
  });

  it("bounds a token's lifetime by kind unless the entry says otherwise; max_token_age is optional", () => {
    const rule = (kind: string) =>
      ({
        github: '      - {match: {repository_owner: acme}, owner: ci, role: operator}\n',
        gitlab: '      - {match: {namespace_path: acme}, owner: ci, role: operator}\n',
        kubernetes: '      - {match: {/kubernetes.io/namespace: ci}, owner: ci, role: operator}\n',
        generic: '      - {match: {sub: ci-bot}, owner_claim: sub, owner: ci, role: operator}\n',
      })[kind]!;
    const lifetime = (kind: string, extra = '') => parseOidcFile(file(rule(kind), kind, extra))[0]!;
    expect(['github', 'gitlab', 'kubernetes', 'generic'].map((k) => lifetime(k).maxTokenLifetime)).toEqual([3600, 86400, 3600, 3600]);
    expect(lifetime('github', '    max_token_lifetime: 10m\n    max_token_age: 5m\n')).toMatchObject({
      maxTokenLifetime: 600,
      maxTokenAge: 300,
    });
    expect(lifetime('github').maxTokenAge).toBeUndefined();
    expect(problems(file(rule('github'), 'github', '    max_token_lifetime: 30d\n')).join('\n')).toMatch(
      /max_token_lifetime must be a duration/,
    );
  });

  it('the documented GitHub, GitLab and Kubernetes issuers (docs/keyless-callers.md) load', () => {
    const readme = fileURLToPath(new URL('../../../docs/keyless-callers.md', import.meta.url));
    const block = docBlocks(readme, ['yaml']).find((b) => /^issuers:/m.test(b.code));
    const issuers = parseOidcFile(block!.code);
    expect(issuers.map((i) => i.kind)).toEqual(['github', 'gitlab', 'kubernetes']);
    expect(issuers.every((i) => i.rules.length > 0)).toBe(true);
    expect((parse(block!.code) as { issuers: unknown[] }).issuers).toHaveLength(3);
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
    ['github matching no owner', file('      - {match: {ref: refs/heads/main}, owner: ci, role: operator}\n'), /rule 1 binds no owner/],
    ['github repository glob:*/*', file('      - {match: {repository: "glob:*/*"}, owner: ci, role: operator}\n'), /binds no owner/],
    ['github repository glob:**', file('      - {match: {repository: "glob:**"}, owner: ci, role: operator}\n'), /binds no owner/],
    ['github repository re:.+', file('      - {match: {repository: "re:.+"}, owner: ci, role: operator}\n'), /binds no owner/],
    [
      'github repository_id re:[0-9]+',
      file('      - {match: {repository_id: "re:[0-9]+"}, owner: ci, role: operator}\n'),
      /binds no owner/,
    ],
    [
      'github repository glob:acme*/*',
      file('      - {match: {repository: "glob:acme*/*"}, owner: ci, role: operator}\n'),
      /binds no owner/,
    ],
    [
      'github repository glob:acme?/*',
      file('      - {match: {repository: "glob:acme?/*"}, owner: ci, role: operator}\n'),
      /binds no owner/,
    ],
    [
      'github repository_owner glob:acme*',
      file('      - {match: {repository_owner: "glob:acme*"}, owner: ci, role: operator}\n'),
      /binds no owner/,
    ],
    [
      'gitlab project_path glob:**/*',
      file('      - {match: {project_path: "glob:**/*"}, owner: ci, role: operator}\n', 'gitlab'),
      /binds no owner: .* project_path exactly or as a glob with a literal top-level group/,
    ],
    [
      'gitlab project_path glob:*/storefront',
      file('      - {match: {project_path: "glob:*/storefront"}, owner: ci, role: operator}\n', 'gitlab'),
      /binds no owner/,
    ],
    [
      'gitlab namespace_path re:acme',
      file('      - {match: {namespace_path: "re:acme"}, owner: ci, role: operator}\n', 'gitlab'),
      /binds no owner/,
    ],
    [
      'kubernetes /kubernetes.io/namespace re:.+',
      file('      - {match: {/kubernetes.io/namespace: "re:.+"}, owner: ci, role: operator}\n', 'kubernetes'),
      /binds no owner: .* \/kubernetes.io\/namespace exactly/,
    ],
    [
      'kubernetes without a namespace',
      file('      - {match: {"/kubernetes.io/serviceaccount/name": bot}, owner: ci, role: operator}\n', 'kubernetes'),
      /binds no owner/,
    ],
    [
      'kubernetes with a sub glob over every namespace',
      file('      - {match: {sub: "glob:system:serviceaccount:*:bot"}, owner: ci, role: operator}\n', 'kubernetes'),
      /binds no owner/,
    ],
    [
      'kubernetes with a namespace glob',
      file('      - {match: {/kubernetes.io/namespace: "glob:team-*"}, owner: ci, role: operator}\n', 'kubernetes'),
      /binds no owner/,
    ],
    [
      'generic without owner_claim',
      file('      - {match: {sub: ci-bot}, owner: ci, role: operator}\n', 'generic'),
      /binds no owner: .* name the claim that binds the owner \(owner_claim\)/,
    ],
    [
      'generic whose owner_claim is matched by a glob',
      file('      - {match: {sub: "glob:ci-*"}, owner_claim: sub, owner: ci, role: operator}\n', 'generic'),
      /match its owner_claim sub exactly/,
    ],
    [
      'owner_claim on a github rule',
      file('      - {match: {repository_owner: acme}, owner_claim: repository_owner, owner: ci, role: operator}\n'),
      /has owner_claim, which only a generic issuer's rule takes/,
    ],
    [
      'a person naming no claim',
      file('      - {match: {repository_owner: acme}, person: alice, owner: ci, role: operator}\n'),
      /person names no claim/,
    ],
    [
      'a github person read from another claim',
      file('      - {match: {repository_owner: acme}, person: "{repository}", owner: ci, role: operator}\n'),
      /person may read only \{actor\} or \{triggering_actor\}/,
    ],
    [
      'a person on a kubernetes rule',
      file('      - {match: {/kubernetes.io/namespace: ci}, person: "{sub}", owner: ci, role: operator}\n', 'kubernetes'),
      /a kubernetes token names no person/,
    ],
    [
      'may_override that is not a boolean',
      file('      - {match: {repository_owner: acme}, may_override: "yes", owner: ci, role: operator}\n'),
      /may_override is not true or false/,
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
  ])('refuses %s, naming OPS_OIDC_FILE and the rule', (_name, text, message) => {
    const p = problems(text);
    expect(p.length).toBeGreaterThan(0);
    expect(p.every((x) => x.startsWith('OPS_OIDC_FILE: '))).toBe(true);
    expect(p.join('\n')).toMatch(message);
    if (/binds no owner/.test(p.join('\n'))) expect(p.join('\n')).toMatch(/issuers 1 \(https:\/\/[^)]+\) rule 1/);
  });

  it.each([
    ['github repository glob:acme/*', '      - {match: {repository: "glob:acme/*"}, owner: ci, role: operator}\n', 'github'],
    [
      'github repository_owner with a repository regex narrowing it',
      '      - {match: {repository_owner: acme, repository: "re:^acme/(web|api)$"}, owner: ci, role: operator}\n',
      'github',
    ],
    ['github repository_owner_id', '      - {match: {repository_owner_id: "65"}, owner: ci, role: operator}\n', 'github'],
    ['github repository_id', '      - {match: {repository_id: 74}, owner: ci, role: operator}\n', 'github'],
    ['github repository exactly', '      - {match: {repository: acme/web}, owner: ci, role: operator}\n', 'github'],
    ['gitlab namespace_path', '      - {match: {namespace_path: acme}, owner: ci, role: operator}\n', 'gitlab'],
    ['gitlab project_id', '      - {match: {project_id: "20"}, owner: ci, role: operator}\n', 'gitlab'],
    ['gitlab project_path glob:acme/**', '      - {match: {project_path: "glob:acme/**"}, owner: ci, role: operator}\n', 'gitlab'],
    [
      'kubernetes sub glob:system:serviceaccount:ci:*',
      '      - {match: {sub: "glob:system:serviceaccount:ci:*"}, owner: ci, role: operator}\n',
      'kubernetes',
    ],
    ['kubernetes an exact namespace', '      - {match: {/kubernetes.io/namespace: ci}, owner: ci, role: operator}\n', 'kubernetes'],
    [
      'generic with owner_claim matched exactly',
      '      - {match: {email: bot@acme.example}, owner_claim: email, owner: ci, role: operator}\n',
      'generic',
    ],
    [
      'a github person over actor',
      '      - {match: {repository_owner: acme}, person: "{actor}", may_override: true, owner: ci, role: operator}\n',
      'github',
    ],
    [
      'a gitlab person over user_login',
      '      - {match: {namespace_path: acme}, person: "{user_login}", owner: ci, role: operator}\n',
      'gitlab',
    ],
  ])('loads %s', (_name, rules, kind) => {
    expect(problems(file(rules, kind))).toEqual([]);
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
