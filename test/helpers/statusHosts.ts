import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:https';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Ajv, type ValidateFunction } from 'ajv';
import { makeCa, makeLeaf } from './certs.js';

/**
 * The hosts of commits (GitHub, GitLab, Gitea, Bitbucket) as one local HTTPS server (a test CA the
 * worker is told to trust) that checks every request: its method and path, its Authorization
 * header (a Bearer token of `tokens`, read at each request so a test can rotate one), and its body
 * against the host's own description of the operation: GitHub's OpenAPI description from
 * @octokit/openapi, Gitea's and Bitbucket's descriptions and GitLab's documented attributes kept in
 * test/fixtures/commit-status (each naming its source).
 */

// --- the hosts' descriptions ---------------------------------------------------------------

type Json = Record<string, unknown>;
const ajv = new Ajv({ strict: false, allErrors: true });
const fixture = (name: string) =>
  JSON.parse(readFileSync(new URL(`../fixtures/commit-status/${name}.json`, import.meta.url), 'utf8')) as Json;

interface Operation {
  method: string;
  path: RegExp;
  validate: ValidateFunction;
  /** The properties the description names: a body with any other fails the check. */
  known: Set<string>;
}

const pathRe = (template: string, prefix = '') =>
  new RegExp(`^${prefix}${template.replace(/[.*+?^$()|[\]\\]/g, '\\$&').replace(/\{[^}]+\}/g, '[^/]+')}$`);

function operations(): Record<string, Operation[]> {
  const octokit = JSON.parse(
    readFileSync(new URL('../../node_modules/@octokit/openapi/generated/api.github.com.json', import.meta.url), 'utf8'),
  ) as { paths: Record<string, Record<string, { requestBody: { content: { 'application/json': { schema: Json } } } }>> };
  const github = [
    '/repos/{owner}/{repo}/deployments',
    '/repos/{owner}/{repo}/deployments/{deployment_id}/statuses',
    '/repos/{owner}/{repo}/statuses/{sha}',
  ].map((p) => {
    const schema = octokit.paths[p]!.post!.requestBody.content['application/json'].schema;
    return {
      method: 'POST',
      path: pathRe(p, '/github'),
      validate: ajv.compile(schema),
      known: new Set(Object.keys(schema.properties as Json)),
    };
  });
  const gitea = fixture('gitea') as { paths: Record<string, unknown>; definitions: Record<string, Json> };
  const giteaPath = Object.keys(gitea.paths)[0]!;
  const bitbucket = fixture('bitbucket') as { paths: Record<string, unknown>; components: { schemas: Record<string, Json> } };
  const bitbucketPath = Object.keys(bitbucket.paths)[0]!;
  const gitlab = fixture('gitlab') as { path: string; body: Json };
  return {
    github,
    gitea: [
      {
        method: 'POST',
        path: pathRe(giteaPath, '/gitea/api/v1'),
        validate: ajv.compile({ $ref: '#/definitions/CreateStatusOption', definitions: gitea.definitions }),
        known: new Set(Object.keys(gitea.definitions.CreateStatusOption!.properties as Json)),
      },
    ],
    bitbucket: [
      {
        method: 'POST',
        path: pathRe(bitbucketPath, '/bitbucket/2.0'),
        validate: ajv.compile({ $ref: '#/components/schemas/commitstatus', components: bitbucket.components }),
        known: new Set(Object.keys(bitbucket.components.schemas.commitstatus!.properties as Json)),
      },
    ],
    gitlab: [
      {
        method: 'POST',
        path: pathRe(gitlab.path, '/gitlab/api/v4'),
        validate: ajv.compile(gitlab.body),
        known: new Set(Object.keys(gitlab.body.properties as Json)),
      },
    ],
  };
}

// --- the hosts ---------------------------------------------------------------------------

