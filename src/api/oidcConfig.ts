import { readFileSync } from 'node:fs';
import { z } from 'zod';
import { ConfigError, type ConfigProblem } from '../shared/errors.js';
import { ownerProblem } from './identity.js';
import { durationSchema } from '../shared/policy.js';
import { scopeSchema, type Scope } from '../shared/scope.js';
import { parseYamlFile } from '../shared/config.js';
import type { Role } from './apiKeys.js';

/**
 * OPS_OIDC_FILE: the OIDC issuers whose ID tokens are accepted as bearer tokens, and the claim rules that turn a verified token
 * into an owner, a role and a scope. A valid signature alone never authorizes: every rule must bind a literal owner by its
 * issuer's `kind`, since anyone can make such an issuer sign a token for an owner of their own.
 */
export const OIDC_FILE_VAR = 'OPS_OIDC_FILE';

export const OIDC_KINDS = ['github', 'gitlab', 'kubernetes', 'generic'] as const;
type OidcKind = (typeof OIDC_KINDS)[number];

/** Where a Kubernetes pod finds its own ServiceAccount token and the cluster's CA. */
export const SERVICE_ACCOUNT_DIR = '/var/run/secrets/kubernetes.io/serviceaccount';

/** A value a rule matches a claim (a top-level key or a JSON Pointer) with: equality, a glob (`*` within a path segment, `**` across `/`), or a regex. */
interface ClaimMatcher {
  readonly claim: string;
  readonly pattern: string;
  test(value: string): boolean;
}

/** A text built from claims: `{claim}` or `{/json/pointer}` placeholders in literal text. */
export interface Template {
  readonly text: string;
  render(claims: Readonly<Record<string, unknown>>): string | undefined;
}

const SCOPE_LISTS = ['hosts', 'namespaces', 'projects'] as const;
const DEPLOY_FIELDS = ['project', 'ref', 'sha'] as const;

interface OidcRule {
  /** Its `name`, else `rule-<n>`, for the audit line. */
  readonly name: string;
  readonly match: readonly ClaimMatcher[];
  readonly owner: Template;
  readonly role: Role;
  readonly scope?: Partial<Record<(typeof SCOPE_LISTS)[number], readonly Template[]>>;
  /** What a deploy by this identity is bound to (the claims name the project, ref and commit). */
  readonly deploy?: Partial<Record<(typeof DEPLOY_FIELDS)[number], Template>>;
  /** The person behind a token (GitHub `actor`, GitLab `user_login`), compared with owners by four eyes. */
  readonly person?: Template;
  readonly mayOverride: boolean;
  /** generic issuers: the claim whose exact match binds the owner. */
  readonly ownerClaim?: string;
}

export interface OidcIssuer {
  readonly issuer: string;
  readonly kind: OidcKind;
  readonly audience: string;
  /** The PEM text of `ca_file`, read with the OIDC file (not again when only the CA changes); absent: the system CAs. */
  readonly ca?: string;
  readonly caFile?: string;
  readonly discoveryAuth?: 'serviceaccount';
  readonly jwksUri?: string;
  /** How long after a successful JWKS fetch an unknown `kid` may trigger another one (ms). */
  readonly cooldownMs: number;
  /** Seconds: the longest `exp` - `iat`, and how long after `iat` a token is accepted (absent: until its `exp`). */
  readonly maxTokenLifetime: number;
  readonly maxTokenAge?: number;
  readonly rules: readonly OidcRule[];
}

/** The issuers in use: one object for the life of the process, its list replaced in place by a reload. */
export interface OidcSettings {
  issuers: OidcIssuer[];
  /** Whether OPS_OIDC_FILE is set: without it, the contract's bearer rules are unchanged in every case. */
  configured: boolean;
}

