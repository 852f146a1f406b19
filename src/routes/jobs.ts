import { Router } from 'express';
import { requireApiKey } from '../middleware/auth.js';
import { methodNotAllowed } from '../middleware/errors.js';
import type { ApiConfig } from '../shared/config.js';
import { NotFoundError } from '../shared/errors.js';
import type { Metrics } from '../shared/metrics.js';
import type { OpsQueue } from '../shared/queue.js';

/** GET /ops/jobs/:id (any valid key): state and bookkeeping of one job, never its data. */
export interface JobsDeps {
  config: Pick<ApiConfig, 'apiKeys'>;
  queue: Pick<OpsQueue, 'getJob'>;
  metrics: Pick<Metrics, 'authFailures'>;
}

const JOB_ID = /^[A-Za-z0-9._:-]{1,128}$/;

export function jobsRouter(deps: JobsDeps): Router {
  const r = Router();
  r.route('/ops/jobs/:id')
    .get(requireApiKey(deps.config.apiKeys, deps.metrics), async (req, res) => {
      const id = req.params.id;
      if (!JOB_ID.test(id)) throw new NotFoundError('job not found');
      const job = await deps.queue.getJob(id);
      if (!job) throw new NotFoundError('job not found');
      res.json(job);
    })
    .all(methodNotAllowed(['GET']));
  return r;
}
