"""Patching a transformer: the modules the served model describes are
swapped for stand-ins, and their weights released."""

from __future__ import annotations

import collections
import inspect
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union, cast

import torch

from temb._offload.description import (Capture, Described, describe,
                                       fingerprint, missing_modules,
                                       replaced_tensors)
from temb._offload.modules import (Carrier, ConditioningEmbedder, InputTap,
                                   ModulationLookup, PassThrough,
                                   TableLookup, ZeroContribution)
from temb._offload.state import (OffloadedConditioning, served_dtype,
                                 served_model)


def _owned_bytes(
        modules: Sequence[Union[torch.nn.Module, torch.Tensor]]) -> int:
    seen = set()
    total = 0
    for module in modules:
        tensors = ([module] if isinstance(module, torch.Tensor) else
                   list(module.parameters()) + list(module.buffers()))
        for tensor in tensors:
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


def conditioning_modules(transformer: torch.nn.Module, served: Any
                         ) -> Dict[str, Any]:
    """The modules with weights that offload_conditioning replaces, by
    qualified name, as the served conditioning model `served` (a
    ConditioningModel of ``client.models()``) describes them: the embedder
    (where it has weights), every modulation Linear, the folded modules,
    and the additive tables (as their Parameters).  Works on the meta
    device, so the bytes a released config frees can be counted without
    its weights."""
    described = describe(served)
    found: Dict[str, Any] = {}
    embedder = transformer.get_submodule(described.embedder)
    if any(True for _ in embedder.parameters()):
        found[described.embedder] = embedder
    tables = {table.table for table in described.tables}
    for path in described.modules()[1:]:
        found[path] = (transformer.get_parameter(path) if path in tables
                       else transformer.get_submodule(path))
    return found


def _expected(transformer: torch.nn.Module, described: Described,
              served: Any) -> Dict[str, Tuple[int, ...]]:
    """The row shape of each output the stand-ins read, as the
    transformer's own modules give it: a Linear's out_features, a table's
    elements, and for the embedder's results the width the Linears read
    (the served width where no Linear reads them)."""
    expected: Dict[str, Tuple[int, ...]] = {}
    counts: Dict[str, int] = collections.Counter()
    widths = [(slot.output, slot.index, cast(
        torch.nn.Linear, transformer.get_submodule(slot.linear)).out_features)
        for slot in described.slots]
    widths += [(table.output, table.index,
                transformer.get_parameter(table.table).numel())
               for table in described.tables]
    for output, index, width in widths:
        if index is None:
            expected[output] = (width,)
        else:
            counts[output] += 1
            expected[output] = (counts[output], width)
    served_shapes = {o.name: tuple(o.row_shape) for o in served.outputs}
    temb = (cast(torch.nn.Linear, transformer.get_submodule(
        described.slots[-1].linear)).in_features,) if described.slots \
        else served_shapes[described.temb_output]
    for name in described.results:
        if name:
            expected[name] = temb
    for names in described.renames.values():
        for read, instead in names.items():
            if read in expected:
                expected[instead] = expected[read]
    return expected


def _transformer_dtype(transformer: torch.nn.Module, described: Described,
                       fallback: torch.dtype) -> Tuple[torch.dtype,
                                                       torch.device]:
    """The transformer's compute dtype and device: its modulation Linears'
    (a model may keep its time MLP in float32), else its embedder's."""
    paths = [slot.linear for slot in described.slots] + [described.embedder]
    for path in paths:
        for parameter in transformer.get_submodule(path).parameters():
            return parameter.dtype, parameter.device
    device = next((p.device for p in transformer.parameters()),
                  torch.device("cpu"))
    return fallback, device


def _argument_names(module: torch.nn.Module) -> Tuple[str, ...]:
    return tuple(inspect.signature(module.forward).parameters)


