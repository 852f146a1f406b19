/**
 * The API's logs are written asynchronously (pino) and flushed on shutdown, on the real API
 * process with its stdout read through a pipe like a container runtime reads it:
 * - while the log reader is stalled (the pipe full), requests are still answered;
 * - SIGTERM while lines are still buffered in the process: the reader resumes only after the
 *   signal, and every line reaches it before the process exits, in order and whole: exactly one
 *   audit line per request (who, method, path, body SHA-256, status, request id), then
 *   "api stopped" last. (The hand-written logger before pino lost the buffered lines here:
 *   process.exit() dropped process.stdout's pending writes.)
 */
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { DIST_DIR, startApi, type OpsProcess } from '../../helpers/processes.js';
import { startRedis, type RedisServer } from '../../helpers/redis.js';
import { apiEnv, makeSecrets, pool, scmPush } from '../../helpers/reliability.js';

const secrets = makeSecrets('asynclog');
let redis: RedisServer;
let api: (OpsProcess & { baseUrl: string }) | undefined;

beforeAll(async () => {
  redis = await startRedis();
}, 60_000);

afterAll(async () => {
  await api?.stop();
  await redis?.destroy();
});

const REQUESTS = 600; // ~600 audit lines of ~500 bytes: several times what the pipe and the reader's buffer hold

describe('asynchronous logging', () => {
  it('answers requests while the log reader is stalled and flushes every line on SIGTERM', async () => {
    api = await startApi({ env: await apiEnv(redis.url, secrets) });
    const a = api;
    // Stop reading the API's stdout: the pipe (64 KiB) and the stream's buffer fill up.
    a.proc.stdout!.pause();
    const linesBefore = a.lines.length;

    const sent: Array<{ id: string; sha: string; body: string }> = [];
    const results = await pool(
      Array.from({ length: REQUESTS }, (_, i) => async () => {
        const body = JSON.stringify(scmPush('team/app', `async-log-${i}-${'x'.repeat(40)}`));
        const ac = new AbortController();
        const t = setTimeout(() => ac.abort(), 20_000); // a request stuck behind the stalled log pipe fails here
        try {
          const r = await fetch(`${a.baseUrl}/webhook/scm`, {
            method: 'POST',
            headers: { 'content-type': 'application/json', 'X-Scm-Token': secrets.scm, 'X-Scm-Event': 'Push Hook' },
            body,
            signal: ac.signal,
          });
          await r.text();
          sent.push({ id: r.headers.get('x-request-id')!, sha: createHash('sha256').update(body).digest('hex'), body });
          return r.status;
        } finally {
          clearTimeout(t);
        }
      }),
      16,
    );
    // Every request answered (202 accepted, a deploy job each) while nobody read the logs.
    expect(results).toEqual(Array(REQUESTS).fill(202));
    // The reader saw (almost) nothing of those requests yet: the lines wait in the pipe and in the process.
    expect(a.lines.length - linesBefore).toBeLessThan(REQUESTS);

    a.kill('SIGTERM');
    await new Promise((r) => setTimeout(r, 500)); // the process is exiting while its log lines are still unread
    a.proc.stdout!.resume();
    const exit = await a.waitExit(30_000);
    expect(exit.code).toBe(0);

    // Every stdout line whole and JSON; one audit line per request, with the audit fields.
    const logs = a.lines.map((l) => JSON.parse(l) as Record<string, unknown>);
    const audits = logs.filter((l) => l.msg === 'audit');
    const byId = new Map<string, Array<Record<string, unknown>>>();
    for (const l of audits) byId.set(String(l.request_id), [...(byId.get(String(l.request_id)) ?? []), l]);
    for (const s of sent) {
      const lines = byId.get(s.id) ?? [];
      expect(lines).toHaveLength(1);
      expect(lines[0]).toMatchObject({
        level: 'info',
        who: expect.any(String),
        method: 'POST',
        path: '/webhook/scm',
        body_sha256: s.sha,
        status: 202,
        request_id: s.id,
      });
      expect(typeof lines[0]!.time).toBe('string');
    }
    // In order, and the shutdown's last line last.
    expect(logs.at(-1)).toMatchObject({ msg: 'api stopped', component: 'api' });
    const times = logs.map((l) => Date.parse(String(l.time)));
    for (let i = 1; i < times.length; i++) expect(times[i]!).toBeGreaterThanOrEqual(times[i - 1]!);
  }, 120_000);

  it('bounds what waits for a stalled reader: lines past the limit are dropped, counted and reported once it reads again', async () => {
    // The built logger in a process of its own.
    const logger = pathToFileURL(join(DIST_DIR, 'src/shared/logger.js')).href;
    const script = `
      import { createLogger } from ${JSON.stringify(logger)};
      const log = createLogger({ base: { component: 't' }, maxBufferBytes: 64 * 1024 });
      for (let n = 0; n < 3000; n++) log.info('line', { n, pad: 'p'.repeat(150) });
      await log.flush(20000);
      process.exit(0);`;
    // The reader: a shell pipe that reads nothing for 2 s, then everything.
    const child = spawn(
      'bash',
      ['--norc', '--noprofile', '-c', 'set -o pipefail; "$0" --input-type=module -e "$1" | { sleep 2; cat; }', process.execPath, script],
      { stdio: ['ignore', 'pipe', 'pipe'] },
    );
    let out = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    const code = await new Promise<number | null>((r) => child.on('close', (c) => r(c)));
    expect({ code, stderr }).toEqual({ code: 0, stderr: '' });

    const lines = out
      .trimEnd()
      .split('\n')
      .map((l) => JSON.parse(l) as Record<string, unknown>);
    const kept = lines.filter((l) => l.msg === 'line').map((l) => l.n as number);
    const warnings = lines.filter((l) => l.msg === 'log lines dropped: stdout was not read fast enough');
    expect(warnings).toHaveLength(1);
    expect(warnings[0]).toMatchObject({ level: 'warn', component: 't', buffer_limit_bytes: 65536 });
    // Some lines were dropped (3000 x ~230 bytes is far more than pipe + 64 KiB), and the count is exact.
    expect(kept.length).toBeLessThan(3000);
    expect(kept.length).toBeGreaterThan(100);
    expect(warnings[0]!.dropped_lines).toBe(3000 - kept.length);
    // The kept lines are in order and whole; the warning comes after them.
    expect([...kept].sort((a, b) => a - b)).toEqual(kept);
    expect(lines.at(-1)).toBe(warnings[0]);
  }, 60_000);
});
