/**
 * Every Lua script of opsgate (every `.lua` file under src/) alone, on a real redis-server: each is a
 * whole script whose KEYS and ARGV are documented at its top, run here with EVAL exactly as
 * documented. A new script without a test here fails the first case.
 */
import { readdirSync } from 'node:fs';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from '@jest/globals';
import { Redis } from 'ioredis';
import { loadLua as loadFile } from '../../../src/shared/lua.js';
import { startRedis, type RedisServer } from '../../helpers/redis.js';

let server: RedisServer;
let redis: Redis;
const TESTED = [
  'rate-limit',
  'replica-release',
  'signature-release',
  'approval-create',
  'approval-decide',
  'budget-take',
  'remediation-guard',
  'deliveries-add',
  'deploy-turn',
  'deploy-history',
];
const SRC = new URL('../../../src/', import.meta.url);
/** Every script under src/, by its file name. */
const SCRIPTS = new Map(
  readdirSync(SRC, { recursive: true, encoding: 'utf8' })
    .filter((f) => f.endsWith('.lua'))
    .map((f) => [f.split('/').pop()!.slice(0, -4), new URL(f, SRC)] as const),
);
const loadLua = (name: string): string => loadFile(SCRIPTS.get(name) ?? new URL(`missing/${name}.lua`, SRC));

beforeAll(async () => {
  server = await startRedis();
  redis = new Redis(server.url);
});
beforeEach(async () => {
  await redis.flushall();
});
afterAll(async () => {
  redis?.disconnect();
  await server?.destroy();
});

it('every script under src/ has its tests here, and documents its KEYS and ARGV', () => {
  expect([...SCRIPTS.keys()].sort()).toEqual([...TESTED].sort());
  for (const name of TESTED) {
    const head = loadLua(name)
      .split('\n')
      .filter((l) => l.startsWith('--'))
      .join('\n');
    expect(head).toMatch(/KEYS\[1\]/);
  }
});

describe('rate-limit.lua: KEYS[1] counter, ARGV[1] window ms -> {count, remaining ms}', () => {
  const hit = async (key: string, windowMs: number) => (await redis.eval(loadLua('rate-limit'), 1, key, windowMs)) as [number, number];

  it('counts hits in one window; the window starts with its first hit', async () => {
    const [n1, ttl1] = await hit('rl:a', 60_000);
    expect(n1).toBe(1);
    expect(ttl1).toBe(60_000);
    const [n2, ttl2] = await hit('rl:a', 60_000);
    expect(n2).toBe(2);
    expect(ttl2).toBeGreaterThan(0);
    expect(ttl2).toBeLessThanOrEqual(60_000);
    expect(await redis.pttl('rl:a')).toBeGreaterThan(0);
    expect((await hit('rl:b', 60_000))[0]).toBe(1); // another client, another counter
  });

  it('a counter that lost its expiry gets one again (it never counts forever)', async () => {
    await redis.set('rl:c', '5');
    const [n, ttl] = await hit('rl:c', 1_000);
    expect(n).toBe(6);
    expect(ttl).toBe(1_000);
    expect(await redis.pttl('rl:c')).toBeGreaterThan(0);
  });

  it('a new window after the old one expired', async () => {
    await hit('rl:d', 50);
    await hit('rl:d', 50);
    const deadline = Date.now() + 5_000;
    while ((await redis.exists('rl:d')) === 1 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 10));
    expect((await hit('rl:d', 50))[0]).toBe(1);
  });
});

