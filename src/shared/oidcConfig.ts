import { readFileSync } from 'node:fs';
import { parse as parseYaml } from 'yaml';
import { z } from 'zod';
import { ConfigError, type ConfigProblem } from './errors.js';
import { ownerProblem } from './identity.js';
import { scopeSchema, type Scope } from './scope.js';

/**
 * OPS_OIDC_FILE (YAML or JSON): the OIDC issuers whose ID tokens opsgate accepts as bearer
 * tokens on POST /ops/restart and POST /ops/deploys, and the claim rules that turn a verified
 * token into an owner, a role and a scope. Re-read while the API runs, like the keys file
 * (src/shared/credentialReload.ts): a file that fails these checks is refused, the last good one
 * stays in use.
 *
 * A valid signature alone never authorizes: a token is accepted only through a rule whose `match`
 * its claims satisfy, and by its issuer's `kind` every rule must constrain who the caller is
 * (github: the repository, gitlab: the project path, kubernetes: the namespace, generic: the
 * subject). A file whose rules do not is refused, at start and on reload.
 */
export const OIDC_FILE_VAR = 'OPS_OIDC_FILE';

/** The roles a rule gives (those of API keys). */
export type Role = 'readonly' | 'operator';

export const OIDC_KINDS = ['github', 'gitlab', 'kubernetes', 'generic'] as const;
export type OidcKind = (typeof OIDC_KINDS)[number];

/** Where a Kubernetes pod finds its own ServiceAccount token and the cluster's CA. */
export const SERVICE_ACCOUNT_DIR = '/var/run/secrets/kubernetes.io/serviceaccount';

/** How a claim is named: a top-level key, or a JSON Pointer (RFC 6901) for a key with a dot or a nested value. */
export type ClaimPath = string;

/** A value a rule matches a claim with: equality, a glob (`*` within a path segment, `**` across `/`), or a regex. */
export interface ClaimMatcher {
  readonly claim: ClaimPath;
  /** As written in the file (for GET /ops/keys). */
  readonly pattern: string;
  test(value: string): boolean;
}

/** A text built from claims: `{claim}` or `{/json/pointer}` placeholders in literal text. */
export interface Template {
  readonly text: string;
  render(claims: Readonly<Record<string, unknown>>): string | undefined;
}

export interface DeployBinding {
  readonly project?: Template;
  readonly ref?: Template;
  readonly sha?: Template;
}

export interface OidcRule {
  /** The rule's name (its `name`, else `rule-<n>`), for the audit line. */
  readonly name: string;
  readonly match: readonly ClaimMatcher[];
  readonly owner: Template;
  readonly role: Role;
  readonly scope?: {
    readonly hosts?: readonly Template[];
    readonly namespaces?: readonly Template[];
    readonly projects?: readonly Template[];
  };
  /** What a deploy by this identity is bound to (the claims name the project, ref and commit). */
  readonly deploy?: DeployBinding;
}

export interface OidcIssuer {
  readonly issuer: string;
  readonly kind: OidcKind;
  readonly audience: string;
  /** The PEM text of `ca_file`, read with the OIDC file (again when that file changes, not when only the CA does); absent: the system CAs. */
  readonly ca?: string;
  readonly caFile?: string;
  readonly discoveryAuth?: 'serviceaccount';
  readonly jwksUri?: string;
  /** How long after a successful JWKS fetch an unknown `kid` may trigger another one (ms). */
  readonly cooldownMs: number;
  readonly rules: readonly OidcRule[];
}

/** The issuers in use: one object for the life of the process, its list replaced in place by a reload. */
export interface OidcSettings {
  issuers: OidcIssuer[];
  /** Whether OPS_OIDC_FILE is set: without it, the contract's bearer rules are unchanged in every case. */
  configured: boolean;
}

// --- claims ------------------------------------------------------------------------------

