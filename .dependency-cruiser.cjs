/**
 * The import layers of opsgate, checked by `make lint-layers`. Arrows point down only:
 *
 *   src/server.ts, src/app.ts        wiring: may import anything below
 *   src/openapi/                     describes the routes (reads their schemas); nothing imports it but the wiring
 *   src/routes/                      every HTTP route: may use changes, remediation, domain, middleware, api, shared
 *   src/middleware/                  request plumbing: api, sources, shared
 *   src/remediation/                 alert-driven remediation: a way into the change pipeline
 *   src/changes/                     the change pipeline (planner, executor, its stores, scripts and views)
 *   src/domain/                      intake and operations
 *   src/sources/                     the webhook senders as data
 *   src/api/                         the API process's own modules that are not HTTP (its queue, dead letters, rate counting,
 *                                    credential reload): never reached from worker/
 *   src/shared/                      what both processes load: every module of it is reached from worker/index.ts
 *   worker/                          the other process: src/shared, src/changes and src/remediation
 *
 * Express is known to src/routes, src/middleware, src/openapi and the wiring only: the domain folders
 * (changes, domain, remediation, sources) take values, not requests.
 */
/** @type {import('dependency-cruiser').IConfiguration} */
module.exports = {
  forbidden: [
    {
      name: 'no-circular',
      severity: 'error',
      comment: 'An import cycle makes load order matter and the layers meaningless.',
      from: {},
      to: { circular: true },
    },
    {
      name: 'express-is-http',
      severity: 'error',
      comment: 'Only the HTTP side (routes, middleware, the OpenAPI router, the wiring) knows Express.',
      from: { pathNot: '^src/(routes|middleware|openapi)/|^src/(app|server)\\.ts$' },
      to: { path: 'node_modules/(@types/)?express/' },
    },
    {
      name: 'nothing-in-src-imports-the-worker',
      severity: 'error',
      comment: 'worker/ is the other process: src/ never depends on it.',
      from: { path: '^src/' },
      to: { path: '^worker/' },
    },
    {
      name: 'shared-is-the-floor',
      severity: 'error',
      comment: "src/shared imports nothing of src/ outside it but the senders' declarations (their secrets' variables).",
      from: { path: '^src/shared/' },
      to: { path: '^src/', pathNot: '^src/(shared|sources)/' },
    },
    {
      name: 'shared-is-used-by-both',
      severity: 'error',
      comment: "A module of src/shared the worker never loads belongs to the API: src/api/ (or its concept's folder).",
      from: { path: '^worker/index\\.ts$' },
      to: { path: '^src/shared/.+\\.ts$', reachable: false },
    },
    {
      name: 'api-is-not-the-worker',
      severity: 'error',
      comment: 'src/api holds what the API process alone loads.',
      from: { path: '^worker/index\\.ts$' },
      to: { path: '^src/api/', reachable: true },
    },
    {
      name: 'api-below-http',
      severity: 'error',
      comment: "The API's own modules take values: no HTTP plumbing, routes or wiring.",
      from: { path: '^src/api/' },
      to: { path: '^src/(changes|remediation|domain|middleware|routes|openapi)/|^src/(app|server)\\.ts$' },
    },
    {
      name: 'domain-folders-below-http',
      severity: 'error',
      comment: 'Every HTTP route lives in src/routes: the domain folders know nothing of routes, middleware or their description.',
      from: { path: '^src/(changes|domain|remediation|sources)/' },
      to: { path: '^src/(middleware|routes|openapi)/|^src/(app|server)\\.ts$' },
    },
    {
      name: 'changes-do-not-remediate',
      severity: 'error',
      comment: 'Remediation is a way into the change pipeline, above it.',
      from: { path: '^src/(changes|domain)/' },
      to: { path: '^src/remediation/' },
    },
    {
      name: 'domain-does-not-plan',
      severity: 'error',
      comment: 'The change pipeline uses the intake; the domain never reaches back into the pipeline.',
      from: { path: '^src/domain/' },
      to: { path: '^src/changes/' },
    },
    {
      name: 'sources-are-data',
      severity: 'error',
      comment: 'A webhook sender is a declaration over src/shared: it knows nothing of the intake, the pipeline or the API.',
      from: { path: '^src/sources/' },
      to: { path: '^src/', pathNot: '^src/(shared|sources)/' },
    },
    {
      name: 'middleware-below-routes',
      severity: 'error',
      comment: 'Middleware is request plumbing over src/api and src/shared; what it needs of the domain belongs in src/shared.',
      from: { path: '^src/middleware/' },
      to: { path: '^src/(domain|changes|remediation|routes|openapi)/|^src/(app|server)\\.ts$' },
    },
    {
      name: 'routes-do-not-import-their-description',
      severity: 'error',
      comment: 'src/openapi reads the routes; the routes never import it back.',
      from: { path: '^src/routes/' },
      to: { path: '^src/openapi/|^src/(app|server)\\.ts$' },
    },
    {
      name: 'openapi-below-wiring',
      severity: 'error',
      from: { path: '^src/openapi/' },
      to: { path: '^src/(app|server)\\.ts$' },
    },
    {
      name: 'worker-uses-shared-and-the-pipeline',
      severity: 'error',
      comment: 'The worker shares src/shared and the change pipeline with the API, and nothing of its HTTP side.',
      from: { path: '^worker/' },
      to: { path: '^src/', pathNot: '^src/(shared|changes|remediation)/' },
    },
  ],
  options: {
    doNotFollow: { path: 'node_modules' },
    tsConfig: { fileName: 'tsconfig.json' },
    tsPreCompilationDeps: true,
    enhancedResolveOptions: { extensions: ['.ts', '.js'] },
  },
};
