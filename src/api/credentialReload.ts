import { ConfigError } from '../shared/errors.js';
import type { ApiConfig } from '../api/config.js';
import { API_KEYS_FILE_VAR, expiredKeyWarnings, reloadApiKeys, weakCredentialWarnings } from './apiKeys.js';
import { parseSecretFile } from '../shared/secrets.js';
import type { FileReloader } from '../shared/fileReload.js';
import { OIDC_FILE_VAR, parseOidcFile } from './oidcConfig.js';
import { watchCredentialFile, type CredentialReloadMetrics, type SenderSecrets } from '../shared/liveSecrets.js';
import type { Logger } from '../shared/logger.js';
import { SOURCE_SECRET_ENVS, secretFileVar } from '../sources/index.js';

/**
 * Re-reads config.credentialFiles while the API runs, replacing what each holds in place (the keys of OPS_API_KEY_ROLES stay).
 * Every new value is added to the logger's redaction before it is in use; an invalid file is refused, the last good one stays.
 */
export function watchCredentials(opts: {
  config: Pick<ApiConfig, 'apiKeys' | 'credentialFiles' | 'SECRETS_RELOAD_INTERVAL_MS' | 'OPS_BEARER_TOKEN'> & { oidc?: ApiConfig['oidc'] };
  senderSecrets: SenderSecrets;
  logger: Logger;
  metrics?: CredentialReloadMetrics;
}): FileReloader {
  const { config, senderSecrets, logger, metrics } = opts;
  const intervalMs = config.SECRETS_RELOAD_INTERVAL_MS;
  const envKeys = config.apiKeys.filter((k) => k.source === 'env');
  const secretEnvOf = new Map(SOURCE_SECRET_ENVS.map((env) => [secretFileVar(env), env]));
  const reloaders: FileReloader[] = [];
  for (const file of config.credentialFiles) {
    const watch = <T>(how: Pick<Parameters<typeof watchCredentialFile<T>>[0], 'parse' | 'apply' | 'describe'>) =>
      reloaders.push(watchCredentialFile({ file, intervalMs, logger, metrics, ...how }));
    if (file.variable === API_KEYS_FILE_VAR) {
      watch({
        parse: (text) => reloadApiKeys(text ?? '', envKeys),
        apply(keys) {
          logger.addSecrets(keys.map((k) => k.key ?? k.digest.toString('hex')));
          // In place: every holder of config.apiKeys sees the new set at once.
          config.apiKeys.splice(0, config.apiKeys.length, ...keys);
          const fileKeys = { apiKeys: keys.filter((k) => k.source === 'file'), OPS_BEARER_TOKEN: undefined };
          for (const warning of [...weakCredentialWarnings(fileKeys), ...expiredKeyWarnings(fileKeys)]) logger.warn(warning);
        },
        describe: (keys) => ({ key_ids: keys.filter((k) => k.source === 'file').map((k) => k.id) }),
      });
      continue;
    }
    if (file.variable === OIDC_FILE_VAR && config.oidc) {
      const issuersInUse = config.oidc.issuers;
      watch({
        parse: (text) => parseOidcFile(text ?? ''),
        apply: (issuers) => issuersInUse.splice(0, issuersInUse.length, ...issuers),
        describe: (issuers) => ({ issuers: issuers.map((i) => i.issuer), rules: issuers.reduce((n, i) => n + i.rules.length, 0) }),
      });
      continue;
    }
    const env = secretEnvOf.get(file.variable);
    if (!env) continue;
    watch({
      // Once in use, a secret file that goes away is refused like any invalid one: the last good secret stays.
      parse: (text) => {
        if (text === undefined) throw new ConfigError(file.variable, 'cannot be read (ENOENT)');
        return parseSecretFile(text, file.variable);
      },
      apply(values) {
        logger.addSecrets(values);
        senderSecrets.set(env, values);
      },
      // How many values are in use: 2 while a previous secret is still accepted.
      describe: (values) => ({ values: values.length }),
    });
  }
  return {
    check: async () => void (await Promise.all(reloaders.map((r) => r.check()))),
    close: () => reloaders.forEach((r) => r.close()),
  };
}
