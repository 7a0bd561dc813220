"""drafters/byte5/train_state.pt (a distill-train checkpoint) -> an HF directory, for a look mid-run."""
import json, shutil, sys
from pathlib import Path
import torch
from safetensors.torch import save_file
src, init, dst = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
st = torch.load(src / "train_state.pt", map_location="cpu", weights_only=True)
dst.mkdir(parents=True, exist_ok=True)
for f in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
    if (init / f).exists():
        shutil.copy2(init / f, dst / f)
sd = {k: v.to(torch.bfloat16).contiguous() for k, v in st["model"].items() if k != "lm_head.weight"}
save_file(sd, str(dst / "model.safetensors"), metadata={"format": "pt"})
print("step", st["step"], "->", dst)