describe('replica-release.lua: KEYS[1] record, ARGV[1] job id -> deleted only while it names that job', () => {
  const release = (key: string, jobId: string) => redis.eval(loadLua('replica-release'), 1, key, jobId);

  it('an alias "q:<id>" is deleted for its job, kept for another', async () => {
    await redis.set('alias', 'q:job-1');
    expect(await release('alias', 'job-2')).toBe(0);
    expect(await redis.get('alias')).toBe('q:job-1');
    expect(await release('alias', 'job-1')).toBe(1);
    expect(await redis.exists('alias')).toBe(0);
  });

  it("a restart's Idempotency-Key answer (JSON with job_id) is deleted for its job only", async () => {
    await redis.set('idem', JSON.stringify({ host: 'h', service: 's', job_id: 'restart-1', coalesced: false }));
    expect(await release('idem', 'restart-2')).toBe(0);
    expect(await release('idem', 'restart-1')).toBe(1);
  });

  it('anything else, or nothing, is left alone', async () => {
    await redis.set('other', 'job-1');
    await redis.set('broken', '{not json');
    expect(await release('other', 'job-1')).toBe(0);
    expect(await release('broken', 'job-1')).toBe(0);
    expect(await release('missing', 'job-1')).toBe(0);
    expect(await redis.get('other')).toBe('job-1');
  });
});

describe("signature-release.lua: KEYS[1] a signature's record, ARGV[1] the value a request wrote -> deleted only while it holds it", () => {
  const release = (key: string, mark: string) => redis.eval(loadLua('signature-release'), 1, key, mark);

  it("the request's own record is deleted; another request's, or none, is left alone", async () => {
    await redis.set('sig', 'mark-1', 'EX', 660);
    expect(await release('sig', 'mark-2')).toBe(0);
    expect(await redis.get('sig')).toBe('mark-1');
    expect(await redis.ttl('sig')).toBeGreaterThan(600);
    expect(await release('sig', 'mark-1')).toBe(1);
    expect(await redis.exists('sig')).toBe(0);
    expect(await release('sig', 'mark-1')).toBe(0);
  });
});

describe("deliveries-add.lua: KEYS[1] a sender's verified stream, KEYS[2] its unverified one; ARGV caps, then kind, n, fields", () => {
  const add = (...entries: Array<['v' | 'u', string]>) =>
    redis.eval(loadLua('deliveries-add'), 2, 'v', 'u', 1000, 1000, ...entries.flatMap(([kind, detail]) => [kind, 2, 'detail', detail]));
  /** Both streams' entries, ordered by id, as kind:detail. */
  const merged = async () => {
    const rows = [
      ...(await redis.xrange('v', '-', '+')).map(([id, f]) => [id, `v:${f[1]}`] as const),
      ...(await redis.xrange('u', '-', '+')).map(([id, f]) => [id, `u:${f[1]}`] as const),
    ];
    const key = (id: string) => id.split('-').map(BigInt) as [bigint, bigint];
    return rows
      .sort(([a], [b]) => {
        const [am, as] = key(a);
        const [bm, bs] = key(b);
        return am === bm ? (as < bs ? -1 : as > bs ? 1 : 0) : am < bm ? -1 : 1;
      })
      .map(([, e]) => e);
  };

  it('gives the deliveries of both streams ids of one sequence, in the order given, even within one millisecond', async () => {
    expect(await add(['v', '1'], ['u', '2'], ['v', '3'], ['u', '4'], ['u', '5'], ['v', '6'])).toBe(6);
    expect(await merged()).toEqual(['v:1', 'u:2', 'v:3', 'u:4', 'u:5', 'v:6']);
    const ids = [...(await redis.xrange('v', '-', '+')), ...(await redis.xrange('u', '-', '+'))].map(([id]) => id);
    expect(new Set(ids).size).toBe(6);
  });

  it('goes on above the newest entry of either stream, even one ahead of the clock', async () => {
    await redis.xadd('u', '99999999999999-5', 'detail', 'ahead');
    await add(['v', 'next']);
    expect((await redis.xrange('v', '-', '+'))[0]![0]).toBe('99999999999999-6');
    expect(await merged()).toEqual(['u:ahead', 'v:next']);
  });

  it('trims each stream to about its own cap', async () => {
    for (let b = 0; b < 6; b++) {
      await redis.eval(
        loadLua('deliveries-add'),
        2,
        'v',
        'u',
        1000,
        10,
        ...Array.from({ length: 100 }, (_, i) => ['u', 2, 'detail', `${b}.${i}`]).flat(),
      );
    }
    expect(await redis.xlen('u')).toBeLessThan(600);
  });
});

