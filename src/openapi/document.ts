import { z } from 'zod';
import { ERROR_CODES, ERROR_CODE_LIST, codesOfStatus, type ErrorCode } from '../shared/errors.js';

/**
 * The OpenAPI 3.1 document, built from the route registry (src/openapi/routes.ts) and the zod
 * schemas the code uses: zod 4 emits JSON Schema 2020-12, OpenAPI 3.1's dialect. Only explicit
 * statuses are documented, never a `default` answer: with one, any status would conform, and the
 * conformance run could not catch an undocumented one.
 */
export interface ResponseDoc {
  description: string;
  /** JSON unless contentType says otherwise; errors default to {detail, code}. */
  schema?: z.ZodType;
  /** An error answer: the codes it can carry; default every code of its status. */
  codes?: readonly ErrorCode[];
  contentType?: string;
  headers?: Record<string, string>;
}

export interface RouteDoc {
  method: 'get' | 'post' | 'delete';
  path: string;
  summary: string;
  description?: string;
  tags: string[];
  /** Alternatives: any one of them authenticates the call. Empty: no authentication. */
  security: string[];
  /** The credential is required only when its secret is configured: anonymous calls are documented too. */
  securityOptional?: boolean;
  pathParams?: z.ZodObject;
  query?: z.ZodObject;
  headers?: z.ZodObject;
  body?: {
    contentTypes: string[];
    schema: z.ZodType;
    required: boolean;
    description?: string;
    /** A content type whose body has another shape than `schema` (GitHub's form encoding: payload=<JSON text>). */
    schemaByType?: Record<string, z.ZodType>;
  };
  responses: Record<number, ResponseDoc>;
}

const detailSchema = z.string().describe('human-readable message; never a secret or a stack trace');

/** `{detail, code}` whose code is one of `codes` (each a code of the catalog). */
export function errorSchemaFor(codes: readonly ErrorCode[]) {
  return z.object({
    detail: detailSchema,
    code: z
      .enum(codes as [ErrorCode, ...ErrorCode[]])
      .describe('the condition, stable (src/shared/errors.ts); components.schemas.Error says what each means'),
  });
}

/** The catalog as a schema: every code, and a table of their statuses and meanings. */
function catalogSchema(): Record<string, unknown> {
  const table = ERROR_CODE_LIST.map((c) => `- \`${c}\` (${ERROR_CODES[c].status}): ${ERROR_CODES[c].meaning}`).join('\n');
  const schema = json(errorSchemaFor(ERROR_CODE_LIST), 'output') as { properties: Record<string, Record<string, unknown>> };
  schema.properties.code = { ...schema.properties.code, description: `The condition, one per code:\n${table}` };
  return schema;
}

/** The codes an error answer documents: its own list, or every code of its status. */
export function responseCodes(status: number, doc: ResponseDoc): readonly ErrorCode[] {
  const codes = doc.codes ?? codesOfStatus(status);
  return codes.length > 0 ? codes : ERROR_CODE_LIST;
}

const SECURITY_SCHEMES: Record<string, Record<string, unknown>> = {
  apiKey: {
    type: 'apiKey',
    in: 'header',
    name: 'X-API-Key',
    description:
      'A key of OPS_API_KEY_ROLES or OPS_API_KEYS_FILE; role readonly or operator (operations marked "operator" answer 403 to a readonly key). ' +
      'A key close to its expiry gets Deprecation and Sunset headers on every answer; an expired key gets 401.',
  },
  bearer: {
    type: 'http',
    scheme: 'bearer',
    description:
      'OPS_BEARER_TOKEN (scheme word case-insensitive; unset: every call 401), or on POST /ops/restart and POST /ops/deploys an OIDC ID token of an issuer of OPS_OIDC_FILE (POST /ops/deploys takes no shared token).',
  },
  basic: { type: 'http', scheme: 'basic', description: 'Browsers: any user name, an operator key as the password.' },
};

const json = (schema: z.ZodType, io: 'input' | 'output'): Record<string, unknown> => {
  const { $schema: _drop, ...rest } = z.toJSONSchema(schema, { io, unrepresentable: 'any' }) as Record<string, unknown>;
  return rest;
};

function parameters(where: 'path' | 'query' | 'header', obj: z.ZodObject | undefined): Array<Record<string, unknown>> {
  if (!obj) return [];
  return Object.entries(obj.shape).map(([name, schema]) => {
    const s = schema as z.ZodType;
    return {
      name,
      in: where,
      // A parameter is required when the schema refuses its absence.
      required: where === 'path' || !s.safeParse(undefined).success,
      ...(s.description ? { description: s.description } : {}),
      schema: json(s, 'input'),
    };
  });
}

export function buildOpenApiDocument(
  routes: readonly RouteDoc[],
  info: { version: string; description: string },
  /** The webhook senders' schemes. */
  schemes: Record<string, Record<string, unknown>> = {},
): Record<string, unknown> {
  const paths: Record<string, Record<string, unknown>> = {};
  for (const r of routes) {
    const responses: Record<string, unknown> = {};
    for (const [status, doc] of Object.entries(r.responses)) {
      const schema = doc.schema ?? (Number(status) >= 400 ? errorSchemaFor(responseCodes(Number(status), doc)) : undefined);
      responses[status] = {
        description: doc.description,
        ...(doc.headers
          ? {
              headers: Object.fromEntries(Object.entries(doc.headers).map(([h, d]) => [h, { description: d, schema: { type: 'string' } }])),
            }
          : {}),
        ...(schema ? { content: { [doc.contentType ?? 'application/json']: { schema: json(schema, 'output') } } } : {}),
      };
    }
    paths[r.path] ??= {};
    paths[r.path]![r.method] = {
      operationId: `${r.method}${r.path.replace(/\{(\w+)\}/g, 'By_$1').replace(/[^A-Za-z0-9]+(.)?/g, (_m, c: string | undefined) => (c ? c.toUpperCase() : ''))}`,
      summary: r.summary,
      ...(r.description ? { description: r.description } : {}),
      tags: r.tags,
      security: [...r.security.map((name) => ({ [name]: [] })), ...(r.securityOptional ? [{}] : [])],
      parameters: [...parameters('path', r.pathParams), ...parameters('query', r.query), ...parameters('header', r.headers)],
      ...(r.body
        ? {
            requestBody: {
              required: r.body.required,
              ...(r.body.description ? { description: r.body.description } : {}),
              content: Object.fromEntries(
                r.body.contentTypes.map((t) => [t, { schema: json(r.body!.schemaByType?.[t] ?? r.body!.schema, 'input') }]),
              ),
            },
          }
        : {}),
      responses,
    };
  }
  return {
    openapi: '3.1.0',
    info: { title: 'opsgate', version: info.version, description: info.description },
    jsonSchemaDialect: 'https://json-schema.org/draft/2020-12/schema',
    components: { securitySchemes: { ...SECURITY_SCHEMES, ...schemes }, schemas: { Error: catalogSchema() } },
    paths,
  };
}

/** "GET /ops/jobs/{id} 404"-style keys of every documented answer (for the coverage test). */
export function documentedStatuses(routes: readonly RouteDoc[]): string[] {
  return routes.flatMap((r) => Object.keys(r.responses).map((s) => `${r.method.toUpperCase()} ${r.path} ${s}`));
}