export function claimAt(claims: Readonly<Record<string, unknown>>, path: string): unknown {
  if (!path.startsWith('/')) return Object.hasOwn(claims, path) ? claims[path] : undefined;
  let at: unknown = claims;
  for (const raw of path.slice(1).split('/')) {
    const key = raw.replace(/~1/g, '/').replace(/~0/g, '~');
    if (typeof at !== 'object' || at === null || Array.isArray(at) || !Object.hasOwn(at, key)) return undefined;
    at = (at as Record<string, unknown>)[key];
  }
  return at;
}

/** A claim as text a rule can compare: strings as they are, numbers and booleans written out, nothing else. */
function claimText(value: unknown): string | undefined {
  if (typeof value === 'string') return value;
  if (typeof value === 'number' || typeof value === 'boolean') return String(value);
  return undefined;
}

/**
 * The claims as rules and deploys read them. GitLab's bare `ref` (`main`) becomes `refs/heads/main` or `refs/tags/main` by its
 * `ref_type`, always prefixed (a tag may be named `refs/heads/main`); with any other `ref_type` the token names no ref.
 */
export function normalizeClaims(kind: OidcKind, claims: Readonly<Record<string, unknown>>): Record<string, unknown> {
  const out = { ...claims };
  if (kind === 'gitlab' && 'ref' in out) {
    const prefix = out.ref_type === 'branch' ? 'refs/heads/' : out.ref_type === 'tag' ? 'refs/tags/' : undefined;
    if (typeof out.ref === 'string' && out.ref !== '' && prefix) out.ref = `${prefix}${out.ref}`;
    else delete out.ref;
  }
  return out;
}

const escapeRe = (s: string) => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');

function globRe(glob: string): RegExp {
  let out = '';
  for (let i = 0; i < glob.length; i++) {
    const c = glob[i]!;
    if (c === '*' && glob[i + 1] === '*') {
      out += '.*';
      i++;
    } else if (c === '*') out += '[^/]*';
    else if (c === '?') out += '[^/]';
    else out += escapeRe(c);
  }
  return new RegExp(`^${out}$`, 's');
}

function compileMatcher(claim: string, pattern: string): ClaimMatcher | string {
  let re: RegExp | undefined;
  try {
    if (pattern.startsWith('glob:')) re = globRe(pattern.slice(5));
    else if (pattern.startsWith('re:')) re = new RegExp(`^(?:${pattern.slice(3)})$`, 's');
  } catch {
    return 'is not a valid regular expression';
  }
  return { claim, pattern, test: re ? (v) => re.test(v) : (v) => v === pattern };
}

const PLACEHOLDER = /\{([^{}]*)\}/g;

const placeholders = (text: string): string[] => [...text.matchAll(PLACEHOLDER)].map((m) => m[1]!);

function compileTemplate(text: string): Template | string {
  const parts: Array<{ literal: string } | { claim: string }> = [];
  let last = 0;
  for (const m of text.matchAll(PLACEHOLDER)) {
    const name = m[1]!;
    if (name === '' || (name.includes('.') && !name.startsWith('/'))) {
      return `has a placeholder {${name}} that names no claim (a key with a dot takes a JSON Pointer: {/kubernetes.io/namespace})`;
    }
    parts.push({ literal: text.slice(last, m.index) }, { claim: name });
    last = m.index + m[0].length;
  }
  const tail = text.slice(last);
  if (tail.includes('{') || tail.includes('}') || parts.some((p) => 'literal' in p && /[{}]/.test(p.literal))) {
    return 'has an unbalanced { or }';
  }
  parts.push({ literal: tail });
  return {
    text,
    render(claims) {
      let out = '';
      for (const p of parts) {
        if ('literal' in p) out += p.literal;
        else {
          const v = claimText(claimAt(claims, p.claim));
          if (v === undefined || v === '') return undefined;
          out += v;
        }
      }
      return out;
    },
  };
}

