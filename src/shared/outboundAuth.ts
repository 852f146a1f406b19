import { readFileSync, statSync } from 'node:fs';
import { request as httpRequest } from 'node:http';
import { request as httpsRequest } from 'node:https';
import { ConfigError, type ConfigProblem } from './errors.js';
import { parseSecretFile } from './secrets.js';

/**
 * Credentials opsgate presents to a server it asks (`<PREFIX>_*` settings), and the one HTTP call that presents them. A
 * secret file's first line is sent; files are read again when they change. Nothing here puts a value in a message.
 */
export interface OutboundAuth {
  bearer?: LiveSecret;
  basic?: { user: string; password: LiveSecret };
  tenant?: { header: string; value: LiveSecret };
  tls?: { cert?: LiveFile; key?: LiveFile; ca?: LiveFile };
}

interface LiveSecret {
  value(): string;
}

interface LiveFile {
  bytes(): Buffer;
}

type Env = Record<string, string | undefined>;
const set = (env: Env, v: string): string | undefined => {
  const x = env[v];
  return x === undefined || x.trim() === '' ? undefined : x;
};

/** A file read again when its size or modification time changed; a bad new file keeps the last good contents. */
function liveFile<T>(variable: string, path: string, parse: (b: Buffer) => T, onRefused?: (p: ConfigProblem) => void): () => T {
  const stamp = () => {
    const s = statSync(path);
    return `${s.size}:${s.mtimeMs}:${s.ino}`;
  };
  let seen = stamp();
  let current = parse(readFileSync(path));
  return () => {
    let now: string;
    try {
      now = stamp();
    } catch {
      return current;
    }
    if (now === seen) return current;
    seen = now;
    try {
      current = parse(readFileSync(path));
    } catch (err) {
      onRefused?.(err instanceof ConfigError ? err.problems[0]! : { variable, problem: 'cannot be read' });
    }
    return current;
  };
}

/** The credentials of one prefix: every problem at once (a ConfigError). `onSecret` is told every value in use (redaction). */
export function loadOutboundAuth(
  env: Env,
  prefix: string,
  opts: { tenant?: boolean; onSecret?: (v: string) => void; onRefused?: (p: ConfigProblem) => void } = {},
): OutboundAuth {
  const problems: ConfigProblem[] = [];
  const watched = <T>(variable: string, path: string, parse: (b: Buffer) => T): (() => T) | undefined => {
    try {
      return liveFile(variable, path, parse, opts.onRefused);
    } catch (err) {
      const code = (err as { code?: string }).code ?? 'error';
      problems.push(err instanceof ConfigError ? err.problems[0]! : { variable, problem: `cannot be read (${code})` });
      return undefined;
    }
  };
  /** Both or neither of a and b; else a problem of the one missing. */
  const pair = (a: unknown, b: unknown, aVar: string, bVar: string, what: string): boolean => {
    if ((a === undefined) === (b === undefined)) return true;
    problems.push({
      variable: a === undefined ? aVar : bVar,
      problem: `is needed with ${a === undefined ? bVar : aVar} (${what} needs both)`,
    });
    return false;
  };
  const secret = (name: string): LiveSecret | undefined => {
    const inline = set(env, name);
    const path = set(env, `${name}_FILE`)?.trim();
    if (inline !== undefined && path !== undefined) {
      problems.push({ variable: `${name}_FILE`, problem: `is set together with ${name}; set one of them` });
      return undefined;
    }
    if (inline !== undefined) {
      opts.onSecret?.(inline);
      return { value: () => inline };
    }
    if (path === undefined) return undefined;
    const value = watched(`${name}_FILE`, path, (b) => {
      const v = parseSecretFile(b.toString('utf8'), `${name}_FILE`)[0]!;
      opts.onSecret?.(v);
      return v;
    });
    return value && { value };
  };
  const file = (name: string): LiveFile | undefined => {
    const path = set(env, name)?.trim();
    const bytes = path === undefined ? undefined : watched(name, path, (b) => b);
    return bytes && { bytes };
  };
  const out: OutboundAuth = {};
  const bearer = secret(`${prefix}_BEARER_TOKEN`);
  const user = set(env, `${prefix}_BASIC_AUTH_USER`);
  const password = secret(`${prefix}_BASIC_AUTH_PASSWORD`);
  if (bearer) out.bearer = bearer;
  if (pair(user, password, `${prefix}_BASIC_AUTH_USER`, `${prefix}_BASIC_AUTH_PASSWORD`, 'basic auth') && user !== undefined && password) {
    if (user.includes(':')) problems.push({ variable: `${prefix}_BASIC_AUTH_USER`, problem: 'must not contain ":"' });
    out.basic = { user, password };
  }
  if (out.bearer && out.basic) {
    problems.push({
      variable: `${prefix}_BEARER_TOKEN`,
      problem: `is set together with ${prefix}_BASIC_AUTH_USER; one Authorization header: set one of them`,
    });
  }
  const cert = file(`${prefix}_TLS_CERT_FILE`);
  const key = file(`${prefix}_TLS_KEY_FILE`);
  const ca = file(`${prefix}_TLS_CA_FILE`);
  if (!problems.some((p) => p.variable.startsWith(`${prefix}_TLS_`))) {
    pair(cert, key, `${prefix}_TLS_CERT_FILE`, `${prefix}_TLS_KEY_FILE`, 'a client certificate');
  }
  if (cert || key || ca) out.tls = { ...(cert ? { cert } : {}), ...(key ? { key } : {}), ...(ca ? { ca } : {}) };
  if (opts.tenant) {
    const tenant = secret(`${prefix}_TENANT`);
    const header = set(env, `${prefix}_TENANT_HEADER`)?.trim() ?? 'X-Scope-OrgID';
    if (!/^[A-Za-z0-9!#$%&'*+.^_`|~-]+$/.test(header))
      problems.push({ variable: `${prefix}_TENANT_HEADER`, problem: 'is not an HTTP header name' });
    else if (tenant) out.tenant = { header, value: tenant };
  }
  if (problems.length > 0) throw new ConfigError(problems);
  return out;
}

/** Whether the server is asked with a credential of its own (a bearer token, basic auth or a client certificate). */
export const authenticates = (a: OutboundAuth | undefined): boolean => !!a && (!!a.bearer || !!a.basic || !!a.tls?.cert);

export class OutboundError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'OutboundError';
  }
}

