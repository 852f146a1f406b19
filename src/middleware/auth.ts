import type { RequestHandler } from 'express';
import type { ApiKey, Role } from '../shared/config.js';
import { credentialId, safeEqual, secretMatcher, verifySha256Signature } from '../shared/crypto.js';
import { ForbiddenError, UnauthorizedError } from '../shared/errors.js';
import type { Metrics } from '../shared/metrics.js';

/**
 * Spec section 5. Every comparison is constant time (safeEqual) and the API key is compared with
 * every configured key, without stopping at the first match, so timing reveals neither which
 * key matched nor how many are configured. Failures are counted in
 * opsgate_auth_failures_total{scheme,reason}; the audit line gets the principal.
 */
type AuthMetrics = Pick<Metrics, 'authFailures'>;

const header = (v: string | undefined): string => (v ?? '').trim();

/** The role of a presented key, or undefined when it matches no configured key. */
export function matchApiKey(keys: readonly ApiKey[], presented: string): ApiKey | undefined {
  let found: ApiKey | undefined;
  for (const k of keys) {
    const eq = safeEqual(presented, k.key);
    if (eq && found === undefined) found = k;
  }
  return found;
}

/** `X-API-Key`: missing/empty/unknown 401; with `role: 'operator'`, a non-operator key 403. */
export function requireApiKey(keys: readonly ApiKey[], metrics: AuthMetrics, required: Role = 'readonly'): RequestHandler {
  return (req, res, next) => {
    const presented = header(req.get('x-api-key'));
    if (presented === '') {
      metrics.authFailures.inc({ scheme: 'api_key', reason: 'missing' });
      throw new UnauthorizedError('missing X-API-Key header', 'missing');
    }
    const key = matchApiKey(keys, presented);
    if (!key) {
      res.locals.presentedCredential = `key:${credentialId(presented)}`;
      metrics.authFailures.inc({ scheme: 'api_key', reason: 'invalid' });
      throw new UnauthorizedError('invalid API key', 'invalid');
    }
    // A key without a known role counts as readonly (spec 5, API key rule 5).
    const role: Role = key.role === 'operator' ? 'operator' : 'readonly';
    res.locals.principal = `key:${key.id}`;
    res.locals.role = role;
    if (required === 'operator' && role !== 'operator') {
      metrics.authFailures.inc({ scheme: 'api_key', reason: 'forbidden_role' });
      throw new ForbiddenError('this operation requires an operator key', 'forbidden_role');
    }
    next();
  };
}

const BEARER = /^(\S+)(?:\s+(.*))?$/;

/**
 * `Authorization: Bearer <token>` (scheme case-insensitive). Missing credentials, another scheme,
 * token not configured or mismatch: 401 with WWW-Authenticate. `scheme` labels the metric.
 */
export function requireBearer(
  token: string | undefined,
  metrics: AuthMetrics,
  opts: { scheme?: string; realm?: string; principal?: string } = {},
): RequestHandler {
  const scheme = opts.scheme ?? 'bearer';
  const realm = opts.realm ?? 'opsgate';
  const challenge = (error?: string) => ({
    'WWW-Authenticate': error ? `Bearer realm="${realm}", error="${error}"` : `Bearer realm="${realm}"`,
  });
  const fail = (detail: string, reason: string, error?: string): never => {
    metrics.authFailures.inc({ scheme, reason });
    throw new UnauthorizedError(detail, reason, challenge(error));
  };
  const matches = token ? secretMatcher(token) : undefined;
  return (req, res, next) => {
    const raw = header(req.get('authorization'));
    if (raw === '') fail('missing bearer credentials', 'missing');
    const m = BEARER.exec(raw);
    const word = m?.[1] ?? '';
    const presented = (m?.[2] ?? '').trim();
    if (word.toLowerCase() !== 'bearer') fail('authorization scheme must be Bearer', 'scheme', 'invalid_request');
    if (presented === '') fail('missing bearer token', 'missing', 'invalid_request');
    if (token === undefined || token === '') fail('bearer authentication is not configured', 'not_configured', 'invalid_token');
    if (!matches!(presented)) {
      res.locals.presentedCredential = `bearer:${credentialId(presented)}`;
      fail('invalid bearer token', 'invalid', 'invalid_token');
    }
    res.locals.principal = opts.principal ?? `bearer:${credentialId(presented)}`;
    next();
  };
}

/** Which token header a shared-secret webhook uses (X-Scm-Token by default; GitLab's X-Gitlab-Token for /webhook/gitlab). */
export interface TokenHeader {
  header: string;
  scheme: string;
  source: string;
  what: string;
}
const SCM_TOKEN: TokenHeader = { header: 'X-Scm-Token', scheme: 'scm_token', source: 'scm', what: 'source-control' };

/** `X-Scm-Token` must equal SCM_WEBHOOK_SECRET (constant time): not configured, missing or mismatch -> 403. Runs before the body is read. */
export function requireScmToken(secret: string | undefined, metrics: AuthMetrics, h: TokenHeader = SCM_TOKEN): RequestHandler {
  const fail = (detail: string, reason: string): never => {
    metrics.authFailures.inc({ scheme: h.scheme, reason });
    throw new ForbiddenError(detail, reason);
  };
  const matches = secret ? secretMatcher(secret) : undefined;
  return (req, res, next) => {
    if (secret === undefined || secret === '') fail(`${h.what} webhook secret is not configured`, 'not_configured');
    const presented = req.get(h.header);
    if (presented === undefined || presented === '') fail(`missing ${h.header} header`, 'missing');
    if (!matches!(presented!)) {
      res.locals.presentedCredential = `${h.scheme}:${credentialId(presented!)}`;
      fail(`invalid ${h.header}`, 'invalid');
    }
    res.locals.principal = `webhook:${h.source}`;
    next();
  };
}

/**
 * Signature variant (spec 5): `<header>: sha256=<hex HMAC-SHA256(secret, raw body)>`. Split in two
 * so nothing is read for an unconfigured source or a missing/malformed header:
 * `before` runs before the body is read, `after` verifies the digest on the raw body.
 */
export function requireSignature(
  secret: string | undefined,
  headerName: string,
  source: string,
  metrics: AuthMetrics,
): { before: RequestHandler; after: RequestHandler } {
  const fail = (detail: string, reason: string): never => {
    metrics.authFailures.inc({ scheme: 'signature', reason });
    throw new ForbiddenError(detail, reason);
  };
  const before: RequestHandler = (req, _res, next) => {
    if (secret === undefined || secret === '') fail(`${source} webhook secret is not configured`, 'not_configured');
    const value = req.get(headerName);
    if (value === undefined || value === '') fail(`missing signature (${headerName})`, 'missing');
    if (!value!.startsWith('sha256=')) fail(`missing signature (${headerName} must start with sha256=)`, 'malformed');
    next();
  };
  const after: RequestHandler = (req, res, next) => {
    const check = verifySha256Signature(secret!, Buffer.isBuffer(req.body) ? req.body : Buffer.alloc(0), req.get(headerName));
    if (!check.ok) fail(check.reason === 'mismatch' ? 'signature mismatch' : `missing signature (${headerName})`, check.reason);
    res.locals.principal = `webhook:${source}`;
    next();
  };
  return { before, after };
}