/** A claim's value by its name (own top-level key) or JSON Pointer; undefined when absent. */
export function claimAt(claims: Readonly<Record<string, unknown>>, path: ClaimPath): unknown {
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
 * The claims as rules and deploys read them. GitLab's `ref` is the bare branch or tag name
 * (`main`): it becomes `refs/heads/main` (`refs/tags/v1` when `ref_type` is tag), the form pushes
 * and the inventory's `refs` use.
 */
export function normalizeClaims(kind: OidcKind, claims: Readonly<Record<string, unknown>>): Record<string, unknown> {
  const out = { ...claims };
  if (kind === 'gitlab' && typeof out.ref === 'string' && !out.ref.startsWith('refs/')) {
    out.ref = `${out.ref_type === 'tag' ? 'refs/tags/' : 'refs/heads/'}${out.ref}`;
  }
  return out;
}

// --- patterns and templates ----------------------------------------------------------------

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

/** A matcher from its text, or the problem with it. */
function compileMatcher(claim: string, pattern: string): ClaimMatcher | string {
  if (pattern.startsWith('glob:')) {
    const re = globRe(pattern.slice(5));
    return { claim, pattern, test: (v) => re.test(v) };
  }
  if (pattern.startsWith('re:')) {
    let re: RegExp;
    try {
      re = new RegExp(`^(?:${pattern.slice(3)})$`, 's');
    } catch {
      return 'is not a valid regular expression';
    }
    return { claim, pattern, test: (v) => re.test(v) };
  }
  return { claim, pattern, test: (v) => v === pattern };
}

/** Texts no constraint admits all of: a matcher that does admits anything. */
const PROBES = ['', 'x', 'acme/storefront', 'other-org/other-repo', 'group/sub/project', 'system:serviceaccount:ns:sa'];
const unconstrained = (m: ClaimMatcher) => PROBES.every((p) => m.test(p));

const PLACEHOLDER = /\{([^{}]*)\}/g;

/** A template from its text, or the problem with it. */
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

// --- the file ------------------------------------------------------------------------------

const httpsUrl = z.string({ error: 'is not text' }).refine((v) => {
  try {
    const u = new URL(v);
    return u.protocol === 'https:' && u.username === '' && u.password === '' && u.hash === '';
  } catch {
    return false;
  }
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
});

const issuerSchema = z.strictObject({
  issuer: httpsUrl,
  kind: z.enum(OIDC_KINDS, { error: `is not one of ${OIDC_KINDS.join(', ')}` }),
  audience: z.string({ error: 'is required' }).min(1, 'is empty').max(256),
  ca_file: z.string().min(1).optional(),
  discovery_auth: z.literal('serviceaccount', { error: 'is not serviceaccount' }).optional(),
  jwks_uri: httpsUrl.optional(),
  jwks_cooldown_seconds: z.number().int().min(1).max(3600).optional(),
  rules: z.array(ruleSchema).min(1, 'lists no rule (a token matching no rule is refused)'),
});

const fileSchema = z.strictObject({ issuers: z.array(issuerSchema) });

/** The claims by which each kind must say who the caller is: a rule matching none of them authorizes any signature. */
const CONSTRAINING: Record<OidcKind, { claims: readonly string[]; what: string }> = {
  github: { claims: ['repository', 'repository_id'], what: 'the repository (match repository)' },
  gitlab: { claims: ['project_path', 'project_id'], what: 'the project path (match project_path)' },
  kubernetes: { claims: ['/kubernetes.io/namespace', 'sub'], what: 'the namespace (match /kubernetes.io/namespace)' },
  generic: { claims: ['sub'], what: 'the subject (match sub)' },
};

/** A Kubernetes `sub` match constrains the namespace only when the namespace part is literal. */
const K8S_SUB = /^system:serviceaccount:([a-z0-9-]+):/;
function constrains(kind: OidcKind, m: ClaimMatcher): boolean {
  if (!CONSTRAINING[kind].claims.includes(m.claim) || unconstrained(m)) return false;
  if (kind === 'kubernetes' && m.claim === 'sub') {
    if (m.pattern.startsWith('re:')) return false;
    const literal = m.pattern.startsWith('glob:') ? m.pattern.slice(5) : m.pattern;
    return K8S_SUB.test(literal);
  }
  return true;
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
  if (problems.length === before && !match.some((m) => constrains(kind, m))) {
    problems.push(`${at} puts no constraint on ${CONSTRAINING[kind].what}: a valid ${kind} token alone must never authorize`);
  }
  const tpl = (field: string, text: string): Template | undefined => {
    const t = compileTemplate(text);
    if (typeof t === 'string') {
      problems.push(`${at} ${field} ${t}`);
      return undefined;
    }
    return t;
  };
  const owner = tpl('owner', raw.owner);
  // An owner without placeholders is checked with the file; one built from claims when it is built.
  if (owner && !raw.owner.includes('{')) {
    const p = ownerProblem(raw.owner);
    if (p) problems.push(`${at} owner ${p}`);
  }
  const list = (field: string, values?: readonly string[]) =>
    values?.map((v) => tpl(`scope.${field}`, v)).filter((t): t is Template => !!t);
  const scope = raw.scope
    ? {
        ...(raw.scope.hosts ? { hosts: list('hosts', raw.scope.hosts)! } : {}),
        ...(raw.scope.namespaces ? { namespaces: list('namespaces', raw.scope.namespaces)! } : {}),
        ...(raw.scope.projects ? { projects: list('projects', raw.scope.projects)! } : {}),
      }
    : undefined;
  const bind = raw.deploy ?? DEFAULT_BINDING[kind];
  const deploy = bind
    ? {
        ...(bind.project ? { project: tpl('deploy.project', bind.project) } : {}),
        ...(bind.ref ? { ref: tpl('deploy.ref', bind.ref) } : {}),
        ...(bind.sha ? { sha: tpl('deploy.sha', bind.sha) } : {}),
      }
    : undefined;
  if (problems.length > before || !owner) return undefined;
  return {
    name: raw.name ?? `rule-${index + 1}`,
    match,
    owner,
    role: raw.role,
    ...(scope ? { scope } : {}),
    ...(deploy ? { deploy } : {}),
  };
}

/** zod's first problem of a value, worded to follow its place (`issuer 2 audience`). */
function issueText(issue: z.core.$ZodIssue): string {
  const path = issue.path.map((p) => (typeof p === 'number' ? String(p + 1) : String(p))).join(' ');
  if (issue.code === 'unrecognized_keys') return `${path ? `${path} ` : ''}has a field it does not know (${issue.keys.join(', ')})`;
  if (issue.code === 'invalid_type' && issue.message.includes('received undefined')) return `${path} is required`;
  return `${path ? `${path} ` : ''}${issue.message}`;
}

/**
 * Parses the text of OPS_OIDC_FILE. Every problem is reported at once, each naming the issuer's
 * and the rule's position; `readFile` reads a `ca_file` (a problem when it cannot).
 */
export function parseOidcFile(text: string, readFile: (path: string) => string = (p) => readFileSync(p, 'utf8')): OidcIssuer[] {
  const variable = OIDC_FILE_VAR;
  let raw: unknown;
  try {
    raw = parseYaml(text);
  } catch {
    throw new ConfigError(variable, 'is not valid YAML or JSON');
  }
  const parsed = fileSchema.safeParse(raw ?? { issuers: [] });
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
        problems.push(`${where} ca_file cannot be read${(err as { code?: string }).code ? ` (${(err as { code?: string }).code})` : ''}`);
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

// --- rules -----------------------------------------------------------------------------------

/** What a matching rule gives a verified token. */
export interface OidcGrant {
  rule: OidcRule;
  owner: string;
  role: Role;
  scope?: Scope;
  /** The deploy the claims bind (each field only when the rule binds it and the claim is there). */
  binds: { project?: string; ref?: string; sha?: string };
}

/**
 * The first rule whose every match the claims satisfy (claims normalized for the issuer's kind),
 * rendered: its owner (which must be a valid owner), role, scope and deploy binding. A rule whose
 * owner or scope names a claim the token lacks does not apply. Undefined: no rule applies.
 */
export function grantFor(issuer: OidcIssuer, claims: Readonly<Record<string, unknown>>): OidcGrant | undefined {
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
    const binds: OidcGrant['binds'] = {};
    for (const f of ['project', 'ref', 'sha'] as const) {
      const v = rule.deploy?.[f]?.render(claims);
      if (v !== undefined) binds[f] = v;
    }
    return { rule, owner, role: rule.role, ...(scope ? { scope } : {}), binds };
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
    rules: i.rules.map((r) => ({
      name: r.name,
      match: Object.fromEntries(r.match.map((m) => [m.claim, m.pattern])),
      owner: r.owner.text,
      role: r.role,
      scope: r.scope
        ? {
            ...(r.scope.hosts ? { hosts: r.scope.hosts.map((t) => t.text) } : {}),
            ...(r.scope.namespaces ? { namespaces: r.scope.namespaces.map((t) => t.text) } : {}),
            ...(r.scope.projects ? { projects: r.scope.projects.map((t) => t.text) } : {}),
          }
        : null,
      deploy: r.deploy ? Object.fromEntries(Object.entries(r.deploy).map(([k, t]) => [k, (t as Template).text])) : null,
    })),
  }));
}
