import { execFileSync } from 'node:child_process';
import { randomBytes, X509Certificate } from 'node:crypto';
import { mkdirSync, readFileSync, readdirSync, renameSync, rmSync, symlinkSync, writeFileSync, existsSync } from 'node:fs';
import { request as httpsRequest, type Agent } from 'node:https';
import type { IncomingHttpHeaders } from 'node:http';
import { join } from 'node:path';
import type { TLSSocket } from 'node:tls';

/**
 * Certificates made by the test with the real openssl (P-256 keys: fast to generate), a Secret
 * volume written the way the kubelet writes one, and an HTTPS client that reports which
 * certificate the server presented.
 */
export interface Pem {
  cert: string;
  key: string;
  /** SHA-256 fingerprint, as Node's getPeerCertificate().fingerprint256 prints it. */
  fingerprint: string;
}

let seq = 0;
function openssl(args: string[], cwd: string): void {
  execFileSync('openssl', args, { cwd, stdio: ['ignore', 'ignore', 'pipe'], timeout: 30_000 });
}

function read(dir: string, base: string): Pem {
  const cert = readFileSync(join(dir, `${base}.crt`), 'utf8');
  return { cert, key: readFileSync(join(dir, `${base}.key`), 'utf8'), fingerprint: new X509Certificate(cert).fingerprint256 };
}

/** A self-signed CA. */
export function makeCa(dir: string, name: string): Pem {
  const base = `${name}-${++seq}`;
  openssl(
    [
      'req',
      '-x509',
      '-new',
      '-newkey',
      'ec',
      '-pkeyopt',
      'ec_paramgen_curve:P-256',
      '-nodes',
      '-keyout',
      `${base}.key`,
      '-out',
      `${base}.crt`,
      '-days',
      '2',
      '-subj',
      `/CN=${name}`,
      '-addext',
      'basicConstraints=critical,CA:TRUE',
      '-addext',
      'keyUsage=critical,keyCertSign,cRLSign',
    ],
    dir,
  );
  return read(dir, base);
}

/**
 * A leaf signed by `ca`, its subject CN=`name`: a server certificate for `names` (default 127.0.0.1
 * and localhost), or a client certificate (default: no subjectAltName). A name that is an IPv4
 * address is an IP SAN, one written with its type (`URI:spiffe://...`, `DNS:...`) is taken as it
 * is, any other a DNS SAN.
 */
export function makeLeaf(
  dir: string,
  ca: Pem,
  name: string,
  usage: 'server' | 'client' = 'server',
  names: readonly string[] = usage === 'server' ? ['127.0.0.1', 'localhost'] : [],
): Pem {
  const base = `${name}-${++seq}`;
  writeFileSync(join(dir, `${base}-ca.crt`), ca.cert);
  writeFileSync(join(dir, `${base}-ca.key`), ca.key, { mode: 0o600 });
  const san = names.map((n) => (/^(DNS|URI|IP):/.test(n) ? n : /^\d+\.\d+\.\d+\.\d+$/.test(n) ? `IP:${n}` : `DNS:${n}`)).join(',');
  writeFileSync(
    join(dir, `${base}.ext`),
    `${san ? `subjectAltName=${san}\n` : ''}extendedKeyUsage=${usage === 'server' ? 'serverAuth' : 'clientAuth'}\n`,
  );
  openssl(
    [
      'req',
      '-new',
      '-newkey',
      'ec',
      '-pkeyopt',
      'ec_paramgen_curve:P-256',
      '-nodes',
      '-keyout',
      `${base}.key`,
      '-out',
      `${base}.csr`,
      '-subj',
      `/CN=${name}`,
    ],
    dir,
  );
  openssl(
    [
      'x509',
      '-req',
      '-in',
      `${base}.csr`,
      '-CA',
      `${base}-ca.crt`,
      '-CAkey',
      `${base}-ca.key`,
      '-set_serial',
      `0x${randomBytes(8).toString('hex')}`,
      '-days',
      '2',
      '-out',
      `${base}.crt`,
      '-extfile',
      `${base}.ext`,
    ],
    dir,
  );
  return read(dir, base);
}