const httpsUrl = z.string({ error: 'is not text' }).refine((v) => {
  const u = URL.parse(v);
  return u?.protocol === 'https:' && u.username === '' && u.password === '' && u.hash === '';
}, 'is not an https:// URL');

const templateText = z.string({ error: 'is not text (quote it)' }).min(1, 'is empty').max(512);

const ruleSchema = z.strictObject({
  name: z
    .string()
    .regex(/^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/, 'is not 1-63 letters, digits, ".", "_" or "-"')
    .optional(),
  match: z.record(z.string().min(1).max(256), z.union([z.string(), z.number(), z.boolean()]), {
    error: 'is not a mapping of claim: value',
  }),
  owner: templateText,
  role: z.enum(['readonly', 'operator'], { error: 'is not readonly or operator' }),
  scope: scopeSchema.optional(),
  deploy: z.strictObject({ project: templateText.optional(), ref: templateText.optional(), sha: templateText.optional() }).optional(),
  person: templateText.optional(),
  may_override: z.boolean({ error: 'is not true or false' }).optional(),
  owner_claim: z.string().min(1).max(256).optional(),
});

/** Longest lifetime a token may be given a bound for: a day's job timeout is GitLab's longest. */
const MAX_LIFETIME_BOUND = 7 * 86400;

const issuerSchema = z.strictObject({
  issuer: httpsUrl,
  kind: z.enum(OIDC_KINDS, { error: `is not one of ${OIDC_KINDS.join(', ')}` }),
  audience: z.string({ error: 'is required' }).min(1, 'is empty').max(256),
  ca_file: z.string().min(1).optional(),
  discovery_auth: z.literal('serviceaccount', { error: 'is not serviceaccount' }).optional(),
  jwks_uri: httpsUrl.optional(),
  jwks_cooldown_seconds: z.number().int().min(1).max(3600).optional(),
  max_token_lifetime: durationSchema(MAX_LIFETIME_BOUND, 'max_token_lifetime').optional(),
  max_token_age: durationSchema(MAX_LIFETIME_BOUND, 'max_token_age').optional(),
  rules: z.array(ruleSchema).min(1, 'lists no rule (a token matching no rule is refused)'),
});

const fileSchema = z.strictObject({ issuers: z.array(issuerSchema) });

/** Longest exp - iat by kind: GitHub's tokens live minutes, a ServiceAccount's an hour, GitLab's a job's timeout (a day at most). */
const DEFAULT_MAX_TOKEN_LIFETIME: Record<OidcKind, number> = { github: 3600, gitlab: 86400, kubernetes: 3600, generic: 3600 };

/** The claims a `person` template may read, by kind: the ones naming the person who ran the job (any claim: generic). */
const PERSON_CLAIMS: Partial<Record<OidcKind, readonly string[]>> = {
  github: ['actor', 'triggering_actor'],
  gitlab: ['user_login'],
  kubernetes: [],
};

const exact = (m: ClaimMatcher) => !m.pattern.startsWith('glob:') && !m.pattern.startsWith('re:');

/**
 * Whether a matcher fixes the text before the first `/` (an owner, a top-level group): exactly, or a glob with no wildcard
 * before it. A regex never does: whether it admits a stranger is not something a start-up check can tell.
 */
function literalHead(m: ClaimMatcher): boolean {
  if (exact(m)) return true;
  if (!m.pattern.startsWith('glob:')) return false;
  const glob = m.pattern.slice(5);
  const slash = glob.indexOf('/');
  return slash > 0 && !/[*?]/.test(glob.slice(0, slash));
}

/** A Kubernetes `sub` glob or value whose namespace part is literal: `system:serviceaccount:ci:*`. */
const K8S_SUB = /^system:serviceaccount:([a-z0-9-]+):/;

