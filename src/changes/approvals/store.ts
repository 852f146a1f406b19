import { randomBytes } from 'node:crypto';
import type { Redis } from 'ioredis';
import type { Origin, Override } from '../types.js';
import { APPROVALS_PENDING_KEY, approvalIndexKey, approvalKey } from '../../shared/keys.js';
import { IDEMPOTENCY_TTL_SECONDS } from '../../shared/jobs.js';
import { defineLua, loadLua } from '../../shared/lua.js';
import { storedJson } from '../../shared/redis.js';

/**
 * Four-eyes approvals, decided by one script (approval-decide.lua), so two operators approving at once see one
 * 'approved' between them. The change's job id is the approval id: a repeated add adds nothing. A record keeps no
 * secret (a credential id only) and stays IDEMPOTENCY_TTL_SECONDS past its expiry, to tell what became of it.
 */
export const APPROVAL_ID = /^apr-[a-z0-9]{20}$/;

/** `approving`: the last approval was given and the change is being carried out; it reads as pending. */
export const APPROVAL_STATES = ['pending', 'approving', 'approved', 'rejected', 'expired', 'superseded'] as const;
/** What GET /ops/approvals shows: `approving` reads as pending. */
export const APPROVAL_VIEW_STATES = ['pending', 'approved', 'rejected', 'expired', 'superseded'] as const;
type ApprovalState = (typeof APPROVAL_STATES)[number];

export type ApprovalChange =
  | { kind: 'restart'; host: string; service: string; namespace: string; override?: Override }
  | {
      kind: 'deploy';
      project: string;
      ref: string;
      namespace: string;
      sha?: string;
      event_id?: string;
      delivery_id?: string;
      source?: string;
      /** A rollback: the deploy it goes back from (null: none was current). */
      rollback?: { from: string | null };
      /** A rollback a person let through the gate when asking for it. */
      override?: Override;
    };

export interface Approval {
  id: string;
  status: ApprovalState;
  change: ApprovalChange;
  /** Who asked (principal: `key:<id>`, `bearer:<id>`, `webhook:<sender>`). */
  requester: string;
  /** The credential id of the requester's secret (first 12 hex of its SHA-256); '' for a webhook. */
  requester_credential: string;
  /** The person or service behind the requester's credential: four eyes compares owners. */
  requester_owner: string;
  /** false: no known person stands behind the credential (the shared bearer token, an OIDC token naming none); `required` counts one approver more. */
  requester_owner_known: boolean;
  /** The person behind the requester's OIDC token (its rule's `person`): four eyes refuses their approval too. */
  requester_person?: string;
  origin: Origin;
  /** The requester's reason, or ''. */
  reason: string;
  required: number;
  approvers: Array<{ by: string; owner: string; credential: string; reason: string; at: number }>;
  rejected?: { by: string; owner: string; credential: string; reason: string; at: number };
  created_at: number;
  expires_at: number;
  decided_at?: number;
  audit_id: string;
  /** The identity whose pending approval a second request joins (a Deployment, an event id). */
  identity: string;
  job_id?: string;
  coalesced?: boolean;
  /** Approving: why carrying it out failed last time. */
  last_error?: string;
  /** Superseded: the newer deploy of its group that started before it was approved. */
  superseded_by?: string;
  /** When the last approval was given (ms): an approve call soon after, with no error yet, is a racer. */
  approving_at?: number;
}

/** `apr-` + 20 base-36 characters, one per byte (about 103 bits from random bytes). */
const idOfBytes = (bytes: ArrayLike<number>): string => `apr-${Array.from(bytes, (b) => (b % 36).toString(36)).join('')}`;

export const newApprovalId = (): string => idOfBytes(randomBytes(20));

/** An approval id derived from an Idempotency-Key scope (hex), so a retried request finds its approval. */
export const approvalIdFor = (scopeHex: string): string =>
  idOfBytes(Array.from({ length: 20 }, (_, i) => parseInt(scopeHex.slice(i * 2, i * 2 + 2) || '0', 16)));

