import { readFileSync, statSync } from 'node:fs';
import { request as httpRequest } from 'node:http';
import { request as httpsRequest } from 'node:https';
import { ConfigError, type ConfigProblem } from './errors.js';
import { parseSecretFile } from './secrets.js';
export { outboundSecrets, outboundVariables } from './outboundVariables.js';

/**
 * Credentials opsgate presents to a server it asks (PROMETHEUS_URL, ALERTMANAGER_URL), read from
 * `<PREFIX>_*` settings, and the one HTTP call that presents them:
 * - a bearer token (`<PREFIX>_BEARER_TOKEN`, or `_FILE`);
 * - basic auth (`<PREFIX>_BASIC_AUTH_USER` and `<PREFIX>_BASIC_AUTH_PASSWORD`, or its `_FILE`);
 * - a client certificate (`<PREFIX>_TLS_CERT_FILE`, `<PREFIX>_TLS_KEY_FILE`), and a CA to verify
 *   the server with (`<PREFIX>_TLS_CA_FILE`);
 * - a tenant header (`<PREFIX>_TENANT` or `_FILE`, sent as `<PREFIX>_TENANT_HEADER`, default
 *   X-Scope-OrgID: Thanos, Mimir, Cortex), where the prefix allows one.
 * A file holds the secret on its first line and, during a rotation, the previous one on the second
 * (as the senders' secret files); the first is sent. Files are read again when they change (their
 * size or modification time), so a rotated Secret needs no restart; a changed file that is not
 * valid is refused and the last good value stays in use. Nothing here puts a value in a message.
 */
export interface OutboundAuth {
  bearer?: LiveSecret;
  basic?: { user: string; password: LiveSecret };
  tenant?: { header: string; value: LiveSecret };
  tls?: { cert?: LiveFile; key?: LiveFile; ca?: LiveFile };
}

interface LiveSecret {
  /** The value in use (a file's first line, read again when the file changed). */
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

const fileProblem = (variable: string, err: unknown): ConfigProblem =>
  err instanceof ConfigError ? err.problems[0]! : { variable, problem: `cannot be read (${(err as { code?: string }).code ?? 'error'})` };

/**
 * The credentials of one prefix, checked at start: every problem at once (a ConfigError), each
 * naming its variable. `onSecret` is told every value in use (for the logger's redaction).
 */
export function loadOutboundAuth(
  env: Env,
  prefix: string,
  opts: { tenant?: boolean; onSecret?: (v: string) => void; onRefused?: (p: ConfigProblem) => void } = {},
): OutboundAuth {
  const problems: ConfigProblem[] = [];
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
    try {
      const read = liveFile(
        `${name}_FILE`,
        path,
        (b) => {
          const v = parseSecretFile(b.toString('utf8'), `${name}_FILE`)[0]!;
          opts.onSecret?.(v);
          return v;
        },
        opts.onRefused,
      );
      return { value: read };
    } catch (err) {
      problems.push(fileProblem(`${name}_FILE`, err));
      return undefined;
    }
  };
  const file = (name: string): LiveFile | undefined => {
    const path = set(env, name)?.trim();
    if (path === undefined) return undefined;
    try {
      return { bytes: liveFile(name, path, (b) => b, opts.onRefused) };
    } catch (err) {
      problems.push(fileProblem(name, err));
      return undefined;
    }
  };

  const out: OutboundAuth = {};
  const bearer = secret(`${prefix}_BEARER_TOKEN`);
  const user = set(env, `${prefix}_BASIC_AUTH_USER`);
  const password = secret(`${prefix}_BASIC_AUTH_PASSWORD`);
  if (bearer) out.bearer = bearer;
  if ((user === undefined) !== (password === undefined)) {
    problems.push({
      variable: user === undefined ? `${prefix}_BASIC_AUTH_USER` : `${prefix}_BASIC_AUTH_PASSWORD`,
      problem: `is needed with ${user === undefined ? `${prefix}_BASIC_AUTH_PASSWORD` : `${prefix}_BASIC_AUTH_USER`} (basic auth needs both)`,
    });
  } else if (user !== undefined && password) {
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
  if ((cert === undefined) !== (key === undefined) && !problems.some((p) => p.variable.startsWith(`${prefix}_TLS_`))) {
    problems.push({
      variable: cert === undefined ? `${prefix}_TLS_CERT_FILE` : `${prefix}_TLS_KEY_FILE`,
      problem: `is needed with ${cert === undefined ? `${prefix}_TLS_KEY_FILE` : `${prefix}_TLS_CERT_FILE`} (a client certificate needs both)`,
    });
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

/**
 * One request to `base` + `path` with the credentials, bounded by `timeoutMs`. Answers the status
 * and body; throws an OutboundError (naming `what`, the method and the path, never a credential)
 * when there is no answer.
 */
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