describe('approval-create.lua: KEYS[1] record, KEYS[2] index, KEYS[3] pending set; ARGV id, record, expiry, keep ms, now', () => {
  const create = (id: string, identity: string, expires: number, now: number) =>
    redis.eval(
      loadLua('approval-create'),
      3,
      `rec:${id}`,
      `idx:${identity}`,
      'pending',
      id,
      JSON.stringify({ id }),
      expires,
      expires - now + 60_000,
      now,
    ) as Promise<[number, string]>;

  it('records a new approval: its record (kept past its expiry), its index until the expiry, its place in the pending set', async () => {
    const now = Date.now();
    expect(await create('apr-1', 'restart:shop/web', now + 30_000, now)).toEqual([1, 'apr-1']);
    expect(JSON.parse((await redis.get('rec:apr-1'))!)).toEqual({ id: 'apr-1' });
    expect(await redis.get('idx:restart:shop/web')).toBe('apr-1');
    const idxTtl = await redis.pttl('idx:restart:shop/web');
    expect(idxTtl).toBeGreaterThan(25_000);
    expect(idxTtl).toBeLessThanOrEqual(30_000);
    expect(await redis.pttl('rec:apr-1')).toBeGreaterThan(30_000);
    expect(Number(await redis.zscore('pending', 'apr-1'))).toBe(now + 30_000);
  });

  it('a second approval of the same change answers the pending one and records nothing; the same id again answers itself', async () => {
    const now = Date.now();
    await create('apr-1', 'restart:shop/web', now + 30_000, now);
    expect(await create('apr-2', 'restart:shop/web', now + 30_000, now)).toEqual([0, 'apr-1']);
    expect(await redis.exists('rec:apr-2')).toBe(0);
    await redis.del('idx:restart:shop/web'); // decided: the index is gone
    expect(await create('apr-1', 'restart:shop/web', now + 30_000, now)).toEqual([0, 'apr-1']);
    expect(await redis.zcard('pending')).toBe(1);
  });
});

