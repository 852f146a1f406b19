import { randomUUID } from 'node:crypto';
import type { RequestHandler } from 'express';
import type { Role } from '../shared/config.js';

/** What the middlewares learn about a request, kept on res.locals (typed here). */
declare module 'express-serve-static-core' {
  interface Locals {
    /** Accepted X-Request-Id or a generated UUID; echoed in the response and used as audit_id. */
    requestId: string;
    /** Who made the call: `key:<id>`, `bearer:<id>`, `webhook:<source>`; unset when unauthenticated. */
    principal?: string;
    role?: Role;
    /** Audit id of a credential that was presented but rejected (never the credential). */
    presentedCredential?: string;
    /** SHA-256 of the raw body, once it has been read. */
    bodySha256?: string;
    /** Set by the error middleware. */
    error?: unknown;
  }
}

/** A caller-supplied request id is kept only if it is short and made of safe characters. */
export const SANE_REQUEST_ID = /^[A-Za-z0-9._:-]{1,64}$/;

export function requestId(): RequestHandler {
  return (req, res, next) => {
    const given = req.get('x-request-id');
    const id = given !== undefined && SANE_REQUEST_ID.test(given) ? given : randomUUID();
    res.locals.requestId = id;
    res.setHeader('X-Request-Id', id);
    // API answers are per-caller operational data: never cached by a proxy, never content-sniffed.
    res.setHeader('Cache-Control', 'no-store');
    res.setHeader('X-Content-Type-Options', 'nosniff');
    next();
  };
}
