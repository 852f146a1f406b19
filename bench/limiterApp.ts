/**
 * In `make bench`: the rate limiter alone, in front of the smallest webhook
 * handler (express.json() + 202), on the API's own request-profile Redis connection. LIMITER:
 * - "hand": src/middleware/rateLimit.ts over src/api/rateLimit.ts (its Lua INCR + PEXPIRE, fail open), as the
 *   API mounts it;
 * - "rlf": rate-limiter-flexible's RateLimiterRedis with a RateLimiterMemory insurance limiter
 *   (fail open to the in-process count, as this service chose), 429 when it rejects.
 * Both with a limit never reached. Listens on 127.0.0.1:$PORT, Redis at $REDIS_URL.
 */
import express, { type RequestHandler } from 'express';
import { RateLimiterMemory, RateLimiterRedis, RateLimiterRes } from 'rate-limiter-flexible';
import { createRateLimiter } from '../src/middleware/rateLimit.js';
import { createRedis } from '../src/shared/redis.js';

const redis = createRedis(process.env.REDIS_URL!, 'request', 'bench-limiter');
const RPS = 1_000_000;
let limiter: RequestHandler;
if (process.env.LIMITER === 'rlf') {
  const rl = new RateLimiterRedis({
    storeClient: redis,
    keyPrefix: 'opsgate:rlf',
    points: RPS,
    duration: 1,
    insuranceLimiter: new RateLimiterMemory({ points: RPS, duration: 1 }),
  });
  limiter = (req, res, next) => {
    rl.consume(req.ip ?? 'unknown').then(
      () => next(),
      (rej: unknown) => {
        if (rej instanceof RateLimiterRes) {
          res
            .set('Retry-After', String(Math.max(1, Math.ceil(rej.msBeforeNext / 1000))))
            .status(429)
            .json({ detail: 'too many requests; slow down' });
        } else next(); // fail open
      },
    );
  };
} else {
  limiter = createRateLimiter({ redis, rps: RPS });
}

const app = express();
app.disable('x-powered-by');
app.use(limiter);
app.post('/webhook/scm', express.json({ limit: '2mb' }), (req, res) => {
  const body = req.body as { checkout_sha?: unknown };
  res.status(202).json({ accepted: true, duplicate: false, event_id: typeof body.checkout_sha === 'string' ? body.checkout_sha : '' });
});
const port = Number(process.env.PORT ?? 0);
const server = app.listen(port, '127.0.0.1', () => {
  process.stdout.write(`limiter ${process.env.LIMITER} listening on ${JSON.stringify(server.address())}\n`);
});
process.on('SIGTERM', () => server.close(() => process.exit(0)));
