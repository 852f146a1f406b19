import { z } from 'zod';
import { nestedString, objectPayload, stringField } from './fields.js';
import type { PushSource } from './types.js';

/** The contract's source-control sender: a shared token, GitLab's push payload. */
export const source: PushSource = {
  kind: 'push',
  name: 'scm',
  title: 'Source control (the contract)',
  verification: { kind: 'token', header: 'X-Scm-Token' },
  secret: { env: 'SCM_WEBHOOK_SECRET', description: 'shared token of /webhook/scm (X-Scm-Token)' },
  event: { header: 'X-Scm-Event', push: 'Push Hook' },
  eventPrefix: 'scm',
  commitField: 'checkout_sha',
  commitForm: 'any',
  example: {
    object_kind: 'push',
    ref: 'refs/heads/main',
    checkout_sha: 'da1560886d4f094c3e6c9ef40349f7d38b5d27d7',
    project: { path_with_namespace: 'mike/diaspora' },
  },
  payload: z.looseObject({
    ref: z.string().optional().describe('branch reference; only refs/heads/main deploys'),
    project: z.looseObject({ path_with_namespace: z.string().optional() }).optional(),
    checkout_sha: z.string().describe('required for a push to main (422 when missing or empty)'),
  }),
  setup: "any sender that can set the `X-Scm-Token` and `X-Scm-Event` headers and post GitLab's push payload",
  map(payload) {
    const p = objectPayload(payload);
    return {
      kind: 'push',
      fields: {
        ref: stringField(p, 'ref', ''),
        project: nestedString(p, 'project', 'path_with_namespace', 'unknown'),
        sha: p.checkout_sha,
      },
    };
  },
};
