import { readFile } from 'node:fs/promises';
import { request as httpsRequest } from 'node:https';
import { join } from 'node:path';
import {
  createRemoteJWKSet,
  customFetch,
  decodeJwt,
  errors,
  jwtVerify,
  type FetchImplementation,
  type JWTPayload,
  type JWTVerifyGetKey,
} from 'jose';
import { credentialId, sha256Hex } from '../shared/crypto.js';
import { ForbiddenError, ServiceUnavailableError, UnauthorizedError } from '../shared/errors.js';
import { widthProblem } from '../api/identity.js';
import type { Logger } from '../shared/logger.js';
import type { Metrics } from '../shared/metrics.js';
import { SERVICE_ACCOUNT_DIR, findIssuer, grantFor, normalizeClaims, type OidcIssuer, type OidcSettings } from '../api/oidcConfig.js';
import type { KubeEnv } from '../shared/kubeconfig.js';

/**
 * OIDC ID tokens as bearer credentials, verified with `jose` against the issuer's JWKS (cached, fetched again for an unknown `kid`
 * after the entry's cooldown). `discovery_auth: serviceaccount` fetches with the pod's ServiceAccount token, re-read at each fetch
 * (the kubelet rotates it), sent only to the cluster's API server (tokenMayGo). Fails closed: an issuer whose discovery or keys
 * cannot be fetched answers 503 with Retry-After, never an accept.
 */
const OIDC_ALGORITHMS = ['RS256', 'ES256'];
/** Clock skew tolerated on exp, nbf and iat. */
const LEEWAY_SECONDS = 30;
/** How long a fetch of discovery or keys may take. */
const FETCH_TIMEOUT_MS = 5000;
/** After a failed discovery, how long requests are answered 503 before it is tried again (and the answer's Retry-After). */
const DISCOVERY_RETRY_SECONDS = 5;
const MAX_DOCUMENT_BYTES = 1024 * 1024;

export const OIDC_RESULTS = [
  'accepted',
  'expired',
  'lifetime',
  'audience',
  'claims',
  'algorithm',
  'signature',
  'unknown_key',
  'invalid',
  'no_matching_rule',
  'unknown_issuer',
  'issuer_unavailable',
] as const;
type OidcResult = (typeof OIDC_RESULTS)[number];

export type OidcVerifier = ReturnType<typeof createOidcVerifier>;
/** A verified token's caller; `audit`: the issuer, the subject, the rule matched and the token's jti. */
export type OidcCaller = NonNullable<Awaited<ReturnType<OidcVerifier['verify']>>>;

interface OidcVerifierDeps {
  settings: OidcSettings;
  metrics?: Pick<Metrics, 'oidcVerifications'>;
  logger?: Pick<Logger, 'warn'>;
  serviceAccountDir?: string;
  env?: Pick<KubeEnv, 'KUBERNETES_SERVICE_HOST' | 'KUBERNETES_SERVICE_PORT'>;
}

class IssuerUnavailable extends Error {
  constructor(
    why: string,
    readonly retryAfter = DISCOVERY_RETRY_SECONDS,
  ) {
    super(why);
  }
}

/** A token whose lifetime (exp - iat) is longer than its issuer's entry allows. */
class LifetimeExceeded extends Error {}

/** `host:port` of a URL as a connection reaches it (the scheme's port when none is written; IPv6 in brackets). */
function endpointOf(url: URL): string {
  return `${url.hostname}:${url.port || (url.protocol === 'http:' ? '80' : '443')}`;
}

const endpoint = (host: string, port: string | number) => `${host.includes(':') ? `[${host}]` : host}:${port}`;

/** One GET over node:https with the entry's trust, the abort signal and a bounded body. */
function httpsGet(url: string, headers: Record<string, string>, ca: string | undefined, signal?: AbortSignal | null): Promise<Response> {
  return new Promise<Response>((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason instanceof Error ? signal.reason : new Error('aborted'));
    const req = httpsRequest(url, { method: 'GET', headers, ...(ca ? { ca } : {}) }, (res) => {
      const chunks: Buffer[] = [];
      let size = 0;
      res.on('data', (c: Buffer) => {
        size += c.length;
        if (size > MAX_DOCUMENT_BYTES) req.destroy(new Error('document too large'));
        else chunks.push(c);
      });
      res.on('end', () => {
        const status = res.statusCode ?? 502;
        const body = status === 204 || status === 304 ? null : new Uint8Array(Buffer.concat(chunks));
        resolve(new Response(body, { status, headers: { 'content-type': String(res.headers['content-type'] ?? '') } }));
      });
      res.on('error', reject);
    });
    const abort = () => req.destroy(signal?.reason instanceof Error ? signal.reason : new Error('aborted'));
    signal?.addEventListener('abort', abort, { once: true });
    req.on('error', reject);
    req.on('close', () => signal?.removeEventListener('abort', abort));
    req.end();
  });
}

