/**
 * Job data parsed once: what parseJobData answers is known to the producer as parsed (it adds it
 * without a second parse of the same schema); anything else, an equal copy included, is parsed.
 */
import { describe, expect, it } from '@jest/globals';
import { isParsedJobData, JOB, parseJobData } from '../../../src/shared/jobs.js';

const alert = { alertname: 'Disk', annotations: { summary: 's' }, fingerprint: 'fp-1', audit_id: 'a-1', requested_by: 'webhook:alerts' };

describe('parseJobData', () => {
  it("marks a success's data as parsed, and only that object", () => {
    const parsed = parseJobData(JOB.notifyOncall, alert);
    expect(parsed.success).toBe(true);
    if (!parsed.success) return;
    expect(parsed.data).toEqual(alert);
    expect(isParsedJobData(parsed.data)).toBe(true);
    // The input and an equal copy were not the schema's answer: the producer parses them.
    expect(isParsedJobData(alert)).toBe(false);
    expect(isParsedJobData({ ...parsed.data })).toBe(false);
  });

  it("answers the schema's failure and marks nothing", () => {
    const bad = { ...alert, alertname: 42 };
    const parsed = parseJobData(JOB.notifyOncall, bad);
    expect(parsed.success).toBe(false);
    expect(isParsedJobData(bad)).toBe(false);
    expect(isParsedJobData(undefined)).toBe(false);
    expect(isParsedJobData('text')).toBe(false);
  });

  it("parses against the named job's schema", () => {
    const deploy = {
      project: 'g/app',
      ref: 'refs/heads/main',
      sha: 'abc',
      event_id: 'scm:g/app:refs/heads/main:abc',
      audit_id: 'a',
      requested_by: 'b',
    };
    expect(parseJobData(JOB.runDeployPipeline, deploy).success).toBe(true);
    expect(parseJobData(JOB.notifyOncall, deploy).success).toBe(false);
  });
});
