/**
 * The baseline of `make bench`: a bare Express 5 app that parses the JSON body and answers 202
 * with a small JSON object: the least an Express webhook receiver does. It serves the paths the
 * load uses (/webhook/scm, /webhook/alerts) so every server gets the very same requests.
 * Listens on 127.0.0.1:$PORT.
 */
import express from 'express';

const app = express();
app.disable('x-powered-by');
const json = express.json({ limit: '2mb' });
app.post('/webhook/scm', json, (req, res) => {
  const body = req.body as { checkout_sha?: unknown };
  res.status(202).json({ accepted: true, duplicate: false, event_id: typeof body.checkout_sha === 'string' ? body.checkout_sha : '' });
});
app.post('/webhook/alerts', json, (req, res) => {
  const alerts = (req.body as { alerts?: unknown[] }).alerts ?? [];
  res.status(202).json({ received: alerts.length, firing: alerts.length });
});
const port = Number(process.env.PORT ?? 0);
const server = app.listen(port, '127.0.0.1', () => {
  process.stdout.write(`bare express listening on ${JSON.stringify(server.address())}\n`);
});
process.on('SIGTERM', () => server.close(() => process.exit(0)));
