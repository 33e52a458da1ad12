"""A diffusion transformer whose time conditioning is served by temb.

    import temb, temb.torch
    client = temb.Client("localhost:50051")
    offload = temb.torch.offload_conditioning(
        pipe.transformer, client=client, model="qwen-image",
        schedule=pipe.scheduler.timesteps)
    image = pipe(prompt).images[0]        # same latents, weights freed

Every timestep-dependent module of the transformer (the time, guidance and
pooled-text embedders, each block's modulation Linear, the output norm's
Linear; for SDXL's UNet its time and added embeddings and every resnet's
time_emb_proj) is replaced, and their parameters are released.  The replaced
embedder asks temb's conditioning model for the step's rows (at most one
call per forward; with a schedule, one call for all of its steps) and
returns the ``temb`` row with the whole answer attached to it; the SiLU
before each modulation Linear becomes a pass-through, so the Linear's
replacement receives that very tensor and reads its block's slice.

A family is a table (_FAMILIES): how its pipeline turns the scheduler's t
(and the guidance scale) into what the embedder receives, and which module
reads which output at which block position.  Where the inputs do not all
reach one module (SDXL's UNet), the table also names parameterless modules
tapped for them and embedders folded into the served temb.

This module is imported by temb.torch (it needs PyTorch).
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import os
import pickle
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

__all__ = ["OffloadedConditioning", "conditioning_modules",
           "offload_conditioning"]

# The attribute of the embedder's output that carries the step's answer.
_ANSWER = "_temb_conditioning"

_DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16",
                torch.float16: "fp16", torch.float64: "fp64"}


# --- families ---------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Slot:
    """A modulation Linear replaced by a lookup: `linear` reads output
    `output` at block position `index` (None: an [N, W] output), and the
    SiLU `silu` before it becomes a pass-through.  `silu` is None where
    that SiLU is shared with other inputs (a UNet resnet's nonlinearity
    also acts on its hidden states): it stays, and the lookup reads the
    embedder's latest answer."""
    linear: str
    silu: Optional[str]
    output: str
    index: Optional[int]


def _adanorm(prefix: str, output: str, index: Optional[int]) -> _Slot:
    # diffusers' AdaLayerNormZero / ...ZeroSingle / ...Continuous /
    # SD35AdaLayerNormZeroX all compute self.linear(self.silu(emb)).
    return _Slot(f"{prefix}.linear", f"{prefix}.silu", output, index)


def _qwen_slots(model: torch.nn.Module) -> List[_Slot]:
    slots = []
    for i in range(len(model.transformer_blocks)):
        for stream in ("img", "txt"):
            prefix = f"transformer_blocks.{i}.{stream}_mod"
            slots.append(_Slot(f"{prefix}.1", f"{prefix}.0",
                               f"{stream}_mod", i))
    slots.append(_adanorm("norm_out", "norm_out", None))
    return slots


def _flux_slots(model: torch.nn.Module) -> List[_Slot]:
    slots = []
    for i in range(len(model.transformer_blocks)):
        slots.append(_adanorm(f"transformer_blocks.{i}.norm1", "img_mod", i))
        slots.append(_adanorm(f"transformer_blocks.{i}.norm1_context",
                              "txt_mod", i))
    for i in range(len(model.single_transformer_blocks)):
        slots.append(_adanorm(f"single_transformer_blocks.{i}.norm",
                              "single_mod", i))
    slots.append(_adanorm("norm_out", "norm_out", None))
    return slots


def _sd3_slots(model: torch.nn.Module) -> List[_Slot]:
    # Each stacked output holds its blocks in increasing block index, so a
    # block's position is its rank among the blocks of its own kind
    # (docs/conditioning.md, "Outputs and layouts").
    slots = []
    plain = dual = text = 0
    for i, block in enumerate(model.transformer_blocks):
        if type(block.norm1).__name__ == "SD35AdaLayerNormZeroX":
            slots.append(_adanorm(f"transformer_blocks.{i}.norm1",
                                  "img_mod_dual", dual))
            dual += 1
        else:
            slots.append(_adanorm(f"transformer_blocks.{i}.norm1",
                                  "img_mod", plain))
            plain += 1
        if block.context_pre_only:
            slots.append(_adanorm(f"transformer_blocks.{i}.norm1_context",
                                  "txt_mod_last", None))
        else:
            slots.append(_adanorm(f"transformer_blocks.{i}.norm1_context",
                                  "txt_mod", text))
            text += 1
    slots.append(_adanorm("norm_out", "norm_out", None))
    return slots