const BINDS: Record<Exclude<OidcKind, 'generic'>, { test: (m: ClaimMatcher) => boolean; what: string }> = {
  github: {
    test: (m) =>
      (['repository_owner', 'repository_owner_id', 'repository_id'].includes(m.claim) && exact(m)) ||
      (m.claim === 'repository' && literalHead(m)),
    what: 'match repository_owner, repository_owner_id or repository_id exactly, or repository exactly or as a glob with a literal owner (glob:acme/*)',
  },
  gitlab: {
    test: (m) => (['namespace_path', 'project_id'].includes(m.claim) && exact(m)) || (m.claim === 'project_path' && literalHead(m)),
    what: 'match namespace_path or project_id exactly, or project_path exactly or as a glob with a literal top-level group (glob:acme/*)',
  },
  kubernetes: {
    test: (m) =>
      (m.claim === '/kubernetes.io/namespace' && exact(m)) ||
      (m.claim === 'sub' && (exact(m) || m.pattern.startsWith('glob:')) && K8S_SUB.test(exact(m) ? m.pattern : m.pattern.slice(5))),
    what: 'match /kubernetes.io/namespace exactly, or a sub whose namespace is literal (glob:system:serviceaccount:ci:*)',
  },
};

function bindingProblem(kind: OidcKind, match: readonly ClaimMatcher[], ownerClaim: string | undefined): string | undefined {
  const why = 'binds no owner: anyone can make the issuer sign a token, so a rule must';
  if (kind === 'generic') {
    if (ownerClaim === undefined) return `${why} name the claim that binds the owner (owner_claim) and match it exactly`;
    const m = match.find((x) => x.claim === ownerClaim);
    return m && exact(m) ? undefined : `${why} match its owner_claim ${ownerClaim} exactly (a glob or re: pattern never binds)`;
  }
  if (ownerClaim !== undefined) return `has owner_claim, which only a generic issuer's rule takes`;
  return match.some((m) => BINDS[kind].test(m)) ? undefined : `${why} ${BINDS[kind].what}; a re: pattern never binds`;
}

const DEFAULT_BINDING: Partial<Record<OidcKind, { project: string; ref: string; sha: string }>> = {
  github: { project: '{repository}', ref: '{ref}', sha: '{sha}' },
  gitlab: { project: '{project_path}', ref: '{ref}', sha: '{sha}' },
};

type RawRule = z.infer<typeof ruleSchema>;

function compileRule(kind: OidcKind, raw: RawRule, index: number, where: string, problems: string[]): OidcRule | undefined {
  const at = `${where} rule ${index + 1}${raw.name ? ` ("${raw.name}")` : ''}`;
  const before = problems.length;
  const match: ClaimMatcher[] = [];
  for (const [claim, value] of Object.entries(raw.match)) {
    if (claim.includes('.') && !claim.startsWith('/')) {
      problems.push(`${at} matches a claim with a dot in its name; use a JSON Pointer (/kubernetes.io/namespace)`);
      continue;
    }
    const m = compileMatcher(claim, String(value));
    if (typeof m === 'string') problems.push(`${at} match ${claim} ${m}`);
    else match.push(m);
  }
  if (problems.length === before) {
    const p = bindingProblem(kind, match, raw.owner_claim);
    if (p) problems.push(`${at} ${p}`);
  }
  const tpl = (field: string, text: string): Template | undefined => {
    const t = compileTemplate(text);
    if (typeof t !== 'string') return t;
    problems.push(`${at} ${field} ${t}`);
  };
  const owner = tpl('owner', raw.owner);
  // An owner without placeholders is checked with the file; one built from claims when it is built.
  if (owner && !raw.owner.includes('{')) {
    const p = ownerProblem(raw.owner);
    if (p) problems.push(`${at} owner ${p}`);
  }
  const lists = raw.scope;
  const compiled = (f: (typeof SCOPE_LISTS)[number]) => lists![f]!.map((v) => tpl(`scope.${f}`, v)).filter((t) => t !== undefined);
  const scope = lists ? Object.fromEntries(SCOPE_LISTS.filter((f) => lists[f]).map((f) => [f, compiled(f)])) : undefined;
  const bind = raw.deploy ?? DEFAULT_BINDING[kind];
  const deploy = bind ? Object.fromEntries(DEPLOY_FIELDS.filter((f) => bind[f]).map((f) => [f, tpl(`deploy.${f}`, bind[f]!)])) : undefined;
  let person: Template | undefined;
  if (raw.person !== undefined) {
    const named = placeholders(raw.person);
    const allowed = PERSON_CLAIMS[kind];
    if (named.length === 0)
      problems.push(`${at} person names no claim ({actor}): a literal person would stand for every token of the rule`);
    else if (allowed && named.some((c) => !allowed.includes(c))) {
      problems.push(
        allowed.length === 0
          ? `${at} person: a ${kind} token names no person`
          : `${at} person may read only ${allowed.map((c) => `{${c}}`).join(' or ')} of a ${kind} token`,
      );
    } else person = tpl('person', raw.person);
  }
  if (problems.length > before || !owner) return undefined;
  return {
    name: raw.name ?? `rule-${index + 1}`,
    match,
    owner,
    role: raw.role,
    ...(scope ? { scope } : {}),
    ...(deploy ? { deploy } : {}),
    ...(person ? { person } : {}),
    mayOverride: raw.may_override === true,
    ...(raw.owner_claim !== undefined ? { ownerClaim: raw.owner_claim } : {}),
  };
}

