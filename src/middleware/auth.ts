import { randomUUID, timingSafeEqual } from 'node:crypto';
import type { Request, RequestHandler, Response } from 'express';
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

/** Comparisons are constant time, and a key is compared with every configured one: timing tells neither which matched nor how many. */
type AuthMetrics = Pick<Metrics, 'authFailures'>;

const header = (v: string | undefined): string => (v ?? '').trim();

/** Who the request is, for everything after the check (routes, four eyes, the audit line). */
const setIdentity = (res: Response, identity: Identity) => Object.assign(res.locals, identity);

function refuse(metrics: AuthMetrics, scheme: string, reason: string, err: Error): never {
  metrics.authFailures.inc({ scheme, reason });
  throw err;
}

/** The configured key a presented key is, expired or not: its digest is compared with every configured digest. */
function findApiKey(keys: readonly ApiKey[], presented: string): ApiKey | undefined {
  const digest = sha256Digest(presented);
  let found: ApiKey | undefined;
  for (const k of keys) if (timingSafeEqual(digest, k.digest) && found === undefined) found = k;
  return found;
}

/** Sets the identity of an accepted key and returns its role (a key without a known role counts as readonly). */
function acceptKey(res: Response, key: ApiKey, presented: string): Role {
  setIdentity(res, keyIdentity(key));
  res.locals.credential = credentialId(presented);
  return (res.locals.role = key.role === 'operator' ? 'operator' : 'readonly');
}

/** The key a presented key is, or undefined when it matches no configured key or its key has expired. */
export function matchApiKey(keys: readonly ApiKey[], presented: string, now: number = Date.now()): ApiKey | undefined {
  const key = findApiKey(keys, presented);
  return key && (key.expiresAt === undefined || now < key.expiresAt) ? key : undefined;
}

export interface ApiKeyPolicy {
  warningDays?: number;
  now?: () => number;
  usage?: Pick<KeyUsage, 'record'>;
}

export interface KeyedDeps {
  config: { apiKeys: readonly ApiKey[] };
  metrics: AuthMetrics;
  apiKeyPolicy?: ApiKeyPolicy;
}

export function keyChecks(deps: KeyedDeps): { anyKey: RequestHandler; operatorKey: RequestHandler } {
  return {
    anyKey: requireApiKey(deps.config.apiKeys, deps.metrics, 'readonly', deps.apiKeyPolicy),
    operatorKey: requireApiKey(deps.config.apiKeys, deps.metrics, 'operator', deps.apiKeyPolicy),
  };
}

/** `X-API-Key`: missing or unknown 401, expired 401, readonly where operator is required 403; near expiry, Deprecation and Sunset. */
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
    if (presented === '') refuse(metrics, 'api_key', 'missing', new UnauthorizedError('missing X-API-Key header', 'missing_api_key'));
    const key = findApiKey(keys, presented);
    if (!key) {
      res.locals.presentedCredential = `key:${credentialId(presented)}`;
      refuse(metrics, 'api_key', 'invalid', new UnauthorizedError('invalid API key', 'invalid_api_key'));
    }
    const at = now();
    const status = keyStatus(key, at, warningDays);
    if (status === 'expired') {
      res.locals.presentedCredential = `key:${key.id}`;
      refuse(metrics, 'api_key', 'expired', new ApiKeyExpiredError(key.id, rfc3339(key.expiresAt!)));
    }
    if (status === 'expiring') {
      for (const [name, value] of Object.entries(expiryHeaders(key.expiresAt!))) res.setHeader(name, value);
      res.locals.credentialWarning = `API key ${key.id} expires at ${rfc3339(key.expiresAt!)}`;
    }
    policy.usage?.record(key.id, at);
    const role = acceptKey(res, key, presented);
    res.locals.scope = key.scope;
    if (required === 'operator' && role !== 'operator') {
      refuse(metrics, 'api_key', 'forbidden_role', new ForbiddenError('this operation requires an operator key', 'operator_role_required'));
    }
    next();
  };
}

export const BASIC_CHALLENGE = 'Basic realm="opsgate", charset="UTF-8"';

const BASIC = /^basic\s+([A-Za-z0-9+/=]+)\s*$/i;

/** An operator key for Bull Board: X-API-Key, or HTTP Basic with it as password (a browser sends no header); 401 with a challenge. */
export function requireOperatorKeyOrBasic(keys: readonly ApiKey[], metrics: AuthMetrics): RequestHandler {
  const fail = (scheme: string, reason: string, detail: string, code: ErrorCodeOf<401>): never =>
    refuse(metrics, scheme, reason, new UnauthorizedError(detail, code, { 'WWW-Authenticate': BASIC_CHALLENGE }));
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
    if (acceptKey(res, key!, presented) !== 'operator') {
      refuse(metrics, scheme, 'forbidden_role', new ForbiddenError('operator role required', 'operator_role_required'));
    }
    // Bull Board acts on every job of the queue: a key scoped to some hosts or projects does not reach it.
    if (key!.scope) {
      const detail = 'a scoped key cannot use Bull Board; an unscoped operator key can';
      refuse(metrics, scheme, 'out_of_scope', new ForbiddenError(detail, 'out_of_scope'));
    }
    next();
  };
}