/** A record as Redis holds it (Lua's cjson writes an empty list as {}). */
function parseApproval(raw: string | null | undefined): Approval | undefined {
  const a = storedJson<Approval>(raw);
  if (typeof a !== 'object' || a === null) return undefined;
  if (!Array.isArray(a.approvers)) a.approvers = [];
  return a;
}

/** pending past its expiry reads as expired, whether or not a script marked it yet; approving reads as pending. */
export function effectiveStatus(a: Approval, now: number): (typeof APPROVAL_VIEW_STATES)[number] {
  if (a.status === 'approving') return 'pending';
  return a.status === 'pending' && now >= a.expires_at ? 'expired' : a.status;
}

type ApprovalAction = 'approve' | 'reject' | 'expire' | 'finish' | 'fail' | 'abandon' | 'supersede';
/** `reason`: for `finish` the job id, for `fail` the error; `coalesced` (finish): the carried change joined another job. */
type DecideArgs = Record<'by' | 'owner' | 'credential' | 'reason', string> & { action: ApprovalAction; now: number; coalesced?: boolean };

/** The script's answer: the state it left the record in, or why it changed nothing. */
type DecideVerdict = ApprovalState | 'not_found' | 'decided' | 'self' | 'again' | 'recorded' | 'failed';

const CREATE = 'opsgateApprovalCreate';
const DECIDE = 'opsgateApprovalDecide';
const CREATE_LUA = loadLua(new URL('./approval-create.lua', import.meta.url));
const DECIDE_LUA = loadLua(new URL('./approval-decide.lua', import.meta.url));
const KEEP_MS = IDEMPOTENCY_TTL_SECONDS * 1000;

type Scripts = Record<string, (...args: Array<string | number>) => Promise<unknown>>;

export function createApprovalStore(redis: Redis) {
  defineLua(redis, CREATE, CREATE_LUA, 3);
  defineLua(redis, DECIDE, DECIDE_LUA, 3);
  const call = redis as unknown as Scripts;
  return {
    /** Records it, or answers the approval that already stands for its identity (created: false). */
    async create(a: Approval): Promise<{ created: boolean; id: string }> {
      const [created, id] = (await call[CREATE]!(
        approvalKey(a.id),
        approvalIndexKey(a.identity),
        APPROVALS_PENDING_KEY,
        a.id,
        JSON.stringify(a),
        a.expires_at,
        a.expires_at - a.created_at + KEEP_MS,
        a.created_at,
      )) as [number, string];
      return { created: created === 1, id };
    },
    async get(id: string): Promise<Approval | undefined> {
      if (!APPROVAL_ID.test(id)) return undefined;
      return parseApproval(await redis.get(approvalKey(id)));
    },
    /** Pending approvals, soonest expiry first. */
    async pending(now: number): Promise<Approval[]> {
      const ids = await redis.zrangebyscore(APPROVALS_PENDING_KEY, now + 1, '+inf');
      if (ids.length === 0) return [];
      const raws = await redis.mget(...ids.map(approvalKey));
      return raws.map(parseApproval).filter((a): a is Approval => a !== undefined && effectiveStatus(a, now) === 'pending');
    },
    async decide(id: string, d: DecideArgs): Promise<{ verdict: DecideVerdict; approval?: Approval }> {
      const [verdict, raw] = (await call[DECIDE]!(
        approvalKey(id),
        APPROVALS_PENDING_KEY,
        // The index is named by the record; its key is only known once it is read.
        approvalIndexKey((await this.get(id))?.identity ?? id),
        d.action,
        d.by,
        d.owner,
        d.credential,
        d.reason,
        d.now,
        KEEP_MS,
        d.coalesced ? 1 : 0,
      )) as [DecideVerdict, string];
      return { verdict, ...(raw ? { approval: parseApproval(raw) } : {}) };
    },
  };
}
