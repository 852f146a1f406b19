import type { Response } from 'express';
import type { Principal } from '../changes/types.js';

/**
 * The authenticated caller of a request as the change pipeline takes it: the principal the auth
 * middleware accepted, its credential id and the owner behind it. A credential whose owner the
 * middleware could not name (the shared bearer token without OPS_BEARER_TOKEN_OWNER) is its own
 * owner, flagged unknown, so its changes need one approver more.
 */
export function principalOf(res: Response): Principal {
  const l = res.locals;
  const principal = l.principal ?? 'unknown';
  return {
    principal,
    credential: l.credential ?? '',
    owner: l.owner ?? principal,
    ownerKnown: l.ownerKnown === true,
  };
}
