import { randomUUID } from 'node:crypto';
import type { RequestHandler } from 'express';
import type { Role } from '../api/apiKeys.js';

/** What the middlewares learn about a request, kept on res.locals (typed here). */
declare module 'express-serve-static-core' {
  interface Locals {
    /** Always generated here (a UUID): sent back as X-Request-Id, used as audit_id and job/Kubernetes label. */
    requestId: string;
    /** The caller's own X-Request-Id, for correlation only (printable ASCII, at most 128 characters). */
    callerRequestId?: string;
    /** Who made the call: `key:<id>`, `bearer:<id>`, `webhook:<source>`; unset when unauthenticated. */
    principal?: string;
    /**
     * Who holds the accepted credential (src/api/identity.ts), set with `principal` by every
     * check that accepts one: a person or service, so that four eyes can compare people. A key's owner (a
     * keys-file entry's `owner`, default its id; `env:<id>` for OPS_API_KEY_ROLES),
     * OPS_BEARER_TOKEN_OWNER for the bearer token, `webhook:<sender>` for a sender. Unset when
     * unauthenticated.
     */
    owner?: string;
    /**
     * Whether a known person stands behind the credential. False for the shared bearer token
     * (OPS_BEARER_TOKEN_OWNER only names it), an OIDC token whose rule names no person, and
     * /webhook/alerts open without a token; true for every other accepted credential.
     */
    ownerKnown?: boolean;
    /** The person behind an OIDC token (its rule's `person`), compared by four eyes besides `owner`. */
    person?: string;
    /** Whether the caller may override a freeze or the change windows (src/api/identity.ts); unset: it may not. */
    mayOverride?: boolean;
    role?: Role;
    /**
     * credentialId of the accepted secret itself (API key or bearer token), whatever its id or
     * scheme, for the audit line and the approval record (never the secret).
     */
    credential?: string;
    /** Audit id of a credential that was presented but rejected (never the credential). */
    presentedCredential?: string;
    /** Why the accepted credential needs attention (an API key close to its expiry), for the audit line. */
    credentialWarning?: string;
    /** SHA-256 of the raw body, once it has been read. */
    bodySha256?: string;
    /** Set by the error middleware. */
    error?: unknown;
  }
}

/** Longest caller X-Request-Id kept (as caller_request_id in the audit line). */
const CALLER_REQUEST_ID_MAX = 128;

/**
 * The caller's X-Request-Id as a log field: cut to CALLER_REQUEST_ID_MAX characters, every
 * character outside printable ASCII replaced by '?'; undefined when absent or empty.
 */
export function callerRequestId(given: string | undefined): string | undefined {
  if (given === undefined) return undefined;
  const v = given
    .slice(0, CALLER_REQUEST_ID_MAX)
    .replace(/[^\x20-\x7e]/g, '?')
    .trim();
  return v === '' ? undefined : v;
}

/**
 * Our own request id for every request. The caller's X-Request-Id never becomes the audit id (nor,
 * through it, a job's audit_id or a Kubernetes label): a caller could otherwise forge or collide
 * with other calls' ids. It is kept apart as res.locals.callerRequestId.
 */
export function requestId(): RequestHandler {
  return (req, res, next) => {
    const id = randomUUID();
    res.locals.requestId = id;
    res.locals.callerRequestId = callerRequestId(req.get('x-request-id'));
    res.setHeader('X-Request-Id', id);
    // API answers are per-caller operational data: never cached by a proxy, never content-sniffed.
    res.setHeader('Cache-Control', 'no-store');
    res.setHeader('X-Content-Type-Options', 'nosniff');
    next();
  };
}
