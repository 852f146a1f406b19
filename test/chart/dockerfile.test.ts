import { afterAll, beforeAll, describe, expect, jest, test } from '@jest/globals';
import { spawn } from 'node:child_process';
import { cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parse as parseYaml } from 'yaml';
import {
  copyParts,
  envPairs,
  isIgnored,
  parseDockerfile,
  parseDockerignore,
  posixJoin,
  stageByName,
  stageChain,
  type Dockerfile,
  type Stage,
} from './dockerfile.js';
import { ROOT } from './helm.js';

/**
 * The Dockerfile, checked without a container engine: parsed, then its build stage replayed for
 * real in a temp dir (only the files .dockerignore lets into the context, the same COPY and RUN
 * steps: npm ci, tsc -p tsconfig.build.json, npm prune --omit=dev). The final stages must run
 * files that replay produced, carry no devDependency, run as a numeric non-root user, and the
 * production node_modules must be enough to load the compiled entrypoints.
 */
jest.setTimeout(900_000);

const df: Dockerfile = parseDockerfile(readFileSync(join(ROOT, 'Dockerfile'), 'utf8'));
const ignore = parseDockerignore(readFileSync(join(ROOT, '.dockerignore'), 'utf8'));
const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8'));
const TARGETS = ['api', 'worker'] as const;

function buildStage(): Stage {
  const builds = df.stages.filter((s) => s.instructions.some((i) => i.keyword === 'RUN' && /\btsc\b/.test(i.args)));
  expect(builds).toHaveLength(1);
  return builds[0]!;
}

function finalChain(target: string): Stage[] {
  const st = stageByName(df, target);
  if (!st) throw new Error(`no stage named ${target}`);
  return stageChain(df, st);
}

/** Instructions of a target in build order (base stage first). */
function chainInstructions(target: string) {
  return finalChain(target)
    .slice()
    .reverse()
    .flatMap((s) => s.instructions);
}

function cmdOf(target: string): string[] {
  const ins = chainInstructions(target).filter((i) => i.keyword === 'CMD' || i.keyword === 'ENTRYPOINT');
  const entry = ins.filter((i) => i.keyword === 'ENTRYPOINT').pop();
  const cmd = ins.filter((i) => i.keyword === 'CMD').pop();
  expect(cmd?.exec ?? entry?.exec).toBeDefined(); // exec form: node is PID 1 and gets SIGTERM
  return [...(entry?.exec ?? []), ...(cmd?.exec ?? [])];
}

function workdirOf(instructions: { keyword: string; args: string }[]): string {
  let wd = '/';
  for (const i of instructions) if (i.keyword === 'WORKDIR') wd = posixJoin(wd, i.args);
  return wd;
}

