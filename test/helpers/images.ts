import { existsSync, readFileSync } from 'node:fs';
import { arch as hostNodeArch } from 'node:process';
import { join } from 'node:path';
import { REPO, run, type RunResult } from './cluster.js';

/**
 * The images hack/images.sh builds, named as it names them: this machine's architecture has the plain
 * tag (localhost/opsgate-api:0.1.0), another architecture has it appended (localhost/opsgate-api:0.1.0-arm64).
 * The platforms under test are the ones `make release` built (artifacts/platforms), or PLATFORMS.
 */
export type Arch = 'amd64' | 'arm64';
export type Target = 'api' | 'worker';

export const HOST_ARCH: Arch = hostNodeArch === 'arm64' ? 'arm64' : 'amd64';
/** process.arch inside an image of each architecture */
export const NODE_ARCH: Record<Arch, string> = { amd64: 'x64', arm64: 'arm64' };
/** ELF e_machine of each architecture (EM_X86_64, EM_AARCH64) */
export const ELF_MACHINE: Record<Arch, number> = { amd64: 62, arm64: 183 };

const pkg = JSON.parse(readFileSync(join(REPO, 'package.json'), 'utf8')) as { version: string };
export const TAG = process.env.APP_TAG ?? pkg.version;
export const PODMAN_ENV = { CONTAINERS_CONF: join(REPO, 'hack', 'images', 'containers.conf') };

/** The architectures of PLATFORMS, else of the last `make release` (artifacts/platforms), else this machine's. */
export function releasePlatforms(): Arch[] {
  const file = join(REPO, 'artifacts', 'platforms');
  const list = process.env.PLATFORMS || (existsSync(file) ? readFileSync(file, 'utf8').trim() : `linux/${HOST_ARCH}`);
  const arches = list.split(',').map((p) => {
    const a = p.trim().replace(/^linux\//, '');
    if (a !== 'amd64' && a !== 'arm64') throw new Error(`unsupported platform ${p} (PLATFORMS=${list})`);
    return a;
  });
  return [...new Set(arches)];
}

export function imageRef(target: Target, arch: Arch): string {
  return `localhost/opsgate-${target}:${TAG}${arch === HOST_ARCH ? '' : `-${arch}`}`;
}

export function podman(args: string[], timeoutMs = 120_000): Promise<RunResult> {
  return run('podman', args, { env: PODMAN_ENV, timeoutMs });
}
