import { randomUUID, timingSafeEqual } from 'node:crypto';
import type { RequestHandler, Response } from 'express';
import type { Redis } from 'ioredis';
import type { Source } from '../sources/index.js';
import { expiryHeaders, keyStatus, rfc3339, type KeyUsage } from '../api/apiKeyLifetime.js';
import type { ApiKey, Role } from '../api/apiKeys.js';
import { credentialId, firstMatch, hmacSha256, secretsMatcher, sha256Digest } from '../shared/crypto.js';
import { ApiKeyExpiredError, ForbiddenError, RedisUnavailableError, UnauthorizedError, type ErrorCodeOf } from '../shared/errors.js';
import { bearerIdentity, keyIdentity, senderIdentity, type Identity } from '../api/identity.js';
import { signatureSeenKey } from '../shared/keys.js';
import { SECRET_ROLES, type SecretValues } from '../shared/liveSecrets.js';
import type { Logger } from '../shared/logger.js';
import { defineLua, loadLua } from '../shared/lua.js';
import type { Metrics } from '../shared/metrics.js';
import type { OidcVerifier } from './oidc.js';

/**
 * API keys, bearer tokens (the shared one, and OIDC ID tokens: src/middleware/oidc.ts) and webhook senders' proofs. Every comparison is constant time (src/shared/crypto.ts) and the API key is compared with
 * every configured key, without stopping at the first match, so timing reveals neither which
 * key matched nor how many are configured. Failures are counted in
 * opsgate_auth_failures_total{scheme,reason}. Every accepted credential sets res.locals.principal,
 * .owner and .ownerKnown (src/api/identity.ts), and .credential for a secret the caller presented
 * itself; the audit line names them.
 */
type AuthMetrics = Pick<Metrics, 'authFailures'>;

const header = (v: string | undefined): string => (v ?? '').trim();

/** Who the request is, for everything after the check (routes, four eyes, the audit line). */
function setIdentity(res: { locals: Record<string, unknown> }, identity: Identity): void {
  res.locals.principal = identity.principal;
  res.locals.owner = identity.owner;
  res.locals.ownerKnown = identity.ownerKnown;
  res.locals.person = identity.person;
  res.locals.mayOverride = identity.mayOverride;
}

/**
 * The configured key a presented key is, expired or not, or undefined. The presented key is
 * hashed once and its digest compared with every configured digest (a clear key's and a
 * `sha256` entry's alike) in constant time.
 */
function findApiKey(keys: readonly ApiKey[], presented: string): ApiKey | undefined {
  const digest = sha256Digest(presented);
  let found: ApiKey | undefined;
  for (const k of keys) {
    const eq = timingSafeEqual(digest, k.digest);
    if (eq && found === undefined) found = k;
  }
  return found;
}

/** The key a presented key is, or undefined when it matches no configured key or its key has expired. */
export function matchApiKey(keys: readonly ApiKey[], presented: string, now: number = Date.now()): ApiKey | undefined {
  const key = findApiKey(keys, presented);
  return key && (key.expiresAt === undefined || now < key.expiresAt) ? key : undefined;
}

/** What requireApiKey does with keys that expire, and where it notes their use. */
export interface ApiKeyPolicy {
  /** API_KEY_EXPIRY_WARNING_DAYS (default 14). */
  warningDays?: number;
  /** The clock expiry is judged by (ms); default Date.now. */
  now?: () => number;
  /** Last use, shared through Redis; absent: not recorded. */
  usage?: Pick<KeyUsage, 'record'>;
}

/** What a router that checks X-API-Key reads: the keys, the failure counter and the keys' policy. */
export interface KeyedDeps {
  config: { apiKeys: readonly ApiKey[] };
  metrics: AuthMetrics;
  /** Expiry warnings, the clock and last use of API keys. */
  apiKeyPolicy?: ApiKeyPolicy;
}

/** A router's two key checks: any valid key, and an operator key. */
export function keyChecks(deps: KeyedDeps): { anyKey: RequestHandler; operatorKey: RequestHandler } {
  return {
    anyKey: requireApiKey(deps.config.apiKeys, deps.metrics, 'readonly', deps.apiKeyPolicy),
    operatorKey: requireApiKey(deps.config.apiKeys, deps.metrics, 'operator', deps.apiKeyPolicy),
  };
}

