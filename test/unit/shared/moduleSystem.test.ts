import { describe, expect, it } from '@jest/globals';
import * as k8s from '@kubernetes/client-node';
import { Queue } from 'bullmq';
import express from 'express';

describe('module system', () => {
  it('loads ESM-only and CJS dependencies together', () => {
    expect(typeof k8s.KubeConfig).toBe('function');
    expect(typeof Queue).toBe('function');
    expect(typeof express).toBe('function');
  });
});
