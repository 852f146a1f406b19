import type { z } from 'zod';

/** A webhook sender as data, one module per sender (src/sources/index.ts derives the router, OpenAPI, secrets and docs from them). */

/** How a delivery proves its sender. Every comparison is constant time. */
export type Verification =
  /** A header equal to the secret (GitLab's X-Gitlab-Token). */
  | { kind: 'token'; header: string }
  /** A header `<prefix><digest>` of the HMAC of the raw body; a value without the prefix is a missing signature (403). */
  | { kind: 'hmac'; header: string; algorithm: 'sha256'; prefix: string; encoding: 'hex' | 'base64' }
  /**
   * `t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<raw body>">`: refused (403) when further than `toleranceSeconds`
   * from the clock, or already used by a delivery answered below 500 (a 5xx gives it back for the sender's retry).
   */
  | { kind: 'timestamped-hmac'; header: string; toleranceSeconds: number }
  /** `Authorization: Bearer <secret>` when the secret is set; open (and logged as such) when not. */
  | { kind: 'bearer'; optional: true };

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
  /** The branch's commit before the push ("" when it created the branch), read by `replayGuard` senders. */
  before?: string;
}

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
  /** The event id's first part (`<eventPrefix>:<project>:<ref>:<sha>`): senders of one system share it to deduplicate together. */
  eventPrefix: string;
  /** The sender's own delivery id headers, the first present wins (remembered 30 days). */
  deliveryHeaders?: readonly string[];
  /**
   * A signature without a timestamp (GitHub, Gitea, Bitbucket) verifies forever once captured, and a new delivery id
   * makes a new delivery: so `map` reads `before`, and a push whose (project, before, after) was queued in the last
   * 30 days is not deployed again by a delivery after its event's 24 h (202 ignored; src/domain/intake.ts).
   */
  replayGuard?: true;
  /** The payload's fields that `map` reads, for the OpenAPI document. */
  payload: z.ZodType;
  /** A payload of a push to the deploy branch, as the sender documents it: for the docs and the tests. */
  example: Record<string, unknown>;
  /** The payload field of the pushed commit, for the 422 that names it. */
  commitField: string;
  /**
   * `hex`: a push to the deploy branch must carry 7 to 64 hex digits (else 422 naming `commitField`);
   * `any`: any non-empty string (a tag, a build's id). The worker refuses any commit that is not a plain name.
   */
  commitForm: 'hex' | 'any';
  /** Also accept `application/x-www-form-urlencoded` bodies with the JSON in `payload` (GitHub's form setting). */
  formPayload?: boolean;
  /**
   * The verified payload -> the push's fields, or ignored with a reason; throws UnprocessableError for a payload
   * that cannot be this sender's push. Of several pushes (Bitbucket), the one to `deployRef` when there is one.
   */
  map(payload: unknown, deployRef: string): PushMapping;
}

/** Alertmanager's webhook receiver: firing alerts become notify_oncall jobs. */
export interface AlertsSource extends SourceBase {
  kind: 'alerts';
}

export type Source = PushSource | AlertsSource;