/**
 * `X-API-Key`: missing/empty/unknown 401; an expired key 401 naming it and its expiry; with
 * `role: 'operator'`, a non-operator key 403. A key within the warning window works, and the
 * answer (whatever its status) carries Deprecation and Sunset, the audit line a warning.
 */
export function requireApiKey(
  keys: readonly ApiKey[],
  metrics: AuthMetrics,
  required: Role = 'readonly',
  policy: ApiKeyPolicy = {},
): RequestHandler {
  const now = policy.now ?? Date.now;
  const warningDays = policy.warningDays ?? 14;
  return (req, res, next) => {
    const presented = header(req.get('x-api-key'));
    if (presented === '') {
      metrics.authFailures.inc({ scheme: 'api_key', reason: 'missing' });
      throw new UnauthorizedError('missing X-API-Key header', 'missing_api_key');
    }
    const key = findApiKey(keys, presented);
    if (!key) {
      res.locals.presentedCredential = `key:${credentialId(presented)}`;
      metrics.authFailures.inc({ scheme: 'api_key', reason: 'invalid' });
      throw new UnauthorizedError('invalid API key', 'invalid_api_key');
    }
    const at = now();
    const status = keyStatus(key, at, warningDays);
    if (status === 'expired') {
      res.locals.presentedCredential = `key:${key.id}`;
      metrics.authFailures.inc({ scheme: 'api_key', reason: 'expired' });
      throw new ApiKeyExpiredError(key.id, rfc3339(key.expiresAt!));
    }
    if (status === 'expiring') {
      for (const [name, value] of Object.entries(expiryHeaders(key.expiresAt!))) res.setHeader(name, value);
      res.locals.credentialWarning = `API key ${key.id} expires at ${rfc3339(key.expiresAt!)}`;
    }
    policy.usage?.record(key.id, at);
    // A key without a known role counts as readonly.
    const role: Role = key.role === 'operator' ? 'operator' : 'readonly';
    setIdentity(res, keyIdentity(key));
    res.locals.credential = credentialId(presented);
    res.locals.role = role;
    res.locals.scope = key.scope;
    if (required === 'operator' && role !== 'operator') {
      metrics.authFailures.inc({ scheme: 'api_key', reason: 'forbidden_role' });
      throw new ForbiddenError('this operation requires an operator key', 'operator_role_required');
    }
    next();
  };
}

/** The challenge that makes a browser prompt for HTTP Basic credentials. */
export const BASIC_CHALLENGE = 'Basic realm="opsgate", charset="UTF-8"';

const BASIC = /^basic\s+([A-Za-z0-9+/=]+)\s*$/i;

/**
 * An operator key for a page a browser opens (Bull Board): `X-API-Key` (scripts), or HTTP Basic
 * with the key as the password and any user name (a browser has no other way to send a header).
 * No, malformed or unknown credentials: 401 with the Basic challenge, so the browser prompts; a
 * key of another role: 403. Counted under the scheme presented (api_key or basic).
 */
export function requireOperatorKeyOrBasic(keys: readonly ApiKey[], metrics: AuthMetrics): RequestHandler {
  const fail = (scheme: string, reason: string, detail: string, code: ErrorCodeOf<401>): never => {
    metrics.authFailures.inc({ scheme, reason });
    throw new UnauthorizedError(detail, code, { 'WWW-Authenticate': BASIC_CHALLENGE });
  };
  return (req, res, next) => {
    let scheme: 'api_key' | 'basic' = 'api_key';
    let presented = header(req.get('x-api-key'));
    if (presented === '') {
      scheme = 'basic';
      const auth = header(req.get('authorization'));
      if (auth === '') {
        fail(scheme, 'missing', 'authentication required: X-API-Key or HTTP Basic with an operator key as password', 'missing_credentials');
      }
      const m = BASIC.exec(auth);
      const decoded = m ? Buffer.from(m[1]!, 'base64').toString('utf8') : '';
      const colon = decoded.indexOf(':');
      if (colon < 0) fail(scheme, 'malformed', 'malformed Authorization header; use HTTP Basic or X-API-Key', 'malformed_credentials');
      presented = decoded.slice(colon + 1);
      if (presented === '') fail(scheme, 'invalid', 'invalid credentials', 'invalid_credentials');
    }
    const key = matchApiKey(keys, presented);
    if (!key) {
      res.locals.presentedCredential = `key:${credentialId(presented)}`;
      fail(scheme, 'invalid', 'invalid credentials', 'invalid_credentials');
    }
    const role: Role = key!.role === 'operator' ? 'operator' : 'readonly';
    setIdentity(res, keyIdentity(key!));
    res.locals.credential = credentialId(presented);
    res.locals.role = role;
    if (role !== 'operator') {
      metrics.authFailures.inc({ scheme, reason: 'forbidden_role' });
      throw new ForbiddenError('operator role required', 'operator_role_required');
    }
    // Bull Board acts on every job of the queue: a key scoped to some hosts or projects does not reach it.
    if (key!.scope) {
      metrics.authFailures.inc({ scheme, reason: 'out_of_scope' });
      throw new ForbiddenError('a scoped key cannot use Bull Board; an unscoped operator key can', 'out_of_scope');
    }
    next();
  };
}

