/**
 * Prototype-pollution keys (`__proto__`, `constructor.prototype`) in every JSON payload and in
 * query strings, against the app in this process (createApp via the API test harness, real
 * Redis and BullMQ), so Object.prototype itself can be inspected afterwards: nothing may be
 * added to it, no request may change another request's outcome, and the jobs' data must be
 * plain data (no inherited surprises).
 */
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import fc from 'fast-check';
import request from 'supertest';
import { startRedis, type RedisServer } from '../../helpers/redis.js';
import { BEARER, OP_KEY, RO_KEY, SCM_SECRET, createHarness, type Harness } from '../../helpers/apiHarness.js';

let redis: RedisServer;
let h: Harness;
const protoBefore = Object.getOwnPropertyNames(Object.prototype).sort();

const pollution = [
  '{"__proto__":{"polluted":"yes","role":"operator","accepted":true}}',
  '{"constructor":{"prototype":{"polluted":"yes","isAdmin":true}}}',
  '{"__proto__":{"__proto__":{"polluted":"deep"}}}',
];

function inject(json: string, at: 'top' | 'project' | 'alerts'): string {
  const inner = json.slice(1, -1);
  if (at === 'top') return `{"ref":"refs/heads/main","checkout_sha":"s-${Math.random().toString(36).slice(2)}",${inner}}`;
  if (at === 'project')
    return `{"ref":"refs/heads/main","checkout_sha":"s-${Math.random().toString(36).slice(2)}","project":{"path_with_namespace":"g/p",${inner}}}`;
  return `{"alerts":[{"status":"firing","fingerprint":"fp-${Math.random().toString(36).slice(2)}","labels":{"alertname":"A",${inner}},"annotations":{"summary":"s",${inner}}}],${inner}}`;
}

beforeAll(async () => {
  redis = await startRedis();
  h = await createHarness(redis.url);
});

afterAll(async () => {
  await h?.close();
  await redis?.destroy();
});

describe('prototype pollution attempts', () => {
  it('leave Object.prototype untouched and change no other request', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.constantFrom(...pollution),
        fc.constantFrom<'top' | 'project' | 'alerts'>('top', 'project', 'alerts'),
        async (p, at) => {
          const body = inject(p, at);
          const path = at === 'alerts' ? '/webhook/alerts' : '/webhook/scm';
          const res = await request(h.app)
            .post(path)
            .set('Content-Type', 'application/json')
            .set('X-Scm-Token', SCM_SECRET)
            .set('X-Scm-Event', 'Push Hook')
            .send(body);
          expect([202, 422]).toContain(res.status);
          expect(Object.getOwnPropertyNames(Object.prototype).sort()).toEqual(protoBefore);
          expect(({} as Record<string, unknown>).polluted).toBeUndefined();
          expect(({} as Record<string, unknown>).role).toBeUndefined();
          // Authorisation decisions are unchanged by what came before.
          expect((await request(h.app).delete('/ops/cache').set('X-API-Key', RO_KEY)).status).toBe(403);
          expect((await request(h.app).get('/ops/hosts')).status).toBe(401);
        },
      ),
      { numRuns: 30 },
    );
    // Query-string variants (Express 5's default "simple" query parser).
    for (const q of [
      '__proto__[polluted]=yes',
      'constructor[prototype][polluted]=yes',
      'host[__proto__][x]=1&service=web',
      'host=__proto__&service=constructor',
    ]) {
      const r = await request(h.app).post(`/ops/restart?${q}`).set('Authorization', `Bearer ${BEARER}`);
      expect([400, 404, 422]).toContain(r.status);
      expect(Object.keys(r.body)).toEqual(['detail', 'code']);
    }
    expect((await request(h.app).get('/ops/hosts/__proto__').set('X-API-Key', RO_KEY)).status).toBe(404);
    expect((await request(h.app).get('/ops/jobs/__proto__').set('X-API-Key', RO_KEY)).status).toBe(404);
    expect((await request(h.app).delete('/ops/cache').set('X-API-Key', OP_KEY)).status).toBe(200);
    expect(Object.getOwnPropertyNames(Object.prototype).sort()).toEqual(protoBefore);
  }, 120_000);

  it('jobs made from such payloads hold plain data only', async () => {
    const jobs = await h.queue.bull.getJobs(['waiting'], 0, -1);
    expect(jobs.length).toBeGreaterThan(0);
    for (const j of jobs) {
      const data = j.data as Record<string, unknown>;
      expect(Object.getPrototypeOf(data)).toBe(Object.prototype);
      expect(data.polluted).toBeUndefined();
      if (j.name === 'ops_worker.run_deploy_pipeline') {
        expect(Object.keys(data).sort()).toEqual([
          'audit_id',
          'event_id',
          'project',
          'ref',
          'requested_by',
          'requested_owner',
          'sha',
          'source',
        ]);
        expect(typeof data.project).toBe('string');
      } else {
        expect(j.name).toBe('ops_worker.notify_oncall');
        expect(typeof data.alertname).toBe('string');
        const ann = data.annotations as Record<string, unknown>;
        expect(ann.summary).toBe('s');
        expect(({} as Record<string, unknown>).polluted).toBeUndefined();
      }
    }
  });
});
