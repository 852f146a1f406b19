import { createServer, type Server } from 'node:https';
import type { AddressInfo } from 'node:net';
import { exportJWK, exportSPKI, generateKeyPair, SignJWT, type JWK } from 'jose';
import type { Pem } from './certs.js';

/**
 * A real OIDC issuer on 127.0.0.1 run by the test: HTTPS with a certificate of the test's own CA,
 * its discovery document at /.well-known/openid-configuration and its JWKS at /keys, signing with
 * keys made by jose. Keys can be added (a rotation) and requests required to carry a bearer token
 * (a Kubernetes API server that serves discovery to authenticated callers only); its discovery
 * document may point jwks_uri at another server, and it may serve other JSON documents (an API
 * server's EndpointSlice). It records the Authorization header of every request.
 */
export interface SigningKey {
  kid: string;
  alg: 'RS256' | 'ES256';
  privateKey: CryptoKey;
  publicKey: CryptoKey;
  jwk: JWK;
  /** The public key as SPKI PEM text (what a confused verifier might use as an HMAC secret). */
  spki: string;
}

export interface LocalIssuer {
  /** https://127.0.0.1:<port> */
  url: string;
  keys: SigningKey[];
  /** Requests served, by path. */
  hits: Record<string, number>;
  /** The Authorization header of every request, by path ('' for none). */
  authorizations: Record<string, string[]>;
  /** The discovery document's jwks_uri (default this server's /keys). */
  pointKeysAt(url: string): void;
  /** Serves `body` as JSON at `path`. */
  serve(path: string, body: unknown): void;
  /** A key made now; `publish` puts it in the JWKS (a rotation), else only the test holds it. */
  newKey(alg: 'RS256' | 'ES256', publish: boolean): Promise<SigningKey>;
  publish(key: SigningKey): void;
  /** A token signed with `key` (default the first), with these claims (iss defaults to this issuer). */
  sign(claims: Record<string, unknown>, key?: SigningKey, header?: Record<string, unknown>): Promise<string>;
  /** Every request must carry `Authorization: Bearer <token>` (else 401). */
  requireBearer(token: string | undefined): void;
  stop(): Promise<void>;
}

let seq = 0;

export async function makeKey(alg: 'RS256' | 'ES256'): Promise<SigningKey> {
  const { privateKey, publicKey } = await generateKeyPair(alg, { extractable: true });
  const kid = `k${++seq}-${alg.toLowerCase()}`;
  const jwk = { ...(await exportJWK(publicKey)), kid, alg, use: 'sig' };
  return { kid, alg, privateKey, publicKey, jwk, spki: await exportSPKI(publicKey) };
}

