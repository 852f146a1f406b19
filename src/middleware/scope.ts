import type { Response } from 'express';
import { ForbiddenError } from '../shared/errors.js';
import { describeScopeTarget, scopeAdmits, type Scope, type ScopeTarget } from '../shared/scope.js';

/** The scope of the request's credential; a credential without one acts on everything its role allows. */
export const scopeOf = (res: Response): Scope | undefined => res.locals.scope as Scope | undefined;

/** 403 `out_of_scope` when the request's credential may not act on the target. */
export function requireInScope(res: Response, target: ScopeTarget): void {
  if (scopeAdmits(scopeOf(res), target)) return;
  throw new ForbiddenError(`${describeScopeTarget(target)} is outside the scope of this credential`, 'out_of_scope');
}
