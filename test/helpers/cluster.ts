import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { generateKeyPairSync, randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, openSync, closeSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { request } from 'node:https';
import { request as httpRequest } from 'node:http';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';

/**
 * A real Kubernetes control plane for tests: etcd + kube-apiserver (RBAC, TokenRequest,
 * default admission) + kube-controller-manager (Deployments get ReplicaSets and status,
 * Jobs, ServiceAccounts, namespace cleanup, garbage collection). No kubelet: pods never run.
 *
 * Binaries come from `make tools-k8s tools-etcd tools-helm` (mk/tools.mk -> .tools/bin).
 * Everything listens on 127.0.0.1 on free ports and lives in one temp dir removed by stop().
 */
export interface Cluster {
  /** kubeconfig with the admin (system:masters) token */
  kubeconfigPath: string;
  /** https://127.0.0.1:<port> */
  server: string;
  adminToken: string;
  /** PEM of the CA that signed the apiserver's serving certificate */
  caPem: string;
  caFile: string;
  /** the temp dir holding data, keys, logs */
  dir: string;
  stop(): Promise<void>;
}

/** What a test file needs to reach a cluster started elsewhere (globalSetup). */
export type ClusterInfo = Omit<Cluster, 'stop'>;

/**
 * This file is also loaded by jest's globalSetup, which jest compiles to CommonJS: so it imports
 * only node: modules (no relative imports, no import.meta) and finds the repo from the cwd.
 */
function findRepoRoot(): string {
  let dir = resolve(process.cwd());
  for (;;) {
    if (existsSync(join(dir, 'charts', 'opsgate')) || existsSync(join(dir, 'mk', 'tools.mk'))) return dir;
    const up = dirname(dir);
    if (up === dir) return resolve(process.cwd());
    dir = up;
  }
}

const REPO_ROOT = findRepoRoot();
export const TOOLS_BIN = process.env.OPSGATE_TOOLS_BIN ?? join(REPO_ROOT, '.tools', 'bin');
export const SHARED_CLUSTER_ENV = 'OPSGATE_K8S_CLUSTER';

export function toolPath(name: 'etcd' | 'kube-apiserver' | 'kube-controller-manager' | 'kubectl' | 'helm' | 'cosign'): string {
  const p = join(TOOLS_BIN, name);
  if (!existsSync(p)) {
    throw new Error(`${p} is missing: run \`make tools\` (mk/tools.mk builds it from Go modules)`);
  }
  return p;
}

/** A free TCP port on 127.0.0.1 (same as test/helpers/redis.ts freePort, kept local: see above). */
export async function freePort(): Promise<number> {
  return new Promise((res, rej) => {
    const srv = createServer();
    srv.unref();
    srv.on('error', rej);
    srv.listen(0, '127.0.0.1', () => {
      const addr = srv.address();
      srv.close(() => (typeof addr === 'object' && addr ? res(addr.port) : rej(new Error('no port'))));
    });
  });
}

const SA_ISSUER = 'https://kubernetes.default.svc.cluster.local';

function openssl(args: string[], cwd: string): void {
  const r = spawnSync('openssl', args, { cwd, encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`openssl ${args.join(' ')} failed: ${r.stderr || r.error}`);
}

/** A CA and a serving certificate for 127.0.0.1/localhost, made with openssl. */
function makeCerts(dir: string): { caFile: string; certFile: string; keyFile: string } {
  mkdirSync(dir, { recursive: true });
  openssl(
    [
      'req',
      '-x509',
      '-newkey',
      'rsa:2048',
      '-nodes',
      '-keyout',
      'ca.key',
      '-out',
      'ca.crt',
      '-days',
      '2',
      '-subj',
      '/CN=opsgate-test-ca',
      '-addext',
      'basicConstraints=critical,CA:TRUE',
      '-addext',
      'keyUsage=critical,keyCertSign,cRLSign',
    ],
    dir,
  );
  openssl(
    ['req', '-newkey', 'rsa:2048', '-nodes', '-keyout', 'apiserver.key', '-out', 'apiserver.csr', '-subj', '/CN=kube-apiserver'],
    dir,
  );
  writeFileSync(
    join(dir, 'apiserver.ext'),
    'subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc\n' +
      'extendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature,keyEncipherment\n',
  );
  openssl(
    [
      'x509',
      '-req',
      '-in',
      'apiserver.csr',
      '-CA',
      'ca.crt',
      '-CAkey',
      'ca.key',
      '-CAcreateserial',
      '-out',
      'apiserver.crt',
      '-days',
      '2',
      '-extfile',
      'apiserver.ext',
    ],
    dir,
  );
  return { caFile: join(dir, 'ca.crt'), certFile: join(dir, 'apiserver.crt'), keyFile: join(dir, 'apiserver.key') };
}

export function kubeconfigYaml(opts: { server: string; caPem: string; token: string; user?: string; namespace?: string }): string {
  const user = opts.user ?? 'user';
  const ca = Buffer.from(opts.caPem).toString('base64');
  return [
    'apiVersion: v1',
    'kind: Config',
    'clusters:',
    '- name: test',
    '  cluster:',
    `    server: ${opts.server}`,
    `    certificate-authority-data: ${ca}`,
    'users:',
    `- name: ${JSON.stringify(user)}`,
    '  user:',
    `    token: ${JSON.stringify(opts.token)}`,
    'contexts:',
    '- name: test',
    '  context:',
    '    cluster: test',
    `    user: ${JSON.stringify(user)}`,
    ...(opts.namespace ? [`    namespace: ${opts.namespace}`] : []),
    'current-context: test',
    '',
  ].join('\n');
}

interface Proc {
  name: string;
  child: ChildProcess;
  logFile: string;
}

function startProc(name: string, bin: string, args: string[], dir: string): Proc {
  const logFile = join(dir, `${name}.log`);
  const fd = openSync(logFile, 'a');
  const child = spawn(bin, args, { stdio: ['ignore', fd, fd] });
  closeSync(fd);
  child.on('error', () => {});
  return { name, child, logFile };
}

function tail(file: string, lines = 40): string {
  try {
    return readFileSync(file, 'utf8').split('\n').slice(-lines).join('\n');
  } catch {
    return '(no log)';
  }
}

async function sleep(ms: number) {
  await new Promise((r) => setTimeout(r, ms));
}

function httpGet(url: string, opts: { ca?: string; token?: string } = {}): Promise<{ status: number; body: string }> {
  return new Promise((resolvePromise, reject) => {
    const u = new URL(url);
    const fn = u.protocol === 'https:' ? request : httpRequest;
    const req = fn(
      url,
      {
        method: 'GET',
        ca: opts.ca,
        headers: opts.token ? { authorization: `Bearer ${opts.token}` } : {},
        timeout: 5000,
      },
      (res) => {
        let body = '';
        res.setEncoding('utf8');
        res.on('data', (d) => (body += d));
        res.on('end', () => resolvePromise({ status: res.statusCode ?? 0, body }));
      },
    );
    req.on('timeout', () => req.destroy(new Error('timeout')));
    req.on('error', reject);
    req.end();
  });
}

async function waitFor(what: string, proc: Proc | undefined, check: () => Promise<boolean>, timeoutMs: number) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (proc && proc.child.exitCode !== null) {
      throw new Error(`${proc.name} exited (${proc.child.exitCode}) while waiting for ${what}:\n${tail(proc.logFile)}`);
    }
    try {
      if (await check()) return;
    } catch {
      /* not yet */
    }
    if (Date.now() > deadline) {
      throw new Error(`timed out waiting for ${what}${proc ? `:\n${tail(proc.logFile)}` : ''}`);
    }
    await sleep(250);
  }
}