describe('Dockerfile structure', () => {
  test('one build stage; final targets api and worker built from a Node 26 slim base', () => {
    const build = buildStage();
    expect(build.base).toMatch(/^node:26([.\d]*)?-(bookworm|trixie)-slim$|^node:26([.\d]*)?-slim$/);
    for (const t of TARGETS) {
      const chain = finalChain(t);
      expect(chain).not.toContain(build); // the targets are not the build stage itself
      expect(chain[chain.length - 1]!.base).toBe(build.base);
    }
    // The local Node the replay below uses is the same major as the image's.
    expect(process.version).toMatch(/^v26\./);
  });

  test('targets run `node <file>` in exec form, never npm/npx/ts-node', () => {
    expect(cmdOf('api')).toEqual(['node', 'dist/src/server.js']);
    expect(cmdOf('worker')).toEqual(['node', 'dist/worker/index.js']);
    for (const t of TARGETS) expect(cmdOf(t).join(' ')).not.toMatch(/\b(npm|npx|ts-node|tsx)\b/);
    // package.json's start scripts name the same files.
    expect(pkg.scripts['start:api']).toBe(`node ${cmdOf('api')[1]}`);
    expect(pkg.scripts['start:worker']).toBe(`node ${cmdOf('worker')[1]}`);
  });

  test('final stages: numeric non-root USER, NODE_ENV=production, no install step, copy only from the build stage', () => {
    const build = buildStage();
    for (const t of TARGETS) {
      const ins = chainInstructions(t);
      const user = ins.filter((i) => i.keyword === 'USER').pop();
      expect(user?.args).toMatch(/^[0-9]+(:[0-9]+)?$/);
      expect(Number(user!.args.split(':')[0])).toBeGreaterThan(0);
      expect(Number(user!.args.split(':')[1] ?? '1')).toBeGreaterThan(0);
      // USER comes after every COPY/RUN, so nothing runs or is written as root after it matters.
      expect(ins.findIndex((i) => i.keyword === 'USER')).toBeGreaterThan(Math.max(...ins.map((i, n) => (['COPY', 'RUN'].includes(i.keyword) ? n : -1))));
      expect(Object.assign({}, ...ins.filter((i) => i.keyword === 'ENV').map(envPairs)).NODE_ENV).toBe('production');
      expect(ins.filter((i) => i.keyword === 'RUN' || i.keyword === 'ADD')).toEqual([]);
      for (const c of ins.filter((i) => i.keyword === 'COPY')) {
        expect([c.line, c.flags.from]).toEqual([c.line, build.name]);
        const { sources } = copyParts(c);
        for (const s of sources) expect(['/app/package.json', '/app/node_modules', '/app/dist']).toContain(posixJoin(workdirOf(build.instructions), s));
      }
    }
  });

  test('the image user is the UID the chart runs the pods as', () => {
    const values = parseYaml(readFileSync(join(ROOT, 'charts/opsgate/values.yaml'), 'utf8'));
    for (const t of TARGETS) {
      const [uid, gid] = chainInstructions(t).filter((i) => i.keyword === 'USER').pop()!.args.split(':').map(Number);
      expect([uid, gid]).toEqual([values.podSecurityContext.runAsUser, values.podSecurityContext.runAsGroup]);
    }
  });

  test('EXPOSE matches the app and chart ports', () => {
    const values = parseYaml(readFileSync(join(ROOT, 'charts/opsgate/values.yaml'), 'utf8'));
    const exposed = (t: string) => chainInstructions(t).filter((i) => i.keyword === 'EXPOSE').flatMap((i) => i.args.split(/\s+/).map(Number));
    expect(exposed('api').sort()).toEqual([values.config.port, values.config.metricsPort].sort());
    expect(exposed('worker')).toEqual([values.config.metricsPort]);
  });

  test('build stage: npm ci before the compile, devDependencies pruned after the last compile', () => {
    const runs = buildStage().instructions.filter((i) => i.keyword === 'RUN').map((i) => i.args);
    const ci = runs.findIndex((r) => /\bnpm ci\b/.test(r));
    const tsc = runs.map((r, n) => (/\btsc -p tsconfig\.build\.json\b/.test(r) ? n : -1)).filter((n) => n >= 0);
    const prune = runs.findIndex((r) => /\bnpm prune\b.*--omit=dev/.test(r));
    expect(ci).toBeGreaterThanOrEqual(0);
    expect(tsc.length).toBeGreaterThan(0);
    expect(ci).toBeLessThan(tsc[0]!);
    expect(prune).toBeGreaterThan(Math.max(...tsc));
  });

  test('.dockerignore keeps secrets, build output, tools and dependencies out of the context', () => {
    for (const p of ['node_modules/express/index.js', 'dist/src/server.js', '.git/config', '.tools/bin/helm', '.env', '.dev/keys', 'test/unit/x.test.ts', 'charts/opsgate/values.yaml', 'coverage/x']) {
      expect([p, isIgnored(ignore, p)]).toEqual([p, true]);
    }
    for (const p of ['package.json', 'package-lock.json', 'tsconfig.json', 'tsconfig.build.json', 'src/server.ts', 'src/shared/config.ts', 'worker/index.ts']) {
      expect([p, isIgnored(ignore, p)]).toEqual([p, false]);
    }
  });
});

// ---- replay ---------------------------------------------------------------------------------

