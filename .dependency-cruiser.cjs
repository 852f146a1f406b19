/**
 * The import layers of opsgate, checked by `make lint-layers`. Arrows point down only:
 *
 *   src/server.ts, src/app.ts        wiring: may import anything below
 *   src/openapi/                     describes the routes (reads their schemas); nothing imports it but the wiring
 *   src/routes/                      HTTP: may use changes, domain, middleware, shared
 *   src/remediation/                 alert-driven remediation: a way into the change pipeline (engine, its store,
 *                                    script and Alertmanager client); its routes.ts is HTTP
 *   src/changes/                     the change pipeline (planner, executor, its stores, scripts and views); its
 *                                    routes (src/changes/<concept>/routes.ts) are HTTP and may use middleware
 *   src/domain/   src/middleware/    intake and operations / request plumbing: shared and sources, never each other
 *   src/sources/                     the webhook senders as data: src/shared only
 *   src/shared/                      the floor: imports nothing of opsgate above it (but the senders' secret list)
 *   worker/                          the other process: src/shared, src/changes and src/remediation (never their routes)
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
      name: 'shared-is-the-floor',
      severity: 'error',
      comment: 'src/shared is used by both processes and imports nothing of opsgate above it.',
      from: { path: '^src/shared/' },
      to: { path: '^(src/(changes|remediation|domain|middleware|routes|openapi)/|src/(app|server)\\.ts$|worker/)' },
    },
    {
      name: 'changes-below-http',
      severity: 'error',
      comment: 'The change pipeline takes values, not HTTP: only its routes know Express plumbing.',
      from: { path: '^src/changes/', pathNot: '/routes\\.ts$' },
      to: { path: '^(src/(middleware|routes|openapi)/|src/(app|server)\\.ts$|worker/|src/changes/.*/routes\\.ts$)' },
    },
    {
      name: 'remediation-below-http',
      severity: 'error',
      comment: 'Remediation takes values, not HTTP: only its routes know Express plumbing; the pipeline never reaches back into it.',
      from: { path: '^src/remediation/', pathNot: '/routes\\.ts$' },
      to: {
        path: '^(src/(middleware|routes|openapi)/|src/(app|server)\\.ts$|worker/|src/remediation/routes\\.ts$|src/changes/.*/routes\\.ts$)',
      },
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
      comment: 'A webhook sender is a declaration over src/shared: it knows nothing of HTTP plumbing, the intake or the routes.',
      from: { path: '^src/sources/' },
      to: { path: '^(src/(domain|middleware|routes|openapi)/|src/(app|server)\\.ts$|worker/)' },
    },
    {
      name: 'domain-below-http',
      severity: 'error',
      comment: 'The domain knows nothing of Express plumbing, routes or their description.',
      from: { path: '^src/domain/' },
      to: { path: '^(src/(middleware|routes|openapi)/|src/(app|server)\\.ts$|worker/)' },
    },
    {
      name: 'middleware-below-routes',
      severity: 'error',
      comment: 'Middleware is request plumbing over src/shared; what it needs of the domain belongs in src/shared.',
      from: { path: '^src/middleware/' },
      to: { path: '^(src/(domain|routes|openapi)/|src/(app|server)\\.ts$|worker/)' },
    },
    {
      name: 'routes-do-not-import-their-description',
      severity: 'error',
      comment: 'src/openapi reads the routes; the routes never import it back.',
      from: { path: '^src/routes/' },
      to: { path: '^(src/openapi/|src/(app|server)\\.ts$|worker/)' },
    },
    {
      name: 'openapi-below-wiring',
      severity: 'error',
      from: { path: '^src/openapi/' },
      to: { path: '^(src/(app|server)\\.ts$|worker/)' },
    },
    {
      name: 'worker-uses-shared-only',
      severity: 'error',
      comment: 'The worker shares src/shared and the change pipeline with the API, and nothing of its HTTP side.',
      from: { path: '^worker/' },
      to: { path: '^src/', pathNot: '^src/(shared|changes|remediation)/' },
    },
    {
      name: 'worker-not-http',
      severity: 'error',
      from: { path: '^worker/' },
      to: { path: '^src/(changes/.*/|remediation/)routes\\.ts$' },
    },
  ],
  options: {
    doNotFollow: { path: 'node_modules' },
    tsConfig: { fileName: 'tsconfig.json' },
    tsPreCompilationDeps: true,
    enhancedResolveOptions: { extensions: ['.ts', '.js'] },
  },
};
