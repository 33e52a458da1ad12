"""What a served conditioning model says it stands for in a transformer.

The server publishes, per conditioning model (``client.models()``): the
transformer class and config fields it is computed for; per output, the
module or parameter it replaces (``replaces``, ``replaced_kind``,
``blocks``, ``input_module``, ``embedding``); per input, where the
transformer hands it (``module``, ``argument``) and what it stands for; and
the modules with weights its outputs fold in.  This module reads that into
the rows below and checks a transformer against it; nothing here names a
family's modules.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
from typing import Any, Dict, List, Optional, Tuple

import torch

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16,
           "fp16": torch.float16, "fp64": torch.float64}
DTYPE_NAMES = {dtype: name for name, dtype in _DTYPES.items()}


def dtype_of(name: Optional[str]) -> Optional[torch.dtype]:
    """The torch dtype of a served dtype name ("bf16"), or None."""
    return _DTYPES.get(name or "")


@dataclasses.dataclass(frozen=True)
class Slot:
    """A modulation Linear replaced by a lookup: `linear` reads output
    `output` at block position `index` (None: an [N, W] output), and its
    input module `silu` (the SiLU before it) becomes a pass-through.
    `silu` is None where the description names none (a UNet resnet's
    nonlinearity also acts on its hidden states): the lookup then reads
    the embedder's latest answer."""
    linear: str
    silu: Optional[str]
    output: str
    index: Optional[int]


@dataclasses.dataclass(frozen=True)
class Table:
    """An additive table (a scale_shift_table parameter) replaced by a
    parameter-free stand-in: where the model adds the table to its
    modulation, the stand-in returns output `output` at block position
    `index`, which is that very sum."""
    table: str
    output: str
    index: Optional[int]


@dataclasses.dataclass(frozen=True)
class StandIn:
    """A folded module: kind "passes_on" (its result is already the served
    value it is handed, so it returns its input) or "adds_nothing" (the
    model adds its result to a served value that already holds it, so it
    returns -0.0: x + -0.0 == x for every x, -0.0 included)."""
    path: str
    kind: str


@dataclasses.dataclass(frozen=True)
class Capture:
    """A served input the patch captures where the transformer hands it:
    the module's `argument` ("" module: the transformer's own forward;
    "name[key]": an entry of a dict argument), sent as input `name`, [N]
    (`width` 0) or [N, width].  `stands_for`: the served value it is
    (requested as an output beside a schedule to key its rows).
    `in_model_dtype`: the pipeline hands it in the model's dtype."""
    name: str
    module: str
    argument: str
    width: int
    stands_for: str
    instead_of: str
    in_model_dtype: bool = False

    def take(self, arguments: Dict[str, Any]) -> Any:
        """The value among a module's bound `arguments`, or None."""
        name, _, key = self.argument.partition("[")
        value = arguments.get(name)
        if key and value is not None:
            value = value.get(key.rstrip("]"))
        return value


@dataclasses.dataclass(frozen=True)
class Described:
    """What a served conditioning model stands for in a transformer."""
    embedder: str        # the module replaced by the embedder's stand-in
    # The outputs it returns: one, or one per position of its tuple (""
    # standing for None).
    results: Tuple[str, ...]
    returns_tuple: bool
    slots: Tuple[Slot, ...]
    tables: Tuple[Table, ...]
    stand_ins: Tuple[StandIn, ...]
    # The captured inputs, the one standing for the timesteps first.
    captures: Tuple[Capture, ...]
    # Where the embedder returns several results: per later result, the
    # names a module reading the first one asks for -> the output it reads
    # instead (a second embedding read by the same Linears).
    renames: Dict[str, Dict[str, str]]
    output_dtypes: Dict[str, Optional[str]]
    dtype: Optional[str]
    class_name: str
    config: Dict[str, str]

    @property
    def temb_output(self) -> str:
        return self.results[0]

    def modules(self) -> List[str]:
        """Every replaced module's and table's name, the embedder first."""
        return ([self.embedder] + [slot.linear for slot in self.slots]
                + [s.path for s in self.stand_ins]
                + [table.table for table in self.tables])