/** zod's first problem of a value, worded to follow its place (`issuer 2 audience`). */
function issueText(issue: z.core.$ZodIssue): string {
  const path = issue.path.map((p) => (typeof p === 'number' ? String(p + 1) : String(p))).join(' ');
  if (issue.code === 'unrecognized_keys') return `${path ? `${path} ` : ''}has a field it does not know (${issue.keys.join(', ')})`;
  if (issue.code === 'invalid_type' && issue.message.includes('received undefined')) return `${path} is required`;
  return `${path ? `${path} ` : ''}${issue.message}`;
}

/** Parses the text of OPS_OIDC_FILE. Every problem is reported at once, each naming the issuer's and the rule's position. */
export function parseOidcFile(text: string, readFile: (path: string) => string = (p) => readFileSync(p, 'utf8')): OidcIssuer[] {
  const variable = OIDC_FILE_VAR;
  const parsed = fileSchema.safeParse(parseYamlFile(text, variable) ?? { issuers: [] });
  if (!parsed.success) {
    throw new ConfigError(parsed.error.issues.slice(0, 10).map((i): ConfigProblem => ({ variable, problem: issueText(i) })));
  }
  const problems: string[] = [];
  const issuers: OidcIssuer[] = [];
  parsed.data.issuers.forEach((e, i) => {
    const where = `issuers ${i + 1} (${e.issuer})`;
    if (issuers.some((o) => o.issuer === e.issuer)) problems.push(`${where} is listed twice`);
    let ca: string | undefined;
    if (e.ca_file) {
      try {
        ca = readFile(e.ca_file);
        if (!ca.includes('-----BEGIN CERTIFICATE-----')) problems.push(`${where} ca_file holds no PEM certificate`);
      } catch (err) {
        const code = (err as { code?: string }).code;
        problems.push(`${where} ca_file cannot be read${code ? ` (${code})` : ''}`);
      }
    }
    const rules = e.rules.map((r, j) => compileRule(e.kind, r, j, where, problems));
    const names = rules.map((r) => r?.name);
    names.forEach((n, j) => {
      if (n !== undefined && names.indexOf(n) !== j) problems.push(`${where} rule ${j + 1} repeats the name "${n}"`);
    });
    issuers.push({
      issuer: e.issuer,
      kind: e.kind,
      audience: e.audience,
      ...(ca !== undefined ? { ca, caFile: e.ca_file } : {}),
      ...(e.discovery_auth ? { discoveryAuth: e.discovery_auth } : {}),
      ...(e.jwks_uri ? { jwksUri: e.jwks_uri } : {}),
      cooldownMs: (e.jwks_cooldown_seconds ?? 30) * 1000,
      maxTokenLifetime: e.max_token_lifetime ?? DEFAULT_MAX_TOKEN_LIFETIME[e.kind],
      ...(e.max_token_age !== undefined ? { maxTokenAge: e.max_token_age } : {}),
      rules: rules.filter((r): r is OidcRule => !!r),
    });
  });
  if (problems.length > 0) throw new ConfigError(problems.map((problem) => ({ variable, problem })));
  return issuers;
}

