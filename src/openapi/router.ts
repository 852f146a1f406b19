import { Router } from 'express';
import { methodNotAllowed } from '../middleware/errors.js';
import { buildOpenApiDocument } from './document.js';
import { API_DESCRIPTION, API_ROUTES } from './routes.js';

/** GET /openapi.json (no authentication): the OpenAPI 3.1 document, built once from the route registry. */
export function openapiRouter(deps: { version?: string }): Router {
  const r = Router();
  const doc = JSON.stringify(buildOpenApiDocument(API_ROUTES, { version: deps.version ?? '0.0.0', description: API_DESCRIPTION }));
  r.route('/openapi.json')
    .get((_req, res) => {
      res.type('application/json').send(doc);
    })
    .all(methodNotAllowed(['GET']));
  return r;
}