describe('approval-decide.lua: KEYS record, pending set, index; ARGV action, by, owner, credential, reason, now, keep, coalesced', () => {
  const now = Date.now();
  const record = (over: Record<string, unknown> = {}) =>
    JSON.stringify({
      id: 'apr-1',
      status: 'pending',
      requester: 'key:req',
      requester_credential: 'c-req',
      requester_owner: 'alice',
      required: 1,
      approvers: [],
      expires_at: now + 60_000,
      ...over,
    });
  const setUp = async (over: Record<string, unknown> = {}) => {
    await redis.set('rec', record(over), 'PX', 120_000);
    await redis.set('idx', 'apr-1');
    await redis.zadd('pending', now + 60_000, 'apr-1');
  };
  const decide = (action: string, by: string, owner: string, credential: string, at = now, reason = 'because', coalesced = 0) =>
    redis.eval(
      loadLua('approval-decide'),
      3,
      'rec',
      'pending',
      'idx',
      action,
      by,
      owner,
      credential,
      reason,
      at,
      5_000,
      coalesced,
    ) as Promise<[string, string]>;
  const stored = async () => JSON.parse((await redis.get('rec'))!);

  it('the last approval makes it approving (still pending and indexed); finish approves it with its job, drops the index and the pending place, keeps it `keep` ms', async () => {
    await setUp();
    const [verdict, raw] = await decide('approve', 'key:op2', 'bob', 'c-op2');
    expect(verdict).toBe('approving');
    expect(JSON.parse(raw)).toMatchObject({
      status: 'approving',
      approving_at: now,
      approvers: [{ by: 'key:op2', owner: 'bob', credential: 'c-op2', reason: 'because', at: now }],
    });
    expect(await redis.get('idx')).toBe('apr-1');
    expect(await redis.zcard('pending')).toBe(1);
    // another approve or an expiry meanwhile: told it is approving (its caller finishes it)
    expect((await decide('approve', 'key:op3', 'carol', 'c-op3'))[0]).toBe('approving');
    expect((await decide('expire', 'opsgate', 'opsgate', '', now + 61_000))[0]).toBe('approving');
    const [done, rawDone] = await decide('finish', 'opsgate', 'opsgate', '', now, 'apr-1', 0);
    expect(done).toBe('approved');
    expect(JSON.parse(rawDone)).toMatchObject({ status: 'approved', decided_at: now, job_id: 'apr-1', coalesced: false });
    expect(await redis.exists('idx')).toBe(0);
    expect(await redis.zcard('pending')).toBe(0);
    expect(await redis.pttl('rec')).toBeLessThanOrEqual(5_000);
    expect((await decide('approve', 'key:op3', 'carol', 'c-op3'))[0]).toBe('decided');
  });

  it('fail keeps the error on the approving record; abandon expires it; neither touches a pending one', async () => {
    await setUp();
    expect((await decide('fail', 'opsgate', 'opsgate', '', now, 'redis down'))[0]).toBe('pending');
    await decide('approve', 'key:op2', 'bob', 'c-op2');
    const [failed, raw] = await decide('fail', 'opsgate', 'opsgate', '', now, 'redis down');
    expect(failed).toBe('failed');
    expect(JSON.parse(raw)).toMatchObject({ status: 'approving', last_error: 'redis down' });
    expect((await decide('abandon', 'opsgate', 'opsgate', '', now, 'no job'))[0]).toBe('expired');
    expect(await stored()).toMatchObject({ status: 'expired', last_error: 'no job' });
    expect(await redis.zcard('pending')).toBe(0);
  });

  it("four eyes between people: no credential of the requester's owner approves (another key, the same principal), but the requester may withdraw (reject)", async () => {
    await setUp();
    expect((await decide('approve', 'key:alice-ci', 'alice', 'x'))[0]).toBe('self');
    expect((await decide('approve', 'key:req', 'someone', 'c-other'))[0]).toBe('self');
    expect((await stored()).status).toBe('pending');
    const [verdict, raw] = await decide('reject', 'key:req', 'alice', 'c-req');
    expect(verdict).toBe('rejected');
    expect(JSON.parse(raw)).toMatchObject({ status: 'rejected', rejected: { by: 'key:req', owner: 'alice', reason: 'because' } });
  });

  it('two approvals needed: the first is recorded (its TTL kept), the same owner again (another key) is refused, another person completes it', async () => {
    await setUp({ required: 2 });
    const ttl = await redis.pttl('rec');
    expect((await decide('approve', 'key:op2', 'bob', 'c-op2'))[0]).toBe('recorded');
    expect((await stored()).approvers).toHaveLength(1);
    expect(await redis.pttl('rec')).toBeGreaterThan(ttl - 1000);
    expect(await redis.get('idx')).toBe('apr-1');
    expect((await decide('approve', 'key:op2-laptop', 'bob', 'c-op2b'))[0]).toBe('again');
    expect((await decide('approve', 'key:op3', 'carol', 'c-op3'))[0]).toBe('approving');
    expect((await stored()).approvers.map((a: { owner: string }) => a.owner)).toEqual(['bob', 'carol']);
  });

  it('past its expiry: approving marks it expired; `expire` before it changes nothing, after it expires it', async () => {
    await setUp();
    expect((await decide('expire', 'opsgate', 'opsgate', '', now + 1000))[0]).toBe('pending');
    expect((await decide('approve', 'key:op2', 'bob', 'c-op2', now + 60_000))[0]).toBe('expired');
    expect((await stored()).status).toBe('expired');
    expect(await redis.zcard('pending')).toBe(0);
    await setUp();
    expect((await decide('expire', 'opsgate', 'opsgate', '', now + 61_000))[0]).toBe('expired');
  });

  it('many people approving at once: exactly one makes it approving', async () => {
    await setUp();
    const all = await Promise.all(Array.from({ length: 20 }, (_, i) => decide('approve', `key:op${i}`, `person${i}`, `c-op${i}`)));
    expect(all.filter(([v]) => v === 'approving')).toHaveLength(20);
    // one approver recorded: the others found it approving already
    expect((await stored()).approvers).toHaveLength(1);
  });

  it('an old record without an owner compares principals', async () => {
    await setUp({ requester_owner: undefined });
    expect((await decide('approve', 'key:req', 'key:req', 'c-req'))[0]).toBe('self');
  });

  it('an unknown approval', async () => {
    expect((await decide('approve', 'key:x', 'x', 'c'))[0]).toBe('not_found');
  });
});

