import type { z } from 'zod';

/**
 * What a webhook sender is, as data: one module per sender in this folder, each exporting
 * `source`. The router (src/routes/webhooks.ts), the OpenAPI document, the configuration's
 * secret list and log redaction, and the table of senders in docs/senders.md are derived from them
 * (src/sources/index.ts).
 */

/** How a delivery proves its sender. Every comparison is constant time. */
export type Verification =
  /** A header equal to the secret (GitLab's X-Gitlab-Token). */
  | { kind: 'token'; header: string }
  /**
   * A header carrying the HMAC of the raw body keyed by the secret: `<prefix><digest>`, the digest
   * in `encoding`. A value without the prefix is a missing signature (403).
   */
  | { kind: 'hmac'; header: string; algorithm: 'sha256'; prefix: string; encoding: 'hex' | 'base64' }
  /**
   * `t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<raw body>">`. A timestamp further than
   * `toleranceSeconds` from the server's clock, or a signature already used, is refused (403).
   * A signature is used by a delivery answered 2xx, 3xx or 4xx; one answered 5xx gives it back,
   * so the sender's retry of that same request is heard (src/middleware/auth.ts).
   */
  | { kind: 'timestamped-hmac'; header: string; toleranceSeconds: number }
  /** `Authorization: Bearer <secret>` when the secret is set; open (and logged as such) when not. */
  | { kind: 'bearer'; optional: true };

/** A secret of a sender, read from the environment. */
export interface SecretSpec {
  env: string;
  /** Used when `env` is unset (a sender that shares another's secret by default). */
  fallbackEnv?: string;
  description: string;
}

/** What a push carries, as read from its payload (checked by the intake's rules, in their order). */
export interface PushFields {
  /** "unknown" when the payload names none. */
  project: string;
  /** "" when the payload has none. */
  ref: string;
  /** The pushed commit as found (it must be a non-empty string to deploy). */
  sha: unknown;
  /** A branch deletion: nothing to deploy. */
  deleted?: boolean;
  /**
   * The branch's commit before the push ("" when the push created the branch), read by the
   * senders with `replayGuard`.
   */
  before?: string;
}

/** The answer of a payload that passed verification: deploy these fields, or ignore it with a reason. */
export type PushMapping = { kind: 'push'; fields: PushFields } | { kind: 'ignored'; reason: string };

interface SourceBase {
  /** The path segment: POST /webhook/<name>. Lower case, digits and dashes. */
  name: string;
  /** Who sends it, for the docs and the OpenAPI document. */
  title: string;
  verification: Verification;
  secret: SecretSpec;
  /** One line for the table of senders in docs/senders.md: where the sender's setting lives. */
  setup: string;
}

/** A source-control sender: pushes to the deploy branch become run_deploy_pipeline jobs. */
export interface PushSource extends SourceBase {
  kind: 'push';
  /** The event header and the value of a push; any other value (or none) is ignored with a reason. */
  event: { header: string; push: string };
  /**
   * The event id's first part: `<eventPrefix>:<project>:<ref>:<sha>`. Senders of one system that
   * must deduplicate together (GitLab through /webhook/scm and /webhook/gitlab) share it.
   */
  eventPrefix: string;
  /** The sender's own delivery id headers, the first present wins (remembered 30 days). */
  deliveryHeaders?: readonly string[];
  /**
   * A signed sender whose signature carries no timestamp (GitHub, Gitea, Bitbucket): a delivery
   * captured once verifies forever, and a new delivery id makes it a new delivery. With this set,
   * `map` reads the push's `before` commit, and a push whose (project, before, after) was queued
   * in the last 30 days is not deployed again by a delivery once its event's 24 h have passed
   * (202 ignored, naming the earlier job; src/domain/intake.ts); an operator's replay still can.
   * A push to the same commit from another `before` (a force-push back) is another push. Token
   * senders keep the contract's 24 h rule; a timestamped signature is refused once stale.
   */
  replayGuard?: true;
  /** The payload's fields that `map` reads, for the OpenAPI document. */
  payload: z.ZodType;
  /** A payload of a push to the deploy branch, as the sender documents it: for the docs and the tests. */
  example: Record<string, unknown>;
  /** The payload field of the pushed commit, for the 422 that names it. */
  commitField: string;
  /**
   * The form of the pushed commit the sender always sends. `hex`: a commit id of 7 to 64 hex
   * digits (the vendors send full SHA-1 or SHA-256 ids); anything else in a push to the deploy branch
   * is a 422 naming `commitField`, checked after the event and the branch (src/domain/deploy.ts).
   * `any`: any non-empty string (the contract's /webhook/scm and in-house senders, whose commit
   * may be a tag or a build's own id). The worker refuses, whatever the sender, a commit that is
   * not a plain name (worker/jobs/deploy.ts).
   */
  commitForm: 'hex' | 'any';
  /** Also accept `application/x-www-form-urlencoded` bodies with the JSON in `payload` (GitHub's form setting). */
  formPayload?: boolean;
  /**
   * The payload (verified, parsed JSON) -> the push's fields, or ignored with a reason. Throws
   * UnprocessableError for a payload that cannot be a push of this sender. The deploy-branch
   * rule is applied after it, to `fields.ref`; a payload of several pushes (Bitbucket's
   * changes) answers the one to `deployRef` when there is one.
   */
  map(payload: unknown, deployRef: string): PushMapping;
}

/** Alertmanager's webhook receiver: firing alerts become notify_oncall jobs. */
export interface AlertsSource extends SourceBase {
  kind: 'alerts';
}

export type Source = PushSource | AlertsSource;