/** One request to `base` + `path` with the credentials, bounded; no answer: an OutboundError naming `what`, never a credential. */
export function outboundCall(
  what: string,
  base: string,
  auth: OutboundAuth | undefined,
  timeoutMs: number,
  method: string,
  path: string,
  body?: string,
  /** Headers a server asks for besides these (GitHub's User-Agent and API version). */
  extra: Readonly<Record<string, string>> = {},
): Promise<{ status: number; text: string }> {
  const url = new URL(`${base}${path}`);
  const headers: Record<string, string> = { accept: 'application/json', ...extra };
  if (body !== undefined) headers['content-type'] = 'application/json';
  if (auth?.bearer) headers.authorization = `Bearer ${auth.bearer.value()}`;
  else if (auth?.basic)
    headers.authorization = `Basic ${Buffer.from(`${auth.basic.user}:${auth.basic.password.value()}`).toString('base64')}`;
  if (auth?.tenant) headers[auth.tenant.header] = auth.tenant.value.value();
  const where = `${what} ${method} ${path.split('?')[0]}`;
  return new Promise((resolve, reject) => {
    const tls = auth?.tls;
    const options = {
      method,
      headers,
      ...(url.protocol === 'https:' && tls
        ? { ...(tls.cert ? { cert: tls.cert.bytes(), key: tls.key!.bytes() } : {}), ...(tls.ca ? { ca: tls.ca.bytes() } : {}) }
        : {}),
    };
    const req = (url.protocol === 'https:' ? httpsRequest : httpRequest)(url, options, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => {
        clearTimeout(timer);
        resolve({ status: res.statusCode ?? 0, text: Buffer.concat(chunks).toString('utf8') });
      });
      res.on('error', () => {
        clearTimeout(timer);
        reject(new OutboundError(`${where}: the answer broke off`));
      });
    });
    const timer = setTimeout(() => {
      req.destroy();
      reject(new OutboundError(`${where}: no answer within ${timeoutMs} ms`));
    }, timeoutMs);
    req.on('error', (err: NodeJS.ErrnoException) => {
      clearTimeout(timer);
      const tlsProblem = /CERT|SSL|TLS|SELF_SIGNED|UNABLE_TO/i.test(err.code ?? '');
      reject(new OutboundError(`${where}: ${tlsProblem ? 'TLS handshake failed' : 'unreachable'}`));
    });
    req.end(body);
  });
}