export async function startIssuer(tls: Pem, alg: 'RS256' | 'ES256' = 'RS256'): Promise<LocalIssuer> {
  const published: SigningKey[] = [await makeKey(alg)];
  const hits: Record<string, number> = {};
  const authorizations: Record<string, string[]> = {};
  const documents = new Map<string, unknown>();
  let bearer: string | undefined;
  let url = '';
  let keysAt: string | undefined;
  const server: Server = createServer({ cert: tls.cert, key: tls.key }, (req, res) => {
    const path = (req.url ?? '/').split('?')[0]!;
    hits[path] = (hits[path] ?? 0) + 1;
    (authorizations[path] ??= []).push(req.headers.authorization ?? '');
    if (bearer !== undefined && req.headers.authorization !== `Bearer ${bearer}`) {
      res.writeHead(401, { 'content-type': 'application/json' }).end('{"message":"Unauthorized"}');
      return;
    }
    if (path === '/.well-known/openid-configuration') {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(
        JSON.stringify({
          issuer: url,
          jwks_uri: keysAt ?? `${url}/keys`,
          response_types_supported: ['id_token'],
          subject_types_supported: ['public'],
          id_token_signing_alg_values_supported: ['RS256', 'ES256'],
        }),
      );
      return;
    }
    if (path === '/keys') {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ keys: published.map((k) => k.jwk) }));
      return;
    }
    if (documents.has(path)) {
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(documents.get(path)));
      return;
    }
    res.writeHead(404).end();
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  url = `https://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return {
    url,
    keys: published,
    hits,
    authorizations,
    pointKeysAt(u) {
      keysAt = u;
    },
    serve(path, body) {
      documents.set(path, body);
    },
    async newKey(a, publish) {
      const k = await makeKey(a);
      if (publish) published.push(k);
      return k;
    },
    publish(k) {
      published.push(k);
    },
    async sign(claims, key = published[0]!, header = {}) {
      return new SignJWT({ iss: url, ...claims })
        .setProtectedHeader({ alg: key.alg, kid: key.kid, typ: 'JWT', ...header })
        .sign(key.privateKey);
    },
    requireBearer(token) {
      bearer = token;
    },
    stop: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

const now = () => Math.floor(Date.now() / 1000);

/**
 * Claims shaped as GitHub Actions documents its OIDC token (docs.github.com, "About security
 * hardening with OpenID Connect"), for a push to main of acme/storefront.
 */
export function githubClaims(over: Record<string, unknown> = {}): Record<string, unknown> {
  const t = now();
  return {
    jti: `gh-${++seq}`,
    sub: 'repo:acme/storefront:ref:refs/heads/main',
    aud: 'opsgate',
    ref: 'refs/heads/main',
    sha: 'e1c5b7a0f9d3c2b1a0e9d8c7b6a5f4e3d2c1b0a9',
    repository: 'acme/storefront',
    repository_owner: 'acme',
    repository_owner_id: '65',
    repository_visibility: 'private',
    repository_id: '74',
    actor_id: '12',
    actor: 'octocat',
    run_id: '1234',
    run_number: '10',
    run_attempt: '1',
    runner_environment: 'github-hosted',
    workflow: 'deploy',
    head_ref: '',
    base_ref: '',
    event_name: 'push',
    ref_type: 'branch',
    workflow_ref: 'acme/storefront/.github/workflows/deploy.yml@refs/heads/main',
    job_workflow_ref: 'acme/storefront/.github/workflows/deploy.yml@refs/heads/main',
    nbf: t - 5,
    iat: t - 5,
    exp: t + 300,
    ...over,
  };
}

/**
 * Claims shaped as GitLab documents a CI/CD job's ID token (docs.gitlab.com, "OpenID Connect
 * (OIDC) Authentication Using ID Tokens"): `ref` is the bare branch name.
 */
export function gitlabClaims(over: Record<string, unknown> = {}): Record<string, unknown> {
  const t = now();
  return {
    namespace_id: '72',
    namespace_path: 'acme',
    project_id: '20',
    project_path: 'acme/shop',
    user_id: '1',
    user_login: 'sample-user',
    user_email: 'sample-user@example.com',
    user_access_level: 'developer',
    pipeline_id: '574',
    pipeline_source: 'push',
    job_id: '302',
    ref: 'main',
    ref_type: 'branch',
    ref_path: 'refs/heads/main',
    ref_protected: 'true',
    runner_id: 1,
    runner_environment: 'gitlab-hosted',
    sha: '714a629c0b401fdce83e847fc9589983fc6f46bc',
    project_visibility: 'private',
    ci_config_ref_uri: 'gitlab.example.com/acme/shop//.gitlab-ci.yml@refs/heads/main',
    ci_config_sha: '714a629c0b401fdce83e847fc9589983fc6f46bc',
    jti: `gl-${++seq}`,
    sub: 'project_path:acme/shop:ref_type:branch:ref:main',
    aud: 'opsgate',
    nbf: t - 5,
    iat: t - 5,
    exp: t + 300,
    ...over,
  };
}

/** Claims of a projected, audience-bound Kubernetes ServiceAccount token. */
export function kubernetesClaims(namespace: string, serviceAccount: string, over: Record<string, unknown> = {}): Record<string, unknown> {
  const t = now();
  return {
    aud: ['opsgate'],
    exp: t + 600,
    iat: t - 5,
    nbf: t - 5,
    jti: `k8s-${++seq}`,
    'kubernetes.io': {
      namespace,
      node: { name: 'node-1', uid: '0c1e2f3a-0000-4000-8000-000000000001' },
      pod: { name: `${serviceAccount}-pod`, uid: '0c1e2f3a-0000-4000-8000-000000000002' },
      serviceaccount: { name: serviceAccount, uid: '0c1e2f3a-0000-4000-8000-000000000003' },
    },
    sub: `system:serviceaccount:${namespace}:${serviceAccount}`,
    ...over,
  };
}