const SAFE_METHODS = new Set(['GET', 'HEAD', 'OPTIONS']);

/**
 * A browser resends cached Basic credentials on any request to the origin, so a state-changing
 * call from another site could ride on an operator's login (CSRF). Such calls get 403: a
 * Sec-Fetch-Site other than same-origin or none, or an Origin whose host is not this host.
 * Scripts (curl with X-API-Key) send neither header and are unaffected; reads (a top-level
 * navigation) stay possible.
 */
export function refuseCrossSiteWrites(metrics: AuthMetrics): RequestHandler {
  return (req, _res, next) => {
    if (SAFE_METHODS.has(req.method)) return next();
    const site = req.get('sec-fetch-site');
    const origin = req.get('origin');
    let crossSite = site !== undefined && site !== 'same-origin' && site !== 'none';
    if (!crossSite && origin !== undefined) {
      try {
        crossSite = origin === 'null' || new URL(origin).host !== req.get('host');
      } catch {
        crossSite = true;
      }
    }
    if (crossSite) {
      metrics.authFailures.inc({ scheme: 'basic', reason: 'cross_site' });
      throw new ForbiddenError('cross-site request refused', 'cross_site_request');
    }
    next();
  };
}

const BEARER = /^(\S+)(?:\s+(.*))?$/;

/**
 * A secret as a check reads it: a fixed value (unset or empty: not configured), or the values in
 * use at each request (a sender's secret reloaded from its file: [current] or [current, previous]).
 */
type SecretSource = string | undefined | (() => SecretValues);

const valuesOf = (secret: SecretSource): (() => SecretValues) => {
  if (typeof secret === 'function') return secret;
  const fixed: SecretValues = secret ? [secret] : [];
  return () => fixed;
};

/** Notes which value of a secret a request proved (current or previous), for its audit line. */
const noteMatch = (res: { locals: Record<string, unknown> }, index: number): void => {
  res.locals.matchedSecret = SECRET_ROLES[index] ?? 'current';
};

/**
 * `Authorization: Bearer <token>` (scheme case-insensitive). Missing credentials, another scheme,
 * token not configured or mismatch: 401 with WWW-Authenticate. `scheme` labels the metric. With
 * `noteMatch`, the audit line says which value of the token matched. The caller is `identity`
 * (default: principal `bearer:<credential id>`, owner `owner` when given, else unknown).
 */
