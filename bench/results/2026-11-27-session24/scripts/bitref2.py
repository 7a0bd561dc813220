import sys; sys.path.insert(0, "/work/main"); import engine
import torch
from engine import native
native.lib().llama_rows_set_split(int(sys.argv[2]))
sys.argv = [sys.argv[0], sys.argv[1], "cmp"]
exec(open("/tmp/s24/bitref.py").read().split("import torch\n", 1)[1])