describe('budget-take.lua: KEYS budgets; ARGV now, job id, take|peek, then window ms and restarts of each -> {taken, spent, retry ms, used and retry of each}', () => {
  const take = (id: string, now: number, max = 3, windowMs = 600_000) =>
    redis.eval(loadLua('budget-take'), 1, 'b', now, id, 'take', windowMs, max) as Promise<number[]>;

  it('takes up to the limit in the window, then refuses until the oldest leaves it', async () => {
    const t = 1_000_000;
    expect(await take('a', t)).toEqual([1, 0, 0, 1, 0]);
    expect(await take('b', t + 1000)).toEqual([1, 0, 0, 2, 0]);
    expect(await take('c', t + 2000)).toEqual([1, 0, 0, 3, 0]);
    expect(await take('d', t + 3000)).toEqual([0, 1, 597_000, 3, 597_000]);
    expect(await take('d', t + 600_000)).toEqual([1, 0, 0, 3, 0]); // a left the window exactly at t + 600 s
    expect(await redis.pttl('b')).toBeGreaterThan(0);
  });

  it('the same job taking again takes nothing more (a retried request)', async () => {
    expect(await take('a', 5000, 1)).toEqual([1, 0, 0, 1, 0]);
    expect(await take('a', 5001, 1)).toEqual([1, 0, 0, 1, 0]);
    expect((await take('b', 5002, 1))[0]).toBe(0);
  });

  it("peek answers as a take would and takes nothing (a dry run's look at the same window)", async () => {
    const peek = (now: number, max = 2) => redis.eval(loadLua('budget-take'), 1, 'b', now, '', 'peek', 10_000, max) as Promise<number[]>;
    expect(await peek(1000)).toEqual([1, 0, 0, 0, 0]);
    await take('a', 1000, 2, 10_000);
    await take('b', 2000, 2, 10_000);
    expect(await peek(3000)).toEqual([0, 1, 8_000, 2, 8_000]);
    expect(await redis.zcard('b')).toBe(2);
    expect(await peek(11_000)).toEqual([1, 0, 0, 1, 0]); // a left the window
  });

  it('two budgets: a place of each, or of none when one is spent', async () => {
    const both = (id: string, now: number) =>
      redis.eval(loadLua('budget-take'), 2, 'rule', 'ns', ...[now, id, 'take', 10_000, 2, 10_000, 1].map(String)) as Promise<number[]>;
    expect(await both('a', 1000)).toEqual([1, 0, 0, 1, 0, 1, 0]);
    expect(await both('b', 2000)).toEqual([0, 2, 9_000, 1, 0, 1, 9_000]);
    expect(await redis.zrange('rule', '0', '-1')).toEqual(['a']);
    expect(await both('b', 11_000)).toEqual([1, 0, 0, 1, 0, 1, 0]); // a left both windows
  });
});

