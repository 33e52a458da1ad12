"""The modules an offloaded transformer holds in place of the replaced ones:
none has weights; each reads the step's rows that the embedder's stand-in
fetched."""

from __future__ import annotations

import inspect
from typing import Any, Dict, List, Optional, Tuple, Union, cast

import torch

from temb._offload.description import Capture
from temb._offload.state import OffloadedConditioning, not_compiled

# The attribute of the embedder's output that carries the step's answer.
ANSWER = "_temb_conditioning"


def _product(shape: Any) -> int:
    count = 1
    for extent in shape:
        count *= int(extent)
    return count


class ConditioningEmbedder(torch.nn.Module):
    """Stands in for a transformer's time embedder: returns the step's rows
    of its served output (or the tuple of them, as the embedder returns),
    each carrying its whole answer for the modulation modules.  It takes
    the embedder's arguments (`arguments`, their names in order), the
    captured inputs among them.  No parameters; one zero-size buffer
    follows ``.to(dtype)`` so that the answer comes in the module's dtype,
    on the timestep's device."""

    dtype_marker: torch.Tensor  # a buffer (register_buffer below)

    def __init__(self, state: OffloadedConditioning,
                 arguments: Tuple[str, ...]) -> None:
        super().__init__()
        self.state = state
        self.arguments = arguments
        self.register_buffer("dtype_marker",
                             torch.empty(0, dtype=state.dtype),
                             persistent=False)

    def forward(self, *args: Any, **kwargs: Any
                ) -> Union[torch.Tensor, Tuple[Optional[torch.Tensor], ...]]:
        state = self.state
        described = state.described
        given = dict(zip(self.arguments, args))
        given.update(kwargs)
        captured = state.take_recorded()
        for capture in described.captures:
            if capture.module == described.embedder:
                captured[capture.name] = capture.take(given)
            elif capture.name not in captured:
                where = capture.module or "the transformer's forward"
                raise RuntimeError(
                    f"offload_conditioning: {where} did not run before the "
                    f"replaced {described.embedder}; is the model called the "
                    "way its pipeline calls it?")
        time = captured.get(described.captures[0].name)
        device = (time.device if isinstance(time, torch.Tensor)
                  else self.dtype_marker.device)
        dtype = self.dtype_marker.dtype
        if dtype != state.dtype:
            # Its inputs now come in another dtype than the served model
            # computes for: rows of that model are not this one's.
            raise ValueError(
                f"offload_conditioning: the transformer was moved to "
                f"{dtype}; temb model {state.model!r} computes for "
                f"{state.dtype} (offload a transformer of the served "
                "model's dtype)")
        answer = state.rows(captured, dtype)
        answer = answer.to(device, {name: state.row_dtype(name, dtype)
                                    for name in answer.rows})
        state.set_current(answer)
        results: List[Optional[torch.Tensor]] = []
        for name in described.results:
            if not name:
                results.append(None)
                continue
            read = (answer if name == described.temb_output
                    else answer.renamed(described.renames[name]))
            value = read.take(described.temb_output, None,
                              (answer.index.numel(),))
            setattr(value, ANSWER, read)
            results.append(value)
        if described.returns_tuple:
            return tuple(results)
        return cast(torch.Tensor, results[0])

    def extra_repr(self) -> str:
        return f"model={self.state.model!r}"


