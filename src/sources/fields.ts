import { z } from 'zod';
import { UnprocessableError } from '../shared/errors.js';
import type { PushSource } from './types.js';

/** Helpers the senders' payload mappings share: typed reads that answer 422 naming the field. */
export const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);

export function objectPayload(payload: unknown): Record<string, unknown> {
  if (!isObject(payload)) throw new UnprocessableError('payload must be a JSON object', 'invalid_payload');
  return payload;
}

/** A string field; `def` when absent or null; 422 when of another type. */
export function stringField(obj: Record<string, unknown>, name: string, def: string, label = name): string {
  const v = obj[name];
  if (v === undefined || v === null) return def;
  if (typeof v !== 'string') throw new UnprocessableError(`${label} must be a string`, 'invalid_payload');
  return v;
}

/** A nested object's string field (`repository.full_name`), `def` when either is absent. */
export function nestedString(obj: Record<string, unknown>, parent: string, name: string, def: string): string {
  const p = obj[parent];
  if (p === undefined || p === null) return def;
  if (!isObject(p)) throw new UnprocessableError(`${parent} must be an object`, 'invalid_payload');
  return stringField(p, name, def, `${parent}.${name}`);
}

/** A commit id as the vendors send it (`commitForm: 'hex'`): an abbreviated SHA-1 id up to a full SHA-256 one. */
export const HEX_COMMIT = /^[0-9a-fA-F]{7,64}$/;

/**
 * A commit id of a field other than the pushed commit (`before`): "" unless a string of at most 255 characters.
 * Never a 422: the field decides nothing the contract orders, and "" is the stricter reading.
 */
export const commitOrNone = (v: unknown): string => (typeof v === 'string' && v.length <= 255 ? v : '');

/** GitHub's push payload, which Gitea copies (without `deleted`); an all-zero `after` is a branch deletion either way. */
export function githubShapedPush(withDeleted: boolean): Pick<PushSource, 'commitField' | 'commitForm' | 'payload' | 'map'> {
  return {
    commitField: 'after',
    commitForm: 'hex',
    payload: z.looseObject({
      ref: z.string().optional().describe('branch reference; only refs/heads/main deploys'),
      before: z
        .string()
        .optional()
        .describe('the branch before the push: a push of the same before and after is deployed once by a delivery in 30 days'),
      after: z.string().regex(HEX_COMMIT).describe('the pushed commit, 7 to 64 hex digits; required for a push to main'),
      ...(withDeleted ? { deleted: z.boolean().optional().describe('a branch deletion is ignored') } : {}),
      repository: z.looseObject({ full_name: z.string().optional() }).optional(),
    }),
    map(payload) {
      const p = objectPayload(payload);
      const sha = p.after;
      return {
        kind: 'push',
        fields: {
          ref: stringField(p, 'ref', ''),
          project: nestedString(p, 'repository', 'full_name', 'unknown'),
          sha,
          before: commitOrNone(p.before),
          deleted: (withDeleted && p.deleted === true) || (typeof sha === 'string' && /^0+$/.test(sha)),
        },
      };
    },
  };
}