/**
 * A directory laid out as the kubelet lays out a Secret volume: the files are symlinks through
 * `..data`, itself a symlink to a timestamped directory; an update writes a new directory and
 * swaps `..data` with one rename (atomic), then removes the old directory.
 */
export class SecretVolume {
  private n = 0;
  constructor(readonly dir: string) {
    mkdirSync(dir, { recursive: true });
  }
  path(name: string): string {
    return join(this.dir, name);
  }
  write(files: Record<string, string>): void {
    const old = readdirSync(this.dir).filter((f) => f.startsWith('..20'));
    const ts = `..2030_01_01_00_00_${String(++this.n).padStart(2, '0')}.${process.pid}`;
    mkdirSync(join(this.dir, ts));
    for (const [name, text] of Object.entries(files)) writeFileSync(join(this.dir, ts, name), text, { mode: 0o600 });
    symlinkSync(ts, join(this.dir, '..data_tmp'));
    renameSync(join(this.dir, '..data_tmp'), join(this.dir, '..data'));
    for (const name of Object.keys(files)) {
      if (!existsSync(join(this.dir, name))) symlinkSync(join('..data', name), join(this.dir, name));
    }
    for (const o of old) rmSync(join(this.dir, o), { recursive: true, force: true });
  }
}

export interface HttpsAnswer {
  status: number;
  body: string;
  headers: IncomingHttpHeaders;
  /** fingerprint256 of the certificate the server presented on this connection. */
  served: string;
  /** The request went out on a kept-alive connection opened by an earlier request. */
  reusedSocket: boolean;
  /** The connection it went out on (kept open by a keep-alive agent). */
  socket: TLSSocket;
}

export interface HttpsCall {
  /** Default 127.0.0.1. */
  host?: string;
  /** The name the server's certificate is verified for (SNI too); default: the host. */
  servername?: string;
  port: number;
  path: string;
  method?: string;
  headers?: Record<string, string>;
  /** Sent in full; see `hold` for a body sent in two parts. */
  body?: string;
  ca: string | string[];
  agent?: Agent | false;
  clientCert?: Pem;
  /** Socket inactivity bound (ms); none by default. */
  timeoutMs?: number;
  /** Sends the first part of `body`, then awaits this before sending the rest (a request in flight). */
  hold?: Promise<unknown>;
  onSent?: () => void;
}

/** One HTTPS request with a real client that verifies the server against `ca`. */
export function httpsCall(c: HttpsCall): Promise<HttpsAnswer> {
  return new Promise((resolve, reject) => {
    const body = c.body ?? '';
    const req = httpsRequest(
      {
        host: c.host ?? '127.0.0.1',
        ...(c.servername ? { servername: c.servername } : {}),
        port: c.port,
        path: c.path,
        method: c.method ?? 'GET',
        ca: c.ca,
        agent: c.agent ?? false,
        ...(c.clientCert ? { cert: c.clientCert.cert, key: c.clientCert.key } : {}),
        headers: { ...(c.body !== undefined ? { 'Content-Length': String(Buffer.byteLength(body)) } : {}), ...c.headers },
      },
      (res) => {
        const socket = res.socket as TLSSocket;
        const served = socket.getPeerCertificate().fingerprint256;
        let text = '';
        res.setEncoding('utf8');
        res.on('data', (d: string) => (text += d));
        res.on('end', () =>
          resolve({ status: res.statusCode ?? 0, body: text, headers: res.headers, served, reusedSocket: req.reusedSocket, socket }),
        );
        res.on('error', reject);
      },
    );
    req.on('error', reject);
    if (c.timeoutMs !== undefined)
      req.setTimeout(c.timeoutMs, () => req.destroy(new Error(`${c.path}: no answer within ${c.timeoutMs} ms`)));
    if (c.hold) {
      const cut = Math.floor(body.length / 2);
      req.write(body.slice(0, cut), () => c.onSent?.());
      c.hold.then(
        () => req.end(body.slice(cut)),
        (err: unknown) => req.destroy(err as Error),
      );
    } else {
      req.end(body);
    }
  });
}
