import express, { type RequestHandler } from 'express';
import { sha256Hex } from '../shared/crypto.js';
import { InvalidJsonError } from '../shared/errors.js';

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

/** JSON.parse of a raw body; invalid JSON (or an empty body) -> 400. */
export function parseJson(buf: Buffer): unknown {
  if (buf.length === 0) throw new InvalidJsonError('request body is empty; a JSON payload is required');
  try {
    return JSON.parse(buf.toString('utf8'));
  } catch {
    throw new InvalidJsonError();
  }
}
