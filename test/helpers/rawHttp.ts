/**
 * A raw HTTP/1.1 client over a TCP socket: the fuzz tests need to send bytes that fetch/undici
 * refuse to produce (control characters and non-ASCII bytes in header values, unknown methods,
 * malformed request lines, 20 KiB headers, lying content types).
 */
import { connect } from 'node:net';

export interface RawResponse {
  status: number;
  headers: Record<string, string>;
  body: string;
  /** The whole response as received (status line, headers, body). */
  raw: string;
}

export interface RawRequest {
  method: string;
  path: string;
  headers?: Array<[string, string | Buffer]>;
  body?: Buffer | string;
  /** Set Content-Length from the body (default true when there is a body). */
  contentLength?: boolean;
}

export function buildRequest(r: RawRequest): Buffer {
  const body = r.body === undefined ? undefined : Buffer.isBuffer(r.body) ? r.body : Buffer.from(r.body, 'utf8');
  const parts: Buffer[] = [Buffer.from(`${r.method} ${r.path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n`, 'latin1')];
  for (const [k, v] of r.headers ?? []) {
    parts.push(Buffer.from(`${k}: `, 'latin1'), Buffer.isBuffer(v) ? v : Buffer.from(v, 'utf8'), Buffer.from('\r\n', 'latin1'));
  }
  if (body && r.contentLength !== false) parts.push(Buffer.from(`Content-Length: ${body.length}\r\n`, 'latin1'));
  parts.push(Buffer.from('\r\n', 'latin1'));
  if (body) parts.push(body);
  return Buffer.concat(parts);
}

function dechunk(body: Buffer): Buffer {
  const out: Buffer[] = [];
  let i = 0;
  for (;;) {
    const eol = body.indexOf('\r\n', i);
    if (eol < 0) break;
    const size = parseInt(body.subarray(i, eol).toString('latin1'), 16);
    if (!Number.isFinite(size) || size === 0) break;
    out.push(body.subarray(eol + 2, eol + 2 + size));
    i = eol + 2 + size + 2;
  }
  return Buffer.concat(out);
}

export function rawRequest(port: number, req: RawRequest | Buffer, timeoutMs = 20_000): Promise<RawResponse> {
  const bytes = Buffer.isBuffer(req) ? req : buildRequest(req);
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    const socket = connect(port, '127.0.0.1');
    const timer = setTimeout(() => {
      socket.destroy();
      reject(new Error(`no complete response within ${timeoutMs} ms`));
    }, timeoutMs);
    socket.on('connect', () => {
      // The server may answer (403, 413) and close before it has read a large body: ignore EPIPE.
      socket.write(bytes, () => undefined);
    });
    socket.on('data', (c: Buffer) => chunks.push(c));
    const finish = () => {
      clearTimeout(timer);
      const all = Buffer.concat(chunks);
      const sep = all.indexOf('\r\n\r\n');
      if (sep < 0) {
        reject(new Error(`no HTTP response (got ${all.length} bytes: ${JSON.stringify(all.toString('latin1').slice(0, 200))})`));
        return;
      }
      const head = all.subarray(0, sep).toString('latin1').split('\r\n');
      const status = Number(/^HTTP\/1\.[01] (\d{3})/.exec(head[0] ?? '')?.[1] ?? NaN);
      const headers: Record<string, string> = {};
      for (const line of head.slice(1)) {
        const i = line.indexOf(':');
        if (i > 0) headers[line.slice(0, i).trim().toLowerCase()] = line.slice(i + 1).trim();
      }
      let body: Buffer = all.subarray(sep + 4);
      if (/chunked/i.test(headers['transfer-encoding'] ?? '')) body = dechunk(body);
      else if (headers['content-length'] !== undefined) body = body.subarray(0, Number(headers['content-length']));
      resolve({ status, headers, body: body.toString('utf8'), raw: all.toString('utf8') });
    };
    socket.on('close', finish);
    socket.on('error', () => {
      /* ECONNRESET/EPIPE after an early answer: 'close' follows and reports what arrived */
    });
  });
}
