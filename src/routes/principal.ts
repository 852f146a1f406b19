import type { Response } from 'express';
import type { Principal } from '../changes/types.js';
import { scopeOf } from '../middleware/scope.js';

/**
 * The authenticated caller as the change pipeline takes it. A credential behind which no known
 * person stands (the shared bearer token, an OIDC token whose rule names none) is flagged, so its
 * changes need one approver more; its scope goes with it, so the pipeline refuses a change outside it.
 */
export function principalOf(res: Response): Principal {
  const l = res.locals;
  const principal = l.principal ?? 'unknown';
  const scope = scopeOf(res);
  return {
    principal,
    credential: l.credential ?? '',
    owner: l.owner ?? principal,
    ownerKnown: l.ownerKnown === true,
    ...(typeof l.person === 'string' ? { person: l.person } : {}),
    mayOverride: l.mayOverride === true,
    ...(scope ? { scope } : {}),
  };
}
