import type { ErrorRequestHandler, RequestHandler } from 'express';
import {
  AppError,
  BadRequestError,
  InternalError,
  InvalidJsonError,
  MethodNotAllowedError,
  NotFoundError,
  PayloadTooLargeError,
  RedisUnavailableError,
  UnsupportedMediaTypeError,
} from '../shared/errors.js';
import type { Logger } from '../shared/logger.js';

/** Errors from ioredis when Redis is unreachable or slow: the caller should retry. */
const REDIS_UNAVAILABLE =
  /Stream isn't writeable|Connection is closed|Command timed out|ECONNREFUSED|ECONNRESET|ETIMEDOUT|Reached the max retries/;
const isRedisUnavailable = (err: unknown) =>
  err instanceof Error && (err.name === 'MaxRetriesPerRequestError' || REDIS_UNAVAILABLE.test(err.message));

/** Maps errors thrown by body-parser / the router (http-errors with `type`/`status`) to the catalog. */
export function toAppError(err: unknown): AppError | undefined {
  if (err instanceof AppError) return err;
  if (isRedisUnavailable(err)) return new RedisUnavailableError();
  if (typeof err === 'object' && err !== null) {
    const e = err as { type?: unknown; status?: unknown; statusCode?: unknown };
    const status = typeof e.status === 'number' ? e.status : typeof e.statusCode === 'number' ? e.statusCode : undefined;
    switch (e.type) {
      case 'entity.too.large':
        return new PayloadTooLargeError();
      case 'entity.parse.failed':
        return new InvalidJsonError();
      case 'encoding.unsupported':
      case 'charset.unsupported':
        return new UnsupportedMediaTypeError();
      case 'request.aborted':
        return new BadRequestError('request aborted', 'request_aborted');
      case 'request.size.invalid':
        return new BadRequestError('request size did not match content length', 'content_length_mismatch');
    }
    // Router errors such as a malformed percent-encoding in the path (status 400).
    if (status !== undefined && status >= 400 && status < 500) {
      if (status === 413) return new PayloadTooLargeError();
      if (status === 404) return new NotFoundError();
      return new BadRequestError('bad request', 'malformed_request');
    }
  }
  return undefined;
}

/** Every error becomes {detail, code} JSON: never Express's HTML page, a stack trace or a secret (unexpected: "internal error"). */
export function errorHandler(logger: Logger): ErrorRequestHandler {
  // Express recognises error middleware by its four parameters.
  return (err, req, res, _next) => {
    let appErr = toAppError(err);
    if (!appErr) {
      logger.error('unhandled error', { err, method: req.method, path: req.path, request_id: res.locals.requestId });
      appErr = new InternalError();
    } else if (appErr.statusCode >= 500) {
      logger.warn('request failed', {
        status: appErr.statusCode,
        detail: appErr.detail,
        cause: err instanceof Error && err !== appErr ? err.message : undefined,
        method: req.method,
        path: req.path,
        request_id: res.locals.requestId,
      });
    }
    res.locals.error = appErr;
    if (res.headersSent) {
      // Nothing sane can be sent any more; end the exchange without Express's default page.
      res.destroy();
      return;
    }
    // An error answer is never stored, whatever a router set for its pages (Bull Board's).
    res.setHeader('Cache-Control', 'no-store');
    for (const [k, v] of Object.entries(appErr.headers)) res.setHeader(k, v);
    res.status(appErr.statusCode).json(appErr.toBody());
  };
}

export const notFound: RequestHandler = () => {
  throw new NotFoundError('not found');
};

/** For `router.route(path)...all(methodNotAllowed([...]))`: another method gets 405 with Allow; OPTIONS 204 with Allow. */
export function methodNotAllowed(allowed: string[]): RequestHandler {
  const list = allowed.includes('GET') && !allowed.includes('HEAD') ? [...allowed, 'HEAD'] : allowed;
  return (req, res) => {
    if (req.method === 'OPTIONS') {
      res.setHeader('Allow', [...list, 'OPTIONS'].join(', '));
      res.status(204).end();
      return;
    }
    throw new MethodNotAllowedError(list);
  };
}