function sh(command: string, cwd: string, env: NodeJS.ProcessEnv, timeoutMs: number): Promise<{ code: number | null; out: string }> {
  return new Promise((resolve) => {
    const child = spawn('sh', ['-c', command], { cwd, env, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    child.stdout.on('data', (d) => (out += d));
    child.stderr.on('data', (d) => (out += d));
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, out });
    });
  });
}

/** Docker COPY of one context source: a directory's (non-ignored) contents go into dest, a file to dest or dest/<name>. */
function copyFromContext(src: string, destAbs: string, destIsDir: boolean) {
  const rel0 = src.replace(/^\.\//, '').replace(/\/$/, '');
  let copied = 0;
  // Directories are always walked (a `!` exception may re-include files below an excluded one); files are filtered.
  const walk = (rel: string, target: string) => {
    const abs = join(ROOT, rel);
    if (statSync(abs).isDirectory()) {
      for (const e of readdirSync(abs)) walk(`${rel}/${e}`, join(target, e));
      return;
    }
    if (isIgnored(ignore, rel)) return;
    mkdirSync(join(target, '..'), { recursive: true });
    cpSync(abs, target);
    copied++;
  };
  const isDir = statSync(join(ROOT, rel0)).isDirectory();
  walk(rel0, isDir || !destIsDir ? destAbs : join(destAbs, rel0.split('/').pop()!));
  if (copied === 0) throw new Error(`COPY ${src}: nothing of it is in the build context (.dockerignore), the build would fail`);
}

describe('build stage replay', () => {
  let root: string;
  let buildRoot: string;
  let log = '';
  let failure: string | undefined;

  beforeAll(async () => {
    root = mkdtempSync(join(tmpdir(), 'opsgate-dockerfile-'));
    buildRoot = join(root, 'build');
    const stage = buildStage();
    let wd = '/';
    const env: NodeJS.ProcessEnv = {
      PATH: process.env.PATH,
      HOME: process.env.HOME,
      // The machine's npm cache makes the replay fast; a cold cache just downloads.
      npm_config_prefer_offline: 'true',
      npm_config_loglevel: 'error',
    };
    for (const ins of stage.instructions) {
      if (ins.keyword === 'WORKDIR') wd = posixJoin(wd, ins.args);
      else if (ins.keyword === 'ENV') Object.assign(env, envPairs(ins));
      else if (ins.keyword === 'COPY') {
        expect(ins.flags.from).toBeUndefined();
        const { sources, dest } = copyParts(ins);
        const destAbs = join(buildRoot, posixJoin(wd, dest));
        for (const s of sources) copyFromContext(s, destAbs, dest.endsWith('/') || sources.length > 1);
      } else if (ins.keyword === 'RUN') {
        const cwd = join(buildRoot, wd);
        mkdirSync(cwd, { recursive: true });
        const r = await sh(ins.exec ? ins.exec.map((a) => `'${a.replace(/'/g, `'\\''`)}'`).join(' ') : ins.args, cwd, env, 600_000);
        log += `$ ${ins.args}\n${r.out}\n`;
        if (r.code !== 0) {
          const lines = r.out.split('\n').filter((l) => !/^npm error {3}/.test(l)); // drop npm's usage text
          failure = `Dockerfile line ${ins.line}: RUN ${ins.args} exited ${r.code}:\n${lines.slice(0, 40).join('\n')}`;
          return;
        }
      } else if (!['ARG', 'LABEL', 'SHELL'].includes(ins.keyword)) {
        throw new Error(`replay does not know ${ins.keyword} (line ${ins.line})`);
      }
    }
  }, 900_000);

  afterAll(() => {
    if (root) rmSync(root, { recursive: true, force: true });
  });

  const buildWorkdir = () => workdirOf(buildStage().instructions);

  /** Where a path of a final image comes from in the replayed build stage (through its COPY --from lines). */
  function resolveInBuild(target: string, imagePath: string): string | undefined {
    const ins = chainInstructions(target);
    let wd = '/';
    let hit: string | undefined;
    for (const i of ins) {
      if (i.keyword === 'WORKDIR') wd = posixJoin(wd, i.args);
      if (i.keyword !== 'COPY') continue;
      const { sources, dest } = copyParts(i);
      const d = posixJoin(wd, dest);
      for (const s of sources) {
        const src = posixJoin(buildWorkdir(), s);
        if (imagePath === d || imagePath.startsWith(`${d}/`)) hit = join(buildRoot, src + imagePath.slice(d.length));
      }
    }
    return hit;
  }

  test('the build stage runs to the end (npm ci, tsc -p tsconfig.build.json, npm prune --omit=dev)', () => {
    if (failure) throw new Error(failure);
    expect(log).toContain('tsc -p tsconfig.build.json');
  });

  test.each(TARGETS)('%s: the file its CMD runs is produced by the build and copied into the image', (t) => {
    if (failure) throw new Error(failure);
    const [, script] = cmdOf(t);
    const imagePath = posixJoin(workdirOf(chainInstructions(t)), script!);
    const inBuild = resolveInBuild(t, imagePath);
    expect(inBuild).toBeDefined();
    expect(existsSync(inBuild!)).toBe(true);
    // It is compiled output, not something that was copied in from the context.
    expect(existsSync(join(ROOT, script!.replace(/^dist\//, '').replace(/\.js$/, '.ts')))).toBe(true);
    expect(readFileSync(inBuild!, 'utf8')).not.toMatch(/^\s*import\s+type\b/m);
  });

  test('no devDependency (nor anything only they need) reaches the images; every dependency does', () => {
    if (failure) throw new Error(failure);
    const nm = resolveInBuild('api', posixJoin(workdirOf(chainInstructions('api')), 'node_modules'));
    expect(nm).toBeDefined();
    expect(resolveInBuild('worker', posixJoin(workdirOf(chainInstructions('worker')), 'node_modules'))).toBe(nm);
    const lock = JSON.parse(readFileSync(join(ROOT, 'package-lock.json'), 'utf8'));
    const devOnly = Object.entries<any>(lock.packages).filter(([p, meta]) => p.startsWith('node_modules/') && (meta.dev === true || meta.devOptional === true));
    // Every direct devDependency is dev-only in the lock unless a production dependency needs it too (e.g. @types/node).
    for (const dev of Object.keys(pkg.devDependencies)) {
      const meta = lock.packages[`node_modules/${dev}`];
      const neededInProduction = meta && !meta.dev && !meta.devOptional;
      expect([dev, existsSync(join(nm!, dev))]).toEqual([dev, Boolean(neededInProduction)]);
    }
    for (const dep of Object.keys(pkg.dependencies)) expect([dep, existsSync(join(nm!, dep, 'package.json'))]).toEqual([dep, true]);
    expect(devOnly.length).toBeGreaterThan(0);
    const present = devOnly.filter(([p]) => existsSync(join(nm!, '..', p))).map(([p]) => p);
    expect(present).toEqual([]);
  });

  test.each([
    ['api', /OPS_API_KEY_ROLES/],
    ['worker', /REDIS_URL/],
  ] as const)('%s: the production node_modules load the compiled entrypoint (it gets as far as refusing the missing config)', async (t, variable) => {
    if (failure) throw new Error(failure);
    const [node, script] = cmdOf(t);
    // Every COPY --from=build keeps its path (/app/x -> /app/x) and the workdirs agree, so the
    // replayed build dir looks like the image's /app for node.
    const wd = workdirOf(chainInstructions(t));
    expect(wd).toBe(buildWorkdir());
    for (const i of chainInstructions(t).filter((x) => x.keyword === 'COPY')) {
      const { sources, dest } = copyParts(i);
      expect(sources.map((x) => posixJoin(buildWorkdir(), x))).toEqual([posixJoin(wd, dest)]);
    }
    const cwd = join(buildRoot, wd);
    const r = await sh(`${node} ${script}`, cwd, { PATH: process.env.PATH, NODE_ENV: 'production' }, 60_000);
    expect(r.out).not.toMatch(/ERR_MODULE_NOT_FOUND|Cannot find (module|package)/);
    expect(r.code).not.toBe(0);
    expect(r.out).toMatch(variable);
  });
});
