import { Router } from 'express';
import { buildOpenApiDocument } from './document.js';
import { API_DESCRIPTION, API_ROUTES, WEBHOOK_SECURITY_SCHEMES } from './routes.js';
import { ADMIN_BASE_PATH } from '../routes/admin.js';
import { only } from '../routes/request.js';

/** GET /openapi.json (no authentication), built once: /admin/queues only with the admin UI mounted. */
export function openapiRouter(deps: { version?: string; adminUI?: boolean }): Router {
  const r = Router();
  const routes = deps.adminUI ? API_ROUTES : API_ROUTES.filter((route) => !route.path.startsWith(ADMIN_BASE_PATH));
  const doc = JSON.stringify(
    buildOpenApiDocument(routes, { version: deps.version ?? '0.0.0', description: API_DESCRIPTION }, WEBHOOK_SECURITY_SCHEMES),
  );
  only(r, 'get', '/openapi.json', (_req, res) => {
    res.type('application/json').send(doc);
  });
  return r;
}