/**
 * Where the pod's ServiceAccount token may be sent: the issuer's origin, the API server as KUBERNETES_SERVICE_HOST and _PORT
 * name it, or an address it advertises in the `default/kubernetes` EndpointSlice (where its discovery points jwks_uri). Any
 * other host could be anyone's (a cloud's public key host): the keys are fetched there without the token.
 */
function tokenMayGo(
  entry: OidcIssuer,
  env: OidcVerifierDeps['env'] & object,
  saDir: string,
  logger: OidcVerifierDeps['logger'],
): (url: string, token: string) => Promise<boolean> {
  const issuerOrigin = new URL(entry.issuer).origin;
  const host = env.KUBERNETES_SERVICE_HOST?.trim();
  const apiServer = host ? endpoint(host, env.KUBERNETES_SERVICE_PORT?.trim() || '443') : undefined;
  const advertised = async (token: string): Promise<Set<string>> => {
    const found = new Set<string>();
    if (!apiServer) return found;
    try {
      const res = await httpsGet(
        `https://${apiServer}/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/kubernetes`,
        { authorization: `Bearer ${token}`, accept: 'application/json' },
        await readFile(join(saDir, 'ca.crt'), 'utf8'),
        AbortSignal.timeout(FETCH_TIMEOUT_MS),
      );
      if (res.status !== 200) throw new Error(`HTTP ${res.status}`);
      const slice = (await res.json()) as { endpoints?: Array<{ addresses?: unknown }>; ports?: Array<{ port?: unknown }> };
      for (const e of slice.endpoints ?? []) {
        for (const a of Array.isArray(e.addresses) ? e.addresses : []) {
          for (const p of slice.ports ?? []) if (typeof a === 'string' && typeof p.port === 'number') found.add(endpoint(a, p.port));
        }
      }
    } catch (err) {
      logger?.warn(
        "OIDC: the API server's advertised addresses (EndpointSlice default/kubernetes) could not be read; keys elsewhere are fetched without the ServiceAccount token",
        { issuer: entry.issuer, why: (err as Error).message },
      );
    }
    return found;
  };
  return async (url, token) => {
    const u = new URL(url);
    if (u.origin === issuerOrigin) return true;
    const at = endpointOf(u);
    if (at === apiServer) return true;
    return (await advertised(token)).has(at);
  };
}

/** node:https as the fetch jose calls: the TLS trust of the entry, and the pod's token where it may go. */
function httpsFetch(
  entry: OidcIssuer,
  saDir: string,
  env: OidcVerifierDeps['env'] & object,
  logger: OidcVerifierDeps['logger'],
): FetchImplementation {
  const mayGo = tokenMayGo(entry, env, saDir, logger);
  return async (url, init) => {
    const headers: Record<string, string> = {};
    init.headers.forEach((v, k) => (headers[k] = v));
    let ca = entry.ca;
    if (entry.discoveryAuth === 'serviceaccount') {
      const token = (await readFile(join(saDir, 'token'), 'utf8')).trim();
      if (await mayGo(url, token)) headers.authorization = `Bearer ${token}`;
      ca ??= await readFile(join(saDir, 'ca.crt'), 'utf8');
    }
    return httpsGet(url, headers, ca, init.signal);
  };
}

