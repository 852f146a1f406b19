import { afterAll, beforeAll, describe, expect, jest, test } from '@jest/globals';
import { randomBytes } from 'node:crypto';
import { chmodSync, cpSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { parse } from 'yaml';
import { REPO, run, toolPath } from '../../helpers/cluster.js';
import { allDocBlocks, blockScript, runCleanBash, where, type DocBlock } from '../../helpers/docBlocks.js';
import { HOST_ARCH, PODMAN_ENV, releasePlatforms } from '../../helpers/images.js';
import { LOCAL_IMAGES, NODE_DIR, PAUSE_IMAGE, helm, kubectl, list, ok, podReady, waitFor, type Obj } from '../../helpers/nodeSupport.js';

/**
 * The release path as an SRE takes it, on the node's OCI registry (Debian's docker-registry, CNCF
 * distribution): `make release PLATFORMS=… REGISTRY=…` pushes each image as an OCI image index of
 * every platform under one tag, and the chart with its GnuPG provenance; it signs the indexes, each
 * platform's image and the chart with cosign (a key pair made here, no transparency log) and attaches
 * each image's SBOM as a signed CycloneDX attestation. The chart README's verification commands run as
 * written and pass; another key does not verify. Only then is the chart installed, pinned to the
 * digests cosign verified and checked by helm against its provenance, and the kubelet pulls both images
 * from the registry (containerd held no copy of them before). Last, a tampered tag: another image and
 * another chart pushed under the release's tags fail the same verification.
 */
jest.setTimeout(1_200_000);

const NS = 'e2e-registry';
const RELEASE = 'fromreg';
const env = Object.fromEntries(
  readFileSync(join(NODE_DIR, 'env'), 'utf8')
    .split('\n')
    .filter((l) => l.includes('='))
    .map((l) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1)]),
) as Record<string, string>;
const REGISTRY = `${env.REGISTRY_ADDR}/opsgate`;
const pkg = JSON.parse(readFileSync(join(REPO, 'package.json'), 'utf8')) as { version: string };
const chart = parse(readFileSync(join(REPO, 'charts', 'opsgate', 'Chart.yaml'), 'utf8')) as { version: string };
const PLATFORMS = releasePlatforms().map((a) => `linux/${a}`);
const MULTI = PLATFORMS.length > 1;
const INDEX = 'application/vnd.oci.image.index.v1+json';

const work = mkdtempSync(join(tmpdir(), 'opsgate-release-'));
const COSIGN_PASSWORD = randomBytes(12).toString('hex');
const GNUPGHOME = join(work, 'gnupg');
const HELM_SIGN_KEY = 'opsgate release test <release-test@opsgate.invalid>';

const cosign = (args: string[], opts: { env?: Record<string, string>; timeoutMs?: number } = {}) =>
  run(toolPath('cosign'), args, { cwd: work, timeoutMs: opts.timeoutMs ?? 180_000, env: opts.env });
const verify = (ref: string, key = 'cosign.pub') => cosign(['verify', '--key', key, '--insecure-ignore-tlog', ref]);

/** The blocks of the chart README that this file runs (labels registry-*), by label. */
function docBlock(label: string): DocBlock {
  const blocks = allDocBlocks(REPO).filter((b) => b.marker === 'node' && b.arg === label);
  expect(blocks.map((b) => b.file)).toEqual(['charts/opsgate/README.md']);
  return blocks[0]!;
}

/** A documented block as a reader runs it: in the directory with the release's cosign.pub, REGISTRY set. */
function runDocBlock(b: DocBlock) {
  return runCleanBash(
    blockScript(b),
    work,
    { PATH: `${dirname(toolPath('cosign'))}:${process.env.PATH ?? ''}`, HOME: work, REGISTRY },
    300_000,
  );
}

async function registryGet(path: string, accept: string): Promise<{ digest: string; body: Obj }> {
  const r = await fetch(`http://${env.REGISTRY_ADDR}/v2/${path}`, { headers: { Accept: accept } });
  expect(r.status).toBe(200);
  return { digest: r.headers.get('docker-content-digest') ?? '', body: (await r.json()) as Obj };
}

