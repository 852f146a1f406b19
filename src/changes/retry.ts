import { jobSchemaOf } from '../shared/jobs.js';
import { UnprocessableError } from '../shared/errors.js';
import type { ChangeRetry } from '../api/deadLetters.js';
import type { JobReads } from '../shared/jobReads.js';
import type { Pipeline } from './deps.js';
import { answerChange, answered } from './answer.js';
import { submitChange } from './pipeline.js';
import { kindOfJob } from './kinds/index.js';
import { changeOfJob, type ChangeJobData } from './wake.js';

/**
 * A dead letter's retry: a new change of origin `retry` by the operator who retries, under the job
 * id `<id>.retry`. It meets every guard anew and carries no override of the old job: whoever
 * overrode a gate then did not override today's.
 */
export function changeRetry(g: Pipeline, jobs: Pick<JobReads, 'get'>): ChangeRetry {
  return {
    carries: (name) => kindOfJob(name) !== undefined,
    async retry(job, by) {
      const kind = kindOfJob(job.name);
      const parsed = kind ? jobSchemaOf(kind.job)?.safeParse(job.data) : undefined;
      if (!kind || !parsed?.success)
        throw new UnprocessableError(`job ${job.id} holds no valid ${kind?.name ?? 'change'} to retry`, 'invalid_job_data');
      const d = parsed.data as ChangeJobData;
      const { override: _dropped, ...rest } = changeOfJob(g.inventory, { name: kind.name, data: d }, `${job.id}.retry`);
      // The retry stands in the old job's place in its group's order: its acceptance, not today's.
      const accepted = { at: d.accepted_at ?? job.timestamp ?? 0, id: d.accepted_id ?? job.id };
      const change = { ...rest, requester: by.requester, reason: by.reason, auditId: by.auditId, origin: 'retry' as const, accepted };
      const { body: b } = answered(answerChange(await submitChange(g, change), 200));
      if (b.status === 'pending_approval')
        return { outcome: 'pending_approval', approval_id: b.approval_id!, expires_at: b.expires_at!, required: b.required! };
      if (b.coalesced) return { outcome: 'busy', holder: b.job_id };
      const view = await jobs.get(b.job_id);
      if (!view) return { outcome: 'not_found' };
      return {
        outcome: 'retried',
        job: view,
        ...(b.held_until ? { held_until: b.held_until } : {}),
        ...(kind.retryClears ? { clear: kind.retryClears(job.id) } : {}),
      };
    },
  };
}