export function requireBearer(
  token: SecretSource,
  metrics: AuthMetrics,
  opts: {
    scheme?: string;
    realm?: string;
    owner?: string;
    identity?: Identity;
    noteMatch?: boolean;
    /**
     * OIDC ID tokens (OPS_OIDC_FILE): a token that is not the shared one is verified as one when
     * its issuer is listed, whether or not the shared token is configured (an operator role required).
     */
    oidc?: OidcVerifier;
    /** The shared token is a valid credential but not for this route: 403 (POST /ops/deploys). */
    refuseShared?: boolean;
  } = {},
): RequestHandler {
  const scheme = opts.scheme ?? 'bearer';
  const realm = opts.realm ?? 'opsgate';
  const challenge = (error?: string) => ({
    'WWW-Authenticate': error ? `Bearer realm="${realm}", error="${error}"` : `Bearer realm="${realm}"`,
  });
  const fail = (detail: string, reason: string, code: ErrorCodeOf<401>, error?: string): never => {
    metrics.authFailures.inc({ scheme, reason });
    throw new UnauthorizedError(detail, code, challenge(error));
  };
  const values = valuesOf(token);
  const match = secretsMatcher(values);
  const oidc = opts.oidc;
  return async (req, res, next) => {
    const raw = header(req.get('authorization'));
    if (raw === '') fail('missing bearer credentials', 'missing', 'missing_credentials');
    const m = BEARER.exec(raw);
    const word = m?.[1] ?? '';
    const presented = (m?.[2] ?? '').trim();
    if (word.toLowerCase() !== 'bearer')
      fail('authorization scheme must be Bearer', 'scheme', 'unsupported_auth_scheme', 'invalid_request');
    if (presented === '') fail('missing bearer token', 'missing', 'missing_credentials', 'invalid_request');
    // The contract's comparison first; only a token that is not the shared one may be an OIDC token.
    const index = values().length === 0 ? -1 : match(presented);
    if (index >= 0 && opts.refuseShared) {
      metrics.authFailures.inc({ scheme, reason: 'shared_token_refused' });
      throw new ForbiddenError(
        'the shared bearer token is not accepted here: use an OIDC token or an operator key',
        'bearer_token_not_accepted',
      );
    }
    if (index < 0 && oidc) {
      let caller: Awaited<ReturnType<OidcVerifier['verify']>>;
      try {
        caller = await oidc.verify(presented);
      } catch (err) {
        res.locals.presentedCredential = `oidc:${credentialId(presented)}`;
        const status = (err as { statusCode?: number }).statusCode;
        metrics.authFailures.inc({
          scheme: 'oidc',
          reason: status === 503 ? 'issuer_unavailable' : status === 403 ? 'no_matching_rule' : 'invalid',
        });
        throw err;
      }
      if (caller) {
        setIdentity(res, caller.identity);
        res.locals.credential = caller.credential;
        res.locals.role = caller.role;
        res.locals.scope = caller.scope;
        res.locals.oidc = caller;
        if (caller.role !== 'operator') {
          metrics.authFailures.inc({ scheme: 'oidc', reason: 'forbidden_role' });
          throw new ForbiddenError(
            'this operation requires the operator role; the OIDC rule that matched gives readonly',
            'operator_role_required',
          );
        }
        return next();
      }
    }
    if (values().length === 0) fail('bearer authentication is not configured', 'not_configured', 'bearer_not_configured', 'invalid_token');
    if (index < 0) {
      res.locals.presentedCredential = `bearer:${credentialId(presented)}`;
      fail('invalid bearer token', 'invalid', 'invalid_bearer_token', 'invalid_token');
    }
    const credential = credentialId(presented);
    setIdentity(res, opts.identity ?? bearerIdentity(credential, opts.owner));
    res.locals.credential = credential;
    if (opts.noteMatch) noteMatch(res, index);
    next();
  };
}

/** A request with an X-API-Key and no Authorization header is judged by its key; any other by the bearer rules. */
function keyOrBearer(operatorKey: RequestHandler, bearer: RequestHandler): RequestHandler {
  return (req, res, next) =>
    req.get('x-api-key') !== undefined && req.get('authorization') === undefined ? operatorKey(req, res, next) : bearer(req, res, next);
}

/**
 * POST /ops/restart: the contract's bearer token, or an operator's own API key, so that each
 * operator has an identity of their own for four eyes. A request with an X-API-Key and no
 * Authorization header is judged by its key (operator role required); any other by the bearer
 * rules, so a request with neither is the contract's 401. `bearerOwner` (OPS_BEARER_TOKEN_OWNER)
 * names the token; whoever holds it, no known person stands behind it.
 */
export function requireBearerOrOperatorKey(
  keys: readonly ApiKey[],
  token: SecretSource,
  metrics: AuthMetrics,
  policy: ApiKeyPolicy = {},
  bearerOwner?: string,
  oidc?: OidcVerifier,
): RequestHandler {
  const operatorKey = requireApiKey(keys, metrics, 'operator', policy);
  const bearer = requireBearer(token, metrics, { owner: bearerOwner, ...(oidc ? { oidc } : {}) });
  return keyOrBearer(operatorKey, bearer);
}

/**
 * POST /ops/deploys: an OIDC token of a listed issuer (OPS_OIDC_FILE), or an operator's own API
 * key. A request with an X-API-Key and no Authorization header is judged by its key; any other
 * by the bearer rules, where the shared bearer token is refused (403): a deploy is asked for by
 * someone with an identity of their own.
 */