async function containerdRefs(): Promise<string[]> {
  const r = ok(await run('ctr', ['--address', env.CONTAINERD_ADDRESS!, '-n', 'k8s.io', 'images', 'ls', '-q']), 'ctr images ls');
  return r.stdout.split('\n').filter(Boolean);
}

/** The digest `cosign verify` checked, from its JSON output. */
function verifiedDigest(stdout: string): string {
  const out = JSON.parse(stdout) as Array<{ critical: { image: { 'docker-manifest-digest': string } } }>;
  expect(out.length).toBeGreaterThanOrEqual(1);
  return out[0]!.critical.image['docker-manifest-digest'];
}

/** artifacts/digests.txt: `<repository>@<digest> <index|linux/<arch>|chart>` per pushed artifact. */
function digests(): Array<{ ref: string; repo: string; digest: string; kind: string }> {
  return readFileSync(join(REPO, 'artifacts', 'digests.txt'), 'utf8')
    .trim()
    .split('\n')
    .map((l) => {
      const [ref, kind] = l.split(' ') as [string, string];
      return { ref, repo: ref.slice(0, ref.indexOf('@')), digest: ref.slice(ref.indexOf('@') + 1), kind };
    });
}

beforeAll(async () => {
  ok(await cosign(['generate-key-pair'], { env: { COSIGN_PASSWORD } }), 'cosign generate-key-pair');
  mkdirSync(join(work, 'other'));
  ok(await cosign(['generate-key-pair', '--output-key-prefix', 'other/cosign'], { env: { COSIGN_PASSWORD: 'other' } }), 'another key pair');
  // A GnuPG key for the chart's provenance, exported as the legacy keyrings helm reads. gpg keeps
  // secret keys in its agent: the agent of this home directory is started up front (gpgconf
  // --launch) so no gpg call starts one itself, and each step is tried again after a failure (with
  // the agent started anew), since a busy machine can make gpg give up waiting for its agent.
  mkdirSync(GNUPGHOME, { mode: 0o700 });
  writeFileSync(join(GNUPGHOME, 'gpg-agent.conf'), 'allow-loopback-pinentry\n');
  const gpgStep = async (bin: 'gpg' | 'gpgconf', args: string[], what: string) => {
    let r = await run(bin, ['--homedir', GNUPGHOME, ...args], { timeoutMs: 120_000 });
    for (let attempt = 2; r.code !== 0 && attempt <= 3; attempt++) {
      console.warn(`${what} exited ${r.code} (attempt ${attempt - 1} of 3): ${r.stderr.trim()}`);
      await run('gpgconf', ['--homedir', GNUPGHOME, '--kill', 'gpg-agent']);
      await run('gpgconf', ['--homedir', GNUPGHOME, '--launch', 'gpg-agent']);
      r = await run(bin, ['--homedir', GNUPGHOME, ...args], { timeoutMs: 120_000 });
    }
    return ok(r, what);
  };
  await gpgStep('gpgconf', ['--launch', 'gpg-agent'], 'gpgconf --launch gpg-agent');
  const gpg = (args: string[], what: string) => gpgStep('gpg', ['--batch', ...args], what);
  await gpg(['--pinentry-mode', 'loopback', '--passphrase', '', '--quick-gen-key', HELM_SIGN_KEY, 'rsa3072', 'sign', 'never'], 'gpg key');
  await gpg(['--output', join(work, 'secring.gpg'), '--yes', '--export-secret-keys'], 'gpg --export-secret-keys');
  await gpg(['--output', join(work, 'pubring.gpg'), '--yes', '--export'], 'gpg --export');
}, 300_000);

afterAll(async () => {
  await run('gpgconf', ['--homedir', GNUPGHOME, '--kill', 'gpg-agent']);
  await helm(['uninstall', RELEASE, '-n', NS, '--wait', '--timeout', '2m']);
  await kubectl(['delete', 'namespace', NS, '--wait=false']);
  rmSync(work, { recursive: true, force: true });
});