const SAFE_METHODS = new Set(['GET', 'HEAD', 'OPTIONS']);

/**
 * A browser resends cached Basic credentials on any request to the origin, so a state-changing call from another site could ride
 * on an operator's login (CSRF): 403 for a Sec-Fetch-Site other than same-origin or none, or an Origin whose host is not this host.
 */
export function refuseCrossSiteWrites(metrics: AuthMetrics): RequestHandler {
  return (req, _res, next) => {
    if (SAFE_METHODS.has(req.method)) return next();
    const site = req.get('sec-fetch-site');
    const origin = req.get('origin');
    let crossSite = site !== undefined && site !== 'same-origin' && site !== 'none';
    if (!crossSite && origin !== undefined) {
      const host = URL.parse(origin)?.host;
      crossSite = origin === 'null' || host === undefined || host !== req.get('host');
    }
    if (crossSite) refuse(metrics, 'basic', 'cross_site', new ForbiddenError('cross-site request refused', 'cross_site_request'));
    next();
  };
}

const BEARER = /^(\S+)(?:\s+(.*))?$/;

/** A fixed secret (unset or empty: not configured), or the values in use at each request (a secret reloaded from its file). */
type SecretSource = string | undefined | (() => SecretValues);

const valuesOf = (secret: SecretSource): (() => SecretValues) => {
  if (typeof secret === 'function') return secret;
  const fixed: SecretValues = secret ? [secret] : [];
  return () => fixed;
};

/** Notes which value of a secret a request proved (current or previous), for its audit line. */
const noteMatch = (res: { locals: Record<string, unknown> }, index: number) =>
  (res.locals.matchedSecret = SECRET_ROLES[index] ?? 'current');

