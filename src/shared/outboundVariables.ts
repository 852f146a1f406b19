/** The optional credential settings of a prefix (PROMETHEUS, ALERTMANAGER), apart from outboundAuth.ts, which reads them. */
export const outboundVariables = (prefix: string, tenant: boolean): string[] => [
  `${prefix}_BEARER_TOKEN`,
  `${prefix}_BEARER_TOKEN_FILE`,
  `${prefix}_BASIC_AUTH_USER`,
  `${prefix}_BASIC_AUTH_PASSWORD`,
  `${prefix}_BASIC_AUTH_PASSWORD_FILE`,
  `${prefix}_TLS_CERT_FILE`,
  `${prefix}_TLS_KEY_FILE`,
  `${prefix}_TLS_CA_FILE`,
  ...(tenant ? [`${prefix}_TENANT`, `${prefix}_TENANT_FILE`, `${prefix}_TENANT_HEADER`] : []),
];

/** The inline secrets of a prefix, for the logger's redaction at start (a file's values are told as they are read). */
export const outboundSecrets = (env: Readonly<Record<string, unknown>>, prefix: string): string[] =>
  [`${prefix}_BEARER_TOKEN`, `${prefix}_BASIC_AUTH_PASSWORD`, `${prefix}_TENANT`]
    .map((v) => env[v])
    .filter((v): v is string => typeof v === 'string' && v.trim() !== '');
