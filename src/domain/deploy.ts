import { UnprocessableError } from '../shared/errors.js';
import { HEX_COMMIT } from '../sources/fields.js';
import type { PushSource } from '../sources/index.js';

/** Push webhooks, whatever their sender: whether a push deploys, from the event header and the payload. */
const DEPLOY_REF = 'refs/heads/main';
/** A delivery id longer than this, or with control characters, is refused (422). */
const MAX_DELIVERY_ID = 128;

/** The delivery id header, checked; undefined when absent or empty. */
export function deliveryIdOf(value: string | undefined, header: string): string | undefined {
  if (value === undefined || value === '') return undefined;
  if (value.length > MAX_DELIVERY_ID || !/^[\x21-\x7e]+$/.test(value)) {
    throw new UnprocessableError(`${header} must be at most ${MAX_DELIVERY_ID} printable characters`, 'invalid_delivery_id');
  }
  return value;
}

/** Why a push is ignored: another event, another branch, or the sender's own reason (a deletion). */
type IgnoredCode = 'not_a_push' | 'not_deploy_branch' | 'ignored';

type PushDecision =
  | { kind: 'ignored'; code: IgnoredCode; reason: string }
  /** `before`: a `replayGuard` sender's commit before the push (src/sources/types.ts). */
  | { kind: 'deploy'; project: string; ref: string; sha: string; eventId: string; before?: string };

/** `<prefix>:<project>:<ref>:<sha>`: the contract's `scm:` form, one prefix per sender system. */
export function pushEventId(prefix: string, project: string, ref: string, sha: string): string {
  return `${prefix}:${project}:${ref}:${sha}`;
}

/** Quotes a caller-supplied value for a reason text, bounded in length. */
const quote = (s: string): string => JSON.stringify(s.length > 200 ? s.slice(0, 200) + '…' : s);

/** The push rules, in the contract's order, on a verified and parsed payload. */
export function decidePush(source: PushSource, eventHeader: string | undefined, payload: unknown, deployRef = DEPLOY_REF): PushDecision {
  const { header, push } = source.event;
  if (eventHeader !== push) {
    return {
      kind: 'ignored',
      code: 'not_a_push',
      reason: `event ${quote(eventHeader ?? '')} is not a push (${header} must be ${JSON.stringify(push)})`,
    };
  }
  const mapped = source.map(payload, deployRef);
  if (mapped.kind === 'ignored') return { kind: 'ignored', code: 'ignored', reason: mapped.reason };
  const { ref, sha, deleted } = mapped.fields;
  if (ref !== deployRef) return { kind: 'ignored', code: 'not_deploy_branch', reason: `ref ${quote(ref)} is not ${deployRef}` };
  if (deleted) return { kind: 'ignored', code: 'ignored', reason: `ref ${quote(ref)} was deleted` };
  if (sha === undefined || sha === null || sha === '') throw new UnprocessableError(`${source.commitField} is required`, 'missing_commit');
  if (typeof sha !== 'string') throw new UnprocessableError(`${source.commitField} must be a string`, 'invalid_payload');
  if (source.commitForm === 'hex' && !HEX_COMMIT.test(sha)) {
    throw new UnprocessableError(`${source.commitField} must be a commit id of 7 to 64 hex digits, not ${quote(sha)}`, 'invalid_commit');
  }
  if (mapped.fields.project.length > 255) throw new UnprocessableError('project is longer than 255 characters', 'invalid_payload');
  const project = mapped.fields.project === '' ? 'unknown' : mapped.fields.project;
  const before = source.replayGuard ? { before: mapped.fields.before ?? '' } : {};
  return { kind: 'deploy', project, ref, sha, eventId: pushEventId(source.eventPrefix, project, ref, sha), ...before };
}
