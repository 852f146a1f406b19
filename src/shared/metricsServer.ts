import type { IncomingMessage, ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Registry } from 'prom-client';
import { ERROR_CODES, errorBody, type ErrorCode } from './errors.js';
import type { Logger } from './logger.js';
import { createListener, type ListenerTls, type TlsListenerMetrics } from './tls.js';

/** The metrics listener on METRICS_PORT, never the public port: GET/HEAD /metrics (and /livez), errors as JSON {detail, code}. */
interface MetricsServerOptions {
  registry: Registry;
  port: number;
  /** Default 0.0.0.0 so Prometheus can reach the pod; tests pass 127.0.0.1. */
  host?: string;
  logger?: Logger;
  /** GET/HEAD /livez (the worker's liveness probe), called per request. Absent: /livez is 404. */
  livez?: () => Promise<{ status: number; body: Record<string, unknown> }>;
  /** HTTPS, with the renewal poll. Absent: plain HTTP. */
  tls?: ListenerTls;
  metrics?: TlsListenerMetrics;
}

export type MetricsServer = Awaited<ReturnType<typeof startMetricsServer>>;

function sendError(res: ServerResponse, code: ErrorCode, detail: string, headers: Record<string, string> = {}) {
  sendJson(res, ERROR_CODES[code].status, errorBody(code, detail), headers);
}

function sendJson(res: ServerResponse, status: number, body: object, headers: Record<string, string> = {}) {
  const text = JSON.stringify(body);
  res.writeHead(status, {
    'Content-Type': 'application/json; charset=utf-8',
    'Content-Length': Buffer.byteLength(text),
    'Cache-Control': 'no-store',
    ...headers,
  });
  res.end(text);
}

function metricsHandler(registry: Registry, logger?: Logger, livez?: MetricsServerOptions['livez']) {
  return (req: IncomingMessage, res: ServerResponse): void => {
    let path: string;
    try {
      path = new URL(req.url ?? '/', 'http://metrics.local').pathname;
    } catch {
      return sendError(res, 'malformed_request', 'bad request');
    }
    const live = path === '/livez' ? livez : undefined;
    if (path !== '/metrics' && !live) return sendError(res, 'not_found', 'not found');
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      return sendError(res, 'method_not_allowed', 'method not allowed; allowed: GET, HEAD', { Allow: 'GET, HEAD' });
    }
    if (live) {
      live().then(
        (r) => sendJson(res, r.status, r.body),
        (err: unknown) => {
          logger?.error('liveness check failed', { err });
          sendError(res, 'internal_error', 'internal error');
        },
      );
      return;
    }
    registry.metrics().then(
      (text) => {
        res.writeHead(200, {
          'Content-Type': registry.contentType,
          'Content-Length': Buffer.byteLength(text),
          'Cache-Control': 'no-store',
        });
        res.end(req.method === 'HEAD' ? undefined : text);
      },
      (err: unknown) => {
        logger?.error('metrics scrape failed', { err });
        if (!res.headersSent) sendError(res, 'internal_error', 'internal error');
        else res.destroy();
      },
    );
  };
}

export async function startMetricsServer(opts: MetricsServerOptions) {
  const { server } = createListener(metricsHandler(opts.registry, opts.logger, opts.livez), {
    listener: 'metrics',
    ...(opts.tls ? { tls: opts.tls } : {}),
    ...(opts.logger ? { logger: opts.logger } : {}),
    ...(opts.metrics ? { metrics: opts.metrics } : {}),
  });
  // Scrapes are short; do not let idle keep-alive sockets hold a shutdown.
  server.keepAliveTimeout = 5000;
  server.headersTimeout = 10000;
  server.requestTimeout = 30000;
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(opts.port, opts.host ?? '0.0.0.0', () => {
      server.off('error', reject);
      resolve();
    });
  });
  const port = (server.address() as AddressInfo).port;
  opts.logger?.info('metrics listening', { port, path: '/metrics', scheme: opts.tls ? 'https' : 'http' });
  return {
    server,
    port,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeIdleConnections();
      }),
  };
}