/** The issuer entry of an `iss` claim (exact match: the allow-list), or undefined. */
export function findIssuer(settings: Pick<OidcSettings, 'issuers'>, iss: unknown): OidcIssuer | undefined {
  return typeof iss === 'string' ? settings.issuers.find((i) => i.issuer === iss) : undefined;
}

/**
 * The first rule whose every match the (normalized) claims satisfy, rendered. A rule whose owner or scope names a claim the
 * token lacks, or renders an invalid owner, does not apply. `binds`: the deploy the claims bind; no `person`: no known person.
 */
export function grantFor(issuer: OidcIssuer, claims: Readonly<Record<string, unknown>>) {
  for (const rule of issuer.rules) {
    const ok = rule.match.every((m) => {
      const v = claimText(claimAt(claims, m.claim));
      return v !== undefined && m.test(v);
    });
    if (!ok) continue;
    const owner = rule.owner.render(claims);
    if (owner === undefined || ownerProblem(owner)) continue;
    let scope: Scope | undefined;
    if (rule.scope) {
      const render = (ts?: readonly Template[]) => ts?.map((t) => t.render(claims));
      const lists = { hosts: render(rule.scope.hosts), namespaces: render(rule.scope.namespaces), projects: render(rule.scope.projects) };
      if (Object.values(lists).some((l) => l?.some((v) => v === undefined))) continue;
      scope = Object.fromEntries(Object.entries(lists).filter(([, l]) => l !== undefined));
    }
    const binds: Partial<Record<(typeof DEPLOY_FIELDS)[number], string>> = {};
    for (const f of DEPLOY_FIELDS) {
      const v = rule.deploy?.[f]?.render(claims);
      if (v !== undefined) binds[f] = v;
    }
    const person = rule.person?.render(claims);
    const known = person !== undefined && ownerProblem(person) === undefined;
    return { rule, owner, role: rule.role, ...(scope ? { scope } : {}), binds, ...(known ? { person } : {}) };
  }
  return undefined;
}

/** The issuers and rules as GET /ops/keys lists them: what they match and give, never a key or a file's contents. */
export function describeIssuers(settings: Pick<OidcSettings, 'issuers'>) {
  return settings.issuers.map((i) => ({
    issuer: i.issuer,
    kind: i.kind,
    audience: i.audience,
    jwks_uri: i.jwksUri ?? null,
    discovery_auth: i.discoveryAuth ?? null,
    ca_file: i.caFile ?? null,
    max_token_lifetime: i.maxTokenLifetime,
    max_token_age: i.maxTokenAge ?? null,
    rules: i.rules.map((r) => ({
      name: r.name,
      match: Object.fromEntries(r.match.map((m) => [m.claim, m.pattern])),
      owner: r.owner.text,
      role: r.role,
      scope: r.scope ? Object.fromEntries(Object.entries(r.scope).map(([k, ts]) => [k, ts.map((t) => t.text)])) : null,
      deploy: r.deploy ? Object.fromEntries(Object.entries(r.deploy).map(([k, t]) => [k, t.text])) : null,
      person: r.person?.text ?? null,
      may_override: r.mayOverride,
      owner_claim: r.ownerClaim ?? null,
    })),
  }));
}
