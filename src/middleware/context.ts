import { randomUUID } from 'node:crypto';
import type { RequestHandler } from 'express';
import type { Role } from '../api/apiKeys.js';
import type { Identity } from '../api/identity.js';

/** What the middlewares learn about a request, kept on res.locals (typed here). */
declare module 'express-serve-static-core' {
  /** The accepted credential's Identity (src/api/identity.ts); unset when unauthenticated. */
  interface Locals extends Partial<Identity> {
    /** Always generated here (a UUID): sent back as X-Request-Id, used as audit_id and job/Kubernetes label. */
    requestId: string;
    /** The caller's own X-Request-Id, for correlation only (printable ASCII, at most 128 characters). */
    callerRequestId?: string;
    role?: Role;
    /** credentialId of the accepted secret itself, for the audit line and the approval record (never the secret). */
    credential?: string;
    /** Audit id of a credential that was presented but rejected (never the credential). */
    presentedCredential?: string;
    /** Why the accepted credential needs attention (an API key close to its expiry), for the audit line. */
    credentialWarning?: string;
    bodySha256?: string;
    error?: unknown;
  }
}

/** The caller's X-Request-Id as a log field: at most 128 characters, non-printable ones as '?'; undefined when empty. */
function callerRequestId(given: string | undefined): string | undefined {
  const v = given
    ?.slice(0, 128)
    .replace(/[^\x20-\x7e]/g, '?')
    .trim();
  return v || undefined;
}

/**
 * Our own request id for every request. The caller's X-Request-Id never becomes the audit id (nor a job's audit_id or a
 * Kubernetes label): a caller could otherwise forge or collide with other calls' ids.
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