export interface Seen {
  host: string;
  method: string;
  path: string;
  body: Json;
  /** Its answer's status, and when it came (ms). */
  status: number;
  at: number;
  /** The request's problems against its host's description (none when it conforms). */
  problems: string[];
}

export interface Hosts {
  seen: Seen[];
  /** Answers of the next requests to a host (default 201), taken one per request. */
  fail: Record<string, number[]>;
  url(host: string): string;
  caFile: string;
  close(): Promise<void>;
}

export async function startStatusHosts(tokens: Record<string, string>): Promise<Hosts> {
  const dir = mkdtempSync(join(tmpdir(), 'opsgate-status-'));
  const ca = makeCa(dir, 'hosts-ca');
  const leaf = makeLeaf(dir, ca, 'hosts');
  const caFile = join(dir, 'ca.crt');
  writeFileSync(caFile, ca.cert);
  const ops = operations();
  const seen: Seen[] = [];
  const fail: Record<string, number[]> = {};
  let deployments = 1000;
  const server: Server = createServer({ cert: leaf.cert, key: leaf.key }, (req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const path = new URL(req.url ?? '/', 'https://x').pathname;
      const host = path.split('/')[1] ?? '';
      const problems: string[] = [];
      let body: Json = {};
      try {
        body = JSON.parse(Buffer.concat(chunks).toString('utf8')) as Json;
      } catch {
        problems.push('body is not JSON');
      }
      const op = (ops[host] ?? []).find((o) => o.method === req.method && o.path.test(path));
      if (!op) problems.push(`no operation ${req.method} ${path}`);
      else {
        if (!op.validate(body)) problems.push(...(op.validate.errors ?? []).map((e) => `${e.instancePath} ${e.message}`));
        for (const k of Object.keys(body)) if (!op.known.has(k)) problems.push(`unknown property ${k}`);
      }
      const token = tokens[host];
      if (req.headers.authorization !== `Bearer ${token}`) problems.push(`authorization ${req.headers.authorization}`);
      if (req.headers['content-type'] !== 'application/json') problems.push(`content-type ${req.headers['content-type']}`);
      if (host === 'github') {
        if (req.headers.accept !== 'application/vnd.github+json') problems.push(`accept ${req.headers.accept}`);
        if (req.headers['x-github-api-version'] !== '2022-11-28') problems.push('no X-GitHub-Api-Version');
        if (!req.headers['user-agent']) problems.push('no User-Agent');
      }
      const status = fail[host]?.shift() ?? 201;
      seen.push({ host, method: req.method ?? '', path, body, problems, status, at: Date.now() });
      res.writeHead(status, { 'content-type': 'application/json' });
      res.end(
        JSON.stringify(status >= 300 ? { message: 'failing on purpose' } : path.endsWith('/deployments') ? { id: ++deployments } : {}),
      );
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as AddressInfo).port;
  return {
    seen,
    fail,
    caFile,
    url: (host) => `https://127.0.0.1:${port}/${host}`,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

/** The worker's settings for `hosts`: every sender's API URL, and the token and CA of each sender not in `without`. */
export function statusHostEnv(
  hosts: Hosts,
  tokens: Record<string, string>,
  publicUrl: string,
  without: string[] = [],
): Record<string, string> {
  const env: Record<string, string> = {
    OPSGATE_PUBLIC_URL: publicUrl,
    GITHUB_STATUS_API_URL: hosts.url('github'),
    GITLAB_STATUS_API_URL: `${hosts.url('gitlab')}/api/v4`,
    GITEA_STATUS_API_URL: `${hosts.url('gitea')}/api/v1`,
    BITBUCKET_STATUS_API_URL: hosts.url('bitbucket'),
  };
  for (const [sender, token] of Object.entries(tokens)) {
    if (without.includes(sender)) continue;
    const prefix = `${sender.toUpperCase()}_STATUS`;
    env[`${prefix}_BEARER_TOKEN`] = token;
    env[`${prefix}_TLS_CA_FILE`] = hosts.caFile;
  }
  return env;
}
