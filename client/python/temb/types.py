"""Plain value types returned or accepted by the temb client."""

from __future__ import annotations

import dataclasses
import enum
import pathlib
from typing import Dict, Optional, Tuple, Union

__all__ = ["ConditioningInput", "ConditioningModel", "ConditioningOutput",
           "FoldedModule", "HealthStatus", "Limits", "Preset",
           "RowCacheStats", "ServerInfo", "Spec", "TlsConfig"]

_Pem = Union[bytes, str]


@dataclasses.dataclass(frozen=True)
class TlsConfig:
    """TLS settings, handed to ``grpc.ssl_channel_credentials``.

    All fields are PEM bytes (a ``str`` is encoded as ASCII).  Leaving
    ``root_certificates`` unset uses gRPC's default roots; setting both
    ``certificate_chain`` and ``private_key`` enables mutual TLS.
    ``server_name_override`` sets the name checked against the server's
    certificate (``grpc.ssl_target_name_override``), for tests and for
    servers reached through an address that is not in their certificate.
    """

    root_certificates: Optional[_Pem] = None
    certificate_chain: Optional[_Pem] = None
    private_key: Optional[_Pem] = None
    server_name_override: Optional[str] = None

    @classmethod
    def from_files(cls, root_certificates: Optional[str] = None,
                   certificate_chain: Optional[str] = None,
                   private_key: Optional[str] = None,
                   server_name_override: Optional[str] = None) -> TlsConfig:
        """Reads the PEM files named by the (optional) paths."""
        def read(path: Optional[str]) -> Optional[bytes]:
            return None if path is None else pathlib.Path(path).read_bytes()
        return cls(read(root_certificates), read(certificate_chain),
                   read(private_key), server_name_override)


@dataclasses.dataclass(frozen=True)
class Spec:
    """An embedding convention, as the server reports it.  None = unset."""

    dim: Optional[int] = None
    max_period: Optional[float] = None
    flip_sin_to_cos: Optional[bool] = None
    downscale_freq_shift: Optional[float] = None
    scale: Optional[float] = None
    time_factor: Optional[float] = None
    repeat_only: Optional[bool] = None
    layout: Optional[str] = None  # "halves" | "interleaved"
    precision: Optional[str] = None  # "fp32" | "fp64"
    # "fp32" | "fp16" | "bf16": the dtype t is rounded to (and time_factor
    # applied in) before the embedding; None: fp32.
    timestep_dtype: Optional[str] = None
    # A frequency table instead of exp(-ln(P) i / (H - shift)), or
    # (min_frequency, max_frequency) of a log-spaced one.
    frequencies: Optional[Tuple[float, ...]] = None
    log_spaced_frequencies: Optional[Tuple[float, float]] = None
    # "divide_last" | "slope_first": the float32 order of the exponent
    # -ln(P) * i / (H - shift) in the model's code.
    exponent_order: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class Preset:
    """A named convention for one model family (e.g. "sdxl", "flux")."""

    name: str
    description: str
    spec: Spec
    dim_overridable: bool
    default_dtype: Optional[str]  # "fp32" | "fp16" | "bf16" | "fp64" | None
    # The embeddings one denoising step needs, as (part name, preset name)
    # pairs (e.g. flux: ("timestep", "flux"), ("guidance", "flux")): the
    # names Client.embed_parts(..., preset=name) takes.
    parts: Tuple[Tuple[str, str], ...] = ()


@dataclasses.dataclass(frozen=True)
class Limits:
    max_dim: int
    max_batch: int
    max_output_bytes: int
    max_message_bytes: int
    # The largest request message the server takes (gRPC's receive limit):
    # a Client.condition call's inputs travel inside it.  0: not reported.
    max_request_bytes: int = 0


@dataclasses.dataclass(frozen=True)
class ConditioningInput:
    """An input a conditioning model takes, by its name in
    ``Client.condition`` ("timesteps", "guidance", "pooled_projections" or
    a family's extra such as "resolution")."""

    name: str
    width: int  # 0: one value per row ([N]); else rows of [N, width]
    help: str = ""
    # Set: the input stands for this value of the model's computation (the
    # transformer forward's own "timestep"), given instead of the input
    # `instead_of` ("timesteps", "guidance").
    stands_for: str = ""
    instead_of: str = ""
    # Where an offload patch captures it, as the transformer hands it: the
    # module ("" for the transformer's own forward) and the argument of its
    # forward ("name[key]": an entry of a dict argument).  Empty argument:
    # not captured.
    module: str = ""
    argument: str = ""
    # The pipeline hands it in the model's dtype (the model rounds a value
    # given otherwise to it).
    in_model_dtype: bool = False


