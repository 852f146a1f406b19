import type { RequestHandler } from 'express';
import type { TLSSocket } from 'node:tls';
import { ForbiddenError, type ErrorCodeOf } from '../shared/errors.js';
import type { Metrics } from '../shared/metrics.js';

/**
 * Mutual TLS for one route (TLS_CLIENT_CA_FILE). The API port asks every connection for a client
 * certificate without requiring one in the handshake (src/shared/tls.ts), so the paths that need
 * none keep working; this check refuses the request (403 {detail, code}) unless the connection presented
 * a certificate that verified against the CA file in use when it was opened (a reloaded CA applies
 * to new connections). It is one more gate: a bearer token configured for the same route is still
 * required (src/routes/webhooks.ts).
 */
export function requireClientCertificate(metrics: Pick<Metrics, 'authFailures'>): RequestHandler {
  const fail = (detail: string, reason: string, code: ErrorCodeOf<403>): never => {
    metrics.authFailures.inc({ scheme: 'client_certificate', reason });
    throw new ForbiddenError(detail, code);
  };
  return (req, res, next) => {
    const socket = req.socket as Partial<TLSSocket>;
    if (typeof socket.getPeerCertificate !== 'function')
      fail('a client certificate is required (use HTTPS)', 'missing', 'client_certificate_required');
    const peer = socket.getPeerCertificate!();
    // An empty object: the client sent no certificate.
    if (!peer || Object.keys(peer).length === 0) fail('a client certificate is required', 'missing', 'client_certificate_required');
    // Audit identity of a certificate: the first 12 hex of its SHA-256 fingerprint (public, not a secret).
    const id = `cert:${(peer.fingerprint256 ?? '').replaceAll(':', '').slice(0, 12).toLowerCase()}`;
    if (socket.authorized !== true) {
      res.locals.presentedCredential = id;
      fail('client certificate is not signed by a trusted CA', 'untrusted', 'untrusted_client_certificate');
    }
    res.locals.auditFields = { ...(res.locals.auditFields as Record<string, unknown> | undefined), client_certificate: id };
    next();
  };
}