describe('a signed release in the node registry, verified before it is installed', () => {
  let pushed: ReturnType<typeof digests>;
  let verified: Record<string, string>;

  test('make release PLATFORMS=… REGISTRY=… pushes each image as one tag over every platform, the chart with its provenance, and signs them', async () => {
    expect(env.REGISTRY_ADDR).toMatch(/^127\.0\.0\.1:\d+$/);
    expect(PLATFORMS).toContain(`linux/${HOST_ARCH}`);
    const before = await containerdRefs();
    expect(before.filter((r) => r.startsWith(REGISTRY))).toEqual([]);

    const r = await run(
      'make',
      [
        '--no-print-directory',
        'release',
        `PLATFORMS=${PLATFORMS.join(',')}`,
        `REGISTRY=${REGISTRY}`,
        'REGISTRY_INSECURE=1',
        `COSIGN_KEY=${join(work, 'cosign.key')}`,
        `HELM_SIGN_KEY=${HELM_SIGN_KEY}`,
        `HELM_KEYRING=${join(work, 'secring.gpg')}`,
      ],
      { env: { ...PODMAN_ENV, COSIGN_PASSWORD }, timeoutMs: 1_000_000 },
    );
    ok(r, 'make release … REGISTRY=…');

    pushed = digests();
    const kinds = (repo: string) => pushed.filter((d) => d.repo === repo).map((d) => d.kind);
    for (const t of ['api', 'worker']) {
      const repo = `${REGISTRY}/opsgate-${t}`;
      expect(kinds(repo).sort()).toEqual([...(MULTI ? ['index'] : []), ...PLATFORMS].sort());
      // What the tag names in the registry: the index (or the one image), as digests.txt says.
      const tagged = await registryGet(
        `opsgate/opsgate-${t}/manifests/${pkg.version}`,
        `${INDEX}, application/vnd.oci.image.manifest.v1+json`,
      );
      expect(tagged.digest).toBe(pushed.find((d) => d.repo === repo && d.kind === (MULTI ? 'index' : PLATFORMS[0]))!.digest);
      if (MULTI) {
        expect(tagged.body.mediaType).toBe(INDEX);
        const manifests = tagged.body.manifests as Array<{ digest: string; platform: { os: string; architecture: string } }>;
        expect(manifests.map((m) => `${m.platform.os}/${m.platform.architecture}`).sort()).toEqual([...PLATFORMS].sort());
        for (const m of manifests) {
          expect(pushed.find((d) => d.repo === repo && d.kind === `${m.platform.os}/${m.platform.architecture}`)?.digest).toBe(m.digest);
          // the image's own configuration says the same architecture
          const image = await registryGet(`opsgate/opsgate-${t}/manifests/${m.digest}`, 'application/vnd.oci.image.manifest.v1+json');
          const config = (await (
            await fetch(`http://${env.REGISTRY_ADDR}/v2/opsgate/opsgate-${t}/blobs/${image.body.config.digest}`)
          ).json()) as Obj;
          expect(`${config.os}/${config.architecture}`).toBe(`${m.platform.os}/${m.platform.architecture}`);
        }
      }
    }
    expect(kinds(`${REGISTRY}/opsgate`)).toEqual(['chart']);
    const shown = ok(
      await helm(['show', 'chart', `oci://${REGISTRY}/opsgate`, '--version', chart.version, '--plain-http']),
      'helm show chart',
    );
    expect((parse(shown.stdout) as Obj).appVersion).toBe(pkg.version);
  });

  test("the chart README's cosign verify commands pass for both images and the chart; another key verifies none of them", async () => {
    const b = docBlock('registry-verify');
    const r = await runDocBlock(b);
    expect({ block: where(b), code: r.code, stderr: r.code === 0 ? '' : r.stderr }).toEqual({ block: where(b), code: 0, stderr: '' });
    verified = Object.fromEntries(
      ['opsgate-api', 'opsgate-worker', 'opsgate'].map((n) => [n, verifiedDigest(readFileSync(join(work, `${n}.verified.json`), 'utf8'))]),
    );
    // what was verified is what was pushed under the tags
    expect(verified['opsgate-api']).toBe(
      pushed.find((d) => d.repo === `${REGISTRY}/opsgate-api` && d.kind === (MULTI ? 'index' : PLATFORMS[0]))!.digest,
    );
    expect(verified['opsgate-worker']).toBe(
      pushed.find((d) => d.repo === `${REGISTRY}/opsgate-worker` && d.kind === (MULTI ? 'index' : PLATFORMS[0]))!.digest,
    );
    expect(verified.opsgate).toBe(pushed.find((d) => d.kind === 'chart')!.digest);
    // each platform's image is signed as well (a node pulls it by its own digest)
    for (const d of pushed.filter((x) => x.kind.startsWith('linux/'))) ok(await verify(d.ref), `cosign verify ${d.ref} (${d.kind})`);

    for (const ref of [`${REGISTRY}/opsgate-api:${pkg.version}`, `${REGISTRY}/opsgate:${chart.version}`]) {
      const wrong = await verify(ref, 'other/cosign.pub');
      expect(wrong.code).not.toBe(0);
      expect(wrong.stderr).toMatch(/no matching signatures|signature|verif/i);
    }
  });

  test("each platform's image carries its SBOM as a signed CycloneDX attestation (the chart README's command)", async () => {
    const b = docBlock('registry-sbom');
    cpSync(join(REPO, 'artifacts', 'digests.txt'), join(work, 'digests.txt'));
    const r = await runDocBlock(b);
    expect({ block: where(b), code: r.code, stderr: r.code === 0 ? '' : r.stderr }).toEqual({ block: where(b), code: 0, stderr: '' });
    const bom = JSON.parse(readFileSync(join(work, 'opsgate-api.cdx.json'), 'utf8')) as Obj;
    expect(bom.bomFormat).toBe('CycloneDX');
    expect(bom.components).toContainEqual(expect.objectContaining({ type: 'platform', name: 'node', version: process.versions.node }));
    // the block reads the linux/amd64 image's
    expect((bom.metadata.component.properties as Obj[]).find((p) => p.name === 'oci:image:architecture')?.value).toBe('amd64');
    // every platform's attestation verifies, and holds that platform's SBOM
    for (const d of pushed.filter((x) => x.kind.startsWith('linux/'))) {
      const a = ok(
        await cosign(['verify-attestation', '--key', 'cosign.pub', '--insecure-ignore-tlog', '--type', 'cyclonedx', d.ref]),
        `cosign verify-attestation ${d.ref}`,
      );
      const statement = JSON.parse(
        Buffer.from((JSON.parse(a.stdout.trim().split('\n')[0]!) as { payload: string }).payload, 'base64').toString(),
      ) as Obj;
      expect(statement.predicateType).toBe('https://cyclonedx.org/bom');
      expect(statement.subject).toContainEqual(expect.objectContaining({ digest: { sha256: d.digest.replace('sha256:', '') } }));
      const props = statement.predicate.metadata.component.properties as Obj[];
      expect(props.find((p) => p.name === 'oci:image:architecture')?.value).toBe(d.kind.replace('linux/', ''));
      expect(props.find((p) => p.name === 'oci:image:digest')?.value).toBe(d.digest);
    }
  });

  test('helm install oci:// with the images pinned to the verified digests, the chart checked against its provenance: both images are pulled from the registry and helm test passes', async () => {
    expect(verified).toBeDefined();
    const apiRef = `${REGISTRY}/opsgate-api@${verified['opsgate-api']}`;
    const workerRef = `${REGISTRY}/opsgate-worker@${verified['opsgate-worker']}`;
    ok(
      await helm([
        'install',
        RELEASE,
        // by version: helm names a chart pulled by digest after the digest, and its provenance check
        // then finds no entry for that file name; --verify ties the chart to the release's GnuPG key
        `oci://${REGISTRY}/opsgate`,
        '--version',
        chart.version,
        '--verify',
        '--keyring',
        join(work, 'pubring.gpg'),
        '--plain-http',
        '-n',
        NS,
        '--create-namespace',
        '-f',
        LOCAL_IMAGES,
        '--set',
        `image.registry=${REGISTRY}`,
        '--set',
        'image.pullPolicy=Always',
        '--set',
        `api.image.digest=${verified['opsgate-api']}`,
        '--set',
        `worker.image.digest=${verified['opsgate-worker']}`,
        '--wait',
        '--timeout',
        '6m',
      ]),
      'helm install oci:// --verify',
    );
    const pods = (await list('pods', NS)).filter((p) => podReady(p));
    const images = pods.flatMap((p) => (p.spec.containers as Obj[]).map((c) => c.image as string));
    expect(images).toContain(apiRef);
    expect(images).toContain(workerRef);

    const pulled = await waitFor(
      'Pulled events for both images',
      async () => {
        const ev = (await list('events', NS)).filter((e) => e.reason === 'Pulled').map((e) => String(e.message));
        return ev.some((m) => m.includes(`Successfully pulled image "${apiRef}"`)) &&
          ev.some((m) => m.includes(`Successfully pulled image "${workerRef}"`))
          ? ev
          : false;
      },
      60_000,
    );
    expect(pulled.length).toBeGreaterThanOrEqual(2);
    const after = await containerdRefs();
    expect(after).toContain(apiRef);
    expect(after).toContain(workerRef);

    const t = await helm(['test', RELEASE, '-n', NS, '--timeout', '4m']);
    ok(t, 'helm test');
    expect(t.stdout).toMatch(/Phase:\s+Succeeded/);
  });

  test('a tampered tag fails verification: another image under the API tag, another chart under the chart version', async () => {
    // Another image pushed under the release's API tag: the tag now names a digest nobody signed.
    ok(
      await run('podman', ['push', '--quiet', '--tls-verify=false', PAUSE_IMAGE, `docker://${REGISTRY}/opsgate-api:${pkg.version}`], {
        env: PODMAN_ENV,
        timeoutMs: 300_000,
      }),
      'podman push (tamper)',
    );
    const b = docBlock('registry-verify');
    const r = await runDocBlock(b);
    expect(r.code).not.toBe(0);
    expect(r.stderr).toMatch(/no (matching )?signatures/i);
    const api = await verify(`${REGISTRY}/opsgate-api:${pkg.version}`);
    expect(api.code).not.toBe(0);
    // the worker's tag was left alone and still verifies
    ok(await verify(`${REGISTRY}/opsgate-worker:${pkg.version}`), 'cosign verify worker');

    // Another chart under the same version: a copy with one value changed, pushed without signature or provenance.
    const copy = join(work, 'tampered', 'opsgate');
    cpSync(join(REPO, 'charts', 'opsgate'), copy, { recursive: true });
    const values = readFileSync(join(copy, 'values.yaml'), 'utf8');
    writeFileSync(join(copy, 'values.yaml'), values.replace(/^ {2}pullPolicy: IfNotPresent$/m, '  pullPolicy: Always'));
    chmodSync(copy, 0o755);
    ok(await helm(['package', copy, '--destination', join(work, 'tampered')]), 'helm package (tamper)');
    ok(
      await helm(['push', join(work, 'tampered', `opsgate-${chart.version}.tgz`), `oci://${REGISTRY}`, '--plain-http']),
      'helm push (tamper)',
    );
    const c = await verify(`${REGISTRY}/opsgate:${chart.version}`);
    expect(c.code).not.toBe(0);
    expect(c.stderr).toMatch(/no (matching )?signatures/i);
    // helm's own check refuses it too: no provenance for what the tag now names
    const pulled = await helm([
      'pull',
      `oci://${REGISTRY}/opsgate`,
      '--version',
      chart.version,
      '--plain-http',
      '--verify',
      '--keyring',
      join(work, 'pubring.gpg'),
      '--destination',
      join(work, 'tampered'),
    ]);
    expect(pulled.code).not.toBe(0);
    // the running release stays on the digests it was installed with
    const images = (await list('pods', NS)).flatMap((p) => (p.spec.containers as Obj[]).map((x) => x.image as string));
    expect(images).toContain(`${REGISTRY}/opsgate-api@${verified['opsgate-api']}`);
  });
});
