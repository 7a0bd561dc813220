"""specchat's decoding engine (never imports textual)."""

import os

# torch's OpenMP threads spin-wait at the end of every parallel region. When anything else wants
# a core — the TUI redrawing a streamed reply, another process — each of the ~120 GEMVs of a step
# stalls until the spinning thread is preempted: SmolLM2 decoding fell to 3 tok/s from ~30 on
# this 2-core machine with one competing process; with passive waits it kept 27. On a quiet
# machine passive waits cost ~13% (31.5 vs 36.4 tok/s), so headless commands (generate, bench,
# distill) switch back to active waits in engine.cli before torch loads — only when the machine
# is idle (< 0.5 cores busy over a short sample, engine.cli.cpu_busy): a 2-thread bench beside one busy process measured 13x noise. An explicit OMP_WAIT_POLICY in the
# environment always wins.
USER_OMP_WAIT_POLICY = os.environ.get("OMP_WAIT_POLICY")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
