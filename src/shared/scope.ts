import { z } from 'zod';

/**
 * What a credential may act on (none: everything its role allows): every list of the target's kind and of namespaces must
 * admit it. `{projects: [a/b]}` restarts nothing; `{hosts: [web-1], namespaces: [shop]}` restarts web-1 only while in shop.
 */
export interface Scope {
  readonly hosts?: readonly string[];
  readonly namespaces?: readonly string[];
  readonly projects?: readonly string[];
}

export type ScopeTarget =
  | { kind: 'host'; host: string; namespace: string }
  | { kind: 'project'; project: string; namespace: string }
  /** A namespace as a whole (a freeze of it). */
  | { kind: 'namespace'; namespace: string };

const names = z.array(z.string().min(1).max(255)).max(500);

/** At least one of the three lists. */
export const scopeSchema = z
  .strictObject({ hosts: names.optional(), namespaces: names.optional(), projects: names.optional() })
  .refine((s) => s.hosts !== undefined || s.namespaces !== undefined || s.projects !== undefined, {
    message: 'names none of hosts, namespaces, projects (leave scope out to act on everything)',
  });

export function scopeAdmits(scope: Scope | undefined, target: ScopeTarget): boolean {
  if (!scope) return true;
  const own = target.kind === 'host' ? scope.hosts : target.kind === 'project' ? scope.projects : undefined;
  const name = target.kind === 'host' ? target.host : target.kind === 'project' ? target.project : undefined;
  if (own === undefined && scope.namespaces === undefined) return false;
  if (own !== undefined && (name === undefined || !own.includes(name))) return false;
  if (scope.namespaces !== undefined && !scope.namespaces.includes(target.namespace)) return false;
  return true;
}

export function describeScopeTarget(target: ScopeTarget): string {
  if (target.kind === 'host') return `host ${target.host} (namespace ${target.namespace})`;
  if (target.kind === 'project') return `project ${target.project} (namespace ${target.namespace})`;
  return `namespace ${target.namespace}`;
}
