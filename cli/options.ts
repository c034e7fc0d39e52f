// Option parsers shared by the commands: every bad value is a UserError naming the flag.

import { InvalidArgumentError } from 'commander';

/** a count flag's largest value: every count lfc takes fits an int32 */
const MAX_COUNT = 2 ** 31 - 1;

export function positiveInt(flag: string) {
  return (v: string): number => {
    const n = Number(v);
    if (!/^\s*\d+\s*$/.test(v) || !Number.isInteger(n) || n < 1) {
      throw new InvalidArgumentError(`${flag} must be a positive integer, got '${v}'`);
    }
    if (n > MAX_COUNT) throw new InvalidArgumentError(`${flag} ${v.trim()} is past ${MAX_COUNT}`);
    return n;
  };
}

export function imageSize(v: string): [number, number] {
  const m = /^(\d+)(?:x(\d+))?$/.exec(v.trim());
  if (!m) throw new InvalidArgumentError(`--image-size must be HxW or N pixels, got '${v}'`);
  const h = Number(m[1]);
  const w = m[2] ? Number(m[2]) : h;
  if (h < 1 || w < 1) throw new InvalidArgumentError(`--image-size must be positive, got '${v}'`);
  return [h, w];
}

export function positiveNumber(flag: string) {
  return (v: string): number => {
    const n = Number(v);
    if (v.trim() === '' || !Number.isFinite(n) || n <= 0) {
      throw new InvalidArgumentError(`${flag} must be a positive number, got '${v}'`);
    }
    return n;
  };
}

export function nonNegativeInt(flag: string) {
  return (v: string): number => {
    const n = Number(v);
    if (!/^\s*\d+\s*$/.test(v) || !Number.isInteger(n) || n < 0) {
      throw new InvalidArgumentError(`${flag} must be a non-negative integer, got '${v}'`);
    }
    return n;
  };
}

export function nonNegativeNumber(flag: string) {
  return (v: string): number => {
    const n = Number(v);
    if (v.trim() === '' || !Number.isFinite(n) || n < 0) {
      throw new InvalidArgumentError(`${flag} must be a non-negative number, got '${v}'`);
    }
    return n;
  };
}

export function atLeastOne(flag: string) {
  return (v: string): number => {
    const n = Number(v);
    if (v.trim() === '' || !Number.isFinite(n) || n < 1)
      throw new InvalidArgumentError(`${flag} must be a number ≥ 1, got '${v}'`);
    return n;
  };
}