export function requireOidcOrOperatorKey(
  keys: readonly ApiKey[],
  token: SecretSource,
  metrics: AuthMetrics,
  policy: ApiKeyPolicy = {},
  oidc?: OidcVerifier,
): RequestHandler {
  const operatorKey = requireApiKey(keys, metrics, 'operator', policy);
  const bearer = requireBearer(token, metrics, { refuseShared: true, ...(oidc ? { oidc } : {}) });
  return keyOrBearer(operatorKey, bearer);
}

/**
 * A webhook sender's verification (src/sources), split in two so nothing is read for an
 * unconfigured sender or a missing or malformed header: `before` runs before the body is read,
 * `after` checks what needs the raw body. Failures are 403 (401 for a bearer token), counted
 * under the sender's scheme.
 */
interface SenderCheck {
  before: RequestHandler;
  after: RequestHandler;
}

interface SenderVerifyOptions {
  source: Pick<Source, 'name' | 'title' | 'verification'>;
  /** The sender's secret: one value, or the values in use at each request (src/shared/liveSecrets.ts). */
  secret: SecretSource;
  metrics: AuthMetrics;
  /** Where a timestamped signature is remembered, so its replay is refused. */
  redis?: Redis;
  /** Where a signature's record that could not be given back is told (default: nowhere). */
  logger?: Pick<Logger, 'warn'>;
  /** Test clocks; default Date.now. */
  now?: () => number;
}

const pass: RequestHandler = (_req, _res, next) => next();
const TIMESTAMPED = /^t=(\d{1,12}),v1=([0-9a-f]{64})$/;
const RELEASE_SIGNATURE = 'opsgateSignatureRelease';
/** src/shared/lua/signature-release.lua: deletes a signature's record only while it holds the given value. */
const RELEASE_SIGNATURE_LUA = loadLua('signature-release');
type ReleaseSignature = (key: string, mark: string) => Promise<unknown>;

/**
 * Every proof is checked against each value of the secret (during a rotation the current and the
 * previous one), all of them, each in constant time; the audit line says which one matched.
 */
