// Types of setup.mjs for the TypeScript that imports it (the benches, the setup test).

export interface PackageRow {
  readonly for: string;
  readonly packages: readonly string[];
}
export const PACKAGES: Readonly<Record<string, PackageRow>>;
export const COMMANDS: Readonly<Record<string, readonly string[]>>;
export const NATIVE_ADDON: string;
export const KERNEL_CHECK: string;
export const root: string;

export class SetupError extends Error {}

export interface SetupOptions {
  root?: string;
  env?: NodeJS.ProcessEnv;
  uid?: number;
  log?: (line: string) => void;
  lockPollMs?: number;
  lockTimeoutMs?: number;
}
export type SetupContext = Required<SetupOptions>;

export function context(options?: SetupOptions): SetupContext;
export function setupFor(command: string, options?: SetupOptions): void;
export function setupOrExit(command: string, options?: SetupOptions): void;
export function ensureDeps(ctx?: SetupContext): void;
export function buildIsStale(ctx?: SetupContext): boolean;
export function ensureBuilt(ctx?: SetupContext): void;
export function vizAppIsStale(ctx?: SetupContext): boolean;
export function ensureVizApp(ctx?: SetupContext): void;
export function missingPackages(features: readonly string[], ctx?: SetupContext): string[];
export function ensurePackages(features: readonly string[], ctx?: SetupContext): void;
export function configured(dir: string): boolean;
export function ensureNative(ctx?: SetupContext): void;
export function ensureKernelCheck(ctx?: SetupContext): void;
export function setupCommandOf(argv: readonly string[]): string;
