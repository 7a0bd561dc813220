"""specchat's decoding engine (never imports textual)."""

import os

# torch's OpenMP threads spin-wait at the end of every parallel region. When anything else wants
# a core — the TUI redrawing a streamed reply, another process — each of the ~120 GEMVs of a step
# stalls until the spinning thread is preempted: SmolLM2 decoding fell to 3 tok/s from ~30 on
# this 2-core machine with one competing process. Passive waiting sleeps instead. Set before torch
# loads OpenMP; an explicit OMP_WAIT_POLICY in the environment wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
