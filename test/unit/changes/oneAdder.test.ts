import { describe, expect, it } from '@jest/globals';
import { readdirSync, readFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

/**
 * One place adds restart and deploy jobs: the change pipeline's executor. Every other way into a
 * change (routes, webhooks, replay, approvals, retries, the worker) goes through the planner and
 * it. This fails when another file names a restart or deploy job in an add, or adds to a BullMQ
 * queue behind the producer's back.
 */
const root = fileURLToPath(new URL('../../../', import.meta.url));
const EXECUTOR = 'src/changes/execute.ts';
const PRODUCER = 'src/shared/producer.ts';

function sources(): Array<{ path: string; text: string }> {
  const out: Array<{ path: string; text: string }> = [];
  for (const dir of ['src', 'worker']) {
    for (const f of readdirSync(join(root, dir), { recursive: true, encoding: 'utf8' })) {
      if (!f.endsWith('.ts')) continue;
      const path = relative(root, join(root, dir, f));
      out.push({ path, text: readFileSync(join(root, path), 'utf8') });
    }
  }
  return out;
}

describe('a single place adds restart and deploy jobs', () => {
  it('only the executor names JOB.restartService or JOB.runDeployPipeline as the name of a job to add', () => {
    const adders = sources()
      .filter((s) => /name:\s*JOB\.(restartService|runDeployPipeline)\b/.test(s.text))
      .map((s) => s.path);
    expect(adders).toEqual([EXECUTOR]);
  });

  it("nothing but the producer adds to a BullMQ queue (Queue#add, Queue#addBulk), so no path skips the producer's checks", () => {
    const direct = sources()
      .filter((s) => s.path !== PRODUCER && /\b(bull|queue|reportQueue|q)\.(add|addBulk)\(/.test(s.text))
      .map((s) => s.path);
    expect(direct).toEqual([]);
  });

  it('the check finds what it looks for (the executor adds both kinds)', () => {
    const text = readFileSync(join(root, EXECUTOR), 'utf8');
    expect(text).toMatch(/name:\s*JOB\.restartService/);
    expect(text).toMatch(/name:\s*JOB\.runDeployPipeline/);
  });
});