/** One issuer's discovery and key set, kept while its entry is unchanged. */
function issuerClient(entry: OidcIssuer, fetchImpl: FetchImplementation) {
  let jwks: ReturnType<typeof createRemoteJWKSet> | undefined;
  let failedAt = 0;
  let pending: Promise<ReturnType<typeof createRemoteJWKSet>> | undefined;
  const remote = (uri: string) =>
    createRemoteJWKSet(new URL(uri), {
      cooldownDuration: entry.cooldownMs,
      timeoutDuration: FETCH_TIMEOUT_MS,
      [customFetch]: fetchImpl,
    });
  const discover = async (): Promise<string> => {
    const url = `${entry.issuer.replace(/\/+$/, '')}/.well-known/openid-configuration`;
    const res = await fetchImpl(url, {
      method: 'GET',
      redirect: 'manual',
      headers: new Headers({ accept: 'application/json' }),
      signal: AbortSignal.timeout(FETCH_TIMEOUT_MS),
    }).catch((err: unknown) => {
      throw new IssuerUnavailable(`its discovery document could not be fetched (${(err as Error).message})`);
    });
    if (res.status !== 200) throw new IssuerUnavailable(`its discovery document answered HTTP ${res.status}`);
    const doc = (await res.json().catch(() => {
      throw new IssuerUnavailable('its discovery document is not JSON');
    })) as { issuer?: unknown; jwks_uri?: unknown };
    if (doc.issuer !== entry.issuer) throw new IssuerUnavailable('its discovery document names another issuer');
    if (typeof doc.jwks_uri !== 'string' || !doc.jwks_uri.startsWith('https://')) {
      throw new IssuerUnavailable('its discovery document has no https jwks_uri');
    }
    return doc.jwks_uri;
  };
  return {
    async keys() {
      if (jwks) return jwks;
      if (entry.jwksUri) return (jwks = remote(entry.jwksUri));
      const wait = failedAt + DISCOVERY_RETRY_SECONDS * 1000 - Date.now();
      if (wait > 0) throw new IssuerUnavailable('its discovery failed moments ago', Math.ceil(wait / 1000));
      pending ??= discover()
        .then((uri) => (jwks = remote(uri)))
        .catch((err: unknown) => {
          failedAt = Date.now();
          throw err;
        })
        .finally(() => (pending = undefined));
      return pending;
    },
  };
}

function resultOf(err: unknown): OidcResult {
  if (err instanceof IssuerUnavailable) return 'issuer_unavailable';
  if (err instanceof LifetimeExceeded) return 'lifetime';
  if (err instanceof errors.JWTExpired) return 'expired';
  if (err instanceof errors.JWTClaimValidationFailed) return err.claim === 'aud' ? 'audience' : 'claims';
  if (err instanceof errors.JOSEAlgNotAllowed || err instanceof errors.JOSENotSupported) return 'algorithm';
  if (err instanceof errors.JWSSignatureVerificationFailed) return 'signature';
  if (err instanceof errors.JWKSNoMatchingKey) return 'unknown_key';
  return 'invalid';
}

const DETAIL: Partial<Record<OidcResult, string>> = {
  expired: 'the OIDC token has expired',
  audience: 'the OIDC token is not for this audience',
  claims: 'the OIDC token is not valid at this time (nbf or iat)',
  algorithm: `the OIDC token is not signed with an allowed algorithm (${OIDC_ALGORITHMS.join(', ')})`,
  signature: 'the OIDC token signature does not verify',
  unknown_key: "the OIDC token is signed with a key its issuer's key set does not hold",
  invalid: 'the OIDC token is not a valid signed JWT',
};

/** The detail of a refusal: a lifetime, a claim the token lacks or an age over max_token_age said as such, else by its result. */
function detailOf(err: unknown, result: OidcResult, entry: OidcIssuer): string {
  if (err instanceof LifetimeExceeded) return err.message;
  if (err instanceof errors.JWTClaimValidationFailed && err.reason === 'missing') return `the OIDC token has no "${err.claim}" claim`;
  // jose's maxTokenAge refuses as an expiry of `iat`.
  if (err instanceof errors.JWTExpired && err.claim === 'iat') {
    return `the OIDC token was issued more than ${entry.maxTokenAge} s ago (its issuer's max_token_age)`;
  }
  return DETAIL[result] ?? DETAIL.invalid!;
}

const CHALLENGE = { 'WWW-Authenticate': 'Bearer realm="opsgate", error="invalid_token"' };

/** A JWT's unverified payload, or undefined for anything else (the shared token, a random string). */
function peek(token: string): JWTPayload | undefined {
  if (!/^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*$/.test(token)) return undefined;
  try {
    return decodeJwt(token);
  } catch {
    return undefined;
  }
}

/** `oidc:<issuer host and path>:<sub>`, or the sub's digest when that would not fit a job's identity fields. */
function oidcPrincipal(issuer: string, sub: string): string {
  const u = new URL(issuer);
  const where = `${u.host}${u.pathname.replace(/\/+$/, '')}`;
  const full = `oidc:${where}:${sub}`;
  return widthProblem(full) ? `oidc:${where.slice(0, 100)}:sha256:${sha256Hex(sub).slice(0, 24)}` : full;
}