def _t_over_1000(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # Qwen-Image's pipeline: t.to(dtype) / 1000, passed as `timestep`; the
    # model's .to(hidden_states.dtype) is then a no-op.
    return t.to(dtype) / 1000


def _t_flux(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # FLUX.1's pipeline divides as Qwen-Image's; the model multiplies back
    # in its dtype before time_text_embed.
    return _t_over_1000(t, dtype).to(dtype) * 1000


def _t_as_is(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # SD3's pipeline passes the scheduler's float32 t, never cast.
    return t.to(torch.float32)


def _guidance_flux(g: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # The pipeline's float32 scale, .to(dtype) * 1000 in the model.
    return g.to(dtype) * 1000


@dataclasses.dataclass(frozen=True)
class _Family:
    name: str
    # The replaced embedder's forward arguments, in diffusers' order
    # ("timestep", "guidance", "pooled", or "-" for one it ignores).
    arguments: Tuple[str, ...]
    # Scheduler t -> the timestep the embedder receives, and the factor
    # between them (embedder value ~= t * factor), for going back.
    timestep: Callable[[torch.Tensor, torch.dtype], torch.Tensor]
    timestep_factor: float
    slots: Callable[[torch.nn.Module], List[_Slot]]
    guidance: Optional[Callable[[torch.Tensor, torch.dtype],
                                torch.Tensor]] = None
    guidance_factor: float = 1.0
    # The module replaced by the embedder (FLUX.2: time_guidance_embed,
    # HunyuanVideo-1.5: time_embed, the UNet: add_embedding).
    embedder: str = "time_text_embed"
    # Parameterless modules that receive one of the served inputs before
    # the embedder runs, where the embedder's own arguments lack it (the
    # UNet's time_proj gets t, its add_time_proj the flattened time ids):
    # each is wrapped to record that input for the embedder.
    taps: Tuple[Tuple[str, str], ...] = ()
    # Modules with weights whose output the model adds to the embedder's
    # (the UNet's time_embedding): the served temb already holds it, so they
    # return zeros.
    folded: Tuple[str, ...] = ()
    # The embedder's "pooled" argument holds the pooled row in its first
    # pooled_width(model) columns (the UNet's add_embedding receives
    # [text_embeds, sinusoids of the time ids]); None: all of it.
    pooled_width: Optional[Callable[[torch.nn.Module], int]] = None


_QWEN = _Family("qwen-image", ("timestep", "-", "-"), _t_over_1000, 1e-3,
                _qwen_slots)
_FLUX_DEV = _Family("flux.1-dev", ("timestep", "guidance", "pooled"),
                    _t_flux, 1.0, _flux_slots, _guidance_flux, 1000.0)
_FLUX_SCHNELL = _Family("flux.1-schnell", ("timestep", "pooled"), _t_flux,
                        1.0, _flux_slots)
_SD3 = _Family("sd3", ("timestep", "pooled"), _t_as_is, 1.0, _sd3_slots)


# FLUX.2, HunyuanVideo-1.5 and SDXL's UNet.

def _flux2_slots(model: torch.nn.Module) -> List[_Slot]:
    # One Flux2Modulation per stream, shared by every block of its kind:
    # its output has no block axis.  Flux2Modulation names its SiLU act_fn.
    slots = [_Slot(f"{prefix}.linear", f"{prefix}.act_fn", output, None)
             for prefix, output in (
                 ("double_stream_modulation_img", "img_mod"),
                 ("double_stream_modulation_txt", "txt_mod"),
                 ("single_stream_modulation", "single_mod"))]
    slots.append(_adanorm("norm_out", "norm_out", None))
    return slots


def _hunyuan_video15_slots(model: torch.nn.Module) -> List[_Slot]:
    # The main path only: the token refiner (context_embedder) embeds t
    # with the prompt's masked mean, which the conditioning model does not
    # serve, so it keeps its own time embedding and modulations.
    slots = []
    for i in range(len(model.transformer_blocks)):
        slots.append(_adanorm(f"transformer_blocks.{i}.norm1", "img_mod", i))
        slots.append(_adanorm(f"transformer_blocks.{i}.norm1_context",
                              "txt_mod", i))
    slots.append(_adanorm("norm_out", "norm_out", None))
    return slots


def _unet_slots(model: torch.nn.Module) -> List[_Slot]:
    # Every ResnetBlock2D's time_emb_proj, one output per down/up block and
    # the mid block, [N, resnets, C].  The resnet's nonlinearity also acts
    # on its hidden states, so it stays (silu None).
    levels = [f"down_blocks.{b}" for b in range(len(model.down_blocks))]
    levels.append("mid_block")
    levels += [f"up_blocks.{b}" for b in range(len(model.up_blocks))]
    slots = []
    for level in levels:
        for j in range(len(model.get_submodule(level).resnets)):
            slots.append(_Slot(f"{level}.resnets.{j}.time_emb_proj", None,
                               level, j))
    return slots


def _t_hunyuan_video15(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # HunyuanVideo-1.5's pipeline: t.to(latents' dtype), at the 0..1000
    # scale, and the model embeds it as it comes.
    return t.to(dtype)


def _unet_pooled_width(model: torch.nn.Module) -> int:
    # add_embedding's input: the pooled text embedding, then one sinusoid
    # of addition_time_embed_dim per time id (6 for SDXL, as served).
    return (model.add_embedding.linear_1.in_features
            - 6 * model.config.addition_time_embed_dim)


# FLUX.2's pipelines pass t and the guidance as FLUX.1's do; klein passes
# guidance=None.
_FLUX2_DEV = _Family("flux.2-dev", ("timestep", "guidance"), _t_flux, 1.0,
                     _flux2_slots, _guidance_flux, 1000.0,
                     embedder="time_guidance_embed")
_FLUX2_KLEIN = _Family("flux.2-klein", ("timestep", "-"), _t_flux, 1.0,
                       _flux2_slots, embedder="time_guidance_embed")
# time_embed(timestep, timestep_r): timestep_r only with use_meanflow,
# which is refused.
_HUNYUAN_VIDEO15 = _Family("hunyuanvideo-1.5", ("timestep", "-"),
                           _t_hunyuan_video15, 1.0, _hunyuan_video15_slots,
                           embedder="time_embed")
# The UNet computes emb = time_embedding(time_proj(t)) + add_embedding(
# [text_embeds, add_time_proj(time_ids)]) inline in its forward.  The
# embedder is add_embedding, the last of them: it receives the pooled row,
# and taps on the two parameterless projections give it t and the time ids;
# time_embedding returns zeros, so the sum is the served temb.  The
# pipeline passes the scheduler's t as it is (float32 in the sinusoid).
_SDXL_UNET = _Family("sdxl-unet", ("pooled",), _t_as_is, 1.0, _unet_slots,
                     embedder="add_embedding",
                     taps=(("time_proj", "timestep"),
                           ("add_time_proj", "time_ids")),
                     folded=("time_embedding",),
                     pooled_width=_unet_pooled_width)

# The UNet config values whose other settings change emb and that the
# conditioning model refuses (server/models/families.cc).
_UNET_REQUIRED = {"addition_embed_type": "text_time",
                  "time_embedding_type": "positional",
                  "time_cond_proj_dim": None, "class_embed_type": None,
                  "num_class_embeds": None, "time_embedding_act_fn": None,
                  "timestep_post_act": None, "resnet_skip_time_act": False}


def _family_of(model: torch.nn.Module) -> _Family:
    name = type(model).__name__
    config = getattr(model, "config", {})
    if name == "QwenImageTransformer2DModel":
        for flag in ("use_additional_t_cond", "zero_cond_t",
                     "guidance_embeds"):
            if config.get(flag):
                raise ValueError(
                    f"offload_conditioning: QwenImageTransformer2DModel with "
                    f"{flag}=True is not served by temb's conditioning models")
        return _QWEN
    if name == "FluxTransformer2DModel":
        return _FLUX_DEV if config.get("guidance_embeds") else _FLUX_SCHNELL
    if name == "SD3Transformer2DModel":
        return _SD3
    if name == "Flux2Transformer2DModel":
        return _FLUX2_DEV if config.get("guidance_embeds") else _FLUX2_KLEIN
    if name == "HunyuanVideo15Transformer3DModel":
        if config.get("use_meanflow"):
            raise ValueError(
                "offload_conditioning: HunyuanVideo15Transformer3DModel with "
                "use_meanflow=True is not served by temb's conditioning "
                "models")
        return _HUNYUAN_VIDEO15
    if name == "UNet2DConditionModel":
        for key, value in _UNET_REQUIRED.items():
            if config.get(key, value) != value:
                raise ValueError(
                    f"offload_conditioning: UNet2DConditionModel with "
                    f"{key}={config.get(key)!r} is not served by temb's "
                    f"conditioning models (SDXL's UNet has {value!r})")
        return _SDXL_UNET
    raise ValueError(
        f"offload_conditioning: {type(model).__module__}.{name} is not a "
        "family temb serves (QwenImageTransformer2DModel, "
        "FluxTransformer2DModel, SD3Transformer2DModel, "
        "Flux2Transformer2DModel, HunyuanVideo15Transformer3DModel, "
        "UNet2DConditionModel)")


# --- going back from what the embedder receives to the scheduler's t ---------

_NEIGHBOURS = (0, -1, 1, -2, 2, -3, 3, -4, 4)


def _scheduler_values(seen: torch.Tensor, forward: Callable, factor: float,
                      dtype: torch.dtype, what: str) -> torch.Tensor:
    """float32 values v with forward(v, dtype) == seen, bit for bit.

    The embedder receives the pipeline's t after its roundings (t.to(bf16)
    / 1000 ...), and temb takes the scheduler's t and applies the same
    roundings itself.  Any v that the pipeline's arithmetic maps onto
    `seen` gives the same rows, so v is searched among the float32 and
    bfloat16 neighbours of seen / factor, and each is checked with the
    pipeline's own operations."""
    seen32 = seen.detach().to("cpu", torch.float32).reshape(-1)
    start = (seen32.double() / factor).float()
    bits = start.view(torch.int32)
    candidates = [(bits + k).view(torch.float32) for k in _NEIGHBOURS]
    candidates += [(((bits >> 16) + k) << 16).view(torch.float32)
                   for k in _NEIGHBOURS]
    candidates = torch.stack(candidates)  # [K, N]
    mapped = forward(candidates, dtype).to(torch.float32)
    match = mapped.view(torch.int32) == seen32.view(torch.int32)
    if not bool(match.any(0).all()):
        bad = seen32[~match.any(0)][0].item()
        raise ValueError(
            f"offload_conditioning: the transformer received {what} {bad!r} "
            f"({dtype}), which its pipeline's arithmetic does not produce "
            "from any scheduler value; is the transformer called the way "
            "its pipeline calls it?")
    first = match.to(torch.int8).argmax(0)
    return candidates.gather(0, first[None])[0]


def _extra_rows(extras: Optional[Dict[str, torch.Tensor]],
                dtype: torch.dtype) -> Dict[str, torch.Tensor]:
    """Each extra input as [rows, K] in the served dtype, on the CPU.  The
    conditioning model rounds these inputs to its dtype, as the pipeline
    does (SDXL's time ids are made in the prompt's dtype); a value that
    dtype cannot hold would give other rows than the model computes."""
    rows = {}
    for name, value in (extras or {}).items():
        value = value.detach().to("cpu")
        rounded = value.to(dtype)
        if not torch.equal(rounded.to(value.dtype), value):
            raise ValueError(
                f"offload_conditioning: {name} holds values that {dtype} "
                "cannot hold exactly, which the served model would round; "
                "does the pipeline make them in the model's dtype?")
        rows[name] = rounded.reshape(-1, value.shape[-1]) if value.dim() \
            else rounded.reshape(1, 1)
    return rows


# --- the client, its reconnection after pickle and fork -----------------------

def _recipe_of(client: Any) -> Tuple[str, Any]:
    """What reopens an equal client elsewhere (after pickle, in a forked
    child): a temb.Client's settings, a temb.local engine's, or the object
    itself for any other client, which must then pickle without its
    connection."""
    try:
        from temb import local
        from temb.client import Client
    except ImportError:  # pragma: no cover - stubs missing
        Client = local = None  # type: ignore
    if Client is not None and isinstance(client, Client):
        return ("client", dict(client.settings))
    if local is not None and isinstance(client, local.Engine):
        return ("engine", dict(client.settings))
    return ("object", client)


def _reopen(recipe: Tuple[str, Any]) -> Any:
    kind, value = recipe
    if kind == "client":
        from temb.client import Client
        return Client(**value)
    if kind == "engine":
        from temb import local
        return local.engine(**value)
    return pickle.loads(pickle.dumps(value))


# --- the shared state ----------------------------------------------------------

class OffloadedConditioning:
    """What offload_conditioning returns, shared by the modules it put in
    the transformer: the client, the served model's name, the schedule and
    the row cache.

    Attributes:
      calls: how many times the client was asked (the cache's misses).
      freed_bytes: the parameter and buffer bytes the patch released.
      replaced: the qualified names of the modules replaced.
    """

    def __init__(self, family: _Family, client: Any, model: str,
                 expected: Dict[str, Tuple[int, ...]], dtype: torch.dtype,
                 cache_bytes: int, timeout: Optional[float]) -> None:
        self.family = family
        self.model = model
        self.expected = expected
        self.dtype = dtype
        self.cache_bytes = int(cache_bytes)
        self.timeout = timeout
        self.calls = 0
        self.freed_bytes = 0
        self.replaced: List[str] = []
        self._schedule: Optional[torch.Tensor] = None
        self._scheduled: set = set()
        self._cache: "collections.OrderedDict[Tuple, Dict[str, torch.Tensor]]" \
            = collections.OrderedDict()
        self._cached_bytes = 0
        self._lock = threading.Lock()
        self._checked = False
        self.current: Optional[Dict[str, torch.Tensor]] = None
        # What the family's taps recorded for the coming embedder call, and
        # how many leading columns of its "pooled" argument are the pooled
        # row (_Family.taps, _Family.pooled_width).
        self.tapped: Dict[str, torch.Tensor] = {}
        self.pooled_columns: Optional[int] = None
        self._prefetch: Optional[threading.Thread] = None
        self._prefetch_error: Optional[BaseException] = None
        self._recipe = _recipe_of(client)
        self._client = client
        self._pid = os.getpid()

    # The client: the caller's, or one reopened from the recipe in a new
    # process (unpickled, or a forked DataLoader worker).
    @property
    def client(self) -> Any:
        if self._client is None or self._pid != os.getpid():
            self._client = _reopen(self._recipe)
            self._pid = os.getpid()
        return self._client

    def set_schedule(self, schedule: Any) -> None:
        """The scheduler timesteps of the coming denoising loop (e.g.
        ``pipe.scheduler.timesteps`` after ``set_timesteps``); None turns
        prefetching off.  A family whose rows depend on t alone
        (Qwen-Image) fetches them now, in the background, while the
        pipeline encodes its prompt; for the others the first step that
        misses the cache fetches every step's rows in the same call."""
        self.wait()
        if schedule is None:
            self._schedule = None
        else:
            self._schedule = torch.as_tensor(schedule).detach().to(
                "cpu", torch.float32).reshape(-1)
        self._scheduled = set()
        if (self._schedule is not None
                and set(self.family.arguments) <= {"timestep", "-"}):
            self._scheduled.add((None, None))
            self._prefetch = threading.Thread(
                target=self._prefetch_schedule,
                args=(self._schedule, self.dtype), daemon=True,
                name="temb-conditioning-prefetch")
            self._prefetch.start()

    def wait(self) -> None:
        """Waits for a schedule being fetched in the background.  If that
        failed, the steps fetch their own rows (and raise what the server
        says)."""
        thread = self._prefetch
        if thread is None:
            return
        thread.join()
        self._prefetch = None
        if self._prefetch_error is not None:
            self._prefetch_error = None
            self._scheduled.discard((None, None))

    def _prefetch_schedule(self, schedule: torch.Tensor,
                           dtype: torch.dtype) -> None:
        try:
            with self._lock:
                seen = self.family.timestep(schedule, dtype).to(torch.float32)
                wanted: Dict[Tuple, int] = {}
                for s, bits in enumerate(seen.view(torch.int32).tolist()):
                    key = (bits, None, None)
                    if key not in self._cache:
                        wanted.setdefault(key, s)
                if not wanted:
                    return
                result = self._request(schedule[list(wanted.values())],
                                       None, None)
                for j, key in enumerate(wanted):
                    self._store(key, {name: result[name][j].to(
                        self.dtype).clone() for name in self.expected})
        except Exception as e:  # the steps will ask again
            self._prefetch_error = e

    def cache_info(self) -> Dict[str, int]:
        return {"calls": self.calls, "entries": len(self._cache),
                "bytes": self._cached_bytes}

    def clear_cache(self) -> None:
        self.wait()
        with self._lock:
            self._cache.clear()
            self._cached_bytes = 0
            self._scheduled = set()

    # --- checking the served model against the transformer ---------------

    def _mismatch(self, served: Dict[str, Tuple[int, ...]],
                  served_dtype: Optional[str], family: str = "") -> List[str]:
        problems = []
        want = _DTYPE_NAMES.get(self.dtype, str(self.dtype))
        if served_dtype is not None and served_dtype != want:
            problems.append(f"dtype: served {served_dtype}, transformer {want}")
        missing = sorted(set(self.expected) - set(served))
        extra = sorted(set(served) - set(self.expected) - {"index"})
        if missing or extra:
            problems.append(
                f"family{f' (served {family})' if family else ''}: outputs "
                f"{missing} missing, {extra} not in a "
                f"{self.family.name} transformer")
        for name in sorted(set(self.expected) & set(served)):
            here, there = tuple(self.expected[name]), tuple(served[name])
            if here == there:
                continue
            if len(here) == 2 and len(there) == 2 and here[0] != there[0]:
                problems.append(f"{name}: {there[0]} blocks served, "
                                f"{here[0]} in the transformer")
            if here[-1] != there[-1]:
                problems.append(f"{name}: width {there[-1]} served, "
                                f"{here[-1]} in the transformer")
            if len(here) != len(there):
                problems.append(f"{name}: shape {list(there)} served, "
                                f"{list(here)} in the transformer")
        return problems

    def _raise_if_mismatched(self, problems: List[str]) -> None:
        if problems:
            raise ValueError(
                f"offload_conditioning: temb model {self.model!r} does not "
                f"match the {self.family.name} transformer: "
                + "; ".join(problems))

    def check_served_model(self) -> bool:
        """Compares the served model's outputs (names, row shapes, dtype)
        with the transformer's, where the client lists its models
        (``client.models()``); False when it cannot tell (the first answer
        is checked then)."""
        lister = getattr(self.client, "models", None)
        if lister is None:
            return False
        found = [m for m in lister() if getattr(m, "name", None) == self.model]
        if not found:
            raise ValueError(f"offload_conditioning: the server has no "
                             f"conditioning model {self.model!r}")
        served = found[0]
        state = getattr(served, "state", "ready")
        if state != "ready":
            raise ValueError(
                f"offload_conditioning: temb model {self.model!r} is {state}"
                + (f": {served.message}" if getattr(served, "message", "")
                   else ""))
        outputs = {o.name: tuple(o.row_shape) for o in served.outputs}
        dtypes = {o.dtype for o in served.outputs if o.name in self.expected}
        problems = self._mismatch(outputs, served.dtype if getattr(
            served, "dtype", None) else (dtypes.pop() if len(dtypes) == 1
                                         else None),
            getattr(served, "family", ""))
        inputs = {i.name for i in getattr(served, "inputs", ())}
        wants_guidance = "guidance" in self.family.arguments
        if inputs and ("guidance" in inputs) != wants_guidance:
            problems.append(
                "guidance: the served model "
                + ("takes" if "guidance" in inputs else "does not take")
                + " a guidance input, the transformer "
                + ("has" if wants_guidance else "has no")
                + " guidance embedder")
        self._raise_if_mismatched(problems)
        self._checked = True
        return True

    # --- rows ----------------------------------------------------------------

    def _request(self, timesteps: torch.Tensor,
                 guidance: Optional[torch.Tensor],
                 pooled: Optional[torch.Tensor],
                 extras: Optional[Dict[str, torch.Tensor]] = None
                 ) -> Dict[str, torch.Tensor]:
        self.calls += 1
        kwargs: Dict[str, Any] = dict(extras or {})
        if guidance is not None:
            kwargs["guidance"] = guidance
        if pooled is not None:
            kwargs["pooled_projections"] = pooled
        if self.timeout is not None:
            kwargs["timeout"] = self.timeout
        answer = self.client.condition(
            self.model, timesteps, outputs=sorted(self.expected),
            return_tensors="pt", **kwargs)
        result = {}
        for name in self.expected:
            if name not in answer:
                self._raise_if_mismatched(self._mismatch(
                    {k: tuple(torch.as_tensor(v).shape[1:])
                     for k, v in answer.items()}, None))
            result[name] = torch.as_tensor(answer[name])
        if not self._checked:
            served_dtypes = {_DTYPE_NAMES.get(v.dtype, str(v.dtype))
                             for v in result.values()}
            # A client may widen bf16 to float32 holding the same value;
            # only a served dtype that is not float32 is known for sure.
            served_dtype = (served_dtypes.pop() if len(served_dtypes) == 1
                            and served_dtypes != {"fp32"} else None)
            self._raise_if_mismatched(self._mismatch(
                {k: tuple(v.shape[1:]) for k, v in result.items()},
                served_dtype))
            self._checked = True
        return result

    def _store(self, key: Tuple, row: Dict[str, torch.Tensor]) -> None:
        size = sum(t.numel() * t.element_size() for t in row.values())
        if size > self.cache_bytes:
            return
        old = self._cache.pop(key, None)
        if old is not None:
            self._cached_bytes -= sum(t.numel() * t.element_size()
                                      for t in old.values())
        self._cache[key] = row
        self._cached_bytes += size
        while self._cached_bytes > self.cache_bytes:
            _, evicted = self._cache.popitem(last=False)
            self._cached_bytes -= sum(t.numel() * t.element_size()
                                      for t in evicted.values())

    def answer(self, timestep: torch.Tensor, guidance: Optional[torch.Tensor],
               pooled: Optional[torch.Tensor],
               dtype: Optional[torch.dtype] = None,
               extras: Optional[Dict[str, torch.Tensor]] = None
               ) -> Dict[str, torch.Tensor]:
        """{output: [N, ...]} for the rows the embedder received, in the
        served dtype, on the CPU.  `dtype`: the one the transformer runs in
        now (the served one unless it was moved with .to(dtype)): its
        pipeline's arithmetic is the one undone to find the scheduler's t.
        `extras`: the family's other row inputs by their served name
        ([N, K] or one row; SDXL's time_ids), which travel with the pooled
        row and are keyed with it."""
        dtype = dtype or self.dtype
        if self._pid != os.getpid():
            # A forked child: the parent's threads did not come along, and
            # one may have held the lock at the fork.
            self._lock = threading.Lock()
            self._prefetch = None
        if self._prefetch is not None:
            self.wait()
        t_seen = timestep.detach().reshape(-1).to("cpu")
        g_seen = (None if guidance is None
                  else guidance.detach().reshape(-1).to("cpu"))
        p_rows = (None if pooled is None else pooled.detach().to(
            "cpu", self.dtype).reshape(-1, pooled.shape[-1]))
        x_rows = _extra_rows(extras, self.dtype)
        # One timestep, guidance or pooled row may stand for every row.
        n = max(x.shape[0] for x in (t_seen, g_seen, p_rows,
                                     *x_rows.values()) if x is not None)
        for name, x in (("timestep", t_seen), ("guidance", g_seen),
                        ("pooled_projections", p_rows), *x_rows.items()):
            if x is not None and x.shape[0] not in (1, n):
                raise ValueError(f"offload_conditioning: {name} has "
                                 f"{x.shape[0]} rows, the batch {n}")
        if t_seen.shape[0] == 1:
            t_seen = t_seen.expand(n)
        t_bits = t_seen.to(torch.float32).view(torch.int32).tolist()
        g_bits = None
        if g_seen is not None:
            g_seen = g_seen.expand(n) if g_seen.shape[0] == 1 else g_seen
            g_bits = g_seen.to(torch.float32).view(torch.int32).tolist()
        p_keys = None
        if p_rows is not None:
            if p_rows.shape[0] == 1:
                p_rows = p_rows.expand(n, -1)
            raw = p_rows.contiguous().view(torch.uint8).numpy()
            p_keys = [raw[i].tobytes() for i in range(n)]
        if x_rows:
            # The extra inputs are keyed with the pooled row: both are
            # per-prompt rows that travel together.
            x_rows = {name: x.expand(n, -1) if x.shape[0] == 1 else x
                      for name, x in x_rows.items()}
            raws = [x.contiguous().view(torch.uint8).numpy()
                    for x in x_rows.values()]
            p_keys = [(None if p_keys is None else p_keys[i],
                       tuple(raw[i].tobytes() for raw in raws))
                      for i in range(n)]
        keys = [(t_bits[i], None if g_bits is None else g_bits[i],
                 None if p_keys is None else p_keys[i]) for i in range(n)]
        with self._lock:
            missing = [i for i in range(n) if keys[i] not in self._cache]
            fetched = {}
            if missing:
                fetched = self._fetch(keys, missing, t_seen, g_seen, p_rows,
                                      dtype, x_rows)
            rows = []
            for k in keys:
                row = fetched.get(k)
                if row is None:
                    row = self._cache[k]
                    self._cache.move_to_end(k)
                rows.append(row)
        return {name: torch.stack([row[name] for row in rows])
                for name in self.expected}

    def _fetch(self, keys, missing, t_seen, g_seen, p_rows, dtype,
               x_rows=None) -> Dict[Tuple, Dict[str, torch.Tensor]]:
        family = self.family
        # The rows to ask for: the missing ones, and with a schedule every
        # step's row for each distinct (guidance, pooled) of this batch.
        wanted: "collections.OrderedDict[Tuple, Tuple]" = \
            collections.OrderedDict()
        first = {}
        for i in missing:
            wanted.setdefault(keys[i], ("seen", i))
        if self._schedule is not None:
            for i, key in enumerate(keys):
                first.setdefault(key[1:], i)
            seen_t = family.timestep(self._schedule, dtype).to(torch.float32)
            s_bits = seen_t.view(torch.int32).tolist()
            for rest, i in first.items():
                if rest in self._scheduled:
                    continue
                self._scheduled.add(rest)
                for s, bits in enumerate(s_bits):
                    key = (bits,) + rest
                    if key not in self._cache:
                        wanted.setdefault(key, ("schedule", s, i))
        t_values, g_values, p_index = [], [], []
        schedule_t = self._schedule
        seen_rows = [w[1] for w in wanted.values() if w[0] == "seen"]
        back = {}
        if seen_rows:
            values = _scheduler_values(t_seen[seen_rows], family.timestep,
                                       family.timestep_factor, dtype,
                                       "timestep")
            back = dict(zip(seen_rows, values.tolist()))
        g_back = {}
        if g_seen is not None:
            distinct = sorted({w[-1] for w in wanted.values()})
            values = _scheduler_values(g_seen[distinct], family.guidance,
                                       family.guidance_factor, dtype,
                                       "guidance")
            g_back = dict(zip(distinct, values.tolist()))
        for w in wanted.values():
            row = w[-1]  # the batch row giving guidance and pooled
            t_values.append(schedule_t[w[1]].item() if w[0] == "schedule"
                            else back[w[1]])
            if g_seen is not None:
                g_values.append(g_back[row])
            p_index.append(row)
        timesteps = torch.tensor(t_values, dtype=torch.float32)
        guidance = (torch.tensor(g_values, dtype=torch.float32)
                    if g_seen is not None else None)
        pooled = p_rows[p_index].contiguous() if p_rows is not None else None
        extras = {name: x[p_index].contiguous()
                  for name, x in (x_rows or {}).items()}
        result = self._request(timesteps, guidance, pooled, extras)
        fetched = {}
        for j, key in enumerate(wanted):
            row = {name: result[name][j].to(self.dtype).clone()
                   for name in self.expected}
            self._store(key, row)
            fetched[key] = row
        # This step's rows come from here even when the cache is smaller
        # than the schedule (or off: cache_bytes=0).
        return fetched

    # copy.deepcopy: the copy shares the caller's client, copies the rest.
    def __deepcopy__(self, memo: Dict[int, Any]) -> "OffloadedConditioning":
        self.wait()
        clone = self.__class__.__new__(self.__class__)
        memo[id(self)] = clone
        state = self.__dict__.copy()
        shared = {name: state.pop(name)
                  for name in ("_client", "_recipe", "_lock", "family")}
        clone.__dict__.update(copy.deepcopy(state, memo))
        clone.__dict__.update(shared)
        clone._lock = threading.Lock()
        return clone

    # pickle: the recipe travels, never a live channel; the cache too.
    def __getstate__(self) -> Dict[str, Any]:
        self.wait()
        state = self.__dict__.copy()
        state["_client"] = None
        state["_lock"] = None
        state["current"] = None
        state["tapped"] = {}
        try:
            pickle.dumps(self._recipe)
        except Exception as e:
            raise TypeError(
                "this offloaded transformer cannot be pickled: its client "
                f"({type(self._client).__name__}) cannot be reopened from "
                "pickled settings") from e
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._pid = -1  # reopen on first use


# --- the modules ------------------------------------------------------------------

class ConditioningEmbedder(torch.nn.Module):
    """Stands in for a transformer's ``time_text_embed``: returns the
    step's ``temb`` rows served by temb, with every output of the step
    attached for the modulation modules.  No parameters; one zero-size
    buffer follows ``.to(dtype)`` so that the answer comes in the module's
    dtype, on the timestep's device."""

    def __init__(self, state: OffloadedConditioning) -> None:
        super().__init__()
        self.state = state
        self.register_buffer("dtype_marker",
                             torch.empty(0, dtype=state.dtype),
                             persistent=False)

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        names = self.state.family.arguments
        given = dict(zip(names, args))
        aliases = {"pooled_projection": "pooled",
                   "pooled_projections": "pooled"}
        for name, value in kwargs.items():
            given[aliases.get(name, name)] = value
        given.pop("-", None)
        extras = self._tapped_and_extra(given)
        timestep = given["timestep"]
        if not isinstance(timestep, torch.Tensor):
            timestep = torch.as_tensor(timestep)
        dtype = self.dtype_marker.dtype
        answer = self.state.answer(timestep, given.get("guidance"),
                                   given.get("pooled"), dtype, extras)
        device = timestep.device
        answer = {name: value.to(device=device, dtype=dtype,
                                 non_blocking=True)
                  for name, value in answer.items()}
        temb = answer["temb"]
        setattr(temb, _ANSWER, answer)
        self.state.current = answer
        return temb

    def _tapped_and_extra(self, given: Dict[str, Any]
                          ) -> Dict[str, torch.Tensor]:
        """Completes `given` with what the family's taps recorded since the
        last answer and cuts the pooled row out of a wider argument; returns
        the tapped inputs beyond t, guidance and pooled, one row each per
        pooled row (add_time_proj sees the time ids flattened)."""
        state = self.state
        tapped, state.tapped = state.tapped, {}
        for module, name in state.family.taps:
            if name not in tapped:
                raise RuntimeError(
                    f"offload_conditioning: {module} did not run before the "
                    f"{state.family.name} model's embedder; is the model "
                    "called the way its pipeline calls it?")
            given.setdefault(name, tapped[name])
        pooled = given.get("pooled")
        if state.pooled_columns is not None and pooled is not None:
            pooled = given["pooled"] = pooled[..., :state.pooled_columns]
        extras = {}
        for _, name in state.family.taps:
            if name not in ("timestep", "guidance", "pooled"):
                value = torch.as_tensor(given.pop(name))
                extras[name] = (value if pooled is None
                                else value.reshape(pooled.shape[0], -1))
        return extras

    def extra_repr(self) -> str:
        return f"model={self.state.model!r}, family={self.state.family.name}"


class PassThrough(torch.nn.Module):
    """Stands in for the SiLU before a modulation Linear: the Linear's
    replacement reads the embedder's answer from the tensor itself."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class ModulationLookup(torch.nn.Module):
    """Stands in for a modulation Linear: output `output` at block position
    `index` of the step's answer, exactly what the Linear computed."""

    def __init__(self, state: OffloadedConditioning, output: str,
                 index: Optional[int]) -> None:
        super().__init__()
        self.state = state
        self.output = output
        self.index = index

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        answer = getattr(x, _ANSWER, None)
        if answer is None:
            # The tensor was rebuilt on the way (a dtype cast; in the UNet,
            # the resnet's SiLU of its sum emb): the step's answer is still
            # the embedder's latest one.
            answer = getattr(self.state, "current", None)
            if answer is None or answer["temb"].shape[0] != x.shape[0]:
                raise RuntimeError(
                    f"offload_conditioning: {self.output}"
                    f"{'' if self.index is None else f'[{self.index}]'} was "
                    "called with a tensor that is not the replaced "
                    f"{self.state.family.embedder}'s output")
        value = answer[self.output]
        if self.index is not None:
            value = value[:, self.index]
        return value.to(x.dtype) if value.dtype != x.dtype else value

    def extra_repr(self) -> str:
        return f"output={self.output!r}, index={self.index}"


class InputTap(torch.nn.Module):
    """Wraps a parameterless module that receives one of the served inputs
    before the embedder runs (the UNet's time_proj and add_time_proj):
    records that input for the embedder, then runs the module as before."""

    def __init__(self, state: OffloadedConditioning, name: str,
                 inner: torch.nn.Module) -> None:
        super().__init__()
        self.state = state
        self.name = name
        self.inner = inner

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        self.state.tapped[self.name] = x
        return self.inner(x, *args, **kwargs)

    def extra_repr(self) -> str:
        return f"records={self.name!r}"


class FoldedEmbedding(torch.nn.Module):
    """Stands in for an embedder whose output the model adds to the
    replaced embedder's (the UNet's time_embedding): the served temb holds
    both, so this returns zeros of its width, and the sum is the served
    temb exactly.  A zero-size buffer follows ``.to(dtype)``."""

    def __init__(self, width: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.width = width
        self.register_buffer("dtype_marker", torch.empty(0, dtype=dtype),
                             persistent=False)

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any
                ) -> torch.Tensor:
        return torch.zeros(x.shape[0], self.width, device=x.device,
                           dtype=self.dtype_marker.dtype)

    def extra_repr(self) -> str:
        return f"width={self.width}"


# --- patching --------------------------------------------------------------------

def _owned_bytes(modules: Sequence[torch.nn.Module]) -> int:
    seen = set()
    total = 0
    for module in modules:
        for tensor in list(module.parameters()) + list(module.buffers()):
            if tensor.is_meta:
                continue
            key = (tensor.untyped_storage().data_ptr(), tensor.device)
            if key in seen:
                continue
            seen.add(key)
            total += tensor.untyped_storage().nbytes()
    return total


def _set(model: torch.nn.Module, path: str, module: torch.nn.Module) -> None:
    parent_path, _, name = path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    setattr(parent, name, module)


def conditioning_modules(transformer: torch.nn.Module
                         ) -> Dict[str, torch.nn.Module]:
    """The modules with weights that offload_conditioning replaces, by
    qualified name: the time (guidance, pooled) embedder, the UNet's
    time_embedding, and every modulation Linear (a UNet resnet's
    time_emb_proj).  Works on the meta device, so the bytes a released
    config frees can be counted without its weights."""
    family = _family_of(transformer)
    found = {name: transformer.get_submodule(name)
             for name in (family.embedder,) + family.folded}
    for slot in family.slots(transformer):
        found[slot.linear] = transformer.get_submodule(slot.linear)
    return found


def offload_conditioning(transformer: torch.nn.Module, *, client: Any,
                         model: str, schedule: Any = None,
                         cache_bytes: int = 1 << 30,
                         timeout: Optional[float] = None
                         ) -> OffloadedConditioning:
    """Replaces, in place, the time conditioning of a diffusers
    transformer (QwenImageTransformer2DModel, FluxTransformer2DModel dev or
    schnell, SD3Transformer2DModel, Flux2Transformer2DModel dev or klein,
    HunyuanVideo15Transformer3DModel) or of SDXL's UNet2DConditionModel
    with temb's answers from the conditioning model `model`, and releases
    its weights.

    Args:
      transformer: the model, called afterwards as its pipeline calls it.
      client: any object with ``condition(model, timesteps, guidance=,
        pooled_projections=, outputs=, return_tensors="pt")`` (a
        temb.Client, temb.local); with ``models()`` as well, the served
        model is checked against the transformer now, else on the first
        answer.  Pickled or forked copies reopen an equal client.
      model: the conditioning model's name on the server.
      schedule: the scheduler's timesteps of the coming loop; the first
        step then fetches all of them in one call (see
        :meth:`OffloadedConditioning.set_schedule`).
      cache_bytes: the bound of the client-side row cache (LRU), keyed by
        the exact bits of what the embedder receives.
      timeout: passed to each call where given.

    Returns the shared :class:`OffloadedConditioning` (its ``calls``,
    ``freed_bytes``, ``set_schedule``).  Raises ValueError naming what
    differs when the served model does not match the transformer.
    """
    from temb import local
    if client is local:  # the module: its default engine, in this process
        client = local.default_engine()
    if not hasattr(client, "condition"):
        raise TypeError("offload_conditioning needs a client with a "
                        "condition() method (temb.Client, temb.local), got "
                        f"{type(client).__name__}")
    family = _family_of(transformer)
    if isinstance(transformer.get_submodule(family.embedder),
                  ConditioningEmbedder):
        raise ValueError("offload_conditioning: this transformer is already "
                         "offloaded")
    slots = family.slots(transformer)
    original = transformer.get_submodule(family.embedder)
    dtype = next(p.dtype for p in original.parameters())
    expected: Dict[str, Tuple[int, ...]] = {}
    counts: Dict[str, int] = collections.Counter()
    for slot in slots:
        linear = transformer.get_submodule(slot.linear)
        if not isinstance(linear, torch.nn.Linear):
            raise ValueError(f"offload_conditioning: {slot.linear} is a "
                             f"{type(linear).__name__}, not a Linear")
        width = linear.out_features
        if slot.index is None:
            expected[slot.output] = (width,)
        else:
            counts[slot.output] += 1
            expected[slot.output] = (counts[slot.output], width)
    expected["temb"] = (transformer.get_submodule(
        slots[-1].linear).in_features,)
    state = OffloadedConditioning(family, client, model, expected, dtype,
                                  cache_bytes, timeout)
    if family.pooled_width is not None:
        state.pooled_columns = family.pooled_width(transformer)
    state.check_served_model()
    state.set_schedule(schedule)

    device = next(original.parameters()).device
    old = [original] + [transformer.get_submodule(name)
                        for name in family.folded] + [
        transformer.get_submodule(slot.linear) for slot in slots]
    state.freed_bytes = _owned_bytes(old)
    del old, original
    _set(transformer, family.embedder, ConditioningEmbedder(state).to(device))
    state.replaced.append(family.embedder)
    for name in family.folded:
        width = transformer.get_submodule(name).linear_2.out_features
        _set(transformer, name, FoldedEmbedding(width, dtype).to(device))
        state.replaced.append(name)
    for name, input_name in family.taps:
        _set(transformer, name,
             InputTap(state, input_name, transformer.get_submodule(name)))
        state.replaced.append(name)
    for slot in slots:
        if slot.silu is not None:
            _set(transformer, slot.silu, PassThrough())
            state.replaced.append(slot.silu)
        _set(transformer, slot.linear,
             ModulationLookup(state, slot.output, slot.index))
        state.replaced.append(slot.linear)
    return state