describe('remediation-guard.lua: KEYS cooldown, history, escalated; ARGV claim|release, id, now, cooldown ms, window ms, escalate_after', () => {
  const guard = (action: 'claim' | 'release', id: string, now: number, cooldownMs = 10_000, windowMs = 100_000, after = 3) =>
    redis.eval(loadLua('remediation-guard'), 3, 'cd', 'hist', 'esc', action, id, now, cooldownMs, windowMs, after) as Promise<
      [string, number]
    >;

  it('claims, then holds the cooldown for its length; another claim after it is counted in the window', async () => {
    expect(await guard('claim', 'a', 1000)).toEqual(['claimed', 1]);
    expect(await redis.get('cd')).toBe('a');
    const [verdict, left] = await guard('claim', 'b', 2000);
    expect(verdict).toBe('cooldown');
    expect(left).toBeGreaterThan(0);
    expect(left).toBeLessThanOrEqual(10_000);
    await redis.del('cd'); // the cooldown's PX ended
    expect(await guard('claim', 'b', 12_000)).toEqual(['claimed', 2]);
    expect(await redis.zrange('hist', '0', '-1')).toEqual(['a', 'b']);
  });

  it('after escalate_after remediations in the window: escalate once, then escalated until the flag ends; old ones leave the window', async () => {
    for (const [id, t] of [
      ['a', 1000],
      ['b', 2000],
      ['c', 3000],
    ] as const) {
      await redis.del('cd');
      expect((await guard('claim', id, t))[0]).toBe('claimed');
    }
    await redis.del('cd');
    expect(await guard('claim', 'd', 4000)).toEqual(['escalate', 3]);
    expect(await redis.get('esc')).toBe('d');
    expect(await redis.pttl('esc')).toBeGreaterThan(0);
    expect(await guard('claim', 'e', 5000)).toEqual(['escalated', 3]);
    // The flag gone and the window moved on past a, b and c: claims again.
    await redis.del('esc');
    expect(await guard('claim', 'f', 103_500)).toEqual(['claimed', 1]);
  });

  it('release gives back the cooldown (only its own) and the place in the window', async () => {
    await guard('claim', 'a', 1000);
    expect(await guard('release', 'other', 0)).toEqual(['released', 0]);
    expect(await redis.get('cd')).toBe('a');
    expect(await guard('release', 'a', 0)).toEqual(['released', 0]);
    expect(await redis.get('cd')).toBeNull();
    expect(await redis.zcard('hist')).toBe(0);
    expect(await guard('claim', 'b', 2000)).toEqual(['claimed', 1]);
  });
});

describe('deploy-turn.lua: KEYS[1] group; ARGV begin|release|check, job, accepted at, accepted id, now, lease ms', () => {
  const turn = (action: string, job: string, at: number, id = job, now = 1000, lease = 60_000) =>
    redis.eval(loadLua('deploy-turn'), 1, 'grp', action, job, at, id, now, lease) as Promise<[string, string]>;

  it('one runs; a newer one waits; an older one waiting is superseded by the newest; the release names the newest waiting', async () => {
    expect(await turn('begin', 'a', 100)).toEqual(['run', '']);
    expect(await turn('begin', 'b', 200)).toEqual(['wait', 'a']);
    expect(await turn('begin', 'c', 300)).toEqual(['wait', 'a']);
    // b asks again: c, accepted after it, waits for the turn.
    expect(await turn('begin', 'b', 200)).toEqual(['superseded', 'c']);
    expect(await turn('release', 'b', 0)).toEqual(['not_running', '']);
    expect(await turn('release', 'a', 0)).toEqual(['released', 'c']);
    expect(await turn('begin', 'c', 300)).toEqual(['run', '']);
    // Its next attempt keeps the turn; nothing waits when it ends.
    expect(await turn('begin', 'c', 300)).toEqual(['run', '']);
    expect(await turn('release', 'c', 0)).toEqual(['released', '']);
  });

  it('never older after newer: once a newer one started, an older one (a retry, a late hold) is superseded, and check says so', async () => {
    expect(await turn('begin', 'new', 200)).toEqual(['run', '']);
    expect(await turn('release', 'new', 0)).toEqual(['released', '']);
    expect(await turn('begin', 'old', 100)).toEqual(['superseded', 'new']);
    expect(await turn('check', '', 100, 'old')).toEqual(['superseded', 'new']);
    // A resubmission of the newest itself (under another job id) still runs.
    expect(await turn('check', '', 200, 'new')).toEqual(['ok', '']);
    expect(await turn('begin', 'new.retry', 200, 'new')).toEqual(['run', '']);
  });

  it('within one millisecond the acceptance id decides, numerically for numeric ids', async () => {
    expect(await turn('begin', '10', 100)).toEqual(['run', '']);
    await turn('release', '10', 0);
    expect(await turn('begin', '9', 100)).toEqual(['superseded', '10']);
    expect(await turn('begin', '11', 100)).toEqual(['run', '']);
  });

  it('a running deploy past its lease no longer holds the group', async () => {
    expect(await turn('begin', 'a', 100, 'a', 1000, 500)).toEqual(['run', '']);
    expect(await turn('begin', 'b', 200, 'b', 1400)).toEqual(['wait', 'a']);
    expect(await turn('begin', 'b', 200, 'b', 1600)).toEqual(['run', '']);
    expect(await redis.hget('grp', 'running')).toBe('b');
  });
});

