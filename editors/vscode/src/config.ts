/** Settings -> server initialization options and process environment (no `vscode` import). */

export interface HtamSettings {
  provider: string;
  model: string;
  baseUrl: string;
  steps: number;
  device: string;
  cassette: string;
  minSpeedup: number;
  startAhead: boolean;
}

export interface InitializationOptions {
  provider: string;
  model?: string;
  baseUrl?: string;
  steps: number;
  device: string;
  cassette?: string;
  minSpeedup: number;
  startAhead: boolean;
  allowExecution: boolean;
}

/** Providers whose API key can be kept in SecretStorage, and the variable the server reads. */
export const API_KEY_VARIABLES = {
  anthropic: "ANTHROPIC_API_KEY",
  openai: "OPENAI_API_KEY",
} as const;

export type KeyProvider = keyof typeof API_KEY_VARIABLES;

export const KEY_PROVIDERS = Object.keys(API_KEY_VARIABLES) as KeyProvider[];

export function isKeyProvider(value: string): value is KeyProvider {
  return Object.hasOwn(API_KEY_VARIABLES, value);
}

/** Empty strings mean "the server's default" and are left out. */
export function initializationOptions(
  settings: HtamSettings,
  trusted: boolean,
): InitializationOptions {
  const options: InitializationOptions = {
    provider: settings.provider || "auto",
    steps: settings.steps,
    device: settings.device || "auto",
    minSpeedup: settings.minSpeedup,
    startAhead: settings.startAhead,
    allowExecution: trusted,
  };
  if (settings.model) {
    options.model = settings.model;
  }
  if (settings.baseUrl) {
    options.baseUrl = settings.baseUrl;
  }
  if (settings.cassette) {
    options.cassette = settings.cassette;
  }
  return options;
}

/**
 * The server's environment: the window's, plus keys from SecretStorage. A key the user
 * stored in VS Code wins over the environment's, since storing it was the explicit act.
 */
export function serverEnvironment(
  base: NodeJS.ProcessEnv,
  secrets: Partial<Record<KeyProvider, string>>,
): NodeJS.ProcessEnv {
  const env = { ...base };
  for (const [provider, variable] of Object.entries(API_KEY_VARIABLES)) {
    const key = secrets[provider as KeyProvider];
    if (key) {
      env[variable] = key;
    }
  }
  return env;
}

/**
 * Answers to `workspace/configuration` carry `allowExecution` in the `htam` section, so
 * a server that reads its settings that way sees Workspace Trust too.
 */
export function withTrust(
  sections: readonly (string | undefined)[],
  results: unknown[],
  trusted: boolean,
): unknown[] {
  return results.map((result, index) => {
    if (sections[index] !== "htam" || typeof result !== "object" || result === null) {
      return result;
    }
    return { ...(result as Record<string, unknown>), allowExecution: trusted };
  });
}
