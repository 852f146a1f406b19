import { afterAll, describe, expect, jest, test } from '@jest/globals';
import { rmSync } from 'node:fs';
import { dirname } from 'node:path';
import {
  allDocBlocks,
  blockScript,
  docBlocksOf,
  mirrorRepo,
  runCleanBash,
  where,
  type DocBlock,
  type ShellResult,
} from '../../helpers/docBlocks.js';
import { KUBE_VERSION, ROOT, helmBin } from '../../helpers/helm.js';

/**
 * Every documented shell block marked `<!-- doc-test: helm -->` runs as printed with the real helm,
 * offline, in a clean bash: from a directory that mirrors the repository's top level (so
 * `charts/opsgate` and `k8s/examples/...` resolve, and files the block writes stay out of the
 * repository). `install-as-template` and `template-only` run `helm install` / `helm upgrade --install` as
 * `helm template` with the same arguments; without it a block that installs fails, since there is
 * no cluster here. helm is given `--kube-version` of the cluster tests, because a helm built from
 * source without the release ldflags assumes a version below the chart's kubeVersion.
 */
jest.setTimeout(120_000);

const WRAPPER = String.raw`
helm() {
  case "$1" in
    install)
      [ "$INSTALL_AS_TEMPLATE" = 1 ] || { echo "doc-test: helm install needs a cluster; mark the block install-as-template" >&2; return 2; }
      shift; command helm template "$@" --kube-version "$KUBE_VERSION" ;;
    upgrade)
      local a args=() install=0
      shift
      for a in "$@"; do if [ "$a" = --install ]; then install=1; else args+=("$a"); fi; done
      [ "$INSTALL_AS_TEMPLATE" = 1 ] && [ "$install" = 1 ] || { echo "doc-test: helm upgrade needs a cluster" >&2; return 2; }
      command helm template "${'$'}{args[@]}" --kube-version "$KUBE_VERSION" ;;
    template|lint) command helm "$@" --kube-version "$KUBE_VERSION" ;;
    *) command helm "$@" ;;
  esac
}
`;

const work = mirrorRepo(ROOT, 'opsgate-docblocks-');
afterAll(() => rmSync(work, { recursive: true, force: true }));

function runBlock(b: DocBlock): Promise<ShellResult> {
  return runCleanBash(
    `${WRAPPER}\n${blockScript(b)}`,
    work,
    {
      PATH: `${dirname(helmBin())}:${process.env.PATH ?? ''}`,
      HOME: work,
      KUBE_VERSION,
      INSTALL_AS_TEMPLATE: b.arg === 'install-as-template' || b.arg === 'template-only' ? '1' : '0',
    },
    60_000,
  );
}

const blocks = allDocBlocks(ROOT).filter((b) => b.marker === 'helm');

describe('documented helm commands', () => {
  test('there are some (the install commands of README.md and the chart README)', () => {
    expect(blocks.map((b) => b.file)).toEqual(expect.arrayContaining(['README.md', 'charts/opsgate/README.md']));
  });

  test.each(blocks.map((b) => [where(b), b] as const))('%s runs as printed', async (_where, b) => {
    const r = await runBlock(b);
    expect({ block: where(b), code: r.code, stderr: r.stderr }).toEqual({ block: where(b), code: 0, stderr: '' });
    if (/helm (install|upgrade|template)/.test(b.code)) expect(r.stdout).toMatch(/kind: Deployment/);
  });

  test('a failing command fails its block, and an install not marked install-as-template is refused', async () => {
    const [bad] = docBlocksOf(
      'x.md',
      "<!-- doc-test: helm install-as-template -->\n```sh\nhelm install opsgate charts/opsgate --set 'secrets.apiKeys[0].key=k' --set 'secrets.apiKeys[0].role=admin'\n```\n",
    );
    expect((await runBlock(bad!)).code).not.toBe(0);
    const [plain] = docBlocksOf('x.md', '<!-- doc-test: helm -->\n```sh\nhelm install opsgate charts/opsgate\n```\n');
    const r = await runBlock(plain!);
    expect(r.code).not.toBe(0);
    expect(r.stderr).toMatch(/needs a cluster/);
  });
});