@dataclasses.dataclass(frozen=True)
class ConditioningOutput:
    """An output of a conditioning model: [N] + row_shape in dtype."""

    name: str
    dtype: Optional[str]  # "fp32" | "fp16" | "bf16" | "fp64"
    row_shape: Tuple[int, ...]
    row_bytes: int
    layout: str = ""
    # What the output stands for in the transformer: `replaces` names a
    # module ("embedder": it returns this output; "linear": it computes it)
    # or a parameter ("table": the model adds it, the output is the sum),
    # with "{i}" for a stacked output, whose rows along L are the blocks
    # `blocks`; `input_module`, the parameterless module (the SiLU) that
    # hands a Linear its input.  Empty for an output standing for none.
    replaces: str = ""
    replaced_kind: str = ""
    blocks: Tuple[int, ...] = ()
    input_module: str = ""
    # Where the embedder returns several results
    # (ConditioningModel.embedder_results): the one the replaced module is
    # handed; empty for the first.
    embedding: str = ""


@dataclasses.dataclass(frozen=True)
class FoldedModule:
    """A transformer module with weights that a conditioning model's
    outputs fold in besides the modules they replace: kind "passes_on" (its
    result is the served value it is handed) or "adds_nothing" (the model
    adds its result to a served value that already holds it)."""

    module: str
    kind: str


@dataclasses.dataclass(frozen=True)
class ConditioningModel:
    """A conditioning model of the server's --model_repository.  Only a
    "ready" model has its family, dtype, width, weights, inputs and
    outputs; a "failed" one has its cause in ``message``."""

    name: str
    state: str  # "loading" | "ready" | "failed" | "unloaded"
    message: str = ""
    family: str = ""
    dtype: Optional[str] = None
    width: int = 0
    weight_bytes: int = 0
    inputs: Tuple[ConditioningInput, ...] = ()
    outputs: Tuple[ConditioningOutput, ...] = ()
    folded_modules: Tuple[FoldedModule, ...] = ()
    # Checkpoint tensor name -> a 16-hex-digit fingerprint of its bytes
    # (temb.torch.offload_conditioning compares its own weights').
    weight_fingerprints: Dict[str, str] = dataclasses.field(
        default_factory=dict, compare=False, hash=False)
    # The transformer class it is computed for, and the config.json fields
    # its description read (JSON text by field).
    class_name: str = ""
    config: Dict[str, str] = dataclasses.field(
        default_factory=dict, compare=False, hash=False)
    # Where the replaced embedder returns a tuple: the output at each
    # position ("" for None); empty when it returns one tensor.
    embedder_results: Tuple[str, ...] = ()

    @property
    def row_bytes(self) -> int:
        """Bytes of every output for one timestep."""
        return sum(output.row_bytes for output in self.outputs)


@dataclasses.dataclass(frozen=True)
class RowCacheStats:
    """The exact row cache the conditioning models share."""

    hits: int = 0
    misses: int = 0
    entries: int = 0
    bytes: int = 0
    evictions: int = 0
    capacity_bytes: int = 0


@dataclasses.dataclass(frozen=True)
class ServerInfo:
    version: str
    backend: str  # "cpu" | "cuda"
    device: str
    limits: Limits
    presets: Tuple[Preset, ...]
    # The conditioning models, in name order, with their state at the call.
    conditioning_models: Tuple[ConditioningModel, ...] = ()
    conditioning_cache: RowCacheStats = RowCacheStats()

    def preset(self, name: str) -> Optional[Preset]:
        """The preset called `name`, or None."""
        return next((p for p in self.presets if p.name == name), None)

    def conditioning_model(self, name: str) -> Optional[ConditioningModel]:
        """The conditioning model called `name`, or None."""
        return next((m for m in self.conditioning_models if m.name == name),
                    None)


class HealthStatus(enum.IntEnum):
    """grpc.health.v1 serving status (same numbers as the protocol)."""

    UNKNOWN = 0
    SERVING = 1
    NOT_SERVING = 2
    SERVICE_UNKNOWN = 3
