import { describe, expect, it } from '@jest/globals';
import { attribute, featureOf, NODE_CORE, type CpuProfile } from '../../../bench/attribution.js';

/** `make bench-profile`'s charging rule (bench/attribution.ts) on a hand-built profile tree. */
const DIST = '/app/dist';
const frame = (functionName: string, url = '') => ({ functionName, url, lineNumber: 0 });

// root -> server handler (node core) -> router next -> observe (ours) -> pino write (library)
//                                                   -> producer (ours) -> queueGuard (helper) -> socket write (native)
//      -> (garbage collector), (idle), ioredis reply parser (no frame of ours above it)
const nodes: CpuProfile['nodes'] = [
  { id: 1, callFrame: frame('(root)'), children: [2, 8, 9, 10] },
  { id: 2, callFrame: frame('parserOnIncoming', 'node:_http_server'), children: [3] },
  { id: 3, callFrame: frame('next', 'file:///app/node_modules/router/index.js'), children: [4, 6] },
  { id: 4, callFrame: frame('done', `file://${DIST}/src/middleware/observe.js`), children: [5] },
  { id: 5, callFrame: frame('write', 'file:///app/node_modules/sonic-boom/index.js') },
  { id: 6, callFrame: frame('add', `file://${DIST}/src/shared/producer.js`), children: [7] },
  { id: 7, callFrame: frame('guard', `file://${DIST}/src/shared/queueGuard.js`), children: [11] },
  { id: 8, callFrame: frame('(garbage collector)') },
  { id: 9, callFrame: frame('(idle)') },
  { id: 10, callFrame: frame('returnReply', 'file:///app/node_modules/ioredis/built/DataHandler.js') },
  { id: 11, callFrame: frame('writeUtf8String') },
];

describe('bench/attribution.ts', () => {
  it('charges library and native work to the innermost feature of ours, helpers to their caller', () => {
    const profile: CpuProfile = {
      nodes,
      startTime: 1_000,
      samples: [5, 11, 11, 3, 8, 9, 10, 2],
      timeDeltas: [10, 20, 20, 5, 7, 100, 3, 4],
    };
    const got = Object.fromEntries(attribute(profile));
    expect(got).toEqual({
      'audit line + metrics': 10, // pino's write under observe
      'Queue#add / addBulk with deduplication (producer, its zod check)': 40, // the socket write under the queue's guard (a helper) under the producer
      'Express routing/dispatch': 5,
      GC: 7,
      [NODE_CORE]: 3 + 4, // reply parsing and the HTTP server's own frame
    }); // idle is left out
  });

  it('counts only the samples inside the window', () => {
    // sample times: 1010, 1030, 1050, 1055
    const profile: CpuProfile = { nodes, startTime: 1_000, samples: [5, 11, 11, 3], timeDeltas: [10, 20, 20, 5] };
    expect(Object.fromEntries(attribute(profile, [1_020, 1_050]))).toEqual({
      'Queue#add / addBulk with deduplication (producer, its zod check)': 40,
    });
  });

  it('names the control and unknown files of ours, and leaves plain library frames to their caller', () => {
    expect(featureOf(frame('h', `file://${DIST}/bench/bench/specMinimum.js`))).toBe('control handler (SET NX, Queue.add, answer)');
    expect(featureOf(frame('h', `file://${DIST}/bench/bench/publicFloor.js`))).toBe('floor handler (Queue#add with deduplication, answer)');
    expect(featureOf(frame('push', `file://${DIST}/src/domain/intake.js`))).toBe('intake: delivery-id alias, version 0.1 records');
    expect(featureOf(frame('record', `file://${DIST}/src/domain/deliveries.js`))).toBe('delivery record (XADD)');
    expect(featureOf(frame('h', `file://${DIST}/src/shared/somethingNew.js`))).toBe('other of ours (src/shared/somethingNew)');
    expect(featureOf(frame('json', 'file:///app/node_modules/express/lib/response.js'))).toBeUndefined();
    expect(featureOf(frame('sha256Hex', `file://${DIST}/src/shared/crypto.js`))).toBeUndefined(); // the body's digest is the body reader's
    expect(featureOf(frame('map', `file://${DIST}/src/sources/gitlab.js`))).toBeUndefined(); // a sender's mapping is its caller's
  });
});
