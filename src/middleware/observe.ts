import type { Request, RequestHandler, Response } from 'express';
import type { Logger } from '../shared/logger.js';
import type { Metrics } from '../shared/metrics.js';

/** The route template that answered (e.g. /ops/jobs/:id), never the raw path; "unmatched" when none did. */
function routeTemplate(req: Request): string {
  const path = (req.route as { path?: unknown } | undefined)?.path;
  return typeof path === 'string' ? (req.baseUrl ?? '') + path : 'unmatched';
}

const STATE_CHANGING = new Set(['POST', 'PUT', 'PATCH', 'DELETE']);

/** HTTP metrics for every request, and the audit line for every state-changing call and every webhook. */
export function observe(deps: { metrics: Pick<Metrics, 'httpRequests' | 'httpDuration'>; logger: Logger }): RequestHandler {
  return (req, res, next) => {
    const started = process.hrtime.bigint();
    const done = () => {
      const seconds = Number(process.hrtime.bigint() - started) / 1e9;
      const labels = { method: req.method, route: routeTemplate(req), status: String(res.statusCode) };
      deps.metrics.httpRequests.inc(labels);
      deps.metrics.httpDuration.observe(labels, seconds);
      if (STATE_CHANGING.has(req.method) || req.path.startsWith('/webhook/')) audit(deps.logger, req, res, seconds);
    };
    res.once('finish', done);
    next();
  };
}

/** For /webhook/<source>: the source named by the path (bounded), whether or not the sender was verified. */
const webhookSource = (path: string) => /^\/webhook\/([^/]{1,32})/.exec(path)?.[1];

/** A query component percent-decoded, then encoded the one way encodeURIComponent does (undecodable: as sent). */
function canonical(component: string): string {
  try {
    return encodeURIComponent(decodeURIComponent(component.replace(/\+/g, ' ')));
  } catch {
    return component;
  }
}

/**
 * The query string (bounded) with every name and value in one canonical encoding: a credential sent there by mistake, spelled
 * with any percent-encoding (`%6fp_...`), reaches the line as the logger's redaction knows it and is replaced.
 */
export function queryOf(url: string): string | undefined {
  const i = url.indexOf('?');
  if (i < 0 || i === url.length - 1) return undefined;
  return url
    .slice(i + 1, i + 1 + 4096)
    .split('&')
    .map((part) => {
      const eq = part.indexOf('=');
      return eq < 0 ? canonical(part) : `${canonical(part.slice(0, eq))}=${canonical(part.slice(eq + 1))}`;
    })
    .join('&')
    .slice(0, 512);
}

function audit(logger: Logger, req: Request, res: Response, seconds: number): void {
  const err = res.locals.error as { detail?: string; code?: string } | undefined;
  logger.info('audit', {
    audit: true,
    request_id: res.locals.requestId,
    caller_request_id: res.locals.callerRequestId,
    who: res.locals.principal ?? 'anonymous',
    owner: res.locals.owner,
    owner_known: res.locals.ownerKnown,
    person: res.locals.person,
    credential: res.locals.credential,
    source: webhookSource(req.path),
    role: res.locals.role,
    presented_credential: res.locals.principal ? undefined : res.locals.presentedCredential,
    // An OIDC caller: its issuer, subject, the rule that matched and the token's jti (never the token).
    oidc: (res.locals.oidc as { audit?: unknown } | undefined)?.audit,
    // Which value of a sender's secret the delivery proved (current, or previous during a rotation); never the value.
    matched_secret: res.locals.matchedSecret,
    warning: res.locals.credentialWarning,
    method: req.method,
    path: (req.originalUrl.split('?')[0] ?? req.path).slice(0, 512), // full path, also under mounted sub-apps (/admin/queues)
    route: routeTemplate(req),
    query: queryOf(req.originalUrl),
    body_sha256: res.locals.bodySha256 ?? null,
    ...(res.locals.auditFields as Record<string, unknown> | undefined), // e.g. event_id, job_id, outcome of a webhook
    status: res.statusCode,
    detail: res.statusCode >= 400 ? err?.detail : undefined,
    code: res.statusCode >= 400 ? err?.code : undefined,
    duration_ms: Math.round(seconds * 1000),
    client: req.ip,
  });
}
