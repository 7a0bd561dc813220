"""The target's verify pass at 1-8 rows (engine/costmodel.measure, median of 9), three rounds, bf16.

    .venv/bin/python bench/results/2026-11-28-session35/scripts/tn.py
"""
import sys
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[4]))
from engine.session import ChatSession
from engine import costmodel
s = ChatSession.load(drafter="none", strategy="ar", dtype="bf16")
import os
for r in range(int(os.environ.get("ROUNDS", "3"))):
    pts = costmodel.measure(getattr(s.target, "model", s.target), sizes=(1, 2, 3, 4, 5, 6, 7, 8), repeats=9)
    t1 = pts[1]
    print(" ".join(f"{n}:{v:.2f}({v/t1:.2f})" for n, v in pts.items()), flush=True)
