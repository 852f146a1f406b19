import { afterAll, beforeAll, describe, expect, test } from '@jest/globals';
import { rmSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { allDocBlocks, blockScript, mirrorRepo, runCleanBash, where, type DocBlock, type ShellResult } from '../../helpers/docBlocks.js';
import { REPO, toolPath } from '../../helpers/cluster.js';
import { KUBECONFIG, NODE_DIR, helm, kubectl, ok, waitFor } from '../../helpers/nodeSupport.js';

/**
 * The documented install commands, run as written on the real node: every block that `make test`
 * runs offline as `helm template` (`doc-test: helm install-as-template`) and every block only a
 * cluster can run (`doc-test: node`), file by file in document order, with the real helm and
 * kubectl. A node block with a label (`doc-test: node <label>`) is a step of a longer story that
 * its own test runs within its release: the chart README's `tls-*` and `rotation-*` blocks
 * (test/e2e/node/tlsRotation.test.ts) and `registry-*` blocks (test/e2e/node/registry.test.ts). Each file starts from a cluster without the release and its namespace; the namespace
 * the example inventory names exists first, as the docs ask. Blocks run from a directory that
 * mirrors the repository's top level, so files a block writes stay out of the clone.
 */
const RELEASE = 'opsgate';
const NS = 'opsgate';
const INVENTORY_NS = 'shop';

const work = mirrorRepo(REPO, 'opsgate-doccommands-');

/** Labels of node blocks run by a test of their own, and that test. */
const LABELLED_NODE_BLOCKS = [
  { pattern: /^(tls|rotation)-[a-z-]+$/, test: 'test/e2e/node/tlsRotation.test.ts' },
  // against a signed release in the node's registry
  { pattern: /^registry-[a-z-]+$/, test: 'test/e2e/node/registry.test.ts' },
];

function clusterBlocks(): Map<string, DocBlock[]> {
  const byFile = new Map<string, DocBlock[]>();
  for (const b of allDocBlocks(REPO)) {
    if ((b.marker === 'node' && b.arg === undefined) || (b.marker === 'helm' && b.arg === 'install-as-template'))
      byFile.set(b.file, [...(byFile.get(b.file) ?? []), b]);
  }
  return byFile;
}

function runBlock(b: DocBlock): Promise<ShellResult> {
  const home = join(NODE_DIR, 'helm-home');
  const env = {
    PATH: `${dirname(toolPath('helm'))}:${dirname(toolPath('kubectl'))}:${process.env.PATH ?? ''}`,
    HOME: work,
    KUBECONFIG,
    HELM_CACHE_HOME: join(home, 'cache'),
    HELM_CONFIG_HOME: join(home, 'config'),
    HELM_DATA_HOME: join(home, 'data'),
  };
  return runCleanBash(blockScript(b), work, env, 300_000);
}

async function removeRelease(): Promise<void> {
  await helm(['uninstall', RELEASE, '-n', NS, '--wait', '--ignore-not-found']);
  await kubectl(['delete', 'namespace', NS, '--ignore-not-found', '--wait=true'], undefined, 300_000);
  await waitFor('namespace gone', async () => (await kubectl(['get', 'namespace', NS])).code !== 0, 240_000);
}

const files = clusterBlocks();

beforeAll(async () => {
  await removeRelease();
  const exists = (await kubectl(['get', 'namespace', INVENTORY_NS])).code === 0;
  if (!exists) ok(await kubectl(['create', 'namespace', INVENTORY_NS]), `create namespace ${INVENTORY_NS}`);
}, 600_000);

afterAll(async () => {
  await removeRelease();
  rmSync(work, { recursive: true, force: true });
}, 600_000);

describe('documented install commands on the node', () => {
  test('every labelled node block belongs to a test that runs it', () => {
    const labelled = allDocBlocks(REPO).filter((b) => b.marker === 'node' && b.arg !== undefined);
    expect(labelled.filter((b) => !LABELLED_NODE_BLOCKS.some((l) => l.pattern.test(b.arg!))).map(where)).toEqual([]);
  });

  test('the chart README and README.md have install commands to run here', () => {
    expect([...files.keys()]).toEqual(expect.arrayContaining(['README.md', 'charts/opsgate/README.md']));
  });

  test.each([...files.keys()])(
    '%s: every install command runs as written and leaves a deployed release',
    async (file) => {
      await removeRelease();
      for (const b of files.get(file)!) {
        const r = await runBlock(b);
        expect({ block: where(b), code: r.code, stderr: r.code === 0 ? '' : r.stderr }).toEqual({ block: where(b), code: 0, stderr: '' });
        if (/\bhelm (upgrade --install|install)\b/.test(b.code)) {
          const status = ok(await helm(['status', RELEASE, '-n', NS, '-o', 'json']), `helm status after ${where(b)}`);
          expect({ block: where(b), status: (JSON.parse(status.stdout) as { info: { status: string } }).info.status }).toEqual({
            block: where(b),
            status: 'deployed',
          });
          // The next block of the same file installs again: start it from no release.
          await removeRelease();
        }
      }
    },
    1_200_000,
  );
});
