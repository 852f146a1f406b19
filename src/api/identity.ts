import { MAX_PRINCIPAL } from '../shared/jobs.js';

/**
 * Who a caller is. Every credential the API accepts resolves to a principal (which credential:
 * `key:<id>`, `bearer:<credential id>`, `webhook:<sender>`, `oidc:<issuer>:<sub>`) and an owner
 * (the person or service holding it), so four eyes can compare people: two keys with one owner are
 * one person, whatever their ids. Owners compare as plain strings: giving two credentials the same
 * owner makes them one person.
 *
 * A credential many people may hold (the shared bearer token, an OIDC token whose rule names no
 * person) hides who asked: it counts as no known person, so four eyes asks one approver more of its
 * changes, and it never overrides a freeze or the change windows.
 */
export interface Identity {
  /** Which credential: `key:<id>`, `bearer:<credential id>`, `webhook:<sender>`. */
  principal: string;
  /**
   * Who holds it: a keys-file entry's `owner` (default its id), `env:<id>` for a key of
   * OPS_API_KEY_ROLES, OPS_BEARER_TOKEN_OWNER for the bearer token, `webhook:<sender>` for a sender.
   */
  owner: string;
  /**
   * False when no known person stands behind the credential: the shared bearer token (whoever holds
   * it; OPS_BEARER_TOKEN_OWNER only names it), an OIDC token whose rule names no person, and
   * /webhook/alerts while it runs open (no token configured, so no proof of its sender).
   */
  ownerKnown: boolean;
  /**
   * The person behind an OIDC token, as its rule's `person` renders it (GitHub `actor`, GitLab
   * `user_login`): four eyes compares it with the approvers' owners, besides `owner`.
   */
  person?: string;
  /** Whether the caller may override a freeze or the change windows: a person's key, or an OIDC rule that says may_override. */
  mayOverride: boolean;
}

/** Longest owner a configuration may name. */
export const OWNER_MAX = 128;

/**
 * What an owner may be: 1-128 letters, digits and `. _ : @ / + -`, enough for a user name, an
 * e-mail address, `team:payments` or `ci:group/project`, and nothing a log line or a chat
 * message would have to escape.
 */
export const OWNER = new RegExp(`^[A-Za-z0-9._:@/+-]{1,${OWNER_MAX}}$`);

const OWNER_RULE = `is not 1-${OWNER_MAX} letters, digits or the characters . _ : @ / + -`;

export const keyPrincipal = (id: string): string => `key:${id}`;
/** The owner of a key of OPS_API_KEY_ROLES, which names no owner: the key alone (its id is the first 12 hex of its SHA-256). */
export const envKeyOwner = (id: string): string => `env:${id}`;
const bearerPrincipal = (credential: string): string => `bearer:${credential}`;
const senderPrincipal = (sender: string): string => `webhook:${sender}`;

/** An API key's identity: its principal and its configured owner, a person. */
export function keyIdentity(key: { readonly id: string; readonly owner: string }): Identity {
  return { principal: keyPrincipal(key.id), owner: key.owner, ownerKnown: true, mayOverride: true };
}

/**
 * The shared bearer token's identity: OPS_BEARER_TOKEN_OWNER names it when set (the audit line,
 * four eyes refuses that owner's approval), else `bearer:<credential id>`. Either way no known
 * person stands behind it.
 */
export function bearerIdentity(credential: string, owner: string | undefined): Identity {
  const principal = bearerPrincipal(credential);
  return { principal, owner: owner ?? principal, ownerKnown: false, mayOverride: false };
}

/** A webhook sender's identity: the sender is its own owner, known when its proof was checked. */
export function senderIdentity(sender: string, verified: boolean): Identity {
  const principal = senderPrincipal(sender);
  return { principal, owner: principal, ownerKnown: verified, mayOverride: false };
}

/**
 * Why a principal or an owner would not fit the job fields it reaches (requested_by, approvers,
 * override.by: MAX_PRINCIPAL characters), or undefined; worded to follow "<principal|owner> ".
 */
export function widthProblem(value: string): string | undefined {
  return value.length > MAX_PRINCIPAL ? `is longer than ${MAX_PRINCIPAL} characters, the width of a job's identity fields` : undefined;
}

/** Why `owner` cannot be an owner (its syntax, then its width), or undefined; worded to follow "<owner> ", never repeating it. */
export function ownerProblem(owner: string): string | undefined {
  return OWNER.test(owner) ? widthProblem(owner) : OWNER_RULE;
}
