import type { Request } from 'express';
import type { z } from 'zod';
import { parseJson } from '../middleware/body.js';
import { UnprocessableError } from '../shared/errors.js';
import { singleValued } from './paging.js';

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
