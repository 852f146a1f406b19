import type { Job } from 'bullmq';
import type { Redis } from 'ioredis';
import type { WorkerConfig } from '../src/shared/config.js';
import type { Inventory } from '../src/shared/inventory.js';
import type { Logger } from '../src/shared/logger.js';
import type { KubeConfigFactory } from '../src/shared/kubeconfig.js';

/** What a job handler gets besides its validated data. */
export interface JobContext {
  /** The BullMQ job (id, attempts, updateProgress). */
  job: Pick<Job, 'id' | 'name' | 'attemptsMade' | 'opts' | 'updateProgress'>;
  /** Aborted at the per-attempt deadline (JOB_TIMEOUT_SECONDS) or when the worker shuts down. */
  signal: AbortSignal;
  /** Bound to job id and name. */
  logger: Logger;
  config: WorkerConfig;
  inventory: Inventory;
  /** The worker's Redis connection (for idempotency records). */
  redis: Redis;
  kubeConfig: KubeConfigFactory;
}

export type Handler<D> = (data: D, ctx: JobContext) => Promise<unknown>;