async function stopProc(p: Proc, graceMs = 10000): Promise<void> {
  const c = p.child;
  if (c.exitCode !== null || c.signalCode !== null) return;
  await new Promise<void>((res) => {
    const t = setTimeout(() => c.kill('SIGKILL'), graceMs);
    c.once('exit', () => {
      clearTimeout(t);
      res();
    });
    c.kill('SIGTERM');
  });
}

/**
 * Kills the control plane if the process that started it dies without calling stop()
 * (a crashed or SIGKILLed jest): a tiny shell that polls our pid.
 */
function startReaper(ownerPid: number, pids: number[], dir: string): ChildProcess {
  const script =
    `while kill -0 ${ownerPid} 2>/dev/null; do sleep 2; done; ` +
    `kill -TERM ${pids.join(' ')} 2>/dev/null; sleep 5; kill -KILL ${pids.join(' ')} 2>/dev/null; ` +
    `rm -rf '${dir.replace(/'/g, '')}'`;
  const r = spawn('bash', ['-c', script], { stdio: 'ignore', detached: true });
  r.unref();
  return r;
}

export async function startCluster(opts: { log?: (msg: string) => void } = {}): Promise<Cluster> {
  const log = opts.log ?? (() => {});
  const etcdBin = toolPath('etcd');
  const apiserverBin = toolPath('kube-apiserver');
  const kcmBin = toolPath('kube-controller-manager');
  const t0 = Date.now();

  const dir = mkdtempSync(join(tmpdir(), 'opsgate-k8s-'));
  const procs: Proc[] = [];
  let reaper: ChildProcess | undefined;
  const stop = async () => {
    reaper?.kill('SIGKILL');
    for (const p of [...procs].reverse()) await stopProc(p);
    if (!process.env.OPSGATE_K8S_KEEP) rmSync(dir, { recursive: true, force: true });
  };

  try {
    // --- credentials --------------------------------------------------------------------
    const pki = join(dir, 'pki');
    const { caFile, certFile, keyFile } = makeCerts(pki);
    const caPem = readFileSync(caFile, 'utf8');
    const { privateKey, publicKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
    const saKey = join(pki, 'sa.key');
    const saPub = join(pki, 'sa.pub');
    writeFileSync(saKey, privateKey.export({ type: 'pkcs8', format: 'pem' }), { mode: 0o600 });
    writeFileSync(saPub, publicKey.export({ type: 'spki', format: 'pem' }));
    const adminToken = randomBytes(24).toString('hex');
    const kcmToken = randomBytes(24).toString('hex');
    const tokenFile = join(pki, 'tokens.csv');
    writeFileSync(tokenFile, `${adminToken},admin,admin-uid,"system:masters"\n` + `${kcmToken},system:kube-controller-manager,kcm-uid\n`, {
      mode: 0o600,
    });

    // --- etcd -----------------------------------------------------------------------------
    const etcdClient = await freePort();
    const etcdPeer = await freePort();
    const etcdUrl = `http://127.0.0.1:${etcdClient}`;
    const etcd = startProc(
      'etcd',
      etcdBin,
      [
        '--name',
        'opsgate-test',
        '--data-dir',
        join(dir, 'etcd'),
        '--listen-client-urls',
        etcdUrl,
        '--advertise-client-urls',
        etcdUrl,
        '--listen-peer-urls',
        `http://127.0.0.1:${etcdPeer}`,
        '--initial-advertise-peer-urls',
        `http://127.0.0.1:${etcdPeer}`,
        '--initial-cluster',
        `opsgate-test=http://127.0.0.1:${etcdPeer}`,
        '--unsafe-no-fsync',
        '--log-level',
        'warn',
      ],
      dir,
    );
    procs.push(etcd);
    await waitFor('etcd /health', etcd, async () => (await httpGet(`${etcdUrl}/health`)).status === 200, 60000);
    log(`etcd up after ${Date.now() - t0}ms`);

    // --- kube-apiserver -------------------------------------------------------------------
    const port = await freePort();
    const server = `https://127.0.0.1:${port}`;
    const apiserver = startProc(
      'kube-apiserver',
      apiserverBin,
      [
        `--etcd-servers=${etcdUrl}`,
        `--etcd-prefix=/registry`,
        '--bind-address=127.0.0.1',
        '--advertise-address=127.0.0.1',
        `--secure-port=${port}`,
        `--cert-dir=${join(dir, 'apiserver-certs')}`,
        `--tls-cert-file=${certFile}`,
        `--tls-private-key-file=${keyFile}`,
        `--client-ca-file=${caFile}`,
        `--token-auth-file=${tokenFile}`,
        '--authorization-mode=RBAC',
        '--anonymous-auth=false',
        `--service-account-issuer=${SA_ISSUER}`,
        `--service-account-key-file=${saPub}`,
        `--service-account-signing-key-file=${saKey}`,
        // ClusterIPs are only bookkeeping here (no kube-proxy); nothing is ever sent to them
        '--service-cluster-ip-range=10.96.0.0/24',
        // the "kubernetes" Service cannot point at a loopback address: skip its endpoint upkeep
        '--endpoint-reconciler-type=none',
        '--allow-privileged=true',
        '--profiling=false',
        '--v=1',
      ],
      dir,
    );
    procs.push(apiserver);
    await waitFor(
      'kube-apiserver /readyz',
      apiserver,
      async () => (await httpGet(`${server}/readyz`, { ca: caPem, token: adminToken })).status === 200,
      120000,
    );
    log(`kube-apiserver ready after ${Date.now() - t0}ms`);

    const kubeconfigPath = join(dir, 'admin.kubeconfig');
    writeFileSync(kubeconfigPath, kubeconfigYaml({ server, caPem, token: adminToken, user: 'admin' }), { mode: 0o600 });
    const kcmKubeconfig = join(dir, 'kcm.kubeconfig');
    writeFileSync(kcmKubeconfig, kubeconfigYaml({ server, caPem, token: kcmToken, user: 'system:kube-controller-manager' }), {
      mode: 0o600,
    });

    // --- kube-controller-manager ----------------------------------------------------------
    const kcm = startProc(
      'kube-controller-manager',
      kcmBin,
      [
        `--kubeconfig=${kcmKubeconfig}`,
        `--authentication-kubeconfig=${kcmKubeconfig}`,
        `--authorization-kubeconfig=${kcmKubeconfig}`,
        '--leader-elect=false',
        '--bind-address=127.0.0.1',
        `--secure-port=${await freePort()}`,
        `--cert-dir=${join(dir, 'kcm-certs')}`,
        // controllers act under their own ServiceAccounts (like a real cluster's bootstrap RBAC)
        '--use-service-account-credentials=true',
        `--service-account-private-key-file=${saKey}`,
        `--root-ca-file=${caFile}`,
        '--cluster-name=opsgate-test',
        '--concurrent-deployment-syncs=5',
        // the controllers' own client limit (20 requests/s by default) would pace a test's hundreds
        // of Jobs, not the code under test
        '--kube-api-qps=200',
        '--kube-api-burst=400',
        '--profiling=false',
        '--v=1',
      ],
      dir,
    );
    procs.push(kcm);
    reaper = startReaper(process.pid, procs.map((p) => p.child.pid!).filter(Boolean), dir);

    // The serviceaccount controller creating "default" in "default" proves KCM is working.
    await waitFor(
      'kube-controller-manager (default ServiceAccount)',
      kcm,
      async () =>
        (await httpGet(`${server}/api/v1/namespaces/default/serviceaccounts/default`, { ca: caPem, token: adminToken })).status === 200,
      120000,
    );
    log(`kube-controller-manager working after ${Date.now() - t0}ms`);

    return { kubeconfigPath, server, adminToken, caPem, caFile, dir, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}

// --- shared cluster for test/e2e/controlplane (see test/helpers/controlPlaneSetup.ts) ------------------------------

/**
 * The cluster for a test file: the one started by test/e2e/controlplane's globalSetup (env
 * OPSGATE_K8S_CLUSTER) when run through `make test-k8s`, else a cluster of its own
 * (so a plain `jest test/e2e/controlplane/x.test.ts` works too). Call release() in afterAll.
 */
export async function useCluster(): Promise<ClusterInfo & { release(): Promise<void> }> {
  const shared = process.env[SHARED_CLUSTER_ENV];
  if (shared) {
    const info = JSON.parse(readFileSync(shared, 'utf8')) as ClusterInfo;
    return { ...info, release: async () => {} };
  }
  const c = await startCluster();
  return { ...c, release: () => c.stop() };
}

// --- CLI helpers ----------------------------------------------------------------------------

export interface RunResult {
  code: number;
  stdout: string;
  stderr: string;
}

/**
 * Run a tool from .tools/bin (async, so jest's timers keep running). The result is the child's exit
 * code and output: a child may exit, or close its stdin, before it reads `input`, and the EPIPE that
 * our write then meets says nothing about the tool, so errors on the child's streams are kept out
 * of the result (a spawn failure, such as a missing binary, still rejects). Without input the child's
 * stdin is closed at once.
 */
export function run(
  bin: string,
  args: string[],
  opts: { env?: Record<string, string>; input?: string | Buffer; cwd?: string; timeoutMs?: number } = {},
): Promise<RunResult> {
  return new Promise((res, rej) => {
    const child = spawn(bin, args, {
      cwd: opts.cwd ?? REPO_ROOT,
      env: { ...process.env, ...opts.env },
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    const timer = setTimeout(() => child.kill('SIGKILL'), opts.timeoutMs ?? 120000);
    const ignore = (): void => undefined;
    child.stdout.on('data', (d) => (stdout += d)).on('error', ignore);
    child.stderr.on('data', (d) => (stderr += d)).on('error', ignore);
    child.on('error', (e) => {
      clearTimeout(timer);
      rej(e);
    });
    child.on('close', (code) => {
      clearTimeout(timer);
      res({ code: code ?? -1, stdout, stderr });
    });
    child.stdin.on('error', ignore).end(opts.input ?? '');
  });
}

export function kubectl(kubeconfig: string, args: string[], input?: string): Promise<RunResult> {
  return run(toolPath('kubectl'), ['--kubeconfig', kubeconfig, ...args], { input });
}

/** helm with its caches/config in a throwaway dir (never the user's ~/.config/helm). */
export function helm(kubeconfig: string, args: string[], input?: string): Promise<RunResult> {
  const home = join(tmpdir(), 'opsgate-helm-home');
  return run(toolPath('helm'), args, {
    input,
    env: {
      KUBECONFIG: kubeconfig,
      HELM_CACHE_HOME: join(home, 'cache'),
      HELM_CONFIG_HOME: join(home, 'config'),
      HELM_DATA_HOME: join(home, 'data'),
    },
  });
}

/** Throw with the tool's output when it failed: a failing command must fail the test readably. */
export function ok(r: RunResult, what: string): RunResult {
  if (r.code !== 0) throw new Error(`${what} exited ${r.code}\nstdout:\n${r.stdout}\nstderr:\n${r.stderr}`);
  return r;
}

export const REPO = REPO_ROOT;
