import { MAX_PRINCIPAL } from '../shared/jobs.js';

/**
 * Who a caller is: a principal (which credential: `key:<id>`, `bearer:<credential id>`, `webhook:<sender>`,
 * `oidc:<issuer>:<sub>`) and an owner (the person or service holding it), so four eyes can compare people: two credentials
 * with one owner are one person. A credential many people may hold (the shared bearer token, an OIDC token whose rule names
 * no person) counts as no known person: four eyes asks one approver more, and it never overrides a freeze or the windows.
 */
export interface Identity {
  principal: string;
  owner: string;
  ownerKnown: boolean;
  /** The person behind an OIDC token (its rule's `person`), compared by four eyes besides `owner`. */
  person?: string;
  mayOverride: boolean;
}

export const OWNER_MAX = 128;

/** An owner: a user name, an e-mail address, `team:payments` or `ci:group/project`; nothing a log line or a chat message would escape. */
export const OWNER = new RegExp(`^[A-Za-z0-9._:@/+-]{1,${OWNER_MAX}}$`);

const OWNER_RULE = `is not 1-${OWNER_MAX} letters, digits or the characters . _ : @ / + -`;

export const keyPrincipal = (id: string) => `key:${id}`;
/** The owner of a key of OPS_API_KEY_ROLES, which names no owner: the key alone (its id is the first 12 hex of its SHA-256). */
export const envKeyOwner = (id: string) => `env:${id}`;

export function keyIdentity(key: { readonly id: string; readonly owner: string }): Identity {
  return { principal: keyPrincipal(key.id), owner: key.owner, ownerKnown: true, mayOverride: true };
}

/** The shared bearer token: owned by OPS_BEARER_TOKEN_OWNER when set, else by itself; no known person stands behind it. */
export function bearerIdentity(credential: string, owner: string | undefined): Identity {
  const principal = `bearer:${credential}`;
  return { principal, owner: owner ?? principal, ownerKnown: false, mayOverride: false };
}

/** A webhook sender is its own owner, known when its proof was checked. */
export function senderIdentity(sender: string, verified: boolean): Identity {
  const principal = `webhook:${sender}`;
  return { principal, owner: principal, ownerKnown: verified, mayOverride: false };
}

/** Why a principal or an owner would not fit a job's identity fields (MAX_PRINCIPAL characters), or undefined. */
export function widthProblem(value: string): string | undefined {
  return value.length > MAX_PRINCIPAL ? `is longer than ${MAX_PRINCIPAL} characters, the width of a job's identity fields` : undefined;
}

/** Why `owner` cannot be an owner (its syntax, then its width), or undefined; worded to follow "<owner> ", never repeating it. */
export function ownerProblem(owner: string): string | undefined {
  return OWNER.test(owner) ? widthProblem(owner) : OWNER_RULE;
}
