import { z } from 'zod';
import { HEX_COMMIT } from './fields.js';
import { source as scm } from './scm.js';
import type { PushSource } from './types.js';

/**
 * GitLab's native headers with scm's event ids, so a push delivered through both (a migration) deploys once.
 * Idempotency-Key (GitLab 17.4+) is stable across GitLab's retries; X-Gitlab-Event-UUID otherwise.
 */
export const source: PushSource = {
  ...scm,
  name: 'gitlab',
  title: 'GitLab',
  verification: { kind: 'token', header: 'X-Gitlab-Token' },
  secret: {
    env: 'GITLAB_WEBHOOK_SECRET',
    fallbackEnv: 'SCM_WEBHOOK_SECRET',
    description: 'secret token of /webhook/gitlab (X-Gitlab-Token); unset: SCM_WEBHOOK_SECRET',
  },
  event: { header: 'X-Gitlab-Event', push: 'Push Hook' },
  commitForm: 'hex',
  payload: z.looseObject({
    ref: z.string().optional().describe('branch reference; only refs/heads/main deploys'),
    project: z.looseObject({ path_with_namespace: z.string().optional() }).optional(),
    checkout_sha: z
      .string()
      .regex(HEX_COMMIT)
      .describe('the pushed commit, 7 to 64 hex digits; required for a push to main (422 when missing, empty or not a commit id)'),
  }),
  deliveryHeaders: ['Idempotency-Key', 'X-Gitlab-Event-UUID'],
  setup: 'project → Settings → Webhooks: URL `…/webhook/gitlab`, Secret token, trigger "Push events"',
};