def _refuse(served: Any, what: str) -> ValueError:
    return ValueError(f"offload_conditioning: temb model {served.name!r} "
                      f"{what} (a server older than this client?)")


def describe(served: Any) -> Described:
    """The served model's description (a ConditioningModel of
    ``client.models()``) as rows.  A module that several outputs name (a
    Linear that also reads a second embedding) is replaced once, for the
    output read from the first embedding."""
    embedder: Dict[str, str] = {}
    slots: List[Slot] = []
    tables: List[Table] = []
    taken = set()
    # (module path, embedding) -> the output read there, for the renames.
    read_at: Dict[Tuple[str, str], str] = {}
    for output in served.outputs:
        kind = getattr(output, "replaced_kind", "")
        if kind == "embedder":
            embedder[output.name] = output.replaces
            continue
        if kind not in ("linear", "table"):
            continue
        blocks = tuple(output.blocks)
        rows = list(enumerate(blocks)) if blocks else [(None, None)]
        embedding = getattr(output, "embedding", "")
        for index, block in rows:
            path = output.replaces.replace("{i}", str(block))
            read_at[(path, embedding)] = output.name
            if path in taken or embedding:
                continue
            taken.add(path)
            if kind == "table":
                tables.append(Table(path, output.name, index))
            else:
                silu = output.input_module.replace("{i}", str(block))
                slots.append(Slot(path, silu or None, output.name, index))
    results = tuple(getattr(served, "embedder_results", ()) or ())
    if not embedder:
        raise _refuse(served, "names no embedder among its outputs' "
                      "replaced modules")
    first = results[0] if results else next(iter(embedder))
    renames: Dict[str, Dict[str, str]] = {}
    for result in results[1:]:
        if result:
            renames[result] = {first: result}
            renames[result].update(
                (read_at[(path, "")], name)
                for (path, embedding), name in read_at.items()
                if embedding == result and (path, "") in read_at)
    captures = [Capture(i.name, getattr(i, "module", ""), i.argument,
                        i.width, getattr(i, "stands_for", ""),
                        getattr(i, "instead_of", ""),
                        bool(getattr(i, "in_model_dtype", False)))
                for i in served.inputs if getattr(i, "argument", "")]
    captures.sort(key=lambda c: c.instead_of != "timesteps")
    if not captures or captures[0].instead_of != "timesteps":
        raise _refuse(served, "says not where its transformer hands the "
                      "timestep")
    return Described(
        embedder[first], results or (first,), bool(results), tuple(slots),
        tuple(tables),
        tuple(StandIn(f.module, f.kind)
              for f in getattr(served, "folded_modules", ())),
        tuple(captures), renames,
        {o.name: o.dtype for o in served.outputs},
        getattr(served, "dtype", None), getattr(served, "class_name", ""),
        dict(getattr(served, "config", {}) or {}))


# --- checking a transformer against it ---------------------------------------

def missing_modules(transformer: torch.nn.Module,
                    described: Described) -> List[str]:
    """What the described modules and tables the transformer lacks say:
    per stacked output, how many of its served blocks the transformer has;
    else the first module it has not."""
    have = ({name for name, _ in transformer.named_modules()}
            | {name for name, _ in transformer.named_parameters()})
    problems = [f"{path}: not in the transformer"
                for path in [described.embedder]
                + [s.path for s in described.stand_ins] if path not in have]
    problems += [f"{c.name}: the transformer has no {c.module}"
                 for c in described.captures
                 if c.module and c.module not in have]
    by_output: Dict[str, List[str]] = collections.defaultdict(list)
    for path, output in ([(s.linear, s.output) for s in described.slots]
                         + [(t.table, t.output) for t in described.tables]):
        by_output[output].append(path)
    for output, paths in by_output.items():
        present = [path in have for path in paths]
        if all(present):
            continue
        if len(paths) > 1 and any(present):
            problems.append(f"{output}: {len(paths)} blocks served, "
                            f"{sum(present)} in the transformer")
        else:
            lacking = paths[present.index(False)]
            problems.append(f"{output}: the transformer has no {lacking}")
    return problems


