import express, { type RequestHandler } from 'express';
import { sha256Hex } from '../shared/crypto.js';
import { InvalidJsonError, UnprocessableError } from '../shared/errors.js';

/**
 * Reads the raw body (any content type, up to `limit`; over it: 413) into req.body as a Buffer
 * and records its SHA-256 for the audit line. Nothing is parsed here: webhook routes verify the
 * sender first and only then call parseJson() themselves.
 */
export function rawBody(limit: string): RequestHandler[] {
  const reader = express.raw({ type: () => true, limit });
  const digest: RequestHandler = (req, res, next) => {
    const buf = Buffer.isBuffer(req.body) ? req.body : Buffer.alloc(0);
    req.body = buf;
    res.locals.bodySha256 = sha256Hex(buf);
    next();
  };
  return [reader, digest];
}

/**
 * Deepest object/array nesting a webhook payload may have. Real payloads nest a few levels;
 * a hostile one (e.g. Alertmanager annotations 5,000 levels deep, 30 KB) parses fine but later
 * blows the stack in JSON.stringify when the job is enqueued, which used to surface as a
 * misleading 503 "queue unavailable" that the sender retried forever.
 */
export const MAX_JSON_DEPTH = 64;

/** True when the JSON text nests objects/arrays deeper than `max` (a linear scan, no recursion). */
export function jsonDeeperThan(text: string, max: number): boolean {
  let depth = 0;
  let inString = false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (inString) {
      if (c === 92) i++; // backslash: skip the escaped character
      else if (c === 34) inString = false;
      continue;
    }
    if (c === 34) inString = true;
    else if (c === 123 || c === 91) {
      if (++depth > max) return true;
    } else if (c === 125 || c === 93) depth--;
  }
  return false;
}

/** JSON.parse of a raw body; invalid JSON (or an empty body) -> 400; nested deeper than MAX_JSON_DEPTH -> 422. */
export function parseJson(buf: Buffer): unknown {
  if (buf.length === 0) throw new InvalidJsonError('request body is empty; a JSON payload is required');
  const text = buf.toString('utf8');
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    throw new InvalidJsonError();
  }
  if (jsonDeeperThan(text, MAX_JSON_DEPTH)) {
    throw new UnprocessableError(`payload is nested deeper than ${MAX_JSON_DEPTH} levels`);
  }
  return value;
}
