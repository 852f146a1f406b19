import type { z } from 'zod';
import { UnprocessableError } from '../shared/errors.js';
import { singleValued } from './paging.js';

/**
 * The 422 for a query or body that fails its schema: the first issue, named by its field, with the
 * code that says which part of the request was wrong. Every router answers bad input through it.
 */
export function invalidInput(error: z.ZodError, what: 'query parameter' | 'body field'): UnprocessableError {
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
