import { source as scm } from './scm.js';
import type { PushSource } from './types.js';

/**
 * GitLab's native headers, with the contract's rules and event ids: a push delivered through both
 * /webhook/scm and /webhook/gitlab (during a migration) deploys once. Idempotency-Key (GitLab
 * 17.4+) stays the same across GitLab's retries of one delivery; X-Gitlab-Event-UUID otherwise.
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
  deliveryHeaders: ['Idempotency-Key', 'X-Gitlab-Event-UUID'],
  setup: 'project → Settings → Webhooks: URL `…/webhook/gitlab`, Secret token, trigger "Push events"',
};
