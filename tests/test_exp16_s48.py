"""Session 48: llama_rows.c's sixteen-lane exponential (exp16: SiLU in the C pass, the AMX
attention's softmax) gives exp8's value in every lane, bit for bit, so a machine's C pass keeps the
bits it had (rows past the last multiple of 16 still go through exp8, and the AVX2 build only has
exp8). Oracle: exp8 itself, compiled from the same source into a small harness with random
finite values, the clamp ends, infinities, NaN, denormals and signed zeros."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from engine import native

HERE = Path(native.__file__).resolve().parent


def _avx512() -> bool:
    try:
        flags = next(ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags")).split()
    except (OSError, StopIteration):
        return False
    return {"avx512f", "avx512dq", "avx2", "fma"} <= set(flags)


HARNESS = r"""
#include "llama_rows.c"
#include <stdio.h>
int main(void) {
#ifndef LR_V512
    puts("no-v512");
    return 0;
#else
    uint32_t st = 12345;
    long bad = 0, n = 0;
    float xs[16], a[16], b[16];
    const float edge[16] = {-INFINITY, INFINITY, NAN, -87.3365f, 88.7228f, 1e-40f, -0.0f, 0.0f,
                            -1e30f, 1e30f, -87.3366f, 88.7229f, -1e-45f, 0.5f, -103.0f, 89.0f};
    for (long it = 0; it < 300000; it++) {
        for (int i = 0; i < 16; i++) {
            st = st * 1664525u + 1013904223u;
            uint32_t u = st;
            float f;
            if (it % 4 == 0) memcpy(&f, &u, 4); /* any bit pattern */
            else f = ((int32_t)u / 2147483648.0f) * (it % 4 == 1 ? 100.0f : 10.0f);
            xs[i] = it == 0 ? edge[i] : f;
        }
        _mm256_storeu_ps(a, exp8(_mm256_loadu_ps(xs)));
        _mm256_storeu_ps(a + 8, exp8(_mm256_loadu_ps(xs + 8)));
        _mm512_storeu_ps(b, exp16(_mm512_loadu_ps(xs)));
        for (int i = 0; i < 16; i++, n++)
            if (memcmp(a + i, b + i, 4)) {
                if (bad < 3) printf("x=%a exp8 %a exp16 %a\n", xs[i], a[i], b[i]);
                bad++;
            }
    }
    printf("%ld %ld\n", n, bad);
    return 0;
#endif
}
"""


@pytest.mark.skipif(shutil.which("cc") is None or not _avx512(), reason="needs a C compiler and AVX-512F/DQ")
def test_exp16_is_exp8_in_every_lane(tmp_path):
    src = tmp_path / "exp16_check.c"
    src.write_text(HARNESS)
    exe = tmp_path / "exp16_check"
    others = [str(HERE / s) for s in native.SOURCES if s != "llama_rows.c"]  # what llama_rows.c links against
    r = subprocess.run(["cc", "-O2", "-march=native", "-std=gnu11", f"-I{HERE}", "-o", str(exe), str(src), *others,
                        "-lm", "-lpthread", "-fopenmp"], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120).stdout.strip()
    if out == "no-v512":
        pytest.skip("this build of llama_rows.c has no sixteen-lane path")
    lanes, bad = (int(x) for x in out.splitlines()[-1].split())
    assert lanes == 300000 * 16
    assert bad == 0, out
