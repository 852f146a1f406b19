import { describe, expect, it } from '@jest/globals';
import { credentialId, secretsMatcher, sha256Hex } from '../../../src/shared/crypto.js';

describe('secretsMatcher', () => {
  it.each([
    ['abc', 'abc', true],
    ['abc', 'abd', false],
    ['abc', 'abcd', false],
    ['', '', true],
    ['', 'a', false],
    ['ключ', 'ключ', true],
  ])('%j vs %j -> %s', (a, b, eq) => {
    expect(secretsMatcher(() => [a])(b) === 0).toBe(eq);
  });
});

describe('credentialId / sha256Hex', () => {
  it('sha256 of the empty string', () => {
    expect(sha256Hex('')).toBe('e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855');
  });
  it('credential id = first 12 hex of SHA-256', () => {
    expect(credentialId('abc')).toBe('ba7816bf8f01');
  });
});
