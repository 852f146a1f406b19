import { createPrivateKey, X509Certificate } from 'node:crypto';
import { createServer as createHttpServer, type RequestListener, type Server } from 'node:http';
import { createServer as createHttpsServer, type Server as HttpsServer } from 'node:https';
import type { Socket } from 'node:net';
import { createSecureContext, type SecureContextOptions, type TLSSocket } from 'node:tls';
import { ConfigError, type ConfigProblem } from './errors.js';
import { contentsDigest, FileProblem, readWatchedFile, watchFiles, type FileReloader, type WatchedFile } from './fileReload.js';
import type { Logger } from './logger.js';

/**
 * TLS of opsgate's own listeners (API and metrics ports): certificate, key and optional client CA
 * bundle, re-read by the poll of src/shared/fileReload.ts and swapped in with setSecureContext():
 * new connections get the new set, open ones keep theirs (except after a CA change, below). A set
 * that is not a usable pair is refused: logged, counted, and the last good context stays.
 */

/** Which files, and the variables that set them (named in every problem report). */
export interface TlsFiles {
  certFile: string;
  keyFile: string;
  caFile?: string;
  vars: { cert: string; key: string; ca?: string };
}

interface TlsMaterial {
  cert: Buffer;
  key: Buffer;
  ca?: Buffer;
  notAfter: Date;
  /** SHA-256 of the served certificate (public; names it in logs). */
  fingerprint: string;
}

/** The variable naming the file and what is wrong, never the contents. */
class TlsFileError extends FileProblem {
  constructor(variable: string, problem: string) {
    super(variable, problem);
    this.name = 'TlsFileError';
  }
}

const PEM_CERT = /-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----/g;

/** The certificates of a PEM file (`leafOnly`: its first), parsed; throws TlsFileError naming the variable. */
function certificates(pem: Buffer, variable: string, leafOnly = false): X509Certificate[] {
  const blocks = pem.toString('utf8').match(PEM_CERT);
  if (!blocks) throw new TlsFileError(variable, 'holds no PEM certificate');
  try {
    return (leafOnly ? blocks.slice(0, 1) : blocks).map((b) => new X509Certificate(b));
  } catch {
    throw new TlsFileError(variable, 'holds a certificate that cannot be parsed');
  }
}

/** Checks the bytes of a set and returns what to serve; throws TlsFileError naming the variable. */
function parseTlsMaterial(files: TlsFiles, bytes: { cert: Buffer; key: Buffer; ca?: Buffer }): TlsMaterial {
  const leaf = certificates(bytes.cert, files.vars.cert, true)[0]!;
  let privateKey;
  try {
    privateKey = createPrivateKey(bytes.key);
  } catch {
    throw new TlsFileError(files.vars.key, 'holds no usable PEM private key');
  }
  if (!leaf.checkPrivateKey(privateKey)) throw new TlsFileError(files.vars.key, `does not match the certificate of ${files.vars.cert}`);
  if (bytes.ca !== undefined && files.vars.ca) certificates(bytes.ca, files.vars.ca);
  try {
    // What the server will build from it: anything OpenSSL still refuses is refused here, not on a connection.
    createSecureContext({ cert: bytes.cert, key: bytes.key, ...(bytes.ca ? { ca: bytes.ca } : {}) });
  } catch {
    throw new TlsFileError(files.vars.cert, `and ${files.vars.key} are refused by OpenSSL`);
  }
  return {
    cert: bytes.cert,
    key: bytes.key,
    ...(bytes.ca ? { ca: bytes.ca } : {}),
    notAfter: new Date(leaf.validTo),
    fingerprint: leaf.fingerprint256,
  };
}

/** The files of a set, in the order they are read: certificate, key, CA. */
function watchedFiles(files: TlsFiles): WatchedFile[] {
  return [
    { variable: files.vars.cert, path: files.certFile },
    { variable: files.vars.key, path: files.keyFile },
    ...(files.caFile && files.vars.ca ? [{ variable: files.vars.ca, path: files.caFile }] : []),
  ];
}

