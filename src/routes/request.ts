import type { Request, RequestHandler, Router } from 'express';
import type { RouteParameters } from 'express-serve-static-core';
import { z } from 'zod';
import { parseJson } from '../middleware/body.js';
import { methodNotAllowed } from '../middleware/errors.js';
import { UnprocessableError } from '../shared/errors.js';

/** The 422 for a query or body that fails its schema: the first issue, named by its field. Every router answers bad input through it. */
function invalidInput(error: z.ZodError, what: 'query parameter' | 'body field'): UnprocessableError {
  const issue = error.issues[0]!;
  return new UnprocessableError(
    `invalid ${what} ${issue.path.join('.')}: ${issue.message}`.replace(/ {2,}/g, ' '),
    what === 'query parameter' ? 'invalid_query' : 'invalid_body',
  );
}

/** A list's query: each parameter given once, then its schema; a 422 otherwise. */
export function parseQuery<S extends z.ZodType>(schema: S, query: Record<string, unknown>): z.output<S> {
  singleValued(query);
  const q = schema.safeParse(query);
  if (!q.success) throw invalidInput(q.error, 'query parameter');
  return q.data;
}

/** A request's JSON body (read by rawBody) through its schema; an empty body stands for `empty` when given, else it is refused. */
export function parseBody<S extends z.ZodType>(req: Request, schema: S, empty?: object): z.output<S> {
  const raw = req.body as Buffer;
  const parsed = schema.safeParse(raw.length === 0 && empty ? empty : parseJson(raw));
  if (parsed.success) return parsed.data;
  const issue = parsed.error.issues[0]!;
  if (issue.code === 'unrecognized_keys')
    throw new UnprocessableError(`invalid body: unknown field ${issue.keys.join(', ')}`, 'invalid_body');
  throw invalidInput(parsed.error, 'body field');
}

/** A route that answers one method: any other gets 405 with Allow (OPTIONS: 204). */
export function only<P extends string>(
  r: Router,
  method: 'get' | 'post' | 'delete',
  path: P,
  ...handlers: Array<RequestHandler<RouteParameters<P>>>
): void {
  const route = r.route(path);
  route[method](...handlers).all(methodNotAllowed([method.toUpperCase()]));
}

/**
 * Paging: a cursor (base64url JSON) names its list and carries its query's filters, so one given
 * with other filters is refused (422) rather than read as a position in another list. Lists read
 * whole page by their order's key: an item that leaves between two pages moves no other item.
 */

/** A list's order: a number, then a string that makes every item's key unique. */
type SortKey = readonly [number, string];

export const sortKeySchema = z.tuple([z.number(), z.string().max(512)]);

/** `limit` and `cursor`, for a list's query schema. */
export function pageQueryShape(defaultLimit: number, maxLimit: number) {
  return {
    limit: z.coerce.number().int().min(1).max(maxLimit).default(defaultLimit).describe('items per page'),
    cursor: z
      .string()
      .min(1)
      .max(2048)
      .optional()
      .describe('the `next_cursor` of the previous page (opaque); it carries the filters of that query'),
  };
}

/** The `next_cursor` every list answers. */
export const nextCursorSchema = z.string().nullable().describe('pass as `cursor` for the next page; null on the last page');

const invalidCursor = (detail: string) => new UnprocessableError(detail, 'invalid_cursor');

/** A cursor's JSON, or undefined when it is none. */
export function cursorJson(cursor: string): unknown {
  try {
    return JSON.parse(Buffer.from(cursor, 'base64url').toString('utf8'));
  } catch {
    return undefined;
  }
}

/** A next page's cursor: the list, the position after this page and the filters of its query (unset ones left out). */
export function encodeCursor(list: string, position: number | string | SortKey, filters: Record<string, string | undefined> = {}): string {
  const f = Object.fromEntries(Object.entries(filters).filter((e): e is [string, string] => e[1] !== undefined));
  return Buffer.from(JSON.stringify({ l: list, p: position, f }), 'utf8').toString('base64url');
}

/** A cursor of `list` read back: its position and its filters, to be used in place of the query's (which must match: 422 otherwise). */
export function decodeCursor<P>(
  list: string,
  cursor: string,
  position: z.ZodType<P>,
  given: Record<string, string | undefined> = {},
): { position: P; filters: Record<string, string> } {
  const parsed = z.object({ l: z.literal(list), p: position, f: z.record(z.string(), z.string()) }).safeParse(cursorJson(cursor));
  if (!parsed.success) throw invalidCursor('cursor is not a next_cursor of this list');
  const filters = parsed.data.f;
  for (const [name, value] of Object.entries(given)) {
    if (value !== undefined && (filters[name] ?? '') !== value) {
      throw invalidCursor(`cursor continues another query (${name}); give it alone, or with the filters of the query that answered it`);
    }
  }
  return { position: parsed.data.p, filters };
}

/** A query parameter given twice (an array) is refused, as a list reads each once. */
export function singleValued(query: Record<string, unknown>): void {
  const repeated = Object.entries(query).find(([, v]) => typeof v !== 'string');
  if (repeated) throw new UnprocessableError(`query parameter "${repeated[0]}" must be given once, as a string`, 'invalid_query');
}

const compare = (a: SortKey, b: SortKey): number => a[0] - b[0] || (a[1] < b[1] ? -1 : a[1] > b[1] ? 1 : 0);

/** One page of a list held in memory, in ascending order of `keyOf`: `limit` items after the cursor's key. */
export function keysetPage<T>(
  list: string,
  items: readonly T[],
  keyOf: (item: T) => SortKey,
  query: { limit: number; cursor?: string | undefined },
): { items: T[]; next_cursor: string | null } {
  const after = query.cursor === undefined ? undefined : decodeCursor(list, query.cursor, sortKeySchema).position;
  const rest = items
    .map((item) => ({ item, key: keyOf(item) }))
    .sort((a, b) => compare(a.key, b.key))
    .filter((e) => after === undefined || compare(e.key, after) > 0);
  const page = rest.slice(0, query.limit);
  const last = page.at(-1);
  return { items: page.map((e) => e.item), next_cursor: rest.length > page.length && last ? encodeCursor(list, last.key) : null };
}
