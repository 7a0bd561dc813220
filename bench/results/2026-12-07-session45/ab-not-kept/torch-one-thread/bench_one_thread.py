import sys
import engine  # sets OMP_WAIT_POLICY before torch loads
import torch
from engine import native, cli
n = torch.get_num_threads()
native.threads = lambda: n
torch.set_num_threads(1)
sys.exit(cli.main(sys.argv[1:]))