export function verifySender(opts: SenderVerifyOptions): SenderCheck {
  const { source, metrics } = opts;
  const values = valuesOf(opts.secret);
  const v = source.verification;
  const verified = senderIdentity(source.name, true);
  const scheme = v.kind === 'token' ? `${source.name}_token` : v.kind === 'bearer' ? `${source.name}_bearer` : 'signature';
  const fail = (detail: string, reason: string, code: ErrorCodeOf<403>): never => {
    metrics.authFailures.inc({ scheme, reason });
    throw new ForbiddenError(detail, code);
  };
  const notConfigured = () => fail(`${source.title} webhook secret is not configured`, 'not_configured', 'webhook_secret_not_configured');
  /** Index of the value whose HMAC of `data` equals `presented` (hex compared case-insensitively), or -1. */
  const hmacMatch = (data: Buffer, presented: string, encoding: 'hex' | 'base64'): number => {
    const given = sha256Digest(encoding === 'hex' ? presented.toLowerCase() : presented);
    return firstMatch(
      given,
      values().map((secret) => sha256Digest(hmacSha256(secret, data, encoding))),
    );
  };

  if (v.kind === 'bearer') {
    // Open while no token is configured; a token file that appears later closes it (a file in use is
    // never emptied: src/api/credentialReload.ts refuses that).
    const bearer = requireBearer(values, metrics, { scheme, realm: `opsgate-${source.name}`, identity: verified, noteMatch: true });
    // Open: the path alone names the sender, and nothing proves who sent the delivery.
    const unproven = senderIdentity(source.name, false);
    return {
      before: (req, res, next) => {
        if (values().length > 0) return bearer(req, res, next);
        setIdentity(res, unproven);
        next();
      },
      after: pass,
    };
  }

  if (v.kind === 'token') {
    const match = secretsMatcher(values);
    return {
      before: (req, res, next) => {
        if (values().length === 0) notConfigured();
        const presented = req.get(v.header);
        if (presented === undefined || presented === '') fail(`missing ${v.header} header`, 'missing', 'missing_webhook_token');
        const index = match(presented!);
        if (index < 0) {
          res.locals.presentedCredential = `${scheme}:${credentialId(presented!)}`;
          fail(`invalid ${v.header}`, 'invalid', 'invalid_webhook_token');
        }
        setIdentity(res, verified);
        noteMatch(res, index);
        next();
      },
      after: pass,
    };
  }

  const rawOf = (body: unknown): Buffer => (Buffer.isBuffer(body) ? body : Buffer.alloc(0));

  if (v.kind === 'hmac') {
    const missing = v.prefix ? `missing signature (${v.header} must start with ${v.prefix})` : `missing signature (${v.header})`;
    return {
      before: (req, _res, next) => {
        if (values().length === 0) notConfigured();
        const value = req.get(v.header);
        if (value === undefined || value === '') fail(`missing signature (${v.header})`, 'missing', 'missing_signature');
        if (!value!.startsWith(v.prefix)) fail(missing, 'malformed', 'malformed_signature');
        next();
      },
      after: (req, res, next) => {
        const presented = req.get(v.header)!.slice(v.prefix.length);
        const index = hmacMatch(rawOf(req.body), presented, v.encoding);
        if (index < 0) fail('signature mismatch', 'mismatch', 'invalid_signature');
        setIdentity(res, verified);
        noteMatch(res, index);
        next();
      },
    };
  }

  // Timestamped: the timestamp bounds how long a captured delivery could be replayed, and the
  // signature's record refuses a replay within that window.
  const now = opts.now ?? Date.now;
  const redis = opts.redis;
  if (redis) defineLua(redis, RELEASE_SIGNATURE, RELEASE_SIGNATURE_LUA, 1);
  /**
   * A signature is spent with its delivery: an answer of 5xx (nothing taken in, or not known to
   * be) gives its record back when the answer is written, so the sender's retry of that very
   * request is heard; a retry whose job was queued after all is a duplicate of it (the event id's
   * deduplication). A 2xx, 3xx or 4xx answer keeps it spent. Only the record this request wrote
   * (`mark`) is deleted.
   */
  const spentWithAnswer = (res: Response, key: string, mark: string) => {
    res.once('finish', () => {
      if (res.statusCode < 500 || !redis) return;
      (redis as unknown as Record<string, ReleaseSignature>)[RELEASE_SIGNATURE]!(key, mark).catch((err: unknown) => {
        // Kept until its expiry: the sender's retry of this request is refused as a replay, a new signature is not.
        opts.logger?.warn('could not give back the signature of a delivery answered 5xx', { source: source.name, err });
      });
    });
  };
  return {
    before: (req, _res, next) => {
      if (values().length === 0) notConfigured();
      const value = req.get(v.header);
      if (value === undefined || value === '') fail(`missing signature (${v.header})`, 'missing', 'missing_signature');
      const m = TIMESTAMPED.exec(value!.trim());
      if (!m) fail(`missing signature (${v.header} must be t=<unix seconds>,v1=<hex HMAC-SHA256>)`, 'malformed', 'malformed_signature');
      const skew = Math.abs(now() / 1000 - Number(m![1]));
      if (skew > v.toleranceSeconds) {
        fail(`signature timestamp is more than ${v.toleranceSeconds} s from the server's clock`, 'stale', 'stale_signature');
      }
      next();
    },
    after: (req, res, next) => {
      const [, t, sig] = TIMESTAMPED.exec(req.get(v.header)!.trim())!;
      const index = hmacMatch(Buffer.concat([Buffer.from(`${t}.`), rawOf(req.body)]), sig!, 'hex');
      if (index < 0) fail('signature mismatch', 'mismatch', 'invalid_signature');
      setIdentity(res, verified);
      noteMatch(res, index);
      if (!redis) return next();
      // Remembered a little longer than a timestamp stays fresh, on either side of the clock, with
      // a value of this request's own, so that only it can give the record back.
      const key = signatureSeenKey(source.name, sig!);
      const mark = randomUUID();
      redis.set(key, mark, 'EX', v.toleranceSeconds * 2 + 60, 'NX').then(
        (set) => {
          if (set === null) {
            metrics.authFailures.inc({ scheme, reason: 'replayed' });
            return next(new ForbiddenError('signature already used (a replayed delivery)', 'replayed_signature'));
          }
          spentWithAnswer(res, key, mark);
          next();
        },
        () => next(new RedisUnavailableError()),
      );
    },
  };
}