/** Start-up: a problem is a ConfigError naming the variable (the process refuses to start). */
export function loadTlsMaterial(files: TlsFiles): TlsMaterial {
  try {
    const [cert, key, ca] = watchedFiles(files).map(readWatchedFile);
    return parseTlsMaterial(files, { cert: cert!, key: key!, ...(ca ? { ca } : {}) });
  } catch (err) {
    if (err instanceof FileProblem) throw new ConfigError(err.problem.variable, err.problem.problem);
    throw err;
  }
}

function secureContextOptions(m: TlsMaterial): SecureContextOptions {
  return { cert: m.cert, key: m.key, ...(m.ca ? { ca: m.ca } : {}) };
}

/** With a CA, a client certificate is asked for but not required by the handshake: the route that needs one checks `socket.authorized`. */
function tlsServerOptions(m: TlsMaterial): SecureContextOptions & { requestCert?: boolean; rejectUnauthorized?: boolean } {
  return { ...secureContextOptions(m), ...(m.ca ? { requestCert: true, rejectUnauthorized: false } : {}) };
}

interface TlsReloadMetrics {
  tlsReloads: { inc(labels: { listener: string; outcome: 'reloaded' | 'refused' }): void };
  tlsCertificateExpiry: { set(labels: { listener: string }, value: number): void };
}

export interface TlsListenerMetrics extends TlsReloadMetrics {
  tlsHandshakeErrors: { inc(labels: { listener: string }): void };
}

/**
 * A certificate is verified once, in the handshake, against the CA in use then: when what judges
 * certificates changes (the CA bundle, the allowed names), closeAll() closes the connections that
 * presented one (those mid-handshake when it ends) so their clients are judged again; it returns
 * how many were open. Connections without a certificate stay: no change makes them pass.
 */
function trackClientCertificateConnections(server: HttpsServer): { closeAll(): number } {
  // Bumped by each closeAll: a connection accepted under an earlier one is closed when its handshake ends.
  let generation = 0;
  // Accepted TCP connections (before their handshake), by peer address and port: the generation they came in under.
  const accepted = new Map<string, { raw: Socket; generation: number }>();
  const open = new Set<TLSSocket>();
  const peerOf = (s: Socket) => (s.remoteAddress === undefined ? undefined : `${s.remoteAddress}|${s.remotePort}`);
  server.on('connection', (raw: Socket) => {
    const key = peerOf(raw);
    if (key === undefined) return;
    accepted.set(key, { raw, generation });
    raw.once('close', () => {
      if (accepted.get(key)?.raw === raw) accepted.delete(key);
    });
  });
  server.on('secureConnection', (socket: TLSSocket) => {
    const peer = socket.getPeerCertificate();
    if (!peer || Object.keys(peer).length === 0) return;
    const key = peerOf(socket);
    const at = key === undefined ? undefined : accepted.get(key)?.generation;
    if (at !== undefined && at < generation) {
      socket.destroy();
      return;
    }
    open.add(socket);
    socket.once('close', () => open.delete(socket));
  });
  return {
    closeAll() {
      generation += 1;
      const n = open.size;
      for (const s of open) s.destroy();
      open.clear();
      return n;
    },
  };
}

/** TLS of one listener: its files, what was loaded at start, how often to look for a renewal. */
export interface ListenerTls {
  files: TlsFiles;
  material: TlsMaterial;
  intervalMs: number;
}

/**
 * Plain HTTP without `tls`, else HTTPS with its files watched for renewal. A failed handshake
 * is counted and logged at debug level (scanners would flood the log otherwise).
 */
