"""torchtitan 0.3's own Llama 3 debug model (dim 256, 16 heads, vocab 2048; needs `pip install torchtitan`), for
`lynx profile examples/torchtitan_llama3.py`: its layers are named as torchtitan names them (tok_embeddings,
layers.N, norm, lm_head), so a plan from this profile applies to torchtitan's model as it is (docs/integrations.md).
On the CPU the inner attention is SDPA: flex attention, torchtitan's default, has no backward there. Its 6 layers
are the debug model's own depth, so `lynx export --to torchtitan` can name `llama3_debugmodel` for it.
"""

import torch

from lynx_planner.integrations.torchtitan import debug_llama3


def lynx_model(batch_size: int = 2, seq_len: int = 64, attention: str = "flash", layers: int = 6):
    torch.manual_seed(0)
    model = debug_llama3(layers=layers)
    tokens = torch.randint(0, 2048, (batch_size, seq_len))
    return model, (tokens,)
