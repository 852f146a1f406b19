import { describe, expect, it } from '@jest/globals';
import { UnrecoverableError, Worker } from 'bullmq';
import { Redis } from 'ioredis';
import { JOB, QUEUE_NAME } from '../../../src/shared/jobs.js';
import type { JobView } from '../../../src/shared/jobReads.js';
import { useHarness } from '../../helpers/apiHarness.js';
import { waitFor } from '../../helpers/waitFor.js';
import { enqueue } from '../../helpers/queueOps.js';

/**
 * GET /ops/jobs/{id} reads a job while a worker may be finishing it: a job seen in a final state
 * is seen with what that state records (a dead letter's reason and times), however the read and
 * the failure interleave. Real Redis, a plain BullMQ worker failing every job at once, and reads
 * racing each job from waiting to failed.
 */
const ctx = useHarness();
const JOBS = 300;

describe('reading a job while it fails', () => {
  it('a failed job is never read without its reason', async () => {
    const ids: string[] = [];
    for (let i = 0; i < JOBS; i++) {
      ids.push(
        await enqueue(ctx.h.queue, JOB.notifyOncall, { alertname: `a${i}`, annotations: {}, audit_id: `x${i}`, requested_by: 'test' }),
      );
    }
    const connection = new Redis(ctx.srv.url, { maxRetriesPerRequest: null });
    const worker = new Worker(
      QUEUE_NAME,
      async () => {
        throw new UnrecoverableError('receiver gone');
      },
      { connection, prefix: ctx.h.queue.bull.opts.prefix, concurrency: 4 },
    );
    worker.on('error', () => {});
    const seen: JobView[] = [];
    try {
      // Every job read over and over until it is failed: each read that lands while its job
      // fails is the case under test.
      await Promise.all(
        ids.map((id) =>
          waitFor(
            `job ${id} read as failed`,
            async () => {
              const v = await ctx.h.queue.jobs.get(id);
              if (v?.state === 'failed') seen.push(v);
              return v?.state === 'failed';
            },
            60_000,
            1,
          ),
        ),
      );
    } finally {
      await worker.close();
      connection.disconnect();
    }
    expect(seen).toHaveLength(JOBS);
    expect(seen.filter((v) => v.failed_reason !== 'receiver gone' || v.finished_at === null).map((v) => v.id)).toEqual([]);
  }, 90_000);
});