export function createOidcVerifier(deps: OidcVerifierDeps) {
  const saDir = deps.serviceAccountDir ?? SERVICE_ACCOUNT_DIR;
  const env = deps.env ?? process.env;
  // One client per issuer entry as configured: a reload that changes an entry starts its caches afresh.
  const clients = new WeakMap<OidcIssuer, ReturnType<typeof issuerClient>>();
  const clientOf = (entry: OidcIssuer) => {
    let c = clients.get(entry);
    if (!c) clients.set(entry, (c = issuerClient(entry, httpsFetch(entry, saDir, env, deps.logger))));
    return c;
  };
  const count = (issuer: string, result: OidcResult) => deps.metrics?.oidcVerifications.inc({ issuer, result });
  return {
    /** The caller a bearer token stands for; undefined when it is no OIDC token of a listed issuer. Throws the refusal (401, 403, 503). */
    async verify(token: string) {
      if (!deps.settings.configured) return undefined;
      const unverified = peek(token);
      if (!unverified) return undefined;
      const entry = findIssuer(deps.settings, unverified.iss);
      if (!entry) {
        count('unlisted', 'unknown_issuer');
        return undefined;
      }
      const client = clientOf(entry);
      let payload: JWTPayload;
      try {
        // Fetched before the verification, so an issuer that cannot be reached is told apart from a bad token.
        const jwks = await client.keys();
        const keyOf: JWTVerifyGetKey = async (header, input) => {
          try {
            return await jwks(header, input);
          } catch (err) {
            if (err instanceof errors.JWKSNoMatchingKey || err instanceof errors.JWKSMultipleMatchingKeys) throw err;
            if (err instanceof errors.JOSEAlgNotAllowed || err instanceof errors.JOSENotSupported) throw err;
            throw new IssuerUnavailable(`its key set could not be fetched (${(err as Error).message})`);
          }
        };
        ({ payload } = await jwtVerify(token, keyOf, {
          issuer: entry.issuer,
          audience: entry.audience,
          algorithms: OIDC_ALGORITHMS,
          clockTolerance: LEEWAY_SECONDS,
          requiredClaims: ['exp', 'iat', 'sub'],
          ...(entry.maxTokenAge !== undefined ? { maxTokenAge: entry.maxTokenAge } : {}),
        }));
        // A token valid for long is a standing credential, whatever its issuer signed it for.
        const lifetime = Number(payload.exp) - Number(payload.iat);
        if (!(lifetime <= entry.maxTokenLifetime)) {
          throw new LifetimeExceeded(
            `the OIDC token is valid for ${Number.isFinite(lifetime) ? `${lifetime} s` : 'an unreadable time'} (exp - iat), longer than the ${entry.maxTokenLifetime} s its issuer's max_token_lifetime allows`,
          );
        }
        if (typeof payload.iat === 'number' && payload.iat > Date.now() / 1000 + LEEWAY_SECONDS) {
          throw new errors.JWTClaimValidationFailed(
            '"iat" claim timestamp check failed (it should be in the past)',
            payload,
            'iat',
            'check_failed',
          );
        }
      } catch (err) {
        const result = resultOf(err);
        count(entry.issuer, result);
        if (err instanceof IssuerUnavailable) {
          deps.logger?.warn('OIDC issuer unavailable: tokens of it are refused until it answers', {
            issuer: entry.issuer,
            why: err.message,
          });
          throw new ServiceUnavailableError(
            `the OIDC issuer ${entry.issuer} cannot be reached to verify the token; retry later`,
            'oidc_issuer_unavailable',
            err.retryAfter,
          );
        }
        throw new UnauthorizedError(
          detailOf(err, result, entry),
          result === 'lifetime' ? 'oidc_token_lifetime_exceeded' : 'invalid_oidc_token',
          CHALLENGE,
        );
      }
      const claims = normalizeClaims(entry.kind, payload);
      const grant = grantFor(entry, claims);
      const subject = String(payload.sub);
      if (!grant) {
        count(entry.issuer, 'no_matching_rule');
        throw new ForbiddenError(
          `no rule of OPS_OIDC_FILE for issuer ${entry.issuer} admits this token (subject ${JSON.stringify(subject.slice(0, 200))})`,
          'oidc_no_matching_rule',
        );
      }
      count(entry.issuer, 'accepted');
      return {
        // A rule that names no person (or a token that leaves it empty) hides who asked: no known person.
        identity: {
          principal: oidcPrincipal(entry.issuer, subject),
          owner: grant.owner,
          ownerKnown: grant.person !== undefined,
          ...(grant.person !== undefined ? { person: grant.person } : {}),
          mayOverride: grant.rule.mayOverride,
        },
        credential: credentialId(token),
        role: grant.role,
        ...(grant.scope ? { scope: grant.scope } : {}),
        binds: grant.binds,
        audit: {
          issuer: entry.issuer,
          subject: subject.slice(0, 256),
          rule: grant.rule.name,
          jti: typeof payload.jti === 'string' ? payload.jti.slice(0, 128) : null,
        },
      };
    },
  };
}