/** `Authorization: Bearer <token>`: missing, another scheme, unconfigured or wrong: 401 with WWW-Authenticate. */
export function requireBearer(
  token: SecretSource,
  metrics: AuthMetrics,
  opts: {
    scheme?: string;
    realm?: string;
    owner?: string;
    identity?: Identity;
    noteMatch?: boolean;
    /** A token that is not the shared one is verified as an OIDC token when its issuer is listed (an operator role required). */
    oidc?: OidcVerifier;
    /** The shared token is a valid credential but not for this route: 403 (POST /ops/deploys). */
    refuseShared?: boolean;
  } = {},
): RequestHandler {
  const scheme = opts.scheme ?? 'bearer';
  const realm = opts.realm ?? 'opsgate';
  const fail = (detail: string, reason: string, code: ErrorCodeOf<401>, error?: string): never => {
    const challenge = `Bearer realm="${realm}"${error ? `, error="${error}"` : ''}`;
    return refuse(metrics, scheme, reason, new UnauthorizedError(detail, code, { 'WWW-Authenticate': challenge }));
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
      const detail = 'the shared bearer token is not accepted here: use an OIDC token or an operator key';
      refuse(metrics, scheme, 'shared_token_refused', new ForbiddenError(detail, 'bearer_token_not_accepted'));
    }
    if (index < 0 && oidc) {
      const caller = await oidc.verify(presented).catch((err: unknown) => {
        res.locals.presentedCredential = `oidc:${credentialId(presented)}`;
        const status = (err as { statusCode?: number }).statusCode;
        const reason = status === 503 ? 'issuer_unavailable' : status === 403 ? 'no_matching_rule' : 'invalid';
        metrics.authFailures.inc({ scheme: 'oidc', reason });
        throw err;
      });
      if (caller) {
        setIdentity(res, caller.identity);
        res.locals.credential = caller.credential;
        res.locals.role = caller.role;
        res.locals.scope = caller.scope;
        res.locals.oidc = caller;
        if (caller.role !== 'operator') {
          const detail = 'this operation requires the operator role; the OIDC rule that matched gives readonly';
          refuse(metrics, 'oidc', 'forbidden_role', new ForbiddenError(detail, 'operator_role_required'));
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

/** POST /ops/restart: the contract's bearer token, or an operator's own API key so each has an identity of their own (four eyes). */
export function requireBearerOrOperatorKey(
  keys: readonly ApiKey[],
  token: SecretSource,
  metrics: AuthMetrics,
  policy: ApiKeyPolicy = {},
  bearerOwner?: string,
  oidc?: OidcVerifier,
): RequestHandler {
  return keyOrBearer(requireApiKey(keys, metrics, 'operator', policy), requireBearer(token, metrics, { owner: bearerOwner, oidc }));
}

/** POST /ops/deploys: an OIDC token or an operator's own API key; the shared bearer token is refused (403): a deploy is asked for by someone with an identity of their own. */
export function requireOidcOrOperatorKey(
  keys: readonly ApiKey[],
  token: SecretSource,
  metrics: AuthMetrics,
  policy: ApiKeyPolicy = {},
  oidc?: OidcVerifier,
): RequestHandler {
  return keyOrBearer(requireApiKey(keys, metrics, 'operator', policy), requireBearer(token, metrics, { refuseShared: true, oidc }));
}

interface SenderVerifyOptions {
  source: Pick<Source, 'name' | 'title' | 'verification'>;
  secret: SecretSource;
  metrics: AuthMetrics;
  /** Where a timestamped signature is remembered, so its replay is refused. */
  redis?: Redis;
  logger?: Pick<Logger, 'warn'>;
  now?: () => number;
}

const pass: RequestHandler = (_req, _res, next) => next();
const TIMESTAMPED = /^t=(\d{1,12}),v1=([0-9a-f]{64})$/;
const RELEASE_SIGNATURE = 'opsgateSignatureRelease';
/** src/shared/lua/signature-release.lua: deletes a signature's record only while it holds the given value. */
const RELEASE_SIGNATURE_LUA = loadLua('signature-release');
type ReleaseSignature = (key: string, mark: string) => Promise<unknown>;

/**
 * A webhook sender's verification, split so nothing is read for an unconfigured sender or a missing or malformed header: `before`
 * runs before the body is read, `after` checks what needs the raw body. Failures are 403 (401 for a bearer token). Every proof is
 * checked against each value of the secret (the current and, during a rotation, the previous one), each in constant time.
 */
export function verifySender(opts: SenderVerifyOptions): { before: RequestHandler; after: RequestHandler } {
  const { source, metrics } = opts;
  const values = valuesOf(opts.secret);
  const v = source.verification;
  const verified = senderIdentity(source.name, true);
  const scheme = v.kind === 'token' ? `${source.name}_token` : v.kind === 'bearer' ? `${source.name}_bearer` : 'signature';
  const fail = (detail: string, reason: string, code: ErrorCodeOf<403>): never =>
    refuse(metrics, scheme, reason, new ForbiddenError(detail, code));
  const notConfigured = () => fail(`${source.title} webhook secret is not configured`, 'not_configured', 'webhook_secret_not_configured');
  const hmacMatch = (data: Buffer, presented: string, encoding: 'hex' | 'base64') =>
    firstMatch(
      sha256Digest(encoding === 'hex' ? presented.toLowerCase() : presented),
      values().map((secret) => sha256Digest(hmacSha256(secret, data, encoding))),
    );
  if (v.kind === 'bearer') {
    // Open while no token is configured (a token file in use is never emptied: the reload refuses that).
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
  const signature = (req: Request): string => {
    if (values().length === 0) notConfigured();
    const value = req.get(v.header);
    if (value === undefined || value === '') fail(`missing signature (${v.header})`, 'missing', 'missing_signature');
    return value!;
  };
  const proven = (res: Response, index: number) => {
    if (index < 0) fail('signature mismatch', 'mismatch', 'invalid_signature');
    setIdentity(res, verified);
    noteMatch(res, index);
  };

  if (v.kind === 'hmac') {
    const missing = v.prefix ? `missing signature (${v.header} must start with ${v.prefix})` : `missing signature (${v.header})`;
    return {
      before: (req, _res, next) => {
        if (!signature(req).startsWith(v.prefix)) fail(missing, 'malformed', 'malformed_signature');
        next();
      },
      after: (req, res, next) => {
        proven(res, hmacMatch(rawOf(req.body), req.get(v.header)!.slice(v.prefix.length), v.encoding));
        next();
      },
    };
  }

  // Timestamped: the timestamp bounds how long a captured delivery could be replayed; the signature's record refuses it within.
  const now = opts.now ?? Date.now;
  const redis = opts.redis;
  if (redis) defineLua(redis, RELEASE_SIGNATURE, RELEASE_SIGNATURE_LUA, 1);
  /**
   * A signature is spent with its delivery: a 5xx answer (nothing taken in, or not known to be) gives its record back, so the
   * sender's retry of that very request is heard (a job queued after all makes it a duplicate by the event id). Only the record
   * this request wrote (`mark`) is deleted.
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
      const m = TIMESTAMPED.exec(signature(req).trim());
      if (!m) fail(`missing signature (${v.header} must be t=<unix seconds>,v1=<hex HMAC-SHA256>)`, 'malformed', 'malformed_signature');
      const skew = Math.abs(now() / 1000 - Number(m![1]));
      if (skew > v.toleranceSeconds) {
        fail(`signature timestamp is more than ${v.toleranceSeconds} s from the server's clock`, 'stale', 'stale_signature');
      }
      next();
    },
    after: (req, res, next) => {
      const [, t, sig] = TIMESTAMPED.exec(req.get(v.header)!.trim())!;
      proven(res, hmacMatch(Buffer.concat([Buffer.from(`${t}.`), rawOf(req.body)]), sig!, 'hex'));
      if (!redis) return next();
      // Kept longer than a timestamp stays fresh on either side of the clock, with a value only this request can give back.
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
