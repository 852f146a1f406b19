import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import * as k8s from '@kubernetes/client-node';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createOidcVerifier } from '../../../src/middleware/oidc.js';
import { parseOidcFile } from '../../../src/api/oidcConfig.js';
import { kubectl, ok, useCluster } from '../../helpers/cluster.js';
import { adminKubeConfig, createNamespaces, deleteNamespaces } from '../../helpers/controlPlaneFixtures.js';

jest.setTimeout(180_000);

/**
 * The real kube-apiserver as an OIDC issuer: a TokenRequest of audience `opsgate` for a workload's
 * ServiceAccount authenticates as `k8s:<namespace>/<name>`, another audience does not. opsgate reads
 * the issuer's keys with its own ServiceAccount token (`discovery_auth: serviceaccount`), which the
 * built-in system:service-account-issuer-discovery ClusterRole allows every ServiceAccount (its
 * default binding to system:serviceaccounts). The test apiserver's issuer
 * (https://kubernetes.default.svc.cluster.local) is a name only pods resolve, so the entry gives
 * the key set's address on the apiserver (`jwks_uri`); the token's `iss` is still checked against it.
 * opsgate sends its token there only as to the API server its pod's environment names
 * (KUBERNETES_SERVICE_HOST and _PORT, given to the verifier as a pod has them): anywhere else it
 * fetches the keys without it, which this apiserver refuses. Tokens that live longer than the
 * kubernetes kind allows (1 h) are refused.
 */
const ISSUER = 'https://kubernetes.default.svc.cluster.local';
const CI = 'oidc-ci';
const OPSGATE = 'oidc-opsgate';
let cluster: Awaited<ReturnType<typeof useCluster>>;
let admin: k8s.KubeConfig;
const dir = mkdtempSync(join(tmpdir(), 'opsgate-e2e-oidc-'));

const token = async (namespace: string, name: string, audiences: string[], expirationSeconds = 600) =>
  (
    await admin
      .makeApiClient(k8s.CoreV1Api)
      .createNamespacedServiceAccountToken({ name, namespace, body: { spec: { audiences, expirationSeconds } } })
  ).status!.token!;

/** The API server as a pod's environment names it. */
const podEnv = () => {
  const u = new URL(cluster.server);
  return { KUBERNETES_SERVICE_HOST: u.hostname, KUBERNETES_SERVICE_PORT: u.port };
};

/** A pod's ServiceAccount mount: its token (default: opsgate's, audience the API server) and the cluster's CA. */
async function serviceAccountDir(name: string, saToken?: string): Promise<string> {
  const d = mkdtempSync(join(dir, `${name}-`));
  writeFileSync(join(d, 'token'), saToken ?? (await token(OPSGATE, 'opsgate', [])));
  writeFileSync(join(d, 'ca.crt'), cluster.caPem);
  return d;
}

beforeAll(async () => {
  cluster = await useCluster();
  admin = adminKubeConfig(cluster);
  await createNamespaces(cluster, [CI, OPSGATE]);
  ok(
    await kubectl(
      cluster.kubeconfigPath,
      ['apply', '-f', '-'],
      [
        `apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: tekton-bot, namespace: ${CI}}`,
        `apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: opsgate, namespace: ${OPSGATE}}`,
      ].join('\n---\n'),
    ),
    'service accounts',
  );
}, 240_000);

afterAll(async () => {
  await deleteNamespaces(cluster, [CI, OPSGATE]);
  await cluster.release();
  rmSync(dir, { recursive: true, force: true });
}, 120_000);

const issuers = () =>
  parseOidcFile(`
issuers:
  - issuer: ${ISSUER}
    kind: kubernetes
    audience: opsgate
    discovery_auth: serviceaccount
    jwks_uri: ${cluster.server}/openid/v1/jwks
    rules:
      - match: {/kubernetes.io/namespace: ${CI}}
        owner: "k8s:{/kubernetes.io/namespace}/{/kubernetes.io/serviceaccount/name}"
        role: operator
        scope: {namespaces: ["{/kubernetes.io/namespace}"]}
`);

describe('the kube-apiserver as issuer', () => {
  it('a TokenRequest of audience opsgate authenticates; another audience does not', async () => {
    const verifier = createOidcVerifier({
      settings: { issuers: issuers(), configured: true },
      serviceAccountDir: await serviceAccountDir('opsgate'),
      env: podEnv(),
    });
    const caller = await verifier.verify(await token(CI, 'tekton-bot', ['opsgate']));
    expect(caller).toMatchObject({
      identity: {
        owner: `k8s:${CI}/tekton-bot`,
        principal: `oidc:kubernetes.default.svc.cluster.local:system:serviceaccount:${CI}:tekton-bot`,
      },
      role: 'operator',
      scope: { namespaces: [CI] },
      audit: { issuer: ISSUER, subject: `system:serviceaccount:${CI}:tekton-bot` },
    });
    await expect(verifier.verify(await token(CI, 'tekton-bot', ['https://kubernetes.default.svc']))).rejects.toMatchObject({
      code: 'invalid_oidc_token',
    });
    // A ServiceAccount of another namespace: a valid token that no rule admits.
    await expect(verifier.verify(await token(OPSGATE, 'opsgate', ['opsgate']))).rejects.toMatchObject({ code: 'oidc_no_matching_rule' });
    // A token the apiserver made to live two hours: longer than a kubernetes issuer's default bound.
    await expect(verifier.verify(await token(CI, 'tekton-bot', ['opsgate'], 7200))).rejects.toMatchObject({
      code: 'oidc_token_lifetime_exceeded',
    });
  });

  it('a jwks_uri on a host that is not the API server the pod knows gets no token: the apiserver refuses the keys, opsgate fails closed (503)', async () => {
    const verifier = createOidcVerifier({
      settings: { issuers: issuers(), configured: true },
      serviceAccountDir: await serviceAccountDir('elsewhere'),
      env: {},
    });
    await expect(verifier.verify(await token(CI, 'tekton-bot', ['opsgate']))).rejects.toMatchObject({ code: 'oidc_issuer_unavailable' });
  });

  it('when the API server refuses opsgate the keys (a token it does not accept), it fails closed (503)', async () => {
    const verifier = createOidcVerifier({
      settings: { issuers: issuers(), configured: true },
      serviceAccountDir: await serviceAccountDir('refused', 'not-a-token'),
      env: podEnv(),
    });
    await expect(verifier.verify(await token(CI, 'tekton-bot', ['opsgate']))).rejects.toMatchObject({ code: 'oidc_issuer_unavailable' });
  });
});
