"""A diffusion transformer whose time conditioning is served by temb.

    import temb, temb.torch
    client = temb.Client("localhost:50051")
    offload = temb.torch.offload_conditioning(
        pipe.transformer, client=client, model="qwen-image",
        schedule=pipe.scheduler.timesteps)
    image = pipe(prompt).images[0]        # same latents, weights freed

The served conditioning model describes what it stands for in the
transformer (description.py): the embedder whose result it returns, each
block's modulation Linear and the SiLU before it, the additive tables, the
modules with weights its rows already fold in, and where the transformer
hands each of its inputs.  The patch (patch.py) swaps exactly those for
parameter-free stand-ins (modules.py) and releases their weights.  The
embedder's stand-in takes the inputs as the transformer hands them,
captured bit for bit at the described modules' arguments, asks the server
for their rows (at most one call per forward; with a schedule, one call
for all of its steps; state.py keeps the rows in an exact LRU cache), and
returns the embedder's result with the whole answer attached to it; the
SiLU before each modulation Linear becomes a pass-through, so the Linear's
stand-in receives that very tensor and reads its block's slice.

This package is imported by temb.torch (it needs PyTorch); it names no
family: a family's knowledge lives in its description on the server.
"""

from temb._offload.patch import conditioning_modules, offload_conditioning
from temb._offload.state import OffloadedConditioning

__all__ = ["OffloadedConditioning", "conditioning_modules",
           "offload_conditioning"]