def _as_json(value: Any) -> Any:
    """A config value as JSON reads it back (tuples as lists)."""
    try:
        return json.loads(json.dumps(value))
    except TypeError:
        return repr(value)


def config_differences(transformer: torch.nn.Module,
                       described: Described) -> List[str]:
    """The transformer's class and config fields that differ from those the
    served model is computed for."""
    problems = []
    name = type(transformer).__name__
    if described.class_name and described.class_name != name:
        problems.append(f"class: served {described.class_name}, "
                        f"transformer {name}")
        return problems
    config = getattr(transformer, "config", {}) or {}
    for field, text in sorted(described.config.items()):
        served, here = json.loads(text), _as_json(config.get(field))
        if served != here:
            problems.append(f"config: {field} {json.dumps(served)} served, "
                            f"{json.dumps(here)} in the transformer")
    return problems


_SAFETENSORS_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16",
                       torch.float16: "F16"}


def fingerprint(tensor: torch.Tensor) -> Optional[str]:
    """The server's fingerprint of a weight tensor's bytes (defined in
    server/models/include/temb/models/weight_fingerprint.h): SHA-256 over
    the dtype, the byte count and the bytes, or 16 windows of 4 KiB of
    them, the first 16 hex digits.  None on the meta device."""
    if tensor.is_meta or tensor.dtype not in _SAFETENSORS_DTYPES:
        return None
    data = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    size = data.numel()
    digest = hashlib.sha256(
        f"{_SAFETENSORS_DTYPES[tensor.dtype]}\n{size}\n".encode())
    if size <= 65536:
        digest.update(data.cpu().numpy().tobytes())
    else:
        for i in range(16):
            offset = i * (size - 4096) // 15
            digest.update(data[offset:offset + 4096].cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def replaced_tensors(transformer: torch.nn.Module, described: Described
                     ) -> Dict[str, torch.Tensor]:
    """{checkpoint name: tensor} of the parameters the patch releases: the
    names are the transformer's parameter names, which are its
    checkpoint's."""
    found: Dict[str, torch.Tensor] = {}
    tables = {table.table for table in described.tables}
    for path in described.modules():
        if path in tables:
            found[path] = transformer.get_parameter(path)
            continue
        for name, tensor in transformer.get_submodule(path).named_parameters():
            found[f"{path}.{name}"] = tensor
    return found


def weight_differences(fingerprints: Dict[str, str],
                       served: Dict[str, str]) -> List[str]:
    """How the transformer's replaced weights (`fingerprints`, by name)
    differ from the served model's: another checkpoint or fine-tune, or a
    weight the served model does not read, which the patch would drop."""
    if not served or not fingerprints:
        return []
    common = sorted(set(served) & set(fingerprints))
    unread = sorted(set(fingerprints) - set(served))
    differ = [name for name in common if served[name] != fingerprints[name]]
    if not common:
        return ["weights: no tensor of the transformer's is among the "
                "served model's"]
    problems = []
    if differ:
        problems.append(
            f"weights: {len(differ)} of {len(common)} tensors differ from "
            f"the served model's ({', '.join(differ[:3])}"
            f"{', ...' if len(differ) > 3 else ''})")
    if unread:
        problems.append(
            f"weights: {len(unread)} tensors of the replaced modules are "
            f"not read by the served model ({', '.join(unread[:3])}"
            f"{', ...' if len(unread) > 3 else ''})")
    return problems
