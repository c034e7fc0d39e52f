// The C++ CPU kernels' own checks (runtime-native/test/kernel_check.cc): every backward against
// central finite differences in double, every optimized kernel against its plain reference,
// AdamW against its formula. Built by `npm test`'s setup step; this runs it and reads its lines.
import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { projectRoot } from '../../compiler/paths.js';
import { chooseOpenblasKernel } from '../../runtime/blas.js';

const exe = join(projectRoot(), 'runtime-native/build/kernel-test/kernel_check');
// the kernels run under the OpenBLAS kernels lfc chooses for this CPU (runtime/blas.ts): a wrong
// choice fails here
const env = { ...process.env };
const choice = chooseOpenblasKernel(env);

describe('C++ kernel checks', () => {
  it('all pass', () => {
    expect(existsSync(exe), `${exe} is not built (npm test builds it in its setup step)`).toBe(
      true,
    );
    let out: string;
    let code = 0;
    try {
      out = execFileSync(exe, { encoding: 'utf8', timeout: 120_000, env });
    } catch (e) {
      const err = e as { status: number; stdout: string };
      code = err.status;
      out = err.stdout;
    }
    const lines = out.split('\n').filter((l) => /PASS|FAIL/.test(l));
    const failed = lines.filter((l) => /FAIL/.test(l));
    expect(failed).toEqual([]);
    expect(code).toBe(0);
    const core = /^OpenBLAS core: (\S+)/m.exec(out)?.[1];
    if (choice.coretype) expect(core?.toLowerCase()).toBe(choice.coretype.toLowerCase());
    // finite-difference checks of every differentiable kernel family are among them
    for (const family of [
      'linear',
      'grouped_linear',
      'layernorm',
      'rmsnorm',
      'embedding',
      'gelu',
      'swiglu',
      'rope',
      'attention',
      'router_topk',
      'moe_permute',
      'moe_permute capacity',
      'moe_unpermute',
      'moe_unpermute capacity',
      'moe_aux_loss',
      'cross_entropy',
      'merge_visual',
      'gather_rows',
    ]) {
      expect(
        lines.some((l) => l.includes(family) && /fd|finite/i.test(l)),
        `no finite-difference check for ${family}`,
      ).toBe(true);
    }
    expect(lines.some((l) => /adamw/i.test(l))).toBe(true);
  });
});