describe('approval-decide.lua supersede: a pending or approving record closes superseded, naming the newer job', () => {
  const now = Date.now();
  const setUp = async (status: string) => {
    await redis.set(
      'rec',
      JSON.stringify({
        id: 'apr-1',
        status,
        requester: 'key:req',
        requester_owner: 'alice',
        required: 1,
        approvers: [],
        expires_at: now + 60_000,
      }),
      'PX',
      120_000,
    );
    await redis.set('idx', 'apr-1');
    await redis.zadd('pending', now + 60_000, 'apr-1');
  };
  const supersede = () =>
    redis.eval(
      loadLua('approval-decide'),
      3,
      'rec',
      'pending',
      'idx',
      'supersede',
      'opsgate',
      'opsgate',
      '',
      'job-9',
      now,
      5_000,
      0,
    ) as Promise<[string, string]>;

  for (const status of ['pending', 'approving']) {
    it(`${status} -> superseded`, async () => {
      await setUp(status);
      const [verdict, raw] = await supersede();
      expect(verdict).toBe('superseded');
      expect(JSON.parse(raw)).toMatchObject({ status: 'superseded', superseded_by: 'job-9', decided_at: now });
      expect(await redis.exists('idx')).toBe(0);
      expect(await redis.zcard('pending')).toBe(0);
    });
  }

  it('a decided record stays as it is', async () => {
    await setUp('approved');
    expect((await supersede())[0]).toBe('decided');
  });
});

describe('deploy-history.lua: KEYS entries, project index, all index, refs; ARGV id, accepted, kept, first, info, step', () => {
  const first = { project: 'g/a', ref: 'main', commit: null, group: 'g', origin: 'push', owner: null, queue_job: null };
  const put = (id: string, at: number, step: Record<string, unknown>, info: Record<string, unknown> = {}, keep = 2) =>
    redis.eval(
      loadLua('deploy-history'),
      4,
      'entries',
      'project',
      'all',
      'refs',
      id,
      at,
      keep,
      JSON.stringify(first),
      JSON.stringify(info),
      JSON.stringify(step),
    ) as Promise<[string, string, string]>;
  const entry = async (id: string) => JSON.parse((await redis.hget('entries', id)) ?? 'null') as Record<string, unknown> | null;

  it('merges steps and never moves a deploy back; the info fields are written whatever the state', async () => {
    expect(await put('a', 100, { state: 'running', started_at: 150 })).toEqual(['written', 'running', '']);
    // The API's late "queued" after the worker's "running": the state stays, the origin it knows is taken.
    expect(await put('a', 100, { state: 'queued' }, { origin: 'ci' })).toEqual(['kept', 'running', '']);
    expect(await entry('a')).toMatchObject({ id: 'a', state: 'running', started_at: 150, origin: 'ci', accepted_at: 100 });
    expect(JSON.parse((await redis.hget('refs', 'main\nrunning'))!)).toMatchObject({ id: 'a' });
    expect(await put('a', 100, { state: 'succeeded', finished_at: 200 })).toEqual(['written', 'succeeded', '']);
    expect(await put('a', 100, { state: 'failed' })).toEqual(['kept', 'succeeded', '']);
    expect(await redis.hget('refs', 'main\nrunning')).toBeNull();
    expect(JSON.parse((await redis.hget('refs', 'main\ncurrent'))!)).toMatchObject({ id: 'a', state: 'succeeded' });
  });

  it('keeps the newest `kept` of a project: the oldest leave both indexes and the entries', async () => {
    await put('a', 100, { state: 'queued' });
    await put('b', 200, { state: 'queued' });
    expect(await put('c', 300, { state: 'queued' })).toEqual(['written', 'queued', 'a']);
    expect(await redis.zrange('project', '0', '-1')).toEqual(['b', 'c']);
    expect(await redis.zrange('all', '0', '-1')).toEqual(['b', 'c']);
    expect(await entry('a')).toBeNull();
  });
});
