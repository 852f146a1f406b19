import type { RequestHandler } from 'express';
import type { TLSSocket } from 'node:tls';
import { matchAllowedName, type AllowedName } from '../api/clientNames.js';
import { ForbiddenError, type ErrorCodeOf } from '../shared/errors.js';
import type { Metrics } from '../shared/metrics.js';

/**
 * Mutual TLS for one route: the handshake asks for a client certificate without requiring one (src/shared/tls.ts), so other
 * paths keep working; this check refuses (403) a connection without a certificate the CA verified, or one not on the allowed
 * names. One more gate: a bearer token configured for the same route is still required.
 */
export function requireClientCertificate(
  metrics: Pick<Metrics, 'authFailures'>,
  /** The allowed names in use, read at each request; empty: any certificate of the CA. */
  allowedNames: () => readonly AllowedName[] = () => [],
): RequestHandler {
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
    const list = allowedNames();
    const matched = list.length > 0 ? matchAllowedName(list, peer) : undefined;
    if (list.length > 0 && !matched) {
      res.locals.presentedCredential = id;
      fail('client certificate is not on the list of allowed names', 'not_allowed', 'client_certificate_not_allowed');
    }
    res.locals.auditFields = {
      ...(res.locals.auditFields as Record<string, unknown> | undefined),
      client_certificate: id,
      // The entry of the list it matched (configuration, not a secret).
      ...(matched ? { client_name: matched.text } : {}),
    };
    next();
  };
}