export function createListener(
  handler: RequestListener,
  opts: { tls?: ListenerTls; listener: string; logger?: Logger; metrics?: TlsListenerMetrics },
): { server: Server; reloader?: FileReloader; clientConnections?: ClientConnections } {
  if (!opts.tls) return { server: createHttpServer(handler) };
  const server = createHttpsServer(tlsServerOptions(opts.tls.material), handler);
  const clientConnections = opts.tls.material.ca ? trackClientCertificateConnections(server) : undefined;
  server.on('tlsClientError', (err: Error & { code?: string }) => {
    opts.metrics?.tlsHandshakeErrors.inc({ listener: opts.listener });
    opts.logger?.debug('tls handshake failed', { listener: opts.listener, code: err.code });
  });
  const reloader = watchTls({
    server,
    files: opts.tls.files,
    initial: opts.tls.material,
    intervalMs: opts.tls.intervalMs,
    listener: opts.listener,
    ...(opts.logger ? { logger: opts.logger } : {}),
    ...(opts.metrics ? { metrics: opts.metrics } : {}),
    ...(clientConnections ? { clientConnections } : {}),
  });
  server.once('close', () => reloader.close());
  return { server, reloader, ...(clientConnections ? { clientConnections } : {}) };
}

type ClientConnections = ReturnType<typeof trackClientCertificateConnections>;

/** Swaps a changed, valid set into the server (refused sets are reported once per distinct contents, never thrown). */
function watchTls(opts: {
  server: Pick<HttpsServer, 'setSecureContext'>;
  files: TlsFiles;
  /** The set the server started with. */
  initial: TlsMaterial;
  intervalMs: number;
  /** api or metrics. */
  listener: string;
  logger?: Logger;
  metrics?: TlsReloadMetrics;
  /** Closed when a reload changes the CA bundle. */
  clientConnections?: ClientConnections;
}): FileReloader {
  const { files, listener, logger, metrics } = opts;
  let inUse = opts.initial;
  metrics?.tlsCertificateExpiry.set({ listener }, opts.initial.notAfter.getTime() / 1000);
  return watchFiles<TlsMaterial>({
    files: watchedFiles(files),
    // The same files in the same order as each poll reads them.
    initialDigest: contentsDigest([opts.initial.cert, opts.initial.key, ...(opts.initial.ca ? [opts.initial.ca] : [])]),
    intervalMs: opts.intervalMs,
    // None of these files is optional: a missing one is a read error before parse.
    parse: ([cert, key, ca]) => parseTlsMaterial(files, { cert: cert!, key: key!, ...(ca ? { ca } : {}) }),
    apply(material) {
      try {
        opts.server.setSecureContext(secureContextOptions(material));
      } catch {
        throw new TlsFileError(files.vars.cert, 'was refused by the server');
      }
    },
    onApplied(material) {
      const caChanged = !(material.ca && inUse.ca ? material.ca.equals(inUse.ca) : material.ca === inUse.ca);
      inUse = material;
      if (caChanged && opts.clientConnections) {
        const closed = opts.clientConnections.closeAll();
        logger?.info('tls client CA changed: connections that presented a client certificate closed', { listener, closed });
      }
      metrics?.tlsReloads.inc({ listener, outcome: 'reloaded' });
      metrics?.tlsCertificateExpiry.set({ listener }, material.notAfter.getTime() / 1000);
      logger?.info('tls certificate reloaded', {
        listener,
        fingerprint: material.fingerprint,
        not_after: material.notAfter.toISOString(),
      });
    },
    onRefused(problems) {
      metrics?.tlsReloads.inc({ listener, outcome: 'refused' });
      logger?.error('tls reload refused: keeping the certificate in use', { listener, ...problems[0] });
    },
  });
}

/** Both files of a pair or neither, checked on the raw environment so it joins the rest of the start-up report. */
export function tlsPairProblems(env: Record<string, string | undefined>, certVar: string, keyVar: string): ConfigProblem[] {
  const set = (v: string) => (env[v] ?? '').trim() !== '';
  if (set(certVar) && !set(keyVar)) return [{ variable: keyVar, problem: `is required when ${certVar} is set` }];
  if (set(keyVar) && !set(certVar)) return [{ variable: certVar, problem: `is required when ${keyVar} is set` }];
  return [];
}
