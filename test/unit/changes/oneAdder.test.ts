import { describe, expect, it } from '@jest/globals';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { processSources as sources, REPO_ROOT } from '../../helpers/sourceFiles.js';

/**
 * One place adds a change's job, whatever its kind: the change pipeline's executor. Every other way
 * into a change (routes, webhooks, replay, approvals, retries, the worker) goes through the planner
 * and it; a kind (src/changes/kinds/) names its job, and the executor adds it. This fails when
 * another file names a restart or deploy job, or a kind's job, in an add, or adds to a BullMQ queue
 * behind the producer's back.
 */
const EXECUTOR = 'src/changes/execute.ts';
const PRODUCER = 'src/shared/producer.ts';

describe('a single place adds restart and deploy jobs', () => {
  it("only the executor names JOB.restartService, JOB.runDeployPipeline or a kind's job as the name of a job to add", () => {
    const adders = sources()
      .filter((s) => /name:\s*(JOB\.(restartService|runDeployPipeline)|kind\.job)\b/.test(s.text))
      .map((s) => s.path);
    expect(adders).toEqual([EXECUTOR]);
  });

  it("nothing but the producer adds to a BullMQ queue (Queue#add, Queue#addBulk), so no path skips the producer's checks", () => {
    const direct = sources()
      .filter((s) => s.path !== PRODUCER && /\b(bull|queue|reportQueue|q)\.(add|addBulk)\(/.test(s.text))
      .map((s) => s.path);
    expect(direct).toEqual([]);
  });

  it("the check finds what it looks for (the executor adds a kind's job both ways: coalesced and through the intake)", () => {
    const text = readFileSync(join(REPO_ROOT, EXECUTOR), 'utf8');
    expect(text.match(/name:\s*kind\.job\b/g)).toHaveLength(2);
  });

  it('the kinds name their jobs: restart_service and run_deploy_pipeline', () => {
    const restart = readFileSync(join(REPO_ROOT, 'src/changes/kinds/restart.ts'), 'utf8');
    const deploy = readFileSync(join(REPO_ROOT, 'src/changes/kinds/deploy.ts'), 'utf8');
    expect(restart).toMatch(/job:\s*JOB\.restartService\b/);
    expect(deploy).toMatch(/job:\s*JOB\.runDeployPipeline\b/);
  });
});