def offload_conditioning(transformer: torch.nn.Module, *, client: Any,
                         model: str, schedule: Any = None,
                         cache_bytes: int = 1 << 30,
                         timeout: Optional[float] = None
                         ) -> OffloadedConditioning:
    """Replaces, in place, the time conditioning of a diffusers transformer
    (or UNet) with temb's answers from the conditioning model `model`, and
    releases the weights of the modules that model's description names
    (docs/offload.md lists the families served).

    Args:
      transformer: the model, called afterwards as its pipeline calls it.
      client: any object with ``condition(model, outputs=, return_tensors=
        "pt", **inputs)`` and ``models()`` (a temb.Client, temb.local).
        The served model's description names the modules replaced and
        where the transformer hands each input, and is checked against the
        transformer now.  Pickled or forked copies reopen an equal client.
      model: the conditioning model's name on the server.
      schedule: the values of its ``timesteps`` input for the coming loop;
        the first step then fetches all of them in one call (see
        :meth:`OffloadedConditioning.set_schedule`).
      cache_bytes: the bound of the client-side row cache (LRU), keyed by
        the exact bits of the inputs the transformer hands over.
      timeout: passed to each call where given.

    Returns the shared :class:`OffloadedConditioning` (its ``calls``,
    ``freed_bytes``, ``set_schedule``).  Raises ValueError naming what
    differs when the served model does not match the transformer.
    """
    from temb import local
    if client is local:  # the module: its default engine, in this process
        client = local.default_engine()
    if not (hasattr(client, "condition") and hasattr(client, "models")):
        raise TypeError("offload_conditioning needs a client with "
                        "condition() and models() methods (temb.Client, "
                        f"temb.local), got {type(client).__name__}")
    if any(isinstance(m, ConditioningEmbedder) for m in transformer.modules()):
        raise ValueError("offload_conditioning: this transformer is already "
                         "offloaded")
    served = served_model(client, model)
    described = describe(served)
    problems = missing_modules(transformer, described)
    if problems:
        raise ValueError(
            f"offload_conditioning: temb model {model!r} (family "
            f"{getattr(served, 'family', '') or 'unknown'}) does not match "
            f"{type(transformer).__name__}: " + "; ".join(problems))
    for slot in described.slots:
        linear = transformer.get_submodule(slot.linear)
        if not isinstance(linear, torch.nn.Linear):
            raise ValueError(f"offload_conditioning: {slot.linear} is a "
                             f"{type(linear).__name__}, not a Linear")
    dtype, device = _transformer_dtype(transformer, described,
                                       served_dtype(described))
    state = OffloadedConditioning(
        described, client, model, _expected(transformer, described, served),
        dtype, cache_bytes, timeout)
    state.check_transformer(transformer)
    for name, tensor in replaced_tensors(transformer, described).items():
        found = fingerprint(tensor)
        if found is not None:
            state.fingerprints[name] = found
    state.check_served_model(served)
    state.set_schedule(schedule)
    _swap(transformer, state, device)
    return state


def _swap(transformer: torch.nn.Module, state: OffloadedConditioning,
          device: torch.device) -> None:
    """Puts the stand-ins in place, releases the replaced weights, and
    hooks the modules that hand the embedder its other inputs."""
    described = state.described
    old: List[Union[torch.nn.Module, torch.Tensor]] = [
        transformer.get_submodule(path)
        for path in [described.embedder]
        + [slot.linear for slot in described.slots]
        + [s.path for s in described.stand_ins]]
    old += [transformer.get_parameter(t.table) for t in described.tables]
    state.freed_bytes = _owned_bytes(old)
    arguments = _argument_names(cast(torch.nn.Module, old[0]))
    del old
    _set(transformer, described.embedder,
         ConditioningEmbedder(state, arguments).to(device))
    state.replaced.append(described.embedder)
    for slot in described.slots:
        if slot.silu is not None:
            _set(transformer, slot.silu, PassThrough())
            state.replaced.append(slot.silu)
        weight = cast(torch.nn.Linear,  # checked by the caller
                      transformer.get_submodule(slot.linear)).weight
        _set(transformer, slot.linear,
             ModulationLookup(state, slot.output, slot.index,
                              weight.dtype).to(weight.device))
        del weight
        state.replaced.append(slot.linear)
    for stand_in in described.stand_ins:
        replacement = (ZeroContribution() if stand_in.kind == "adds_nothing"
                       else Carrier(state.dtype))
        _set(transformer, stand_in.path, replacement.to(device))
        state.replaced.append(stand_in.path)
    for table in described.tables:
        parent_path, _, name = table.table.rpartition(".")
        parent = (transformer.get_submodule(parent_path) if parent_path
                  else transformer)
        parameter = getattr(parent, name)
        lookup = TableLookup(state, table.output, table.index,
                             parameter.dtype, parameter.shape).to(
                                 parameter.device)
        del parameter
        delattr(parent, name)
        setattr(parent, name, lookup)
        state.replaced.append(table.table)
    by_module: Dict[str, List[Capture]] = collections.defaultdict(list)
    for capture in described.captures:
        if capture.module != described.embedder:
            by_module[capture.module].append(capture)
    for path, captures in by_module.items():
        transformer.get_submodule(path).register_forward_pre_hook(
            InputTap(state, tuple(captures)), with_kwargs=True)