class PassThrough(torch.nn.Module):
    """Stands in for the SiLU before a modulation Linear: the Linear's
    replacement reads the embedder's answer from the tensor itself."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class ModulationLookup(torch.nn.Module):
    """Stands in for a modulation Linear: output `output` at block position
    `index` of the step's answer, exactly what the Linear computed.  A
    zero-size buffer keeps the Linear's dtype, for models that read it."""

    dtype_marker: torch.Tensor  # a buffer (register_buffer below)

    def __init__(self, state: OffloadedConditioning, output: str,
                 index: Optional[int],
                 dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.state = state
        self.output = output
        self.index = index
        self.register_buffer("dtype_marker", torch.empty(0, dtype=dtype),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        answer = getattr(x, ANSWER, None)
        lead = x.shape[:-1]
        if answer is None:
            # The tensor was rebuilt on the way (a dtype cast, an
            # unflatten, a sum with another embedding, a resnet's SiLU of
            # its sum): the step's answer is still the embedder's latest.
            answer = self.state.current()
            if (answer is not None and not answer.fits(lead)
                    and answer.index.numel() > _product(lead)):
                # A leading slice of the embedder's rows: a model that
                # embeds more rows than a module reads (t and t * 0 for
                # reference tokens) hands the others the first ones.
                answer = answer.first(_product(lead))
            if answer is None or not answer.fits(lead):
                raise RuntimeError(
                    f"offload_conditioning: {self.output}"
                    f"{'' if self.index is None else f'[{self.index}]'} was "
                    "called with a tensor that is not the replaced "
                    f"{self.state.described.embedder}'s output")
        # Rows as the Linear gives them: [..., W] ([N, 6, D] flat).
        value = answer.take(self.output, self.index, lead).flatten(len(lead))
        return value.to(x.dtype) if value.dtype != x.dtype else value

    def extra_repr(self) -> str:
        return f"output={self.output!r}, index={self.index}"


class Carrier(torch.nn.Module):
    """Stands in for a module with weights whose result the served temb
    already is (a time MLP after the replaced sinusoid): returns its
    input.  A model may read the module's parameters' dtype to cast to, so
    it holds one zero-size parameter in the model's dtype: the cast is then
    a no-op and no byte is held."""

    def __init__(self, dtype: Optional[torch.dtype] = None) -> None:
        super().__init__()
        if dtype is not None:
            self.dtype_marker = torch.nn.Parameter(
                torch.empty(0, dtype=dtype), requires_grad=False)

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any
                ) -> torch.Tensor:
        return x


class ZeroContribution(torch.nn.Module):
    """Stands in for an embedding that the model adds to temb and that the
    served temb already includes: adds -0.0, which leaves every value as it
    is."""

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any
                ) -> torch.Tensor:
        return x.new_full((1, 1), -0.0)


class TableLookup(torch.nn.Module):
    """Stands in for an additive ``scale_shift_table`` parameter.  The
    model adds the table to its modulation (a block's) or to temb (the
    output's); the stand-in's sum is output `output` at block position
    `index` of the step's answer, which is that sum, laid out as the
    model's addend is ([N, k, D], or [B, seq, k, D] per token).  It takes
    the indexing, unsqueeze, ``.to()`` and ``.device`` the models apply to
    their table on the way, and keeps the table's dtype for the sum's type
    promotion."""

    dtype_marker: torch.Tensor  # a buffer (register_buffer below)

    def __init__(self, state: OffloadedConditioning, output: str,
                 index: Optional[int], dtype: torch.dtype,
                 shape: Tuple[int, ...] = ()) -> None:
        super().__init__()
        self.state = state
        self.output = output
        self.index = index
        # The table's shape, which a model may read (its row count is the
        # number of chunks).
        self.shape = torch.Size(shape)
        self.register_buffer("dtype_marker", torch.empty(0, dtype=dtype),
                             persistent=False)

    @property
    def device(self) -> torch.device:
        return self.dtype_marker.device

    def __getitem__(self, item: Any) -> TableLookup:
        # table[None], table[None, None].
        if item is None or item in ((None,), (None, None)):
            return self
        raise TypeError(f"offload_conditioning: {self.output} table indexed "
                        f"with {item!r}")

    def unsqueeze(self, dim: int) -> TableLookup:
        return self

    def __add__(self, other: torch.Tensor) -> torch.Tensor:
        answer = self.state.current()
        lead = other.shape[:-2]
        if answer is None or not answer.fits(lead):
            raise RuntimeError(
                f"offload_conditioning: the {self.output} table was added to "
                f"a {list(other.shape)} tensor that is not of the replaced "
                "embedder's latest step")
        value = answer.take(self.output, self.index, lead)
        dtype = torch.promote_types(self.dtype_marker.dtype, other.dtype)
        return value.to(dtype) if value.dtype != dtype else value

    __radd__ = __add__

    def extra_repr(self) -> str:
        return f"output={self.output!r}, index={self.index}"


class InputTap:
    """A forward pre-hook recording the served inputs a module (or the
    transformer's own forward) is handed, for the embedder's coming call.
    The module runs as before."""

    def __init__(self, state: OffloadedConditioning,
                 captures: Tuple[Capture, ...]) -> None:
        self.state = state
        self.captures = captures

    @not_compiled
    def __call__(self, module: torch.nn.Module, args: Tuple[Any, ...],
                 kwargs: Dict[str, Any]) -> None:
        bound = inspect.signature(module.forward).bind_partial(
            *args, **kwargs).arguments
        for capture in self.captures:
            self.state.record(capture.name, capture.take(bound))
